"""The sandbox's models: what a run may touch, and which isolation layers this host has."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator


class Limits(BaseModel):
    cpu_s: int = Field(default=3600, ge=1)
    """RLIMIT_CPU: CPU seconds before SIGXCPU/SIGKILL."""
    file_bytes: int = Field(default=4 * 2**30, ge=1)
    """RLIMIT_FSIZE: largest file the run may write."""
    open_files: int = Field(default=1024, ge=16)
    """RLIMIT_NOFILE."""
    processes: int = Field(default=128, ge=8)
    """Processes and threads the run may have (pids cgroup, else RLIMIT_NPROC)."""
    memory_bytes: int | None = Field(default=12 * 2**30, ge=2**28)
    """Host memory the whole run may use (memory cgroup, where one is writable)."""
    address_space_bytes: int | None = Field(default=16 * 2**30, ge=2**28)
    """RLIMIT_AS; None where a GPU is used (CUDA maps huge virtual ranges)."""
    disk_bytes: int | None = Field(default=16 * 2**30, ge=2**20)
    """Bytes the run may keep in its writable directories, all files together (RLIMIT_FSIZE
    bounds one file, not a thousand). Where the run writes to a file system of its own
    (SandboxPolicy.disk_fs) this is that file system's size: a write past it fails with ENOSPC.
    Elsewhere ait's watchdog checks it every few seconds, so a fast writer may pass it by a few
    GB before it is killed."""
    disk_files: int | None = Field(default=100_000, ge=100)
    """Files and directories the run may create there (a million empty files fill a disk's inodes):
    the inode count of the run's own file system, else the watchdog's count."""


class SandboxPolicy(BaseModel):
    """What one untrusted run may do. Paths are absolute."""

    read: list[str] = Field(default_factory=list)
    """Extra read-only paths (the workspace, model weights)."""
    write: list[str] = Field(default_factory=list)
    """Writable paths (the job directory); everything else is read-only or invisible."""
    gpu: bool = False
    """Bind GPU device nodes in and lift the address-space limit."""
    mps_pipe_dir: str | None = None
    """With gpu: the CUDA MPS daemon's pipe directory, so packed jobs share the GPU through MPS
    (kernels of several processes run at once instead of time-sliced). The run may then reach
    that directory (and may connect to its sockets), and keeps the host's IPC namespace, as MPS
    clients must; only where the private root hides every other socket (ait.sandbox.gpu_settings)."""
    limits: Limits = Field(default_factory=Limits)
    """Resource limits."""
    disk_fs: Literal["tmpfs", "image"] | None = None
    """Where this host has one (ait.sandbox.diskfs), what the run writes in write[0] goes to a file
    system of its own, limits.disk_bytes in size, mounted over that directory in the run's mount
    namespace: "tmpfs" (memory, charged to the run's memory limit: for a small disk limit, the
    probe's) or "image" (an ext4 image on a loop device, disk-backed: training's). None: write[0]
    is the host's directory itself, bounded by the watchdog alone."""
    keep: list[str] | None = None
    """Top-level names in write[0] that outlive the run (the checkpoint, the report). With a list,
    everything else the run wrote there is gone when it ends: with its own file system, which only
    these names are copied out of; without one, removed after it (regular files that were there
    before the run, such as its request, stay). None: everything stays (never with disk_fs, whose
    file system goes with the run)."""

    @model_validator(mode="after")
    def _keep_with_disk_fs(self) -> "SandboxPolicy":
        if self.disk_fs is not None and self.keep is None:
            raise ValueError("disk_fs needs keep: the names that outlive the run's own file system")
        if any(not name or "/" in name or name in (".", "..") for name in self.keep or []):
            raise ValueError("keep holds top-level names in write[0], without '/'")
        return self


class Layer(BaseModel):
    name: str
    """Layer name (session, rlimits, env, landlock, mounts, seccomp, capabilities, cgroups, namespaces)."""
    active: bool
    """Whether it is applied on this host."""
    isolating: bool
    """Whether it confines what code can reach (not just how long it runs)."""
    detail: str
    """Why it is (not) active, e.g. the Landlock ABI."""


class Capabilities(BaseModel):
    """Detected once per host and kernel; cached in AIT_HOME/sandbox.json."""

    kernel: str
    """uname release the detection ran on."""
    detector: int = 0
    """Version of the detection code; a cache from another version is detected again."""
    layers: list[Layer]
    """Every layer, active or not."""
    disk_fs: list[str] = Field(default_factory=list)
    """The size-capped file systems a run can be given here ("tmpfs", "image"; ait.sandbox.diskfs)."""

    def active(self, name: str) -> bool:
        return any(layer.name == name and layer.active for layer in self.layers)

    @property
    def isolating(self) -> bool:
        """Agent code may run here: a layer that confines the file system is active (Landlock or a
        private mount namespace), so the secret and the hidden set stay unreadable. seccomp,
        dropped capabilities or a network namespace alone do not keep a file from being read."""
        return any(self.active(name) for name in FILESYSTEM_LAYERS)


FILESYSTEM_LAYERS = ("landlock", "mounts")
"""The layers that keep files outside the allow-lists unreadable; agent code runs only under one."""
