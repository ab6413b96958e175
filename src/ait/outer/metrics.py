"""metrics.jsonl: one flat JSON object per outer step (the report and any other sink read these keys).

Every row has every key of `KEYS`; a mean over nothing (no job finished this step) is null,
a share over nothing is {}. Held-out keys appear only on held-out steps. The backend's own
figures (grad norm, drift between sampler and learner, ...) follow as `trainer/<name>`.
`families` nests one object per family trained on in the step (`FAMILY_KEYS`): the row stays one
line, and a family's figures stay together for the report's per-family table.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from ait.harness.types import EpisodeResult, StopReason
from ait.job.types import JobConfig, TrainConfig
from ait.outer.types import StepStats, Trajectory, TrajectoryGroup
from ait.probe.types import ProbeReport

KEYS: dict[str, str] = {
    "step": "outer steps completed (1-based; a resumed run continues the count)",
    "time": "unix time the row was written",
    "seconds": "wall seconds of this step (waiting for groups, training, held-out eval, checkpoint)",
    "seconds_by_phase": "{wait_groups, train_step, heldout, checkpoint}: where `seconds` went (checkpoint: the "
                        "previous step's bundle, written after its row; the rest is the loop's own bookkeeping)",
    "policy_version": "the backend's optimizer steps after this step (below `step` when steps had no signal)",
    "episodes": "training episodes in the groups trained on",
    "reward_mean": "mean episode reward (ait.reward total) of those episodes",
    "reward_std": "population standard deviation of those rewards",
    "validation": "mean of the reward's validation term (1 − (k−1)/K, 0 if never valid)",
    "job_quality": "mean of the reward's job-quality term (0.25·post + 0.75·uplift_term; 0 if no job finished)",
    "speed": "mean of the reward's train-speed term",
    "post_mean": "mean hidden post score over episodes whose scored job finished (null if none)",
    "uplift_mean": "mean post − best_pre over episodes with both (null if none)",
    "valid_rate": "fraction of episodes that submitted a valid job",
    "base_model_share": "{base model: fraction} over episodes whose scored job ran",
    "hparam_use": "{job.toml [train] key: fraction of the jobs run that set it beyond the template default}",
    "learning_rate_share": "{learning rate: fraction of the jobs run that used it} (the template's included)",
    "staleness_mean": "mean over trained groups of (policy version at training − version the group was sampled at)",
    "staleness_max": "largest such staleness",
    "resampled_groups": "groups dropped this step (and sampled again) for exceeding max_steps_off_policy, or "
                        "for having fewer than two members left once infra_error episodes were set aside",
    "timed_out": "training episodes that hit episode_timeout_s (scored as they stood)",
    "stop_share": "{stop reason: fraction} over the training episodes (job_done, turn_cap, stuck, ...): where "
                  "episodes that earned nothing went wrong",
    "infra_errors": "episodes of this step's groups (trained or dropped) that ended as infra_error: left out of "
                    "their group's advantages, not a verdict on the agent",
    "policy_tokens": "completion tokens the policy sampled in those episodes",
    "train_tokens": "completion tokens in the optimizer step's batch",
    "loss": "the step's importance-sampling loss (sum over tokens / tokens; 0 when skipped)",
    "usd": "USD (LLM + jobs) of every episode consumed this step: trained, dropped as stale, held out",
    "usd_total": "USD of the run so far",
    "families": "{family: {FAMILY_KEYS}} for each family among this step's training episodes",
}
FAMILY_KEYS: dict[str, str] = {
    "episodes": "training episodes of the family in the step",
    "valid_rate": "fraction of them that submitted a valid job",
    "job_quality_mean": "mean of their reward's job-quality term",
    "job_quality_std": "population standard deviation (divided by n, as reward_std) of that term over them, 0 "
                       "for one episode: with round robin the family has one group a step, so this is the "
                       "within-group spread its advantages are made of",
    "finished": "those of them whose job finished and was scored (a post score)",
    "job_quality_finished_mean": "mean of the job-quality term over those alone (null for none): invalid "
                                 "episodes score 0 there, so where every job stays below best_pre more valid jobs "
                                 "lower job_quality_mean, and this is what says whether the jobs got better",
    "job_quality_finished_std": "population standard deviation of that term over those alone (null for none)",
    "configs": "[{base_model, learning_rate, max_steps, count}] over the jobs they ran (every job of an episode "
               "with max_jobs > 1), most used first",
    "distinct_configs": "distinct (base_model, learning_rate, max_steps) triples among those jobs",
    "shaped_share": "fraction of those jobs whose reward is shaped: more than one reward function with a "
                    "non-zero weight (e.g. partial credit beside correctness); null when none reported it",
    "variants": "{name: count} of those jobs by the surface's names (ait.policy.job_variants.variant_name: "
                "the knobs turned from the reference job, e.g. model_qwen15+lr_3e-6), most used first",
}
HELDOUT_KEYS: dict[str, str] = {
    "heldout_reward": "mean reward of the held-out (triage) episodes, policy after this step's update",
    "heldout_n": "held-out episodes run",
    "heldout_reward_se2": "two standard errors of heldout_reward (null below two episodes)",
    "heldout_start_reward": "mean held-out reward of the starting policy (step 0, before any update)",
    "heldout_vs_start": "held-out transfer: this step's reward minus the starting policy's, paired by episode "
                        "(same tasks and seeds)",
    "heldout_vs_start_se2": "two standard errors of the paired differences (null below two pairs)",
}


@dataclass
class Episode:
    """One finished episode as the loop keeps it: the trainable trajectory and the harness's result."""

    trajectory: Trajectory
    result: EpisodeResult


