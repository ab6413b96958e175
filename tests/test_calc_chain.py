"""calc_chain: generator determinism, gold answers checked by an independent solver,
exact division, gold-trace replay, the scorer, the calculator tool, difficulty validation,
and that answer-only guessing fails.

The solver below parses the natural-language prompt with its own regexes and computes with
Python ints; it never calls the module's apply_op and never reads Example.world.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from ait.families import ToolCall, get_family
from ait.job.task_tools.calc_chain import calculator
from ait.spec import build_spec, load_spec

FAMILY = get_family("calc_chain")
REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "examples" / "tasks" / "calc_chain.json"

# ---------------------------------------------------------------- independent solver

PROMPT_RE = re.compile(r"Start with (\d+)\. (.+)\. What is the final result\?")
# Written out independently of calc_chain.PHRASES on purpose.
PHRASE_TEMPLATES = {
    "add N": "+",
    "increase it by N": "+",
    "add another N": "+",
    "subtract N": "-",
    "decrease it by N": "-",
    "take away N": "-",
    "multiply it by N": "*",
    "multiply the result by N": "*",
    "scale it by a factor of N": "*",
    "divide it by N": "/",
    "split it into N equal parts and keep one part": "/",
}
PHRASE_RES = [(re.compile(re.escape(t).replace("N", r"(\d+)")), op) for t, op in PHRASE_TEMPLATES.items()]


def parse_prompt(prompt: str) -> tuple[int, list[tuple[str, int]]]:
    """(starting number, [(op, operand), ...]) read from the prompt text alone."""
    m = PROMPT_RE.fullmatch(prompt)
    assert m, f"prompt does not have the expected shape: {prompt!r}"
    start = int(m.group(1))
    raw = m.group(2).split(", then ")
    assert raw[0][0].isupper(), f"first operation is not capitalised: {prompt!r}"
    raw[0] = raw[0][0].lower() + raw[0][1:]
    ops = []
    for phrase in raw:
        hits = [(op, int(mm.group(1))) for rx, op in PHRASE_RES if (mm := rx.fullmatch(phrase))]
        assert len(hits) == 1, f"unrecognised phrase {phrase!r} in {prompt!r}"
        ops.append(hits[0])
    return start, ops


def solve_prompt(prompt: str) -> int:
    value, ops = parse_prompt(prompt)
    for op, b in ops:
        if op == "+":
            value += b
        elif op == "-":
            value -= b
        elif op == "*":
            value *= b
        else:
            assert b >= 2, f"division by {b} in {prompt!r}"
            assert value % b == 0, f"{value} / {b} is not exact in {prompt!r}"
            value //= b
    return value


def replay_gold(example) -> str:
    """Replay the gold trace through call_tool, feeding each tool result as the next `a`."""
    trace = FAMILY.gold_trace(example)
    result = None
    for call in trace:
        assert call.name == "calculator"
        args = dict(call.arguments)
        if result is not None:
            args["a"] = result  # the previous tool output, as text
        result = FAMILY.call_tool(example.world, ToolCall(name=call.name, arguments=args))
        assert not result.startswith("error"), (example.prompt, call, result)
    assert result is not None
    return result


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("knobs", [{}, {"n_ops": 6, "operators": "+-*/", "operand_max": 5000}])
def test_same_seed_gives_identical_examples(knobs):
    a = examples(knobs, 50, seed=123)
    b = examples(knobs, 50, seed=123)
    assert [(e.prompt, e.world, e.answer) for e in a] == [(e.prompt, e.world, e.answer) for e in b]
    # the 50 examples are not all the same example
    assert len({e.prompt for e in a}) == 50


def test_different_seeds_give_different_prompts():
    a = [e.prompt for e in examples({}, 50, seed=1)]
    b = [e.prompt for e in examples({}, 50, seed=2)]
    assert a != b
    assert len(set(a) & set(b)) < 5


def test_example_only_depends_on_rng_state():
    """Two generators interleaved with other draws still agree when their rng states match."""
    d = FAMILY.difficulty({})
    r1, r2 = random.Random(7), random.Random(7)
    first = FAMILY.example(r1, d)
    r2.setstate(random.Random(7).getstate())
    assert FAMILY.example(r2, d) == first


# ---------------------------------------------------------------- gold answers (independent)

# Values stay exact for every operator in these; huge values are tested separately below.
SOLVER_CONFIGS = [
    {},  # default: n_ops=3, 2..999, "+-*"
    {"n_ops": 1, "operand_min": 2, "operand_max": 20, "operators": "+-*/"},
    {"n_ops": 2, "operand_min": 2, "operand_max": 5, "operators": "+-"},
    {"n_ops": 4, "operand_min": 2, "operand_max": 999, "operators": "+-*/"},
    {"n_ops": 5, "operand_min": 1, "operand_max": 30, "operators": "+-*/"},
    {"n_ops": 6, "operand_min": 500, "operand_max": 100_000, "operators": "+-*"},
    {"n_ops": 7, "operand_min": 2, "operand_max": 12, "operators": "*/"},
    {"n_ops": 8, "operand_min": 2, "operand_max": 10**6, "operators": "*"},
    {"n_ops": 8, "operand_min": 2, "operand_max": 50, "operators": "+-*/"},
]


def test_gold_answers_match_independent_solver():
    checked = 0
    for i, knobs in enumerate(SOLVER_CONFIGS):
        d = FAMILY.difficulty(knobs)
        for ex in examples(knobs, 60, seed=1000 + i):
            start, ops = parse_prompt(ex.prompt)
            assert len(ops) == d.n_ops
            assert d.operand_min <= start <= d.operand_max
            assert set(op for op, _ in ops) <= set(d.operators) | {"+"}  # '+' is the '/'-only fallback
            for op, b in ops:
                if op != "/":
                    assert d.operand_min <= b <= d.operand_max, (knobs, ex.prompt)
            assert int(ex.answer) == solve_prompt(ex.prompt), (knobs, ex.prompt, ex.answer)
            assert ex.answer == str(int(ex.answer))  # canonical integer text
            checked += 1
    assert checked >= 500


def test_every_phrase_and_operator_appears():
    """The solver above really exercises all eleven phrasings."""
    seen = set()
    for ex in examples({"n_ops": 8, "operand_max": 60, "operators": "+-*/"}, 100, seed=5):
        for phrase in re.split(r", then ", PROMPT_RE.fullmatch(ex.prompt).group(2).lower()):
            for rx, _ in PHRASE_RES:
                if rx.fullmatch(phrase):
                    seen.add(rx.pattern)
    assert len(seen) == len(PHRASE_TEMPLATES)


def test_gold_answer_exact_for_huge_values_with_division():
    knobs = {"n_ops": 12, "operand_max": 999, "operators": "*/"}
    ex = examples(knobs, 1, seed=45)[0]
    assert int(ex.answer) == solve_prompt(ex.prompt)


# ---------------------------------------------------------------- division


@pytest.mark.parametrize("knobs", [
    {"n_ops": 6, "operand_max": 999, "operators": "+-*/"},
    {"n_ops": 4, "operand_min": 2, "operand_max": 40, "operators": "-/"},
    {"n_ops": 3, "operand_min": 2, "operand_max": 500, "operators": "/"},
])
def test_division_is_exact_and_never_by_zero_or_one(knobs):
    n_div = 0
    for ex in examples(knobs, 150, seed=99):
        steps = ex.world["steps"]
        value = steps[0]["a"]
        for step in steps:
            assert type(step["a"]) is int and type(step["b"]) is int, step
            assert step["a"] == value, "a step does not start from the previous result"
            if step["op"] == "/":
                n_div += 1
                assert step["b"] not in (0, 1) and step["b"] >= 2, step
                assert step["a"] % step["b"] == 0, step
                value = step["a"] // step["b"]
            else:
                value = {"+": value + step["b"], "-": value - step["b"], "*": value * step["b"]}[step["op"]]
        assert ex.answer == str(value)
        # the prompt's own arithmetic agrees
        assert solve_prompt(ex.prompt) == value
    assert n_div >= 50, "division difficulty produced almost no divisions"


def test_division_only_with_prime_start_falls_back_exactly():
    """A start with no divisor in range cannot be divided; the example must stay exact."""
    d = FAMILY.difficulty({"n_ops": 1, "operand_min": 2, "operand_max": 13, "operators": "/"})
    rng = random.Random(0)
    seen_primes = set()
    for _ in range(200):
        ex = FAMILY.example(rng, d)
        step = ex.world["steps"][0]
        if step["a"] in (2, 3, 5, 7, 11, 13):
            seen_primes.add(step["a"])
            if step["op"] == "/":
                assert step["b"] == step["a"]  # the only divisor >= 2 of a prime is itself
        assert solve_prompt(ex.prompt) == int(ex.answer)
    assert seen_primes


# ---------------------------------------------------------------- gold trace replay


def test_gold_trace_replay_reaches_gold_answer():
    configs = [{}, {"n_ops": 4, "operators": "+-*/"}, {"n_ops": 8, "operand_max": 40, "operators": "+-*/"},
               {"n_ops": 1, "operand_max": 10**6}]
    n = 0
    for i, knobs in enumerate(configs):
        d = FAMILY.difficulty(knobs)
        for ex in examples(knobs, 50, seed=300 + i):
            trace = FAMILY.gold_trace(ex)
            assert len(trace) == d.n_ops
            assert {c.name for c in trace} == {"calculator"}
            assert replay_gold(ex) == ex.answer
            assert FAMILY.score(f"Answer: {replay_gold(ex)}", ex.answer) == 1.0
            n += 1
    assert n == 200


def test_gold_trace_only_uses_tools_the_eval_exposes():
    ex = examples({}, 1, seed=0)[0]
    tool_names = [fn.__name__ for fn in FAMILY.tools(ex.world)]
    eval_names = [t.name for t in FAMILY.eval_format(FAMILY.difficulty({})).tools]
    assert tool_names == eval_names == ["calculator"]
    params = [p.name for p in FAMILY.eval_format(FAMILY.difficulty({})).tools[0].parameters]
    assert params == ["a", "op", "b"]
    assert set(FAMILY.gold_trace(ex)[0].arguments) == set(params)


def test_gold_trace_replay_exact_for_large_products():
    ex = examples({"n_ops": 8, "operators": "*"}, 1, seed=1)[0]
    assert replay_gold(ex) == ex.answer


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: 1234", "1234", 1.0),
    ("Answer: 1,234", "1234", 1.0),
    ("answer = -5", "-5", 1.0),
    ("Answer: 1234.0", "1234", 1.0),
    ("Answer: −5", "-5", 1.0),  # unicode minus
    ("Let me compute.\nThe result is 42.\nAnswer: 42", "42", 1.0),
    ("ANSWER:   +42", "42", 1.0),
    ("1234", "1234", 0.0),  # missing "Answer:"
    ("The result is 1234.", "1234", 0.0),
    ("Answer: 1\nAnswer: 2", "2", 1.0),  # the last one wins
    ("Answer: 1\nAnswer: 2", "1", 0.0),
    ("Answer: 1235", "1234", 0.0),
    ("Answer: 1234.5", "1234", 0.0),
    ("Answer: 5", "-5", 0.0),
    ("Answer: -1234", "1234", 0.0),
    ("Answer: 12340", "1234", 0.0),
    ("", "1234", 0.0),
    ("Answer:", "1234", 0.0),
    ("Answer: none", "1234", 0.0),
])
def test_score(response, answer, expected):
    assert FAMILY.score(response, answer) == expected


def test_score_none_response_is_zero():
    assert FAMILY.score(None, "1234") == 0.0  # type: ignore[arg-type]


def test_score_distinguishes_large_integers():
    assert FAMILY.score("Answer: 10000000000000000000", "10000000000000000001") == 0.0


# ---------------------------------------------------------------- calculator tool


@pytest.mark.parametrize("a, op, b, expected", [
    (12, "*", 34, "408"),
    (12.0, "*", 34.0, "408"),
    ("3", "+", "4", "7"),
    ("3", "/", "4", "0.75"),
    ("1", "/", "3", "0.333333"),
    (10, "-", 25, "-15"),
    (84, "/", 4, "21"),
    ("-6", "*", "7", "-42"),
])
def test_calculator_results(a, op, b, expected):
    assert calculator(a, op, b) == expected
    assert FAMILY.call_tool({}, ToolCall(name="calculator", arguments={"a": a, "op": op, "b": b})) == expected


@pytest.mark.parametrize("args", [
    {"a": 10, "op": "/", "b": 0},
    {"a": "10", "op": "/", "b": "0.0"},
    {"a": 10, "op": "^", "b": 2},
    {"a": 10, "op": "plus", "b": 2},
    {"a": "ten", "op": "+", "b": 2},
    {"a": None, "op": "+", "b": 2},
    {"a": 1, "op": "+"},  # missing argument
    {"a": 1, "op": "+", "b": 2, "c": 3},  # extra argument
    {"a": 1, "op": ["+"], "b": 2},  # unhashable operator
])
def test_calculator_errors_are_text(args):
    out = FAMILY.call_tool({}, ToolCall(name="calculator", arguments=args))
    assert isinstance(out, str) and out.startswith("error:"), out


def test_unknown_tool_is_an_error_text():
    out = FAMILY.call_tool({}, ToolCall(name="python", arguments={"code": "1+1"}))
    assert out.startswith("error:") and "calculator" in out


@pytest.mark.parametrize("args", [
    {"a": 1e200, "op": "*", "b": 1e200},
    {"a": "inf", "op": "+", "b": 1},
    {"a": "nan", "op": "+", "b": 1},
])
def test_calculator_non_finite_never_raises(args):
    out = FAMILY.call_tool({}, ToolCall(name="calculator", arguments=args))
    assert out.startswith("error:")


# ---------------------------------------------------------------- difficulty validation


def test_default_difficulty():
    d = FAMILY.difficulty(None)
    assert d.model_dump() == {"n_ops": 3, "operand_min": 2, "operand_max": 999, "operators": "+-*"}


def test_unknown_knob_is_rejected_by_name():
    with pytest.raises(ValidationError) as e:
        FAMILY.difficulty({"n_ops": 3, "bogus_knob": 1})
    assert "bogus_knob" in str(e.value)


@pytest.mark.parametrize("knobs", [
    {"operand_min": 50, "operand_max": 50},
    {"operand_min": 60, "operand_max": 50},
    {"operators": "x"},
    {"operators": "+x"},
    {"operators": ""},
    {"n_ops": 0},
    {"n_ops": 13},
    {"operand_min": 0},
])
def test_bad_difficulty_rejected(knobs):
    with pytest.raises(ValidationError):
        FAMILY.difficulty(knobs)


def test_operand_range_error_message():
    with pytest.raises(ValidationError) as e:
        FAMILY.difficulty({"operand_min": 10, "operand_max": 5})
    assert "operand_min must be below operand_max" in str(e.value)


# ---------------------------------------------------------------- guessing fails


def test_answer_only_guessing_scores_low(monkeypatch, tmp_path):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.setenv("AIT_HIDDEN_SEED", "calc-chain-guess-test")
    # The family at full strength (3-step chains): the shipped spec's calibrated rung is one
    # operation, where "sum the numbers" is not a shortcut but the computation itself.
    spec = build_spec("calc_chain", constraints=load_spec(SPEC_PATH).constraints)
    exs = hidden_examples(spec)
    assert len(exs) == 200
    gold = sum(FAMILY.score(f"Answer: {ex.answer}", ex.answer) for ex in exs)
    assert gold == 200
    guesses = {
        "start": lambda nums: nums[0],
        "sum": lambda nums: sum(nums),
        "last": lambda nums: nums[-1],
        "product of first two": lambda nums: nums[0] * nums[1],
    }
    for name, guess in guesses.items():
        hits = 0
        for ex in exs:
            nums = [int(x) for x in re.findall(r"\d+", ex.prompt)]
            hits += FAMILY.score(f"Answer: {guess(nums)}", ex.answer)
        assert hits / len(exs) < 0.05, f"guessing the {name} scores {hits}/{len(exs)}"


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: an easy rung trains on easy problems (it once
    trained a 2-4-operation mix at every rung, and the model learned only the shaped rewards)."""
    import json
    import re
    import shutil

    from ait.job.env_loader import import_env

    ref = Path(__file__).resolve().parents[1] / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain"
    ws = tmp_path / "ws"
    shutil.copytree(ref, ws)
    task = json.loads((Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain.json").read_text())
    task["difficulty"] = {"n_ops": 1, "operand_min": 2, "operand_max": 99, "operators": "+-"}
    (ws / "task.json").write_text(json.dumps(task))
    rows = import_env(ws / "env.py").build_dataset(200, 0)
    assert len(rows) == 200
    for row in rows:
        numbers = [int(x) for x in re.findall(r"\d+", row["prompt"])]
        assert len(numbers) == 2 and all(2 <= x <= 99 for x in numbers), row["prompt"]
        assert "multipl" not in row["prompt"] and row["info"]["n_ops"] == 1
        a, b = numbers
        assert int(row["answer"]) in (a + b, a - b)
    # a rung with fewer distinct problems than asked for ends instead of looping forever
    task["difficulty"] = {"n_ops": 1, "operand_min": 2, "operand_max": 3, "operators": "+"}
    (ws / "task.json").write_text(json.dumps(task))
    small = import_env(ws / "env.py").build_dataset(100, 0)
    assert 1 <= len(small) <= 4 * 2  # 2 x 2 operand pairs x 2 phrasings
    # without task.json (an older workspace): the 2-4-operation mix as before
    (ws / "task.json").unlink()
    assert {r["info"]["n_ops"] for r in import_env(ws / "env.py").build_dataset(100, 0)} <= {2, 3, 4}


def test_the_description_names_the_calculator_only_where_the_rung_offers_it() -> None:
    from ait.spec import Constraints, build_spec

    c = Constraints(allowed_base_models=["tiny"], max_steps=10, max_group_size=8, max_prompts_per_step=8,
                    max_completion_tokens=64, max_turns=4, time_budget_s=60, min_dataset_rows=8, max_dataset_rows=100)
    with_tool = build_spec("calc_chain", constraints=c)
    without = build_spec("calc_chain", constraints=c, difficulty={"calculator": False})
    assert "calculator tool" in with_tool.description and with_tool.eval_format.tools
    assert "calculator" not in without.description and not without.eval_format.tools
    assert "no tool is offered" in without.description
