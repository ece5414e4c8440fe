#!/usr/bin/env python3
"""Compares one pipelined gpipe step of a Llama with Hugging Face's LlamaForCausalLM math in
float64 (tests/pytorch/llama.py, written out without the transformers package).

Runs pytorch_llama_dump_step (the path is the first argument) into a scratch folder, loads the
parameters it saved under Hugging Face's names (gpipe::hf_llama_names) into the PyTorch model with
load_state_dict (strict), runs forward and backward in float64 on the same batch, and checks
gpipe's loss and every gradient (renamed by the names_<model>.txt it wrote) within 1e-5 relative,
for every split, schedule and remat policy that pytorch_llama_dump_step writes. And one
LlamaBlock on packed documents, which pytorch_llama_dump_step ran in double: its output, input
gradient and parameter gradients against the decoder layer's with the documents' mask and
positions.
Exits 77 (CTest: skipped) when torch is not installed.
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

from llama import DecoderLayer, LlamaForCausalLM  # noqa: E402 (needs torch)

try:
    from safetensors.torch import load_file
except ImportError:
    from safetensors_f32 import load_file

# name: (vocab, width, heads, kv_heads, hidden, layers, rope base), as pytorch_llama_dump_step's
MODELS = {"gqa": (13, 32, 8, 2, 40, 2, 10000.0), "mqa": (13, 32, 4, 1, 40, 2, 500000.0)}
TOLERANCE = 1e-5


def relative(got, want):
    """max |got - want| relative to want's largest entry."""
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check(tmp, name, shape):
    failures = []
    model = LlamaForCausalLM(*shape).double()
    params = load_file(os.path.join(tmp, f"params_{name}.safetensors"))
    params = {k: v.double() for k, v in params.items()}
    model.load_state_dict(params, strict=True)
    batch = load_file(os.path.join(tmp, f"batch_{name}.safetensors"))
    x, y = batch["x"].long(), batch["y"].long()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    want = {k: p.grad for k, p in model.named_parameters()}
    renamed = {}
    with open(os.path.join(tmp, f"names_{name}.txt")) as f:
        for line in f:
            gpipe_name, hf_name = line.strip().split(", ")
            renamed[gpipe_name] = hf_name
    runs = sorted(glob.glob(os.path.join(tmp, f"grads_{name}_*.safetensors")))
    if not runs:
        failures.append(f"{name}: no gradients written")
    for path in runs:
        tag = os.path.basename(path)[len("grads_"):-len(".safetensors")]
        with open(os.path.join(tmp, f"loss_{tag}.txt")) as f:
            got_loss = float(f.read())
        e = abs(got_loss - loss.item()) / abs(loss.item())
        if e > TOLERANCE:
            failures.append(f"{tag}: loss {got_loss} vs PyTorch {loss.item()} (relative {e:.3g})")
        grads = load_file(path)
        if sorted(renamed[k] for k in grads) != sorted(want):
            failures.append(f"{tag}: gradient names {sorted(grads)} do not map onto {sorted(want)}")
            continue
        worst = 0.0
        for gpipe_name, g in grads.items():
            e = relative(g.double(), want[renamed[gpipe_name]])
            worst = max(worst, e)
            if e > TOLERANCE:
                failures.append(f"{tag}: {renamed[gpipe_name]} off by {e:.3g} relative")
        print(f"{tag}: loss {got_loss:.7f} (PyTorch {loss.item():.7f}), worst gradient {worst:.2e}")
    return failures


def check_block_with_documents(tmp):
    """The LlamaBlock<32, 8, 2, 40> that pytorch_llama_dump_step ran in double on packed documents
    (its results stored as float32: compared within 1e-6)."""
    failures = []
    saved = {k: v.double() for k, v in
             load_file(os.path.join(tmp, "block_documents.safetensors")).items()}
    layer = DecoderLayer(32, 8, 2, 40, 10000.0).double()
    layer.load_state_dict({k: v for k, v in saved.items()
                           if k not in ("x", "document", "dy", "y", "dx")
                           and not k.startswith("grad.")}, strict=True)
    x = saved["x"].clone().requires_grad_(True)
    y = layer(x, saved["document"].long())
    y.backward(saved["dy"])
    checks = [("y", y.detach(), saved["y"]), ("dx", x.grad, saved["dx"])]
    checks += [(name, p.grad, saved["grad." + name]) for name, p in layer.named_parameters()]
    worst = 0.0
    for name, want, got in checks:
        e = relative(got, want)
        worst = max(worst, e)
        if e > 1e-6:
            failures.append(f"block with documents: {name} off by {e:.3g} relative")
    print(f"block with documents: worst difference {worst:.2e}")
    return failures


def main():
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} <pytorch_llama_dump_step>")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.argv[1], tmp], check=True)
        failures = []
        for name, shape in MODELS.items():
            failures += check(tmp, name, shape)
        failures += check_block_with_documents(tmp)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
