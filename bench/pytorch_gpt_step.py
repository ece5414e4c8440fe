#!/usr/bin/env python3
"""PyTorch's side of bench_gpt_step: the same GPT-2-shaped model and step, timed on the CPU.

Model: V = 50304, T = 256, D = 768, H = 12, 4 pre-norm blocks (nanoGPT's Block without dropout,
tanh GELU), final LayerNorm, untied LM head; batch 8 samples; cross-entropy over all tokens.
A step is `model.zero_grad(); loss = cross_entropy(...); loss.backward()`, as bench_gpt_step times
`trainer.zero_grad(); trainer.forward_backward(tokens, targets)`.

Prints one JSON object per thread count on stdout:
  {"name": "torch/threads:1", "step_ms": <median>, "tokens_per_s": ..., "steps": [...], ...}
Exits 0 with {"skipped": "..."} when torch cannot be imported.
"""

import argparse
import json
import math
import sys

from pytorch_timing import median_step_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated torch.set_num_threads values")
    parser.add_argument("--min-time", type=float, default=10.0, help="seconds of timed steps per thread count")
    parser.add_argument("--autocast", action="store_true",
                        help='also time the step under torch.autocast("cpu", dtype=torch.bfloat16)')
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(json.dumps({"skipped": f"torch is not importable: {error}"}))
        return 0
    nn = torch.nn
    V, T, D, H, B = 50304, 256, 768, 12, 8

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

        def forward(self, x):
            q, k, v = self.c_attn(x).split(D, dim=2)
            q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
            att = att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, D))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(D), Attention(), nn.LayerNorm(D)
            self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
            self.blocks = nn.Sequential(*[Block() for _ in range(4)])
            self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, V)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            return self.head(self.ln_f(self.blocks(x)))

    torch.manual_seed(0)
    model = Gpt()
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))

    def step():
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x).view(-1, V), y.view(-1))
        loss.backward()

    def bf16_step():  # autocast: bf16 matmuls, fp32 weights, gradients and the loss's softmax
        model.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, run in [("torch", step)] + ([("torch-autocast-bf16", bf16_step)] if args.autocast else []):
            ms, times = median_step_ms(run, args.min_time)
            print(json.dumps({"name": f"{name}/threads:{threads}", "step_ms": ms,
                              "tokens_per_s": B * T / (ms / 1e3), "steps": times,
                              "torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
