#!/usr/bin/env python3
"""PyTorch's side of bench_mpi_pipeline_compare: the same GPT, cut, weights, batch and step on 2
processes with torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B, gloo).

Model (as bench/mpi_pipeline_compare.cpp): V = 8192, T = 128, D = 384, H = 6, 6 pre-norm blocks
(nanoGPT's Block without dropout, tanh GELU, attention by scaled_dot_product_attention with
is_causal), final LayerNorm, untied LM head with bias; batch 8 samples; parameters named as gpipe
names them (nn.Sequential indices: 0 embedding, 1-6 blocks, 7 LayerNorm, 8 head).
Cut: rank 0 runs layers 0-4 (embedding, 4 blocks), rank 1 layers 5-8 (2 blocks, LayerNorm, head).
Step: optimizer.zero_grad() (untimed), schedule.step (forward and backward of every micro-batch),
torch.optim.AdamW(lr 6e-4, betas (0.9, 0.95), weight_decay 0.1, foreach=False). The gradients are
the mini-batch mean loss's, as gpipe's: the schedule's scale_grads (torch >= 2.6) divides the
micro-batches' summed gradients by M; older schedules get each micro-batch's loss divided by M.
Versions: measured with torch 2.15 (PyPI); torch 2.5.1 runs ScheduleGPipe but hangs in
Schedule1F1B on gloo (its batched send + receive waits for only one of the two requests).
Timing: a step is from the earliest rank's start of schedule.step to the latest rank's end of
optimizer.step (gpipe's Trainer::last_step_seconds); each rank records its own clock
(CLOCK_MONOTONIC, one machine) and the spans are formed after the timed steps.
Threads: one per rank (torch.set_num_threads(1), OMP_NUM_THREADS=MKL_NUM_THREADS=1); with --pin,
rank r runs on core r only (as `mpirun --bind-to core` places gpipe's ranks).

Usage:
  pytorch_pipeline_step.py --write-weights FILE      the model's weights (torch.manual_seed(0)),
                                                      one safetensors file for both programs
  pytorch_pipeline_step.py --weights FILE [--steps 5] [--schedules GPipe:4,1F1B:4] [--pin]
prints one JSON object per schedule on stdout:
  {"name": "torch/1F1B/M:4", "step_ms": <median>, "steps_ms": [...], "first_loss": ...,
   "second_loss": ..., "torch": "2.5.1"}
(first_loss before any update, second_loss after one; the same batch every step). Exits 2 with a
message when torch or torch.distributed.pipelining cannot be imported.
"""

import argparse
import inspect
import json
import os
import socket
import statistics
import sys
import time

V, T, D, H, BLOCKS, B = 8192, 128, 384, 6, 6, 8
CUT = 5  # layers on rank 0: the embedding and 4 blocks


def random_tokens(seed, n):
    """gpipe::Rng(seed) (splitmix64) draws modulo V: the batch bench_mpi_pipeline_compare uses."""
    mask = (1 << 64) - 1
    state, out = seed, []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) % V)
    return out


def build_gpt(torch):
    nn, F = torch.nn, torch.nn.functional

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)

        def forward(self, idx):
            return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in self.c_attn(x).split(D, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, D))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), Attention(), nn.LayerNorm(D), Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    return nn.Sequential(Embedding(), *[Block() for _ in range(BLOCKS)], nn.LayerNorm(D), nn.Linear(D, V))


def import_torch():
    """torch and its pipelining package, or exit 2 saying which is missing."""
    try:
        import torch
    except ImportError as error:
        print(f"pytorch_pipeline_step.py: torch is not importable by {sys.executable}: {error}",
              file=sys.stderr)
        sys.exit(2)
    try:
        import torch.distributed.pipelining  # noqa: F401 (torch 2.4 and later)
    except ImportError as error:
        print(f"pytorch_pipeline_step.py: torch {torch.__version__} at {sys.executable} has no "
              f"torch.distributed.pipelining (needs torch >= 2.4): {error}", file=sys.stderr)
        sys.exit(2)
    return torch


