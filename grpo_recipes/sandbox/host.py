"""The host side: jobs, the pool of zygotes, isolation detection, and turning reports into results."""

from __future__ import annotations

import atexit
import functools
import json
import logging
import marshal
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import judge, split, verdict
from .inside import cgroup

logger = logging.getLogger("grpo_recipes.sandbox")
infra_errors = 0  # jobs of this process that ended in infra_error (each one also logged)

STATUSES = ("ok", "failed", "timeout", "crashed", "infra_error")
SANDBOX_MODE_TESTS = ("run", "refuse")
OUTPUT_CAP = 16_384  # bytes of stdout/stderr kept per job: enough to debug, bounded under a print loop
IO_OUTPUT_CAP = 1 << 20  # stdout kept per io case, the same for every case (a per-case cap would leak its answer)
RECORDS_CAP = 8 << 20  # result records per job; values are bounded by inside/codec.py's MAX_BYTES each
DISK_MB = 64  # the work dir's tmpfs; RLIMIT_FSIZE caps one file at the same size
NPROC = 64  # processes + threads of the job (its cgroup's pids.max, and RLIMIT_NPROC of its uid)
NOFILE = 64
MAX_WORKERS = 64  # default pool size cap, and how many idle zygotes (about 12 MB each) are kept
STARTUP_SLACK_S = 20.0  # the host gives up on a supervisor this long after the job's own deadline
ENV_ISOLATION = "GRPO_SANDBOX_ISOLATION"  # auto (default) | namespaces | userns | none
ENV_REQUIRE = "GRPO_SANDBOX_REQUIRE"  # comma list of PROTECTIONS to insist on: refuse to run without them
PROTECTIONS = ("namespaces", "minimal_root", "seccomp", "cgroup", "unique_uid", "oom_score_adj", "unix_sockets_only",
               "private_inodes")
# What the start-up warning says a missing protection means (docs/sandbox.md quotes each one).
CONSEQUENCES = {
    "namespaces": "programs share the host's network and see its processes",
    "minimal_root": "programs see the host's files (those their uid may read)",
    "seccomp": "programs may call unshare, keyctl, io_uring, bpf, ptrace and the mount API: only the kernel's own "
               "permission checks stand",
    "cgroup": f"memory is capped per process only (RLIMIT_AS = memory_mb, RLIMIT_NPROC = {NPROC} per uid): "
              f"up to {NPROC} x memory_mb for a job",
    "unique_uid": "jobs share one uid: they may signal each other's processes and share per-uid limits",
    "oom_score_adj": "under memory pressure the kernel may kill the trainer before a sandbox process",
    "unix_sockets_only": "programs may open AF_VSOCK sockets, whose ports are the host's, and hold ports of other "
                         "families in the network namespace",
    "private_inodes": "file locks, leases and inotify marks on those files reach jobs that run at the same time",
}
_UID_BASE, _UID_SPAN = 0x50000000, 1 << 24  # unique per-job uids: no /etc/passwd entry, no shared rlimits
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# The interpreter the sandbox runs: the base one, since -S ignores the venv anyway.
PYTHON = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
INSIDE = str(Path(__file__).resolve().parent / "inside")  # run as a folder: `python -I -S -B INSIDE`


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    status: str  # one of STATUSES
    stdout: str = ""
    stderr: str = ""
    detail: str = ""  # why, in a few words: "exit code 1", "killed by signal 9", ...
    elapsed_s: float = 0.0
    results: tuple[bool, ...] = ()  # per test or case
    # per test: "host" (the host judged its values), "sandbox" (the harness did) or "refused" (not run: failed)
    modes: tuple[str, ...] = ()

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def judged_in_sandbox(self) -> int:
        """How many tests ran in the weaker mode, where the verdict is the in-sandbox harness's report."""
        return sum(m == "sandbox" for m in self.modes)

    @property
    def refused(self) -> int:
        """How many tests were refused (Job.sandbox_mode_tests="refuse"): they count as failed."""
        return sum(m == "refused" for m in self.modes)


@dataclass(frozen=True)
class ProgramResult:
    """What `python main.py < stdin` did: for a tool that shows a program's output to a model."""

    status: str  # ok (exit 0), failed (other exit code), timeout, crashed (signal), infra_error
    returncode: int | None
    stdout: str
    stderr: str
    detail: str = ""
    elapsed_s: float = 0.0
    truncated: bool = False  # stdout hit output_cap


