#!/usr/bin/env python3
"""PyTorch's side of bench_llama_step: the same Llama-shaped model and step, timed on the CPU.

Model: Hugging Face's LlamaForCausalLM math in fp32 (RMSNorm eps 1e-5, RoPE with rotate_half,
grouped-query attention with each key/value head repeated for its query heads, causal softmax,
SwiGLU MLP, no biases, untied head): V = 32000, T = 256, D = 384, H = 6 heads on KVH = 2
key/value heads, F = 1024, 6 blocks; batch 8 samples; cross-entropy over all tokens.
A step is `model.zero_grad(); loss = cross_entropy(...); loss.backward()`, as bench_llama_step
times `trainer.zero_grad(); trainer.forward_backward(tokens, targets)`. --documents N packs N
documents into each sample as bench_llama_step's docs:N rows do (the same borders): attention
masked to each document, rotary positions restarting at each border.

Prints one JSON object per thread count on stdout:
  {"name": "torch/threads:1", "step_ms": <median>, "tokens_per_s": ..., "steps": N, "torch": ...,
   "blas": ...}
Exits 0 with {"skipped": "..."} when torch cannot be imported, so callers can tell.
"""

import argparse
import json
import math
import sys

from pytorch_timing import loaded_blas, median_step_ms

V, T, D, H, KVH, F, BLOCKS, B = 32000, 256, 384, 6, 2, 1024, 6, 8


def document_borders(documents):
    """Each sample's first token of each document: bench_llama_step's borders (0, then
    T * j / documents for j = 1 .. documents - 1)."""
    return [T * j // documents for j in range(documents)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated torch.set_num_threads values")
    parser.add_argument("--min-time", type=float, default=10.0, help="seconds of timed steps per thread count")
    parser.add_argument("--documents", type=int, default=1, help="documents packed into each sample")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(json.dumps({"skipped": f"torch is not importable: {error}"}))
        return 0
    if not 1 <= args.documents <= T:
        parser.error(f"--documents must be in [1, {T}]")
    nn = torch.nn
    hd = D // H

    # positions (T,) and the (T, T) mask of one sample, the same for every sample
    starts = document_borders(args.documents)
    run = torch.zeros(T, dtype=torch.long)
    for s in starts[1:]:
        run[s:] += 1
    positions = torch.arange(T) - torch.tensor(starts)[run]
    mask = torch.ones(T, T, dtype=torch.bool).tril() & (run[:, None] == run[None, :])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    angles = positions.double()[:, None] * inv_freq
    cos = torch.cat((angles, angles), dim=-1).cos().float()  # (T, hd)
    sin = torch.cat((angles, angles), dim=-1).sin().float()

    def rotate_half(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(D))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(D, H * hd, bias=False)
            self.k_proj = nn.Linear(D, KVH * hd, bias=False)
            self.v_proj = nn.Linear(D, KVH * hd, bias=False)
            self.o_proj = nn.Linear(H * hd, D, bias=False)

        def forward(self, x):
            q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, KVH, hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, KVH, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            # Hugging Face's repeat_kv: each key/value head for its H / KVH query heads
            k = k[:, :, None].expand(B, KVH, H // KVH, T, hd).reshape(B, H, T, hd)
            v = v[:, :, None].expand(B, KVH, H // KVH, T, hd).reshape(B, H, T, hd)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, H * hd))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attention()
            self.post_attention_layernorm = RMSNorm()
            self.gate_proj = nn.Linear(D, F, bias=False)
            self.up_proj = nn.Linear(D, F, bias=False)
            self.down_proj = nn.Linear(F, D, bias=False)

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            m = self.post_attention_layernorm(x)
            return x + self.down_proj(nn.functional.silu(self.gate_proj(m)) * self.up_proj(m))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, D)
            self.layers = nn.Sequential(*[Block() for _ in range(BLOCKS)])
            self.norm, self.lm_head = RMSNorm(), nn.Linear(D, V, bias=False)

        def forward(self, idx):
            return self.lm_head(self.norm(self.layers(self.embed_tokens(idx))))

    torch.manual_seed(0)
    model = Llama()
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))

    def step():
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x).view(-1, V), y.view(-1))
        loss.backward()

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        ms, times = median_step_ms(step, args.min_time)
        print(json.dumps({"name": f"torch/threads:{threads}" +
                          (f"/docs:{args.documents}" if args.documents > 1 else ""),
                          "step_ms": ms, "tokens_per_s": B * T / (ms / 1e3), "steps": len(times),
                          "torch": torch.__version__,
                          "blas": "mkl" if torch.backends.mkl.is_available() else loaded_blas()}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
