"""Every use of Trackio beyond what transformers' TrackioCallback does on its own, in one module.

Several of them lean on Trackio internals, which is why pyproject.toml pins trackio to the tested minor version
(0.43.x):
- `TrackioRun`: transformers' TrackioCallback, with every row of the run at the training step it belongs to (the
  run's `log` is wrapped: Run._next_step would number rows itself), its rows named for the dashboard (`Panels`) and
  the run in its group (the run's `group` and the config key `_Group`, what trackio.init(group=...) writes);
- `use_dir`: the storage folder of an already imported Trackio (the constants trackio.utils.TRACKIO_DIR, MEDIA_DIR,
  ARTIFACTS_DIR and the copies other trackio modules took of them);
- `flush`: Run._flush_queues_inline under Run._client_lock (Trackio has no public flush), so a checkpoint is marked
  complete only once the metrics of every step up to it are on disk;
- `project_db`, `logged_steps`, `prune_metrics`: reads and deletes in Trackio's SQLite database (tables `metrics`,
  `alerts`), for the start-up check against interleaved curves and for an exact resume (docs/reliability.md).
The public ones: `alert`, `active`, `finish`, `storage_mode`.

Trackio is imported on first use, so a run with `report_to: none` runs where it is not installed (bench/gpu_check.py).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
from pathlib import Path

from transformers.integrations import TrackioCallback

from ..trl_internals import PROFILED_BLOCKS

logger = logging.getLogger("grpo_recipes")

GROUP_KEY = "_Group"  # the config key Trackio's own init(group=...) writes
PROFILING_PREFIX = "profiling/"  # TRL's profiling_context rows: {"profiling/Time taken: <Trainer>.<what>": seconds}
_DIR_CONSTANTS = ("TRACKIO_DIR", "MEDIA_DIR", "ARTIFACTS_DIR")  # trackio.utils, fixed at its import


def _trackio():
    """The trackio package with the submodules used here."""
    # Imported here, not at the top: a run that does not report to Trackio needs no Trackio installed.
    import trackio
    import trackio.sqlite_storage
    import trackio.utils

    return trackio


def enabled(args) -> bool:
    """Whether a training config reports to Trackio."""
    return "trackio" in (args.report_to or [])


def use_dir(path: str | os.PathLike) -> None:
    """Make `path` Trackio's storage folder, for this process and the processes it starts.

    Trackio 0.43 reads $TRACKIO_DIR once, when trackio.utils is first imported, into the constants TRACKIO_DIR,
    MEDIA_DIR and ARTIFACTS_DIR, and its other modules copy them at import (`from trackio.utils import TRACKIO_DIR`
    in sqlite_storage, bucket_storage, run, table, media, ...). A recipe's `trackio_dir` is known only once its
    config is parsed, after this module (and trl) imported Trackio, so setting the variable alone would be silently
    ignored: every loaded trackio module's copy is replaced here, and the variable is set for child processes and for
    trackio modules imported later (they copy from trackio.utils, already switched). Private and version-pinned;
    tests/test_checkpoint.py proves a run's database and media land in the new folder.
    """
    path = Path(path).expanduser().resolve()
    trackio = _trackio()
    if _current_run() is not None:
        raise RuntimeError(f"trackio_dir: a Trackio run is open; switching to {path} would split it across folders")
    old = {name: getattr(trackio.utils, name) for name in _DIR_CONSTANTS}
    new = {"TRACKIO_DIR": path, "MEDIA_DIR": path / "media", "ARTIFACTS_DIR": path / "artifacts"}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "trackio" or name.startswith("trackio.")):
            continue
        for constant, value in new.items():
            if getattr(module, constant, None) is old[constant]:
                setattr(module, constant, value)
    os.environ["TRACKIO_DIR"] = str(path)


def project_db(project: str) -> Path:
    """The SQLite file Trackio writes this project to."""
    return _trackio().sqlite_storage.SQLiteStorage.get_project_db_path(project)


def storage_mode() -> str:
    """"sqlite", or Trackio's fallback on filesystems where SQLite locking is unsafe (JSONL fragments)."""
    return _trackio().utils.get_storage_mode()


# ------------------------------------------------------------------------------------------ the SQLite history
#
# Trackio's `step` column of a run logged through TrackioRun is the training step of the row (see there), for
# training records, completions tables, held-out evaluations and profiling rows alike, and alerts carry the step of
# the last row logged before them. So the history of "steps up to N" is a plain `step <= N`.


def _rows(db: Path, run_name: str) -> list[tuple[int, dict]]:
    """(step, metrics) of every row of the run, in log order."""
    if not db.is_file():
        return []
    with sqlite3.connect(db, timeout=30) as con:
        try:
            raw = con.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id",
                              (run_name,)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
    out = []
    for step, metrics in raw:
        try:
            out.append((step, json.loads(metrics)))
        except ValueError:
            out.append((step, {}))
    return out


