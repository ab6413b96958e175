"""A private root file system: the run sees only the paths its policy allows (bubblewrap's
approach, done with unshare(2), mount(2) and pivot_root(2) directly).

In new mount and PID namespaces, a tmpfs becomes the root; each allowed path is bind-mounted
from the old root at the same place (read-only unless it is a write path); /proc is a fresh
procfs that shows only the run's own processes; /dev holds only a few character devices (and
the GPU's nodes for a GPU run) and a private, empty /dev/shm; /tmp is an empty read-only
directory. Then the old root is detached. What is not listed does not exist for the run:
host Unix sockets (docker.sock, daemons' control sockets), the host's /tmp and /dev/shm,
AIT_HOME and its secret, other jobs' directories.

The PID namespace needs a fork: the process that called unshare stays outside as a waiter and
exits with its child's status; the child is PID 1 of the namespace, so when it dies the kernel
kills every process the run left behind.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import signal
from dataclasses import dataclass, field

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
PR_SET_PDEATHSIG = 1
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo's escapes; nothing may be imported once the root moved
BASE = "/tmp"  # where the new root is assembled, inside the private mount namespace only
DEV_NODES = ("null", "zero", "full", "random", "urandom")
# statvfs flags a bind's read-only remount must keep (the kernel locks them in a user namespace)
ST_KEEP = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC}


@dataclass
class RootView:
    """What the new root shows. Paths are absolute, as seen on the host."""

    read: list[str] = field(default_factory=list)
    """Bound read-only (files or directories)."""
    write: list[str] = field(default_factory=list)
    """Bound read-write."""
    devices: list[str] = field(default_factory=list)
    """Device nodes bound under /dev (the GPU's)."""
    host_shm: bool = False
    """Bind the host's /dev/shm instead of a private one (CUDA MPS clients share it with the server)."""


class MountError(OSError):
    """The private root could not be built."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc().mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                         ctypes.c_ulong(flags), data.encode() if data else None), f"mount {source or ''} on {target}")


def _pivot_root(new_root: str, put_old: str) -> None:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    _check(libc.syscall(PIVOT_ROOT[platform.machine()], new_root.encode(), put_old.encode()), "pivot_root")


def unshare_and_fork(disk=None) -> None:
    """Enter new mount and PID namespaces. The caller continues as PID 1 of the new namespace; the
    original process waits outside and leaves with the child's status (never returns).
    `disk` (an ait.sandbox.diskfs_waiter.Waiter): the run's own file system, mounted here before the fork
    (build_root then binds it like any write path), watched while the child runs, and what it keeps
    copied back once it has ended."""
    _check(_libc().unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare(CLONE_NEWNS|CLONE_NEWPID)")
    if disk is not None:
        disk.setup()
    pid = os.fork()
    if pid == 0:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by fork: the waiter's death ends the run
        if disk is not None:
            disk.close_in_child()
        return
    if disk is not None:
        status = disk.wait(pid)
        disk.finish()
    else:
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # die of the same signal, so the parent sees what really happened
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # their handlers cannot be set (EINVAL), nor need to be
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _ensure(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.lexists(path):
            open(path, "a").close()


def _place(host_path: str, new_root: str, old_root: str) -> str | None:
    """Recreate the symlinks on the way to `host_path` inside the new root, so paths like /lib64 or a
    venv's bin/python resolve the same; returns the fully resolved host path to bind (None if absent)."""
    parts = [p for p in host_path.split("/") if p]
    resolved = ""
    for i, part in enumerate(parts):
        here = f"{resolved}/{part}"
        old = old_root + here
        if os.path.islink(old):
            link = new_root + here
            if not os.path.lexists(link):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(os.readlink(old), link)
            real = os.path.realpath(old)  # resolved against the old root's mount point
            if not real.startswith(old_root + "/"):
                return None
            resolved = real[len(old_root):]
        else:
            resolved = here
    return resolved if os.path.exists(old_root + resolved) else None


def _mounts_under(target: str) -> list[str]:
    """Mount points at or below `target` in this mount namespace (paths as this process sees them)."""
    points = []
    with open("/oldroot/proc/self/mountinfo") as f:  # the host's procfs, still reachable before the final pivot
        for line in f:
            point = OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4])  # \040 and friends
            if point == target or point.startswith(target + "/"):
                points.append(point)
    return points


