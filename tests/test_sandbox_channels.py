"""Channels between jobs and between io cases, the host's memory under hostile output, and what the start-up
report says (issue 34, sandbox items 8 to 12). Each test replays an attack that worked before: a receiver that
knows nothing must still fail, and the host must stay bounded. Where this machine lacks the protection, the test
checks that the start-up report names it instead. Time bounds here only catch hangs, never measure speed."""

import functools
import json
import secrets
import socket
import textwrap
import tracemalloc

from helpers import REPO

from grpo_recipes import sandbox
from grpo_recipes.sandbox import host
from grpo_recipes.sandbox.inside import codec

HANG_S = 120
run_io_tests = functools.partial(sandbox.run_io_tests, timeout_s=HANG_S)


def missing(protection: str) -> str:
    """Why this machine lacks `protection` ('' when it has it); when it lacks it, the start-up report says so."""
    why = sandbox.isolation().missing().get(protection, "")
    if why:
        assert protection in sandbox.isolation().describe() and host.CONSEQUENCES[protection]
    return why


def random_bits(n: int = 8) -> list[int]:
    while True:  # some of each: a receiver that reads nothing must not match by luck
        bits = [secrets.randbelow(2) for _ in range(n)]
        if 0 < sum(bits) < n:
            return bits


# ---- item 8: SysV shared memory, a SysV message queue and a POSIX queue, left by case 0 for case 1

IPC = """
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY, CREATE, NOWAIT = 0x5B5B5B5B, 0o1666, 0o4000
def store(token):
    ctypes.memmove(libc.shmat(libc.shmget(KEY, 4096, CREATE), None, 0), token, len(token))
    queue = libc.msgget(KEY, CREATE)
    posix = libc.mq_open(b"/sbx", os.O_CREAT | os.O_RDWR, 0o666, None) if hasattr(libc, "mq_open") else -1
    for _ in range(2):  # one for the control below, one for the next case
        libc.msgsnd(queue, struct.pack("l", 1) + token, len(token), 0)
        if posix >= 0:
            libc.mq_send(posix, token, len(token), 0)
def load():
    found = []
    shm = libc.shmget(KEY, 4096, 0)
    if shm >= 0:
        found.append(ctypes.string_at(libc.shmat(shm, None, 0), 16))
    queue, buf = libc.msgget(KEY, 0), ctypes.create_string_buffer(8192)
    if queue >= 0 and libc.msgrcv(queue, buf, 64, 0, NOWAIT) == 16:
        found.append(buf.raw[8:24])
    posix = libc.mq_open(b"/sbx", os.O_RDONLY | os.O_NONBLOCK, 0, None) if hasattr(libc, "mq_open") else -1
    if posix >= 0 and libc.mq_receive(posix, buf, 8192, None) == 16:
        found.append(buf.raw[:16])
    return found
command = sys.stdin.read().split()
if command[0] == "store":
    store(command[1].encode())
    seen = load()  # the control: within its own case, each object is there
    print("stored" if len(seen) == 2 + hasattr(libc, "mq_open") and set(seen) == {command[1].encode()} else seen)
else:
    print(" ".join(sorted({t.decode() for t in load()})) or "nothing")
"""


def test_io_cases_share_no_ipc_objects():
    token = secrets.token_hex(8)
    result = run_io_tests(textwrap.dedent(IPC), [(f"store {token}", "stored"), ("load", token)])
    assert result.results == (True, False), result  # case 0 stored them (and saw them), case 1 found nothing
    assert result.stdout.split() == ["stored", "nothing"], result


COUNTER = """
import os, sys
case = sys.stdin.read().split()
if case[0] == "fork":  # the message: a number of processes started
    for _ in range(int(case[1])):
        if os.fork() == 0:
            os._exit(0)
        os.wait()
    print("forked")
else:  # what the pid counter says the case before started
    print(os.getpid() - int(case[1]))
"""


def test_an_io_case_cannot_count_the_processes_of_the_one_before():
    message = 100 + secrets.randbelow(100)
    first = run_io_tests(COUNTER, [("fork 0", "forked"), ("count 0", "?")])  # what a case starts from
    base = int(first.stdout.split()[-1])
    result = run_io_tests(COUNTER, [(f"fork {message}", "forked"), (f"count {base}", str(message))])
    assert result.results == (True, False), result


