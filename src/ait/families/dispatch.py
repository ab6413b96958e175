"""dispatch: route a request through an ordered rule table (first match wins).

"Route request REQ-4821: which queue does it go to?" The world holds a rule table (an
ordered list of rules, each a conjunction of attribute conditions such as
`priority >= 3 and region == "eu" -> escalations`, plus a default queue) and a few
requests with attributes. By default neither the rules nor the request is in the prompt:
the model must read them through the tools (`get_request`, `count_rules`, `get_rule`) and
reason, or walk the table with `check_rule` until a rule matches.

`inline` (the same knob in every family, default False): the question itself states the
target requests' attributes and the rule table (numbered, in order, each rule's conditions
and queue, then the default queue), compactly, and ends with a line asking for the reply
'Answer: <queue name>' without a tool call (untrained Qwen2.5-Coder-0.5B otherwise tends to
answer in tool-call JSON: the chat template's tool block comes after the system prompt).
The tools stay available and behave the same; the world and the gold answer are exactly
those of the non-inline example drawn from the same rng state (the inline text consumes no
randomness); the system prompt says the rules and request are in the question (tools
optional). It turns the task into reading and applying a short table, for base models that
never call a tool on their own. When False, prompts, examples and the difficulty's dump are
exactly as before (the dump omits `inline` when it is False, so hidden-eval seeds do not move).

Generation builds the rules around the target request: rules before the matching one
fail for it (`near_misses` of them on exactly one condition, so a careless reading goes
wrong), the matching rule holds, rules after it are random. The matching position is
uniform over `near_misses + 1 .. n_rules` plus "no rule matches" (the default queue).
Queue names are drawn per example from a pool, so the answer cannot be guessed.

Defaults (provisional, to be calibrated on a GPU): n_rules=6, conditions_per_rule=3
(each rule has 2-3 conditions), n_attributes=5, near_misses=2, n_targets=1. The walk
needs count_rules plus 3-6 check_rule calls (the match is never before rule 3), about
5 tool calls on average: an untrained 0.6B-1.7B model that follows the system prompt can
do it but often stops early, skips a rule or misreads a near miss, which we expect to
put it in the 0.2-0.7 band. n_targets > 1 asks for the queue that receives the most of
several requests (a harder, much longer walk).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, InlineDifficulty, ToolCall

# The tools, and the rule semantics the generator shares with them, are the stdlib-only module every
# workspace gets as task_tools.py: one source for the hidden eval and the jobs. Its helpers keep their
# leading underscore there, so what env.py sees of the module (and the probe's hints, which list its
# public names) stays the surface its docstring documents.
from ait.job.task_tools.dispatch import rule_holds as holds, first_match, fmt_rule, make_tools

# name -> ("int", lo, hi) or ("cat", [values])
ATTRIBUTES: dict[str, tuple] = {
    "priority": ("int", 1, 5),
    "region": ("cat", ["eu", "us", "apac", "latam"]),
    "customer_tier": ("cat", ["free", "silver", "gold", "platinum"]),
    "channel": ("cat", ["email", "phone", "chat", "web"]),
    "product": ("cat", ["billing", "storage", "compute", "network", "auth"]),
    "language": ("cat", ["en", "de", "fr", "es", "ja"]),
    "age_days": ("int", 0, 30),
    "prior_contacts": ("int", 0, 6),
}
QUEUES = [
    "escalations", "billing-support", "eu-tier2", "vip-desk", "chat-triage", "fraud-review",
    "onboarding", "tech-l2", "returns", "account-security", "priority-desk", "apac-regional",
    "legal-review", "retention", "hardware-rma", "network-ops", "enterprise-success", "refunds",
    "compliance", "outage-response", "partner-desk", "spanish-support", "german-support", "quality-review",
]
DEFAULT_QUEUES = ["general", "standard", "backlog", "tier1", "inbox", "unassigned"]
INT_OPS = [">=", "<=", ">", "<"]
CAT_OPS = ["==", "!=", "in", "not in"]
PROMPTS_ONE = [
    "Route request {ids}: which queue does it go to?",
    "Which queue should request {ids} be routed to?",
    "Using the routing rules, which queue does request {ids} go to?",
]
PROMPTS_MANY = [
    "Route requests {ids}. Which queue receives the most of these requests?",
    "Route each of the requests {ids} with the routing rules and report the queue that receives the most of them.",
]
INLINE_SYSTEM_PROMPT = (  # str.format: {what}
    "You are a routing assistant. Requests are routed by an ordered rule table: rules "
    "are checked in order, the first rule whose conditions all hold decides the queue, "
    "and a request no rule matches goes to the default queue. The question states the "
    "rules, the default queue and the request's attributes, so you can answer from the "
    "question alone (the tools read the same data and are optional). Compare each rule's "
    "conditions with the request's values, rule by rule, and stop at the first rule whose "
    "conditions all hold. End with the final line 'Answer: <queue name>' naming {what}."
)
# Room to reason before the answer: asked for one line, both Qwen models name a queue without
# comparing any condition (a guess, right one time in three); asked to think first, the 1.5B reasons
# in half its replies and scores 0.547 against 0.266 (n = 64, docs/surface.md, lease-h100-s15).
INLINE_TAIL_ONE = ("Think it through briefly in plain text (which rule's condition holds for this request, "
                   "checking rule 1 first), then end with the line 'Answer: <queue name>' (the default queue "
                   "if no rule holds). Do not call a tool.")
INLINE_TAIL_MANY = ("Think it through briefly in plain text (route each request: which rule's condition holds, "
                    "checking rule 1 first), then end with the line 'Answer: <queue name>', the queue that "
                    "receives the most of these requests (the default queue for a request no rule holds). "
                    "Do not call a tool.")
ANSWER_RE = re.compile(r"answer\s*[:=]\s*(.*)", re.IGNORECASE)
ID_RE = re.compile(r"REQ-\d{4}")


class DispatchDifficulty(InlineDifficulty):
    model_config = ConfigDict(extra="forbid")

    n_rules: int = Field(default=6, ge=2, le=12)
    """Rules in the table (the default queue is extra)."""
    conditions_per_rule: int = Field(default=3, ge=1, le=4)
    """Most conditions in one rule; each rule has this many or one fewer (at least 1)."""
    n_attributes: int = Field(default=5, ge=2, le=len(ATTRIBUTES))
    """Attributes each request carries (a subset of the attribute pool)."""
    near_misses: int = Field(default=2, ge=0, le=11)
    """Rules before the matching one that fail on exactly one condition (the match comes after them)."""
    n_targets: int = Field(default=1, ge=1, le=3)
    """Requests to route; above 1 the answer is the queue that receives the most of them."""
    inline: bool = False
    """The question states the target requests' attributes and the rule table (numbered, in
    order, conditions and queue, plus the default queue), then asks for the 'Answer:' line; the
    tools stay available and optional, the world and gold answer are unchanged. Same knob name in every family. Omitted from the dump when
    False, so existing specs and hidden-eval seeds are unchanged."""


    @model_validator(mode="after")
    def _bounds(self) -> "DispatchDifficulty":
        if self.near_misses >= self.n_rules:
            raise ValueError("near_misses must be below n_rules")
        if self.conditions_per_rule > self.n_attributes:
            raise ValueError("conditions_per_rule must not exceed n_attributes")
        return self


# ---------------------------------------------------------------- inline text and answers


def inline_text(world: dict[str, Any]) -> str:
    """The rule table and the target requests, compactly, for an inline question."""
    order = world["attributes"]
    lines = []
    for rid in world["targets"]:
        attrs = world["requests"][rid]
        lines.append(f"Request {rid}: " + ", ".join(f"{a}={attrs[a]}" for a in order))
    lines.append("Rules, checked in order (the first rule whose conditions all hold decides):")
    lines += [fmt_rule(i, rule) for i, rule in enumerate(world["rules"], start=1)]
    lines.append(f"If no rule matches: default queue {world['default_queue']}")
    lines.append(INLINE_TAIL_MANY if len(world["targets"]) > 1 else INLINE_TAIL_ONE)
    return "\n".join(lines)


def mode_queue(queues: list[str]) -> str | None:
    """The single most common queue, or None on a tie."""
    counts = Counter(queues).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


def normalize_queue(text: str) -> str:
    """'Queue: "Billing Support".' -> 'billing-support' (case, quotes, spaces/underscores/hyphens)."""
    t = (text or "").strip().lower()
    t = re.sub(r"[*`'\"“”‘’]", "", t)
    t = re.sub(r"^(the\s+)?(queue\b\s*[:=]?\s*)?", "", t)
    t = t.strip(" .,;:!?()[]{}<>")
    t = re.sub(r"\s+queue$", "", t)
    return re.sub(r"[\s_\-]+", "-", t).strip("-")


# ---------------------------------------------------------------- generation


def random_condition(rng: random.Random, attr: str) -> dict[str, Any]:
    """A non-trivial condition (some values pass, some fail) on one attribute."""
    kind = ATTRIBUTES[attr]
    if kind[0] == "int":
        lo, hi = kind[1], kind[2]
        op = rng.choice(INT_OPS)
        value = rng.randint(lo + 1, hi) if op in (">=", "<") else rng.randint(lo, hi - 1)
        return {"attr": attr, "op": op, "value": value}
    values = kind[1]
    op = rng.choice(CAT_OPS)
    if op in ("==", "!="):
        return {"attr": attr, "op": op, "value": rng.choice(values)}
    return {"attr": attr, "op": op, "value": sorted(rng.sample(values, 2), key=values.index)}


def condition_with(rng: random.Random, attr: str, value: Any, want: bool) -> dict[str, Any]:
    """A non-trivial condition on attr that holds (want=True) or fails for value."""
    while True:  # every attribute admits both outcomes for any value, so this ends quickly
        cond = random_condition(rng, attr)
        if holds(cond, value) == want:
            return cond


def random_request(rng: random.Random, attrs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in attrs:
        kind = ATTRIBUTES[a]
        out[a] = rng.randint(kind[1], kind[2]) if kind[0] == "int" else rng.choice(kind[1])
    return out


def build_rule(rng: random.Random, d: DispatchDifficulty, attrs: list[str], request: dict[str, Any],
               kind: str) -> list[dict[str, Any]]:
    """Conditions of one rule relative to the request: 'match', 'near' (exactly one fails),
    'fail' (at least one fails) or 'any'."""
    k = rng.randint(max(1, d.conditions_per_rule - 1), d.conditions_per_rule)
    chosen = rng.sample(attrs, k)
    if kind == "match":
        return [condition_with(rng, a, request[a], True) for a in chosen]
    if kind == "near":
        bad = rng.randrange(k)
        return [condition_with(rng, a, request[a], i != bad) for i, a in enumerate(chosen)]
    if kind == "fail":
        conds = [random_condition(rng, a) for a in chosen]
        if all(holds(c, request[c["attr"]]) for c in conds):
            i = rng.randrange(k)
            conds[i] = condition_with(rng, chosen[i], request[chosen[i]], False)
        return conds
    return [random_condition(rng, a) for a in chosen]


class Dispatch(Family):
    name = "dispatch"
    calibrated = {"n_rules": 2, "conditions_per_rule": 1, "n_attributes": 2, "near_misses": 0,
                  "inline": True}  # Qwen2.5-Coder-0.5B 0.355, n=200 (H200, 2026-11-30)
    description = (
        "Rule-based request routing: an ordered rule table (first match wins, each rule a "
        "conjunction of attribute conditions, plus a default queue) decides which queue a "
        "request goes to. Neither the rules nor the request's attributes are in the prompt; "
        "the model must read them with the tools (or check rules one by one in order until "
        "one matches) and report the queue name."
    )
    Difficulty = DispatchDifficulty

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = DispatchDifficulty.model_validate(difficulty.model_dump())
        while True:
            world = self._world(rng, d)
            if world is not None:
                break
        targets = world["targets"]
        if len(targets) == 1:
            ids = targets[0]
            prompt = rng.choice(PROMPTS_ONE).format(ids=ids)
        else:
            ids = ", ".join(targets[:-1]) + " and " + targets[-1]
            prompt = rng.choice(PROMPTS_MANY).format(ids=ids)
        answer = mode_queue([first_match(world, t) for t in targets])
        assert answer is not None
        if d.inline:  # consumes no randomness: same world and answer as the non-inline example
            prompt = f"{prompt}\n{inline_text(world)}"
        return Example(prompt=prompt, world=world, answer=answer)

    def _world(self, rng: random.Random, d: DispatchDifficulty) -> dict[str, Any] | None:
        names = list(ATTRIBUTES)
        attrs = sorted(rng.sample(names, d.n_attributes), key=names.index)
        queues = rng.sample(QUEUES, d.n_rules)
        default = rng.choice(DEFAULT_QUEUES)
        first = random_request(rng, attrs)
        # position of the matching rule (1-based); n_rules + 1 means the default queue
        pos = rng.randint(d.near_misses + 1, d.n_rules + 1)
        near = set(rng.sample(range(1, pos), d.near_misses))
        rules = []
        for i in range(1, d.n_rules + 1):
            kind = "near" if i in near else "fail" if i < pos else "match" if i == pos else "any"
            rules.append({"conditions": build_rule(rng, d, attrs, first, kind), "queue": queues[i - 1]})
        n_ids = d.n_targets + rng.randint(3, 6)
        ids = [f"REQ-{x}" for x in rng.sample(range(1000, 10000), n_ids)]
        requests = {ids[0]: first}
        for rid in ids[d.n_targets:]:
            requests[rid] = random_request(rng, attrs)
        world = {"attributes": attrs, "rules": rules, "default_queue": default, "requests": requests}
        # further targets: at least one more goes where the first goes, so the busiest queue is unique
        win = first_match(world, ids[0])
        for j, rid in enumerate(ids[1:d.n_targets]):
            for _ in range(200):
                req = self._request_towards(rng, world, attrs, win) if j == 0 else random_request(rng, attrs)
                requests[rid] = req
                if j == 0 and first_match(world, rid) != win:
                    continue
                break
            else:
                return None
        targets = ids[:d.n_targets]
        if mode_queue([first_match(world, t) for t in targets]) is None:
            return None
        rng.shuffle(targets)
        items = list(requests.items())
        rng.shuffle(items)
        world["requests"] = dict(items)
        world["targets"] = targets
        return world

    @staticmethod
    def _request_towards(rng: random.Random, world: dict[str, Any], attrs: list[str], queue: str) -> dict[str, Any]:
        """A random request that satisfies the conditions of the rule routing to `queue` (if any)."""
        req = random_request(rng, attrs)
        for rule in world["rules"]:
            if rule["queue"] == queue:
                for c in rule["conditions"]:
                    while not holds(c, req[c["attr"]]):
                        req[c["attr"]] = random_request(rng, [c["attr"]])[c["attr"]]
        return req

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)

    def score(self, response: str, answer: str) -> float:
        text = re.sub(r"[*`]", "", response or "")
        found = [m.group(1) for line in text.splitlines() if (m := ANSWER_RE.search(line))]
        if not found:
            return 0.0
        got = normalize_queue(found[-1])
        return 1.0 if got and got == normalize_queue(answer) else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        world = example.world
        calls = [ToolCall(name="count_rules", arguments={})]
        for rid in world["targets"]:
            attrs = world["requests"][rid]
            for i, rule in enumerate(world["rules"], start=1):
                calls.append(ToolCall(name="check_rule", arguments={"rule_index": i, "request_id": rid}))
                if all(holds(c, attrs[c["attr"]]) for c in rule["conditions"]):
                    break
        return calls

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = DispatchDifficulty.model_validate(difficulty.model_dump())
        what = "the queue that receives the most of the requests" if d.n_targets > 1 else "the queue"
        if d.inline:
            system_prompt = INLINE_SYSTEM_PROMPT.format(what=what)
        else:
            system_prompt = (
                "You are a routing assistant. Requests are routed by an ordered rule table: rules "
                "are checked in order, the first rule whose conditions all hold decides the queue, "
                "and a request no rule matches goes to the default queue. The rules and the "
                "requests are only available through the tools: use count_rules, then check_rule "
                "for rule 1, 2, 3, ... until one matches (or read rules with get_rule and requests "
                f"with get_request). When done, reply with the final line 'Answer: <queue name>' "
                f"naming {what}."
            )
        return EvalFormat(
            system_prompt=system_prompt,
            tools=[
                ToolSpec(
                    name="get_request",
                    description="Look up a request's attributes by id; returns 'REQ-1234: name=value, ...' "
                    "(errors start with 'error:').",
                    parameters=[ToolParam(name="request_id", type="string", description='request id, e.g. "REQ-4821"')],
                    returns="the request's attributes as text",
                    example={"request_id": "REQ-1234"},
                ),
                ToolSpec(
                    name="count_rules",
                    description="How many rules the table has (numbered from 1) and the default queue for "
                    "requests that match no rule.",
                    parameters=[],
                    returns="the rule count and the default queue as text",
                    example={},
                ),
                ToolSpec(
                    name="get_rule",
                    description="Read rule number `index` (from 1): its conditions, all of which must hold, "
                    "and the queue it routes to (errors start with 'error:').",
                    parameters=[ToolParam(name="index", type="integer", description="rule position, starting at 1")],
                    returns="the rule as text, e.g. 'rule 2: if priority >= 3 and region == \"eu\" -> queue escalations'",
                    example={"index": 1},
                ),
                ToolSpec(
                    name="check_rule",
                    description="Check whether every condition of rule `rule_index` holds for a request: "
                    "'rule 2 matches REQ-4821 -> queue escalations', or 'rule 2 does not match REQ-4821: "
                    "failed ...' naming the failed conditions (errors start with 'error:').",
                    parameters=[
                        ToolParam(name="rule_index", type="integer", description="rule position, starting at 1"),
                        ToolParam(name="request_id", type="string", description='request id, e.g. "REQ-4821"'),
                    ],
                    returns="whether the rule matches and its queue, or which conditions failed",
                    example={"rule_index": 1, "request_id": "REQ-1234"},
                ),
            ],
            answer_format="The last line of the final reply is 'Answer: <queue name>', e.g. 'Answer: billing-support'.",
            max_turns=min(32, d.n_targets * d.n_rules + 2),
            max_new_tokens=256 if d.inline else 128,  # inline: one reply holds all the reasoning
        )
