"""dispatch: generator determinism, gold answers recomputed independently from the world,
scripted solvers that see only the prompt and the tools, guessing fails, the scorer, tool
errors, JSON schemas, the reference job's probe and its agreement with the family's tools.

The evaluator below re-implements the rule semantics on the raw world data; the solvers
parse tool text with their own regexes and never read Example.world or the answer.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

import ait.families
from ait.families import ToolCall
from ait.families.dispatch import Dispatch
from ait.spec import Constraints, build_spec
from tests.reference_rows import reference_rows_at

FAMILY = Dispatch()
REPO = Path(__file__).resolve().parents[1]
REF_DIR = REPO / "src" / "ait" / "policy" / "reference_jobs" / "dispatch"
CONSTRAINTS = Constraints(
    allowed_base_models=["tiny", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200, max_group_size=16,
    max_prompts_per_step=16, max_completion_tokens=512, max_turns=8, time_budget_s=600,
    min_dataset_rows=32, max_dataset_rows=20000,
)


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ait.families.FAMILIES, "dispatch", FAMILY)
    monkeypatch.setenv("AIT_HIDDEN_SEED", "dispatch-test-seed")


def hidden(knobs: dict | None = None) -> list:
    from ait.evals.hidden import hidden_examples

    spec = build_spec("dispatch", difficulty=knobs, constraints=CONSTRAINTS)
    exs = hidden_examples(spec)
    assert len(exs) == 200
    return exs


# ---------------------------------------------------------------- independent evaluator


def cond_ok(attr_value, op: str, target) -> bool:
    if op in (">=", "<=", ">", "<"):
        assert isinstance(attr_value, int) and isinstance(target, int)
        return {">=": attr_value >= target, "<=": attr_value <= target,
                ">": attr_value > target, "<": attr_value < target}[op]
    if op == "==":
        return attr_value == target
    if op == "!=":
        return attr_value != target
    assert isinstance(target, list) and len(target) >= 1
    return (attr_value in target) == (op == "in")


def route(world: dict, rid: str) -> tuple[int | None, str]:
    """(1-based index of the first matching rule or None, queue)."""
    req = world["requests"][rid]
    for i, rule in enumerate(world["rules"], start=1):
        if all(cond_ok(req[c["attr"]], c["op"], c["value"]) for c in rule["conditions"]):
            return i, rule["queue"]
    return None, world["default_queue"]


def expected_answer(world: dict) -> str:
    counts = Counter(route(world, t)[1] for t in world["targets"]).most_common()
    assert len(counts) == 1 or counts[0][1] > counts[1][1], "the busiest queue is not unique"
    return counts[0][0]


# ---------------------------------------------------------------- scripted solvers (prompt + tools only)


def solve_by_checking(prompt: str, call) -> str:
    """count_rules, then check_rule 1, 2, ... per request until one matches."""
    ids = re.findall(r"REQ-\d{4}", prompt)
    assert ids, prompt
    info = call("count_rules")
    m = re.match(r"(\d+) rules .* the default queue is (\S+)$", info)
    assert m, info
    n, default = int(m.group(1)), m.group(2)
    queues = []
    for rid in ids:
        queue = default
        for i in range(1, n + 1):
            out = call("check_rule", rule_index=i, request_id=rid)
            assert not out.startswith("error"), out
            hit = re.fullmatch(rf"rule {i} matches {rid} -> queue (\S+)", out)
            if hit:
                queue = hit.group(1)
                break
            assert out.startswith(f"rule {i} does not match {rid}: failed "), out
        queues.append(queue)
    return Counter(queues).most_common(1)[0][0]


COND_RE = re.compile(r'(\w+) (>=|<=|>|<|==|!=|not in|in) (.+)')


def solve_by_reading(prompt: str, call) -> str:
    """get_request + get_rule for every rule, evaluated here from the text alone."""
    ids = re.findall(r"REQ-\d{4}", prompt)
    m = re.match(r"(\d+) rules .* the default queue is (\S+)$", call("count_rules"))
    n, default = int(m.group(1)), m.group(2)
    rules = []
    for i in range(1, n + 1):
        text = call("get_rule", index=i)
        rm = re.fullmatch(rf"rule {i}: if (.+) -> queue (\S+)", text)
        assert rm, text
        conds = []
        for part in rm.group(1).split(" and "):
            cm = COND_RE.fullmatch(part)
            assert cm, part
            conds.append((cm.group(1), cm.group(2), json.loads(cm.group(3))))
        rules.append((conds, rm.group(2)))
    queues = []
    for rid in ids:
        text = call("get_request", request_id=rid)
        assert text.startswith(f"{rid}: "), text
        attrs = {}
        for pair in text[len(rid) + 2:].split(", "):
            k, v = pair.split("=")
            attrs[k] = int(v) if v.isdigit() else v
        queue = default
        for conds, q in rules:
            if all(cond_ok(attrs[a], op, val) for a, op, val in conds):
                queue = q
                break
        queues.append(queue)
    return Counter(queues).most_common(1)[0][0]


def bound_call(world):
    log = []

    def call(name, **args):
        log.append(name)
        return FAMILY.call_tool(world, ToolCall(name=name, arguments=args))

    return call, log


# ---------------------------------------------------------------- determinism and world


@pytest.mark.parametrize("knobs", [{}, {"n_rules": 10, "n_targets": 3, "conditions_per_rule": 4, "n_attributes": 8}])
def test_same_seed_gives_identical_examples(knobs):
    a = examples(knobs, 40, seed=11)
    b = examples(knobs, 40, seed=11)
    assert [(e.prompt, e.world, e.answer) for e in a] == [(e.prompt, e.world, e.answer) for e in b]
    assert len({json.dumps(e.world, sort_keys=True) for e in a}) == 40


def test_different_seeds_differ():
    a = examples({}, 40, seed=1)
    b = examples({}, 40, seed=2)
    assert [e.prompt for e in a] != [e.prompt for e in b]
    assert [e.world for e in a] != [e.world for e in b]


def test_world_is_json_serialisable_plain_data():
    for ex in examples({"n_targets": 2}, 30, seed=3):
        assert json.loads(json.dumps(ex.world)) == ex.world


def test_prompt_does_not_leak_rules_or_attributes():
    for ex in examples({}, 100, seed=4):
        rid = ex.world["targets"][0]
        assert rid in ex.prompt
        assert ex.answer not in ex.prompt.lower()
        for rule in ex.world["rules"]:
            assert rule["queue"] not in ex.prompt
        for v in ex.world["requests"][rid].values():
            if isinstance(v, str):
                assert f" {v} " not in f" {ex.prompt.lower()} ".replace("?", " ")


# ---------------------------------------------------------------- gold answers (independent)


@pytest.mark.parametrize("knobs", [
    {},
    {"n_rules": 2, "near_misses": 0, "conditions_per_rule": 1, "n_attributes": 2},
    {"n_rules": 12, "near_misses": 11, "conditions_per_rule": 4, "n_attributes": 8},
    {"n_rules": 8, "near_misses": 3, "n_targets": 2},
    {"n_targets": 3},
])
def test_gold_answers_match_independent_evaluator(knobs):
    d = FAMILY.difficulty(knobs)
    positions = Counter()
    for ex in examples(knobs, 80, seed=21):
        w = ex.world
        assert len(w["rules"]) == d.n_rules
        assert len(w["targets"]) == d.n_targets == len(set(w["targets"]))
        assert all(t in ex.prompt for t in w["targets"])
        assert len(w["attributes"]) == d.n_attributes
        for rule in w["rules"]:
            k = len(rule["conditions"])
            assert max(1, d.conditions_per_rule - 1) <= k <= d.conditions_per_rule
            assert len({c["attr"] for c in rule["conditions"]}) == k
        assert len({r["queue"] for r in w["rules"]} | {w["default_queue"]}) == d.n_rules + 1
        assert ex.answer == expected_answer(w)
        pos, _ = route(w, w["targets"][0]) if d.n_targets == 1 else (None, None)
        positions[pos] += 1
        if d.n_targets == 1:
            assert pos is None or pos > d.near_misses
            # exactly near_misses rules before the match fail on exactly one condition
            req = w["requests"][w["targets"][0]]
            last = pos - 1 if pos else d.n_rules
            fails = [sum(not cond_ok(req[c["attr"]], c["op"], c["value"]) for c in r["conditions"])
                     for r in w["rules"][:last]]
            assert all(f >= 1 for f in fails)
            assert sum(f == 1 for f in fails) >= d.near_misses
    if d.n_targets == 1 and d.n_rules > 2:
        # the default queue and every allowed match position occur
        assert positions[None] > 0 and len(positions) >= min(3, d.n_rules - d.near_misses + 1), positions


def test_default_needs_two_dependent_calls_at_least():
    for ex in examples({}, 200, seed=5):
        trace = FAMILY.gold_trace(ex)
        assert len(trace) >= 4  # count_rules + rules 1..3 at least (match is after 2 near misses)


# ---------------------------------------------------------------- solvers over the hidden set


def test_scripted_solvers_reach_gold_on_hidden_set(registered):
    exs = hidden()
    for solver in (solve_by_checking, solve_by_reading):
        hits = 0
        for ex in exs:
            call, _ = bound_call(ex.world)
            hits += FAMILY.score(f"Working...\nAnswer: {solver(ex.prompt, call)}", ex.answer)
        assert hits == 200, solver.__name__


def test_scripted_solver_multi_target(registered):
    for ex in hidden({"n_targets": 3, "n_rules": 5, "near_misses": 1})[:100]:
        call, _ = bound_call(ex.world)
        assert FAMILY.score(f"Answer: {solve_by_checking(ex.prompt, call)}", ex.answer) == 1.0


def test_gold_trace_replay_reaches_answer():
    for ex in examples({}, 100, seed=6) + examples({"n_targets": 2}, 50, seed=7):
        trace = FAMILY.gold_trace(ex)
        assert trace[0].name == "count_rules"
        outs = [FAMILY.call_tool(ex.world, c) for c in trace]
        assert not any(o.startswith("error") for o in outs)
        matched = [re.search(r"-> queue (\S+)$", o).group(1) for o in outs if " matches " in o]
        default = re.search(r"default queue is (\S+)$", outs[0]).group(1)
        per_target = []
        for rid in ex.world["targets"]:
            mine = [o for o in outs if f" {rid}" in o and " matches " in o]
            per_target.append(re.search(r"-> queue (\S+)$", mine[0]).group(1) if mine else default)
        assert len(matched) <= len(ex.world["targets"])
        assert Counter(per_target).most_common(1)[0][0] == ex.answer
        eval_tools = {t.name: [p.name for p in t.parameters] for t in FAMILY.eval_format(FAMILY.difficulty({})).tools}
        for c in trace:
            assert list(c.arguments) == eval_tools[c.name]


# ---------------------------------------------------------------- guessing fails


def test_answer_only_guessing_scores_low(registered):
    exs = hidden()
    common = Counter(ex.answer for ex in examples({}, 300, seed=99)).most_common(1)[0][0]
    guesses = {
        "general": lambda p: "general",
        "escalations": lambda p: "escalations",
        "most common public answer": lambda p: common,
        "request id": lambda p: re.search(r"REQ-\d+", p).group(0),
    }
    for name, guess in guesses.items():
        hits = sum(FAMILY.score(f"Answer: {guess(ex.prompt)}", ex.answer) for ex in exs)
        assert hits / len(exs) < 0.10, f"guessing {name} scores {hits}/200"


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: billing-support", "billing-support", 1.0),
    ("answer: Billing Support", "billing-support", 1.0),
    ("Answer: billing_support.", "billing-support", 1.0),
    ('Answer: "billing-support"', "billing-support", 1.0),
    ("**Answer:** `billing-support`", "billing-support", 1.0),
    ("Answer: queue billing-support", "billing-support", 1.0),
    ("Answer: the billing-support queue", "billing-support", 1.0),
    ("Rule 2 matches.\nAnswer:   GENERAL  ", "general", 1.0),
    ("Answer: general\nAnswer: tier1", "tier1", 1.0),
    ("Answer: general\nAnswer: tier1", "general", 0.0),
    ("Answer: billing", "billing-support", 0.0),
    ("Answer: billing-support-2", "billing-support", 0.0),
    ("billing-support", "billing-support", 0.0),
    ("The queue is billing-support.", "billing-support", 0.0),
    ("Answer:", "general", 0.0),
    ("Answer: ...", "general", 0.0),
    ("", "general", 0.0),
])
def test_score(response, answer, expected):
    assert FAMILY.score(response, answer) == expected


def test_score_none_is_zero():
    assert FAMILY.score(None, "general") == 0.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- tools


def test_tools_have_json_schemas_matching_the_eval_format():
    from transformers.utils import get_json_schema

    ex = examples({}, 1, seed=0)[0]
    fmt = FAMILY.eval_format(FAMILY.difficulty({}))
    fns = FAMILY.tools(ex.world)
    assert [f.__name__ for f in fns] == [t.name for t in fmt.tools]
    type_of = {"string": "string", "integer": "integer"}
    for fn, spec in zip(fns, fmt.tools):
        schema = get_json_schema(fn)["function"]
        props = schema["parameters"].get("properties", {})
        assert list(props) == [p.name for p in spec.parameters]
        for p in spec.parameters:
            assert props[p.name]["type"] == type_of[p.type]
            assert props[p.name].get("description")
        # the spec's example runs against an arbitrary world and returns text
        for other in examples({}, 3, seed=8):
            out = FAMILY.call_tool(other.world, ToolCall(name=spec.name, arguments=spec.example))
            assert isinstance(out, str) and out


@pytest.mark.parametrize("name, args", [
    ("get_request", {"request_id": "REQ-0000"}),
    ("get_request", {"request_id": ""}),
    ("get_request", {"request_id": None}),
    ("get_request", {"request_id": ["REQ-1"]}),
    ("get_request", {}),
    ("get_rule", {"index": 0}),
    ("get_rule", {"index": 99}),
    ("get_rule", {"index": -1}),
    ("get_rule", {"index": "one"}),
    ("get_rule", {"index": ""}),
    ("get_rule", {"index": True}),
    ("get_rule", {"index": 1.5}),
    ("get_rule", {"index": None}),
    ("check_rule", {"rule_index": 0, "request_id": "TARGET"}),
    ("check_rule", {"rule_index": 1, "request_id": "nope"}),
    ("check_rule", {"rule_index": "x", "request_id": "TARGET"}),
    ("check_rule", {"rule_index": 1}),
    ("check_rule", {"rule_index": 1, "request_id": "TARGET", "extra": 1}),
    ("count_rules", {"x": 1}),
    ("list_rules", {}),
    ("", {}),
])
def test_bad_calls_return_error_text(name, args):
    ex = examples({}, 1, seed=9)[0]
    args = {k: (ex.world["targets"][0] if v == "TARGET" else v) for k, v in args.items()}
    out = FAMILY.call_tool(ex.world, ToolCall(name=name, arguments=args))
    assert isinstance(out, str) and out.startswith("error:"), out
    for fn in FAMILY.tools(ex.world):  # direct calls never raise either
        if fn.__name__ == name and set(args) <= set(fn.__code__.co_varnames):
            try:
                fn(**args)
            except TypeError:
                pass  # missing argument: call_tool turns it into an error text, tested above


def test_lenient_argument_forms():
    ex = examples({}, 1, seed=10)[0]
    rid = ex.world["targets"][0]
    call, _ = bound_call(ex.world)
    base = call("get_request", request_id=rid)
    assert call("get_request", request_id=f"  {rid.lower()} ") == base
    assert call("get_request", request_id=rid[4:]) == base
    assert call("get_rule", index="2") == call("get_rule", index=2) == call("get_rule", index=2.0)
    assert call("check_rule", rule_index="1", request_id=rid) == call("check_rule", rule_index=1, request_id=rid)


def test_check_rule_agrees_with_evaluator_on_every_rule_and_request():
    for ex in examples({"n_rules": 8}, 30, seed=12):
        call, _ = bound_call(ex.world)
        for rid, req in ex.world["requests"].items():
            for i, rule in enumerate(ex.world["rules"], start=1):
                out = call("check_rule", rule_index=i, request_id=rid)
                failed = [c for c in rule["conditions"] if not cond_ok(req[c["attr"]], c["op"], c["value"])]
                if failed:
                    assert out.startswith(f"rule {i} does not match {rid}: failed ")
                    assert out.count("(request has ") == len(failed)
                else:
                    assert out == f"rule {i} matches {rid} -> queue {rule['queue']}"


# ---------------------------------------------------------------- difficulty


def test_default_difficulty():
    assert FAMILY.difficulty(None).model_dump() == {
        "n_rules": 6, "conditions_per_rule": 3, "n_attributes": 5, "near_misses": 2, "n_targets": 1}


@pytest.mark.parametrize("knobs", [
    {"n_rules": 1}, {"n_rules": 13}, {"near_misses": 6}, {"conditions_per_rule": 0},
    {"conditions_per_rule": 4, "n_attributes": 3}, {"n_attributes": 9}, {"n_targets": 4}, {"bogus": 1},
])
def test_bad_difficulty_rejected(knobs):
    with pytest.raises(ValidationError):
        FAMILY.difficulty(knobs)


def test_eval_format_turns_cover_gold_trace():
    for knobs in [{}, {"n_rules": 12, "near_misses": 11}, {"n_targets": 2, "n_rules": 8}]:
        d = FAMILY.difficulty(knobs)
        fmt = FAMILY.eval_format(d)
        longest = max(len(FAMILY.gold_trace(ex)) for ex in examples(knobs, 60, seed=13))
        assert fmt.max_turns >= min(32, longest + 1)
        assert 96 <= fmt.max_new_tokens <= 128


# ---------------------------------------------------------------- reference job


def load_reference_env():
    from ait.job.env_loader import import_env

    return import_env(REF_DIR / "env.py")  # with the workspace's task_tools.py importable


def test_reference_job_passes_probe(registered, tmp_path):
    from ait.probe.runner import probe_workspace

    ws = tmp_path / "ws"
    shutil.copytree(REF_DIR, ws)
    spec = build_spec("dispatch", constraints=CONSTRAINTS)
    report = probe_workspace(ws, spec)
    assert report.valid, report.summary()


def test_reference_env_is_self_contained_and_matches_spec():
    source = (REF_DIR / "env.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+ait\b", source, re.M)
    env = load_reference_env()
    assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt
    rows = env.build_dataset(64, seed=0)
    assert len(rows) == 64 and len({r["prompt"] for r in rows}) == 64
    for r in rows:  # the reference dataset's answers agree with the independent evaluator
        assert r["answer"] == expected_answer(r["info"]["world"])
        assert env.reward_correct(f"Answer: {r['answer']}", r["answer"], r["info"]) == 1.0
        assert env.reward_correct("Answer: nowhere", r["answer"], r["info"]) == 0.0
        wrong = next(q["queue"] for q in r["info"]["world"]["rules"] if q["queue"] != r["answer"])
        assert 0.0 < env.reward_known_queue(f"Answer: {wrong}", r["answer"], r["info"]) < 1.0


def _reference_rows_at(tmp_path, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    return reference_rows_at(tmp_path, "dispatch", knobs, n, seed)


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: the easiest rung trains on two one-condition
    rules (it once drew 3-7 rules of 1-3 conditions over 3-6 attributes whatever the task asked)."""
    easiest = {"n_rules": 2, "conditions_per_rule": 1, "n_attributes": 2, "near_misses": 0}
    rows = _reference_rows_at(tmp_path, easiest)
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 200
    positions = Counter()
    for r in rows:
        world = r["info"]["world"]
        assert len(world["rules"]) == 2 and all(len(rule["conditions"]) == 1 for rule in world["rules"])
        assert len(world["attributes"]) == 2 and all(set(q) == set(world["attributes"])
                                                     for q in world["requests"].values())
        assert r["answer"] == expected_answer(world)
        positions[route(world, world["targets"][0])[0]] += 1
    assert set(positions) == {1, 2, None}
    # near misses: the match comes after near_misses rules that fail on exactly one condition
    knobs = {"n_rules": 5, "conditions_per_rule": 3, "n_attributes": 5, "near_misses": 2}
    for r in _reference_rows_at(tmp_path, knobs, 100):
        world = r["info"]["world"]
        rid = world["targets"][0]
        assert len(world["rules"]) == 5 and {len(rule["conditions"]) for rule in world["rules"]} <= {2, 3}
        pos, queue = route(world, rid)
        assert pos is None or pos >= 3, r["prompt"]
        near = [rule for rule in world["rules"][: (pos or 6) - 1]
                if sum(not cond_ok(world["requests"][rid][c["attr"]], c["op"], c["value"])
                       for c in rule["conditions"]) == 1]
        assert len(near) >= 2 and r["answer"] == queue
    # without task.json (an older workspace): 3-7 rules over 3-6 attributes, as before
    old = _reference_rows_at(tmp_path, None)
    assert {len(r["info"]["world"]["rules"]) for r in old} == set(range(3, 8))
    assert {len(r["info"]["world"]["attributes"]) for r in old} == set(range(3, 7))


