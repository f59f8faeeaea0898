"""Alert detectors on synthetic metric streams (fire on the failure, silent on health, once per episode), the callback,
and a tiny-model run configured to hack its format reward, which must raise the format-hacking alert in Trackio."""

import json
import logging
import random
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.config.schema import AlertArguments, RecipeArguments
from grpo_recipes.grpo.alerts import (
    MISSING,
    AlertCallback,
    ClipRatioSpike,
    EntropyBlowup,
    EntropyCollapse,
    FormatHacking,
    LengthAtLimit,
    LengthCollapse,
    NoLearningSignal,
    TrainUpEvalDown,
    default_detectors,
)

CFG = AlertArguments()


def run(detector, stream):
    """-> [(step, alert name)] for a list of metric dicts, logged at steps 1, 2, ..."""
    fired = []
    for step, metrics in enumerate(stream, start=1):
        alert = detector.update(step, metrics)
        if alert is not None:
            fired.append((step, alert.name))
    return fired


def healthy_stream(steps=200, seed=0):
    """A plausible healthy GRPO run: entropy eases down, correctness and format rise, lengths steady, evals improve."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        p = t / steps
        correct = min(1.0, 0.3 + 0.4 * p + rng.gauss(0, 0.08))
        fmt = min(1.0, 0.5 + 0.45 * p + rng.gauss(0, 0.05))
        m = {
            "entropy": 1.2 - 0.4 * p + rng.gauss(0, 0.05),
            "frac_reward_zero_std": min(1.0, max(0.0, 0.4 + rng.gauss(0, 0.15))),
            "rewards/math_correctness/mean": correct,
            "rewards/boxed_format/mean": fmt,
            "reward": correct + 0.2 * fmt,
            "completions/mean_length": 20 + rng.gauss(0, 3),
            "completions/clipped_ratio": max(0.0, 0.05 + rng.gauss(0, 0.03)),
            "clip_ratio/region_mean": max(0.0, 0.005 + rng.gauss(0, 0.002)),
        }
        out.append(m)
        if t % 20 == 0:  # evaluations arrive as separate logs
            out.append({"eval_pass@1": 0.3 + 0.4 * p + rng.gauss(0, 0.02)})
    return out


def test_the_recipe_is_the_alerts_config():
    """The thresholds are RecipeArguments' alert_* fields (AlertArguments): a detector reads them from the recipe."""
    recipe = RecipeArguments(alert_patience=2, alert_eval_drop=0.3)
    assert isinstance(recipe, AlertArguments)
    assert NoLearningSignal(recipe).patience == 2 and TrainUpEvalDown(recipe).cfg.alert_eval_drop == 0.3


def test_healthy_stream_raises_nothing():
    for seed in range(5):
        stream = healthy_stream(seed=seed)
        for detector in default_detectors(CFG, ["math_correctness", "boxed_format"], "math_correctness", None):
            assert run(detector, stream) == [], (seed, detector.name)


def test_entropy_collapse_fires_once_per_episode_and_rearms():
    e = [1.0, 1.0, 1.0] + [0.01] * 10 + [0.9] * 3 + [0.01] * 6
    fired = run(EntropyCollapse(CFG), [{"entropy": v} for v in e])
    assert fired == [(3 + 5, "entropy_collapse"), (16 + 5, "entropy_collapse")]
    # Relative collapse: a high-entropy model falling to 5% of its start is collapsing even above the floor.
    assert run(EntropyCollapse(CFG), [{"entropy": v} for v in [4.0] * 3 + [0.15] * 5]) == [(8, "entropy_collapse")]
    assert run(EntropyCollapse(CFG), [{"entropy": v} for v in [1.0] * 3 + [0.5] * 20]) == []


def test_entropy_blowup():
    assert run(EntropyBlowup(CFG), [{"entropy": v} for v in [1.0] * 3 + [4.0] * 5]) == [(8, "entropy_blowup")]
    assert run(EntropyBlowup(CFG), [{"entropy": v} for v in [1.0] * 3 + [2.5] * 20]) == []
    # From a near-deterministic start, tripling is not a blow-up: the baseline is floored at 0.5 nats.
    assert run(EntropyBlowup(CFG), [{"entropy": v} for v in [0.05] * 3 + [0.3] * 20]) == []


