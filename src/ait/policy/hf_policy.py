"""A local Hugging Face model as a policy, recording what the outer loop needs to train it.

Each turn renders the conversation with the model's own chat template (the harness's
tools included), samples a reply at `temperature` (no top-k / top-p, so the recorded
logprobs are exactly those of the distribution sampled from), parses tool calls with the
template's response parser, and returns the reply with its prompt ids, sampled ids and
per-token logprobs.

Sampling goes through the decoding engine (ait.train.decode_batch.SamplingEngine: static KV
cache, CUDA graphs on a GPU). A policy makes its own engine unless it is handed one: policies
that share a model (the episodes of `ait eval`, the outer loop's EnginePolicy) share its engine
and have their replies decoded together, each from its own seeded generator, so a reply depends
on the seed and the weights only. `close` stops an engine the policy made itself.
`sampler="generate"` (or a model whose cache the engine cannot hold, e.g. sliding-window
attention) samples through transformers' `generate` instead, one reply at a time.

When the prompt outgrows the context, the oldest tool results are shortened first; if it
still does not fit, the episode stops as context_full.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ait.chat.renderers import HFRenderer, to_template
from ait.chat.types import ToolCall
from ait.harness.types import Message, PolicyStop, StopReason, TokenTrace
from ait.metering import Usage
from ait.spec import TaskSpec

TRUNCATED = "[older tool result shortened to fit the model's context: {n} characters]"
PREFIX_CACHE_GIB = 4.0
"""Host memory the policy's own engine keeps ended replies' KV in: a turn prefills only what is new."""


class HFPolicy:
    def __init__(self, model: str, *, temperature: float = 0.7, max_new_tokens: int = 512,
                 max_context: int | None = None, seed: int | None = 0, device: str | None = None,
                 loaded: tuple[Any, Any] | None = None, sampler: str = "engine", engine: Any = None):
        """`loaded` = (model, tokenizer) already in memory (the outer loop's weights): nothing is read
        from disk and `model` is only the name; the tokenizer must have been through prepare_tokenizer.
        `engine`: the SamplingEngine to sample through (default: one of its own, which `close` stops);
        `sampler="generate"`: transformers' generate instead."""
        if sampler not in ("engine", "generate"):
            raise ValueError(f"sampler is engine or generate, not {sampler!r}")
        import torch

        if loaded is not None:
            self.model, self.tokenizer = loaded
            self.device = str(self.model.device)
            path = getattr(self.model, "name_or_path", model)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from ait.chat.renderers import prepare_tokenizer
            from ait.train.models import resolve_base_model

            resolved = resolve_base_model(model)  # tiny, a local directory, or a hub id (safetensors only)
            path = resolved.path
            self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
            self.tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path, trust_remote_code=False))
            from ait.train.attention import grouped_attention_name

            # No KV-cache copy per query head at each masked decode step (ait.train.attention).
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True,
                                                              trust_remote_code=False,
                                                              attn_implementation=grouped_attention_name()
                                                              ).to(self.device).eval()
        self.name = f"hf:{model}"
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        self.max_context = max_context or context_length(self.model, self.tokenizer)
        self.settings = {"model": model, "path": path, "temperature": temperature,
                         "max_new_tokens": max_new_tokens, "max_context": self.max_context, "seed": seed}
        self.turn = 0
        self.owns_engine = engine is None and sampler == "engine"
        if self.owns_engine:
            from ait.train.decode_batch import SamplingEngine

            engine = SamplingEngine(self.model, self.tokenizer, prefix_cache_gib=PREFIX_CACHE_GIB)
        self.engine = engine
        self.settings["sampler"] = "engine" if engine is not None else "generate"

    def close(self) -> None:
        """Stop the engine this policy made (one it was handed belongs to whoever made it). An engine
        left running at interpreter exit may still be inside a torch op, which aborts the process."""
        if self.owns_engine and self.engine is not None:
            self.engine.close()

    def reset(self, spec: TaskSpec) -> None:
        import torch

        self.turn = 0
        # The same episode samples the same replies: its own generator (the engine), the global one (generate).
        seed = int(self.seed) if self.seed is not None else int(torch.randint(2**62, ()).item())
        self.generator = torch.Generator(device=self.model.device)
        self.generator.manual_seed(seed)
        if self.seed is not None:
            torch.manual_seed(self.seed)

    def _tokenizer_lock(self):
        """A fast tokenizer is not safe to call from several threads: policies sharing an engine share its lock."""
        engine = getattr(self, "engine", None)
        return engine.tokenizer_lock if engine is not None else contextlib.nullcontext()

    def act(self, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        self.turn += 1
        prompt_ids, truncated = self.fit(messages, tools)
        t0 = time.monotonic()
        ids, logprobs = self.sample(prompt_ids)
        latency = time.monotonic() - t0
        content, calls = self.parse(prompt_ids, ids, tools)
        usage = Usage(model=self.name, prompt_tokens=len(prompt_ids), completion_tokens=len(ids), usd=0.0,
                      usd_source="local", latency_s=latency)
        tokens = TokenTrace(prompt_ids=prompt_ids, completion_ids=ids, logprobs=logprobs,
                            temperature=self.temperature, truncated_tool_results=truncated)
        return Message(role="assistant", content=content, tool_calls=calls, usage=usage, tokens=tokens)

    def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        with self._tokenizer_lock():
            return HFRenderer(self.tokenizer).build_generation_prompt(to_template(messages), tools)

    def fit(self, messages: list[Message], tools: list[dict[str, Any]]) -> tuple[list[int], int]:
        """Prompt ids leaving room for a full reply: shorten tool results oldest first, else stop."""
        room = self.max_context - self.max_new_tokens
        messages = list(messages)
        ids = self.render(messages, tools)
        shortened = 0
        for i, m in enumerate(messages):
            if len(ids) <= room:
                break
            if m.role == "tool" and not m.content.startswith("[older tool result"):
                messages[i] = m.model_copy(update={"content": TRUNCATED.format(n=len(m.content))})
                shortened += 1
                ids = self.render(messages, tools)
        if len(ids) > room:
            raise PolicyStop(StopReason.context_full,
                             f"{self.name}: the prompt is {len(ids)} tokens with every older tool result shortened; "
                             f"the model's context of {self.max_context} leaves {room} after {self.max_new_tokens} "
                             "for the reply")
        return ids, shortened

    def sample(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        if self.engine is not None:
            if not hasattr(self, "generator"):
                self.reset(None)  # type: ignore[arg-type]
            try:
                return self.engine.sample(prompt_ids, self.temperature, self.max_new_tokens, self.generator)
            except NotImplementedError:  # a model whose KV cache the engine cannot hold: generate from now on
                self.engine = None
                self.settings["sampler"] = "generate"
        return self.generate(prompt_ids)

    def generate(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        """One reply through transformers' generate (the fallback sampler)."""
        import torch

        tok = self.tokenizer
        inputs = torch.tensor([prompt_ids], device=self.model.device)
        greedy = self.temperature <= 0
        sampling = {} if greedy else {"temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        with torch.no_grad():
            out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), do_sample=not greedy,
                                      max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id, output_scores=True,
                                      return_dict_in_generate=True, **sampling)
        ids = out.sequences[0, len(prompt_ids):]
        # `scores` are the processed logits each token was drawn from (temperature applied).
        scores = torch.stack(out.scores[:len(ids)], dim=0)[:, 0, :].float()
        logprobs = torch.log_softmax(scores, dim=-1).gather(1, ids[:, None])[:, 0]
        return ids.tolist(), logprobs.tolist()

    def parse(self, prompt_ids: list[int], ids: list[int],
              tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]]:
        """(content, tool calls): the chat format's lenient (agent) reading, the renderer the trainer and
        the hidden eval read their rollouts with; tool-call blocks the template parser rejects are
        salvaged as malformed calls, so the harness answers them instead of losing them."""
        with self._tokenizer_lock():
            return HFRenderer(self.tokenizer).parse_response(ids, prompt_ids, agent_prefix=f"call_{self.turn}",
                                                             tools=tools)


def context_length(model: Any, tokenizer: Any) -> int:
    """The model's usable context: its position limit, or the tokenizer's when that is smaller and sane."""
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < limit:
        limit = declared
    return int(limit)
