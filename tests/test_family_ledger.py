"""ledger: determinism, gold answers from an independent simulation, a prompt-only scripted
solver that reaches the gold answer through the tools, guessing fails, the scorer, tool
errors, the reference job (probe + agreement with the family's tools).

The simulation below is written from the stated rules and reads only the world's raw
data; the solver sees only the prompt and a `call(name, **args)` function.
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
from ait.families.ledger import Ledger, inline_prompt
from ait.spec import Constraints, build_spec
from tests.reference_rows import reference_rows_at

FAMILY = Ledger()
REPO = Path(__file__).resolve().parents[1]
REF_JOB = REPO / "src" / "ait" / "policy" / "reference_jobs" / "ledger"
ALL_Q = {"questions": "balance,net_change,rejected,fees"}
CONSTRAINTS = Constraints(allowed_base_models=["tiny", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"], max_steps=200,
                          max_group_size=16, max_prompts_per_step=16, max_completion_tokens=512, max_turns=8,
                          time_budget_s=600, min_dataset_rows=32, max_dataset_rows=20000)


def examples(knobs: dict, n: int, seed: int) -> list:
    d = FAMILY.difficulty(knobs)
    rng = random.Random(seed)
    return [FAMILY.example(rng, d) for _ in range(n)]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ait.families.FAMILIES, "ledger", FAMILY)
    return FAMILY


def hidden_set(monkeypatch, seed: str, knobs: dict | None = None):
    from ait.evals.hidden import hidden_examples

    monkeypatch.setitem(ait.families.FAMILIES, "ledger", FAMILY)
    monkeypatch.setenv("AIT_HIDDEN_SEED", seed)
    spec = build_spec("ledger", difficulty=knobs, constraints=CONSTRAINTS)
    return spec, hidden_examples(spec)


# ---------------------------------------------------------------- independent simulation


def simulate(world: dict) -> dict:
    """Final balances, rejected count and fees from the raw world, per the prompt's rules."""
    bal = {k: v for k, v in world["accounts"].items()}
    rejected = fees = 0
    for tx in world["transactions"]:
        a = tx["account"]
        if tx["kind"] == "deposit":
            bal[a] = bal[a] + tx["amount"]
        elif tx["kind"] == "fee":
            charge = (bal[a] * tx["percent"]) // 100
            fees += charge
            bal[a] -= charge
        else:
            if tx["amount"] > bal[a]:
                rejected += 1
                continue
            bal[a] -= tx["amount"]
            if tx["kind"] == "transfer":
                bal[tx["to"]] += tx["amount"]
    return {"final": bal, "rejected": rejected, "fees": fees}


def expected_answer(prompt: str, world: dict) -> int:
    sim = simulate(world)
    if m := re.search(r"final balance of account '(\w+)'", prompt):
        return sim["final"][m.group(1)]
    if m := re.search(r"balance of account '(\w+)' change", prompt):
        return sim["final"][m.group(1)] - world["accounts"][m.group(1)]
    if "were rejected" in prompt:
        return sim["rejected"]
    assert "charged in fees" in prompt, prompt
    return sim["fees"]


# ---------------------------------------------------------------- prompt-only solver


def solve(prompt: str, call) -> str:
    listing = call("list_transactions")
    n = int(re.search(r": (\d+) transactions", listing).group(1))

    def balance_after(i: int, account: str) -> int:
        out = call("apply_transaction", index=i)
        return int(re.search(rf"\b{account}=(-?\d+)", out.split("Balances after")[1]).group(1))

    if m := re.search(r"final balance of account '(\w+)'", prompt):
        return str(balance_after(n, m.group(1)))
    if m := re.search(r"balance of account '(\w+)' change", prompt):
        opening = int(re.search(r": (-?\d+)", call("opening_balance", account=m.group(1))).group(1))
        return str(balance_after(n, m.group(1)) - opening)
    if "were rejected" in prompt:
        return str(sum(": rejected" in call("apply_transaction", index=i) for i in range(1, n + 1)))
    fee_idx = [int(x) for x in re.findall(r"^#(\d+) fee ", listing, re.MULTILINE)]
    return str(sum(int(re.search(r"charged (\d+)", call("apply_transaction", index=i)).group(1)) for i in fee_idx))


def bound_call(world: dict):
    def call(name: str, **args) -> str:
        out = FAMILY.call_tool(world, ToolCall(name=name, arguments=args))
        assert not out.startswith("error"), (name, args, out)
        return out
    return call


# ---------------------------------------------------------------- determinism and world


