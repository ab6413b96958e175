#!/usr/bin/env bash
# Issue 21, first look: where the standard job's seconds go on the GPU machine, today's code vs an
# earlier commit's (its src/ carried in BASELINE_SRC), one job each, then the in-process profile.
#   bench/gpu_inner_profile.sh   (after ../shared/device/stage.sh smollm2; model at /root/stage/model.gguf)
set -uo pipefail
trap 'kill 0 2>/dev/null' TERM INT
export AIT_HOME=/root/.ait PYTHONUNBUFFERED=1
R=/root/results; mkdir -p "$AIT_HOME" "$R"
ln -sf /root/stage/model.gguf /root/stage/smol.gguf
printf '[models]\n"smollm2-135m" = "/root/stage/smol.gguf"\n' > "$AIT_HOME/models.toml"
PYTHONPATH=$PWD/src:/tmp/site python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
run() {  # NAME SRC: the standard job alone with that source tree
  PYTHONPATH=$2:/tmp/site python3 bench/inner_job.py --model smollm2-135m --trainers fast \
    --json "$R/$1.json" --out /root/work-$1 > "$R/$1.log" 2>&1
  echo "$1: $(grep -E 'total|s/step' "$R/$1.log" | head -3)"
}
run new "$PWD/src"
run baseline "$PWD/${BASELINE_SRC:-.device/baseline/src}"
PYTHONPATH=$PWD/src:/tmp/site timeout 240 python3 bench/profile_fast_step.py --model smollm2-135m --skip-job \
  --out "$R/profile" > "$R/profile.log" 2>&1
tail -c 3000 "$R/profile.log"
tar -czf "$OUT/results.tgz" -C /root results  # $OUT takes at most 8 files
