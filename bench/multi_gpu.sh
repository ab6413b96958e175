#!/usr/bin/env bash
# Several GPUs of one host (2 or 4: nvidia-h200-x2 / nvidia-h200-x4): Ray throughput, the step, chaos. Everything at once,
# detached (results and logs under docs/measurements and $LOG as it goes):
#   setsid bench/multi_gpu.sh all > /root/multi_gpu.log 2>&1 < /dev/null &
# or one stage per device call (each well under 10 minutes):
#   bench/multi_gpu.sh tests | throughput1 | throughput2 | throughput4 | step | chaos | arc
# K per GPU: K=4 (default) or K=8 (the local packing's best on one H200) via the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && source .venv/bin/activate
N=$(nvidia-smi -L | wc -l)
K=${K:-4}
OUT=${OUT:-docs/measurements/multi-gpu-h200-x$N-k$K.json}

stage() {
  echo "== $1 ($(date -u +%H:%M:%S), $N GPU(s), K=$K)"
  case "$1" in
    tests)  # the CPU suite of the Ray executor, first: a broken install shows here, in seconds
      python -m pytest -o addopts="" -q tests/test_ray_gpus.py tests/test_ray_executor.py tests/test_multi_gpu_bench.py ;;
    throughput1|throughput2|throughput4)  # jobs/hour of the standard job on G GPUs, 2 rounds of G x K jobs
      G=${1#throughput}
      if [ "$G" -le "$N" ]; then python bench/multi_gpu.py --gpus "$G" --jobs-per-gpu "$K" --only throughput --json "$OUT"; fi ;;
    step)  # one outer step's jobs (N x K less the agent's slot) spread over N GPUs vs packed on one
      python bench/multi_gpu.py --gpus "$N" --jobs-per-gpu "$K" --only step --json "$OUT" ;;
    chaos)  # real GPU processes; workers and Ray worker processes SIGKILLed at random
      python bench/chaos_queue.py --executor ray --gpus "$N" --real-gpus --cuda --kill-slots --jobs 64 --workers 2 \
        --slots $((N * K / 2)) --jobs-per-gpu "$K" --lease 5 --json > "docs/measurements/chaos-ray-h200-x$N.json" ;;
    arc)  # the outer loop itself on Ray: agent on its GPU share, 16 episodes' jobs over the GPUs
      ait train --config configs/outer/h200_ray_x4.toml --run-dir "runs/outer-ray-x$N" --json ;;
    all)
      for s in tests throughput1 throughput2 throughput4 step chaos; do stage "$s"; done ;;
    *) echo "unknown stage $1" >&2; exit 2 ;;
  esac
}

for s in "${@:-all}"; do stage "$s"; done
