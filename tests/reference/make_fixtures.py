"""Writes Brigade's test fixtures into tests/fixtures/ (run from anywhere):

    /usr/bin/python3 tests/reference/make_fixtures.py [--out DIR]

Files (all safetensors written by st_io.py; __metadata__ has magic=brigade-fixture,
version=1, and a `kind`):
  rng.safetensors          torch generator outputs for tests/core/test_rng.cpp
  rng_default.safetensors  the same, with torch forced to ATEN_CPU_CAPABILITY=default
  dtype_conversions.safetensors  f32 -> bf16/f16 (and f16 -> f32) conversions by torch
  gpt2_tiny.safetensors    GPT-2 parity: params, ids, targets, logits, loss, grads, AdamW losses
  safetensors_py.safetensors  all dtypes, 0-d, empty, multi-d + metadata for the loader test
Deterministic: re-running gives identical bytes (single thread, fixed seeds).
Needs torch 1.13 on an AVX2/AVX512 CPU (rng.safetensors records torch's CPU kernels).
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from gpt2_ref import GPT2  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}

# ---------------------------------------------------------------- RNG
# Each case runs in order on torch's default generator. `seed` (if present) calls
# torch.manual_seed first; otherwise the generator continues from the previous case.
# layout: contiguous (shape), transpose (a (shape[1], shape[0]) tensor viewed .t()),
# slice2 (a (shape[0], 2*shape[1]) tensor viewed [:, ::2]). The stored tensor is the
# filled view in logical order (shape = `shape`).
SIZES = [1, 7, 15, 16, 17, 31, 100, 1000, 4097, 50000]
MEAN_STD = [(0.0, 1.0), (0.0, 0.02), (0.5, 2.0), (-1.0, 0.1), (3.0, 0.5)]


def rng_cases(full=True):
    cases = []

    def add(op, shape, a, b, layout="contiguous", seed=None):
        c = dict(op=op, shape=list(shape), a=a, b=b, layout=layout)
        if seed is not None:
            c["seed"] = seed
        cases.append(c)

    sizes = SIZES if full else [1, 16, 17, 100, 1000]
    # every size from a fresh seed, then the same sizes back to back on one generator
    for i, n in enumerate(sizes):
        m, s = MEAN_STD[i % len(MEAN_STD)]
        add("normal", [n], m, s, seed=1234 + i)
    add("normal", [1], 0.0, 1.0, seed=42)
    for i, n in enumerate(sizes if not full else SIZES[:-1] + [5003]):  # (50000 once is enough bytes)
        m, s = MEAN_STD[(i + 1) % len(MEAN_STD)]
        add("normal", [n], m, s)
    add("normal", [3], 0.0, 1.0)   # odd: leaves a cached double-normal sample
    add("normal", [5, 7], 0.0, 1.0)  # 35 >= 16: vector path; cache must survive it
    add("normal", [1], 0.0, 1.0)   # consumes the cached sample
    add("uniform", [37], 0.0, 1.0)
    add("uniform", [3, 50], -2.0, 3.5)
    add("uniform", [], 0.0, 1.0)     # 0-d
    add("normal", [], 1.0, 2.0)      # 0-d
    add("normal", [0], 0.0, 1.0)     # empty: draws nothing
    add("normal", [17, 5], 0.0, 1.0, layout="transpose")  # non-contiguous, >= 16
    add("normal", [6, 9], 1.0, 2.0, layout="slice2")
    add("uniform", [7, 3], 0.0, 1.0, layout="transpose")
    add("uniform", [5, 5], -1.0, 1.0, layout="slice2")
    add("normal", [4, 4], 0.0, 0.02)
    add("normal", [2, 100], 0.0, 1.0, seed=2**64 - 1)
    add("normal", [33], 0.1, 0.2, seed=0)
    return cases


def run_rng_cases(cases):
    out = []
    for c in cases:
        if "seed" in c:
            torch.manual_seed(c["seed"])
        shape = c["shape"]
        if c["layout"] == "contiguous":
            t = torch.zeros(shape)
        elif c["layout"] == "transpose":
            t = torch.zeros(shape[1], shape[0]).t()
        elif c["layout"] == "slice2":
            t = torch.zeros(shape[0], 2 * shape[1])[:, ::2]
        else:
            raise ValueError(c["layout"])
        if c["op"] == "normal":
            t.normal_(c["a"], c["b"])
        else:
            t.uniform_(c["a"], c["b"])
        out.append(t.contiguous())
    return out


def write_rng(path, full, capability):
    cases = rng_cases(full)
    vals = run_rng_cases(cases)
    meta = dict(MAGIC, kind="rng", torch=torch.__version__, cpu_capability=capability,
                cases=json.dumps(cases, separators=(",", ":")))
    st_io.save(path, [(f"case.{i:02d}", v) for i, v in enumerate(vals)], meta)


# ---------------------------------------------------------------- dtype conversions

def f32_from_bits(bits):
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def write_dtypes(path):
    special = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF800000, 0x7FC00000,
               0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,
               0x7F7FFFFF, 0xFF7FFFFF,
               # bf16 ties: lower half exactly 0x8000 with even / odd kept bit, and just above/below
               0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7F8000, 0x7F7FFFFF,
               # f16 edges: max half 65504, rounding to Inf at 65520, smallest normal/denormal, ties
               0x477FE000, 0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33800000, 0x33000000,
               0x33000001, 0x32FFFFFF, 0x3F801000, 0x3F803000, 0x3F801001, 0x3580_0000, 0x3540_0000]
    g = torch.Generator().manual_seed(99)
    rnd = torch.randint(0, 2**32, (2000,), generator=g, dtype=torch.int64).tolist()
    # values near 1 and in the half range, so most random ones are not Inf/0 in f16
    scaled = (torch.randn(1000, generator=g) * 100).view(torch.int32).tolist()
    bits = special + rnd + [b & 0xFFFFFFFF for b in scaled]
    src = f32_from_bits(bits)
    h = torch.randint(0, 2**16, (1000,), generator=g, dtype=torch.int64)
    h = torch.cat([h, torch.tensor([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
                                    0x7C01, 0x3C00])])
    h16 = h.to(torch.int16).view(torch.float16) if hasattr(torch.Tensor, "view") else None
    h16 = h.to(torch.int32).to(torch.int16).view(torch.float16)
    meta = dict(MAGIC, kind="dtype_conversions", torch=torch.__version__,
                note="f32_src -> bf16/f16 by Tensor.to (round to nearest even; torch makes every NaN "
                     "0x7FC0 in bf16); f16_src -> f16_to_f32 by Tensor.float()")
    st_io.save(path, [("f32_src", src), ("bf16", src.to(torch.bfloat16)), ("f16", src.to(torch.float16)),
                      ("f16_src", h16), ("f16_to_f32", h16.float())], meta)


# ---------------------------------------------------------------- GPT-2 parity

GPT_CFG = dict(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=32, layer_norm_eps=1e-5)
BATCH = dict(B=2, T=16, data_seed=4321)
INIT_SEED = 1234
ADAMW = dict(lr=1e-3, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, steps=10,
             decay="weight_decay only for params with dim >= 2 (two param groups), foreach=False")


def make_batch(V, B, T, data_seed):
    g = torch.Generator().manual_seed(data_seed)
    data = torch.randint(0, V, (B, T + 1), generator=g)  # (B, T+1)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def write_gpt2(path):
    model = GPT2(**GPT_CFG)
    model.init_weights(INIT_SEED)
    params0 = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    ids, targets = make_batch(GPT_CFG["vocab_size"], **BATCH)
    logits, loss = model(ids, targets)
    loss.backward()
    grads = [(f"grad.{n}", p.grad.detach().clone()) for n, p in model.named_parameters()]

    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"], foreach=False)
    losses = []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad(set_to_none=True)
        _, l = model(ids, targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    with torch.no_grad():
        losses.append(model(ids, targets)[1].item())
    meta = dict(MAGIC, kind="gpt2_parity", torch=torch.__version__,
                config=json.dumps(GPT_CFG), batch=json.dumps(BATCH), init_seed=str(INIT_SEED),
                init="torch.manual_seed(init_seed); wte, wpe normal_(0,0.02); per layer c_attn normal_(0,0.02), "
                     "attn.c_proj normal_(0,0.02/sqrt(2*n_layer)), c_fc normal_(0,0.02), mlp.c_proj "
                     "normal_(0,0.02/sqrt(2*n_layer)); biases 0, LayerNorm 1/0",
                adamw=json.dumps(ADAMW),
                adamw_losses="adamw_losses[k] = loss after k AdamW steps on (ids, targets), k = 0..steps",
                ids="torch.randint(0, V, (B, T+1), generator=torch.Generator().manual_seed(data_seed)): "
                    "ids = [:, :-1], targets = [:, 1:]")
    tensors = params0 + [("ids", ids), ("targets", targets), ("logits", logits.detach()),
                         ("loss", loss.detach().reshape(())), ("adamw_losses", torch.tensor(losses, dtype=torch.float32))]
    tensors += grads
    st_io.save(path, tensors, meta)


# ---------------------------------------------------------------- loader fixture

def write_loader(path):
    tensors = [
        ("f32_2x3", torch.tensor([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], dtype=torch.float32)),
        ("bf16_4", torch.tensor([1.0, -2.5, 3.140625, float("inf")], dtype=torch.bfloat16)),
        ("f16_2x2x2", torch.tensor([0.5, -1.0, 65504.0, 6.103515625e-05, 5.960464477539063e-08, -0.0, 2.0, 3.0],
                                   dtype=torch.float16).reshape(2, 2, 2)),
        ("i32_5", torch.tensor([-2147483648, -1, 0, 1, 2147483647], dtype=torch.int32)),
        ("i64_scalar", torch.tensor(1099511627776 + 7, dtype=torch.int64)),
        ("f32_scalar", torch.tensor(3.25, dtype=torch.float32)),
        ("f32_empty_0x3", torch.empty(0, 3, dtype=torch.float32)),
        ("i64_1x2x1x3", torch.arange(-3, 3, dtype=torch.int64).reshape(1, 2, 1, 3)),
        ("name with spaces/and.dots", torch.tensor([7.0])),
    ]
    meta = dict(MAGIC, kind="safetensors_loader", note="written by tests/reference/st_io.py; header keys sorted, "
                "data in list order", unicode="μ-ünïcode ✓")
    st_io.save(path, tensors, meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    ap.add_argument("--rng-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--capability", default="avx2", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    if args.rng_only:  # child process under ATEN_CPU_CAPABILITY=default
        write_rng(os.path.join(args.out, "rng_default.safetensors"), full=False, capability=args.capability)
        return
    cap = os.environ.get("ATEN_CPU_CAPABILITY", "")
    if cap not in ("", "avx2", "avx512"):
        sys.exit("run make_fixtures.py without ATEN_CPU_CAPABILITY (it forces 'default' itself where needed)")
    if "AVX2" not in torch.__config__.show() and "AVX512" not in torch.__config__.show():
        sys.exit("torch does not report AVX2/AVX512 CPU capability; rng.safetensors would record a different kernel")
    write_rng(os.path.join(args.out, "rng.safetensors"), full=True, capability="avx2")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--rng-only",
                    "--capability", "default"], env=env, check=True)
    write_dtypes(os.path.join(args.out, "dtype_conversions.safetensors"))
    write_gpt2(os.path.join(args.out, "gpt2_tiny.safetensors"))
    write_loader(os.path.join(args.out, "safetensors_py.safetensors"))
    for f in sorted(os.listdir(args.out)):
        if f.endswith(".safetensors"):
            print(f"{f}: {os.path.getsize(os.path.join(args.out, f))} bytes")


if __name__ == "__main__":
    main()
