"""Checks the tensor data of a GGUF file Brigade wrote (models/hf/gguf.h) against the model's
parameters, with a GGUF reader of its own (struct, no gguf package) and the converter's
transforms written again here from their description:

    /usr/bin/python3 tests/reference/gguf_check.py FILE.gguf PARAMS.safetensors ARCH DTYPE N_HEAD N_KV_HEAD

PARAMS holds the model's parameters under its Hugging Face names (F32). ARCH: gpt2 | llama.
DTYPE: F32 | F16 | BF16, the dtype of the 2-D weights (1-D tensors must be F32).

- GPT-2: HF Conv1D weights (c_attn, c_proj, c_fc) transposed to (out, in); output.weight a copy of
  token_embd.weight.
- LLaMA: q_proj / k_proj rows permuted per head from HF's rotary halves to GGML's interleaved pairs:
  new row h*HS + 2i + j = old row h*HS + j*HS/2 + i (j in {0, 1}), with N_HEAD heads for q and
  N_KV_HEAD for k. Computed both by that index formula and as llama.cpp's converter describes it
  (reshape (heads, 2, HS/2, C), swap axes 1 and 2), which must agree.
- F32 data must equal the parameters bit for bit; F16 equal numpy's float16 rounding; BF16 equal
  round-to-nearest-even of the f32 bits (checked against torch's bfloat16 too).
- Layout: magic, version 3, offsets multiples of general.alignment, tensors inside the file and
  not overlapping, shapes in GGML order (the row-major shape reversed), the exact set of names.

Prints "ok: N tensors" and exits 0, or prints every mismatch and exits 1.
"""
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
ESIZE = {GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2}


