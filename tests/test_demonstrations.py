"""demonstration_field: a group that none of its completions solves trains on its row's worked solution in place of
its last completion; `rewards/<name>/mean`, `reward` and `diag/*` stay the sampled completions' alone, the trained
batch's are `demonstrations/*`."""

import json
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.rewards import registry
from grpo_recipes.rewards.arithmetic import ArithmeticFault, evaluate, worked_steps
from grpo_recipes.run.runner import prepare
from grpo_recipes.tasks.registry import available

worked_solution = available()["arithmetic"].worked_solution  # tasks/arithmetic.py
WORKED_SOLUTION = "worked_solution"


@pytest.mark.parametrize("expression, steps", [
    ("-3 - 4", ["-3 - 4", "-7"]),
    ("( 5 - -8 )", ["5 - (-8)", "13"]),
    ("-( 5 + 2 )", ["-(5 + 2)", "-(7)", "-7"]),  # the value under the sign shown before the sign is applied
    ("-( -( -1 - -7 ) )", ["-(-(-1 - (-7)))", "-(-(6))", "-(-6)", "6"]),
    ("2 * (3 + 4) - -1", ["(2 * (3 + 4)) - (-1)", "(2 * 7) - (-1)", "14 - (-1)", "15"]),
    ("1 / 2 + 1", ["(1 / 2) + 1", "(1/2) + 1", "3/2"]),
    ("7", ["7"]),
])
def test_worked_steps_reduce_one_operation_at_a_time_and_every_step_keeps_the_value(expression, steps):
    assert worked_steps(expression) == steps
    assert {evaluate(s) for s in steps} == {evaluate(expression)}


def test_worked_steps_refuse_what_the_evaluator_refuses():
    with pytest.raises(ArithmeticFault, match="unsupported element"):
        worked_steps("x + 1")


def test_worked_solutions_score_full_marks_under_the_strictest_math_reward():
    rows = [{"expression": e, "answer": str(evaluate(e))} for e in ("-3 - 4", "-( -( -1 - -7 ) )", "( 0 - -8 )")]
    texts = [worked_solution(r) for r in rows]
    assert texts[0] == "-3 - 4 = -7. \\boxed{-7}"
    spec = registry.RewardSpec("math_correctness", 1.0, {"answer_form": "literal", "check_working": True})
    funcs, _ = registry.compile_rewards([spec], registry.available())
    scores = funcs[0](texts, answer=[r["answer"] for r in rows], log_metric=lambda *a: None)
    assert scores == [1.0, 1.0, 1.0]


def test_every_training_row_of_the_math_default_gets_a_demonstration_its_rewards_pay_in_full(tmp_path):
    run = prepare("math", ["--output_dir", str(tmp_path / "out")], REPO / "recipes" / "configs" / "math_cpu.yaml",
                  for_training=False)
    train = run.train
    assert run.recipe.demonstration_field == WORKED_SOLUTION and [s.name for s in run.recipe.reward_specs] == [
        "math_correctness", "boxed_format"]  # the arithmetic task's
    texts = [[{"role": "assistant", "content": t}] for t in train[WORKED_SOLUTION]]
    for func in run.funcs:
        assert func(texts, answer=train["answer"], log_metric=lambda *a: None) == [1.0] * len(train), func.__name__


def test_no_worked_solution_where_the_gold_is_not_the_expression_value_or_there_is_no_expression():
    assert worked_solution({"expression": "7 / 2", "answer": "3"}) is None  # a floored gold: it would score 0
    assert worked_solution({"question": "What is 2 + 2?", "answer": "4"}) is None


def _run(model_dir, run_env, *extra: str):
    out, tracks = run_env / "out", run_env / "trackio"
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(model_dir, out, 2),
           "--eval_heldout", "false", "--trackio_dir", str(tracks), "--run_name", "demo", "--report_to", "trackio",
           "--log_completions", "true", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    return proc, out, tracks


def test_unsolved_groups_train_on_the_worked_solution_and_the_metrics_stay_the_policys(tiny_model_dir, run_env):
    proc, out, tracks = _run(tiny_model_dir, run_env, "--demonstration_field", "worked_solution",
                             "--demonstrate_unsolved_groups", "true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        logs = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")]
    logs = [r for r in logs if "train/loss" in r]
    # A random tiny model solves nothing: every group gets its demonstration, and none of them counts as a sample.
    assert [r["train/demonstrations/frac_groups"] for r in logs] == [1.0, 1.0]
    for r in logs:  # what a person reads as the policy's: its samples solve nothing
        assert r["train/rewards/math_correctness/mean"] == 0.0 and r["train/diag/pass@1"] == 0.0
        assert r["train/diag/pass@k"] == 0.0 and r["train/diag/solve_none"] == 1.0
        assert r["train/demonstrations/rewards/math_correctness/mean"] == 0.25  # the trained batch: one row in four
        assert r["train/demonstrations/reward"] > r["train/reward"]
    table = pd.concat([pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet"))])
    shown = table[table["demonstration"]]
    assert len(shown) == len(table) // 4  # the last of each group of 4
    for _, row in shown.iterrows():
        expression = row["prompt"][-1]["content"][len("Calculate "):-1]
        expected = worked_solution({"expression": expression, "answer": str(evaluate(expression))})
        assert row["completion"][0]["content"] == expected
        assert row["math_correctness"] == 1.0 and row["advantage"] > 0
    assert (table[~table["demonstration"]]["advantage"] < 0).all()


def test_a_demonstration_column_missing_from_the_rows_is_a_start_up_error(tiny_model_dir, run_env):
    proc, _, _ = _run(tiny_model_dir, run_env, "--demonstration_field", "solution", "--demonstrate_unsolved_groups",
                      "true")
    assert proc.returncode != 0
    assert "demonstration_field: 40 of 40 training rows have no 'solution' text" in proc.stderr


def test_demonstrations_and_dynamic_sampling_are_refused_together():
    """A demonstration makes an unsolved group informative, so dynamic sampling would never replace it: the two
    decide the same groups, and the policy's own metrics could not be told from the demonstrations' across rounds."""
    from grpo_recipes.config.schema import RecipeArguments
    from grpo_recipes.grpo.features.demonstrations import Demonstrations

    both = RecipeArguments(demonstration_field="worked_solution", dynamic_sampling=True)
    [problem] = Demonstrations.problems(both, None)
    assert problem.startswith("demonstrate_unsolved_groups, dynamic_sampling: both on")
    assert Demonstrations.problems(RecipeArguments(demonstration_field="worked_solution", dynamic_sampling=True,
                                                   demonstrate_unsolved_groups=False), None) == []
