#!/usr/bin/env python3
"""Three steps of a training run, gpipe against nanoGPT's GPT in PyTorch (float64).

The model is nanoGPT's GPT (module names transformer.wte/wpe/h.{i}/ln_f and lm_head, the LM head
tied to the token embedding, a causal-mask buffer attn.bias in every block), its parameters drawn
at random (biases and LayerNorms too, so that weight decay on them would show). Its state dict
(both tied names, the masks) goes to a safetensors file that gpipe loads with nanogpt_names; each
step is nanoGPT's: cross-entropy, clip_grad_norm_ at a norm below the gradients' (so it clips),
AdamW with nanoGPT's two groups (weight decay on tensors of 2 or more dimensions only) and a
warmup + cosine learning rate. gpipe runs the same steps (pytorch_train_steps): in one process at
K = 1, 2, 4; with MPI on 2 and 4 ranks and on 2 replicas of 2 stages; saved at K = 4 after the
first step and resumed for the other two on 2 ranks and on 2 x 2 replicas (without MPI: at K = 2
in one process); saved by 2 x 2 replicas and resumed at K = 1 in one process.
Each run's losses, norms and final parameters (written under nanoGPT's names) are checked; a
gpipe::MixedBf16 run at K = 2 is checked against the same steps under PyTorch's
torch.autocast("cpu", dtype=torch.bfloat16): losses within 1e-2 relative.

Usage: check_training_run.py <pytorch_train_steps>
       [--mpi <pytorch_train_steps_mpi> --mpiexec <mpiexec>]
Exits 77 (CTest: skipped) when torch is not installed.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: {e} (apt-get install python3-torch, or pip install torch, to run this check)")
    sys.exit(77)

import nanogpt  # noqa: E402 (needs torch)
from safetensors_f32 import load_file, save_file  # noqa: E402

V, T, D, H, BLOCKS, BATCH = 13, 6, 12, 3, 3, 4  # as tests/pytorch/train_steps.cpp
STEPS, MAX_NORM = 3, 0.05
MAX_LR, MIN_LR, WARMUP = 1e-2, 1e-3, 1
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.1


def lr_at(step):
    """gpipe::optim::WarmupCosine (and nanoGPT's get_lr) with total_steps = STEPS."""
    if step < WARMUP:
        return MAX_LR * (step + 1) / WARMUP
    ratio = (step - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)


class GPT(nanogpt.GPT):
    """nanoGPT's GPT at this test's shapes, its parameters drawn at random (biases and
    LayerNorms too, so that weight decay on them would show)."""

    def __init__(self):
        super().__init__(V, T, D, H, BLOCKS)
        generator = torch.Generator().manual_seed(29)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
                elif name.endswith("weight"):  # LayerNorm
                    p.copy_(1 + 0.2 * (torch.rand(p.shape, generator=generator) - 0.5))
                else:
                    p.copy_(0.2 * (torch.rand(p.shape, generator=generator) - 0.5))


def adam_ratio_bound(t):
    """An upper bound of |m_hat / sqrt(v_hat)| after t Adam steps, whatever the gradients
    (Cauchy-Schwarz on the two moving sums): an entry whose gradient is only rounding noise moves
    at most lr times this per step, in either direction."""
    b1, b2 = BETAS
    series = sum((b1 * b1 / b2) ** j for j in range(t))
    return (1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2) * series)


def reference(batches):
    """nanoGPT's steps in float64: (losses, norms, parameters by name after the steps)."""
    model = GPT().double()
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr_at(0), betas=BETAS, eps=EPS)
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batches[f"x{step}"].long(), batches[f"y{step}"].long()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        assert norm.item() > 2 * MAX_NORM, f"step {step}: norm {norm.item()} does not clip"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, {name: p.detach() for name, p in model.named_parameters()}


def autocast_losses(batches):
    """The same steps in float32 under torch.autocast("cpu", dtype=torch.bfloat16) (bf16
    matmuls, the loss's softmax in float32): the losses."""
    model = GPT()
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr_at(0), betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        x, y = batches[f"x{step}"].long(), batches[f"y{step}"].long()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def compare_bf16(out, want, autocast):
    """gpipe's MixedBf16 steps: losses within 1e-2 relative of PyTorch's autocast steps."""
    steps = [line.split() for line in open(os.path.join(out, "steps.txt")).read().split("\n")
             if line]
    worst_autocast = worst_fp64 = 0.0
    for s, loss, _ in steps:
        s = int(s)
        worst_autocast = max(worst_autocast, abs(float(loss) - autocast[s]) / autocast[s])
        worst_fp64 = max(worst_fp64, abs(float(loss) - want[0][s]) / want[0][s])
    failed = len(steps) != STEPS or worst_autocast > 1e-2
    print(f"MixedBf16, K = 2: worst rel loss error against autocast {worst_autocast:.1e} (bound "
          f"1e-2), against float64 {worst_fp64:.1e}{'  FAILED' if failed else ''}")
    return failed