def prune_metrics(db: Path, run_name: str, after_step: int) -> int:
    """Delete this run's Trackio rows and alerts at training steps after `after_step` (-1: all of them); return how
    many metric rows went."""
    if not db.is_file():
        return 0
    with sqlite3.connect(db, timeout=30) as con:
        removed = 0
        for table in ("metrics", "alerts"):
            try:
                cur = con.execute(f"DELETE FROM {table} WHERE run_name = ? AND (step IS NULL OR step > ?)",
                                  (run_name, after_step))
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    continue
                raise
            if table == "metrics":
                removed = cur.rowcount
    return removed


def logged_steps(db: Path, run_name: str) -> list[int]:
    """Training steps that have a training record (train/loss) in this run, in log order, duplicates included."""
    return [step for step, m in _rows(db, run_name) if "train/loss" in m]


# ------------------------------------------------------------------------------------------ the dashboard
#
# Trackio 0.43's dashboard (frontend/src/lib/dataProcessing.js, groupMetricsByPrefix) shows a project's metrics in
# sections named by the key's first `/` part: keys without one first (a section called "charts"), then the sections
# in alphabetical order; in a section, the keys of two parts first, alphabetically, then one sub-section per second
# part. Nothing the project stores changes that (TRACKIO_PLOT_ORDER is read from the environment of whoever runs
# `trackio show`), so the keys alone decide what a recipe's project opens on, three panels a row at 1400 pixels:
#   eval/      the held-out evaluation: format_rate, mean_length, pass@1 (the first row)
#   policy/    four of the training curves again, named by what they are to a reader: correctness (the correctness
#              reward's mean over the policy's own samples), entropy, format (the format reward's mean), mean_length
#              (completion tokens): the second row. The training record keeps its own keys too.
#   train/     every training metric, as TRL and the features log them
#   walltime/  TRL's timings (`profiling/Time taken: <Trainer>.<method>`), named for what they time
#              (trl_internals.PROFILED_BLOCKS): the seconds each block took
SUMMARY = "policy/"
TIMINGS = "walltime/"


class Panels:
    """How a run's rows are named in Trackio, so that a recipe's project opens on what runs are compared by (the
    section map above). `rewards`: the reward functions' names (TRL times each one under its name); `correctness` and
    `format_reward`: the rewards whose means are policy/correctness and policy/format."""

    def __init__(self, rewards=(), correctness: str | None = None, format_reward: str | None = None):
        self.rewards = set(rewards)
        # policy/<name> <- the first of its sources the training record has
        self.summary = {SUMMARY + "entropy": ("train/entropy",),
                        SUMMARY + "mean_length": ("train/completions/mean_length",)}
        if correctness:  # the policy's own samples, demonstrations or not (grpo/features/demonstrations.py)
            self.summary[SUMMARY + "correctness"] = (f"train/rewards/{correctness}/mean",)
        if format_reward:
            self.summary[SUMMARY + "format"] = (f"train/rewards/{format_reward}/mean",)

    def named(self, metrics: dict) -> dict:
        """The row as Trackio stores it: timings renamed, and a GRPO training record's summary curves added."""
        out = {self.timing(k) if k.startswith(PROFILING_PREFIX) else k: v for k, v in metrics.items()}
        if "train/reward" in metrics:  # GRPO's training record (an sft stage's has no reward)
            for key, sources in self.summary.items():
                if found := next((s for s in sources if s in metrics), None):
                    out[key] = metrics[found]
        return out

    def timing(self, key: str) -> str:
        """TRL's `profiling/Time taken: RecipeTrainer.transformers.generate` -> `walltime/generation`."""
        what = key.removeprefix(PROFILING_PREFIX).removeprefix("Time taken: ")
        what = what.split(".", 1)[1] if "." in what else what  # TRL puts the trainer's class first
        if what in PROFILED_BLOCKS:
            return TIMINGS + PROFILED_BLOCKS[what]
        if what in self.rewards:
            return f"{TIMINGS}rewards/{what}"
        return TIMINGS + what.lstrip("_").replace("._", ".")


# --------------------------------------------------------------------------------------------- the open run


def _current_run():
    """The open Trackio run, None if there is none; none can be open while Trackio was never imported."""
    if sys.modules.get("trackio") is None:
        return None
    return _trackio().context_vars.current_run.get()


def active() -> bool:
    """Whether a Trackio run is open in this process."""
    return _current_run() is not None


