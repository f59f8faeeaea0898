"""The math recipe end to end: 2 GRPO steps of a tiny model, logged to Trackio, saved."""

import json
import os
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
from helpers import REPO, tiny_run_args, trackio_metrics


def test_math_recipe_trains_logs_and_saves(tiny_model_dir, run_env):
    out = run_env / "out"
    # TRACKIO_DIR (run_env) says run_env/trackio; the recipe's trackio_dir must win, though Trackio reads its folder
    # once, when first imported, before the config is parsed (tracking.use_dir switches it).
    tracks = run_env / "from_config"
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(tiny_model_dir, out),
           "--trackio_group", "smoke-runs", "--trackio_dir", str(tracks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "model.safetensors").is_file()
    assert not (run_env / "trackio" / "grpo-recipes-math.db").exists()
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        (config,) = con.execute("SELECT config FROM configs").fetchone()
    assert json.loads(config)["_Group"] == "smoke-runs"  # the dashboard groups runs by it
    rows = trackio_metrics(tracks, "grpo-recipes-math")
    text = " ".join(m for _, m in rows)
    for key in ("train/rewards/math_correctness/mean", "train/loss", "train/entropy", "train/completions/mean_length"):
        assert key in text, key
    steps = {json.loads(m).get("train/global_step") for _, m in rows}
    assert {1, 2} <= steps


@pytest.mark.slow
def test_default_recipe_one_real_step_logs_reward_and_loss(run_env):
    """The shipped default (real SmolLM2-135M from the bundled GGUF), unchanged but for the step counts: one step
    of the sft stage, then one GRPO step."""
    out = run_env / "out"
    sft = {"name": "sft", "max_steps": 1, "learning_rate": 3e-5, "lr_scheduler_type": "constant",
           "per_device_train_batch_size": 16}
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), "--max_steps", "1", "--stages",
           json.dumps([sft, {"name": "grpo"}]), "--output_dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "from bundled-gguf" in proc.stderr
    records = [json.loads(m) for _, m in trackio_metrics(run_env / "trackio", "grpo-recipes-math")]
    sft, train = [r for r in records if "train/loss" in r]
    assert sft["train/global_step"] == 1 and 0 < sft["train/loss"] < 5 and "train/reward" not in sft
    assert train["train/global_step"] == 2
    assert 0.0 <= train["train/rewards/math_correctness/mean"] <= 1.0
    assert train["train/loss"] == train["train/loss"]  # not NaN


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


@pytest.mark.slow
def test_default_recipe_on_two_cpu_processes_fits_half_the_machine(run_env):
    """README's two-process CPU command with the real model: both ranks train as gloo ranks, and the whole process
    tree (launcher, torchrun, two workers) stays under 12 GB, half of the project's 24 GB machine."""
    out = run_env / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "accelerate_configs" / "cpu_ddp.yaml"), str(REPO / "recipes" / "math_grpo.py"),
           "--max_steps", "1", "--stages", json.dumps([{"name": "sft", "max_steps": 1, "per_device_train_batch_size": 8},
                                                       {"name": "grpo"}]),
           "--output_dir", str(out), "--eval_size", "32"]
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "WORLD_SIZE")}
    with open(run_env / "log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=run_env, env=env)
        tree, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(tree))
            time.sleep(0.2)
    text = (run_env / "log").read_text()
    assert proc.returncode == 0, text[-4000:]
    assert (out / "model.safetensors").is_file()
    assert "processes: 2 (MULTI_CPU, cpu" in text  # not two lone trainers
    print(f"two-process default, 2 steps: peak RSS of the process tree {peak / 2**30:.2f} GB")  # shown with -s
    assert peak < 12 * 2**30, f"peak RSS of the process tree {peak / 2**30:.1f} GB"
