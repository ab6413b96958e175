"""The validation probe, end to end: real `python -m ait.probe.child` subprocesses on workspaces
built from the reference calc_chain job with one or more planted defects.

Probe runs cost ~0.3 s (env.py fails before the tools are inspected) to ~2.5 s (transformers is
imported for the tool schemas), so each full run plants several independent defects (a tool
defect, a dataset defect, reward defects) and several tests read the same cached report. Every
run stays under the verdict's cap of 8 errors so no planted defect is truncated away.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest

from ait.probe.checks import MAX_ERRORS, verdict
from ait.probe.runner import probe_workspace, run_child
from ait.probe.types import ProbeCheck, ProbeError, ProbeReport, ProbeRequest
from ait.spec import TaskSpec, load_spec

REPO = Path(__file__).resolve().parents[1]
REFERENCE_JOB = REPO / "src/ait/policy/reference_jobs/calc_chain"
TASK = REPO / "examples/tasks/calc_chain.json"
SECRET = "sk-test-secret"

GOOD_DOC = '''"""Apply one arithmetic operation to two numbers and return the result.

        Args:
            a: The left operand.
            op: The operator.
            b: The right operand.
        """'''


def build_workspace(root: Path, *, env: str | None = None, append: str = "", job_toml: str | None = None) -> Path:
    """Copy the reference job into `root`; replace env.py with `env`, or append overrides to it."""
    shutil.copytree(REFERENCE_JOB, root, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    env_path = root / "env.py"
    if env is not None:
        env_path.write_text(env)
    if append:
        env_path.write_text(env_path.read_text() + "\n\n# --- planted defects ---\n" + textwrap.dedent(append))
    if job_toml is not None:
        (root / "job.toml").write_text(job_toml)
    return root


def env_class(method: str) -> str:
    """An Environment whose only tool is `method` (indented source of one method)."""
    return "class Environment:\n    def reset(self, info: dict) -> None:\n        pass\n\n" + textwrap.indent(
        textwrap.dedent(method), "    ") + "\n"


# Each scenario: keyword arguments of build_workspace.
SCENARIOS: dict[str, dict] = {
    "reference": {},
    "import_value_error": {"env": '"""An env that fails on import."""\nimport os\nraise ValueError("boom")\n'},
    "import_syntax_error": {"env": "x = 1\ny = 2\ndef broken(:\n    pass\n"},
    "import_missing_module": {"env": "import os\nimport nonexistent_module_xyz\n"},
    "import_sys_exit": {"env": "import sys\nsys.exit(0)\n"},
    # No SYSTEM_PROMPT, no Environment, no build_dataset, and an empty REWARD_FUNCS.
    "surface_missing": {"env": "import random\n\nREWARD_FUNCS = []\n"},
    # Weights of the wrong length, and a reward with an argument the trainer cannot supply.
    "surface_reward_shape": {"append": """
        def reward_gold(completion: str, answer: str, gold: str) -> float:
            return 1.0 if completion == gold else 0.0

        REWARD_FUNCS = [reward_correct, reward_gold]
        REWARD_WEIGHTS = [1.0, 0.3, 0.1]
    """},
    # Tools: calculator renamed (missing) plus an extra public method.
    # Dataset: row 5 lacks "answer", row 7 has an unknown key.  Reward: constant 0.5.
    "tools_missing__dataset_malformed__reward_constant": {"append": env_class(f'''
        def calc(self, a: float, op: str, b: float) -> str:
            {GOOD_DOC}
            return "0"

        def helper_lookup(self, key: str) -> str:
            """Look something up.

            Args:
                key: what to look up.
            """
            return key
    ''') + """
_reference_build = build_dataset

def build_dataset(n: int, seed: int) -> list[dict]:
    rows = _reference_build(n, seed)
    del rows[5]["answer"]
    rows[7]["difficulty"] = 3
    return rows

def reward_constant(completion: str, answer: str, info: dict) -> float:
    return 0.5

