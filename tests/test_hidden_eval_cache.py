"""The hidden eval and its base weights: their score computed once per (weights, set, format, numerics),
remembered by the trusted side (the eval itself only reads the cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ait.evals import hidden_eval
from ait.evals.runner import eval_request, evaluate_here, pre_cache_dir
from ait.spec import load_spec
from ait.train.models import resolve_base_model

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain_fast.json"


def run(tmp_path: Path, n: int = 11) -> hidden_eval.EvalReport:
    return evaluate_here(eval_request(load_spec(TASK), resolve_base_model("tiny"), tmp_path, n=n))


def test_pre_is_scored_once_then_read_back(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = hidden_eval.score
    monkeypatch.setattr(hidden_eval, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = run(tmp_path)
    assert len(calls) == 1 and "eval/pre_cached" not in first.seconds
    second = run(tmp_path)
    assert len(calls) == 1 and second.pre == first.pre and second.seconds["eval/pre_cached"] == 1.0
    run(tmp_path, n=12)  # another hidden set: scored afresh
    assert len(calls) == 2


def test_the_cache_is_what_is_reported_and_a_broken_entry_is_rescored(tmp_path: Path, monkeypatch) -> None:
    cache = pre_cache_dir()
    before = set(cache.glob("*.json"))
    first = run(tmp_path, n=13)
    (path,) = set(cache.glob("*.json")) - before
    digests = ["0123456789abcdef"] * 13
    path.write_text(json.dumps({"pre": 0.75, "scores": [1.0] * 9 + [0.0] * 3 + [0.75], "digests": digests}))
    read = run(tmp_path, n=13)  # read back, not recomputed: the per-example scores, digests and their mean
    assert read.pre_scores == [1.0] * 9 + [0.0] * 3 + [0.75] and read.pre == pytest.approx(9.75 / 13)
    assert read.pre_digests == digests
    path.write_text(json.dumps({"pre": 0.75}))  # a mean without its per-example scores: rescored
    assert run(tmp_path, n=13).pre == first.pre
    path.write_text(json.dumps({"pre": 0.5, "scores": [0.5] * 12, "digests": digests[:12]}))  # another set's size
    assert run(tmp_path, n=13).pre_scores == first.pre_scores
    path.write_text(json.dumps({"pre": 0.5, "scores": [0.5] * 13, "digests": ["../x"] * 13}))  # not digests
    assert run(tmp_path, n=13).pre_digests == first.pre_digests
    path.write_text("{not json")
    again = run(tmp_path, n=13)
    assert again.pre == first.pre and "eval/pre_cached" not in again.seconds
    assert json.loads(path.read_text()) == {"pre": first.pre, "scores": first.pre_scores,
                                            "digests": first.pre_digests}
    assert len(first.pre_scores) == 13 and first.pre == pytest.approx(sum(first.pre_scores) / 13)


def test_the_cache_file_is_named_by_the_trusted_side_only(tmp_path: Path) -> None:
    """The eval (sandboxed) says which key its pre belongs to; a key this code never makes is ignored,
    so the eval cannot make the trusted side write a file of its choosing."""
    from ait.evals.runner import remember_pre

    before = set(pre_cache_dir().iterdir())
    d = "0123456789abcdef"
    remember_pre(pre_cache_dir(), "../../hidden_secret", [0.5], [d])
    remember_pre(pre_cache_dir(), "a" * 32, [1.5], [d])
    remember_pre(pre_cache_dir(), "a" * 32, [float("nan")], [d])
    remember_pre(pre_cache_dir(), "a" * 32, [0.5], ["../../etc/passwd"])
    assert set(pre_cache_dir().iterdir()) == before
    remember_pre(pre_cache_dir(), "a" * 32, [0.5, 1.0], [d, d])
    assert json.loads((pre_cache_dir() / ("a" * 32 + ".json")).read_text()) == \
        {"pre": 0.75, "scores": [0.5, 1.0], "digests": [d, d]}


def test_a_change_to_the_scoring_code_is_a_new_cache_key(tmp_path: Path, monkeypatch) -> None:
    """A scorer fix must never meet a pre score cached before it."""
    calls = []
    real = hidden_eval.score
    monkeypatch.setattr(hidden_eval, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    run(tmp_path, n=14)
    run(tmp_path, n=14)
    assert len(calls) == 1
    monkeypatch.setattr(hidden_eval, "scoring_code_digest", lambda: "a scorer fixed since")
    run(tmp_path, n=14)
    assert len(calls) == 2


@pytest.mark.parametrize("changed", ["families/calc_chain.py", "evals/rollout.py", "chat/parse.py", "chat/renderers.py", "chat/types.py",
                                     "train/decode.py", "train/decode_cache.py", "train/decode_sample.py", "spec.py",
                                     "contract.py"])
def test_the_code_digest_covers_everything_that_decides_a_score(tmp_path: Path, changed: str) -> None:
    """The scorer, the rollout and chat-format helpers, the sampler, the spec and eval-format models: a change
    to any is a miss."""
    import shutil

    root = Path(hidden_eval.__file__).resolve().parents[1]
    copy = tmp_path / "ait"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = hidden_eval.scoring_code_digest(copy)
    assert before == hidden_eval.scoring_code_digest(root)
    (copy / changed).write_text((copy / changed).read_text() + "\n# a fix\n")
    assert hidden_eval.scoring_code_digest(copy) != before
    assert "cli/episode.py" not in {p.relative_to(copy).as_posix() for p in hidden_eval.scoring_modules(copy)}


def test_a_library_upgrade_is_a_new_cache_key(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = hidden_eval.score
    monkeypatch.setattr(hidden_eval, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    run(tmp_path, n=15)
    run(tmp_path, n=15)
    assert len(calls) == 1
    versions = hidden_eval.library_versions()
    assert {"torch", "transformers", "tokenizers", "trl", "safetensors"} <= set(versions)
    monkeypatch.setattr(hidden_eval, "library_versions", lambda: {**versions, "trl": "99.0"})
    run(tmp_path, n=15)
    assert len(calls) == 2


def test_other_weights_are_a_new_cache_key(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = hidden_eval.score
    monkeypatch.setattr(hidden_eval, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = resolve_base_model("tiny")
    evaluate_here(eval_request(load_spec(TASK), model, tmp_path, n=16))
    evaluate_here(eval_request(load_spec(TASK), model.model_copy(update={"sha256": "0" * 64}), tmp_path, n=16))
    assert len(calls) == 2
