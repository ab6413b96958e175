"""Dropping Linux capabilities: root without capabilities cannot bypass rlimits, load modules,
override file permissions or change its uid. Applied only when running as root."""

from __future__ import annotations

import ctypes

PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_all() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets (irreversible)."""
    libc = ctypes.CDLL(None, use_errno=True)
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # until EINVAL: past the last capability
        cap += 1
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _Header(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
