"""demonstration_field: a group that none of its completions solves trains on its row's worked solution in place of
its last completion; `rewards/<name>/sampled_mean` stays the sampled completions' alone."""

import json
import shutil
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import REPO, tiny_run_args
from grpo_recipes import registry
from grpo_recipes.arithmetic import ArithmeticFault, evaluate, worked_steps
from grpo_recipes.checks import demonstration_warmup_problems
from grpo_recipes.data import WORKED_SOLUTION, load_splits, worked_solution
from grpo_recipes.parsing import parse_recipe_args


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


def test_every_training_row_of_the_math_default_gets_a_demonstration_its_rewards_pay_in_full():
    config = REPO / "recipes" / "configs" / "math_cpu.yaml"
    recipe, *_ = parse_recipe_args(["--config", str(config), "--demonstration_field", WORKED_SOLUTION])
    train, _ = load_splits(recipe)
    funcs, _ = registry.compile_rewards(recipe.reward_specs, registry.available())
    texts = [[{"role": "assistant", "content": t}] for t in train[WORKED_SOLUTION]]
    for spec, func in zip(recipe.reward_specs, funcs):
        assert func(texts, answer=train["answer"], log_metric=lambda *a: None) == [1.0] * len(train), spec.name


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
    assert [r["train/frac_groups_demonstrated"] for r in logs] == [1.0, 1.0]
    assert all(r["train/rewards/math_correctness/sampled_mean"] == 0.0 for r in logs)
    assert all(r["train/rewards/math_correctness/mean"] == 0.25 for r in logs)  # TRL's: one row in four
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
    proc, _, _ = _run(tiny_model_dir, run_env, "--demonstration_field", "solution")
    assert proc.returncode != 0
    assert "demonstration_field: 40 of 40 training rows have no 'solution' text" in proc.stderr


def test_warmup_steps_train_on_the_demonstrations_then_grpo_takes_over(tiny_model_dir, run_env):
    proc, out, tracks = _run(tiny_model_dir, run_env, "--max_steps", "3", "--demonstration_field", "worked_solution",
                             "--demonstrate_unsolved_groups", "false", "--demonstration_warmup_steps", "2",
                             "--demonstration_warmup_learning_rate", "1e-3", "--learning_rate", "1e-6")
    assert proc.returncode == 0, proc.stderr[-4000:]
    logs = _train_logs(tracks)
    assert sorted(logs) == [1, 2, 3]
    warm, grpo = [logs[1], logs[2]], logs[3]
    assert all("train/reward" not in r and r["train/learning_rate"] == 1e-3 for r in warm)
    assert "train/demonstration_warmup/nll" not in grpo and grpo["train/learning_rate"] == 1e-6
    assert "train/reward" in grpo and "train/frac_groups_demonstrated" not in grpo  # GRPO, on-policy
    # Supervised steps on other rows of the same form: the second batch is already likelier than the first was.
    assert warm[1]["train/demonstration_warmup/nll"] < warm[0]["train/demonstration_warmup/nll"]
    tables = sorted(p.name for p in (out / "completions").glob("*.parquet"))
    assert tables == ["completions_00003.parquet"]  # the warm-up generated nothing
    assert "demonstration" not in pd.read_parquet(out / "completions" / tables[0]).columns


def test_warmup_without_a_demonstration_column_or_grpo_steps_is_a_start_up_error(tiny_model_dir, run_env):
    proc, _, _ = _run(tiny_model_dir, run_env, "--demonstration_warmup_steps", "2", "--demonstration_field", "")
    assert proc.returncode != 0
    assert "demonstration_warmup_steps: trains on demonstration_field, which is unset" in proc.stderr
    assert "demonstration_warmup_steps: 2 of max_steps 2 leaves no GRPO step" in proc.stderr


def test_a_run_resumed_inside_the_warmup_continues_its_rows_and_learning_rates(tiny_model_dir, run_env):
    warmup = ["--max_steps", "3", "--demonstration_field", "worked_solution", "--demonstrate_unsolved_groups",
              "false", "--demonstration_warmup_steps", "2", "--demonstration_warmup_learning_rate", "1e-3",
              "--learning_rate", "1e-6", "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "5"]
    proc, out, tracks = _run(tiny_model_dir, run_env, *warmup)
    assert proc.returncode == 0, proc.stderr[-4000:]
    straight = _train_logs(tracks)
    # The same run stopped after step 1: its checkpoint, resumed, must train steps 2 and 3 as the straight run did.
    resumed_out = run_env / "resumed"
    shutil.copytree(out / "checkpoint-1", resumed_out / "checkpoint-1")
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(tiny_model_dir, resumed_out, 2),
           "--eval_heldout", "false", "--trackio_dir", str(run_env / "trackio2"), "--run_name", "demo",
           "--report_to", "trackio", *warmup, "--resume"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = _train_logs(run_env / "trackio2")
    assert sorted(again) == [2, 3]
    assert again[2]["train/learning_rate"] == 1e-3 and again[3]["train/learning_rate"] == 1e-6
    assert again[2]["train/demonstration_warmup/nll"] == pytest.approx(straight[2]["train/demonstration_warmup/nll"],
                                                                       rel=1e-4)


def _train_logs(tracks) -> dict[int, dict]:
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        rows = [(s, json.loads(m)) for s, m in con.execute("SELECT step, metrics FROM metrics ORDER BY id")]
    return {s: m for s, m in rows if "train/loss" in m}


@pytest.mark.parametrize("steps, field_, max_steps, lr, problem", [
    (-1, WORKED_SOLUTION, 30, 3e-5, "demonstration_warmup_steps: -1; a number of optimiser steps, 0 for none"),
    (24, None, 30, 3e-5, "demonstration_warmup_steps: trains on demonstration_field, which is unset. Fix: "
                         "--demonstration_field worked_solution"),
    (24, WORKED_SOLUTION, 10, 3e-5, "demonstration_warmup_steps: 24 of max_steps 10 leaves no GRPO step. Fix: fewer "
                                    "warm-up steps (--demonstration_warmup_steps 0 for none)"),
    (24, WORKED_SOLUTION, 30, 0.0, "demonstration_warmup_learning_rate: 0; it must be > 0"),
])
def test_warmup_settings_that_cannot_work_are_named_with_their_fix(steps, field_, max_steps, lr, problem):
    recipe = SimpleNamespace(demonstration_warmup_steps=steps, demonstration_field=field_,
                             demonstration_warmup_learning_rate=lr)
    problems = demonstration_warmup_problems(recipe, SimpleNamespace(max_steps=max_steps))
    assert len(problems) == 1 and problems[0].startswith(problem)
    # max_steps -1 (train for num_train_epochs) leaves the GRPO steps to the epochs: not an error
    assert demonstration_warmup_problems(SimpleNamespace(demonstration_warmup_steps=24, demonstration_field=field_ or
                                                         WORKED_SOLUTION, demonstration_warmup_learning_rate=3e-5),
                                         SimpleNamespace(max_steps=-1)) == []
