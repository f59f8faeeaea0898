"""Checkpoint markers, retention, Trackio pruning, signal handling, sampler order and the reward failure stop.

Fast unit tests: no model, no training. The end-to-end kill/resume runs are in test_resume.py.
"""

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import fake_checkpoint

from grpo_recipes.config import checks
from grpo_recipes.errors import RewardFailureRateExceeded
from grpo_recipes.rewards import registry
from grpo_recipes.rewards.registry import CompiledReward, RewardSpec
from grpo_recipes.state import checkpoint, tracking
from grpo_recipes.state.checkpoint import SENTINEL, CheckpointCallback, latest_complete, mark_complete, rotate, verify
from grpo_recipes.state.signals import SignalStop
from grpo_recipes.state.tracking import prune_metrics

# ------------------------------------------------------------------------------------------------ markers


def test_a_marked_checkpoint_is_complete_and_damage_is_detected(tmp_path):
    path = fake_checkpoint(tmp_path, 4)
    assert verify(path) is None
    manifest = json.loads((path / SENTINEL).read_text())
    assert manifest["step"] == 4 and manifest["files"]["optimizer.pt"] == 2000

    with open(path / "optimizer.pt", "r+b") as f:  # a file cut short after the marker was written
        f.truncate(100)
    assert "optimizer.pt has 100 bytes, 2000 were written" in verify(path)

    (path / "optimizer.pt").unlink()
    assert "optimizer.pt is missing" in verify(path)

    (path / SENTINEL).unlink()
    assert "the save did not finish" in verify(path)


def test_marker_must_match_the_folder_and_vouch_for_trainer_state(tmp_path):
    path = fake_checkpoint(tmp_path, 4)
    moved = path.rename(tmp_path / "checkpoint-6")
    assert "is for step 4, not 6" in verify(moved)

    other = tmp_path / "checkpoint-8"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"w")
    mark_complete(other, 8)  # the Trainer died before trainer_state.json: not resumable
    assert "trainer_state.json was not saved" in verify(other)


def test_latest_complete_skips_half_written_checkpoints(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    fake_checkpoint(tmp_path, 6, complete=False)  # killed while saving
    truncated = fake_checkpoint(tmp_path, 8)
    (truncated / "model.safetensors").write_bytes(b"")
    best, invalid = latest_complete(tmp_path)
    assert best == tmp_path / "checkpoint-4"
    assert [p.name for p, _ in invalid] == ["checkpoint-8", "checkpoint-6"]


def test_retention_counts_only_complete_checkpoints_and_keeps_the_newest(tmp_path):
    for step in (2, 4, 6, 8):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 10, complete=False)
    removed = rotate(tmp_path, keep=2)
    assert [p.name for p in removed] == ["checkpoint-2", "checkpoint-4"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]  # the incomplete one is not counted

    # keep=1 is safe: the previous checkpoint goes only once the new one is marked complete
    assert [p.name for p in rotate(tmp_path, keep=1)] == ["checkpoint-6"]
    assert verify(tmp_path / "checkpoint-8") is None


def test_retention_protects_the_best_checkpoint(tmp_path):
    for step in (2, 4, 6):
        fake_checkpoint(tmp_path, step)
    removed = rotate(tmp_path, keep=2, protect=tmp_path / "checkpoint-2")
    assert [p.name for p in removed] == ["checkpoint-4"]
    assert rotate(tmp_path, keep=None) == [] and rotate(tmp_path, keep=0) == []


# --------------------------------------------------------------------------------------- start-up decisions


def _args(tmp_path, **kw):
    recipe = SimpleNamespace(resume=kw.pop("resume", False), overwrite_output_dir=kw.pop("overwrite", False))
    grpo = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=kw.pop("resume_from", None),
                           run_name=kw.pop("run_name", None), report_to=[])
    return recipe, grpo


