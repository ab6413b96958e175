"""triage's tool interface, shipped read-only into the workspace: `import task_tools as tt`.

    SYSTEM_PROMPT           the task's system prompt (the inline one when task.json sets inline: true)
    Environment             the task's tools: list_alerts(), get_dependencies(service),
                            list_deploys(since), search_logs(service, level), reading info["world"] =
                            {"incident", "services", "deps", "deploys", "alerts", "logs"}
    make_tools(world)       the same tools as plain functions over one world: the hidden eval's own
    task_difficulty()       task.json's knobs: n_services, depth, n_distractor_deploys,
                            n_background_deploys, log_noise, inline
    make_row(rng, d)        one row {prompt, answer, info: {"world"}} at knobs d; unset knobs: 4-7
                            services, depth 1-3, a random mix of distractor deploys
    distinct_rows(n, draw)  up to n rows with distinct prompts from draw()
    parse_answer(text)      the last 'Answer: <service>@<version>' as (service, version), or None
    gold(answer)            the row's answer as parse_answer returns it
"""

import json
import random
import re
from pathlib import Path

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

LEVELS = {"error": ("ERROR",), "errors": ("ERROR",), "warn": ("WARN",), "warning": ("WARN",), "warnings": ("WARN",),
          "info": ("INFO",), "any": ("ERROR", "WARN", "INFO"), "all": ("ERROR", "WARN", "INFO")}
TIME_RE = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::\d{2})?\s*$")
MAX_DEPLOY_LINES = 8
MAX_LOG_LINES = 8


def parse_time(text):
    if not isinstance(text, str):
        return None
    m = TIME_RE.match(text)
    if not m or int(m.group(1)) >= 24 or int(m.group(2)) >= 60:
        return None
    return int(m.group(1)) * 60 + int(m.group(2))


def fmt_time(minutes):
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _service(name):
    return name.strip().lower() if isinstance(name, str) and name.strip() else None


# ---------------------------------------------------------------- tools


def make_tools(world):
    """The task's tools over one world, as plain functions: the hidden eval's own (ait.families.triage
    returns these, and the eval's chat template shows their docstrings)."""
    services = list(world.get("services", []))
    deps = world.get("deps", {})
    deploys = world.get("deploys", [])
    alerts = world.get("alerts", [])
    logs = world.get("logs", {})

    def unknown(name):
        return f"error: unknown service {name!r}; services: {', '.join(services)}"

    def list_alerts() -> str:
        """List the incident's alerts, earliest first.

        Returns:
            One line per alert: 'HH:MM service: symptom'.
        """
        if not alerts:
            return "no alerts"
        return "\n".join(f"{a['time']} {a['service']}: {a['symptom']}" for a in alerts)

    def get_dependencies(service: str) -> str:
        """List the services that a service calls directly.

        Args:
            service: The service name, e.g. "checkout".

        Returns:
            'service calls: a, b' or 'service calls: nothing'.
        """
        name = _service(service)
        if name not in deps:
            return unknown(service)
        return f"{name} calls: {', '.join(deps[name]) or 'nothing'}"

    def list_deploys(since: str) -> str:
        """List deploys at or after a time of day, earliest first (at most 8 lines).

        Args:
            since: A time of day 'HH:MM'; only deploys at or after it are listed.

        Returns:
            One line per deploy: 'HH:MM service@version'.
        """
        start = parse_time(since)
        if start is None:
            return f"error: since must be a time of day like '13:30', got {since!r}"
        hits = [d for d in deploys if parse_time(d["time"]) >= start]
        if not hits:
            return f"no deploys at or after {fmt_time(start)}"
        out = [f"{d['time']} {d['service']}@{d['version']}" for d in hits[:MAX_DEPLOY_LINES]]
        if len(hits) > MAX_DEPLOY_LINES:
            out.append(f"... {len(hits) - MAX_DEPLOY_LINES} more (use a later since)")
        return "\n".join(out)

    def search_logs(service: str, level: str) -> str:
        """Show one service's log lines at a level, earliest first (at most 8 lines).

        Args:
            service: The service name, e.g. "payments".
            level: "error", "warn" or "any".

        Returns:
            One line per log entry: 'HH:MM LEVEL message', repeats collapsed as
            'HH:MM LEVEL message (xN, last HH:MM)'.
        """
        name = _service(service)
        if name not in logs:
            return unknown(service)
        wanted = LEVELS.get(level.strip().lower()) if isinstance(level, str) else None
        if wanted is None:
            return f"error: level must be one of error, warn, any; got {level!r}"
        hits = [e for e in logs[name] if e["level"] in wanted]
        if not hits:
            return f"no {level.strip().lower()} lines for {name}"
        runs = []  # consecutive repeats of one message collapse into one line
        for e in hits:
            if runs and (runs[-1][0]["level"], runs[-1][0]["msg"]) == (e["level"], e["msg"]):
                runs[-1].append(e)
            else:
                runs.append([e])
        out = [f"{r[0]['time']} {r[0]['level']} {r[0]['msg']}"
               + (f" (x{len(r)}, last {r[-1]['time']})" if len(r) > 1 else "") for r in runs[:MAX_LOG_LINES]]
        if len(runs) > MAX_LOG_LINES:
            out.append(f"... {len(runs) - MAX_LOG_LINES} more lines")
        return "\n".join(out)

    return [list_alerts, get_dependencies, list_deploys, search_logs]


