"""One renderer per chat format: the inner trainer, the hidden eval, the probe's dry run and the HF policy
read a model's replies through ait.chat.renderers.HFRenderer, and the OpenAI policy through
OpenAIRenderer, so the trainer and the eval cannot drift apart from what the agent is parsed with.
(The parsers' behaviour is pinned in test_rollout, test_deep_json, test_openai_policy, test_hf_policy.)"""

from __future__ import annotations

import ast
import contextlib
import inspect
from pathlib import Path
from types import SimpleNamespace

from transformers import AutoTokenizer

import ait.chat.renderers as renderers
import ait.evals.rollout as eval_rollout
import ait.policy.hf_policy as hf_policy
import ait.policy.openai_policy as openai_policy
import ait.probe.dry_run as dry_run
import ait.train.rollouts as train_rollouts
from ait.chat.types import ToolCall
from ait.families import get_family
from ait.families.base import ToolCall as FamilyToolCall
from ait.harness.types import ToolCallRequest
from ait.train.tiny import tiny_model_path

SRC = Path(renderers.__file__).resolve().parents[1]


def test_trainer_eval_probe_and_hf_policy_share_one_renderer() -> None:
    assert train_rollouts.HFRenderer is eval_rollout.HFRenderer is hf_policy.HFRenderer is renderers.HFRenderer
    assert openai_policy.OpenAIRenderer is renderers.OpenAIRenderer
    assert "HFRenderer(tokenizer).parse_response" in inspect.getsource(dry_run.dry_run)


def test_no_module_outside_ait_chat_parses_replies_itself() -> None:
    """TRL's response parser and the call readers are imported by ait.chat only: a second parser
    elsewhere is how the trainer and the eval drifted from the agent before."""
    readers = {"parse_response", "parse_reply", "bare_tool_calls", "salvage_tool_calls", "json_tool_calls",
               "template_calls", "agent_template_calls", "call_from_json", "call_object"}
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "chat":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and readers & {a.name for a in node.names}:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
            if isinstance(node, ast.FunctionDef) and node.name in readers:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} defines {node.name}")
    assert offenders == []


def test_one_tool_call_type() -> None:
    assert ToolCallRequest is ToolCall and FamilyToolCall is ToolCall


def test_the_eval_and_the_hf_policy_call_the_same_parse_response(monkeypatch) -> None:
    seen = []
    real = renderers.HFRenderer.parse_response

    def spy(self, ids, prefix, **options):
        seen.append("agent" if options.get("agent_prefix") else "strict")
        return real(self, ids, prefix, **options)

    monkeypatch.setattr(renderers.HFRenderer, "parse_response", spy)
    tok = renderers.prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_model_path()))
    family = get_family("calc_chain")
    import random

    example = family.example(random.Random(0), family.difficulty())
    fmt = family.eval_format(family.difficulty())
    reply = tok("The answer is 4.<|im_end|>", add_special_tokens=False)["input_ids"]
    eval_rollout.run_conversations(None, tok, family, fmt, [example], generate=lambda ps, n: [reply for _ in ps])
    assert seen == ["strict"]
    policy = SimpleNamespace(tokenizer=tok, turn=1, _tokenizer_lock=contextlib.nullcontext)
    content, calls = hf_policy.HFPolicy.parse(policy, [1, 2], reply, [])
    assert seen == ["strict", "agent"] and calls == []
