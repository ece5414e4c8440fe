#!/usr/bin/env python3
"""Compares one pipelined gpipe step with PyTorch on the same weights and batch.

Runs pytorch_dump_step (the path is the first argument) into a scratch folder, builds the same
models as torch.nn.Sequential (a Residual is an nn.Sequential whose forward adds its input, so
its children are named "i.j" as in gpipe), loads gpipe's parameters with load_state_dict
(strict), runs forward and backward in float64 and checks gpipe's loss and every gradient, then
two steps of torch.optim.AdamW / SGD against gpipe's parameters after the same two steps.
The same for a GPT against a nanoGPT-style model (token + position embedding, pre-norm blocks
with causal self-attention and a tanh-GELU MLP, final LayerNorm, linear head), for every split,
schedule, micro-batch count and remat policy that pytorch_dump_step writes; and the same GPT with
packed documents (the mask and position restarts written in nanogpt.py from the document ids) and
ignored (-100) targets.
Exits 77 (CTest: skipped) when torch is not installed. safetensors files are read with the
safetensors package where it is installed, else by the small reader below.
"""
import glob
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"skipped: {e} (apt-get install python3-torch, or pip install torch, to run this check)")
    sys.exit(77)

from nanogpt import Block, Embedding  # noqa: E402 (needs torch)

try:
    from safetensors.torch import load_file
except ImportError:
    from safetensors_f32 import load_file


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


def check_tied_gpt(tmp):
    """GPT-2's tying: the LM head (no bias) shares wte's tensor. gpipe's file holds it once, as
    0.wte.weight; its gradient is the sum of both uses; two SGD steps. Returns the failures."""
    V, T, D, H = 11, 5, 12, 3
    nn = torch.nn
    model = nn.Sequential(Embedding(V, T, D), Block(D, H), Block(D, H), Block(D, H),
                          nn.LayerNorm(D, eps=1e-5), nn.Linear(D, V, bias=False))
    model[5].weight = model[0].wte.weight
    missing, unexpected = model.load_state_dict(load_file(f"{tmp}/params_tied_gpt.safetensors"),
                                                strict=False)
    failures = int(missing != ["5.weight"] or unexpected != [])
    model = model.double()
    assert model[5].weight is model[0].wte.weight
    batch = load_file(f"{tmp}/batch_gpt.safetensors")
    x, y = batch["x"].long(), batch["y"].long()

    def loss_of():
        return nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))

    loss = loss_of()
    loss.backward()
    gpipe_loss = float(open(f"{tmp}/loss_tied_gpt.txt").read())
    loss_error = abs(gpipe_loss - loss.item()) / abs(loss.item())
    grads = load_file(f"{tmp}/grads_tied_gpt.safetensors")
    failures += sorted(grads) != sorted(n for n, _ in model.named_parameters())
    grad_error = 0.0
    for pname, p in model.named_parameters():
        scale = p.grad.abs().max().item() or 1.0
        grad_error = max(grad_error, (grads[pname].double() - p.grad).abs().max().item() / scale)
    failures += loss_error > 1e-6 or grad_error > 2e-5
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    optimizer.step()
    optimizer.zero_grad()
    loss_of().backward()
    optimizer.step()
    stepped = load_file(f"{tmp}/stepped_tied_gpt.safetensors")
    step_error = 0.0
    for pname, p in model.named_parameters():
        got, want = stepped[pname].double(), p.detach()
        tensor_error = (got - want).abs().max().item() / (want.abs().max().item() or 1.0)
        if tensor_error > 1e-5:
            print(f"  tied gpt after 2 SGD steps {pname}: max rel error {tensor_error:.1e}  FAILED")
        step_error = max(step_error, tensor_error)
    failures += step_error > 1e-5
    print(f"tied gpt: loss rel error {loss_error:.1e}, worst gradient {grad_error:.1e}, "
          f"after 2 SGD steps {step_error:.1e}{'' if failures == 0 else '  FAILED'}")
    return failures


