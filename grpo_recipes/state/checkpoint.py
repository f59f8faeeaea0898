"""Checkpoints that survive kills, a clean stop on SIGTERM/SIGINT, and exact resume (docs/reliability.md), for the
GRPO and SFT runs alike.

Atomic checkpoints. transformers 5.24's `Trainer._save_checkpoint` writes straight into `checkpoint-N` (no temp dir),
so a kill during a save leaves a half-written folder that `get_last_checkpoint` would happily pick. Rather than
re-implementing the save, completeness is marked: after everything is written (model, optimizer, scheduler, RNG,
trainer_state.json, TRL's extras), `on_save` fsyncs the files and writes `checkpoint_complete.json` last, atomically
(temp file + rename), listing every file with its size. A checkpoint is valid only if that marker exists and every file
it lists is there with that size; resume picks the newest valid one and removes the invalid ones.

Retention is taken over from the Trainer: its rotation runs *before* `on_save`, counts half-written folders, and with
save_total_limit=1 deletes the previous good checkpoint before the new one is marked. Here the oldest complete
checkpoints beyond the limit are deleted only after the new one is marked, so a complete checkpoint exists at all times.

Resume restores model, optimizer, scheduler and RNG through the Trainer, which also fast-forwards the data within
the interrupted epoch. TRL's RepeatSampler draws each epoch's order from one generator seeded once, so a run resumed
in a later epoch would replay the first epoch's order; `on_epoch_begin` re-derives the generator for the epoch so the
order is the one an uninterrupted run sees.

Metric history. Every Trackio row is logged at its training step (tracking.TrackioRun), and
`trackio.init(resume="allow")` appends to the run of the same name. After a SIGKILL at step k with the last valid
checkpoint at c < k, steps c+1..k would be logged twice. Before training restarts, the rows of this run at steps after
c are deleted from Trackio's local SQLite database (they are about to be recomputed, and the recomputed values are the
ones that lead to the final model). `on_save` also flushes Trackio's write queue before marking a checkpoint complete,
so every step up to a valid checkpoint is on disk: no gaps. The Trackio side of both is tracking.py; the signal
handling is signals.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from transformers import TrainerCallback

from ..trl_internals import seeded_repeat_sampler, set_epoch_order
from . import tracking
from .signals import SignalStop, any_process

logger = logging.getLogger("grpo_recipes")

SENTINEL = "checkpoint_complete.json"
STAGES_DIR = "stages"  # where a run's earlier stages train (stages.py): part of the run in output_dir
RUN_INFO = "grpo_recipes_run.json"  # the Trackio project/run name, so a resumed run logs to the same run
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_TRAINER_STATE = "trainer_state.json"


# ------------------------------------------------------------------------------------------ checkpoint folders


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint-N folder, oldest first. Complete or not."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for child in out.iterdir():
        m = _CHECKPOINT_RE.match(child.name)
        if m and child.is_dir():
            found.append((int(m.group(1)), child))
    return sorted(found)


def verify(path: str | os.PathLike) -> str | None:
    """None when `path` is a complete checkpoint, else why not."""
    path = Path(path)
    marker = path / SENTINEL
    if not marker.is_file():
        return f"no {SENTINEL}: the save did not finish (the process was killed while saving?)"
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
        step = int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{SENTINEL} is unreadable ({exc})"
    m = _CHECKPOINT_RE.match(path.name)
    if m and int(m.group(1)) != step:
        return f"{SENTINEL} is for step {step}, not {m.group(1)}"
    if _TRAINER_STATE not in files:
        return f"{_TRAINER_STATE} was not saved"
    for rel, size in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        actual = f.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, {size} were written (truncated or overwritten)"
    return None


def latest_complete(output_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(newest complete checkpoint or None, [(incomplete checkpoint, why)] for every invalid one)."""
    best, invalid = None, []
    for _, path in reversed(checkpoint_dirs(output_dir)):
        why = verify(path)
        if why:
            invalid.append((path, why))
        elif best is None:
            best = path
    return best, invalid


def checkpoint_step(path: str | os.PathLike) -> int:
    with open(Path(path) / _TRAINER_STATE) as f:
        return int(json.load(f)["global_step"])


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_complete(path: str | os.PathLike, step: int) -> None:
    """Write the completeness marker, last: data first on disk, then the marker, atomically."""
    path = Path(path)
    files = {}
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix()
        if rel.startswith(SENTINEL):
            continue
        _fsync(f)  # a power cut must not leave a marker that vouches for data still in the page cache
        files[rel] = f.stat().st_size
    tmp = path / f"{SENTINEL}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "time": time.time(), "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path / SENTINEL)
    _fsync(path, directory=True)


def remove_checkpoint(path: Path) -> None:
    # The marker goes first: a kill during rmtree then leaves an incomplete folder, never a damaged "complete" one.
    (path / SENTINEL).unlink(missing_ok=True)
    shutil.rmtree(path)


