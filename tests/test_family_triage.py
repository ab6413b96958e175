"""triage (held out): determinism, gold answers recomputed independently from the world,
a prompt-and-tools-only solver on a hidden-like set, guessing and shortcut heuristics,
the scorer, tool errors and schemas, the reference job (probe + tool agreement).

The independent checks below never call the module's generator helpers: they read the
world's plain data (or, for the solver, only tool text) and apply the task's rule: the
root cause is the deploy shortly before the first alert, on a service the alerting
services depend on, whose own (non-blaming) errors start after it.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

import ait.families
from ait.families import ToolCall
from ait.families.triage import Triage
from ait.spec import Constraints, build_spec
from tests.reference_rows import reference_rows_at

FAMILY = Triage()
REPO = Path(__file__).resolve().parents[1]
REF_JOB = REPO / "src" / "ait" / "policy" / "reference_jobs" / "triage"
CONSTRAINTS = Constraints(allowed_base_models=["tiny", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200,
                          max_group_size=16, max_prompts_per_step=16, max_completion_tokens=512, max_turns=8,
                          time_budget_s=600, min_dataset_rows=32, max_dataset_rows=20000)
PROMPT_RE = re.compile(r"Incident (INC-\d+): (\w+) is [a-z0-9 ]+ since (\d\d):(\d\d)\. Which deploy is the root "
                       r"cause\? Answer with the service and version\.")


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


def minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


@pytest.fixture
def hidden(monkeypatch, tmp_path):
    """200 examples drawn exactly like the hidden eval (default difficulty)."""
    from ait.evals.hidden import hidden_examples

    monkeypatch.setitem(ait.families.FAMILIES, "triage", FAMILY)
    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "triage-family-test")
    spec = build_spec("triage", constraints=CONSTRAINTS)
    exs = hidden_examples(spec)
    assert len(exs) == 200
    return exs


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("knobs", [{}, {"n_services": 8, "depth": 4, "n_distractor_deploys": 6, "log_noise": 5}])
def test_same_seed_same_examples_and_json_world(knobs):
    a, b = examples(knobs, 40, seed=11), examples(knobs, 40, seed=11)
    assert [(e.prompt, e.world, e.answer) for e in a] == [(e.prompt, e.world, e.answer) for e in b]
    assert len({e.prompt for e in a}) == 40
    for e in a:
        assert json.loads(json.dumps(e.world)) == e.world


def test_different_seeds_differ():
    a = [e.prompt for e in examples({}, 50, seed=1)]
    b = [e.prompt for e in examples({}, 50, seed=2)]
    assert len(set(a) & set(b)) < 3


# ---------------------------------------------------------------- gold answers (independent)


def closure(deps: dict, starts: list[str]) -> set[str]:
    seen, stack = set(), list(starts)
    while stack:
        for nxt in deps[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def independent_root(world: dict) -> list[str]:
    """Every deploy satisfying the task's rule, computed from the raw world."""
    first = min(minutes(a["time"]) for a in world["alerts"])
    alerting = [a["service"] for a in world["alerts"]]
    reach = closure(world["deps"], alerting)
    names = set(world["services"])
    found = []
    for dep in world["deploys"]:
        t = minutes(dep["time"])
        if dep["service"] not in reach or not (0 < first - t <= 60):
            continue
        own = [minutes(e["time"]) for e in world["logs"][dep["service"]]
               if e["level"] == "ERROR" and not any(re.search(rf"\b{n}\b", e["msg"]) for n in names)]
        if any(t < x <= first for x in own) and not any(t - 60 <= x <= t for x in own):
            found.append(f"{dep['service']}@{dep['version']}")
    return found


