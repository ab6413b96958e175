#!/usr/bin/env bash
# The one GPU runner: every measurement this project makes on a GPU machine, as named stages.
#
#   setsid bench/gpu.sh STAGE [STAGE ...] > /root/results/session.log 2>&1 < /dev/null &
#
# Run it on the GPU machine from the repository root, from the staging call that brings the first model
# on (`python3 ../shared/device/stage.py MODEL...` prints the calls; each model lands as STAGE/FILE.gguf
# followed by STAGE/FILE.gguf.done): a stage that needs a model waits for it and dequantises it once.
# Stages run in the order given; a stage written `+NAME` starts in the background and the next one goes on
# (e.g. `+arc surface`: the outer-loop arc, with surface cells beside it). Results go under RESULTS
# (default /root/results) as they are made: progress.log, one log and JSON per stage, fingerprints.json
# (the hidden sets, by fingerprint: no seed is fixed or committed), gpu-monitor.csv. A poll call tars that
# folder into $OUT: `bash bench/gpu_poll.sh 240` (progress, the arc's per-family rows, results without weights, the
# bundles' pieces).
#
# Stages (settings by environment; the old one-off script each replaces, for the history in docs/):
#   convert     dequantise every staged model now, all at once (other stages convert what they need)
#   inner-job   the standard job alone (bench/inner_job.py): BASELINE_SRC's code cold, today's cold, today's
#               warm x2; MODEL (smollm2-135m)                    [inner_job_h200.sh ab, h200.sh sidebyside]
#   profile     today's code against BASELINE_SRC's, then the in-process profile of one fast step
#               (bench/profile_fast_step.py)                                       [gpu_inner_profile.sh]
#   packing     K standard jobs at once under CUDA MPS: PACK (K list, 1,8,2,4), PACK_JOBS (a queue of N jobs
#               through each K > 1), PACK_MPS_PCT, MODEL                [h200.sh pack, inner_job_h200.sh pack]
#   matrix      the base-model x K rows of src/ait/compute/pack_measurements.json: MATRIX items
#               [before/]MODEL:K[xN] (bench/matrix_table.py reads the run)          [inner_job_h200.sh matrix]
#   decode      the one sampling engine against generate (bench/decode_speed.py): DECODE_MODEL  [.. decode]
#   rollouts    training rollouts turn by turn against continuous (bench/rollout_schedule.py) on the 0.5B:
#               ROLLOUT_FAMILIES (ledger dispatch calc_chain), 4 batches of 4 prompts x 8 each; then the
#               hidden eval's the same two ways (bench/eval_schedule.py, 200 examples)
#   calibrate   untrained scores of the staged models over every family's ladder (bench/calibrate.py) [h200.sh]
#   uplift      the standard job on the 0.5B at each calibrated rung, the families at once: UPLIFT_FAMILIES,
#               UPLIFT_LR, UPLIFT_LR_FOR ("calc_chain=1e-6:3e-6 ..."), CAL               [h200.sh uplift]
#   wordings    a family's prompt wordings scored on both Qwen models (bench/eval_transcripts.py --wordings):
#               WORDINGS (bench/dispatch_wordings.json), WORDINGS_TASK, WORDINGS_N (64)      [lease_h200.sh]
#   surface     the job-quality surface (bench/job_surface.py, docs/surface.md): the 0.5B cells FAMILIES x
#               VARIANTS (REPEAT, PACK_A: 4 on 100 GB or more, else 2), then THEN_FAMILIES x THEN_VARIANTS (THEN_REPEAT); the 1.5B cells
#               B_FAMILIES x B_VARIANTS (B_PACK), then B2_FAMILIES x B2_VARIANTS. The 1.5B cells run beside
#               the 0.5B ones only on a card of 100 GB or more (SIDE_BY_SIDE=0|1 overrides: side by side
#               on 80 GB both OOM). No cell starts after DEADLINE s from the stage's start  [job_surface_h200.sh]
#               SURFACE_SET ("ledger.questions=net_change ..."): a rung of a family's ladder instead of its example task;
#               FAMILIES= (set, empty): the 1.5B cells only
#   arc         the outer-loop arc, CONFIG (configs/outer/h200_qwen15.toml), resumed from STAGE/bundle when
#               there is one (ARC_RESUME=1: wait for STAGE/bundle.joined first); each new checkpoint packed as RESULTS/bundle.tar.part-* for the poll calls to
#               bring back; restarted from its newest bundle after a crash, RESTARTS times (3); jobs_per_gpu
#               ARC_JOBS_PER_GPU (default: the config's, 4 on a card under 100 GB)               [arc_h200.sh]
#   agent-sampling  the arc's agent calls replayed through the sampling engine on the GPU alone
#               (bench/agent_sampling.py): CALLS (machine 2's agent-calls.json), its first SAMPLING_EPISODES (8)
#               episodes, each one's calls back to back; alone with prefix reuse (SAMPLING_PREFIX_GIB, 8); beside
#               4 busy processes; with SAMPLING_STREAMS=1 also beside a default-stream load, shared and own stream
#   agent-memory  the agent's training step on one merged 24k-token sequence (5k targets), the vocabulary
#               projection in chunks against all at once: peak GPU memory and seconds (bench/agent_step_memory.py)
#   transfer    held-out transfer at the arc's end (bench/heldout_transfer.py): START (STAGE/step0, the warm
#               start's bundle) against FINAL (the newest bundle here, else STAGE/bundle) on triage, the same
#               seeds, this machine's hidden set: TRANSFER_EPISODES (16) each, a paired difference with 2 SE
#   agent-eval  `ait eval` of the hf:qwen2.5-coder-0.5b agent on the five training families, jobs through a
#               background `ait worker`: EPISODES (2), TIMEOUT (330 s an episode), LIMIT (520 s) [gpu_agent_eval.sh]
#   gpu-tests   pytest -m gpu tests/test_gpu.py (the GPU paths CI cannot run)          [h200_session.sh gputests]
#   importtime  python -X importtime of torch + transformers (what every job process pays at start)  [h200.sh]
# Several GPUs on one host: bench/multi_gpu.sh (Ray throughput, the step over N GPUs, chaos).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { sed -n '2,/^set -uo/p' bench/gpu.sh | sed '$d'; exit 2; }
R=${RESULTS:-/root/results} STAGE=${STAGE:-/root/stage}
mkdir -p "$R"
# The staging calls re-copy the working tree under this script's feet: run from a private copy.
CODE=${CODE:-/root/code}
if [ "$PWD" != "$CODE" ]; then
  rm -rf "$CODE"; mkdir -p "$CODE"; cp -r src bench examples configs docs tests pyproject.toml "$CODE/"
  [ -n "${BASELINE_SRC:-}" ] && [ -d "$BASELINE_SRC" ] && cp -r "$BASELINE_SRC" /root/baseline-src && BASELINE_SRC=/root/baseline-src
  cd "$CODE"
