#!/usr/bin/env bash
# `ait eval` of the Qwen2.5-Coder-0.5B agent (hf: policy, zero-shot) on the five training families,
# inner jobs packed on the one GPU by a background `ait worker` (CUDA MPS when the daemon starts).
# Expects the staged GGUF at /root/stage/model.gguf and the wheels in /tmp/site (../shared/device/stage.sh
# qwen2.5-coder-0.5b). Writes results.json, report.html, the worker's and the eval's logs, the hidden
# sets' fingerprints and the episodes' records under $OUT.
#   EPISODES (default 2) per task, TIMEOUT (default 330) seconds per episode, LIMIT (520) for the whole eval.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:/tmp/site AIT_HOME=/root/.ait
mkdir -p "$AIT_HOME" "$OUT"
printf '[models]\n"qwen2.5-coder-0.5b" = "/root/stage/model.gguf"\n' > "$AIT_HOME/models.toml"
python3 bench/fingerprints.py > "$OUT/fingerprints.json" 2>/dev/null
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/tmp/nvidia-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d || unset CUDA_MPS_PIPE_DIRECTORY
fi
python3 -c "from ait.train.models import resolve_base_model as r; print(r('qwen2.5-coder-0.5b').path)"  # dequantise once
python3 -m ait.cli worker --queue runs/queue.sqlite --create --gpus 0 --jobs-per-gpu 4 > "$OUT/worker.log" 2>&1 &
worker=$!
timeout "${LIMIT:-520}" python3 -m ait.cli eval --policy hf:qwen2.5-coder-0.5b \
  --tasks calc_chain multi_hop string_pipeline ledger dispatch --episodes "${EPISODES:-2}" --concurrency 10 \
  --executor queue --episode-timeout "${TIMEOUT:-330}" --max-turns 12 --out /root/agent-eval > "$OUT/eval.log" 2>&1
echo "eval exit $?" >> "$OUT/eval.log"
kill -TERM $worker; sleep 2; kill -TERM $worker 2>/dev/null
cp /root/agent-eval/results.json /root/agent-eval/report.html "$OUT/" 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = []
for p in sorted(pathlib.Path("/root/agent-eval/runs").glob("*/episode.json")):
    e = json.loads(p.read_text())
    rows.append({k: e.get(k) for k in ("run_id", "task_id", "stop_reason", "turns", "error", "malformed_tool_calls",
                                       "wall_seconds")} | {"reward": e["reward"], "submissions": [
        {"attempt": s["attempt"], "valid": s["report"]["valid"],
         "errors": [x["message"][:200] for x in s["report"]["errors"]][:4]} for s in e["submissions"]],
        "job": e["job"] and {k: e["job"].get(k) for k in ("ok", "fail_reason", "base_model", "pre", "post",
                                                           "train_seconds", "eval_n")}})
(out / "episodes.json").write_text(json.dumps(rows, indent=1))
PY
tail -25 "$OUT/eval.log"
