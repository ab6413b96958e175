"""Hostile jobs: agent code that attacks the host from inside the training process.

Each hostile env.py runs its attack at import inside the training job (TRL is imported
there first; the probe never imports it), through a real worker. Every attack must be
contained with a clear error in the job's result, and the same worker must then run a
good job. The probe side of the same sandbox is covered in test_probe.py.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import textwrap
import threading
from pathlib import Path

import pytest

from ait.compute.run_job import run_job
from ait.compute.worker import run_worker
from ait.home import hidden_secret
from ait.job.config import load_job_config
from ait.job.types import FailReason, Job
from ait.queue import JobQueue
from ait.sandbox.detect import cached_capabilities
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"
REFERENCE = ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain"

pytestmark = pytest.mark.skipif(not cached_capabilities().active("landlock"), reason="needs Landlock on this kernel")


def in_training(code: str) -> str:
    """Run `code` at import only inside the training process."""
    return "import sys\nif 'ait.train.fast_grpo' in sys.modules or 'ait.train.grpo' in sys.modules:\n" + textwrap.indent(textwrap.dedent(code), "    ") + "\n"


def make_job(root: Path, name: str, attack: str, budget: float = 120.0) -> Job:
    spec = load_spec(TASK)
    ws = root / name / "ws"
    shutil.copytree(REFERENCE, ws)
    (ws / "env.py").write_text(in_training(attack) + (REFERENCE / "env.py").read_text())
    return Job(job_id=name, run_dir=str(root / name / "run"), workspace=str(ws), task_path=str(TASK),
               config=load_job_config(ws / "job.toml", spec.constraints), time_budget_s=budget, kill_factor=1.0,
               eval_size=4)


@pytest.fixture(scope="module")
def loopback_server():
    """A TCP server on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


# What a refused file access looks like: Landlock says EACCES; in the private root the path does
# not exist (ENOENT) or lies in its read-only skeleton (EROFS).
REFUSED_FILE = ("PermissionError", "FileNotFoundError", "Read-only file system")


