"""The outer loop: RL on the agent that writes training jobs (`ait train`).

    train(config, run_dir)
      executor ← job_executor(config)                       one pool of job slots for every episode
      backend ← make_backend(config), or the latest checkpoint of run_dir (resume)
      for step in start+1 .. max_steps (while under budget_usd):
          sampler.fill()                                    groups of G episodes start on threads
          groups, dropped ← sampler.take(groups_per_step)   too-stale groups dropped, re-sampled
          stats ← backend.train_step(groups)                importance-sampling policy gradient
          sampler.fill()                                    sampling goes on while the next step waits
          heldout ← held-out (triage) episodes, when due
          metrics.jsonl ← step_metrics(...)                 one row per step
          checkpoint, when due and at the end

Run directory:

    RUN_DIR/config.json        the resolved OuterConfig (a resume without --config reads it)
    RUN_DIR/manifest.json      versions, start time, resumes
    RUN_DIR/metrics.jsonl      one row per step (ait.outer.metrics.KEYS)
    RUN_DIR/checkpoints/step_N ait.outer.checkpoint: a self-contained bundle (weights, optimizer, loop
                               state, metrics so far) that `train(resume_from=...)` continues elsewhere
    RUN_DIR/episodes/<id>/     every training episode's run directory (ait.runs)
    RUN_DIR/costs.jsonl        the spend ledger of every episode of the run (unless [episode] ledger_path)
    RUN_DIR/heldout/step-N/    each held-out evaluation (ait.agent_eval): runs/<task>-<i>/, results.json
"""

from __future__ import annotations

import glob
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ait.compute.executors import Executor
from ait.harness.types import EpisodeConfig
from ait.outer import checkpoint as ckpt
from ait.outer.backends import make_backend
from ait.outer.config import OuterConfig
from ait.outer.executors import OuterRunError, job_executor
from ait.outer.heldout import (
    evaluate_heldout,
    heldout_transfer,
    restore_start,
    results_path,
    start_for_bundle,
)
from ait.outer.metrics import Episode, MetricsLog, step_metrics
from ait.outer.prefetch import baseline_prefetch, prefetch_every_task
from ait.outer.rollouts import GroupSampler
from ait.outer.tasks import training_tasks
from ait.outer.types import TrainerBackend
from ait.runs import new_run_id, runs_root, versions


@dataclass
class Run:
    """An open run: its directory, backend, the executor its episodes' jobs share, sampler, metrics log
    and the state it starts from."""

    dir: Path
    config: OuterConfig
    backend: TrainerBackend
    executor: Executor
    sampler: GroupSampler
    metrics: MetricsLog
    state: ckpt.LoopState
    episode_config: EpisodeConfig
    heldout_paths: list[Path]
    lineage: list[dict[str, Any]]
    """Earlier runs of this arc (continued from a bundle), oldest first; empty for a run begun here."""

    def groups_needed(self, step: int) -> int:
        """Groups the steps after `step` still train on."""
        return (self.config.max_steps - step) * self.config.groups_per_step

    def heldout_due(self, step: int) -> bool:
        return bool(self.heldout_paths) and (step % self.config.heldout_every == 0 or step == self.config.max_steps)

    def checkpoint(self, step: int, usd_total: float) -> None:
        state = ckpt.LoopState(step=step, config_digest=self.config.digest(),
                               rng_state=ckpt.rng_to_json(self.sampler.rng), groups_launched=self.sampler.launched,
                               usd_total=usd_total, usd_carried=self.state.usd_carried)
        ckpt.save_checkpoint(self.dir, self.backend, state, config=self.config, lineage=self.lineage,
                             max_bytes=self.config.checkpoint_max_mib * 2**20, extra=start_for_bundle(self.dir))

    def evaluate_heldout(self, step: int) -> list[Episode]:
        return evaluate_heldout(self.dir, self.config, self.backend, self.episode_config, self.heldout_paths,
                                self.sampler.stopping, step, self.executor)

    def close(self) -> None:
        self.sampler.close()  # waits for the episodes under way, so no job still needs the executor
        self.backend.close()
        self.executor.close()


def train(config: OuterConfig | None, run_dir: str | Path | None = None, *, resume: bool = False,
          resume_from: str | Path | None = None, on_step: Callable[[dict[str, Any]], None] | None = None,
          on_event: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the outer loop up to config.max_steps; returns a summary. `resume_from`: a
    checkpoint bundle (another machine's RUN_DIR/checkpoints/step_N) that a new run_dir continues
    (config None: the bundle's own)."""
    say = on_event or (lambda _msg: None)
    if resume_from is not None:
        run_dir = Path(run_dir or runs_root() / new_run_id("outer")).resolve()
        config = import_bundle(Path(resume_from), run_dir, config)
        for warning in json.loads((run_dir / "manifest.json").read_text())["continued_from"]["warnings"]:
            say(f"warning: {warning}")
        say(f"continuing from {resume_from}")
        resume = True
    assert config is not None
    run = open_run(config, run_dir, resume, say)
    config, backend, sampler = run.config, run.backend, run.sampler
    step, usd_total, stopped, saved_at = run.state.step, run.state.usd_total, "max_steps", run.state.step
    row: dict[str, Any] = {}
    phases: dict[str, float] = {"checkpoint": 0.0}
    t_last = time.monotonic()
    try:
        if run.heldout_paths and step == 0 and not results_path(run.dir, 0).is_file():
            say("step 0: held-out evaluation of the starting policy (later ones are compared with it)")
            usd_total += sum(e.result.cost.total_usd for e in run.evaluate_heldout(0))
        if step == 0 and not (ckpt.checkpoints_dir(run.dir) / "step_0").is_dir():
            # A bundle now, so that a machine lost during step 1 keeps the warm start (and the step-0
            # evaluation), and an arc's end can compare its final adapter with the warm start's.
            t0 = time.monotonic()
            run.checkpoint(0, usd_total)
            phases["checkpoint"] = time.monotonic() - t0
        while step < config.max_steps:
            if config.budget_usd is not None and usd_total >= config.budget_usd:
                stopped = "budget"
                say(f"budget of ${config.budget_usd:g} reached (${usd_total:.4f} spent)")
                break
            sampler.fill(run.groups_needed(step))  # tops up: a no-op when the last step's fill already did
            say(f"step {step + 1}: waiting for {config.groups_per_step} group(s)")
            version = backend.step
            t0 = time.monotonic()
            groups, dropped = sampler.take(config.groups_per_step, version, run.groups_needed(step))
            phases["wait_groups"] = time.monotonic() - t0
            say(f"step {step + 1}: training")
            t0 = time.monotonic()
            stats = backend.train_step([g.group for g in groups])
            phases["train_step"] = time.monotonic() - t0
            step += 1
            sampler.fill(run.groups_needed(step))  # the next step's groups sample while this one finishes
            heldout = None
            t0 = time.monotonic()
            if run.heldout_due(step):
                say(f"step {step}: held-out evaluation")
                heldout = run.evaluate_heldout(step)
            phases["heldout"] = time.monotonic() - t0
            usd = sum(g.usd for g in groups + dropped) + sum(e.result.cost.total_usd for e in heldout or [])
            usd_total += usd
            now = time.monotonic()
            row = step_metrics(step, groups, stats, version=backend.step, seconds=now - t_last,
                               staleness=[version - g.group.policy_version for g in groups],
                               resampled=len(dropped), usd=usd, usd_total=usd_total, heldout=heldout,
                               infra_errors=sum(len(g.infra) for g in groups + dropped),
                               transfer=heldout_transfer(run.dir, step) if heldout is not None else None,
                               phases=phases)
            t_last = now
            run.metrics.append(row)
            phases = {"checkpoint": 0.0}
            if step % config.checkpoint_every == 0 or step == config.max_steps:
                t0 = time.monotonic()
                run.checkpoint(step, usd_total)
                phases["checkpoint"] = time.monotonic() - t0  # counted in the next step's seconds
                saved_at = step
            if on_step:
                on_step(row)
        if saved_at != step:
            run.checkpoint(step, usd_total)
    finally:
        run.close()
    rows = run.metrics.rows()
    latest = ckpt.latest(run.dir)
    return {"run_dir": str(run.dir), "step": step, "max_steps": config.max_steps, "stopped": stopped,
            "policy_version": backend.step, "reward_first": rows[0]["reward_mean"] if rows else None,
            "reward_last": rows[-1]["reward_mean"] if rows else None, "usd_total": usd_total,
            "checkpoint": str(latest) if latest else None, "metrics": str(run.metrics.path), "last": row}


def open_run(config: OuterConfig, run_dir: str | Path | None, resume: bool, say: Callable[[str], None]) -> Run:
    """Directory, manifest, (warm-started or resumed) backend, sampler: everything the loop starts from."""
    import torch

    run_dir = Path(run_dir or runs_root() / new_run_id("outer")).resolve()
    task_paths = resolve_tasks(config.tasks)
    heldout_paths = resolve_tasks(config.heldout_tasks) if config.heldout_every else []
    torch.manual_seed(config.seed)
    if config.prefetch_baselines and not resume:
        prefetch_every_task(config, task_paths, first_slot=0, say=say)  # beside the warm start
    if config.warmstart.steps and not resume and not config.policy.init_checkpoint:
        say(f"warm start: {config.warmstart.steps} supervised steps on reference transcripts")
        config = with_warm_start(config, task_paths)
    state = start_run(run_dir, config, resume)
    if config.prefetch_baselines and resume:
        prefetch_every_task(config, task_paths, first_slot=state.step * config.groups_per_step, say=say)  # beside the load
    # Built before the policy: on Ray the agent's GPU share is placed first and fixes its device.
    executor, config = job_executor(config, say)
    try:
        say("loading the policy")
        # On resume the checkpoint's adapter replaces any warm start: it is not loaded (its path may be
        # another machine's).
        backend = make_backend(without_init(config) if resume else config)
        if resume:
            backend.load(str(ckpt.latest(run_dir) / "backend"))
    except BaseException:
        executor.close()
        raise
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    metrics.truncate_after(state.step)  # rows a crash left past the checkpoint are written again
    episodes_cfg = episode_config(config, run_dir, carried_usd=state.usd_carried)
    sampler = GroupSampler(backend=backend, executor=executor, task_paths=task_paths,
                           rng=ckpt.rng_from_json(state.rng_state), episode_config=episodes_cfg, runs_dir=run_dir / "episodes",
                           group_size=config.num_generations, groups_per_step=config.groups_per_step,
                           max_off_policy=config.max_steps_off_policy, concurrency=config.concurrency,
                           seed=config.seed, groups_launched=state.groups_launched,
                           task_sampling=config.task_sampling, first_slot=state.step * config.groups_per_step,
                           prefetch=baseline_prefetch(episodes_cfg) if config.prefetch_baselines else None)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return Run(dir=run_dir, config=config, backend=backend, executor=executor, sampler=sampler, metrics=metrics,
               state=state, episode_config=episodes_cfg, heldout_paths=heldout_paths,
               lineage=manifest.get("lineage", []))


def without_init(config: OuterConfig) -> OuterConfig:
    return config.model_copy(update={"policy": config.policy.model_copy(update={"init_checkpoint": None})})


def import_bundle(bundle: Path, run_dir: Path, config: OuterConfig | None = None) -> OuterConfig:
    """A new run directory that continues the arc of `bundle` (see ait.outer.checkpoint): the bundle
    checked and copied to RUN_DIR/checkpoints/step_N, its metrics rows as RUN_DIR/metrics.jsonl, its
    config (or `config`, which must train the same weights) as RUN_DIR/config.json, the manifest
    naming the runs it continues. Returns the config. Raises BundleError / OuterRunError (one line)."""
    from pydantic import ValidationError

    manifest = ckpt.verify_bundle(bundle)
    try:
        saved = OuterConfig.model_validate(manifest["config"])
    except ValidationError as e:
        first = e.errors()[0]
        raise ckpt.BundleError(f"{bundle}: its config does not validate here "
                               f"({'.'.join(map(str, first['loc']))}: {first['msg']})") from None
    config = config or saved
    for name, ours, theirs in (("policy.model", config.policy.model, saved.policy.model),
                               ("trainer.backend", config.trainer.backend, saved.trainer.backend),
                               ("trainer.lora_r", config.trainer.lora_r, saved.trainer.lora_r),
                               ("trainer.lora_alpha", config.trainer.lora_alpha, saved.trainer.lora_alpha),
                               ("trainer.lora_target_modules", config.trainer.lora_target_modules,
                                saved.trainer.lora_target_modules)):
        if ours != theirs:
            raise ckpt.BundleError(f"{bundle} was trained with {name} = {theirs!r}; the config has {ours!r}")
    if manifest.get("model") not in (None, config.policy.model):
        raise ckpt.BundleError(f"{bundle} holds weights of {manifest['model']!r}, not {config.policy.model!r}")
    if (run_dir / "metrics.jsonl").exists() or ckpt.latest(run_dir) is not None:
        raise OuterRunError(f"{run_dir} already holds a run; --resume-from starts a new run directory")
    step = int(manifest["step"])
    warnings = []
    if manifest.get("hidden_secret_id") not in (None, ckpt.hidden_secret_id()):
        warnings.append("this machine's hidden-eval secret differs from the one the bundle was written under: "
                        "inner jobs are scored on other hidden sets (set AIT_HIDDEN_SEED alike on every machine)")
    lineage = [*manifest.get("lineage", []), {"run": manifest.get("source_run"), "to_step": step,
                                              "bundle": str(Path(bundle).resolve())}]
    dest = ckpt.checkpoints_dir(run_dir) / f"step_{step}"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(bundle, tmp)
    state = ckpt.load_state(tmp)
    # The spend so far is in the earlier runs' ledgers, not this run's costs.jsonl.
    state = state.model_copy(update={"usd_carried": state.usd_total})
    (tmp / "state.json").write_text(state.model_dump_json(indent=2) + "\n")
    ckpt.seal(tmp, step=step, config=saved, source=Path(manifest.get("source_run") or "?"),
              max_bytes=manifest.get("max_bytes"), lineage=manifest.get("lineage", []))
    tmp.rename(dest)
    shutil.copyfile(dest / ckpt.METRICS_FILE, run_dir / "metrics.jsonl")
    restore_start(dest, run_dir)  # the step-0 held-out results later steps are compared with
    (run_dir / "manifest.json").write_text(json.dumps({
        "kind": "outer", "started_at": time.time(), "versions": versions(), "resumes": [],
        "continued_from": {"bundle": str(Path(bundle).resolve()), "step": step, "run": manifest.get("source_run"),
                           "config_digest": manifest.get("config_digest"), "warnings": warnings},
        "lineage": lineage}, indent=2, default=str) + "\n")
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    return config


# ---- helpers ---------------------------------------------------------------------------------


def resolve_tasks(patterns: list[str]) -> list[Path]:
    """Paths and globs -> TaskSpec files (in order, without duplicates). `examples/tasks/...` falls back
    to the specs installed with the package when run outside a source checkout."""
    from ait.tasks import shipped_pattern

    out: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) or ([pattern] if Path(pattern).is_file() else [])
        if not matches and (shipped := shipped_pattern(pattern)):
            matches = sorted(glob.glob(shipped))
        if not matches:
            raise OuterRunError(f"tasks: {pattern!r} matches no file")
        out += [Path(m).resolve() for m in matches if Path(m).resolve() not in out]
    return out


def episode_config(config: OuterConfig, run_dir: Path, carried_usd: float = 0.0) -> EpisodeConfig:
    """The harness config of every episode: the [episode] table plus the run's limits (the run budget
    less `carried_usd`, what earlier runs of the arc spent outside this run's ledger)."""
    update: dict[str, Any] = {"timeout_s": config.episode_timeout_s, "run_group": run_dir.name}
    if config.episode.ledger_path is None:  # training and held-out episodes share one ledger (and budget)
        update["ledger_path"] = str(run_dir / "costs.jsonl")
    if config.budget_usd is not None and config.episode.run_budget_usd is None:
        update["run_budget_usd"] = max(config.budget_usd - carried_usd, 0.0)
    if "keep_checkpoints" not in config.episode.model_fields_set:
        # The H200 arc of 2026-11-30 kept 40 GB of inner checkpoints after five steps of 12 episodes
        # (a 64 GB disk); the loop reads only each job's scores.
        update["keep_checkpoints"] = False
    return config.episode.model_copy(update=update)


def start_run(run_dir: Path, config: OuterConfig, resume: bool) -> ckpt.LoopState:
    """A fresh run's directory and state, or a resumed run's state from its latest checkpoint."""
    manifest_path = run_dir / "manifest.json"
    if resume:
        latest = ckpt.latest(run_dir)
        if latest is None:
            raise OuterRunError(f"nothing to resume: {run_dir} has no checkpoints/step_N/state.json")
        state = ckpt.load_state(latest)
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        manifest.setdefault("resumes", []).append({"at": time.time(), "from_step": state.step,
                                                   "config_changed": state.config_digest != config.digest()})
    else:
        if (run_dir / "metrics.jsonl").exists() or ckpt.latest(run_dir) is not None:
            raise OuterRunError(f"{run_dir} already holds a run; pass --resume {run_dir} to continue it")
        training = training_tasks(resolve_tasks(config.tasks))
        if not training:
            raise OuterRunError("tasks: every task given is held out (or none given); nothing to train on")
        state = ckpt.LoopState(step=0, config_digest=config.digest(),
                               rng_state=ckpt.rng_to_json(random.Random(config.seed)))
        manifest = {"kind": "outer", "started_at": time.time(), "versions": versions(), "resumes": []}
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest.update({"config": config.model_dump(mode="json"), "config_digest": config.digest()})
    manifest_path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2) + "\n")
    return state


def with_warm_start(config: OuterConfig, task_paths: list[Path]) -> OuterConfig:
    """The config with [policy] init_checkpoint set to a (cached) reference warm start."""
    from ait.outer.warmstart import build_warm_start

    specs = [spec for spec, _ in training_tasks(task_paths)]
    w = config.warmstart
    path = build_warm_start(config, specs, steps=w.steps, learning_rate=w.learning_rate, batch_size=w.batch_size,
                            base_models=w.base_models, variants_per_task=w.variants_per_task,
                            per_model_variant=w.model_variant_transcripts)
    update = config.policy.model_copy(update={"init_checkpoint": str(path)})
    return config.model_copy(update={"policy": update})


def load_run_config(run_dir: Path) -> OuterConfig:
    """The config a run was started (or last resumed) with."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise OuterRunError(f"{path} not found: not an outer-loop run directory")
    return OuterConfig.model_validate_json(path.read_text())
