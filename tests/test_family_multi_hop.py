"""multi_hop: generator determinism, gold answers recomputed independently from the world,
a prompt-only scripted solver through the tools on the hidden set, answer-only guessing,
the scorer, tool error handling and schemas, difficulty validation, and the reference job
(probe + agreement of its tools with the family's).

The prompt parser and the walker below are written independently of ait.families.multi_hop:
they read the prompt with their own regexes and walk Example.world's plain dicts.
"""

from __future__ import annotations

import inspect
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers.utils import get_json_schema

import ait.families
from ait.families import ToolCall
from ait.families.multi_hop import MultiHop, render_inline
from ait.spec import Constraints, build_spec
from tests.reference_rows import reference_rows_at

FAMILY = MultiHop()
REPO = Path(__file__).resolve().parents[1]
REF_DIR = REPO / "src" / "ait" / "policy" / "reference_jobs" / "multi_hop"
CONSTRAINTS = Constraints(allowed_base_models=["tiny", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200,
                          max_group_size=16, max_prompts_per_step=16, max_completion_tokens=512, max_turns=8,
                          time_budget_s=600, min_dataset_rows=32, max_dataset_rows=20000)


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


# ---------------------------------------------------------------- independent prompt parser

NAME = r"([A-Z][a-z]+ [A-Z][a-z]+)"
NESTED_RE = re.compile(rf"What is the (.+) of {NAME}\?")
FOLLOW_RE = re.compile(rf"Start from {NAME}\. Follow their (.+)\. What is the (.+) of the person you reach\?")
POSSESSIVE_RE = re.compile(rf"What is {NAME}'s (.+)\?")


def field_of(words: str) -> str:
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", words), words
    return words.replace(" ", "_")


def parse_prompt(prompt: str) -> tuple[str, list[str], str, str]:
    """(start name, relations in the order they are followed, attribute, template) from the prompt alone."""
    if m := FOLLOW_RE.fullmatch(prompt):
        rels = m.group(2).split(", then that person's ")
        return m.group(1), [field_of(r) for r in rels], field_of(m.group(3)), "follow"
    if m := POSSESSIVE_RE.fullmatch(prompt):
        parts = m.group(2).split("'s ")
        return m.group(1), [field_of(r) for r in parts[:-1]], field_of(parts[-1]), "possessive"
    if m := NESTED_RE.fullmatch(prompt):
        parts = m.group(1).split(" of the ")
        return m.group(2), [field_of(r) for r in reversed(parts[1:])], field_of(parts[0]), "nested"
    raise AssertionError(f"prompt has no known shape: {prompt!r}")


def my_norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", "", text.lower().replace("-", " ").replace("_", " ")).split())


def walk(world: dict, start: str, relations: list[str]) -> list[str]:
    path = [start]
    for r in relations:
        path.append(world["people"][path[-1]][r])
    return path


# ---------------------------------------------------------------- determinism / serialisation


@pytest.mark.parametrize("knobs", [{}, {"hops": 4, "n_people": 40, "n_relations": 5, "n_attributes": 8,
                                        "n_similar": 10}])
def test_same_seed_gives_identical_examples(knobs):
    a, b = examples(knobs, 40, seed=123), examples(knobs, 40, seed=123)
    assert [(e.prompt, e.world, e.answer) for e in a] == [(e.prompt, e.world, e.answer) for e in b]
    assert len({e.prompt for e in a}) == 40


def test_different_seeds_differ():
    a = [e.prompt for e in examples({}, 50, seed=1)]
    b = [e.prompt for e in examples({}, 50, seed=2)]
    assert len(set(a) & set(b)) < 3


def test_world_is_plain_json():
    for ex in examples({}, 30, seed=4):
        assert json.loads(json.dumps(ex.world)) == ex.world
        for row in ex.world["people"].values():
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in row.items())


# ---------------------------------------------------------------- gold answers (independent)

GOLD_CONFIGS = [
    {},
    {"hops": 1, "n_people": 6, "n_relations": 1, "n_attributes": 1, "n_similar": 0},
    {"hops": 3},
    {"hops": 6, "n_people": 9, "n_relations": 1, "n_attributes": 2, "n_similar": 4},
    {"hops": 5, "n_people": 80, "n_relations": 5, "n_attributes": 8, "n_similar": 40},
]


