"""seccomp-bpf: syscalls agent code never needs, refused with EPERM.

No network sockets (only AF_UNIX, which Python and torch use internally), and no connect(2):
a Unix socket can be paired (socketpair) or listened on, never connected to a path, so a
daemon's socket on the host (docker.sock, an MPS or nscd pipe) is out of reach even where no
private mount namespace hides it. A CUDA MPS client must connect to its daemon: with
`allow_connect` the filter lets it (the private root then holds only the MPS pipe directory). No ptrace,
no mounts or new namespaces, no bpf, no kernel keyring, no module loading, no reading
other processes' memory, and no leaving the process group (setsid/setpgid), so a
timeout's group kill reaches every process the run started. A classic-BPF program built here and installed with prctl;
it is inherited across fork and exec and cannot be removed.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K, AND_K = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
AF_UNIX, SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 1, 5, 0xF
CONNECT = {"x86_64": 42, "aarch64": 203}
NEW_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET

ARCH = {  # audit arch, socket, clone, clone3, denied syscalls
    "x86_64": (0xC000003E, 41, 56, 435, {
        "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321,
        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "process_vm_readv": 310,
        "process_vm_writev": 311, "perf_event_open": 298, "unshare": 272, "setns": 308, "userfaultfd": 323,
        "io_uring_setup": 425, "open_by_handle_at": 304, "pidfd_getfd": 438, "mount_setattr": 442,
        "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428, "fspick": 433, "swapon": 167,
        "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173, "kcmp": 312,
        "setsid": 112, "setpgid": 109}),
    "aarch64": (0xC00000B7, 198, 220, 435, {
        "ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280, "keyctl": 219,
        "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "process_vm_readv": 270, "process_vm_writev": 271,
        "perf_event_open": 241, "unshare": 97, "setns": 268, "userfaultfd": 282, "io_uring_setup": 425,
        "open_by_handle_at": 265, "pidfd_getfd": 438, "mount_setattr": 442, "fsopen": 430, "fsmount": 432,
        "move_mount": 429, "open_tree": 428, "fspick": 433, "swapon": 224, "swapoff": 225, "reboot": 142,
        "kcmp": 272, "setsid": 157, "setpgid": 154}),
}


class SeccompError(OSError):
    """The filter could not be installed."""


def supported() -> bool:
    return platform.machine() in ARCH


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None, allow_connect: bool = False) -> bytes:
    """The BPF program. Without `allow_connect`: no connect(2), and Unix sockets only of the
    connection-oriented types (a datagram socket could send to a path without connecting)."""
    machine = machine or platform.machine()
    audit_arch, nr_socket, nr_clone, nr_clone3, denied = ARCH[machine]
    if not allow_connect:
        denied = {**denied, "connect": CONNECT[machine]}
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    prog = [
        _insn(LD_W_ABS, 0, 0, 4),                 # A = arch
        _insn(JEQ_K, 1, 0, audit_arch),           # native arch: continue
        _insn(RET_K, 0, 0, eperm),                # any other ABI (x32, 32-bit compat): refuse
        _insn(LD_W_ABS, 0, 0, 0),                 # A = syscall number
        _insn(JGE_K, 0, 1, 0x40000000),           # x32 syscall numbers on x86_64
        _insn(RET_K, 0, 0, eperm),
    ]
    for nr in sorted(denied.values()):
        prog += [_insn(JEQ_K, 0, 1, nr), _insn(RET_K, 0, 0, eperm)]
    # clone3 passes its flags in memory BPF cannot read: ENOSYS makes libc fall back to clone.
    prog += [_insn(JEQ_K, 0, 1, nr_clone3), _insn(RET_K, 0, 0, enosys)]
    # socket(domain, type, ...): AF_UNIX only (and only stream or seqpacket without connect).
    if allow_connect:
        prog += [
            _insn(JEQ_K, 0, 4, nr_socket),
            _insn(LD_W_ABS, 0, 0, 16),            # A = low 32 bits of args[0]
            _insn(JEQ_K, 1, 0, AF_UNIX),
            _insn(RET_K, 0, 0, eperm),
            _insn(RET_K, 0, 0, RET_ALLOW),
        ]
    else:
        prog += [
            _insn(JEQ_K, 0, 9, nr_socket),
            _insn(LD_W_ABS, 0, 0, 16),            # A = domain
            _insn(JEQ_K, 1, 0, AF_UNIX),
            _insn(RET_K, 0, 0, eperm),
            _insn(LD_W_ABS, 0, 0, 24),            # A = type (low 32 bits of args[1])
            _insn(AND_K, 0, 0, SOCK_TYPE_MASK),   # without SOCK_NONBLOCK / SOCK_CLOEXEC
            _insn(JEQ_K, 2, 0, SOCK_STREAM),
            _insn(JEQ_K, 1, 0, SOCK_SEQPACKET),
            _insn(RET_K, 0, 0, eperm),
            _insn(RET_K, 0, 0, RET_ALLOW),
        ]
    # clone(flags, ...): no new namespaces.
    prog += [
        _insn(JEQ_K, 0, 3, nr_clone),
        _insn(LD_W_ABS, 0, 0, 16),
        _insn(JSET_K, 0, 1, NEW_NAMESPACE_FLAGS),
        _insn(RET_K, 0, 0, eperm),
        _insn(RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)


def install(allow_connect: bool = False) -> None:
    """Install the filter on this process (irreversible; inherited by children and exec)."""
    if not supported():
        raise SeccompError(f"no seccomp table for {platform.machine()}")
    code = build_filter(allow_connect=allow_connect)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SeccompError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