@pytest.mark.parametrize("knobs", [{}, {**ALL_Q, "n_accounts": 5, "max_transactions": 20}])
def test_same_seed_same_examples_and_distinct_prompts(knobs):
    a, b = examples(knobs, 60, seed=11), examples(knobs, 60, seed=11)
    assert [e.model_dump() for e in a] == [e.model_dump() for e in b]
    assert len({e.prompt for e in a}) == 60


def test_different_seeds_differ():
    a = examples({}, 50, seed=1)
    b = examples({}, 50, seed=2)
    assert [e.prompt for e in a] != [e.prompt for e in b]
    assert [e.world for e in a] != [e.world for e in b]


def test_world_is_plain_json_and_tools_agree_after_round_trip():
    for ex in examples(ALL_Q, 40, seed=3):
        text = json.dumps(ex.world)
        world2 = json.loads(text)
        assert world2 == ex.world
        for c in FAMILY.gold_trace(ex):
            assert FAMILY.call_tool(world2, c) == FAMILY.call_tool(ex.world, c)


def test_knobs_shape_the_world():
    d = FAMILY.difficulty({"n_accounts": 5, "min_transactions": 15, "max_transactions": 18,
                           "fee_frequency": 0.5, "overdraft_probability": 0.8, **ALL_Q})
    rng = random.Random(4)
    kinds, rejected = [], 0
    for _ in range(50):
        ex = FAMILY.example(rng, d)
        assert len(ex.world["accounts"]) == 5
        assert 15 <= len(ex.world["transactions"]) <= 18
        kinds += [t["kind"] for t in ex.world["transactions"]]
        rejected += simulate(ex.world)["rejected"]
    assert {"deposit", "withdrawal", "transfer", "fee"} <= set(kinds)
    assert kinds.count("fee") / len(kinds) > 0.3
    assert rejected > 100  # most withdrawals/transfers overdraw at 0.8
    none = examples({"fee_frequency": 0.0, "overdraft_probability": 0.0}, 50, seed=5)
    assert all(t["kind"] != "fee" for e in none for t in e.world["transactions"])
    assert all(simulate(e.world)["rejected"] == 0 for e in none)


def test_prompt_does_not_leak_the_facts():
    """The only number in the prompt is the ledger's id: amounts and balances live in the world."""
    for ex in examples(ALL_Q, 100, seed=6):
        assert re.findall(r"\d+", ex.prompt) == [ex.world["ledger"][1:]]
        assert "deposit" not in ex.prompt and "#" not in ex.prompt and " into " not in ex.prompt


# ---------------------------------------------------------------- gold answers


@pytest.mark.parametrize("knobs", [{}, ALL_Q, {**ALL_Q, "n_accounts": 2, "min_transactions": 2,
                                               "max_transactions": 3}, {**ALL_Q, "n_accounts": 6,
                                               "min_transactions": 20, "max_transactions": 20,
                                               "fee_frequency": 0.5, "overdraft_probability": 0.8}])
def test_gold_answers_match_independent_simulation(knobs):
    types = set()
    for ex in examples(knobs, 120, seed=21):
        assert ex.answer == str(expected_answer(ex.prompt, ex.world)), ex.prompt
        types.add(ex.world["question"]["type"])
        q = ex.world["question"]
        if q["type"] in ("balance", "net_change"):  # the opening balance is never the answer
            assert simulate(ex.world)["final"][q["account"]] != ex.world["accounts"][q["account"]]
        if q["type"] == "fees":
            assert int(ex.answer) > 0
    assert types == set(FAMILY.difficulty(knobs).question_types())


def test_gold_trace_reaches_answer_and_uses_only_eval_tools():
    fmt = FAMILY.eval_format(FAMILY.difficulty(ALL_Q))
    specs = {t.name: [p.name for p in t.parameters] for t in fmt.tools}
    for ex in examples(ALL_Q, 100, seed=8):
        trace = FAMILY.gold_trace(ex)
        q = ex.world["question"]
        assert len(trace) >= (2 if q["type"] == "net_change" else 1)
        assert len(trace) + 1 <= fmt.max_turns
        outputs = []
        for c in trace:
            assert list(c.arguments) == specs[c.name]
            outputs.append(FAMILY.call_tool(ex.world, c))
            assert not outputs[-1].startswith("error")
        if q["type"] == "balance":  # one call shows the answer
            assert [c.name for c in trace] == ["final_balance"]
            assert outputs[0].startswith(f"Final balance of {q['account']}: {ex.answer} ")
        elif q["type"] == "net_change":  # final minus opening, both read off the trace
            final = int(re.search(r": (-?\d+)", outputs[0]).group(1))
            opening = int(re.search(r": (-?\d+)", outputs[1]).group(1))
            assert final - opening == int(ex.answer)
        else:
            assert trace[-1].name == "apply_transaction"


