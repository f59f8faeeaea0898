"""skip_zero_advantage_batches: a micro-batch whose advantages are all zero is not trained on, and the run is
exactly the run without the skip (same weights, bit for bit), whole skipped steps included."""

import json
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import torch
from helpers import REPO, tiny_run_args
from safetensors.torch import load_file

from grpo_recipes.grpo.features.skip import skip_blockers
from grpo_recipes.grpo.groups import equal_reward_groups


def _run(model_dir, run_env, name: str, *extra: str) -> tuple[dict, list[dict]]:
    out, tracks = run_env / name, run_env / f"trackio_{name}"
    config = run_env / "skip.yaml"
    config.write_text((REPO / "recipes" / "configs" / "math_cpu.yaml").read_text() + f"""
reward_dirs: [{REPO / "tests" / "data" / "skip_rewards"}]
rewards:
  - {{name: test_length_on_multiples_of_three, weight: 1.0}}
learning_rate: 1.0e-2
eval_heldout: false
""")
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), "--config", str(config),
           *tiny_run_args(model_dir, out, 4), "--per_device_train_batch_size", "1",
           "--gradient_accumulation_steps", "8", "--trackio_dir", str(tracks), "--run_name", name, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        rows = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics ORDER BY id")]
    return load_file(out / "model.safetensors"), [r for r in rows if "train/loss" in r]


def test_skipping_zero_advantage_rows_trains_the_same_weights(tiny_model_dir, run_env):
    # 2 prompts x 4 completions per step, one row per micro-batch: a prompt whose answer is not a multiple of 3
    # scores 0 on all four completions, so its rows have zero advantage.
    full, full_logs = _run(tiny_model_dir, run_env, "full", "--skip_zero_advantage_batches", "false")
    skipped, logs = _run(tiny_model_dir, run_env, "skip", "--skip_zero_advantage_batches", "true")
    fractions = [r["train/frac_rows_skipped"] for r in logs]
    # The case both kinds of step: some rows skipped, and (the momentum case) a step with every row skipped.
    assert any(0 < f < 1 for f in fractions) and 1.0 in fractions, fractions
    assert all("train/frac_rows_skipped" not in r for r in full_logs)
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert any(not initial[k].equal(full[k]) for k in full)  # it trained
    assert full.keys() == skipped.keys()
    for k in full:
        assert full[k].equal(skipped[k]), k


def _args(**kw):
    return SimpleNamespace(**{"beta": 0.0, "entropy_coef": 0.0, "use_adaptive_entropy": False,
                              "multi_objective_aggregation": "sum_then_normalize", **kw})


def test_the_skip_is_exact_only_with_beta_0_no_bonus_group_sums_and_one_process():
    assert skip_blockers(_args(), 1, False) == []
    assert skip_blockers(_args(beta=0.04), 1, False) == ["beta 0.04 gives every row a KL gradient"]
    assert "entropy bonus" in skip_blockers(_args(use_adaptive_entropy=True), 1, False)[0]
    assert "entropy bonus" in skip_blockers(_args(entropy_coef=0.01), 1, False)[0]
    assert "normalize_then_sum" in skip_blockers(_args(multi_objective_aggregation="normalize_then_sum"), 1, False)[0]
    assert "router loss" in skip_blockers(_args(), 1, True)[0]
    assert skip_blockers(_args(), 2, False) == ["2 processes would each have to skip the same micro-batches"]


def test_a_run_where_the_skip_is_not_exact_trains_every_row_and_says_why(tiny_model_dir, run_env):
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(tiny_model_dir, run_env / "out", 1),
           "--skip_zero_advantage_batches", "true", "--beta", "0.04", "--eval_heldout", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "skip_zero_advantage_batches: off in this run: beta 0.04 gives every row a KL gradient" in proc.stderr
    assert "frac_rows_skipped" not in proc.stdout + proc.stderr


def test_rows_of_a_group_that_scored_alike_are_marked_whatever_the_float_mean_says():
    nan = float("nan")
    groups = [
        [[0.0, 0.2]] * 8,                                   # alike: TRL's float32 mean of 8 x 0.2 leaves a residue
        [[1.0, 0.2]] + [[0.0, 0.2]] * 7,                    # one right
        [[1.0, 0.0], [0.0, 1.0], [nan, nan]] + [[0.5, 0.5]] * 5,  # other rows, same total; one scored by nothing
        [[nan, nan]] * 8,                                   # nothing scored: TRL gives every row 0
        [[0.0, 0.2]] * 7 + [[0.0, 0.2 + 1e-7]],             # a real, tiny, difference
    ]
    rewards = torch.tensor([row for group in groups for row in group])
    weights = torch.tensor([1.0, 1.0])
    totals = (rewards * weights).nansum(1).view(-1, 8)
    assert (totals[0] - totals[0].mean()).abs().max() > 0  # the residue this is about
    assert equal_reward_groups(rewards, weights, 8).tolist() == [True, False, True, True, False]
