"""The host's judging of a job, in a process of its own under a CPU and memory budget.

Judging evaluates values the program chose: decoding them, hashing them into sets, comparing them, handing them to
the builtins a test calls. Counting items bounds none of that work (colliding hashes, empty containers that each
become an object, `map(list, ...)` over ranges), so the work is bounded where it runs: a judging process, started
like the zygotes and reused from job to job, judges one job at a time with at most JUDGE_CPU_S of CPU (ITIMER_PROF:
the signal ends it) and JUDGE_MEMORY_MB above what it held before (RLIMIT_AS). A job whose judging runs over is
the program's failure, 0 tests passed; the process that ran over exits and a fresh one judges the next job. The
trainer itself never decodes a value a program sent.

    program_names(program) -> split.ProgramNames, or why the budget ran out     what the program's text binds
    read_tests(raw, nonce, plans) -> (ready, done, outcomes, forged, over)    like verdict.read_tests, plus why
                                                                             the budget ran out, or ''

The program's text is read there too (ast, symtable), under the same budget: parsing it can cost as much as its
values (f-strings with 30,000 fields: a second).
"""

from __future__ import annotations

import dataclasses
import logging
import marshal
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import split, verdict

logger = logging.getLogger("grpo_recipes.sandbox")
JUDGE_CPU_S = 1.0  # CPU seconds to judge one job: decoding its records and evaluating its tests
JUDGE_MEMORY_MB = 256  # memory to judge one job, above what the judging process held before it
JUDGE_WALL_S = 60.0  # a backstop only: JUDGE_CPU_S of CPU takes this long only on a machine that has stalled
WHY_CAP = 1000  # characters of a test's failure message that come back
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the grpo_recipes package
_BOOT = "import sys; sys.path.insert(0, %r); from grpo_recipes.sandbox import judge; judge.serve()" % _ROOT
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class JudgeUnavailable(RuntimeError):
    """No judging process could start: the sandbox's failure (infra_error), never the program's."""