# ---------------------------------------------------------------- solver and guessing on the hidden set


def test_prompt_only_solver_reaches_every_hidden_answer(monkeypatch):
    spec, exs = hidden_set(monkeypatch, "ledger-solver-test")
    assert len(exs) == 200
    assert sum(FAMILY.score(f"Answer: {solve(ex.prompt, bound_call(ex.world))}", ex.answer) for ex in exs) == 200


def test_prompt_only_solver_on_every_question_type(monkeypatch):
    spec, exs = hidden_set(monkeypatch, "ledger-solver-all", {**ALL_Q, "max_transactions": 16})
    assert {e.world["question"]["type"] for e in exs} == {"balance", "net_change", "rejected", "fees"}
    assert all(FAMILY.score(f"Answer: {solve(e.prompt, bound_call(e.world))}", e.answer) == 1.0 for e in exs)


def test_answer_only_guessing_scores_low(monkeypatch):
    spec, exs = hidden_set(monkeypatch, "ledger-guess-test")
    guesses = {
        "zero": lambda p: "0",
        "round number": lambda p: "1000",
        "ledger number": lambda p: re.search(r"Ledger L(\d+)", p).group(1),
        "small change": lambda p: "-100" if "change" in p else "500",
    }
    for name, guess in guesses.items():
        hits = sum(FAMILY.score(f"Answer: {guess(ex.prompt)}", ex.answer) for ex in exs)
        assert hits / len(exs) < 0.10, f"guessing {name} scores {hits}/200"


def test_single_tool_call_is_not_enough(monkeypatch):
    """Opening balance or a fixed index without reading the count fails most of the time."""
    spec, exs = hidden_set(monkeypatch, "ledger-shortcut-test")
    hits_open = hits_fixed = 0
    for ex in exs:
        acct = re.search(r"account '(\w+)'", ex.prompt).group(1)
        opening = re.search(r": (-?\d+)", bound_call(ex.world)("opening_balance", account=acct)).group(1)
        hits_open += FAMILY.score(f"Answer: {opening}", ex.answer)
        out = FAMILY.call_tool(ex.world, ToolCall(name="apply_transaction", arguments={"index": 10}))
        if not out.startswith("error"):
            value = re.search(rf"{acct}=(-?\d+)", out).group(1)
            hits_fixed += FAMILY.score(f"Answer: {value}", ex.answer)
    assert hits_open == 0
    assert hits_fixed / len(exs) < 0.25


# ---------------------------------------------------------------- scorer


@pytest.mark.parametrize("response, answer, expected", [
    ("Answer: 1234", "1234", 1.0),
    ("Answer: 1,234", "1234", 1.0),
    ("Answer: $1,234", "1234", 1.0),
    ("answer = 1234.0", "1234", 1.0),
    ("ANSWER:  +75", "75", 1.0),
    ("Answer: -75", "-75", 1.0),
    ("Answer: −75", "-75", 1.0),
    ("Answer: -$75", "-75", 1.0),
    ("Answer: $-75", "-75", 1.0),
    ("Answer: 1234.", "1234", 1.0),
    ("The balance is 900.\nAnswer: 1234", "1234", 1.0),
    ("Answer: 5\nAnswer: 7", "7", 1.0),
    ("Answer: 5\nAnswer: 7", "5", 0.0),
    ("Answer: 75", "-75", 0.0),
    ("Answer: -1234", "1234", 0.0),
    ("Answer: 1234.5", "1234", 0.0),
    ("Answer: 12340", "1234", 0.0),
    ("1234", "1234", 0.0),
    ("The final balance is 1234.", "1234", 0.0),
    ("Answer: 1234\nAnswer: none", "1234", 0.0),
    ("Answer:", "0", 0.0),
    ("", "0", 0.0),
    ("Answer: 0", "0", 1.0),
])
def test_score(response, answer, expected):
    assert FAMILY.score(response, answer) == expected


def test_score_none_is_zero():
    assert FAMILY.score(None, "5") == 0.0  # type: ignore[arg-type]


# ---------------------------------------------------------------- tools