def test_the_start_resumes_from_the_latest_complete_checkpoint(tmp_path):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    fake_checkpoint(tmp_path, 6, complete=False)
    recipe, grpo = _args(tmp_path, resume=True)
    point = checkpoint.start_point(recipe, grpo)
    assert point.resume_from == tmp_path / "checkpoint-4" and point.start_step == 4
    assert [p.name for p, _ in point.incomplete] == ["checkpoint-6"]
    assert point.replace_metrics
    assert (tmp_path / "checkpoint-6").is_dir()  # planning changes nothing on disk

    recipe, grpo = _args(tmp_path, overwrite=True)
    point = checkpoint.start_point(recipe, grpo)
    assert point.resume_from is None and point.start_step == 0 and len(point.discard) == 3


def test_a_resumed_run_keeps_the_run_name_it_started_under(tmp_path):
    """Resolved once, at start-up: the derived name would change with a setting it shows (the learning rate)."""
    from helpers import REPO

    from grpo_recipes.config.resolve import resolve

    math = REPO / "recipes" / "configs" / "math_cpu.yaml"
    out = ["--output_dir", str(tmp_path)]
    assert checkpoint.stored_run_name(tmp_path) is None
    (tmp_path / checkpoint.RUN_INFO).write_text(json.dumps({"project": "p", "run_name": "first-name"}))
    assert checkpoint.stored_run_name(tmp_path) == "first-name"
    assert resolve([*out, "--resume", "--learning_rate", "2e-5"], math).training.run_name == "first-name"
    assert resolve([*out, "--resume", "--run_name", "explicit"], math).training.run_name == "explicit"
    assert resolve(out, math).training.run_name != "first-name"  # a fresh start names itself (output_dir checks it)


def test_output_dir_conflicts(tmp_path):
    recipe, grpo = _args(tmp_path)
    assert checkpoint.output_dir_problems(recipe, grpo) == []  # empty output dir: fine
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    [problem] = checkpoint.output_dir_problems(recipe, grpo)
    assert "already holds checkpoints" in problem and "--resume" in problem and "--overwrite_output_dir" in problem
    recipe, grpo = _args(tmp_path, resume_from=str(tmp_path / "checkpoint-2"))
    [problem] = checkpoint.output_dir_problems(recipe, grpo)
    assert "checkpoint-2 is older than checkpoint-4" in problem
    recipe, grpo = _args(tmp_path, resume=True)
    assert checkpoint.output_dir_problems(recipe, grpo) == []


# --------------------------------------------------------------------------------------------- Trackio


def _trackio_db(path: Path, rows: list[tuple[str, int, dict]]) -> Path:
    """A database with Trackio's `metrics` columns, holding rows in the shapes transformers and TRL write."""
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, timestamp TEXT, "
                    "run_name TEXT, step INTEGER, metrics TEXT)")
        con.executemany("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES ('id', '', ?, ?, ?)",
                        [(run, step, json.dumps(m)) for run, step, m in rows])
    return path


def _logged_run(run: str, last: int) -> list[tuple[str, int, dict]]:
    """What one run logs per step s, each row at s (tracking.TrackioRun): timing rows, the train record, the
    completions table."""
    rows = []
    for s in range(1, last + 1):
        rows.append((run, s, {"walltime/generation": 0.1}))
        rows.append((run, s, {"train/loss": 0.0, "train/global_step": s}))
        rows.append((run, s, {"completions": {"_type": "trackio.table", "_value": [{"step": s, "prompt": "q"}]}}))
    return rows