class _Process:
    """One judging process; the host talks to it with length-prefixed parts on its stdin and stdout."""

    def __init__(self):
        python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        self.proc = subprocess.Popen([python, "-I", "-S", "-B", "-c", _BOOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env=_ENV)
        try:  # it says it is ready once it has imported everything: a death after that is a job's doing
            if self._read(5, time.monotonic() + JUDGE_WALL_S) != b"ready":
                raise EOFError("the judging process did not start")
        except (OSError, EOFError, TimeoutError) as exc:
            self.kill()
            raise JudgeUnavailable(f"the judging process could not start: {exc}") from None

    def call(self, parts: list[bytes]) -> tuple | None:
        """The reply to a request, or None when the process ended without one (it ran over, or died)."""
        try:
            for part in parts:
                self.proc.stdin.write(len(part).to_bytes(8, "little"))
                self.proc.stdin.write(part)
            self.proc.stdin.flush()
            deadline = time.monotonic() + JUDGE_WALL_S
            size = int.from_bytes(self._read(8, deadline), "little")
            return marshal.loads(self._read(size, deadline))
        except (OSError, EOFError, ValueError, TimeoutError):
            self.kill()
            return None

    def _read(self, n: int, deadline: float) -> bytes:
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("the judging process did not answer in time")
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError("the judging process ended")
            out += chunk
        return bytes(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: it exits between jobs
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


_idle: list[_Process] = []
_idle_lock = threading.Lock()


def _call(parts: list[bytes]) -> tuple:
    """A judging process's reply: ("ok", ...) or ("over", why the budget ran out)."""
    with _idle_lock:
        process = _idle.pop() if _idle else None
    if process is None or process.proc.poll() is not None:
        process = _Process()
    reply = process.call(parts)
    if reply is not None and reply[0] == "ok":
        with _idle_lock:
            _idle.append(process)
        return reply
    process.kill()
    code = process.proc.returncode
    if reply is not None:
        return reply
    if code == -signal.SIGPROF:
        return "over", f"ran over its {JUDGE_CPU_S:g} s of CPU"
    if code == -signal.SIGKILL:
        return "over", f"ran over {JUDGE_WALL_S:g} s"
    # nothing runs in it but the work on this job's program and values; still, a crash may be the host's bug
    logger.warning("sandbox: the judging process ended with status %s on a job", code)
    return "over", f"ended the judging process (exit status {code})"


def program_names(program: str) -> split.ProgramNames | str:
    """split.program_names(program), read in a judging process under the budget (a program's text is its own:
    parsing it can cost the host as much as its values), or why the budget ran out."""
    reply = _call([marshal.dumps(("names",)), program.encode("utf-8", "surrogatepass")])
    return split.ProgramNames(*reply[1:]) if reply[0] == "ok" else reply[1]


def read_tests(raw: bytes, nonce: str, plans: list) -> tuple[bool, bool, list, str, str]:
    """verdict.read_tests for a tests job's records, run in a judging process under the budget, plus `over`: why
    the judging ran over it ('' when it did not; then no outcome is known, and the job is the program's failure)."""
    reply = _call([marshal.dumps(("tests", nonce, len(plans))), *(p.pickled for p in plans), raw])
    if reply[0] != "ok":
        return True, False, [], "", reply[1]
    _, ready, done, outcomes, forged = reply
    return ready, done, [verdict.TestOutcome(*o) for o in outcomes], forged, ""


def shutdown() -> None:
    with _idle_lock:
        processes = list(_idle)
        _idle.clear()
    for process in processes:
        process.close()


# ---- the judging process


def _read_exact(n: int) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        chunk = os.read(0, n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def _part() -> bytes | None:
    head = _read_exact(8)
    return None if head is None else _read_exact(int.from_bytes(head, "little"))


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


_STATM = None  # /proc/self/statm, kept open: read before every job


def _vm_bytes() -> int:
    global _STATM
    if _STATM is None:
        _STATM = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    return int(os.pread(_STATM, 64, 0).split()[0]) * os.sysconf("SC_PAGE_SIZE")


_PLANS: dict[bytes, split.Plan] = {}  # pickled -> plan: a plan serves every completion of a prompt
_PLANS_KEPT = 16 << 20  # bytes of pickled plans kept, oldest dropped first
_plans_bytes = 0


def _plan(blob: bytes) -> split.Plan:
    global _plans_bytes
    plan = _PLANS.get(blob)
    if plan is None:
        plan = pickle.loads(blob)
        env = plan.actions[0] if plan.actions else {}
        if any(hasattr(v, "__next__") for v in env.values()):  # judging would use an iterator up: such a plan is
            return plan  # unpickled afresh for every job
        while _PLANS and _plans_bytes + len(blob) > _PLANS_KEPT:
            _plans_bytes -= len(next(iter(_PLANS)))
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[blob] = plan
        _plans_bytes += len(blob)
    return plan


def _budgeted(work) -> tuple:
    """("ok", *work()) or ("over", why), `work` run with at most JUDGE_CPU_S of CPU and JUDGE_MEMORY_MB more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    budget = _vm_bytes() + (JUDGE_MEMORY_MB << 20)
    resource.setrlimit(resource.RLIMIT_AS, (budget if hard == resource.RLIM_INFINITY else min(budget, hard), hard))
    signal.setitimer(signal.ITIMER_PROF, JUDGE_CPU_S)  # SIGPROF's default action ends this process
    try:
        return ("ok", *work())
    except MemoryError:
        return "over", f"ran over its {JUDGE_MEMORY_MB} MB of memory"
    except RecursionError:  # the host's own recursion on a value nested within the codec's depth: still its doing
        return "over", "went past the host's recursion limit"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _fields(names: split.ProgramNames) -> tuple:
    return tuple(getattr(names, f.name) for f in dataclasses.fields(names))


def _tests(raw: bytes, nonce: str, plans: list) -> tuple:
    ready, done, outcomes, forged = verdict.read_tests(raw, nonce, plans)
    return ready, done, [(o.passed, o.mode, o.why[:WHY_CAP]) for o in outcomes], forged


def serve() -> None:
    """The judging process's loop. Requests: ("names",) and a program's text; ("tests", nonce, n), n plans and a
    job's records. One reply each."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    _write_all(b"ready")
    while True:
        header = _part()
        if header is None:
            return
        header = marshal.loads(header)
        if header[0] == "names":
            program = _part().decode("utf-8", "surrogatepass")
            reply = _budgeted(lambda: _fields(split.program_names(program)))
        else:
            plans = [_plan(_part()) for _ in range(header[2])]
            raw = _part()
            reply = _budgeted(lambda: _tests(raw, header[1], plans))
            del raw, plans
        data = marshal.dumps(reply)
        _write_all(len(data).to_bytes(8, "little") + data)
        if reply[0] == "over":
            return  # whatever the failed job left behind goes with this process
