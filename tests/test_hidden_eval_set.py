"""The hidden eval set: size, distinctness, determinism under a fixed secret, separation from
the dev examples, the on-disk secret, the committed calc_chain TaskSpec, and load_spec errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ait.evals.hidden import eval_fingerprint, hidden_examples
from ait.families import get_family
from ait.home import hidden_secret
from ait.spec import SpecError, TaskSpec, build_spec, load_spec

REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "examples" / "tasks" / "calc_chain.json"
FAMILY = get_family("calc_chain")
SECRET = "hidden-eval-test-secret-0001"

# n_ops=1, operands 2..6, '+' only: 5 starts x 3 phrasings x 5 operands = 75 possible prompts.
TINY = {"n_ops": 1, "operand_min": 2, "operand_max": 6, "operators": "+"}
TINY_SPACE = {
    f"Start with {a}. {phrase.format(b=b)}. What is the final result?"
    for a in range(2, 7)
    for b in range(2, 7)
    for phrase in ("Add {b}", "Increase it by {b}", "Add another {b}")
}


@pytest.fixture
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.setenv("AIT_HIDDEN_SEED", SECRET)
    monkeypatch.delenv("AIT_BASELINES", raising=False)
    return tmp_path


@pytest.fixture
def spec() -> TaskSpec:
    return load_spec(SPEC_PATH)


def dumps(exs) -> list[dict]:
    return [e.model_dump() for e in exs]


# ---------------------------------------------------------------- size, distinctness, determinism


def test_hidden_set_has_200_distinct_examples(home, spec):
    exs = hidden_examples(spec)
    assert spec.hidden_eval_size == 200
    assert len(exs) == 200
    assert len({e.prompt for e in exs}) == 200
    d = FAMILY.difficulty(spec.difficulty)
    for e in exs:
        assert len(e.world["steps"]) == d.n_ops  # generated at the spec's difficulty
        assert e.answer == str(int(e.answer))


def test_explicit_n_overrides_spec_size(home, spec):
    assert len(hidden_examples(spec, 17)) == 17
    small = spec.model_copy(update={"hidden_eval_size": 30})
    assert len(hidden_examples(small)) == 30


def test_hidden_set_is_deterministic_for_a_fixed_secret(home, spec):
    a = hidden_examples(spec)
    b = hidden_examples(load_spec(SPEC_PATH))
    assert dumps(a) == dumps(b)
    assert eval_fingerprint(spec) == eval_fingerprint(load_spec(SPEC_PATH))


def test_different_secret_gives_a_different_set(home, spec, monkeypatch):
    a = {e.prompt for e in hidden_examples(spec)}
    fp_a = eval_fingerprint(spec)
    monkeypatch.setenv("AIT_HIDDEN_SEED", SECRET + "-other")
    b = {e.prompt for e in hidden_examples(spec)}
    assert len(a & b) < 20, "a different secret gave (almost) the same hidden set"
    assert eval_fingerprint(spec) != fp_a


def test_hidden_set_is_not_the_public_dev_stream(home, spec):
    """The hidden rng must not be the public dev seed (or seed 0): nothing an agent can rebuild."""
    exs = hidden_examples(spec)
    for public_seed in (0, 1, 42, 1000):
        public = build_spec("calc_chain", constraints=spec.constraints, n_dev=200, dev_seed=public_seed)
        assert len({e.prompt for e in exs} & {d.prompt for d in public.dev_examples}) < 10


def test_fingerprint_changes_with_secret_difficulty_and_n(home, spec, monkeypatch):
    fp = eval_fingerprint(spec)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert SECRET not in fp
    assert eval_fingerprint(spec) == fp
    assert eval_fingerprint(spec, 200) == fp  # n defaults to hidden_eval_size
    assert eval_fingerprint(spec, 100) != fp
    harder = spec.model_copy(update={"difficulty": {**spec.difficulty, "n_ops": 4}})
    assert eval_fingerprint(harder) != fp
    # a different difficulty also really changes the examples
    assert all(len(e.world["steps"]) == 4 for e in hidden_examples(harder, 20))
    monkeypatch.setenv("AIT_HIDDEN_SEED", SECRET + "x")
    assert eval_fingerprint(spec) != fp


# ---------------------------------------------------------------- separation from dev examples


def test_no_hidden_prompt_equals_a_dev_prompt(home, spec):
    dev = {d.prompt for d in spec.dev_examples}
    assert len(dev) == 5
    hidden = {e.prompt for e in hidden_examples(spec)}
    assert not hidden & dev


def test_tiny_space_excludes_dev_prompts_and_can_exhaust_the_space(home, spec):
    tiny = build_spec("calc_chain", difficulty=TINY, constraints=spec.constraints, n_dev=30)
    dev = {d.prompt for d in tiny.dev_examples}
    assert dev <= TINY_SPACE
    # collisions are likely here: an unfiltered draw of 40 overlaps the dev prompts
    import random

    rng = random.Random(0)
    d = FAMILY.difficulty(TINY)
    assert {FAMILY.example(rng, d).prompt for _ in range(40)} & dev

    exs = hidden_examples(tiny, 40)
    prompts = [e.prompt for e in exs]
    assert len(prompts) == 40 and len(set(prompts)) == 40
    assert not set(prompts) & dev
    assert set(prompts) <= TINY_SPACE

    # every prompt not used by dev can be drawn, and then the space is exactly covered
    remaining = len(TINY_SPACE - dev)
    full = {e.prompt for e in hidden_examples(tiny, remaining)}
    assert len(full) == remaining
    assert full | dev == TINY_SPACE


def test_too_few_distinct_examples_is_a_clear_error(home, spec):
    tiny = build_spec("calc_chain", difficulty=TINY, constraints=spec.constraints, n_dev=30)
    remaining = len(TINY_SPACE - {d.prompt for d in tiny.dev_examples})
    with pytest.raises(RuntimeError, match=r"cannot draw \d+ distinct hidden examples"):
        hidden_examples(tiny, remaining + 1)
    with pytest.raises(RuntimeError, match="calc_chain"):
        hidden_examples(tiny, 200)


# ---------------------------------------------------------------- the on-disk secret


def test_threads_creating_the_secret_at_once_all_read_the_one_that_won(monkeypatch, tmp_path):
    """An arc's first episodes start together on a fresh install: every thread must see one secret (a
    temporary file named by the pid alone was shared by the threads, rewritten after it was linked into
    place, and renamed away under the others: two secrets, two hidden sets, FileNotFoundError)."""
    import threading

    monkeypatch.setenv("AIT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    for attempt in range(5):
        (tmp_path / "home" / "hidden_secret").unlink(missing_ok=True)
        seen, errors = [], []
        start = threading.Barrier(16)

        def read():
            try:
                start.wait()
                seen.append(hidden_secret())
            except Exception as e:  # noqa: BLE001 - the assertion names it
                errors.append(e)

        threads = [threading.Thread(target=read) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(seen) == 16 and len(set(seen)) == 1, (attempt, errors, set(seen))
        assert (tmp_path / "home" / "hidden_secret").read_text().strip() == seen[0]
        assert not list((tmp_path / "home").glob(".hidden_secret.*"))


def test_secret_file_created_0600_and_reused(monkeypatch, tmp_path, spec):
    home = tmp_path / "nested" / "ait_home"
    monkeypatch.setenv("AIT_HOME", str(home))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    old_umask = os.umask(0)  # the 0600 must come from the code, not from the umask
    try:
        first = hidden_examples(spec, 20)
        fp = eval_fingerprint(spec)
    finally:
        os.umask(old_umask)
    path = home / "hidden_secret"
    assert path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) >= 16
    assert hidden_secret() == secret

    # reused: same secret, same file contents, same set, same fingerprint
    assert dumps(hidden_examples(spec, 20)) == dumps(first)
    assert eval_fingerprint(spec) == fp
    assert path.read_text().strip() == secret
    assert [p.name for p in home.iterdir()] == ["hidden_secret"]

    # the env var, when set, wins over the file and gives the set that secret names
    monkeypatch.setenv("AIT_HIDDEN_SEED", secret)
    assert dumps(hidden_examples(spec, 20)) == dumps(first)
    monkeypatch.setenv("AIT_HIDDEN_SEED", "something-else")
    assert eval_fingerprint(spec) != fp
    assert path.read_text().strip() == secret


def test_fresh_homes_get_different_secrets(monkeypatch, tmp_path, spec):
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    fps = []
    for name in ("a", "b"):
        monkeypatch.setenv("AIT_HOME", str(tmp_path / name))
        fps.append(eval_fingerprint(spec))
    assert (tmp_path / "a" / "hidden_secret").read_text() != (tmp_path / "b" / "hidden_secret").read_text()
    assert fps[0] != fps[1]


# ---------------------------------------------------------------- the committed TaskSpec


def test_committed_spec_matches_the_family(home, spec):
    assert spec.id == SPEC_PATH.stem == spec.family == "calc_chain"
    d = FAMILY.difficulty(spec.difficulty)
    assert spec.difficulty == d.model_dump()  # every knob spelled out
    assert spec.eval_format == FAMILY.eval_format(d)
    assert spec.eval_format.max_turns == d.n_ops + 2
    assert spec.description == FAMILY.description
    # the committed file is exactly what build_spec regenerates
    assert build_spec("calc_chain", difficulty=spec.difficulty, constraints=spec.constraints) == spec
    # dev answers are the replayed world steps
    for dev in spec.dev_examples:
        steps = dev.world["steps"]
        value = steps[0]["a"]
        for s in steps:
            assert s["a"] == value
            value = {"+": value + s["b"], "-": value - s["b"], "*": value * s["b"]}[s["op"]]
        assert dev.answer == str(value)
        assert FAMILY.score(f"Answer: {dev.answer}", dev.answer) == 1.0
    assert spec.constraints.max_turns >= spec.eval_format.max_turns


def _all_keys(obj) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _all_keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _all_keys(v)}
    return set()


def test_committed_spec_leaks_neither_secret_nor_hidden_prompts(monkeypatch, tmp_path, spec):
    monkeypatch.setenv("AIT_HOME", str(tmp_path))
    monkeypatch.delenv("AIT_HIDDEN_SEED", raising=False)
    exs = hidden_examples(spec)
    secret = (tmp_path / "hidden_secret").read_text().strip()
    assert secret

    text = SPEC_PATH.read_text()
    data = json.loads(text)
    assert secret not in text
    assert not {k.lower() for k in _all_keys(data)} & {"seed", "secret", "hidden_seed", "hidden_examples"}
    dev_prompts = {d.prompt for d in spec.dev_examples}
    dev_blob = json.dumps([d.model_dump() for d in spec.dev_examples])
    assert secret not in dev_blob
    assert len(exs) == 200
    for e in exs:
        assert e.prompt not in text
        assert json.dumps(e.prompt) not in text
        assert e.prompt not in dev_prompts
    assert eval_fingerprint(spec) not in text


# ---------------------------------------------------------------- load_spec errors


def test_load_spec_missing_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(SpecError, match="does not exist") as e:
        load_spec(missing)
    assert str(missing) in str(e.value)
    with pytest.raises(SpecError):
        load_spec(tmp_path)  # a directory is not a spec file
    assert issubclass(SpecError, ValueError)


def test_load_spec_invalid_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "calc_chain",')
    with pytest.raises(SpecError, match="not valid JSON") as e:
        load_spec(bad)
    assert str(bad) in str(e.value)


def test_load_spec_unknown_top_level_key(tmp_path):
    data = json.loads(SPEC_PATH.read_text())
    data["hidden_seed"] = 1234
    p = tmp_path / "extra.json"
    p.write_text(json.dumps(data))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert "hidden_seed" in msg and "unknown key" in msg and str(p) in msg


def test_load_spec_unknown_nested_key_names_its_path(tmp_path):
    data = json.loads(SPEC_PATH.read_text())
    data["eval_format"]["tools"][0]["bogus_field"] = True
    data["dev_examples"][1]["gold_trace"] = []
    p = tmp_path / "nested.json"
    p.write_text(json.dumps(data))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert "eval_format.tools.0.bogus_field: unknown key" in msg
    assert "dev_examples.1.gold_trace: unknown key" in msg


def test_load_spec_missing_required_key_is_named(tmp_path):
    data = json.loads(SPEC_PATH.read_text())
    del data["constraints"]["max_steps"]
    p = tmp_path / "missing.json"
    p.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=r"constraints\.max_steps"):
        load_spec(p)