@dataclass
class SampledGroup:
    """A finished group and what metrics need beyond the TrajectoryGroup."""

    group: TrajectoryGroup
    episodes: list[Episode] = field(default_factory=list)
    """The episodes trained on (their trajectories are the group's)."""
    infra: list[Episode] = field(default_factory=list)
    """Episodes that ended as infra_error: paid for, recorded, left out of the group."""
    slot: int | None = None
    """Its place in the run's task order (ait.outer.tasks.round_robin_task); None outside the sampler."""

    @property
    def usd(self) -> float:
        return sum(e.result.cost.total_usd for e in self.episodes + self.infra)


def trajectory_components(result: EpisodeResult) -> dict[str, float]:
    """The reward decomposition and job figures for Trajectory.components."""
    r = result.reward
    out = {"validation": r.validation, "job_quality": r.job_quality, "speed": r.train_speed,
           "uplift_term": r.uplift_term, "valid": float(r.valid_attempt is not None),
           "usd": result.cost.total_usd}
    if r.post is not None:
        out["post"] = r.post
    if r.post is not None and r.best_pre is not None:
        out["uplift"] = r.post - r.best_pre
    return out


def template_defaults() -> dict[str, Any]:
    """[train] values a job gets without touching them: the workspace template's, else the model's defaults."""
    template = tomllib.loads((files("ait") / "job" / "template" / "job.toml").read_text())
    defaults = {name: f.default for name, f in TrainConfig.model_fields.items() if not f.is_required()}
    for key, value in template.get("train", {}).items():
        name = {"group_size": "num_generations", "max_completion_tokens": "max_completion_length",
                "max_turns": "max_tool_calling_iterations"}.get(key, key)
        defaults[name] = value
    return defaults


def keys_set(config: JobConfig, defaults: dict[str, Any]) -> set[str]:
    """[train] keys whose value differs from what the template would have given."""
    values = config.train.model_dump()
    return {k for k, v in values.items() if k in defaults and v != defaults[k]}


def jobs_reports(result: EpisodeResult) -> list[ProbeReport]:
    """The probe report of every job the episode ran (the submission whose probe admitted it)."""
    by_attempt = {s.attempt: s.report for s in result.submissions}
    return [r for rec in result.jobs if (r := by_attempt.get(rec.attempt)) is not None and r.config is not None]


def jobs_configs(result: EpisodeResult) -> list[JobConfig]:
    """The job.toml of every job the episode ran."""
    return [r.config for r in jobs_reports(result)]


def shaped(report: ProbeReport) -> bool | None:
    """More than one reward function weighed above 0; None when the probe reported no rewards."""
    return sum(r.weight != 0.0 for r in report.rewards) > 1 if report.rewards else None


def variant(report: ProbeReport) -> str:
    """The job by the surface's name (ait.policy.job_variants.variant_name)."""
    from ait.policy.job_variants import variant_name

    return variant_name(report.config.job.base_model, report.config.train.model_dump(),
                        [r.weight for r in report.rewards] or None)


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def pstd(xs: list[float]) -> float:
    """Population standard deviation (0 for fewer than two values), as reward_std."""
    mu = mean(xs) or 0.0
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs)) if xs else 0.0


