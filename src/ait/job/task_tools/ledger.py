"""ledger's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the inline one when task.json sets inline: true)
    Environment             the task's tools: list_transactions(), apply_transaction(index),
                            opening_balance(account), final_balance(account), reading info["world"] = {"ledger", "accounts",
                            "transactions", "question"}
    make_tools(world)       the same tools as plain functions over one world: the hidden eval's own
    task_difficulty()       task.json's knobs: n_accounts, min_transactions, max_transactions,
                            fee_frequency, overdraft_probability, questions, inline
    make_row(rng, d)        one row {prompt, answer, info: {"world"}} at knobs d (None if none came up);
                            unset knobs: 2-4 accounts, 6-12 transactions, balance / net-change questions
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    parse_answer(text)      the last 'Answer: <integer>' as an int (sign, $ and commas understood), or None
    gold(answer)            the row's answer as parse_answer returns it (an int)
"""

import json
import random
import re
from pathlib import Path

RULE_OVERDRAFT = "a withdrawal or transfer that would make a balance negative is rejected and skipped"
RULE_FEE = "a fee takes the given percent of the account's current balance, rounded down"
RULES = f"{RULE_OVERDRAFT}; {RULE_FEE}"

TOOLS_SYSTEM_PROMPT = (
    "You are a careful bookkeeping assistant. The ledger's transactions are not in the "
    "question: call list_transactions to see them, apply_transaction to process the ledger "
    "in order through a transaction number (it reports that transaction's outcome and every "
    "balance right after it), final_balance for an account's balance after the whole ledger, and "
    "opening_balance for an account's opening balance. Rules: "
    f"{RULES}. When done, reply with the final line 'Answer: <integer>'."
)


def _inline_system_prompt(fees):
    """The system prompt when the question states the data (the fee rule only when fees occur)."""
    return ("You are a careful bookkeeping assistant. The question states the ledger's opening "
            "balances and its numbered transactions, so you do not need to call any tool (the tools are "
            "optional and report the same data). Work through the transactions in order yourself, one "
            f"short line each, keeping track of the balances. Rules: {RULES if fees else RULE_OVERDRAFT}. "
            "When done, reply with the final line 'Answer: <integer>'.")

ACCOUNT_NAMES = ["checking", "savings", "cash", "travel", "rent", "payroll", "reserve", "groceries"]


def describe(tx):
    kind = tx["kind"]
    if kind == "deposit":
        return f"deposit {tx['amount']} into {tx['account']}"
    if kind == "withdrawal":
        return f"withdraw {tx['amount']} from {tx['account']}"
    if kind == "transfer":
        return f"transfer {tx['amount']} from {tx['account']} to {tx['to']}"
    return f"fee {tx['percent']}% on {tx['account']}"


def apply_step(balances, tx):
    kind, acct = tx["kind"], tx["account"]
    if kind == "deposit":
        balances[acct] += tx["amount"]
        return True, 0
    if kind in ("withdrawal", "transfer"):
        if balances[acct] < tx["amount"]:
            return False, 0
        balances[acct] -= tx["amount"]
        if kind == "transfer":
            balances[tx["to"]] += tx["amount"]
        return True, 0
    charged = balances[acct] * tx["percent"] // 100
    balances[acct] -= charged
    return True, charged


def process_transactions(world, upto):
    balances = dict(world.get("accounts") or {})
    outcomes = [apply_step(balances, tx) for tx in (world.get("transactions") or [])[:upto]]
    return balances, outcomes


