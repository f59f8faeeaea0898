"""Kill and resume, end to end: the recipe as a subprocess with the tiny model, stopped by SIGTERM or SIGKILL,
then resumed. The resumed run must reach the same final step, with a gap-free, duplicate-free Trackio history in
which every row sits at its training step, and train on the same data with the same sampled completions as an
uninterrupted run.

Runs: 8 training rows, 2 prompts × 4 completions per step, so one epoch is 4 steps and 7 steps cross into a second
epoch. A probe reward (weight 0) records, for every generation batch, the step, its questions and its completions.
The held-out evaluation runs at steps 0, 2, 4, 6 and 7 (8 rows, 2 samples each); alerts are off (another feature).

No separate uninterrupted run is paid for: the part of each run before its kill *is* uninterrupted, and the two runs
are interrupted at different places (SIGTERM after step 5, in the second epoch; SIGKILL with the resume from step 2 or
4), so every step of one is checked against an uninterrupted or differently-resumed record of the other.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import REPO, tiny_run_args

from grpo_recipes.rewards.registry import completion_text
from grpo_recipes.state.checkpoint import SENTINEL, checkpoint_dirs, verify

RECIPE = REPO / "recipes/math_grpo.py"
PROJECT = "grpo-recipes-math"
STEPS = 7
EVAL_STEPS = [0, 2, 4, 6, 7]  # train start, every 2 steps, the end
PROBE_TIMING = "walltime/rewards/order_probe"  # TRL's profiling row for the probe reward's call, as Trackio stores it
HUNG = 1200  # seconds after which a run counts as hung; a run takes minutes on a loaded 2-core machine

PROBE = '''
import json
from grpo_recipes.rewards import reward


@reward("order_probe")
def order_probe(completions, question, trainer_state, *, path: str = ""):
    """Appends {step, questions, completions} for every batch it scores; scores nothing (weight 0)."""
    with open(path, "a") as f:
        f.write(json.dumps({"step": trainer_state.global_step + 1, "questions": list(question),
                            "completions": list(completions)}) + "\\n")
    return [0.0] * len(completions)
'''


def run_argv(model_dir: Path, root: Path) -> list[str]:
    rewards = root / "probe_rewards"
    rewards.mkdir(exist_ok=True)
    (rewards / "order_probe.py").write_text(PROBE)
    spec = [{"name": "math_correctness"}, {"name": "order_probe", "weight": 0.0,
                                           "params": {"path": str(root / "probe.jsonl")}}]
    return tiny_run_args(model_dir, root / "out", STEPS) + [
        "--train_size", "8", "--save_strategy", "steps", "--save_steps", "2", "--save_total_limit", "2",
        "--reward_dirs", str(rewards), "--rewards", json.dumps(spec), "--eval_every_steps", "2", "--eval_k", "2",
        "--alerts", "false",
    ]


def env_for(root: Path) -> dict:
    return {**os.environ, "TRACKIO_DIR": str(root / "trackio"), "GRPO_RECIPES_CACHE": str(root / "cache"),
            "HF_HUB_OFFLINE": "1"}


def launch(argv: list[str], root: Path, log: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(RECIPE), *argv], cwd=root, env=env_for(root),
                            stdout=open(root / log, "w"), stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, root: Path, log: str, timeout: float = HUNG) -> tuple[int, str]:
    rc = proc.wait(timeout=timeout)
    return rc, (root / log).read_text()


def train_rows(root: Path) -> list[int]:
    """global_step of every training record (train/loss) in Trackio's database, in log order."""
    db = root / "trackio" / f"{PROJECT}.db"
    if not db.is_file():
        return []
    try:
        with sqlite3.connect(db, timeout=5) as con:
            rows = con.execute("SELECT metrics FROM metrics").fetchall()
    except sqlite3.OperationalError:  # created but not initialised yet
        return []
    records = [json.loads(m) for (m,) in rows]
    return [int(r["train/global_step"]) for r in records if "train/loss" in r]


def history(root: Path) -> list[tuple[int, dict]]:
    """(Trackio step, metrics) of every row of the run, in log order."""
    with sqlite3.connect(root / "trackio" / f"{PROJECT}.db") as con:
        return [(step, json.loads(m)) for step, m in con.execute("SELECT step, metrics FROM metrics ORDER BY id")]


