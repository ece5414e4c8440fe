#!/usr/bin/env bash
# example_train_gpt_mpi on 4 ranks under scripts/train-resilient, one of its ranks killed with
# SIGKILL five times at random moments: each time the job must end within a deadline (the other
# ranks do not hang), the wrapper restarts it with --resume, and the run must end with the
# weights (model.safetensors), byte for byte, and the log of a 4-rank run never interrupted.
# Then a shorter run on 8 ranks (2 replicas) killed once and restarted on 4 (the checkpoint
# resharded): it must finish with every step logged, and since 2 replicas sum the gradients in
# another order than 1 (rounding, not bit for bit), its losses and its final validation loss must
# be within 1e-3 (relative) of the uninterrupted run's.
# The moments: the killed rank and the step after whose log line it dies are drawn from a seed
# (printed), then a random further wait of up to two steps' time, so that kills land in a step's
# compute, its messages, its log line or its checkpoint.
# Usage: train_gpt_mpi_resume_test.sh <example_train_gpt_mpi> <mpiexec> <train-resilient> <text>
set -euo pipefail
program=$1
mpiexec=$2
wrapper=$3
source_text=$4
seed=${GPIPE_KILL_SEED:-48}
steps=40
# a copy: every start of every run reads the same text, even if the file is edited meanwhile
data=$PWD/data.txt
cp "$source_text" "$data"
args=(--data "$data" --steps "$steps" --batch 8 --warmup 4 --eval-every 0 --checkpoint-every 3
      --sample 0 --quiet)