class Environment:
    """make_tools' tools as methods over a row's info["world"]: what env.py's trainer calls, and the
    docstrings its prompts show."""

    def reset(self, info: dict) -> None:
        world = (info or {}).get("world") or {}
        self.services = list(world.get("services", []))  # the world's parts, for code that reads them
        self.deps = world.get("deps", {})
        self.deploys = world.get("deploys", [])
        self.alerts = world.get("alerts", [])
        self.logs = world.get("logs", {})
        self._tools = {fn.__name__: fn for fn in make_tools(world)}

    def _tool(self, name):
        if not hasattr(self, "_tools"):  # a tool called before reset acts on an empty world
            self._tools = {fn.__name__: fn for fn in make_tools({})}
        return self._tools[name]

    def list_alerts(self) -> str:
        """List the incident's alerts, earliest first.

        Returns:
            One line per alert: 'HH:MM service: symptom'.
        """
        return self._tool("list_alerts")()

    def get_dependencies(self, service: str) -> str:
        """List the services that a service calls directly.

        Args:
            service: The service name, e.g. "checkout".
        """
        return self._tool("get_dependencies")(service)

    def list_deploys(self, since: str) -> str:
        """List deploys at or after a time of day, earliest first (at most 8 lines).

        Args:
            since: A time of day 'HH:MM'; only deploys at or after it are listed.
        """
        return self._tool("list_deploys")(since)

    def search_logs(self, service: str, level: str) -> str:
        """Show one service's log lines at a level, earliest first (at most 8 lines).

        Args:
            service: The service name, e.g. "payments".
            level: "error", "warn" or "any".
        """
        return self._tool("search_logs")(service, level)


# ---------------------------------------------------------------- training data

NAMES = ["checkout", "payments", "auth", "inventory", "search", "cart", "users", "orders", "shipping",
         "catalog", "pricing", "gateway", "ledger", "billing", "sessions", "reviews", "media", "profile",
         "fraud", "tax", "coupons", "accounts", "wallet", "quotes", "returns", "loyalty"]
OWN_ERRORS = ["panic: index out of range in Resolver", "KeyError: 'currency'", "migration 17 failed: table locked",
              "database connection refused", "NullPointerException in Mapper", "decode error: unexpected field"]
BLAME = ["call to {d} failed: HTTP 503", "upstream {d} timed out after 2000ms", "{d} returned 500"]
NOISE = [("WARN", "slow query took 900ms"), ("WARN", "GC pause 250ms"), ("INFO", "health check ok"),
         ("WARN", "retry budget at 80%"), ("INFO", "processed 812 requests"), ("ERROR", "metrics push failed")]
PHRASES = ["returning 502s", "throwing 500 errors", "timing out", "failing health checks", "erroring"]


