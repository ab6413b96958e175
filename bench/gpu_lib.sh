# Shared by the GPU session scripts (bench/inner_job_h200.sh, arc_h200.sh, h200_session.sh, lease_h200.sh), sourced
# from the project root once R (the results folder) is set.
note() { echo "$(date -u +%H:%M:%S) $*" >> "$R/progress.log"; }
start_mps() {  # the CUDA MPS daemon, so that packed jobs' kernels run side by side (a no-op while it runs)
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && return
  if command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d && note "MPS daemon started" || { note "MPS daemon failed"; unset CUDA_MPS_PIPE_DIRECTORY; }
  else
    note "no nvidia-cuda-mps-control: packed jobs are time-sliced"
  fi
}
stop_mps() { echo quit | nvidia-cuda-mps-control 2>/dev/null; unset CUDA_MPS_PIPE_DIRECTORY; }
