#!/usr/bin/env bash
# The job-quality surface (bench/job_surface.py) on one H200 lease, pipelined with the staging calls:
#   setsid bench/job_surface_h200.sh > /root/results/session.log 2>&1 < /dev/null &
# once STAGE/smol.gguf.done and STAGE/qwen.gguf.done exist (the wheels in /tmp/site). The 0.5B and 135M
# cells start at once (K = PACK under the jobs' MPS daemon; at K = 6 beside a 1.5B job the GPU's 140 GiB
# filled and a 1.5B and a 135M cell died of OOM on 2026-12-03); the 1.5B cells (one at a time beside
# them: a 1.5B job peaks near 45 GiB) start when STAGE/qwen15.gguf.done appears. No cell starts after DEADLINE
# seconds from the start. Results: R/surface-a.json, R/surface-b.json (every finished cell, as it ends).
set -uo pipefail
cd "$(dirname "$0")/.."
R=${RESULTS:-/root/results}; mkdir -p "$R"
STAGE=${STAGE:-/root/stage} DEADLINE=${DEADLINE:-950} PACK=${PACK:-4}
# What to run (defaults: the whole plan). VARIANTS: surface A's variants; FAMILIES; REPEAT (--repeat);
# SURFACE_B=0 skips the 1.5B cells (when qwen15.gguf is not staged this lease). SIDE_BY_SIDE=0|1 overrides
# whether the 1.5B cells run beside the 0.5B cells (default: only on a card of 100 GB or more).
FAMILIES=${FAMILIES:-calc_chain,dispatch,ledger,multi_hop,string_pipeline} REPEAT=${REPEAT:-reference:2}
SURFACE_B=${SURFACE_B:-1} B_FAMILIES=${B_FAMILIES:-calc_chain,dispatch,ledger,multi_hop,string_pipeline} B_PACK=${B_PACK:-1}
B_VARIANTS=${B_VARIANTS:-model_qwen15}
# B2_FAMILIES (with B2_VARIANTS): a second 1.5B pass after surface B, to surface-b2.json (e.g. a second knob
# on the 1.5B: model_qwen15+lr_3e-6).
B2_FAMILIES=${B2_FAMILIES:-} B2_VARIANTS=${B2_VARIANTS:-model_qwen15+lr_3e-6}
# THEN_FAMILIES (with THEN_VARIANTS, THEN_REPEAT): a second 0.5B pass after surface A, to its own JSON
# (surface-a2.json): e.g. the reference's repeats on the families whose ranking its seed decides.
THEN_FAMILIES=${THEN_FAMILIES:-}
# The staging calls re-copy the working tree under this script's feet: run from a private copy.
CODE=/root/code; rm -rf $CODE; mkdir -p $CODE; cp -r src bench examples configs pyproject.toml $CODE/; cd $CODE
export AIT_HOME=${AIT_HOME:-/root/.ait} PYTHONUNBUFFERED=1 PYTHONPATH=$CODE/src:/tmp/site
mkdir -p "$AIT_HOME"
. bench/gpu_lib.sh  # note
printf '[models]\n"smollm2-135m" = "%s/smol.gguf"\n"qwen2.5-coder-0.5b" = "%s/qwen.gguf"\n"qwen2.5-coder-1.5b" = "%s/qwen15.gguf"\n' \
  "$STAGE" "$STAGE" "$STAGE" > "$AIT_HOME/models.toml"
convert() { python3 -c "from ait.train.models import resolve_base_model as r; print(r('$1'))" > "$R/convert-$1.log" 2>&1 \
  && note "converted $1" || note "converting $1 failed: $(tail -1 "$R/convert-$1.log")"; }