def test_gold_answers_match_independent_walk():
    templates = Counter()
    for i, knobs in enumerate(GOLD_CONFIGS):
        d = FAMILY.difficulty(knobs)
        for ex in examples(knobs, 60, seed=500 + i):
            world = ex.world
            start, rels, attr, template = parse_prompt(ex.prompt)
            templates[template] += 1
            people = world["people"]
            assert len(people) == d.n_people
            assert len({n.lower() for n in people}) == d.n_people  # names distinct case-insensitively
            assert len(rels) == d.hops
            assert start in people
            for row in people.values():
                assert len(row) == d.n_relations + d.n_attributes
            path = walk(world, start, rels)
            assert len(set(path)) == len(path), "the path revisits a person"
            assert ex.answer == my_norm(people[path[-1]][attr]), (ex.prompt, ex.answer)
            # skipping hops never gives the answer
            for p in path[:-1]:
                assert my_norm(people[p][attr]) != ex.answer, (ex.prompt, p)
            if rels != rels[::-1]:
                rev = walk(world, start, rels[::-1])
                assert my_norm(people[rev[-1]][attr]) != ex.answer, ("reverse order gives the answer", ex.prompt)
    assert set(templates) == {"nested", "follow", "possessive"}


def test_relation_values_are_other_people():
    for ex in examples({"n_relations": 5, "n_attributes": 8}, 20, seed=8):
        people = ex.world["people"]
        fields = ex.world["fields"]
        rels = [f for f in fields if all(v in people for v in (row[f] for row in people.values()))]
        assert len(rels) == 5
        for name, row in people.items():
            assert all(row[r] != name for r in rels)


def test_similar_names_are_generated():
    for ex in examples({"n_similar": 8, "n_people": 24}, 10, seed=3):
        names = list(ex.world["people"])
        firsts = Counter(n.split()[0] for n in names)
        lasts = Counter(n.split()[1] for n in names)
        same_first = sum(c for c in firsts.values() if c > 1)
        same_last = sum(c for c in lasts.values() if c > 1)
        assert same_first + same_last >= 8, names
    none = examples({"n_similar": 0, "n_people": 6}, 5, seed=3)
    assert all(len(e.world["people"]) == 6 for e in none)


def test_gold_trace_replay_reaches_answer():
    for ex in examples({}, 50, seed=11) + examples({"hops": 4, "n_people": 30}, 20, seed=12):
        trace = FAMILY.gold_trace(ex)
        assert len(trace) == len(parse_prompt(ex.prompt)[1]) + 1 >= 2
        out = None
        for i, call in enumerate(trace):
            assert call.name == "lookup"
            if out is not None:
                assert call.arguments["name"] == out  # each lookup feeds the next
            out = FAMILY.call_tool(ex.world, call)
            assert not out.startswith("error"), (call, out)
        assert FAMILY.score(f"Answer: {out}", ex.answer) == 1.0


# ---------------------------------------------------------------- scripted solver on the hidden set


@pytest.fixture
def hidden(monkeypatch, tmp_path):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setitem(ait.families.FAMILIES, "multi_hop", FAMILY)
    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "multi-hop-test-secret")
    spec = build_spec("multi_hop", constraints=CONSTRAINTS)
    exs = hidden_examples(spec)
    assert len(exs) == 200
    return spec, exs


def scripted_solver(prompt: str, call) -> str:
    """Sees only the prompt and the tools."""
    name, rels, attr, _ = parse_prompt(prompt)
    for r in rels:
        name = call("lookup", name=name, field=r.replace("_", " "))  # fields as written in the prompt
        assert not name.startswith("error"), name
        assert call("search", name_prefix=name.split()[1]).count(name) == 1
    return f"The value is below.\nAnswer: {call('lookup', name=name.upper(), field=attr)}"


