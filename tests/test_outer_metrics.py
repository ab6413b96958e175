"""metrics.jsonl rows: the reward decomposition, job figures, base-model shares and the use of the
hyperparameter surface, computed from the episodes' own results."""

from __future__ import annotations

import tomllib

import pytest

from ait.harness.types import EpisodeResult, JobRecord, StopReason, Submission
from ait.job.types import JobConfig, JobResult
from ait.metering import CostSummary, JobCost
from ait.outer.metrics import FAMILY_KEYS, KEYS, Episode, SampledGroup, step_metrics
from ait.outer.types import StepStats, Trajectory, TrajectoryGroup, Turn
from ait.probe.types import ProbeReport, RewardChoice
from ait.reward import RewardBreakdown

TEMPLATE = {"job": {"base_model": "tiny"},
            "train": {"max_steps": 1, "learning_rate": 1e-4, "num_generations": 2, "max_completion_length": 32}}


def episode(reward: float, *, job_toml: dict | None = None, post: float | None = None, best_pre: float | None = None,
            model: str = "tiny", timed_out: bool = False, usd: float = 0.0, family: str = "calc_chain",
            job_quality: float | None = None, weights: list[float] | None = None) -> Episode:
    submissions, jobs, job = [], [], None
    if job_toml is not None:
        config = JobConfig.model_validate(job_toml)
        rewards = [RewardChoice(name=f"reward_{i}", weight=w) for i, w in enumerate(weights or [])]
        submissions = [Submission(attempt=1, parseable=True, report=ProbeReport(valid=True, config=config,
                                                                                rewards=rewards))]
        job = JobResult(job_id="j", ok=post is not None, base_model=model, post=post, pre=best_pre)
        jobs = [JobRecord(attempt=1, job_id="j", result=job,
                          cost=JobCost(gpus=0, wall_s=1, gpu_seconds=0, cpu_seconds=1, usd=usd))]
    quality = job_quality if job_quality is not None else 0.5 if post else 0.0
    r = RewardBreakdown(total=reward, validation=1.0 if job_toml else 0.0, job_quality=quality,
                        train_speed=0.2 if post else 0.0, post=post, best_pre=best_pre,
                        valid_attempt=1 if job_toml else None, max_attempts=3, parseable_submission=reward > -0.1)
    result = EpisodeResult(run_id="e", run_dir="/x", task_id="t", policy="p",
                           stop_reason=StopReason.timeout if timed_out else StopReason.job_done, turns=3,
                           submissions=submissions, job=job, jobs=jobs, reward=r, wall_seconds=1.0,
                           cost=CostSummary(job_usd=usd, jobs=len(jobs)))
    turn = Turn(prompt_ids=[1, 2], completion_ids=[3, 4, 5], logprobs=[-1.0, -1.0, -1.0])
    trajectory = Trajectory(episode_id="e", task_id="t", family=family, turns=[turn], reward=reward,
                            policy_version=0, timed_out=timed_out)
    return Episode(trajectory=trajectory, result=result)


def group(*episodes: Episode) -> SampledGroup:
    return SampledGroup(group=TrajectoryGroup(task_id="t", trajectories=[e.trajectory for e in episodes],
                                              policy_version=0), episodes=list(episodes))


def test_step_row() -> None:
    tuned = {"job": {"base_model": "Qwen/Qwen3-0.6B"},
             "train": {**TEMPLATE["train"], "learning_rate": 5e-5, "lora": {"r": 8}, "beta": 0.0}}
    groups = [group(episode(0.8, job_toml=tuned, post=0.6, best_pre=0.4, model="Qwen/Qwen3-0.6B", usd=0.5),
                    episode(-0.1)),
              group(episode(0.35, job_toml=TEMPLATE, post=None, model="tiny", timed_out=True),
                    episode(0.5, job_toml=TEMPLATE, post=0.3, best_pre=0.3, model="tiny"))]
    stats = StepStats(step=1, loss=-0.25, tokens=12, datums=4, seconds=1.0, extra={"grad_norm": 0.5})
    row = step_metrics(3, groups, stats, version=1, seconds=2.0, staleness=[0, 1], resampled=2, usd=0.5,
                       usd_total=1.5, heldout=[episode(0.1), episode(0.3)])
    assert set(KEYS) <= set(row)
    assert row["step"] == 3 and row["episodes"] == 4 and row["reward_mean"] == pytest.approx(0.3875)
    assert row["valid_rate"] == 0.75 and row["validation"] == 0.75
    assert row["post_mean"] == pytest.approx(0.45) and row["uplift_mean"] == pytest.approx(0.1)
    assert row["base_model_share"] == {"Qwen/Qwen3-0.6B": pytest.approx(1 / 3), "tiny": pytest.approx(2 / 3)}
    hp = row["hparam_use"]
    assert hp["learning_rate"] == pytest.approx(1 / 3) and hp["lora"] == pytest.approx(1 / 3)
    assert hp["beta"] == 0.0  # set, but to the default: not a use of the surface
    assert hp["max_steps"] == 0.0 and set(hp) >= {"temperature", "loss_type", "warmup_steps"}
    template_lr = f"{TEMPLATE['train']['learning_rate']:g}"
    assert row["learning_rate_share"] == {"5e-05": pytest.approx(1 / 3), template_lr: pytest.approx(2 / 3)}
    assert row["staleness_mean"] == 0.5 and row["staleness_max"] == 1 and row["resampled_groups"] == 2
    assert row["timed_out"] == 1 and row["policy_tokens"] == 12 and row["train_tokens"] == 12
    assert row["stop_share"] == {"job_done": 0.75, "timeout": 0.25}
    assert row["loss"] == -0.25 and row["usd"] == 0.5 and row["trainer/grad_norm"] == 0.5
    assert row["heldout_reward"] == pytest.approx(0.2) and row["heldout_n"] == 2