REWARD_FUNCS = [reward_constant]
REWARD_WEIGHTS = None
"""},
    # Tools: wrong parameter name.  Dataset: one row short.  Rewards: NaN and inf.
    "tools_param__dataset_short__reward_nan_inf": {"append": env_class(f'''
        def calculator(self, x: float, op: str, b: float) -> str:
            {GOOD_DOC.replace("a: The left", "x: The left")}
            return "0"
    ''') + """
_reference_build = build_dataset

def build_dataset(n: int, seed: int) -> list[dict]:
    return _reference_build(n, seed)[: n - 1]

def reward_nan(completion: str, answer: str, info: dict) -> float:
    return float("nan")

def reward_inf(completion: str, answer: str, info: dict) -> float:
    return float("inf")

REWARD_FUNCS = [reward_correct, reward_nan, reward_inf]
REWARD_WEIGHTS = None
"""},
    # Tools: no docstring (no JSON schema).  Dataset: every prompt identical.  Rewards: a str, and 1.5.
    "tools_nodoc__dataset_identical__reward_str_over": {"append": env_class('''
        def calculator(self, a: float, op: str, b: float) -> str:
            return str(a * b)
    ''') + """
def build_dataset(n: int, seed: int) -> list[dict]:
    return [{"prompt": "Start with 1. Add 2. What is the final result?", "answer": str(i), "info": {}}
            for i in range(n)]

def reward_text(completion: str, answer: str, info: dict) -> float:
    return "1.0"

def reward_over(completion: str, answer: str, info: dict) -> float:
    return 1.5

REWARD_FUNCS = [reward_correct, reward_text, reward_over]
REWARD_WEIGHTS = None
"""},
    # Tools: raises on the example call.  Dataset: only 10 well-formed rows.  Reward: raises.
    "tools_raises__dataset_too_few__reward_raises": {"append": env_class(f'''
        def calculator(self, a: float, op: str, b: float) -> str:
            {GOOD_DOC}
            raise RuntimeError("calculator exploded")
    ''') + """
_reference_build = build_dataset

def build_dataset(n: int, seed: int) -> list[dict]:
    rows = _reference_build(n, seed)
    return rows[:10] + ["not a row"] * (n - 10)

def reward_raises(completion: str, answer: str, info: dict) -> float:
    raise KeyError("no_such_field")

REWARD_FUNCS = [reward_correct, reward_raises]
REWARD_WEIGHTS = None
"""},
    # Tools: returns a dict.  Dataset: build_dataset raises.
    "tools_dict__dataset_raises": {"append": env_class(f'''
        def calculator(self, a: float, op: str, b: float) -> str:
            {GOOD_DOC}
            return {{"result": a * b}}
    ''') + """
def build_dataset(n: int, seed: int) -> list[dict]:
    raise ValueError("no rows today")
"""},
    # Tools: a parameter without a type hint.  Rewards: `messages` and **kwargs signatures are allowed.
    "tools_nohint__reward_signatures_ok": {"append": env_class(f'''
        def calculator(self, a, op: str, b: float) -> str:
            {GOOD_DOC}
            return "408"
    ''') + """
def reward_messages(messages: list, answer: str) -> float:
    return 1.0 if answer in messages[-1]["content"] else 0.0

def reward_kwargs(**kwargs) -> float:
    return 1.0 if kwargs["answer"] in kwargs["completion"] and kwargs["info"] is not None else 0.0

