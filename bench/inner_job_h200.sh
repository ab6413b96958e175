#!/usr/bin/env bash
# The inner job on one H200, in one background run: today's code against an earlier commit's, and packing.
#   setsid bench/inner_job_h200.sh > /root/results/session.log 2>&1 < /dev/null &
# Expects /root/stage/smol.gguf (SmolLM2-135M-Instruct, ../shared/device/stage.sh smollm2), the wheels
# in /tmp/site, and the earlier commit's src/ at $BASELINE_SRC (default ../baseline/src). Stages:
#   ab      the standard job alone: earlier code (cold start), today's cold, today's with --warm-start x2
#   pack    today's code, --warm-start, a queue of 24 standard jobs through K = 8 slots under CUDA MPS
#   decode  bench/decode_speed.py on SmolLM2: the one engine (batch and continuous APIs) against generate
#   matrix  the base-model x K matrix with warm starts, items MODEL:K[xN] (MATRIX; "before/" runs $BASELINE_SRC):
#           K = 1 is N jobs alone one after another, K > 1 is N waves of K jobs under MPS. Models: SmolLM2 at
#           /root/stage/smol.gguf, Qwen2.5-Coder-0.5B at qwen.gguf (stage.sh qwen2.5-coder-0.5b), the 1.5B
#           at qwen15.gguf (bench/stage_qwen15.py); each is dequantised in the background once its staging
#           calls touch FILE.done, and its items wait for that. Gives jobs/hour, $/job and peak memory per
#           job: the rows src/ait/compute/pack_measurements.json takes
#   decode15 bench/decode_speed.py on Qwen2.5-Coder-1.5B (issue 22's agent): the engine against generate
# Results under /root/results (a later call tars them into $OUT); progress in /root/results/progress.log.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/root/results; mkdir -p "$R"
. bench/gpu_lib.sh  # note, start_mps, stop_mps
export AIT_HOME=/root/.ait PYTHONUNBUFFERED=1
mkdir -p "$AIT_HOME"
printf '[models]\n' > "$AIT_HOME/models.toml"
# Each model is dequantised once (AIT_HOME cache) as soon as its staging calls finish (they touch
# /root/stage/FILE.done): in the background, so that the GPU runs the stages of models already there.
declare -A FILE=([smollm2-135m]=smol.gguf [qwen2.5-coder-0.5b]=qwen.gguf [qwen2.5-coder-1.5b]=qwen15.gguf)
for m in "${!FILE[@]}"; do
  ( f=/root/stage/${FILE[$m]}; for _ in $(seq 1 360); do [ -f "$f.done" ] && break; sleep 5; done
    [ -f "$f.done" ] || exit 0
    printf '"%s" = "%s"\n' "$m" "$f" >> "$AIT_HOME/models.toml"
    t=$(date +%s); PYTHONPATH=$PWD/src:/tmp/site python3 -c "from ait.train.models import resolve_base_model as r; print(r('$m'))" \
      > "$R/convert-$m.log" 2>&1 && touch "/root/stage/$m.ready"
    echo "$(date -u +%H:%M:%S) converted $m in $(( $(date +%s) - t )) s" >> "$R/progress.log" ) &
done
wait_ready() { for _ in $(seq 1 360); do [ -f "/root/stage/$1.ready" ] && return 0; sleep 5; done; return 1; }
NEW=$PWD/src BASE=${BASELINE_SRC:-$PWD/../baseline/src}
# A carried folder is gone from the working tree after the next call that does not carry it (seen on
# 2026-12-02): the earlier commit's src/ is copied out of the tree before any later call can remove it.
[ -d "$BASE" ] && rm -rf /root/baseline-src && cp -r "$BASE" /root/baseline-src && BASE=/root/baseline-src
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
for stage in ${STAGES:-ab pack decode}; do  # e.g. STAGES="matrix decode15"  # the most wanted first: a lease can end mid-run
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
    matrix)  # MATRIX items [before/]MODEL:K[xN] in order, each waiting for its model (staged and converted)
      for item in ${MATRIX:-smollm2-135m:1x2 before/smollm2-135m:1x2 smollm2-135m:4 qwen2.5-coder-0.5b:1 qwen2.5-coder-0.5b:4 \
                           qwen2.5-coder-1.5b:1 qwen2.5-coder-1.5b:2}; do
        src=$NEW tag=matrix; case $item in before/*) src=$BASE tag=before; item=${item#before/};; esac
        model=${item%%:*} k=${item#*:}; n=${k#*x}; k=${k%%x*}; [ "$n" = "$k" ] && n=1
        wait_ready "$model" || { note "skip $item: $model not ready"; continue; }
        if [ "$k" = 1 ]; then  # alone, no MPS (as the s9 rows)
          MODEL=$model inner "$tag-$model-k1" "$src" --warm-start --repeat "$n"
        else  # N waves of K jobs under MPS, each job two jobs' worth of SMs (as ait.compute.packing splits them)
          start_mps
          MODEL=$model inner "$tag-$model-k$k" "$src" --warm-start --pack "$k" --pack-jobs $((n * k)) \
            --mps-pct "$(( (200 + k - 1) / k > 100 ? 100 : (200 + k - 1) / k ))"
          stop_mps
        fi
      done ;;
    decode15)  # the 1.5B agent model of issue 22 through the engine against generate
      wait_ready qwen2.5-coder-1.5b && { note "start decode15"
        PYTHONPATH=$NEW:/tmp/site timeout 400 python3 bench/decode_speed.py --model qwen2.5-coder-1.5b --batch 16 --new-tokens 256 \
          --json "$R/decode-speed-qwen15.json" > "$R/decode-speed-qwen15.log" 2>&1; note "done decode15 rc=$?"; } ;;
    decode)
      note "start decode"
      PYTHONPATH=$NEW:/tmp/site timeout 300 python3 bench/decode_speed.py --model smollm2-135m \
        --json "$R/decode-speed.json" > "$R/decode-speed.log" 2>&1
      note "done decode" ;;
  esac
done
note "all done"
touch "$R/ALL_DONE"