# ---- item 9: only AF_UNIX sockets, whose abstract names stay in the sandbox's own network namespace

FAMILIES = {"AF_VSOCK": (40, 1), "AF_INET": (2, 2), "AF_INET6": (10, 2), "AF_NETLINK": (16, 3),  # (family, type)
            "AF_PACKET": (17, 2), "AF_ALG": (38, 5)}

SOCKETS = """
import errno, json, socket
out = {}
for name, (family, kind) in FAMILIES.items():
    try:
        s = socket.socket(family, kind)
        out[name] = "opened"
        if name == "AF_VSOCK":  # the port the host holds: EADDRINUSE where the port space is the host's
            s.bind((0xFFFFFFFF, PORT))
            out[name] = "bound"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
a, b = socket.socketpair()
a.sendall(b"u")
out["AF_UNIX"] = b.recv(1).decode()
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind("\\0sbx-own-name")
out["abstract"] = "bound"
print(json.dumps(out))
"""


def test_only_unix_sockets_open_and_vsock_is_not_the_hosts():
    port = None
    try:  # the host holds a vsock port, as in the report: a sandbox that reaches it sees EADDRINUSE
        held = socket.socket(40, socket.SOCK_STREAM)
        held.bind((0xFFFFFFFF, 0xFFFFFFFF))
        port = held.getsockname()[1]
    except OSError:
        held = None  # no vsock on this kernel: the filter's work shows on AF_INET and the rest
    program = SOCKETS.replace("FAMILIES.items()", repr(FAMILIES) + ".items()").replace("PORT", str(port or 1234))
    try:
        result = sandbox.run_tests(program, ["pass"], timeout_s=HANG_S)
    finally:
        if held is not None:
            held.close()
    assert result.status == "ok", result
    out = json.loads(result.stdout)
    assert out["AF_UNIX"] == "u" and out["abstract"] == "bound", out  # what programs use still works
    why = missing("unix_sockets_only")
    if why:
        assert "AF_INET" in why, why  # the probe found what the program can open, and the report names it
        return
    assert {name: out[name] for name in FAMILIES} == {name: "EAFNOSUPPORT" for name in FAMILIES}, out
    for name in ("AF_INET", "AF_NETLINK"):  # the control: this kernel has them, so the refusal is the filter's
        family, kind = FAMILIES[name]
        socket.socket(family, kind).close()
    if held is None:
        print("no AF_VSOCK on this kernel: checked the filter on the other families")


# ---- item 10: file locks and inotify marks on the files every job can open, between jobs running at once

CHANNEL = """
import ctypes, fcntl, json, os, struct, time
libc = ctypes.CDLL(None, use_errno=True)
D = os.path.dirname(os.__file__)
FILES = sorted(os.path.join(D, n) for n in os.listdir(D) if n.endswith(".py"))[:10]
BITS, READY, WATCHED = FILES[:8], FILES[8], FILES[9]
LOCKED_DEVICE, WATCHED_DEVICE = "/dev/zero", "/dev/null"
HOLD = 8.0
def lock(path):  # every kind of lock a read-only file takes: flock, POSIX and open-file-description
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 1, 0))
    fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 1, 1, 0))  # F_OFD_SETLK
    return fd
def held(path):  # by another open file or process, through any of them
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return True
        for cmd, start in ((fcntl.F_GETLK, 0), (36, 1)):  # F_OFD_GETLK
            probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, 1, 0)
            if struct.unpack("hhqqi", fcntl.fcntl(fd, cmd, probe))[0] != fcntl.F_UNLCK:
                return True
        return False
    finally:
        os.close(fd)
def watch(*paths):
    fd = libc.inotify_init1(os.O_NONBLOCK)
    for path in paths:
        libc.inotify_add_watch(fd, path.encode(), 0x20)  # IN_OPEN
    return fd
def events(fd):
    try:
        return len(os.read(fd, 65536)) > 0
    except BlockingIOError:
        return False
"""

