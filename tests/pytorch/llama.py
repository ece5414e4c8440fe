"""Hugging Face's LlamaForCausalLM written out in PyTorch, the reference of check_llama.py:
module names as its state dict's (model.embed_tokens, model.layers.{j}.input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj, model.norm,
lm_head), no biases, RMSNorm with eps 1e-5, rotary embeddings with rotate_half (frequency i
pairs elements i and i + hd/2 of a head), grouped-query attention (each key/value head repeated
for its H / KVH query heads), causal softmax with scale 1/sqrt(hd), SwiGLU MLP. The rotary angles
are computed in the dtype of the model (float64 in the check), not in float32 as Hugging Face
does. With document ids (batch, tokens) a token attends only to the earlier tokens of its own run
of equal ids in its sample, and its rotary position is its distance from the run's first token
(packed documents). Imported by check_llama.py once it knows torch is installed."""
import math

import torch


class RMSNorm(torch.nn.Module):
    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(head_size, positions, base, dtype):
    """cos and sin of (..., tokens, head_size) for positions (..., tokens): angle = position *
    base^(-2i / head_size) for frequency i, repeated for the two halves."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_size, 2, dtype=dtype) / head_size))
    freqs = positions.to(dtype)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def document_runs(document):
    """For ids (batch, tokens): each token's run (a counter that grows where the id changes) and
    its position, the distance from the first token of its run."""
    changes = torch.ones_like(document, dtype=torch.long)
    changes[:, 1:] = (document[:, 1:] != document[:, :-1]).long()
    run = changes.cumsum(dim=1)
    index = torch.arange(document.shape[1]).expand_as(document)
    start = torch.where(changes.bool(), index, torch.zeros_like(index)).cummax(dim=1).values
    return run, index - start


class Attention(torch.nn.Module):
    def __init__(self, width, heads, kv_heads, base):
        super().__init__()
        self.heads, self.kv_heads, self.head_size = heads, kv_heads, width // heads
        self.base = base
        hd = self.head_size
        self.q_proj = torch.nn.Linear(width, heads * hd, bias=False)
        self.k_proj = torch.nn.Linear(width, kv_heads * hd, bias=False)
        self.v_proj = torch.nn.Linear(width, kv_heads * hd, bias=False)
        self.o_proj = torch.nn.Linear(heads * hd, width, bias=False)

    def forward(self, x, document=None):
        b, t, _ = x.shape
        hd = self.head_size
        q = self.q_proj(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, hd).transpose(1, 2)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        if document is None:
            cos, sin = rotary(hd, torch.arange(t), self.base, x.dtype)
        else:
            run, positions = document_runs(document)
            cos, sin = rotary(hd, positions, self.base, x.dtype)  # (b, t, hd)
            cos, sin = cos[:, None], sin[:, None]  # one for every head
            mask = mask & (run[:, :, None] == run[:, None, :])[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)  # query head h reads key/value head h // group
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        o = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * hd))


class Mlp(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(width, hidden, bias=False)
        self.up_proj = torch.nn.Linear(width, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, width, heads, kv_heads, hidden, base):
        super().__init__()
        self.input_layernorm = RMSNorm(width)
        self.self_attn = Attention(width, heads, kv_heads, base)
        self.post_attention_layernorm = RMSNorm(width)
        self.mlp = Mlp(width, hidden)

    def forward(self, x, document=None):
        x = x + self.self_attn(self.input_layernorm(x), document)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(torch.nn.Module):
    def __init__(self, vocab, width, heads, kv_heads, hidden, layers, base):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(
            DecoderLayer(width, heads, kv_heads, hidden, base) for _ in range(layers))
        self.norm = RMSNorm(width)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, vocab, width, heads, kv_heads, hidden, layers, base=10000.0):
        super().__init__()
        self.model = Body(vocab, width, heads, kv_heads, hidden, layers, base)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        return self.lm_head(self.model(idx))
