"""Run untrusted Python programs against tests, each in its own throwaway sandbox. Design and limits: docs/sandbox.md.

    run_tests(program, ["assert f(2) == 4"])            -> SandboxResult(passed, total, status, ...)
    run_io_tests(program, [("1 2\\n", "3\\n")])          -> the program reads stdin; its stdout is compared here
    run_many([Job(...), ...], max_workers=8)            -> many jobs in parallel over a bounded pool

Each job runs under a trusted supervisor that is PID 1 of fresh pid, mount and ipc namespaces, inside a
network namespace with no connectivity: the filesystem is read-only except a private tmpfs work dir, and the
program runs as a unique unprivileged uid under rlimits. When the supervisor exits the kernel kills whatever is left in the pid namespace, so nothing
the program started can outlive its job. Jobs are forked from a pre-started interpreter (a "zygote") instead
of starting Python twice per job. Where namespaces are unavailable a weaker mode is used and a warning is
logged once; see `isolation()`.
"""

from __future__ import annotations

import ast
import atexit
import logging
import marshal
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

logger = logging.getLogger(__name__)

STATUSES = ("ok", "failed", "timeout", "crashed", "infra_error")
OUTPUT_CAP = 16_384  # bytes of stdout/stderr kept per job: enough to debug, bounded under a print loop
DISK_MB = 64  # the work dir's tmpfs; RLIMIT_FSIZE caps one file at the same size
NPROC = 64  # processes + threads of the job's uid
NOFILE = 64
MAX_WORKERS = 64  # default pool size cap, and how many idle zygotes (about 12 MB each) are kept
STARTUP_SLACK_S = 20.0  # the host gives up on a supervisor this long after the job's own deadline
ENV_ISOLATION = "GRPO_SANDBOX_ISOLATION"  # auto (default) | namespaces | userns | none
_UID_BASE, _UID_SPAN = 0x50000000, 1 << 24  # unique per-job uids: no /etc/passwd entry, no shared rlimits
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# The interpreter the sandbox runs: the base one, since -S ignores the venv anyway.
PYTHON = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    status: str  # one of STATUSES
    stdout: str = ""
    stderr: str = ""
    detail: str = ""  # why, in a few words: "exit code 1", "killed by signal 9", ...
    elapsed_s: float = 0.0
    results: tuple[bool, ...] = ()  # per test or case, as observed by the harness

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class Job:
    """One program with either `tests` (Python snippets run after it) or `io_cases` ((stdin, expected stdout))."""

    program: str
    tests: tuple[str, ...] = ()
    io_cases: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 5.0  # wall clock for the whole job: the program plus all its tests or cases
    memory_mb: int = 512  # address space per process

    def __post_init__(self):
        object.__setattr__(self, "tests", tuple(str(t) for t in self.tests))
        object.__setattr__(self, "io_cases", tuple((str(i), str(o)) for i, o in self.io_cases))
        if bool(self.tests) == bool(self.io_cases):
            raise ValueError("a Job needs exactly one of: tests (non-empty) or io_cases (non-empty)")
        if not (0 < self.timeout_s <= 3600) or self.memory_mb < 64:
            raise ValueError(f"need 0 < timeout_s <= 3600 and memory_mb >= 64, got {self.timeout_s}, {self.memory_mb}")

    @property
    def total(self) -> int:
        return len(self.tests) or len(self.io_cases)