class Reader:
    def __init__(self, data):
        self.d = data
        self.p = 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.d[self.p:self.p + n].decode("utf-8")
        self.p += n
        return s

    SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(self, t):
        if t in self.SCALAR:
            return self.take(self.SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            sub = self.take("I")
            n = self.take("Q")
            return [self.value(sub) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_gguf(path):
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    r.p = 4
    version = r.take("I")
    n_tensors = r.take("Q")
    n_kv = r.take("Q")
    kv = {}
    for _ in range(n_kv):
        k = r.string()
        kv[k] = r.value(r.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        typ = r.take("I")
        off = r.take("Q")
        infos.append((name, dims, typ, off))
    align = kv.get("general.alignment", 32)
    start = (r.p + align - 1) // align * align
    return data, version, kv, infos, start, align


def permute_by_index(w, heads):
    rows = w.shape[0]
    hs = rows // heads
    out = np.empty_like(w)
    for h in range(heads):
        for i in range(hs // 2):
            for j in range(2):
                out[h * hs + 2 * i + j] = w[h * hs + j * (hs // 2) + i]
    return out


def permute_as_converter(w, heads):
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(params, arch, n_head, n_kv_head, errors):
    """GGUF name -> expected f32 array (row-major, torch shape)."""
    p = {k: v.float().numpy() for k, v in params.items()}
    out = {}
    if arch == "gpt2":
        pre = "transformer."
        out["token_embd.weight"] = p[pre + "wte.weight"]
        out["output.weight"] = p[pre + "wte.weight"]
        out["position_embd.weight"] = p[pre + "wpe.weight"]
        out["output_norm.weight"] = p[pre + "ln_f.weight"]
        out["output_norm.bias"] = p[pre + "ln_f.bias"]
        n_layer = len({k.split(".")[2] for k in p if k.startswith(pre + "h.")})
        parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
                 "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
        for i in range(n_layer):
            for hf, gg in parts.items():
                for wb in ("weight", "bias"):
                    t = p[f"{pre}h.{i}.{hf}.{wb}"]
                    if wb == "weight" and t.ndim == 2:
                        t = np.ascontiguousarray(t.T)  # Conv1D (in, out) -> (out, in)
                    out[f"blk.{i}.{gg}.{wb}"] = t
    elif arch == "llama":
        out["token_embd.weight"] = p["model.embed_tokens.weight"]
        out["output_norm.weight"] = p["model.norm.weight"]
        out["output.weight"] = p["lm_head.weight"]
        n_layer = len({k.split(".")[2] for k in p if k.startswith("model.layers.")})
        parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
        for i in range(n_layer):
            for hf, gg in parts.items():
                t = p[f"model.layers.{i}.{hf}.weight"]
                heads = n_head if hf.endswith("q_proj") else n_kv_head if hf.endswith("k_proj") else 0
                if heads:
                    a, b = permute_by_index(t, heads), permute_as_converter(t, heads)
                    if not np.array_equal(a, b):
                        errors.append(f"{hf}: the index permutation and the converter's differ")
                    if np.array_equal(a, t):
                        errors.append(f"{hf}: the permutation changed nothing (degenerate test weights)")
                    t = a
                out[f"blk.{i}.{gg}.weight"] = t
    else:
        raise ValueError(f"arch {arch}")
    return out


def bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even (no NaNs here)


def main():
    path, params_path, arch, dtype, n_head, n_kv_head = sys.argv[1:7]
    n_head, n_kv_head = int(n_head), int(n_kv_head)
    want_2d = {"F32": GGML_F32, "F16": GGML_F16, "BF16": GGML_BF16}[dtype]
    errors = []
    data, version, kv, infos, start, align = read_gguf(path)
    params, _ = st_io.load(params_path)
    want = expected_tensors(params, arch, n_head, n_kv_head, errors)
    if version != 3:
        errors.append(f"version {version}")
    if kv.get("general.architecture") != arch:
        errors.append(f"general.architecture {kv.get('general.architecture')!r}")
    names = [i[0] for i in infos]
    if sorted(names) != sorted(want) or len(set(names)) != len(names):
        errors.append(f"tensor names: extra {sorted(set(names) - set(want))}, missing {sorted(set(want) - set(names))}")
    spans = []
    for name, dims, typ, off in infos:
        if name not in want:
            continue
        w = want[name]
        if list(dims) != list(reversed(w.shape)):
            errors.append(f"{name}: GGML dims {dims}, want {list(reversed(w.shape))}")
            continue
        exp_type = want_2d if w.ndim == 2 else GGML_F32
        if typ != exp_type:
            errors.append(f"{name}: ggml type {typ}, want {exp_type}")
            continue
        if off % align:
            errors.append(f"{name}: offset {off} not a multiple of {align}")
        nbytes = w.size * ESIZE[typ]
        b = start + off
        if b + nbytes > len(data):
            errors.append(f"{name}: data [{b}, {b + nbytes}) beyond the file ({len(data)} bytes)")
            continue
        spans.append((b, b + nbytes, name))
        raw = data[b:b + nbytes]
        if typ == GGML_F32:
            got = np.frombuffer(raw, dtype="<f4").reshape(w.shape)
            ok = np.array_equal(got.view(np.uint32), w.astype(np.float32).view(np.uint32))
        elif typ == GGML_F16:
            got = np.frombuffer(raw, dtype="<u2")
            ok = np.array_equal(got, w.astype(np.float16).reshape(-1).view(np.uint16))
        else:
            got = np.frombuffer(raw, dtype="<u2")
            ref = bf16_bits(w).reshape(-1)
            tref = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(torch.bfloat16)
            if not np.array_equal(ref, tref.view(torch.int16).numpy().view(np.uint16).reshape(-1)):
                errors.append(f"{name}: this script's bf16 rounding differs from torch's")
            ok = np.array_equal(got, ref)
        if not ok:
            errors.append(f"{name}: data differs from the expected {dtype if w.ndim == 2 else 'F32'} values")
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            errors.append(f"{n0} and {n1} overlap")
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print(f"ok: {len(infos)} tensors")


if __name__ == "__main__":
    main()
