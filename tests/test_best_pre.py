"""best_pre: the highest frozen untrained score among the task's allowed base models, whichever
model the agent trains; frozen per weights hash; measured on first use; unavailable models left
out and named; a failed measurement is an infrastructure error, never a lower best_pre."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from ait.evals import best_pre as best_pre_mod
from ait.evals.baselines import Baseline, BaselineStore, scoring_setup
from ait.evals.best_pre import best_pre
from ait.evals.hidden import eval_fingerprint
from ait.job.types import JobResult
from ait.reward import compute_reward
from ait.spec import load_spec
from ait.train.models import resolve_base_model
from ait.train.tiny import tiny_model_path

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "calc_chain_fast.json"
N = 4


@pytest.fixture
def models(tmp_path, monkeypatch):
    """Two local base models with different weights ("strong", "weak") named in an alias file, and one
    alias that points nowhere ("gone")."""
    dirs = {}
    for i, name in enumerate(("strong", "weak")):
        d = tmp_path / name
        shutil.copytree(tiny_model_path(), d)
        tensors = load_file(str(d / "model.safetensors"))
        first = sorted(tensors)[0]
        tensors[first] = tensors[first] + i  # other weights, other hash
        save_file(tensors, str(d / "model.safetensors"))
        dirs[name] = d
    aliases = tmp_path / "models.toml"
    aliases.write_text(f'[models]\nstrong = "{dirs["strong"]}"\nweak = "{dirs["weak"]}"\n'
                       f'gone = "{tmp_path / "missing.gguf"}"\n')
    monkeypatch.setenv("AIT_MODELS", str(aliases))
    return dirs, aliases


def spec_with(*allowed: str):
    spec = load_spec(TASK)
    return spec.model_copy(update={"constraints": spec.constraints.model_copy(update={"allowed_base_models":
                                                                                          list(allowed)})})


def freeze(store: BaselineStore, spec, name: str, score: float) -> None:
    model = resolve_base_model(name)
    store.freeze(Baseline(family=spec.family, base_model=name, weights_sha256=model.sha256,
                          setup=scoring_setup(spec, model.path), fingerprint=eval_fingerprint(spec, N),
                          best_pre=score, n=N))


def job_on(name: str, pre: float, post: float) -> JobResult:
    return JobResult(job_id="j", ok=True, base_model=name, base_model_sha256=resolve_base_model(name).sha256,
                     pre=pre, post=post, eval_n=N, train_seconds=10.0)


def reward_of(job: JobResult, made) -> float:
    return compute_reward(parseable_submission=True, valid_attempt=1, max_attempts=3, job=job,
                          best_pre=made.value, time_budget_s=100.0)


def test_a_weak_model_must_beat_the_strong_models_untrained_score(models, tmp_path):
    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.6)
    freeze(store, spec, "weak", 0.2)
    weak = job_on("weak", pre=0.2, post=0.5)  # +0.3 over its own start, still below the strong model
    made = best_pre(spec, N, store, own=weak, measure=False)
    assert made.value == 0.6 and made.scores == {"strong": 0.6, "weak": 0.2} and made.complete
    r = reward_of(weak, made)
    assert r.best_pre == 0.6 and r.uplift_term == pytest.approx((0.5 - 0.6) / 0.4)
    strong = job_on("strong", pre=0.6, post=0.7)
    r = reward_of(strong, best_pre(spec, N, store, own=strong, measure=False))
    assert r.best_pre == 0.6 and r.uplift_term == pytest.approx(0.1 / 0.4)


def test_the_jobs_own_pre_freezes_its_models_baseline_by_weights(models, tmp_path):
    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.6)
    made = best_pre(spec, N, store, own=job_on("weak", pre=0.25, post=0.3), measure=False)
    assert made.scores == {"strong": 0.6, "weak": 0.25}
    weak = resolve_base_model("weak")
    entry = store.get(spec.family, weak.sha256, eval_fingerprint(spec, N), scoring_setup(spec, weak.path))
    assert entry is not None and entry.best_pre == 0.25 and entry.base_model == "weak"


def test_a_missing_baseline_is_measured_on_first_use_then_frozen(models, tmp_path, monkeypatch):
    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    measured = []
    real = best_pre_mod.measure_baseline
    monkeypatch.setattr(best_pre_mod, "measure_baseline", lambda *a: measured.append(a[1].name) or real(*a))
    made = best_pre(spec, N, store, own=job_on("weak", pre=0.1, post=0.2))
    assert measured == ["strong"] and "strong" in made.scores and 0.0 <= made.scores["strong"] <= 1.0
    assert made.value == max(made.scores.values())
    again = best_pre(spec, N, store, own=job_on("weak", pre=0.1, post=0.2))
    assert measured == ["strong"] and again.scores == made.scores  # frozen: not measured twice


def test_a_group_finishing_together_measures_each_missing_baseline_once(models, tmp_path, monkeypatch):
    """Eight episodes of a group score their jobs at once: one of them measures the missing model while
    the others wait for it and read its frozen score (eight evals at once filled an H100 on 2026-12-07)."""
    import threading
    import time

    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    running, calls, most = [], [], [0]

    def slow(_spec, model, _n):
        running.append(model.name)
        most[0] = max(most[0], len(running))
        time.sleep(0.3)  # long enough for every thread to arrive while it runs
        calls.append(model.name)
        running.remove(model.name)
        return 0.5

    monkeypatch.setattr(best_pre_mod, "measure_baseline", slow)
    made = []
    threads = [threading.Thread(target=lambda: made.append(best_pre(spec, N, store, own=job_on("weak", 0.1, 0.2))))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["strong"] and most[0] == 1
    assert len(made) == 8 and all(m.scores == {"strong": 0.5, "weak": 0.1} and m.complete for m in made)


def test_a_baseline_eval_that_runs_out_of_gpu_memory_is_tried_again(models, tmp_path, monkeypatch):
    """Beside packed jobs an eval's OOM or CUDA fault is the neighbours' doing: tried again after a wait;
    any other failure, or a third OOM, is final. The waits are outside the store's measuring lock, so
    other episodes' baselines are measured meanwhile."""
    import fcntl
    from types import SimpleNamespace

    from ait.evals import runner

    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    waits, lock_free = [], []

    def wait(seconds):
        waits.append(seconds)
        with open(store.path.with_suffix(".measuring.lock"), "w") as f:  # another episode's try at the lock
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_free.append(True)
            except BlockingIOError:
                lock_free.append(False)

    monkeypatch.setattr(best_pre_mod, "RETRY_WAITS_S", (1.0, 2.0))
    monkeypatch.setattr(best_pre_mod.time, "sleep", wait)
    failures = []

    def flaky(*_a, **_k):
        if failures:
            raise failures.pop(0)
        return SimpleNamespace(pre=0.25)

    monkeypatch.setattr(runner, "scratch_eval", flaky)
    failures[:] = [runner.EvalFailed("out of memory", oom=True), runner.EvalFailed("fault", gpu_fault=True)]
    made = best_pre(spec, N, store, own=job_on("weak", 0.1, 0.2))
    assert made.scores["strong"] == 0.25 and made.complete and waits == [1.0, 2.0] and lock_free == [True, True]
    for outcome, expected, expected_waits in (
            ([runner.EvalFailed("out of memory", oom=True)] * 3, r"try 3 of 3\): out of memory", [1.0, 2.0]),
            ([runner.EvalFailed("the eval exited with status 1")], "failed: the eval exited", [])):
        waits.clear()
        failures[:] = outcome
        fresh = BaselineStore(tmp_path / f"b{len(expected)}.json")
        made = best_pre(spec, N, fresh, own=job_on("weak", 0.1, 0.2))
        assert not made.complete and "strong" not in made.scores
        assert re.search(expected, made.failed["strong"])
        assert waits == expected_waits


