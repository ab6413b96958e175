#!/usr/bin/env bash
# The outer-loop arc on one H200, a lease at a time (the machine is gone after ~30 minutes):
#   setsid bench/arc_h200.sh > /root/results/session.log 2>&1 < /dev/null &
# Expects the wheels in /tmp/site and the staged GGUFs: STAGE/smol.gguf (STAGE default /root/stage), qwen.gguf (the inner jobs'
# base models) and qwen15.gguf (the agent), each followed by FILE.done (as bench/inner_job_h200.sh's calls
# make them). With STAGE/bundle/ (the last lease's bundle, carried back in as .arc/ pieces and
# joined there) the arc resumes from it; otherwise it starts: warm start, held-out triage at step 0.
# Every new checkpoint is packed as /root/results/bundle.tar.part-* (15 MiB pieces, at most 5 for the
# 64 MiB bound) beside metrics.jsonl, for the last call of the lease to bring back under $OUT:
#   cd /root/results && tar czf /tmp/arc.tgz --exclude=checkpoints --exclude='*.safetensors' arc* *.log *.csv *.json \
#     && split -b 15M -d /tmp/arc.tgz $OUT/arc.tgz.part- && cp bundle.tar.part-* $OUT/
# A lease that continues the arc carries the last lease's pieces (kept in the ignored .arc/) and joins them
# first: mkdir -p /root/stage/bundle && cat .arc/bundle.tar.part-* | tar xf - -C /root/stage/bundle
# CONFIG (default configs/outer/h200_qwen15.toml) picks the arc; it runs until the lease ends. MODELS (default
# "smol qwen qwen15") names the staged files to wait for; a CPU check of this script: MODELS= CONFIG=configs/outer/cpu_tiny.toml
set -uo pipefail
cd "$(dirname "$0")/.."
R=${RESULTS:-/root/results}; mkdir -p "$R"
export AIT_HOME=${AIT_HOME:-/root/.ait} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
CONFIG=${CONFIG:-configs/outer/h200_qwen15.toml} STAGE=${STAGE:-/root/stage}
mkdir -p "$AIT_HOME"
. bench/gpu_lib.sh  # note
printf '[models]\n"smollm2-135m" = "%s/smol.gguf"\n"qwen2.5-coder-0.5b" = "%s/qwen.gguf"\n"qwen2.5-coder-1.5b" = "%s/qwen15.gguf"\n' \
  "$STAGE" "$STAGE" "$STAGE" > "$AIT_HOME/models.toml"
declare -A ALIAS=([smol]=smollm2-135m [qwen]=qwen2.5-coder-0.5b [qwen15]=qwen2.5-coder-1.5b)
for f in ${MODELS-smol qwen qwen15}; do  # every model staged, then dequantised once, all at once
  while [ ! -f "$STAGE/$f.gguf.done" ]; do sleep 5; done
  python3 -c "from ait.train.models import resolve_base_model as r; print(r('${ALIAS[$f]}'))" > "$R/convert-$f.log" 2>&1 \
    || note "converting $f failed: $(tail -1 "$R/convert-$f.log")" &
done
wait
note "models converted"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 10 > "$R/gpu-monitor.csv" 2>/dev/null &
python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true  # the hidden sets, by fingerprint
# The inner jobs share the GPU under CUDA MPS; the agent does not join it. An MPS client's fatal fault
# ends every client of the daemon: on 2026-12-02 an illegal memory access ended the agent (and the run)
# with the jobs. So the daemon runs at a private pipe directory (not MPS's default, which every CUDA
# process would join) that only the jobs are given (AIT_JOBS_MPS_PIPE_DIRECTORY, ait.compute.local).
JOBS_MPS=/tmp/ait-jobs-mps
jobs_mps() {  # (re)start the jobs' daemon: after a fatal fault it refuses clients until restarted
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$JOBS_MPS nvidia-cuda-mps-control 2>/dev/null; sleep 1
  mkdir -p $JOBS_MPS /tmp/ait-jobs-mps-log
  if command -v nvidia-cuda-mps-control > /dev/null && CUDA_MPS_PIPE_DIRECTORY=$JOBS_MPS \
      CUDA_MPS_LOG_DIRECTORY=/tmp/ait-jobs-mps-log nvidia-cuda-mps-control -d; then
    export AIT_JOBS_MPS_PIPE_DIRECTORY=$JOBS_MPS; note "jobs' MPS daemon started at $JOBS_MPS"
  else
    unset AIT_JOBS_MPS_PIPE_DIRECTORY; note "no MPS daemon: packed jobs are time-sliced"
  fi
}
unset CUDA_MPS_PIPE_DIRECTORY
export AIT_HIDDEN_SEED=${AIT_HIDDEN_SEED:-}  # the same secret on every machine of the arc, when given
ait() { python3 -c "from ait.cli import app; app()" "$@"; }
newest_bundle() {  # the highest complete step over this lease's run directories (arc, arc-2, ...)
  for d in "$R"/arc*/checkpoints/step_*; do [ -f "$d/bundle.json" ] && echo "${d##*step_} $d"; done \
    | sort -n | tail -1 | cut -d' ' -f2
}
last=""
pack_newest() {  # the newest complete checkpoint as 15 MiB pieces, once
  local newest; newest=$(newest_bundle)
  if [ -n "$newest" ] && [ "$newest" != "$last" ]; then
    rm -f "$R"/bundle.tar.part-*
    tar cf - -C "$newest" . | split -b 15M -d - "$R/bundle.tar.part-"
    last=$newest; note "bundle $(basename "$newest") packed: $(ls "$R"/bundle.tar.part-* | wc -l) pieces"
  fi
}
# A crash (a CUDA fault, say) is one more machine lost: the arc resumes from its newest bundle in a new
# run directory, on a restarted daemon, at most RESTARTS times; `ait report` on the last shows one arc.
from=""; [ -d "$STAGE/bundle" ] && from=$STAGE/bundle
for n in $(seq 1 $((${RESTARTS:-3} + 1))); do
  dir=$R/arc; [ "$n" -gt 1 ] && dir=$R/arc-$n
  jobs_mps
  if [ -n "$from" ]; then
    note "run $n: resuming from $from (step $(python3 -c "import json;print(json.load(open('$from/state.json'))['step'])"))"
    ait train --resume-from "$from" --run-dir "$dir" --config "$CONFIG" > "$R/arc-$n.log" 2>&1 &
  else
    note "run $n: starting the arc"
    rm -rf "$dir"; ait train --config "$CONFIG" --run-dir "$dir" > "$R/arc-$n.log" 2>&1 &
  fi
  arc=$!
  while kill -0 "$arc" 2>/dev/null; do pack_newest; sleep 10; done
  pack_newest
  wait "$arc"; rc=$?; note "run $n exited rc=$rc: $(grep -v Warning "$R/arc-$n.log" | tail -1 | head -c 300)"
  [ "$rc" -eq 0 ] && break
  from=$(newest_bundle); [ -z "$from" ] && [ -d "$STAGE/bundle" ] && from=$STAGE/bundle
done
touch "$R/ALL_DONE"