def _index(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*#?\s*[+-]?\d{1,6}\s*", value):
        return int(value.replace("#", "").strip())
    return None


def _account(account, accounts):
    name = str(account).strip().strip("'\"").lower()
    if name in accounts:
        return name, None
    return name, f"error: unknown account {str(account)[:40]!r}; accounts: {', '.join(sorted(accounts))}"


def format_balances(balances):
    return ", ".join(f"{name}={balances[name]}" for name in sorted(balances))


# ---------------------------------------------------------------- tools


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own (ait.families.ledger
    returns these, and the eval's chat template shows their docstrings). They are pure functions of
    (world, arguments): "through #i" replays the ledger from the opening balances every call."""
    txs = world.get("transactions") or []
    accounts = world.get("accounts") or {}
    n = len(txs)

    def list_transactions() -> str:
        """List the ledger's transactions in processing order, numbered from 1.

        Returns:
            One line per transaction, e.g. '#2 withdraw 300 from checking'.
        """
        lines = [f"Ledger {world.get('ledger', '?')}: {n} transactions, processed in order #1..#{n}."]
        lines += [f"#{i} {describe(tx)}" for i, tx in enumerate(txs, 1)]
        return "\n".join(lines)

    def apply_transaction(index: int) -> str:
        """Process the ledger in order through transaction #index and report its outcome.

        Every earlier transaction is processed first, from the opening balances; a withdrawal
        or transfer that would make a balance negative is rejected and skipped, and a fee
        takes the given percent of the current balance, rounded down.

        Args:
            index: The transaction number, from 1 to the number of transactions.

        Returns:
            The transaction's outcome and every balance right after it.
        """
        i = _index(index)
        if i is None or not 1 <= i <= n:
            return f"error: index must be an integer from 1 to {n}, got {str(index)[:40]!r}"
        balances, outcomes = process_transactions(world, i)
        tx = txs[i - 1]
        applied, charged = outcomes[-1]
        if not applied:
            outcome = f"rejected ({tx['account']} has only {balances[tx['account']]})"
        elif tx["kind"] == "fee":
            outcome = f"applied, charged {charged}"
        else:
            outcome = "applied"
        return f"#{i} {describe(tx)}: {outcome}. Balances after #{i}: {format_balances(balances)}"

    def opening_balance(account: str) -> str:
        """Look up an account's opening balance, before transaction #1 is processed.

        Args:
            account: The account name, e.g. 'savings'.

        Returns:
            The opening balance as text.
        """
        name, error = _account(account, accounts)
        if error:
            return error
        return f"Opening balance of {name}: {accounts[name]} (before transaction #1)"

    def final_balance(account: str) -> str:
        """Process the whole ledger, every transaction in order, and report an account's final balance.

        Args:
            account: The account name, e.g. 'savings'.

        Returns:
            The account's balance after the last transaction, as text.
        """
        name, error = _account(account, accounts)
        if error:
            return error
        balances, _ = process_transactions({"accounts": accounts, "transactions": txs}, n)
        return f"Final balance of {name}: {balances[name]} (after all {n} transactions)"

    return [list_transactions, apply_transaction, opening_balance, final_balance]


class Environment:
    """make_tools' tools as methods over a row's info["world"]: what env.py's trainer calls, and the
    docstrings its prompts show."""

    def __init__(self):
        self.world = {}
        self._tools = {fn.__name__: fn for fn in make_tools({})}

    def reset(self, info: dict) -> None:
        world = (info or {}).get("world") if isinstance(info, dict) else None
        self.world = world if isinstance(world, dict) else {}
        self._tools = {fn.__name__: fn for fn in make_tools(self.world)}

    def list_transactions(self) -> str:
        """List the ledger's transactions in processing order, numbered from 1.

        Returns:
            One line per transaction, e.g. '#2 withdraw 300 from checking'.
        """
        return self._tools["list_transactions"]()

    def apply_transaction(self, index: int) -> str:
        """Process the ledger in order through transaction #index and report its outcome.

        Every earlier transaction is processed first, from the opening balances; a withdrawal
        or transfer that would make a balance negative is rejected and skipped, and a fee
        takes the given percent of the current balance, rounded down.

        Args:
            index: The transaction number, from 1 to the number of transactions.

        Returns:
            The transaction's outcome and every balance right after it.
        """
        return self._tools["apply_transaction"](index)

    def opening_balance(self, account: str) -> str:
        """Look up an account's opening balance, before transaction #1 is processed.

        Args:
            account: The account name, e.g. 'savings'.

        Returns:
            The opening balance as text.
        """
        return self._tools["opening_balance"](account)

    def final_balance(self, account: str) -> str:
        """Process the whole ledger, every transaction in order, and report an account's final balance.

        Args:
            account: The account name, e.g. 'savings'.

        Returns:
            The account's balance after the last transaction, as text.
        """
        return self._tools["final_balance"](account)


# ---------------------------------------------------------------- dataset


QUESTION_TYPES = ("balance", "net_change", "rejected", "fees")


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see ledgers it cannot process, and learn the shaped rewards instead of the answer."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


def _inline(difficulty):
    """The task's `inline` knob: the data is stated in the question (only a real true counts)."""
    return difficulty.get("inline") is True


def _system_prompt(difficulty):
    return _inline_system_prompt(_settings(difficulty)["fee"] > 0) if _inline(difficulty) else TOOLS_SYSTEM_PROMPT


def _knob(difficulty, name, lo, hi, cast=int):
    """A knob clamped to [lo, hi], or None when the task does not set it (or garbles it)."""
    try:
        return min(max(cast(difficulty[name]), lo), hi)
    except (KeyError, TypeError, ValueError):
        return None


def _settings(difficulty):
    """The task's knobs in the family's meaning (n_accounts; a transaction count drawn from
    min_transactions..max_transactions; fee_frequency and overdraft_probability per transaction;
    questions: the types asked, all four of the family's), or this env's own ranges where a knob
    is missing."""
    lo = _knob(difficulty, "min_transactions", 1, 20)
    hi = _knob(difficulty, "max_transactions", 1, 20)
    if lo is None:
        lo = 6 if hi is None else min(6, hi)
    if hi is None:
        hi = max(12, lo)
    fee = _knob(difficulty, "fee_frequency", 0.0, 1.0, float)
    overdraft = _knob(difficulty, "overdraft_probability", 0.0, 1.0, float)
    fee = 0.15 if fee is None else fee
    raw = difficulty.get("questions")
    asked = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, (list, tuple)) else []
    asked = [q.strip() for q in asked if isinstance(q, str)]
    # 'fees' needs fee transactions to ask about
    questions = [q for q in dict.fromkeys(asked) if q in QUESTION_TYPES and (q != "fees" or fee > 0)]
    return {"n_accounts": _knob(difficulty, "n_accounts", 2, len(ACCOUNT_NAMES)),
            "transactions": (min(lo, hi), max(lo, hi)), "fee": fee,
            "overdraft": 0.2 if overdraft is None else overdraft,
            "questions": questions or ["balance", "net_change"], "inline": _inline(difficulty)}


SYSTEM_PROMPT = _system_prompt(task_difficulty())


def _ledger(rng, s):
    n_accounts = rng.choice([2, 3, 3, 4]) if s["n_accounts"] is None else s["n_accounts"]
    names = rng.sample(ACCOUNT_NAMES, n_accounts)
    opening = {name: rng.randint(50, 1500) for name in names}
    balances = dict(opening)
    txs = []
    for _ in range(rng.randint(*s["transactions"])):
        acct = rng.choice(names)
        if rng.random() < s["fee"]:
            tx = {"kind": "fee", "account": acct, "percent": rng.randint(1, 10)}
        else:
            kind = rng.choice(["deposit", "withdrawal", "transfer"])
            if kind != "deposit" and rng.random() < s["overdraft"]:
                amount = balances[acct] + rng.randint(1, 400)
            elif kind != "deposit" and balances[acct] >= 10:
                amount = rng.randint(5, min(balances[acct], 800))
            else:
                kind, amount = "deposit", rng.randint(10, 600)
            tx = {"kind": kind, "account": acct, "amount": amount}
            if kind == "transfer":
                tx["to"] = rng.choice([x for x in names if x != acct])
        apply_step(balances, tx)
        txs.append(tx)
    return {"accounts": opening, "transactions": txs}


def make_row(rng, difficulty):
    """One question at the task's knobs; None if no ledger with a non-trivial answer came up."""
    s = _settings(difficulty)
    qtype = rng.choice(s["questions"])
    ledger_id = f"L{rng.randint(1000, 99999)}"
    for _ in range(200):  # redraw until the question has a non-trivial answer
        world = _ledger(rng, s)
        final, outcomes = process_transactions(world, len(world["transactions"]))
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
    else:
        return None
    world["ledger"] = ledger_id
    world["question"] = {"type": qtype, "account": account}
    names = sorted(world["accounts"])
    accts = ", ".join(names[:-1]) + " and " + names[-1]
    head = f"Ledger {ledger_id} has accounts {accts}. After processing all of its transactions in order ({RULES}),"
    if qtype == "balance":
        ask = f"what is the final balance of account '{account}'?"
    elif qtype == "net_change":
        ask = (f"by how much did the balance of account '{account}' change from its opening balance? "
               "Give a signed integer (negative if it went down).")
    elif qtype == "rejected":
        ask = "how many transactions were rejected?"
    else:
        ask = "how much was charged in fees in total, across all accounts?"
    prompt = _inline_prompt(world, accts, ask) if s["inline"] else f"{head} {ask}"
    return {"prompt": prompt, "answer": str(value), "info": {"world": world}}


def _inline_prompt(world, accts, ask):
    """The question with its data, as the eval words it at an inline difficulty: opening balances,
    the numbered listing, the rules that apply to it, the ask and a nudge to work it through."""
    txs = world["transactions"]
    opening = ", ".join(f"{k}={world['accounts'][k]}" for k in sorted(world["accounts"]))
    listing = "\n".join(f"#{i} {describe(tx)}" for i, tx in enumerate(txs, 1))
    kinds = {tx["kind"] for tx in txs}
    rules = [r for r, used in ((RULE_OVERDRAFT, bool(kinds & {"withdrawal", "transfer"})),
                               (RULE_FEE, "fee" in kinds)) if used]
    rule_text = f"{'Rules' if len(rules) > 1 else 'Rule'}: {'; '.join(rules)}. " if rules else ""
    return (f"Ledger {world['ledger']} has accounts {accts}. Opening balances: {opening}. Transactions, in order:\n"
            f"{listing}\n{rule_text}After processing all of them in order, {ask} "
            "Think step by step, then end with the line 'Answer: <integer>'.")


def distinct_rows(n: int, draw) -> list:
    """Up to n rows from draw() with distinct prompts (None draws skipped; gives up after 50*n draws,
    as a tiny difficulty has fewer distinct problems than asked for)."""
    rows, seen = [], set()
    for _ in range(50 * n):
        if len(rows) == n:
            break
        row = draw()
        if row is not None and row["prompt"] not in seen:
            seen.add(row["prompt"])
            rows.append(row)
    return rows


_ANSWER = re.compile(r"answer\s*[:=]\s*([+\-]?)\s*\$?\s*([+\-]?)\s*(\d[\d,]*)(?:\.0+)?\b", re.IGNORECASE)


def parse_answer(text):
    found = _ANSWER.findall(text or "")
    if not found:
        return None
    s1, s2, digits = found[-1]
    value = int(digits.replace(",", ""))
    return -value if "-" in (s1, s2) else value


def gold(answer):
    return int(answer)