@dataclass(frozen=True)
class Job:
    """One program with either `tests` (Python snippets run after it) or `io_cases` ((stdin, expected stdout))."""

    program: str
    tests: tuple[str, ...] = ()
    io_cases: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 5.0  # wall clock for the whole job: the program plus all its tests or cases
    memory_mb: int = 512  # for all of the job's processes together (cgroup), and per process (RLIMIT_AS)
    # A test the host cannot split: "run" it whole in the sandbox (where a program can forge its verdict), or
    # "refuse" it: not run, failed, with the reason (docs/sandbox.md, "The weaker mode").
    sandbox_mode_tests: str = "run"

    def __post_init__(self):
        object.__setattr__(self, "tests", tuple(str(t) for t in self.tests))
        object.__setattr__(self, "io_cases", tuple((str(i), str(o)) for i, o in self.io_cases))
        if bool(self.tests) == bool(self.io_cases):
            raise ValueError("a Job needs exactly one of: tests (non-empty) or io_cases (non-empty)")
        if self.sandbox_mode_tests not in SANDBOX_MODE_TESTS:
            raise ValueError(f"sandbox_mode_tests must be one of {SANDBOX_MODE_TESTS}, "
                             f"got {self.sandbox_mode_tests!r}")
        _check_limits(self.timeout_s, self.memory_mb)

    @property
    def total(self) -> int:
        return len(self.tests) or len(self.io_cases)


def _check_limits(timeout_s: float, memory_mb: int) -> None:
    if not (0 < timeout_s <= 3600) or memory_mb < 64:
        raise ValueError(f"need 0 < timeout_s <= 3600 and memory_mb >= 64, got {timeout_s}, {memory_mb}")


def run_tests(program: str, tests: Sequence[str], *, timeout_s: float = 5.0, memory_mb: int = 512,
              sandbox_mode_tests: str = "run") -> SandboxResult:
    """Run `program`, then each test against it; a test passes when its assertions hold and nothing raises."""
    return run_many([Job(program, tuple(tests), timeout_s=timeout_s, memory_mb=memory_mb,
                         sandbox_mode_tests=sandbox_mode_tests)])[0]


def run_io_tests(
    program: str, cases: Sequence[tuple[str, str]], *, timeout_s: float = 5.0, memory_mb: int = 512
) -> SandboxResult:
    """Run `program` once per case with the case's stdin; a case passes when it exits 0 printing the expected text.

    Outputs are compared outside the sandbox, ignoring trailing whitespace on each line and trailing blank lines.
    """
    return run_many([Job(program, io_cases=tuple(cases), timeout_s=timeout_s, memory_mb=memory_mb)])[0]


def run_program(code: str, stdin: str = "", *, timeout_s: float = 5.0, memory_mb: int = 512,
                output_cap: int = OUTPUT_CAP) -> ProgramResult:
    """Run `code` as a script (`__main__`) with `stdin`, in the same walls as every job; never raises for the code."""
    _check_limits(timeout_s, memory_mb)
    start = time.monotonic()
    iso = isolation()
    try:
        if iso.mode == "unavailable":
            raise _Infra(f"sandbox unavailable: {iso.problem}")
        cap = max(1, int(output_cap))
        report = _execute(iso, "io", code, [], [stdin.encode()], timeout_s, memory_mb, cap, full_keep=cap)
        run = report["runs"][0]
    except _Infra as exc:
        return ProgramResult("infra_error", None, "", "", str(exc), time.monotonic() - start)
    except Exception as exc:  # the sandbox's own failure must reach the caller as a status, not a traceback
        logger.exception("sandbox program failed")
        return ProgramResult("infra_error", None, "", "", f"{type(exc).__name__}: {exc}", time.monotonic() - start)
    code_ = run["returncode"]
    status = ("timeout" if run["timed_out"] else "crashed" if code_ < 0 else "ok" if code_ == 0 else "failed")
    detail = f"timed out after {timeout_s:g}s" if run["timed_out"] else _outcome(run)
    return ProgramResult(status, code_, _text(run["stdout"]), _text(run["stderr"]), detail,
                         time.monotonic() - start, run["stdout_full"])


def default_workers() -> int:
    # Most of a job's wall time is the kernel building and tearing down namespaces, not CPU: oversubscribe.
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(4 * cpus, MAX_WORKERS)