WORLD = {"ledger": "L1234", "accounts": {"checking": 100, "savings": 50},
         "transactions": [{"kind": "withdrawal", "account": "checking", "amount": 150},
                          {"kind": "transfer", "account": "checking", "to": "savings", "amount": 60},
                          {"kind": "fee", "account": "savings", "percent": 10},
                          {"kind": "deposit", "account": "checking", "amount": 7}],
         "question": {"type": "rejected", "account": None}}


def test_tool_outputs_on_a_hand_made_world():
    call = bound_call(WORLD)
    assert call("list_transactions").splitlines() == [
        "Ledger L1234: 4 transactions, processed in order #1..#4.", "#1 withdraw 150 from checking",
        "#2 transfer 60 from checking to savings", "#3 fee 10% on savings", "#4 deposit 7 into checking"]
    assert call("apply_transaction", index=1) == ("#1 withdraw 150 from checking: rejected (checking has only 100). "
                                                   "Balances after #1: checking=100, savings=50")
    assert call("apply_transaction", index=3) == ("#3 fee 10% on savings: applied, charged 11. "
                                                   "Balances after #3: checking=40, savings=99")
    assert call("apply_transaction", index="4").endswith("checking=47, savings=99")
    assert call("apply_transaction", index=2.0).startswith("#2 transfer 60 from checking to savings: applied.")
    assert call("opening_balance", account=" Savings ") == "Opening balance of savings: 50 (before transaction #1)"
    # order of calls does not matter: the ledger is always processed in order
    assert call("apply_transaction", index=3) == call("apply_transaction", index=3)


def test_balance_exactly_zero_is_allowed():
    world = {**WORLD, "transactions": [{"kind": "withdrawal", "account": "checking", "amount": 100}]}
    assert "applied. Balances after #1: checking=0" in bound_call(world)("apply_transaction", index=1)


@pytest.mark.parametrize("name, args", [
    ("apply_transaction", {"index": 0}),
    ("apply_transaction", {"index": 5}),
    ("apply_transaction", {"index": -1}),
    ("apply_transaction", {"index": ""}),
    ("apply_transaction", {"index": "three"}),
    ("apply_transaction", {"index": None}),
    ("apply_transaction", {"index": True}),
    ("apply_transaction", {"index": 1.5}),
    ("apply_transaction", {"index": [1]}),
    ("apply_transaction", {"index": "9" * 500}),
    ("apply_transaction", {}),
    ("apply_transaction", {"index": 1, "extra": 2}),
    ("opening_balance", {"account": "bogus"}),
    ("opening_balance", {"account": ""}),
    ("opening_balance", {"account": None}),
    ("opening_balance", {"account": ["savings"]}),
    ("list_transactions", {"x": 1}),
    ("transfer", {"index": 1}),
])
def test_bad_calls_are_error_text(name, args):
    out = FAMILY.call_tool(WORLD, ToolCall(name=name, arguments=args))
    assert isinstance(out, str) and out.startswith("error:"), out
    assert len(out) < 300


@pytest.mark.parametrize("world", [{}, {"accounts": {}}, {"transactions": []}, WORLD])
def test_tools_never_raise_directly(world):
    tools = {fn.__name__: fn for fn in FAMILY.tools(world)}
    for bad in [0, 1, -3, "", "x", None, 2.5, True, [], {}, 10**30]:
        assert isinstance(tools["apply_transaction"](bad), str)
        assert isinstance(tools["opening_balance"](bad), str)
        assert isinstance(tools["final_balance"](bad), str)
    assert isinstance(tools["list_transactions"](), str)


def test_tools_have_json_schemas_matching_the_eval_format():
    from transformers.utils import get_json_schema

    fmt = FAMILY.eval_format(FAMILY.difficulty({}))
    tools = FAMILY.tools(WORLD)
    assert [fn.__name__ for fn in tools] == [t.name for t in fmt.tools]
    for fn, t in zip(tools, fmt.tools):
        schema = get_json_schema(fn)["function"]
        assert schema["name"] == t.name
        props = schema["parameters"].get("properties", {})
        assert list(props) == [p.name for p in t.parameters]
        for p in t.parameters:
            assert props[p.name]["type"] == p.type
        # the spec's example is valid against any world, including an empty one
        for world in ({}, WORLD, examples({}, 1, seed=0)[0].world):
            out = {f.__name__: f for f in FAMILY.tools(world)}[t.name](**t.example)
            assert isinstance(out, str)