SENDER = CHANNEL + """
held_fds = [lock(path) for path, bit in zip(BITS, MESSAGE) if bit]
held_fds += [lock(READY), lock(LOCKED_DEVICE)]
r, w = os.pipe()
if os.fork() == 0:  # the control: within its own job, another process sees every signal
    seen = watch(WATCHED, WATCHED_DEVICE)
    os.write(w, b"+")
    time.sleep(0.5)
    os.write(w, json.dumps([held(READY), held(LOCKED_DEVICE), [held(p) for p in BITS], events(seen)]).encode())
    os._exit(0)
os.read(r, 1)
end = time.monotonic() + HOLD
while time.monotonic() < end:  # opens that a watcher elsewhere would see
    for path in (WATCHED, WATCHED_DEVICE):
        os.close(os.open(path, os.O_RDONLY))
    time.sleep(0.01)
control = json.loads(os.read(r, 4096))
"""

RECEIVER = CHANNEL + """
seen = watch(WATCHED, WATCHED_DEVICE)
end = time.monotonic() + HOLD
ready = False
while not ready and time.monotonic() < end:
    ready = held(READY) or held(LOCKED_DEVICE) or events(seen)
    time.sleep(0.01)
bits = [int(held(path)) for path in BITS]
print("read", bits)
def f():
    return bits
"""


def test_jobs_running_at_once_cannot_signal_through_file_locks_or_inotify():
    bits = random_bits()
    sender = sandbox.Job(SENDER.replace("MESSAGE", repr(bits)), ("assert control == [True, True, %r, True]" % (
        [bool(b) for b in bits],),), timeout_s=HANG_S)
    receiver = sandbox.Job(RECEIVER, (f"assert f() == {bits!r}",), timeout_s=HANG_S)
    sent, received = sandbox.run_many([sender, receiver], max_workers=2)
    assert sent.status == "ok", sent  # every signal works inside one job
    why = missing("private_inodes")
    if why:
        assert "host" in why or "bound" in why, why
        return
    assert received.passed == 0 and received.status == "failed", received
    assert received.stdout.startswith("read ["), received  # it ran to the end, and read nothing


# ---- item 11: a socket left in flight, named with the message, for the next job or io case of the zygote

IN_FLIGHT = """
import array, os, re, socket, sys
def in_flight(name):  # bound, then put in an SCM_RIGHTS cycle and closed: only the kernel's collector frees it
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\\0" + name)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), s.fileno()]))])
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [b.fileno()]))])
    for x in (s, a, b):
        x.detach()  # the fds go with the process: closing here would start the collector at once
def send(message, bits):
    in_flight(message)
    for i, bit in enumerate(bits):  # names known beforehand: found by bind even without /proc/net/unix
        if bit:
            in_flight("sbx-bit-%d" % i)
    return message in open("/proc/self/net/unix").read()  # the control: in flight, within its own job
def receive(n):
    listed = re.findall(r"@(sbx-msg-[0-9a-f]+)", open("/proc/self/net/unix").read())
    bits = []
    for i in range(n):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.bind("\\0sbx-bit-%d" % i)
            bits.append(0)
        except OSError:
            bits.append(1)
        probe.detach()
    return (listed[0] if listed else None), bits
"""


def zygote_sockets() -> dict[int, int]:
    """Unix sockets in each idle zygote's network namespace (read from outside)."""
    counts = {}
    for zygote in [z for pool in host._idle.values() for z in pool]:
        with open(f"/proc/{zygote.proc.pid}/net/unix") as f:
            counts[zygote.proc.pid] = len(f.read().splitlines()) - 1
    return counts


def test_sockets_left_in_flight_reach_no_later_job_or_case():
    message, bits = "sbx-msg-" + secrets.token_hex(6), random_bits()
    sender = sandbox.Job(IN_FLIGHT + f"sent = send({message!r}, {bits!r})", ("assert sent",), timeout_s=HANG_S)
    receiver = sandbox.Job(IN_FLIGHT + "message, bits = receive(8)\nprint(message, bits)",
                           (f"assert message == {message!r}", f"assert bits == {bits!r}"), timeout_s=HANG_S)
    # one worker: both jobs fork from the same zygote, in the same network namespace
    sent, received = sandbox.run_many([sender, receiver], max_workers=1)
    assert sent.status == "ok", sent
    assert received.passed == 0 and received.status == "failed", received
    assert received.stdout.strip() == f"None {[0] * len(bits)}", received  # it ran, and found nothing
    io = IN_FLIGHT + textwrap.dedent(f"""
        if input() == "send":
            print("sent" if send({message!r}, {bits!r}) else "not in flight")
        else:
            print(*receive(8))
        """)
    result = run_io_tests(io, [("send", "sent"), ("receive", f"{message} {bits}")])
    assert result.results == (True, False), result
    assert result.stdout.split("\n")[1] == f"None {[0] * len(bits)}", result
    if sandbox.isolation().namespaces:  # a zygote's own network namespace: nothing left in it between jobs
        assert set(zygote_sockets().values()) <= {0}, zygote_sockets()


