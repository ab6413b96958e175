"""dispatch's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the inline one when task.json sets inline: true)
    Environment             the task's tools: get_request(request_id), count_rules(), get_rule(index),
                            check_rule(rule_index, request_id), reading info["world"] = {"attributes",
                            "rules", "default_queue", "requests", "targets"}
    make_tools(world)       the same tools as plain functions over one world: the hidden eval's own
    task_difficulty()       task.json's knobs: n_rules, conditions_per_rule, n_attributes, near_misses,
                            inline
    make_row(rng, d)        one row {prompt, answer, info: {"world"}} at knobs d; unset knobs: 3-7 rules
                            of 1-3 conditions over 3-6 attributes
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    norm(text)              a queue name's comparable form ("the Queue: VIP desk" -> "vip-desk")
    parse_answer(text)      the last 'Answer: <queue>', normed, or None
    gold(answer)            the row's answer as parse_answer returns it
"""

import json
import random
import re
from pathlib import Path

TOOLS_SYSTEM_PROMPT = (
    "You are a routing assistant. Requests are routed by an ordered rule table: rules "
    "are checked in order, the first rule whose conditions all hold decides the queue, "
    "and a request no rule matches goes to the default queue. The rules and the "
    "requests are only available through the tools: use count_rules, then check_rule "
    "for rule 1, 2, 3, ... until one matches (or read rules with get_rule and requests "
    "with get_request). When done, reply with the final line 'Answer: <queue name>' "
    "naming the queue."
)
INLINE_SYSTEM_PROMPT = (
    "You are a routing assistant. Requests are routed by an ordered rule table: rules "
    "are checked in order, the first rule whose conditions all hold decides the queue, "
    "and a request no rule matches goes to the default queue. The question states the "
    "rules, the default queue and the request's attributes, so you can answer from the "
    "question alone (the tools read the same data and are optional). Compare each rule's "
    "conditions with the request's values, rule by rule, and stop at the first rule whose "
    "conditions all hold. End with the final line 'Answer: <queue name>' naming the queue."
)
INLINE_TAIL = ("Think it through briefly in plain text (which rule's condition holds for this request, "
               "checking rule 1 first), then end with the line 'Answer: <queue name>' (the default queue "
               "if no rule holds). Do not call a tool.")  # as ait.families.dispatch.INLINE_TAIL_ONE

ATTRS = {
    "priority": (1, 5),
    "region": ["eu", "us", "apac", "latam"],
    "customer_tier": ["free", "silver", "gold", "platinum"],
    "channel": ["email", "phone", "chat", "web"],
    "product": ["billing", "storage", "compute", "network", "auth"],
    "language": ["en", "de", "fr", "es", "ja"],
    "age_days": (0, 30),
    "prior_contacts": (0, 6),
}
QUEUES = ["escalations", "billing-support", "eu-tier2", "vip-desk", "chat-triage", "fraud-review",
          "onboarding", "tech-l2", "returns", "account-security", "priority-desk", "apac-regional",
          "legal-review", "retention", "network-ops", "refunds", "compliance", "partner-desk"]
DEFAULTS = ["general", "standard", "backlog", "tier1", "inbox", "unassigned"]
TEMPLATES = ["Route request {rid}: which queue does it go to?",
             "Which queue should request {rid} be routed to?",
             "Using the routing rules, which queue does request {rid} go to?"]


def rule_holds(cond, value):
    op, t = cond["op"], cond["value"]
    if op == ">=":
        return value >= t
    if op == "<=":
        return value <= t
    if op == ">":
        return value > t
    if op == "<":
        return value < t
    if op == "==":
        return value == t
    if op == "!=":
        return value != t
    if op == "in":
        return value in t
    if op == "not in":
        return value not in t
    raise ValueError(f"unknown operator {op!r}")


def _cond_text(c):
    return f"{c['attr']} {c['op']} {json.dumps(c['value'])}"  # ints plain, strings quoted, lists as ["a", "b"]


def fmt_rule(index, rule):
    return f"rule {index}: if " + " and ".join(_cond_text(c) for c in rule["conditions"]) + f" -> queue {rule['queue']}"


def _as_index(x):
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and re.fullmatch(r"\s*[+]?\d+\s*", x):
        return int(x)
    return None


def _request_id(x):
    """'4821', ' "req-4821" ' -> 'REQ-4821'; None for what cannot name a request."""
    if not isinstance(x, (str, int)) or isinstance(x, bool):
        return None
    s = str(x).strip().strip("\"'").upper()
    if s.isdigit():
        s = f"REQ-{s}"
    return s or None


def first_match(world, rid):
    """The queue a request is routed to: the first rule whose conditions all hold, else the default."""
    attrs = world["requests"][rid]
    for rule in world["rules"]:
        if all(rule_holds(c, attrs[c["attr"]]) for c in rule["conditions"]):
            return rule["queue"]
    return world["default_queue"]


