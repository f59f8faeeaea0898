"""The code recipe end to end on the tiny model: the sandbox's status counts and pass rate reach Trackio."""

import json
import subprocess
import sys

from helpers import REPO, tiny_run_args, trackio_metrics

from grpo_recipes.config.resolve import resolve
from grpo_recipes.tasks.data import load_splits, question_key


def test_humaneval_is_held_out_only():
    config = resolve([], REPO / "recipes/configs/code_cpu.yaml")
    recipe = config.recipe
    train, held = load_splits(recipe, config.task)
    assert all(t.startswith("HumanEval/") for t in held["task_id"]) and len(held) == recipe.eval_size
    assert not {question_key(q) for q in train["question"]} & {question_key(q) for q in held["question"]}
    assert "task_id" not in train.column_names


def test_code_recipe_logs_pass_rate_and_statuses(tiny_model_dir, run_env):
    out = run_env / "out"
    args = tiny_run_args(tiny_model_dir, out, 1, "--eval_heldout", "false")
    proc = subprocess.run([sys.executable, str(REPO / "recipes/code_grpo.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-code")]
    train = next(r for r in records if "train/loss" in r)
    assert 0.0 <= train["train/rewards/unit_tests/pass_rate"] <= 1.0
    assert any(k.startswith("train/rewards/unit_tests/status/") for k in train)
