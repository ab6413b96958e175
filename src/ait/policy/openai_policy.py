"""An OpenAI-compatible chat endpoint as a policy: OpenAI, OpenRouter, vLLM, llama.cpp, any `base_url`.

One request per turn with the harness's tool schemas. Transient failures (429, 408,
409, 5xx, timeouts, dropped connections, an empty reply) are retried with exponential
backoff and jitter, honouring Retry-After, up to `max_attempts`; then, or at once for
any other error, a PolicyError ends the episode as policy_error. A context-length error
ends it as context_full instead (PolicyStop). The SDK's own retries are off so that every
attempt is counted here: each failed attempt is a `Retry` on the call's Usage, and the
call's latency covers every attempt and the waits between them. Error messages carry the
URL, the status and the server's own explanation (or, for a connection that failed, why).

Tool calls whose arguments are not a JSON object are passed on raw: the harness answers
them with an error and counts them. Some servers return no structured tool calls at all
(the model writes `<tool_call>` tags or bare JSON in the text): `diagnostics()` counts
such replies, and `salvage_tool_calls=True` parses them into calls (ait.chat's agent parser,
the one the HF policy uses). `preflight()` checks the endpoint and the model before an
episode spends anything.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import random
import re
import time
from typing import Any, Callable
from urllib.parse import urlparse

from ait.chat.parse import looks_like_tool_call
from ait.chat.renderers import OpenAIRenderer
from ait.harness.types import Message, PolicyStop, StopReason
from ait.metering import Retry, Usage
from ait.policy.keys import is_openrouter, resolve_endpoint
from ait.spec import TaskSpec

RETRY_STATUS = {408, 409, 429}
DEFAULT_TIMEOUT_S = 120.0
MAX_DETAIL = 500  # characters of the server's message kept in an error
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b")

# How servers word "the prompt does not fit": OpenAI / vLLM / OpenRouter ("maximum context length",
# context_length_exceeded), llama.cpp's server ("exceeds the available context size",
# exceed_context_size_error), llama-cpp-python ("exceed context window"), Anthropic-style gateways
# ("prompt is too long"), TGI ("must have less than N tokens"), and the generic ones.
CONTEXT_FULL = re.compile(
    r"context[ _-]?length|maximum context|context[ _-]?window|context[ _-]?size|exceed_context|"
    r"too many tokens|prompt is too long|input is too long|prompt too long|"
    r"must have less than \d+ (?:input )?tokens|reduce the length of the messages",
    re.IGNORECASE)


class PolicyError(RuntimeError):
    """The endpoint could not produce a reply (after retries, or a non-retryable error).

    `usage` is what the failed call took (latency of every attempt and wait, attempts, retries; no
    tokens), for the meter's llm_seconds; `retries` its failed attempts; `status` the last HTTP status."""

    def __init__(self, message: str, *, usage: Usage | None = None, status: int | None = None):
        super().__init__(message)
        self.usage = usage
        self.retries = list(usage.retries) if usage else []
        self.status = status


class EmptyReply(Exception):
    """A 200 response without choices (some gateways answer overload this way): retried."""


def retryable(e: BaseException) -> bool:
    import openai

    if isinstance(e, (openai.APIConnectionError, EmptyReply)):  # APITimeoutError is a connection error
        return True
    if isinstance(e, openai.APIStatusError):
        return e.status_code in RETRY_STATUS or e.status_code >= 500
    return False