def test_eval_format_turns_cover_the_longest_trace():
    assert FAMILY.eval_format(FAMILY.difficulty({})).max_turns >= 4
    fmt = FAMILY.eval_format(FAMILY.difficulty({**ALL_Q, "max_transactions": 20, "min_transactions": 20}))
    assert fmt.max_turns >= 22
    assert "Answer: <integer>" in fmt.system_prompt


# ---------------------------------------------------------------- difficulty


def test_default_difficulty():
    assert FAMILY.difficulty(None).model_dump() == {
        "n_accounts": 3, "min_transactions": 8, "max_transactions": 12, "fee_frequency": 0.15,
        "overdraft_probability": 0.2, "questions": "balance,net_change"}


@pytest.mark.parametrize("knobs", [
    {"bogus": 1}, {"n_accounts": 1}, {"n_accounts": 9}, {"min_transactions": 13},
    {"max_transactions": 21}, {"fee_frequency": 0.9}, {"overdraft_probability": -0.1},
    {"questions": "balance,total"}, {"questions": ""}, {"questions": "fees", "fee_frequency": 0.0},
])
def test_bad_difficulty_rejected(knobs):
    with pytest.raises(ValidationError):
        FAMILY.difficulty(knobs)


# ---------------------------------------------------------------- reference job


def load_ref_env():
    from ait.job.env_loader import import_env

    return import_env(REF_JOB / "env.py")  # with the workspace's task_tools.py importable


def test_reference_env_is_self_contained():
    text = (REF_JOB / "env.py").read_text()
    assert not re.search(r"^\s*(from|import)\s+ait\b", text, re.MULTILINE)


def test_reference_job_passes_the_probe(registered, tmp_path):
    from ait.probe.runner import probe_workspace

    spec = build_spec("ledger", constraints=CONSTRAINTS)
    ws = tmp_path / "ws"
    shutil.copytree(REF_JOB, ws)
    report = probe_workspace(ws, spec)
    assert report.valid, report.summary()


def test_reference_env_prompt_matches_the_eval():
    assert load_ref_env().SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt


def test_reference_dataset_is_distinct_correct_and_solvable():
    env_mod = load_ref_env()
    rows = env_mod.build_dataset(300, 7)
    assert len(rows) == 300 and len({r["prompt"] for r in rows}) == 300
    assert rows == env_mod.build_dataset(300, 7)
    assert rows != env_mod.build_dataset(300, 8)
    for r in rows:
        world = r["info"]["world"]
        json.dumps(r["info"])
        assert r["answer"] == str(expected_answer(r["prompt"], world)), r["prompt"]
        assert solve(r["prompt"], bound_call(world)) == r["answer"]
        assert env_mod.reward_correct(f"Answer: {r['answer']}", r["answer"], r["info"]) == 1.0
        assert env_mod.reward_correct(f"Answer: {int(r['answer']) + 1}", r["answer"], r["info"]) == 0.0


def test_reference_rewards_give_graded_signal():
    env_mod = load_ref_env()
    gold = "-120"
    assert env_mod.reward_correct("Answer: -120", gold, {}) == 1.0
    assert env_mod.reward_correct("Answer: 120", gold, {}) == 0.0
    assert env_mod.reward_correct("Answer: $1,234", "1234", {}) == 1.0
    near, far = env_mod.reward_close("Answer: -110", gold, {}), env_mod.reward_close("Answer: 900", gold, {})
    assert 1.0 > near > far > 0.0
    assert env_mod.reward_close("no numbers", gold, {}) == 0.0
    assert env_mod.reward_format("Answer: 3", gold, {}) == 1.0 and env_mod.reward_format("3", gold, {}) == 0.0
    assert len(env_mod.REWARD_FUNCS) == len(env_mod.REWARD_WEIGHTS)


def _reference_rows_at(tmp_path, knobs: dict | None, n: int = 200, seed: int = 0) -> list[dict]:
    return reference_rows_at(tmp_path, "ledger", knobs, n, seed)


