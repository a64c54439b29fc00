#!/usr/bin/env python3
"""Attention memory against sequence length: T = 256, 512, 1024, 2048 with B x T fixed.

Runs `brigade bench` (random ids, no data) on the issue's small GPT (6 layers, 384 wide,
6 heads, vocabulary 8192) with B x T = 4096 tokens per step, and prints for each T:
the step's peak activation bytes (the allocator's activation tag), tokens/s, and what
one layer's T x T attention matrix would take if it were kept (B x heads x T^2 x 4 bytes).

Brigade's attention keeps no T x T matrix: it works on 64 x 128 tiles (GEMM-shaped, online
softmax), the forward saves the output and the row log-sum-exp, and the backward recomputes
each tile's probabilities. With B x T fixed, a
kernel that stored the scores would hold B T^2 = 4096 T elements per head per layer,
growing linearly with T; the measured peak stays flat instead (memory linear in T per
sequence, constant per token).

Usage: python3 bench/attention_sweep.py [--brigade build/bin/brigade] [--steps 3] [--threads 2]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096, help="B x T per step")
    args = ap.parse_args()
    if not os.path.exists(args.brigade):
        sys.exit(f"bench: {args.brigade} not found; build it with scripts/build.sh brigade")
    L, C, H, V = 6, 384, 6, 8192
    rows = []
    for T in (256, 512, 1024, 2048):
        B = args.tokens // T
        sets = {"model.n_layer": L, "model.n_embd": C, "model.n_head": H, "model.vocab_size": V,
                "model.block_size": 2048, "train.seq_len": T, "train.batch_size": B, "run.threads": args.threads}
        cmd = [args.brigade, "bench", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--steps", str(args.steps),
               "--warmup", "1"] + sum([["--set", f"{k}={v}"] for k, v in sets.items()], [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            sys.exit(f"bench: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        j = json.loads(r.stdout.strip().splitlines()[-1])
        act = j["allocator_peak_bytes"]["activations"]
        scores = B * H * T * T * 4  # one layer's (B, heads, T, T) fp32 scores, if kept
        rows.append((T, B, act, j["tokens_per_s"], scores))
        print(f"  T={T}: {act / 2**20:.1f} MiB activations, {j['tokens_per_s']:.0f} tok/s", file=sys.stderr)
    print(f"GPT {L} layers, {C} wide, {H} heads, vocab {V}; B x T = {args.tokens} tokens per step, fp32, "
          f"{args.threads} threads, median of {args.steps} steps")
    print()
    print("| T | B | peak activations (MiB) | tokens/s | one layer's T x T scores, if kept (MiB) |")
    print("|---:|---:|---:|---:|---:|")
    for T, B, act, tps, scores in rows:
        print(f"| {T} | {B} | {act / 2**20:.1f} | {tps:.0f} | {scores / 2**20:.0f} |")


if __name__ == "__main__":
    main()
