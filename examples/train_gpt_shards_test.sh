#!/usr/bin/env bash
# example_train_gpt on llm.c token shards (GPT-2 ids, the vocabulary-50304 model): a training and
# a validation shard written here the way llm.c's data scripts write them (an int32[256] header:
# magic 20240520, version 1, token count; then uint16 ids), text of a repeating pattern of ids
# spread over the vocabulary; 20 steps must lower the validation loss.
# Usage: train_gpt_shards_test.sh <example_train_gpt> <python3>
set -euo pipefail
program=$1
python=$2
rm -rf shards && mkdir shards
"$python" - <<'PY'
import struct
def shard(path, count, offset):
    ids = [(offset + i) % 97 * 509 % 50257 for i in range(count)]
    header = [20240520, 1, count] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{count}H", *ids))
shard("shards/pattern_train_000001.bin", 20000, 0)
shard("shards/pattern_val_000000.bin", 3000, 13)
PY
"$program" --data shards/pattern_val_000000.bin --data shards/pattern_train_000001.bin \
  --steps 20 --warmup 2 --eval-every 10 --batch 8 --sample 8 --out shards/run
