"""The Policy interface: one assistant message per turn, with tool calls.

Implementations, picked by `make_policy` from a spec string:

    reference[:N]        scripted, no model (the default); refines with up to N jobs (default 2)
    openai:MODEL         any OpenAI-compatible chat endpoint (OpenAI, OpenRouter, vLLM, ...)
    hf:PATH_OR_NAME      a local Hugging Face model (hf:tiny = the built-in tiny model)

An LLM policy attaches `usage` (tokens, USD, latency) to each reply; a trainable one also
attaches `tokens` (prompt ids, sampled ids, their logprobs). A policy that cannot go on for
a known reason raises `PolicyStop`; any other exception ends the episode as policy_error.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlparse

from pydantic import Field, field_validator

from ait.contract import Strict
from ait.harness.types import Message
from ait.spec import TaskSpec


class Policy(Protocol):
    name: str

    def reset(self, spec: TaskSpec) -> None:
        """Start a new episode (the policy may not read the spec's hidden parts: there are none)."""

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        """Return the next assistant message given the conversation and the tool schemas."""


class PolicySettings(Strict):
    """The agent and how it is called: the one place `ait episode` and `ait eval` (EvalPlan extends it)
    read their policy flags from, so the two commands take the same settings with the same bounds."""

    policy: str = "reference"
    """reference[:N], openai:MODEL or hf:PATH_OR_NAME."""
    base_url: str | None = None
    """OpenAI-compatible endpoint of an openai: policy."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Sampling temperature of an LLM policy."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens an LLM policy may reply with."""
    request_timeout_s: float | None = Field(default=None, ge=0.1)
    """Seconds one openai: request may take before it is retried (default 120)."""
    salvage_tool_calls: bool = False
    """openai: read tool calls a model writes as text (bare JSON, <tool_call> tags)."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and (urlparse(v).scheme not in ("http", "https") or not urlparse(v).netloc):
            raise ValueError(f"--base-url {v!r} is not an http(s) URL: pass e.g. http://127.0.0.1:8080/v1")
        return v

    def make(self) -> Policy:
        return make_policy(self.policy, base_url=self.base_url, temperature=self.temperature,
                           max_tokens=self.max_tokens, request_timeout_s=self.request_timeout_s,
                           salvage_tool_calls=self.salvage_tool_calls)


def make_policy(spec: str | None, *, base_url: str | None = None, temperature: float | None = None,
                max_tokens: int | None = None, request_timeout_s: float | None = None,
                salvage_tool_calls: bool = False) -> Policy:
    """Build a policy from `reference`, `reference:N`, `openai:MODEL` or `hf:PATH_OR_NAME`.

    `max_tokens` caps each reply (openai, hf); `request_timeout_s` is one HTTP request's limit and
    `salvage_tool_calls` parses tool calls written as text (openai only: the hf policy always does)."""
    kind, _, arg = (spec or "reference").partition(":")
    if kind != "openai" and (request_timeout_s is not None or salvage_tool_calls):
        raise ValueError("--request-timeout and --salvage-tool-calls apply to an openai:MODEL policy only")
    if kind == "reference":
        from ait.policy.reference import ReferencePolicy

        if arg and not arg.isdigit():
            raise ValueError(f"reference takes a number of jobs (reference:2), not {arg!r}")
        return ReferencePolicy(jobs=int(arg) if arg else 2)
    if kind == "openai" and arg:
        from ait.policy.openai_policy import OpenAIPolicy

        return OpenAIPolicy(arg, base_url, temperature=temperature, max_tokens=max_tokens,
                            timeout_s=request_timeout_s, salvage_tool_calls=salvage_tool_calls)
    if kind == "hf" and arg:
        from ait.policy.hf_policy import HFPolicy

        options: dict[str, Any] = {"temperature": temperature} if temperature is not None else {}
        if max_tokens is not None:
            options["max_new_tokens"] = max_tokens
        return HFPolicy(arg, **options)
    raise ValueError(f"unknown policy {spec!r}; use reference, reference:N, openai:MODEL or hf:PATH_OR_NAME")
