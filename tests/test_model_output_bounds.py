"""What the trained model writes is the job's outcome: a reply no tool, tokenizer or scorer can read
scores nothing; it never fails the hidden eval as if the infrastructure had (an agent could then
veto any episode it expects to lose, by training its model to write that reply)."""

from __future__ import annotations

import random
import time

import pytest
from transformers import AutoTokenizer

from ait.evals.hidden_eval import safe_score
from ait.evals.rollout import final_response, run_conversations
from ait.families import FAMILIES, get_family
from ait.train.chat_format import prepare_tokenizer
from ait.train.tiny import tiny_model_path


class Replies:
    """A generator that writes the same reply every turn, as token ids."""

    def __init__(self, tok, reply: str):
        self.ids = tok(reply, add_special_tokens=False)["input_ids"]

    def __call__(self, prompts, max_new_tokens):
        return [self.ids for _ in prompts]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_lone_surrogate_in_a_tool_call_does_not_break_the_next_turns_prompt(name):
    family = get_family(name)
    difficulty = family.difficulty()
    fmt = family.eval_format(difficulty)
    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_model_path()))
    tool = family.tools(family.example(random.Random(0), difficulty).world)[0].__name__
    # JSON escapes decode to a lone surrogate; echoed back in the tool's error, it reached the tokenizer
    reply = '{"name": "%s", "arguments": {"op": "\\ud800", "account": "\\ud800", "x": "\\udfff"}}<|im_end|>' % tool
    example = family.example(random.Random(1), difficulty)
    convs = run_conversations(None, tok, family, fmt, [example], generate=Replies(tok, reply))
    assert sum(m["role"] == "tool" for m in convs[0]) == fmt.max_turns  # every turn ran
    for m in convs[0]:
        for text in (m.get("content") or "", str(m.get("tool_calls") or "")):
            text.encode("utf-8")  # nothing unencodable was kept
    assert safe_score(family, final_response(convs[0]), example.answer) == 0.0


@pytest.mark.parametrize("answer", ["1e999999999", "9" * 5000, "-1e-999999999", "\ud800", "1" * 100_000])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_no_final_answer_breaks_or_stalls_a_scorer(name, answer):
    family = get_family(name)
    example = family.example(random.Random(2), family.difficulty())
    start = time.monotonic()
    assert safe_score(family, f"Answer: {answer}", example.answer) == 0.0
    assert time.monotonic() - start < 2.0


def test_calc_chains_calculator_refuses_a_huge_exponent_at_once():
    from ait.families.calc_chain import calculator, normalize_number
    from ait.job.task_tools.calc_chain import Environment

    start = time.monotonic()
    assert calculator("1e999999999", "+", 1).startswith("error:")
    assert calculator(1, "*", "1" + "0" * 5000).startswith("error:")
    assert normalize_number("1e999999999") is None and normalize_number("-2.5e3") == "-2500"
    assert time.monotonic() - start < 1.0
    assert Environment().calculator("1e999", "+", 1).startswith("error:")  # inf, not an OverflowError


def test_a_scorer_that_raises_or_returns_nonsense_scores_zero():
    class Broken:
        def __init__(self, value):
            self.value = value

        def score(self, response, answer):
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    assert safe_score(Broken(ValueError("Exceeds the limit (4300 digits)")), "x", "y") == 0.0
    assert safe_score(Broken(float("nan")), "x", "y") == 0.0
    assert safe_score(Broken(7.0), "x", "y") == 1.0 and safe_score(Broken(1.0), "x", "y") == 1.0
