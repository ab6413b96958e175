#!/usr/bin/env bash
# Issue 21 on one H200, in one background run: today's code against an earlier commit's, and packing.
#   setsid bench/gpu_issue21.sh > /root/results/session.log 2>&1 < /dev/null &
# Expects /root/stage/model.gguf (SmolLM2-135M-Instruct, ../shared/device/stage.sh smollm2), the wheels
# in /tmp/site, and the earlier commit's src/ at $BASELINE_SRC (default ../baseline/src). Stages:
#   ab      the standard job alone: earlier code (cold start), today's cold, today's with --warm-start x2
#   pack    today's code, --warm-start, a queue of 24 standard jobs through K = 8 slots under CUDA MPS
#   decode  bench/decode_speed.py on SmolLM2: the one engine (batch and continuous APIs) against generate
#   matrix  the base-model x K matrix with warm starts: each staged model (SmolLM2; Qwen2.5-Coder-0.5B at
#           /root/stage/qwen.gguf via stage.sh qwen2.5-coder-0.5b; the 1.5B at /root/stage/qwen15.gguf via
#           bench/stage_qwen15.py) alone x2, then queues of 3K jobs through K = 4 and 8 slots (MATRIX_K)
#           under MPS: jobs/hour, $/job and peak memory per job, the rows src/ait/compute/pack_measurements.json takes
# Results under /root/results (a later call tars them into $OUT); progress in /root/results/progress.log.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/root/results; mkdir -p "$R"
export AIT_HOME=/root/.ait PYTHONUNBUFFERED=1
mkdir -p "$AIT_HOME"
ln -sf /root/stage/model.gguf /root/stage/smol.gguf
{ printf '[models]\n"smollm2-135m" = "/root/stage/smol.gguf"\n'
  [ -f /root/stage/qwen.gguf ] && printf '"qwen2.5-coder-0.5b" = "/root/stage/qwen.gguf"\n'
  [ -f /root/stage/qwen15.gguf ] && printf '"qwen2.5-coder-1.5b" = "/root/stage/qwen15.gguf"\n'; } > "$AIT_HOME/models.toml"
NEW=$PWD/src BASE=${BASELINE_SRC:-$PWD/../baseline/src}
note() { echo "$(date -u +%H:%M:%S) $*" >> "$R/progress.log"; }
PYTHONPATH=$NEW:/tmp/site python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
(while true; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader >> "$R/gpu-monitor.csv"; sleep 1; done) &
inner() {  # NAME SRC ARGS...: bench/inner_job.py with that source tree
  local name=$1 src=$2; shift 2
  note "start $name"
  PYTHONPATH=$src:/tmp/site python3 bench/inner_job.py --model "${MODEL:-smollm2-135m}" --trainers fast \
    --json "$R/$name.json" --out "/root/work-$name" "$@" > "$R/$name.log" 2>&1
  note "done $name rc=$?"
}
start_mps() {
  if command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && note "MPS daemon started" || { note "MPS failed"; unset CUDA_MPS_PIPE_DIRECTORY; }
  fi
}
stop_mps() { echo quit | nvidia-cuda-mps-control 2>/dev/null; unset CUDA_MPS_PIPE_DIRECTORY; }
for stage in ${STAGES:-ab pack decode}; do  # the most wanted first: a lease can end mid-run
  case $stage in
    ab)
      inner alone-before "$BASE"
      inner alone-cold "$NEW"
      inner alone-warm "$NEW" --warm-start --repeat 2
      # Warm starts unproven on this machine (a failed job): pack with cold starts instead of wasting the lease.
      grep -q '"ok": true' "$R/alone-warm.json" 2>/dev/null || { WARM=""; note "warm start failed: packing cold"; } ;;
    pack)
      start_mps
      inner pack "$NEW" ${WARM---warm-start} --pack 8 --pack-jobs 24 --mps-pct "${PACK_MPS_PCT:-25}"
      stop_mps ;;
    matrix)
      start_mps
      for model in $(sed -n 's/^"\(.*\)" = .*/\1/p' "$AIT_HOME/models.toml"); do
        MODEL=$model inner "matrix-$model-k1" "$NEW" --warm-start --repeat 2
        for k in ${MATRIX_K:-4 8}; do
          MODEL=$model inner "matrix-$model-k$k" "$NEW" --warm-start --pack "$k" --pack-jobs $((3 * k)) \
            --mps-pct "$(( (200 + k - 1) / k > 100 ? 100 : (200 + k - 1) / k ))"
        done
      done
      stop_mps ;;
    decode)
      note "start decode"
      PYTHONPATH=$NEW:/tmp/site timeout 300 python3 bench/decode_speed.py --model smollm2-135m \
        --json "$R/decode-speed.json" > "$R/decode-speed.log" 2>&1
      note "done decode" ;;
  esac
done
note "all done"
touch "$R/ALL_DONE"