REWARD_FUNCS = [reward_messages, reward_kwargs]
REWARD_WEIGHTS = [1.0, 0.5]
"""},
    "crash_exit_3": {"env": "import os\n\nos._exit(3)\n"},
    # Agent code forging the child's observations file (argv[3]) with a "verdict" and exiting cleanly.
    "forged_observations": {"env": textwrap.dedent("""
        import json, os, sys
        with open(sys.argv[3], "w") as f:
            json.dump({"import_error": None, "valid": True, "errors": []}, f)
        os._exit(0)
    """)},
    "config_and_env_broken": {
        "env": "import os\nraise ImportError('env is broken too')\n",
        "job_toml": (REFERENCE_JOB / "job.toml").read_text() + "warp_speed = 9\n",
    },
}


@pytest.fixture(scope="module")
def probe_spec() -> TaskSpec:
    return load_spec(TASK)


@pytest.fixture(scope="module")
def probe_home(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIT_HOME", str(tmp_path_factory.mktemp("ait_home")))
        yield


@pytest.fixture(scope="module")
def probe_report(probe_home, probe_spec: TaskSpec, tmp_path_factory) -> Callable[[str], ProbeReport]:
    """Run (once per module) the probe on a named scenario's workspace."""
    cache: dict[str, ProbeReport] = {}

    def get(name: str) -> ProbeReport:
        if name not in cache:
            ws = build_workspace(tmp_path_factory.mktemp(name), **SCENARIOS[name])
            cache[name] = probe_workspace(ws, probe_spec, timeout_s=60)
        return cache[name]

    return get


def only(report: ProbeReport, check: ProbeCheck, *needles: str) -> ProbeError:
    """The one error of `check` whose message contains every needle."""
    assert not report.valid and report.config is None
    found = [e for e in report.errors if e.check is check and all(n in e.message for n in needles)]
    assert len(found) == 1, f"no single [{check.value}] error containing {needles}:\n{report.summary()}"
    return found[0]


def checks(report: ProbeReport) -> list[ProbeCheck]:
    return [e.check for e in report.errors]


# --- the reference job ----------------------------------------------------------------------------


def test_reference_job_is_valid(probe_report) -> None:
    report = probe_report("reference")
    assert report.valid, report.summary()
    assert report.errors == []
    assert report.summary() == "valid"
    assert report.config is not None
    assert report.config.job.base_model == "tiny" and report.config.train.dataset_size == 64
    assert report.dataset_rows == 64
    assert 0 < report.seconds < 60
    # its reward shaping, as env.py weighs it (reported for the arc's per-family rows, never scored)
    assert [(r.name, r.weight) for r in report.rewards] == [("reward_correct", 1.0), ("reward_close", 0.3),
                                                           ("reward_format", 0.1)]


# --- env.py import ----------------------------------------------------------------------------------


def test_import_error_names_type_message_and_line(probe_report) -> None:
    report = probe_report("import_value_error")
    assert checks(report) == [ProbeCheck.env_import]
    msg = report.errors[0].message
    assert "ValueError" in msg and "boom" in msg and "line 3" in msg


def test_syntax_error_gives_the_line(probe_report) -> None:
    report = probe_report("import_syntax_error")
    assert checks(report) == [ProbeCheck.env_import]
    msg = report.errors[0].message
    assert "SyntaxError" in msg and "line 3" in msg


def test_missing_module_is_named(probe_report) -> None:
    report = probe_report("import_missing_module")
    assert checks(report) == [ProbeCheck.env_import]
    msg = report.errors[0].message
    assert "ModuleNotFoundError" in msg and "nonexistent_module_xyz" in msg and "line 2" in msg


def test_sys_exit_at_import_is_reported(probe_report) -> None:
    report = probe_report("import_sys_exit")
    assert not report.valid
    assert checks(report) == [ProbeCheck.env_import]
    assert "SystemExit" in report.errors[0].message and "line 2" in report.errors[0].message


# --- the surface ----------------------------------------------------------------------------------------


def test_missing_surface_parts_each_reported(probe_report) -> None:
    report = probe_report("surface_missing")
    assert set(checks(report)) == {ProbeCheck.surface}
    only(report, ProbeCheck.surface, "SYSTEM_PROMPT")
    only(report, ProbeCheck.surface, "class Environment")
    only(report, ProbeCheck.surface, "build_dataset")
    only(report, ProbeCheck.surface, "REWARD_FUNCS must be a non-empty list")
    assert len(report.errors) == 4


def test_reward_weights_length_and_unknown_reward_argument(probe_report) -> None:
    report = probe_report("surface_reward_shape")
    assert set(checks(report)) == {ProbeCheck.surface}
    only(report, ProbeCheck.surface, "REWARD_WEIGHTS", "2 numbers")
    only(report, ProbeCheck.surface, "reward_gold", "'gold'")
    assert len(report.errors) == 2