def _bind(real: str, new_root: str, old_root: str, writable: bool) -> None:
    """Bind the host's `real` (a fully resolved path) at the same place in the new root."""
    source, target = old_root + real, new_root + real
    _ensure(target, os.path.isdir(source))
    # Recursive: a mount below a bound path (the GPU driver's /usr/local/nvidia under /usr, say) comes
    # along; each of them is then remounted with the same read-only, nosuid, nodev flags, or detached
    # when it cannot be: a mount is never handed over with more rights than asked for.
    _mount(source, target, None, MS_BIND | MS_REC)
    for point in _mounts_under(target):
        keep = MS_NOSUID | MS_NODEV
        flags = os.statvfs(point).f_flag
        for st_flag, ms_flag in ST_KEEP.items():
            if flags & st_flag:
                keep |= ms_flag
        try:
            _mount(None, point, None, MS_BIND | MS_REMOUNT | keep | (0 if writable else MS_RDONLY))
        except MountError:
            if point == target:
                raise
            _check(_libc().umount2(point.encode(), MNT_DETACH), f"umount2({point})")


def _plan_binds(view: RootView, new: str, old: str) -> list[tuple[str, bool]]:
    """(resolved host path, writable), parents first, without entries an ancestor already grants
    with the same rights (a write path inside a read path stays, and is bound over it)."""
    wanted: dict[str, bool] = {}
    for path, writable in [(p, False) for p in view.read] + [(p, True) for p in view.write]:
        if path in ("/proc", "/dev") or path.startswith(("/proc/", "/dev/")):
            continue  # a fresh /proc and a private /dev are made below
        real = _place(path, new, old)
        if real is None or real in ("", "/"):
            continue  # a path that does not exist here grants nothing; the whole old root is never bound
        wanted[real] = wanted.get(real, False) or writable
    kept: list[tuple[str, bool]] = []
    for real, writable in sorted(wanted.items(), key=lambda e: (e[0].count("/"), e[0])):
        if not any(w == writable and (real == k or real.startswith(k + "/")) for k, w in kept):
            kept.append((real, writable))
    return kept


def build_root(view: RootView) -> None:
    """Replace this process's root with one that holds only `view` (in a private mount namespace,
    as PID 1 of a new PID namespace: call unshare_and_fork first). Irreversible."""
    cwd = os.getcwd()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    _mount("tmpfs", BASE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.chdir(BASE)
    os.mkdir("newroot")
    os.mkdir("oldroot")
    _pivot_root(".", "oldroot")  # the tmpfs is / now; the host's root is at /oldroot
    os.chdir("/")
    new, old = "/newroot", "/oldroot"
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    for real, writable in _plan_binds(view, new, old):
        _bind(real, new, old, writable)
    os.makedirs(new + "/proc", exist_ok=True)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _build_dev(new, old, view)
    os.makedirs(new + "/tmp", exist_ok=True)
    os.chdir(new)
    _pivot_root(".", ".")  # stack the new root over the old one, then detach the old one
    _check(_libc().umount2(b".", MNT_DETACH), "umount2(old root)")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(cwd)


def _build_dev(new: str, old: str, view: RootView) -> None:
    dev = new + "/dev"
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name in DEV_NODES:
        if os.path.exists(f"{old}/dev/{name}"):
            _ensure(f"{dev}/{name}", False)
            _mount(f"{old}/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for node in view.devices:  # the GPU's nodes, and directories of them (/dev/nvidia-caps)
        if node.startswith("/dev/") and os.path.exists(old + node) and "/" not in node[5:]:
            _ensure(new + node, os.path.isdir(old + node))
            _mount(old + node, new + node, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm")
    if view.host_shm and os.path.isdir(old + "/dev/shm"):
        _mount(old + "/dev/shm", dev + "/shm", None, MS_BIND)
    else:
        _mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
    _mount(None, dev, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)  # no new nodes in /dev


def works() -> str:
    """'' if a private root can be built here (tried in a throwaway child), else why not."""
    import sys

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 1
        try:
            if os.geteuid() != 0:
                from ait.sandbox.namespaces import enter_user_namespace

                enter_user_namespace()
            unshare_and_fork()
            prefix = os.path.realpath(sys.prefix)
            build_root(RootView(read=["/usr", "/etc/passwd", prefix], write=[]))
            listed = set(os.listdir("/"))
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
            code = 0 if "oldroot" not in listed and pids == ["1"] else 2
        except Exception as e:  # noqa: BLE001 - reported as the layer's detail
            os.write(write, f"{type(e).__name__}: {e}"[:300].encode())
        os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    detail = os.read(read, 400).decode(errors="replace")
    os.close(read)
    if os.waitstatus_to_exitcode(status) == 0:
        return ""
    return f"a private root could not be built here ({detail or 'the check failed'})"