def assert_rows_at_training_steps(root: Path) -> None:
    """Every row of the run at the training step it belongs to, each step's records exactly once: checked against
    what the probe reward and the held-out evaluation recorded themselves, not against Trackio's own numbers."""
    rows, steps, probe = history(root), list(range(1, STEPS + 1)), probe_records(root)
    assert sorted(s for s, m in rows if "train/loss" in m) == steps  # one training record per step
    assert [(s, m["train/global_step"]) for s, m in rows if "train/global_step" in m and s != m["train/global_step"]
            ] == []
    tables = {}  # step -> completions of its table
    for step, m in rows:
        if "completions" in m:
            assert step not in tables, f"two completions tables at step {step}"
            tables[step] = sorted(completion_text(r["completion"]) for r in m["completions"]["_value"])
    assert tables == {s: sorted(probe[s][1]) for s in steps}  # the table at s holds the completions sampled at s
    summary = json.loads((root / "out" / "eval_summary.json").read_text())
    made = {e["step"]: e["mean_length"] for e in summary["evaluations"]}  # as the evaluation recorded itself
    evaluations = [(s, m["eval/mean_length"]) for s, m in rows if "eval/mean_length" in m]
    assert sorted(s for s, _ in evaluations) == sorted(made) == EVAL_STEPS  # once each, start and end included
    assert dict(evaluations) == made
    assert summary["start"]["step"] == 0 and summary["end"]["step"] == STEPS
    # The paired gain and the per-question file compare the step-0 evaluation (made before the kill) with the last.
    lines = [json.loads(x) for x in (root / "out" / "eval_completions.jsonl").read_text().splitlines()]
    assert {(r["start"]["step"], r["end"]["step"]) for r in lines} == {(0, STEPS)}
    assert sum(bool(r["start"]["correct"]) for r in lines) / len(lines) == summary["start"]["pass_at_1"]
    assert summary["greedy_gain"]["rows"] == len(lines)
    # The probe's timing row at the step whose batch it scored; no timing row outside the steps trained.
    assert sorted(s for s, m in rows if PROBE_TIMING in m) == sorted(probe) == steps
    assert {s for s, m in rows if any(k.startswith("walltime/") for k in m)} == set(steps)


def wait_for_step(proc: subprocess.Popen, root: Path, step: int, timeout: float = HUNG) -> None:
    deadline = time.monotonic() + timeout
    while max(train_rows(root), default=0) < step:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before step {step}"
        assert time.monotonic() < deadline, f"no step {step} after {timeout}s"
        time.sleep(0.2)


def wait_for_checkpoint(proc: subprocess.Popen, path: Path, timeout: float = HUNG) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_dir() or verify(path) is not None:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {path.name} was complete"
        assert time.monotonic() < deadline, f"no complete {path.name} after {timeout}s"
        time.sleep(0.2)


