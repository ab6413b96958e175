"""ledger: bookkeeping over an ordered list of transactions, with an overdraft rule.

"Ledger L4821 has accounts cash, checking and savings. After processing all of its
transactions in order (...), what is the final balance of account 'savings'?" The
opening balances and the transactions live in the world, reachable only through the
tools: `list_transactions()` shows the raw list (and so its length), `apply_transaction(i)`
processes the ledger in order through transaction #i and reports that transaction's
outcome (applied / rejected, fee charged) and every balance right after it,
`opening_balance(account)` gives an account's opening balance and `final_balance(account)` its
balance after the whole ledger.

Rules (stated in the prompt and the system prompt): a withdrawal or transfer that would
make its source balance negative is rejected and skipped; a fee takes the given percent
of the account's current balance, rounded down. All amounts are integers.

The tools are pure functions of (world, arguments): the hidden eval rebuilds the tools
for every call (`Family.call_tool`) and reuses one world for the pre and post evals, so
state kept in a closure or written into the world would be lost or leak. "Processing
through #i" is deterministic, which gives the same answers a stateful ledger would.

Question types: `balance` (final balance of one account: one final_balance call), `net_change`
(final minus opening, signed: final_balance and opening_balance), `rejected` (how many
transactions were rejected: apply every index) and `fees` (total fees charged: apply every
fee). The queried account always ends away from its opening balance, so the opening
balance is never the answer to a balance question and a net change is never 0.

Defaults (provisional; calibrated later on a GPU): 3 accounts, 8-12 transactions (the
count varies so the last index must be read, not memorised), fees 15% and overdraft
attempts 20% of the time, questions `balance,net_change`. Reasoning: the default path is
2-3 dependent tool calls and reading one number out of a short balances line, which a
small untrained model can manage sometimes (opening balance trap, wrong index, misreading
the line) but not reliably; `rejected` and `fees` need a call per transaction and are
left as harder knobs (their small-integer answers would also make guessing too easy).

`inline` (default false) is the easiest knob: the question itself states what the tools
would return, the opening balances and the numbered transaction list in the tools' own
wording ("Opening balances: cash=300, checking=1200. Transactions, in order:" then one
"#1 deposit 200 into cash" line each), the rules that apply to that list (the fee rule
only when it has a fee), the ask, and "Think step by step, then end with the line
'Answer: <integer>'." (without that nudge a small model copies the opening balance). The
system prompt says the data is in the question and the tools are optional; the tools stay
available and behave the same, the gold answer is computed the same way, and the reply
gets more room (max_new_tokens 256 + 48 per transaction, at most 1024, instead of 128).
It is for models that cannot yet run multi-turn tool use: the problem becomes reading a
short list and doing the arithmetic. The ledger drawn for a seed does not depend on it
(only the wording does), and `inline` is left out of the difficulty's dump while false, so
non-inline task specs, hidden-set seeds and examples are exactly what they were before the
knob existed. `min_transactions` may be 1 (the easiest inline rungs).
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, InlineDifficulty, ToolCall

# The tools, and the ledger semantics the generator shares with them, are the stdlib-only module every
# workspace gets as task_tools.py: one source for the hidden eval and the jobs. Its helpers keep their
# leading underscore there, so what env.py sees of the module (and the probe's hints, which list its
# public names) stays the surface its docstring documents.
from ait.job.task_tools.ledger import describe, format_balances
from ait.job.task_tools.ledger import process_transactions as process, apply_step as step, make_tools

ACCOUNT_NAMES = ["checking", "savings", "cash", "travel", "rent", "payroll", "reserve", "groceries"]
QUESTION_TYPES = ("balance", "net_change", "rejected", "fees")
RULE_OVERDRAFT = "a withdrawal or transfer that would make a balance negative is rejected and skipped"
RULE_FEE = "a fee takes the given percent of the account's current balance, rounded down"
RULES = f"{RULE_OVERDRAFT}; {RULE_FEE}"
INLINE_ASK = "Think step by step, then end with the line 'Answer: <integer>'."
ANSWER_RE = re.compile(r"answer\s*[:=]\s*([+\-−]?)\s*\$?\s*([+\-−]?)\s*(\d[\d,]*)(\.\d+)?", re.IGNORECASE)
ANSWER_LINE_RE = re.compile(r"answer\s*[:=]", re.IGNORECASE)


class LedgerDifficulty(InlineDifficulty):
    model_config = ConfigDict(extra="forbid")

    n_accounts: int = Field(default=3, ge=2, le=6)
    """Accounts in the ledger."""
    min_transactions: int = Field(default=8, ge=1, le=20)
    """Fewest transactions in a ledger."""
    max_transactions: int = Field(default=12, ge=1, le=20)
    """Most transactions in a ledger (the count is drawn uniformly in between)."""
    fee_frequency: float = Field(default=0.15, ge=0.0, le=0.5)
    """Probability that a transaction is a percentage fee."""
    overdraft_probability: float = Field(default=0.2, ge=0.0, le=0.8)
    """Probability that a withdrawal or transfer asks for more than its account holds (rejected)."""
    questions: str = Field(default="balance,net_change",
                           pattern=r"^(balance|net_change|rejected|fees)(,(balance|net_change|rejected|fees))*$")
    """Comma-separated question types drawn uniformly: balance, net_change, rejected, fees."""
    inline: bool = False
    """True: the question states the data, the opening balances and the numbered transaction list
    (what opening_balance and list_transactions return), plus the rules that apply and a nudge to work
    it through; the system prompt says the data is in the question and the tools (unchanged) are
    optional; the gold answer is the same. False: the data lives only behind the tools. Left out
    of the dump while false (so existing specs and hidden-set seeds are unchanged)."""


    @model_validator(mode="after")
    def _check(self) -> "LedgerDifficulty":
        if self.min_transactions > self.max_transactions:
            raise ValueError("min_transactions must not exceed max_transactions")
        if "fees" in self.question_types() and self.fee_frequency == 0:
            raise ValueError("the 'fees' question needs fee_frequency above 0")
        return self

    def question_types(self) -> list[str]:
        return list(dict.fromkeys(self.questions.split(",")))


# ---------------------------------------------------------------- generation


def gen_ledger(rng: random.Random, d: LedgerDifficulty) -> dict[str, Any]:
    names = rng.sample(ACCOUNT_NAMES, d.n_accounts)
    opening = {name: rng.randint(50, 1500) for name in names}
    balances = dict(opening)
    txs: list[dict[str, Any]] = []
    for _ in range(rng.randint(d.min_transactions, d.max_transactions)):
        acct = rng.choice(names)
        if rng.random() < d.fee_frequency:
            tx = {"kind": "fee", "account": acct, "percent": rng.randint(1, 10)}
        else:
            kind = rng.choice(["deposit", "withdrawal", "transfer"])
            if kind == "deposit":
                tx = {"kind": "deposit", "account": acct, "amount": rng.randint(10, 600)}
            else:
                if rng.random() < d.overdraft_probability:
                    amount = balances[acct] + rng.randint(1, 400)
                elif balances[acct] >= 10:
                    amount = rng.randint(5, min(balances[acct], 800))
                else:
                    kind, amount = "deposit", rng.randint(10, 600)
                tx = {"kind": kind, "account": acct, "amount": amount}
                if kind == "transfer":
                    tx["to"] = rng.choice([n for n in names if n != acct])
        step(balances, tx)
        txs.append(tx)
    return {"accounts": opening, "transactions": txs}


class Ledger(Family):
    name = "ledger"
    description = (
        "Stateful bookkeeping: a ledger holds a few accounts with opening balances and an ordered "
        "list of deposits, withdrawals, transfers and percentage fees; overdrawing withdrawals and "
        "transfers are rejected. The transactions are only reachable through tools: the model must "
        "list them, process the ledger with apply_transaction or final_balance (and look up "
        "opening balances) and "
        "report the asked integer (a final balance, a net change, a count of rejections or total fees)."
    )
    Difficulty = LedgerDifficulty

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = LedgerDifficulty.model_validate(difficulty.model_dump())
        qtype = rng.choice(d.question_types())
        ledger_id = f"L{rng.randint(1000, 99999)}"
        while True:  # redraw until the question has a non-trivial answer (bounded in practice)
            world = gen_ledger(rng, d)
            world["ledger"] = ledger_id
            final, outcomes = process(world, len(world["transactions"]))
            moved = [a for a in world["accounts"] if final[a] != world["accounts"][a]]
            if qtype in ("balance", "net_change") and moved:
                account = rng.choice(moved)
                value = final[account] - (world["accounts"][account] if qtype == "net_change" else 0)
                break
            if qtype == "rejected":
                account, value = None, sum(1 for ok, _ in outcomes if not ok)
                break
            if qtype == "fees" and sum(c for _, c in outcomes) > 0:
                account, value = None, sum(c for _, c in outcomes)
                break
        world["question"] = {"type": qtype, "account": account}
        names = sorted(world["accounts"])
        accts = ", ".join(names[:-1]) + " and " + names[-1]
        head = (f"Ledger {ledger_id} has accounts {accts}. After processing all of its transactions in "
                f"order ({RULES}),")
        if qtype == "balance":
            ask = f"what is the final balance of account '{account}'?"
        elif qtype == "net_change":
            ask = (f"by how much did the balance of account '{account}' change from its opening balance? "
                   "Give a signed integer (negative if it went down).")
        elif qtype == "rejected":
            ask = "how many transactions were rejected?"
        else:
            ask = "how much was charged in fees in total, across all accounts?"
        prompt = inline_prompt(world, accts, ask) if d.inline else f"{head} {ask}"
        return Example(prompt=prompt, world=world, answer=str(value))

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)

    def score(self, response: str, answer: str) -> float:
        got, gold = parse_answer(response or ""), parse_answer(f"Answer: {answer}")
        return 1.0 if got is not None and got == gold else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        world = example.world
        q, n = world["question"], len(world["transactions"])
        if q["type"] in ("balance", "net_change"):
            calls = [ToolCall(name="final_balance", arguments={"account": q["account"]})]
            if q["type"] == "net_change":
                calls.append(ToolCall(name="opening_balance", arguments={"account": q["account"]}))
            return calls
        calls = [ToolCall(name="list_transactions", arguments={})]
        if q["type"] == "rejected":
            indices = list(range(1, n + 1))
        else:
            indices = [i for i, tx in enumerate(world["transactions"], 1) if tx["kind"] == "fee"]
        calls += [ToolCall(name="apply_transaction", arguments={"index": i}) for i in indices]
        return calls

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = LedgerDifficulty.model_validate(difficulty.model_dump())
        per_tx = {"rejected", "fees"} & set(d.question_types())
        longest_trace = 1 + d.max_transactions if per_tx else 3
        return EvalFormat(
            system_prompt=system_prompt(d.inline, fees=d.fee_frequency > 0),
            tools=[
                ToolSpec(
                    name="list_transactions",
                    description="List the ledger's transactions in processing order, numbered from 1 "
                    "(the header says how many there are).",
                    parameters=[],
                    returns="a header line, then one line per transaction, e.g. '#2 withdraw 300 from checking'",
                    example={},
                ),
                ToolSpec(
                    name="apply_transaction",
                    description="Process the ledger in order from the opening balances through transaction "
                    "#index and report that transaction's outcome (applied, rejected, or the fee charged) "
                    "and every balance right after it. Errors start with 'error:'.",
                    parameters=[ToolParam(name="index", type="integer",
                                          description="transaction number, from 1 to the number of transactions")],
                    returns="e.g. '#3 withdraw 300 from checking: applied. Balances after #3: cash=40, checking=120'",
                    example={"index": 1},
                ),
                ToolSpec(
                    name="opening_balance",
                    description="An account's opening balance, before transaction #1 (an unknown account "
                    "is an error listing the accounts).",
                    parameters=[ToolParam(name="account", type="string", description="account name, e.g. 'savings'")],
                    returns="e.g. 'Opening balance of savings: 1200 (before transaction #1)'",
                    example={"account": "checking"},
                ),
                ToolSpec(
                    name="final_balance",
                    description="An account's final balance, after the whole ledger is processed (every "
                    "transaction, in order; an unknown account is an error listing the accounts).",
                    parameters=[ToolParam(name="account", type="string", description="account name, e.g. 'savings'")],
                    returns="e.g. 'Final balance of savings: 940 (after all 9 transactions)'",
                    example={"account": "checking"},
                ),
            ],
            answer_format="The last line of the final reply is 'Answer: <integer>', e.g. 'Answer: 1250' "
            "or 'Answer: -75'.",
            max_turns=longest_trace + 2,
            max_new_tokens=min(1024, 256 + 48 * d.max_transactions) if d.inline else 128,  # inline: room to work it through
        )


def inline_prompt(world: dict[str, Any], accts: str, ask: str) -> str:
    """The question with its data: opening balances, the numbered listing (the tools' own wording),
    the rules that apply to this listing (fees only when it has one), the ask and a nudge to work
    it through (a small model otherwise copies the opening balance)."""
    txs = world["transactions"]
    listing = "\n".join(f"#{i} {describe(tx)}" for i, tx in enumerate(txs, 1))
    kinds = {tx["kind"] for tx in txs}
    rules = [r for r, used in ((RULE_OVERDRAFT, bool(kinds & {"withdrawal", "transfer"})),
                               (RULE_FEE, "fee" in kinds)) if used]
    rule_text = f"{'Rules' if len(rules) > 1 else 'Rule'}: {'; '.join(rules)}. " if rules else ""
    return (f"Ledger {world['ledger']} has accounts {accts}. Opening balances: {format_balances(world['accounts'])}. "
            f"Transactions, in order:\n{listing}\n{rule_text}After processing all of them in order, {ask} {INLINE_ASK}")


def system_prompt(inline: bool, fees: bool = True) -> str:
    if inline:
        rules = RULES if fees else RULE_OVERDRAFT
        return ("You are a careful bookkeeping assistant. The question states the ledger's opening "
                "balances and its numbered transactions, so you do not need to call any tool (the tools are "
                "optional and report the same data). Work through the transactions in order yourself, one "
                f"short line each, keeping track of the balances. Rules: {rules}. When done, reply with the "
                "final line 'Answer: <integer>'.")
    return ("You are a careful bookkeeping assistant. The ledger's transactions are not in the "
            "question: call list_transactions to see them, apply_transaction to process the ledger "
            "in order through a transaction number (it reports that transaction's outcome and every "
            "balance right after it), final_balance for an account's balance after the whole ledger, and "
            "opening_balance for an account's opening balance. Rules: "
            f"{RULES}. When done, reply with the final line 'Answer: <integer>'.")


def parse_answer(text: str) -> int | None:
    """The integer on the last 'Answer:' line: '$1,234', '+5', '1234.0', '−$75' accepted; None otherwise."""
    lines = [ln for ln in text.splitlines() if ANSWER_LINE_RE.search(ln)]
    if not lines:
        return None
    matches = ANSWER_RE.findall(lines[-1])
    if not matches:
        return None
    sign1, sign2, digits, frac = matches[-1]
    if frac and set(frac[1:]) != {"0"}:
        return None
    if sign1 and sign2:
        return None
    value = int(digits.replace(",", ""))
    return -value if (sign1 or sign2) in ("-", "−") else value
