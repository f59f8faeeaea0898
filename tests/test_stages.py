"""Stages: `stages: [{name: sft, ...}, {name: grpo}]` runs SFTTrainer then the GRPO trainer in one command, one output
folder and one Trackio run whose steps continue across stages; the held-out evaluation runs at each stage boundary;
`--resume` continues inside a stage and across a boundary; a stage's settings are checked at start-up."""

import json
import shutil
import sqlite3
import subprocess
import sys

import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.config import stages
from grpo_recipes.config.resolve import resolve
from grpo_recipes.errors import ConfigError
from grpo_recipes.run.runner import prepare
from grpo_recipes.state import checkpoint

MATH = REPO / "recipes" / "configs" / "math_cpu.yaml"
SFT = {"name": "sft", "max_steps": 2, "learning_rate": 1e-3, "lr_scheduler_type": "constant",
       "per_device_train_batch_size": 4, "max_length": 64}
PIPELINE = json.dumps([SFT, {"name": "grpo"}])


def _run(model_dir, out, tracks, *extra, steps=1):
    cmd = [sys.executable, str(REPO / "recipes" / "math_grpo.py"), *tiny_run_args(model_dir, out, steps),
           "--stages", PIPELINE, "--trackio_dir", str(tracks), "--run_name", "staged", "--report_to", "trackio",
           "--learning_rate", "1e-6", "--eval_size", "4", "--eval_k", "0", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=out.parent)


def _rows(tracks) -> list[tuple[int, dict]]:
    with sqlite3.connect(tracks / "grpo-recipes-math.db") as con:
        return [(s, json.loads(m)) for s, m in con.execute(
            "SELECT step, metrics FROM metrics WHERE run_name = 'staged' ORDER BY id")]


def _train_logs(tracks) -> dict[int, dict]:
    logs = {}
    for step, m in _rows(tracks):
        if "train/loss" in m:
            assert step not in logs, f"step {step} logged twice"
            logs[step] = m
    return logs


