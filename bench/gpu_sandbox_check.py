"""Which sandbox layer, if any, stops CUDA from starting? Run on a GPU machine.

    python bench/gpu_sandbox_check.py

Each variant runs `torch.cuda.init()` and a tiny CUDA op through the real launcher with a
subset of layers (and, for Landlock, wider allow-lists), and prints ok or the error.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from ait.sandbox import python_argv, scrubbed_env
from ait.sandbox.detect import cached_capabilities
from ait.sandbox.launch import LaunchPlan, plan_paths
from ait.sandbox.types import SandboxPolicy

def landlock_probe(max_abi: int | None, scope: bool, write: list[str] = ("/tmp", "/dev/null")) -> str:
    """Landlock alone, with one feature turned off, then the CUDA probe (in-process, no exec)."""
    return ("import os; from ait.sandbox import landlock, launch; "
            f"landlock.restrict(['/'], {list(write)!r}, launch.GPU_DEVICES + ['/dev/' + d for d in os.listdir('/dev') if d.startswith('nvidia')], max_abi={max_abi}, scope={scope}); "
            + PROBE_BODY)


PROBE_BODY = ("import torch; torch.cuda.init(); x = torch.ones(4, device='cuda'); "
              "print('CUDA_OK', torch.cuda.get_device_name(0), float((x * 2).sum()))")
PROBE = ("import torch; torch.cuda.init(); x = torch.ones(4, device='cuda'); "
         "print('CUDA_OK', torch.cuda.get_device_name(0), float((x * 2).sum()))")


def attempt(name: str, layers: list[str], read: list[str], write: list[str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    policy = SandboxPolicy(read=read, write=[str(tmp), *write], gpu=True)
    plan = LaunchPlan(policy=policy, layers=layers, paths=plan_paths(policy), args=python_argv(["-c", PROBE]))
    proc = subprocess.run(python_argv(["-m", "ait.sandbox.launch", plan.model_dump_json()]), cwd=tmp,
                          env=scrubbed_env(tmp), capture_output=True, text=True, timeout=300)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    ok = any("CUDA_OK" in line for line in out)
    print(f"{name:<34} {'ok' if ok else 'FAIL'}  {'' if ok else (out[-1] if out else proc.returncode)}", flush=True)


def main() -> None:
    caps = cached_capabilities(refresh=True)
    active = [layer.name for layer in caps.layers if layer.active]
    print("active layers:", active)
    attempt("no layers", [], [], [])
    attempt("all layers (the launcher as shipped)", active, [], [])
    base = ["/tmp", "/dev/null"]
    variants = [(7, base + ["/proc/driver"]), (7, base + ["/proc/self"])]
    for max_abi, write in variants:
        proc = subprocess.run([sys.executable, "-c", landlock_probe(max_abi, True, write)], capture_output=True,
                              text=True, timeout=300)
        out = (proc.stdout + proc.stderr).strip().splitlines()
        ok = any("CUDA_OK" in line for line in out)
        print(f"landlock abi<={max_abi} write={write}  {'ok' if ok else 'FAIL'}  {'' if ok else out[-1][-120:]}",
              flush=True)


if __name__ == "__main__":
    main()
