#!/usr/bin/env python3
"""Writes llm.c token shards for test_io_llmc, independently of gpipe's writer, the way llm.c's
data scripts do (an int32[256] header of magic 20240520, version 1 and the token count, then
uint16 tokens), plus malformed variants. Usage: write_llmc_files.py <dir>"""
import struct
import sys


def shard(tokens, magic=20240520, version=1, count=None, extra=b""):
    header = [0] * 256
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens) + extra


def main():
    out = sys.argv[1]
    tokens = [(i * 7919) % 65536 for i in range(1000)] + [0, 65535, 50256]
    files = {
        "good.bin": shard(tokens),
        "empty.bin": shard([]),
        "bad_magic.bin": shard(tokens, magic=20240326),
        "bad_version.bin": shard(tokens, version=2),
        "short.bin": shard(tokens, count=len(tokens) + 1),
        "long.bin": shard(tokens, extra=b"\0"),
        "truncated_header.bin": shard(tokens)[:100],
    }
    for name, data in files.items():
        with open(f"{out}/{name}", "wb") as f:
            f.write(data)
    with open(f"{out}/good.txt", "w") as f:
        f.write(" ".join(map(str, tokens)))


if __name__ == "__main__":
    main()