# ---------------------------------------------------------------- inline: the rule table and request in the question

INLINE_KNOBS = [
    {"inline": True},
    {"inline": True, "n_rules": 2, "conditions_per_rule": 1, "n_attributes": 5, "near_misses": 0},
    {"inline": True, "n_rules": 2, "conditions_per_rule": 1, "n_attributes": 2, "near_misses": 0},
    {"inline": True, "n_rules": 3, "conditions_per_rule": 2, "n_attributes": 4, "near_misses": 1},
    {"inline": True, "n_rules": 12, "conditions_per_rule": 4, "n_attributes": 8, "near_misses": 11},
    {"inline": True, "n_rules": 8, "near_misses": 3, "n_targets": 3},
]
EASY_INLINE = {"inline": True, "n_rules": 2, "conditions_per_rule": 1, "n_attributes": 5, "near_misses": 0}
INLINE_REQ_RE = re.compile(r"Request (REQ-\d{4}): (.+)")
INLINE_RULE_RE = re.compile(r"rule (\d+): if (.+) -> queue (\S+)")
INLINE_DEFAULT_RE = re.compile(r"If no rule matches: default queue (\S+)")


def parse_inline(prompt: str) -> tuple[list[str], dict, list, str]:
    """(target ids in the question, their attributes, rules in order, default queue) read from the text alone."""
    lines = prompt.split("\n")
    ids = re.findall(r"REQ-\d{4}", lines[0])
    requests, rules, default = {}, [], None
    for line in lines[1:]:
        if m := INLINE_REQ_RE.fullmatch(line):
            attrs = {}
            for pair in m.group(2).split(", "):
                k, v = pair.split("=")
                attrs[k] = int(v) if v.isdigit() else v
            requests[m.group(1)] = attrs
        elif m := INLINE_RULE_RE.fullmatch(line):
            assert int(m.group(1)) == len(rules) + 1, line  # numbered, in order
            conds = []
            for part in m.group(2).split(" and "):
                cm = COND_RE.fullmatch(part)
                assert cm, part
                conds.append((cm.group(1), cm.group(2), json.loads(cm.group(3))))
            rules.append((conds, m.group(3)))
        elif m := INLINE_DEFAULT_RE.fullmatch(line):
            default = m.group(1)
    assert ids and rules and default, prompt
    return ids, requests, rules, default