# ---- issue 46, item 10: the page cache of the files every job reads, from a job that already finished

PAGES = """
import os, time
D = os.path.dirname(os.__file__)
FILES = sorted(os.path.join(D, n) for n in os.listdir(D) if n.endswith(".py"))[20:36]
def evict(path):  # the sender: drop the file's pages from the page cache, which every job's overlay reads through
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return "evicted"
    except OSError as exc:
        return os.strerror(exc.errno)
    finally:
        os.close(fd)
def cached(path):  # the receiver: RWF_NOWAIT answers without timing; where it cannot, a read's time does
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
            return True
        except BlockingIOError:
            return False
        except OSError:
            pass
        start = time.perf_counter_ns()
        os.pread(fd, 4096, 0)
        return time.perf_counter_ns() - start < 30_000
    finally:
        os.close(fd)
"""


def test_issue46_item10_a_finished_job_leaves_nothing_in_the_page_cache_for_the_next():
    bits = random_bits(16)
    sender = PAGES + f"done = [evict(p) for p, bit in zip(FILES, {bits!r}) if bit]\nprint(sorted(set(done)))"
    receiver = PAGES + "bits = [int(not cached(p)) for p in FILES]\nprint('read', bits)\ndef f():\n    return bits"
    sent = sandbox.run_tests(sender, ["pass"], timeout_s=HANG_S)  # finished before the receiver starts
    received = sandbox.run_tests(receiver, [f"assert f() == {bits!r}"], timeout_s=HANG_S)
    assert sent.status == "ok" and "evicted" not in sent.stdout, sent  # the filter refuses the eviction
    assert "Function not implemented" in sent.stdout, sent
    assert received.passed == 0 and received.stdout.startswith("read ["), received  # it ran, and read nothing


# ---- issue 46, item 11: the host's count of processes ever started, between two jobs one after the other

COUNTS = """
import os, socket
def views():  # every view this job has of host-wide counts a job can advance
    out = {}
    def view(name, read):
        try:
            out[name] = read()
        except OSError as exc:
            out[name] = os.strerror(exc.errno)
    view("/proc/stat", lambda: int(open("/proc/stat").read().split("processes")[1].split()[0]))
    view("pidfd_open", lambda: os.fstat(os.pidfd_open(os.getpid())).st_ino)
    a, b = socket.socketpair()
    view("SO_PEERPIDFD", lambda: os.fstat(a.getsockopt(socket.SOL_SOCKET, 77)).st_ino)
    view("SO_COOKIE", lambda: int.from_bytes(a.getsockopt(socket.SOL_SOCKET, 57, 8), "little"))
    for name in ("loadavg", "vmstat", "meminfo", "sys/kernel/random/boot_id", "sys/fs/file-nr"):
        view("/proc/" + name, lambda: open("/proc/" + name).read()[:20])
    out["/proc"] = sorted(n for n in os.listdir("/proc") if not n.isdigit())
    return out
def counter():
    for value in views().values():
        if isinstance(value, int):
            return value
"""


def test_issue46_item11_no_host_wide_counter_carries_a_number_between_jobs():
    message = secrets.randbelow(64)
    sender = COUNTS + textwrap.dedent(f"""
        seen = counter()
        while seen is not None and seen % 64 != {message}:  # fork until the count says the message
            if os.fork() == 0:
                os._exit(0)
            os.wait()
            seen = counter()
        print(views())
        """)
    receiver = COUNTS + "seen = counter()\ndef f():\n    return None if seen is None else (seen - 3) % 64"
    sent = sandbox.run_tests(sender, ["pass"], timeout_s=HANG_S)
    received = sandbox.run_tests(receiver, [f"assert f() == {message}"], timeout_s=HANG_S)
    assert sent.status == "ok", sent
    views = eval(sent.stdout)  # noqa: S307 - what this test's own program printed
    assert not [v for k, v in views.items() if isinstance(v, int)], views  # no view shows a count
    assert set(views["/proc"]) <= {"self", "thread-self"}, views  # the job's processes, nothing host-wide
    assert received.passed == 0, received


