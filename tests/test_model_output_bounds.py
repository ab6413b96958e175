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
from ait.chat.renderers import prepare_tokenizer
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
    assert time.monotonic() - start < 10.0  # a scorer that parses 1e999999999 runs for minutes


def test_calc_chains_calculator_refuses_a_huge_exponent_at_once():
    from ait.families.calc_chain import normalize_number
    from ait.job.task_tools.calc_chain import Environment, calculator

    start = time.monotonic()
    assert calculator("1e999999999", "+", 1).startswith("error:")
    assert calculator(1, "*", "1" + "0" * 5000).startswith("error:")
    assert normalize_number("1e999999999") is None and normalize_number("-2.5e3") == "-2500"
    assert time.monotonic() - start < 10.0  # a calculator that computes the power runs for minutes
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


def test_a_checkpoint_padded_past_its_base_model_is_refused_before_it_is_loaded(tmp_path):
    """Extra safetensors files of many zero-size tensors: the eval read every header whole and was
    killed for memory (an infra error). Counted against the base model first, they are refused as
    the job's checkpoint, which is the job's fault."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from ait.evals.hidden_eval import CheckpointError, apply_checkpoint, checkpoint_bounds, load_checkpoint_tensors

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    bounds = checkpoint_bounds(model)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(ckpt / "model.safetensors"))
    assert apply_checkpoint(model, load_checkpoint_tensors(ckpt, bounds)) is False  # an honest one loads
    save_file({f"pad.{i}": torch.zeros(0) for i in range(bounds.tensors + 1)}, str(ckpt / "pad.safetensors"))
    with pytest.raises(CheckpointError, match="more than the base model can"):
        load_checkpoint_tensors(ckpt, bounds)
    (ckpt / "pad.safetensors").unlink()
    (ckpt / "zhuge.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")  # claims a 1 TiB header
    with pytest.raises(CheckpointError, match="header"):
        load_checkpoint_tensors(ckpt, bounds)


class Finished:
    """A started eval process that has already ended the given way."""

    def __init__(self, outcome):
        self.outcome = outcome

    def finish(self, timeout_s, stdin_line=None):
        return self.outcome


@pytest.mark.parametrize("returncode,timed_out", [(-9, False), (1, False), (None, True)])
def test_an_eval_that_dies_on_the_trained_checkpoint_is_the_jobs_failure(tmp_path, returncode, timed_out):
    """Killed for memory, crashed or out of time after it turned to the checkpoint: the job's; the
    same before (loading the base model, scoring pre): the infrastructure's."""
    from ait.evals.hidden_eval import PHASE_NAME
    from ait.evals.runner import EvalFailed, finish_eval
    from ait.sandbox.process import RunOutcome

    outcome = RunOutcome(returncode, timed_out, 5.0, "Killed")
    for phase, jobs in ((None, False), ("post", True)):
        eval_dir = tmp_path / f"eval-{phase}-{returncode}"
        eval_dir.mkdir()
        if phase:
            (eval_dir / PHASE_NAME).write_text(phase)
        with pytest.raises(EvalFailed) as failed:
            finish_eval(Finished(outcome), None, eval_dir)
        assert failed.value.job_fault is jobs and ("on the trained checkpoint" in str(failed.value)) is jobs


def test_an_eval_out_of_memory_is_classed_oom_so_a_packed_job_is_rerun_alone(tmp_path, monkeypatch):
    """On an 80 GB card beside the agent and packed jobs a 2 GB eval's allocation failed and the job
    was scored as an infrastructure error; it exits EXIT_EVAL_OOM now, which the runner names oom."""
    import torch

    from ait.evals import hidden_eval
    from ait.evals.runner import EXIT_EVAL_OOM, EvalFailed, finish_eval
    from ait.sandbox.process import RunOutcome

    assert hidden_eval.EXIT_EVAL_OOM == EXIT_EVAL_OOM
    request = tmp_path / "req.json"
    request.write_text("{}")
    monkeypatch.setattr(hidden_eval.EvalRequest, "model_validate_json", classmethod(lambda cls, text: None))
    for error in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 62.00 MiB"), MemoryError()):
        def evaluate(req, error=error):
            raise error
        monkeypatch.setattr(hidden_eval, "evaluate", evaluate)
        assert hidden_eval.main([str(request)]) == EXIT_EVAL_OOM
    # A CUDA fault is still a fault, not memory.
    monkeypatch.setattr(hidden_eval, "evaluate", lambda req: (_ for _ in ()).throw(RuntimeError("CUDA error: illegal")))
    assert hidden_eval.main([str(request)]) == hidden_eval.EXIT_GPU_FAULT

    with pytest.raises(EvalFailed) as failed:
        finish_eval(Finished(RunOutcome(EXIT_EVAL_OOM, False, 5.0, "ait: out of GPU memory during the eval")), None, tmp_path)
    assert failed.value.oom and not failed.value.job_fault and not failed.value.gpu_fault