fi
export AIT_HOME=${AIT_HOME:-/root/.ait} PYTHONUNBUFFERED=1 PYTHONPATH=$CODE/src:/tmp/site
mkdir -p "$AIT_HOME"
note() { echo "$(date -u +%H:%M:%S) $*" >> "$R/progress.log"; }
printf '[models]\n"smollm2-135m" = "%s/smol.gguf"\n"qwen2.5-coder-0.5b" = "%s/qwen.gguf"\n"qwen2.5-coder-1.5b" = "%s/qwen15.gguf"\n' \
  "$STAGE" "$STAGE" "$STAGE" > "$AIT_HOME/models.toml"
declare -A FILE=([smollm2-135m]=smol [qwen2.5-coder-0.5b]=qwen [qwen2.5-coder-1.5b]=qwen15)

need() {  # MODEL: wait until it is staged, then dequantise it once (the first caller converts, others wait)
  local f=${FILE[$1]}
  while [ ! -f "$STAGE/$f.gguf.done" ]; do sleep 3; done
  if mkdir "$STAGE/$f.converting" 2>/dev/null; then
    local t=$(date +%s)
    if python3 -c "from ait.train.models import resolve_base_model as r; print(r('$1'))" > "$R/convert-$1.log" 2>&1; then
      note "converted $1 in $(( $(date +%s) - t )) s"
    else
      note "converting $1 failed: $(tail -1 "$R/convert-$1.log")"
    fi
    touch "$STAGE/$f.ready"
  fi
  while [ ! -f "$STAGE/$f.ready" ]; do sleep 2; done
}

