"""The program's seccomp filter: a classic-BPF deny list, installed with prctl through ctypes (no libseccomp).

Denied calls fail with ENOSYS, as if the kernel lacked them: programs and libraries take their fallback paths
(glibc retries clone3 as clone, io_uring users fall back to epoll), and a test can tell the filter's refusal
from a permission check (EPERM). Denied: namespace creation and entry (unshare, setns, clone with any CLONE_NEW*
flag, clone3 whose flags a filter cannot read), keyrings, io_uring, userfaultfd, bpf, perf_event_open, ptrace and
process_vm_*, the mount API, module and kexec loading, file handles, syslog, acct, swap and reboot. Channels
between jobs: what changes or shows the page cache of the files every job reads (fadvise, madvise page-out,
mincore, cachestat, RWF_NOWAIT reads), shared read-only mappings of them (a futex key is the file page, so a
wake would cross jobs), and what shows the host's count of processes ever started (pidfds: pidfd_open,
CLONE_PIDFD, SO_PEERPIDFD, SO_PASSPIDFD) or of sockets given a cookie (SO_COOKIE). Sockets of
any family but AF_UNIX fail with EAFNOSUPPORT, as where the kernel lacks the family: AF_VSOCK's ports are the
host's, and AF_INET, netlink and the rest would hold ports or state in the zygote's network namespace that
outlive a job. A syscall from another ABI (i386 via int 0x80) kills the process; x32 numbers fail like denied calls.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "clone3", "add_key", "request_key",
          "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "bpf", "perf_event_open",
          "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
          "fspick", "mount_setattr", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
          "name_to_handle_at", "open_by_handle_at", "syslog", "acct", "swapon", "swapoff", "reboot",
          # what the page cache shared by every job's files shows or lets a job change, and the pid counter's view
          "fadvise64", "mincore", "cachestat", "pidfd_open")
# Calls allowed but for some arguments (the labels in build): the clone flags, the socket family, shared read-only
# mappings (a futex on one wakes another job's), madvise's page-out, RWF_NOWAIT reads (is it cached?), and the
# socket options that read host-wide counters (SO_COOKIE) or hand out pidfds (SO_PEERPIDFD, SO_PASSPIDFD).
FILTERED = ("clone", "socket", "socketpair", "mmap", "madvise", "preadv2", "pwritev2", "getsockopt", "setsockopt")
_NUMBERS = {  # from the kernel's unistd headers, in the order of DENIED then FILTERED
    "x86_64": (101, 310, 311, 272, 308, 435, 248, 249, 250, 425, 426, 427, 323, 321, 298, 165, 166, 155, 161, 428,
               429, 430, 431, 432, 433, 442, 175, 313, 176, 246, 320, 303, 304, 103, 163, 167, 168, 169, 221, 27, 451,
               434, 56, 41, 53, 9, 28, 327, 328, 55, 54),
    "aarch64": (117, 270, 271, 97, 268, 435, 217, 218, 219, 425, 426, 427, 282, 280, 241, 40, 39, 41, 51, 428, 429,
                430, 431, 432, 433, 442, 105, 273, 106, 104, 294, 264, 265, 116, 89, 224, 225, 142, 223, 232, 451, 434,
                220, 198, 199, 222, 233, 286, 287, 209, 208),
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (CLONE_NEWTIME exists only for clone3/unshare),
# and CLONE_PIDFD: a pidfd's inode number counts every process the host ever started
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x1000
MAP_SHARED, PROT_WRITE, MADV_COLD, MADV_PAGEOUT, RWF_NOWAIT = 0x01, 0x02, 20, 21, 0x08
SOL_SOCKET, SO_COOKIE, SO_PASSPIDFD, SO_PEERPIDFD = 1, 57, 76, 77
DENY_ERRNO = errno.ENOSYS
AF_UNIX = 1
SOCKET_ERRNO = errno.EAFNOSUPPORT

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def machine() -> str:
    return platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")


def numbers(arch: str | None = None) -> dict[str, int]:
    """Syscall numbers by name for `arch` (this machine's by default): DENIED plus FILTERED."""
    return dict(zip((*DENIED, *FILTERED), _NUMBERS[arch or machine()]))


def build(arch: str | None = None) -> bytes:
    """The filter as packed `struct sock_filter`s. KeyError when the architecture has no table here."""
    arch = arch or machine()
    nrs = numbers(arch)
    code: list[tuple] = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 0, "kill", _AUDIT_ARCH[arch]), (_LD_W_ABS, 0, 0, 0)]
    if arch == "x86_64":
        code.append((_JGE, "deny", 0, 0x40000000))  # __X32_SYSCALL_BIT
    code += [(_JEQ, "deny", 0, nrs[name]) for name in DENIED]
    code += [(_JEQ, "clone", 0, nrs["clone"]), (_JEQ, "socket", 0, nrs["socket"]),
             (_JEQ, "socket", 0, nrs["socketpair"]), (_JEQ, "mmap", 0, nrs["mmap"]),
             (_JEQ, "madvise", 0, nrs["madvise"]), (_JEQ, "rwf", 0, nrs["preadv2"]), (_JEQ, "rwf", 0, nrs["pwritev2"]),
             (_JEQ, "sockopt", 0, nrs["getsockopt"]), (_JEQ, "sockopt", 0, nrs["setsockopt"]),
             (_RET, 0, 0, _RET_ALLOW)]

    def arg(i: int) -> tuple:  # the low word of args[i]: every argument checked here is an int or flags below 2**32
        return (_LD_W_ABS, 0, 0, 16 + 8 * i)

    labels = {"clone": len(code)}
    code += [arg(0), (_JSET, "deny", 0, CLONE_NS_FLAGS), (_RET, 0, 0, _RET_ALLOW)]
    labels["socket"] = len(code)
    code += [arg(0), (_JEQ, 0, 1, AF_UNIX), (_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | SOCKET_ERRNO)]
    labels["mmap"] = len(code)  # MAP_SHARED without PROT_WRITE: the only shared mapping of a file of the root
    code += [arg(3), (_JSET, 0, 2, MAP_SHARED), arg(2), (_JSET, 0, "deny", PROT_WRITE), (_RET, 0, 0, _RET_ALLOW)]
    labels["madvise"] = len(code)
    code += [arg(2), (_JEQ, "deny", 0, MADV_COLD), (_JEQ, "deny", 0, MADV_PAGEOUT), (_RET, 0, 0, _RET_ALLOW)]
    labels["rwf"] = len(code)
    code += [arg(5), (_JSET, "deny", 0, RWF_NOWAIT), (_RET, 0, 0, _RET_ALLOW)]
    labels["sockopt"] = len(code)
    code += [arg(1), (_JEQ, 0, 4, SOL_SOCKET), arg(2), (_JEQ, "deny", 0, SO_COOKIE), (_JEQ, "deny", 0, SO_PASSPIDFD),
             (_JEQ, "deny", 0, SO_PEERPIDFD), (_RET, 0, 0, _RET_ALLOW)]
    labels["deny"] = len(code)
    code.append((_RET, 0, 0, _RET_ERRNO | DENY_ERRNO))
    labels["kill"] = len(code)
    code.append((_RET, 0, 0, _RET_KILL_PROCESS))

    def jump(target: int | str, at: int) -> int:
        return labels[target] - at - 1 if isinstance(target, str) else target

    return b"".join(struct.pack("=HBBI", op, jump(jt, i), jump(jf, i), k) for i, (op, jt, jf, k) in enumerate(code))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes) -> None:
    """Filter this thread and every process it starts. Needs PR_SET_NO_NEW_PRIVS (or CAP_SYS_ADMIN) first."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "seccomp filter: " + os.strerror(err))