def task_difficulty() -> dict:
    """The task's difficulty knobs from task.json next to this file ({} when it is not there).
    Training at another difficulty teaches the wrong problems: at an easy rung the model would
    only ever see incidents it cannot trace, and learn the shaped rewards instead of the answer."""
    try:
        difficulty = json.loads(Path(__file__).with_name("task.json").read_text()).get("difficulty", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return difficulty if isinstance(difficulty, dict) else {}


def _inline(difficulty) -> bool:
    """Whether the task states the tools' data in the question itself (the "inline" knob)."""
    return isinstance(difficulty, dict) and difficulty.get("inline") is True


SYSTEM_PROMPT = INLINE_SYSTEM_PROMPT if _inline(task_difficulty()) else TOOLS_SYSTEM_PROMPT


def _inline_text(world):
    """The data an inline prompt states, in the tools' own line formats: alerts, every service's
    dependencies, all deploys, every service's error lines merged earliest first."""
    env = Environment()
    env.reset({"world": world})
    lines = ["Alerts:", env.list_alerts(), "Dependencies:"]
    lines += [env.get_dependencies(s) for s in env.services]
    lines.append("Deploys today:")
    lines += [f"{d['time']} {d['service']}@{d['version']}" for d in env.deploys] or ["none"]
    errors, quiet = [], []
    for s in env.services:
        out = env.search_logs(s, "error")
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


def _knob(difficulty, name, lo, hi):
    """An integer knob clamped to [lo, hi], or None when the task does not set it (or garbles it)."""
    try:
        return min(max(int(difficulty[name]), lo), hi)
    except (KeyError, TypeError, ValueError):
        return None


def make_row(rng, difficulty=None):
    """One incident at the task's knobs (the family's meaning: n_services services, a chain of
    depth hops from the alerting service to the culprit, n_distractor_deploys misleading deploys
    near the alert (the first on an unrelated service), n_background_deploys deploys hours
    before it, log_noise WARN/INFO lines per service plus old chronic errors from 2 up); a knob
    the task leaves out keeps this env's own range."""
    difficulty = difficulty or {}
    n = _knob(difficulty, "n_services", 3, len(NAMES))
    n = rng.randint(4, 7) if n is None else n
    depth = _knob(difficulty, "depth", 1, n - 2)
    depth = rng.randint(1, min(3, n - 2)) if depth is None else depth
    n_distractors = _knob(difficulty, "n_distractor_deploys", 1, 6)
    n_background = _knob(difficulty, "n_background_deploys", 0, 6)
    log_noise = _knob(difficulty, "log_noise", 0, 6)
    names = rng.sample(NAMES, n)
    chain, rest = names[:depth + 1], names[depth + 1:]
    side = rest[:rng.randint(0, len(rest) - 1)]  # healthy dependencies; the remainder is unrelated
    unrelated = rest[len(side):]
    deps = {s: [] for s in names}
    for a, b in zip(chain, chain[1:]):
        deps[a].append(b)
    for s in side:
        deps[rng.choice(chain)].append(s)
    root = chain[-1]
    alert = rng.randint(9 * 60 + 30, 17 * 60)
    root_t = alert - rng.randint(5, 45)
    err = root_t + rng.randint(1, 3)
    plan = [(root_t, root)]
    taken = {root_t}

    def pick(lo, hi):
        t = rng.randint(lo, hi)
        while t in taken:
            t = rng.randint(lo, hi)
        taken.add(t)
        return t

    plan.append((pick(alert - 50, alert - 1), rng.choice(unrelated)))
    if n_distractors is None and n_background is None:
        kinds = [None] * rng.randint(1, 4)  # distractors and background mixed, drawn below
    else:  # r < 0.75: a distractor near the alert (healthy dependency, caller, hotfix); else background
        n_distractors = rng.randint(2, 4) if n_distractors is None else n_distractors
        kinds = [0.75 * rng.random() for _ in range(n_distractors - 1)]
        kinds += [1.0] * (rng.randint(0, 1) if n_background is None else n_background)
    for r in kinds:
        r = rng.random() if r is None else r
        if r < 0.3 and side:
            plan.append((pick(alert - 50, alert - 1), rng.choice(side)))
        elif r < 0.55:
            plan.append((pick(alert - 50, alert - 1), rng.choice(chain[:-1])))
        elif r < 0.75:
            plan.append((pick(alert + 2, alert + 30), rng.choice(chain)))
        else:
            plan.append((pick(7 * 60, alert - 110), rng.choice(names)))
    plan.sort()
    ver = {s: [rng.randint(0, 5), rng.randint(0, 20), rng.randint(0, 15)] for s in names}
    deploys, answer = [], None
    for t, s in plan:
        ver[s][2] += 1
        v = ".".join(str(x) for x in ver[s])
        deploys.append({"service": s, "version": v, "time": fmt_time(t)})
        if t == root_t:
            answer = f"{root}@{v}"
    logs = {s: [] for s in names}
    msg, t = rng.choice(OWN_ERRORS), err
    while t < alert + 20:
        logs[root].append((t, "ERROR", msg))
        t += rng.randint(2, 7)
    for i in range(depth - 1, -1, -1):
        line, t = rng.choice(BLAME).format(d=chain[i + 1]), min(err + depth - i, alert)
        while t < alert + 20:
            logs[chain[i]].append((t, "ERROR", line))
            t += rng.randint(2, 7)
    chronic = set()  # with log_noise: exactly log_noise WARN/INFO lines a service, and from 2 up
    if log_noise is not None and log_noise >= 2:  # an old chronic error on two healthy services
        chronic = set(rng.sample([s for s in names if s != root], min(2, len(names) - 1)))
    quiet, loud = [x for x in NOISE if x[0] != "ERROR"], [x for x in NOISE if x[0] == "ERROR"]
    for s in names:
        if log_noise is None:
            pools = [NOISE] * rng.randint(0, 3)
        else:
            pools = [quiet] * log_noise + ([loud] if s in chronic else [])
        for pool in pools:
            level, text = rng.choice(pool)
            lo = alert - 240 if level == "ERROR" else alert - 150
            hi = alert - 130 if level == "ERROR" else alert + 20
            if level == "ERROR" and s == root:
                continue
            logs[s].append((rng.randint(lo, hi), level, text))
    logs = {s: [{"time": fmt_time(t), "level": lv, "msg": m} for t, lv, m in sorted(v)] for s, v in logs.items()}
    alerts = [{"service": chain[0], "symptom": f"HTTP 5xx rate {rng.randint(4, 35)}%", "time": fmt_time(alert)}]
    for s in chain[1:-1]:
        if rng.random() < 0.5:
            alerts.append({"service": s, "symptom": f"error rate {rng.randint(4, 35)}%",
                           "time": fmt_time(alert + rng.randint(1, 6))})
    alerts.sort(key=lambda a: a["time"])
    incident = f"INC-{rng.randint(1000, 9999)}"
    world = {"incident": incident, "services": sorted(names), "deps": deps, "deploys": deploys,
             "alerts": alerts, "logs": logs}
    prompt = (f"Incident {incident}: {chain[0]} is {rng.choice(PHRASES)} since {fmt_time(alert)}. "
              "Which deploy is the root cause? Answer with the service and version.")
    if _inline(difficulty):
        prompt = f"{prompt}\n\n{_inline_text(world)}"
    return {"prompt": prompt, "answer": answer, "info": {"world": world}}


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


PAIR = re.compile(r"([a-z][a-z0-9_]*)(?:\s*(?:@|:|==|=|,)\s*|\s+)v?(\d+(?:\.\d+){1,3})(?![\d.]*\d)")


def parse_answer(text):
    lines = re.findall(r"answer\s*[:=]\s*(.*)", text or "", re.IGNORECASE)
    if not lines:
        return None
    line = re.sub(r"\bversion\b", " ", lines[-1].lower())
    for ch in "`*\"":
        line = line.replace(ch, " ")
    pairs = {(s, v) for s, v in PAIR.findall(line) if s != "v"}
    return pairs.pop() if len(pairs) == 1 else None


def gold(answer):
    return parse_answer(f"Answer: {answer}")
