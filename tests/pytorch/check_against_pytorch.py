#!/usr/bin/env python3
"""Compares one pipelined gpipe step with PyTorch on the same weights and batch.

Runs pytorch_dump_step (the path is the first argument) into a scratch folder, builds the same
models as torch.nn.Sequential (a Residual is an nn.Sequential whose forward adds its input, so
its children are named "i.j" as in gpipe), loads gpipe's parameters with load_state_dict
(strict), runs forward and backward in float64 and checks gpipe's loss and every gradient, then
two steps of torch.optim.AdamW / SGD against gpipe's parameters after the same two steps.
Exits 77 (CTest: skipped) when torch or safetensors is not installed.
"""
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: {e} (pip install torch safetensors to run this check)")
    sys.exit(77)


class Residual(torch.nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)


def models():
    nn = torch.nn
    cross_entropy = nn.Sequential(
        nn.Linear(12, 32), nn.ReLU(),
        nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32, eps=1e-5),
        Residual(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 32)), nn.Linear(32, 7))
    mse = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24, eps=1e-5), nn.Linear(24, 5))
    return {
        "cross_entropy": (
            cross_entropy, lambda out, y: nn.functional.cross_entropy(out, y[:, 0].long()),
            lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)),
        "mse": (
            mse, lambda out, y: nn.functional.mse_loss(out, y),
            lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01,
                                           nesterov=True)),
    }


def main():
    dump = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([dump, tmp], check=True)
        for name, (model, loss_fn, make_optimizer) in models().items():
            params = load_file(f"{tmp}/params_{name}.safetensors")
            model.load_state_dict(params, strict=True)
            model = model.double()
            batch = load_file(f"{tmp}/batch_{name}.safetensors")
            x, y = batch["x"].double(), batch["y"].double()
            loss = loss_fn(model(x), y)
            loss.backward()
            gpipe_loss = float(open(f"{tmp}/loss_{name}.txt").read())
            grads = load_file(f"{tmp}/grads_{name}.safetensors")
            loss_error = abs(gpipe_loss - loss.item()) / abs(loss.item())
            print(f"{name}: loss gpipe {gpipe_loss:.7f} torch {loss.item():.7f} (rel {loss_error:.1e})")
            failures += loss_error > 1e-6
            for pname, p in model.named_parameters():
                reference = p.grad
                got = grads[pname].double()
                scale = reference.abs().max().item() or 1.0
                error = (got - reference).abs().max().item() / scale
                ok = error < 2e-5
                failures += not ok
                print(f"  {pname:12s} {tuple(reference.shape)!s:12s} max rel error {error:.1e}"
                      f"{'' if ok else '  FAILED'}")
            optimizer = make_optimizer(model.parameters())
            optimizer.step()
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            stepped = load_file(f"{tmp}/stepped_{name}.safetensors")
            for pname, p in model.named_parameters():
                scale = p.detach().abs().max().item() or 1.0
                error = (stepped[pname].double() - p.detach()).abs().max().item() / scale
                ok = error < 1e-5
                failures += not ok
                print(f"  after 2 steps {pname:12s} max rel error {error:.1e}"
                      f"{'' if ok else '  FAILED'}")
    print("passed" if failures == 0 else f"{failures} FAILED")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