def test_the_reference_env_trains_at_the_tasks_difficulty(tmp_path):
    """The reference env reads task.json beside it: the easiest rung trains on two accounts, 2-4
    transactions, no fees, no overdrafts and balance questions only (it once drew 2-4 accounts and
    6-12 transactions with fees and overdrafts whatever the task asked)."""
    easiest = {"n_accounts": 2, "min_transactions": 2, "max_transactions": 4, "fee_frequency": 0.0,
               "overdraft_probability": 0.0, "questions": "balance"}
    rows = _reference_rows_at(tmp_path, easiest)
    assert len(rows) == 200 and len({r["prompt"] for r in rows}) == 200
    for r in rows:
        world = r["info"]["world"]
        assert len(world["accounts"]) == 2 and 2 <= len(world["transactions"]) <= 4, r["prompt"]
        assert all(tx["kind"] != "fee" for tx in world["transactions"])
        assert simulate(world)["rejected"] == 0 and "final balance of account" in r["prompt"]
        assert r["answer"] == str(expected_answer(r["prompt"], world))
    # the per-transaction question types, with many fees and overdrafts, are asked when the task asks them
    hard = {"n_accounts": 5, "min_transactions": 14, "max_transactions": 16, "fee_frequency": 0.4,
            "overdraft_probability": 0.6, "questions": "rejected,fees"}
    rows = _reference_rows_at(tmp_path, hard)
    kinds = [tx["kind"] for r in rows for tx in r["info"]["world"]["transactions"]]
    assert 0.3 < kinds.count("fee") / len(kinds) < 0.5
    assert sum(simulate(r["info"]["world"])["rejected"] for r in rows) / len(kinds) > 0.15
    asked = set()
    for r in rows:
        world = r["info"]["world"]
        assert len(world["accounts"]) == 5 and 14 <= len(world["transactions"]) <= 16
        asked.add(world["question"]["type"])
        assert r["answer"] == str(expected_answer(r["prompt"], world)), r["prompt"]
        assert solve(r["prompt"], bound_call(world)) == r["answer"]
    assert asked == {"rejected", "fees"}
    # without task.json (an older workspace): 2-4 accounts, 6-12 transactions, balance and net change
    old = _reference_rows_at(tmp_path, None)
    assert {len(r["info"]["world"]["accounts"]) for r in old} == {2, 3, 4}
    assert {len(r["info"]["world"]["transactions"]) for r in old} == set(range(6, 13))
    assert {r["info"]["world"]["question"]["type"] for r in old} == {"balance", "net_change"}


# ---------------------------------------------------------------- inline: the data stated in the question


EASY = {"n_accounts": 2, "min_transactions": 2, "max_transactions": 4, "fee_frequency": 0.0,
        "overdraft_probability": 0.0, "questions": "balance"}
TX_LINE = re.compile(r"^#(\d+) (?:deposit (\d+) into (\w+)|withdraw (\d+) from (\w+)|transfer (\d+) from (\w+) to (\w+)"
                     r"|fee (\d+)% on (\w+))$", re.MULTILINE)


def read_inline(prompt: str) -> dict:
    """The ledger as the prompt states it (opening balances, numbered transactions), from the text alone."""
    opening = re.search(r"Opening balances: ([^\n]*?)\. Transactions", prompt).group(1)
    accounts = {name: int(v) for name, v in re.findall(r"(\w+)=(-?\d+)", opening)}
    txs = []
    for k, (i, dep, dep_a, wd, wd_a, tr, tr_a, tr_to, pct, fee_a) in enumerate(TX_LINE.findall(prompt), 1):
        assert int(i) == k, prompt
        if dep:
            txs.append({"kind": "deposit", "account": dep_a, "amount": int(dep)})
        elif wd:
            txs.append({"kind": "withdrawal", "account": wd_a, "amount": int(wd)})
        elif tr:
            txs.append({"kind": "transfer", "account": tr_a, "to": tr_to, "amount": int(tr)})
        else:
            txs.append({"kind": "fee", "account": fee_a, "percent": int(pct)})
    return {"accounts": accounts, "transactions": txs}


def solve_inline(prompt: str) -> str:
    """No tools: read the stated ledger and simulate it by the stated rules."""
    return str(expected_answer(prompt, read_inline(prompt)))


def test_inline_knob_defaults_off_and_is_left_out_of_the_dump_until_set():
    assert FAMILY.difficulty({}).inline is False
    assert FAMILY.difficulty({"inline": False}).model_dump() == FAMILY.difficulty({}).model_dump()
    assert "inline" not in FAMILY.difficulty({}).model_dump_json()
    on = FAMILY.difficulty({**EASY, "inline": True})
    assert on.model_dump() == {**EASY, "inline": True}
    assert FAMILY.difficulty(on.model_dump()) == on
    with pytest.raises(ValidationError):
        FAMILY.difficulty({"inline": "sometimes"})


@pytest.mark.parametrize("knobs", [EASY, {}, ALL_Q, {**ALL_Q, "n_accounts": 6, "min_transactions": 20,
                                                     "max_transactions": 20, "fee_frequency": 0.5,
                                                     "overdraft_probability": 0.8}])