CONFIGS = [{}, {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0},
           {"n_services": 4, "depth": 2}, {"n_services": 8, "depth": 4, "n_distractor_deploys": 6,
                                           "n_background_deploys": 6, "log_noise": 6},
           {"n_services": 6, "depth": 3, "n_distractor_deploys": 5, "log_noise": 3}]


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_gold_answer_is_the_unique_deploy_satisfying_the_rule(i):
    knobs = CONFIGS[i]
    d = FAMILY.difficulty(knobs)
    for ex in examples(knobs, 150, seed=500 + i):
        w = ex.world
        assert independent_root(w) == [ex.answer], (ex.prompt, ex.answer)
        assert len(w["services"]) == d.n_services
        assert len(w["deploys"]) == 1 + d.n_distractor_deploys + d.n_background_deploys
        assert len({(x["service"], x["version"]) for x in w["deploys"]}) == len(w["deploys"])
        m = PROMPT_RE.fullmatch(ex.prompt)
        assert m, ex.prompt
        first = w["alerts"][0]
        assert first["service"] == m.group(2) and first["time"] == f"{m.group(3)}:{m.group(4)}"
        root = ex.answer.split("@")[0]
        # the culprit is exactly `depth` hops below the prompt's service and never alerts itself
        frontier, hops = {m.group(2)}, 0
        while root not in frontier:
            frontier = {n for s in frontier for n in w["deps"][s]}
            hops += 1
            assert hops <= d.depth
        assert hops == d.depth
        assert root not in {a["service"] for a in w["alerts"]}
        # the prompt gives away neither the culprit nor any version
        assert root not in ex.prompt and not re.search(r"\d+\.\d+", ex.prompt)


def test_distractors_present_at_default():
    """At the default difficulty each example has an unrelated in-window deploy and a closure
    deploy that is not the answer (so dependency filtering and log checks both matter)."""
    for ex in examples({}, 100, seed=3):
        w = ex.world
        first = minutes(w["alerts"][0]["time"])
        reach = closure(w["deps"], [a["service"] for a in w["alerts"]])
        window = [x for x in w["deploys"] if 0 < first - minutes(x["time"]) <= 45]
        assert any(x["service"] not in reach and x["service"] not in {a["service"] for a in w["alerts"]}
                   for x in window)
        assert any(f"{x['service']}@{x['version']}" != ex.answer and
                   (x["service"] in reach or x["service"] == w["alerts"][0]["service"]) for x in w["deploys"])


# ---------------------------------------------------------------- prompt + tools only solver

LINE_RE = re.compile(r"^(\d\d:\d\d) (\S+?)@(\S+)$")
LOG_RE = re.compile(r"^(\d\d:\d\d) (ERROR|WARN|INFO) (.*?)(?: \(x\d+, last (\d\d:\d\d)\))?$")


def solve(prompt: str, call) -> str:
    m = PROMPT_RE.fullmatch(prompt)
    assert m
    alerts = [ln.split(" ", 1) for ln in call("list_alerts").splitlines()]
    first = min(minutes(t) for t, _ in alerts)
    alerting = [rest.split(":")[0] for _, rest in alerts]
    assert m.group(2) in alerting
    deps: dict[str, list[str]] = {}
    stack = list(alerting)
    while stack:
        s = stack.pop()
        if s in deps:
            continue
        out = call("get_dependencies", service=s)
        assert out.startswith(f"{s} calls: "), out
        rest = out.split(": ", 1)[1]
        deps[s] = [] if rest == "nothing" else rest.split(", ")
        stack += deps[s]
    reach = {n for s in deps for n in deps[s]}
    since = first - 90
    deploys = []
    for ln in call("list_deploys", since=f"{since // 60:02d}:{since % 60:02d}").splitlines():
        mm = LINE_RE.match(ln)
        if mm:
            deploys.append((minutes(mm.group(1)), mm.group(2), mm.group(3)))
    found = []
    for t, svc, ver in deploys:
        if svc not in reach or not 0 < first - t <= 60:
            continue
        own = []
        for ln in call("search_logs", service=svc, level="error").splitlines():
            lm = LOG_RE.match(ln)
            if lm and not any(re.search(rf"\b{n}\b", lm.group(3)) for n in deps):
                own.append(minutes(lm.group(1)))
        if any(t < x <= first for x in own) and not any(t - 60 <= x <= t for x in own):
            found.append(f"{svc}@{ver}")
    assert len(found) == 1, (prompt, found)
    return found[0]