def attacks(port: int, root: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (attack code, texts of which the contained error must show one)."""
    outside = root / "outside.txt"
    other_job = root / "other-job" / "run" / "job"
    other_job.mkdir(parents=True, exist_ok=True)
    (other_job / "notes.txt").write_text("other job's private notes")
    hidden_secret()  # make sure the file exists: the attack must meet a refusal, not a missing file
    secret_path = Path(__import__("ait.home").home.ait_home()) / "hidden_secret"
    worker = os.getpid()  # the test process is the worker: the run must not be able to signal it
    return {
        "net": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)", ("PermissionError",)),
        "raw_syscall": ("import ctypes\nfd = ctypes.CDLL(None, use_errno=True).syscall(41, 2, 1, 0)\n"
                        "raise RuntimeError(f'raw socket fd={fd} errno={ctypes.get_errno()}')",
                        ("raw socket fd=-1 errno=1",)),
        "ptrace": (f"import ctypes, os\nr = ctypes.CDLL(None, use_errno=True).ptrace(16, {worker}, 0, 0)\n"
                   "raise RuntimeError(f'ptrace={r} errno={ctypes.get_errno()}')", ("ptrace=-1 errno=1",)),
        "write_outside": (f"open({str(outside)!r}, 'w').write('escaped')", REFUSED_FILE),
        "read_secret": (f"print(open({str(secret_path)!r}).read())", REFUSED_FILE),
        "read_other_job": (f"print(open({str(other_job / 'notes.txt')!r}).read())", REFUSED_FILE),
        "env_secret": ("import os\nraise RuntimeError('key=' + str(os.environ.get('OPENAI_API_KEY')))", ("key=None",)),
        # Landlock's signal scope refuses it; in a PID namespace the worker's pid does not exist.
        "kill_worker": (f"import os, signal\nos.kill({worker}, signal.SIGKILL)", ("PermissionError", "ProcessLookupError")),
        "escape_group": ("import os\nos.setsid()", ("PermissionError",)),
        "fork_bomb": ("import os\nwhile True:\n    os.fork()", ("BlockingIOError", "a fork bomb")),
        "memory_bomb": ("x = b' ' * (64 * 2**30)", ("MemoryError",)),
    }


@pytest.mark.parametrize("name", ["net", "raw_syscall", "ptrace", "write_outside", "read_secret", "read_other_job",
                                  "env_secret", "kill_worker", "escape_group", "fork_bomb", "memory_bomb"])
def test_attacks_in_the_probe_are_contained(name, tmp_path, loopback_server, monkeypatch):
    """The probe runs the same attacks at import (no TRL gate): each is refused with a clear error."""
    from ait.probe.runner import probe_workspace

    port, accepted = loopback_server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret-123")
    code, needles = attacks(port, tmp_path)[name]
    ws = tmp_path / "ws"
    shutil.copytree(REFERENCE, ws)
    (ws / "env.py").write_text(code + "\n" + (REFERENCE / "env.py").read_text())
    report = probe_workspace(ws, load_spec(TASK), timeout_s=30)
    assert not report.valid
    message = " ".join(e.message for e in report.errors)
    if name == "fork_bomb":  # the forked copies race to write the report: any clear refusal will do
        needles = ("BlockingIOError", "report is missing or unreadable", "a fork bomb")
    assert any(n in message for n in needles), message
    assert not accepted and not (tmp_path / "outside.txt").exists()
    assert "sk-parent-secret-123" not in message and hidden_secret() not in message


def test_output_flood_and_sleep_are_cut_off(tmp_path):
    from ait.probe.runner import probe_workspace

    for code in ["while True:\n    print('x' * 100_000)", "import time\ntime.sleep(600)"]:
        ws = tmp_path / f"ws{len(code)}"
        shutil.copytree(REFERENCE, ws)
        (ws / "env.py").write_text(code + "\n")
        report = probe_workspace(ws, load_spec(TASK), timeout_s=4)
        assert [e.check.value for e in report.errors] == ["timeout"] and report.seconds < 15


@pytest.mark.slow  # 40 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_hostile_jobs_are_contained_and_the_worker_serves_the_next_job(tmp_path, loopback_server, monkeypatch):
    port, accepted = loopback_server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret-123")
    chosen = ["kill_worker", "fork_bomb", "memory_bomb", "net", "write_outside", "read_secret"]
    table = attacks(port, tmp_path)
    queue = JobQueue(tmp_path / "queue.sqlite", lease_s=30)
    for name in chosen:
        queue.enqueue(make_job(tmp_path, name, table[name][0]))
    queue.enqueue(make_job(tmp_path, "flood", "while True:\n    print('x' * 100_000)", budget=12.0))
    queue.enqueue(make_job(tmp_path, "good", "pass"))

    assert run_worker(queue, once=True) == len(chosen) + 2
    good = queue.result("good")
    assert good.ok, good.error  # the worker survived every attack and still serves jobs
    for name in chosen:
        r = queue.result(name)
        assert not r.ok and r.fail_reason is not None and any(n in r.error for n in table[name][1]), \
            (name, (r.error or "")[-800:])
    assert queue.result("memory_bomb").fail_reason is FailReason.oom
    # The pids limit stops a fork bomb growing, not churning: the watchdog ends it in seconds.
    bomb = queue.result("fork_bomb")
    assert bomb.fail_reason is FailReason.crash and "a fork bomb" in bomb.error and bomb.train_seconds < 20
    assert queue.result("flood").fail_reason is FailReason.timeout
    flood_log = tmp_path / "flood" / "run" / "logs" / "train.log"
    assert flood_log.stat().st_size < 6_000_000 and b"bytes of output dropped" in flood_log.read_bytes()
    assert not accepted and not (tmp_path / "outside.txt").exists()
    blob = "\n".join(queue.result(n).error or "" for n in chosen)
    assert hidden_secret() not in blob and "sk-parent-secret-123" not in blob


@pytest.mark.slow  # 17 s on 2 shared cores: in CI's `pytest -m slow` pass
def test_scorer_patch_and_pickle_checkpoint_do_not_reach_the_eval(tmp_path):
    # Patching the family's scorer inside training changes nothing: the eval is another process.
    patched = make_job(tmp_path, "patch", "import ait.families.calc_chain as cc\n"
                                          "cc.CalcChain.score = lambda self, response, answer: 1.0")
    result = run_job(patched)
    assert result.ok and result.post == 0.0, result  # the random tiny model honestly scores 0

    # Swap the checkpoint for a pickle that would leave a marker if anything unpickled it.
    marker = tmp_path / "unpickled.marker"
    swap = textwrap.dedent(f"""
        import atexit, os, pickle
        class Boom:
            def __reduce__(self):
                return (open, ({str(marker)!r}, 'w'))
        def swap():
            ckpt = os.path.join(os.getcwd(), 'checkpoint')
            for f in os.listdir(ckpt):
                if f.endswith('.safetensors'):
                    os.remove(os.path.join(ckpt, f))
            with open(os.path.join(ckpt, 'pytorch_model.bin'), 'wb') as fh:
                pickle.dump(Boom(), fh)
        atexit.register(swap)
    """)
    result = run_job(make_job(tmp_path, "pickle", swap))
    assert not result.ok and "safetensors" in result.error
    assert not marker.exists()


def test_training_cannot_reach_the_eval_that_waits_beside_it(tmp_path):
    """The eval starts with training and waits; its request and report live where training cannot write."""
    attack = """
        import os
        eval_dir = os.path.join(os.path.dirname(os.getcwd()), 'eval')
        outcome = []
        for name, act in [('request', lambda: open(os.path.join(eval_dir, 'eval_request.json'), 'w').write('{}')),
                          ('link', lambda: os.symlink('/etc/passwd', os.path.join(eval_dir, 'eval.json')))]:
            try:
                act()
                outcome.append(name + ':done')
            except OSError as e:
                outcome.append(name + ':' + type(e).__name__)
        print('EVAL-FILES', *outcome, flush=True)
    """
    result = run_job(make_job(tmp_path, "evalfiles", attack))
    assert result.ok and result.post is not None, result.error
    log = (tmp_path / "evalfiles" / "run" / "logs" / "train.log").read_text()
    assert re.search(r"EVAL-FILES request:(PermissionError|FileNotFoundError) link:(PermissionError|FileNotFoundError)",
                     log), log[-2000:]
    assert not (tmp_path / "evalfiles" / "run" / "eval" / "eval.json").is_symlink()


def test_a_failed_training_stops_the_waiting_eval(tmp_path):
    job = make_job(tmp_path, "crash", "raise SystemExit(7)")
    result = run_job(job)
    assert not result.ok and "SystemExit: 7" in result.error
    request = str(Path(job.run_dir) / "eval" / "eval_request.json")
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and request in (proc / "cmdline").read_bytes().decode(errors="replace"):
                alive.append(proc.name)
        except OSError:
            pass
    assert not alive, f"eval processes left waiting: {alive}"
