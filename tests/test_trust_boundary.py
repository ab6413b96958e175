"""The trust boundary (issue 17): agent code runs only where the file system is confined, reaches
no host socket, never sees AIT_HOME; trusted code never follows what a job planted, never lets a
job's own output pick its failure class, and kills a job whole. Whole hostile episodes are in
test_hostile_episodes.py; single hostile jobs in test_hostile_jobs.py."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ait.home import ait_home, hidden_secret
from ait.safe_io import UnsafeFile, read_json_model, read_regular_file, write_new_file
from ait.sandbox import SandboxPolicy, SandboxUnavailable, StartedProcess, run_untrusted
from ait.sandbox import detect as detect_mod
from ait.sandbox.types import Capabilities

ROOT = Path(__file__).resolve().parents[1]
HOST = detect_mod.cached_capabilities()


@pytest.fixture(autouse=True)
def confined(monkeypatch):
    """Every test here is about the sandbox as it refuses: never with the override on."""
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)


def with_layers(**active: bool) -> Capabilities:
    """This host's detected layers with some switched off (never on: a layer the host lacks stays off)."""
    return Capabilities(kernel=HOST.kernel, detector=HOST.detector, layers=[
        layer.model_copy(update={"active": layer.active and active.get(layer.name, True)}) for layer in HOST.layers])


def run_code(tmp_path: Path, code: str, **policy) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    outcome = run_untrusted(["-c", code], cwd=work, timeout_s=60, log_path=tmp_path / "log",
                            policy=SandboxPolicy(write=[str(work)], **policy))
    return outcome.log_tail


@pytest.fixture
def unix_listener():
    """A pathname Unix socket on the host (as docker.sock or a daemon's control pipe would be)."""
    path = Path(f"/tmp/ait-test-{os.getpid()}-{time.monotonic_ns()}.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, accepted
    stop.set()
    thread.join()
    server.close()
    path.unlink(missing_ok=True)


ATTACK = """
import socket
def attempt(label, act):
    try:
        print(label, 'DONE', act())
    except OSError as e:
        print(label, 'REFUSED', type(e).__name__)
attempt('secret', lambda: open({secret!r}).read())
attempt('socket', lambda: socket.socket(socket.AF_UNIX).connect({sock!r}))
attempt('tmp', lambda: open('/tmp/ait-escape-probe', 'w'))
"""


# ---- fail closed -------------------------------------------------------------------------------------

def test_seccomp_capabilities_and_namespaces_alone_are_not_enough(tmp_path, monkeypatch):
    """Finding 2: without Landlock and without a private root the secret is readable, so agent code is
    refused, and `ait doctor` says which layers are missing."""
    from typer.testing import CliRunner

    from ait.cli import app

    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: with_layers(landlock=False, mounts=False))
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match="Landlock or a private mount namespace"):
        run_code(tmp_path, "print('ran')")
    report = CliRunner().invoke(app, ["doctor", "--json"])
    data = __import__("json").loads(report.stdout)
    assert data["agent_code"] == "refused" and set(data["filesystem_layers_missing"]) == {"landlock", "mounts"}


@pytest.mark.skipif(not HOST.active("mounts"), reason="no private root on this host")
def test_the_private_root_alone_confines_the_run(tmp_path, monkeypatch, unix_listener):
    """Without Landlock, the mount namespace alone keeps AIT_HOME and the host's sockets and /tmp away."""
    sock, accepted = unix_listener
    hidden_secret()
    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: with_layers(landlock=False))
    out = run_code(tmp_path, ATTACK.format(secret=str(ait_home() / "hidden_secret"), sock=str(sock)))
    assert "secret REFUSED FileNotFoundError" in out and "tmp REFUSED" in out, out
    assert "socket REFUSED" in out and not accepted, out
    assert hidden_secret() not in out and not Path("/tmp/ait-escape-probe").exists()


@pytest.mark.skipif(not HOST.active("landlock"), reason="needs Landlock")
def test_landlock_without_a_private_root_still_reaches_no_host_socket(tmp_path, monkeypatch, unix_listener):
    """Finding 4: Landlock does not check connect(2) on a pathname socket; seccomp refuses connect."""
    sock, accepted = unix_listener
    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: with_layers(mounts=False))
    out = run_code(tmp_path, ATTACK.format(secret=str(ait_home() / "hidden_secret"), sock=str(sock)))
    assert "socket REFUSED PermissionError" in out and not accepted, out
    assert "secret REFUSED PermissionError" in out, out


def test_every_layer_on_reaches_no_host_socket(tmp_path, unix_listener):
    sock, accepted = unix_listener
    out = run_code(tmp_path, ATTACK.format(secret=str(ait_home() / "hidden_secret"), sock=str(sock)))
    assert "socket REFUSED" in out and "secret REFUSED" in out and not accepted, out


@pytest.mark.skipif(not HOST.active("mounts"), reason="no private root on this host")
def test_the_run_sees_only_its_own_processes_and_a_private_shm(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: with_layers(landlock=False))
    out = run_code(tmp_path, "import os\nprint('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
                             "print('SHM', os.listdir('/dev/shm'))", )
    assert "PIDS [1]" in out and "SHM []" in out, out


def test_an_ancestor_of_ait_home_on_pythonpath_is_refused(tmp_path, monkeypatch):
    """Finding 3: every PYTHONPATH entry becomes readable inside; one above AIT_HOME would expose the secret."""
    monkeypatch.setenv("PYTHONPATH", str(ait_home().parent))
    with pytest.raises(SandboxUnavailable, match="AIT_HOME .* lies inside"):
        run_code(tmp_path, "print('ran')")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # an unrelated entry is fine
    assert "ran" in run_code(tmp_path, "print('ran')")


