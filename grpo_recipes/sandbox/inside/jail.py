"""The walls: the minimal root a zygote moves into, and the last steps of the program's process before it runs.

The minimal root is a read-only tmpfs holding only what the interpreter needs: its prefix (the standard library;
site-packages masked by an empty tmpfs), the directories of the shared libraries it and its extension modules
load, /etc/ld.so.cache, a /dev with null, zero, full, random and urandom, and mount points for /proc, /tmp,
/dev/shm and the work dir, which each job mounts fresh. No project files, no home directories, no host sockets.

Every file in it is an inode of this zygote's own: the folders are read-only overlays of the host's (a file,
such as the interpreter, is bound out of an overlay of its folder) and the devices are made with mknod. File
locks, leases and inotify marks live on the inode, so they reach no job of another zygote; jobs of one zygote
run one at a time, and nothing of a job outlives it (zygote.settle_sockets).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import stat

from . import seccomp

libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_MOUNT_SETATTR = 442  # the same on every architecture
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKDIR = "/sandbox"
SCRATCH = {WORKDIR: None, "/tmp": "mode=1777,size=16m", "/dev/shm": "mode=1777,size=16m"}  # per run


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s):
        return s.encode() if s else None

    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)


def umount(target: str) -> None:
    check(libc.umount2(target.encode(), MNT_DETACH), "umount " + target)


def _read_only_tree(path: str) -> None:
    """Make every mount under `path` read-only and nosuid (mount_setattr, Linux >= 5.12; else one remount each)."""
    attr = (ctypes.c_uint64 * 4)(0x1 | 0x2, 0, 0, 0)  # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
    if libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(-100), path.encode(), ctypes.c_long(0x8000),
                    attr, ctypes.c_long(32)) == 0:  # AT_FDCWD, AT_RECURSIVE
        return
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        if point == path or point.startswith(path.rstrip("/") + "/"):
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
            st = os.statvfs(point)  # a user namespace may not drop flags the mount already has: keep them
            flags |= st.f_flag & (MS_NODEV | MS_NOEXEC) | (st.f_flag & 0x1C00)  # + the atime flags
            mount(None, point, None, flags)


def _private_copy(path: str, fd: int, dst: str, layer: str, empty: str) -> None:
    """Mount at `dst` a read-only overlay of the folder `fd`, or bind the file `fd` out of an overlay of its
    folder (mounted at `layer` for the moment): inodes of this zygote's own, with the host's contents."""
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        mount("overlay", dst, "overlay", MS_RDONLY, "lowerdir=/proc/self/fd/%d:%s" % (fd, empty))
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mount("overlay", layer, "overlay", MS_RDONLY, "lowerdir=/proc/self/fd/%d:%s" % (folder, empty))
    finally:
        os.close(folder)
    try:
        mount(os.path.join(layer, os.path.basename(path)), dst, None, MS_BIND)
    finally:
        umount(layer)  # the bind keeps the overlay alive


def build_root(cfg: dict, arch: str) -> tuple[str, str]:
    """Called once per zygote, in its own mount namespace: build the minimal root and move into it.

    Returns (a note when it had to settle for less than pivot_root, why some inodes are the host's), '' for each
    when not.
    """
    sources = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in cfg["binds"]]
    devices = [(n, os.open("/dev/" + n, os.O_PATH | os.O_CLOEXEC)) for n in DEVICES if os.path.exists("/dev/" + n)]
    proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    new = cfg["staging"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here may propagate back to the host
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    for path, target in cfg["links"]:
        os.makedirs(new + os.path.dirname(path), exist_ok=True)
        os.symlink(target, new + path)
    shared = []  # what stays the host's inodes, and why
    empty, layer = new + "/.empty", new + "/.layer"  # an overlay needs two lower layers; removed below
    os.makedirs(empty)
    os.makedirs(layer)
    for path, fd in sources:
        dst = new + path
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "wb").close()
        try:
            _private_copy(path, fd, dst, layer, empty)
        except OSError as exc:  # no overlayfs here (Linux < 5.11 in a user namespace, or too deep a stack)
            shared.append("%s: bound, not overlaid (%s)" % (path, exc.strerror or exc))
            mount("/proc/self/fd/%d" % fd, dst, None, MS_BIND | MS_REC)
        os.close(fd)
    os.rmdir(layer)
    for path in cfg["masks"]:
        mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4k")
    os.makedirs(new + "/dev")
    mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    bound = []
    for name, fd in devices:
        st = os.fstat(fd)
        try:
            os.mknod(new + "/dev/" + name, stat.S_IFCHR | 0o600, st.st_rdev)
            os.chmod(new + "/dev/" + name, stat.S_IMODE(st.st_mode))
        except PermissionError:  # a user namespace may not make device nodes: bind the host's
            bound.append("/dev/" + name)
            open(new + "/dev/" + name, "wb").close()
            mount("/proc/self/fd/%d" % fd, new + "/dev/" + name, None, MS_BIND)
        os.close(fd)
    if bound:
        shared.append("%s: the host's (mknod needs root)" % ", ".join(bound))
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink("/proc/self/fd/%d" % i, new + "/dev/" + name)
    os.symlink("/proc/self/fd", new + "/dev/fd")
    for d in (*SCRATCH, "/proc"):
        os.makedirs(new + d, exist_ok=True)
    # The host's /proc, under each job's own: in a user namespace the kernel lets a job mount a proc only where
    # a full one is already visible. A job's mount hides it, and the program can neither unmount nor reach it.
    mount("/proc/self/fd/%d" % proc, new + "/proc", None, MS_BIND | MS_REC)
    os.close(proc)
    os.chdir(new)
    note = ""
    if libc.syscall(ctypes.c_long(_SYS_PIVOT_ROOT[arch]), b".", b".") == 0:
        umount(".")  # the old root, stacked on top by pivot_root(".", "."): detached, unreachable from here on
    elif ctypes.get_errno() == errno.EINVAL:  # the host's / is no mount point (a chroot, an initramfs)
        check(libc.chroot(b"."), "chroot")
        note = ("minimal root entered with chroot (pivot_root: the host's / is not a mount point): the host tree "
                "stays mounted below it, out of reach of a process without capabilities")
    else:
        check(-1, "pivot_root")
    os.chdir("/")
    os.rmdir("/.empty")  # the overlays hold on to it; it is gone from the tree
    _read_only_tree("/")
    return note, "; ".join(shared)


def close_fds_except(keep: set[int]) -> None:
    start = 0
    for fd in sorted(keep):
        if start < fd:  # never an empty range: CPython turns closerange(n, n) into close_range(n, ~0)
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 1 << 16)


def take_fds(fds: list[int], go_w: int, cgroup_procs: list[int]) -> int:
    """R's first step: join the job's cgroup, make `fds` 0, 1, ... and close every other fd but the go pipe.

    Returns the go pipe's new number (above the others).
    """
    for fd in cgroup_procs:  # first: every process from here on is counted against the job
        os.write(fd, b"0")
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in (*fds, go_w)]
    for target, fd in enumerate(high[:-1]):
        os.dup2(fd, target)
    close_fds_except(set(range(len(fds))) | {high[-1]})
    return high[-1]


def enter(spec: dict, joined_cgroup: bool, seccomp_filter: bytes | None) -> dict:
    """R walls itself in before any program code runs; returns which walls it got."""
    os.setsid()  # its own process group: killpg(0) from the program cannot reach the supervisor
    if spec["ns"]:  # ipc: no SysV or POSIX-queue object of a run (an io case) reaches the next one
        cg = CLONE_NEWCGROUP if joined_cgroup else 0  # cgroup: /proc/self/cgroup then shows "/" only
        check(libc.unshare(CLONE_NEWIPC | cg), "unshare ipc, cgroup")
    os.chdir(spec["cwd"])
    uid = spec["uid"]
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
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": spec["cwd"],
                       "TMPDIR": spec["cwd"]})
    if seccomp_filter is not None:
        seccomp.install(seccomp_filter)  # last: the steps above make calls it denies
    return {"cgroup": joined_cgroup, "seccomp": seccomp_filter is not None}
