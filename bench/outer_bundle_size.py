"""The size of one outer-loop checkpoint bundle (RUN_DIR/checkpoints/step_N) for a real agent shape,
and what each encoding loses (ait.outer.state_codec).

    python bench/outer_bundle_size.py --like qwen2.5-0.5b --lora-r 32   # h200_mini.toml's agent; CPU, ~2 min

Random weights of the shape (bench/outer_sampler_speed.py's stand-ins; a bundle's size depends on the
shape and the LoRA settings, not the weights), LoRA on every linear layer, two AdamW steps of a
next-token loss so that both moments hold real values, then the bundle saved through the loop's own
`save_checkpoint` under the 64 MiB bound and unbounded (float32, exact), each loaded back into a fresh
backend. Reported per encoding: files, bytes, and the round trip's error in the adapter, in m, in v
and in the update AdamW would take next (m / (sqrt(v) + eps), bias-corrected).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outer_sampler_speed import SHAPES, random_model  # noqa: E402

from ait.outer import checkpoint as ckpt  # noqa: E402
from ait.outer.backends.local import LocalBackend  # noqa: E402
from ait.outer.config import OuterConfig  # noqa: E402


def update(state: dict, group: dict) -> torch.Tensor:
    b1, b2 = group["betas"]
    t = float(state["step"])
    m, v = state["exp_avg"] / (1 - b1 ** t), state["exp_avg_sq"] / (1 - b2 ** t)
    return m / (v.sqrt() + group["eps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--like", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--lora-alpha", type=int, default=64)
    ap.add_argument("--max-mib", type=float, default=64.0)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = random_model(args.like, tmp / args.like, torch.float32)
        config = OuterConfig(policy={"model": model, "max_new_tokens": 16},
                             trainer={"device": "cpu", "lora_r": args.lora_r, "lora_alpha": args.lora_alpha,
                                      "learning_rate": 4e-5})
        backend = LocalBackend(config)
        g = torch.Generator().manual_seed(0)
        for _ in range(2):
            ids = torch.randint(3, 2000, (48,), generator=g).tolist()
            backend.sft_step([(ids[:16], ids[16:])])
        backend.step = 2
        names = list(backend.params)
        weights = backend.adapter_state()
        opt = backend.optimizer.state_dict()
        group = opt["param_groups"][0]
        out = {"shape": args.like, "lora_r": args.lora_r, "lora_target_modules": "all-linear",
               "trainable_params": backend.trainable_params(), "max_mib": args.max_mib, "encodings": {}}
        for label, bound in (("bounded", args.max_mib * 2**20), ("unbounded", None)):
            run = tmp / f"run-{label}"
            run.mkdir()
            (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.1}) + "\n"
                                                       for s in (1, 2)))
            state = ckpt.LoopState(step=2, config_digest=config.digest(), rng_state=ckpt.rng_to_json(__import__(
                "random").Random(0)))
            t0 = time.monotonic()
            dest = ckpt.save_checkpoint(run, backend, state, config=config, max_bytes=bound)
            save_s = time.monotonic() - t0
            manifest = ckpt.verify_bundle(dest)
            files = [p for p in dest.rglob("*") if p.is_file()]
            fresh = LocalBackend(config)
            t0 = time.monotonic()
            fresh.load(str(dest / "backend"))
            load_s = time.monotonic() - t0
            got, got_opt = fresh.adapter_state(), fresh.optimizer.state_dict()
            fresh.close()
            w_err = max(float((weights[k] - got[k]).abs().max() / weights[k].abs().max().clamp_min(1e-30))
                        for k in names if weights[k].abs().max() > 0)
            m_err = v_err = u_err = 0.0
            for i in opt["state"]:
                a, b = opt["state"][i], got_opt["state"][i]
                m_err = max(m_err, float((a["exp_avg"] - b["exp_avg"]).abs().max() /
                                         a["exp_avg"].abs().max().clamp_min(1e-30)))
                nz = a["exp_avg_sq"] > 0
                v_err = max(v_err, float((a["exp_avg_sq"][nz] / b["exp_avg_sq"][nz].clamp_min(1e-38)).log2().abs()
                                         .max()) if nz.any() else 0.0)
                ua, ub = update(a, group), update(b, group)
                u_err = max(u_err, float((ua - ub).norm() / ua.norm().clamp_min(1e-30)))
            out["encodings"][manifest["encoding"]] = {
                "bound_mib": args.max_mib if bound else None, "files": len(files),
                "bytes": sum(p.stat().st_size for p in files),
                "mib": round(sum(p.stat().st_size for p in files) / 2**20, 2),
                "per_file_bytes": {p.relative_to(dest).as_posix(): p.stat().st_size for p in files},
                "adapter_max_rel_err": w_err, "exp_avg_max_err_of_tensor_max": m_err,
                "exp_avg_sq_max_abs_log2_err": v_err, "next_update_rel_l2_err_worst_tensor": u_err,
                "save_s": round(save_s, 2), "load_s": round(load_s, 2)}
            print(json.dumps({manifest["encoding"]: out["encodings"][manifest["encoding"]]}, indent=1))
        backend.close()
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