def test_tool_only_solver_reaches_gold_on_hidden_like_set(hidden):
    total, n_calls = 0.0, []
    for ex in hidden:
        calls = []

        def call(name, **args):
            calls.append(name)
            return FAMILY.call_tool(ex.world, ToolCall(name=name, arguments=args))

        total += FAMILY.score(f"I checked the logs.\nAnswer: {solve(ex.prompt, call)}", ex.answer)
        n_calls.append(len(calls))
    assert total == 200
    assert min(n_calls) >= 4


def test_gold_trace_replay_contains_the_answer():
    for knobs in CONFIGS:
        d = FAMILY.difficulty(knobs)
        for ex in examples(knobs, 40, seed=77):
            trace = FAMILY.gold_trace(ex)
            assert len(trace) == d.depth + 3
            assert FAMILY.eval_format(d).max_turns >= len(trace) + 1
            outs = [FAMILY.call_tool(ex.world, c) for c in trace]
            assert not any(o.startswith("error") for o in outs)
            assert f" {ex.answer}" in outs[-1]  # the deploy listing shows the culprit's deploy
            root = ex.answer.split("@")[0]
            assert trace[-2].arguments["service"] == root
            assert not any(re.search(rf"\b{n}\b", outs[-2]) for n in ex.world["services"])  # own errors
            # every caller's error log names the next service on the chain
            for c, nxt, out in zip(trace[1:-2], trace[2:-1], outs[1:-2]):
                assert nxt.arguments["service"] in out, (c, out)


# ---------------------------------------------------------------- guessing and shortcuts


def test_prompt_only_guessing_scores_low(hidden):
    strategies = {
        "entry service": lambda m: f"{m.group(2)}@1.0.0",
        "common service": lambda m: "payments@2.4.1",
        "entry with time": lambda m: f"{m.group(2)}@{int(m.group(3))}.{int(m.group(4))}.0",
    }
    for name, guess in strategies.items():
        hits = sum(FAMILY.score(f"Answer: {guess(PROMPT_RE.fullmatch(ex.prompt))}", ex.answer) for ex in hidden)
        assert hits / len(hidden) < 0.1, name


def test_shortcut_heuristics_fall_short(hidden):
    """Reading deploys without logs/dependencies is often wrong: the distractors do their job."""
    latest_any = latest_reach = 0
    for ex in hidden:
        w = ex.world
        first = minutes(w["alerts"][0]["time"])
        before = [x for x in w["deploys"] if minutes(x["time"]) < first]
        latest_any += FAMILY.score(f"Answer: {before[-1]['service']}@{before[-1]['version']}", ex.answer)
        reach = closure(w["deps"], [w["alerts"][0]["service"]]) | {w["alerts"][0]["service"]}
        near = [x for x in before if x["service"] in reach]
        latest_reach += FAMILY.score(f"Answer: {near[-1]['service']}@{near[-1]['version']}", ex.answer)
    assert latest_any / len(hidden) < 0.5, latest_any
    assert latest_reach / len(hidden) < 0.75, latest_reach


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, expected", [
    ("Answer: payments@2.4.1", 1.0),
    ("answer: PAYMENTS @ 2.4.1", 1.0),
    ("Answer: payments 2.4.1", 1.0),
    ("Answer: payments:2.4.1.", 1.0),
    ("Answer: payments version 2.4.1", 1.0),
    ("Answer: payments@v2.4.1", 1.0),
    ("Answer: `payments@2.4.1`", 1.0),
    ("Answer: **payments@2.4.1**", 1.0),
    ("Logs show payments failing.\nAnswer: payments@2.4.1 (deployed 13:41)", 1.0),
    ("Answer: search@1.0.0\nAnswer: payments@2.4.1", 1.0),  # the last answer line wins
    ("Answer: payments@2.4.1\nAnswer: search@1.0.0", 0.0),
    ("Answer: payments@2.4.1 or search@1.9.0", 0.0),  # hedging is wrong
    ("Answer: payments@2.4.2", 0.0),
    ("Answer: payments@2.4", 0.0),
    ("Answer: payments@2.4.10", 0.0),
    ("Answer: payment@2.4.1", 0.0),
    ("Answer: payments", 0.0),
    ("Answer: 2.4.1", 0.0),
    ("payments@2.4.1", 0.0),  # no answer line
    ("", 0.0),
])
def test_score(response, expected):
    assert FAMILY.score(response, "payments@2.4.1") == expected