def test_no_learning_signal_needs_consecutive_steps():
    z = [1.0] * 4 + [0.5] + [0.95] * 5
    assert run(NoLearningSignal(CFG), [{"frac_reward_zero_std": v} for v in z]) == [(10, "no_learning_signal")]
    assert run(NoLearningSignal(CFG), [{"frac_reward_zero_std": v} for v in [1.0, 0.5] * 20]) == []


def test_no_learning_signal_counts_equal_groups_exactly_when_diagnostics_log_them():
    # The math default's all-wrong, all-boxed groups (8 x 0.2): TRL's isclose sees a std of 1.5e-8 and counts none.
    stream = [{"frac_reward_zero_std": 0.0, "diag/frac_equal_groups": 1.0}] * 5
    assert run(NoLearningSignal(CFG), stream) == [(5, "no_learning_signal")]
    stream = [{"frac_reward_zero_std": 1.0, "diag/frac_equal_groups": 0.5}] * 5
    assert run(NoLearningSignal(CFG), stream) == []


def test_missing_metrics_neither_extend_nor_end_an_episode():
    stream = [{"frac_reward_zero_std": 1.0}] * 3 + [{"eval_pass@1": 0.1}] * 4 + [{"frac_reward_zero_std": 1.0}] * 2
    assert run(NoLearningSignal(CFG), stream) == [(9, "no_learning_signal")]
    assert NoLearningSignal(CFG).observe({"frac_reward_zero_std": None}) is MISSING  # TRL logs None for all-NaN


def fmt_stream(correct, fmt):
    return [{"rewards/math_correctness/mean": c, "rewards/boxed_format/mean": f} for c, f in zip(correct, fmt)]


def test_format_hacking():
    hacked = fmt_stream([0.1] * 20, [0.2, 0.5, 0.8] + [1.0] * 17)
    assert run(FormatHacking(CFG, "math_correctness", ["boxed_format"]), hacked) == [(8, "format_hacking")]
    learning = fmt_stream([0.1, 0.1, 0.1] + [0.3] * 17, [0.2, 0.5, 0.8] + [1.0] * 17)
    assert run(FormatHacking(CFG, "math_correctness", ["boxed_format"]), learning) == []
    solved = fmt_stream([0.95] * 20, [1.0] * 20)  # both saturated from the start: success, not hacking
    assert run(FormatHacking(CFG, "math_correctness", ["boxed_format"]), solved) == []


def test_format_hacking_watches_every_other_reward_unless_one_is_named():
    names = ["math_correctness", "boxed_format", "length_bonus"]
    stream = [{"rewards/math_correctness/mean": 0.1, "rewards/boxed_format/mean": 0.3,
               "rewards/length_bonus/mean": 1.0}] * 10
    (auto,) = [d for d in default_detectors(CFG, names, "math_correctness", None) if d.name == "format_hacking"]
    assert run(auto, stream) == [(8, "format_hacking")]
    named_detectors = default_detectors(CFG, names, "math_correctness", "boxed_format")
    (named,) = [d for d in named_detectors if d.name == "format_hacking"]
    assert run(named, stream) == []
    assert not [d for d in default_detectors(CFG, ["math_correctness"], "math_correctness", None)
                if d.name == "format_hacking"]


def test_train_up_eval_down():
    rewards = [{"reward": 0.2 + 0.05 * t} for t in range(10)]
    evals = [{"eval_pass@1": 0.5}, *rewards[:5], {"eval_pass@1": 0.55}, *rewards[5:], {"eval_pass@1": 0.4}]
    assert run(TrainUpEvalDown(CFG), evals) == [(len(evals), "train_up_eval_down")]
    both_up = [{"eval_pass@1": 0.5}, *rewards, {"eval_pass@1": 0.6}]
    assert run(TrainUpEvalDown(CFG), both_up) == []
    flat_train = [{"eval_pass@1": 0.5}, *[{"reward": 0.3}] * 10, {"eval_pass@1": 0.3}]
    assert run(TrainUpEvalDown(CFG), flat_train) == []  # eval falling alone is not this pattern


