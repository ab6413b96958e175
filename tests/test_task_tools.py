"""The read-only tool-interface module (ait.job.task_tools) every workspace ships as task_tools.py.

It must be in every family's workspace, read-only to the agent, restored in every submission, hold
no hidden example and no hidden seed, and keep the reference jobs' env.py short (issue 22: a job
an agent writes in one turn).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
import re
import sys
from pathlib import Path

import pytest
from test_harness import FakeExecutor, Scripted, call, ok_result, tool_results

from ait.evals.baselines import BaselineStore
from ait.evals.hidden import _digest, hidden_examples
from ait.families import FAMILIES
from ait.harness.episode import READ_ONLY, run_episode, seed_workspace
from ait.harness.workspace_tools import ToolError, WorkspaceTools
from ait.home import hidden_secret
from ait.job import task_tools
from ait.job.env_loader import EnvLoadError, env_tools, import_env
from ait.job.export import export_job
from ait.policy.reference import reference_job
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TASKS = sorted((ROOT / "examples" / "tasks").glob("*.json"))
REFERENCE_JOBS = ROOT / "src" / "ait" / "policy" / "reference_jobs"
NAMES = sorted(FAMILIES)
SURFACE = ("SYSTEM_PROMPT", "Environment", "make_tools", "task_difficulty", "make_row", "distinct_rows", "parse_answer",
           "gold")
MAX_ENV_TOKENS = 1000
"""Most tokens a reference env.py may take, estimated as characters / 4 (Qwen2.5's tokenizer counts
380-510 for today's six; issue 22 asks for well under ~1,500)."""


def tokens_estimate(text: str) -> int:
    return len(text) // 4


@pytest.mark.parametrize("family", NAMES)
def test_every_family_ships_a_stdlib_module_with_the_common_surface(family):
    text = task_tools.source(family)
    assert text is not None
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert set(SURFACE) <= top, set(SURFACE) - top
    # the reference job's copy (so that a reference job directory is a complete workspace) is the trusted one
    assert (REFERENCE_JOBS / family / task_tools.MODULE).read_text() == text


def tool_module(family: str):
    return importlib.import_module(f"ait.job.task_tools.{family}")


def outcome(fn, args: dict) -> str:
    try:
        return fn(**args)
    except Exception as e:  # noqa: BLE001 - both sides must fail alike
        return f"raised {type(e).__name__}"


@pytest.mark.parametrize("family", NAMES)
def test_the_familys_tools_are_the_modules_functions(family):
    """The hidden eval's tools are the workspace module's own functions, not a copy kept in step with it:
    what the family returns for a world is what the module's make_tools returns (the same code, bound to
    that world), so the eval and the job's task_tools.py cannot drift apart."""
    fam, module = FAMILIES[family], tool_module(family)
    rng = random.Random(0)
    for knobs in ({}, fam.calibrated):
        world = fam.example(rng, fam.difficulty(knobs)).world
        ours, theirs = fam.tools(world), module.make_tools(world)
        assert [fn.__code__ for fn in ours] == [fn.__code__ for fn in theirs]
        assert {fn.__module__ for fn in ours} == {module.__name__}


ENV_OWN_TOOLS = {"calc_chain"}
"""Families whose Environment has a tool of its own rather than make_tools' (calc_chain's calculator
computes in floats; the eval's is exact)."""


@pytest.mark.parametrize("family", sorted(set(NAMES) - ENV_OWN_TOOLS))
def test_the_environment_calls_the_same_tools(family):
    """Environment's methods, what env.py's trainer calls (under docstrings of their own, which training
    renders), are make_tools' functions: the same names and parameters, the same answers on the family's
    worlds, on odd arguments, and on an empty info."""
    fam, module = FAMILIES[family], tool_module(family)
    methods = env_tools(module.Environment)
    rng = random.Random(1)
    exs = [fam.example(rng, fam.difficulty(knobs)) for knobs in ({}, fam.calibrated) for _ in range(5)]
    for ex in exs + [None]:
        world = ex.world if ex else {}
        tools = {fn.__name__: fn for fn in module.make_tools(world)}
        assert sorted(methods) == sorted(tools)
        env = module.Environment()
        env.reset({"world": world} if ex else {})
        calls = [(c.name, c.arguments) for c in fam.gold_trace(ex)] if ex else []
        for name, fn in tools.items():
            params = list(inspect.signature(fn).parameters)
            assert list(inspect.signature(methods[name]).parameters)[1:] == params, name
            calls += [(name, dict.fromkeys(params, value)) for value in ("1", "nope", 0, None)]
        for name, args in calls:
            assert outcome(getattr(env, name), args) == outcome(tools[name], args), (name, args)


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_every_workspace_has_the_module_read_only(path, tmp_path):
    spec = load_spec(path)
    ws = tmp_path / "ws"
    seed_workspace(ws, spec)
    module = ws / task_tools.MODULE
    assert module.read_text() == task_tools.source(spec.family)
    assert module.stat().st_mode & 0o222 == 0
    assert task_tools.MODULE in READ_ONLY
    tools = WorkspaceTools(ws, read_only=READ_ONLY)
    for attempt in (lambda: tools.write_file("task_tools.py", "X = 1\n"),
                    lambda: tools.write_file("./task_tools.py", "X = 1\n"),
                    lambda: tools.edit_file("task_tools.py", "def ", "def x")):
        with pytest.raises(ToolError):
            attempt()
    assert module.read_text() == task_tools.source(spec.family)


def test_install_restores_whatever_stands_at_the_path(tmp_path):
    trusted = task_tools.source("calc_chain")
    for make in (lambda p: p.write_text("tampered"), lambda p: p.symlink_to(tmp_path / "elsewhere.py"),
                 lambda p: p.mkdir(), lambda p: None):
        ws = tmp_path / f"ws{len(list(tmp_path.iterdir()))}"
        ws.mkdir()
        make(ws / task_tools.MODULE)
        assert task_tools.install(ws, "calc_chain")
        target = ws / task_tools.MODULE
        assert not target.is_symlink() and target.read_text() == trusted
    assert not task_tools.install(tmp_path, "no_such_family")


@pytest.mark.parametrize("path", TASKS, ids=[p.stem for p in TASKS])
def test_the_module_holds_no_hidden_example_and_no_hidden_seed(path, tmp_path, monkeypatch):
    """As test_families_suite checks the workspace: the secret, the hidden set's seed, its prompts, and
    its answers (any long enough not to be a word of the family's own public vocabulary)."""
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    spec = load_spec(path)
    text = task_tools.source(spec.family)
    secret = hidden_secret()
    hidden = hidden_examples(spec)
    digest = _digest(spec, spec.hidden_eval_size)
    assert secret not in text and digest[:16] not in text and str(int(digest[:16], 16)) not in text
    family_source = Path(sys.modules[type(FAMILIES[spec.family]).__module__].__file__).read_text()
    for h in hidden:
        assert h.prompt not in text
        answer = str(h.answer)
        if len(answer) >= 5 and answer not in family_source:
            assert not re.search(rf"(?<![\w.@]){re.escape(answer)}(?![\w.@])", text), answer
    # the module is the same whatever the secret: nothing in it is derived from the hidden set
    monkeypatch.setenv("AIT_HIDDEN_SEED", "another secret")
    seed_workspace(tmp_path / "ws", spec)
    assert (tmp_path / "ws" / task_tools.MODULE).read_text() == text


@pytest.mark.parametrize("family", NAMES)
def test_reference_env_py_is_short_and_uses_the_module(family):
    text = (REFERENCE_JOBS / family / "env.py").read_text()
    assert tokens_estimate(text) <= MAX_ENV_TOKENS, (family, tokens_estimate(text))
    assert re.search(r"^import task_tools as tt$", text, re.M)
    assert "def calculator" not in text and "def lookup" not in text  # the tools live in the module


@pytest.mark.parametrize("family", NAMES)
def test_env_py_imports_its_own_workspaces_module(family, tmp_path):
    """import_env loads task_tools.py from env.py's workspace, never one cached from another workspace."""
    job = reference_job(family)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "env.py").write_text(job["env.py"])
    task_tools.install(ws, family)
    other = tmp_path / "other"
    other.mkdir()
    (other / "env.py").write_text(reference_job("calc_chain")["env.py"])
    task_tools.install(other, "calc_chain")
    import_env(other / "env.py")
    env = import_env(ws / "env.py")
    assert env.tt.__file__ == str(ws / task_tools.MODULE)
    rows = env.build_dataset(8, 0)
    assert len(rows) == 8 and all({"prompt", "answer", "info"} <= set(r) for r in rows)
    assert env.reward_correct(f"Answer: {rows[0]['answer']}", rows[0]["answer"], rows[0]["info"]) == 1.0
    (ws / task_tools.MODULE).unlink()
    with pytest.raises(EnvLoadError, match="task_tools"):
        import_env(ws / "env.py")