def test_score_none_is_zero():
    assert FAMILY.score(None, "payments@2.4.1") == 0.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- tools


def test_tools_match_eval_format_and_have_schemas():
    from transformers.utils import get_json_schema
    import inspect

    ex = examples({}, 1, seed=0)[0]
    ef = FAMILY.eval_format(FAMILY.difficulty({}))
    tools = FAMILY.tools(ex.world)
    assert [t.__name__ for t in tools] == [s.name for s in ef.tools]
    for fn, spec in zip(tools, ef.tools):
        schema = get_json_schema(fn)
        assert schema["function"]["name"] == spec.name
        assert list(inspect.signature(fn).parameters) == [p.name for p in spec.parameters]
        assert list(schema["function"]["parameters"].get("properties", {})) == [p.name for p in spec.parameters]
        # the probe's example call is valid against an arbitrary world
        for world in (ex.world, {}):
            out = FAMILY.call_tool(world, ToolCall(name=spec.name, arguments=spec.example))
            assert isinstance(out, str) and not out.startswith("error: bad arguments")


BAD_CALLS = [
    ("get_dependencies", {"service": "nonexistent"}),
    ("get_dependencies", {"service": ""}),
    ("get_dependencies", {"service": 42}),
    ("get_dependencies", {"service": None}),
    ("get_dependencies", {}),
    ("list_deploys", {"since": ""}),
    ("list_deploys", {"since": "two pm"}),
    ("list_deploys", {"since": "25:00"}),
    ("list_deploys", {"since": 1400}),
    ("list_deploys", {"since": ["13:00"]}),
    ("search_logs", {"service": "nonexistent", "level": "error"}),
    ("search_logs", {"service": "", "level": "error"}),
    ("search_logs", {"service": [], "level": "error"}),
    ("search_logs", {"service": "SERVICE0", "level": "debug"}),
    ("search_logs", {"service": "SERVICE0", "level": ""}),
    ("search_logs", {"service": "SERVICE0", "level": 3}),
    ("search_logs", {"service": "SERVICE0"}),
    ("list_alerts", {"extra": 1}),
    ("rollback", {"service": "SERVICE0"}),
]


@pytest.mark.parametrize("name, args", BAD_CALLS)
def test_bad_tool_calls_return_error_text(name, args):
    ex = examples({}, 1, seed=4)[0]
    args = {k: (ex.world["services"][0] if v == "SERVICE0" else v) for k, v in args.items()}
    out = FAMILY.call_tool(ex.world, ToolCall(name=name, arguments=args))
    assert isinstance(out, str) and out.startswith("error:"), out
    # the raw functions never raise either (call_tool's guard is not what saves them)
    fns = {f.__name__: f for f in FAMILY.tools(ex.world)}
    if name in fns:
        try:
            raw = fns[name](**args)
        except TypeError:
            return  # a missing/extra argument is a signature mismatch, reported by call_tool
        assert raw.startswith("error:")