def run_many(jobs: Iterable[Job], *, max_workers: int | None = None) -> list[SandboxResult]:
    """Results in the order of `jobs`. Never raises for a job: a sandbox failure is status 'infra_error'."""
    jobs = list(jobs)
    if not jobs:
        return []
    global infra_errors
    iso = isolation()
    with ThreadPoolExecutor(max_workers=min(max_workers or default_workers(), len(jobs))) as pool:
        results = list(pool.map(lambda job: _run_guarded(job, iso), jobs))
    for result in results:  # a fault of the host, never of the program: say so, every time
        if result.status == "infra_error":
            with _warn_lock:
                infra_errors += 1
            if result.detail.startswith("sandbox unavailable"):
                _warn_once(f"sandbox: infra_error (no reward for the job): {result.detail}")
            else:
                logger.warning("sandbox: infra_error (no reward for the job): %s", result.detail)
    return results


# ---------------------------------------------------------------------------------------------------------
# Isolation: what this machine allows, probed once per mode with a real job, and what the user insists on.


@dataclass(frozen=True)
class Isolation:
    mode: str  # "namespaces" (root), "userns" (unprivileged user namespaces), "none", or "unavailable"
    namespaces: bool = False
    userns: bool = False
    drop_uid: bool = False  # run programs as a unique unprivileged uid (needs root)
    problem: str = ""  # for "unavailable": why no job can run
    walls: tuple[tuple[str, str], ...] = field(default=())  # (protection, "" when on, else why it is missing)

    def missing(self) -> dict[str, str]:
        return {name: why for name, why in self.walls if why}

    def describe(self) -> str:
        if self.mode == "unavailable":
            return f"unavailable: {self.problem}"
        on = [name for name, why in self.walls if not why]
        text = f"{self.mode}: " + ", ".join(on)
        if self.missing():
            text += "; MISSING: " + "; ".join(f"{k} ({v})" for k, v in self.missing().items())
        return text


_iso_cache: dict[tuple[str, frozenset], Isolation] = {}
_iso_lock = threading.Lock()
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning(message)


def _settings() -> tuple[str, frozenset]:
    mode = os.environ.get(ENV_ISOLATION, "auto").strip().lower() or "auto"
    if mode not in ("auto", "namespaces", "userns", "none"):
        raise ValueError(f"${ENV_ISOLATION} must be auto, namespaces, userns or none; got {mode!r}")
    require = frozenset(p.strip() for p in os.environ.get(ENV_REQUIRE, "").split(",") if p.strip())
    unknown = require - set(PROTECTIONS)
    if unknown:
        raise ValueError(f"${ENV_REQUIRE}: unknown protection(s) {sorted(unknown)}; "
                         f"choose from {', '.join(PROTECTIONS)}")
    return mode, require


def isolation() -> Isolation:
    """The isolation this process uses (per $GRPO_SANDBOX_ISOLATION and $GRPO_SANDBOX_REQUIRE), probed once."""
    key = _settings()
    with _iso_lock:
        if key not in _iso_cache:
            iso = _detect(key[0])
            refused = {k: v for k, v in iso.missing().items() if k in key[1]}
            if iso.mode != "unavailable" and refused:
                problem = "required protection missing: " + "; ".join(f"{k} ({v})" for k, v in refused.items())
                logger.error("sandbox: %s (${%s}=%s)", problem, ENV_REQUIRE, ",".join(sorted(key[1])))
                iso = Isolation("unavailable", problem=problem, walls=iso.walls)
            elif iso.missing():
                _warn_once(missing_warning(iso))
            _iso_cache[key] = iso
            logger.info("sandbox isolation: %s", iso.describe())
        return _iso_cache[key]


def missing_warning(iso: Isolation) -> str:
    """The start-up warning: each missing protection, why, and what that means for a program."""
    return (f"sandbox: running WITHOUT {', '.join(iso.missing())}: "
            + "; ".join(f"{k} ({v}): {CONSEQUENCES[k]}" for k, v in iso.missing().items())
            + f". Set ${ENV_REQUIRE} to refuse to run without them.")


# json: a stdlib import must work. The sockets a program must not open: AF_VSOCK, whose ports are the host's, and
# families that would hold ports or state in the zygote's network namespace.
_PROBE = """import json, socket
x = json.loads('1')
opened = []
for name, family, kind in (("AF_VSOCK", 40, 1), ("AF_INET", 2, 2), ("AF_INET6", 10, 2), ("AF_NETLINK", 16, 3)):
    try:
        socket.socket(family, kind).close()
        opened.append(name)
    except OSError:
        pass
print(json.dumps(opened))
"""