def test_a_read_path_above_ait_home_is_refused_even_with_a_clean_pythonpath(tmp_path):
    with pytest.raises(SandboxUnavailable, match="AIT_HOME"):
        run_code(tmp_path, "print('ran')", read=[str(ait_home().parent)])


# ---- trusted processes ---------------------------------------------------------------------------------

def test_a_trusted_process_started_in_an_agent_directory_imports_nothing_from_it(tmp_path):
    """Finding 1's class: isolated mode, so a module planted in the working directory is never imported."""
    (tmp_path / "json.py").write_text(f"open({str(tmp_path / 'planted.marker')!r}, 'w')\nraise SystemExit(9)\n")
    outcome = StartedProcess(["-c", "import json, pydantic; print('clean', json.dumps(1))"], cwd=tmp_path,
                             log_path=tmp_path / "log").finish(60)
    assert outcome.returncode == 0 and "clean 1" in outcome.log_tail, outcome.log_tail
    assert not (tmp_path / "planted.marker").exists()


def test_the_log_tail_comes_from_the_pipe_not_from_the_file(tmp_path):
    """Finding 8: what a run printed is reported, whatever it later put at its log's path."""
    log = tmp_path / "run.log"
    code = f"import os\nprint('honest line', flush=True)\nos.unlink({str(log)!r})\nos.symlink('/proc/self/environ', {str(log)!r})"
    outcome = StartedProcess(["-c", code], cwd=tmp_path, log_path=log, env={"PATH": os.environ["PATH"],
                                                                            "SECRET_CANARY": "sk-canary-42"}).finish(60)
    assert "honest line" in outcome.log_tail and "sk-canary-42" not in outcome.log_tail


def test_safe_reads_refuse_links_fifos_and_oversize_files_and_never_quote_content(tmp_path):
    from ait.train.request import TrainOutput

    secret = tmp_path / "secret"
    secret.write_text("sk-very-secret")
    (tmp_path / "link.json").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "big.json").write_bytes(b" " * 2000)
    (tmp_path / "bad.json").write_text('{"checkpoint": "sk-very-secret", "train_seconds": "sk-very-secret"}')
    for name in ("link.json", "fifo.json", "big.json", "bad.json", "missing.json"):
        with pytest.raises(UnsafeFile) as caught:
            read_json_model(tmp_path / name, TrainOutput, 1000)
        assert "sk-very-secret" not in str(caught.value) and name in str(caught.value)
    assert read_regular_file(secret, 100) == b"sk-very-secret"
    write_new_file(tmp_path / "link.json", "new")  # replaces the link, never writes through it
    assert secret.read_text() == "sk-very-secret" and (tmp_path / "link.json").read_text() == "new"


def test_the_eval_refuses_a_checkpoint_that_is_a_link(tmp_path):
    from ait.evals.hidden_eval import CheckpointError, load_checkpoint_tensors
    from ait.train.tiny import tiny_model_path

    real = tiny_model_path()
    (tmp_path / "dir_link").symlink_to(real)
    with pytest.raises(CheckpointError, match="not a plain directory"):
        load_checkpoint_tensors(tmp_path / "dir_link")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").symlink_to(real / "model.safetensors")
    with pytest.raises(CheckpointError, match="cannot be opened as a plain file"):
        load_checkpoint_tensors(ckpt)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match="not valid safetensors"):
        load_checkpoint_tensors(ckpt)


# ---- killing a job whole -------------------------------------------------------------------------------

def test_the_reaper_kills_the_jobs_eval_too(tmp_path):
    """Finding 7: the eval works in RUN_DIR/eval; a deadline kill must reach it."""
    from ait.compute import processes
    from ait.compute.local import kill_job_processes

    class Job:
        job_id, run_dir = "reaped-1", str(tmp_path)

    (tmp_path / "eval").mkdir()
    untracked = StartedProcess(["-c", "import time; time.sleep(120)"], cwd=tmp_path / "eval", log_path=tmp_path / "a")
    tracked = StartedProcess(["-c", "import time; time.sleep(120)"], cwd=tmp_path, log_path=tmp_path / "b")
    processes.track(Job.job_id, tracked.pid)
    try:
        assert kill_job_processes(Job) >= 2
        for proc in (untracked, tracked):
            proc.proc.wait(timeout=10)
        # A process the killed job starts later dies as it is tracked.
        late = StartedProcess(["-c", "import time; time.sleep(120)"], cwd=tmp_path, log_path=tmp_path / "c")
        processes.track(Job.job_id, late.pid)
        late.proc.wait(timeout=10)
    finally:
        processes.forget(Job.job_id)
        for proc in (untracked, tracked):
            proc.kill()


# ---- no committed seed ---------------------------------------------------------------------------------

def test_no_committed_file_fixes_a_hidden_seed():
    """Finding 5: a seed in the repo lets any agent that reads it regenerate the hidden set."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    pattern = re.compile(r"AIT_HIDDEN_SEED\s*[=:]\s*(\$\{AIT_HIDDEN_SEED:-)?['\"]?\d")
    offenders = [f for f in files if (ROOT / f).is_file() and f.endswith((".sh", ".py", ".md", ".toml", ".json",
                                                                           ".yml", ".yaml", ".cfg", ".txt"))
                 and pattern.search((ROOT / f).read_text(errors="replace"))]
    assert not offenders, offenders
