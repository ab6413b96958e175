"""The run's own file system, seen from the launcher's waiter: mounting it, watching it, reporting.

The launcher's waiter (the process left outside the run's PID namespace, ait.sandbox.mounts)
sets it up after unshare(CLONE_NEWNS) and before it forks the run: it makes the namespace's
mounts private, mounts the file system over the directory (the private root then binds it like
any write path), seeds it with what the host's directory holds (the request, HOME and TMPDIR)
and keeps a descriptor on each. When the run has ended it copies back only the names the policy
keeps (ait.sandbox.diskfs_copy), deletes the rest (so the unmount writes none of it into an
image about to be deleted) and exits: the namespace, its mount and the loop device go with it,
and the parent deletes the image.

It also watches the file system: a fanotify mark (root) hands it each file the run closes after
writing, held open until it is read, so a file written until ENOSPC is seen full even when it was
unlinked and its writer died at once; statvfs is polled besides. The fanotify group and a pipe
for its report come from whoever starts the launcher (the parent, or the zygote's server), which
reads the report once the run has ended: what the waiter saw never goes through a file the run
could write.

This module is what the launcher needs (DiskPlan, the plan it is handed, and Waiter); the
parent's side (planning, the image, the fanotify group, reading the report) is ait.sandbox.diskfs.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import stat
import struct
from typing import Literal

from pydantic import BaseModel, Field

from ait.sandbox.diskfs_copy import copy_tree, remove_all

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MNT_DETACH = 2
LOOP_SET_FD, LOOP_CLR_FD, LOOP_SET_STATUS64, LOOP_CONFIGURE = 0x4C00, 0x4C01, 0x4C04, 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_AUTOCLEAR = 4  # the loop device detaches itself when its file system is unmounted
LO_INFO64_SIZE, LO_FLAGS_OFFSET = 232, 52  # struct loop_info64, and where its lo_flags lies
FAN_CLOSE_WRITE = 0x08
FAN_MARK_ADD, FAN_MARK_FILESYSTEM = 1, 0x100
EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata: len, vers, reserved, metadata_len, mask, fd, pid
POLL_MS = 200
FULL_MARGIN = 2**20  # free space under max(this, 1% of the size) counts as full
MAX_REPORT_BYTES = 65536


class DiskPlan(BaseModel):
    """The file system one run gets, as the parent planned it (part of ait.sandbox.launch.LaunchPlan)."""

    kind: Literal["tmpfs", "image"]
    path: str
    """The run's directory, resolved, that the file system is mounted over."""
    size_bytes: int
    """Its size: the run's disk limit."""
    inodes: int | None = None
    """Its inode count: the run's file limit."""
    image: str | None = None
    """The ext4 image (kind "image"), made by the parent beside `path`."""
    keep: list[str] = Field(default_factory=list)
    """Top-level names copied back into the host's directory when the run ends."""
    noexec: bool = False
    """Mount it noexec."""
    report_fd: int | None = None
    """The pipe the waiter writes its report to (set by whoever starts the launcher)."""
    watch_fd: int | None = None
    """A fanotify group the waiter marks the file system on and reads (made by whoever starts the
    launcher, which holds it until the run has ended: the last close of a group with marks waits an
    RCU grace period, 6-28 ms measured, that the run's exit then never pays)."""


def libc():
    """The C library, errno kept (ctypes.get_errno) for the calls Python has no wrapper for."""
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if libc().mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} on {target}: {os.strerror(err)}")