def inline_solver(prompt: str) -> str:
    """Reads only the inline question (no tools, no world): routes each stated request through the stated table."""
    ids, requests, rules, default = parse_inline(prompt)
    queues = []
    for rid in ids:
        queue = default
        for conds, q in rules:
            if all(cond_ok(requests[rid][a], op, val) for a, op, val in conds):
                queue = q
                break
        queues.append(queue)
    return Counter(queues).most_common(1)[0][0]


def test_inline_prompt_states_the_rules_and_the_request():
    for knobs in INLINE_KNOBS:
        for ex in examples(knobs, 40, seed=30):
            w = ex.world
            ids, requests, rules, default = parse_inline(ex.prompt)
            assert ids == w["targets"]
            assert requests == {rid: w["requests"][rid] for rid in w["targets"]}  # only the targets
            assert [q for _, q in rules] == [r["queue"] for r in w["rules"]]
            assert [[(c["attr"], c["op"], c["value"]) for c in r["conditions"]] for r in w["rules"]] == \
                [conds for conds, _ in rules]
            assert default == w["default_queue"]


def test_inline_prompt_alone_reaches_the_gold_answer():
    """An independent solver that reads only the inline question (never the tools or the world)
    solves every example across many seeds and knob settings."""
    for knobs in INLINE_KNOBS:
        for seed in range(5):
            for ex in examples(knobs, 40, seed=100 + seed):
                assert FAMILY.score(f"Answer: {inline_solver(ex.prompt)}", ex.answer) == 1.0, ex.prompt