def validation_summary(errors: list[dict[str, Any]]) -> str:
    """Pydantic / FastAPI validation errors, the ones that matter: for a union (a chat message is one
    of several message types) the branches ruled out by a literal mismatch (`role`) are dropped, so a
    null `content` is not buried under "Input should be 'system'", "... 'user'", ..."""
    ruled_out = {tuple(e.get("loc") or ())[:-1] for e in errors if e.get("type") == "literal_error"}
    kept = [e for e in errors if tuple(e.get("loc") or ())[:-1] not in ruled_out] or errors
    parts = []
    for e in kept[:3]:
        loc = ".".join(str(x) for x in e.get("loc") or ())
        got = e.get("input", "")
        shown = f" (got {got!r})" if not isinstance(got, (dict, list)) and len(repr(got)) < 80 else ""
        parts.append(f"{loc}: {e.get('msg', e.get('type', '?'))}{shown}")
    return f"{len(errors)} validation error{'s' * (len(errors) != 1)}: " + "; ".join(parts)


def pydantic_dump(text: str) -> str | None:
    """A summary of "N validation errors:" followed by one error dict a line (pydantic's str()), or None."""
    if not re.match(r"\d+ validation errors?", text):
        return None
    errors = []
    for line in text.splitlines()[1:]:
        line = line.strip()
        if line.startswith("{"):
            try:
                value = ast.literal_eval(line)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, dict):
                errors.append(value)
    return validation_summary(errors) if errors else None


def trim(text: str, limit: int = MAX_DETAIL) -> str:
    """The part of a server's message that matters, on one line: a validation error's relevant entries,
    a Python traceback's last lines (the exception), else the text with its whitespace collapsed, its
    head and tail kept when too long."""
    text = text.strip()
    text = pydantic_dump(text) or text
    if "Traceback (most recent call last)" in text:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        frames = [i for i, line in enumerate(lines) if line.startswith("File ")]
        rest = lines[frames[-1] + 1:] if frames else lines
        starts = [i for i, line in enumerate(rest) if EXCEPTION_LINE.match(line)]
        text = " ".join(rest[starts[0]:] if starts else rest[-1:])
    text = re.sub(r"\s+", " ", text)
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def server_message(e: BaseException) -> str:
    """What the server said: the JSON body's error.message (or error, detail, message), else its text."""
    response = getattr(e, "response", None)
    try:
        raw = response.text if response is not None else ""
    except Exception:  # a streamed or closed response
        raw = ""
    body: Any = None
    try:
        body = json.loads(raw) if raw else getattr(e, "body", None)
    except ValueError:
        body = None
    found = message_in(body)
    return trim(found if found else raw)


def message_in(body: Any) -> str:
    if isinstance(body, str):
        return body
    if not isinstance(body, dict):
        return ""
    for key in ("error", "detail", "message", "msg"):
        value = body.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            if found := message_in(value):
                return found
        if isinstance(value, list) and value:  # FastAPI validation errors: [{"loc": ..., "msg": ...}]
            if all(isinstance(v, dict) and "msg" in v for v in value):
                return validation_summary(value)
            return "; ".join(message_in(v) or json.dumps(v) for v in value[:3])
    return ""


def connection_cause(e: BaseException) -> str:
    """Why a connection failed, from the exception chain: refused, DNS, timeout, reset."""
    import socket

    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    for err in reversed(chain):  # the deepest cause is the most specific
        if isinstance(err, socket.gaierror):
            return f"DNS lookup failed ({err.strerror or err})"
        if isinstance(err, ConnectionRefusedError):
            return "connection refused (is the server running, on this port?)"
        if isinstance(err, ConnectionResetError):
            return "connection reset by the server"
        if isinstance(err, TimeoutError) or "Timeout" in type(err).__name__:
            return "timed out"
    for err in reversed(chain):
        if str(err) and str(err) != "Connection error.":
            return f"{type(err).__name__}: {trim(str(err), 200)}"
    return type(chain[0]).__name__ if chain else "unknown"


def request_url(e: BaseException, fallback: str | None) -> str:
    for holder in (getattr(e, "request", None), getattr(getattr(e, "response", None), "request", None)):
        try:
            if holder is not None and holder.url:
                return str(holder.url)
        except Exception:
            continue
    return fallback or "the default endpoint"


