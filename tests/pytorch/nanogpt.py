"""nanoGPT's modules in PyTorch, the reference of tests/pytorch/: token + position embedding,
pre-norm blocks of causal self-attention and a tanh-GELU MLP (module names as nanoGPT's), and
nanoGPT's whole GPT (transformer.wte/wpe/h.{i}/ln_f, lm_head tied to wte). With packed documents
(a (B, T) tensor of document ids) a token attends only within its run of equal ids in its sample
and positions restart at each run (runs(), below). Imported by check_against_pytorch.py and
check_training_run.py once they know torch is installed."""
import math

import torch


def runs(document):
    """For document ids (B, T): each token's run (B, T), counted from 1 in its sample, a new run
    where the id changes (a returning id starts a new one), and its position in that run (B, T)."""
    starts = torch.ones_like(document, dtype=torch.bool)
    starts[:, 1:] = document[:, 1:] != document[:, :-1]
    t = torch.arange(document.shape[1]).expand_as(document)
    first = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values
    return starts.long().cumsum(dim=1), t - first


class Embedding(torch.nn.Module):
    """nanoGPT's wte + wpe."""

    def __init__(self, vocab, tokens, width):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(tokens, width)

    def forward(self, idx, document=None):
        positions = torch.arange(idx.shape[1], device=idx.device) if document is None else runs(
            document)[1]
        return self.wte(idx) + self.wpe(positions)


class CausalSelfAttention(torch.nn.Module):
    """With tokens, the causal mask is a buffer `bias` of (1, 1, tokens, tokens), as nanoGPT keeps
    it where it has no flash attention (so it is in the state dict); else it is made per call."""

    def __init__(self, width, heads, tokens=None):
        super().__init__()
        self.heads = heads
        self.c_attn = torch.nn.Linear(width, 3 * width)
        self.c_proj = torch.nn.Linear(width, width)
        if tokens is not None:
            self.register_buffer("bias", torch.tril(torch.ones(tokens, tokens)).view(1, 1, tokens, tokens))

    def forward(self, x, document=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        mask = self.bias[:, :, :T, :T] != 0 if hasattr(self, "bias") else torch.tril(
            torch.ones(T, T, dtype=torch.bool))
        if document is not None:  # (B, 1, T, T): query and key in one run
            run = runs(document)[0]
            mask = mask & (run[:, None, :, None] == run[:, None, None, :])
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = torch.nn.Linear(width, 4 * width)
        self.c_proj = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, width, heads, tokens=None):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(width, eps=1e-5)
        self.attn = CausalSelfAttention(width, heads, tokens)
        self.ln_2 = torch.nn.LayerNorm(width, eps=1e-5)
        self.mlp = Mlp(width)

    def forward(self, x, document=None):
        x = x + self.attn(self.ln_1(x), document)
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    """nanoGPT's GPT: its module names, a bias-free LM head tied to wte, causal-mask buffers."""

    def __init__(self, vocab, tokens, width, heads, blocks):
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab, width), wpe=torch.nn.Embedding(tokens, width),
            h=torch.nn.ModuleList(Block(width, heads, tokens) for _ in range(blocks)),
            ln_f=torch.nn.LayerNorm(width, eps=1e-5)))
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's tie

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))
