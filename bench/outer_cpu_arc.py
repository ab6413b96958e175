"""A miniature outer-loop arc on CPU: the tiny agent, warm-started to call submit_job first,
RL-trained for a few steps on real episodes with the tiny inner model, then `ait report`.

    python bench/outer_cpu_arc.py [--steps 8] [--out runs/outer-cpu-arc]

The warm start (SFT on "opening messages -> submit_job") only teaches the tool-call format:
a random 2-layer agent otherwise never submits and every reward is -0.1. The rewards stay
the harness's: 0.0 for submitting the (invalid) template workspace, -0.1 for never
submitting. What the arc can show is whether RL makes the well-formed call likelier.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ait.configs import load_config
from ait.harness.episode import opening_messages
from ait.harness.types import Message, ToolCallRequest
from ait.outer.config import OuterConfig
from ait.outer.loop import resolve_tasks
from ait.outer.tasks import training_tasks
from ait.outer.warmstart import sft_warm_start

ROOT = Path(__file__).resolve().parents[1]
HEAD = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def toml(data: dict, prefix: str = "") -> str:
    out = "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items() if not isinstance(v, dict))
    for k, v in data.items():
        if isinstance(v, dict):
            out += f"\n[{prefix}{k}]\n" + toml(v, f"{prefix}{k}.")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="runs/outer-cpu-arc")
    args = p.parse_args()
    data = load_config(ROOT / "configs" / "outer" / "cpu_tiny.toml", OuterConfig).model_dump(mode="json",
                                                                                           exclude_none=True)
    tasks = ROOT / "examples" / "tasks"
    data.update(tasks=[str(tasks / "*.json")], heldout_tasks=[str(tasks / "triage.json")], max_steps=args.steps,
                num_generations=4, max_steps_off_policy=1, heldout_every=4, checkpoint_every=4)
    data["trainer"] = {**data["trainer"], "lora_target_modules": HEAD}
    work = Path(tempfile.mkdtemp(prefix="ait-arc-"))
    (work / "sft.toml").write_text(toml(data))
    config = load_config(work / "sft.toml", OuterConfig)
    submit = Message(role="assistant", tool_calls=[ToolCallRequest(id="call_0", name="submit_job", arguments={})])
    transcripts = [[*opening_messages(spec), submit] for spec, _ in training_tasks(resolve_tasks(config.tasks))]
    warm = sft_warm_start(config, transcripts, steps=120, learning_rate=1e-2, batch_size=2, cache_dir=work / "ws")
    data["policy"] = {**data["policy"], "init_checkpoint": str(warm)}
    (work / "arc.toml").write_text(toml(data))
    run = subprocess.run([sys.executable, "-m", "ait.cli", "train", "--config", str(work / "arc.toml"),
                          "--run-dir", args.out, "--json"], check=False)
    if run.returncode != 0:
        return run.returncode
    return subprocess.run([sys.executable, "-m", "ait.cli", "report", args.out, "--out", args.out],
                          check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
