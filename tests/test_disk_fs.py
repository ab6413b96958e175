"""A run's own file system, capped at its disk limit by the kernel (ait.sandbox.diskfs).

The watchdog's walk every 2 s missed what a run holds in files it unlinked but keeps open, and a fast
writer passes any limit between two walks: the probe held 2 GiB against its 1 GiB limit and the host
lost them. Where the private root is built, a run's directory is a tmpfs (the probe) or a
loop-mounted ext4 image (training) of exactly its disk limit: a write past it fails with ENOSPC,
however it is made (unlinked, fallocated, sparse, hard-linked, through a descriptor handed to
another process), the host never loses more than the limit, the failure is the job's and says
"disk", and only what is kept on purpose survives the run.
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ait.compute.run_job import classify_failure
from ait.job.types import FailReason
from ait.sandbox import Limits, RunOutcome, SandboxPolicy, run_untrusted
from ait.sandbox import diskfs, diskfs_copy, diskfs_waiter
from ait.sandbox.detect import cached_capabilities, disk_detail

LIMIT = 32 * 2**20
ATTEMPT = 2 * 2**30  # what each hostile run tries to write: without a cap, far past the limit
SLACK = 256 * 2**20  # other processes share this disk; the drop must stay well under ATTEMPT


def kinds_here() -> list[str]:
    return cached_capabilities().disk_fs


def need(kind: str | None) -> None:
    if kind is not None and kind not in kinds_here():
        layer = next((layer for layer in cached_capabilities().layers if layer.name == "disk"), None)
        pytest.skip(f"no capped {kind} here: {layer.detail if layer else 'no disk layer'}")


class FreeSpace:
    """The lowest free space of the file system holding `path`, sampled every 5 ms while running;
    and whether a mount under `path` was ever seen from here (the run's must stay in its namespace)."""

    def __init__(self, path: Path):
        self.path = path
        self.start = self.free()
        self.lowest, self._stop = self.start, threading.Event()
        self.mounts_seen: set[str] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(0.005):
            self.lowest = min(self.lowest, self.free())
            polls += 1
            if polls % 10 == 0:
                with open("/proc/self/mountinfo") as f:
                    self.mounts_seen.update(line.split()[4] for line in f if str(self.path) in line.split()[4])

    def __enter__(self) -> FreeSpace:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def dropped(self) -> int:
        return self.start - self.lowest


# Each writes past the limit one way, then reports how far it got (and the errno) on one line.
FILL = {
    "unlinked": """
        f = open("hidden", "wb", buffering=0)
        os.unlink("hidden")  # no walk of the directory sees it now
        try:
            while written < ATTEMPT:
                written += f.write(CHUNK)
        except OSError as e:
            err = e.errno
    """,
    "fallocate": """
        fd = os.open("reserved", os.O_RDWR | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, ATTEMPT)  # all at once: refused
        except OSError as e:
            first = e.errno
        try:
            while written < ATTEMPT:  # a piece at a time: fills the file system, then refused
                os.posix_fallocate(fd, written, len(CHUNK))
                written += len(CHUNK)
        except OSError as e:
            err = e.errno
        assert first == errno.ENOSPC, first
    """,
    "sparse": """
        fd = os.open("sparse", os.O_RDWR | os.O_CREAT)
        try:
            for i in range(60):  # 1 MiB every 64 MiB: a 3.8 GB file of 60 MiB of data
                written += os.pwrite(fd, CHUNK, i * 64 * 2**20)
        except OSError as e:
            err = e.errno
    """,
    "passed": """
        fd = os.open("a", os.O_RDWR | os.O_CREAT)
        os.link("a", "b")
        os.unlink("a"); os.unlink("b")  # two names, both gone
        r, w = os.pipe()
        if os.fork() == 0:  # the descriptor handed to another process, which writes
            n, code = 0, 0
            try:
                while n < ATTEMPT:
                    n += os.write(fd, CHUNK)
            except OSError as e:
                code = e.errno
            os.write(w, json.dumps([n, code]).encode())
            os._exit(0)
        os.close(fd)
        written, err = json.loads(os.read(r, 100))
    """,
}

FILL_PRELUDE = """
import errno, json, os, sys
ATTEMPT, CHUNK = {attempt}, b"x" * 2**20
written, err, first = 0, 0, 0
"""
FILL_REPORT = """
st = os.statvfs(".")
print("FILLED " + json.dumps({"written": written, "errno": err, "nosuid": bool(st.f_flag & os.ST_NOSUID),
                              "nodev": bool(st.f_flag & os.ST_NODEV), "noexec": bool(st.f_flag & os.ST_NOEXEC)}),
      flush=True)
"""


def fill_code(how: str) -> str:
    return FILL_PRELUDE.format(attempt=ATTEMPT) + textwrap.dedent(FILL[how]) + FILL_REPORT


def filled(outcome: RunOutcome) -> dict:
    lines = [line for line in outcome.log_tail.splitlines() if line.startswith("FILLED ")]
    assert lines, outcome.log_tail
    return json.loads(lines[-1][len("FILLED "):])


def policy_for(run: Path, kind: str | None, keep: list[str], **limits) -> SandboxPolicy:
    return SandboxPolicy(write=[str(run)], disk_fs=kind, keep=keep,
                         limits=Limits(disk_bytes=LIMIT, disk_files=1000, **limits))


@pytest.mark.parametrize("how", sorted(FILL))
@pytest.mark.parametrize("kind", ["tmpfs", "image"])
def test_a_write_past_the_limit_fails_with_enospc_and_the_host_keeps_its_space(tmp_path, kind, how):
    need(kind)
    run = tmp_path / "run"
    run.mkdir()
    with FreeSpace(tmp_path) as space:
        outcome = run_untrusted(["-c", fill_code(how)], cwd=run, timeout_s=120, log_path=tmp_path / "log",
                                policy=policy_for(run, kind, keep=[]))
    report = filled(outcome)
    assert outcome.returncode == 0, outcome.log_tail
    assert report["errno"] == 28 and report["written"] <= LIMIT, report  # ENOSPC, within the limit
    assert outcome.disk_fs == kind and outcome.disk_full, outcome
    assert outcome.watchdog is None  # the kernel bound it, long before a walk would have
    assert classify_failure(RunOutcome(1, False, 1.0, "", disk_full=outcome.disk_full)) is FailReason.disk
    assert space.dropped < LIMIT + SLACK, f"the host lost {space.dropped / 2**20:.0f} MiB"
    assert not space.mounts_seen  # the run's file system never showed in the host's mount table
    assert report["nosuid"] and report["nodev"] and report["noexec"] == (kind == "tmpfs"), report
    assert sorted(os.listdir(tmp_path)) == ["log", "run"]  # the image is gone
    assert os.listdir(run) == []  # HOME and TMPDIR were scratch


KEEPS = r"""
import os, stat
open("kept.txt", "w").write("kept")
os.makedirs("out/sub/deeper")
open("out/sub/deeper/weights", "wb").write(b"w" * 5000)
with open("out/sparse", "wb") as f:  # 8 MiB apparent, 4 KiB of data
    f.seek(8 * 2**20 - 4096); f.write(b"s" * 4096)
open("out/setuid", "w").write("#!/bin/sh\n")
os.chmod("out/setuid", 0o6755)
os.symlink("/etc/passwd", "out/link")
os.link("out/sub/deeper/weights", "out/hardlink")
os.mkfifo("out/fifo")
open("scratch.bin", "wb").write(b"x" * 100000)
open(os.path.join(os.environ["HOME"], "cache"), "w").write("home")
open(os.path.join(os.environ["TMPDIR"], "tmp"), "w").write("tmp")
open("request.json", "w").write("overwritten")  # its own copy: the host's stays as it was
seen = {}
for path in ("/dev/loop-control", "/dev/loop0", os.path.join(os.path.dirname(os.getcwd()), ".run.ait-disk.img")):
    try:
        open(path, "rb").close()
        seen[path] = "opened"
    except OSError as e:
        seen[path] = type(e).__name__
print("SEEN", seen, flush=True)
"""


@pytest.mark.parametrize("kind", [None, "tmpfs", "image"])
def test_what_is_kept_survives_and_scratch_does_not(tmp_path, kind):
    need(kind)
    run = tmp_path / "run"
    run.mkdir()
    (run / "request.json").write_text("{}")  # the parent's, there before the run
    outcome = run_untrusted(["-c", KEEPS], cwd=run, timeout_s=120, log_path=tmp_path / "log",
                            policy=policy_for(run, kind, keep=["kept.txt", "out", "missing"]))
    assert outcome.returncode == 0, outcome.log_tail
    assert outcome.disk_fs == kind and not outcome.disk_full
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert "kept.txt" in left and "request.json" in left and "out/sub/deeper" in left
    assert not {"scratch.bin", ".home", ".tmp", "missing"} & set(left), left  # scratch is gone, wherever it was
    assert (run / "kept.txt").read_text() == "kept"
    assert (run / "out/sparse").stat().st_size == 8 * 2**20
    if kind is None:
        assert (run / "request.json").read_text() == "overwritten"  # the host's directory itself
        return
    assert (run / "request.json").read_text() == "{}"
    assert "'/dev/loop-control': 'FileNotFoundError'" in outcome.log_tail  # no loop device, no image inside
    assert "'opened'" not in outcome.log_tail, outcome.log_tail
    assert (run / "out/sparse").stat().st_blocks * 512 <= 64 * 1024  # copied as sparse
    assert not (run / "out/link").exists() and not (run / "out/link").is_symlink()  # links never followed
    assert not (run / "out/fifo").exists()
    assert not (run / "out/setuid").stat().st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH)
    # Two links to one file: its bytes are copied once (the first name met), the other name is skipped.
    assert sum(1 for p in run.rglob("*") if p.is_file() and p.read_bytes() == b"w" * 5000) == 1
    assert sorted(os.listdir(tmp_path)) == ["log", "run"]  # the image is gone


