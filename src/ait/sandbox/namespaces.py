"""Linux namespaces via unshare(2): a private network (no interfaces, so no network at all,
and abstract unix sockets are private too), IPC and hostname for the run.

As root the namespaces are created directly; as an ordinary user a user namespace comes
first (unprivileged user namespaces), mapping the user to itself. PID and mount namespaces
(what bubblewrap adds) are not created here: Landlock already hides other processes'
/proc entries and everything outside the allow-lists.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = 0x04000000, 0x08000000, 0x10000000, 0x40000000


def enter(ipc: bool = True) -> None:
    """Move this process into new net, IPC (unless ipc=False: CUDA MPS clients share the host's)
    and UTS namespaces (irreversible)."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET | CLONE_NEWUTS | (CLONE_NEWIPC if ipc else 0)
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if flags & CLONE_NEWUSER:  # map ourselves to ourselves so file ownership looks unchanged
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")


def works() -> str:
    """'' if namespaces can be entered here (tried in a throwaway child process), else why not."""
    pid = os.fork()
    if pid == 0:
        try:
            enter()
            os._exit(0 if os.listdir("/sys/class/net") is not None else 1)
        except Exception:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return "" if os.waitstatus_to_exitcode(status) == 0 else "unshare(CLONE_NEWNET|NEWIPC|NEWUTS) refused here"