def test_inline_solver_fails_on_plain_prompts_and_a_scrambled_table():
    """The solver really depends on the stated table: without it, or with the rules reordered, it fails."""
    for ex in examples({}, 5, seed=32):
        with pytest.raises(AssertionError):
            inline_solver(ex.prompt)
    wrong = 0
    for ex in examples(EASY_INLINE, 60, seed=33):
        head, *rest = ex.prompt.split("\n")
        rule_lines = [line for line in rest if line.startswith("rule ")]
        swapped = {rule_lines[0]: rule_lines[1].replace("rule 2:", "rule 1:"),
                   rule_lines[1]: rule_lines[0].replace("rule 1:", "rule 2:")}
        scrambled = "\n".join([head] + [swapped.get(line, line) for line in rest])
        wrong += FAMILY.score(f"Answer: {inline_solver(scrambled)}", ex.answer) == 0.0
    assert wrong >= 10


def test_inline_changes_only_the_question():
    """Same seed and knobs: the inline example has the same world and gold answer; its prompt is the
    plain question followed by the table, and the tools answer exactly as for the plain example."""
    for knobs in INLINE_KNOBS:
        plain_knobs = {k: v for k, v in knobs.items() if k != "inline"}
        plain = examples(plain_knobs, 40, seed=31)
        inline = examples(knobs, 40, seed=31)
        for p, q in zip(plain, inline):
            assert q.world == p.world and q.answer == p.answer
            assert q.prompt.startswith(p.prompt + "\n") and q.prompt.split("\n")[0] == p.prompt
            call, _ = bound_call(q.world)
            assert FAMILY.score(f"Answer: {solve_by_checking(q.prompt.split(chr(10))[0], call)}", q.answer) == 1.0