t0=$(date +%s)
[ -f "$STAGE/smol.gguf" ] && convert smollm2-135m & convert qwen2.5-coder-0.5b & wait
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 10 > "$R/gpu-monitor.csv" 2>/dev/null &
python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true  # the hidden sets, by fingerprint
JOBS_MPS=/tmp/ait-jobs-mps; mkdir -p $JOBS_MPS /tmp/ait-jobs-mps-log
if CUDA_MPS_PIPE_DIRECTORY=$JOBS_MPS CUDA_MPS_LOG_DIRECTORY=/tmp/ait-jobs-mps-log nvidia-cuda-mps-control -d; then
  export AIT_JOBS_MPS_PIPE_DIRECTORY=$JOBS_MPS; note "jobs' MPS daemon started"
else note "no MPS daemon: packed jobs are time-sliced"; fi
A_VARIANTS=${VARIANTS:-$(python3 -c "from ait.policy.job_variants import VARIANTS; print(','.join(v for v in VARIANTS if v != 'model_qwen15'))")}
note "surface A starting ($A_VARIANTS)"
(
  python3 bench/job_surface.py --families "$FAMILIES" --variants "$A_VARIANTS" --repeat "$REPEAT" --pack "$PACK" --deadline-s "$DEADLINE" \
    --json "$R/surface-a.json" --out /root/work-a > "$R/surface-a.log" 2>&1 && note "surface A done" || note "surface A rc=$?"
  if [ -n "$THEN_FAMILIES" ]; then
    left=$(( DEADLINE - ($(date +%s) - t0) ))
    note "surface A2 ($THEN_FAMILIES) starting, $left s to its deadline"
    python3 bench/job_surface.py --families "$THEN_FAMILIES" --variants "${THEN_VARIANTS:-reference}" \
      --repeat "${THEN_REPEAT:-reference:2}" --pack "$PACK" --deadline-s "$left" --json "$R/surface-a2.json" \
      --out /root/work-a2 > "$R/surface-a2.log" 2>&1 && note "surface A2 done" || note "surface A2 rc=$?"
  fi
) &
a=$!
# Side by side only where both fit: on an 80 GB card a 0.5B and a 1.5B job filled it and both died of OOM
# (docs/surface.md, lease 6), so there the 1.5B cells wait for surface A (and A2) to end.
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
SIDE_BY_SIDE=${SIDE_BY_SIDE:-$([ "${GPU_MIB:-0}" -ge 100000 ] && echo 1 || echo 0)}
note "GPU memory ${GPU_MIB:-?} MiB: 1.5B cells $([ "$SIDE_BY_SIDE" = 1 ] && echo beside || echo after) the 0.5B cells"
[ "$SURFACE_B" = 1 ] && (
  while [ ! -f "$STAGE/qwen15.gguf.done" ]; do sleep 5; done
  [ "$SIDE_BY_SIDE" = 1 ] || while kill -0 $a 2>/dev/null; do sleep 5; done
  convert qwen2.5-coder-1.5b
  left=$(( DEADLINE - ($(date +%s) - t0) ))
  note "surface B (1.5B) starting, $left s to its deadline"
  python3 bench/job_surface.py --families "$B_FAMILIES" --variants "$B_VARIANTS" --pack "$B_PACK" --deadline-s "$left" \
    --json "$R/surface-b.json" --out /root/work-b > "$R/surface-b.log" 2>&1 && note "surface B done" || note "surface B rc=$?"
  if [ -n "$B2_FAMILIES" ]; then
    left=$(( DEADLINE - ($(date +%s) - t0) ))
    note "surface B2 ($B2_FAMILIES: $B2_VARIANTS) starting, $left s to its deadline"
    python3 bench/job_surface.py --families "$B2_FAMILIES" --variants "$B2_VARIANTS" --pack "$B_PACK" --deadline-s "$left" \
      --json "$R/surface-b2.json" --out /root/work-b2 > "$R/surface-b2.log" 2>&1 && note "surface B2 done" || note "surface B2 rc=$?"
  fi
) &
b=$!
wait $a $b  # not a bare wait: the GPU monitor runs until the machine goes back
touch "$R/ALL_DONE"; note "all done"
