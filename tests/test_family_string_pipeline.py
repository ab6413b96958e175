"""string_pipeline: determinism, gold answers by an independent implementation, a scripted
prompt-only solver on the hidden-set distribution, guessing, the scorer, the tools' error
handling and schemas, the reference job's probe, and reference-env/family tool agreement.

The helpers below parse the prompt with their own phrase table and implement every op
from scratch; they never call the family module's transform code.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers.utils import get_json_schema

import ait.families
from ait.families import ToolCall
from ait.families.string_pipeline import OPS, StringPipeline
from ait.job.env_loader import import_env
from ait.spec import Constraints, build_spec
from tests.reference_rows import reference_rows_at

FAMILY = StringPipeline()
REPO = Path(__file__).resolve().parents[1]
REF_DIR = REPO / "src" / "ait" / "policy" / "reference_jobs" / "string_pipeline"
CONSTRAINTS = Constraints(allowed_base_models=["tiny", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200,
                          max_group_size=16, max_prompts_per_step=16, max_completion_tokens=512, max_turns=8,
                          time_budget_s=600, min_dataset_rows=32, max_dataset_rows=20000)

# ---------------------------------------------------------------- independent prompt parser and ops

PROMPT_RE = re.compile(r"Take record (R\d+)\. (.+)\. What is the resulting string\?")
# Written out independently of string_pipeline.PHRASES on purpose: N = a number, A/B = one char.
TEMPLATES = {
    "reverse it": "reverse",
    "write it backwards": "reverse",
    "convert it to uppercase": "upper",
    "make every letter uppercase": "upper",
    "convert it to lowercase": "lower",
    "make every letter lowercase": "lower",
    "rotate it left by N": "rotate_left",
    "move its first N characters to the end": "rotate_left",
    "rotate it right by N": "rotate_right",
    "move its last N characters to the front": "rotate_right",
    "replace every 'A' with 'B'": "replace",
    "change each 'A' into 'B'": "replace",
    "remove the vowels": "drop_vowels",
    "drop every vowel": "drop_vowels",
    "keep every other character, starting with the first": "every_other",
    "take the characters at even positions (0, 2, 4, ...)": "every_other",
    "apply a Caesar shift of N": "caesar",
    "shift every letter N places forward in the alphabet": "caesar",
    "sort its characters": "sort_chars",
    "arrange its characters in ASCII order": "sort_chars",
    "remove repeated characters, keeping the first of each": "dedupe",
    "delete duplicate characters": "dedupe",
}


def _template_re(t: str) -> re.Pattern:
    rx = re.escape(t).replace("N", r"(?P<n>\d+)").replace("'A'", r"'(?P<a>[A-Za-z0-9])'")
    return re.compile(rx.replace("'B'", r"'(?P<b>[A-Za-z0-9])'"))


TEMPLATE_RES = [(_template_re(t), op) for t, op in TEMPLATES.items()]


def parse_prompt(prompt: str) -> tuple[str, list[tuple[str, str]]]:
    """(record id, [(op, arg), ...]) from the prompt text alone."""
    m = PROMPT_RE.fullmatch(prompt)
    assert m, f"prompt does not have the expected shape: {prompt!r}"
    raw = m.group(2).split(", then ")
    assert raw[0][0].isupper(), prompt
    raw[0] = raw[0][0].lower() + raw[0][1:]
    steps = []
    for phrase in raw:
        hits = []
        for rx, op in TEMPLATE_RES:
            mm = rx.fullmatch(phrase)
            if mm:
                g = mm.groupdict()
                arg = g["n"] if "n" in g else f"{g['a']}->{g['b']}" if "a" in g else ""
                hits.append((op, arg))
        assert len(hits) == 1, f"unrecognised phrase {phrase!r} in {prompt!r}"
        steps.append(hits[0])
    return m.group(1), steps


def my_op(s: str, op: str, arg: str) -> str:
    if op == "reverse":
        return "".join(reversed(s))
    if op == "upper":
        return "".join(c.upper() for c in s)
    if op == "lower":
        return "".join(c.lower() for c in s)
    if op in ("rotate_left", "rotate_right"):
        out = list(s)
        for _ in range(int(arg)):
            out = out[1:] + out[:1] if op == "rotate_left" else out[-1:] + out[:-1]
        return "".join(out)
    if op == "replace":
        a, b = arg.split("->")
        return "".join(b if c == a else c for c in s)
    if op == "drop_vowels":
        return "".join(c for c in s if c.lower() not in "aeiou")
    if op == "every_other":
        return "".join(c for i, c in enumerate(s) if i % 2 == 0)
    if op == "caesar":
        lower, upper = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        out = []
        for c in s:
            for alpha in (lower, upper):
                if c in alpha:
                    c = alpha[(alpha.index(c) + int(arg)) % 26]
                    break
            out.append(c)
        return "".join(out)
    if op == "sort_chars":
        return "".join(sorted(s, key=ord))
    if op == "dedupe":
        seen, out = set(), []
        for c in s:
            if c not in seen:
                seen.add(c)
                out.append(c)
        return "".join(out)
    raise AssertionError(f"unknown op {op}")


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


@pytest.fixture
def hidden_set(monkeypatch, tmp_path):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setitem(ait.families.FAMILIES, "string_pipeline", FAMILY)
    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "string-pipeline-test")
    spec = build_spec("string_pipeline", constraints=CONSTRAINTS)
    exs = hidden_examples(spec)
    assert len(exs) == 200
    return exs


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("knobs", [{}, {"n_transforms": 6, "min_length": 20, "max_length": 30, "n_records": 10}])
def test_same_seed_gives_identical_examples(knobs):
    a = examples(knobs, 50, seed=123)
    b = examples(knobs, 50, seed=123)
    assert [(e.prompt, e.world, e.answer) for e in a] == [(e.prompt, e.world, e.answer) for e in b]
    assert len({e.prompt for e in a}) == 50
    for e in a:
        assert json.loads(json.dumps(e.world)) == e.world


def test_different_seeds_differ():
    a = examples({}, 50, seed=1)
    b = examples({}, 50, seed=2)
    assert [e.prompt for e in a] != [e.prompt for e in b]
    assert len({e.answer for e in a} & {e.answer for e in b}) < 3


def test_prompt_never_contains_the_record_text():
    for ex in examples({}, 200, seed=8):
        rid = ex.world["record_id"]
        assert ex.world["records"][rid] not in ex.prompt
        assert ex.answer not in ex.prompt
        assert len(ex.world["records"]) == 4 and rid in ex.world["records"]


# ---------------------------------------------------------------- gold answers (independent)

GOLD_CONFIGS = [
    {},
    {"n_transforms": 1},
    {"n_transforms": 6, "max_shift": 25},
    {"n_transforms": 10, "min_length": 30, "max_length": 40, "n_records": 1},
    {"n_transforms": 4, "min_length": 4, "max_length": 6},
    {"n_transforms": 3, "ops": ["caesar", "replace"], "max_shift": 25},
    {"n_transforms": 3, "ops": ["rotate_left", "rotate_right"], "max_shift": 25, "min_length": 5, "max_length": 8},
]


def test_gold_answers_match_independent_computation():
    seen_ops, checked = set(), 0
    for i, knobs in enumerate(GOLD_CONFIGS):
        d = FAMILY.difficulty(knobs)
        for ex in examples(knobs, 60, seed=500 + i):
            rid, steps = parse_prompt(ex.prompt)
            assert rid == ex.world["record_id"]
            assert len(steps) == d.n_transforms
            assert [(s["op"], s["arg"]) for s in ex.world["steps"]] == steps
            text = ex.world["records"][rid]
            assert d.min_length <= len(text) <= d.max_length
            assert re.fullmatch(r"[A-Za-z0-9]+", text)
            for op, arg in steps:
                assert op in d.ops
                if arg.isdigit():
                    assert 1 <= int(arg) <= d.max_shift
                new = my_op(text, op, arg)
                assert new, ex.prompt
                if len(text) > 1:
                    assert new != text, f"no-op step {op} {arg!r} in {ex.prompt!r}"
                seen_ops.add(op)
                text = new
            assert ex.answer == text, (knobs, ex.prompt)
            checked += 1
    assert seen_ops == set(OPS)
    assert checked == 60 * len(GOLD_CONFIGS)


def test_every_phrasing_appears():
    seen = set()
    for ex in examples({"n_transforms": 8}, 100, seed=5):
        body = PROMPT_RE.fullmatch(ex.prompt).group(2)
        for phrase in body.split(", then "):
            phrase = phrase[0].lower() + phrase[1:]
            for rx, _ in TEMPLATE_RES:
                if rx.fullmatch(phrase):
                    seen.add(rx.pattern)
    assert len(seen) == len(TEMPLATES)


def test_gold_trace_replays_to_the_answer():
    for ex in examples({"n_transforms": 5}, 50, seed=11):
        trace = FAMILY.gold_trace(ex)
        assert [c.name for c in trace] == ["get_record"] + ["transform"] * 5
        out = None
        for call in trace:
            args = dict(call.arguments)
            if out is not None:
                assert args["text"] == out  # each step consumes the previous result
            out = FAMILY.call_tool(ex.world, ToolCall(name=call.name, arguments=args))
            assert not out.startswith("error"), (call, out)
        assert out == ex.answer
        assert FAMILY.score(f"Answer: {out}", ex.answer) == 1.0


# ---------------------------------------------------------------- scripted solver on the hidden set


def scripted_solver(prompt: str, call) -> str:
    """Sees only the prompt and the tools."""
    rid, steps = parse_prompt(prompt)
    text = call("get_record", record_id=rid)
    for op, arg in steps:
        text = call("transform", text=text, op=op, arg=arg)
    return f"I applied every step.\nAnswer: {text}"


def test_scripted_solver_solves_the_hidden_set(hidden_set):
    solved, n_calls = 0, []
    for ex in hidden_set:
        calls = []

        def call(name, **args):
            calls.append(name)
            return FAMILY.call_tool(ex.world, ToolCall(name=name, arguments=args))

        solved += FAMILY.score(scripted_solver(ex.prompt, call), ex.answer)
        n_calls.append(len(calls))
    assert solved == 200
    assert min(n_calls) >= 3  # at least two dependent tool calls at the default difficulty
    assert len(FAMILY.eval_format(FAMILY.difficulty({})).tools) == 2
    assert FAMILY.eval_format(FAMILY.difficulty({})).max_turns >= max(n_calls) + 1


def test_answer_only_guessing_scores_low(hidden_set):
    guessers = {
        "record id": lambda p: PROMPT_RE.fullmatch(p).group(1),
        "quoted chars": lambda p: "".join(re.findall(r"'([A-Za-z0-9])'", p)) or "x",
        "random string": lambda p: "".join(random.Random(p).choice("abcdefghijKLMNOP0123") for _ in range(10)),
        "empty": lambda p: "",
    }
    for name, guess in guessers.items():
        hits = sum(FAMILY.score(f"Answer: {guess(ex.prompt)}", ex.answer) for ex in hidden_set)
        assert hits / len(hidden_set) < 0.10, f"guessing the {name} scores {hits}/200"
    # the wrong record gives a wrong answer: distractors matter
    wrong = 0
    for ex in hidden_set:
        rid, steps = parse_prompt(ex.prompt)
        other = next(k for k in ex.world["records"] if k != rid)
        text = ex.world["records"][other]
        for op, arg in steps:
            text = my_op(text, op, arg)
        wrong += FAMILY.score(f"Answer: {text}", ex.answer)
    assert wrong < 5


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: k3TqXb9", "k3TqXb9", 1.0),
    ("answer:k3TqXb9", "k3TqXb9", 1.0),
    ("Answer:   k3TqXb9  ", "k3TqXb9", 1.0),
    ("Answer: 'k3TqXb9'", "k3TqXb9", 1.0),
    ('Answer: "k3TqXb9"', "k3TqXb9", 1.0),
    ("Answer: `k3TqXb9`", "k3TqXb9", 1.0),
    ("**Answer:** k3TqXb9", "k3TqXb9", 1.0),
    ("steps...\nAnswer: wrong\nAnswer: k3TqXb9", "k3TqXb9", 1.0),
    ("Answer: k3TqXb9\nAnswer: wrong", "k3TqXb9", 0.0),
    ("Answer: K3TQXB9", "k3TqXb9", 0.0),  # case-sensitive
    ("Answer: k3tqxb9", "k3TqXb9", 0.0),
    ("Answer: k3TqXb", "k3TqXb9", 0.0),
    ("Answer: k3Tq Xb9", "k3TqXb9", 0.0),
    ("k3TqXb9", "k3TqXb9", 0.0),  # no Answer line
    ("The result is k3TqXb9.", "k3TqXb9", 0.0),
    ("Answer:", "k3TqXb9", 0.0),
    ("Answer: ''", "k3TqXb9", 0.0),
    ("", "k3TqXb9", 0.0),
    ("Answer: 9bXqT3k", "k3TqXb9", 0.0),
])
def test_score(response, answer, expected):
    assert FAMILY.score(response, answer) == expected


def test_score_none_and_empty_gold():
    assert FAMILY.score(None, "abc") == 0.0  # type: ignore[arg-type]
    assert FAMILY.score("Answer:", "") == 0.0


# ---------------------------------------------------------------- tools

WORLD = {"records": {"R7": "Hello42World", "R12": "abcABC123"}, "record_id": "R7", "steps": []}


def call(name, **args):
    return FAMILY.call_tool(WORLD, ToolCall(name=name, arguments=args))


@pytest.mark.parametrize("op, arg, expected", [
    ("reverse", "", "dlroW24olleH"),
    ("upper", "", "HELLO42WORLD"),
    ("lower", "", "hello42world"),
    ("rotate_left", "3", "lo42WorldHel"),
    ("rotate_right", "3", "rldHello42Wo"),
    ("rotate_left", "15", "lo42WorldHel"),
    ("rotate_left", 3, "lo42WorldHel"),
    ("replace", "l->x", "Hexxo42Worxd"),
    ("replace", "'l'->'x'", "Hexxo42Worxd"),
    ("replace", "l -> x", "Hexxo42Worxd"),
    ("replace", "L->x", "Hello42World"),  # case-sensitive
    ("drop_vowels", "", "Hll42Wrld"),
    ("every_other", "", "Hlo2ol"),
    ("caesar", "3", "Khoor42Zruog"),
    ("caesar", "26", "Hello42World"),
    ("sort_chars", "", "24HWdellloor"),
    ("dedupe", "", "Helo42Wrd"),
    ("Reverse", "", "dlroW24olleH"),  # op names are case-insensitive
    ("rotate-left", "3", "lo42WorldHel"),
    ("upper", "ignored", "HELLO42WORLD"),
])
def test_transform_results(op, arg, expected):
    assert call("transform", text="Hello42World", op=op, arg=arg) == expected
    assert my_op("Hello42World", normalize(op), str(arg).replace("'", "").replace(" ", "")) == expected


def normalize(op: str) -> str:
    return op.lower().replace("-", "_")


def test_get_record():
    assert call("get_record", record_id="R7") == "Hello42World"
    assert call("get_record", record_id=" r12 ") == "abcABC123"
    out = call("get_record", record_id="R99")
    assert out.startswith("error:") and "R12, R7" in out


@pytest.mark.parametrize("name, args", [
    ("get_record", {"record_id": ""}),
    ("get_record", {"record_id": None}),
    ("get_record", {"record_id": 7}),
    ("get_record", {"record_id": ["R7"]}),
    ("get_record", {}),
    ("get_record", {"record_id": "R7", "extra": 1}),
    ("transform", {"text": "abc", "op": "explode", "arg": ""}),
    ("transform", {"text": "abc", "op": "", "arg": ""}),
    ("transform", {"text": "abc", "op": None, "arg": ""}),
    ("transform", {"text": "abc", "op": ["reverse"], "arg": ""}),
    ("transform", {"text": None, "op": "reverse", "arg": ""}),
    ("transform", {"text": ["abc"], "op": "reverse", "arg": ""}),
    ("transform", {"text": "abc", "op": "rotate_left", "arg": ""}),
    ("transform", {"text": "abc", "op": "rotate_left", "arg": "three"}),
    ("transform", {"text": "abc", "op": "rotate_left", "arg": True}),
    ("transform", {"text": "abc", "op": "rotate_left", "arg": 1.5}),
    ("transform", {"text": "abc", "op": "caesar", "arg": "99999999999"}),
    ("transform", {"text": "abc", "op": "caesar", "arg": None}),
    ("transform", {"text": "abc", "op": "replace", "arg": ""}),
    ("transform", {"text": "abc", "op": "replace", "arg": "a"}),
    ("transform", {"text": "abc", "op": "replace", "arg": "->x"}),
    ("transform", {"text": "abc", "op": "replace", "arg": 5}),
    ("transform", {"text": "a" * 100, "op": "replace", "arg": "a->bbbbbbbbbb"}),
    ("transform", {"text": "x" * 500, "op": "reverse", "arg": ""}),
    ("transform", {"text": "abc", "op": "reverse"}),  # missing argument
    ("nope", {}),
])
def test_tools_error_as_text(name, args):
    out = FAMILY.call_tool(WORLD, ToolCall(name=name, arguments=args))
    assert isinstance(out, str) and out.startswith("error:"), out


def test_tool_edge_cases_never_raise():
    fns = {fn.__name__: fn for fn in FAMILY.tools(WORLD)}
    assert fns["transform"]("", "rotate_left", "3") == ""
    assert fns["transform"]("", "reverse", "") == ""
    assert fns["transform"](12345, "reverse", "") == "54321"
    assert fns["transform"]("abc", "replace", "b->") == "ac"
    assert fns["transform"]("abc", "rotate_left", "-1") == "cab"
    assert fns["transform"]("abc", "upper", None) == "ABC"
    assert fns["get_record"]("R7") == "Hello42World"
    empty = {fn.__name__: fn for fn in FAMILY.tools({})}
    assert empty["get_record"]("R7").startswith("error:")


def test_tools_have_json_schemas_matching_the_spec():
    fmt = FAMILY.eval_format(FAMILY.difficulty({}))
    fns = FAMILY.tools(WORLD)
    assert [fn.__name__ for fn in fns] == [t.name for t in fmt.tools]
    type_map = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}
    for fn, spec in zip(fns, fmt.tools):
        schema = get_json_schema(fn)
        props = schema["function"]["parameters"]["properties"]
        assert list(props) == [p.name for p in spec.parameters]
        for p in spec.parameters:
            assert props[p.name]["type"] == type_map[p.type]
            assert props[p.name].get("description")
        out = FAMILY.call_tool({"records": {}}, ToolCall(name=spec.name, arguments=spec.example))
        assert isinstance(out, str)
    assert FAMILY.call_tool({}, ToolCall(name="transform", arguments=fmt.tools[1].example)) == "llo42He"


def test_eval_format_and_difficulty():
    d = FAMILY.difficulty({})
    assert d.model_dump() == {"n_transforms": 3, "min_length": 10, "max_length": 16, "ops": OPS,
                              "max_shift": 5, "n_records": 4}
    fmt = FAMILY.eval_format(d)
    assert fmt.max_turns == 5 and "Answer:" in fmt.system_prompt
    assert FAMILY.eval_format(FAMILY.difficulty({"n_transforms": 7})).max_turns == 9
    for op in OPS:
        assert op in fmt.tools[1].description


@pytest.mark.parametrize("knobs", [
    {"n_transforms": 0}, {"n_transforms": 11}, {"min_length": 20, "max_length": 10}, {"ops": []},
    {"ops": ["reverse", "explode"]}, {"ops": ["reverse", "reverse"]}, {"max_shift": 0}, {"n_records": 0},
    {"bogus": 1},
])
def test_bad_difficulty_rejected(knobs):
    with pytest.raises(ValidationError):
        FAMILY.difficulty(knobs)


def test_single_op_short_strings_still_valid():
    """Ops that can be no-ops (sort, dedupe) on short strings never yield empty answers."""
    for ex in examples({"ops": ["drop_vowels", "dedupe", "sort_chars"], "min_length": 4, "max_length": 4,
                        "n_transforms": 5}, 100, seed=3):
        assert ex.answer
        rid, steps = parse_prompt(ex.prompt)
        text = ex.world["records"][rid]
        for op, arg in steps:
            text = my_op(text, op, arg)
        assert text == ex.answer


# ---------------------------------------------------------------- reference job


def load_reference_env():
    from ait.job.env_loader import import_env

    return import_env(REF_DIR / "env.py")  # with the workspace's task_tools.py importable


def test_reference_job_passes_probe(monkeypatch, tmp_path):
    from ait.probe.runner import probe_workspace

    monkeypatch.setitem(ait.families.FAMILIES, "string_pipeline", FAMILY)
    spec = build_spec("string_pipeline", constraints=CONSTRAINTS)
    ws = tmp_path / "ws"
    shutil.copytree(REF_DIR, ws)
    report = probe_workspace(ws, spec)
    assert report.valid, report.summary()


def test_reference_env_matches_the_family():
    env_mod = load_reference_env()
    assert "import ait" not in (REF_DIR / "env.py").read_text()
    assert env_mod.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt


def test_reference_dataset_rows_are_solvable_and_scored_by_the_rewards():
    env_mod = load_reference_env()
    rows = env_mod.build_dataset(100, seed=3)
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    assert env_mod.build_dataset(100, seed=3) == rows
    env = env_mod.Environment()
    for row in rows:
        world = row["info"]["world"]
        env.reset(row["info"])
        rid, steps = parse_prompt(row["prompt"])  # the reference phrasing is the task's phrasing
        text = env.get_record(rid)
        assert text == world["records"][rid]
        for op, arg in steps:
            text = env.transform(text=text, op=op, arg=arg)
        assert text == row["answer"]
        # the family's tools, fed the reference world, agree
        assert FAMILY.call_tool(world, ToolCall(name="get_record", arguments={"record_id": rid})) == world["records"][rid]
        good = f"Answer: {row['answer']}"
        assert env_mod.reward_correct(good, row["answer"], row["info"]) == 1.0
        assert FAMILY.score(good, row["answer"]) == 1.0
        near = f"Answer: {row['answer'][:-1]}"
        assert 0.0 < env_mod.reward_close(near, row["answer"], row["info"]) < 1.0
        assert env_mod.reward_correct(near, row["answer"], row["info"]) == 0.0
        assert env_mod.reward_format("no answer here", row["answer"], row["info"]) == 0.0


def _reference_rows_at(tmp_path, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    return reference_rows_at(tmp_path, "string_pipeline", knobs, n, seed)


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: an easy rung trains on one transform of a short
    string from the task's ops (it once drew 2-4 transforms of 10-16 characters whatever the task)."""
    easy = {"n_transforms": 1, "min_length": 6, "max_length": 10, "ops": ["reverse", "upper", "caesar", "rotate_left"],
            "max_shift": 2, "n_records": 2}
    rows = _reference_rows_at(tmp_path, easy)
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 200
    used = set()
    for r in rows:
        world = r["info"]["world"]
        rid, steps = parse_prompt(r["prompt"])
        assert len(steps) == 1 and len(world["records"]) == 2, r["prompt"]
        assert all(6 <= len(text) <= 10 for text in world["records"].values())
        (op, arg), = steps
        assert op in easy["ops"] and (op not in ("caesar", "rotate_left") or 1 <= int(arg) <= 2), r["prompt"]
        assert my_op(world["records"][rid], op, arg) == r["answer"]
        used.add(op)
    assert used == set(easy["ops"])
    # a longer chain: the count of steps follows n_transforms exactly
    for r in _reference_rows_at(tmp_path, {"n_transforms": 5, "min_length": 12, "max_length": 12, "n_records": 6}, 50):
        rid, steps = parse_prompt(r["prompt"])
        assert len(steps) == 5 and len(r["info"]["world"]["records"]) == 6
        text = r["info"]["world"]["records"][rid]
        assert len(text) == 12
        for op, arg in steps:
            text = my_op(text, op, arg)
        assert text == r["answer"]
    # a rung with fewer distinct problems than asked for ends instead of looping forever
    small = _reference_rows_at(tmp_path, {"n_transforms": 1, "min_length": 4, "max_length": 4, "ops": ["reverse"],
                                          "n_records": 1}, 300)
    assert 1 <= len(small) <= 99 * 2  # record ids R1-R99 x two phrasings
    # without task.json (an older workspace): 2-4 transforms over all ops on 10-16 characters as before
    old = _reference_rows_at(tmp_path, None)
    assert {len(parse_prompt(r["prompt"])[1]) for r in old} == {2, 3, 4}
    assert {op for r in old for op, _ in parse_prompt(r["prompt"])[1]} == set(OPS)
    assert all(10 <= len(t) <= 16 and len(r["info"]["world"]["records"]) == 4
               for r in old for t in r["info"]["world"]["records"].values())