def probe_records(root: Path) -> dict[int, tuple[list[str], list[str]]]:
    """step -> (questions, sampled completions) of its batch; a step scored twice (before a kill, and again after
    the resume) keeps the last. Same completions = same weights and same RNG state."""
    out = {}
    for line in (root / "probe.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[record["step"]] = (record["questions"], record["completions"])
    return out


def completed(records: dict, last: int) -> dict:
    """The records of the steps a killed process finished (it may have scored the next step before dying)."""
    return {s: r for s, r in records.items() if s <= last}


@pytest.fixture(scope="module")
def sigterm_run(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("sigterm")
    argv = run_argv(tiny_model_dir, root)
    proc = launch(argv, root, "first.log")
    wait_for_step(proc, root, 4)  # checkpoint-4 is marked (its row is flushed then): the signal lands in step 5
    proc.send_signal(signal.SIGTERM)
    rc1, log1 = finish(proc, root, "first.log")
    stopped = max(train_rows(root), default=0)
    before = completed(probe_records(root), stopped)
    final_model_after_stop = (root / "out" / "model.safetensors").exists()
    why_incomplete = verify(root / "out" / f"checkpoint-{stopped}")  # before the resumed run rotates it away
    proc = launch(argv + ["--resume"], root, "resume.log")
    rc2, log2 = finish(proc, root, "resume.log")
    return SimpleNamespace(root=root, rc1=rc1, log1=log1, stopped=stopped, before=before,
                           final_model_after_stop=final_model_after_stop, why_incomplete=why_incomplete,
                           rc2=rc2, log2=log2)


@pytest.fixture(scope="module")
def sigkill_run(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("sigkill")
    argv = run_argv(tiny_model_dir, root)
    proc = launch(argv, root, "first.log")
    out = root / "out"
    # Killed right after checkpoint-4 is marked, two steps before the next save: checkpoints 2 and 4 are complete.
    # (Killing on the step-4 Trackio row instead can land inside the save of checkpoint-4, which then has no marker:
    # the real thing, but not deterministic.)
    wait_for_checkpoint(proc, out / "checkpoint-4")
    proc.send_signal(signal.SIGKILL)
    rc1, _ = finish(proc, root, "first.log")
    complete = [p for _, p in checkpoint_dirs(out) if verify(p) is None]
    assert [p.name for p in complete] == ["checkpoint-2", "checkpoint-4"]
    # Make it a kill in the middle of writing checkpoint-4: the marker was never written and a file is cut short.
    # Resume must fall back to checkpoint-2, and steps 3-4, already logged, would be logged twice unless pruned.
    torn, good = complete[-1], complete[-2]
    (torn / SENTINEL).unlink()
    with open(torn / "model.safetensors", "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    logged_before = train_rows(root)
    before = completed(probe_records(root), max(logged_before))
    proc = launch(argv + ["--resume"], root, "resume.log")
    rc2, log2 = finish(proc, root, "resume.log")
    return SimpleNamespace(root=root, rc1=rc1, torn=torn, good=good, logged_before=logged_before, before=before,
                           rc2=rc2, log2=log2)


def test_sigterm_saves_stops_cleanly_and_resume_finishes_the_run(sigterm_run):
    r = sigterm_run
    assert r.rc1 == 128 + signal.SIGTERM, r.log1[-4000:]
    assert "SIGTERM received: saving a checkpoint at the end of this step" in r.log1
    assert 5 <= r.stopped < STEPS  # stopped inside the second epoch: the resume must restore its order
    assert f"interrupted by SIGTERM: stopped after step {r.stopped}, checkpoint saved to" in r.log1
    out = r.root / "out"
    assert r.why_incomplete is None  # the checkpoint the signal asked for is complete
    assert not r.final_model_after_stop and "model saved to" not in r.log1  # an interrupted run is not finished
    assert r.rc2 == 0, r.log2[-4000:]
    assert f"resuming from {out / f'checkpoint-{r.stopped}'} (step {r.stopped})" in r.log2
    assert "Resumed existing run" in r.log2  # the same Trackio run
    assert (out / "model.safetensors").is_file()
    assert sorted(train_rows(r.root)) == list(range(1, STEPS + 1))  # every step once: no gap, no duplicate
    assert_rows_at_training_steps(r.root)
    complete = [p.name for _, p in checkpoint_dirs(out) if verify(p) is None]
    assert len(complete) == 2 and complete[-1] == f"checkpoint-{STEPS}"  # save_total_limit 2; last step saved


def test_sigkill_resumes_from_the_last_complete_checkpoint(sigkill_run):
    r = sigkill_run
    assert r.rc1 == -signal.SIGKILL
    step = int(r.good.name.split("-")[1])
    assert max(r.logged_before) > step  # steps after the checkpoint were logged: they would come twice
    assert r.rc2 == 0, r.log2[-4000:]
    assert f"removing incomplete checkpoint {r.torn}" in r.log2
    assert f"resuming from {r.good} (step {step})" in r.log2
    assert sorted(train_rows(r.root)) == list(range(1, STEPS + 1))  # pruned, re-logged once, nothing missing
    assert_rows_at_training_steps(r.root)
    assert not r.torn.exists() or verify(r.torn) is None  # re-saved complete when its step came again (or rotated)


def test_resumed_runs_train_on_the_same_data_with_the_same_samples(sigterm_run, sigkill_run):
    """Questions and sampled completions of every step, whatever the interruption: the same as uninterrupted."""
    term, kill = probe_records(sigterm_run.root), probe_records(sigkill_run.root)
    assert sorted(term) == sorted(kill) == list(range(1, STEPS + 1))
    assert term[1][0] != term[5][0]  # the second epoch is reshuffled, so a replayed first epoch would show
    for uninterrupted in (sigterm_run.before, sigkill_run.before):  # what each run did before it was interrupted
        for step, record in uninterrupted.items():
            assert term[step] == record, f"step {step} differs from the uninterrupted record"
            assert kill[step] == record, f"step {step} differs from the uninterrupted record"
    assert term == kill  # steps after both interruptions: resumed at different points, still the same