def test_a_baseline_another_episode_froze_during_the_wait_is_read_not_measured_again(models, tmp_path, monkeypatch):
    """The store is re-read at every try: a score frozen by another episode while this one waited out an
    OOM is taken as it is."""
    from ait.evals import runner

    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    tries = []

    def oom(*_a, **_k):
        tries.append(1)
        raise runner.EvalFailed("out of memory", oom=True)

    monkeypatch.setattr(runner, "scratch_eval", oom)
    monkeypatch.setattr(best_pre_mod.time, "sleep", lambda _s: freeze(store, spec, "strong", 0.4))
    made = best_pre(spec, N, store, own=job_on("weak", 0.1, 0.2))
    assert tries == [1] and made.scores["strong"] == 0.4 and made.complete


def test_models_this_install_cannot_resolve_are_left_out_and_named(models, tmp_path):
    spec = spec_with("strong", "gone", "Qwen/Not-A-Real-Model")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.4)
    made = best_pre(spec, N, store, measure=False)
    assert made.value == 0.4 and set(made.excluded) == {"gone", "Qwen/Not-A-Real-Model"} and made.complete
    assert "does not exist" in made.excluded["gone"]


def test_repointing_an_alias_never_meets_the_old_weights_score(models, tmp_path, monkeypatch):
    dirs, aliases = models
    spec = spec_with("strong")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.9)
    aliases.write_text(f'[models]\nstrong = "{dirs["weak"]}"\n')  # same name, other weights
    made = best_pre(spec, N, store, measure=False)
    assert made.value is None and "not measured yet" in made.excluded["strong"]


