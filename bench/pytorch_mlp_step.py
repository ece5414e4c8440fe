#!/usr/bin/env python3
"""PyTorch's side of bench_mlp_step: the same MLP and step, timed on the CPU.

Model: 4 x (Linear(1024, 1024), ReLU), then Linear(1024, 16); batch 256; cross-entropy.
A step is `model.zero_grad(); loss = cross_entropy(model(x), y); loss.backward()`, as
bench_mlp_step times `trainer.zero_grad(); trainer.forward_backward(x, y)`.

Prints one JSON object per thread count on stdout:
  {"name": "torch/threads:1", "step_ms": <median>, "steps": [...], "torch": "<version>", ...}
Exits 0 with {"skipped": "..."} when torch cannot be imported, so callers can tell.
"""

import argparse
import json
import statistics
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated torch.set_num_threads values")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps per thread count")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(json.dumps({"skipped": f"torch is not importable: {error}"}))
        return 0

    width, classes, rows = 1024, 16, 256
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))
    x = torch.rand(rows, width) * 2 - 1
    y = torch.randint(0, classes, (rows,))

    def step():
        model.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()

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
            "name": f"torch/threads:{threads}",
            "step_ms": 1e3 * statistics.median(times),
            "steps": len(times),
            "torch": torch.__version__,
            "blas": "mkl" if torch.backends.mkl.is_available() else "generic (system BLAS)",
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
