#!/usr/bin/env bash
# A whole GPU session's issue-7/8 measurements, run in the background so that the calls which
# stage Qwen's weights (one part per call) overlap the first, timing-sensitive stages:
#
#   setsid bench/h200_session.sh [STAGE ...] > /root/results/session.log 2>&1 < /dev/null &
#
# STAGEs, run in the order given (default: sidebyside pack calibrate arc uplift):
#   sidebyside   fast trainer, then TRL's default, on the calc_chain standard job (timings)
#   pack         K = 1, 8, 2, 4 standard jobs at once, under CUDA MPS when the daemon is on this
#                machine (kernels of the K processes then overlap); MPS stays on afterwards
#   calibrate    untrained scores of both models over every family's ladder (scores)
#   uplift       the standard job on Qwen at each calibrated rung, five jobs at once (scores); UPLIFT_FAMILIES
#                picks the families; `uplift_bg` starts it in the background and goes on
#   pack2        the pack stage again as pack2.json, with PACK2 (default 8) and PACK2_MPS_PCT (default 50):
#                a second cap, run later in the session (its ratio is against pack's K = 1)
#   importtime   python -X importtime of torch + transformers (what each job process pays at start)
#   gputests     pytest -m gpu tests/test_gpu.py (the GPU paths CI cannot run)
#   convert_bg   dequantise Qwen's GGUF in the background as soon as it is staged (about 3 minutes
#                of one core), so that the stages that need it do not wait for it on an idle GPU
#   monitor_bg   sample GPU utilisation and memory (nvidia-smi, 1 s) and the CPU load (2 s) into
#                gpu-monitor.csv and cpu-load.log until the machine goes back: where a packed run's
#                time goes (an idle GPU means the jobs wait on their CPUs)
#   arc          the outer loop (configs/outer/h200_mini.toml, its tasks rebuilt by bench/arc_tasks.py at
#                the session's calibrated difficulty), started in the background: it
#                runs beside the stages after it until the machine goes back
# Settings (environment): PACK (K list, default 1,8,2,4), PACK_MPS_PCT (SM caps for K > 1, 0 = none),
# PACK_JOBS (a queue of N jobs through each K > 1 instead of K at once); UPLIFT_FAMILIES, UPLIFT_LR,
# UPLIFT_LR_FOR ("calc_chain=1e-6:3e-6 ..."), UPLIFT_CAL (rungs; bench/uplift_rungs.json holds the
# ones measured so far); ARC_CAL.
# Stages that need Qwen wait for /root/stage/qwen.gguf.done (the staging calls touch it).
# Timing stages should come before `arc`: after it they share the GPU.
# Every stage writes under /root/results as it goes; a later call tars that folder into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
R=/root/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site AIT_HOME=/root/.ait
# The committed calibration (docs/measurements) picks each family's rung for the uplift jobs on a fresh
# machine; the timing stages keep the families' default difficulty.
# A calibrate stage earlier in the same session (it writes /root/stage/calibration.json) takes over.
fresh_cal() { [ -f /root/stage/calibration.json ] && echo /root/stage/calibration.json || echo "$PWD/docs/measurements/calibration-h200.json"; }
mkdir -p "$AIT_HOME"  # the model aliases every stage resolves (bench/h200.sh writes the same)
# The hidden sets come from this machine's own secret (or an AIT_HIDDEN_SEED passed in); results
# name them by fingerprint, never by seed.
python3 bench/fingerprints.py > "$R/fingerprints.json" 2>/dev/null || true
printf '[models]\n"smollm2-135m" = "/root/stage/smol.gguf"\n"qwen2.5-coder-0.5b" = "/root/stage/qwen.gguf"\n' \
  > "$AIT_HOME/models.toml"
. bench/gpu_lib.sh  # note, start_mps, stop_mps
wait_qwen() { while [ ! -f /root/stage/qwen.gguf.done ]; do sleep 5; done; }

for stage in ${*:-sidebyside pack calibrate arc uplift}; do
  case "$stage" in
    sidebyside) note "sidebyside start"; OUT=$R bench/h200.sh sidebyside calc_chain > /dev/null; note "sidebyside rc=$?" ;;
    pack) start_mps; note "pack start"; OUT=$R bench/h200.sh pack calc_chain > /dev/null; note "pack rc=$?" ;;
    pack2) start_mps; note "pack2 start"  # K > 1 again at other caps (PACK2_MPS_PCT), e.g. after the uplift
           PACK=${PACK2:-8} PACK_MPS_PCT=${PACK2_MPS_PCT:-50} PACK_NAME=pack2 OUT=$R bench/h200.sh pack calc_chain \
             > /dev/null; note "pack2 rc=$?" ;;
    importtime) OUT=$R bench/h200.sh importtime > /dev/null; note "importtime rc=$?" ;;
    convert_bg) ( wait_qwen; note "qwen conversion start"
                  python3 -c "from ait.train.models import resolve_base_model as r; print(r('qwen2.5-coder-0.5b'))" \
                    > "$R/convert.log" 2>&1; note "qwen conversion rc=$?" ) & ;;
    gputests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py > "$R/gputests.log" 2>&1; note "gputests rc=$?" ;;
    calibrate) wait_qwen; note "calibrate start"; OUT=$R bench/h200.sh calibrate > /dev/null; note "calibrate rc=$?" ;;
    uplift) wait_qwen; note "uplift start"; CAL=${UPLIFT_CAL:-$(fresh_cal)} OUT=$R bench/h200.sh uplift > /dev/null; note "uplift rc=$?" ;;
    uplift_bg) wait_qwen; note "uplift (background) start"
               ( CAL=${UPLIFT_CAL:-$(fresh_cal)} OUT=$R bench/h200.sh uplift > /dev/null; note "uplift rc=$?" ) & ;;
    arc) wait_qwen; start_mps
         # the tasks at the calibrated difficulty, inner jobs bounded so an outer step fits the lease
         python3 bench/arc_tasks.py --calibration "${ARC_CAL:-$(fresh_cal)}" --config configs/outer/h200_mini.toml \
           --out-dir "$R/arc-tasks" > "$R/arc-tasks.log" 2>&1; note "arc start (tasks rc=$?)"
         python3 -c "from ait.cli import app; app()" train --config "$R/arc-tasks/h200_mini.toml" --run-dir "$R/arc" \
           > "$R/arc.log" 2>&1 & ;;
    monitor_bg) { nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used \
                    --format=csv,noheader -l 1 > "$R/gpu-monitor.csv" 2>&1 &
                  while sleep 2; do echo "$(date -u +%T) $(cut -d' ' -f1-4 /proc/loadavg)"; done > "$R/cpu-load.log"; } &
                disown ;;  # not waited for: it samples until the machine goes back
    *) note "unknown stage $stage (skipped)" ;;
  esac
done
wait
note "all stages done"
