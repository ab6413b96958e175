#!/usr/bin/env bash
# One H200 lease, pipelined with its staging calls: the outer-loop arc (bench/arc_h200.sh, CONFIG) and,
# beside its warm start, surface cells (bench/job_surface.py) and prompt wordings (bench/eval_transcripts.py):
#   setsid bench/lease_h200.sh > /root/results/lease.log 2>&1 < /dev/null &
# from the first staging call on (it waits for STAGE/<file>.gguf.done). In order:
#   1. when the 0.5B is staged: WORDINGS (a JSON of bench/eval_transcripts.py --wordings) on WORDINGS_TASK
#      with the 0.5B, n = WORDINGS_N (the GPU is idle while the other pieces arrive)
#   2. when every model is staged: all dequantised once (one process each, before anyone reads them), then
#      the arc starts, then the same wordings on the 1.5B, then SURFACE_FAMILIES x SURFACE_VARIANTS at
#      K = SURFACE_PACK with no cell started after SURFACE_DEADLINE s (the 1.5B cells peak near 45 GiB
#      each, the arc's agent near 32: K = 2 fits beside it)
# Results under R (default /root/results): progress.log, wordings-*.json, surface.json, the arc's files.
set -uo pipefail
R=${RESULTS:-/root/results} STAGE=${STAGE:-/root/stage}; mkdir -p "$R"
# The staging calls re-copy the working tree under this script's feet: run from a private copy.
CODE=/root/code; rm -rf $CODE; mkdir -p $CODE; cp -r src bench examples configs pyproject.toml $CODE/; cd $CODE
export AIT_HOME=${AIT_HOME:-/root/.ait} PYTHONUNBUFFERED=1 PYTHONPATH=$CODE/src:/tmp/site
mkdir -p "$AIT_HOME"
. bench/gpu_lib.sh  # note
printf '[models]\n"smollm2-135m" = "%s/smol.gguf"\n"qwen2.5-coder-0.5b" = "%s/qwen.gguf"\n"qwen2.5-coder-1.5b" = "%s/qwen15.gguf"\n' \
  "$STAGE" "$STAGE" "$STAGE" > "$AIT_HOME/models.toml"
WORDINGS=${WORDINGS:-bench/dispatch_wordings.json} WORDINGS_TASK=${WORDINGS_TASK:-examples/tasks/dispatch.json}
WORDINGS_N=${WORDINGS_N:-64}
SURFACE_FAMILIES=${SURFACE_FAMILIES:-ledger} SURFACE_PACK=${SURFACE_PACK:-2} SURFACE_DEADLINE=${SURFACE_DEADLINE:-420}
SURFACE_VARIANTS=${SURFACE_VARIANTS:-model_qwen15,model_qwen15+lr_3e-6,model_qwen15+steps_30,model_qwen15+lr_3e-7}
staged() { while [ ! -f "$STAGE/$1.gguf.done" ]; do sleep 3; done; }
convert() { python3 -c "from ait.train.models import resolve_base_model as r; print(r('$1'))" > "$R/convert-$1.log" 2>&1 \
  && note "converted $1" || note "converting $1 failed: $(tail -1 "$R/convert-$1.log")"; }
wordings() {  # $1: model
  [ -n "$WORDINGS" ] || return 0
  python3 bench/eval_transcripts.py --task "$WORDINGS_TASK" --model "$1" --n "$WORDINGS_N" --show 2 \
    --wordings "$WORDINGS" --json "$R/wordings-$1.json" > "$R/wordings-$1.log" 2>&1 \
    && note "wordings on $1: $(grep -c ' score ' "$R/wordings-$1.log") scored" || note "wordings on $1 failed"
}
staged qwen; convert qwen2.5-coder-0.5b
wordings qwen2.5-coder-0.5b &
staged smol; staged qwen15
convert smollm2-135m & convert qwen2.5-coder-1.5b & wait
note "all models staged and converted"
RESULTS=$R STAGE=$STAGE setsid bash bench/arc_h200.sh > "$R/arc-session.log" 2>&1 < /dev/null &
note "arc started (${CONFIG:-configs/outer/h200_qwen15.toml})"
wordings qwen2.5-coder-1.5b
if [ -n "$SURFACE_VARIANTS" ]; then
  python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true
  python3 bench/job_surface.py --families "$SURFACE_FAMILIES" --variants "$SURFACE_VARIANTS" --pack "$SURFACE_PACK" \
    --deadline-s "$SURFACE_DEADLINE" --json "$R/surface.json" --out /root/work-surface > "$R/surface.log" 2>&1 \
    && note "surface done" || note "surface rc=$?"
fi
touch "$R/LEASE_DONE"; note "lease script done"
