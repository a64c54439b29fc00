#!/usr/bin/env python3
"""Where the time of a training step goes: a per-op profile from `perf`.

Runs `brigade bench` (random inputs, no data) on a GPT config, or on any row of bench/vs_torch.py
(`--row resnet50-28`: that row's recipe, shapes, optimizer and precision), under `perf record`
(user and kernel samples of the brigade process only), then groups the samples by symbol
into the step's parts and prints the share of each:

  GEMM (oneDNN JIT code, attention's tile GEMMs included), attention (the softmax and tile
  code around those GEMMs), OpenMP barrier waits, dtype conversions, cross-entropy
  (log-softmax and its backward over the vocabulary), LayerNorm, GELU, AdamW, copies and
  transposes (copy kernels, head transposes, strided gathers), element-wise (binary and
  unary kernels, reductions), memory (memset/memmove, page faults and the rest of the
  kernel), other.

Only the timed steps are sampled: perf starts with sampling disabled and the script
enables it (perf's control FIFO) when `brigade bench` reports on stderr that its warm-up
steps are done, so initialisation, first-touch page faults and JIT compilation stay out.
Shares are of samples, so a noisy machine changes them less than it changes absolute times.

Needs `perf` (linux-perf) and a kernel that allows sampling (perf_event_paranoid <= 2, or root).

Usage: python3 bench/profile_step.py [--brigade build/bin/brigade] [--config small|gpt2 | --row ROW]
                                     [--threads 2] [--steps 6] [--precision O0|O2] [--top 12]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=256, batch_size=4),
    "small": dict(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, seq_len=256, batch_size=8),
}

# (part, pattern on "dso symbol"); the first match wins.
PARTS = [
    ("GEMM (oneDNN)", r"^\[JIT\]|libdnnl|dnnl::|brgemm|gemm"),
    ("attention (softmax and tile code; its GEMMs count as GEMM)", r"attention|forward_tile|backward_head"),
    ("OpenMP barrier waits (libgomp: load imbalance, serial sections)", r"libgomp"),
    ("dtype conversions (bf16 <-> f32)", r"bf16_to_f32|f32_to_bf16|f16_to_f32|f32_to_f16|convert_contig|load_f32|store_f32|gather_f32"),
    ("convolution glue (im2col, weight reorders; oneDNN's kernels count as GEMM)", r"im2col|col2im|reorder|depthwise"),
    ("cross-entropy", r"cross_entropy|logsumexp|log_softmax"),
    ("batch norm", r"batch_norm"),
    ("ReLU (and add + ReLU)", r"relu"),
    ("pooling", r"pool"),
    ("LayerNorm", r"layer_norm"),
    ("GELU", r"gelu|erff|tanhf"),
    ("AdamW / optimizer", r"AdamW|optim::|LAMB|SGD"),
    ("copies, transposes, gathers", r"copy_kernel|transpose|gather|convert|cast"),
    ("element-wise and reductions", r"binary|unary|column_sum|sum_squares|blocked_sum|axpy|scale|fill|normal_fill"),
    ("memory (memset/memmove, page faults, kernel)", r"memset|memmove|memcpy|\[kernel|malloc|free|_int_"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--config", choices=sorted(CONFIGS), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--precision", default="O0", help="precision.level (O0 = fp32, O2 = bf16)")
    ap.add_argument("--row", help="a row of bench/vs_torch.py (resnet50-28, vit-b16, ...) instead of --config")
    ap.add_argument("--top", type=int, default=12, help="how many of the largest symbols to list")
    ap.add_argument("--perf-data", help="keep perf's samples in this file (for perf report)")
    args = ap.parse_args()
    if not os.path.exists(args.brigade):
        sys.exit(f"profile: {args.brigade} not found; build it with scripts/build.sh brigade")
    if not shutil.which("perf"):
        sys.exit("profile: perf not found; install it (apt install linux-perf)")
    if args.row:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import vs_torch
        if args.row not in vs_torch.ROWS:
            sys.exit(f"profile: unknown --row {args.row}; the rows are {', '.join(vs_torch.ROWS)}")
        row = vs_torch.ROWS[args.row]
        recipe = os.path.join(ROOT, "recipes", row["recipe"])
        sets = vs_torch.brigade_sets(args, row, args.precision)
        what = args.row
    else:
        c = CONFIGS[args.config]
        recipe = os.path.join(ROOT, "recipes/gpt-kjv.toml")
        sets = [f"model.{k}={c[k]}" for k in ("n_layer", "n_embd", "n_head", "vocab_size")]
        sets += [f"model.block_size={c['seq_len']}", f"train.seq_len={c['seq_len']}",
                 f"train.batch_size={c['batch_size']}", "model.dropout=0.0", f"run.threads={args.threads}",
                 f"precision.level={args.precision}", "precision.dtype=bf16"]
        what = args.config
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.abspath(args.perf_data) if args.perf_data else os.path.join(tmp, "perf.data")
        ctl, ack = os.path.join(tmp, "ctl.fifo"), os.path.join(tmp, "ack.fifo")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        # sampling starts disabled (-D -1); the bench's "warm-up done" line on stderr enables it, so
        # initialisation and the warm-up steps (first-touch page faults, JIT) are not in the profile
        cmd = ["perf", "record", "-q", "-D", "-1", f"--control=fifo:{ctl},{ack}", "-o", data, args.brigade, "bench",
               recipe, "--steps", str(args.steps), "--warmup", str(args.warmup)]
        cmd += sum([["--set", s] for s in sets], [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ctl_f = open(ctl, "w")
        ack_f = open(ack, "r")
        err_lines = []
        for line in proc.stderr:
            err_lines.append(line)
            print(line.rstrip(), file=sys.stderr, flush=True)
            if line.startswith("bench: warm-up done"):
                ctl_f.write("enable\n")
                ctl_f.flush()
                ack_f.readline()
        out = proc.stdout.read()
        proc.wait()
        ctl_f.close()
        ack_f.close()
        if proc.returncode != 0:
            sys.exit(f"profile: {' '.join(cmd)} failed:\n{''.join(err_lines)}")
        bench = out.strip().splitlines()[-1] if out.strip() else ""
        rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol", "--stdio",
                              "-q", "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
        # oneDNN's JIT code has no symbols: each sampled address is its own row, most of them under
        # the report's 0.01% resolution, so its total comes from a report by dso alone
        by_dso = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso", "--stdio", "-q",
                                 "--percent-limit", "0"], capture_output=True, text=True, check=True).stdout
    jit = sum(float(m.group(1)) for m in (re.match(r"\s*([0-9.]+)%\s+\[JIT\]", ln) for ln in by_dso.splitlines()) if m)
    shares = {name: 0.0 for name, _ in PARTS}
    shares["other"] = 0.0
    shares[PARTS[0][0]] = jit
    top = {(PARTS[0][0], "(oneDNN JIT-generated GEMM and convolution code)"): jit}
    for line in rep.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(.+?)\s+\[([.k])\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, sym = float(m.group(1)), m.group(2).strip(), m.group(4).strip()
        if m.group(3) == "k":
            dso = "[kernel " + dso
        if dso.startswith("[JIT]"):
            continue  # counted above
        key = f"{dso} {sym}"
        part = next((name for name, pat in PARTS if re.search(pat, key)), "other")
        shares[part] += pct
        label = sym[:90]
        top[(part, label)] = top.get((part, label), 0.0) + pct
    print(f"# per-op profile: {what}, {args.precision}, {args.threads} threads, "
          f"{args.steps} steps after {args.warmup} warm-up (perf samples of the brigade process)")
    if bench:
        print(f"# brigade bench: {bench}")
    print("| part of the step | share of samples |")
    print("|---|---:|")
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {share:.1f}% |")
    print("\n# the largest symbols")
    for (part, sym), pct in sorted(top.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{pct:6.2f}%  {part:<28} {sym}")


if __name__ == "__main__":
    main()