def test_inline_prompts_are_short_at_easy_rungs():
    for knobs in INLINE_KNOBS[1:4]:
        for ex in examples(knobs, 100, seed=34):
            # well under 350 tokens (the think-first tail is ~40 words of it)
            assert len(ex.prompt) < 800 and len(ex.prompt.split()) < 140, ex.prompt


def test_inline_answers_are_not_degenerate_at_easy_rungs(registered):
    """A constant strategy (always the default queue, always rule 1's queue) must not score well."""
    for knobs in INLINE_KNOBS[1:4]:
        exs = hidden(knobs)
        where = Counter()
        for ex in exs:
            w = ex.world
            queues = [r["queue"] for r in w["rules"]]
            where["default" if ex.answer == w["default_queue"] else queues.index(ex.answer) + 1] += 1
        assert max(where.values()) / len(exs) < 0.45, (knobs, where)
        assert where["default"] / len(exs) < 0.45, (knobs, where)


def test_non_inline_examples_and_dump_are_unchanged():
    """Pinned from the family before the inline knob existed: the same seed gives byte-identical
    examples and eval formats, and a false inline stays out of the dump (spec difficulty, hidden-set seed)."""
    import hashlib

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]

    pinned = {
        json.dumps({}): "e7a22a16289863bf",
        json.dumps({"n_rules": 2, "conditions_per_rule": 1, "n_attributes": 5, "near_misses": 0}): "c0eecbec64cdb6a8",
        json.dumps({"n_targets": 3, "n_rules": 8}): "eedd2f099c890f65",
    }
    for key, want in pinned.items():
        knobs = json.loads(key)
        for k in (knobs, {**knobs, "inline": False}):
            exs = examples(k, 60, seed=17)
            assert digest([[e.prompt, e.world, e.answer] for e in exs]) == want, k
        assert "inline" not in FAMILY.difficulty({**knobs, "inline": False}).model_dump()
    assert FAMILY.difficulty({"inline": True}).model_dump()["inline"] is True
    for knobs, want in [({}, "7eaea0e9a4c20d27"), ({"n_targets": 2}, "d83d2866845c362d")]:
        fmt = FAMILY.eval_format(FAMILY.difficulty({**knobs, "inline": False})).model_dump_json()
        assert hashlib.sha256(fmt.encode()).hexdigest()[:16] == want
    spec = build_spec("dispatch", difficulty={"inline": False}, constraints=CONSTRAINTS)
    assert spec.difficulty == build_spec("dispatch", constraints=CONSTRAINTS).difficulty
    assert "inline" not in spec.difficulty