# ---- issue 46, item 12: a futex wake on a shared mapping of a file both jobs read, between jobs running at once

FUTEX = """
import ctypes, mmap, os, platform, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
WAIT, WAKE, HOLD = 0, 1, 8.0
def shared(fd, size=4096):  # MAP_SHARED, as a futex between processes needs; None where refused
    addr = libc.mmap(None, size, mmap.PROT_READ | (mmap.PROT_WRITE if fd < 0 else 0),
                     mmap.MAP_SHARED | (mmap.MAP_ANONYMOUS if fd < 0 else 0), fd, 0)
    return None if addr in (None, 2**64 - 1) else addr
def futex(addr, op, value, timeout_s=None):
    spec = (ctypes.c_long * 2)(int(timeout_s), 0) if timeout_s else None
    return libc.syscall(SYS_FUTEX, ctypes.c_void_p(addr), op, value, spec, None, 0)
def file_word():
    return shared(os.open(os.path.join(os.path.dirname(os.__file__), "os.py"), os.O_RDONLY))
"""

FUTEX_SENDER = FUTEX + """
word = shared(-1)  # the control: within its own job, a wake reaches a waiting child
if os.fork() == 0:
    os._exit(0 if futex(word, WAIT, 0, HOLD) == 0 else 1)
woken = 0
end = time.monotonic() + 1
while not woken and time.monotonic() < end:
    woken = futex(word, WAKE, 1)
control = os.waitstatus_to_exitcode(os.wait()[1]) == 0
addr = file_word()
end = time.monotonic() + HOLD
while addr is not None and time.monotonic() < end:  # wakes that a waiter in another job would see
    futex(addr, WAKE, 1)
    time.sleep(0.001)
print("mapped" if addr is not None else "refused")
"""

FUTEX_RECEIVER = FUTEX + """
addr = file_word()
woken = addr is not None and futex(addr, WAIT, ctypes.c_uint32.from_address(addr).value, HOLD) == 0
print("mapped" if addr is not None else "refused", woken)
def f():
    return woken
"""


def test_issue46_item12_a_futex_on_a_file_both_jobs_read_wakes_nobody_else():
    sender = sandbox.Job(FUTEX_SENDER, ("assert control",), timeout_s=HANG_S)
    receiver = sandbox.Job(FUTEX_RECEIVER, ("assert f()",), timeout_s=HANG_S)
    sent, received = sandbox.run_many([sender, receiver], max_workers=2)
    assert sent.status == "ok", sent  # a futex still works within a job
    assert received.passed == 0 and received.stdout.split() == ["refused", "False"], received
    assert sent.stdout.strip() == "refused", sent


# ---- item 12: what hostile output costs the host, against a job whose output costs nothing to read

NONCE = """
import os, sys
def prefix():  # the harness's channel, found by walking the frames: forged records carry the right nonce
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(getattr(value, "prefix", None), str) and len(value.prefix) == 33:
                os.write(1, b"found the nonce\\n")
                return value.prefix
        frame = frame.f_back
"""