def test_tool_outputs_are_normalised_and_short():
    for ex in examples({"n_services": 8, "depth": 4, "n_distractor_deploys": 6, "n_background_deploys": 6,
                        "log_noise": 6}, 30, seed=8):
        svc = ex.world["services"][0]
        assert FAMILY.call_tool(ex.world, ToolCall(name="get_dependencies", arguments={"service": f"  {svc.upper()} "})) \
            .startswith(f"{svc} calls:")
        assert FAMILY.call_tool(ex.world, ToolCall(name="search_logs", arguments={"service": svc, "level": " ERROR"})) \
            == FAMILY.call_tool(ex.world, ToolCall(name="search_logs", arguments={"service": svc, "level": "error"}))
        for s in ex.world["services"]:
            for level in ("any", "warn", "error"):
                out = FAMILY.call_tool(ex.world, ToolCall(name="search_logs", arguments={"service": s, "level": level}))
                assert len(out.splitlines()) <= 9 and len(out) < 900
        out = FAMILY.call_tool(ex.world, ToolCall(name="list_deploys", arguments={"since": "00:00"}))
        assert len(out.splitlines()) == 9 and out.splitlines()[-1].startswith("... 5 more")
        assert "no deploys" in FAMILY.call_tool(ex.world, ToolCall(name="list_deploys", arguments={"since": "23:59"}))


# ---------------------------------------------------------------- difficulty


def test_difficulty_defaults_and_validation():
    assert FAMILY.difficulty({}).model_dump() == {"n_services": 5, "depth": 2, "n_distractor_deploys": 3,
                                                  "n_background_deploys": 3, "log_noise": 2}
    for bad in ({"bogus": 1}, {"n_services": 3}, {"n_services": 9}, {"depth": 0}, {"depth": 5},
                {"n_services": 5, "depth": 4}, {"n_distractor_deploys": 0}, {"log_noise": -1}):
        with pytest.raises(ValidationError):
            FAMILY.difficulty(bad)
    assert FAMILY.held_out is True and FAMILY.name == "triage"


# ---------------------------------------------------------------- reference job


def load_ref_env():
    from ait.job.env_loader import import_env

    return import_env(REF_JOB / "env.py")  # with the workspace's task_tools.py importable


def test_reference_job_passes_probe(monkeypatch, tmp_path):
    from ait.probe.runner import probe_workspace

    monkeypatch.setitem(ait.families.FAMILIES, "triage", FAMILY)
    spec = build_spec("triage", constraints=CONSTRAINTS)
    ws = tmp_path / "ws"
    shutil.copytree(REF_JOB, ws)
    report = probe_workspace(ws, spec)
    assert report.valid, report.summary()


def test_reference_env_is_self_contained_and_prompt_matches():
    src = (REF_JOB / "env.py").read_text()
    assert not re.search(r"^\s*(from|import)\s+ait\b", src, re.M)
    env = load_ref_env()
    assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt


def test_reference_dataset_rows_are_solvable_and_distinct():
    env = load_ref_env()
    rows = env.build_dataset(120, seed=5)
    assert len(rows) == 120 and len({r["prompt"] for r in rows}) == 120
    assert env.build_dataset(10, seed=5) == rows[:10]
    for r in rows:
        assert PROMPT_RE.fullmatch(r["prompt"]), r["prompt"]
        assert independent_root(r["info"]["world"]) == [r["answer"]], r["prompt"]
        e = env.Environment()
        e.reset(r["info"])

        def call(name, **args):
            return getattr(e, name)(**args)

        assert solve(r["prompt"], call) == r["answer"]
        assert FAMILY.score(f"Answer: {r['answer']}", r["answer"]) == 1.0
        assert env.reward_correct(f"Answer: {r['answer']}", r["answer"], r["info"]) == 1.0
        wrong_version = r["answer"].rsplit(".", 1)[0] + ".999"
        assert env.reward_correct(f"Answer: {wrong_version}", r["answer"], r["info"]) == 0.0
        assert env.reward_partial(f"Answer: {wrong_version}", r["answer"], r["info"]) == 0.5
        assert env.reward_format("no idea", r["answer"], r["info"]) == 0.0


