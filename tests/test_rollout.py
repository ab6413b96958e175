"""The hidden eval's rollout loop: tool calls are parsed, executed with the family's tools, and fed back."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoTokenizer

from ait.chat.parse import bare_tool_calls
from ait.chat.renderers import parse_reply, prepare_tokenizer
from ait.evals.rollout import final_response, run_conversations
from ait.families import FAMILIES, get_family
from ait.train.tiny import tiny_model_path


def tokenizer():
    return prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_model_path()))


def test_tool_calls_in_a_reply_are_parsed():
    tok = tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "3*4?"}], tokenize=False, add_generation_prompt=True)
    reply = '<tool_call>\n{"name": "calculator", "arguments": {"a": 3, "op": "*", "b": 4}}\n</tool_call><|im_end|>'
    ids = tok(reply, add_special_tokens=False)["input_ids"]
    content, calls = parse_reply(tok, ids, reply, tok(prompt, add_special_tokens=False)["input_ids"])
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"a": 3, "op": "*", "b": 4})]


@pytest.mark.parametrize("text,expected", [
    ('{"name": "lookup", "arguments": {"id": 3}}', [("lookup", {"id": 3})]),
    ('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]', [("a", {}), ("b", {"x": 1})]),
    # several objects one per line (how small models write parallel calls), fenced or not
    ('{"name": "a", "arguments": {"x": 1}}\n{"name": "b", "arguments": {"y": "}{"}}', [("a", {"x": 1}), ("b", {"y": "}{"})]),
    ('```json\n{"name": "a", "arguments": {}}\n\n{"name": "a", "arguments": {"k": 2}}\n```', [("a", {}), ("a", {"k": 2})]),
    # what Qwen2.5-Coder-0.5B writes: the schema's required list and return spec copied into the call,
    # and the result it imagines after it (dropped: the real result replaces it)
    ('{"name": "get", "arguments": {"account": "cash", "required": ["account"]}}\n{"response": "1061"}',
     [("get", {"account": "cash"})]),
    ('{"name": "a", "arguments": {"index": 1, "required": ["index"]}, "return": {"type": "string"}}', [("a", {"index": 1})]),
    # a "required" that is not an echo of the call's own keys is an argument, kept
    ('{"name": "a", "arguments": {"required": ["x", "y"]}}', [("a", {"required": ["x", "y"]})]),
    ('{"name": "a", "arguments": {"required": true}}', [("a", {"required": True})]),
    # anything else is prose, not calls: nothing is half-read
    ('{"name": "a", "arguments": {}}\nThe answer is 4', []),
    ('{"name": "a", "arguments": {}}\n{"name": "b"}', []),
    ('{"response": "4"}', []),
    ('{"name": "a", "arguments": {}, "extra": 1}', []),
    ('{"name": "a", "arguments": {}} {"name": 5, "arguments": {}}', []),
    ('[[{"name": "a", "arguments": {}}]]', []),
    ("", []),
    ("answer: 12", []),
])
def test_bare_json_tool_calls(text, expected):
    assert [(c.name, c.arguments) for c in bare_tool_calls(text)] == expected


class ScriptedModel:
    """Stands in for a causal LM's generator: emits the gold tool calls, then the answer, as token ids."""

    def __init__(self, tok, replies):
        self.tok, self.replies = tok, iter(replies)

    def __call__(self, prompts, max_new_tokens):
        return [self.tok(next(self.replies), add_special_tokens=False)["input_ids"] for _ in prompts]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_model_that_calls_the_tools_gets_full_marks(name):
    """Every family, end to end through the eval's loop: gold tool calls as model output are
    parsed, run on the example's world with the family's tools, and the answer scores 1."""
    family = get_family(name)
    difficulty = family.difficulty()
    fmt = family.eval_format(difficulty)
    tok = tokenizer()
    for seed in range(3):
        example = family.example(random.Random(seed), difficulty)
        trace = family.gold_trace(example)
        assert len(trace) + 1 <= fmt.max_turns
        replies = [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call><|im_end|>"
                   for c in trace] + [f"Done.\nAnswer: {example.answer}<|im_end|>"]
        convs = run_conversations(None, tok, family, fmt, [example], generate=ScriptedModel(tok, replies))
        tool_results = [m["content"] for m in convs[0] if m["role"] == "tool"]
        assert len(tool_results) == len(trace) and not any(r.startswith("error:") for r in tool_results), tool_results
        assert family.score(final_response(convs[0]), example.answer) == 1.0


