"""[reward] dead_job (issue 31, item 2): how a job that died is scored.

"zero" (the reference system's rule, the default) scores a dead job's job_quality 0, so a job that
finishes below best_pre scores less than the same job dead, and an agent learns to crash its weak
jobs. "untrained" scores a dead job as if it had not trained (post = its own pre, else its base
model's frozen baseline): crashing then pays more than finishing only when the finished job made
the model worse than untrained.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import TASK, fake_executor, memo_probe, ok_result, setup_of, weights_of

from ait.configs import ConfigError, load_config
from ait.evals.baselines import Baseline, BaselineStore
from ait.evals.hidden import eval_fingerprint
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig
from ait.job.types import FailReason, JobResult
from ait.outer.config import OuterConfig
from ait.policy.reference import ReferencePolicy
from ait.reward import RewardWeights, compute_reward, job_quality
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "recompute_reward.py"
BUDGET = 600.0
GRID = (0.0, 0.1, 0.25, 0.4, 0.5, 0.7, 0.9, 0.99, 1.0)
DEAD = [r for r in FailReason if r is not FailReason.infra]
ZERO, UNTRAINED = RewardWeights(), RewardWeights(dead_job="untrained")


def dead(reason: FailReason = FailReason.crash, pre: float | None = None) -> JobResult:
    # A dead job never reports post or eval_n; a fast clock must not earn it speed credit.
    return JobResult(job_id="j", ok=False, fail_reason=reason, error="boom", base_model="tiny", pre=pre,
                     train_seconds=1.0)


def finished(post: float, train_seconds: float = BUDGET * 1.5) -> JobResult:
    return JobResult(job_id="j", ok=True, base_model="tiny", pre=0.3, post=post, eval_n=200,
                     train_seconds=train_seconds)


def reward(job: JobResult | None, best_pre: float | None, weights: RewardWeights, base_pre: float | None = None,
           k: int = 1):
    return compute_reward(parseable_submission=True, valid_attempt=k, max_attempts=3, job=job, best_pre=best_pre,
                          time_budget_s=BUDGET, weights=weights, base_pre=base_pre)


# ---- (a) "zero": today's behaviour ----------------------------------------------------------------


def test_zero_is_the_default() -> None:
    assert RewardWeights().dead_job == "zero" and EpisodeConfig().reward.dead_job == "zero"


@pytest.mark.parametrize("reason", DEAD)
@pytest.mark.parametrize("pre,best_pre", [(None, 0.3), (0.2, 0.3), (0.5, 0.5), (0.9, None)])
def test_zero_scores_a_dead_job_with_validation_only(reason, pre, best_pre) -> None:
    r = reward(dead(reason, pre), best_pre, ZERO, base_pre=0.25, k=2)
    assert (r.job_quality, r.uplift_term, r.train_speed) == (0.0, 0.0, 0.0)
    assert r.total == pytest.approx(0.35 * (1 - 1 / 3))
    assert (r.dead_job_rule, r.dead_job_post, r.post) == ("zero", None, None)


@pytest.mark.parametrize("weights", [ZERO, UNTRAINED])
def test_the_rule_touches_neither_finished_nor_infra_failed_jobs(weights) -> None:
    r = reward(finished(0.6, 100.0), 0.3, weights)
    assert r.job_quality == job_quality(0.6, 0.3)[0] and r.train_speed > 0 and r.dead_job_rule is None
    infra = JobResult(job_id="j", ok=False, fail_reason=FailReason.infra, base_model="tiny", pre=0.5)
    r = reward(infra, 0.3, weights, base_pre=0.5)
    assert (r.job_quality, r.dead_job_rule, r.dead_job_post) == (0.0, None, None)


# ---- (b) "untrained": no deliberate crash beats finishing ------------------------------------------


@pytest.mark.parametrize("reason", DEAD)
def test_untrained_scores_a_dead_job_as_a_finished_one_with_post_equal_pre(reason) -> None:
    for pre, best_pre in itertools.product(GRID, GRID):
        r = reward(dead(reason), best_pre, UNTRAINED, base_pre=pre)
        same = reward(finished(pre), best_pre, UNTRAINED)  # finished, no speed credit, post = pre
        assert r.job_quality == same.job_quality and r.uplift_term == same.uplift_term, (pre, best_pre)
        assert r.total == same.total and r.train_speed == 0.0
        assert (r.dead_job_rule, r.dead_job_post, r.best_pre, r.post) == ("untrained", pre, best_pre, None)


@pytest.mark.parametrize("train_seconds", [BUDGET * 0.25, BUDGET, BUDGET * 1.5])
def test_under_untrained_crashing_beats_finishing_only_when_training_made_the_model_worse(train_seconds) -> None:
    for pre, best_pre, post in itertools.product(GRID, GRID, GRID):
        crashed = reward(dead(), best_pre, UNTRAINED, base_pre=pre).total
        done = reward(finished(post, train_seconds), best_pre, UNTRAINED).total
        if crashed > done:
            assert post < pre, (pre, best_pre, post)


def test_the_asymmetry_under_zero_that_untrained_removes() -> None:
    # A weak finished job (below best_pre) scores less than the same job dead under "zero" ...
    pre, best_pre, post = 0.3, 0.3, 0.2
    assert reward(finished(post), best_pre, ZERO).total < reward(dead(), best_pre, ZERO).total
    # ... and under "untrained" only because it ended worse than untrained (post < pre); at post = pre it ties.
    assert reward(finished(pre), best_pre, UNTRAINED).total == reward(dead(), best_pre, UNTRAINED, base_pre=pre).total


def test_the_jobs_own_pre_comes_before_the_frozen_baseline() -> None:
    r = reward(dead(pre=0.2), 0.3, UNTRAINED, base_pre=0.25)
    assert r.dead_job_post == 0.2 and r.job_quality == job_quality(0.2, 0.3)[0]


@pytest.mark.parametrize("best_pre,base_pre", [(0.3, None), (None, 0.3), (None, None)])
def test_untrained_without_a_pre_or_best_pre_falls_back_to_zero_and_says_why(best_pre, base_pre) -> None:
    r = reward(dead(), best_pre, UNTRAINED, base_pre=base_pre)
    assert (r.job_quality, r.uplift_term, r.dead_job_rule, r.dead_job_post) == (0.0, 0.0, "zero", None)
    assert r.dead_job_note and ("best_pre" in r.dead_job_note if best_pre is None else "pre" in r.dead_job_note)


# ---- (c) the config ---------------------------------------------------------------------------------


def test_the_episode_config_loads_the_rule_from_toml(tmp_path) -> None:
    path = tmp_path / "episode.toml"
    path.write_text('[reward]\ndead_job = "untrained"\n')
    assert load_config(path, EpisodeConfig).reward.dead_job == "untrained"


def test_an_unknown_rule_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "episode.toml"
    path.write_text('[reward]\ndead_job = "half"\n')
    with pytest.raises(ConfigError, match=r"reward\.dead_job: Input should be 'zero' or 'untrained'"):
        load_config(path, EpisodeConfig)


@pytest.mark.parametrize("name", ["cpu_tiny", "h200_mini", "h200_qwen15", "h200_qwen15_3step", "h200_ray_x4"])
def test_the_arcs_score_dead_jobs_as_untrained(name) -> None:
    assert load_config(ROOT / "configs" / "outer" / f"{name}.toml", OuterConfig).episode.reward.dead_job == "untrained"


# ---- (d) through the harness, and recomputed without ait ---------------------------------------------


def crashed(pre: float | None = None):
    return lambda job: JobResult(job_id=job.job_id, ok=False, fail_reason=FailReason.crash, error="boom",
                                 base_model=job.config.job.base_model, pre=pre,
                                 base_model_sha256=weights_of(job.config.job.base_model), train_seconds=50.0)


FROZEN = 0.27  # tiny's frozen untrained score on calc_chain's hidden set


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    import ait.train.models as models

    memo_probe(monkeypatch)
    monkeypatch.setattr(models, "model_availability", lambda name: None if name == "tiny" else "not here (test)")
    spec = load_spec(TASK)
    path = tmp_path / "baselines.json"
    BaselineStore(path).freeze(Baseline(family=spec.family, base_model="tiny", weights_sha256=weights_of("tiny"), setup=setup_of(spec),
                                        fingerprint=eval_fingerprint(spec, spec.hidden_eval_size),
                                        best_pre=FROZEN, n=spec.hidden_eval_size))
    return path


@pytest.mark.parametrize("rule,maker,rule_used,post_used", [
    ("zero", crashed(), "zero", None),
    ("untrained", crashed(), "untrained", FROZEN),        # no pre reported: the frozen baseline
    ("untrained", crashed(pre=0.2), "untrained", 0.2),    # the job's own pre
    ("untrained", ok_result(pre=FROZEN, post=0.5), None, None),
])
def test_an_episode_scores_a_dead_job_by_its_rule_and_recomputes_exactly(tmp_path, store, rule, maker,
                                                                         rule_used, post_used) -> None:
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(), EpisodeConfig(reward={"dead_job": rule}),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(store), executor=fake_executor(maker))
    r = result.reward
    assert (r.dead_job_rule, r.dead_job_post) == (rule_used, post_used)
    if post_used is not None:
        assert r.best_pre == FROZEN and r.job_quality == job_quality(post_used, FROZEN)[0]
    recorded = json.loads((Path(result.run_dir) / "reward.json").read_text())
    assert recorded["dead_job_rule"] == rule_used and recorded["dead_job_post"] == post_used
    proc = subprocess.run([sys.executable, str(SCRIPT), result.run_dir, "--baselines", str(store), "--json"],
                          capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["match"], out
    assert out["recomputed"]["dead_job_rule"] == rule_used


def test_the_script_notices_a_rule_changed_after_the_fact(tmp_path, store) -> None:
    result = run_episode(load_spec(TASK), TASK, ReferencePolicy(), EpisodeConfig(reward={"dead_job": "untrained"}),
                         runs_dir=tmp_path / "runs", baselines=BaselineStore(store), executor=fake_executor(crashed()))
    manifest = Path(result.run_dir) / "manifest.json"
    data = json.loads(manifest.read_text())
    data["config"]["reward"]["dead_job"] = "zero"
    manifest.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, str(SCRIPT), result.run_dir, "--baselines", str(store), "--json"],
                          capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["recomputed"]["job_quality"] == 0.0


# ---- a real crash: a scripted agent whose reward function raises once training starts ----------------

CRASH_AFTER_THE_PROBE = '''

import sys as _sys

_honest_reward = reward_correct


def reward_correct(completion, answer, info):
    # The probe imports env.py without the trainer; training imports the trainer first. SystemExit, not
    # an Exception: the trainer scores a reward that raises an Exception 0 and goes on.
    if "ait.train.fast_grpo" in _sys.modules or "ait.train.grpo" in _sys.modules:
        print("crashing a weak job on purpose", flush=True)
        raise SystemExit(1)
    return _honest_reward(completion, answer, info)


REWARD_FUNCS = [reward_correct, reward_close, reward_format]
'''


@pytest.mark.slow  # one whole episode, really trained and evaluated (~25 s on 2 cores)
def test_a_job_that_crashes_on_purpose_is_scored_from_its_models_untrained_score(tmp_path, monkeypatch) -> None:
    """The real probe, executor and sandbox on CPU: the job passes the probe, exits from a reward
    function in training, and under "untrained" is scored from its base model's frozen untrained score
    on the hidden set (frozen here at 0.4: the random tiny model's own is 0, which "zero" would also give)."""
    from hostile_agent import HostileAgent, quick_job_toml, reference_files

    from ait.policy.base import make_policy
    from ait.sandbox.detect import cached_capabilities
    import ait.train.models as models

    if not cached_capabilities().active("landlock"):
        pytest.skip("needs Landlock on this kernel (as the hostile episodes)")
    monkeypatch.setattr(models, "model_availability", lambda name: None if name == "tiny" else "not here (test)")
    spec, store = load_spec(TASK), BaselineStore(tmp_path / "baselines.json")
    store.freeze(Baseline(family=spec.family, base_model="tiny", weights_sha256=weights_of("tiny"), setup=setup_of(spec),
                          fingerprint=eval_fingerprint(spec, 8), best_pre=0.4, n=8))
    job = {"job.toml": quick_job_toml(), "env.py": reference_files()["env.py"] + CRASH_AFTER_THE_PROBE}
    with HostileAgent([job]) as agent:
        config = EpisodeConfig(eval_size=8, max_nudges=0, probe_timeout_s=120, reward={"dead_job": "untrained"})
        result = run_episode(spec, TASK, make_policy("openai:hostile-agent", base_url=agent.url), config,
                             runs_dir=tmp_path / "runs", baselines=store)
    assert result.job is not None and result.job.fail_reason is FailReason.crash, result.job
    assert "crashing a weak job on purpose" in (result.job.error or "")
    r = result.reward
    assert (r.dead_job_rule, r.dead_job_post, r.best_pre, r.post) == ("untrained", 0.4, 0.4, None)
    assert r.job_quality == job_quality(0.4, 0.4)[0] and r.train_speed == 0.0
    assert r.total == pytest.approx(0.35 + 0.60 * 0.25 * 0.4)  # "zero" would give 0.35
