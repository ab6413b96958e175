"""The sandbox on a GPU machine: which layers work, CUDA inside every layer, a real job (training
and eval both sandboxed) on the GPU, and two jobs packed under CUDA MPS with a private /dev/shm.

    python bench/gpu_trust_check.py [--out DIR] [--mps]

Prints one line per check and writes DIR/gpu-trust-check.json. The jobs train the tiny model
(built on the fly), so nothing has to be staged; what is measured is that the layers let CUDA
and MPS work and still confine the run, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ait.sandbox import SandboxPolicy, run_untrusted
from ait.sandbox.detect import cached_capabilities

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "tasks" / "calc_chain_fast.json"
REFERENCE = ROOT / "src" / "ait" / "policy" / "reference_jobs" / "calc_chain"
CUDA_PROBE = """
import os, socket, torch
x = torch.ones(1 << 20, device='cuda')
print('CUDA_OK', torch.cuda.get_device_name(0), float((x * 2).sum()))
def attempt(label, act):
    try:
        print(label, 'DONE', act())
    except OSError as e:
        print(label, 'REFUSED', type(e).__name__)
attempt('secret', lambda: open(os.environ.get('PROBE_SECRET', '/nonexistent')).read())
attempt('socket', lambda: socket.socket(socket.AF_UNIX).connect('/tmp/ait-gpu-check.sock'))
attempt('shm', lambda: os.listdir('/dev/shm'))
"""


def check(results: dict, name: str, fn) -> None:
    t0 = time.monotonic()
    try:
        value = fn()
        results[name] = {"ok": True, "value": value, "seconds": round(time.monotonic() - t0, 2)}
    except Exception as e:  # noqa: BLE001 - every check reports, none stops the others
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[-2000:], "seconds": round(time.monotonic() - t0, 2)}
    print(f"{name:<28} {'ok' if results[name]['ok'] else 'FAIL'}  {json.dumps(results[name])[:400]}", flush=True)


def cuda_in_sandbox(mps_dir: str | None) -> str:
    from ait.home import ait_home, hidden_secret

    hidden_secret()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-trust-"))
    listener = subprocess.Popen(["python3", "-c", "import socket, os\ns = socket.socket(socket.AF_UNIX)\n"
                                 "p = '/tmp/ait-gpu-check.sock'\nos.path.exists(p) and os.unlink(p)\ns.bind(p)\n"
                                 "s.listen()\ns.settimeout(60)\ntry:\n    s.accept()\n    print('ACCEPTED')\nexcept OSError:\n    pass"],
                                stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    outcome = run_untrusted(["-c", CUDA_PROBE], cwd=tmp, timeout_s=300, log_path=tmp / "log",
                            policy=SandboxPolicy(write=[str(tmp)], gpu=True, mps_pipe_dir=mps_dir),
                            env={"PROBE_SECRET": str(ait_home() / "hidden_secret")})
    listener.kill()
    accepted = "ACCEPTED" in (listener.communicate()[0] or "")
    if "CUDA_OK" not in outcome.log_tail or accepted or "secret DONE" in outcome.log_tail:
        raise RuntimeError(f"accepted={accepted} rc={outcome.returncode}\n{outcome.log_tail}")
    return outcome.log_tail


def make_job(tmp: Path, name: str):
    from ait.job.config import load_job_config
    from ait.job.types import Job
    from ait.spec import load_spec

    ws = tmp / name / "ws"
    shutil.copytree(REFERENCE, ws)
    return Job(job_id=name, run_dir=str(tmp / name / "run"), workspace=str(ws), task_path=str(TASK),
               config=load_job_config(ws / "job.toml", load_spec(TASK).constraints), time_budget_s=300, eval_size=16)


def job_on_gpu() -> dict:
    from ait.compute.run_job import run_job

    tmp = Path(tempfile.mkdtemp(prefix="gpu-trust-job-"))
    result = run_job(make_job(tmp, "alone"), extra_env={"CUDA_VISIBLE_DEVICES": "0"})
    if not result.ok:
        raise RuntimeError(result.error)
    return {"pre": result.pre, "post": result.post, "train_s": result.train_seconds, "total_s": result.total_seconds}


def packed_under_mps(mps_dir: str) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from ait.compute.local import LocalExecutor, run_job_in_slot, slot_envs

    tmp = Path(tempfile.mkdtemp(prefix="gpu-trust-mps-"))
    ex = LocalExecutor(slot_envs(2, ["0"], jobs_per_gpu=2), job_fn=run_job_in_slot)
    made = [make_job(tmp, f"p{i}") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(ex.run, made))
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise RuntimeError(bad[0])
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/tmp/nvidia-mps-log")) / "server.log"
    clients = log.read_text().count("connected\n") if log.exists() else -1
    return {"ok_jobs": len(results), "retried_alone": [r.metrics.get("pack/retried_alone", 0.0) for r in results],
            "mps_server_new_clients": clients}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--mps", action="store_true", help="start the MPS daemon and run the packed check")
    args = p.parse_args()
    results: dict = {}
    caps = cached_capabilities(refresh=True)
    results["kernel"] = caps.kernel
    results["layers"] = {layer.name: {"active": layer.active, "detail": layer.detail} for layer in caps.layers}
    print("kernel", caps.kernel, "active:", [layer.name for layer in caps.layers if layer.active], flush=True)
    check(results, "cuda_in_every_layer", lambda: cuda_in_sandbox(None))
    check(results, "job_train_and_eval_on_gpu", job_on_gpu)
    if args.mps and shutil.which("nvidia-cuda-mps-control"):
        pipe, logs = "/tmp/nvidia-mps", "/tmp/nvidia-mps-log"
        os.makedirs(pipe, exist_ok=True)
        os.makedirs(logs, exist_ok=True)
        os.environ.update(CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logs)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
        check(results, "cuda_under_mps_private_shm", lambda: cuda_in_sandbox(pipe))
        check(results, "two_jobs_packed_under_mps", lambda: packed_under_mps(pipe))
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-trust-check.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
