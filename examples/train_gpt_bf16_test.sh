#!/usr/bin/env bash
# example_train_gpt in fp32 and with --bf16 (gpipe::MixedBf16) on the same data, seed and steps:
# their loss curves (training, averaged over 10 steps, and validation) must stay within 2 % of
# each other (compare_runs.py draws both in bf16_vs_fp32.svg).
# Usage: train_gpt_bf16_test.sh <example_train_gpt> <python3> <data>...
set -euo pipefail
program=$1 python=$2
shift 2
data=()
for file in "$@"; do data+=(--data "$file"); done
for precision in fp32 bf16; do
  flags=()
  [[ $precision == bf16 ]] && flags=(--bf16)
  "$program" --steps 100 --warmup 10 --eval-every 25 --checkpoint-every 0 --sample 0 --quiet \
    "${data[@]}" --out "bf16_test_$precision" "${flags[@]}" > "bf16_test_$precision.txt"
done
"$python" "$(dirname "${BASH_SOURCE[0]}")/train_gpt/compare_runs.py" --window 10 \
  bf16_test_fp32/log.csv bf16_test_bf16/log.csv bf16_vs_fp32.svg