# ---------------------------------------------------------------- tools


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own (ait.families.dispatch
    returns these, and the eval's chat template shows their docstrings)."""
    rules, requests = world.get("rules", []), world.get("requests", {})
    default, order = world.get("default_queue", "general"), world.get("attributes", [])
    n = len(rules)

    def find(request_id):
        rid = _request_id(request_id)
        if rid is None or rid not in requests:
            return None, f"error: no request {str(request_id)[:40]!r}; request ids look like REQ-1234"
        return rid, None

    def bad_index(index):
        i = _as_index(index)
        if i is None or not 1 <= i <= n:
            return f"error: rule index must be an integer from 1 to {n}"
        return None

    def get_request(request_id: str) -> str:
        """Look up a request's attributes.

        Args:
            request_id: The request id, e.g. "REQ-4821".

        Returns:
            The attributes as "name=value" pairs, or a line starting with "error:".
        """
        rid, err = find(request_id)
        if err:
            return err
        attrs = requests[rid]
        return f"{rid}: " + ", ".join(f"{a}={attrs[a]}" for a in order)

    def count_rules() -> str:
        """Say how many routing rules there are and name the default queue.

        Returns:
            The number of rules and the default queue.
        """
        return (f"{n} rules (1-{n}), checked in order; the first rule whose conditions all hold "
                f"decides the queue; if none holds, the default queue is {default}")

    def get_rule(index: int) -> str:
        """Read one routing rule: its conditions (all must hold) and its queue.

        Args:
            index: The rule's position in the table, starting at 1.

        Returns:
            The rule as text, or a line starting with "error:".
        """
        err = bad_index(index)
        if err:
            return err
        i = _as_index(index)
        return fmt_rule(i, rules[i - 1])

    def check_rule(rule_index: int, request_id: str) -> str:
        """Check whether every condition of one rule holds for one request.

        Args:
            rule_index: The rule's position in the table, starting at 1.
            request_id: The request id, e.g. "REQ-4821".

        Returns:
            Whether the rule matches (and its queue), or which conditions failed.
        """
        err = bad_index(rule_index)
        if err:
            return err
        rid, err = find(request_id)
        if err:
            return err
        i = _as_index(rule_index)
        rule, attrs = rules[i - 1], requests[rid]
        failed = [c for c in rule["conditions"] if not rule_holds(c, attrs[c["attr"]])]
        if not failed:
            return f"rule {i} matches {rid} -> queue {rule['queue']}"
        why = "; ".join(f"{_cond_text(c)} (request has {c['attr']}={attrs[c['attr']]})" for c in failed)
        return f"rule {i} does not match {rid}: failed {why}"

    return [get_request, count_rules, get_rule, check_rule]


class Environment:
    """make_tools' tools as methods over a row's info["world"]: what env.py's trainer calls, and the
    docstrings its prompts show."""

    def reset(self, info: dict) -> None:
        world = (info or {}).get("world") or {}
        self.rules = world.get("rules", [])  # the world's parts, for code that reads them
        self.requests = world.get("requests", {})
        self.default = world.get("default_queue", "general")
        self.order = world.get("attributes", [])
        self._tools = {fn.__name__: fn for fn in make_tools(world)}

    def get_request(self, request_id: str) -> str:
        """Look up a request's attributes.

        Args:
            request_id: The request id, e.g. "REQ-4821".
        """
        return self._tools["get_request"](request_id)

    def count_rules(self) -> str:
        """Say how many routing rules there are and name the default queue."""
        return self._tools["count_rules"]()

    def get_rule(self, index: int) -> str:
        """Read one routing rule: its conditions (all must hold) and its queue.

        Args:
            index: The rule's position in the table, starting at 1.
        """
        return self._tools["get_rule"](index)

    def check_rule(self, rule_index: int, request_id: str) -> str:
        """Check whether every condition of one rule holds for one request.

        Args:
            rule_index: The rule's position in the table, starting at 1.
            request_id: The request id, e.g. "REQ-4821".
        """
        return self._tools["check_rule"](rule_index, request_id)


# ---------------------------------------------------------------- dataset


def _value(rng, attr):
    dom = ATTRS[attr]
    return rng.randint(*dom) if isinstance(dom, tuple) else rng.choice(dom)


def _condition(rng, attr):
    dom = ATTRS[attr]
    if isinstance(dom, tuple):
        op = rng.choice([">=", "<=", ">", "<"])
        v = rng.randint(dom[0] + 1, dom[1]) if op in (">=", "<") else rng.randint(dom[0], dom[1] - 1)
        return {"attr": attr, "op": op, "value": v}
    op = rng.choice(["==", "!=", "in", "not in"])
    if op in ("==", "!="):
        return {"attr": attr, "op": op, "value": rng.choice(dom)}
    return {"attr": attr, "op": op, "value": sorted(rng.sample(dom, 2), key=dom.index)}


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see rule tables it cannot walk, and learn the shaped rewards instead of the answer."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


def _inline(difficulty):
    """The task's `inline` knob: true only when task.json says so."""
    return (difficulty or {}).get("inline") is True


SYSTEM_PROMPT = INLINE_SYSTEM_PROMPT if _inline(task_difficulty()) else TOOLS_SYSTEM_PROMPT


def _knob(difficulty, name, lo, hi):
    """An integer knob clamped to [lo, hi], or None when the task does not set it (or garbles it)."""
    try:
        return min(max(int(difficulty[name]), lo), hi)
    except (KeyError, TypeError, ValueError):
        return None


def _condition_with(rng, attr, value, want):
    """A condition on attr that holds (want=True) or fails for value (every attribute admits both)."""
    while True:
        cond = _condition(rng, attr)
        if rule_holds(cond, value) == want:
            return cond


def _inline_text(world):
    """The request's attributes and the rule table, as the family's inline questions write them."""
    lines = []
    for rid in world["targets"]:
        attrs = world["requests"][rid]
        lines.append(f"Request {rid}: " + ", ".join(f"{a}={attrs[a]}" for a in world["attributes"]))
    lines.append("Rules, checked in order (the first rule whose conditions all hold decides):")
    lines += [fmt_rule(i, rule) for i, rule in enumerate(world["rules"], start=1)]
    lines.append(f"If no rule matches: default queue {world['default_queue']}")
    lines.append(INLINE_TAIL)
    return "\n".join(lines)


def make_row(rng, difficulty=None):
    """One routing question at the task's knobs, in the family's meaning: n_rules rules, each
    of conditions_per_rule or one fewer conditions, over n_attributes request attributes; the
    matching rule comes after near_misses rules that fail for the target on exactly one
    condition. A knob the task leaves out keeps this env's own range. Ignored: n_targets (the
    busiest queue over several requests) has no equivalent here, every row routes one request."""
    difficulty = difficulty or {}
    names = list(ATTRS)
    n_attrs = _knob(difficulty, "n_attributes", 1, len(names))
    attrs = sorted(rng.sample(names, rng.randint(3, 6) if n_attrs is None else n_attrs), key=names.index)
    n_rules = _knob(difficulty, "n_rules", 1, len(QUEUES))
    n_rules = rng.randint(3, 7) if n_rules is None else n_rules
    per_rule = _knob(difficulty, "conditions_per_rule", 1, len(attrs))
    near_misses = _knob(difficulty, "near_misses", 0, n_rules - 1) or 0
    target = {a: _value(rng, a) for a in attrs}
    pos = rng.randint(near_misses + 1, n_rules + 1)  # n_rules + 1: no rule matches, default queue
    near = set(rng.sample(range(1, pos), near_misses)) if near_misses else set()
    rules = []
    for i, queue in enumerate(rng.sample(QUEUES, n_rules), start=1):
        if per_rule is None:
            chosen = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
        else:
            chosen = rng.sample(attrs, rng.randint(max(1, per_rule - 1), per_rule))
        if i in near:  # fails for the target on exactly one condition
            bad = rng.randrange(len(chosen))
            conds = [_condition_with(rng, a, target[a], k != bad) for k, a in enumerate(chosen)]
        else:
            while True:
                conds = [_condition(rng, a) for a in chosen]
                ok = all(rule_holds(c, target[c["attr"]]) for c in conds)
                if i > pos or (i == pos) == ok:
                    break
        rules.append({"conditions": conds, "queue": queue})
    ids = [f"REQ-{x}" for x in rng.sample(range(1000, 10000), rng.randint(3, 6))]
    requests = {rid: {a: _value(rng, a) for a in attrs} for rid in ids[1:]}
    requests[ids[0]] = target
    items = list(requests.items())
    rng.shuffle(items)
    world = {"attributes": attrs, "rules": rules, "default_queue": rng.choice(DEFAULTS),
             "requests": dict(items), "targets": [ids[0]]}
    prompt = rng.choice(TEMPLATES).format(rid=ids[0])
    if _inline(difficulty):  # no randomness used: the same rows as without inline, plus the table
        prompt += "\n" + _inline_text(world)
    return {"prompt": prompt, "answer": first_match(world, ids[0]), "info": {"world": world}}


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


def norm(text):
    t = re.sub(r"[*`'\"“”‘’]", "", (text or "").strip().lower())
    t = re.sub(r"^(the\s+)?(queue\b\s*[:=]?\s*)?", "", t).strip(" .,;:!?()[]{}<>")
    t = re.sub(r"\s+queue$", "", t)
    return re.sub(r"[\s_\-]+", "-", t).strip("-")


def parse_answer(text):
    found = re.findall(r"answer\s*[:=]\s*(.*)", re.sub(r"[*`]", "", text or ""), re.IGNORECASE)
    return (norm(found[-1]) or None) if found else None


def gold(answer):
    return norm(answer)