def test_scripted_solver_solves_hidden_set(hidden):
    spec, exs = hidden
    solved = 0
    for ex in exs:
        def call(tool, **args):
            return FAMILY.call_tool(ex.world, ToolCall(name=tool, arguments=args))
        solved += FAMILY.score(scripted_solver(ex.prompt, call), ex.answer)
    assert solved == 200


def test_one_hop_shortcut_fails_on_hidden_set(hidden):
    """Looking up the attribute of the start person (skipping the chain) never scores."""
    spec, exs = hidden
    hits = 0
    for ex in exs:
        start, rels, attr, _ = parse_prompt(ex.prompt)
        out = FAMILY.call_tool(ex.world, ToolCall(name="lookup", arguments={"name": start, "field": attr}))
        hits += FAMILY.score(f"Answer: {out}", ex.answer)
    assert hits == 0


def test_answer_only_guessing_scores_low(hidden):
    spec, exs = hidden
    # prior knowledge of the answer distribution: the most common answer per attribute on other seeds
    prior: dict[str, Counter] = {}
    for ex in examples({}, 2000, seed=77):
        prior.setdefault(parse_prompt(ex.prompt)[2], Counter())[ex.answer] += 1
    guesses = {
        "most common answer for the attribute": lambda p: prior[parse_prompt(p)[2]].most_common(1)[0][0],
        "the start person's name": lambda p: parse_prompt(p)[0],
        "a stock value": lambda p: {"city": "London", "birth_year": "1980", "favourite_color": "blue",
                                    "pet": "dog"}.get(parse_prompt(p)[2], "unknown"),
    }
    for label, guess in guesses.items():
        hits = sum(FAMILY.score(f"Answer: {guess(ex.prompt)}", ex.answer) for ex in exs)
        assert hits / len(exs) < 0.10, f"guessing {label} scores {hits}/{len(exs)}"


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: port aldren", "port aldren", 1.0),
    ("Answer: Port Aldren", "port aldren", 1.0),
    ("answer =   PORT   aldren.", "port aldren", 1.0),
    ("**Answer:** Port Aldren", "port aldren", 1.0),
    ("Answer: 'rock-climbing'", "rock climbing", 1.0),
    ("Answer: Halden & Pike", "halden pike", 1.0),
    ("Let me look.\nHer city is Velmora.\nAnswer: Velmora", "velmora", 1.0),
    ("Answer: 1987", "1987", 1.0),
    ("Answer: Velmora\nAnswer: Ostbrook", "ostbrook", 1.0),  # the last one wins
    ("Answer: Velmora\nAnswer: Ostbrook", "velmora", 0.0),
    ("Velmora", "velmora", 0.0),  # no Answer: line
    ("Answer: Velmoraa", "velmora", 0.0),
    ("Answer: Port", "port aldren", 0.0),
    ("Answer: 1988", "1987", 0.0),
    ("Answer:", "velmora", 0.0),
    ("Answer: ...", "velmora", 0.0),
    ("", "velmora", 0.0),
])
def test_score(response, answer, expected):
    assert FAMILY.score(response, answer) == expected


def test_score_none_is_zero():
    assert FAMILY.score(None, "velmora") == 0.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- tools


@pytest.fixture
def world():
    return examples({}, 1, seed=21)[0].world


def call(world, tool, **args):
    return FAMILY.call_tool(world, ToolCall(name=tool, arguments=args))


def test_lookup_normalises_name_and_field(world):
    name = next(iter(world["people"]))
    row = world["people"][name]
    attr = world["fields"][-1]
    assert call(world, "lookup", name=name, field=attr) == row[attr]
    assert call(world, "lookup", name=f"  {name.lower()}  ", field=attr.upper().replace("_", " ")) == row[attr]
    assert call(world, "lookup", name=name.replace(" ", "   "), field=attr.replace("_", "-")) == row[attr]


@pytest.mark.parametrize("args", [
    {"name": "", "field": "city"},
    {"name": "   ", "field": "city"},
    {"name": None, "field": "city"},
    {"name": 42, "field": "city"},
    {"name": ["x"], "field": "city"},
    {"name": "Nobody Atall", "field": "city"},
    {"field": "city"},  # missing name
    {"name": "x", "field": "city", "extra": 1},
])
def test_lookup_bad_name_is_error_text(world, args):
    out = call(world, "lookup", **args)
    assert isinstance(out, str) and out.startswith("error:"), out