need_all() {  # MODEL...: `need` them at once. Waits on those pids only: a bare `wait` in the main shell also
  local pids=() m  # waits for the GPU monitor, which never ends (a lease lost 3 min that way)
  for m in "$@"; do need "$m" & pids+=($!); done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
}

# The jobs share the GPU under a CUDA MPS daemon of their own: not MPS's default pipe directory, which
# every CUDA process would join, since one client's fatal fault ends every client of the daemon (on
# 2026-12-02 an illegal memory access ended the arc's agent with the jobs). ait.compute.local gives the
# jobs AIT_JOBS_MPS_PIPE_DIRECTORY; the agent and this script stay outside it.
JOBS_MPS=/tmp/ait-jobs-mps
jobs_mps() {  # [restart]: start the jobs' daemon once; restart it after a fatal fault (it refuses clients then)
  [ -n "${AIT_JOBS_MPS_PIPE_DIRECTORY:-}" ] && [ "${1:-}" != restart ] && return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$JOBS_MPS nvidia-cuda-mps-control 2>/dev/null; sleep 1
  mkdir -p $JOBS_MPS /tmp/ait-jobs-mps-log
  if command -v nvidia-cuda-mps-control > /dev/null && CUDA_MPS_PIPE_DIRECTORY=$JOBS_MPS \
      CUDA_MPS_LOG_DIRECTORY=/tmp/ait-jobs-mps-log nvidia-cuda-mps-control -d; then
    export AIT_JOBS_MPS_PIPE_DIRECTORY=$JOBS_MPS; note "jobs' MPS daemon started"
  else
    unset AIT_JOBS_MPS_PIPE_DIRECTORY; note "no MPS daemon: packed jobs are time-sliced"
  fi
}
# bench/inner_job.py's own packing runs its K processes under MPS's default daemon instead (run those
# stages apart from surface, arc and agent-eval, which use the jobs' daemon).
default_mps() {  # on | off
  if [ "$1" = on ] && command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d 2>/dev/null || true
  else
    echo quit | nvidia-cuda-mps-control 2>/dev/null; unset CUDA_MPS_PIPE_DIRECTORY
  fi
}

inner() {  # NAME SRC ARGS...: bench/inner_job.py with that source tree (today's: $CODE/src)
  local name=$1 src=$2; shift 2
  note "start $name"
  PYTHONPATH=$src:/tmp/site python3 bench/inner_job.py --model "${MODEL:-smollm2-135m}" --trainers fast \
    --json "$R/$name.json" --out "/root/work-$name" "$@" > "$R/$name.log" 2>&1
  note "done $name rc=$?"
}

surface_pass() {  # NAME FAMILIES VARIANTS PACK REPEAT: one bench/job_surface.py pass, within the stage's deadline
  local left=$(( ${DEADLINE:-950} - ($(date +%s) - surface_t0) ))
  note "surface $1 ($2: $3) starting, $left s to its deadline"
  python3 bench/job_surface.py --families "$2" --variants "$3" --pack "$4" ${5:+--repeat "$5"} --deadline-s "$left" ${SURFACE_SET:+--set $SURFACE_SET} \
    --json "$R/surface-$1.json" --out "/root/work-$1" > "$R/surface-$1.log" 2>&1 && note "surface $1 done" || note "surface $1 rc=$?"
}

