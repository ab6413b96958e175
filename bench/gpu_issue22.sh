#!/usr/bin/env bash
# Issue 22's arc on one H200, a lease at a time (the machine is gone after ~30 minutes):
#   setsid bench/gpu_issue22.sh > /root/results/session.log 2>&1 < /dev/null &
# Expects the wheels in /tmp/site and the staged GGUFs: STAGE/smol.gguf (STAGE default /root/stage), qwen.gguf (the inner jobs'
# base models) and qwen15.gguf (the agent), each followed by FILE.done (as bench/gpu_issue21.sh's calls
# make them). With STAGE/bundle/ (the last lease's bundle, carried back in as .arc/ pieces and
# joined there) the arc resumes from it; otherwise it starts: warm start, held-out triage at step 0.
# Every new checkpoint is packed as /root/results/bundle.tar.part-* (15 MiB pieces, at most 5 for the
# 64 MiB bound) beside metrics.jsonl, for the last call of the lease to bring back under $OUT:
#   cd /root/results && tar czf $OUT/arc.tgz arc/metrics.jsonl arc/manifest.json arc/heldout progress.log \
#     && cp bundle.tar.part-* $OUT/
# CONFIG (default configs/outer/h200_qwen15.toml) picks the arc; it runs until the lease ends. MODELS (default
# "smol qwen qwen15") names the staged files to wait for; a CPU check of this script: MODELS= CONFIG=configs/outer/cpu_tiny.toml
set -uo pipefail
cd "$(dirname "$0")/.."
R=${RESULTS:-/root/results}; mkdir -p "$R"
export AIT_HOME=${AIT_HOME:-/root/.ait} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site
CONFIG=${CONFIG:-configs/outer/h200_qwen15.toml} STAGE=${STAGE:-/root/stage}
mkdir -p "$AIT_HOME"
. bench/gpu_lib.sh  # note, start_mps
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
start_mps  # the packed inner jobs' SM shares
export AIT_HIDDEN_SEED=${AIT_HIDDEN_SEED:-}  # the same secret on every machine of the arc, when given
ait() { python3 -c "from ait.cli import app; app()" "$@"; }
if [ -d $STAGE/bundle ]; then
  note "resuming from $(cat $STAGE/bundle/state.json | head -c 80)"
  ait train --resume-from $STAGE/bundle --run-dir "$R/arc" --config "$CONFIG" \
    > "$R/arc.log" 2>&1 &
else
  note "starting the arc"
  ait train --config "$CONFIG" --run-dir "$R/arc" > "$R/arc.log" 2>&1 &
fi
arc=$!
last=""
pack_newest() {  # the newest complete checkpoint as 15 MiB pieces, once
  local newest; newest=$(ls -d "$R"/arc/checkpoints/step_* 2>/dev/null | sort -V | tail -1)
  if [ -n "$newest" ] && [ "$newest" != "$last" ] && [ -f "$newest/bundle.json" ]; then
    rm -f "$R"/bundle.tar.part-*
    tar cf - -C "$newest" . | split -b 15M -d - "$R/bundle.tar.part-"
    last=$newest; note "bundle $(basename "$newest") packed: $(ls "$R"/bundle.tar.part-* | wc -l) pieces"
  fi
}
while kill -0 "$arc" 2>/dev/null; do pack_newest; sleep 10; done
pack_newest
wait "$arc"; note "arc exited rc=$?"
touch "$R/ALL_DONE"