def describe(e: BaseException, url: str | None = None, timeout_s: float | None = None) -> str:
    """One line: the status, the URL and the server's message; or the URL and the connection's cause."""
    import openai

    where = request_url(e, url)
    if isinstance(e, openai.APIStatusError):
        said = server_message(e)
        hint = ""
        if e.status_code == 404 and not re.search(r"/v\d+/", urlparse(where).path + "/"):
            hint = " (does the base URL end in /v1?)"
        elif e.status_code in (401, 403):
            hint = " (check the API key: AIT_API_KEY, OPENAI_API_KEY or OPENROUTER_API_KEY)"
        return f"HTTP {e.status_code} from {where}{hint}" + (f": {said}" if said else "")
    if isinstance(e, openai.APITimeoutError):
        return f"timed out after {timeout_s:g} s waiting for {where}" if timeout_s else f"timed out: {where}"
    if isinstance(e, openai.APIConnectionError):
        return f"cannot connect to {where}: {connection_cause(e)}"
    return f"{type(e).__name__}: {trim(str(e), 300)}"


def context_full(e: BaseException) -> bool:
    import openai

    if not isinstance(e, openai.APIStatusError) or e.status_code in (401, 403, 404, 429):
        return False
    body = getattr(e, "body", None)
    code = " ".join(str(body.get(k, "")) for k in ("code", "type")) if isinstance(body, dict) else ""
    return bool(CONTEXT_FULL.search(f"{server_message(e)} {code}"))


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


def is_loopback(base_url: str | None) -> bool:
    """Whether the endpoint is on this machine (127.0.0.0/8, ::1, localhost)."""
    host = (urlparse(base_url).hostname or "") if base_url else ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {str((t.get("function") or t).get("name")) for t in tools if isinstance(t, dict)}