def test_lookup_unknown_name_suggests_close_names(world):
    name = next(iter(world["people"]))
    out = call(world, "lookup", name=name[:-1], field="city")
    assert out.startswith("error: no person named") and name in out


@pytest.mark.parametrize("field", ["", "salary", None, 3, "manager of"])
def test_lookup_bad_field_lists_valid_fields(world, field):
    name = next(iter(world["people"]))
    out = call(world, "lookup", name=name, field=field)
    assert out.startswith("error:") and all(f in out for f in world["fields"]), out


@pytest.mark.parametrize("prefix", ["", "  ", None, 7, "Zzzq", "'"])
def test_search_errors(world, prefix):
    out = call(world, "search", name_prefix=prefix)
    assert out.startswith("error:"), out


def test_search_finds_by_first_name_and_surname(world):
    names = list(world["people"])
    first, last = names[0].split()
    assert names[0] in call(world, "search", name_prefix=first.lower())
    by_last = call(world, "search", name_prefix=last)
    assert names[0] in by_last
    assert all(n.split()[1].startswith(last) or n.split()[0].startswith(last) for n in by_last.split("; "))
    many = call(world, "search", name_prefix="a")  # capped and says how many more
    assert len(many.split("; ")) <= 8


def test_tools_work_on_an_empty_world():
    for fn in FAMILY.tools({}):
        spec = next(t for t in FAMILY.eval_format(FAMILY.difficulty({})).tools if t.name == fn.__name__)
        assert fn(**spec.example).startswith("error:")


def test_unknown_tool_is_error_text(world):
    out = call(world, "python", code="1")
    assert out.startswith("error:") and "lookup" in out


def test_tools_have_schemas_matching_the_eval_format(world):
    fmt = FAMILY.eval_format(FAMILY.difficulty({}))
    fns = FAMILY.tools(world)
    assert [f.__name__ for f in fns] == [t.name for t in fmt.tools] == ["lookup", "search"]
    for fn, spec in zip(fns, fmt.tools):
        schema = get_json_schema(fn)["function"]
        assert list(inspect.signature(fn).parameters) == [p.name for p in spec.parameters]
        assert list(schema["parameters"]["properties"]) == [p.name for p in spec.parameters]
        for p in spec.parameters:
            assert schema["parameters"]["properties"][p.name]["type"] == p.type
        assert isinstance(fn(**spec.example), str)
        inspect.signature(fn).bind(**spec.example)


def test_eval_format_turns_cover_gold_trace():
    for hops in (1, 2, 6):
        d = FAMILY.difficulty({"hops": hops, "n_people": 12})
        fmt = FAMILY.eval_format(d)
        ex = FAMILY.example(random.Random(0), d)
        assert fmt.max_turns >= len(FAMILY.gold_trace(ex)) + 1
        assert "Answer:" in fmt.system_prompt and "lookup" in fmt.system_prompt


# ---------------------------------------------------------------- difficulty


def test_default_difficulty():
    assert FAMILY.difficulty(None).model_dump() == {"hops": 2, "n_people": 24, "n_relations": 3,
                                                    "n_attributes": 4, "n_similar": 4}


@pytest.mark.parametrize("knobs", [
    {"hops": 0}, {"hops": 7}, {"n_people": 5}, {"n_people": 81}, {"n_relations": 0}, {"n_relations": 6},
    {"n_attributes": 0}, {"n_attributes": 9}, {"n_similar": -1}, {"n_people": 8, "n_similar": 5},
    {"hops": 6, "n_people": 8}, {"bogus": 1},
])
def test_bad_difficulty_rejected(knobs):
    with pytest.raises(ValidationError):
        FAMILY.difficulty(knobs)


# ---------------------------------------------------------------- reference job


def load_ref_env():
    from ait.job.env_loader import import_env

    return import_env(REF_DIR / "env.py")  # with the workspace's task_tools.py importable


