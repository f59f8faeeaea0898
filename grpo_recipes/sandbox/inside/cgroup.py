"""Per-job cgroups: one memory + pids cap for all of a job's processes, nested under the caller's own cgroup.

cgroup v2 when the caller's cgroup can hand memory and pids to children; otherwise the v1 memory and pids
hierarchies. Nesting under the caller's cgroup (not the root) keeps a job inside whatever limits the caller
already has. `detect()` runs on the host; `open_parents`, `create` and `remove` run in the zygote, on directory
fds opened before it leaves the host's file tree.
"""

from __future__ import annotations

import errno
import os
import time

PREFIX = "grpo-sbx-"


def _mounts() -> tuple[str | None, dict[str, tuple[str, str]]]:
    """(the cgroup2 mount point, {v1 controller: (mount point, mount root)}) from /proc/self/mountinfo."""
    v2, v1 = None, {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3:
                continue
            root, point = fields[3], fields[4].replace("\\040", " ")
            if rfields[0] == "cgroup2" and root == "/":
                v2 = point
            elif rfields[0] == "cgroup":
                for option in rfields[2].split(","):
                    if option in ("memory", "pids"):
                        v1[option] = (point, root)
    return v2, v1


def _own_paths() -> dict[str, str]:
    """{"": v2 path, "memory": v1 path, "pids": v1 path} of this process, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _try_child(parent: str, files: tuple[str, ...]) -> str:
    """'' when this process can create a child of `parent` that has `files`, else why not."""
    probe = os.path.join(parent, "%sprobe-%d" % (PREFIX, os.getpid()))
    try:
        os.mkdir(probe)
    except OSError as exc:
        return "cannot create cgroups under %s: %s" % (parent, exc.strerror)
    try:
        missing = [f for f in files if not os.path.exists(os.path.join(probe, f))]
        return "no %s in %s" % (", ".join(missing), parent) if missing else ""
    finally:
        os.rmdir(probe)


def detect() -> tuple[dict | None, str]:
    """({"version": 2 or 1, "parents": [dirs]}, '') when per-job cgroups work here, else (None, why not)."""
    try:
        v2, v1 = _mounts()
        own = _own_paths()
    except OSError as exc:
        return None, "cannot read this process's cgroups: %s" % exc
    reasons = []
    if v2 and "" in own:
        parent = os.path.normpath(v2 + own[""])
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                available = f.read().split()
            if not {"memory", "pids"} <= set(available):
                raise OSError(errno.ENOTSUP, "the v2 hierarchy has no memory/pids controller here (hybrid setup)")
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if not {"memory", "pids"} <= set(enabled):
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory +pids")  # EBUSY when the caller's cgroup holds processes and is not the root
            problem = _try_child(parent, ("memory.max", "pids.max"))
            if not problem:
                return {"version": 2, "parents": [parent]}, ""
            reasons.append("v2: " + problem)
        except OSError as exc:
            reasons.append("v2: %s" % (exc.strerror or exc))
    else:
        reasons.append("v2: not mounted")
    if "memory" in v1 and "pids" in v1 and "memory" in own and "pids" in own:
        parents = []
        for controller, files in (("memory", ("memory.limit_in_bytes",)), ("pids", ("pids.max",))):
            point, root = v1[controller]
            rel = os.path.relpath(own[controller], root) if own[controller].startswith(root) else None
            if rel is None:
                reasons.append("v1 %s: this process's cgroup is outside the mounted hierarchy" % controller)
                break
            parent = os.path.normpath(os.path.join(point, rel))
            problem = _try_child(parent, files)
            if problem:
                reasons.append("v1: " + problem)
                break
            parents.append(parent)
        else:
            return {"version": 1, "parents": parents}, ""
    else:
        reasons.append("v1: no memory and pids hierarchies mounted")
    return None, "; ".join(reasons)


def open_parents(config: dict) -> list[int]:
    return [os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for p in config["parents"]]


def _write(dirfd: int, path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dirfd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def create(config: dict, parent_fds: list[int], name: str, memory_bytes: int, pids: int) -> list[int]:
    """Make the job's cgroup(s) with their caps; returns write fds of their cgroup.procs (write b"0" to join)."""
    procs = []
    try:
        for i, dirfd in enumerate(parent_fds):
            os.mkdir(name, 0o755, dir_fd=dirfd)
            if config["version"] == 2:
                _write(dirfd, name + "/memory.max", str(memory_bytes))
                try:
                    _write(dirfd, name + "/memory.swap.max", "0")
                except FileNotFoundError:  # no swap accounting: there is no swap to cap
                    pass
                _write(dirfd, name + "/pids.max", str(pids))
            elif i == 0:  # v1 memory; swap, where accounted, capped at the same total
                _write(dirfd, name + "/memory.limit_in_bytes", str(memory_bytes))
                try:
                    _write(dirfd, name + "/memory.memsw.limit_in_bytes", str(memory_bytes))
                except FileNotFoundError:
                    pass
            else:
                _write(dirfd, name + "/pids.max", str(pids))
            procs.append(os.open(name + "/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=dirfd))
    except OSError:
        for fd in procs:
            os.close(fd)
        remove(parent_fds, name)
        raise
    return procs


def remove(parent_fds: list[int], name: str, attempts: int = 100) -> str:
    """Remove the job's cgroup(s) once empty; '' or what is left behind. Exiting tasks may hold one briefly."""
    left = []
    for dirfd in parent_fds:
        for attempt in range(attempts):
            try:
                os.rmdir(name, dir_fd=dirfd)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or attempt == attempts - 1:
                    left.append("%s: %s" % (name, exc.strerror))
                    break
                time.sleep(0.01)
    return "; ".join(left)


def remove_stale(config: dict, prefix: str) -> None:
    """The host's backstop after killing a zygote: remove the job cgroups it left, named `prefix`*."""
    for parent in config["parents"]:
        try:
            names = [n for n in os.listdir(parent) if n.startswith(prefix)]
        except OSError:
            continue
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for n in names:
                _kill_members(os.path.join(parent, n))
                remove([fd], n)
        finally:
            os.close(fd)


def _kill_members(path: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
