"""One renderer per chat format: messages -> what the model is sampled from, and its reply -> (content,
tool calls). As in tinker-cookbook, the same renderer serves sampling, training and evaluation, so the
agent's policies, the inner trainer and the hidden eval cannot read a model's turns differently.

- HFRenderer: a tokenizer's chat template (prepared by `prepare_tokenizer`), TRL's response parser and
  the bare-JSON fallback. The train rollouts, the hidden eval's rollout, the probe's dry run and the HF
  policy all parse through `HFRenderer.parse_response`; the agent asks for the lenient reading
  (`agent_prefix`), the rollouts that are trained on or scored get the strict one.
- OpenAIRenderer: the chat-completions wire format; structured tool calls, and with `salvage` calls
  written as text.

Harness messages are read by their attributes (role, content, tool_calls, ...), not imported: the
harness imports the evals, which import this module.
"""

from __future__ import annotations

from typing import Any, Protocol

from ait.chat.parse import (agent_template_calls, arguments_text, bare_tool_calls, parse_arguments,
                            salvage_tool_calls, template_calls)
from ait.chat.types import ToolCall


class Renderer(Protocol):
    def build_generation_prompt(self, messages: list[Any], tools: list[Any]) -> Any:
        """What the model is sampled from for the next assistant turn (token ids, or a request body)."""

    def parse_response(self, reply: Any, *args: Any, **kwargs: Any) -> tuple[str, list[ToolCall]]:
        """The reply read back into (content, tool calls)."""


# ---- HF chat templates ---------------------------------------------------------------------------


def prepare_tokenizer(tokenizer):
    """Left padding, and a chat template whose tool calls TRL's response parser can read.

    A ChatML model whose own template cannot carry tools (SmolLM2) or is not one TRL knows
    (a GGUF copy of Qwen2.5's template with different whitespace) gets TRL's Qwen2.5 tool
    template: the most common ChatML tool format, so tool definitions reach the model and
    its `<tool_call>` blocks are parsed. Training, the probe and the hidden eval all come
    through here, so they always render the same prompts."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None) is not None:
        return tokenizer
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    try:
        add_response_schema(tokenizer)
        return tokenizer
    except ValueError:
        pass
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        tokenizer.chat_template = qwen2_5_chat_template
        add_response_schema(tokenizer)
    return tokenizer  # otherwise: replies are read as plain text (no tool calls)


def stop_ids(tokenizer, model=None) -> list[int]:
    """Tokens that end an assistant turn: eos, <|im_end|>-style end markers, generation config's eos."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(text)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None and tid >= 0:
            ids.add(tid)
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tid in (gen if isinstance(gen, list) else [gen]):
        if isinstance(tid, int):
            ids.add(tid)
    return sorted(ids)


def to_template(messages: list[Any]) -> list[dict[str, Any]]:
    """Harness messages as HF chat templates take them (arguments as dicts, tool results with their name)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "name": m.name or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append({"role": "assistant", "content": m.content, "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def parse_reply(tokenizer, ids: list[int], text: str | None, prefix: list[int]) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of one generated reply, the strict reading (rollouts that are trained on or
    scored); unparseable replies are plain text (`text`, else the reply decoded without special tokens).
    `prefix` is the rendered prompt's token ids: the response template needs it to find
    where the assistant turn starts (without it, tool calls come back as plain text).
    A reply that is nothing but a tool-call JSON object ({"name": ..., "arguments": {...}}),
    bare or in a code fence, is a tool call too: small Qwen2.5-Coder models answer that way
    instead of wrapping it in <tool_call> tags."""
    try:
        from trl.chat_template_utils import parse_response

        parsed = parse_response(tokenizer, ids, prefix=prefix)
    except Exception:
        parsed = {"content": tokenizer.decode(ids, skip_special_tokens=True) if text is None else text}
    calls = template_calls(parsed.get("tool_calls"))
    content = str(parsed.get("content") or "")
    if not calls and (bare := bare_tool_calls(content)):
        return "", bare
    return content, calls


def parse_agent_reply(tokenizer, ids: list[int], prefix: list[int], tools: list[dict[str, Any]] | None,
                      call_prefix: str) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of an agent's reply, the lenient reading: through the template's response
    parser; `<tool_call>` blocks it rejects are salvaged as malformed calls (ids `call_prefix`_i), so the
    harness answers them instead of losing them."""
    from trl.chat_template_utils import parse_response

    parsed = parse_response(tokenizer, ids, prefix=prefix, tools=tools or None)
    calls = agent_template_calls(parsed.get("tool_calls"), call_prefix)
    content = str(parsed.get("content") or "")
    if not calls:
        raw = tokenizer.decode(ids, skip_special_tokens=False)
        if "<tool_call>" in raw:
            end = tokenizer.eos_token or ""
            content, calls = salvage_tool_calls(raw.replace(end, ""), call_prefix)
    return content, calls


class HFRenderer:
    """A prepared tokenizer's chat format (see `prepare_tokenizer`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def build_generation_prompt(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        """Token ids of the conversation (template-format dicts; see `to_template`) and the assistant header."""
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def parse_response(self, ids: list[int], prefix: list[int], *, text: str | None = None,
                       agent_prefix: str | None = None,
                       tools: list[dict[str, Any]] | None = None) -> tuple[str, list[ToolCall]]:
        """(content, tool calls) of the reply `ids` sampled after `prefix`. Strict by default (the
        trainer's and the eval's rollouts; `text` = the reply decoded, if the caller has it); with
        `agent_prefix` (the agent's calls' id prefix) the lenient reading, `tools` passed to TRL's parser."""
        if agent_prefix is None:
            return parse_reply(self.tokenizer, ids, text, prefix)
        return parse_agent_reply(self.tokenizer, ids, prefix, tools, agent_prefix)


# ---- the OpenAI chat-completions wire format -----------------------------------------------------


def to_openai(messages: list[Any]) -> list[dict[str, Any]]:
    """Harness messages in the chat-completions wire format (arguments as JSON strings)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            # "" rather than null: llama-cpp-python's server answers a null content with HTTP 500 (it wants a
            # string) and the OpenAI API, vLLM and `transformers serve` accept either.
            out.append({"role": "assistant", "content": m.content or "", "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_text(c.arguments)}}
                for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


class OpenAIRenderer:
    """The chat-completions wire format. `salvage`: a reply without structured calls is searched for
    calls written as text (tags, bare JSON; see parse.salvage_tool_calls)."""

    def __init__(self, salvage: bool = False):
        self.salvage = salvage

    def build_generation_prompt(self, messages: list[Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The request's messages and tools (tool_choice auto when there are tools)."""
        request: dict[str, Any] = {"messages": to_openai(messages)}
        if tools:
            request.update(tools=tools, tool_choice="auto")
        return request

    def parse_response(self, message: Any, call_prefix: str, *,
                       tool_names: set[str] | None = None) -> tuple[str, list[ToolCall]]:
        """(content, tool calls) of a response's message; a call without an id gets `call_prefix`_i."""
        calls = []
        for i, tc in enumerate(getattr(message, "tool_calls", None) or []):
            fn = getattr(tc, "function", None)
            calls.append(ToolCall(id=tc.id or f"{call_prefix}_{i}", name=getattr(fn, "name", None) or "",
                                  arguments=parse_arguments(getattr(fn, "arguments", None))))
        content = message.content or ""
        if not calls and content and self.salvage:
            content, calls = salvage_tool_calls(content, call_prefix, bare_json=True, tool_names=tool_names)
        return content, calls
