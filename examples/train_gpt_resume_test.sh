#!/usr/bin/env bash
# example_train_gpt killed with SIGKILL at random moments and restarted with --resume, then run
# to the end: its final weights (model.safetensors) must equal, byte for byte, those of a run
# never interrupted, and its log the same losses, learning rates, norms and validation losses.
# The moments: once the run has logged a randomly drawn step (the steps spread over the run, so
# that every kill lands inside a run and after its first checkpoint), a random further wait of up
# to two steps' time, so that kills land in a step's compute, its log line or its checkpoint.
# Usage: train_gpt_resume_test.sh <example_train_gpt> <text file>
set -euo pipefail
program=$1
data=$2
steps=48
args=(--data "$data" --steps "$steps" --batch 8 --warmup 4 --eval-every 8 --checkpoint-every 3
      --sample 0 --quiet)
rm -rf whole killed whole.log killed.log

start=$(date +%s%N)
"$program" "${args[@]}" --out whole >whole.log
duration_ms=$((($(date +%s%N) - start) / 1000000))
step_ms=$((duration_ms / steps + 1))
echo "uninterrupted run: ${duration_ms} ms"

RANDOM=29  # the same draws every time the test runs
kills=0
for attempt in 0 1 2 3 4; do
  target=$((4 + 9 * attempt + RANDOM % 4))  # 0-based step; the gaps exceed what a kill overshoots
  wait_ms=$((RANDOM % (2 * step_ms)))
  "$program" "${args[@]}" --out killed --resume >>killed.log 2>&1 &
  pid=$!
  until ! kill -0 "$pid" 2>/dev/null || grep -q "^$target," killed/log.csv 2>/dev/null; do
    sleep 0.01
  done
  sleep "$(awk -v ms="$wait_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  kill -KILL "$pid" 2>/dev/null || true
  status=0
  wait "$pid" 2>/dev/null || status=$?
  if ((status == 137)); then
    kills=$((kills + 1))
    echo "attempt $attempt: killed ${wait_ms} ms after step $target was logged"
  else
    echo "attempt $attempt: ended with status $status before its kill"; cat killed.log; exit 1
  fi
done
"$program" "${args[@]}" --out killed --resume >>killed.log 2>&1

resumes=$(grep -c '^resumed' killed.log || true)
echo "$kills kills, $resumes resumes from a checkpoint"
((resumes >= kills)) || { echo "FAILED: a run after a kill did not resume from a checkpoint"; exit 1; }
cmp whole/model.safetensors killed/model.safetensors ||
  { echo "FAILED: the resumed run's weights differ from the uninterrupted run's"; exit 1; }
# every column but the step's milliseconds
diff <(cut -d, -f1-4,6 whole/log.csv) <(cut -d, -f1-4,6 killed/log.csv) ||
  { echo "FAILED: the logs differ"; exit 1; }
echo "passed: the same weights and log as the uninterrupted run"
