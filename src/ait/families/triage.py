"""triage (held out): on-call incident triage across services, deploys and alerts.

"Incident INC-2041: checkout is returning 502s since 14:05. Which deploy is the root
cause? Answer with the service and version."

The world holds a handful of services with a dependency graph (A calls B), a day of
deploys (service, version, time), the incident's alerts and per-service log lines.
Exactly one deploy is the root cause: it landed shortly (6-40 min) before the first
alert, on a service the alerting services depend on (directly or transitively), and
that service's own logs show errors starting after the deploy. The alerting services'
logs only blame their dependency ("call to orders failed: HTTP 503"), so the model
must walk the chain with the tools. Distractors: a deploy on an unrelated service
just before the alert, a healthy deploy on another dependency, a deploy on an
alerting (caller) service, a hotfix deploy after the alert, morning deploys (possibly
on the root-cause service itself, with an older version), noisy warnings and old
chronic errors.

Nothing in the prompt names the culprit or any version, so answering needs at least
the log/dependency walk and a deploy lookup (depth + 3 calls in the gold trace).

Defaults (provisional, calibrated later on a GPU): n_services=5, depth=2 (alerting
service -> middle service -> culprit), n_distractor_deploys=3, n_background_deploys=3,
log_noise=2. A model that just names the latest deploy before the alert is right about
a third of the time; one that also filters by dependency about half; a small untrained
model that follows the tools part of the way should land in the 0.2-0.7 band.

inline=True (an easier rung for models that cannot drive multi-turn tool use): the
question itself also states the data the tools would return that answering needs, one
line per item: the alerts, every service's dependencies, the day's deploys and every
service's error-level log lines (merged, earliest first; WARN/INFO noise stays behind
search_logs). The world, the tools and the gold answer are exactly those of the same
example without inline (same rng draws), and the system prompt says the data is in the
question and the tools are optional. inline=False (the default) leaves everything as
before, and is left out of the difficulty's dump, so task specs and hidden-eval seeds
(derived from that dump) do not change.
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ait.contract import EvalFormat, ToolParam, ToolSpec
from ait.families.base import Example, Family, InlineDifficulty, ToolCall

# The tools, and the time helpers the generator shares with them, are the stdlib-only module every
# workspace gets as task_tools.py: one source for the hidden eval and the jobs. Its helpers keep their
# leading underscore there, so what env.py sees of the module (and the probe's hints, which list its
# public names) stays the surface its docstring documents.
from ait.job.task_tools.triage import fmt_time, parse_time, make_tools

SERVICE_POOL = [
    "checkout", "payments", "auth", "inventory", "search", "cart", "users", "orders",
    "shipping", "notifications", "catalog", "pricing", "gateway", "ledger", "billing",
    "sessions", "reviews", "recommender", "media", "profile", "fraud", "tax", "coupons", "accounts",
]
ENTRY_SYMPTOMS = [
    ("returning 502s", "HTTP 502 rate {p}%"),
    ("throwing 500 errors", "HTTP 5xx rate {p}%"),
    ("timing out", "request timeouts {p}%"),
    ("failing health checks", "health check failures {p}%"),
]
MID_SYMPTOMS = ["error rate {p}%", "p99 latency {s}s", "HTTP 503 rate {p}%"]
ROOT_ERRORS = [
    "panic: nil map write in ChargeHandler",
    "TypeError: cannot read field 'currency' of null",
    "schema migration 0042 failed: column 'region' missing",
    "connection pool exhausted (max=50)",
    "NullPointerException in RequestMapper.toDto",
    "serialization failed: unknown enum value 'PENDING_V2'",
    "out of memory: heap limit 512MB reached",
    "invalid config: feature flag 'fast_path' has no default",
]
BLAME_ERRORS = [
    "call to {dep} failed: HTTP 503",
    "upstream {dep} timed out after 3000ms",
    "{dep} returned 500 Internal Server Error",
    "circuit breaker open for {dep}",
]
CHRONIC_ERRORS = [
    "failed to flush metrics buffer",
    "smtp timeout sending receipt",
    "job reindex failed: lock held",
    "stale cache entry evicted with error",
]
WARN_NOISE = [
    "slow query took 1450ms",
    "cache hit ratio 71% below target",
    "retrying connection to redis (attempt 2)",
    "deprecated config key 'timeout_ms'",
    "GC pause 320ms",
    "queue depth 1200 above soft limit",
    "certificate expires in 14 days",
]
INFO_NOISE = ["health check ok", "processed 1532 requests", "config reloaded", "worker pool size 16"]
WINDOW_START = 45  # in-window distractor deploys land within this many minutes before the alert
BACKGROUND_GAP = 100  # background deploys stay this many minutes before (or 30 after) the alert
ANSWER_LINE_RE = re.compile(r"answer\s*[:=]\s*(.*)", re.IGNORECASE)
PAIR_RE = re.compile(r"([a-z][a-z0-9_]*)(?:\s*(?:@|:|==|=|,)\s*|\s+)v?(\d+(?:\.\d+){1,3})(?![\d.]*\d)")


class TriageDifficulty(InlineDifficulty):
    model_config = ConfigDict(extra="forbid")

    n_services: int = Field(default=5, ge=4, le=8)
    """Services in the world (the alerting chain, its other dependencies and unrelated ones)."""
    depth: int = Field(default=2, ge=1, le=4)
    """Dependency hops from the alerting service in the prompt down to the root-cause service."""
    n_distractor_deploys: int = Field(default=3, ge=1, le=6)
    """Misleading deploys near the alert (unrelated service, healthy dependency, caller, post-alert hotfix)."""
    n_background_deploys: int = Field(default=3, ge=0, le=6)
    """Ordinary deploys hours away from the incident (possibly on the culprit service itself)."""
    log_noise: int = Field(default=2, ge=0, le=6)
    """Irrelevant INFO/WARN lines per service; at 2 or more, some services also carry old chronic errors."""
    inline: bool = False
    """The question itself states the data needed (alerts, dependencies, deploys, error logs, one line
    each) and the system prompt says so; the tools stay available and return the same data. Same world
    and gold answer as without it. Left out of the dump when False (specs and hidden seeds unchanged)."""


    @model_validator(mode="after")
    def _enough_services(self) -> "TriageDifficulty":
        if self.n_services < self.depth + 2:
            raise ValueError("n_services must be at least depth + 2 (the chain plus one unrelated service)")
        return self


def parse_answer(text: str) -> tuple[str, str] | None:
    """The one service@version named on the last 'Answer:' line; None if none or several."""
    lines = ANSWER_LINE_RE.findall(text or "")
    if not lines:
        return None
    line = re.sub(r"\bversion\b", " ", lines[-1].lower()).replace("`", " ").replace("*", " ").replace('"', " ")
    pairs = {(s, v) for s, v in PAIR_RE.findall(line) if s != "v"}
    return pairs.pop() if len(pairs) == 1 else None


# ---------------------------------------------------------------- generator


def dependency_path(deps: dict[str, list[str]], src: str, dst: str) -> list[str]:
    """Shortest call path src -> ... -> dst (BFS over the world's graph)."""
    prev: dict[str, str | None] = {src: None}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        if node == dst:
            path = [node]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])  # type: ignore[arg-type]
            return path[::-1]
        for nxt in deps.get(node, []):
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return []


