#!/usr/bin/env python3
"""Writes llm.c files for test_io_llmc, independently of gpipe's code: token shards the way llm.c's
data scripts write them (an int32[256] header of magic 20240520, version 1 and the token count,
then uint16 tokens), and a small GPT-2 checkpoint the way llm.c's train_gpt2 writes one (header
20240326, 3, maxT, V, L, NH, C, Vp; then the 16 fp32 tensors, the per-layer ones grouped across
layers), with gpt2_expected.txt naming every tensor as gpipe's GPT layout does, plus malformed
variants of both. Usage: write_llmc_files.py <dir>"""
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
    write_checkpoints(out)


def write_checkpoints(out):
    maxT, V, L, NH, C, Vp = 8, 10, 2, 2, 4, 12
    # (llm.c's name, gpipe's leaf name or None for the embedding / final norm, shape per layer)
    per_layer = [("ln1w", "ln_1.weight", [C]), ("ln1b", "ln_1.bias", [C]),
                 ("qkvw", "attn.c_attn.weight", [3 * C, C]), ("qkvb", "attn.c_attn.bias", [3 * C]),
                 ("attprojw", "attn.c_proj.weight", [C, C]), ("attprojb", "attn.c_proj.bias", [C]),
                 ("ln2w", "ln_2.weight", [C]), ("ln2b", "ln_2.bias", [C]),
                 ("fcw", "mlp.c_fc.weight", [4 * C, C]), ("fcb", "mlp.c_fc.bias", [4 * C]),
                 ("fcprojw", "mlp.c_proj.weight", [C, 4 * C]), ("fcprojb", "mlp.c_proj.bias", [C])]
    tensors = [("0.wte.weight", Vp * C), ("0.wpe.weight", maxT * C)]
    for _, leaf, shape in per_layer:
        size = 1
        for d in shape:
            size *= d
        tensors += [(f"{layer + 1}.{leaf}", size) for layer in range(L)]
    tensors += [(f"{L + 1}.weight", C), (f"{L + 1}.bias", C)]
    values, expected, k = [], [], 0
    for name, size in tensors:
        chunk = [((i * 7919) % 2001) / 1000.0 - 1.0 for i in range(k, k + size)]
        chunk = [struct.unpack("<f", struct.pack("<f", v))[0] for v in chunk]  # as fp32
        values += chunk
        expected.append(name + " " + " ".join(repr(v) for v in chunk))
        k += size
    header = [0] * 256
    header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    body = struct.pack(f"<{len(values)}f", *values)
    files = {
        "gpt2.bin": struct.pack("<256i", *header) + body,
        "gpt2_bad_magic.bin": struct.pack("<256i", 20240520, *header[1:]) + body,
        "gpt2_bf16.bin": struct.pack("<256i", header[0], 5, *header[2:]) + body,
        "gpt2_short.bin": struct.pack("<256i", *header) + body[:-4],
        # headers whose sizes describe far more than the file holds: 2^30 blocks, and a width
        # whose square overflows 64 bits
        "gpt2_many_layers.bin": struct.pack("<256i", *header[:4], 2**30, *header[5:]) + body,
        "gpt2_wide.bin": struct.pack("<256i", *header[:5], 1, 2**31 - 1, 2**31 - 1, *header[8:])
        + body,
    }
    for name, data in files.items():
        with open(f"{out}/{name}", "wb") as f:
            f.write(data)
    with open(f"{out}/gpt2_expected.txt", "w") as f:
        f.write("\n".join(expected) + "\n")


if __name__ == "__main__":
    main()
