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

The launcher's waiter (the process left outside the run's PID namespace, ait.sandbox.mounts)
sets it up after unshare(CLONE_NEWNS) and before it forks the run: it makes the namespace's
mounts private, mounts the file system over the directory (the private root then binds it like
any write path), seeds it with what the host's directory holds (the request, HOME and TMPDIR)
and keeps a descriptor on each. When the run has ended it copies back only the names the policy
keeps (links never followed, regular files and directories only, sparse files as sparse, a second
hard link skipped, no setuid bit), deletes the rest (so the unmount writes none of it into an
image about to be deleted) and exits: the namespace, its mount and the loop device go with it,
and the parent deletes the image.

It also watches the file system: a fanotify mark (root) hands it each file the run closes after
writing, held open until it is read, so a file written until ENOSPC is seen full even when it was
unlinked and its writer died at once; statvfs is polled besides. The fanotify group and a pipe
for its report come from whoever starts the launcher (the parent, or the zygote's server), which
reads the report once the run has ended: what the waiter saw never goes through a file the run
could write.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import stat
import struct
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MNT_DETACH = 2
LOOP_SET_FD, LOOP_CLR_FD, LOOP_SET_STATUS64, LOOP_CONFIGURE = 0x4C00, 0x4C01, 0x4C04, 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_AUTOCLEAR = 4  # the loop device detaches itself when its file system is unmounted
LO_INFO64_SIZE, LO_FLAGS_OFFSET = 232, 52  # struct loop_info64, and where its lo_flags lies
FAN_CLOSE_WRITE = 0x08
FAN_CLASS_NOTIF, FAN_CLOEXEC, FAN_NONBLOCK = 0, 1, 2
FAN_MARK_ADD, FAN_MARK_FILESYSTEM = 1, 0x100
EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata: len, vers, reserved, metadata_len, mask, fd, pid
POLL_MS = 200
FULL_MARGIN = 2**20  # free space under max(this, 1% of the size) counts as full
MAX_DEPTH = 64  # directories below this depth are not copied
MAX_REPORT_BYTES = 65536
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


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


# --- in the parent ------------------------------------------------------------------------------

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


# --- in the launcher's waiter -------------------------------------------------------------------

def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc().mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
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


def watch_group() -> int | None:
    """A fanotify group for one run's waiter to watch its file system with (None where fanotify
    cannot mark a whole file system: not root). Its events' descriptors open without blocking on a
    FIFO. Pass it to the launcher (DiskPlan.watch_fd) and close it once the run has ended."""
    if os.geteuid() != 0:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_LARGEFILE", 0)
    fan = _libc().fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, flags)
    return fan if fan >= 0 else None


def _watch_closes(group: int, fs_fd: int) -> bool:
    """Mark the file system of `fs_fd` on `group`: every file closed after writing there is reported."""
    libc = _libc()
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    return libc.fanotify_mark(group, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_CLOSE_WRITE, fs_fd, None) == 0


def is_full(st: os.statvfs_result) -> bool:
    """Full as a write that failed with ENOSPC leaves it: free space under max(1 MiB, 1% of the size)
    (ext4 keeps a few hundred KB it will not hand out), or no inode left."""
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    return free <= max(FULL_MARGIN, total // 100) or (st.f_files > 0 and st.f_ffree == 0)


def copy_tree(src: int, dst: int, names: list[str] | None, seen: set, skipped: list[str], depth: int = 0) -> int:
    """Copy `names` (all entries when None) from directory `src` into `dst`: directories and regular
    files only, never through a link, modes without setuid, setgid, sticky or group/world write bits
    (and always readable and writable by their owner), sparse files with their holes, a file already copied under another name skipped (its hard link would count its
    bytes twice on the host). Entries that cannot be copied are named in `skipped`. Returns how many
    entries were copied."""
    copied = 0
    for name in sorted(os.listdir(src)) if names is None else names:
        try:
            st = os.stat(name, dir_fd=src, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as e:
            skipped.append(f"{name}: {e.strerror}")
            continue
        try:
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_DEPTH:
                    skipped.append(f"{name}: deeper than {MAX_DEPTH} directories")
                    continue
                sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
                try:
                    try:
                        os.mkdir(name, 0o700 | (st.st_mode & 0o755), dir_fd=dst)
                    except FileExistsError:
                        pass
                    dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
                    try:
                        copied += 1 + copy_tree(sfd, dfd, None, seen, skipped, depth + 1)
                    finally:
                        os.close(dfd)
                finally:
                    os.close(sfd)
            elif stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    skipped.append(f"{name}: a second link to a file already copied")
                    continue
                seen.add((st.st_dev, st.st_ino))
                _copy_file(src, dst, name)
                copied += 1
            else:
                skipped.append(f"{name}: not a regular file or directory")
        except OSError as e:
            skipped.append(f"{name}: {e.strerror}")
    return copied


def _copy_file(src_dir: int, dst_dir: int, name: str) -> None:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600 | (st.st_mode & 0o755), dir_fd=dst_dir)
        try:
            pos = 0
            while pos < st.st_size:  # data extents only: a sparse file stays sparse on the host
                try:
                    start = os.lseek(src, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        break  # a hole to the end
                    raise
                end = os.lseek(src, start, os.SEEK_HOLE)
                os.lseek(dst, start, os.SEEK_SET)
                while start < end:
                    sent = os.sendfile(dst, src, start, min(end - start, 2**30))
                    if sent == 0:
                        break
                    start += sent
                pos = end
            os.ftruncate(dst, st.st_size)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _remove_all(dir_fd: int) -> None:
    for name in os.listdir(dir_fd):
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except (OSError, RecursionError):
            pass  # what is left is written back at the unmount, into an image deleted next


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
                _libc().umount2(plan.path.encode(), MNT_DETACH)

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
                _remove_all(self.fs_fd)
        report = {"fs": self.plan.kind if self.fs_fd is not None else None, "full": self.full, "error": self.error,
                  "kept": kept, "skipped": [s[:200] for s in skipped[:20]]}
        if self.plan.report_fd is not None:
            try:
                os.write(self.plan.report_fd, json.dumps(report).encode()[:MAX_REPORT_BYTES])
            except OSError:
                pass


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
                if _libc().unshare(0x00020000) != 0:  # CLONE_NEWNS
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