def test_a_failed_measurement_is_an_infra_error_not_a_lower_best_pre(models, tmp_path, monkeypatch):
    from ait.harness.episode import infra_failure

    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")

    def broken(*_):
        raise best_pre_mod.BaselineUnmeasured("its baseline eval failed: the eval exited with status 1")

    monkeypatch.setattr(best_pre_mod, "measure_baseline", broken)
    made = best_pre(spec, N, store, own=job_on("weak", pre=0.1, post=0.3))
    assert not made.complete and "strong" in made.failed and made.scores == {"weak": 0.1}
    error = infra_failure(job_on("weak", pre=0.1, post=0.3), made)  # the episode ends as infra_error
    assert error is not None and "strong" in error


def test_a_changed_eval_format_never_meets_the_old_frozen_score(models, tmp_path):
    """The system prompt and max_new_tokens decide the score as much as the weights: another eval
    format is another baseline (measured afresh), not the frozen one."""
    spec = spec_with("strong")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.0)
    assert best_pre(spec, N, store, measure=False).value == 0.0
    for change in ({"system_prompt": spec.eval_format.system_prompt + " Be brief."},
                   {"max_new_tokens": spec.eval_format.max_new_tokens + 1}):
        other = spec.model_copy(update={"eval_format": spec.eval_format.model_copy(update=change)})
        made = best_pre(other, N, store, measure=False)
        assert made.value is None and "not measured yet" in made.excluded["strong"], change
        assert made.setups["strong"] != best_pre(spec, N, store, measure=False).setups["strong"]


def test_a_changed_scorer_changes_the_setup_its_baseline_is_frozen_under(models, tmp_path, monkeypatch):
    """A copy of ait whose calc_chain scorer gives 0.5 for no answer is another scoring code: its
    digest differs, so the score frozen under the old code is not served for it."""
    import ait
    from ait.evals import hidden_eval

    root = Path(ait.__file__).parent
    copy = tmp_path / "ait"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    family = copy / "families" / "calc_chain.py"
    family.write_text(family.read_text() + "\n# a scorer edited after the baseline was frozen\n")
    assert hidden_eval.scoring_code_digest(copy) != hidden_eval.scoring_code_digest(root)
    spec = spec_with("strong")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.0)
    monkeypatch.setattr(hidden_eval, "scoring_code_digest", lambda root=None: "edited")
    made = best_pre(spec, N, store, measure=False)
    assert made.value is None and "not measured yet" in made.excluded["strong"]


def test_a_jobs_pre_beyond_noise_of_its_frozen_baseline_is_an_error_not_a_reward(models, tmp_path):
    from ait.harness.episode import infra_failure

    spec = spec_with("strong", "weak")
    store = BaselineStore(tmp_path / "b.json")
    freeze(store, spec, "strong", 0.6)
    freeze(store, spec, "weak", 0.0)
    stale = job_on("weak", pre=1.0, post=1.0)  # the eval now scores the untrained weak model 1.0
    made = best_pre(spec, N, store, own=stale, measure=False)
    assert not made.complete and "disagrees with the frozen baseline 0.0000" in made.failed["weak"]
    error = infra_failure(stale, made)  # the episode ends as infra_error
    assert error is not None and "weak" in error
    assert store.get(spec.family, resolve_base_model("weak").sha256, eval_fingerprint(spec, N),
                     made.setups["weak"]).best_pre == 0.0  # the frozen score is not replaced behind anyone's back
    close = best_pre(spec, N, store, own=job_on("weak", pre=0.25, post=0.5), measure=False)
    assert close.complete and close.scores["weak"] == 0.0  # within noise at n = 4: scored against the frozen 0.0


@pytest.mark.parametrize("a,b,n,agree", [
    (0.30, 0.30, 200, True), (0.30, 0.39, 200, True), (0.30, 0.40, 200, False), (0.0, 0.5, 200, False),
    (0.0, 0.02, 50, True), (0.0, 0.08, 50, False), (0.0, 0.25, 4, True), (0.0, 1.0, 4, False)])
def test_agreement_is_two_standard_errors_of_the_difference_with_a_floor(a, b, n, agree):
    from ait.evals.best_pre import agrees

    assert agrees(a, b, n) is agree and agrees(b, a, n) is agree
