#!/usr/bin/env python3
"""PyTorch's side of bench_mlp_step: the same MLP and step, timed on the CPU.

Model: 4 x (Linear(1024, 1024), ReLU), then Linear(1024, 16); batch 256; cross-entropy.
A step is `model.zero_grad(); loss = cross_entropy(model(x), y); loss.backward()`, as
bench_mlp_step times `trainer.zero_grad(); trainer.forward_backward(x, y)`. --micro-batches M
runs it as M chunks of rows / M, one after the other, accumulating the gradients (each chunk's
loss weighted by its share of the rows, so the gradients are the whole batch's): the GEMM sizes of
a pipeline's micro-batches without a pipeline, as bench_mlp_step's K = 1, M = 8. --rows sets the
batch, as bench_mlp_step's --rows.

Prints one JSON object per thread count on stdout:
  {"name": "torch/threads:1", "step_ms": <median>, "steps": [...], "torch": "<version>", ...}
Exits 0 with {"skipped": "..."} when torch cannot be imported, so callers can tell. "blas" is
the BLAS library the process has loaded (a Debian torch calls the system's: with only Debian's
reference BLAS installed, `libblas3`, PyTorch runs about 20 times slower than with OpenBLAS,
`libopenblas0-pthread`, and the comparison would mean nothing).
"""

import argparse
import json
import statistics
import sys
import time

from pytorch_timing import loaded_blas


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated torch.set_num_threads values")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per thread count")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="split each step into this many chunks, gradients accumulated")
    parser.add_argument("--rows", type=int, default=256, help="the batch")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(json.dumps({"skipped": f"torch is not importable: {error}"}))
        return 0

    width, classes, rows, m = 1024, 16, args.rows, args.micro_batches
    if rows < 1 or m < 1 or m > rows:
        parser.error(f"need 1 <= --micro-batches <= --rows (got {m} and {rows})")
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))
    x = torch.rand(rows, width) * 2 - 1
    y = torch.randint(0, classes, (rows,))

    chunks = list(zip(torch.tensor_split(x, m), torch.tensor_split(y, m)))

    def step():
        model.zero_grad(set_to_none=False)
        for xs, ys in chunks:
            loss = torch.nn.functional.cross_entropy(model(xs), ys) * (len(ys) / rows)
            loss.backward()

    if m > 1:  # the chunks' accumulated gradients must be the whole batch's
        model.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        whole = [p.grad.clone() for p in model.parameters()]
        step()
        for p, g in zip(model.parameters(), whole):
            error = ((p.grad - g).norm() / g.norm()).item()
            if not error <= 1e-5:
                sys.exit(f"pytorch_mlp_step: {m} chunks' gradients differ from the whole batch's "
                         f"by {error:.2e} (relative, L2) for a parameter of shape {tuple(g.shape)}")

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for _ in range(3):
            step()
        times = []
        start = time.perf_counter()
        while time.perf_counter() - start < args.min_time or len(times) < 5:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps({
            "name": f"torch/threads:{threads}" + (f"/M:{m}" if m > 1 else ""),
            "step_ms": 1e3 * statistics.median(times),
            "steps": len(times),
            "torch": torch.__version__,
            "blas": "mkl" if torch.backends.mkl.is_available() else loaded_blas(),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