def run_tests(program: str, tests: Sequence[str], *, timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    """Run `program`, then each test snippet in its namespace; a test passes when it runs without raising."""
    return run_many([Job(program, tuple(tests), timeout_s=timeout_s, memory_mb=memory_mb)])[0]


def run_io_tests(
    program: str, cases: Sequence[tuple[str, str]], *, timeout_s: float = 5.0, memory_mb: int = 512
) -> SandboxResult:
    """Run `program` once per case with the case's stdin; a case passes when it exits 0 printing the expected text.

    Outputs are compared outside the sandbox, ignoring trailing whitespace on each line and trailing blank lines.
    """
    return run_many([Job(program, io_cases=tuple(cases), timeout_s=timeout_s, memory_mb=memory_mb)])[0]


def default_workers() -> int:
    # Most of a job's wall time is the kernel building and tearing down namespaces, not CPU: oversubscribe.
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(4 * cpus, MAX_WORKERS)


def run_many(jobs: Iterable[Job], *, max_workers: int | None = None) -> list[SandboxResult]:
    """Results in the order of `jobs`. Never raises for a job: a sandbox failure is status 'infra_error'."""
    jobs = list(jobs)
    if not jobs:
        return []
    iso = isolation()
    with ThreadPoolExecutor(max_workers=min(max_workers or default_workers(), len(jobs))) as pool:
        return list(pool.map(lambda job: _run_guarded(job, iso), jobs))


# ---------------------------------------------------------------------------------------------------------
# Isolation detection: what this machine allows, probed once per mode with a real job.


@dataclass(frozen=True)
class Isolation:
    mode: str  # "namespaces" (root), "userns" (unprivileged user namespaces), "none", or "unavailable"
    namespaces: bool = False
    userns: bool = False
    drop_uid: bool = False  # run programs as a unique unprivileged uid (needs root)
    problem: str = ""  # for "unavailable": why no job can run

    def describe(self) -> str:
        if self.mode == "unavailable":
            return f"unavailable: {self.problem}"
        parts = ["pid+net+mount+ipc+uts namespaces, read-only filesystem, private tmpfs work dir"
                 if self.namespaces else "process group + subreaper only (no network, pid or filesystem isolation)"]
        parts.append("unique unprivileged uid" if self.drop_uid else "the caller's uid without capabilities")
        return f"{self.mode}: " + ", ".join(parts) + ", rlimits (cpu, as, nproc, fsize, nofile, core), no_new_privs"


_iso_cache: dict[str, Isolation] = {}
_iso_lock = threading.Lock()
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning(message)


def isolation() -> Isolation:
    """The isolation this process uses (per $GRPO_SANDBOX_ISOLATION), probed once per mode and cached."""
    mode = os.environ.get(ENV_ISOLATION, "auto").strip().lower() or "auto"
    if mode not in ("auto", "namespaces", "userns", "none"):
        raise ValueError(f"${ENV_ISOLATION} must be auto, namespaces, userns or none; got {mode!r}")
    with _iso_lock:
        if mode not in _iso_cache:
            _iso_cache[mode] = _detect(mode)
            logger.info("sandbox isolation: %s", _iso_cache[mode].describe())
        return _iso_cache[mode]


def _probe(iso: Isolation) -> str:
    """'' when a trivial job passes under `iso`, else what went wrong."""
    program = "import json\nx = json.loads('1')\nprint('probe')"  # json: a stdlib import must work
    result = _run_guarded(Job(program, ("assert x == 1",), timeout_s=10.0), iso)
    return "" if result.status == "ok" else f"{result.status}: {result.detail} {result.stderr[-600:]}".strip()


def _detect(mode: str) -> Isolation:
    root = os.geteuid() == 0
    if mode == "userns" and root:
        # uid 0 mapped to itself stays exempt from RLIMIT_NPROC: a fork bomb would be unbounded
        return Isolation("unavailable", problem="userns isolation is for unprivileged users; as root use namespaces")
    if mode != "none":
        use_userns = mode == "userns" or (mode == "auto" and not root)
        iso = Isolation("userns" if use_userns else "namespaces", True, use_userns, drop_uid=not use_userns)
        problem = _probe(iso)
        if not problem:
            if use_userns and mode == "auto":
                _warn_once("sandbox: not root, so programs run as your uid (without capabilities) inside a user "
                           "namespace: the filesystem is read-only to them but they can read every file you can")
            return iso
        if mode != "auto":
            logger.error("sandbox: isolation %r requested but unavailable: %s", mode, problem)
            return Isolation("unavailable", problem=problem)
        _warn_once(f"sandbox: namespaces unavailable ({problem}); DEGRADED to process-group isolation: programs "
                   "share the host network, can see host processes and can write world-writable dirs such as /tmp")
    iso = Isolation("none", drop_uid=root)
    problem = _probe(iso)
    if problem:
        logger.error("sandbox: cannot run programs at all: %s", problem)
        return Isolation("unavailable", problem=problem)
    if mode == "none":
        _warn_once(f"sandbox: ${ENV_ISOLATION}=none: no network, pid or filesystem isolation")
    if not root:
        _warn_once("sandbox: not root and no namespaces: programs run as YOUR user and can read your files "
                   "and signal your processes; use a container or a remote sandbox for untrusted code")
    return iso


# ---------------------------------------------------------------------------------------------------------
# Zygotes: pre-started interpreters (one per busy worker) that fork one supervisor per job.


class _ZygoteLost(RuntimeError):
    pass


class _Zygote:
    def __init__(self, mode: str):
        self.proc = subprocess.Popen([PYTHON, "-I", "-S", "-B", "-c", ZYGOTE, mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env=_BASE_ENV,
                                     start_new_session=True)
        self.usable = True

    def request(self, payload: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        try:
            try:
                self.proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
                self.proc.stdin.flush()
            except OSError as exc:
                raise _ZygoteLost(f"zygote gone: {exc}") from exc
            size = int.from_bytes(self._read(8, deadline), "little")
            return self._read(size, deadline)
        except BaseException:
            self.usable = False  # a half-read answer would be read as the next job's: never reuse it
            raise

    def _read(self, n: int, deadline: float) -> bytes:
        fd, buf = self.proc.stdout.fileno(), bytearray()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _ZygoteLost("the supervisor did not answer in time")
            if poller.poll(left * 1000):
                chunk = os.read(fd, n - len(buf))
                if not chunk:
                    raise _ZygoteLost(f"zygote exited ({self.proc.poll()})")
                buf += chunk
        return bytes(buf)

    def kill(self, uid: int | None = None) -> None:
        """Its group holds the supervisors; their pid namespaces die with them (PR_SET_PDEATHSIG)."""
        self.usable = False
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if uid is not None:  # no pid namespace: the job's processes that left the group still carry its uid
            subprocess.run([PYTHON, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid,
                           extra_groups=[], env={}, cwd="/", timeout=30, check=False)
        self.proc.wait()

    def close(self) -> None:
        self.usable = False
        try:
            self.proc.stdin.close()  # EOF: the zygote exits between jobs
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


_idle: dict[Isolation, list[_Zygote]] = {}
_idle_lock = threading.Lock()


def _checkout(iso: Isolation) -> _Zygote:
    with _idle_lock:
        pool = _idle.setdefault(iso, [])
        if pool:
            return pool.pop()
    return _Zygote(iso.mode)


def _checkin(iso: Isolation, zygote: _Zygote) -> None:
    with _idle_lock:
        pool = _idle.setdefault(iso, [])
        if zygote.usable and zygote.proc.poll() is None and len(pool) < MAX_WORKERS:
            pool.append(zygote)
            return
    if zygote.proc.poll() is None:
        zygote.close()


@atexit.register
def shutdown() -> None:
    """Stop the idle zygotes (they also exit on their own when this process dies: their stdin closes)."""
    with _idle_lock:
        zygotes = [z for pool in _idle.values() for z in pool]
        _idle.clear()
    for z in zygotes:
        z.close()


# ---------------------------------------------------------------------------------------------------------
# One job, host side.

_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


def _take_uid() -> int:
    with _uid_lock:
        while True:
            uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _run_guarded(job: Job, iso: Isolation) -> SandboxResult:
    start = time.monotonic()
    try:
        if iso.mode == "unavailable":
            return _infra(job, f"sandbox unavailable: {iso.problem}", start)
        return _run_job(job, iso, start)
    except Exception as exc:  # the sandbox's own failure must reach the caller as a status, not a traceback
        logger.exception("sandbox job failed")
        return _infra(job, f"{type(exc).__name__}: {exc}", start)


def _infra(job: Job, detail: str, start: float) -> SandboxResult:
    return SandboxResult(0, job.total, "infra_error", detail=detail, elapsed_s=time.monotonic() - start)


def _run_job(job: Job, iso: Isolation, start: float) -> SandboxResult:
    nonce = secrets.token_hex(16)
    uid = _take_uid() if iso.drop_uid else None
    workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        io_mode = bool(job.io_cases)
        spec = {
            "ns": iso.namespaces, "uid": uid, "workdir": workdir, "prefix": sys.base_prefix,
            "timeout": float(job.timeout_s), "memory_mb": int(job.memory_mb), "disk_mb": DISK_MB,
            # RLIMIT_NPROC counts all processes of a uid: when the job shares the caller's, it gets NPROC more
            "nproc": NPROC, "nproc_shared": uid is None and not iso.userns, "nofile": NOFILE, "out_cap": OUTPUT_CAP,
            "job": {"nonce": nonce, "mode": "io" if io_mode else "tests", "program": job.program,
                    "tests": list(job.tests)},
            "stdins": [i.encode() for i, _ in job.io_cases] if io_mode else [None],
            # an output longer than the expected one is wrong whatever it says; no need to keep it all
            "caps": [len(o.encode()) + 4096 for _, o in job.io_cases] if io_mode else [OUTPUT_CAP],
        }
        if not iso.namespaces and uid is not None:
            os.chown(workdir, uid, uid)
        zygote = _checkout(iso)
        try:
            raw = zygote.request(marshal.dumps(spec), job.timeout_s + STARTUP_SLACK_S)
        except _ZygoteLost as exc:
            zygote.kill(None if iso.namespaces else uid)
            return _infra(job, str(exc), start)
        finally:
            _checkin(iso, zygote)
        try:
            report = ast.literal_eval(raw.decode())
        except (ValueError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError):
            return _infra(job, "unreadable supervisor report", start)
        for note in report.get("notes", ()):
            _warn_once(f"sandbox: {note}")
        if report.get("error"):
            return _infra(job, report["error"], start)
        score = _score_io if io_mode else _score_tests
        return score(job, report["runs"], nonce, start)
    finally:
        _remove_tree(workdir)
        if uid is not None:
            with _uid_lock:
                _uids_in_use.discard(uid)


def _remove_tree(path: str) -> None:
    def retry_writable(func, target, _exc):
        os.chmod(os.path.dirname(target), 0o700)
        func(target)

    try:
        shutil.rmtree(path, onerror=retry_writable)
    except OSError as exc:
        _warn_once(f"sandbox: could not remove work dir {path}: {exc}")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _outcome(run: dict) -> str:
    if run["timed_out"]:
        return "timed out"
    code = run["returncode"]
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _score_tests(job: Job, runs: list[dict], nonce: str, start: float) -> SandboxResult:
    """Count a test only from a well-formed record carrying this job's nonce, in order, each exactly once."""
    run = runs[0]
    verdicts: list[bool] = []
    ready = done = forged = False
    for line in _text(run["records"]).splitlines():
        tag, _, body = line.partition(" ")
        if tag != nonce or done:
            forged = True
        elif body == "ready" and not ready:
            ready = True
        elif ready and body == "done":
            done = True
        elif ready and body in (f"{len(verdicts)} P", f"{len(verdicts)} F"):
            verdicts.append(body.endswith("P"))
        else:
            forged = True
        if forged:
            break
    common = dict(stdout=_text(run["stdout"]), stderr=_text(run["stderr"]), elapsed_s=time.monotonic() - start)
    if forged:
        return SandboxResult(0, job.total, "failed", detail="result records tampered with", **common)
    if not ready:
        return SandboxResult(0, job.total, "infra_error", detail=f"the harness never started ({_outcome(run)})",
                             **common)
    verdicts += [False] * (job.total - len(verdicts))
    passed = sum(verdicts)
    if run["timed_out"]:
        status, detail = "timeout", f"timed out after {job.timeout_s:g}s"
    elif not done:
        status, detail = "crashed", f"stopped before the tests finished ({_outcome(run)})"
    else:
        status, detail = ("ok" if passed == job.total else "failed"), f"{passed}/{job.total} tests passed"
    return SandboxResult(passed, job.total, status, detail=detail, results=tuple(verdicts), **common)


def _same_output(got: str, expected: str) -> bool:
    return [line.rstrip() for line in got.rstrip().splitlines()] == \
        [line.rstrip() for line in expected.rstrip().splitlines()]


def _score_io(job: Job, runs: list[dict], nonce: str, start: float) -> SandboxResult:
    """The expected outputs never enter the sandbox: the comparison happens here, on what the supervisor saw."""
    verdicts, status, detail = [], "", ""
    for run, (_, expected) in zip(runs, job.io_cases):
        if _text(run["records"]).splitlines()[:1] != [f"{nonce} ready"]:
            status, detail = "infra_error", f"the harness never started ({_outcome(run)})"
            break
        verdicts.append(run["returncode"] == 0 and not run["truncated"] and
                        _same_output(_text(run["stdout"]), expected))
        if run["timed_out"]:
            status, detail = "timeout", f"timed out after {job.timeout_s:g}s"
        elif run["returncode"] < 0:
            status, detail = "crashed", f"case {len(verdicts) - 1}: {_outcome(run)}"
    verdicts += [False] * (job.total - len(verdicts))
    passed = sum(verdicts) if status != "infra_error" else 0
    if not status:
        status, detail = ("ok" if passed == job.total else "failed"), f"{passed}/{job.total} cases passed"
    out = "".join(_text(r["stdout"]) for r in runs)[:OUTPUT_CAP]
    err = "".join(_text(r["stderr"]) for r in runs)[:OUTPUT_CAP]
    return SandboxResult(passed, job.total, status, out, err, detail, time.monotonic() - start, tuple(verdicts))


# ---------------------------------------------------------------------------------------------------------
# The zygote, run with `python -I -S -B -c` as root (or as the caller without root). It imports only cheap
# builtin-ish modules: every job and every program inherits them by fork.
#
#   zygote (own net+uts namespaces) ── S (job: new pid+mount+ipc namespaces) ── P1 (supervisor, PID 1)
#                                                                                └── R (program + harness)
#
# Requests and answers are length-prefixed: marshal in (from the trusted host), repr() of plain values out.
ZYGOTE = r'''
import os, sys, select, marshal, resource, signal, ctypes, time, fcntl
import traceback  # unused here: preloaded so that a failing test need not import it

libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38

def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))

def mount(src, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s else None
    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)

def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)

def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

def die_with_parent(parent):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() not in (parent, 0):  # 0: our parent is outside our new pid namespace
        os._exit(1)

# ---- S: the job process, in the host's pid namespace

def run_job(spec):
    r, w = os.pipe()
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            job_process(spec, w, zygote)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks) or repr({"error": "the job process died without a report"}).encode()

def job_process(spec, w, zygote):
    die_with_parent(zygote)
    try:
        if spec["ns"]:
            check(libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC), "unshare")
            mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount may propagate back to the host
    except OSError as exc:
        write_all(w, repr({"error": "could not create namespaces: %s" % exc}).encode())
        return
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(me)
            try:
                report = supervise(spec)
            except Exception as exc:
                report = {"error": "supervisor failed: %r" % (exc,)}
            write_all(w, repr(report).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)

def zygote_namespaces(mode):
    """Once per zygote: its own network (loopback only, down) and uts namespaces, which its jobs share one
    after the other (a job cannot change them without capabilities, and leaves nothing running in them)."""
    if mode == "none":
        return None
    uid, gid = os.getuid(), os.getgid()
    try:
        check(libc.unshare(CLONE_NEWNET | CLONE_NEWUTS | (CLONE_NEWUSER if mode == "userns" else 0)), "unshare")
        if mode == "userns":
            for name, text in (("uid_map", "0 %d 1" % uid), ("setgroups", "deny"), ("gid_map", "0 %d 1" % gid)):
                with open("/proc/self/" + name, "w") as f:
                    f.write(text)
    except OSError as exc:
        return "could not create namespaces: %s" % exc
    return None

# ---- P1: the supervisor

def supervise(spec):
    notes = []
    if spec["ns"]:
        private_filesystem(spec, notes)
    elif libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # orphans come back to us, to be killed
        notes.append("PR_SET_CHILD_SUBREAPER failed: a program's detached children may outlive its job")
    if spec["nproc_shared"]:
        me = os.getuid()
        spec["nproc"] += sum(1 for p in os.listdir("/proc") if p.isdigit() and owner(p) == me)
    report = {"notes": notes, "runs": [], "error": None}
    deadline = time.monotonic() + spec["timeout"]
    for stdin, cap in zip(spec["stdins"], spec["caps"]):
        run = run_one(spec, stdin, cap, deadline)
        sweep(spec)
        if "error" in run:
            report["error"] = run["error"]
            break
        report["runs"].append(run)
        if run["timed_out"]:
            break
    return report

def owner(pid):
    try:
        return os.stat("/proc/" + pid).st_uid
    except OSError:
        return None

def private_filesystem(spec, notes):
    """A pid-namespace /proc; everything else read-only and nosuid, except fresh tmpfs dirs that die with us."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    attr = (ctypes.c_uint64 * 4)(0x1 | 0x2, 0, 0, 0)  # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
    if libc.syscall(ctypes.c_long(442), ctypes.c_long(-100), b"/", ctypes.c_long(0x8000), attr,
                    ctypes.c_long(32)) != 0:  # mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, ...), Linux >= 5.12
        notes.append("mount_setattr failed (%s): the host filesystem stays writable where the job's uid may write; "
                     "only /tmp, /var/tmp, /dev/shm and /run/lock are replaced" % os.strerror(ctypes.get_errno()))
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d):
            mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=16m")
    # The interpreter may live under a directory the job's uid cannot enter (pyenv in /root): cover that
    # directory with an empty tmpfs and bind the interpreter's prefix back at its own path, so imports work.
    path = "/"
    for part in spec["prefix"].strip("/").split("/")[:-1]:
        path = os.path.join(path, part)
        if spec["uid"] is not None and not os.stat(path).st_mode & 0o001:
            fd = os.open(spec["prefix"], os.O_PATH)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            os.makedirs(spec["prefix"])
            mount("/proc/self/fd/%d" % fd, spec["prefix"], None, MS_BIND | MS_REC)
            os.close(fd)
            break
    os.makedirs(spec["workdir"], exist_ok=True)
    owner = ",uid=%d,gid=%d" % (spec["uid"], spec["uid"]) if spec["uid"] is not None else ""
    mount("tmpfs", spec["workdir"], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=%dm%s" % (spec["disk_mb"], owner))

def memfd(data):
    fd = os.memfd_create("stdin")
    write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

def read_into(fd, buf, cap):
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    if chunk and len(buf) < cap:
        buf += chunk[: cap - len(buf)]
    return bool(chunk)

def run_one(spec, stdin, cap, deadline):
    hard_exit = os._exit  # a local: the program may rebind os._exit, not this frame's variables
    stdin_fd = memfd(stdin) if stdin is not None else os.open("/dev/null", os.O_RDONLY)
    (out_r, out_w), (err_r, err_w), (rec_r, rec_w), (go_r, go_w) = [os.pipe() for _ in range(4)]
    pid = os.fork()
    if pid == 0:
        code = 127
        try:
            go_w = high(go_w)
            try:
                enter_jail(spec, [stdin_fd, out_w, err_w, rec_w], go_w)
            except BaseException as exc:
                os.write(go_w, ("could not start the program: %r" % (exc,)).encode())
                raise
            os.close(go_w)
            code = harness(spec["job"])
        finally:
            hard_exit(code)  # R never returns into the supervisor's code
    for fd in (stdin_fd, out_w, err_w, rec_w, go_w):
        os.close(fd)
    failure = os.read(go_r, 4096)
    os.close(go_r)
    if failure:
        os.waitpid(pid, 0)
        return {"error": failure.decode(errors="replace")}
    caps = {out_r: cap, err_r: spec["out_cap"], rec_r: 65536}
    bufs = {fd: bytearray() for fd in caps}
    poller = select.poll()
    for fd in caps:
        poller.register(fd, select.POLLIN)
    try:
        pidfd = os.pidfd_open(pid)  # wakes the poll when the program exits (Linux >= 5.3)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None
    status, timed_out = None, False
    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            status, timed_out = os.waitpid(pid, 0)[1], True
            break
        for fd, _ in poller.poll(left * 1000 if pidfd is not None else min(left * 1000, 5)):
            if fd in bufs and not read_into(fd, bufs[fd], caps[fd]):
                poller.unregister(fd)
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
    # Descendants may still hold the pipes open: take what is there now instead of waiting for EOF.
    for fd, buf in bufs.items():
        os.set_blocking(fd, False)
        for _ in range(64):
            if not read_into(fd, buf, caps[fd]):
                break
        os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
            "stdout": bytes(bufs[out_r]), "stderr": bytes(bufs[err_r]), "records": bytes(bufs[rec_r]),
            "truncated": len(bufs[out_r]) >= cap}

def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

def sweep(spec):
    """Kill whatever the program left behind, before the next case and before reporting."""
    if spec["ns"]:
        if os.getpid() == 1:  # kill(-1) from a namespace's init reaches only that namespace
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        return
    me = str(os.getpid())
    for _ in range(200):  # a fork bomb refills the tree while we kill; NPROC bounds how long
        children = {}
        for name in os.listdir("/proc"):
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    ppid = f.read().rsplit(b")", 1)[1].split()[1].decode()
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(name)
        found, todo = [], list(children.get(me, []))
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        reap()
        if not found:
            return
        for pid in found:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()

# ---- R: the program's process

def high(fd):
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)

def enter_jail(spec, fds, go_w):
    moved = [high(fd) for fd in fds]
    for target, fd in enumerate(moved):
        os.dup2(fd, target)
    os.closerange(len(fds), go_w)  # above all the zygote's pipe to the host and the report pipe
    os.closerange(go_w + 1, 1 << 16)
    os.setsid()  # its own process group: killpg(0) from the program cannot reach the zygote
    work, uid = spec["workdir"], spec["uid"]
    os.chdir(work)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # No capabilities left, even as uid 0 of a user namespace (then NO_NEW_PRIVS keeps exec from restoring them)
    check(libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()), "capset")
    cpu = int(spec["timeout"]) + 1
    limits = [(resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (spec["memory_mb"] << 20,) * 2),
              (resource.RLIMIT_FSIZE, (spec["disk_mb"] << 20,) * 2), (resource.RLIMIT_NOFILE, (spec["nofile"],) * 2),
              (resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_NPROC, (spec["nproc"],) * 2)]
    for res, value in limits:
        resource.setrlimit(res, value)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work})

def report_exception():
    try:
        import traceback
        traceback.print_exc()
    except BaseException:
        pass

# The harness keeps its own references (default arguments, bound before any program runs), so a program
# that rebinds builtins or module attributes cannot change how results are recorded; a program that
# kills or wedges the process loses the records the harness did not write, which only lowers its score.
def harness(job, write=os.write, close=os.close, Base=BaseException, compile_=compile, exec_=exec,
            enumerate_=enumerate, builtins=__builtins__, report=report_exception):
    nonce = job["nonce"]
    def emit(text):
        write(3, (nonce + " " + text + "\n").encode())
    emit("ready")
    os.set_inheritable(3, False)  # programs it execs need not see the channel
    if job["mode"] == "io":
        close(3)
        sys.argv = ["main.py"]
        return run_script(job["program"], exec_, compile_, builtins)
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        exec_(compile_(job["program"], "<program>", "exec"), namespace)
        loaded = True
    except Base:
        report()
        loaded = False
    for i, test in enumerate_(job["tests"]):
        ok = False
        if loaded:
            try:
                exec_(compile_(test, "<test %d>" % i, "exec"), namespace)
                ok = True
            except Base:
                report()
        emit("%d %s" % (i, "P" if ok else "F"))
    flush()
    emit("done")
    return 0

def run_script(source, exec_, compile_, builtins):
    """What `python main.py` does: run it, turn SystemExit into the exit code, wait for threads, run atexit."""
    code = 0
    try:
        exec_(compile_(source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        report_exception()
        code = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        report_exception()
    return code if flush() else 120

def flush():
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        return True
    except BaseException:
        return False

def serve(mode):
    problem = zygote_namespaces(mode)
    while True:
        head = read_exact(0, 8)
        if head is None:
            return
        spec = marshal.loads(read_exact(0, int.from_bytes(head, "little")))
        report = repr({"error": problem}).encode() if problem else run_job(spec)
        write_all(1, len(report).to_bytes(8, "little") + report)

serve(sys.argv[1])
'''
