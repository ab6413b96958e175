"""An OpenAI-compatible chat endpoint as a policy: OpenAI, OpenRouter, vLLM, any `base_url`.

One request per turn with the harness's tool schemas. Transient failures (429, 408,
409, 5xx, timeouts, dropped connections, an empty reply) are retried with exponential
backoff and jitter, honouring Retry-After, up to `max_attempts`; then, or at once for
any other error, a PolicyError ends the episode as policy_error. The SDK's own retries
are off so that every attempt is counted here. Tool calls whose arguments are not a
JSON object are passed on raw: the harness answers them with an error and counts them.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

from ait.harness.types import Message, ToolCallRequest
from ait.metering import Usage
from ait.policy.chat import parse_arguments, to_openai
from ait.policy.keys import is_openrouter, resolve_endpoint
from ait.spec import TaskSpec

RETRY_STATUS = {408, 409, 429}


class PolicyError(RuntimeError):
    """The endpoint could not produce a reply (after retries, or a non-retryable error)."""


class EmptyReply(Exception):
    """A 200 response without choices (some gateways answer overload this way): retried."""


def retryable(e: BaseException) -> bool:
    import openai

    if isinstance(e, (openai.APIConnectionError, EmptyReply)):  # APITimeoutError is a connection error
        return True
    if isinstance(e, openai.APIStatusError):
        return e.status_code in RETRY_STATUS or e.status_code >= 500
    return False


def describe(e: BaseException) -> str:
    import openai

    if isinstance(e, openai.APIStatusError):
        return f"HTTP {e.status_code}: {str(e.message)[:300]}"
    return f"{type(e).__name__}: {str(e)[:300]}"


def retry_after_s(e: BaseException) -> float | None:
    """The server's Retry-After (seconds or retry-after-ms), when it sent one."""
    response = getattr(e, "response", None)
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, TypeError, ValueError):
            continue
    return None


def backoff_s(attempt: int, base: float, cap: float, rng: random.Random, retry_after: float | None = None) -> float:
    """Exponential backoff with 'equal jitter': half the window fixed, half random, so that
    many episodes hitting one rate limit spread out instead of retrying in lockstep."""
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    window = min(cap, base * 2 ** (attempt - 1))
    return window / 2 + rng.uniform(0, window / 2)


class OpenAIPolicy:
    def __init__(self, model: str, base_url: str | None = None, *, api_key: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None, timeout_s: float = 120.0,
                 max_attempts: int = 6, backoff_base_s: float = 1.0, backoff_max_s: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep, seed: int | None = None):
        from openai import OpenAI

        if api_key is None:
            base_url, api_key = resolve_endpoint(base_url)
        self.model, self.base_url = model, base_url
        self.name = f"openai:{model}"
        self.temperature, self.max_tokens = temperature, max_tokens
        self.max_attempts, self.backoff_base_s, self.backoff_max_s = max(1, max_attempts), backoff_base_s, backoff_max_s
        self.sleep, self.rng = sleep, random.Random(seed)
        self.client = OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)
        self.settings = {"model": model, "base_url": base_url, "temperature": temperature, "max_tokens": max_tokens,
                         "timeout_s": timeout_s, "max_attempts": self.max_attempts}  # no key: this goes to the manifest
        self.retries: list[dict[str, Any]] = []  # every failed attempt: what and how long we waited
        self.turn = 0

    def reset(self, spec: TaskSpec) -> None:
        self.turn = 0
        self.retries = []

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.turn += 1
        request: dict[str, Any] = {"model": self.model, "messages": to_openai(messages)}
        if tools:
            request.update(tools=tools, tool_choice="auto")
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if is_openrouter(self.base_url):
            request["extra_body"] = {"usage": {"include": True}}  # ask OpenRouter to report the call's cost
        response, attempts, latency = self.request(request)
        return self.to_message(response, attempts, latency)

    def request(self, request: dict[str, Any]) -> tuple[Any, int, float]:
        last: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            t0 = time.monotonic()
            try:
                response = self.client.chat.completions.create(**request)
                if not getattr(response, "choices", None):
                    raise EmptyReply("the response has no choices")
                return response, attempt, time.monotonic() - t0
            except Exception as e:
                if not retryable(e):
                    raise PolicyError(f"{self.name}: {describe(e)} (not retryable)") from None
                last = e
            if attempt < self.max_attempts:
                delay = backoff_s(attempt, self.backoff_base_s, self.backoff_max_s, self.rng, retry_after_s(last))
                self.retries.append({"turn": self.turn, "attempt": attempt, "error": describe(last), "wait_s": delay})
                self.sleep(delay)
        raise PolicyError(f"{self.name}: gave up after {self.max_attempts} attempts; last error: {describe(last)}")

    def to_message(self, response: Any, attempts: int, latency: float) -> Message:
        msg = response.choices[0].message
        calls = []
        for i, tc in enumerate(getattr(msg, "tool_calls", None) or []):
            fn = getattr(tc, "function", None)
            calls.append(ToolCallRequest(id=tc.id or f"call_{self.turn}_{i}", name=getattr(fn, "name", None) or "",
                                         arguments=parse_arguments(getattr(fn, "arguments", None))))
        return Message(role="assistant", content=msg.content or "", tool_calls=calls,
                       usage=self.usage(response, attempts, latency))

    def usage(self, response: Any, attempts: int, latency: float) -> Usage:
        u = getattr(response, "usage", None)
        if u is None:  # some servers omit usage; the price table then sees zero tokens
            return Usage(model=self.model, latency_s=latency, attempts=attempts)
        details = getattr(u, "prompt_tokens_details", None)
        cost = (getattr(u, "model_extra", None) or {}).get("cost")
        return Usage(model=self.model, prompt_tokens=u.prompt_tokens or 0, completion_tokens=u.completion_tokens or 0,
                     cached_tokens=getattr(details, "cached_tokens", None) or 0,
                     usd=float(cost) if isinstance(cost, (int, float)) else None,
                     usd_source="provider" if isinstance(cost, (int, float)) else None,
                     latency_s=latency, attempts=attempts)