def test_prune_removes_exactly_the_steps_after_the_checkpoint(tmp_path):
    rows = _logged_run("r", 5) + [("r", 2, {"custom": 1}), ("r", 99, {"custom": 1})] + _logged_run("other", 5)
    db = _trackio_db(tmp_path / "p.db", rows)
    removed = prune_metrics(db, "r", after_step=3)
    assert removed == 2 * 3 + 1  # steps 4 and 5 (timing, train, table each) and the row at step 99
    assert tracking.logged_steps(db, "r") == [1, 2, 3]
    assert tracking.logged_steps(db, "other") == [1, 2, 3, 4, 5]  # another run is untouched
    assert sorted(step for step, _ in tracking._rows(db, "r")) == [1, 1, 1, 2, 2, 2, 2, 3, 3, 3]
    with sqlite3.connect(db) as con:
        tables = [json.loads(m) for (m,) in con.execute("SELECT metrics FROM metrics WHERE run_name='r'")]
    assert sorted(t["completions"]["_value"][0]["step"] for t in tables if "completions" in t) == [1, 2, 3]
    assert prune_metrics(db, "r", after_step=3) == 0
    assert prune_metrics(db, "r", after_step=0) == 10 and tracking.logged_steps(db, "r") == []


def test_prune_drops_later_alerts_and_a_fresh_start_drops_step_zero(tmp_path):
    rows = [("r", 0, {"eval/pass@1": 0.3, "train/global_step": 0})] + _logged_run("r", 4)
    db = _trackio_db(tmp_path / "p.db", rows + _logged_run("other", 2))
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE alerts (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, timestamp TEXT, "
                    "run_name TEXT, title TEXT, text TEXT, level TEXT, step INTEGER, alert_id TEXT)")
        con.executemany("INSERT INTO alerts (run_id, timestamp, run_name, title, level, step) "
                        "VALUES ('id', '', ?, ?, 'warn', ?)", [("r", "early", 2), ("r", "late", 3), ("other", "x", 3)])

    def alerts():
        with sqlite3.connect(db) as con:
            return sorted(con.execute("SELECT run_name, title FROM alerts").fetchall())

    prune_metrics(db, "r", after_step=2)  # resume from checkpoint-2
    assert tracking.logged_steps(db, "r") == [1, 2]
    assert alerts() == [("other", "x"), ("r", "early")]
    prune_metrics(db, "r", after_step=-1)  # a fresh start: the step-0 evaluation and every alert of the run go too
    assert tracking._rows(db, "r") == [] and alerts() == [("other", "x")]
    assert tracking.logged_steps(db, "other") == [1, 2]


def test_a_fresh_start_into_an_existing_trackio_run_is_refused(tmp_path, monkeypatch):
    db = _trackio_db(tmp_path / "p.db", _logged_run("r", 2))
    monkeypatch.setattr(tracking, "project_db", lambda project: db)
    grpo = SimpleNamespace(report_to=["trackio"], project="p", run_name="r")
    [problem] = checks.metric_history_problems(checkpoint.StartPoint(tmp_path), grpo)
    assert "already has a run 'r' with metrics up to step 2" in problem and "--resume" in problem
    assert checks.metric_history_problems(checkpoint.StartPoint(tmp_path, replace_metrics=True), grpo) == []
    grpo.run_name = "new"
    assert checks.metric_history_problems(checkpoint.StartPoint(tmp_path), grpo) == []


# -------------------------------------------------------------------------------------------------- signals


def test_first_signal_asks_for_a_checkpoint_then_a_stop(tmp_path):
    stop = SignalStop()
    stop.install()
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is not stop._handle
    callback = CheckpointCallback(keep=2, stop=stop)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_step_end(SimpleNamespace(), SimpleNamespace(global_step=7), control)
    assert control.should_save and control.should_training_stop and callback.stopped_at == 7


def test_no_signal_changes_nothing():
    callback = CheckpointCallback(keep=2, stop=SignalStop())
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_step_end(SimpleNamespace(), SimpleNamespace(global_step=3), control)
    assert not control.should_save and not control.should_training_stop and callback.stopped_at is None


def test_second_signal_exits_at_once():
    # A forked child, not a new interpreter: the default action of the signal ends the process that gets it.
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            stop = SignalStop()
            stop.install()
            signal.raise_signal(signal.SIGTERM)
            os.write(write_fd, b"first handled;")
            signal.raise_signal(signal.SIGTERM)
            time.sleep(5)
            os.write(write_fd, b"still alive;")
        finally:
            os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        said = f.read()
    assert said == "first handled;"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