def test_inline_prompt_states_the_tools_data(knobs):
    """Same seed, same ledger, same answer: inline only adds the opening balances and the listing."""
    plain, inline = examples(knobs, 60, seed=41), examples({**knobs, "inline": True}, 60, seed=41)
    for p, ex in zip(plain, inline):
        assert ex.world == p.world and ex.answer == p.answer
        call = bound_call(ex.world)
        for name, value in ex.world["accounts"].items():
            assert f"{name}={value}" in ex.prompt
            assert call("opening_balance", account=name).endswith(f": {value} (before transaction #1)")
        for line in call("list_transactions").splitlines()[1:]:
            assert f"\n{line}\n" in ex.prompt, (line, ex.prompt)
        assert read_inline(ex.prompt) == {k: ex.world[k] for k in ("accounts", "transactions")}
        # the same head and ask as the tool-only prompt, with the rules that apply to this listing
        head, rest = p.prompt.split(" After processing all of its transactions in order (")
        assert ex.prompt.startswith(head + " Opening balances: ")
        ask = rest.split("rounded down), ")[1]
        assert f"After processing all of them in order, {ask} " in ex.prompt
        assert ex.prompt.endswith("Think step by step, then end with the line 'Answer: <integer>'.")
        kinds = {t["kind"] for t in ex.world["transactions"]}
        assert ("would make a balance negative is rejected" in ex.prompt) == bool(kinds & {"withdrawal", "transfer"})
        assert ("percent of the account's current balance, rounded down" in ex.prompt) == ("fee" in kinds)
        assert FAMILY.gold_trace(ex) == FAMILY.gold_trace(p)


def test_inline_prompts_are_short_at_the_easy_rungs():
    for knobs in (EASY, {**EASY, "max_transactions": 6, "n_accounts": 3}):
        longest = max(len(ex.prompt) for ex in examples({**knobs, "inline": True}, 200, seed=42))
        assert longest < 1000, longest  # well under ~350 tokens (words and numbers: ~3.5 chars a token)


@pytest.mark.parametrize("knobs", [EASY, {}, ALL_Q, {**ALL_Q, "n_accounts": 5, "min_transactions": 14,
                                                     "max_transactions": 20, "fee_frequency": 0.5,
                                                     "overdraft_probability": 0.6}])
def test_inline_prompt_alone_reaches_every_gold_answer(knobs):
    exs = examples({**knobs, "inline": True}, 300, seed=43)
    assert {e.world["question"]["type"] for e in exs} == set(FAMILY.difficulty(knobs).question_types())
    for ex in exs:
        assert solve_inline(ex.prompt) == ex.answer, ex.prompt
    # and the same reading fails on the tool-only prompt: it carries no data
    for ex in examples(knobs, 20, seed=43):
        with pytest.raises(AttributeError):
            solve_inline(ex.prompt)


def test_inline_hidden_set_is_solvable_from_the_prompt_alone(monkeypatch):
    spec, exs = hidden_set(monkeypatch, "ledger-inline-test", {**ALL_Q, "inline": True})
    assert spec.difficulty["inline"] is True
    assert all(FAMILY.score(f"Answer: {solve_inline(e.prompt)}", e.answer) == 1.0 for e in exs)
    # the tools still reach the same answers
    assert all(FAMILY.score(f"Answer: {solve(e.prompt, bound_call(e.world))}", e.answer) == 1.0 for e in exs)


def test_non_inline_examples_and_format_are_unchanged():
    """Pinned before the knob existed: examples (prompts, worlds, answers) and the eval format (its
    digest re-pinned when final_balance joined the tools; the examples are unchanged)."""
    import hashlib

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()

    pinned = {
        "default": ({}, "17e1aaa9e5ec6ac9f0a594caf759fb95dc86693eeffc8a40c06a5b73a9cb2f23",
                    "84cf57e531812289dcd25ef46c9e6eee3715730076b9ffaf663272271fa8c54f"),
        "wide": ({**ALL_Q, "n_accounts": 5, "max_transactions": 20},
                 "25c8f25450e5ebdaf3e75e112189f3cf14a94c4eab5f4fd469ff117b366bc338",
                 "989378692b1bc5395f5ea269ac1a8af978e771533993ad0dd676b47c5ec8088d"),
    }
    for name, (knobs, ex_digest, fmt_digest) in pinned.items():
        for k in (knobs, {**knobs, "inline": False}):
            d = FAMILY.difficulty(k)
            rng = random.Random(2024)
            assert digest([FAMILY.example(rng, d).model_dump() for _ in range(40)]) == ex_digest, name
            assert hashlib.sha256(FAMILY.eval_format(d).model_dump_json().encode()).hexdigest() == fmt_digest, name
    for ex in examples({**ALL_Q, "inline": False}, 50, seed=44):
        assert re.findall(r"\d+", ex.prompt) == [ex.world["ledger"][1:]] and "Opening balances" not in ex.prompt