# --- tools -----------------------------------------------------------------------------------------------


def test_missing_tool_and_extra_public_method(probe_report) -> None:
    report = probe_report("tools_missing__dataset_malformed__reward_constant")
    only(report, ProbeCheck.tools, "lacks", "calculator")
    extra = only(report, ProbeCheck.tools, "not tools in task.json")
    assert "calc" in extra.message and "helper_lookup" in extra.message


def test_wrong_parameter_name(probe_report) -> None:
    report = probe_report("tools_param__dataset_short__reward_nan_inf")
    only(report, ProbeCheck.tools, "tool calculator", "['x', 'op', 'b']", "['a', 'op', 'b']")


def test_missing_docstring_is_a_schema_error(probe_report) -> None:
    report = probe_report("tools_nodoc__dataset_identical__reward_str_over")
    only(report, ProbeCheck.tools, "tool calculator", "no JSON schema", "docstring")
    assert ProbeCheck.tool_call not in checks(report)  # the call itself works


def test_missing_type_hint_is_a_schema_error(probe_report) -> None:
    report = probe_report("tools_nohint__reward_signatures_ok")
    only(report, ProbeCheck.tools, "tool calculator", "no JSON schema", "type hint")
    assert checks(report) == [ProbeCheck.tools]  # messages/**kwargs rewards are accepted


def test_tool_raising_on_the_example_call(probe_report) -> None:
    report = probe_report("tools_raises__dataset_too_few__reward_raises")
    err = only(report, ProbeCheck.tool_call, "tool calculator", "RuntimeError", "calculator exploded")
    assert "'op': '*'" in err.message  # the spec's example call is shown


def test_tool_returning_a_dict(probe_report) -> None:
    report = probe_report("tools_dict__dataset_raises")
    only(report, ProbeCheck.tool_call, "tool calculator", "returned dict")


# --- dataset ---------------------------------------------------------------------------------------------


def test_build_dataset_raising(probe_report) -> None:
    report = probe_report("tools_dict__dataset_raises")
    only(report, ProbeCheck.dataset, "build_dataset(64", "ValueError", "no rows today")
    assert ProbeCheck.reward not in checks(report)  # no rows: rewards are not blamed
    assert len(report.errors) == 2


def test_fewer_rows_than_asked(probe_report) -> None:
    report = probe_report("tools_param__dataset_short__reward_nan_inf")
    only(report, ProbeCheck.dataset, "returned 63 rows")
    assert report.dataset_rows == 63


def test_row_missing_answer_and_row_with_unknown_key(probe_report) -> None:
    report = probe_report("tools_missing__dataset_malformed__reward_constant")
    only(report, ProbeCheck.dataset, "row 5", "answer")
    only(report, ProbeCheck.dataset, "row 7", "unknown keys", "difficulty")
    assert len([e for e in report.errors if e.check is ProbeCheck.dataset]) == 2  # 62 good rows suffice


def test_identical_prompts_fail_the_distinct_check(probe_report) -> None:
    report = probe_report("tools_nodoc__dataset_identical__reward_str_over")
    only(report, ProbeCheck.dataset, "only 1 distinct prompts among 64")


def test_too_few_rows_for_the_task_minimum(probe_report) -> None:
    report = probe_report("tools_raises__dataset_too_few__reward_raises")
    only(report, ProbeCheck.dataset, "only 10 well-formed rows", "at least 32")
    only(report, ProbeCheck.dataset, "row 10", "is a str")