def test_no_loop_device_stays_behind(tmp_path):
    need("image")
    run = tmp_path / "run"
    run.mkdir()
    outcome = run_untrusted(["-c", "open('f', 'w').write('x')"], cwd=run, timeout_s=60, log_path=tmp_path / "log",
                            policy=policy_for(run, "image", keep=[]))
    assert outcome.returncode == 0 and outcome.disk_fs == "image", outcome
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            assert str(tmp_path) not in backing.read_text(), backing
        except FileNotFoundError:
            pass  # detached meanwhile


def test_the_probe_that_fills_its_disk_is_refused_as_disk(tmp_path, monkeypatch):
    """Through the probe's warm zygote, as an episode runs it: env.py writes into an unlinked file."""
    need("tmpfs")
    from ait.probe import runner
    from ait.probe.types import ProbeCheck
    from ait.spec import load_spec
    from tests.test_probe import TASK, build_workspace

    monkeypatch.setattr(runner, "PROBE_LIMITS", runner.PROBE_LIMITS.model_copy(update={"disk_bytes": LIMIT}))
    ws = build_workspace(tmp_path / "ws", append=f"""
        import os as _os
        _held = open(_os.path.join(_os.environ["TMPDIR"], "held"), "wb", buffering=0)
        _os.unlink(_held.name)
        for _ in range({ATTEMPT // 2**20}):
            _held.write(b"x" * 2**20)
    """)
    with FreeSpace(tmp_path) as space:
        report = runner.probe_workspace(ws, load_spec(TASK), timeout_s=120)
    assert not report.valid
    assert report.errors[0].check is ProbeCheck.disk, report.errors
    assert "ran out of disk" in report.errors[0].message and "32 MiB" in report.errors[0].message
    assert space.dropped < LIMIT + SLACK