def test_sft_then_grpo_in_one_run_with_one_step_axis_and_an_evaluation_at_each_boundary(tiny_model_dir, run_env):
    out, tracks = run_env / "out", run_env / "trackio"
    proc = _run(tiny_model_dir, out, tracks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The sft stage trained into its own folder, marked done; the last stage into output_dir.
    sft_dir = out / "stages" / "1-sft"
    assert (sft_dir / "model.safetensors").is_file() and (out / "model.safetensors").is_file()
    assert json.loads((sft_dir / checkpoint.DONE).read_text())["global_step"] == 2
    logs = _train_logs(tracks)
    assert sorted(logs) == [1, 2, 3]  # one run: GRPO's first step is the run's third
    assert all("train/reward" not in logs[s] and logs[s]["train/learning_rate"] == 1e-3 for s in (1, 2))
    assert "train/reward" in logs[3] and logs[3]["train/learning_rate"] == 1e-6
    assert logs[3]["train/global_step"] == 3
    summary = json.loads((out / "eval_summary.json").read_text())
    assert [(e["step"], e["when"]) for e in summary["evaluations"]] == [(0, "start"), (2, "end of sft"), (3, "end")]
    assert [(s["stage"], s["from_step"], s["to_step"]) for s in summary["stages"]] == [("sft", 0, 2), ("grpo", 2, 3)]
    assert all(s["greedy_gain"]["rows"] == 4 for s in summary["stages"])
    evals = sorted(step for step, m in _rows(tracks) if "eval/pass@1" in m)
    assert evals == [0, 2, 3]
    assert "stage sft   steps 0-2" in proc.stdout


def test_resume_continues_inside_the_sft_stage_and_across_the_boundary(tiny_model_dir, run_env):
    saving = ("--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "5", "--eval_heldout", "false")
    straight_out, straight_tracks = run_env / "straight", run_env / "t1"
    proc = _run(tiny_model_dir, straight_out, straight_tracks, *saving, steps=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    straight = _train_logs(straight_tracks)
    assert sorted(straight) == [1, 2, 3, 4]

    # Stopped after the sft stage's step 1: its checkpoint alone, resumed, trains steps 2-4 as the straight run did.
    out, tracks = run_env / "resumed", run_env / "t2"
    shutil.copytree(straight_out / "stages" / "1-sft" / "checkpoint-1", out / "stages" / "1-sft" / "checkpoint-1")
    proc = _run(tiny_model_dir, out, tracks, *saving, "--resume", steps=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = _train_logs(tracks)
    assert sorted(again) == [2, 3, 4]
    for step in (2, 3, 4):
        assert again[step]["train/learning_rate"] == straight[step]["train/learning_rate"]
        assert again[step]["train/loss"] == pytest.approx(straight[step]["train/loss"], rel=1e-3, abs=1e-6)

    # Killed inside GRPO (its checkpoint-1, the run's step 3): the sft stage is skipped, GRPO resumes at its step 1,
    # and Trackio keeps one row per step.
    for _, path in stages_checkpoints(out):
        if path.name == "checkpoint-2":
            shutil.rmtree(path)
    proc = _run(tiny_model_dir, out, tracks, *saving, "--resume", steps=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "stage 1-sft: finished at step 2; resuming after it" in proc.stderr
    assert "resuming from" in proc.stderr and "checkpoint-1 (step 1)" in proc.stderr
    assert sorted(_train_logs(tracks)) == [2, 3, 4]


def stages_checkpoints(out):
    from grpo_recipes.state.checkpoint import checkpoint_dirs

    return checkpoint_dirs(out)


def test_a_second_run_into_a_staged_output_dir_is_refused(tiny_model_dir, run_env):
    out = run_env / "out"
    (out / "stages" / "1-sft").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"already holds checkpoints of an earlier run \(stages/1-sft\)"):
        prepare("math", tiny_run_args(tiny_model_dir, out, 1, "--stages", PIPELINE), MATH)


@pytest.mark.parametrize("entries, message", [
    ([{"name": "sft", "max_step": 2}, {"name": "grpo"}],
     "stages[0].max_step: unknown setting of the sft stage; did you mean `max_steps`?"),
    ([{"name": "sft", "max_steps": 2}, {"name": "grpo", "max_steps": 3}],
     "stages[1]: the last stage (grpo) is configured by the flat keys; move max_steps out of its entry"),
    ([{"name": "sft"}, {"name": "grpo"}], "stages[0].max_steps: an earlier stage needs a number of steps >= 1"),
    ([{"name": "sft", "max_steps": 2, "learning_rate": 0}, {"name": "grpo"}],
     "stages[0] (sft): learning_rate: 0; it must be > 0"),
    ([{"name": "sft", "max_steps": 2, "sft_format": "boxd"}, {"name": "grpo"}],
     "stages[0] (sft): sft_format: 'boxd' is not one of demonstration"),
    ([{"name": "sft", "max_steps": 2}, {"name": "grpo"}, {"name": "grpo"}], "stages: one grpo stage per run"),
])
def test_stage_settings_that_cannot_work_are_named_before_anything_loads(entries, message, run_env):
    with pytest.raises(ConfigError) as err:
        prepare("math", ["--output_dir", str(run_env / "out"), "--stages", json.dumps(entries)], MATH)
    assert message in str(err.value)


def test_a_stage_without_a_name_it_knows_is_refused_while_parsing(run_env):
    with pytest.raises(ConfigError, match=r"stages\[0\]: expected a mapping with `name` one of sft, distill, grpo"):
        resolve(["--output_dir", str(run_env / "out"), "--stages", '[{"name": "dpo"}]'], MATH)


def test_an_earlier_stage_takes_the_shared_settings_and_keeps_its_own_pace(run_env):
    argv = ["--output_dir", str(run_env / "out"), "--seed", "7", "--logging_steps", "3"]
    config = resolve(argv, MATH)
    recipe, training = config.recipe, config.training
    plans, problems = stages.plan_stages(recipe, training)
    assert problems == []
    sft, grpo = plans
    assert (sft.name, grpo.name, grpo.training) == ("sft", "grpo", training)
    cfg = sft.training
    assert (cfg.seed, cfg.logging_steps, cfg.save_steps) == (7, 3, training.save_steps)  # shared
    assert (cfg.max_steps, cfg.learning_rate, cfg.per_device_train_batch_size) == (24, 3e-5, 2)  # its own entry
    assert (cfg.gradient_accumulation_steps, training.gradient_accumulation_steps) == (8, 16)
    assert cfg.output_dir == str(run_env / "out" / "stages" / "1-sft")


def test_the_last_stage_picks_the_flat_keys_config():
    assert stages.final_stage({"stages": [{"name": "sft"}, {"name": "grpo"}]}, []) == "grpo"
    assert stages.final_stage({"stages": ["sft"]}, []) == "sft"
    assert stages.final_stage({"stages": ["sft"]}, ["--stages", '["sft", "grpo"]']) == "grpo"
    assert stages.final_stage({}, ["--stages=[\"sft\"]"]) == "sft"
    assert stages.final_stage({}, []) == "grpo"


def test_every_configured_stage_name_has_a_kind():
    """config/schema.STAGE_CONFIGS is the one list of stage names; the runner has a kind for each."""
    from grpo_recipes.config.schema import STAGE_CONFIGS
    from grpo_recipes.run.runner import KINDS

    assert set(KINDS) == set(STAGE_CONFIGS) == {"sft", "distill", "grpo"}
