"""A file system of the run's own for what it writes, capped at its disk limit by the kernel.

The watchdog (ait.sandbox.watch) walks a run's directories every 2 s: a fast writer passes the
limit between two walks, and no walk sees what the kernel holds for the run elsewhere (a file
unlinked but open, a descriptor passed to another process). Here the run's directory
(policy.write[0]) is, inside the run's mount namespace, a fresh file system of `disk_bytes` with
`disk_files` inodes: a write past it fails with ENOSPC whatever the trick (unlinked-but-open,
fallocated, sparse or hard-linked files), between polls or not, and the host never loses more.

    tmpfs   size=disk_bytes, nr_inodes=disk_files; nosuid, nodev, noexec. Memory, charged to the
            run's memory limit: for a small limit on scratch (the probe's). Wherever the private
            root is built, as root or in a user namespace.
    image   a sparse file of disk_bytes beside the directory (never inside a path the run may
            reach), made by mkfs.ext4 without a journal in the parent, loop-mounted nosuid, nodev
            (exec stays: Triton and inductor load the kernels they compile into TMPDIR). Disk, for
            training. Root with loop devices and mkfs.ext4 only.

The launcher's waiter mounts it over the directory before it forks the run, watches it, and when
the run has ended copies back only the names the policy keeps and reports what it saw through a
pipe the run never holds (ait.sandbox.diskfs_waiter; the copying, links never followed:
ait.sandbox.diskfs_copy). This module is the parent's side (whoever starts the launcher): the
plan (`prepare`, the image made here), the fanotify group the waiter watches with, and after the
run the report read, the image deleted, the directory stripped of what is not kept; and `works`,
whether a kind can be given to a run on this host.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

from ait.sandbox.diskfs_copy import MAX_DEPTH, copy_tree  # noqa: F401 - re-exported: their home was here
from ait.sandbox.diskfs_waiter import (  # noqa: F401 - re-exported: their home was here
    EVENT, FAN_CLOSE_WRITE, FAN_MARK_ADD, FAN_MARK_FILESYSTEM, FULL_MARGIN, LO_FLAGS_AUTOCLEAR, LO_FLAGS_OFFSET,
    LO_INFO64_SIZE, LOOP_CLR_FD, LOOP_CONFIGURE, LOOP_CTL_GET_FREE, LOOP_SET_FD, LOOP_SET_STATUS64, MNT_DETACH, MS_NODEV,
    MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_REC, POLL_MS, attach_loop, is_full)
from ait.sandbox.diskfs_waiter import MAX_REPORT_BYTES, DiskPlan, Waiter, libc

FAN_CLASS_NOTIF, FAN_CLOEXEC, FAN_NONBLOCK = 0, 1, 2
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def mkfs_path() -> str | None:
    return shutil.which("mkfs.ext4", path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def image_path(write_dir: str) -> str:
    """Beside the directory, in its parent: RUN_DIR/job -> RUN_DIR/.job.ait-disk.img."""
    path = Path(write_dir)
    return str(path.parent / f".{path.name}.ait-disk.img")


def make_image(image: str, size: int, inodes: int | None, uid: int, gid: int) -> None:
    """A sparse file of `size` bytes holding an empty ext4 (no journal: the file system lives as long
    as one run; no reserved blocks; the root directory owned by uid:gid). ~50 ms, a few hundred KB."""
    mkfs = mkfs_path()
    if mkfs is None:
        raise OSError(errno.ENOENT, "mkfs.ext4 not found")
    try:
        os.unlink(image)  # a dead attempt's
    except FileNotFoundError:
        pass
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    args = [mkfs, "-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0",
            "-E", f"lazy_itable_init=1,nodiscard,root_owner={uid}:{gid}"]
    if inodes:
        args += ["-N", str(inodes)]
    proc = subprocess.run([*args, image], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"})
    if proc.returncode != 0:
        os.unlink(image)
        raise OSError(errno.EIO, f"mkfs.ext4 failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def _inside(path: str, roots: list[str]) -> bool:
    for root in roots:
        if root.startswith(("/dev/", "/proc/")):
            continue
        real = os.path.realpath(root)
        if path == real or path.startswith(real.rstrip("/") + "/"):
            return True
    return False


def prepare(policy, available: list[str], reachable: list[str]) -> DiskPlan | None:
    """The file system this run gets, its image made now; None where the policy asks for none, this
    host has none of that kind, or making it failed (the watchdog is then the bound)."""
    limits = policy.limits
    if policy.disk_fs is None or policy.disk_fs not in available or not policy.write or limits.disk_bytes is None:
        return None
    path = os.path.realpath(policy.write[0])
    if not os.path.isdir(path):
        return None
    plan = DiskPlan(kind=policy.disk_fs, path=path, size_bytes=limits.disk_bytes, inodes=limits.disk_files,
                    keep=list(policy.keep or []), noexec=policy.disk_fs == "tmpfs")
    if plan.kind == "image":
        plan.image = image_path(path)
        if _inside(plan.image, reachable):  # the run could read or write its own image
            return None
        st = os.stat(path)
        try:
            make_image(plan.image, plan.size_bytes, plan.inodes, st.st_uid, st.st_gid)
        except (OSError, subprocess.SubprocessError):
            return None
    return plan


def release(plan: DiskPlan | None) -> None:
    """After the run: delete its image (its loop device cleared itself when the run's namespace ended)."""
    if plan is not None and plan.image:
        try:
            os.unlink(plan.image)
        except FileNotFoundError:
            pass


def read_report(fd: int, plan: DiskPlan | None) -> dict:
    """What the waiter saw, as RunOutcome fields (read once the run's processes are gone; closes `fd`).
    Without a report (the waiter was killed with its group) the planned file system is named."""
    chunks, total = [], 0
    try:
        os.set_blocking(fd, False)
        while total < MAX_REPORT_BYTES:
            try:
                chunk = os.read(fd, MAX_REPORT_BYTES - total)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    fields = {"disk_fs": plan.kind if plan else None, "disk_full": False}
    try:
        report = json.loads(b"".join(chunks) or b"null")
    except ValueError:
        report = None
    if isinstance(report, dict):
        fs = report.get("fs")
        fields["disk_fs"] = fs if fs in ("tmpfs", "image") else None
        fields["disk_full"] = report.get("full") is True
    return fields


def watch_group() -> int | None:
    """A fanotify group for one run's waiter to watch its file system with (None where fanotify
    cannot mark a whole file system: not root). Its events' descriptors open without blocking on a
    FIFO. Pass it to the launcher (DiskPlan.watch_fd) and close it once the run has ended."""
    if os.geteuid() != 0:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_LARGEFILE", 0)
    fan = libc().fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, flags)
    return fan if fan >= 0 else None


