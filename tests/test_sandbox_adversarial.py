"""Hostile programs: each must end contained. Not passed, the host (this process) alive, no process of the
program left anywhere, no file written outside its work dir, and the sandbox still usable afterwards.

The tests named after issue 13's items replay its reproducers; docs/sandbox.md's threat model cites each one.
Time bounds here only catch hangs: they are minutes, never a measure of speed."""

import functools
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO

from grpo_recipes import sandbox
from grpo_recipes.sandbox.inside import cgroup, jail, seccomp

HANG_S = 120  # a job that takes longer than this is stuck, however busy the machine
run_tests = functools.partial(sandbox.run_tests, timeout_s=HANG_S)  # jobs meant to finish never race a clock
run_io_tests = functools.partial(sandbox.run_io_tests, timeout_s=HANG_S)


def marker() -> str:
    return "sbx" + secrets.token_hex(5)  # 13 chars: fits a process name (comm), unique per test


def name_processes(mark: str) -> str:
    """Program prologue: name the process (inherited by every fork) so leftovers can be found from outside."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, b'{mark}', 0, 0, 0)\n"


def processes_with(mark: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if mark.encode() in comm + cmdline:
            found.append(pid)
    return found


def assert_no_process_left(mark: str) -> None:
    deadline = time.monotonic() + 30.0  # only to let the kernel finish reaping; a survivor stays past this
    while processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(mark) == [], f"processes of the program outlived it: {processes_with(mark)}"


def assert_sandbox_still_works() -> None:
    result = run_tests("x = 41 + 1", ["assert x == 42"])
    assert result.status == "ok", result


def require_namespaces() -> None:
    iso = sandbox.isolation()
    if not iso.namespaces:
        pytest.skip(f"needs the namespace isolation this machine does not allow ({iso.describe()}); "
                    "see docs/sandbox.md, 'Modes, detection and degradation'")


def require(protection: str) -> None:
    missing = sandbox.isolation().missing()
    if protection in missing:
        pytest.skip(f"this machine lacks {protection}: {missing[protection]} (docs/sandbox.md)")


def run_contained(program: str, tests=("assert False, 'never reached'",), **kw):
    mark = marker()
    start = time.monotonic()
    result = run_tests(name_processes(mark) + textwrap.dedent(program), list(tests), **kw)
    elapsed = time.monotonic() - start
    assert result.passed < result.total and result.status != "ok", result
    assert result.status != "infra_error", result
    assert_no_process_left(mark)
    return result, elapsed


def test_fork_bomb_is_bounded_and_fully_killed():
    result, elapsed = run_contained("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, timeout_s=2)
    assert result.status == "timeout"
    assert elapsed < 2 + HANG_S
    assert_sandbox_still_works()


def test_memory_bomb_hits_the_address_space_limit():
    result, elapsed = run_contained("""
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))
    """, memory_mb=256, timeout_s=HANG_S)
    assert result.status == "failed" and "MemoryError" in result.stderr  # the limit stopped it, not the clock


def test_infinite_loop_times_out():
    result, elapsed = run_contained("while True:\n    pass\n", timeout_s=1)
    assert result.status == "timeout" and "timed out" in result.detail
    assert elapsed < 1 + HANG_S


def test_cpu_spin_ignoring_sigterm_in_two_processes_is_killed():
    result, elapsed = run_contained("""
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.fork()
        while True:
            pass
    """, timeout_s=1)
    assert result.status == "timeout"
    assert elapsed < 1 + HANG_S


def test_disk_fill_stops_at_the_file_size_limit():
    result, elapsed = run_contained("""
        with open("big", "wb") as f:
            while True:
                f.write(b"0" * (1 << 20))
    """, timeout_s=HANG_S)
    assert result.status == "failed"  # the limit stopped it, not the clock
    assert "File too large" in result.stderr or "No space left" in result.stderr


@pytest.fixture
def world_writable_dir():
    """A host dir any uid may write (outside /tmp, which the sandbox replaces): only a read-only mount stops it."""
    base = next(b for b in ("/mnt", "/opt", "/srv", "/var/lib", "/") if os.path.isdir(b))
    path = Path(tempfile.mkdtemp(prefix="sbx-open-", dir=base))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_writes_outside_the_work_dir_leave_nothing(world_writable_dir):
    require_namespaces()
    name = marker()
    targets = [world_writable_dir / name, Path("/tmp") / name, Path("/var/tmp") / name, Path("/dev/shm") / name,
               REPO / name, Path("/") / name]
    result, _ = run_contained(f"""
        import os
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
                print("wrote", path)
            except OSError as exc:
                print("blocked", path, exc)
    """)
    assert "blocked" in result.stdout  # the program did run
    assert [t for t in targets if t.exists()] == []


def test_parent_environment_secrets_are_invisible(monkeypatch):
    secret = "hf_secret_" + secrets.token_hex(8)
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    sandbox.shutdown()  # fresh zygotes, started while this process holds the secrets
    program = """
        import os
        seen = [repr(dict(os.environ))]
        for pid in os.listdir("/proc"):
            for leaf in ("environ", "cmdline"):
                try:
                    seen.append(open(f"/proc/{pid}/{leaf}", "rb").read().decode(errors="replace"))
                except OSError:
                    pass
        print("\\n".join(seen))
    """
    result = run_tests(textwrap.dedent(program), ["assert 'HF_TOKEN' not in os.environ",
                                                  "assert not any(k.startswith(('HF_', 'AWS_')) for k in os.environ)"])
    assert result.status == "ok", result
    assert secret not in result.stdout + result.stderr
    assert "PATH" in result.stdout  # it did print its environment


def test_network_connection_to_host_loopback_fails():
    require_namespaces()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        result, _ = run_contained(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hello")
                connected = True
            except OSError as exc:
                print("no connection:", exc)
                connected = False
        """, tests=["assert connected"])
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            server.accept()
    assert result.status == "failed" and "no connection" in result.stdout


