"""Every use of Trackio beyond `report_to: trackio` (which transformers' TrackioCallback handles), in one module.

Several of them lean on Trackio internals, which is why pyproject.toml pins trackio to the tested minor version:
- `flush`: Run._flush_queues_inline under Run._client_lock (Trackio has no public flush), so a checkpoint is marked
  complete only once the metrics of every step up to it are on disk;
- `TrackioGroup`: the run's `group` and the config key `_Group`, what trackio.init(group=...) writes;
- `project_db`, `logged_steps`, `prune_metrics`: reads and deletes in Trackio's SQLite database (tables `metrics`,
  `alerts`), for the start-up check against interleaved curves and for an exact resume (docs/reliability.md).
The public ones: `alert`, `active`, `finish`, `storage_mode`.

Trackio is imported at first use, never when this module is imported: it fixes its storage folder from TRACKIO_DIR
when it is first imported, and a recipe's `trackio_dir` is known only once its config is parsed (`use_dir`).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
from pathlib import Path

from transformers import TrainerCallback

from .errors import ConfigError

logger = logging.getLogger("grpo_recipes")

GROUP_KEY = "_Group"  # the config key Trackio's own init(group=...) writes


def _trackio():
    # Not at module level: importing trackio fixes its storage folder from TRACKIO_DIR (see the module docstring).
    import trackio
    import trackio.sqlite_storage
    import trackio.utils

    return trackio


def enabled(args) -> bool:
    """Whether a training config reports to Trackio."""
    return "trackio" in (args.report_to or [])


def use_dir(path: str | os.PathLike) -> None:
    """Make `path` Trackio's storage folder. Call before anything imports trackio (see the module docstring)."""
    path = Path(path).expanduser().resolve()
    imported = sys.modules.get("trackio.utils")  # already imported: its folder is fixed, the variable would be ignored
    if imported is not None and Path(imported.TRACKIO_DIR).resolve() != path:
        raise ConfigError([f"trackio_dir: Trackio was imported before the config was read and writes to "
                           f"{imported.TRACKIO_DIR}, not {path}; set TRACKIO_DIR={path} in the environment instead"])
    os.environ["TRACKIO_DIR"] = str(path)


def project_db(project: str) -> Path:
    """The SQLite file Trackio writes this project to."""
    return _trackio().sqlite_storage.SQLiteStorage.get_project_db_path(project)


def storage_mode() -> str:
    """"sqlite", or Trackio's fallback on filesystems where SQLite locking is unsafe (JSONL fragments)."""
    return _trackio().utils.get_storage_mode()


# ------------------------------------------------------------------------------------------ the SQLite history


def _rows(db: Path, run_name: str) -> list[tuple[int, int, dict]]:
    if not db.is_file():
        return []
    with sqlite3.connect(db, timeout=30) as con:
        try:
            raw = con.execute("SELECT id, step, metrics FROM metrics WHERE run_name = ? ORDER BY id",
                              (run_name,)).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
    out = []
    for row_id, step, metrics in raw:
        try:
            out.append((row_id, step, json.loads(metrics)))
        except ValueError:
            out.append((row_id, step, {}))
    return out


def _row_step(trackio_step: int, metrics: dict) -> int | None:
    """The training step a Trackio row belongs to, or None when it cannot be told."""
    if "train/global_step" in metrics:  # transformers' TrackioCallback: every train/eval record
        return int(metrics["train/global_step"])
    table = metrics.get("completions")
    if isinstance(table, dict) and table.get("_type") == "trackio.table":  # TRL's completions table
        steps = [r.get("step") for r in table.get("_value") or [] if isinstance(r, dict)]
        steps = [s for s in steps if isinstance(s, int)]
        return max(steps) if steps else None
    if metrics and all(k.startswith("profiling/") for k in metrics):
        # TRL's profiling_context logs with step=trainer.state.global_step, i.e. before the step completes
        return trackio_step + 1
    return None


def prune_metrics(db: Path, run_name: str, after_step: int) -> int:
    """Delete this run's Trackio rows that belong to training steps after `after_step` (-1: all of them), and the
    alerts raised after the last kept row; return how many metric rows went.

    Rows that name no step are deleted when they were written after the last row of a kept step (they came from
    the lost part of the run); the others stay.
    """
    rows = _rows(db, run_name)
    if not rows:
        return 0
    steps = {row_id: _row_step(step, m) for row_id, step, m in rows}
    kept_ids = [row_id for row_id, s in steps.items() if s is not None and s <= after_step]
    cut = max(kept_ids, default=0)
    doomed = [row_id for row_id, s in steps.items()
              if (s is not None and s > after_step) or (s is None and row_id > cut)]
    # Alerts carry Trackio's own step counter, the `step` column of the metric rows: keep those up to the last kept row.
    last_kept = max((trackio_step for row_id, trackio_step, _ in rows if row_id not in set(doomed)), default=-1)
    with sqlite3.connect(db, timeout=30) as con:
        if doomed:
            con.executemany("DELETE FROM metrics WHERE id = ?", [(i,) for i in doomed])
        try:
            con.execute("DELETE FROM alerts WHERE run_name = ? AND (step IS NULL OR step > ?)", (run_name, last_kept))
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
    return len(doomed)


def logged_steps(db: Path, run_name: str) -> list[int]:
    """Global steps that have a training record (train/loss) in this run, in log order, duplicates included."""
    return [int(m["train/global_step"]) for _, _, m in _rows(db, run_name)
            if "train/loss" in m and "train/global_step" in m]


# --------------------------------------------------------------------------------------------- the open run


def _current_run():
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
    """A Trackio alert on the open run (`level`: a trackio.AlertLevel value)."""
    trackio = _trackio()
    trackio.alert(title=title, text=text, level=trackio.AlertLevel(level))


def finish() -> None:
    _trackio().finish()


class TrackioGroup(TrainerCallback):
    """Puts the run in a Trackio group. transformers' TrackioCallback calls trackio.init without one; Trackio keeps
    the group in the run's config, which it sends with the run's first log, so this must run after that callback's
    on_train_begin (which creates the run) and before anything logs (the held-out evaluation at train start)."""

    def __init__(self, group: str):
        self.group = group

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        run = _current_run()
        if run is None:
            raise RuntimeError("trackio_group: no Trackio run was started; is trackio in report_to?")
        run.group = self.group
        run.config[GROUP_KEY] = self.group
