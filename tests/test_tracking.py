"""tracking.TrackioRun: every Trackio row of a run lands at the training step it belongs to, named for the dashboard.

Fast: the callback is driven by hand through the events a Trainer sends, with real Trackio writing to a temporary
folder; the rows are then read back from Trackio's SQLite database. The end-to-end runs (a real trainer, TRL's
profiling rows and completions tables, held-out evaluations, kill and resume) are in test_resume.py and
test_evaluate.py.
"""

import json
import os
import sqlite3
from types import SimpleNamespace

import pytest
import trackio
from transformers import TrainerControl, TrainerState
from transformers.integrations import TrackioCallback

from grpo_recipes.state import tracking

PROJECT = "steps"
GENERATE = "profiling/Time taken: RecipeTrainer.transformers.generate"  # TRL's profiling_context key
GENERATION = "walltime/generation"  # the key Trackio stores it under


@pytest.fixture
def trackio_dir(tmp_path):
    """Trackio writes to a fresh folder for the test, and back where it wrote before afterwards."""
    before, env = trackio.utils.TRACKIO_DIR, os.environ.get("TRACKIO_DIR")
    tracking.use_dir(tmp_path / "trackio")
    yield tmp_path / "trackio"
    if tracking.active():
        trackio.finish()
    tracking.use_dir(before)
    if env is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = env


def args(run_name: str = "r"):
    return SimpleNamespace(project=PROJECT, run_name=run_name, trackio_space_id=None, hub_private_repo=None,
                           trackio_bucket_id=None, to_dict=lambda: {"learning_rate": 1e-6})


def rows(db, run_name: str = "r") -> list[tuple[int, set]]:
    with sqlite3.connect(db) as con:
        raw = con.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (run_name,)).fetchall()
    return [(step, set(json.loads(m))) for step, m in raw]


def train_step(cb, state, control, step: int) -> None:
    """What one optimizer step logs, in the order a GRPO trainer logs it."""
    cb.on_step_begin(args(), state, control)
    # TRL's profiling_context names trainer.state.global_step, the last completed step, while it times this one.
    trackio.log({GENERATE: 0.1}, step=state.global_step)
    trackio.log({"mid_step": 1.0})  # anything else logged while the step runs belongs to it too
    state.global_step = step
    cb.on_step_end(args(), state, control)
    cb.on_log(args(), state, control, logs={"loss": 1.0, "reward": 0.5})  # TrackioCallback: no step
    trackio.log({"completions": trackio.Table(data=[[step, "a completion"]], columns=["step", "completion"])})


def test_every_row_lands_at_its_training_step_across_a_resume(trackio_dir):
    state, control = TrainerState(), TrainerControl()
    cb = tracking.TrackioRun(group="sweep")
    cb.on_train_begin(args(), state, control)
    cb.on_log(args(), state, control, logs={"eval_pass@1": 0.25})  # the held-out evaluation at train start
    for step in (1, 2):
        train_step(cb, state, control, step)
    trackio.log({"explicit": 1.0}, step=1)  # a step given by the caller (not TRL's profiling) is kept
    tracking.alert("stalled", "why", "warn")  # raised from on_log: the step just logged
    cb.on_log(args(), state, control, logs={"eval_pass@1": 0.5})  # evaluated at the end of step 2
    trackio.log({GENERATE: 0.1}, step=state.global_step)  # profiling outside a step (TRL's own eval loop)
    cb.on_log(args(), state, control, logs={"train_runtime": 9.0, "train_loss": 1.0, "epoch": 1.0})  # the summary
    cb.on_train_end(args(), state, control)
    assert not tracking.active()

    # Resumed from checkpoint-2 in a new process: Trackio's own counter would continue after its highest step.
    state, cb = TrainerState(global_step=2), tracking.TrackioRun(group="sweep")
    cb.on_train_begin(args(), state, control)
    train_step(cb, state, control, 3)
    cb.on_train_end(args(), state, control)
    cb.on_log(args(), state, control, logs={"eval_after": 1.0})  # a log after train end reopens the run (SFT's)
    trackio.finish()

    db = trackio_dir / f"{PROJECT}.db"
    table = {"completions"}
    train = {"train/loss", "train/reward", "train/global_step"}
    assert rows(db) == [
        (0, {"eval/pass@1", "train/global_step"}),
        (1, {GENERATION}), (1, {"mid_step"}), (1, train), (1, table),
        (2, {GENERATION}), (2, {"mid_step"}), (2, train), (2, table),
        (1, {"explicit"}),
        (2, {"eval/pass@1", "train/global_step"}),
        (2, {GENERATION}),
        (3, {GENERATION}), (3, {"mid_step"}), (3, train), (3, table),
        (3, {"eval/after", "train/global_step"}),
    ]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT title, step FROM alerts").fetchall() == [("stalled", 2)]
        configs = [json.loads(c) for (c,) in con.execute("SELECT config FROM configs")]
    assert configs and all(c[tracking.GROUP_KEY] == "sweep" for c in configs)  # the dashboard groups by it
    assert tracking.logged_steps(db, "r") == [1, 2, 3]