def test_a_step_without_jobs_has_empty_shares_and_null_means() -> None:
    row = step_metrics(1, [group(episode(-0.1), episode(-0.1))], StepStats(step=0, loss=0.0, tokens=6, datums=2,
                       seconds=0.0, extra={"skipped": 1.0}), version=0, seconds=1.0, staleness=[0], resampled=0,
                       usd=0.0, usd_total=0.0)
    assert row["base_model_share"] == {} and row["hparam_use"] == {} and row["learning_rate_share"] == {}
    assert row["post_mean"] is None and row["uplift_mean"] is None and row["reward_std"] == 0.0
    assert "heldout_reward" not in row
    assert row["families"] == {"calc_chain": {"episodes": 2, "valid_rate": 0.0, "job_quality_mean": 0.0,
                                              "job_quality_std": 0.0, "finished": 0, "job_quality_finished_mean": None,
                                              "job_quality_finished_std": None, "configs": [], "distinct_configs": 0,
                                              "shaped_share": None, "variants": {}}}


def with_lr(lr: float, model: str = "tiny", max_steps: int = 1) -> dict:
    return {"job": {"base_model": model}, "train": {**TEMPLATE["train"], "learning_rate": lr, "max_steps": max_steps}}


def test_per_family_figures() -> None:
    """Two families over three groups: each family's valid rate, job-quality mean and (population) std, and
    the (base model, learning rate, max steps) triples its jobs chose, counted."""
    ledger = [episode(0.6, job_toml=with_lr(1e-5), post=0.5, family="ledger", job_quality=0.2, weights=[1.0, 0.1]),
              episode(0.9, job_toml=with_lr(1e-5), post=0.7, family="ledger", job_quality=0.6, weights=[1.0, 0.0]),
              episode(0.5, job_toml=with_lr(3e-6, "Qwen/Qwen3-0.6B", 50), post=0.4, family="ledger",
                      job_quality=0.4, weights=[1.0, 0.5, 0.2]),
              episode(-0.1, family="ledger")]  # no valid job: counts for the valid rate, chose nothing
    dispatch = [episode(0.7, job_toml=with_lr(1e-5), post=0.3, family="dispatch", job_quality=0.3),
                episode(0.7, job_toml=with_lr(1e-5), post=0.3, family="dispatch", job_quality=0.3)]
    groups = [group(*ledger[:2]), group(*dispatch), group(*ledger[2:])]
    row = step_metrics(1, groups, StepStats(step=1, loss=0.0, tokens=0, datums=6, seconds=0.0), version=1,
                       seconds=1.0, staleness=[0, 0, 0], resampled=0, usd=0.0, usd_total=0.0)
    fams = row["families"]
    assert list(fams) == ["dispatch", "ledger"] and set(fams["ledger"]) == set(FAMILY_KEYS)
    led, dis = fams["ledger"], fams["dispatch"]
    assert led["episodes"] == 4 and led["valid_rate"] == 0.75
    assert led["job_quality_mean"] == pytest.approx(0.3)
    # population std of (0.2, 0.6, 0.4, 0.0): sqrt(0.05); the sample std would be sqrt(0.2 / 3)
    assert led["job_quality_std"] == pytest.approx(0.05 ** 0.5)
    # the three finished jobs alone (0.2, 0.6, 0.4): the invalid episode's 0 left out
    assert led["finished"] == 3 and led["job_quality_finished_mean"] == pytest.approx(0.4)
    assert led["job_quality_finished_std"] == pytest.approx((0.08 / 3) ** 0.5)
    assert led["distinct_configs"] == 2
    # partial credit on (0.1), off (weight 0: one reward left), three rewards on: two of three jobs shaped
    assert led["shaped_share"] == pytest.approx(2 / 3)
    # by the surface's names: values no variant has are named by value (the template's tiny model, 1 step, 2 generations)
    tiny_lr5 = "model=tiny+lr_1e-5+steps=1+gens=2"
    assert led["variants"] == {tiny_lr5: 1, f"{tiny_lr5}+no_partial_credit": 1,
                               "model=Qwen/Qwen3-0.6B+lr_3e-6+steps=50+gens=2": 1}
    assert led["configs"] == [{"base_model": "tiny", "learning_rate": 1e-5, "max_steps": 1, "count": 2},
                              {"base_model": "Qwen/Qwen3-0.6B", "learning_rate": 3e-6, "max_steps": 50, "count": 1}]
    assert dis == {"episodes": 2, "valid_rate": 1.0, "job_quality_mean": pytest.approx(0.3), "job_quality_std": 0.0,
                   "finished": 2, "job_quality_finished_mean": pytest.approx(0.3), "job_quality_finished_std": 0.0,
                   "configs": [{"base_model": "tiny", "learning_rate": 1e-5, "max_steps": 1, "count": 2}],
                   "distinct_configs": 1, "shaped_share": None, "variants": {"model=tiny+lr_1e-5+steps=1+gens=2": 2}}
    assert row["valid_rate"] == pytest.approx(5 / 6)  # the step's own keys are unchanged


def test_template_is_what_the_defaults_read() -> None:
    from importlib.resources import files

    template = tomllib.loads((files("ait") / "job" / "template" / "job.toml").read_text())
    assert template["train"] == TEMPLATE["train"]