def test_reference_env_is_self_contained():
    text = (REF_DIR / "env.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+ait\b", text, re.MULTILINE)
    imports = set(re.findall(r"^\s*(?:import|from)\s+(\w+)", text, re.MULTILINE))
    assert imports <= {"difflib", "json", "pathlib", "random", "re", "task_tools"}, imports


def test_reference_job_passes_probe(monkeypatch, tmp_path):
    from ait.probe.runner import probe_workspace

    monkeypatch.setitem(ait.families.FAMILIES, "multi_hop", FAMILY)
    spec = build_spec("multi_hop", constraints=CONSTRAINTS)
    ws = tmp_path / "ws"
    shutil.copytree(REF_DIR, ws, ignore=shutil.ignore_patterns("__pycache__"))
    report = probe_workspace(ws, spec)
    assert report.valid, report.summary()
    assert load_ref_env().SYSTEM_PROMPT == spec.eval_format.system_prompt


def test_reference_dataset_rows_are_consistent():
    env = load_ref_env()
    rows = env.build_dataset(200, 5)
    assert rows == env.build_dataset(200, 5)
    assert rows != env.build_dataset(200, 6)
    assert len({r["prompt"] for r in rows}) == 200
    hops = Counter()
    for r in rows:
        world = r["info"]["world"]
        json.dumps(r["info"])
        start, rels, attr, _ = parse_prompt(r["prompt"])  # the reference mimics the task's phrasing
        hops[len(rels)] += 1
        path = walk(world, start, rels)
        assert r["answer"] == my_norm(world["people"][path[-1]][attr])
        # the family's own tools and scorer solve it too (same world format)
        out = start
        for rel in rels + [attr]:
            out = FAMILY.call_tool(world, ToolCall(name="lookup", arguments={"name": out, "field": rel}))
        assert FAMILY.score(f"Answer: {out}", r["answer"]) == 1.0
    assert set(hops) == {1, 2, 3}


def test_reference_rewards():
    env = load_ref_env()
    row = next(r for r in env.build_dataset(50, 0) if len(r["info"]["world"]["query"]["relations"]) == 2)
    world, info, ans = row["info"]["world"], row["info"], row["answer"]
    q = world["query"]
    path = walk(world, q["start"], q["relations"])
    mid = world["people"][path[1]][q["attribute"]]
    start_val = world["people"][path[0]][q["attribute"]]

    def total(text):
        return sum(w * f(text, ans, info) for f, w in zip(env.REWARD_FUNCS, env.REWARD_WEIGHTS))

    assert env.reward_correct(f"Answer: {ans.upper()}", ans, info) == 1.0
    assert env.reward_correct("Answer: nope", ans, info) == 0.0
    assert env.reward_format("Answer: nope", ans, info) == 1.0 and env.reward_format(ans, ans, info) == 0.0
    if my_norm(mid) != ans:
        assert env.reward_progress(f"Answer: {mid}", ans, info) == pytest.approx(0.5)
    assert total(f"Answer: {ans}") > total(f"Answer: {mid}") >= total(f"Answer: {start_val}") > total("") == 0.0
    for f in env.REWARD_FUNCS:
        for text in ["", "Answer:", "Answer: x", f"Answer: {ans}", None]:
            v = f(text, ans, info)
            assert 0.0 <= v <= 1.0
            assert f(text, ans, {}) in (0.0, 1.0) or f is env.reward_progress