def compare(tag, out, first_step, want):
    """Failures of one gpipe run against the reference."""
    losses, norms, params = want
    failures, worst = 0, {"loss": 0.0, "norm": 0.0, "parameter": 0.0}
    lines = open(os.path.join(out, "steps.txt")).read().split("\n")
    steps = [line.split() for line in lines if line]
    failures += [int(s[0]) for s in steps] != list(range(first_step, STEPS))
    for s, loss, norm in steps:
        s = int(s)
        worst["loss"] = max(worst["loss"], abs(float(loss) - losses[s]) / losses[s])
        worst["norm"] = max(worst["norm"], abs(float(norm) - norms[s]) / norms[s])
    got = {n: t.double() for n, t in load_file(os.path.join(out, "stepped.safetensors")).items()}
    failures += sorted(got) != sorted(params)  # nanoGPT's names, the tied tensor once as wte
    noise_bound = 2 * sum(lr_at(s) * adam_ratio_bound(s + 1) for s in range(STEPS))
    for name, p in params.items():
        g = got.get(name)
        if g is None:
            continue
        if name.endswith("attn.c_attn.bias"):
            # The key third's gradient is exactly 0 (q . b_k is the same for every key of a query,
            # and softmax ignores it): both sides step on rounding noise, bounded above.
            keys = slice(D, 2 * D)
            drift = (g[keys] - p[keys]).abs().max().item()
            if drift > noise_bound:
                print(f"  {tag} {name}[D:2D]: drift {drift:.1e} > {noise_bound:.1e}  FAILED")
                failures += 1
            g, p = torch.cat([g[:D], g[2 * D:]]), torch.cat([p[:D], p[2 * D:]])
        error = (g - p).abs().max().item() / (p.abs().max().item() or 1.0)
        worst["parameter"] = max(worst["parameter"], error)
    bad = worst["loss"] > 1e-5 or worst["norm"] > 1e-5 or worst["parameter"] > 1e-5
    failures += bad
    print(f"{tag}: steps {first_step}-{STEPS - 1}, worst rel error: loss {worst['loss']:.1e}, "
          f"norm {worst['norm']:.1e}, parameters {worst['parameter']:.1e}"
          f"{'  FAILED' if failures else ''}")
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("train_steps")
    parser.add_argument("--mpi")
    parser.add_argument("--mpiexec")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = GPT()
        state = model.state_dict()
        assert "lm_head.weight" in state and "transformer.h.0.attn.bias" in state
        save_file(f"{tmp}/state_dict.safetensors", state)
        generator = torch.Generator().manual_seed(30)
        batches = {f"{n}{s}": torch.randint(0, V, (BATCH, T), generator=generator).double()
                   for s in range(STEPS) for n in "xy"}
        save_file(f"{tmp}/batches.safetensors", batches)
        want = reference(batches)

        def run(command, tag):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                print(f"{tag}: {' '.join(command)} failed:\n{result.stdout}{result.stderr}")
                return False
            return True

        def mpi(ranks, replicas, k, out, *extra):
            return [args.mpiexec, "-n", str(ranks), "--oversubscribe", "-x",
                    f"GPIPE_REPLICAS={replicas}", args.mpi, tmp, str(k), f"{tmp}/{out}", *extra]

        failures = 0
        ok = run([args.train_steps, tmp, "2", f"{tmp}/bf16", "--bf16"], "MixedBf16")
        failures += not ok or compare_bf16(f"{tmp}/bf16", want, autocast_losses(batches))
        for k in (1, 2, 4):
            tag = f"one process, K = {k}"
            ok = run([args.train_steps, tmp, str(k), f"{tmp}/k{k}"], tag)
            failures += not ok or compare(tag, f"{tmp}/k{k}", 0, want)
        ckpt = f"{tmp}/checkpoint"
        ok = run([args.train_steps, tmp, "4", f"{tmp}/saved", "--save-after-first", ckpt],
                 "saved at K = 4")
        failures += not ok or compare("one process, K = 4, saving after step 0",
                                      f"{tmp}/saved", 0, want)
        if args.mpi:
            for ranks, replicas, tag in ((2, 1, "2 ranks"), (4, 1, "4 ranks"),
                                         (4, 2, "2 replicas x 2 ranks")):
                out = f"mpi{ranks}_{replicas}"
                ok = run(mpi(ranks, replicas, ranks // replicas, out), tag)
                failures += not ok or compare(tag, f"{tmp}/{out}", 0, want)
            tag = "resumed on 2 ranks from K = 4's checkpoint"
            ok = run(mpi(2, 1, 2, "resumed", "--resume", ckpt), tag)
            failures += not ok or compare(tag, f"{tmp}/resumed", 1, want)
            tag = "resumed on 2 replicas x 2 ranks from K = 4's checkpoint"
            ok = run(mpi(4, 2, 2, "resumed_replicas", "--resume", ckpt), tag)
            failures += not ok or compare(tag, f"{tmp}/resumed_replicas", 1, want)
            # saved by 2 replicas of 2 ranks, resumed in one process at K = 1
            replicas_ckpt = f"{tmp}/checkpoint_replicas"
            ok = run(mpi(4, 2, 2, "saved_replicas", "--save-after-first", replicas_ckpt),
                     "saved by 2 replicas x 2 ranks")
            failures += not ok or compare("2 replicas x 2 ranks, saving after step 0",
                                          f"{tmp}/saved_replicas", 0, want)
            tag = "resumed at K = 1 from the replicas' checkpoint"
            ok = run([args.train_steps, tmp, "1", f"{tmp}/resumed_k1", "--resume", replicas_ckpt],
                     tag)
            failures += not ok or compare(tag, f"{tmp}/resumed_k1", 1, want)
        else:
            tag = "resumed at K = 2 from K = 4's checkpoint (no MPI here)"
            ok = run([args.train_steps, tmp, "2", f"{tmp}/resumed", "--resume", ckpt], tag)
            failures += not ok or compare(tag, f"{tmp}/resumed", 1, want)
    print("FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