def gold_oracle(tok, family, examples):
    """Each conversation's next scripted reply from its prompt alone (which example, how many turns so far):
    the same replies whatever order or batch the turns come in."""
    scripts = {ex.prompt: [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call><|im_end|>"
                           for c in family.gold_trace(ex)] + [f"Done.\nAnswer: {ex.answer}<|im_end|>"]
               for ex in examples}

    def reply(prompt_ids, max_new_tokens):
        text = tok.decode(prompt_ids)
        [script] = [s for p, s in scripts.items() if p in text]
        turn = text.count("<|im_start|>assistant") - 1  # the generation prompt opens one more
        return tok(script[min(turn, len(script) - 1)], add_special_tokens=False)["input_ids"][:max_new_tokens]
    return reply


class OracleDecoder:
    """The decoding engine's continuous API (submit, step, Decoder.run's loop) answering from an oracle;
    one request finishes a step, the newest first, so turns interleave unlike any lock-step order."""

    def __init__(self, oracle):
        self.oracle, self.waiting, self.order = oracle, [], []

    check_every, generator = 1, None

    @property
    def busy(self):
        return bool(self.waiting)

    def submit(self, requests):
        self.waiting += list(requests)

    def step(self):
        r = self.waiting.pop()
        r.ids = self.oracle(r.prompt, r.max_new_tokens)
        self.order.append(r.tag[0])
        return [r]

    def abort(self):
        self.waiting = []

    from ait.train.decode import Decoder
    run = Decoder.run


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_continuous_turns_give_the_lock_step_conversations(name):
    """Every family: conversations whose turns join the running batch as their tool results come in
    are the conversations the lock-step loop writes, turn for turn, and score full marks."""
    family = get_family(name)
    difficulty = family.difficulty()
    fmt = family.eval_format(difficulty)
    tok = tokenizer()
    examples = [family.example(random.Random(seed), difficulty) for seed in range(4)]
    oracle = gold_oracle(tok, family, examples)
    lock = run_conversations(None, tok, family, fmt, examples, batch_size=2,
                             generate=lambda prompts, n: [oracle(p, n) for p in prompts])
    decoder = OracleDecoder(oracle)
    cont = run_conversations(None, tok, family, fmt, examples, decoder=decoder)
    assert cont == lock
    assert all(family.score(final_response(c), ex.answer) == 1.0 for c, ex in zip(cont, examples))
    if any(family.gold_trace(ex) for ex in examples):
        assert decoder.order != sorted(decoder.order)  # the turns really interleaved


def test_the_real_decoder_gives_the_same_conversations_either_way():
    """Greedy on a real (tiny) model through ait.train.decode: continuous and lock step agree."""
    import torch
    from transformers import AutoModelForCausalLM

    from ait.chat.renderers import stop_ids
    from ait.train.decode import Decoder

    family = get_family("ledger")
    difficulty = family.difficulty()
    fmt = family.eval_format(difficulty).model_copy(update={"max_new_tokens": 24, "max_turns": 3})
    tok = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    examples = [family.example(random.Random(seed), difficulty) for seed in range(5)]
    cont = run_conversations(model, tok, family, fmt, examples, batch_size=3)
    decoder = Decoder(model, stop_ids=stop_ids(tok, model), pad_id=tok.pad_token_id)
    lock = run_conversations(model, tok, family, fmt, examples, batch_size=3,
                             generate=lambda prompts, n: [s.ids for s in decoder.generate(prompts, n, temperature=0.0)])
    assert cont == lock and all(c[-1]["role"] in ("assistant", "tool") for c in cont)
