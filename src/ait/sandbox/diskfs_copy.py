"""Copying a run's files between its own file system and the host's directory (ait.sandbox.diskfs).

The launcher's waiter (ait.sandbox.diskfs_waiter) seeds the run's file system from the host's
directory before the run, and after it copies back only the names the policy keeps. What the run
wrote is untrusted: links are never followed, only regular files and directories are copied (no
FIFO, device or socket), modes lose setuid, setgid, sticky and group/world write bits, a sparse
file stays sparse (the host never stores the holes) and a second hard link to a file already
copied is skipped (it would count its bytes twice on the host). Everything works on directory
descriptors, so a name the run swaps for a link meanwhile is refused, not followed.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat

MAX_DEPTH = 64  # directories below this depth are not copied


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


def remove_all(dir_fd: int) -> None:
    """Delete every entry of the directory `dir_fd`, links never followed; what cannot be deleted stays."""
    for name in os.listdir(dir_fd):
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except (OSError, RecursionError):
            pass  # what is left is written back at the unmount, into an image deleted next
