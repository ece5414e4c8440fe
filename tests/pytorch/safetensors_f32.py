"""F32 safetensors files for tests/pytorch/, without the safetensors package: an 8-byte
little-endian header size, a JSON header {name: {dtype, shape, data_offsets}} padded with spaces
to a multiple of 8 bytes, then the data. Readers prefer the package's load_file where it is
installed; save_file here also writes tensors that share memory (a tied state dict's two names),
which the package refuses."""
import json
import struct

import torch


def load_file(path):
    """{name: float32 tensor} of a file of F32 tensors."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}"
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        out[name] = flat.reshape(info["shape"]).clone()
    return out


def save_file(path, tensors):
    """Every tensor as F32, in name order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        blob = tensors[name].detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