def test_killing_the_parent_and_the_test_process_fails():
    me = os.getpid()
    result, _ = run_contained(f"""
        import os, signal
        for target in (os.getppid(), 1, {me}):
            try:
                os.kill(target, signal.SIGKILL)
                print("killed", target)
            except OSError as exc:
                print("could not kill", target, exc)
        try:
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)
    """)
    assert os.getpid() == me  # still here
    assert result.status == "crashed"  # the last kill took the program's own group down
    assert_sandbox_still_works()


def test_exit_zero_before_the_tests_is_not_a_pass():
    result, _ = run_contained("import os\nos._exit(0)\n", tests=["assert True", "pass"])
    assert result.status == "crashed" and result.passed == 0


CHEATS = {
    "prints success": "print('all tests passed')\nprint('OK 2/2')",
    "fake records, then exit": "import os\nos.write(3, b'%s 0 P\\n%s 1 P\\n%s done\\n' % ((b'0' * 32,) * 3))\n"
                               "os._exit(0)",
    "fake records on every fd": "import os\nfor fd in range(64):\n    try:\n"
                                "        os.write(fd, b'x 0 P\\nx 1 P\\nx done\\n')\n"
                                "    except OSError:\n        pass",
    "AssertionError replaced": "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})",
    "exec disabled": "import builtins\nbuiltins.exec = lambda *a, **k: None",
    "compile replaced": "import builtins\n_compile = compile\n"
                        "builtins.compile = lambda *a, **k: _compile('pass', '', 'exec')",
    "os.write rewritten": "import os\n_write = os.write\n"
                          "os.write = lambda fd, data: _write(fd, data.replace(b' F', b' P'))",
    "harness functions replaced": "import sys\nm = sys.modules['__main__']\n"
                                  "m.harness = m.emit = m.report_exception = m.flush = lambda *a, **k: 0",
    "builtins the harness uses": "import builtins\nbuiltins.enumerate = lambda x: iter(())\n"
                                 "builtins.BaseException = object",
    "SystemExit inside the function": "def f():\n    raise SystemExit(0)",
    "SystemExit at top level": "raise SystemExit(0)",
    "atexit pass records": "import atexit, os\natexit.register(lambda: os.write(3, b'x 0 P\\nx 1 P\\nx done\\n'))",
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_cheats_do_not_turn_failing_tests_into_passes(cheat):
    program = "def f():\n    return 2\n" + CHEATS[cheat]
    result, _ = run_contained(program, tests=["assert f() == 1", "assert f() == 1"])
    assert result.passed == 0, result


def test_background_child_that_detaches_dies_with_the_job():
    result, _ = run_contained("""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)  # a daemon: new session, parent gone; it must not outlive the job
            os._exit(0)
        print("parent returns at once")
    """, tests=["assert False"])
    assert "parent returns" in result.stdout  # run_contained checked that no process of it is left


# ---- the modes an unprivileged caller gets: user namespaces, or no namespaces at all

def _system_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            ok = subprocess.run([candidate, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                                capture_output=True).returncode == 0
            if ok:
                return candidate
    return None


NONROOT_SCENARIOS = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from grpo_recipes import sandbox
assert sandbox.__file__.startswith(sys.argv[1]), sandbox.__file__  # the readable copy, not the checkout
mark = sys.argv[2]
name = "import ctypes\nctypes.CDLL(None).prctl(15, b'%s', 0, 0, 0)\n" % mark
iso = sandbox.isolation()
out = {"isolation": iso.mode, "missing": sorted(iso.missing())}
out["basic"] = sandbox.run_tests("import json\nx = json.loads('2')", ["assert x == 2"], timeout_s=120).status
bomb = name + "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
out["fork_bomb"] = sandbox.run_tests(bomb, ["pass"], timeout_s=2).status
daemon = name + ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                 "        time.sleep(600)\n    os._exit(0)\n")
out["daemon"] = sandbox.run_tests(daemon, ["assert False"], timeout_s=120).status
out["secret_seen"] = os.environ["HF_TOKEN"] in sandbox.run_tests(
    "import os\nprint(dict(os.environ))", ["pass"], timeout_s=120).stdout
out["forged"] = sandbox.run_tests("def f():\n    return 2\nclass _I(int):\n    __eq__ = lambda s, o: True\n"
                                  "def g():\n    return _I(2)", ["assert f() == 1", "assert g() == 1"],
                                  timeout_s=120).passed
print(json.dumps(out))
'''


@pytest.fixture
def shared_dir():
    """A directory an unprivileged uid can use (pytest's tmp_path sits under a root-only 0700 dir)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-unprivileged-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def readable_copy_of_the_package(dest: Path) -> Path:
    """The checkout may sit under a folder uid 4242 cannot enter (a clone in `mktemp -d`, mode 0700): give it
    its own copy of the package, world-readable, and nothing else of the checkout."""
    root = dest / "pkg"
    shutil.copytree(REPO / "grpo_recipes", root / "grpo_recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_unprivileged_caller_is_contained(mode, shared_dir):
    """As a non-root user (via setpriv): user namespaces in auto mode, the process-group fallback in none."""
    python, setpriv = _system_python(), shutil.which("setpriv")
    if os.geteuid() != 0 or python is None or setpriv is None:
        pytest.skip("needs root (to switch to an unprivileged uid), setpriv and a system python >= 3.10")
    mark = marker()
    script = shared_dir / "scenarios.py"
    script.write_text(NONROOT_SCENARIOS)
    script.chmod(0o644)
    package = readable_copy_of_the_package(shared_dir)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(shared_dir), "TMPDIR": str(shared_dir),
           "HF_TOKEN": "hf_secret_" + mark, "GRPO_SANDBOX_ISOLATION": mode}
    proc = subprocess.run([setpriv, "--reuid=4242", "--regid=4242", "--clear-groups", python, "-I", str(script),
                           str(package), mark], env=env, cwd=str(shared_dir), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isolation"] == ("userns" if mode == "auto" else "none"), proc.stderr[-2000:]
    assert out["basic"] == "ok"
    assert out["fork_bomb"] == "timeout"
    assert out["daemon"] == "failed"
    assert out["secret_seen"] is False
    assert out["forged"] == 0  # the host judges in every mode
    assert "seccomp" not in out["missing"] and "oom_score_adj" not in out["missing"]
    if mode == "auto":
        assert "minimal_root" not in out["missing"] and "namespaces" not in out["missing"]
    assert_no_process_left(mark)


# ---- issue 13: each reproducer, replayed. The host decides; the program no longer knows the right values.

THREE = ["assert f() == 1"] * 3

FD3_RELAY = """
def f(): return 2
import os, sys
_real = os.dup(3); _r, _w = os.pipe(); os.dup2(_w, 3)
class _Out:
    def __init__(s, o): s.o = o
    def write(s, x): return s.o.write(x)
    def flush(s):
        os.set_blocking(_r, False)
        os.write(_real, os.read(_r, 1 << 16).replace(b" F\\n", b" P\\n")); os.dup2(_real, 3); s.o.flush()
sys.stdout = _Out(sys.stdout)
"""


def test_issue13_item1_fd3_relay_gains_nothing():
    result = run_tests(FD3_RELAY, THREE)
    assert result.passed == 0 and result.status == "failed", result
    assert result.modes == ("host",) * 3


# The harness's except block is where item 2 struck: make the tests raise, plant a fake traceback module in
# sys.modules and as a file on sys.path, and rig the real module's internals. The fake learns the nonce by
# walking frames and writes "pass" records in both the old and the new format, then exits at once.
FAKE_MODULES = """
import os, sys, types, json
def f(): return 2
def g(): raise ValueError("boom")
def _forge(*args, **kwargs):
    nonce = None
    frame = sys._getframe()
    while frame is not None and nonce is None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value):
                nonce = value
            prefix = getattr(value, "prefix", None)
            if isinstance(prefix, str) and len(prefix) == 33:
                nonce = prefix[:32]
        frame = frame.f_back
    nonce = nonce or "0" * 32
    lines = [[ "load", True]] + [x for i in range(3) for x in (["value", i, 0, ["i", "1"]], ["end", i])] + [["done"]]
    data = "".join("%s %s\\n" % (nonce, json.dumps(r, separators=(",", ":"))) for r in lines)
    data += "".join("%s %d P\\n" % (nonce, i) for i in range(3)) + nonce + " done\\n"
    os.write(3, data.encode())
    os._exit(0)
fake = types.ModuleType("traceback")
fake.print_exception = fake.print_exc = fake.format_exception = _forge
sys.modules["traceback"] = fake
open("traceback.py", "w").write("import os\\nos._exit(0)\\n")
sys.path.insert(0, os.getcwd())
import traceback as real_traceback_is_gone
real = sys.modules.get("linecache")
if real is not None:
    real.getline = real.getlines = _forge  # reached by the harness's own, pre-bound print_exception
"""


def test_issue13_item2_fake_modules_gain_nothing():
    result = run_tests(FAKE_MODULES, ["assert f() == 1", "assert g() == 1", "assert f() == 1"])
    assert result.passed == 0 and result.status != "ok", result


def test_issue13_item2_the_harness_imports_nothing_once_the_program_runs():
    program = "import sys\nBEFORE = set(sys.modules)\n"
    tests = ["undefined_name", "1 / int('0')", "raise SystemExit(3)", "import sys\nassert set(sys.modules) == BEFORE"]
    result = run_tests(program, tests)  # three tracebacks printed by the harness, then the check
    assert result.results == (False, False, False, True), result


SHADOWED = """
class _I(int): __eq__ = lambda s, o: True; __hash__ = int.__hash__
def f(x): return _I(0)
type = lambda o: int
isinstance = lambda *a: True
"""


def test_issue13_item3_shadowed_builtins_and_rigged_eq_gain_nothing():
    tests = ["r = f(2); assert type(r) is int and r == 4", "assert f(2) == 4",
             "assert isinstance(f(2), int) and f(2) == 4", "assert f(2) in [4]", "assert not f(2) != 4",
             "assert sorted([f(2)]) == [4]"]
    result = run_tests(SHADOWED, tests)
    assert result.passed == 0 and result.status == "failed", result
    assert result.modes == ("host",) * len(tests)
    honest = run_tests("def f(x):\n    return 4", tests)
    assert honest.status == "ok", honest  # the same tests pass for a right answer


ITEM4 = """
import gc
spec = next(o for o in gc.get_objects() if isinstance(o, dict) and "caps" in o and "stdins" in o)
case = spec["stdins"].index(open(0, "rb").read())
print("YES" if spec["caps"][case] - 4096 == 4 else "NO")
"""


def test_issue13_item4_io_cases_learn_nothing_about_each_other():
    labels = ["YES", "NO", "NO", "YES", "YES", "NO", "YES", "NO"]
    cases = [(f"question {i}\n", label) for i, label in enumerate(labels)]
    result = run_io_tests(ITEM4, cases)
    assert result.passed == 0, result
    # Stronger: nothing of any other case is anywhere in a case's process memory, not even freed remnants.
    tokens = ["SBX" + secrets.token_hex(8).upper() for _ in range(6)]
    scan = """
        import ctypes, gc, re, sys
        pattern = re.compile(rb"SBX[0-9A-F]{16}")
        found = set()
        with open("/proc/self/maps") as maps:  # first, before new objects reuse freed memory
            for line in maps:  # the heap, the stack and anonymous memory: where freed data would linger
                fields = line.split()
                if "r" not in fields[1] or (len(fields) > 5 and fields[5] not in ("[heap]", "[stack]")):
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found.update(m.decode() for m in pattern.findall(ctypes.string_at(lo, hi - lo)))
        for obj in gc.get_objects():
            for v in (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()):
                if isinstance(v, (str, bytes)):
                    found.update(m.decode() for m in pattern.findall(v.encode() if isinstance(v, str) else v))
        mine = sys.stdin.read().strip()
        found.discard(mine)
        print(mine * 100 if not found else "SAW " + " ".join(sorted(found)))  # long: stays in freed memory
    """
    result = run_io_tests(textwrap.dedent(scan), [(t, t * 100) for t in tokens], timeout_s=HANG_S)
    assert result.status == "ok", (result.stdout, result.stderr)


def test_issue13_item4_output_cap_is_the_same_for_every_case():
    # a case whose expected output is short and one whose expected output is long: both get the same cap
    program = "print('y' * 100_000)"
    result = run_io_tests(program, [("", "y"), ("", "y" * 100_000)])
    assert result.results == (False, True), result


def test_issue13_item4_each_case_gets_a_fresh_work_dir():
    program = """
import os
left = sorted(os.listdir(".")) + sorted(os.listdir("/tmp"))
open("from_" + input(), "w").write("x")
open("/tmp/also_" + str(os.getpid()), "w").write("x")
print(left)
"""
    result = run_io_tests(program, [("a", "[]"), ("b", "[]"), ("c", "[]")])
    assert result.status == "ok", result


def test_issue13_item5_the_answer_key_and_the_host_tree_are_out_of_reach():
    answer_key = REPO / "recipes/data/code_train.jsonl"
    assert answer_key.exists()
    row = json.loads(answer_key.read_text().splitlines()[0])
    program = f"""
import json, os
for line in open({str(answer_key)!r}):
    row = json.loads(line)
    if row["entry_point"] == {row["entry_point"]!r}:
        exec(row["canonical_solution"])
"""
    result = run_tests(program, row["tests"])
    assert result.passed == 0 and "No such file" in result.stderr, result
    look = """
import json, os, sys
seen = {p: os.path.exists(p) for p in
        [{repo!r}, "/home", "/root/.cache", "/etc/passwd", "/var", "/run", "/sys", "/opt", "/mnt", "/srv", "/media"]}
print(json.dumps([sorted(os.listdir("/")), sorted(os.listdir("/etc")), sorted(os.listdir("/dev")), seen]))
""".replace("{repo!r}", repr(str(REPO)))
    result = run_tests(look, ["pass"])
    require("minimal_root")
    roots, etc, dev, seen = json.loads(result.stdout)
    assert set(roots) <= {"proc", "tmp", "dev", "usr", "lib", "lib64", "bin", "etc", "root", "sandbox", "opt"}, roots
    assert etc in ([], ["ld.so.cache"])
    assert set(dev) == {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr", "shm"}
    assert not any(seen.values()), seen


def test_issue13_item5_site_packages_are_hidden():
    require("minimal_root")
    purelib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})["purelib"]
    result = run_tests(f"import os\nprint(os.listdir({purelib!r}) if os.path.isdir({purelib!r}) else [])", ["pass"])
    assert result.status == "ok" and result.stdout.strip() == "[]", result


def test_issue13_item6_host_unix_sockets_are_unreachable(shared_dir):
    require_namespaces()
    path = shared_dir / "host.sock"
    abstract = "\0sbx-" + secrets.token_hex(6)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server2:
        server.bind(str(path))
        path.chmod(0o777)
        server.listen(1)
        server2.bind(abstract)
        server2.listen(1)
        program = f"""
import socket
outcome = []
for address in ({str(path)!r}, {abstract!r}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(address)
        s.sendall(b"hello")
        outcome.append("connected")
    except OSError as exc:
        outcome.append("blocked: %s" % exc)
print(outcome)
"""
        result, _ = run_contained(program, tests=["assert outcome == ['connected', 'connected']"])
        for s in (server, server2):
            s.settimeout(0.5)
            with pytest.raises(socket.timeout):
                s.accept()
    assert result.stdout.count("blocked:") == 2, result


# seccomp: syscall name -> arguments that make it succeed (or fail for want of privilege) without the filter
SYSCALL_PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = json.loads(sys.argv[1]) if len(sys.argv) > 1 else NUMBERS
buf = ctypes.create_string_buffer(512)
def call(name, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *conv)
    err = ctypes.get_errno()
    if ret == 0 and name == "clone":
        os._exit(0)  # we are the child a namespace clone would have made
    if ret > 0 and name == "clone":
        os.waitpid(ret, 0)
    return [ret, err]
attr = ctypes.create_string_buffer(128)
attr[4:8] = (112).to_bytes(4, "little")  # perf_event_attr.size; type 1 = software, config 0 = cpu clock
attr[0:4] = (1).to_bytes(4, "little")
ns = os.open("/proc/self/ns/uts", os.O_RDONLY)
out = {
    "unshare": call("unshare", 0x10000000),                      # CLONE_NEWUSER
    "clone": call("clone", 0x10000000 | 17, 0, 0, 0, 0),         # CLONE_NEWUSER | SIGCHLD
    "setns": call("setns", ns, 0),
    "add_key": call("add_key", b"user", b"sbx", b"v", 1, -2),    # into the process keyring
    "request_key": call("request_key", b"user", b"sbx-none", None, 0),
    "keyctl": call("keyctl", 0, -1, 1),                          # GET_KEYRING_ID, thread keyring, create
    "io_uring_setup": call("io_uring_setup", 4, buf),
    "userfaultfd": call("userfaultfd", 1),                       # UFFD_USER_MODE_ONLY
    "bpf": call("bpf", 0, buf, 72),                              # BPF_MAP_CREATE
    "perf_event_open": call("perf_event_open", attr, 0, -1, -1, 0),
    "ptrace": call("ptrace", 0, 0, 0, 0),                        # PTRACE_TRACEME
    "process_vm_readv": call("process_vm_readv", os.getpid(), None, 0, None, 0, 0),
}
print(json.dumps(out))
"""


def test_issue13_item7_seccomp_denies_namespaces_keys_io_uring_userfaultfd_bpf_perf_ptrace():
    require("seccomp")
    numbers = seccomp.numbers()
    program = SYSCALL_PROBE.replace("NUMBERS", repr(numbers))
    result = run_tests(program, ["pass"])
    assert result.status == "ok", result
    inside = json.loads(result.stdout.strip().splitlines()[-1])
    assert {name: v for name, v in inside.items() if v != [-1, seccomp.DENY_ERRNO]} == {}, inside
    # Control: the same calls outside the filter, as an unprivileged uid. Some succeed there (that is what the
    # filter is for), the rest fail with a permission error, but none is missing from the kernel: so the ENOSYS
    # above is the filter's doing.
    python, setpriv = _system_python(), shutil.which("setpriv")
    if os.geteuid() != 0 or python is None or setpriv is None:
        return
    control = subprocess.run([setpriv, "--reuid=4242", "--regid=4242", "--clear-groups", python, "-I", "-S", "-c",
                              SYSCALL_PROBE, json.dumps(numbers)], capture_output=True, text=True, timeout=HANG_S,
                             cwd="/")
    assert control.returncode == 0, control.stderr
    outside = json.loads(control.stdout)
    assert all(err != seccomp.DENY_ERRNO for _, err in outside.values()), outside
    assert {n for n, (ret, _) in outside.items() if ret >= 0} >= {"add_key", "keyctl", "ptrace"}, outside


def test_issue13_item7_no_kernel_keys_are_left_behind():
    require("seccomp")  # the filter is what keeps keys from being made at all
    keyed = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for keyring in (-3, -4, -5):  # session, user, user-session
    libc.syscall(%d, b"user", b"sbx-left", b"v", 1, keyring)
""" % seccomp.numbers()["add_key"]
    before = sandbox_uids_with_keys()  # only what this job leaves counts: keys outlive their uid's processes
    assert run_tests(keyed, ["pass"]).status == "ok"
    assert sandbox_uids_with_keys() == before


def sandbox_uids_with_keys() -> list[int]:
    uids = []
    with open("/proc/key-users") as f:
        for line in f:
            uid = int(line.split(":")[0])
            if 0x50000000 <= uid < 0x51000000:
                uids.append(uid)
    return uids


CHILDREN_400MB = """
import os, select, time
r, w = os.pipe()
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            block = bytearray(400 << 20)
            for k in range(0, len(block), 4096):
                block[k] = 1  # touch every page: resident, charged
            os.write(w, b"%d," % i)
            time.sleep(600)
        finally:
            os._exit(0)
    kids.append(pid)
os.close(w)
holders, gone = set(), set()
data = b""
while len(holders | gone) < 6:
    ready, _, _ = select.select([r], [], [], 0.1)
    if ready:
        data += os.read(r, 1000)
        holders = {int(x) for x in data.split(b",") if x}
    for i, pid in enumerate(kids):
        if i not in gone and os.waitpid(pid, os.WNOHANG)[0]:
            gone.add(i)
alive_holders = sorted(i for i in holders if i not in gone and os.waitpid(kids[i], os.WNOHANG)[0] == 0)
print("holding at once:", len(alive_holders), "killed:", len(gone))
"""


def test_issue13_item7_six_children_of_400mb_cannot_exceed_the_job_memory():
    require("cgroup")
    result = run_tests(CHILDREN_400MB, ["pass"], memory_mb=512, timeout_s=HANG_S)
    found = re.search(r"holding at once: (\d+) killed: (\d+)", result.stdout)
    assert found, result
    holding, killed = map(int, found.groups())
    assert holding <= 1 and killed >= 5, result.stdout  # 512 MB fits one 400 MB child, never two (let alone 2.4 GB)


def test_issue13_item7_the_sandbox_is_the_oom_killers_first_choice():
    require("oom_score_adj")
    program = """
import subprocess, sys
score = open("/proc/self/oom_score_adj").read().strip()
child = subprocess.run([sys.executable, "-c", "print(open('/proc/self/oom_score_adj').read())"],
                       capture_output=True, text=True).stdout.strip()
"""
    result = run_tests(program, ["assert score == '1000'", "assert child == '1000'"])
    assert result.status == "ok", result


def test_issue13_item7_threads_and_processes_are_capped_per_job():
    result = run_tests("""
import threading, time
started = 0
stop = threading.Event()
try:
    for _ in range(1000):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
stop.set()
print(started)
""", ["assert started < 1000"])
    assert result.status == "ok", result
    assert int(result.stdout.split()[-1]) < sandbox.NPROC


def host_state() -> dict:
    """What this process's jobs could leave on the host: cgroups, work dirs, keys, mounts. Only what is ours
    counts (other test runs may share the machine): cgroups carry the name of the zygote that made them."""
    cg, _ = cgroup.detect()
    zygotes = [z.proc.pid for pool in sandbox.host._idle.values() for z in pool]
    cgroups = []
    for parent in (cg or {}).get("parents", []):
        cgroups += [n for n in os.listdir(parent) if any(n.startswith(f"{cgroup.PREFIX}{z}-") for z in zygotes)]
    temp = [] if sandbox.isolation().namespaces else [  # without namespaces a job's work dir is on the host
        n for n in os.listdir(tempfile.gettempdir()) if n.startswith("grpo-sandbox-")]
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    ours = [m for m in mounts if m in (jail.WORKDIR, "/dev/shm/sandbox") or "grpo-sbx" in m]
    return {"cgroups": cgroups, "temp": temp, "keys": sandbox_uids_with_keys(), "mounts": ours, "zygotes": zygotes}


def test_issue13_nothing_is_left_behind_after_a_job():
    before = host_state()
    mark = marker()
    litter = f"""
import ctypes, os, time
for path in ("left.txt", "/tmp/left.txt", "/dev/shm/left.txt", "/var/tmp/left.txt"):
    try:
        open(path, "w").write("x")
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
if {"seccomp" not in sandbox.isolation().missing()}:
    libc.syscall({seccomp.numbers()["add_key"]}, b"user", b"sbx-left", b"v", 1, -4)
libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
if os.fork() == 0:
    os.setsid()
    time.sleep(600)
"""
    for _ in range(3):
        run_contained(litter, tests=["assert False"])
    after = host_state()
    assert after["zygotes"], "the jobs' zygotes are idle in the pool: their cgroups would show"
    assert {k: v for k, v in after.items() if k != "zygotes"} == {k: v for k, v in before.items() if k != "zygotes"}
    assert not Path(tempfile.gettempdir(), "left.txt").exists() and not Path("/dev/shm/left.txt").exists()
    assert_no_process_left(mark)


def test_isolation_reports_every_protection_at_start_up():
    iso = sandbox.isolation()
    assert [name for name, _ in iso.walls] == list(sandbox.PROTECTIONS)
    text = iso.describe()
    assert iso.mode in text and all(name in text for name in sandbox.PROTECTIONS)


def test_a_missing_protection_is_named_at_start_up_and_the_rest_still_runs(machine_without_cgroups, caplog):
    with caplog.at_level("WARNING", logger="grpo_recipes.sandbox"):
        iso = sandbox.isolation()
    assert iso.missing() == {"cgroup": "no cgroups on this pretend machine"}
    assert any("WITHOUT cgroup" in r.getMessage() and "GRPO_SANDBOX_REQUIRE" in r.getMessage() for r in caplog.records)
    assert run_tests("x = 1", ["assert x == 1"]).status == "ok"


def test_a_required_protection_that_is_missing_refuses_to_run(machine_without_cgroups, monkeypatch, caplog):
    monkeypatch.setenv(sandbox.ENV_REQUIRE, "seccomp,cgroup")
    with caplog.at_level("ERROR", logger="grpo_recipes.sandbox"):
        iso = sandbox.isolation()
    assert iso.mode == "unavailable" and "cgroup" in iso.problem and "seccomp" not in iso.problem
    assert any("required protection missing" in r.getMessage() for r in caplog.records)
    result = run_tests("x = 1", ["assert x == 1"])
    assert result.status == "infra_error" and "cgroup" in result.detail
    monkeypatch.setenv(sandbox.ENV_REQUIRE, "seccomp,moat")
    with pytest.raises(ValueError, match="unknown protection"):
        sandbox.isolation()


MEMORY_SCAN = """
import ctypes, gc, re
pattern = re.compile(rb"SBX[0-9A-F]{16}")
found = set()
with open("/proc/self/maps") as maps:
    for line in maps:  # the heap, the stack and anonymous memory: where freed data would linger
        fields = line.split()
        if "r" not in fields[1] or (len(fields) > 5 and fields[5] not in ("[heap]", "[stack]")):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        found.update(m.decode() for m in pattern.findall(ctypes.string_at(lo, hi - lo)))
"""


def test_a_job_finds_nothing_of_the_jobs_before_it_in_its_memory():
    token = "SBX" + secrets.token_hex(8).upper()
    # an earlier job (another completion of the same prompt, say): its program, its values, its output
    earlier = f"def f():\n    return {token!r}\nprint({token!r})\n"
    assert run_many_serial([sandbox.Job(earlier, ("assert f() == 'x'",), timeout_s=HANG_S),
                            sandbox.Job(earlier, io_cases=(("x", token),), timeout_s=HANG_S)])[1].status == "ok"
    later = run_many_serial([sandbox.Job(MEMORY_SCAN, ("pass",), timeout_s=HANG_S)])[0]
    assert later.status == "ok", later
    scan = run_many_serial([sandbox.Job(MEMORY_SCAN + "print(sorted(found))", ("pass",), timeout_s=HANG_S)])[0]
    assert token not in scan.stdout, scan.stdout


def run_many_serial(jobs):
    """One worker: every job forks from the same zygote, the one the earlier jobs used."""
    return sandbox.run_many(jobs, max_workers=1)