def flush(args) -> None:
    """Push Trackio's queued rows to its database now (it writes every 0.5 s from a thread), so that a checkpoint is
    marked complete only once the metrics of every step up to it are on disk. Trackio has no public flush; this
    uses the same call its writer thread makes, under the same lock."""
    if not enabled(args):
        return
    run = _current_run()
    if run is None:
        return
    flush_inline, lock = getattr(run, "_flush_queues_inline", None), getattr(run, "_client_lock", None)
    if flush_inline is None or lock is None:
        logger.warning("trackio %s has no _flush_queues_inline: a kill within 0.5 s of a checkpoint may leave the "
                       "last step's metrics out of Trackio", _trackio().__version__)
        return
    with lock:
        flush_inline()


def alert(title: str, text: str, level: str) -> None:
    """A Trackio alert on the open run (`level`: a trackio.AlertLevel value), at the step of the last row logged."""
    trackio = _trackio()
    trackio.alert(title=title, text=text, level=trackio.AlertLevel(level))


def finish() -> None:
    _trackio().finish()


class TrackioRun(TrackioCallback):
    """transformers' TrackioCallback, with every row of the run at its training step, and the run in `group`.

    Without a step, Trackio numbers a row itself (Run._next_step: one past the highest step so far). TrackioCallback
    logs every record that way, TRL's GRPOTrainer.log logs the completions table right after the training record
    (a second number), and the held-out evaluation goes through the trainer's log (a third), so training step 5
    would sit near dashboard step 10. TRL's profiling rows name a step, `trainer.state.global_step` when the timed
    block starts, which is the last completed step while they time the one in progress.

    Once the run is started (`setup`, at train start or at the first log after train end), its `log` is wrapped so
    that a row without a step, and a profiling row, lands at the step it belongs to: the step in progress
    (global_step + 1) between on_step_begin and on_step_end, where TRL times generation, rewards and the loss; else
    `state.global_step`, where the training record, the completions table, the held-out evaluation and alerts come.
    The trainer's end-of-training summary (train_runtime, ...) is not a step and is not logged; TrackioCallback
    keeps only its epoch anyway.
    """

    def __init__(self, group: str | None = None, offset: int = 0, panels: Panels | None = None):
        super().__init__()
        self.group = group
        self.offset = offset  # the run's steps before this trainer's stage (stages.py): one step axis for the run
        self.panels = panels or Panels()
        self._state = None  # the trainer's TrainerState: read at each log, as training moves it on
        self._in_step = False

    def setup(self, args, state, model, **kwargs):
        super().setup(args, state, model, **kwargs)
        self._state = state
        if not state.is_world_process_zero:
            return
        run = _current_run()
        if run is None:  # TrackioCallback.setup started none: no Trackio run to place rows in
            raise RuntimeError("TrackioRun: transformers' TrackioCallback did not start a Trackio run")
        if self.group:  # sent with the run's config at its first log, so before anything logs
            run.group = self.group
            run.config[GROUP_KEY] = self.group
        log = run.log
        run.log = lambda metrics, step=None: log(self.panels.named(self.shifted(metrics)),
                                                 step=self.step_of(metrics, step))

    def step_of(self, metrics: dict, step: int | None) -> int:
        """The step a row is logged at: see the class docstring."""
        now = self._state.global_step + (1 if self._in_step else 0)
        if step is None or all(k.startswith(PROFILING_PREFIX) for k in metrics):
            return self.offset + now
        return self.offset + step

    def shifted(self, metrics: dict) -> dict:
        if self.offset and "train/global_step" in metrics:  # TrackioCallback's own copy of the step
            return {**metrics, "train/global_step": self.offset + metrics["train/global_step"]}
        return metrics

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._in_step = False
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        self._state, self._in_step = state, True

    def on_step_end(self, args, state, control, **kwargs):
        self._state, self._in_step = state, False

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if logs and "train_runtime" in logs:  # Trainer.train's closing summary, at the last step: no training step
            return
        super().on_log(args, state, control, model=model, logs=logs, **kwargs)


def attach(trainer, group: str | None = None, offset: int = 0, correctness: str | None = None,
           format_reward: str | None = None) -> None:
    """Put TrackioRun in place of the TrackioCallback that `report_to: trackio` gave `trainer`; its rows are logged
    `offset` steps on (a later stage's, stages.py) and named for the dashboard (Panels: the trainer's reward
    functions, if any; the correctness reward, by default the first one, and the format reward)."""
    if not any(isinstance(cb, TrackioCallback) for cb in trainer.callback_handler.callbacks):
        raise RuntimeError("tracking.attach: the trainer has no TrackioCallback; is trackio in report_to?")
    trainer.remove_callback(TrackioCallback)
    rewards = list(getattr(trainer, "reward_func_names", None) or ())  # a GRPO trainer's, as TRL names its metrics
    panels = Panels(rewards, correctness or (rewards[0] if rewards else None), format_reward)
    trainer.add_callback(TrackioRun(group, offset, panels))
