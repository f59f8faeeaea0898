"""Hostile programs: each must end contained. Not passed, the host (this process) alive, no process of the
program left anywhere, no file written outside its work dir, and the sandbox still usable afterwards."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO
from grpo_recipes import sandbox
from grpo_recipes.sandbox import run_tests


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
    deadline = time.monotonic() + 2.0  # only to let the kernel finish reaping; a survivor stays past this
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
    assert elapsed < 2 + 10
    assert_sandbox_still_works()


def test_memory_bomb_hits_the_address_space_limit():
    result, elapsed = run_contained("""
        hoard = []
        while True:
            hoard.append(bytearray(64 << 20))
    """, memory_mb=256, timeout_s=10)
    assert result.status == "failed" and "MemoryError" in result.stderr
    assert elapsed < 8  # the limit stopped it, not the timeout


def test_infinite_loop_times_out():
    result, elapsed = run_contained("while True:\n    pass\n", timeout_s=1)
    assert result.status == "timeout" and "timed out" in result.detail
    assert elapsed < 1 + 5


def test_cpu_spin_ignoring_sigterm_in_two_processes_is_killed():
    result, elapsed = run_contained("""
        import os, signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.fork()
        while True:
            pass
    """, timeout_s=1)
    assert result.status == "timeout"
    assert elapsed < 1 + 5


def test_disk_fill_stops_at_the_file_size_limit():
    result, elapsed = run_contained("""
        with open("big", "wb") as f:
            while True:
                f.write(b"0" * (1 << 20))
    """, timeout_s=10)
    assert result.status == "failed"
    assert "File too large" in result.stderr or "No space left" in result.stderr
    assert elapsed < 8


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


def test_background_child_that_detaches_dies_with_the_job(tmp_path):
    late = tmp_path / marker()
    tmp_path.chmod(0o777)
    result, _ = run_contained(f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 1; echo late > {late}"])
            os._exit(0)
        print("parent returns at once")
    """, tests=["assert False"])
    assert "parent returns" in result.stdout
    time.sleep(1.5)
    assert not late.exists()


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
mark = sys.argv[2]
name = "import ctypes\nctypes.CDLL(None).prctl(15, b'%s', 0, 0, 0)\n" % mark
out = {"isolation": sandbox.isolation().mode}
out["basic"] = sandbox.run_tests("import json\nx = json.loads('2')", ["assert x == 2"]).status
bomb = name + "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
out["fork_bomb"] = sandbox.run_tests(bomb, ["pass"], timeout_s=2).status
daemon = name + ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                 "        os.execv('/bin/sh', ['/bin/sh', '-c', 'sleep 5 %s'])\n    os._exit(0)\n" % mark)
out["daemon"] = sandbox.run_tests(daemon, ["assert False"]).status
out["secret_seen"] = os.environ["HF_TOKEN"] in sandbox.run_tests(
    "import os\nprint(dict(os.environ))", ["pass"]).stdout
print(json.dumps(out))
'''


@pytest.fixture
def shared_dir():
    """A directory an unprivileged uid can use (pytest's tmp_path sits under a root-only 0700 dir)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-unprivileged-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


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
    env = {"PATH": "/usr/bin:/bin", "HOME": str(shared_dir), "TMPDIR": str(shared_dir),
           "HF_TOKEN": "hf_secret_" + mark, "GRPO_SANDBOX_ISOLATION": mode}
    proc = subprocess.run([setpriv, "--reuid=4242", "--regid=4242", "--clear-groups", python, "-I", str(script),
                           str(REPO), mark], env=env, cwd=str(shared_dir), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isolation"] == ("userns" if mode == "auto" else "none"), proc.stderr[-2000:]
    assert out["basic"] == "ok"
    assert out["fork_bomb"] == "timeout"
    assert out["daemon"] == "failed"
    assert out["secret_seen"] is False
    assert_no_process_left(mark)
