"""The program's seccomp filter: a classic-BPF deny list, installed with prctl through ctypes (no libseccomp).

Denied calls fail with ENOSYS, as if the kernel lacked them: programs and libraries take their fallback paths
(glibc retries clone3 as clone, io_uring users fall back to epoll), and a test can tell the filter's refusal
from a permission check (EPERM). Denied: namespace creation and entry (unshare, setns, clone with any CLONE_NEW*
flag, clone3 whose flags a filter cannot read), keyrings, io_uring, userfaultfd, bpf, perf_event_open, ptrace and
process_vm_*, the mount API, module and kexec loading, file handles, syslog, acct, swap and reboot. Sockets of
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
          "name_to_handle_at", "open_by_handle_at", "syslog", "acct", "swapon", "swapoff", "reboot")
_NUMBERS = {  # from the kernel's unistd headers, in DENIED's order, then clone, socket, socketpair
    "x86_64": (101, 310, 311, 272, 308, 435, 248, 249, 250, 425, 426, 427, 323, 321, 298, 165, 166, 155, 161, 428,
               429, 430, 431, 432, 433, 442, 175, 313, 176, 246, 320, 303, 304, 103, 163, 167, 168, 169, 56, 41, 53),
    "aarch64": (117, 270, 271, 97, 268, 435, 217, 218, 219, 425, 426, 427, 282, 280, 241, 40, 39, 41, 51, 428, 429,
                430, 431, 432, 433, 442, 105, 273, 106, 104, 294, 264, 265, 116, 89, 224, 225, 142, 220, 198, 199),
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (CLONE_NEWTIME exists only for clone3/unshare)
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
DENY_ERRNO = errno.ENOSYS
AF_UNIX = 1
SOCKET_ERRNO = errno.EAFNOSUPPORT

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def machine() -> str:
    return platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")


def numbers(arch: str | None = None) -> dict[str, int]:
    """Syscall numbers by name for `arch` (this machine's by default): DENIED plus clone, socket, socketpair."""
    return dict(zip((*DENIED, "clone", "socket", "socketpair"), _NUMBERS[arch or machine()]))


def build(arch: str | None = None) -> bytes:
    """The filter as packed `struct sock_filter`s. KeyError when the architecture has no table here."""
    arch = arch or machine()
    nrs = numbers(arch)
    code: list[tuple] = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 0, "kill", _AUDIT_ARCH[arch]), (_LD_W_ABS, 0, 0, 0)]
    if arch == "x86_64":
        code.append((_JGE, "deny", 0, 0x40000000))  # __X32_SYSCALL_BIT
    code += [(_JEQ, "deny", 0, nrs[name]) for name in DENIED]
    code += [(_JEQ, "clone", 0, nrs["clone"]), (_JEQ, "socket", 0, nrs["socket"]),
             (_JEQ, "socket", 0, nrs["socketpair"]), (_RET, 0, 0, _RET_ALLOW)]
    labels = {"clone": len(code)}
    code += [(_LD_W_ABS, 0, 0, 16), (_JSET, "deny", 0, CLONE_NS_FLAGS), (_RET, 0, 0, _RET_ALLOW)]  # args[0], low word
    labels["socket"] = len(code)  # the family is an int: the low word of args[0] is all the kernel reads
    code += [(_LD_W_ABS, 0, 0, 16), (_JEQ, 0, 1, AF_UNIX), (_RET, 0, 0, _RET_ALLOW),
             (_RET, 0, 0, _RET_ERRNO | SOCKET_ERRNO)]
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