def test_a_training_job_that_fills_its_disk_fails_as_disk(tmp_path, monkeypatch):
    """Through run_job, as a worker runs it: training writes into a file it unlinked, past its limit."""
    need("image")
    from ait.compute import run_job as run_job_mod
    from tests.test_hostile_jobs import make_job

    policy_for_job = run_job_mod.train_policy

    def small_disk(*args, **kwargs):
        policy = policy_for_job(*args, **kwargs)
        assert policy.disk_fs == "image"
        return policy.model_copy(update={"limits": policy.limits.model_copy(update={"disk_bytes": LIMIT})})

    monkeypatch.setattr(run_job_mod, "train_policy", small_disk)
    fill = f"""
        import os
        held = open(os.path.join(os.getcwd(), "held"), "wb", buffering=0)
        os.unlink(held.name)
        for _ in range({ATTEMPT // 2**20}):
            held.write(b"x" * 2**20)
    """
    job = make_job(tmp_path, "fill", fill)
    with FreeSpace(tmp_path) as space:
        result = run_job_mod.run_job(job)
    assert not result.ok and result.fail_reason is FailReason.disk, (result.fail_reason, result.error)
    assert "ran out of disk" in result.error and "No space left on device" in result.error
    assert space.dropped < LIMIT + SLACK, f"the host lost {space.dropped / 2**20:.0f} MiB"
    run_dir = Path(job.run_dir)
    assert not any((run_dir / "job").iterdir())  # what it wrote was deleted
    assert not any(p.name.endswith(".ait-disk.img") for p in run_dir.iterdir())