def _probe(iso: Isolation) -> tuple[str, dict]:
    """('', the program's walls and the socket families it opened) when a trivial job passes under `iso`, else
    (what went wrong, {})."""
    try:
        report = _execute(iso, "tests", _PROBE, [split.split_test("assert x == 1")], [], 60.0, 256, OUTPUT_CAP)
    except _Infra as exc:
        return str(exc), {}
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", {}
    run = report["runs"][0]
    ready, done, outcomes, forged = verdict.read_tests(run["records"], report["nonce"],
                                                       [split.split_test("assert x == 1")])
    if done and outcomes and outcomes[0].passed and not forged:
        return "", dict(run["walls"], sockets=json.loads(_text(run["stdout"])))
    return f"the probe job failed ({_outcome(run)}): {_text(run['stderr'])[-600:]}".strip(), {}


def _detect(mode: str) -> Isolation:
    root = os.geteuid() == 0
    if mode == "userns" and root:
        # uid 0 mapped to itself stays exempt from RLIMIT_NPROC: a fork bomb would be unbounded
        return Isolation("unavailable", problem="userns isolation is for unprivileged users; as root use namespaces")
    if mode != "none":
        use_userns = mode == "userns" or (mode == "auto" and not root)
        iso = _with_walls(Isolation("userns" if use_userns else "namespaces", True, use_userns,
                                    drop_uid=not use_userns))
        if iso.mode != "unavailable":
            return iso
        if mode != "auto":
            logger.error("sandbox: isolation %r requested but unavailable: %s", mode, iso.problem)
            return iso
        _warn_once(f"sandbox: namespaces unavailable ({iso.problem}); DEGRADED to process-group isolation: programs "
                   "share the host network, can see host processes and files, and can write world-writable dirs")
    iso = _with_walls(Isolation("none", drop_uid=root))
    if iso.mode == "unavailable":
        logger.error("sandbox: cannot run programs at all: %s", iso.problem)
        return iso
    if not root:
        _warn_once("sandbox: not root and no namespaces: programs run as YOUR user and can read your files "
                   "and signal your processes; use a container or a remote sandbox for untrusted code")
    return iso


def _with_walls(iso: Isolation) -> Isolation:
    """Start a zygote for `iso`, run the probe job, and record which protections the program really got."""
    try:
        walls = dict(_zygote_walls(iso.mode))
    except (_Infra, OSError) as exc:  # OSError: the interpreter itself cannot start
        return Isolation("unavailable", problem=str(exc))
    problem, program_walls = _probe(iso)
    if problem:
        return Isolation("unavailable", problem=problem)
    if not program_walls.get("seccomp") and not walls.get("seccomp"):
        walls["seccomp"] = "the program's process did not install the filter"
    if walls.get("cgroup", "") == "" and not program_walls.get("cgroup"):
        walls["cgroup"] = "the program's process did not join the job cgroup"
    walls["namespaces"] = "" if iso.namespaces else "isolation mode none: no pid, network, mount or ipc namespaces"
    opened = program_walls["sockets"]
    walls["unix_sockets_only"] = f"a program opened {', '.join(opened)} sockets" if opened else ""
    walls["unique_uid"] = "" if iso.drop_uid else (
        "not root: programs run as the caller's uid" + (" (uid 0 of a user namespace, no capabilities)"
                                                        if iso.userns else ""))
    ordered = tuple((name, walls.get(name, "not reported")) for name in PROTECTIONS)
    return Isolation(iso.mode, iso.namespaces, iso.userns, iso.drop_uid, walls=ordered)


# ---------------------------------------------------------------------------------------------------------
# What a zygote is told at start-up: the minimal root's contents and the cgroup parents.


@functools.cache
def _cgroup_config() -> tuple[dict | None, str]:
    return cgroup.detect()


def _shared_library_paths() -> set[str]:
    """Every shared library the interpreter and its extension modules load, as the loader names them."""
    dynload = {os.path.dirname(m.__file__) for m in map(sys.modules.get, ("_json", "_ctypes", "math", "_struct"))
               if m is not None and getattr(m, "__file__", None)}
    targets = [PYTHON] + [str(p) for p in Path(PYTHON).parent.parent.glob("lib/libpython*.so*")]
    for d in dynload:
        targets += [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".so")]
    ldd = shutil.which("ldd")
    paths: set[str] = set()
    if ldd is not None:
        out = subprocess.run([ldd, *targets], capture_output=True, text=True, timeout=120).stdout
        paths |= set(re.findall(r"=>\s+(/\S+)", out)) | set(re.findall(r"^\s+(/\S+)\s+\(0x", out, re.M))
    else:  # no ldd: the usual library folders
        paths |= {os.path.join(d, "x") for d in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.isdir(d)}
    return paths | {p for p in targets if p != PYTHON}