def generate(rng: random.Random, d: TriageDifficulty) -> tuple[str, dict[str, Any], str]:
    names = rng.sample(SERVICE_POOL, d.n_services)
    chain = names[: d.depth + 1]  # chain[0] alerts (named in the prompt); chain[-1] is the culprit
    others = names[d.depth + 1:]
    n_unrelated = max(1, len(others) - rng.randint(1, max(1, len(others) - 1))) if len(others) > 1 else 1
    unrelated, siblings = others[:n_unrelated], others[n_unrelated:]
    deps: dict[str, list[str]] = {s: [] for s in names}
    for a, b in zip(chain, chain[1:]):
        deps[a].append(b)
    for s in siblings:  # healthy dependencies of chain nodes (the culprit may call one too)
        deps[rng.choice(chain)].append(s)
    for i, s in enumerate(unrelated[1:], start=1):  # unrelated services only call each other
        if rng.random() < 0.5:
            deps[s].append(rng.choice(unrelated[:i]))
    for s in names:
        rng.shuffle(deps[s])
    root = chain[-1]

    alert_t = rng.randint(10 * 60, 16 * 60 + 30)
    root_t = alert_t - rng.randint(6, 40)
    err_start = root_t + rng.randint(1, 4)
    used_times = {root_t}

    def free_time(lo: int, hi: int) -> int:
        while True:
            t = rng.randint(lo, hi)
            if t not in used_times:
                used_times.add(t)
                return t

    deploys: list[tuple[int, str]] = [(root_t, root)]
    alerting = [chain[0]] + [s for s in chain[1:-1] if rng.random() < 0.6]
    kinds = ["unrelated"] + rng.sample(["healthy_dep", "caller", "after"], 3)
    while len(kinds) < d.n_distractor_deploys:
        kinds.append(rng.choice(["unrelated", "healthy_dep", "caller", "after"]))
    for kind in kinds[: d.n_distractor_deploys]:
        if kind == "healthy_dep" and not siblings:
            kind = "caller"
        if kind == "unrelated":
            deploys.append((free_time(alert_t - WINDOW_START, alert_t - 2), rng.choice(unrelated)))
        elif kind == "healthy_dep":
            deploys.append((free_time(alert_t - WINDOW_START, alert_t - 2), rng.choice(siblings)))
        elif kind == "caller":
            deploys.append((free_time(alert_t - WINDOW_START, alert_t - 2), rng.choice(chain[:-1])))
        else:  # a hotfix or follow-up deploy after the first alert
            deploys.append((free_time(alert_t + 3, alert_t + 25), rng.choice([root, root] + chain[:-1])))
    for _ in range(d.n_background_deploys):
        if rng.random() < 0.5:
            t = free_time(8 * 60, alert_t - BACKGROUND_GAP)
        else:
            t = free_time(alert_t + 30, 19 * 60)
        deploys.append((t, rng.choice(names)))
    deploys.sort()
    versions = {s: [rng.randint(1, 4), rng.randint(0, 12), rng.randint(0, 9)] for s in names}
    deploy_rows = []
    answer = ""
    for t, s in deploys:
        v = versions[s]
        if rng.random() < 0.15:
            v[1], v[2] = v[1] + 1, 0
        else:
            v[2] += 1
        version = ".".join(map(str, v))
        deploy_rows.append({"service": s, "version": version, "time": fmt_time(t)})
        if t == root_t:
            answer = f"{root}@{version}"

    logs: dict[str, list[tuple[int, str, str]]] = {s: [] for s in names}
    msg = rng.choice(ROOT_ERRORS)
    t = err_start
    while t <= alert_t + 25:
        logs[root].append((t, "ERROR", msg))
        t += rng.randint(2, 6)
    for hop, caller in enumerate(reversed(chain[:-1]), start=1):  # callers blame their dependency
        dep = chain[len(chain) - hop]
        tmpl = rng.choice(BLAME_ERRORS)
        t = min(err_start + hop, alert_t)
        while t <= alert_t + 25:
            logs[caller].append((t, "ERROR", tmpl.format(dep=dep)))
            t += rng.randint(2, 6)
    for s in names:
        for _ in range(d.log_noise):
            if rng.random() < 0.6:
                logs[s].append((rng.randint(alert_t - 180, alert_t + 30), "WARN", rng.choice(WARN_NOISE)))
            else:
                logs[s].append((rng.randint(alert_t - 180, alert_t + 30), "INFO", rng.choice(INFO_NOISE)))
    if d.log_noise >= 2:
        for s in rng.sample([s for s in names if s != root], k=min(2, len(names) - 1)):
            logs[s].append((rng.randint(alert_t - 300, alert_t - 150), "ERROR", rng.choice(CHRONIC_ERRORS)))
    log_rows = {s: [{"time": fmt_time(t), "level": lv, "msg": m} for t, lv, m in sorted(logs[s])] for s in names}

    entry_phrase, entry_symptom = rng.choice(ENTRY_SYMPTOMS)
    alert_rows = [{"service": chain[0], "symptom": entry_symptom.format(p=rng.randint(5, 40)), "time": fmt_time(alert_t)}]
    for i, s in enumerate(alerting[1:]):
        symptom = rng.choice(MID_SYMPTOMS).format(p=rng.randint(5, 40), s=rng.randint(2, 9))
        alert_rows.append({"service": s, "symptom": symptom, "time": fmt_time(alert_t + 1 + i + rng.randint(0, 4))})
    alert_rows.sort(key=lambda a: a["time"])

    incident = f"INC-{rng.randint(1000, 9999)}"
    world = {"incident": incident, "services": sorted(names), "deps": deps, "deploys": deploy_rows,
             "alerts": alert_rows, "logs": log_rows}
    prompt = (f"Incident {incident}: {chain[0]} is {entry_phrase} since {fmt_time(alert_t)}. "
              "Which deploy is the root cause? Answer with the service and version.")
    return prompt, world, answer


