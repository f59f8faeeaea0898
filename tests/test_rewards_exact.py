"""exact_match, numeric_match and reasoning_gym_score: answer extraction, normalisation, and the gym scorers."""

from __future__ import annotations

import json
import sys

import pytest
import reasoning_gym

from grpo_recipes.rewards.registry import available

REWARDS = available()
EXACT = sys.modules[REWARDS["exact_match"].func.__module__]


def run(name: str, completions: list[str], **columns) -> tuple[list, dict]:
    metrics = {}
    return REWARDS[name].func(completions, log_metric=metrics.__setitem__, **columns), metrics


@pytest.mark.parametrize("text, expected", [
    ("work \\boxed{\\frac{1}{2}} then <answer>7</answer>", "\\frac{1}{2}"),   # boxed first
    ("\\boxed{1} and later \\boxed{2}", "2"),                                  # the last box
    ("<answer> Paris </answer>\nok", "Paris"),
    ("line one\n\nThe answer is 42 apples.\n", "42 apples"),
    ("\\boxed{\uff14\uff12}", "42"),                                              # full-width digits read plainly
    ("**Final answer:** 7", "7"),
    ("<think>\\boxed{1}</think>\nAnswer: 2", "2"),                              # reasoning is skipped
    ("<think>still thinking \\boxed{1}", None),
    ("\\boxed{3", None),                                                      # a last box left open: no answer
    ("\\boxed{2} then \\boxed{3", None),
    ("\\boxed{1} or \\boxed{2}", None),                                         # a hedge: no answer
    ("\\boxed{2} \\boxed{2}", "2"),                                              # the same answer twice is one answer
    ("\\boxed{1}. Wait, no: \\boxed{2}", "2"),                                    # a correction: the final box
    ("\\boxed{2}. Wait, no: 3.", None), ("<answer>2</answer> Actually, 3.", None),   # taken back (issue 46)
    ("", None),
])
def test_extract_answer(text, expected):
    assert EXACT.extract_answer(text) == expected


def test_exact_match_normalises():
    texts = ["\\boxed{\\text{Paris}}", "The answer is  PARIS.", "<answer>'paris'</answer>", "London", "<think>"]
    out, metrics = run("exact_match", texts, answer=["Paris"] * 5)
    assert out == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert metrics["no_answer"] == pytest.approx(1 / 5)
    assert run("exact_match", ["x"], answer=["  "])[0] == [None]


def test_numeric_match_is_exact_by_default_and_tolerant_on_request():
    texts = ["\\boxed{106475279602}", "\\boxed{1/2}", "The answer is 0.500", "\\boxed{0.333}", "\\boxed{1,234}",
             "no number"]
    golds = ["106475279601", "0.5", "\\frac{1}{2}", "1/3", "1234", "5"]
    out, metrics = run("numeric_match", texts, answer=golds)
    assert out == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert metrics["no_number"] == pytest.approx(1 / 6)
    assert REWARDS["numeric_match"].func(["\\boxed{0.333}"], ["1/3"], lambda *a: None, rel_tol=0.01) == [1.0]
    assert REWARDS["numeric_match"].func(["\\boxed{5}"], ["five"], lambda *a: None) == [None]


@pytest.mark.parametrize("task", ["basic_arithmetic", "leg_counting", "chain_sum", "letter_counting", "spell_backward"])
def test_reasoning_gym_score_uses_the_task_scorer(task):
    entries = list(reasoning_gym.create_dataset(task, size=3, seed=0))
    texts = [f"<think>\nok\n</think>\n<answer>{e['answer']}</answer>" for e in entries]
    texts += ["<think>\nok\n</think>\n<answer>definitely wrong</answer>"]
    entries.append(entries[0])
    out, metrics = run("reasoning_gym_score", texts, answer=[str(e["answer"]) for e in entries],
                       gym_entry=[json.dumps(e, default=str) for e in entries])
    assert out[:3] == [1.0, 1.0, 1.0] and out[3] < 1.0
    assert metrics["unscorable"] == 0.0


def test_reasoning_gym_score_counts_unscorable_entries():
    entry = json.dumps(reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=0)[0])
    bad = ["not json", "{}", json.dumps({"metadata": {"source_dataset": "no_such_task"}}), entry]
    out, metrics = run("reasoning_gym_score", ["\\boxed{1}"] * 4, answer=["1"] * 4, gym_entry=bad)
    assert out[:3] == [None, None, None] and out[3] in (0.0, 1.0)
    assert metrics["unscorable"] == pytest.approx(3 / 4)