def test_system_prompt_says_where_the_data_is():
    plain = FAMILY.eval_format(FAMILY.difficulty(EASY))
    inline = FAMILY.eval_format(FAMILY.difficulty({**EASY, "inline": True}))
    committed = json.loads((REPO / "examples" / "tasks" / "ledger.json").read_text())["eval_format"]
    assert plain.system_prompt == committed["system_prompt"]
    assert "not in the question" in plain.system_prompt
    assert "not in the question" not in inline.system_prompt
    assert "question states" in inline.system_prompt and "optional" in inline.system_prompt
    assert "Answer: <integer>" in inline.system_prompt
    # the fee rule only where fees can occur
    assert "rounded down" not in inline.system_prompt and "would make a balance negative" in inline.system_prompt
    with_fees = FAMILY.eval_format(FAMILY.difficulty({**EASY, "fee_frequency": 0.1, "inline": True}))
    assert "a fee takes the given percent" in with_fees.system_prompt
    # the same tools, answer format and turns; more room to write the working out
    assert (inline.model_dump(exclude={"system_prompt", "max_new_tokens"})
            == plain.model_dump(exclude={"system_prompt", "max_new_tokens"}))
    assert plain.max_new_tokens == 128 and inline.max_new_tokens >= 256


def test_the_reference_env_honours_inline(tmp_path):
    from ait.job.env_loader import import_env

    env_path = tmp_path / "ws-ledger" / "env.py"
    for knobs in (EASY, {**ALL_Q, "n_accounts": 4, "min_transactions": 6, "max_transactions": 10,
                         "fee_frequency": 0.3, "overdraft_probability": 0.4}):
        rows = _reference_rows_at(tmp_path, {**knobs, "inline": True}, n=150)
        assert len(rows) == 150
        for r in rows:
            world = r["info"]["world"]
            assert read_inline(r["prompt"]) == {k: world[k] for k in ("accounts", "transactions")}, r["prompt"]
            assert solve_inline(r["prompt"]) == r["answer"] == str(expected_answer(r["prompt"], world))
            # worded exactly as the eval words an inline question about the same world
            names = sorted(world["accounts"])
            ask = re.search(r"After processing all of them in order, (.*) Think step by step", r["prompt"]).group(1)
            assert r["prompt"] == inline_prompt(world, ", ".join(names[:-1]) + " and " + names[-1], ask)
            assert solve(r["prompt"], bound_call(world)) == r["answer"]  # the tools still work
        env_mod = import_env(env_path)
        assert env_mod.SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({**knobs, "inline": True})).system_prompt
        # the same knobs without inline: no data in the prompt, the tools-only system prompt
        rows = _reference_rows_at(tmp_path, knobs, n=50)
        assert all("Opening balances" not in r["prompt"] and "#1 " not in r["prompt"] for r in rows)
        assert all(re.findall(r"\d+", r["prompt"]) == [r["info"]["world"]["ledger"][1:]] for r in rows)
        assert import_env(env_path).SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty(knobs)).system_prompt
    assert load_ref_env().SYSTEM_PROMPT == FAMILY.eval_format(FAMILY.difficulty({})).system_prompt


def test_single_transaction_ledgers():
    """min_transactions may be 1 (the easiest inline rungs): gold answers, tools and the inline reading agree."""
    knobs = {**ALL_Q, "min_transactions": 1, "max_transactions": 1, "fee_frequency": 0.3}
    for inline in (False, True):
        exs = examples({**knobs, "inline": inline}, 120, seed=45)
        assert {e.world["question"]["type"] for e in exs} == set(QUESTION_TYPES_ALL)
        for ex in exs:
            assert len(ex.world["transactions"]) == 1
            assert ex.answer == str(expected_answer(ex.prompt, ex.world)) == solve(ex.prompt, bound_call(ex.world))
            if inline:
                assert solve_inline(ex.prompt) == ex.answer
    with pytest.raises(ValidationError):
        FAMILY.difficulty({"min_transactions": 0})


QUESTION_TYPES_ALL = ("balance", "net_change", "rejected", "fees")
