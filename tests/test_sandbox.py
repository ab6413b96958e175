"""The sandbox seam: layer detection, refusal without isolation, the unsafe override."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ait.cli import app
from ait.sandbox import SandboxPolicy, SandboxUnavailable, run_untrusted
from ait.sandbox import detect as detect_mod
from ait.sandbox.seccomp import ARCH, build_filter
from ait.sandbox.types import Capabilities, Layer


def no_isolation() -> Capabilities:
    return Capabilities(kernel="test", layers=[Layer(name="session", active=True, isolating=False, detail=""),
                                               Layer(name="landlock", active=False, isolating=True, detail="off")])


def test_doctor_reports_every_layer_as_json():
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    names = [layer["name"] for layer in json.loads(result.stdout)["layers"]]
    assert names == ["session", "rlimits", "env", "landlock", "mounts", "disk", "seccomp", "capabilities", "cgroups",
                     "namespaces"]


def test_agent_code_is_refused_without_an_isolating_layer(tmp_path, monkeypatch):
    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: no_isolation())
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)
    policy = SandboxPolicy(write=[str(tmp_path)])
    with pytest.raises(SandboxUnavailable, match="--unsafe-no-sandbox"):
        run_untrusted(["-c", "print('hi')"], cwd=tmp_path, timeout_s=10, log_path=tmp_path / "log", policy=policy)
    monkeypatch.setenv("AIT_UNSAFE_NO_SANDBOX", "1")
    outcome = run_untrusted(["-c", "print('ran unconfined')"], cwd=tmp_path, timeout_s=30,
                            log_path=tmp_path / "log", policy=policy)
    assert outcome.returncode == 0 and "ran unconfined" in outcome.log_tail


def test_unsafe_flag_on_the_command_line_sets_the_override(monkeypatch):
    monkeypatch.setenv("AIT_UNSAFE_NO_SANDBOX", "0")  # recorded, so teardown removes what the CLI sets
    import os

    CliRunner().invoke(app, ["--unsafe-no-sandbox", "doctor", "--json"])
    assert os.environ.get("AIT_UNSAFE_NO_SANDBOX") == "1"
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX")


@pytest.mark.parametrize("machine", sorted(ARCH))
def test_seccomp_program_is_well_formed(machine):
    prog = build_filter(machine)
    assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 4096  # classic BPF: 8-byte instructions, bounded length


def test_sandboxed_run_cannot_write_outside_its_directory(tmp_path):
    if not detect_mod.cached_capabilities().active("landlock"):
        pytest.skip("needs Landlock")
    inside, outside = tmp_path / "inside", tmp_path / "outside.txt"
    inside.mkdir()
    code = (f"open({str(inside / 'ok.txt')!r}, 'w').write('ok')\n"
            f"open({str(outside)!r}, 'w').write('escaped')")
    outcome = run_untrusted(["-c", code], cwd=inside, timeout_s=30, log_path=tmp_path / "log",
                            policy=SandboxPolicy(write=[str(inside)]))
    assert (inside / "ok.txt").read_text() == "ok"
    # Refused by Landlock (EACCES) or absent from the private root's read-only skeleton (EROFS).
    assert not outside.exists() and ("PermissionError" in outcome.log_tail or "Read-only file system" in outcome.log_tail)


def test_episode_refuses_to_start_without_isolation_and_records_the_override(tmp_path, monkeypatch):
    from ait.harness.episode import run_episode
    from ait.harness.types import EpisodeConfig
    from ait.spec import load_spec

    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: no_isolation())
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)
    spec_path = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain.json"

    class Silent:
        name = "silent"

        def reset(self, spec):
            pass

        def act(self, messages, tools):
            from ait.harness.types import Message

            return Message(role="assistant", content="nothing to do")

    with pytest.raises(SandboxUnavailable):
        run_episode(load_spec(spec_path), spec_path, Silent(), EpisodeConfig(max_nudges=0), runs_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing was started
    monkeypatch.setenv("AIT_UNSAFE_NO_SANDBOX", "1")
    result = run_episode(load_spec(spec_path), spec_path, Silent(), EpisodeConfig(max_nudges=0), runs_dir=tmp_path)
    manifest = json.loads((__import__("pathlib").Path(result.run_dir) / "manifest.json").read_text())
    assert manifest["sandbox"]["unsafe_no_sandbox"] is True


def test_sandboxed_run_gets_its_own_network_and_ipc_namespaces(tmp_path):
    import os

    if not detect_mod.cached_capabilities().active("namespaces"):
        pytest.skip("namespaces unavailable here")
    code = "import os\nprint(os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/ipc'))"
    outcome = run_untrusted(["-c", code], cwd=tmp_path, timeout_s=30, log_path=tmp_path / "log",
                            policy=SandboxPolicy(write=[str(tmp_path)]))
    inside = outcome.log_tail.split()
    assert outcome.returncode == 0 and len(inside) == 2, outcome.log_tail
    assert inside[0] != os.readlink("/proc/self/ns/net") and inside[1] != os.readlink("/proc/self/ns/ipc")


def test_a_gpu_run_under_cuda_mps_reaches_the_pipe_dir_and_keeps_the_host_ipc(tmp_path):
    """MPS clients need the daemon's pipe directory and the host's IPC namespace; the network
    namespace and the rest of the file system stay confined."""
    import os

    caps = detect_mod.cached_capabilities()
    if not (caps.active("namespaces") and caps.active("landlock")):
        pytest.skip("namespaces or Landlock unavailable here")
    pipe, work = tmp_path / "mps", tmp_path / "work"
    pipe.mkdir()
    work.mkdir()
    code = ("import os\nopen('../mps/probe', 'w').write('x')\n"
            "print(os.readlink('/proc/self/ns/net'), os.readlink('/proc/self/ns/ipc'))\n"
            "try:\n    open('/tmp/ait-mps-escape', 'w')\nexcept OSError:\n    print('confined')")
    outcome = run_untrusted(["-c", code], cwd=work, timeout_s=30, log_path=tmp_path / "log",
                            policy=SandboxPolicy(write=[str(work)], gpu=True, mps_pipe_dir=str(pipe)))
    assert outcome.returncode == 0, outcome.log_tail
    net, ipc, confined = outcome.log_tail.split()[-3:]
    assert (pipe / "probe").read_text() == "x" and confined == "confined"
    assert net != os.readlink("/proc/self/ns/net") and ipc == os.readlink("/proc/self/ns/ipc")


def test_the_job_sandbox_uses_mps_only_when_its_pipe_dir_exists(tmp_path, monkeypatch):
    from ait.compute import run_job as rj

    job = SimpleJob(str(tmp_path))
    # A GPU host, faked: the check is whether /dev/nvidiactl exists.
    monkeypatch.setattr(rj.Path, "exists", lambda self: str(self) == "/dev/nvidiactl" or os_exists(self))
    policy = rj.train_policy(job, str(tmp_path), tmp_path, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert policy.gpu and policy.mps_pipe_dir == str(tmp_path)
    policy = rj.train_policy(job, str(tmp_path), tmp_path, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "gone")})
    assert policy.gpu and policy.mps_pipe_dir is None
    policy = rj.train_policy(job, str(tmp_path), tmp_path, {"CUDA_VISIBLE_DEVICES": "",
                                                             "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert not policy.gpu and policy.mps_pipe_dir is None
    # Without the private root, MPS (which needs connect(2)) would leave every host socket reachable:
    # packed jobs then share the GPU without it.
    host = detect_mod.cached_capabilities()
    no_root = host.model_copy(update={"layers": [layer.model_copy(update={"active": layer.active and
                                                                          layer.name != "mounts"})
                                                 for layer in host.layers]})
    monkeypatch.setattr(detect_mod, "cached_capabilities", lambda refresh=False: no_root)
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)
    policy = rj.train_policy(job, str(tmp_path), tmp_path, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert policy.gpu and policy.mps_pipe_dir is None


def os_exists(path) -> bool:
    import os

    return os.path.exists(str(path))


class SimpleJob:
    def __init__(self, workspace: str):
        self.workspace, self.time_budget_s, self.kill_factor = workspace, 60.0, 1.5


def test_the_namespace_waiter_dies_of_the_signal_that_killed_its_run():
    """A run SIGKILLed (by a cgroup's OOM killer, say) is reported as killed by SIGKILL, not as the
    waiter's own traceback: SIGKILL's handler cannot be reset (EINVAL), so the waiter must not try."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from ait.sandbox.detect import cached_capabilities

    if not cached_capabilities().active("mounts"):
        pytest.skip("needs mount and PID namespaces")
    code = "import time\nfrom ait.sandbox.mounts import unshare_and_fork\nunshare_and_fork()\ntime.sleep(60)"
    waiter = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{waiter.pid}/task/{waiter.pid}/children")
    deadline = time.monotonic() + 30
    while not children.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(int(children.read_text().split()[0]), signal.SIGKILL)  # the run, PID 1 of its namespace
    _, stderr = waiter.communicate(timeout=30)
    assert waiter.returncode == -signal.SIGKILL and "Traceback" not in stderr, stderr[-2000:]
