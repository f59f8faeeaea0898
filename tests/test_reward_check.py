"""The contract checker catches broken rewards, and every shipped reward passes it."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from grpo_recipes.cli import main
from grpo_recipes.rewards import registry
from grpo_recipes.rewards.check import MALFORMED, check_reward, default_rows

pytestmark = pytest.mark.filterwarnings("ignore::Warning")  # sympy deprecations from fuzzed LaTeX

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(n for n, r in registry.available().items() if Path(r.source).parent == REPO / "rewards")

BROKEN = textwrap.dedent('''
    from grpo_recipes.rewards import reward

    @reward("broken_raises")
    def broken_raises(completions):
        """Divides by the length: raises on an empty completion."""
        return [1.0 / len(t) for t in completions]

    @reward("broken_length")
    def broken_length(completions):
        return [0.0] * (len(completions) - 1)

    @reward("broken_type")
    def broken_type(completions):
        return [len(t) > 3 for t in completions]

    @reward("broken_inf")
    def broken_inf(completions):
        return [float("inf") if not t else 0.0 for t in completions]
''')


@pytest.fixture
def broken_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # keep the broken ones out of other tests
    (tmp_path / "broken.py").write_text(BROKEN)
    return tmp_path


@pytest.mark.parametrize("name, finding", [
    ("broken_raises", "EXCEPTION malformed completion '': ZeroDivisionError"),
    ("broken_length", f"returned {len(MALFORMED) + 3} values for {len(MALFORMED) + 4} completions"),  # +2 good, 2 bad
    ("broken_type", "value 0 is bool True, expected float or None"),
    ("broken_inf", "infinite scores"),
])
def test_broken_rewards_are_caught(broken_dir, capsys, name, finding):
    rc = main(["rewards", "check", name, "--reward-dir", str(broken_dir), "--rows", "1", "--no-fuzz"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert finding in out and "contract: BROKEN" in out


# The sandboxed code rewards (rewards/unit_tests.py) read columns the default rows lack; until that file gives its
# rewards check_rows/check_examples, these stand in: one row per column, with a right and a wrong program.
CODE_ROWS = {
    "tests": ({"tests": json.dumps(["assert add(2, 3) == 5", "assert add(-1, 1) == 0"])},
              "def add(a, b):\n    return a + b", "def add(a, b):\n    return a * b"),
    "io_cases": ({"io_cases": json.dumps([["2 3\n", "5\n"], ["-1 1\n", "0\n"]])},
                 "a, b = map(int, input().split())\nprint(a + b)", "print(1)"),
}


def _rows_and_examples(rdef):
    code = [CODE_ROWS[c] for c in rdef.columns if c in CODE_ROWS]
    if not code or hasattr(rdef.func, "check_rows"):
        return default_rows(rdef, 2), None
    row, good, bad = code[0]
    fence = "```python\n{}\n```".format
    return [row], lambda row, params: {"good": [fence(good)], "bad": [fence(bad), "no code at all"]}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_reward_passes_the_check(name):
    rdef = registry.available()[name]
    rows, examples = _rows_and_examples(rdef)
    report = check_reward(rdef, rows, fuzz=True, examples=examples)
    assert report.ok, report.render()
    assert report.good_beats_bad, report.render()
    assert len(report.scores["fuzz"]) > 0


def test_episode_bonus_pays_a_computed_answer_and_no_text():
    """tool_grounded's check examples are episodes: the expression computed then boxed pays 1; a wrong box after the
    call, the right box with no call, and every malformed and fuzzed text pay 0."""
    rdef = registry.available()["tool_grounded"]
    rows, examples = _rows_and_examples(rdef)
    report = check_reward(rdef, rows, fuzz=True, examples=examples)
    assert report.ok, report.render()
    assert set(report.scores["good"]) == {1.0} and len(report.scores["good"]) == len(rows)
    assert {s for kind in ("bad", "malformed", "fuzz") for s in report.scores[kind]} == {0.0}


def test_shipped_rewards_include_the_issue_list():
    assert {"math_correctness", "think_format", "think_tag_count", "think_format_if_correct", "boxed_format",
            "json_schema", "json_field_accuracy", "overlong_penalty", "repetition_penalty", "length_reward",
            "exact_match", "numeric_match", "reasoning_gym_score"} <= set(SHIPPED)


def test_list_shows_contract_of_every_reward(capsys):
    assert main(["rewards", "list"]) == 0
    out = capsys.readouterr().out
    for name in SHIPPED:
        assert f"{name}  (" in out
    assert "columns: answer, gym_entry" in out
    # Each parameter with its default and the values it accepts (its annotation, checked at start-up).
    math = out.split("math_correctness  (")[1].split("\n\S")[0]
    for line in ("answer_form='literal'  (one of 'literal', 'expression')", "require_boxed=True  (true or false)",
                 "timeout_s=3  (a number > 0)"):
        assert f"\n      {line}\n" in math, line


def test_check_reads_rows_file_and_params(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"answer": a}) + "\n" for a in ["3", "0.5", "-7"]))
    rc = main(["rewards", "check", "numeric_match", "--rows-file", str(rows), "--params", '{"rel_tol": 0.01}',
               "--no-fuzz"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 rows" in out and '"rel_tol": 0.01' in out and "good outranks bad: yes" in out


@pytest.mark.parametrize("argv, message", [
    (["no_such_reward"], "unknown reward 'no_such_reward'"),
    (["numeric_match", "--params", '{"rel_tol": 0.1, "tol": 1}'], "has no parameter 'tol'"),
    (["numeric_match", "--params", "[1]"], "expected a JSON object"),
])
def test_check_rejects_bad_usage(argv, message, capsys):
    assert main(["rewards", "check", *argv, "--rows", "1", "--no-fuzz"]) == 2
    assert message in capsys.readouterr().err


def test_check_rows_file_without_needed_column(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "q"}) + "\n")
    assert main(["rewards", "check", "json_schema", "--rows-file", str(rows)]) == 2
    assert "needs dataset column 'schema'" in capsys.readouterr().err


def test_check_with_a_recipe_config(tmp_path, capsys):
    config = tmp_path / "json.yaml"
    config.write_text(textwrap.dedent(f"""
        dataset_source: file
        dataset_path: {REPO / "recipes/data/json_train.jsonl"}
        answer_field: null
        train_size: 20
        eval_size: 4
        rewards:
          - {{name: json_schema}}
          - {{name: json_field_accuracy, weight: 0.5}}
    """))
    rc = main(["rewards", "check", "json_field_accuracy", "--config", str(config), "--rows", "3", "--no-fuzz"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "3 rows" in out and "good outranks bad: yes" in out


NAIVE = textwrap.dedent('''
    import re
    import time
    from grpo_recipes.rewards import reward

    @reward("naive_contains")
    def naive_contains(completions, answer):
        """1.0 when the gold appears anywhere in the completion."""
        return [1.0 if str(gold) in text else 0.0 for text, gold in zip(completions, answer)]

    @reward("naive_layout", role="format")
    def naive_layout(completions):
        """1.0 when the text has the expected layout."""
        return [1.0 if "\\boxed{" in text or "</think>" in text else 0.0 for text in completions]

    @reward("slow_on_spaces")
    def slow_on_spaces(completions, answer):
        """Costs time in proportion to the longest run of spaces, as a backtracking pattern does."""
        for text in completions:
            time.sleep(0.0002 * max(map(len, re.findall(" +", text)), default=0))
        return [0.0 for _ in completions]

    @reward("raises_on_hedge")
    def raises_on_hedge(completions, answer):
        """Raises on the word 'or'."""
        if any(" or " in t for t in completions):
            raise ValueError("or")
        return [0.0 for _ in completions]
''')


@pytest.fixture
def naive_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    (tmp_path / "naive.py").write_text(NAIVE)
    return tmp_path


def test_check_reports_what_a_users_reward_pays_for(naive_dir, capsys):
    rc = main(["rewards", "check", "naive_contains", "--reward-dir", str(naive_dir), "--rows", "3", "--no-fuzz"])
    out = capsys.readouterr().out
    assert rc == 0, out  # paying for hacks is a finding, not a broken contract
    assert "hack catalog (answer)" in out
    for name in ("hedge_in_box", "gold_then_wrong", "gold_only_in_think", "false_equation"):
        assert re.search(rf"PAYS\s+\d\.\d\d\s+{name}:", out), name
    assert re.search(r"REFUSES\s+\d\.\d\d\s+fullwidth_digits:", out)
    assert "[the catalog records" not in out  # a user's reward has no catalogued scores
    paid = re.search(r"pays for (\d+) hack", out)
    assert paid and int(paid.group(1)) >= 10


def test_check_runs_both_format_families_on_an_unspecific_format_reward(naive_dir, capsys):
    assert main(["rewards", "check", "naive_layout", "--reward-dir", str(naive_dir), "--rows", "2", "--no-fuzz"]) == 0
    out = capsys.readouterr().out
    assert "hack catalog (boxed, think)" in out and re.search(r"PAYS\s+1\.00\s+empty_reasoning:", out)


def test_check_reports_a_shape_that_costs_time(naive_dir, capsys):
    # Issue 34, item 6: ~800 spaces in each of 24 boxes, each a run a backtracking pattern retries from every space.
    assert main(["rewards", "check", "slow_on_spaces", "--reward-dir", str(naive_dir), "--rows", "1", "--no-fuzz"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"SLOW\s+0\.00\s+padded_boxes: .*\[\d+ ms a completion, \d+\.\d ms for a plain one", out), out
    assert "slow on 2 shape(s): padded_boxes, padded_sign_box" in out


def test_a_hack_that_makes_a_reward_raise_breaks_the_contract(naive_dir, capsys):
    assert main(["rewards", "check", "raises_on_hedge", "--reward-dir", str(naive_dir), "--rows", "1",
                 "--no-fuzz"]) == 1
    out = capsys.readouterr().out
    assert "EXCEPTION hack hedge_after_anchor completion" in out and "contract: BROKEN" in out


def test_shipped_reward_check_compares_with_the_catalog(capsys):
    assert main(["rewards", "check", "math_correctness", "--rows", "2", "--no-fuzz"]) == 0
    out = capsys.readouterr().out
    # The working is not read without check_working: its fourteen catalogued hacks are paid, each with its reason.
    assert ("pays for 14 hack(s): working_contradicts_answer, working_in_words, false_working, unrelated_working, "
            "false_equation_then_true, working_relation_word, working_fullwidth_equals, working_arrow, "
            "working_in_aligned, working_left_right, working_padded_side, working_in_think, identity_working, "
            "other_numbers_working" in out and "REFUSES" in out and "(known: " in out)
    assert re.search(r"PAYS\s+1\.00\s+working_contradicts_answer:.*\(known: the working before", out)
    assert main(["rewards", "check", "math_correctness", "--rows", "2", "--no-fuzz", "--params",
                 '{"check_working": true}']) == 0
    # The last chain holds there, but its false step computes with numbers the question does not hold.
    assert "pays for 0 hack" in capsys.readouterr().out
    # The arithmetic task's default (tasks/arithmetic.py) reads every equation too: it pays for none.
    assert main(["rewards", "check", "math_correctness", "--rows", "2", "--no-fuzz", "--params",
                 '{"check_working": true, "check_equations": true}']) == 0
    assert "pays for 0 hack" in capsys.readouterr().out
    assert main(["rewards", "check", "math_correctness", "--rows", "2", "--no-fuzz", "--params",
                 '{"answer_form": "expression"}']) == 0
    out = capsys.readouterr().out
    assert re.search(r"PAYS\s+1\.00\s+expression_in_box:.*\(known: expression mode pays", out)
