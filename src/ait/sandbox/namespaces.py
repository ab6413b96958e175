"""Linux namespaces via unshare(2): a private network (no interfaces, so no network at all,
and abstract unix sockets are private too), IPC and hostname for the run.

As root the namespaces are created directly; as an ordinary user a user namespace comes
first (unprivileged user namespaces), mapping the user to itself. The mount and PID
namespaces that hide the host's files and processes are `ait.sandbox.mounts`.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = 0x04000000, 0x08000000, 0x10000000, 0x40000000


def _unshare(flags: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare({what}): {os.strerror(ctypes.get_errno())}")


def enter_user_namespace() -> None:
    """As an ordinary user: a user namespace mapping us to ourselves, so the namespaces that follow
    can be created (file ownership looks unchanged). A no-op as root."""
    if os.geteuid() == 0:
        return
    uid, gid = os.getuid(), os.getgid()
    _unshare(CLONE_NEWUSER, "CLONE_NEWUSER")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def enter(ipc: bool = True) -> None:
    """Move this process into new net, IPC (unless ipc=False: CUDA MPS clients share the host's)
    and UTS namespaces (irreversible). Call enter_user_namespace first when not root."""
    _unshare(CLONE_NEWNET | CLONE_NEWUTS | (CLONE_NEWIPC if ipc else 0), "CLONE_NEWNET|NEWIPC|NEWUTS")


def works() -> str:
    """'' if namespaces can be entered here (tried in a throwaway child process), else why not."""
    pid = os.fork()
    if pid == 0:
        try:
            enter_user_namespace()
            enter()
            os._exit(0 if os.listdir("/sys/class/net") is not None else 1)
        except Exception:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return "" if os.waitstatus_to_exitcode(status) == 0 else "unshare(CLONE_NEWNET|NEWIPC|NEWUTS) refused here"
