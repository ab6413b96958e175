#!/usr/bin/env bash
# The issue-7 measurements on the GPU machine, one stage per call (each fits one 10-minute call).
#   bench/h200.sh calibrate | sidebyside FAMILY | pack FAMILY | uplift | importtime
# Expects the staged GGUF files /root/stage/smol.gguf and /root/stage/qwen.gguf and the wheels in
# /tmp/site (see ../shared/device/stage.sh); results go under $OUT. The hidden sets come from this
# machine's own secret (no seed is fixed or committed): $OUT/fingerprints.json names them, so a result
# is compared only with results on the same sets.
# Output goes to $OUT/<stage>.log as it is produced (no pipe to tail: a call cut short by its time
# limit still returns everything so far, and a time limit kills python itself, not just this shell,
# so no job keeps running into the next call).
set -uo pipefail
trap 'kill 0 2>/dev/null' TERM INT  # a time limit stops the benchmark and its jobs, not just this shell
export PYTHONPATH=$PWD/src:/tmp/site AIT_HOME=/root/.ait
mkdir -p "$AIT_HOME" "$OUT"
python3 bench/fingerprints.py > "$OUT/fingerprints.json" 2>/dev/null || true
printf '[models]\n"smollm2-135m" = "/root/stage/smol.gguf"\n"qwen2.5-coder-0.5b" = "/root/stage/qwen.gguf"\n' > "$AIT_HOME/models.toml"
stage=$1; shift || true
CAL=${CAL:-$( [ -f /root/stage/calibration.json ] && echo /root/stage/calibration.json || true )}
case "$stage" in
  calibrate)
    python3 bench/calibrate.py --model qwen2.5-coder-0.5b --model smollm2-135m --n 200 \
      --out "$OUT/calibration.json" --store "$OUT/baselines.json" > "$OUT/calibrate.log" 2>&1
    cp "$OUT/calibration.json" /root/stage/calibration.json ;;
  sidebyside)
    python3 bench/inner_job.py --model smollm2-135m --family "${1:-calc_chain}" --trainers fast,trl \
      ${CAL:+--calibration $CAL} --json "$OUT/sidebyside.json" > "$OUT/sidebyside.log" 2>&1 ;;
  pack)
    python3 bench/inner_job.py --model smollm2-135m --family "${1:-calc_chain}" --trainers fast --pack "${PACK:-1,8,2,4}" \
      --mps-pct "${PACK_MPS_PCT:-}" --pack-jobs "${PACK_JOBS:-0}" \
      ${CAL:+--calibration $CAL} --json "$OUT/${PACK_NAME:-pack}.json" > "$OUT/${PACK_NAME:-pack}.log" 2>&1
    stage=${PACK_NAME:-pack} ;;  # the tail below shows this run's log
  importtime)  # what a fresh process spends importing torch and transformers (the jobs start two)
    python3 -X importtime -c "import torch, transformers; from transformers import AutoModelForCausalLM" \
      2> "$OUT/importtime.raw"; sort -t'|' -k2 -n -r "$OUT/importtime.raw" | head -40 > "$OUT/importtime.log" ;;
  uplift)
    # UPLIFT_LR_FOR="calc_chain=1e-6:3e-6 ...": a family's own learning rates (one job each) instead of UPLIFT_LR
    fams=""; for f in ${UPLIFT_FAMILIES:-calc_chain multi_hop string_pipeline ledger dispatch}; do fams="$fams --family $f"; done
    lrfor=""; for x in ${UPLIFT_LR_FOR:-}; do lrfor="$lrfor --lr-for $x"; done
    python3 bench/inner_job.py --model qwen2.5-coder-0.5b --trainers fast --parallel --lr "${UPLIFT_LR:-1e-5}" $fams $lrfor \
      ${CAL:+--calibration $CAL} --json "$OUT/uplift.json" > "$OUT/uplift.log" 2>&1 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
tail -c 6000 "$OUT/$stage.log"
