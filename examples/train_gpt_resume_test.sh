#!/usr/bin/env bash
# example_train_gpt killed with SIGKILL at random moments and restarted with --resume, then run
# to the end: its final weights (model.safetensors) must equal, byte for byte, those of a run
# never interrupted, and its log the same losses, learning rates, norms and validation losses.
# Usage: train_gpt_resume_test.sh <example_train_gpt> <text file>
set -euo pipefail
program=$1
data=$2
args=(--data "$data" --steps 48 --batch 8 --warmup 4 --eval-every 8 --checkpoint-every 3
      --sample 0 --quiet)
rm -rf whole killed whole.log killed.log

start=$(date +%s%N)
"$program" "${args[@]}" --out whole >whole.log
duration_ms=$((($(date +%s%N) - start) / 1000000))
echo "uninterrupted run: ${duration_ms} ms"

RANDOM=29  # the same moments every time the test runs (on a machine of the same speed)
kills=0
for attempt in 1 2 3 4 5; do
  # a moment in the first fifth of a whole run (each restart also loads and measures first), so
  # that five attempts rarely reach the end even when the machine gets faster meanwhile
  delay_ms=$((duration_ms / 20 + RANDOM % (duration_ms * 3 / 20)))
  seconds=$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')
  # (the subshell keeps bash's "Killed" notice out of the test's output)
  status=$( (timeout -s KILL "$seconds" "$program" "${args[@]}" --out killed --resume \
    >>killed.log 2>&1; echo $?) 2>/dev/null)
  if ((status == 137)); then
    kills=$((kills + 1))
    echo "attempt $attempt: killed after ${delay_ms} ms"
  elif ((status == 0)); then
    echo "attempt $attempt: finished before its kill at ${delay_ms} ms"
    break
  else
    echo "attempt $attempt: failed with status $status"; cat killed.log; exit 1
  fi
done
"$program" "${args[@]}" --out killed --resume >>killed.log 2>&1

resumes=$(grep -c '^resumed' killed.log || true)
echo "$kills kills, $resumes resumes from a checkpoint"
((kills >= 3)) || { echo "FAILED: fewer than 3 kills landed inside a run"; exit 1; }
((resumes >= 1)) || { echo "FAILED: no run resumed from a checkpoint"; exit 1; }
cmp whole/model.safetensors killed/model.safetensors ||
  { echo "FAILED: the resumed run's weights differ from the uninterrupted run's"; exit 1; }
# every column but the step's milliseconds
diff <(cut -d, -f1-4,6 whole/log.csv) <(cut -d, -f1-4,6 killed/log.csv) ||
  { echo "FAILED: the logs differ"; exit 1; }
echo "passed: the same weights and log as the uninterrupted run"