def test_length_collapse_and_length_at_limit():
    lengths = [{"completions/mean_length": v} for v in [30, 30, 30] + [5] * 5]
    assert run(LengthCollapse(CFG), lengths) == [(8, "length_collapse")]
    assert run(LengthCollapse(CFG), [{"completions/mean_length": v} for v in [30] * 3 + [15] * 10]) == []
    clipped = [{"completions/clipped_ratio": v} for v in [0.1] * 3 + [0.8] * 5]
    assert run(LengthAtLimit(CFG), clipped) == [(8, "length_at_limit")]
    assert run(LengthAtLimit(CFG), [{"completions/clipped_ratio": 0.2}] * 20) == []


def test_clip_ratio_spike():
    stream = [{"clip_ratio/region_mean": v} for v in [0.01, 0.012, 0.009, 0.011, 0.2, 0.21, 0.01, 0.3]]
    assert run(ClipRatioSpike(CFG), stream) == [(5, "clip_ratio_spike"), (8, "clip_ratio_spike")]
    assert run(ClipRatioSpike(CFG), [{"clip_ratio/region_mean": 0.0}] * 5 + [{"clip_ratio/region_mean": 0.04}]) == []


def test_callback_warns_on_the_main_process_only(caplog):
    cb = AlertCallback([NoLearningSignal(AlertArguments(alert_patience=1))])
    main = SimpleNamespace(is_world_process_zero=True, global_step=3)
    other = SimpleNamespace(is_world_process_zero=False, global_step=3)
    with caplog.at_level(logging.WARNING, logger="grpo_recipes.grpo.alerts"):
        cb.on_log(None, other, None, logs={"frac_reward_zero_std": 1.0})
        assert cb.fired == []
        cb.on_log(None, main, None, logs={"frac_reward_zero_std": 1.0})
        cb.on_log(None, main, None, logs={"frac_reward_zero_std": 1.0})
    assert [a.name for a in cb.fired] == ["no_learning_signal"]
    assert "ALERT No learning signal: step 3" in caplog.text


@pytest.fixture
def hack_rewards(tmp_path):
    folder = tmp_path / "hack_rewards"
    folder.mkdir()
    (folder / "hack.py").write_text(
        "from grpo_recipes.rewards.registry import reward\n\n"
        "@reward('always_formatted')\n"
        "def always_formatted(completions):\n"
        "    '''1.0 for any completion: a format reward the policy collects without solving anything.'''\n"
        "    return [1.0 for _ in completions]\n\n"
        "@reward('odd_length')\n"
        "def odd_length(completions):\n"
        "    '''1.0 for an odd number of characters: reward spread with nothing to learn.'''\n"
        "    return [float(len(c) % 2) for c in completions]\n"
    )
    return folder


def test_run_configured_to_hack_raises_the_format_hacking_alert(tiny_model_dir, run_env, hack_rewards):
    """Correctness weighted 0, a format reward anyone earns: the alert must reach Trackio's alerts table.

    A random tiny model cannot write \\boxed{}, so `always_formatted` stands in for a hackable format reward.
    Patience and baseline are 1 so that 2 steps suffice.
    """
    rewards = ('[{"name": "math_correctness", "weight": 0.0}, {"name": "always_formatted", "weight": 1.0}, '
               '{"name": "odd_length", "weight": 0.5}]')
    out = run_env / "out"
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(tiny_model_dir, out),
           "--reward_dirs", str(hack_rewards), "--rewards", rewards, "--format_reward", "always_formatted",
           "--alert_patience", "1", "--alert_baseline_steps", "1", "--eval_heldout", "false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with sqlite3.connect(run_env / "trackio" / "grpo-recipes-math.db") as con:
        titles = [t for (t,) in con.execute("SELECT title FROM alerts")]
        metrics = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics")]
    train = [m for m in metrics if "train/diag/adv_zero_frac" in m]
    assert len(train) == 2
    for m in train:  # binary rewards: a zero advantage is exactly a member of a zero-spread group, as TRL counts them
        assert m["train/diag/adv_zero_frac"] == pytest.approx(m["train/frac_reward_zero_std"])
        assert m["train/diag/frac_equal_groups"] == pytest.approx(m["train/frac_reward_zero_std"])
        assert (m["train/diag/adv_abs_mean"] > 0) == (m["train/frac_reward_zero_std"] < 1)
    assert titles.count(FormatHacking.title) == 1, titles  # once per episode, though both steps qualify
    assert "ALERT Format reward saturated, correctness flat" in proc.stderr