def write_weights(torch, path):
    from safetensors.torch import save_file
    torch.manual_seed(0)
    model = build_gpt(torch)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)


def worker(rank, args, port):
    torch = import_torch()
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from safetensors.torch import load_file

    if args.pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.tensor(random_tokens(2, B * T), dtype=torch.long).view(B, T)
    y = torch.tensor(random_tokens(3, B * T), dtype=torch.long).view(B, T)
    kinds = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
    state = load_file(args.weights)
    for spec in args.schedules.split(","):
        kind, m = spec.split(":")
        m = int(m)
        model = build_gpt(torch)
        model.load_state_dict(state)
        part = model[:CUT] if rank == 0 else model[CUT:]
        shapes = {}
        if needs_shapes(PipelineStage):  # torch < 2.6: the micro-batches' input and output
            mb = B // m
            shapes = dict(input_args=x[:mb] if rank == 0 else torch.zeros(mb, T, D),
                          output_args=torch.zeros(mb, T, D) if rank == 0 else torch.zeros(mb, T, V))
        stage = PipelineStage(part, rank, 2, torch.device("cpu"), **shapes)

        # torch >= 2.6 divides the summed gradients by M itself (scale_grads); before, the loss
        # of a micro-batch is divided by M so that the gradients are the mini-batch mean's
        divide = 1 if scales_grads(kinds[kind]) else m

        def loss_fn(logits, targets, divide=divide):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)) / divide

        schedule = kinds[kind](stage, n_microbatches=m, loss_fn=loss_fn)
        optimizer = torch.optim.AdamW(part.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                                      weight_decay=0.1, foreach=False)

        def step():
            losses = []
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
            optimizer.step()
            return sum(loss.item() for loss in losses) * divide / m

        losses = []
        for _ in range(4):  # the first two losses, and warm-up as gpipe's row has it
            optimizer.zero_grad()
            losses.append(step())
        starts, ends = [], []
        for _ in range(args.steps):
            optimizer.zero_grad()
            starts.append(time.perf_counter())
            step()
            ends.append(time.perf_counter())
        gathered = [None, None]
        dist.all_gather_object(gathered, (starts, ends, losses[:2]))
        if rank == 0:
            spans = [1e3 * (max(g[1][i] for g in gathered) - min(g[0][i] for g in gathered))
                     for i in range(args.steps)]
            first, second = gathered[1][2]  # the last stage computes the loss
            print(json.dumps({"name": f"torch/{kind}/M:{m}", "step_ms": statistics.median(spans),
                              "steps_ms": spans, "first_loss": first, "second_loss": second,
                              "torch": torch.__version__}), flush=True)
        dist.barrier()
    dist.destroy_process_group()


def scales_grads(schedule_class):
    return "scale_grads" in inspect.signature(schedule_class.__init__).parameters


def needs_shapes(stage_class):
    """True where PipelineStage must be given example inputs (later versions infer them)."""
    return inspect.signature(stage_class.__init__).parameters["input_args"].default is inspect.Parameter.empty


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-weights", metavar="FILE", help="write the weights and exit")
    parser.add_argument("--weights", metavar="FILE", help="the weights to train from")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per schedule")
    parser.add_argument("--schedules", default="GPipe:4,1F1B:4", help="KIND:M,... (GPipe, 1F1B)")
    parser.add_argument("--pin", action="store_true", help="rank r on core r only")
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"  # before torch loads its OpenMP and MKL
    torch = import_torch()
    if args.write_weights:
        write_weights(torch, args.write_weights)
        return 0
    if not args.weights or args.steps < 1:
        parser.error("give --weights FILE (from --write-weights) and --steps >= 1")
    for spec in args.schedules.split(","):
        kind, _, m = spec.partition(":")
        if kind not in ("GPipe", "1F1B") or not m.isdigit() or int(m) < 1 or B % int(m) != 0:
            parser.error(f"--schedules: {spec!r} is not KIND:M with KIND GPipe or 1F1B, M dividing {B}")
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args, free_port()), nprocs=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
