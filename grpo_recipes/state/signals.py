"""SIGTERM/SIGINT during training: the first asks for a checkpoint at the end of the current step and a clean stop,
on every process at the same step; a second exits at once. checkpoint.start installs it; docs/reliability.md."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import torch
import torch.distributed as dist
from accelerate import PartialState

logger = logging.getLogger("grpo_recipes")


class SignalStop:
    """First SIGTERM/SIGINT: ask for a checkpoint at the end of the current step, then a clean stop.
    Second one: exit at once with the signal's default action (the last complete checkpoint stays valid)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():  # signal.signal works only there
            logger.warning("not in the main thread: SIGTERM/SIGINT will not trigger a checkpoint")
            return
        for sig in self.SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            os.write(2, f"\n{name} again: exiting now without saving.\n".encode())
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        # os.write, not print: a signal handler may run in the middle of another write to the same stream
        os.write(2, f"\n{name} received: saving a checkpoint at the end of this step, then stopping. "
                    f"Send {name} again to exit at once.\n".encode())


def any_process(flag: bool) -> bool:
    """True on every process if it is true on any: all processes must stop at the same step, or the ones still
    training wait forever in a collective for the ones that stopped."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], device=PartialState().device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def exit_code(signum: int) -> int:
    return 128 + signum  # what a shell reports for a process ended by that signal; schedulers read it as "stopped"