# ---------------------------------------------------------------------------------------------- data order


def test_resumed_epoch_sees_the_order_an_uninterrupted_run_sees():
    import torch
    from trl.trainer.utils import RepeatSampler

    def order(sampler):
        return list(iter(sampler))

    class Loader:  # the attribute path of accelerate's DataLoaderShard -> BatchSampler -> sampler
        def __init__(self, sampler):
            self.batch_sampler = SimpleNamespace(sampler=sampler)

        def __len__(self):
            return 4  # batches per epoch

    data = list(range(8))
    args = SimpleNamespace(gradient_accumulation_steps=1)
    plain = RepeatSampler(data, mini_repeat_count=2, batch_size=2, seed=42)
    uninterrupted = [order(plain) for _ in range(3)]
    assert uninterrupted[0] != uninterrupted[2]

    # with the callback from the start: the same orders (it only re-derives what the generator would give)
    sampler = RepeatSampler(data, mini_repeat_count=2, batch_size=2, seed=42)
    cb = CheckpointCallback(keep=None)
    with_cb = []
    for epoch in range(3):
        cb.on_epoch_begin(args, SimpleNamespace(global_step=epoch * 4), None, train_dataloader=Loader(sampler))
        with_cb.append(order(sampler))
    assert with_cb == uninterrupted

    # resumed at step 9 (epoch 2): a fresh sampler would replay epoch 0's order; the callback gives epoch 2's
    fresh = RepeatSampler(data, mini_repeat_count=2, batch_size=2, seed=42)
    assert order(RepeatSampler(data, mini_repeat_count=2, batch_size=2, seed=42)) == uninterrupted[0]
    CheckpointCallback(keep=None).on_epoch_begin(args, SimpleNamespace(global_step=9), None,
                                                 train_dataloader=Loader(fresh))
    assert order(fresh) == uninterrupted[2]
    assert isinstance(fresh.generator, torch.Generator)


# ------------------------------------------------------------------------------------------- reward faults


def _reward(func, **kw):
    rdef = registry._describe(func, "flaky", "test")
    faults = []
    return CompiledReward(rdef, RewardSpec("flaky"), fault_log=faults.append, **kw), faults


def test_fault_rate_is_logged_and_a_low_rate_keeps_going():
    def sometimes(completions):
        return [1.0 if c != "bad" else 1 / 0 for c in completions]

    fn, faults = _reward(sometimes, max_failure_rate=0.25, failure_window=8)
    metrics = {}
    for _ in range(5):  # 1 fault in 4 completions = 25%: at the limit, not over it
        fn(["a", "b", "c", "bad"], log_metric=lambda k, v: metrics.__setitem__(k, v))
    assert metrics["rewards/flaky/fault_rate"] == pytest.approx(0.25)
    assert len(faults) == 5


def test_too_many_faults_stop_the_run_with_the_reason():
    def broken(completions):
        return [1 / 0 for _ in completions]

    fn, faults = _reward(broken, max_failure_rate=0.1, failure_window=64)
    expected = r"raised on 8 of the last 8 completions .*max_reward_failure_rate"
    with pytest.raises(RewardFailureRateExceeded, match=expected):
        fn(["x"] * 8)  # 8 faults already exceed 10% of any 64-completion window: no need to wait for it to fill
    assert len(faults) == 8  # every fault was recorded before stopping


def test_a_burst_of_faults_stops_only_when_the_window_rate_is_over():
    def flaky(completions):
        return [1 / 0 if c == "bad" else 0.0 for c in completions]

    fn, _ = _reward(flaky, max_failure_rate=0.5, failure_window=8)
    fn(["bad", "bad", "ok", "ok"])  # 2 faults: under 0.5 × 8
    fn(["ok"] * 4)  # window full, 2/8 = 25%
    fn(["bad"] * 4)  # window: ok ok ok ok bad bad bad bad = 50%: at the limit
    with pytest.raises(RewardFailureRateExceeded):
        fn(["bad"])  # 5/8