def _reference_rows_at(tmp_path, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    return reference_rows_at(tmp_path, "triage", knobs, n, seed)


def _chain_length(world: dict, src: str, dst: str) -> int:
    """Dependency hops from src to dst (breadth first over the world's graph)."""
    frontier, seen, hops = {src}, {src}, 0
    while dst not in frontier:
        frontier = {d for s in frontier for d in world["deps"][s]} - seen
        seen |= frontier
        hops += 1
        assert frontier, (src, dst)
    return hops


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: the easiest rung trains on a one-hop chain among
    four services, one distractor deploy and quiet logs (it once drew 4-7 services, depth 1-3 and a
    random mix of deploys and noise whatever the task asked)."""
    easiest = {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0}
    rows = _reference_rows_at(tmp_path, easiest)
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 200
    for r in rows:
        world = r["info"]["world"]
        alerting = PROMPT_RE.fullmatch(r["prompt"]).group(2)
        assert len(world["services"]) == 4 and len(world["deploys"]) == 2, r["prompt"]
        assert _chain_length(world, alerting, r["answer"].split("@")[0]) == 1
        assert all(e["level"] == "ERROR" for lines in world["logs"].values() for e in lines)
        assert independent_root(world) == [r["answer"]]
    # a harder rung: every knob shows in the world
    hard = {"n_services": 8, "depth": 4, "n_distractor_deploys": 5, "n_background_deploys": 3, "log_noise": 3}
    for r in _reference_rows_at(tmp_path, hard, 100):
        world = r["info"]["world"]
        alert = min(minutes(a["time"]) for a in world["alerts"])
        alerting = PROMPT_RE.fullmatch(r["prompt"]).group(2)
        assert len(world["services"]) == 8 and len(world["deploys"]) == 1 + 5 + 3, r["prompt"]
        assert sum(alert - minutes(d["time"]) > 100 for d in world["deploys"]) == 3  # the background ones
        assert _chain_length(world, alerting, r["answer"].split("@")[0]) == 4
        assert all(sum(e["level"] != "ERROR" for e in lines) == 3 for lines in world["logs"].values())
        assert independent_root(world) == [r["answer"]]
    # without task.json (an older workspace): 4-7 services and depth 1-3, as before
    old = _reference_rows_at(tmp_path, None)
    assert {len(r["info"]["world"]["services"]) for r in old} == {4, 5, 6, 7}
    assert {_chain_length(r["info"]["world"], PROMPT_RE.fullmatch(r["prompt"]).group(2), r["answer"].split("@")[0])
            for r in old} == {1, 2, 3}


# ---------------------------------------------------------------- inline (the data stated in the question)

EASIEST = {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0}
INLINE_CONFIGS = [EASIEST, {}, {"n_services": 5, "depth": 1, "n_distractor_deploys": 3, "n_background_deploys": 0,
                                "log_noise": 0}] + CONFIGS[2:]
ALERT_LINE_RE = re.compile(r"^(\d\d:\d\d) ([a-z]+): (.+)$")
DEPS_LINE_RE = re.compile(r"^([a-z]+) calls: (.+)$")
DEPLOY_LINE_RE = re.compile(r"^(\d\d:\d\d) ([a-z]+)@(\d+\.\d+\.\d+)$")
ERROR_LINE_RE = re.compile(r"^(\d\d:\d\d) ([a-z]+) ERROR (.*?)(?: \(x\d+, last \d\d:\d\d\))?$")


def solve_from_text(prompt: str) -> str:
    """The task's rule applied to nothing but the question's text (no tools, no world)."""
    head, _, body = prompt.partition("\n\n")
    m = PROMPT_RE.fullmatch(head)
    assert m and body, prompt
    alerts, deps, deploys, own_errors, section = [], {}, [], {}, None
    for ln in body.splitlines():
        if ln in ("Alerts:", "Dependencies:", "Deploys today:", "Error logs (earliest first):"):
            section = ln[:-1]
            continue
        if section == "Alerts":
            am = ALERT_LINE_RE.match(ln)
            alerts.append((minutes(am.group(1)), am.group(2)))
        elif section == "Dependencies":
            dm = DEPS_LINE_RE.match(ln)
            deps[dm.group(1)] = [] if dm.group(2) == "nothing" else dm.group(2).split(", ")
        elif section == "Deploys today":
            pm = DEPLOY_LINE_RE.match(ln)
            deploys.append((minutes(pm.group(1)), pm.group(2), pm.group(3)))
        elif section == "Error logs (earliest first)":
            if ln.startswith("No error lines: "):
                continue
            em = ERROR_LINE_RE.match(ln)
            assert em, ln
            own_errors.setdefault(em.group(2), []).append((minutes(em.group(1)), em.group(3)))
        else:
            raise AssertionError(f"line outside a section: {ln!r}")
    assert alerts and deps and deploys, prompt
    first = min(t for t, _ in alerts)
    assert m.group(2) in {s for _, s in alerts}
    reach = closure(deps, [s for _, s in alerts])
    found = []
    for t, svc, ver in deploys:
        if svc not in reach or not 0 < first - t <= 60:
            continue
        own = [x for x, msg in own_errors.get(svc, []) if not any(re.search(rf"\b{n}\b", msg) for n in deps)]
        if any(t < x <= first for x in own) and not any(t - 60 <= x <= t for x in own):
            found.append(f"{svc}@{ver}")
    assert len(found) == 1, (prompt, found)
    return found[0]


def test_inline_off_changes_nothing():
    """inline=False (the default) keeps examples, the eval format and the difficulty's dump byte-identical
    to before the knob existed (the dump seeds the hidden eval and is written into task specs)."""
    import hashlib

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()

    pinned = {"{}": "168e8714b60edd22c467558898863808e6980d23dfde26f1e75ddd811cef4921",
              json.dumps(EASIEST): "e3423f27babf54aaac2a44d036bd2289f69e6bcbb7aa88c8679ce9ba6e251c72",
              json.dumps(CONFIGS[3]): "3740ee23b73e4749577c2f0498cd65cfcc1ee957dde3a8dae9d440f0fa989833"}
    for knobs, want in pinned.items():
        for extra in ({}, {"inline": False}):
            d = FAMILY.difficulty({**json.loads(knobs), **extra})
            rng = random.Random(2024)
            assert digest([FAMILY.example(rng, d).model_dump() for _ in range(30)]) == want, (knobs, extra)
    for extra in ({}, {"inline": False}):
        fmt = FAMILY.eval_format(FAMILY.difficulty(extra))
        assert hashlib.sha256(fmt.model_dump_json().encode()).hexdigest() == \
            "a9623938abdff9c220023de54c1f3200a749e9a98ccec6d1099cdd47c42a6557"
    assert FAMILY.difficulty({"inline": False}).model_dump() == FAMILY.difficulty({}).model_dump()
    assert "inline" not in FAMILY.difficulty({}).model_dump()
    on = FAMILY.difficulty({"inline": True})
    assert on.model_dump()["inline"] is True and FAMILY.difficulty(on.model_dump()) == on
    assert build_spec("triage", constraints=CONSTRAINTS).difficulty == FAMILY.difficulty({}).model_dump()


@pytest.mark.parametrize("i", range(len(INLINE_CONFIGS)))
def test_inline_prompt_states_the_data_of_the_same_example(i):
    knobs = INLINE_CONFIGS[i]
    plain, inline = examples(knobs, 60, seed=900 + i), examples({**knobs, "inline": True}, 60, seed=900 + i)
    for p, ex in zip(plain, inline):
        assert (ex.world, ex.answer) == (p.world, p.answer)  # same draws: only the question grows
        assert ex.prompt.startswith(p.prompt + "\n\n") and ex.prompt != p.prompt
        lines = set(ex.prompt.splitlines())
        w = ex.world
        for a in w["alerts"]:
            assert f"{a['time']} {a['service']}: {a['symptom']}" in lines
        for d in w["deploys"]:
            assert f"{d['time']} {d['service']}@{d['version']}" in lines
        for s, called in w["deps"].items():
            assert f"{s} calls: {', '.join(called) or 'nothing'}" in lines
        root = ex.answer.split("@")[0]
        first_own = next(e for e in w["logs"][root] if e["level"] == "ERROR")
        assert any(ln.startswith(f"{first_own['time']} {root} ERROR {first_own['msg']}") for ln in lines)
        assert " WARN " not in ex.prompt and " INFO " not in ex.prompt  # the noise stays behind the tools
        if knobs in (EASIEST, {}):
            assert len(ex.prompt) < 1300, ex.prompt  # about 400 tokens at most at the easy rungs


@pytest.mark.parametrize("i", range(len(INLINE_CONFIGS)))
def test_inline_prompt_alone_reaches_the_gold_answer(i):
    knobs = {**INLINE_CONFIGS[i], "inline": True}
    for ex in examples(knobs, 150, seed=1300 + i):
        assert FAMILY.score(f"From the question.\nAnswer: {solve_from_text(ex.prompt)}", ex.answer) == 1.0
    with pytest.raises(AssertionError):  # without inline the question alone is not enough
        solve_from_text(examples(INLINE_CONFIGS[i], 1, seed=1300 + i)[0].prompt)


def test_inline_hidden_like_set_is_solvable_from_the_text(monkeypatch, tmp_path):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setitem(ait.families.FAMILIES, "triage", FAMILY)
    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "triage-family-test")
    spec = build_spec("triage", difficulty={**EASIEST, "inline": True}, constraints=CONSTRAINTS)
    assert spec.difficulty["inline"] is True
    exs = hidden_examples(spec)
    assert all(solve_from_text(ex.prompt) == ex.answer for ex in exs)
    assert all(solve_from_text(d.prompt) == d.answer for d in spec.dev_examples)


def test_inline_system_prompt_says_the_data_is_in_the_question():
    plain, inline = FAMILY.eval_format(FAMILY.difficulty({})), FAMILY.eval_format(FAMILY.difficulty({"inline": True}))
    assert plain.system_prompt.startswith("You are an on-call engineer triaging an incident. Use the tools:")
    assert "question" not in plain.system_prompt
    assert inline.system_prompt != plain.system_prompt
    assert "The question lists" in inline.system_prompt and "optional" in inline.system_prompt
    assert "Answer: <service>@<version>" in inline.system_prompt
    # only the system prompt differs: same tools, answer format and budgets
    assert inline.model_dump(exclude={"system_prompt"}) == plain.model_dump(exclude={"system_prompt"})
    ex = examples({"inline": True}, 1, seed=3)[0]
    assert [t.__name__ for t in FAMILY.tools(ex.world)] == [t.name for t in inline.tools]


def test_reference_env_honours_inline_from_task_json(tmp_path):
    from ait.families.triage import inline_data
    from ait.job.env_loader import import_env

    ws = tmp_path / "ws-triage"
    for knobs in (EASIEST, {"n_services": 6, "depth": 3, "n_distractor_deploys": 4, "log_noise": 3}):
        plain = _reference_rows_at(tmp_path, knobs, 60, seed=4)
        assert import_env(ws / "env.py").SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty(knobs)).system_prompt
        rows = _reference_rows_at(tmp_path, {**knobs, "inline": True}, 60, seed=4)
        env = import_env(ws / "env.py")
        assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({"inline": True})).system_prompt
        assert len(rows) == 60
        for p, r in zip(plain, rows):
            assert (r["answer"], r["info"]) == (p["answer"], p["info"])  # same worlds, answers and info
            # the family's inline layout, computed by the family from the row's world
            assert r["prompt"] == f"{p['prompt']}\n\n{inline_data(r['info']['world'])}"
            assert solve_from_text(r["prompt"]) == r["answer"]
            assert env.reward_correct(f"Answer: {r['answer']}", r["answer"], r["info"]) == 1.0
    # no task.json (or inline off): the dataset is what it always was
    import hashlib

    env = import_env(REF_JOB / "env.py")
    assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt
    assert hashlib.sha256(json.dumps(env.build_dataset(40, 3), sort_keys=True).encode()).hexdigest() == \
        "99e510886cf4ca5edb517ecb24f3f30a939dd823cc2ec950c0029588784a2e9f"
