#!/usr/bin/env python3
"""LoRA against full fine-tuning on GPT-2 124M, and against a plain-PyTorch LoRA, side by side.

Three engines run the same training step (random token ids, AdamW, grad-norm clipping, same B,
T and threads), alternating round by round so machine noise hits each alike; the script prints
medians of tokens/s and the ratios:
  brigade-full   `brigade bench` of GPT-2 124M, every parameter trained
  brigade-lora   the same with finetune.method = "lora" (r 8, alpha 16, c_attn: PEFT's GPT-2
                 default), the base frozen
  torch-lora     tests/reference/gpt2_ref.py with the plain-PyTorch LoRA of
                 tests/reference/make_lora_fixtures.py (the base frozen, AdamW over the adapters)
It also reports memory (point 4 of the fine-tuning work): the allocator's measured peak of
params + grads + optimizer state for brigade-full and brigade-lora (their ratio), and what
`brigade train --dry-run --json` predicts for each, with the relative error.

PyTorch gets its best settings on this machine, in its own process only (as bench/gpt_vs_torch.py:
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset, ATEN_CPU_CAPABILITY=avx512, OMP_WAIT_POLICY=PASSIVE,
GLIBC_TUNABLES keeping freed memory, foreach AdamW); the preflight checks its fp32 GEMM peak
against Brigade's and refuses a ratio against a crippled peer. The output says so.

Usage: python3 bench/lora_bench.py [--brigade build/bin/brigade] [--steps 4] [--warmup 1]
                                   [--rounds 3] [--threads 2] [--seq-len 256] [--batch 4]
                                   [--skip-deps-check]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpt_vs_torch as gvt  # noqa: E402  (the peer's settings, the preflight)

LORA = dict(r=8, alpha=16.0, targets=["c_attn"])


def config(args):
    return dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=args.seq_len, batch_size=args.batch)


def brigade_sets(args, c, lora):
    sets = [f"model.{k}={c[k]}" for k in ("n_layer", "n_embd", "n_head", "vocab_size")]
    sets += [f"model.block_size={c['seq_len']}", f"train.seq_len={c['seq_len']}", f"train.batch_size={c['batch_size']}",
             f"run.threads={args.threads}", "optim.lr=6e-4", "train.grad_clip=1.0", "sample.top_k=1"]
    if lora:
        sets += ["finetune.method=lora", f"lora.r={LORA['r']}", f"lora.alpha={LORA['alpha']}",
                 "lora.target_modules=" + ",".join(LORA["targets"])]
    return sum([["--set", s] for s in sets], [])


def run_brigade(args, c, lora):
    cmd = [args.brigade, "bench", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + brigade_sets(args, c, lora)
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def predicted(args, c, lora):
    cmd = [args.brigade, "train", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--dry-run", "--json"] + \
        brigade_sets(args, c, lora)
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    return j["ranks"][0]["peak"]


def torch_worker(args):
    import time

    import torch

    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from gpt2_ref import GPT2
    from make_lora_fixtures import adapt

    c = json.loads(args.config_json)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = GPT2(c["vocab_size"], c["seq_len"], c["n_layer"], c["n_head"], c["n_embd"])
    model.init_weights(1337)
    adapt(model, LORA["targets"], LORA["r"], LORA["alpha"], 99)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)
    g = torch.Generator().manual_seed(1339)
    ids = torch.randint(0, c["vocab_size"], (c["batch_size"], c["seq_len"] + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"engine": "torch-lora", "median_step_s": med, "tokens_per_s": c["batch_size"] * c["seq_len"] / med,
                      "trainable": sum(p.numel() for p in trainable), "torch": torch.__version__}))


def run_torch(args, c):
    cmd = [gvt.TORCH_PY, os.path.abspath(__file__), "--torch-worker", "--config-json", json.dumps(c), "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=gvt.torch_env("fp32")).stdout
    return json.loads(out.strip().splitlines()[-1])


def state_bytes(peaks):
    return peaks["params"] + peaks["grads"] + peaks["optimizer"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--skip-deps-check", action="store_true")
    ap.add_argument("--install-deps", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    c = config(args)
    gvt.preflight(args)
    print(f"GPT-2 124M (12 x 768, vocab 50257), B {c['batch_size']} x T {c['seq_len']}, {args.threads} threads, fp32; "
          f"LoRA r {LORA['r']} alpha {LORA['alpha']:g} on {','.join(LORA['targets'])}; {args.rounds} rounds x "
          f"{args.steps} steps (+{args.warmup} warmup), engines alternating", flush=True)
    rate = {"brigade-full": [], "brigade-lora": [], "torch-lora": []}
    last = {}
    for k in range(args.rounds):
        for name in rate:
            r = run_torch(args, c) if name == "torch-lora" else run_brigade(args, c, name == "brigade-lora")
            rate[name].append(r["tokens_per_s"])
            last[name] = r
        print(f"round {k + 1}: " + ", ".join(f"{n} {v[-1]:.0f} tok/s" for n, v in rate.items()), flush=True)
    med = {n: statistics.median(v) for n, v in rate.items()}
    print("medians: " + ", ".join(f"{n} {v:.0f} tok/s" for n, v in med.items()))
    print(f"Brigade LoRA / Brigade full = {med['brigade-lora'] / med['brigade-full']:.2f}x; "
          f"Brigade LoRA / PyTorch LoRA = {med['brigade-lora'] / med['torch-lora']:.2f}x")
    full_m, lora_m = last["brigade-full"]["allocator_peak_bytes"], last["brigade-lora"]["allocator_peak_bytes"]
    full_p, lora_p = predicted(args, c, False), predicted(args, c, True)
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    print(f"params + grads + optimizer, measured peak: full {mib(state_bytes(full_m))}, LoRA {mib(state_bytes(lora_m))} "
          f"= {100 * state_bytes(lora_m) / state_bytes(full_m):.1f}% of full")
    for name, m, p in (("full", full_m, full_p), ("LoRA", lora_m, lora_p)):
        err = (state_bytes(p) - state_bytes(m)) / state_bytes(m)
        print(f"--dry-run prediction, {name}: {mib(state_bytes(p))} ({100 * err:+.1f}% of measured); per category "
              + ", ".join(f"{k} {mib(p[k])} / {mib(m[k])}" for k in ("params", "grads", "optimizer", "activations")))


if __name__ == "__main__":
    main()