def attach_loop(image: str) -> tuple[str, int]:
    """A free loop device backed by `image`, clearing itself on its last close or unmount:
    (its path, an open descriptor to close once the file system is mounted)."""
    img = os.open(image, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(32):  # another run may take the free device first (EBUSY): ask again
                device = f"/dev/loop{fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)}"
                fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                try:
                    _configure(fd, img)
                    return device, fd
                except OSError as e:
                    os.close(fd)
                    if e.errno != errno.EBUSY:
                        raise
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(ctl)
    finally:
        os.close(img)


def _configure(fd: int, img: int) -> None:
    info = bytearray(LO_INFO64_SIZE)
    struct.pack_into("I", info, LO_FLAGS_OFFSET, LO_FLAGS_AUTOCLEAR)
    try:
        fcntl.ioctl(fd, LOOP_CONFIGURE, struct.pack("II", img, 0) + bytes(info) + bytes(64))  # struct loop_config
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
        fcntl.ioctl(fd, LOOP_SET_FD, img)  # before Linux 5.8: in two steps
        try:
            fcntl.ioctl(fd, LOOP_SET_STATUS64, bytes(info))
        except OSError:
            fcntl.ioctl(fd, LOOP_CLR_FD, 0)
            raise


def _watch_closes(group: int, fs_fd: int) -> bool:
    """Mark the file system of `fs_fd` on `group`: every file closed after writing there is reported."""
    lib = libc()
    lib.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    return lib.fanotify_mark(group, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_CLOSE_WRITE, fs_fd, None) == 0


def is_full(st: os.statvfs_result) -> bool:
    """Full as a write that failed with ENOSPC leaves it: free space under max(1 MiB, 1% of the size)
    (ext4 keeps a few hundred KB it will not hand out), or no inode left."""
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    return free <= max(FULL_MARGIN, total // 100) or (st.f_files > 0 and st.f_ffree == 0)


class Waiter:
    """The run's file system, seen from the launcher's waiter: `setup` after unshare(CLONE_NEWNS) and
    before the fork, `close_in_child` first thing in the child, `wait` for the child, then `finish`."""

    def __init__(self, plan: DiskPlan):
        self.plan = plan
        self.host_fd: int | None = None
        self.fs_fd: int | None = None
        self.fan_fd: int | None = None
        self.full = False
        self.error: str | None = None

    def setup(self) -> None:
        """Mount the file system over the run's directory in this (new) mount namespace and seed it.
        On failure the run goes on in the host's directory, bounded by the watchdog, and the report
        says why."""
        plan, mounted = self.plan, False
        try:
            _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted from here on reaches the host
            self.host_fd = os.open(plan.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            host = os.fstat(self.host_fd)
            flags = MS_NOSUID | MS_NODEV | (MS_NOEXEC if plan.noexec else 0)
            mode = stat.S_IMODE(host.st_mode) & 0o777
            if plan.kind == "tmpfs":
                options = f"size={plan.size_bytes},mode={mode:o},uid={host.st_uid},gid={host.st_gid}"
                _mount("tmpfs", plan.path, "tmpfs", flags, options + (f",nr_inodes={plan.inodes}" if plan.inodes else ""))
            else:
                device, loop_fd = attach_loop(plan.image or "")
                try:
                    _mount(device, plan.path, "ext4", flags, "noinit_itable")  # a fresh image has no stale inodes
                finally:
                    os.close(loop_fd)  # the mount holds the device now; its unmount clears it
            mounted = True
            self.fs_fd = os.open(plan.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if os.fstat(self.fs_fd).st_dev == host.st_dev:
                raise OSError(errno.EIO, "the file system is not where it was mounted")
            if plan.kind == "image":
                try:
                    os.rmdir("lost+found", dir_fd=self.fs_fd)
                except OSError:
                    pass
                os.fchmod(self.fs_fd, mode)
            skipped: list[str] = []
            copy_tree(self.host_fd, self.fs_fd, None, set(), skipped)
            if skipped:
                raise OSError(errno.EIO, f"seeding it: {skipped[0]}")
            if plan.watch_fd is not None and _watch_closes(plan.watch_fd, self.fs_fd):
                self.fan_fd = plan.watch_fd
        except OSError as e:
            self.error = f"{plan.kind}: {e.strerror or e}"[:300]
            if self.fs_fd is not None:
                os.close(self.fs_fd)
            self.fs_fd = self.fan_fd = None
            if mounted:
                libc().umount2(plan.path.encode(), MNT_DETACH)

    def close_in_child(self) -> None:
        """The run never holds these: the host's directory (uncapped), the watch (its events open files
        as root), the report pipe."""
        for fd in (self.host_fd, self.fs_fd, self.plan.watch_fd, self.plan.report_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def wait(self, pid: int) -> int:
        """Wait for the run's PID 1, watching the file system meanwhile; its wait status."""
        if self.fs_fd is None:
            return os.waitpid(pid, 0)[1]
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        poller = select.poll()
        for fd in (pidfd, self.fan_fd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        try:
            while True:
                poller.poll(POLL_MS)
                self._observe()
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
        finally:
            if pidfd is not None:
                os.close(pidfd)
        self._observe()  # the closes at the run's end: its PID namespace was emptied before PID 1 was reaped
        return status

    def _observe(self) -> None:
        held: list[int] = []
        try:
            while self.fan_fd is not None:  # each event holds its file (and its blocks) until closed here
                try:
                    data = os.read(self.fan_fd, 4096)
                except BlockingIOError:
                    break
                except OSError:
                    break  # EMFILE: the files it would open stay queued; statvfs still sees them
                for offset in range(0, len(data) - EVENT.size + 1, EVENT.size):
                    length, _, _, _, _, fd, _ = EVENT.unpack_from(data, offset)
                    if length != EVENT.size:
                        break
                    if fd >= 0:
                        held.append(fd)
            self.full = self.full or is_full(os.fstatvfs(self.fs_fd))
        finally:
            for fd in held:
                os.close(fd)

    def finish(self) -> None:
        """After the run: copy the kept names back to the host's directory, delete the rest, report."""
        kept, skipped = 0, []
        if self.fs_fd is not None and self.host_fd is not None:
            try:
                kept = copy_tree(self.fs_fd, self.host_fd, self.plan.keep, set(), skipped)
            except OSError as e:
                skipped.append(f"copying out: {e.strerror}")
            if self.plan.kind == "image":
                remove_all(self.fs_fd)
        report = {"fs": self.plan.kind if self.fs_fd is not None else None, "full": self.full, "error": self.error,
                  "kept": kept, "skipped": [s[:200] for s in skipped[:20]]}
        if self.plan.report_fd is not None:
            try:
                os.write(self.plan.report_fd, json.dumps(report).encode()[:MAX_REPORT_BYTES])
            except OSError:
                pass