def _expose(path: str, links: dict[str, str], binds: set[str]) -> None:
    """Make `path` resolvable in the new root: recreate the symlinks along it and bind its real location."""
    parts = [p for p in path.split("/") if p]
    current = "/"
    for i, part in enumerate(parts):
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            target = os.readlink(candidate)
            links[candidate] = target
            resolved = os.path.normpath(os.path.join(current, target))
            return _expose(os.path.join(resolved, *parts[i + 1:]), links, binds)
        current = candidate
    binds.add(current)


@functools.cache
def _root_layout() -> dict:
    """What the minimal root holds: the interpreter, its standard library, and the libraries they load."""
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                      "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})
    links: dict[str, str] = {}
    binds: set[str] = set()
    _expose(PYTHON, links, binds)
    for key in ("stdlib", "platstdlib"):
        if os.path.isdir(paths[key]):
            _expose(paths[key], links, binds)
    for lib in _shared_library_paths():
        _expose(os.path.dirname(lib), links, binds)
    if os.path.exists("/etc/ld.so.cache"):
        _expose("/etc/ld.so.cache", links, binds)
    # a bind inside another bind is redundant; site-packages inside a bind are hidden (stdlib only)
    binds = {b for b in binds if not any(b != o and b.startswith(o.rstrip("/") + "/") for o in binds)}
    masks = set()
    for key in ("purelib", "platlib"):
        real = os.path.realpath(paths[key])
        if os.path.isdir(real) and any(real.startswith(b.rstrip("/") + "/") for b in binds):
            masks.add(real)
    for b in binds:
        for name in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(b, name)):
                masks.add(os.path.join(b, name))
    _warm(binds, masks)
    return {"binds": sorted(binds), "links": sorted(links.items()), "masks": sorted(masks),
            "staging": tempfile.gettempdir()}


def _warm(binds: set[str], masks: set[str]) -> None:
    """Ask the kernel to cache every file the minimal root shows, before any job runs. The page cache of these
    files is shared by every job (the overlays read the host's inodes): a job that reads a file nothing else read
    would leave it cached for the next job to time. With all of it cached, and no call that evicts a page allowed
    (inside/seccomp.py), a job has no page to change. Memory pressure on the host can still evict some."""
    for top in binds:
        for folder, dirs, files in os.walk(top) if os.path.isdir(top) else [(os.path.dirname(top), [], [top])]:
            dirs[:] = [d for d in dirs if os.path.join(folder, d) not in masks]
            for name in files:
                try:
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError:  # a dangling link, a socket, a file we may not read: no job may read it either
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                except OSError:
                    pass
                finally:
                    os.close(fd)


def _init_config(mode: str) -> dict:
    cg, _ = _cgroup_config()
    return {"mode": mode, "cgroup": cg, "root": _root_layout() if mode != "none" else None}


_zygote_walls_cache: dict[str, dict] = {}


def _zygote_walls(mode: str) -> dict:
    """The protections a zygote of `mode` set up (starting one, which then waits in the idle pool)."""
    zygote = _checkout(mode)
    _checkin(mode, zygote)
    walls = dict(zygote.walls)
    cg, why = _cgroup_config()
    if cg is None:
        walls["cgroup"] = why
    return walls


# ---------------------------------------------------------------------------------------------------------
# Zygotes: pre-started interpreters (one per busy worker) that fork one supervisor per job.


class _Infra(RuntimeError):
    """The sandbox itself failed: the job's status is infra_error."""


class _ZygoteGone(_Infra):
    """The zygote was dead before it got the job (the OOM killer picks sandbox processes first): retry."""