# ---------------------------------------------------------------- inline: the record's text in the question

INLINE_RE = re.compile(r'Take record (R\d+), whose text is "([A-Za-z0-9]+)"\. (.+)\. What is the resulting string\? '
                       r"End your reply with the line 'Answer: <string>'\.")
INLINE_CONFIGS = [
    {"inline": True},
    {"inline": True, "n_transforms": 1, "min_length": 6, "max_length": 10, "ops": ["reverse", "upper", "lower"]},
    {"inline": True, "n_transforms": 1, "min_length": 6, "max_length": 10},
    {"inline": True, "n_transforms": 6, "max_shift": 25, "n_records": 1},
    {"inline": True, "n_transforms": 10, "min_length": 30, "max_length": 40, "n_records": 10},
]


def inline_solver(prompt: str) -> str:
    """Reads only the inline question (no tools, no world): the stated text, then each step by hand."""
    m = INLINE_RE.fullmatch(prompt)
    assert m, f"not an inline question: {prompt!r}"
    _, steps = parse_prompt(f"Take record {m.group(1)}. {m.group(3)}. What is the resulting string?")
    text = m.group(2)
    for op, arg in steps:
        text = my_op(text, op, arg)
    return f"Worked it out by hand.\nAnswer: {text}"


def test_inline_prompt_states_the_record_text():
    for i, knobs in enumerate(INLINE_CONFIGS):
        for ex in examples(knobs, 60, seed=900 + i):
            rid = ex.world["record_id"]
            m = INLINE_RE.fullmatch(ex.prompt)
            assert m and m.group(1) == rid, ex.prompt
            assert m.group(2) == ex.world["records"][rid]
            assert f'"{ex.world["records"][rid]}"' in ex.prompt