def test_no_limit_means_no_stop():
    fn, _ = _reward(lambda completions: [1 / 0 for _ in completions])
    assert fn(["x"] * 100) == [None] * 100


def test_main_reports_a_reward_failure_stop_with_exit_code_3(monkeypatch, run_env, capsys):
    """The runner glue: the stop raised inside TRL's reward step ends the run with a clear message, no traceback."""
    from helpers import REPO

    from grpo_recipes.run import runner

    class Trainer:  # stands in for the model: only what runner.main and checkpoint.start touch
        accelerator = SimpleNamespace(num_processes=1)

        def __init__(self, args):
            self.args, self.callbacks = args, []

        def add_callback(self, callback):
            self.callbacks.append(callback)

        def train(self, resume_from_checkpoint=None):
            raise RewardFailureRateExceeded("reward 'x' raised on 9 of the last 10 completions")

        def end(self):
            self.ended = True

    before = signal.getsignal(signal.SIGTERM)
    made = []
    monkeypatch.setattr(runner, "build_trainer", lambda run, stage, model: made.append(Trainer(stage.spec.training))
                        or made[-1])
    argv = ["--output_dir", str(run_env / "out"), "--train_size", "40", "--eval_size", "8", "--save_total_limit", "3"]
    rc = runner.main("math", REPO / "recipes/configs/math_cpu.yaml", argv)
    assert rc == 3 and made[0].ended  # trackers finished before the exit
    assert "error: reward 'x' raised on 9 of the last 10 completions" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


def test_trackio_dir_switches_an_already_imported_trackio(tmp_path):
    """Trackio fixes its folder when first imported (trl imports it long before a recipe's config is read);
    tracking.use_dir points it at another folder afterwards: the run's database and media land there, nothing in
    the folder it was imported with, and child processes inherit the new folder. In a fresh interpreter, so that
    this session's Trackio is left alone."""
    first, second = tmp_path / "first", tmp_path / "second"
    code = f"""
import os, subprocess, sys
from pathlib import Path
import numpy as np
import trackio
from grpo_recipes.state import tracking  # imports trackio at its top, like trl does

assert trackio.utils.TRACKIO_DIR.resolve() == Path({str(first)!r}).resolve()
tracking.use_dir({str(second)!r})
trackio.init(project="switch", name="r")
image, other = (trackio.Image(np.full((4, 4, 3), v, dtype=np.uint8)) for v in (0, 255))
trackio.log({{"x": 1.0, "picture": image, "table": trackio.Table(data=[[other]], columns=["picture"])}})
trackio.finish()
print(tracking.project_db("switch"))
print(subprocess.run([sys.executable, "-c", "import os; print(os.environ['TRACKIO_DIR'])"], capture_output=True,
                     text=True, check=True).stdout.strip())
"""
    import subprocess
    import sys

    env = {**os.environ, "TRACKIO_DIR": str(first)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    db, child_dir = proc.stdout.strip().splitlines()[-2:]
    assert Path(db) == second.resolve() / "switch.db" and Path(db).is_file() and child_dir == str(second.resolve())
    with sqlite3.connect(db) as con:
        [(metrics,)] = con.execute("SELECT metrics FROM metrics WHERE run_name = 'r'").fetchall()
    assert json.loads(metrics)["x"] == 1.0
    media = [p for p in (second / "media").rglob("*") if p.is_file()]
    assert len(media) >= 2  # the image, and the one in the table
    assert not first.exists() or [p for p in first.rglob("*") if p.is_file()] == []


def test_trackio_dir_cannot_move_an_open_run(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_current_run", lambda: object())
    with pytest.raises(RuntimeError, match="a Trackio run is open"):
        tracking.use_dir(tmp_path)