def test_rows_are_named_for_the_dashboard(trackio_dir):
    """Trackio shows a section per first key part, alphabetically (keys without one first): held-out eval/, then
    policy/ (four training curves again, by what they are), then train/ as TRL logs it, then TRL's timings under
    walltime/, named for what they time, not for TRL's private methods."""
    state, control = TrainerState(), TrainerControl()
    panels = tracking.Panels(["math_correctness", "boxed_format"], "math_correctness", "boxed_format")
    cb = tracking.TrackioRun(panels=panels)
    cb.on_train_begin(args(), state, control)
    cb.on_step_begin(args(), state, control)
    timed = ["transformers.generate", "_prepare_inputs", "_calculate_rewards", "math_correctness", "boxed_format",
             "_get_per_token_logps_and_entropies", "compute_loss", "sync_weights", "_some_new_method"]
    for what in timed:
        trackio.log({f"profiling/Time taken: RecipeTrainer.{what}": 0.1}, step=state.global_step)
    state.global_step = 1
    cb.on_step_end(args(), state, control)
    record = {"loss": 0.1, "reward": 0.5, "entropy": 2.0, "completions/mean_length": 30.0,
              "rewards/math_correctness/mean": 0.25, "rewards/boxed_format/mean": 0.75, "rewards/boxed_format/std": 0.1}
    cb.on_log(args(), state, control, logs=record)
    cb.on_train_end(args(), state, control)

    with sqlite3.connect(trackio_dir / f"{PROJECT}.db") as con:
        logged = [(step, json.loads(m)) for step, m in con.execute("SELECT step, metrics FROM metrics ORDER BY id")]
    timings = [key for _, m in logged[:len(timed)] for key in m]
    assert timings == ["walltime/generation", "walltime/prepare_batch", "walltime/rewards",
                       "walltime/rewards/math_correctness", "walltime/rewards/boxed_format", "walltime/logprobs",
                       "walltime/loss", "walltime/weight_sync", "walltime/some_new_method"]
    ((_, first),) = logged[len(timed):]
    assert {k: first[k] for k in first if k.startswith("policy/")} == {
        "policy/correctness": 0.25, "policy/format": 0.75, "policy/entropy": 2.0, "policy/mean_length": 30.0}
    assert first["train/rewards/math_correctness/mean"] == 0.25 and first["train/entropy"] == 2.0  # TRL's keys stay
    keys = {k for _, m in logged for k in m}
    assert not [k for k in keys if "._" in k or "Time taken" in k or "profiling" in k]
    assert {k.split("/")[0] for k in keys} == {"policy", "train", "walltime"}  # no key outside a section


def test_attach_replaces_transformers_callback(trackio_dir):
    handler = SimpleNamespace(callbacks=[object(), TrackioCallback(), object()])

    class Trainer:
        callback_handler = handler

        def remove_callback(self, cls):
            handler.callbacks.remove(next(cb for cb in handler.callbacks if isinstance(cb, cls)))

        def add_callback(self, cb):
            handler.callbacks.append(cb)

    tracking.attach(Trainer(), "g")
    found = [cb for cb in handler.callbacks if isinstance(cb, TrackioCallback)]
    assert len(found) == 1 and isinstance(found[0], tracking.TrackioRun) and found[0].group == "g"
    Trainer.reward_func_names = ["math_correctness", "boxed_format"]  # a GRPO trainer's: the first is correctness
    handler.callbacks = [TrackioCallback()]
    tracking.attach(Trainer(), "g", format_reward="boxed_format")
    [run] = handler.callbacks
    assert run.panels.timing("profiling/Time taken: T.boxed_format") == "walltime/rewards/boxed_format"
    assert run.panels.summary["policy/correctness"][-1] == "train/rewards/math_correctness/mean"
    handler.callbacks = [object()]
    with pytest.raises(RuntimeError, match="no TrackioCallback; is trackio in report_to"):
        tracking.attach(Trainer())