def test_a_disk_verdict_is_the_jobs_own_failure():
    assert classify_failure(RunOutcome(1, False, 1.0, "", disk_full=True)) is FailReason.disk
    assert classify_failure(RunOutcome(-9, False, 1.0, "", watchdog="over", watchdog_rule="disk")) is FailReason.disk
    assert classify_failure(RunOutcome(None, True, 1.0, "", disk_full=True)) is FailReason.timeout
    from ait.job.types import JobResult
    from ait.reward import died

    assert died(JobResult(job_id="j", ok=False, fail_reason=FailReason.disk))  # not infra: it scores as a dead job


def test_the_disk_layer_names_the_bound_that_applies():
    assert "watchdog" in disk_detail([], {}, "no mount namespace")
    only_tmpfs = disk_detail(["tmpfs"], {"disk_image": "not root: loop devices need it"}, "")
    assert "tmpfs" in only_tmpfs and "training is bounded by the watchdog" in only_tmpfs and "not root" in only_tmpfs
    both = disk_detail(["tmpfs", "image"], {}, "")
    assert "ENOSPC" in both and "watchdog" not in both
    layer = next(layer for layer in cached_capabilities().layers if layer.name == "disk")
    assert layer.active == bool(kinds_here()) and layer.detail


def test_without_a_kind_here_the_watchdog_is_the_bound(tmp_path, monkeypatch):
    from ait.sandbox import detect

    caps = cached_capabilities()
    monkeypatch.setattr(detect, "cached_capabilities", lambda refresh=False: caps.model_copy(update={"disk_fs": []}))
    run = tmp_path / "run"
    run.mkdir()
    outcome = run_untrusted(["-c", "open('f', 'w').write('x')"], cwd=run, timeout_s=60, log_path=tmp_path / "log",
                            policy=policy_for(run, "image", keep=["f"]))
    assert outcome.returncode == 0 and outcome.disk_fs is None and (run / "f").read_text() == "x"


def test_copy_tree_keeps_holes_and_refuses_links(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    with open(src / "sparse", "wb") as f:
        f.seek(2**30)
        f.write(b"end")
    (src / "link").symlink_to("/etc/passwd")
    os.link(src / "sparse", src / "again")
    s, d = os.open(src, os.O_RDONLY | os.O_DIRECTORY), os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    skipped: list[str] = []
    try:
        copied = diskfs_copy.copy_tree(s, d, None, set(), skipped)
    finally:
        os.close(s)
        os.close(d)
    names = sorted(os.listdir(dst))
    assert copied == 1 and len(names) == 1, names
    out = dst / names[0]
    assert out.stat().st_size == 2**30 + 3 and out.stat().st_blocks * 512 <= 1 << 20
    with open(out, "rb") as f:
        f.seek(2**30)
        assert f.read() == b"end"
    assert any("link" in s and "not a regular file" in s for s in skipped)
    assert any("second link" in s for s in skipped)


def test_the_names_that_moved_out_of_diskfs_are_still_importable_from_it():
    """diskfs.py was split (diskfs_waiter, diskfs_copy); callers outside the package import from the old path."""
    assert diskfs.DiskPlan is diskfs_waiter.DiskPlan and diskfs.Waiter is diskfs_waiter.Waiter
    assert (diskfs.attach_loop, diskfs.is_full, diskfs.MAX_REPORT_BYTES) == (
        diskfs_waiter.attach_loop, diskfs_waiter.is_full, diskfs_waiter.MAX_REPORT_BYTES)
    assert diskfs.copy_tree is diskfs_copy.copy_tree and diskfs.MAX_DEPTH == diskfs_copy.MAX_DEPTH