def regular_files(write_dir: str) -> set[str]:
    """Top-level regular files in the run's directory before it starts (its request): they stay."""
    try:
        with os.scandir(write_dir) as it:
            return {e.name for e in it if e.is_file(follow_symlinks=False)}
    except OSError:
        return set()


def discard_unkept(write_dir: str, keep: list[str], before: set[str]) -> int:
    """After the run: remove every entry of its directory but the kept names and the regular files
    that were there before it (links removed, never followed). Returns how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(write_dir))
    except OSError:
        return 0
    for entry in entries:
        if entry.name in keep or (entry.name in before and entry.is_file(follow_symlinks=False)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:
            pass
    return removed


def works(kind: str) -> str:
    """'' if a capped file system of `kind` can be given to a run here (tried: a few MiB written
    until ENOSPC in a throwaway child), else why not."""
    import tempfile

    if kind == "image" and os.geteuid() != 0:
        return "not root: loop devices need it"
    if kind == "image" and not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop devices)"
    if kind == "image" and mkfs_path() is None:
        return "no mkfs.ext4"
    size = 8 * 2**20
    base = tempfile.mkdtemp(prefix="ait-diskfs-")
    try:
        run = os.path.join(base, "run")
        os.mkdir(run)
        plan = DiskPlan(kind=kind, path=run, size_bytes=size, inodes=128, noexec=kind == "tmpfs")
        if kind == "image":
            plan.image = image_path(run)
            try:
                make_image(plan.image, size, 128, os.getuid(), os.getgid())
            except (OSError, subprocess.SubprocessError) as e:
                return f"an ext4 image could not be made ({e})"
        plan.watch_fd = watch_group()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 1
            try:
                if os.geteuid() != 0:
                    from ait.sandbox.namespaces import enter_user_namespace

                    enter_user_namespace()
                if libc().unshare(0x00020000) != 0:  # CLONE_NEWNS
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) refused")
                waiter = Waiter(plan)
                waiter.setup()
                if waiter.error:
                    raise OSError(errno.EIO, waiter.error)
                written = 0
                with open(os.path.join(run, "fill"), "wb") as f:
                    os.unlink(os.path.join(run, "fill"))
                    try:
                        while written <= 2 * size:
                            written += f.write(b"\0" * 2**20) or 0
                            f.flush()
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                code = 0 if written <= size else 2
                if code:
                    os.write(write, b"a write past the size did not fail")
            except Exception as e:  # noqa: BLE001 - reported as the detail
                os.write(write, f"{type(e).__name__}: {e}"[:300].encode())
            os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        detail = os.read(read, 400).decode(errors="replace")
        os.close(read)
        if plan.watch_fd is not None:
            os.close(plan.watch_fd)
        return "" if os.waitstatus_to_exitcode(status) == 0 else f"a capped {kind} could not be used ({detail or 'failed'})"
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the image too: it lies beside the directory