stage_surface() {
  surface_t0=$(date +%s); jobs_mps
  local gib; gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  local side=${SIDE_BY_SIDE:-$([ "${gib:-0}" -ge 100000 ] && echo 1 || echo 0)}
  note "GPU memory ${gib:-?} MiB: the 1.5B cells run $([ "$side" = 1 ] && echo beside || echo after) the 0.5B cells"
  # 0.5B jobs peak near 16-20 GiB each (pack_measurements.json): 4 at once on 141 GB, 2 on 80 GB.
  local pack_a=${PACK_A:-$([ "${gib:-0}" -ge 100000 ] && echo 4 || echo 2)}
  local a_variants=${VARIANTS:-$(python3 -c "from ait.policy.job_variants import VARIANTS; print(','.join(n for n, v in VARIANTS.items() if v.base_model != 'qwen2.5-coder-1.5b'))")}
  ( [ -z "${FAMILIES-x}" ] && exit 0  # FAMILIES= (empty): no 0.5B cells, only the 1.5B ones
    need qwen2.5-coder-0.5b
    surface_pass a "${FAMILIES:-calc_chain,dispatch,ledger,multi_hop,string_pipeline}" "$a_variants" "$pack_a" "${REPEAT:-reference:2}"
    [ -z "${THEN_FAMILIES:-}" ] || surface_pass a2 "$THEN_FAMILIES" "${THEN_VARIANTS:-reference}" "$pack_a" "${THEN_REPEAT:-reference:2}"
  ) &
  local a=$!
  [ "$side" = 1 ] || wait $a
  if [ -n "${B_FAMILIES-calc_chain,dispatch,ledger,multi_hop,string_pipeline}" ]; then
    need qwen2.5-coder-1.5b
    surface_pass b "${B_FAMILIES-calc_chain,dispatch,ledger,multi_hop,string_pipeline}" "${B_VARIANTS:-model_qwen15,lora_qwen15}" "${B_PACK:-1}" ""
    [ -z "${B2_FAMILIES:-}" ] || surface_pass b2 "$B2_FAMILIES" "${B2_VARIANTS:-model_qwen15+lr_3e-6}" "${B_PACK:-1}" ""
  fi
  wait $a 2>/dev/null
}