def _reference_rows_at(tmp_path, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    return reference_rows_at(tmp_path, "multi_hop", knobs, n, seed)


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: an easy rung trains on one-hop questions over a
    small directory (it once drew 1-3 hops over 16-30 people whatever the task asked)."""
    easy = {"hops": 1, "n_people": 8, "n_relations": 2, "n_attributes": 2, "n_similar": 0}
    rows = _reference_rows_at(tmp_path, easy)
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 200
    for r in rows:
        world = r["info"]["world"]
        start, rels, attr, _ = parse_prompt(r["prompt"])
        assert len(rels) == 1 and len(world["people"]) == 8, r["prompt"]
        assert len(world["fields"]) == 4 and all(len(p) == 4 for p in world["people"].values())
        assert r["answer"] == my_norm(world["people"][walk(world, start, rels)[-1]][attr])
    # a harder rung: three hops, every field, half the directory near-duplicate names
    hard = {"hops": 3, "n_people": 12, "n_relations": 5, "n_attributes": 8, "n_similar": 6}
    for r in _reference_rows_at(tmp_path, hard, 100):
        world = r["info"]["world"]
        start, rels, attr, _ = parse_prompt(r["prompt"])
        path = walk(world, start, rels)
        assert len(rels) == 3 and len(set(path)) == 4 and len(world["people"]) == 12 and len(world["fields"]) == 13
        assert r["answer"] == my_norm(world["people"][path[-1]][attr])
        twins = Counter((name.split()[0], name.split()[1][:3]) for name in world["people"])
        assert sum(c for c in twins.values() if c > 1) >= 6, sorted(world["people"])
    # a directory too small for a simple three-hop path is skipped, not looped on forever
    tiny = _reference_rows_at(tmp_path, {"hops": 3, "n_people": 6, "n_relations": 1, "n_attributes": 1,
                                         "n_similar": 0}, 20)
    assert all(len(parse_prompt(r["prompt"])[1]) == 3 for r in tiny)
    # without task.json (an older workspace): the 1-3-hop mix over 16-30 people as before
    old = _reference_rows_at(tmp_path, None)
    assert {len(parse_prompt(r["prompt"])[1]) for r in old} == {1, 2, 3}
    sizes = {len(r["info"]["world"]["people"]) for r in old}
    assert len(sizes) > 3 and min(sizes) >= 16 and max(sizes) <= 30


# ---------------------------------------------------------------- inline (the directory in the question)

FACT_RE = re.compile(rf"{NAME}'s ([a-z]+(?: [a-z]+)*) is (.+)")
TRAILER_RE = re.compile(rf"Reply with one sentence per step, like \"{NAME}'s ([a-z ]+) is <name>\.((?: <name>'s \.\.\. "
                        r"is <name>\.)*) <name>'s \.\.\. is \.\.\.\", then the final line 'Answer: <value>' \(the value alone\)\.")
INLINE_KNOBS = [
    {"inline": True, "hops": 1, "n_people": 8, "n_similar": 0},
    {"inline": True, "hops": 1, "n_people": 6, "n_relations": 1, "n_attributes": 1, "n_similar": 0},
    {"inline": True, "hops": 2, "n_people": 12, "n_similar": 2},
    {"inline": True},
    {"inline": True, "hops": 6, "n_people": 80, "n_relations": 5, "n_attributes": 8, "n_similar": 40},
]


def parse_inline(prompt: str) -> tuple[str, dict[str, dict[str, str]]]:
    """(question, {name: {field: value}}) read from an inline prompt's text alone."""
    head, sep, tail = prompt.rpartition("\n\nQuestion: ")
    assert sep, prompt
    question, trailer = tail.split("\n")
    m = TRAILER_RE.fullmatch(trailer)
    assert m, trailer
    start, rels, _, _ = parse_prompt(question)
    assert (m.group(1), field_of(m.group(2))) == (start, rels[0])  # the reply format names the first step
    assert m.group(3).count("<name>'s") == len(rels) - 1  # ...and has one sentence per lookup
    header, *lines = head.split("\n")
    assert header.startswith("Directory") and header.endswith(":"), header
    rows: dict[str, dict[str, str]] = {}
    for line in lines:
        assert line.endswith("."), line
        facts = [FACT_RE.fullmatch(f) for f in line[:-1].split("; ")]
        assert all(facts) and len({f.group(1) for f in facts}) == 1, line
        rows[facts[0].group(1)] = {field_of(f.group(2)): f.group(3) for f in facts}
    return question, rows


def solve_from_text(prompt: str) -> str:
    """An independent solver that sees only the inline prompt (no tools, no world)."""
    question, rows = parse_inline(prompt)
    name, rels, attr, _ = parse_prompt(question)
    for r in rels:
        name = rows[name][r]
    return f"Answer: {rows[name][attr]}"


@pytest.mark.parametrize("knobs", INLINE_KNOBS)
def test_inline_prompt_holds_the_chain_rows(knobs):
    d = FAMILY.difficulty(knobs)
    sizes = Counter()
    for ex in examples(knobs, 60, seed=41):
        question, rows = parse_inline(ex.prompt)
        start, rels, attr, _ = parse_prompt(question)
        people = ex.world["people"]
        path = walk(ex.world, start, rels)
        for p in path:  # every person on the chain, with their full row as the tools see it
            assert rows[p] == people[p], (p, ex.prompt)
        assert all(rows[n] == people[n] for n in rows)
        assert list(rows) == [n for n in people if n in rows]  # directory order
        sizes[len(rows)] += 1
        if d.n_people <= 6:
            assert len(rows) == d.n_people and ex.prompt.startswith("Directory:\n")
        else:  # the chain plus a few distractors, never the whole of a big directory
            assert len(rows) == max(6, d.hops + 4) and ex.prompt.startswith("Directory (the entries you need):\n")
    assert len(sizes) == 1


def test_inline_distractors_include_near_duplicate_names():
    near = 0
    for ex in examples({"inline": True, "hops": 2, "n_people": 24, "n_similar": 8}, 60, seed=42):
        question, rows = parse_inline(ex.prompt)
        start, rels, _, _ = parse_prompt(question)
        path = walk(ex.world, start, rels)
        near += any(n not in path and (n.split()[0] in {p.split()[0] for p in path}
                                       or n.split()[1] in {p.split()[1] for p in path}) for n in rows)
    assert near >= 45, near


def test_inline_examples_are_deterministic():
    for knobs in INLINE_KNOBS:
        a, b = examples(knobs, 30, seed=44), examples(knobs, 30, seed=44)
        assert [e.model_dump() for e in a] == [e.model_dump() for e in b]


@pytest.mark.parametrize("knobs", INLINE_KNOBS)
def test_text_only_solver_reaches_gold_on_inline_prompts(knobs):
    exs = [ex for seed in range(5) for ex in examples(knobs, 40, seed=900 + seed)]
    assert all(FAMILY.score(solve_from_text(ex.prompt), ex.answer) == 1.0 for ex in exs)
    # ...and the rows matter: the start person's own row gives the wrong answer every time
    for ex in exs:
        question, rows = parse_inline(ex.prompt)
        start, _, attr, _ = parse_prompt(question)
        assert FAMILY.score(f"Answer: {rows[start][attr]}", ex.answer) == 0.0


def test_inline_on_hidden_set(monkeypatch, tmp_path):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "multi-hop-test-secret")
    spec = build_spec("multi_hop", difficulty={"inline": True, "hops": 2, "n_people": 10}, constraints=CONSTRAINTS)
    assert spec.difficulty["inline"] is True
    exs = hidden_examples(spec)
    assert sum(FAMILY.score(solve_from_text(ex.prompt), ex.answer) for ex in exs) == 200
    for d in spec.dev_examples:
        assert FAMILY.score(solve_from_text(d.prompt), d.answer) == 1.0


