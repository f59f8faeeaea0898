"""The JSON recipe end to end on the tiny model: its rewards' metrics reach Trackio."""

import json
import subprocess
import sys

from conftest import REPO, tiny_run_args
from test_recipe_e2e import trackio_metrics


def test_json_recipe_logs_parse_and_schema_rates(tiny_model_dir, run_env):
    out = run_env / "out"
    args = tiny_run_args(tiny_model_dir, out, 1, "--eval_heldout", "false")
    proc = subprocess.run([sys.executable, str(REPO / "recipes/json_grpo.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-json")]
    train = next(r for r in records if "train/loss" in r)
    for key in ("rewards/json_schema/parse_rate", "rewards/json_schema/schema_valid_rate",
                "rewards/json_field_accuracy/mean", "rewards/json_schema/mean"):
        assert 0.0 <= train[f"train/{key}"] <= 1.0, key
