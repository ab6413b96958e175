#!/usr/bin/env bash
# The poll call beside bench/gpu.sh: wait, show where the run stands, and bring back what it made so far
# (a machine that goes away takes everything on it).
#
#   bash bench/gpu_poll.sh SECONDS        # on the GPU machine, inside a `run` call; $OUT comes back
#
# Prints the end of progress.log, the arc's per-step rows (reward, valid rate, seconds; per family the
# job_quality mean and within-group std and the distinct job configurations) and the last log line; then
# writes $OUT/results.tgz (RESULTS without weights, checkpoints or pieces) and copies the newest bundle's
# pieces when they changed since the last poll (RESEND=1: anyway), and the warm start's (step_0) once. A
# call brings back at most 8 files and 64 MiB.
R=${RESULTS:-/root/results}
sleep "${1:-0}"
tail -n "${TAIL:-8}" "$R/progress.log" 2>/dev/null
for m in "$R"/arc*/metrics.jsonl; do
  [ -f "$m" ] && python3 - "$m" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    fam = " ".join(f"{k}:q{v['job_quality_mean']:+.3f}/sd{v['job_quality_std']:.3f}/c{v['distinct_configs']}/v{v['valid_rate']:.2f}"
                   + "".join(f"/{name}x{n}" for name, n in list((v.get("variants") or {}).items())[:2])
                   for k, v in sorted(r.get("families", {}).items()))
    mem = r.get("trainer/agent_peak_reserved_gib")
    fed, reused = r.get("trainer/sampler_prefill_tokens"), r.get("trainer/sampler_prefix_tokens_reused") or 0
    reuse = f" reuse {reused / (fed + reused):.0%}" if fed else ""
    fb, refresh = r.get("trainer/seconds_forward_backward"), r.get("trainer/seconds_refresh")
    train = f" train {fb:.0f}s+refresh {refresh:.0f}s" if fb is not None and refresh is not None else ""
    print(f"step {r.get('step')} {r.get('seconds') or 0:.0f}s reward {r.get('reward_mean') or 0:+.3f} "
          f"valid {r.get('valid_rate') or 0:.2f} "
          f"agent {mem if mem is None else round(mem, 1)} GiB{reuse}{train} {fam}")
PY
done
ls "$R"/arc-*.log > /dev/null 2>&1 && grep -hv Warning "$R"/arc-*.log | tail -n 2 | cut -c1-300
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
[ -n "${OUT:-}" ] || exit 0
# The pieces first: they are what a later machine resumes from, and a poll cut short must still bring them.
# Only when they changed since a poll last sent them (RESEND=1: again anyway): four pieces and the results
# passed the 64 MiB a call brings back on 2026-12-07, and the results were left out.
sig=$(stat -c '%n %s %Y' "$R"/bundle.tar.part-* 2>/dev/null | md5sum | cut -c1-32)
if ls "$R"/bundle.tar.part-* > /dev/null 2>&1 && { [ -n "${RESEND:-}" ] || [ "$sig" != "$(cat "$R/bundle.sent" 2>/dev/null)" ]; }; then
  cp "$R"/bundle.tar.part-* "$OUT/" && echo "$sig" > "$R/bundle.sent"
fi
if [ ! -f "$R/step0.sent" ] && ls "$R"/step0.tar.part-* > /dev/null 2>&1; then
  cp "$R"/step0.tar.part-* "$OUT/" && touch "$R/step0.sent"
fi
# Never the episodes' disk images (sparse, 16 GiB each: tar reads every byte and the call ran out of time
# on 2026-12-07) nor the jobs' CUDA caches; and a bounded tar, so the call always ends in time.
timeout "${TAR_S:-60}" tar czf "$OUT/results.tgz" --exclude='*.img' --exclude=.home --exclude='*.safetensors' \
  --exclude='*.bin' --exclude='*.gguf' --exclude='*.part-*' --exclude=checkpoints --exclude='*.pt' -C "$R" . 2>/dev/null
ls -la "$OUT" | tail -n +2 | awk '{print $5, $9}' | tr '\n' ' '; echo