@pytest.mark.parametrize("knobs", [{}, {"hops": 1, "n_people": 8, "n_similar": 0},
                                   {"hops": 4, "n_people": 40, "n_relations": 5, "n_attributes": 8, "n_similar": 10}])
def test_inline_keeps_world_question_and_answer(knobs):
    """Same rng state: the inline example is the non-inline one with rows above the question; tools agree."""
    plain = examples(knobs, 40, seed=43)
    inline = examples({**knobs, "inline": True}, 40, seed=43)
    for p, i in zip(plain, inline):
        assert i.world == p.world and i.answer == p.answer
        assert parse_inline(i.prompt)[0] == p.prompt and f"\n\nQuestion: {p.prompt}\nReply with" in i.prompt
        assert FAMILY.gold_trace(i) == FAMILY.gold_trace(p)
        for c in FAMILY.gold_trace(i):
            assert FAMILY.call_tool(i.world, c) == FAMILY.call_tool(p.world, c)
    # non-inline prompts are the bare question (the family's original phrasing)
    assert all(not p.prompt.startswith("Directory") and "\n" not in p.prompt for p in plain)
    assert FAMILY.difficulty({**knobs, "inline": False}).model_dump() == FAMILY.difficulty(knobs).model_dump()


def test_inline_false_leaves_specs_and_hidden_seeds_unchanged(monkeypatch, tmp_path):
    from ait.evals.hidden import eval_fingerprint

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "multi-hop-test-secret")
    base = build_spec("multi_hop", constraints=CONSTRAINTS)
    off = build_spec("multi_hop", difficulty={"inline": False}, constraints=CONSTRAINTS)
    on = build_spec("multi_hop", difficulty={"inline": True}, constraints=CONSTRAINTS)
    assert "inline" not in base.difficulty and off.model_dump_json() == base.model_dump_json()
    assert on.difficulty == {**base.difficulty, "inline": True}
    assert eval_fingerprint(on) != eval_fingerprint(base) == eval_fingerprint(off)
    # The shipped spec is the family at its calibrated rung (an inline one): built the same way here.
    shipped = build_spec("multi_hop", difficulty=dict(FAMILY.calibrated), constraints=CONSTRAINTS)
    assert shipped.difficulty.get("inline") is True
    committed = json.loads((REPO / "examples" / "tasks" / "multi_hop.json").read_text())
    assert committed["difficulty"] == shipped.difficulty
    assert committed["eval_format"]["system_prompt"] == shipped.eval_format.system_prompt
    assert [d["prompt"] for d in committed["dev_examples"]] == [d.prompt for d in shipped.dev_examples]