@pytest.mark.parametrize("family", NAMES)
def test_the_export_carries_the_module(family, tmp_path):
    spec = load_spec(ROOT / "examples" / "tasks" / f"{family}.json")
    ws = tmp_path / "ws"
    seed_workspace(ws, spec)
    job = reference_job(family)
    (ws / "job.toml").write_text(job["job.toml"])
    (ws / "env.py").write_text(job["env.py"])
    result = export_job(ws, "verifiers", tmp_path / "out")
    carried = tmp_path / "out" / result.module / "job" / task_tools.MODULE
    assert carried.read_text() == task_tools.source(family)
    assert result.third_party_imports == []  # task_tools is the workspace's own module


TAMPER = '''import pathlib as _p
_m = _p.Path(__file__).with_name("task_tools.py")
try:  # agent code rewriting the interface in its submission's snapshot (the probe runs it there)
    _m.chmod(0o644)
    _m.write_text(_m.read_text() + "\\n# tampered\\n")
except OSError:
    pass
'''


def test_a_submission_always_trains_against_the_trusted_module(tmp_path, monkeypatch):
    """The agent cannot write task_tools.py, and whatever its code does to the snapshot's copy, the job
    runs with the trusted one."""
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    jobs = []
    task = ROOT / "examples" / "tasks" / "calc_chain.json"
    job = reference_job("calc_chain")
    policy = Scripted([[call("write_file", {"path": "task_tools.py", "content": "X = 1\n"}),
                        call("write_file", {"path": "job.toml", "content": job["job.toml"]}),
                        call("write_file", {"path": "env.py", "content": TAMPER + job["env.py"]})],
                       [call("submit_job")]])
    result = run_episode(load_spec(task), task, policy, runs_dir=tmp_path / "runs",
                         baselines=BaselineStore(tmp_path / "b.json"), executor=FakeExecutor(ok_result(), jobs))
    assert [s.report.valid for s in result.submissions] == [True], result.submissions[0].report.summary()
    refused = tool_results(result, "write_file")[0]
    assert "read-only" in refused, refused
    assert len(jobs) == 1
    assert (Path(jobs[0].workspace) / task_tools.MODULE).read_text() == task_tools.source("calc_chain")


