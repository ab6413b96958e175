#!/usr/bin/env bash
# A whole GPU session's issue-7/8 measurements, run in the background so that the calls which
# stage Qwen's weights (one part per call) overlap the first, timing-sensitive stages:
#
#   setsid bench/h200_session.sh > /root/results/session.log 2>&1 < /dev/null &
#
#   1. sidebyside calc_chain   fast trainer, then TRL's default, alone on the GPU (timings)
#   2. pack calc_chain         K = 1, 8, 2, 4 standard jobs at once, under CUDA MPS when the
#                              daemon is on this machine (kernels of the K processes then overlap)
#   3. once /root/stage/qwen.gguf.done exists: calibrate, then uplift (scores, not timings), beside
#      the outer-loop arc (configs/outer/h200_mini.toml), which runs until the machine goes back
#
# Every stage writes under /root/results as it goes; a later call tars that folder into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/root/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site AIT_HIDDEN_SEED=${AIT_HIDDEN_SEED:-20261129} AIT_HOME=/root/.ait
note() { echo "$(date -u +%H:%M:%S) $*" >> "$R/progress.log"; }

note "sidebyside start"; OUT=$R bench/h200.sh sidebyside calc_chain > /dev/null; note "sidebyside rc=$?"

if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && note "MPS daemon started" || { note "MPS daemon failed"; unset CUDA_MPS_PIPE_DIRECTORY; }
else
  note "no nvidia-cuda-mps-control: packed jobs are time-sliced"
fi
note "pack start"; OUT=$R bench/h200.sh pack calc_chain > /dev/null; note "pack rc=$?"
[ -n "${CUDA_MPS_LOG_DIRECTORY:-}" ] && cp "$CUDA_MPS_LOG_DIRECTORY"/control.log "$R/mps-control.log" 2>/dev/null

while [ ! -f /root/stage/qwen.gguf.done ]; do sleep 5; done
note "qwen staged; arc start"
python3 -c "from ait.cli import app; app()" train --config configs/outer/h200_mini.toml --run-dir "$R/arc" \
  > "$R/arc.log" 2>&1 &
note "calibrate start"; OUT=$R bench/h200.sh calibrate > /dev/null; note "calibrate rc=$?"
note "uplift start"; OUT=$R bench/h200.sh uplift > /dev/null; note "uplift rc=$?"
wait
note "arc exited"