def inline_data(world: dict[str, Any]) -> str:
    """The data an inline question states, in the tools' own line formats: alerts, every service's
    dependencies, all deploys, and every service's error lines (merged, earliest first)."""
    tools = {fn.__name__: fn for fn in make_tools(world)}
    services = list(world.get("services", []))
    lines = ["Alerts:", tools["list_alerts"](), "Dependencies:"]
    lines += [tools["get_dependencies"](s) for s in services]
    lines.append("Deploys today:")
    lines += [f"{d['time']} {d['service']}@{d['version']}" for d in world.get("deploys", [])] or ["none"]
    errors: list[tuple[str, str, str]] = []
    quiet = []
    for s in services:
        out = tools["search_logs"](s, "error")
        if out.startswith("no "):
            quiet.append(s)
            continue
        for ln in out.splitlines():
            t, rest = ln.split(" ", 1)
            errors.append((t, s, rest))
    lines.append("Error logs (earliest first):")
    lines += [f"{t} {s} {rest}" for t, s, rest in sorted(errors)]
    if quiet:
        lines.append(f"No error lines: {', '.join(quiet)}")
    return "\n".join(lines)


TOOLS_SYSTEM_PROMPT = (
    "You are an on-call engineer triaging an incident. Use the tools: check the alerts, "
    "follow the failing service's dependencies and error logs down to the service whose "
    "own errors started first (callers only blame their dependency), then find the deploy "
    "of that service shortly before its errors began. When done, reply with the final "
    "line 'Answer: <service>@<version>'."
)
INLINE_SYSTEM_PROMPT = (
    "You are an on-call engineer triaging an incident. The question lists the alerts, the "
    "service dependencies, the day's deploys and the error logs; the tools return the same "
    "data, so using them is optional. Follow the failing service's dependencies and error logs "
    "down to the service whose own errors started first (callers only blame their dependency), "
    "then pick the deploy of that service shortly before its errors began. Reply with the final "
    "line 'Answer: <service>@<version>'."
)