def test_make_row_draws_only_from_the_callers_rng():
    """The module's generator is seeded by env.py alone: same rng state, same row; no global randomness."""
    for family in NAMES:
        ns: dict = {"__file__": str(REFERENCE_JOBS / family / "task_tools.py"), "__name__": f"tt_{family}"}
        exec(compile(task_tools.source(family), ns["__file__"], "exec"), ns)
        random.seed(1)
        a = ns["make_row"](random.Random(3), {})
        random.seed(2)
        b = ns["make_row"](random.Random(3), {})
        assert a == b


def test_a_call_to_a_helper_the_module_lacks_is_answered_with_what_it_has(tmp_path):
    """The 1.5B agent's failure on held-out triage (2026-12-02): env.py written from memory called
    task_tools.find_service, and used `re` without importing it. The probe's errors name what to use."""
    from ait.probe.runner import probe_workspace

    job = reference_job("triage")
    env_py = job["env.py"].replace(
        "def reward_format(completion: str, answer: str, info: dict) -> float:\n",
        "def reward_format(completion: str, answer: str, info: dict) -> float:\n"
        "    if re.search(r'@', completion) and tt.find_service(completion):\n        return 0.5\n")
    env_py = env_py.replace("got, gold = tt.parse_answer(completion), tt.gold(answer)",
                            "got, gold = tt.parse_answer(completion), tt.gold_answer(answer)")
    assert env_py.count("find_service") == 1 and "gold_answer" in env_py
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "job.toml").write_text(job["job.toml"])
    (ws / "env.py").write_text(env_py)
    task_tools.install(ws, "triage")
    report = probe_workspace(ws, load_spec(ROOT / "examples" / "tasks" / "triage.json"))
    messages = [e.message for e in report.errors]
    assert not report.valid
    fmt = next(m for m in messages if "reward_format" in m)
    assert "NameError: name 're' is not defined" in fmt and "add `import re`" in fmt
    partial = next(m for m in messages if "reward_partial" in m)
    assert "no attribute 'gold_answer'" in partial and "gold" in partial.split("task_tools has ")[1]  # close names
    # Without a close name, the module's own functions and classes, not its imports or constants.
    env_py = env_py.replace("import random\n", "import random\nimport re\n")
    (ws / "env.py").write_text(env_py.replace("tt.gold_answer(answer)", "tt.gold(answer)"))
    report = probe_workspace(ws, load_spec(ROOT / "examples" / "tasks" / "triage.json"))
    (fmt,) = [e.message for e in report.errors if "reward_format" in e.message]
    assert "no attribute 'find_service'" in fmt and "task_tools has Environment, distinct_rows, fmt_time, gold, make_row" in fmt
    assert "SYSTEM_PROMPT" not in fmt and "Path" not in fmt.split("has ")[1]