# --- rewards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario,name,fragment", [
    ("tools_param__dataset_short__reward_nan_inf", "reward_nan", "returned nan"),
    ("tools_param__dataset_short__reward_nan_inf", "reward_inf", "returned inf"),
    ("tools_nodoc__dataset_identical__reward_str_over", "reward_text", "returned str"),
    ("tools_nodoc__dataset_identical__reward_str_over", "reward_over", "returned 1.5"),
    ("tools_raises__dataset_too_few__reward_raises", "reward_raises", "KeyError"),
])
def test_bad_reward_is_named(probe_report, scenario: str, name: str, fragment: str) -> None:
    report = probe_report(scenario)
    only(report, ProbeCheck.reward, f"reward {name} ", fragment)
    assert "reward_correct" not in " ".join(e.message for e in report.errors)  # the good one is not blamed


def test_constant_reward_is_rejected(probe_report) -> None:
    report = probe_report("tools_missing__dataset_malformed__reward_constant")
    only(report, ProbeCheck.reward, "same value", "constant reward")


def test_planted_defects_are_all_reported_within_the_cap(probe_report) -> None:
    # Guards the grouping above: a truncated report would hide a planted defect.
    expected = {
        "tools_missing__dataset_malformed__reward_constant": 5,
        "tools_param__dataset_short__reward_nan_inf": 4,
        "tools_nodoc__dataset_identical__reward_str_over": 4,
        "tools_raises__dataset_too_few__reward_raises": 6,
    }
    for name, n in expected.items():
        assert len(probe_report(name).errors) == n < MAX_ERRORS, probe_report(name).summary()


# --- robustness ------------------------------------------------------------------------------------------


def test_infinite_loop_at_import_times_out(probe_home, probe_spec: TaskSpec, tmp_path: Path) -> None:
    ws = build_workspace(tmp_path / "ws", env="import time\n\nwhile True:\n    pass\n")
    start = time.monotonic()
    report = probe_workspace(ws, probe_spec, timeout_s=3)
    elapsed = time.monotonic() - start
    assert elapsed < 15
    assert not report.valid
    assert checks(report) == [ProbeCheck.timeout]
    assert "3s" in report.errors[0].message


def test_hard_exit_at_import_is_a_crash(probe_report) -> None:
    report = probe_report("crash_exit_3")
    assert checks(report) == [ProbeCheck.crash]
    assert "exit status 3" in report.errors[0].message


def test_forged_observations_do_not_validate(probe_report) -> None:
    report = probe_report("forged_observations")
    assert report.valid is False
    assert report.config is None
    only(report, ProbeCheck.tools, "lacks", "calculator")
    only(report, ProbeCheck.dataset, "returned 0 rows")


def test_config_and_env_errors_in_one_report(probe_report) -> None:
    report = probe_report("config_and_env_broken")
    assert checks(report) == [ProbeCheck.config, ProbeCheck.env_import]
    config = report.errors[0].message
    assert "train.warp_speed: unknown key" in config
    env = report.errors[1].message
    assert "ImportError" in env and "env is broken too" in env and "line 2" in env
    assert report.config is None


def test_config_error_alone_still_runs_env(probe_home, probe_spec: TaskSpec, tmp_path: Path) -> None:
    # A bad job.toml with the good env: only the config is blamed, and env.py was still exercised
    # (with the fallback dataset size, max(min_dataset_rows, 64)).
    toml = (REFERENCE_JOB / "job.toml").read_text().replace('"tiny"', '"gpt2"')
    ws = build_workspace(tmp_path / "ws", job_toml=toml)
    report = probe_workspace(ws, probe_spec, timeout_s=60)
    assert checks(report) == [ProbeCheck.config]
    assert "job.base_model 'gpt2' is not allowed" in report.errors[0].message
    assert report.config is None and report.dataset_rows == 64


# --- secrets do not reach agent code ----------------------------------------------------------------------


LEAK_ENV = '''
import os

def _leak() -> str:
    found = [k for k, v in os.environ.items() if "sk-test" in v]
    return f"KEY={os.environ.get('OPENAI_API_KEY')} FOUND={found}"

SYSTEM_PROMPT = "solve it " + _leak()


class Environment:
    def calculator(self, a: float, op: str, b: float) -> str:
        """Leak through a tool error.

        Args:
            a: left.
            op: operator.
            b: right.
        """
        raise RuntimeError(_leak())


def build_dataset(n: int, seed: int) -> list[dict]:
    return [{"prompt": f"{i}: {_leak()}", "answer": str(i), "info": {"leak": _leak()}} for i in range(n)]


def reward_leak(completion: str, answer: str, info: dict) -> float:
    raise ValueError(_leak())


REWARD_FUNCS = [reward_leak]
'''