def family_figures(episodes: list[Episode]) -> dict[str, dict[str, Any]]:
    """`FAMILY_KEYS` for each family among `episodes` (by the trajectory's family), families sorted."""
    by_family: dict[str, list[EpisodeResult]] = {}
    for e in episodes:
        by_family.setdefault(e.trajectory.family, []).append(e.result)
    out = {}
    for family in sorted(by_family):
        results = by_family[family]
        quality = [r.reward.job_quality for r in results]
        finished = [r.reward.job_quality for r in results if r.reward.post is not None]
        triples = Counter((c.job.base_model, c.train.learning_rate, c.train.max_steps)
                          for r in results for c in jobs_configs(r))
        reports = [p for r in results for p in jobs_reports(r)]
        shaping = [s for p in reports if (s := shaped(p)) is not None]
        variants = Counter(variant(p) for p in reports)
        out[family] = {
            "episodes": len(results),
            "valid_rate": sum(r.reward.valid_attempt is not None for r in results) / len(results),
            "job_quality_mean": mean(quality),
            "job_quality_std": pstd(quality),
            "finished": len(finished),
            "job_quality_finished_mean": mean(finished),
            "job_quality_finished_std": pstd(finished) if finished else None,
            "configs": [{"base_model": m, "learning_rate": lr, "max_steps": n, "count": k}
                        for (m, lr, n), k in sorted(triples.items(), key=lambda t: (-t[1], t[0]))],
            "distinct_configs": len(triples),
            "shaped_share": mean([float(s) for s in shaping]),
            "variants": dict(sorted(variants.items(), key=lambda t: (-t[1], t[0]))),
        }
    return out


def step_metrics(step: int, groups: list[SampledGroup], stats: StepStats, *, version: int, seconds: float,
                 staleness: list[int], resampled: int, usd: float, usd_total: float,
                 heldout: list[Episode] | None = None, infra_errors: int = 0,
                 transfer: tuple[Any, float | None] | None = None,
                 phases: dict[str, float] | None = None) -> dict[str, Any]:
    episodes = [e for g in groups for e in g.episodes]
    rewards = [e.trajectory.reward for e in episodes]
    results = [e.result for e in episodes]
    mu = mean(rewards) or 0.0
    scored = [r.job.base_model for r in results if r.job is not None and r.job.base_model]
    configs = [c for r in results for c in jobs_configs(r)]
    defaults = template_defaults()
    used = [keys_set(c, defaults) for c in configs]
    rates = [f"{c.train.learning_rate:g}" for c in configs]
    stops = [r.stop_reason.value for r in results]
    row: dict[str, Any] = {
        "step": step, "time": time.time(), "seconds": seconds, "seconds_by_phase": dict(phases or {}),
        "policy_version": version,
        "episodes": len(episodes),
        "reward_mean": mu,
        "reward_std": pstd(rewards),
        "validation": mean([r.reward.validation for r in results]),
        "job_quality": mean([r.reward.job_quality for r in results]),
        "speed": mean([r.reward.train_speed for r in results]),
        "post_mean": mean([r.reward.post for r in results if r.reward.post is not None]),
        "uplift_mean": mean([r.reward.post - r.reward.best_pre for r in results
                             if r.reward.post is not None and r.reward.best_pre is not None]),
        "valid_rate": mean([float(r.reward.valid_attempt is not None) for r in results]),
        "base_model_share": {m: scored.count(m) / len(scored) for m in sorted(set(scored))},
        "hparam_use": {k: sum(k in u for u in used) / len(used) for k in sorted(defaults)} if used else {},
        # What the jobs set it to, the learning rate above all (on Qwen, 1e-6..3e-6 helped and 1e-5 hurt).
        "learning_rate_share": {lr: rates.count(lr) / len(rates) for lr in sorted(set(rates), key=float)},
        "staleness_mean": mean([float(s) for s in staleness]) or 0.0,
        "staleness_max": max(staleness, default=0),
        "resampled_groups": resampled,
        "timed_out": sum(e.trajectory.timed_out for e in episodes),
        "stop_share": {s: stops.count(s) / len(stops) for s in sorted(set(stops))},
        "infra_errors": infra_errors,
        "policy_tokens": sum(len(t.completion_ids) for e in episodes for t in e.trajectory.turns),
        "train_tokens": stats.tokens,
        "loss": stats.loss,
        "usd": usd,
        "usd_total": usd_total,
        "families": family_figures(episodes),
    }
    if heldout is not None:
        from ait.agent_eval.stats import stat

        held = stat([e.trajectory.reward for e in heldout])
        row["heldout_reward"], row["heldout_reward_se2"], row["heldout_n"] = held.mean, held.se2, len(heldout)
        if transfer is not None:  # (paired difference with the step-0 evaluation, its mean reward)
            diff, row["heldout_start_reward"] = transfer
            row["heldout_vs_start"], row["heldout_vs_start_se2"] = diff.mean, diff.se2
    row.update({f"trainer/{k}": v for k, v in stats.extra.items()})
    return row


def timed_out(result: EpisodeResult) -> bool:
    return result.stop_reason is StopReason.timeout


def infra_error(result: EpisodeResult) -> bool:
    return result.stop_reason is StopReason.infra_error


class MetricsLog:
    """RUN_DIR/metrics.jsonl, appended one row per step; `truncate_after` drops rows a crash left
    beyond the checkpoint a run resumes from, so no step appears twice."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash
        return out

    def truncate_after(self, step: int) -> None:
        keep = [r for r in self.rows() if isinstance(r.get("step"), int) and r["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in keep))
        tmp.replace(self.path)
