"""The probe's dry-run rollout: the agent's environment driven by the tiny model, as TRL will.

Two dataset rows are rendered with the model's chat template and the agent's tools (the
same schema path TRL's GRPOTrainer uses), generated from, parsed for tool calls, the
calls run on fresh Environment instances, and the reward functions scored on the
result. It runs inside the probe's sandbox, on weights the parent resolved.
"""

from __future__ import annotations

import json
from typing import Any

from ait.job.env_loader import EnvSurface, call_reward

MAX_NEW_TOKENS = 16
_LOADED: dict[str, tuple[Any, Any]] = {}


def load(model_path: str):
    """(model, tokenizer), cached: a zygote loads and warms them once, its children reuse them."""
    if model_path not in _LOADED:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from ait.chat.renderers import prepare_tokenizer

        hf_logging.disable_progress_bar()

        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_path))
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        _LOADED[model_path] = (model, tokenizer)
    return _LOADED[model_path]


def zygote_warmup() -> None:
    """Called by ait.sandbox.zygote after import: load the tiny model and run one generation,
    so forked probes skip torch's first-call initialisation. One intra-op thread: an OpenMP
    pool started before fork() deadlocks the forked child, and a 2-layer model gains nothing
    from threads anyway."""
    import os

    import torch

    path = os.environ.get("AIT_ZYGOTE_TINY")
    if path:
        torch.set_num_threads(1)
        model, tokenizer = load(path)
        ids = tokenizer("warm up", return_tensors="pt")
        with torch.no_grad():
            model.generate(**ids, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)


def dry_run(surface: EnvSurface, rows: list[dict], model_path: str, env_path) -> dict[str, Any]:
    """Returns {"ok": bool, "error": str | None, "sample": str}; never raises."""
    from ait.job.env_loader import describe_exception

    try:
        import torch

        from ait.chat.renderers import HFRenderer

        model, tokenizer = load(model_path)
    except Exception as e:  # our side, not the agent's: report it as such
        return {"ok": True, "error": None, "sample": f"(dry run skipped: tiny model unavailable: {e})"}
    sample = ""
    for row in rows[:2]:
        step = "building the chat prompt with your tools"
        try:
            env = surface.env_class()
            if hasattr(env, "reset"):
                step = "Environment.reset"
                env.reset(row.get("info") or {})
            tools = [getattr(env, name) for name in surface.tools]
            messages = [{"role": "system", "content": surface.system_prompt},
                        {"role": "user", "content": row["prompt"]}]
            step = "rendering the chat template with your tools"
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            reply_ids = out[0, ids["input_ids"].shape[1]:].tolist()
            # The strict reading the trainer's rollouts use: the dry run shows what training will see.
            content, calls = HFRenderer(tokenizer).parse_response(reply_ids, ids["input_ids"][0].tolist())
            for call in calls:
                step = f"tool call {call.name}"
                if call.name in surface.tools:
                    getattr(env, call.name)(**call.arguments)
            for fn in surface.reward_funcs:
                step = f"reward {getattr(fn, '__name__', 'reward')}"
                call_reward(fn, content, str(row["answer"]), row.get("info") or {},
                            messages + [{"role": "assistant", "content": content}])
            sample = json.dumps(content[:120])
        except Exception as e:
            return {"ok": False, "error": f"{step} failed: {describe_exception(e, env_path)}", "sample": sample}
    return {"ok": True, "error": None, "sample": sample}