def test_inline_system_prompt_says_the_rules_are_in_the_question():
    for extra in ({}, {"n_targets": 2}):
        plain = FAMILY.eval_format(FAMILY.difficulty(extra))
        inline = FAMILY.eval_format(FAMILY.difficulty({**extra, "inline": True}))
        assert plain.system_prompt != inline.system_prompt
        assert "only available through the tools" in plain.system_prompt
        assert "only available through the tools" not in inline.system_prompt
        assert "The question states the rules, the default queue and the request's attributes" in inline.system_prompt
        assert "optional" in inline.system_prompt
        assert "Answer: <queue name>" in inline.system_prompt
        # the tools, answer format and turn budget stay the same
        assert inline.tools == plain.tools and inline.answer_format == plain.answer_format
        assert inline.max_turns == plain.max_turns and inline.max_new_tokens >= plain.max_new_tokens
    assert "receives the most" in FAMILY.eval_format(FAMILY.difficulty({"inline": True, "n_targets": 2})).system_prompt


def test_reference_env_honours_inline_from_task_json(tmp_path):
    from ait.job.env_loader import import_env

    knobs = {"n_rules": 3, "conditions_per_rule": 2, "n_attributes": 4, "near_misses": 1}
    plain = _reference_rows_at(tmp_path, knobs, 100)
    rows = _reference_rows_at(tmp_path, {**knobs, "inline": True}, 100)
    env = import_env(tmp_path / "ws-dispatch" / "env.py")  # the workspace with the inline task.json
    assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({**knobs, "inline": True})).system_prompt
    assert len(rows) == 100
    for p, r in zip(plain, rows):
        world = r["info"]["world"]
        assert r["info"] == p["info"] and r["answer"] == p["answer"]
        assert r["prompt"].startswith(p["prompt"] + "\n")
        ids, requests, rules, default = parse_inline(r["prompt"])
        assert ids == world["targets"] and default == world["default_queue"] and len(rules) == 3
        assert inline_solver(r["prompt"]) == r["answer"] == expected_answer(world)
    # the family writes the same table for the same world
    ex = examples({**knobs, "inline": True}, 1, seed=0)[0]
    env_text = env.tt._inline_text(ex.world)
    assert ex.prompt.endswith("\n" + env_text)
    # without inline: the rows and the system prompt are as before (pinned from the env before the knob)
    import hashlib

    again = _reference_rows_at(tmp_path, knobs, 50)
    assert hashlib.sha256(json.dumps(again, sort_keys=True).encode()).hexdigest()[:16] == "7b78d286a2d0811d"
    env = import_env(tmp_path / "ws-dispatch" / "env.py")
    assert env.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty(knobs)).system_prompt
    assert "only available through the tools" in env.SYSTEM_PROMPT