deadline_s=30  # from a kill to the job's end, and for a restarted job to log its step
rm -rf whole killed resharded ./*.log

watched=""
cleanup() {  # a wrapper still running (a failed check) ends with its job
  [[ -z $watched ]] || kill -TERM "$watched" 2>/dev/null || true
}
trap cleanup EXIT

now_ms() { echo $(($(date +%s%N) / 1000000)); }
descendants() {  # descendants PID: the processes under PID, all generations
  local child
  for child in $(pgrep -P "$1" || true); do
    echo "$child"
    descendants "$child"
  done
}
program_path=$(readlink -f "$program")
rank_pid() {  # rank_pid ROOT RANK: the process of MPI rank RANK under ROOT (none: empty)
  local pid
  for pid in $(descendants "$1"); do
    [[ $(readlink -f "/proc/$pid/exe" 2>/dev/null) == "$program_path" ]] || continue
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}
# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds; fails the test after SECONDS
wait_for() {
  local seconds=$1 what=$2 start
  shift 2
  start=$(now_ms)
  until "$@"; do
    if (($(now_ms) - start > seconds * 1000)); then
      echo "FAILED: waited ${seconds} s for $what"
      tail -n 30 ./*.log
      exit 1
    fi
    sleep 0.01
  done
}
count_at_least() {  # count_at_least N PATTERN FILE
  local n
  n=$(grep -c -- "$2" "$3" 2>/dev/null) || true
  ((${n:-0} >= $1))
}
logged() { grep -q "^$1," "$2/log.csv" 2>/dev/null; }

start=$(now_ms)
"$mpiexec" -n 4 --oversubscribe "$program" "${args[@]}" --out whole >whole.log 2>&1 ||
  { cat whole.log; exit 1; }
duration_ms=$(($(now_ms) - start))
# a step's time: the median of the log's milliseconds (the run's time includes its start)
step_ms=$(cut -d, -f5 whole/log.csv | tail -n +2 | sort -n | awk '{ a[NR] = $1 } END {
  printf "%d", a[int((NR + 1) / 2)] + 1 }')
echo "uninterrupted run on 4 ranks: ${duration_ms} ms, ${step_ms} ms a step; seed $seed"

# kill_once N ROOT OUT RANKS TARGET: the job under ROOT, started for the N-th time (1-based),
# loses a random one of its RANKS ranks a random moment after it logged step TARGET (0-based),
# and must end within deadline_s
kill_once() {
  local n=$1 root=$2 out=$3 ranks=$4 target=$5 rank wait_ms pid killed_at
  rank=$((RANDOM % ranks))
  wait_ms=$((RANDOM % (2 * step_ms)))
  # the n-th start has read its checkpoint and rewritten the log (the line follows both)
  wait_for "$deadline_s" "start $n of the job" count_at_least "$n" "a uniform guess" "$out.log"
  wait_for "$deadline_s" "step $target in $out/log.csv" logged "$target" "$out"
  sleep "$(awk -v ms="$wait_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  pid=$(rank_pid "$root" "$rank")
  [[ -n $pid ]] || { echo "FAILED: rank $rank of start $n not found"; tail -n 30 "$out.log"; exit 1; }
  kill -KILL "$pid"
  killed_at=$(now_ms)
  wait_for "$deadline_s" "the job to end after rank $rank was killed" \
    count_at_least "$n" "^train-resilient: attempt .* failed" "$out.log"
  echo "kill $n: rank $rank (pid $pid) ${wait_ms} ms after step $target was logged; the job" \
    "ended $(($(now_ms) - killed_at)) ms later"
}

# Five kills on 4 ranks, restarts on 4: the uninterrupted run's bytes.
RANDOM=$seed
start=$(now_ms)
"$wrapper" --restarts 5 --timeout 120 -- \
  "$mpiexec" -n 4 --oversubscribe "$program" "${args[@]}" --out killed >killed.log 2>&1 &
watched=$!
for n in 1 2 3 4 5; do
  # targets spread over the run, 7 steps apart give or take 2: more than a kill overshoots
  kill_once "$n" "$watched" killed 4 $((4 + 7 * (n - 1) + RANDOM % 3))
done
status=0
wait "$watched" || status=$?
watched=""
echo "killed and resumed 5 times: $(($(now_ms) - start)) ms"
((status == 0)) || { echo "FAILED: the wrapper ended with status $status"; cat killed.log; exit 1; }
restarts=$(grep -c "^train-resilient: attempt .* failed" killed.log || true)
resumes=$(grep -c '^resumed' killed.log || true)
((restarts == 5 && resumes == 5)) ||
  { echo "FAILED: $restarts restarts and $resumes resumes, not 5"; cat killed.log; exit 1; }
grep "^train-resilient" killed.log
cmp whole/model.safetensors killed/model.safetensors ||
  { echo "FAILED: the resumed run's weights differ from the uninterrupted run's"; exit 1; }
# every column but the step's milliseconds
diff <(cut -d, -f1-4,6 whole/log.csv) <(cut -d, -f1-4,6 killed/log.csv) ||
  { echo "FAILED: the logs differ"; exit 1; }
echo "passed: 5 kills, the same weights and log as the uninterrupted run"

# One kill on 8 ranks (2 replicas), the restart on 4: resharded.
start=$(now_ms)
"$wrapper" --restarts 1 --ranks-after-failure 4 --timeout 120 -- \
  "$mpiexec" -n 8 --oversubscribe "$program" "${args[@]}" --out resharded >resharded.log 2>&1 &
watched=$!
kill_once 1 "$watched" resharded 8 $((6 + RANDOM % 20))
status=0
wait "$watched" || status=$?
watched=""
echo "8 ranks killed once, resumed on 4: $(($(now_ms) - start)) ms"
((status == 0)) || { echo "FAILED: the wrapper ended with status $status"; cat resharded.log; exit 1; }
grep -q "^resumed" resharded.log || { echo "FAILED: no resume"; cat resharded.log; exit 1; }
grep "^train-resilient" resharded.log
# every step logged once, in order, and each loss and the last validation loss near the whole run's
awk -F, -v steps="$steps" '
  FNR == 1 { next }
  NR == FNR { loss[$1] = $2; validation[$1] = $6; next }
  {
    if ($1 != FNR - 2) { printf "FAILED: row %d holds step %s\n", FNR - 1, $1; bad = 1 }
    if (!($1 in loss) || ($2 - loss[$1]) ^ 2 > (1e-3 * loss[$1]) ^ 2) {
      printf "FAILED: step %s loss %s, uninterrupted %s\n", $1, $2, loss[$1]; bad = 1
    }
    last = $1; last_validation = $6
  }
  END {
    if (last != steps - 1) { printf "FAILED: the last step logged is %s\n", last; bad = 1 }
    w = validation[steps - 1]
    if ((last_validation - w) ^ 2 > (1e-3 * w) ^ 2) {
      printf "FAILED: validation loss %s, uninterrupted %s\n", last_validation, w; bad = 1
    }
    if (!bad) printf "passed: all %d steps, validation loss %s (uninterrupted: %s)\n", steps,
                     last_validation, w
    exit bad
  }' whole/log.csv resharded/log.csv
