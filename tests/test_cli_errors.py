"""The `ait` command as a newcomer meets it, run as a real subprocess: from any directory, and with
bad input of every ordinary kind. Each failure is one line on stderr and a non-zero exit; never a
traceback, a boxed panel, or exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain.json"


def ait(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ait.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int | None = None) -> str:
    """The run failed with exactly one line on stderr that says `needles`; returns it."""
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    if code is not None:
        assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---- from any directory ----------------------------------------------------------------------------

def test_the_shipped_tasks_are_found_outside_the_repo(tmp_path):
    listed = ait("tasks", "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = {t["name"] for t in json.loads(listed.stdout)}
    assert {"calc_chain", "triage", "ledger"} <= names
    shown = ait("tasks", "show", "calc_chain", cwd=tmp_path)
    assert shown.returncode == 0 and "available here" in shown.stdout


# ---- flags -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["episode", "--eval-size", "0"], "--eval-size"),
    (["episode", "--max-jobs", "0"], "--max-jobs"),
    (["episode", "--budget-usd", "-1"], "--budget-usd"),
    (["episode", "--executor", "bogus"], "'bogus' is not one of"),
    (["job", "validate", ".", "--task", "calc_chain", "--timeout", "-1"], "--timeout"),
    (["worker", "--jobs-per-gpu", "0"], "--jobs-per-gpu"),
    (["nosuchcommand"], "No such command"),
])
def test_a_bad_flag_is_one_line_naming_the_flag(tmp_path, args, needle):
    line = one_line_error(ait(*args, cwd=tmp_path), needle, code=2)
    assert "ait " in line and "--help" in line and "'loc'" not in line and "pydantic" not in line


def test_brackets_in_an_error_are_printed_not_swallowed_as_markup(tmp_path):
    ws = tmp_path / "ws"
    assert ait("job", "init", str(ws), "--task", "calc_chain", cwd=tmp_path).returncode == 0
    (ws / "job.toml").write_text("[job]\nbase_model = 'tiny'\n")  # no [train] table
    proc = ait("job", "validate", str(ws), "--task", "calc_chain", cwd=tmp_path)
    assert proc.returncode == 1 and "[config]" in proc.stdout and "train" in proc.stdout, proc.stdout


# ---- the file system -----------------------------------------------------------------------------------

def test_runs_dir_problems_are_one_line(tmp_path):
    (tmp_path / "a-file").write_text("x")
    one_line_error(ait("episode", "--runs-dir", str(tmp_path / "a-file"), cwd=tmp_path), "--runs-dir", "a-file")
    one_line_error(ait("episode", "--runs-dir", "/proc/no/such/dir", cwd=tmp_path), "--runs-dir", "cannot create")


def test_an_unusable_ait_home_is_named(tmp_path):
    home = tmp_path / "home-file"
    home.write_text("not a directory")
    proc = ait("doctor", cwd=tmp_path, env={"AIT_HOME": str(home)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr  # doctor still answers
    assert "AIT_HOME" in proc.stdout + proc.stderr
    one_line_error(ait("episode", cwd=tmp_path, env={"AIT_HOME": str(home)}), "AIT_HOME", str(home))


def test_files_that_are_not_utf8_are_named(tmp_path):
    task = tmp_path / "task.json"
    task.write_bytes(b'{"id": "\xff\xfe"}')
    one_line_error(ait("tasks", "show", str(task), cwd=tmp_path), "task.json", "not UTF-8")
    config = tmp_path / "episode.toml"
    config.write_bytes(b"max_turns = 3 # \xff\n")
    one_line_error(ait("episode", "--config", str(config), cwd=tmp_path), "episode.toml", "not UTF-8")


# ---- task specs that parse but do not mean anything ------------------------------------------------------

def spec_with(tmp_path: Path, **changes) -> Path:
    data = json.loads(TASK.read_text())
    for key, value in changes.items():
        if key == "knobs":
            data["difficulty"].update(value)
        else:
            data[key] = value
    path = tmp_path / "bad-spec.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("changes,needle", [
    ({"family": "astrology"}, "unknown task family 'astrology'"),
    ({"knobs": {"n_ops": "three"}}, "difficulty: n_ops"),
    ({"knobs": {"n_opps": 3}}, "n_opps: unknown key"),
])
def test_a_spec_that_means_nothing_is_refused_everywhere(tmp_path, changes, needle):
    spec = spec_with(tmp_path, **changes)
    one_line_error(ait("tasks", "show", str(spec), cwd=tmp_path), needle)
    (tmp_path / "ws").mkdir()
    one_line_error(ait("job", "validate", str(tmp_path / "ws"), "--task", str(spec), cwd=tmp_path), needle)
    one_line_error(ait("episode", "--task", str(spec), cwd=tmp_path), needle)


# ---- queue and worker ------------------------------------------------------------------------------------

def test_a_typod_queue_path_is_refused_not_created(tmp_path):
    line = one_line_error(ait("worker", "--queue", str(tmp_path / "qeueu.sqlite"), "--once", cwd=tmp_path),
                          "no queue at")
    assert "--create" in line and not (tmp_path / "qeueu.sqlite").exists()
    one_line_error(ait("queue", "ls", "--queue", str(tmp_path / "qeueu.sqlite"), cwd=tmp_path), "no queue at")


def test_a_gpu_this_host_does_not_have_is_refused(tmp_path):
    proc = ait("worker", "--queue", str(tmp_path / "q.sqlite"), "--create", "--gpus", "7", "--once", cwd=tmp_path,
               env={"CUDA_VISIBLE_DEVICES": "0"})
    one_line_error(proc, "--gpus 7", "not visible here")


# ---- exit statuses of an episode ---------------------------------------------------------------------------

def test_an_unreachable_endpoint_is_exit_3_and_no_submission_exit_1(tmp_path):
    from test_openai_policy import ChatServer

    server = ChatServer()
    try:
        server.script = [{"status": 400, "body": {"error": {"message": "model not found"}}}]
        proc = ait("episode", "--policy", "openai:nope", "--base-url", server.url, "--runs-dir", str(tmp_path / "r"),
                   cwd=tmp_path)
        assert proc.returncode == 3 and "policy_error" in proc.stdout, (proc.returncode, proc.stdout[-800:])
        silent = {"body": {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "I will not."}}]}}
        server.script = [silent] * 5
        proc = ait("episode", "--policy", "openai:m", "--base-url", server.url, "--runs-dir", str(tmp_path / "r"),
                   cwd=tmp_path)
        assert proc.returncode == 1 and "no_submission" in proc.stdout, (proc.returncode, proc.stdout[-800:])
    finally:
        server.httpd.shutdown()


def test_piped_progress_is_a_line_per_event(tmp_path):
    """Not a terminal: each stage is printed as it happens, not only the result at the end."""
    proc = ait("job", "init", str(tmp_path / "ws"), "--task", "calc_chain", cwd=tmp_path)
    assert proc.returncode == 0
    from ait.cli.episode import progress_reporter

    lines = []

    class Console:
        is_terminal = False

        def print(self, text, **_):
            lines.append(text)

    import ait.cli.episode as mod

    real = mod.err
    mod.err = Console()
    try:
        with progress_reporter("episode on x") as report:
            report("probing submission 1")
            report("probing submission 1")  # repeats collapse
            report("training and evaluating (tiny)")
    finally:
        mod.err = real
    assert [line.split("] ", 1)[1] for line in lines] == ["episode on x", "probing submission 1",
                                                           "training and evaluating (tiny)"]



# ---- the newcomer's smaller findings ---------------------------------------------------------------

def test_a_task_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "task.json").write_text(TASK.read_text())
    one_line_error(ait("tasks", "show", "spec", cwd=tmp_path), "is a directory", "spec/task.json")


def test_a_huge_task_spec_is_refused_by_its_size_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GiB that takes no disk; reading it whole took 6 GB of memory
    one_line_error(ait("tasks", "show", str(big), cwd=tmp_path, timeout=60), "3072 MiB", "16 MiB")


def test_job_validate_takes_the_workspaces_task_and_names_env_py_that_is_a_directory(tmp_path):
    assert ait("job", "init", "ws", "--task", str(TASK), cwd=tmp_path).returncode == 0
    ws = tmp_path / "ws"
    (ws / "env.py").unlink()
    (ws / "env.py").mkdir()
    proc = ait("job", "validate", "ws", cwd=tmp_path)  # no --task: the workspace's task.json
    assert proc.returncode == 1 and "env.py is a directory" in proc.stdout, (proc.stdout, proc.stderr)
    (tmp_path / "bare").mkdir()
    one_line_error(ait("job", "validate", "bare", cwd=tmp_path), "no task.json", "--task")


def test_a_prime_rl_export_refuses_a_model_that_is_not_a_hub_id_and_says_where_prime_rl_comes_from(tmp_path):
    ws = tmp_path / "ws"
    assert ait("job", "init", "ws", "--task", str(TASK), cwd=tmp_path).returncode == 0
    reference = ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain"
    for name in ("job.toml", "env.py"):
        (ws / name).write_text((reference / name).read_text())
    one_line_error(ait("job", "export", "ws", "out", "--to", "prime-rl", "--model", "notamodel", cwd=tmp_path),
                   "not a Hugging Face model id", "ORG/NAME")
    assert not (tmp_path / "out").exists()
    proc = ait("job", "export", "ws", "out", "--to", "prime-rl", "--model", "Qwen/Qwen2.5-0.5B", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checkout of prime-rl" in " ".join(proc.stdout.split())
    assert "github.com/PrimeIntellect-ai/prime-rl" in (tmp_path / "out" / "rl.toml").read_text()


@pytest.mark.parametrize("command", ["episode", "eval"])
def test_a_base_url_that_is_not_http_is_one_clear_line(tmp_path, command):
    args = ["--policy", "openai:some-model", "--base-url", "not-a-url"]
    extra = ["--task", str(TASK)] if command == "episode" else ["--tasks", str(TASK), "--episodes", "1", "--out", "o"]
    line = one_line_error(ait(command, *args, *extra, cwd=tmp_path), "'not-a-url' is not an http(s) URL", code=2)
    assert line.count("not-a-url") == 1 and "error: 2" not in line