def test_inline_system_prompt_says_the_directory_is_in_the_question():
    plain = FAMILY.eval_format(FAMILY.difficulty({}))
    inline = FAMILY.eval_format(FAMILY.difficulty({"inline": True}))
    assert plain.system_prompt != inline.system_prompt
    assert "in the question" not in plain.system_prompt and "optional" not in plain.system_prompt
    assert "question lists the directory" in inline.system_prompt and "optional" in inline.system_prompt
    assert "Answer: <value>" in inline.system_prompt
    # the tools, answer format and budget are the same
    assert inline.model_dump(exclude={"system_prompt"}) == plain.model_dump(exclude={"system_prompt"})


def test_inline_reference_env_trains_on_inline_prompts(tmp_path):
    knobs = {"inline": True, "hops": 2, "n_people": 12, "n_relations": 2, "n_attributes": 3, "n_similar": 2}
    rows = _reference_rows_at(tmp_path, knobs, 120)
    assert len(rows) == 120
    spec_prompt = FAMILY.eval_format(FAMILY.difficulty(knobs)).system_prompt
    for r in rows:
        world = r["info"]["world"]
        question, shown = parse_inline(r["prompt"])
        start, rels, attr, _ = parse_prompt(question)
        path = walk(world, start, rels)
        assert len(rels) == 2 and len(world["people"]) == 12 and len(shown) == 6
        assert all(shown[p] == world["people"][p] for p in path)
        assert FAMILY.score(solve_from_text(r["prompt"]), r["answer"]) == 1.0
        assert r["answer"] == my_norm(world["people"][path[-1]][attr])
        assert r["prompt"] == render_inline(question, world)  # the family's inline style, row for row
    small = _reference_rows_at(tmp_path, {**knobs, "n_people": 6}, 40)
    assert all(len(parse_inline(r["prompt"])[1]) == 6 and r["prompt"].startswith("Directory:\n") for r in small)
    # the env's system prompt follows task.json; without inline (or without task.json) it is the tools one
    from ait.job.env_loader import import_env

    ws = tmp_path / "ws-multi_hop"
    assert import_env(ws / "env.py").SYSTEM_PROMPT == spec_prompt
    for plain in ({k: v for k, v in knobs.items() if k != "inline"}, None):
        rows = _reference_rows_at(tmp_path, plain, 40)
        assert all("\n" not in r["prompt"] and parse_prompt(r["prompt"]) for r in rows)
        assert import_env(ws / "env.py").SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt
