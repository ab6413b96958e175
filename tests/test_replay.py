"""Replaying an episode: scripts/recompute_reward.py (which imports nothing of ait) recomputes the
reward from the run directory's plain files and the baselines store, exactly, and notices a change."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fakes import TASK, fake_executor, memo_probe, ok_result

from ait.evals.baselines import Baseline, BaselineStore
from ait.evals.hidden import eval_fingerprint
from ait.harness.episode import run_episode
from ait.harness.types import EpisodeConfig
from ait.policy.reference import ReferencePolicy
from ait.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "recompute_reward.py"
REPLAY = ROOT / "docs" / "measurements" / "replay-cpu"


def recompute(run_dir: Path, store: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), "--baselines", str(store), "--json"],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def test_the_committed_replay_recomputes_exactly():
    (run_dir,) = [p for p in REPLAY.iterdir() if p.is_dir()]
    code, out = recompute(run_dir, REPLAY / "baselines.json")
    assert code == 0 and out["match"], out
    assert out["recomputed"]["total"] == json.loads((run_dir / "reward.json").read_text())["total"]


def test_a_changed_baseline_is_noticed(tmp_path):
    copy = tmp_path / "replay"
    shutil.copytree(REPLAY, copy)
    store = json.loads((copy / "baselines.json").read_text())
    store["baselines"][0]["best_pre"] = 0.5
    (copy / "baselines.json").write_text(json.dumps(store))
    (run_dir,) = [p for p in copy.iterdir() if p.is_dir()]
    code, out = recompute(run_dir, copy / "baselines.json")
    assert code == 1 and not out["match"] and out["recomputed"]["best_pre"] == 0.5


def test_an_episode_with_uplift_recomputes_exactly(tmp_path, monkeypatch):
    """Non-zero scores and a best_pre from another model's frozen baseline than the one trained."""
    import ait.train.models as models

    memo_probe(monkeypatch)
    monkeypatch.setattr(models, "model_availability", lambda name: None if name == "tiny" else "not here (test)")
    spec = load_spec(TASK)
    store = BaselineStore(tmp_path / "b.json")
    # A frozen baseline for a stronger model this install lacks is not part of best_pre (excluded) ...
    store.freeze(Baseline(family=spec.family, base_model="smollm2-135m", weights_sha256="f" * 64, setup="s" * 16,
                          fingerprint=eval_fingerprint(spec, 200), best_pre=0.9, n=200))
    result = run_episode(spec, TASK, ReferencePolicy(), EpisodeConfig(), runs_dir=tmp_path / "runs",
                         baselines=store, executor=fake_executor(ok_result(pre=0.31, post=0.67, train_seconds=123.4)))
    assert result.reward.best_pre == 0.31 and "smollm2-135m" in result.baseline.excluded
    code, out = recompute(Path(result.run_dir), tmp_path / "b.json")
    assert code == 0 and out["match"], out
    assert out["recomputed"]["uplift_term"] == (0.67 - 0.31) / (1 - 0.31)


def test_a_store_without_the_episodes_baseline_says_why_it_cannot_recompute(tmp_path):
    copy = tmp_path / "replay"
    shutil.copytree(REPLAY, copy)
    (copy / "baselines.json").write_text(json.dumps({"baselines": []}))
    (run_dir,) = [p for p in copy.iterdir() if p.is_dir()]
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), "--baselines", str(copy / "baselines.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot recompute" in proc.stderr and "--baselines" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
