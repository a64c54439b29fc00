"""Minimal, independent safetensors writer and reader (struct + json, no `safetensors`
package), used to write every Brigade fixture and to read Brigade-written files.

Format (https://github.com/huggingface/safetensors): u64 little-endian header length N,
N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}} padded with spaces to a multiple of 8, then the data buffer.
This writer keeps data in the given order but writes header keys sorted, so a reader
that assumed header order == data order would fail on our fixtures (on purpose).
"""
import json
import struct

import torch

DTYPES = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
    "I32": torch.int32, "I64": torch.int64, "F64": torch.float64,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def tensor_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()  # little-endian host assumed (x86/arm)


def dumps(tensors, metadata=None):
    """tensors: list of (name, tensor) in data order. Returns the file bytes."""
    header = {}
    chunks = []
    off = 0
    for name, t in tensors:
        assert name not in header and name != "__metadata__", name
        b = tensor_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    if metadata:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        header["__metadata__"] = dict(metadata)
    h = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


def save(path, tensors, metadata=None):
    with open(path, "wb") as f:
        f.write(dumps(tensors, metadata))


def load(path):
    """Returns (dict name -> tensor (owned copy), metadata dict). Validates the layout."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: truncated (less than 8 bytes)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} beyond file size")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buf = memoryview(data)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    spans = []
    for name, info in header.items():
        dt = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        shape = info["shape"]
        numel = 1
        for s in shape:
            numel *= s
        esize = torch.empty((), dtype=dt).element_size()
        if not (0 <= b <= e <= len(buf)) or (e - b) != numel * esize:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {info['data_offsets']} for shape {shape}")
        spans.append((b, e, name))
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dt)
        else:
            out[name] = torch.frombuffer(bytearray(buf[b:e]), dtype=dt).reshape(shape).clone()
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise ValueError(f"{path}: tensor {name}: data_offsets overlap or leave a gap at {pos}")
        pos = e
    if pos != len(buf):
        raise ValueError(f"{path}: tensors cover {pos} of {len(buf)} data bytes")
    return out, meta