def host_peak(job: sandbox.Job) -> tuple[int, sandbox.SandboxResult]:
    """The peak of this process's Python allocations while it runs `job` (its zygote already started)."""
    sandbox.run_many([sandbox.Job("pass", ("pass",))], max_workers=1)
    tracemalloc.start()
    try:
        result = sandbox.run_many([job], max_workers=1)[0]
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_forged_records_are_capped_before_they_are_parsed():
    size = host.RECORDS_CAP - 4096
    shapes = {  # each written to the result channel, then the program exits
        # the baseline: as many bytes, as one unterminated line, which the host drops unread
        "baseline": "os.write(3, b'x' * SIZE)",
        # the report's shape: short well-formed records, far more of them than the harness ever writes
        "short records": "line = (prefix() + '[\"ready\"]\\n').encode()\nos.write(3, line * (SIZE // len(line)))",
        # one long value record of nested lists, which json.loads would build whole
        "nested": "os.write(3, (prefix() + '[\"value\",0,0,[' + '[],' * (SIZE // 3 - 20) + '[]]]\\n').encode())",
        # one long value record of short strings: far more tokens than the codec allows
        "tokens": "os.write(3, (prefix() + '[\"value\",0,0,[' + '\"ab\",' * (SIZE // 5 - 20) + '\"ab\"]]\\n')"
                  ".encode())",
    }
    peaks = {}
    for name, write in shapes.items():
        program = NONCE + write.replace("SIZE", str(size)) + "\nos._exit(0)\n"
        peaks[name], result = host_peak(sandbox.Job(program, ("assert f() == 1",), timeout_s=HANG_S))
        assert result.passed == 0 and result.status in ("failed", "crashed"), (name, result)
        assert name == "baseline" or "found the nonce" in result.stdout, (name, result)  # the records were forged
    extra = {name: (peak - peaks["baseline"]) / 2**20 for name, peak in peaks.items()}
    assert extra["short records"] < 1 and extra["nested"] < 1, extra  # never parsed
    # parsed one token at a time up to the codec's bound: the line as ASCII, and MAX_TOKENS short strings
    assert extra["tokens"] < (size + (codec.MAX_TOKENS + 9) * 64) / 2**20 + 1, extra


def test_hostile_io_output_is_cut_before_it_is_decoded():
    cases = tuple((str(i), "x") for i in range(20))
    peak = {name: host_peak(sandbox.Job(program, io_cases=cases, timeout_s=HANG_S)) for name, program in {
        "baseline": "print('y')",
        # 1 MiB of invalid UTF-8 per case: at the cap, so each case fails whatever it printed
        "full": f"import sys\nsys.stdout.buffer.write(b'\\xff' * {sandbox.IO_OUTPUT_CAP})",
        # just under the cap: each case's stdout must come back to be compared
        "under": f"import sys\nsys.stdout.buffer.write(b'\\xff' * {sandbox.IO_OUTPUT_CAP - 1})",
    }.items()}
    for name, (_, result) in peak.items():
        assert result.passed == 0 and 0 < len(result.stdout.encode()) <= 3 * sandbox.OUTPUT_CAP, (name, result)
    extra = {name: (p - peak["baseline"][0]) / 2**20 for name, (p, _) in peak.items()}
    assert extra["full"] < 1, extra  # only what the result shows came back
    # each stdout held once as it came, and decoded one case at a time (at most 4 bytes a character, and its lines)
    assert extra["under"] < (len(cases) + 8) * sandbox.IO_OUTPUT_CAP / 2**20, extra


# ---- what the start-up report says of a missing protection, as docs/sandbox.md quotes it


def test_each_missing_protection_is_reported_as_the_docs_say():
    assert set(host.CONSEQUENCES) == set(sandbox.PROTECTIONS)
    docs = (REPO / "docs/sandbox.md").read_text()
    nothing = sandbox.Isolation("namespaces", walls=tuple((p, f"why {p}") for p in sandbox.PROTECTIONS))
    text = host.missing_warning(nothing)
    for name in sandbox.PROTECTIONS:
        assert f"{name} (why {name}): {host.CONSEQUENCES[name]}" in text
        assert f"| `{name}` | {host.CONSEQUENCES[name]} |" in docs, name
    assert f"up to {sandbox.NPROC} x memory_mb for a job" in host.CONSEQUENCES["cgroup"]
    assert "AF_VSOCK" in host.CONSEQUENCES["unix_sockets_only"]


def test_the_cgroup_warning_states_the_per_process_fallback(machine_without_cgroups, caplog):
    with caplog.at_level("WARNING", logger="grpo_recipes.sandbox"):
        assert "cgroup" in sandbox.isolation().missing()
    warning = " ".join(r.getMessage() for r in caplog.records if "WITHOUT" in r.getMessage())
    assert f"cgroup (no cgroups on this pretend machine): {host.CONSEQUENCES['cgroup']}" in warning, warning
    assert f"up to {sandbox.NPROC} x memory_mb" in warning