def test_inline_prompt_alone_reaches_the_gold_answer():
    """An independent solver that sees only the question text (ops applied by this test's own code)
    solves every inline example across many seeds, all ops and long chains included."""
    solved, seen_ops = 0, set()
    for i, knobs in enumerate(INLINE_CONFIGS):
        for seed in range(40):
            for ex in examples(knobs, 5, seed=10_000 * i + seed):
                solved += FAMILY.score(inline_solver(ex.prompt), ex.answer)
                seen_ops |= {s["op"] for s in ex.world["steps"]}
    assert solved == len(INLINE_CONFIGS) * 40 * 5
    assert seen_ops == set(OPS)


def test_inline_changes_only_the_question():
    """Same seed and knobs: the inline example has the same world, steps and gold answer, and its
    question is the plain one with the text clause and the Answer-line reminder added; the tools
    replay to the same answer."""
    for knobs in ({}, {"n_transforms": 1, "min_length": 6, "max_length": 10}, {"n_transforms": 5, "n_records": 1}):
        plain = examples(knobs, 80, seed=31)
        inline = examples({**knobs, "inline": True}, 80, seed=31)
        for p, q in zip(plain, inline):
            assert (q.world, q.answer) == (p.world, p.answer)
            rid = p.world["record_id"]
            assert q.prompt == p.prompt.replace(
                f"Take record {rid}.", f'Take record {rid}, whose text is "{p.world["records"][rid]}".', 1) + \
                " End your reply with the line 'Answer: <string>'."
            assert q.prompt != p.prompt and p.world["records"][rid] not in p.prompt
            out = None
            for call_ in FAMILY.gold_trace(q):
                out = FAMILY.call_tool(q.world, call_)
            assert out == q.answer