ait() {  # AIT_CMD: another command in its place (tests/test_gpu_script.py runs the arc stage with a fake one)
  if [ -n "${AIT_CMD:-}" ]; then "$AIT_CMD" "$@"; else python3 -c "from ait.cli import app; app()" "$@"; fi
}
newest_bundle() {  # the highest complete step over this machine's arc run directories (arc, arc-2, ...)
  for d in "$R"/arc*/checkpoints/step_*; do [ -f "$d/bundle.json" ] && echo "${d##*step_} $d"; done \
    | sort -n | tail -1 | cut -d' ' -f2
}
packed_bundle=""
pack_newest() {  # the newest complete checkpoint as 15 MiB pieces (at most 5 fit the 64 MiB a call brings back)
  local newest; newest=$(newest_bundle)
  local start; start=$(ls -d "$R"/arc/checkpoints/step_0 2>/dev/null)
  if [ -n "$start" ] && [ -f "$start/bundle.json" ] && [ ! -f "$R/step0.packed" ]; then  # the warm start, once:
    tar cf - -C "$start" . | split -b 15M -d - "$R/step0.tar.part-"  # the arc's end is compared with it
    touch "$R/step0.packed"; note "bundle step_0 (the warm start) packed: $(ls "$R"/step0.tar.part-* | wc -l) pieces"
  fi
  if [ -n "$newest" ] && [ "$newest" != "$packed_bundle" ]; then
    rm -f "$R"/bundle.tar.part-*
    tar cf - -C "$newest" . | split -b 15M -d - "$R/bundle.tar.part-"
    packed_bundle=$newest; note "bundle $(basename "$newest") packed: $(ls "$R"/bundle.tar.part-* | wc -l) pieces"
  fi
}
# An arc that continues (ARC_RESUME=1) carries the last machine's pieces (kept in the ignored .arc/ by
# bench/arc_collect.py after each poll) in staging calls of their own, and the last of them joins them:
#   mkdir -p /root/stage/bundle && cat /root/stage/parts/bundle.tar.part-* | tar xf - -C /root/stage/bundle \
#     && touch /root/stage/bundle.joined
# The stage waits for that mark, so it never starts a new arc from a half-joined bundle.
stage_arc() {
  local config=${CONFIG:-configs/outer/h200_qwen15.toml} from="" gib
  gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  # The H200 arc peaked at 113 GB (8 jobs ~10 GB each beside the agent): on an 80 GB card 4 jobs at once.
  # The agent's own peak, measured on an H100 on 2026-12-07 (metrics.jsonl trainer/agent_peak_reserved_gib,
  # printed by each poll): 41.5 GiB in step 1, 44.6 GiB in step 2; 46 GiB is held back for it. The ledger's
  # 10% headroom (8 GiB here) holds the one baseline eval that runs at a time (ait.evals.best_pre).
  if [ -n "${ARC_JOBS_PER_GPU:-}${ARC_AGENT_GIB:-}" ] || [ "${gib:-200000}" -lt 100000 ]; then
    sed -e "s/^jobs_per_gpu = [0-9]*/jobs_per_gpu = ${ARC_JOBS_PER_GPU:-4}/" \
        -e "s/^agent_gpu_gib = [0-9.]*/agent_gpu_gib = ${ARC_AGENT_GIB:-46}/" "$config" > "$R/outer-config.toml"
    config=$R/outer-config.toml; note "GPU memory ${gib:-?} MiB: jobs_per_gpu = ${ARC_JOBS_PER_GPU:-4}, agent_gpu_gib = ${ARC_AGENT_GIB:-46}"
  fi
  need_all ${ARC_MODELS-smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b}
  if [ -n "${ARC_RESUME:-}" ]; then  # an arc that continues: its bundle is joined by a staging call, then marked
    note "arc: waiting for the carried bundle ($STAGE/bundle.joined)"
    while [ ! -f "$STAGE/bundle.joined" ]; do sleep 2; done
  fi
  [ -d "$STAGE/bundle" ] && from=$STAGE/bundle
  for n in $(seq 1 $((${RESTARTS:-3} + 1))); do  # a crash is one more machine lost: resume from the newest bundle
    local dir=$R/arc; [ "$n" -gt 1 ] && dir=$R/arc-$n
    if [ "$n" -gt 1 ]; then jobs_mps restart; else jobs_mps; fi
    if [ -n "$from" ]; then
      note "arc run $n: resuming from $from"
      ait train --resume-from "$from" --run-dir "$dir" --config "$config" > "$R/arc-$n.log" 2>&1 &
    else
      note "arc run $n: starting ($config)"
      rm -rf "$dir"; ait train --config "$config" --run-dir "$dir" > "$R/arc-$n.log" 2>&1 &
    fi
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do pack_newest; sleep "${PACK_EVERY_S:-10}"; done
    pack_newest
    wait "$pid"; local rc=$?; note "arc run $n exited rc=$rc: $(grep -v Warning "$R/arc-$n.log" | tail -1 | head -c 300)"
    [ "$rc" -eq 0 ] && break
    from=$(newest_bundle); [ -z "$from" ] && [ -d "$STAGE/bundle" ] && from=$STAGE/bundle
  done
}

stage_agent_eval() {
  need qwen2.5-coder-0.5b; jobs_mps
  ait worker --queue /root/agent-eval-queue.sqlite --create --gpus 0 --jobs-per-gpu 4 > "$R/worker.log" 2>&1 &
  local worker=$!
  timeout "${LIMIT:-520}" python3 -m ait.cli eval --policy hf:qwen2.5-coder-0.5b \
    --tasks calc_chain multi_hop string_pipeline ledger dispatch --episodes "${EPISODES:-2}" --concurrency 10 \
    --executor queue --episode-timeout "${TIMEOUT:-330}" --max-turns 12 --out /root/agent-eval > "$R/agent-eval.log" 2>&1
  note "agent-eval exit $?"
  kill -TERM $worker; sleep 2; kill -TERM $worker 2>/dev/null
  cp /root/agent-eval/results.json "$R/agent-eval-results.json" 2>/dev/null
  cp /root/agent-eval/report.html "$R/agent-eval-report.html" 2>/dev/null
}