def test_environment_secret_is_not_visible_to_env_py(monkeypatch: pytest.MonkeyPatch, probe_spec: TaskSpec,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("AIT_TEST_OTHER_TOKEN", SECRET + "-2")
    ws = build_workspace(tmp_path / "ws", env=LEAK_ENV)
    obs = run_child(ws, ProbeRequest(tools=probe_spec.eval_format.tools, dataset_size=64, seed=0), timeout_s=60)
    assert not isinstance(obs, ProbeError), obs
    errors = verdict(obs, probe_spec, 64)
    report = ProbeReport(valid=not errors, errors=errors)
    obs_json, report_json = obs.model_dump_json(), report.model_dump_json()
    # The leak channels work (positive control): the probed values surface in both.
    assert "KEY=None FOUND=[]" in obs.system_prompt
    assert "KEY=None FOUND=[]" in obs.dataset_samples[0]["prompt"]
    tool_err = only(report, ProbeCheck.tool_call, "RuntimeError")
    reward_err = only(report, ProbeCheck.reward, "reward_leak", "ValueError")
    assert "KEY=None FOUND=[]" in tool_err.message and "KEY=None FOUND=[]" in reward_err.message
    # ... and the secret itself never does.
    assert SECRET not in obs_json and SECRET not in report_json
    assert "sk-test" not in obs_json and "sk-test" not in report_json


# --- the CLI ---------------------------------------------------------------------------------------------------


def test_cli_job_validate_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ait.cli import app

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)
    good = build_workspace(tmp_path / "good")
    bad = build_workspace(tmp_path / "bad", **SCENARIOS["import_value_error"])
    runner = CliRunner()

    result = runner.invoke(app, ["job", "validate", str(good), "--task", "examples/tasks/calc_chain.json", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["valid"] is True and data["errors"] == [] and data["config"]["job"]["base_model"] == "tiny"

    result = runner.invoke(app, ["job", "validate", str(bad), "--task", "examples/tasks/calc_chain.json", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["valid"] is False and data["config"] is None
    assert [e["check"] for e in data["errors"]] == ["env_import"]
    assert "boom" in data["errors"][0]["message"]


def test_cli_job_validate_missing_workspace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ait.cli import app

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, ["job", "validate", str(tmp_path / "nope"), "--task", "calc_chain", "--json"])
    assert result.exit_code == 2
    assert "not a directory" in " ".join(result.output.split())  # rich wraps long lines


# --- the trust boundary: agent code against the trusted parent and the host --------------------------------
# Landlock's read allow-list closes these: other processes' /proc entries and AIT_HOME are not readable.

RUN_PROBE = ("import sys\nfrom ait.probe.runner import probe_workspace\nfrom ait.spec import load_spec\n"
             "print(probe_workspace(sys.argv[1], load_spec(sys.argv[2]), timeout_s=10).model_dump_json())\n")


def probe_in_subprocess(ws: Path, tmp_path: Path, timeout_s: float, **env: str) -> subprocess.CompletedProcess:
    """Run the probe from a fresh interpreter whose *initial* environment holds `env`."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    full_env = {**os.environ, "AIT_HOME": str(tmp_path / "home"), "TMPDIR": str(scratch), **env}
    return subprocess.run([sys.executable, "-c", RUN_PROBE, str(ws), str(TASK)], env=full_env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


def test_forged_unknown_tool_name_does_not_crash_the_parent(probe_home, probe_spec: TaskSpec, tmp_path: Path) -> None:
    ws = build_workspace(tmp_path / "ws", env=textwrap.dedent("""
        import json, os, sys
        with open(sys.argv[3], "w") as f:
            json.dump({"tool_names": ["calculator"], "tools": [{"name": "not_in_spec"}]}, f)
        os._exit(0)
    """))
    report = probe_workspace(ws, probe_spec, timeout_s=30)
    assert not report.valid


def test_fifo_at_observations_path_does_not_hang_the_parent(tmp_path: Path) -> None:
    ws = build_workspace(tmp_path / "ws", env="import os, sys\nos.mkfifo(sys.argv[3])\nos._exit(0)\n")
    try:
        proc = probe_in_subprocess(ws, tmp_path, timeout_s=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the trusted parent hung reading a FIFO planted at the observations path")
    report = ProbeReport.model_validate_json(proc.stdout)
    assert not report.valid


def test_parent_environ_is_not_readable_from_env_py(tmp_path: Path) -> None:
    ws = build_workspace(tmp_path / "ws", env=textwrap.dedent("""
        import os
        data = open(f"/proc/{os.getppid()}/environ", "rb").read().decode(errors="replace")
        raise ValueError("LEAK " + " ".join(kv for kv in data.split("\\0") if "OPENAI" in kv))
    """))
    proc = probe_in_subprocess(ws, tmp_path, timeout_s=30, OPENAI_API_KEY=SECRET)
    assert proc.returncode == 0, proc.stderr
    report = ProbeReport.model_validate_json(proc.stdout)
    # Refused by Landlock, or the parent is not even in the run's PID namespace (getppid() is 0 there).
    message = report.errors[0].message
    assert ("PermissionError" in message or "FileNotFoundError" in message) and "environ" in message, message
    assert SECRET not in proc.stdout


def test_hidden_secret_is_not_readable_from_env_py(monkeypatch: pytest.MonkeyPatch, probe_spec: TaskSpec,
                                                   tmp_path: Path) -> None:
    from ait.home import hidden_secret

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    secret = hidden_secret()
    assert (tmp_path / "home" / "hidden_secret").is_file()
    # The attacker knows where the secret lives (AIT_HOME itself is not passed in).
    ws = build_workspace(tmp_path / "ws", env=textwrap.dedent(f"""
        import os
        assert "AIT_HOME" not in os.environ
        try:
            found = open({str(tmp_path / "home" / "hidden_secret")!r}).read()
        except OSError as e:
            found = f"unreadable ({{type(e).__name__}})"
        raise ValueError("HIDDEN=" + found)
    """))
    report = probe_workspace(ws, probe_spec, timeout_s=30)
    # It ran, and the read was refused (Landlock) or the file does not exist in the private root.
    assert re.search(r"HIDDEN=unreadable \((PermissionError|FileNotFoundError)\)", report.errors[0].message)
    assert secret not in report.model_dump_json()


def test_import_error_message_is_bounded(probe_home, probe_spec: TaskSpec, tmp_path: Path) -> None:
    ws = build_workspace(tmp_path / "ws", env='raise ValueError("x" * 100_000)\n')
    report = probe_workspace(ws, probe_spec, timeout_s=30)
    assert checks(report) == [ProbeCheck.env_import]
    assert len(report.errors[0].message) < 2_000


def test_an_allowed_base_model_this_install_lacks_is_refused_before_any_job(probe_home, probe_spec: TaskSpec,
                                                                             tmp_path: Path) -> None:
    """The task allows it, but it does not resolve here: the probe says so, instead of the job crashing."""
    from ait.train.models import model_availability

    missing = next((m for m in probe_spec.constraints.allowed_base_models if model_availability(m)), None)
    if missing is None:
        pytest.skip("every allowed base model resolves on this install")
    ws = build_workspace(tmp_path / "ws")
    text = (ws / "job.toml").read_text()
    (ws / "job.toml").write_text(re.sub(r'base_model = "[^"]*"', f'base_model = "{missing}"', text))
    report = probe_workspace(ws, probe_spec, timeout_s=30)
    assert not report.valid
    message = " ".join(e.message for e in report.errors if e.check is ProbeCheck.config)
    assert f"base model {missing!r} is not available on this install" in message