def test_non_inline_examples_and_dump_are_unchanged():
    """Pinned from the family before the inline knob existed: the same seed gives byte-identical
    examples, and a false inline stays out of the dump (spec difficulty, hidden-set seed)."""
    import hashlib

    def digest(knobs):
        rng = random.Random(2024)
        exs = [FAMILY.example(rng, FAMILY.difficulty(knobs)) for _ in range(100)]
        blob = json.dumps([[e.prompt, e.world, e.answer] for e in exs], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    assert digest({}) == digest({"inline": False}) == "65a0551dd6883f3fbdaea0e44d351f3df8748bd1a82e5c33bae277ffe9796494"
    assert digest({"n_transforms": 1, "min_length": 6, "max_length": 10}) == \
        "3a1f7709c89456e56ddbef84d16d39281c4734e51c616ea822930f1ba11a7c17"
    assert "inline" not in FAMILY.difficulty({"inline": False}).model_dump()
    assert FAMILY.difficulty({"inline": False}).model_dump() == FAMILY.difficulty({}).model_dump()
    dumped = FAMILY.difficulty({"inline": True, "n_transforms": 2}).model_dump()
    assert dumped["inline"] is True and FAMILY.difficulty(dumped).inline is True
    assert json.loads(FAMILY.difficulty({"inline": True}).model_dump_json())["inline"] is True
    with pytest.raises(ValidationError):
        FAMILY.difficulty({"inline": "sometimes"})


def test_inline_system_prompt_says_the_text_is_in_the_question():
    plain = FAMILY.eval_format(FAMILY.difficulty({"n_transforms": 2}))
    inline = FAMILY.eval_format(FAMILY.difficulty({"n_transforms": 2, "inline": True}))
    assert "First call get_record" in plain.system_prompt
    assert inline.system_prompt != plain.system_prompt
    assert "get_record" not in inline.system_prompt.replace("do not need get_record", "")
    assert "question states" in inline.system_prompt and "transform gives exact results" in inline.system_prompt
    assert "Answer: <string>" in inline.system_prompt
    # the tools, answer format and turn budget stay the same
    assert inline.tools == plain.tools
    assert (inline.answer_format, inline.max_turns, inline.max_new_tokens) == \
        (plain.answer_format, plain.max_turns, plain.max_new_tokens)


def test_reference_env_honours_inline_from_task_json(tmp_path):
    knobs = {"n_transforms": 2, "min_length": 6, "max_length": 10, "ops": ["reverse", "upper", "caesar", "replace"],
             "n_records": 3}
    plain = _reference_rows_at(tmp_path, knobs, 80)
    env_plain = import_env(tmp_path / "ws-string_pipeline" / "env.py")
    assert env_plain.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty(knobs)).system_prompt
    rows = _reference_rows_at(tmp_path, {**knobs, "inline": True}, 120)
    env_inline = import_env(tmp_path / "ws-string_pipeline" / "env.py")
    assert env_inline.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({**knobs, "inline": True})).system_prompt
    assert env_inline.SYSTEM_PROMPT != env_plain.SYSTEM_PROMPT
    assert len(rows) == 120 and len({r["prompt"] for r in rows}) == 120
    env = env_inline.Environment()
    for r in rows:
        world = r["info"]["world"]
        rid = world["record_id"]
        m = INLINE_RE.fullmatch(r["prompt"])
        assert m and m.group(1) == rid and m.group(2) == world["records"][rid], r["prompt"]
        assert FAMILY.score(inline_solver(r["prompt"]), r["answer"]) == 1.0
        assert env_inline.reward_correct(inline_solver(r["prompt"]), r["answer"], r["info"]) == 1.0
        # the tools still reach the answer from the record
        env.reset(r["info"])
        text = env.get_record(rid)
        for op, arg in parse_prompt(f"Take record {rid}. {m.group(3)}. What is the resulting string?")[1]:
            text = env.transform(text=text, op=op, arg=arg)
        assert text == r["answer"]
    # the same draws as without inline (plain rows skip repeated questions, so they are a subsequence):
    # only the question's text clause and closing reminder differ
    by_world = {json.dumps(r["info"], sort_keys=True): r for r in rows}
    for p in plain:
        rid = p["info"]["world"]["record_id"]
        text = p["info"]["world"]["records"][rid]
        assert INLINE_RE.fullmatch(p["prompt"]) is None and text not in p["prompt"]
        twin = by_world[json.dumps(p["info"], sort_keys=True)]
        assert twin["answer"] == p["answer"]
        stated = p["prompt"].replace(f"Take record {rid}.", f'Take record {rid}, whose text is "{text}".')
        assert twin["prompt"] == stated + " End your reply with the line 'Answer: <string>'."
