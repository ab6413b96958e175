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
    assert names == ["session", "rlimits", "env", "landlock", "seccomp", "capabilities", "cgroups", "namespaces"]


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
    monkeypatch.delenv("AIT_UNSAFE_NO_SANDBOX", raising=False)
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
    assert not outside.exists() and "PermissionError" in outcome.log_tail


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