class OpenAIPolicy:
    def __init__(self, model: str, base_url: str | None = None, *, api_key: str | None = None,
                 temperature: float | None = None, max_tokens: int | None = None,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S, max_attempts: int = 6, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 60.0, sleep: Callable[[float], None] = time.sleep, seed: int | None = None,
                 salvage_tool_calls: bool = False):
        """`timeout_s`: seconds one request may take (a slow local server on CPU needs more than the
        default); `salvage_tool_calls`: parse tool calls the model wrote as text (tags or bare JSON)."""
        from openai import OpenAI

        if api_key is None:
            base_url, api_key = resolve_endpoint(base_url)
        self.model, self.base_url = model, base_url
        self.name = f"openai:{model}"
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        if self.timeout_s <= 0:
            raise ValueError(f"the request timeout must be positive, not {timeout_s}")
        self.max_attempts, self.backoff_base_s, self.backoff_max_s = max(1, max_attempts), backoff_base_s, backoff_max_s
        self.sleep, self.rng = sleep, random.Random(seed)
        self.salvage = salvage_tool_calls
        self.renderer = OpenAIRenderer(salvage=salvage_tool_calls)
        self.local = is_loopback(base_url)
        self.client = OpenAI(api_key=api_key, base_url=base_url, timeout=self.timeout_s, max_retries=0)
        self.url = str(self.client.base_url).rstrip("/")
        self.settings = {"model": model, "base_url": base_url, "temperature": temperature, "max_tokens": max_tokens,
                         "timeout_s": self.timeout_s, "max_attempts": self.max_attempts,
                         "salvage_tool_calls": salvage_tool_calls}  # no key: this goes to the manifest
        self.retries: list[Retry] = []  # every failed attempt of the episode (each call's are on its Usage too)
        self.turn = 0
        self.counts = self.fresh_counts()

    @staticmethod
    def fresh_counts() -> dict[str, int]:
        return {"replies": 0, "structured": 0, "text_calls": 0, "salvaged": 0}

    def reset(self, spec: TaskSpec) -> None:
        self.turn = 0
        self.retries = []
        self.counts = self.fresh_counts()

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.turn += 1
        request: dict[str, Any] = {"model": self.model, **self.renderer.build_generation_prompt(messages, tools)}
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request["max_tokens"] = self.max_tokens
        if is_openrouter(self.base_url):
            request["extra_body"] = {"usage": {"include": True}}  # ask OpenRouter to report the call's cost
        response, attempts, latency, retries = self.request(request)
        return self.to_message(response, attempts, latency, retries, tools)

    def request(self, request: dict[str, Any]) -> tuple[Any, int, float, list[Retry]]:
        """(response, attempts, seconds of every attempt and wait, the failed attempts)."""
        retries: list[Retry] = []
        spent = 0.0
        last: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            t0 = time.monotonic()
            try:
                response = self.client.chat.completions.create(**request)
                if not getattr(response, "choices", None):
                    raise EmptyReply("the response has no choices")
                spent += time.monotonic() - t0
                return response, attempt, spent, retries
            except Exception as e:
                took = time.monotonic() - t0
                spent += took
                error = describe(e, f"{self.url}/chat/completions", self.timeout_s)
                if context_full(e):
                    stop = PolicyStop(StopReason.context_full, f"{self.name}: the conversation no longer fits the "
                                                               f"model's context: {error}")
                    stop.usage = self.failed_usage(attempt, spent, retries)  # type: ignore[attr-defined]
                    raise stop from None
                if not retryable(e):
                    raise PolicyError(f"{self.name}: {error} (not retryable)", usage=self.failed_usage(
                        attempt, spent, retries), status=getattr(e, "status_code", None)) from None
                last = e
            if attempt < self.max_attempts:
                delay = backoff_s(attempt, self.backoff_base_s, self.backoff_max_s, self.rng, retry_after_s(last))
                self.note_retry(retries, Retry(turn=self.turn, attempt=attempt, error=error, seconds=round(took, 3),
                                               wait_s=delay))
                self.sleep(delay)
                spent += delay
            else:
                self.note_retry(retries, Retry(turn=self.turn, attempt=attempt, error=error, seconds=round(took, 3)))
        tries = f"{self.max_attempts} attempt" + "s" * (self.max_attempts != 1)
        raise PolicyError(f"{self.name}: gave up after {tries}; last error: {error}",
                          usage=self.failed_usage(self.max_attempts, spent, retries),
                          status=getattr(last, "status_code", None))

    def note_retry(self, retries: list[Retry], retry: Retry) -> None:
        retries.append(retry)
        self.retries.append(retry)

    def failed_usage(self, attempts: int, spent: float, retries: list[Retry]) -> Usage:
        return Usage(model=self.model, latency_s=spent, attempts=attempts, local=self.local, retries=list(retries))

    def to_message(self, response: Any, attempts: int, latency: float, retries: list[Retry],
                   tools: list[dict[str, Any]] = ()) -> Message:
        msg = response.choices[0].message
        names = tool_names(tools) or None
        content, calls = self.renderer.parse_response(msg, f"call_{self.turn}", tool_names=names)
        self.counts["replies"] += 1
        if getattr(msg, "tool_calls", None):
            self.counts["structured"] += 1
        elif self.salvage:  # the renderer searched the text: any call it has was written as text
            self.counts["salvaged"] += bool(calls)
            self.counts["text_calls"] += bool(calls)
        elif content and looks_like_tool_call(content, names):
            self.counts["text_calls"] += 1
        return Message(role="assistant", content=content, tool_calls=calls,
                       usage=self.usage(response, attempts, latency, retries))

    def usage(self, response: Any, attempts: int, latency: float, retries: list[Retry] = ()) -> Usage:
        u = getattr(response, "usage", None)
        common = {"model": self.model, "latency_s": latency, "attempts": attempts, "local": self.local,
                  "retries": list(retries)}
        if u is None:  # some servers omit usage; the price table then sees zero tokens
            return Usage(**common)
        details = getattr(u, "prompt_tokens_details", None)
        cost = (getattr(u, "model_extra", None) or {}).get("cost")
        return Usage(prompt_tokens=u.prompt_tokens or 0, completion_tokens=u.completion_tokens or 0,
                     cached_tokens=getattr(details, "cached_tokens", None) or 0,
                     usd=float(cost) if isinstance(cost, (int, float)) else None,
                     usd_source="provider" if isinstance(cost, (int, float)) else None, **common)

    def diagnostics(self) -> dict[str, Any]:
        """This episode's replies: how many had structured tool calls, how many wrote calls as text
        (salvaged or not), the retries; `note` is a sentence for the episode's result, or None."""
        c = self.counts
        note = None
        if c["structured"] == 0 and c["text_calls"] > 0:
            if self.salvage:
                note = (f"the model wrote tool calls as text, never as structured calls ({c['text_calls']} of "
                        f"{c['replies']} replies); they were salvaged from the text (--salvage-tool-calls)")
            else:
                note = (f"the model wrote tool calls as text, never as structured calls ({c['text_calls']} of "
                        f"{c['replies']} replies); try --salvage-tool-calls, or a server chat format that "
                        "returns tool calls")
        elif c["text_calls"] > 0 and not self.salvage:
            note = (f"{c['text_calls']} of {c['replies']} replies wrote a tool call as text instead of a structured "
                    "call (not acted on; --salvage-tool-calls parses them)")
        return {"replies": c["replies"], "structured_tool_call_replies": c["structured"],
                "text_tool_call_replies": c["text_calls"], "salvaged_replies": c["salvaged"],
                "retries": len(self.retries), "note": note}

    def preflight(self, timeout_s: float = 10.0) -> str | None:
        """A one-line problem with the endpoint or the model, or None (also when it cannot tell).

        GET {base_url}/models: unreachable, 404 (the URL), 401/403 (the key) are problems; a server that
        does not list models (404/405 on /models, a body that is not a list) cannot be checked and passes.
        A model missing from the list is confirmed with a 1-token request first, since single-model
        servers (llama.cpp) answer whatever name they are sent."""
        import openai

        client = self.client.with_options(timeout=timeout_s, max_retries=0)
        url = f"{self.url}/models"
        try:
            listed = client.models.list()
            ids = [str(getattr(m, "id", "")) for m in getattr(listed, "data", None) or []]
        except openai.APIStatusError as e:
            if e.status_code in (404, 405, 501):
                if e.status_code == 404 and not re.search(r"/v\d+$", self.url) and self.answers(f"{self.url}/v1/models",
                                                                                                  timeout_s):
                    return (f"HTTP 404 from {url}, but {self.url}/v1/models answers: the base URL should end in /v1 "
                            f"(--base-url {self.url}/v1)")
                return None  # no /models here: cannot check, the first chat call will say
            if e.status_code in (401, 403):
                return f"the server refused the key: {describe(e, url)}"
            return f"{describe(e, url)}"
        except openai.APIConnectionError as e:
            return describe(e, url, timeout_s)
        except Exception:  # a 200 that is not a model list: cannot check
            return None
        if not ids or self.model in ids:
            return None
        try:
            client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
            return None  # not listed, but served (the server ignores the name, or aliases it)
        except Exception as e:
            listing = ", ".join(ids[:8]) + (f" (and {len(ids) - 8} more)" if len(ids) > 8 else "")
            return (f"model {self.model!r} is not served at {self.url}; the server has: {listing} "
                    f"(a 1-token request said: {describe(e, f'{self.url}/chat/completions', timeout_s)})")

    def answers(self, url: str, timeout_s: float) -> bool:
        """Whether GET `url` answers 200 (with this client's key)."""
        try:
            response = self.client.with_options(timeout=timeout_s, max_retries=0).get(url, cast_to=object)
            return response is not None
        except Exception:
            return False