class _Zygote:
    def __init__(self, mode: str):
        self.mode, self.usable = mode, True
        self.proc = subprocess.Popen([PYTHON, "-I", "-S", "-B", INSIDE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env=_BASE_ENV,
                                     start_new_session=True)
        reply = marshal.loads(self.request([marshal.dumps(_init_config(mode))], 60.0)[0])
        if reply.get("error"):
            self.kill()
            raise _Infra(f"the sandbox could not set up ({mode}): {reply['error']}")
        self.walls = reply["walls"]
        for note in reply.get("notes", ()):
            _warn_once(f"sandbox: {note}")

    def request(self, parts: list[bytes], timeout: float, answers: int = 1) -> list[bytes]:
        """Send length-prefixed parts, read `answers` length-prefixed parts back."""
        deadline = time.monotonic() + timeout
        try:
            try:
                for part in parts:
                    self.proc.stdin.write(len(part).to_bytes(8, "little"))
                    self.proc.stdin.write(part)
                self.proc.stdin.flush()
            except OSError as exc:
                raise _ZygoteGone(f"zygote gone: {exc}") from exc
            out = []
            for _ in range(answers):
                size = int.from_bytes(self._read(8, deadline), "little")
                out.append(self._read(size, deadline))
            return out
        except BaseException:
            self.usable = False  # a half-read answer would be read as the next job's: never reuse it
            raise

    def _read(self, n: int, deadline: float) -> bytearray:
        """`n` bytes, read in place: a report is held once, however much the program printed."""
        fd, buf, got = self.proc.stdout.fileno(), bytearray(n), 0
        view = memoryview(buf)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Infra("the supervisor did not answer in time")
            if poller.poll(left * 1000):
                moved = os.readv(fd, [view[got:]])
                if not moved:
                    raise _Infra(f"zygote exited ({self.proc.poll()})")
                got += moved
        return buf

    def kill(self, uid: int | None = None) -> None:
        """Its group holds the supervisors; their pid namespaces die with them (PR_SET_PDEATHSIG)."""
        self.usable = False
        pid = self.proc.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if uid is not None:  # no pid namespace: the job's processes that left the group still carry its uid
            subprocess.run([PYTHON, "-I", "-S", "-c", "import os; os.kill(-1, 9)"], user=uid, group=uid,
                           extra_groups=[], env={}, cwd="/", timeout=30, check=False)
        self.proc.wait()
        cg, _ = _cgroup_config()
        if cg is not None:
            cgroup.remove_stale(cg, f"{cgroup.PREFIX}{pid}-")

    def close(self) -> None:
        self.usable = False
        try:
            self.proc.stdin.close()  # EOF: the zygote exits between jobs
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


_idle: dict[str, list[_Zygote]] = {}
_idle_lock = threading.Lock()


def _checkout(mode: str) -> _Zygote:
    with _idle_lock:
        pool = _idle.setdefault(mode, [])
        while pool:
            zygote = pool.pop()
            if zygote.proc.poll() is None:
                return zygote
            zygote.usable = False  # died while idle, e.g. chosen by the OOM killer (oom_score_adj 1000)
    return _Zygote(mode)


def _checkin(mode: str, zygote: _Zygote) -> None:
    with _idle_lock:
        pool = _idle.setdefault(mode, [])
        if zygote.usable and zygote.proc.poll() is None and len(pool) < MAX_WORKERS:
            pool.append(zygote)
            return
    if zygote.proc.poll() is None:
        zygote.close()


@atexit.register
def shutdown() -> None:
    """Stop the idle zygotes and judging processes (they also exit on their own when this process dies: their stdin
    closes)."""
    with _idle_lock:
        zygotes = [z for pool in _idle.values() for z in pool]
        _idle.clear()
    for z in zygotes:
        z.close()
    judge.shutdown()


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


def _execute(iso: Isolation, kind: str, program: str, plans: list, stdins: list[bytes], timeout_s: float,
             memory_mb: int, out_cap: int, full_keep: int = OUTPUT_CAP) -> dict:
    """Run one job in a zygote of `iso`: the supervisor's report, with the job's nonce. Raises _Infra.

    A stdout that reached `out_cap` comes back cut to `full_keep` bytes: an io case that fills its cap fails
    whatever it printed, so the host needs only what it shows."""
    nonce = secrets.token_hex(16)
    uid = _take_uid() if iso.drop_uid else None
    workdir = None if iso.namespaces else tempfile.mkdtemp(prefix="grpo-sandbox-")
    try:
        if workdir is not None and uid is not None:
            os.chown(workdir, uid, uid)
        spec = {
            "kind": kind, "cases": len(stdins), "uid": uid, "workdir": workdir, "timeout": float(timeout_s),
            "memory_mb": int(memory_mb), "disk_mb": DISK_MB, "nofile": NOFILE, "nproc": NPROC,
            # RLIMIT_NPROC counts all processes of a uid: when the job shares the caller's, it gets NPROC more
            "nproc_shared": uid is None and not iso.userns, "out_cap": out_cap, "err_cap": OUTPUT_CAP,
            "full_keep": full_keep,
            "records_cap": RECORDS_CAP, "job": {"nonce": nonce, "kind": kind},
        }
        # The program, the tests and each stdin travel as separate blobs: the zygote moves them into memfds
        # without reading them, so no later job forked from it can find them in its memory.
        parts = [marshal.dumps(spec), program.encode("utf-8", "surrogatepass"),
                 marshal.dumps([p.wire() for p in plans]), *stdins]
        for attempt in (1, 2):  # a zygote that died before reading the job ran nothing of it: use another
            zygote = _checkout(iso.mode)
            try:
                raw, trailer = zygote.request(parts, timeout_s + STARTUP_SLACK_S, answers=2)
                trailer = marshal.loads(trailer)
                zygote.usable = not trailer.get("retire")  # a job's sockets outlived it: start a fresh one
                break
            except _ZygoteGone:
                zygote.kill(None if iso.namespaces else uid)
                if attempt == 2:
                    raise
            except _Infra:
                zygote.kill(None if iso.namespaces else uid)
                raise
            finally:
                _checkin(iso.mode, zygote)
        report = _read_report(raw)
        for note in report.get("notes", []) + trailer.get("notes", []):
            _warn_once(f"sandbox: {note}")
        if report.get("error"):
            raise _Infra(report["error"])
        report["nonce"] = nonce
        return report
    finally:
        if workdir is not None:
            _remove_tree(workdir)
        if uid is not None:
            with _uid_lock:
                _uids_in_use.discard(uid)


def _read_report(raw: bytearray) -> dict:
    """P1's report: [8-byte length][marshal meta], then each run's stdout, stderr and records (sizes in meta).

    stdout and stderr are views of `raw`, not copies; the records, parsed on the host, are bytes."""
    if len(raw) < 8:
        raise _Infra("the job process died without a report")
    size = int.from_bytes(raw[:8], "little")
    try:
        report = marshal.loads(raw[8:8 + size])
    except (EOFError, ValueError, TypeError) as exc:
        raise _Infra("unreadable supervisor report") from exc
    pos, view = 8 + size, memoryview(raw)
    for run in report.get("runs", []):
        for name, n in zip(("stdout", "stderr", "records"), run.pop("sizes")):
            run[name] = bytes(view[pos:pos + n]) if name == "records" else view[pos:pos + n]
            pos += n
    return report


def _run_guarded(job: Job, iso: Isolation) -> SandboxResult:
    start = time.monotonic()
    try:
        if iso.mode == "unavailable":
            return _infra(job, f"sandbox unavailable: {iso.problem}", start)
        if job.io_cases:
            report = _execute(iso, "io", job.program, [], [i.encode() for i, _ in job.io_cases], job.timeout_s,
                              job.memory_mb, IO_OUTPUT_CAP)
            return _score_io(job, report, start)
        names = judge.program_names(job.program)
        if isinstance(names, str):  # its text alone cost more than the budget to read
            return SandboxResult(0, job.total, "failed", detail=f"reading its text on the host {names}: "
                                 f"0/{job.total} tests passed", elapsed_s=time.monotonic() - start,
                                 results=(False,) * job.total)
        plans = split.split_tests(list(job.tests), names)
        if job.sandbox_mode_tests == "refuse":
            plans = [split.refused(p) if p.mode == "sandbox" else p for p in plans]
            if all(p.mode == "refused" for p in plans):  # nothing to run
                why = "\n".join(f"[judged on the host] test {i}: {p.reason}" for i, p in enumerate(plans))
                return SandboxResult(0, job.total, "failed", "", why, f"0/{job.total} tests passed: all refused",
                                     time.monotonic() - start, (False,) * job.total, ("refused",) * job.total)
        report = _execute(iso, "tests", job.program, plans, [], job.timeout_s, job.memory_mb, OUTPUT_CAP)
        return _score_tests(job, plans, report, start)
    except (_Infra, judge.JudgeUnavailable) as exc:
        return _infra(job, str(exc), start)
    except Exception as exc:  # the sandbox's own failure must reach the caller as a status, not a traceback
        logger.exception("sandbox job failed")
        return _infra(job, f"{type(exc).__name__}: {exc}", start)


def _infra(job: Job, detail: str, start: float) -> SandboxResult:
    return SandboxResult(0, job.total, "infra_error", detail=detail, elapsed_s=time.monotonic() - start)


def _remove_tree(path: str) -> None:
    def retry_writable(func, target, _exc):
        os.chmod(os.path.dirname(target), 0o700)
        func(target)

    try:
        shutil.rmtree(path, onerror=retry_writable)
    except OSError as exc:
        _warn_once(f"sandbox: could not remove work dir {path}: {exc}")


def _text(raw) -> str:
    return str(raw, "utf-8", "replace")


def _head(chunks, cap: int = OUTPUT_CAP) -> str:
    """The first `cap` bytes of `chunks`, decoded: no more of them is ever joined or decoded."""
    out, left = [], cap
    for chunk in chunks:
        if left <= 0:
            break
        out.append(chunk[:left])
        left -= len(out[-1])
    return _text(b"".join(out))


def _outcome(run: dict) -> str:
    if run["timed_out"]:
        return "timed out"
    code = run["returncode"]
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _score_tests(job: Job, plans: list[split.Plan], report: dict, start: float) -> SandboxResult:
    run = report["runs"][0]
    modes = tuple(p.mode for p in plans)
    ready, done, outcomes, forged, over = judge.read_tests(run["records"], report["nonce"], plans)
    stderr = _text(run["stderr"])
    notes = [f"test {i}: {o.why}" for i, o in enumerate(outcomes) if not o.passed and o.why]
    if notes:  # what the host saw, after what the program printed
        stderr = (stderr + "\n" if stderr else "") + "\n".join(f"[judged on the host] AssertionError: {n}"
                                                              for n in notes)
    common = dict(stdout=_text(run["stdout"]), stderr=stderr, elapsed_s=time.monotonic() - start, modes=modes)
    if over:  # the program's values cost more to judge than any test needs: its failure, all of it
        detail = (f"judging its values on the host {over}: 0/{job.total} tests passed (a job's judging gets "
                  f"{judge.JUDGE_CPU_S:g} s of CPU and {judge.JUDGE_MEMORY_MB} MB; docs/sandbox.md)")
        return SandboxResult(0, job.total, "failed", detail=detail, results=(False,) * job.total, **common)
    if forged:
        return SandboxResult(0, job.total, "failed", detail=forged, **common)
    if not ready:
        return SandboxResult(0, job.total, "infra_error", detail=f"the harness never started ({_outcome(run)})",
                             **common)
    verdicts = [o.passed for o in outcomes] + [False] * (job.total - len(outcomes))
    passed = sum(verdicts)
    if run["timed_out"]:
        status, detail = "timeout", f"timed out after {job.timeout_s:g}s"
    elif not done:
        status, detail = "crashed", f"stopped before the tests finished ({_outcome(run)})"
        if run["records_full"]:
            detail += f"; result records over {RECORDS_CAP} bytes"
    else:
        status, detail = ("ok" if passed == job.total else "failed"), f"{passed}/{job.total} tests passed"
    return SandboxResult(passed, job.total, status, detail=detail, results=tuple(verdicts), **common)


def _score_io(job: Job, report: dict, start: float) -> SandboxResult:
    """The expected outputs never enter the sandbox: the comparison happens here, on what the supervisor saw."""
    verdicts, status, detail = [], "", ""
    runs = report["runs"]
    for run, (_, expected) in zip(runs, job.io_cases):
        if not run["records"].startswith(f'{report["nonce"]} ["ready"]\n'.encode()):
            status, detail = "infra_error", f"the harness never started ({_outcome(run)})"
            break
        verdicts.append(run["returncode"] == 0 and not run["stdout_full"] and
                        verdict.same_output(_text(run["stdout"]), expected))
        if run["timed_out"]:
            status, detail = "timeout", f"timed out after {job.timeout_s:g}s"
        elif run["returncode"] < 0:
            status, detail = "crashed", f"case {len(verdicts) - 1}: {_outcome(run)}"
    verdicts += [False] * (job.total - len(verdicts))
    passed = sum(verdicts) if status != "infra_error" else 0
    if not status:
        status, detail = ("ok" if passed == job.total else "failed"), f"{passed}/{job.total} cases passed"
    out, err = _head(r["stdout"] for r in runs), _head(r["stderr"] for r in runs)
    return SandboxResult(passed, job.total, status, out, err, detail, time.monotonic() - start, tuple(verdicts),
                         ("host",) * job.total)
