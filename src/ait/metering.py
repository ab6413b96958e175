"""Tokens, USD and GPU-seconds: what every LLM call and every job costs, the ledger, budgets.

    Usage        one LLM call: prompt / completion / cached tokens, USD, latency
    JobCost      one job: GPUs held, GPU-seconds (or CPU-seconds), estimated USD
    PriceTable   USD per million tokens per model, USD per GPU-hour per GPU type
    Ledger       runs/costs.jsonl: one append-only JSON line per LLM call and per job
    Meter        one episode's running totals, its ledger lines and its budget checks

USD comes from the provider when the response reports it (OpenRouter's `usage.cost`),
else from the price table; a model missing from the table is recorded as unpriced
($0, counted) rather than guessed, unless it was served on this machine (a loopback
base URL: `local`, $0). Defaults below are list prices at the time of
writing; override or extend them in AIT_HOME/prices.toml, AIT_PRICES or a path.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, computed_field

from ait.contract import Strict
from ait.home import ait_home
from ait.job.types import JobResult

# ---- records ---------------------------------------------------------------------------------


class Retry(BaseModel):
    """One failed attempt of an LLM call, and the wait before the next."""

    turn: int
    """The policy turn the call belonged to."""
    attempt: int
    """1-based attempt number."""
    error: str
    """What went wrong: status, URL and the server's own message, or the connection's cause."""
    seconds: float = 0.0
    """How long the failed attempt took."""
    wait_s: float = 0.0
    """Backoff before the next attempt (0 after the last one)."""


class Usage(BaseModel):
    """What one LLM call consumed."""

    model: str | None = None
    """Model name as sent to the endpoint."""
    prompt_tokens: int = 0
    """Input tokens, cached ones included (OpenAI's convention)."""
    completion_tokens: int = 0
    """Generated tokens."""
    cached_tokens: int = 0
    """Input tokens served from the provider's prompt cache."""
    usd: float | None = None
    """Cost of the call; None until priced."""
    usd_source: Literal["provider", "price_table", "local", "unpriced"] | None = None
    """Where `usd` came from: the response, the price table, a local model ($0), or nowhere ($0)."""
    latency_s: float = 0.0
    """Wall time of the call: every attempt, failed ones included, and the backoff waits between them."""
    attempts: int = 1
    """Requests made, retries included."""
    local: bool = False
    """Served on this machine (a loopback base URL): priced $0 ("local") when the price table has no price."""
    retries: list[Retry] = Field(default_factory=list)
    """Why each failed attempt of this call failed (empty when the first attempt answered)."""


class JobCost(BaseModel):
    """What one job consumed."""

    gpus: float
    """GPUs held (fractional when packed; 0 on CPU)."""
    gpu_type: str | None = None
    """GPU name the price was looked up by."""
    wall_s: float
    """Train + eval wall time (dev eval included)."""
    gpu_seconds: float
    """wall_s × gpus."""
    cpu_seconds: float
    """wall_s when the job held no GPU (the CPU time it occupied), else 0."""
    usd: float
    """Estimated cost from the $/GPU-hour (or $/CPU-hour) table."""


class CostSummary(BaseModel):
    """An episode's totals (flat metrics via `metrics()`)."""

    llm_calls: int = 0
    """LLM calls that returned."""
    prompt_tokens: int = 0
    """Sum of prompt tokens."""
    completion_tokens: int = 0
    """Sum of completion tokens."""
    cached_tokens: int = 0
    """Sum of cached prompt tokens."""
    llm_usd: float = 0.0
    """USD spent on LLM calls."""
    unpriced_calls: int = 0
    """Calls whose model had no price (counted as $0)."""
    llm_seconds: float = 0.0
    """Summed LLM latency (retries and backoff included; calls that failed in the end too)."""
    failed_llm_calls: int = 0
    """Calls that never answered (gave up after retries, or a non-retryable error): time counted, no tokens."""
    jobs: int = 0
    """Jobs metered."""
    gpu_seconds: float = 0.0
    """Summed job GPU-seconds."""
    cpu_seconds: float = 0.0
    """Summed job CPU-seconds (jobs without a GPU)."""
    job_usd: float = 0.0
    """Estimated USD of the jobs."""

    @computed_field
    @property
    def total_usd(self) -> float:
        """LLM plus job USD."""
        return self.llm_usd + self.job_usd

    def metrics(self) -> dict[str, float]:
        return {"cost/usd": self.total_usd, "cost/llm_usd": self.llm_usd, "cost/job_usd": self.job_usd,
                "tokens/prompt": self.prompt_tokens, "tokens/completion": self.completion_tokens,
                "tokens/cached": self.cached_tokens, "llm/calls": self.llm_calls,
                "time/llm_s": self.llm_seconds, "time/gpu_s": self.gpu_seconds, "time/cpu_s": self.cpu_seconds}


# ---- prices ----------------------------------------------------------------------------------


class LLMPrice(Strict):
    prompt: float = Field(ge=0)
    """USD per million prompt tokens."""
    completion: float = Field(ge=0)
    """USD per million completion tokens."""
    cached_prompt: float | None = Field(default=None, ge=0)
    """USD per million cached prompt tokens; None = the prompt price."""


class PriceTable(Strict):
    llm: dict[str, LLMPrice] = Field(default_factory=dict)
    """Per model name (with or without a provider prefix such as `openai/`)."""
    gpu_hour: dict[str, float] = Field(default_factory=dict)
    """USD per GPU-hour, keyed by a substring of the device name; `default` for the rest."""
    cpu_hour: float = Field(default=0.0, ge=0)
    """USD per hour of a job that held no GPU (local CPU: 0 unless you say otherwise)."""


DEFAULT_PRICES = PriceTable(
    llm={
        "gpt-4o": LLMPrice(prompt=2.50, completion=10.00, cached_prompt=1.25),
        "gpt-4o-mini": LLMPrice(prompt=0.15, completion=0.60, cached_prompt=0.075),
        "gpt-4.1": LLMPrice(prompt=2.00, completion=8.00, cached_prompt=0.50),
        "gpt-4.1-mini": LLMPrice(prompt=0.40, completion=1.60, cached_prompt=0.10),
        "gpt-4.1-nano": LLMPrice(prompt=0.10, completion=0.40, cached_prompt=0.025),
        "o4-mini": LLMPrice(prompt=1.10, completion=4.40, cached_prompt=0.275),
        "claude-sonnet-4": LLMPrice(prompt=3.00, completion=15.00, cached_prompt=0.30),
        "claude-3.5-haiku": LLMPrice(prompt=0.80, completion=4.00, cached_prompt=0.08),
    },
    gpu_hour={"H200": 3.50, "H100": 2.50, "A100": 1.50, "L40S": 1.00, "L4": 0.80, "A10": 0.75, "T4": 0.35,
              "default": 2.00},
)


class PriceError(ValueError):
    """A price file that is not TOML or has a wrong or unknown key."""


def load_prices(path: str | Path | None = None) -> PriceTable:
    """Defaults, then AIT_HOME/prices.toml, then `path` (or AIT_PRICES); later files win per key."""
    table = DEFAULT_PRICES.model_copy(deep=True)
    extra = path or os.environ.get("AIT_PRICES")
    for p in [ait_home() / "prices.toml", *([Path(extra)] if extra else [])]:
        if not p.is_file():
            if p != ait_home() / "prices.toml":
                raise PriceError(f"price file {p} not found")
            continue
        try:
            user = PriceTable.model_validate(tomllib.loads(p.read_text()))
        except (tomllib.TOMLDecodeError, ValidationError) as e:
            raise PriceError(f"{p}: {e}") from None
        table.llm.update(user.llm)
        table.gpu_hour.update(user.gpu_hour)
        if "cpu_hour" in user.model_fields_set:
            table.cpu_hour = user.cpu_hour
    return table


def llm_price(table: PriceTable, model: str | None) -> LLMPrice | None:
    """Exact name, then without the provider prefix, then the longest known prefix (dated variants)."""
    if not model:
        return None
    for name in (model, model.split("/", 1)[-1]):
        if name in table.llm:
            return table.llm[name]
    bare = model.split("/", 1)[-1]
    prefixes = [k for k in table.llm if bare.startswith(k + "-")]
    return table.llm[max(prefixes, key=len)] if prefixes else None


def price_usage(usage: Usage, table: PriceTable) -> Usage:
    """Fill `usd` for a call the provider did not price; a provider's or a local $0 is kept."""
    if usage.usd is not None:
        return usage.model_copy(update={"usd_source": usage.usd_source or "provider"})
    price = llm_price(table, usage.model)
    if price is None:
        return usage.model_copy(update={"usd": 0.0, "usd_source": "local" if usage.local else "unpriced"})
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    cached_rate = price.prompt if price.cached_prompt is None else price.cached_prompt
    usd = ((usage.prompt_tokens - cached) * price.prompt + cached * cached_rate
           + usage.completion_tokens * price.completion) / 1e6
    return usage.model_copy(update={"usd": usd, "usd_source": "price_table"})


def gpu_hour_usd(table: PriceTable, gpu_type: str | None) -> float:
    """Price of the longest key found in the device name (case-insensitive), else `default`."""
    name = (gpu_type or "").lower()
    hits = [k for k in table.gpu_hour if k != "default" and k.lower() in name]
    return table.gpu_hour[max(hits, key=len)] if hits else table.gpu_hour.get("default", 0.0)


# ---- jobs ------------------------------------------------------------------------------------


def detect_gpus() -> tuple[float, str | None]:
    """(1, device name) on a CUDA machine, else (0, None): what an inline job holds when its
    result does not say (training runs in one process on one device)."""
    try:
        import torch
    except ImportError:
        return 0.0, None
    if not torch.cuda.is_available():
        return 0.0, None
    return 1.0, torch.cuda.get_device_name(0)


def job_cost(wall_s: float, gpus: float, gpu_type: str | None, table: PriceTable) -> JobCost:
    if gpus > 0:
        usd = wall_s * gpus / 3600 * gpu_hour_usd(table, gpu_type)
        return JobCost(gpus=gpus, gpu_type=gpu_type, wall_s=wall_s, gpu_seconds=wall_s * gpus, cpu_seconds=0.0,
                       usd=usd)
    return JobCost(gpus=0.0, gpu_type=None, wall_s=wall_s, gpu_seconds=0.0, cpu_seconds=wall_s,
                   usd=wall_s / 3600 * table.cpu_hour)


def job_wall_seconds(result: JobResult) -> float:
    """Train + eval wall time: the job's total when it reports one, else its training time."""
    return float(result.total_seconds if result.total_seconds is not None else result.train_seconds or 0.0)


# ---- the ledger ------------------------------------------------------------------------------


class Ledger:
    """runs/costs.jsonl: append-only JSON lines, shared by every episode writing to that runs dir.
    Each line is written with one write() under an exclusive lock, so concurrent episodes never
    interleave; a line torn by a crash is skipped when reading."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps({"t": time.time(), **entry}, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
        finally:
            os.close(fd)  # closing releases the lock

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def total_usd(self, group: str | None = None) -> float:
        """USD of every line, or of the lines tagged with `group`."""
        return sum(float(e.get("usd") or 0.0) for e in self.entries() if group is None or e.get("group") == group)


# ---- one episode's meter ---------------------------------------------------------------------


def ledger_usage(usage: Usage) -> dict[str, Any]:
    """A call's ledger fields: the retries' count, not their messages (the trajectory has those)."""
    out = usage.model_dump(exclude={"retries"})
    if usage.retries:
        out["retries"] = len(usage.retries)
    return out


class Meter:
    """Running totals of one episode; writes its ledger lines and answers budget questions."""

    def __init__(self, ledger: Ledger, run_id: str, prices: PriceTable, *, group: str | None = None,
                 budget_usd: float | None = None, run_budget_usd: float | None = None):
        self.ledger, self.run_id, self.prices, self.group = ledger, run_id, prices, group
        self.budget_usd, self.run_budget_usd = budget_usd, run_budget_usd
        self.summary = CostSummary()
        self.last_call_usd = 0.0

    def record_llm(self, usage: Usage, policy: str) -> Usage:
        usage = price_usage(usage, self.prices)
        s = self.summary
        s.llm_calls += 1
        s.prompt_tokens += usage.prompt_tokens
        s.completion_tokens += usage.completion_tokens
        s.cached_tokens += usage.cached_tokens
        s.llm_usd += usage.usd or 0.0
        s.unpriced_calls += usage.usd_source == "unpriced"
        s.llm_seconds += usage.latency_s
        self.last_call_usd = usage.usd or 0.0
        self.ledger.append({"kind": "llm", "run_id": self.run_id, "group": self.group, "policy": policy,
                            **ledger_usage(usage)})
        return usage

    def record_llm_failure(self, usage: Usage, policy: str) -> None:
        """A call that never answered (e.g. `PolicyError.usage`): its seconds count in llm_seconds, and
        it is counted in failed_llm_calls, not llm_calls; no ledger line (nothing was billed)."""
        self.summary.failed_llm_calls += 1
        self.summary.llm_seconds += usage.latency_s

    def record_job(self, job_id: str, cost: JobCost) -> None:
        s = self.summary
        s.jobs += 1
        s.gpu_seconds += cost.gpu_seconds
        s.cpu_seconds += cost.cpu_seconds
        s.job_usd += cost.usd
        self.ledger.append({"kind": "job", "run_id": self.run_id, "group": self.group, "job_id": job_id,
                            **cost.model_dump()})

    def over_budget(self, next_usd: float = 0.0) -> str | None:
        """Why spending `next_usd` more would break a budget (None if it would not). A budget
        already reached stops everything, even a call expected to be free."""
        checks = [("budget_usd (this episode)", self.summary.total_usd, self.budget_usd)]
        if self.run_budget_usd is not None:
            scope = f"run_budget_usd (group {self.group!r})" if self.group else "run_budget_usd (whole ledger)"
            checks.append((scope, self.ledger.total_usd(self.group), self.run_budget_usd))
        for name, spent, limit in checks:
            if limit is None:
                continue
            if spent >= limit or spent + next_usd > limit:
                return (f"{name} ${limit:.4f}: spent ${spent:.4f}"
                        + (f", next step estimated at ${next_usd:.4f}" if next_usd else ""))
        return None