class Triage(Family):
    name = "triage"
    held_out = True
    calibrated = {"n_services": 4, "depth": 1, "n_distractor_deploys": 1, "n_background_deploys": 0, "log_noise": 0,
                  "inline": True}  # Qwen2.5-Coder-0.5B 0.200, n=200
    description = (
        "On-call incident triage: given an incident on one service, find the deploy that caused it. "
        "The model must query alerts, follow the service dependency graph and the logs (callers only "
        "blame their dependency), and match the failing service's first errors to a deploy shortly "
        "before the first alert, ignoring unrelated, healthy and post-incident deploys and noisy logs. "
        "It answers with service@version."
    )
    Difficulty = TriageDifficulty

    def example(self, rng: random.Random, difficulty: BaseModel) -> Example:
        d = TriageDifficulty.model_validate(difficulty.model_dump())
        prompt, world, answer = generate(rng, d)
        if d.inline:
            prompt = f"{prompt}\n\n{inline_data(world)}"
        return Example(prompt=prompt, world=world, answer=answer)

    def tools(self, world: dict[str, Any]) -> list[Callable[..., str]]:
        return make_tools(world)

    def score(self, response: str, answer: str) -> float:
        got, gold = parse_answer(response), parse_answer(f"Answer: {answer}")
        return 1.0 if got is not None and got == gold else 0.0

    def gold_trace(self, example: Example) -> list[ToolCall]:
        world = example.world
        root = example.answer.split("@")[0]
        entry = world["alerts"][0]["service"]
        first = parse_time(world["alerts"][0]["time"]) or 0
        calls = [ToolCall(name="list_alerts", arguments={})]
        for s in dependency_path(world["deps"], entry, root):
            calls.append(ToolCall(name="search_logs", arguments={"service": s, "level": "error"}))
        calls.append(ToolCall(name="list_deploys", arguments={"since": fmt_time(max(first - 60, 0))}))
        return calls

    def eval_format(self, difficulty: BaseModel) -> EvalFormat:
        d = TriageDifficulty.model_validate(difficulty.model_dump())
        return EvalFormat(
            system_prompt=INLINE_SYSTEM_PROMPT if d.inline else TOOLS_SYSTEM_PROMPT,
            tools=[
                ToolSpec(name="list_alerts", description="The incident's alerts, earliest first, one "
                         "'HH:MM service: symptom' line each.", parameters=[],
                         returns="alert lines as text", example={}),
                ToolSpec(name="get_dependencies", description="The services a service calls directly: "
                         "'service calls: a, b' (or 'nothing'); an unknown service gives 'error: ...' with "
                         "the list of services.",
                         parameters=[ToolParam(name="service", type="string", description="service name")],
                         returns="one line of text", example={"service": "checkout"}),
                ToolSpec(name="list_deploys", description="Deploys at or after a time of day, earliest "
                         "first, one 'HH:MM service@version' line each, at most 8 lines. To find a root "
                         "cause, start about an hour before the first alert.",
                         parameters=[ToolParam(name="since", type="string", description="time of day 'HH:MM'")],
                         returns="deploy lines as text", example={"since": "13:00"}),
                ToolSpec(name="search_logs", description="One service's log lines at a level, earliest "
                         "first, one 'HH:MM LEVEL message' line each (consecutive repeats collapse into "
                         "'HH:MM LEVEL message (xN, last HH:MM)'), at most 8 lines.",
                         parameters=[ToolParam(name="service", type="string", description="service name"),
                                     ToolParam(name="level", type="string",
                                               description='"error", "warn" or "any"')],
                         returns="log lines as text", example={"service": "payments", "level": "error"}),
            ],
            answer_format="The last line of the final reply is 'Answer: <service>@<version>', "
            "e.g. 'Answer: payments@2.4.1'.",
            max_turns=d.depth + 4,
            max_new_tokens=128,
        )