def check_gpt(tmp):
    """The GPT of pytorch_dump_step (V = 11, T = 5, D = 12, H = 3, 3 blocks) in float64 against
    every configuration's loss and gradients, and two AdamW steps. Returns the failures."""
    V, T, D, H = 11, 5, 12, 3
    nn = torch.nn

    def fresh():
        model = nn.Sequential(Embedding(V, T, D), Block(D, H), Block(D, H), Block(D, H),
                              nn.LayerNorm(D, eps=1e-5), nn.Linear(D, V))
        model.load_state_dict(load_file(f"{tmp}/params_gpt.safetensors"), strict=True)
        return model.double()

    batch = load_file(f"{tmp}/batch_gpt.safetensors")
    x, y = batch["x"].long(), batch["y"].long()

    def loss_of(model):
        return nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))

    model = fresh()
    loss = loss_of(model)
    loss.backward()
    failures = 0
    runs = sorted(glob.glob(f"{tmp}/grads_gpt_*.safetensors"))
    worst_loss = worst_grad = 0.0
    for path in runs:
        tag = os.path.basename(path)[len("grads_"):-len(".safetensors")]
        gpipe_loss = float(open(f"{tmp}/loss_{tag}.txt").read())
        loss_error = abs(gpipe_loss - loss.item()) / abs(loss.item())
        grads = load_file(path)
        grad_error = 0.0
        for pname, p in model.named_parameters():
            scale = p.grad.abs().max().item() or 1.0
            grad_error = max(grad_error, (grads[pname].double() - p.grad).abs().max().item() / scale)
        ok = loss_error < 1e-6 and grad_error < 2e-5
        failures += not ok
        worst_loss, worst_grad = max(worst_loss, loss_error), max(worst_grad, grad_error)
        if not ok:
            print(f"  {tag}: loss rel error {loss_error:.1e}, worst gradient {grad_error:.1e}  FAILED")
    print(f"gpt: {len(runs)} configurations (K, schedule, M, remat), loss torch {loss.item():.7f}; "
          f"worst rel error: loss {worst_loss:.1e}, gradients {worst_grad:.1e}")
    failures += len(runs) != 54

    model = fresh()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        loss_of(model).backward()
        optimizer.step()
    stepped = load_file(f"{tmp}/stepped_gpt.safetensors")
    # The key thirds of c_attn's bias have a gradient of exactly 0 (q . b_k is the same for every
    # key of a query, and softmax ignores it), so both gradients are rounding noise, which
    # AdamW's g / sqrt(v) turns into steps of up to lr in either direction. Those entries are
    # checked against that bound: 2 steps of lr = 1e-2.
    for pname, p in model.named_parameters():
        got, want = stepped[pname].double(), p.detach()
        if pname.endswith("attn.c_attn.bias"):
            keys = slice(D, 2 * D)
            key_drift = (got[keys] - want[keys]).abs().max().item()
            ok = key_drift <= 2 * 1e-2 * 1.001
            failures += not ok
            if not ok:
                print(f"  gpt after 2 AdamW steps {pname}[D:2D]: drift {key_drift:.1e}  FAILED")
            got, want = torch.cat([got[:D], got[2 * D:]]), torch.cat([want[:D], want[2 * D:]])
        scale = want.abs().max().item() or 1.0
        error = (got - want).abs().max().item() / scale
        ok = error < 1e-5
        failures += not ok
        if not ok:
            print(f"  gpt after 2 AdamW steps {pname}: max rel error {error:.1e}  FAILED")
    print(f"gpt: two AdamW steps checked on {len(stepped)} tensors")
    return failures


def check_packed_gpt(tmp):
    """The GPT with packed documents and ignored targets: gpipe's loss and gradients of every
    configuration against the float64 model whose attention masks other runs and whose positions
    restart at each run, with cross_entropy's ignore_index -100. Returns the failures."""
    V, T, D, H = 11, 5, 12, 3
    nn = torch.nn
    layers = [Embedding(V, T, D), Block(D, H), Block(D, H), Block(D, H), nn.LayerNorm(D, eps=1e-5),
              nn.Linear(D, V)]
    model = nn.Sequential(*layers)
    model.load_state_dict(load_file(f"{tmp}/params_gpt.safetensors"), strict=True)
    model = model.double()
    batch = load_file(f"{tmp}/batch_packed_gpt.safetensors")
    x, y, d = batch["x"].long(), batch["y"].long(), batch["d"].long()
    h = model[0](x, d)
    for block in model[1:4]:
        h = block(h, d)
    logits = model[5](model[4](h))
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100)
    loss.backward()
    # the documents and ignored targets matter: the plain model's loss is another
    plain = nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1), ignore_index=-100)
    failures = int(abs(plain.item() - loss.item()) < 1e-3 * abs(loss.item()))
    runs = sorted(glob.glob(f"{tmp}/grads_packed_gpt_*.safetensors"))
    worst_loss = worst_grad = 0.0
    for path in runs:
        tag = os.path.basename(path)[len("grads_"):-len(".safetensors")]
        gpipe_loss = float(open(f"{tmp}/loss_{tag}.txt").read())
        loss_error = abs(gpipe_loss - loss.item()) / abs(loss.item())
        grads = load_file(path)
        grad_error = 0.0
        for pname, p in model.named_parameters():
            scale = p.grad.abs().max().item() or 1.0
            grad_error = max(grad_error, (grads[pname].double() - p.grad).abs().max().item() / scale)
        ok = loss_error < 1e-6 and grad_error < 2e-5
        failures += not ok
        worst_loss, worst_grad = max(worst_loss, loss_error), max(worst_grad, grad_error)
        if not ok:
            print(f"  {tag}: loss rel error {loss_error:.1e}, worst gradient {grad_error:.1e}  FAILED")
    print(f"packed gpt: {len(runs)} configurations, loss torch {loss.item():.7f} (without "
          f"documents {plain.item():.7f}); worst rel error: loss {worst_loss:.1e}, gradients "
          f"{worst_grad:.1e}")
    failures += len(runs) != 24
    return failures


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
        failures += check_gpt(tmp)
        failures += check_tied_gpt(tmp)
        failures += check_packed_gpt(tmp)
    print("passed" if failures == 0 else f"{failures} FAILED")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