run_stage() {
  note "stage $1 start"
  case "$1" in
    convert) local staged=(); for m in "${!FILE[@]}"; do [ -f "$STAGE/${FILE[$m]}.gguf.done" ] && staged+=("$m"); done
      need_all "${staged[@]}" ;;
    inner-job)
      need "${MODEL:-smollm2-135m}"
      [ -n "${BASELINE_SRC:-}" ] && inner alone-before "$BASELINE_SRC"
      inner alone-cold "$CODE/src"
      inner alone-warm "$CODE/src" --warm-start --repeat 2 ;;
    profile)
      need "${MODEL:-smollm2-135m}"
      [ -n "${BASELINE_SRC:-}" ] && inner profile-before "$BASELINE_SRC"
      inner profile-now "$CODE/src"
      timeout 240 python3 bench/profile_fast_step.py --model "${MODEL:-smollm2-135m}" --skip-job --out "$R/profile" \
        > "$R/profile.log" 2>&1 ;;
    packing)
      need "${MODEL:-smollm2-135m}"; default_mps on
      inner pack "$CODE/src" --warm-start --pack "${PACK:-1,8,2,4}" --pack-jobs "${PACK_JOBS:-0}" --mps-pct "${PACK_MPS_PCT:-}"
      default_mps off ;;
    matrix)  # items [before/]MODEL:K[xN]: K = 1 is N jobs alone in turn, K > 1 is N waves of K jobs under MPS
      for item in ${MATRIX:-smollm2-135m:1x2 smollm2-135m:4 qwen2.5-coder-0.5b:1 qwen2.5-coder-0.5b:4 qwen2.5-coder-1.5b:1 qwen2.5-coder-1.5b:2}; do
        local src=$CODE/src tag=matrix; case $item in before/*) src=$BASELINE_SRC tag=before; item=${item#before/};; esac
        local model=${item%%:*} k=${item#*:}; local n=${k#*x}; k=${k%%x*}; [ "$n" = "$k" ] && n=1
        need "$model"
        if [ "$k" = 1 ]; then
          MODEL=$model inner "$tag-$model-k1" "$src" --warm-start --repeat "$n"
        else  # each job two jobs' worth of SMs, as ait.compute.packing splits them
          default_mps on
          MODEL=$model inner "$tag-$model-k$k" "$src" --warm-start --pack "$k" --pack-jobs $((n * k)) \
            --mps-pct "$(( (200 + k - 1) / k > 100 ? 100 : (200 + k - 1) / k ))"
          default_mps off
        fi
      done ;;
    decode)
      need "${DECODE_MODEL:-smollm2-135m}"
      timeout 400 python3 bench/decode_speed.py --model "${DECODE_MODEL:-smollm2-135m}" \
        --json "$R/decode-speed-${DECODE_MODEL:-smollm2-135m}.json" > "$R/decode-speed.log" 2>&1 ;;
    rollouts)
      need qwen2.5-coder-0.5b
      for f in ${ROLLOUT_FAMILIES:-ledger dispatch calc_chain}; do
        timeout 400 python3 bench/rollout_schedule.py --model qwen2.5-coder-0.5b --family "$f" --batches 4 --prompts 4 \
          --gens 8 --json "$R/rollout-schedule-$f.json" > "$R/rollout-schedule-$f.log" 2>&1 || note "rollouts on $f failed"
        timeout 300 python3 bench/eval_schedule.py --model qwen2.5-coder-0.5b --family "$f" --n 200 --repeats 2 \
          --json "$R/eval-schedule-$f.json" > "$R/eval-schedule-$f.log" 2>&1 || note "eval schedule on $f failed"
      done ;;
    calibrate)
      need qwen2.5-coder-0.5b; need smollm2-135m
      python3 bench/calibrate.py --model qwen2.5-coder-0.5b --model smollm2-135m --n 200 \
        --out "$R/calibration.json" --store "$R/baselines.json" > "$R/calibrate.log" 2>&1 ;;
    uplift)
      need qwen2.5-coder-0.5b
      local fams="" lrfor="" cal=${CAL:-docs/measurements/calibration-h200.json}
      [ -f "$R/calibration.json" ] && cal=${CAL:-$R/calibration.json}  # a calibrate stage earlier this run takes over
      for f in ${UPLIFT_FAMILIES:-calc_chain multi_hop string_pipeline ledger dispatch}; do fams="$fams --family $f"; done
      for x in ${UPLIFT_LR_FOR:-}; do lrfor="$lrfor --lr-for $x"; done
      python3 bench/inner_job.py --model qwen2.5-coder-0.5b --trainers fast --parallel --lr "${UPLIFT_LR:-1e-5}" $fams $lrfor \
        --calibration "$cal" --json "$R/uplift.json" > "$R/uplift.log" 2>&1 ;;
    wordings)
      for m in qwen2.5-coder-0.5b qwen2.5-coder-1.5b; do
        need "$m"
        python3 bench/eval_transcripts.py --task "${WORDINGS_TASK:-examples/tasks/dispatch.json}" --model "$m" \
          --n "${WORDINGS_N:-64}" --show 2 --wordings "${WORDINGS:-bench/dispatch_wordings.json}" \
          --json "$R/wordings-$m.json" > "$R/wordings-$m.log" 2>&1 || note "wordings on $m failed"
      done ;;
    surface) stage_surface ;;
    arc) stage_arc ;;
    agent-sampling)  # alone; beside 4 busy processes under the jobs' MPS daemon (the packed jobs; the agent
      need qwen2.5-coder-1.5b; jobs_mps  # stays out of it, as in the arc); beside a default-stream load
      local calls=${CALLS:-docs/measurements/arc/2026-12-07-h100-b/agent-calls.json}
      timeout 540 python3 bench/agent_sampling.py --calls "$calls" --episodes "${SAMPLING_EPISODES:-8}" \
        --compare-prefix "${SAMPLING_PREFIX_GIB:-8}" ${SAMPLING_STREAMS:+--compare-streams} \
        --beside-processes "${SAMPLING_PROCESSES:-4}" --json "$R/agent-sampling.json" \
        > "$R/agent-sampling.log" 2>&1; note "agent-sampling rc=$?: $(tail -1 "$R/agent-sampling.log")" ;;
    agent-memory)
      need qwen2.5-coder-1.5b
      timeout 300 python3 bench/agent_step_memory.py --model qwen2.5-coder-1.5b --json "$R/agent-step-memory.json" \
        > "$R/agent-step-memory.log" 2>&1; note "agent-memory rc=$?: $(tail -1 "$R/agent-step-memory.log")" ;;
    transfer)
      need_all ${ARC_MODELS-smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b}; jobs_mps
      local final; final=${FINAL:-$(newest_bundle)}; final=${final:-$STAGE/bundle}
      python3 bench/heldout_transfer.py --start "${START:-$STAGE/step0}" --final "$final" \
        --episodes "${TRANSFER_EPISODES:-16}" --out /root/transfer --config "${CONFIG:-configs/outer/h200_qwen15.toml}" \
        > "$R/transfer.log" 2>&1; note "transfer rc=$?: $(tail -2 "$R/transfer.log" | head -1)"
      cp /root/transfer/transfer.json "$R/" 2>/dev/null ;;
    agent-eval) stage_agent_eval ;;
    # A test still running after 180 s writes every thread's traceback to the log (on 2026-12-07 one ran six
    # minutes on an H100 beside the staging calls, its third, and was stopped by hand); the stage ends by 600 s.
    gpu-tests) timeout 600 python3 -m pytest -o addopts="" -o faulthandler_timeout=180 -q -m gpu -p no:cacheprovider \
                 tests/test_gpu.py > "$R/gpu-tests.log" 2>&1 ;;
    importtime)
      python3 -X importtime -c "import torch, transformers; from transformers import AutoModelForCausalLM" 2> "$R/importtime.raw"
      sort -t'|' -k2 -n -r "$R/importtime.raw" | head -40 > "$R/importtime.log" ;;
    *) note "unknown stage $1 (skipped)"; return 2 ;;
  esac
  note "stage $1 done rc=$?"
}

python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 10 > "$R/gpu-monitor.csv" 2>/dev/null &
monitor=$!
# Stages that run side by side (`+arc surface`) share one jobs' daemon: started here, before them, so each
# inherits it (a stage starting its own would quit the other's, ending that stage's jobs).
case " $* " in *" +"*) jobs_mps ;; esac
waits=()
for s in "$@"; do
  if [ "${s#+}" != "$s" ]; then run_stage "${s#+}" & waits+=($!); else run_stage "$s"; fi
done
[ ${#waits[@]} -eq 0 ] || wait "${waits[@]}"
kill $monitor 2>/dev/null
touch "$R/ALL_DONE"; note "all stages done"