def rotate(output_dir: str | os.PathLike, keep: int | None, protect: str | os.PathLike | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `keep` (None or <= 0: keep all). The newest is never deleted,
    nor `protect` (the best checkpoint when load_best_model_at_end)."""
    if not keep or keep <= 0:
        return []
    complete = [p for _, p in checkpoint_dirs(output_dir) if verify(p) is None]
    protected = {complete[-1].resolve()} if complete else set()
    if protect:
        protected.add(Path(protect).resolve())
    removed = []
    excess = len(complete) - max(keep, len(protected))
    for path in complete:
        if excess <= 0:
            break
        if path.resolve() not in protected:
            remove_checkpoint(path)
            removed.append(path)
            excess -= 1
    return removed


# ----------------------------------------------------------------------------------------- start-up decisions


def output_dir_problems(recipe, training) -> list[str]:
    """Output-directory conflicts, checked at start-up before anything loads."""
    out = Path(training.output_dir)
    problems = []
    explicit = training.resume_from_checkpoint
    if recipe.resume and recipe.overwrite_output_dir:
        problems.append("resume, overwrite_output_dir: both set; --resume continues the run in output_dir, "
                        "--overwrite_output_dir discards it. Choose one")
    if explicit and recipe.overwrite_output_dir:
        problems.append("resume_from_checkpoint, overwrite_output_dir: both set; overwriting would delete the "
                        "checkpoints you resume from. Choose one")
    if explicit:
        path = Path(explicit)
        if not path.is_dir():
            problems.append(f"resume_from_checkpoint: no such folder {path}; use --resume to pick the latest "
                            f"complete checkpoint of output_dir automatically")
        elif why := verify(path):
            best, _ = latest_complete(path.parent)
            hint = f"the latest complete one there is {best}" if best else "there is no complete one there"
            problems.append(f"resume_from_checkpoint: {path} is not a complete checkpoint ({why}); {hint}")
        elif path.resolve().parent == out.resolve():
            newer = [p.name for s, p in checkpoint_dirs(out) if s > checkpoint_step(path)]
            if newer:
                problems.append(
                    f"resume_from_checkpoint: {path.name} is older than {', '.join(newer)} in the same output_dir; "
                    "the resumed run would overwrite them step by step and mix two histories. Fix: move the newer "
                    "checkpoints out of output_dir, or resume from the latest with --resume"
                )
        return problems
    if recipe.resume or recipe.overwrite_output_dir:
        return problems
    stage_root = out / STAGES_DIR
    existing = [p.name for _, p in checkpoint_dirs(out)]
    existing += [f"{STAGES_DIR}/{p.name}" for p in sorted(stage_root.iterdir())] if stage_root.is_dir() else []
    if existing:
        shown = ", ".join(existing[-3:]) + (" ..." if len(existing) > 3 else "")
        problems.append(
            f"output_dir: {out} already holds checkpoints of an earlier run ({shown}); training into it would mix "
            "the two runs. Fix: --resume to continue that run, --overwrite_output_dir to discard it, or a new "
            "--output_dir"
        )
    return problems


@dataclass
class StartPoint:
    """Where a stage's training starts, and what becomes of what an earlier run left in its output_dir and Trackio."""

    output_dir: Path
    resume_from: Path | None = None
    start_step: int = 0
    incomplete: list[tuple[Path, str]] = field(default_factory=list)  # removed before training
    discard: list[Path] = field(default_factory=list)  # --overwrite_output_dir: earlier checkpoints, removed
    replace_metrics: bool = False  # Trackio rows of this run after start_step are deleted (they will be re-logged)
    step_offset: int = 0  # the run's steps before this stage's (stages.py): Trackio rows are at offset + step


def start_point(recipe, training) -> StartPoint:
    """Decide where training starts. Changes nothing on disk; `start` applies it right before training."""
    out = Path(training.output_dir)
    existing = checkpoint_dirs(out)
    point = StartPoint(output_dir=out)
    if recipe.overwrite_output_dir:
        point.discard = [p for _, p in existing]
        point.replace_metrics = True
    else:
        point.incomplete = [(p, why) for _, p in existing if (why := verify(p))]
    if training.resume_from_checkpoint:
        point.resume_from = Path(training.resume_from_checkpoint)
    elif recipe.resume:
        point.resume_from, _ = latest_complete(out)
        if point.resume_from is None:
            logger.info("resume: no complete checkpoint in %s; starting from step 0", out)
    if point.resume_from is not None:
        point.start_step = checkpoint_step(point.resume_from)
    if recipe.resume or training.resume_from_checkpoint:
        point.replace_metrics = True
    return point


def stored_run_name(output_dir: str | os.PathLike) -> str | None:
    """The Trackio run name an earlier run in `output_dir` logged under (config/resolve.py: a resumed run keeps it)."""
    info = Path(output_dir) / RUN_INFO
    return json.loads(info.read_text())["run_name"] if info.is_file() else None


# ------------------------------------------------------------------------------------------------- callback


class CheckpointCallback(TrainerCallback):
    """Marks checkpoints complete, applies retention, turns a signal into save-and-stop, and keeps the data order
    of resumed runs identical to uninterrupted ones."""

    def __init__(self, keep: int | None, stop: SignalStop | None = None):
        self.keep = keep
        self.stop = stop
        self.stopped_at: int | None = None
        self._epoch: int | None = None

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        sampler = seeded_repeat_sampler(train_dataloader)
        if sampler is None:
            return
        if self._epoch is None:  # first epoch of this process: the Trainer's own formula for the resumed epoch
            batches = len(train_dataloader)
            per_epoch = max(batches // args.gradient_accumulation_steps
                            + int(batches % args.gradient_accumulation_steps > 0), 1)
            self._epoch = state.global_step // per_epoch
        else:
            self._epoch += 1
        set_epoch_order(sampler, self._epoch)  # RepeatSampler draws each epoch's order from one seeded generator

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop is not None and any_process(self.stop.signum is not None):
            control.should_save = True  # even with save_strategy "no": otherwise the work since the start is lost
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_save(self, args, state, control, **kwargs):
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        PartialState().wait_for_everyone()  # sharded saves (FSDP/DeepSpeed) write on every process: all must be done
        if state.is_world_process_zero:
            tracking.flush(args)
            mark_complete(path, state.global_step)
            for old in rotate(args.output_dir, self.keep, state.best_model_checkpoint):
                logger.info("deleted %s (save_total_limit %s)", old, self.keep)
        PartialState().wait_for_everyone()  # no process may go on (and possibly be killed) before the marker exists


# -------------------------------------------------------------------------------------------------- session


@dataclass
class Session:
    point: StartPoint
    callback: CheckpointCallback
    stop: SignalStop

    @property
    def interrupted(self) -> int | None:
        """The signal that stopped training, or None."""
        return self.stop.signum if self.callback.stopped_at is not None else None

    def message(self) -> str:
        name = signal.Signals(self.stop.signum).name
        path = self.point.output_dir / f"checkpoint-{self.callback.stopped_at}"
        return (f"interrupted by {name}: stopped after step {self.callback.stopped_at}, checkpoint saved to {path}. "
                f"Continue with the same command plus --resume.")

    def close(self) -> None:
        self.stop.uninstall()


def start(trainer, point: StartPoint, training) -> Session:
    """Apply the start point (remove incomplete/discarded checkpoints, prune the metrics that will be re-logged, record
    the run name), take over checkpoint retention, and install the signal handlers. Call right before trainer.train."""
    state = PartialState()
    if state.is_main_process:
        for path, why in point.incomplete:
            logger.warning("removing incomplete checkpoint %s: %s", path, why)
            remove_checkpoint(path)
        for path in point.discard:
            logger.warning("overwrite_output_dir: removing %s", path)
            remove_checkpoint(path)
        if point.replace_metrics and tracking.enabled(training):
            if tracking.storage_mode() != "sqlite":
                logger.warning("Trackio stores to JSONL fragments here (network filesystem?), which cannot be "
                               "pruned: steps after %d may appear twice in Trackio", point.start_step)
            # A fresh start (overwrite, or resume with no checkpoint) replaces everything, step-0 evaluation included;
            # a later stage keeps what the stages before it logged.
            resumed = point.resume_from is not None or point.step_offset
            after = point.step_offset + point.start_step if resumed else -1
            removed = tracking.prune_metrics(tracking.project_db(training.project), training.run_name, after)
            if removed:
                logger.info("Trackio: removed %d rows of run %s logged after step %d; they are re-logged as the run "
                            "continues", removed, training.run_name, point.start_step)
        point.output_dir.mkdir(parents=True, exist_ok=True)
        info = {"project": training.project, "run_name": training.run_name}
        (point.output_dir / RUN_INFO).write_text(json.dumps(info))
    state.wait_for_everyone()
    if point.resume_from is not None:
        logger.info("resuming from %s (step %d)", point.resume_from, point.start_step)
    # Retention moves to CheckpointCallback.on_save, which runs after the new checkpoint is marked complete.
    keep, trainer.args.save_total_limit = trainer.args.save_total_limit, None
    stop = SignalStop()
    callback = CheckpointCallback(keep, stop)
    trainer.add_callback(callback)
    stop.install()
    return Session(point, callback, stop)


# ------------------------------------------------------------------- stage folders and their done markers (stages)

DONE = "stage_complete.json"


def stage_dir(output_dir: str | os.PathLike, index: int, name: str) -> Path:
    return Path(output_dir) / STAGES_DIR / f"{index + 1}-{name}"


def mark_done(folder: str | os.PathLike, stage: str, index: int, global_step: int, evaluation: dict | None) -> None:
    """A finished earlier stage: its last global step and the held-out evaluations so far, in its folder."""
    path = Path(folder) / DONE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"stage": stage, "index": index, "global_step": global_step, "evaluation": evaluation}))
    os.replace(tmp, path)


def done(folder: str | os.PathLike) -> dict | None:
    """What a finished stage recorded in its folder, or None when it has not finished."""
    path = Path(folder) / DONE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def discard_stages(output_dir: str | os.PathLike) -> None:
    """--overwrite_output_dir: the earlier run's stage folders go (its last stage's checkpoints: start)."""
    shutil.rmtree(Path(output_dir) / STAGES_DIR, ignore_errors=True)
