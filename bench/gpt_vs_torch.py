#!/usr/bin/env python3
"""End-to-end training speed: Brigade against PyTorch on the CPU, side by side.

For each config and precision, runs `brigade bench` (the recipe's training step on
random token ids) and the same model in PyTorch (tests/reference/gpt2_ref.py, AdamW,
grad-norm clipping, same B, T, threads), alternating them round by round so machine
noise hits both alike, and prints medians: tokens/s, the ratio, achieved GFLOP/s
(FLOPs/token = 6N + 12 L T C), MFU against the GEMM peak each engine measured in that
run (1024^3 matmul, best of 12), and peak RSS.

Configs (issue 3):
  gpt2   GPT-2 124M: 12 layers, 768 wide, 12 heads, vocab 50257, T 256, B 4
  small  6 layers, 384 wide, 6 heads, vocab 8192, T 256, B 8
Precisions: fp32 (Brigade O0, torch fp32) and bf16 (Brigade O1 and O2, torch
autocast(cpu, bfloat16)).

PyTorch gets its best settings on this machine, in its own process only:
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, ATEN_CPU_CAPABILITY=avx512,
OMP_WAIT_POLICY=PASSIVE for fp32, the multi-tensor (foreach) AdamW, and glibc malloc told to
keep freed memory (GLIBC_TUNABLES mmap_max=0, a 4 GiB trim threshold). The last one matters
most: PyTorch's CPU allocator is malloc/free, so without it every large temporary is a fresh
mmap whose pages fault in one by one, and a page fault is slow in this VM; it makes PyTorch's
GPT-2 step 2.5-3x faster here. The output says so.

Usage: python3 bench/gpt_vs_torch.py [--brigade build/bin/brigade] [--configs gpt2,small]
                                     [--precisions fp32,bf16] [--steps 6] [--warmup 2]
                                     [--rounds 3] [--threads 2] [--markdown]
                                     [--install-deps | --skip-deps-check] [--gemm-check-only]
Torch runs with Debian's /usr/bin/python3 (python3-torch). Its fp32 GEMMs go through the
system libblas.so.3, which on a fresh machine is Debian's reference BLAS (~8 GFLOP/s) unless
libopenblas0-pthread is installed. So before anything is timed the script
  1. runs scripts/install-bench-deps.sh --check (with --install-deps: the installer itself;
     --skip-deps-check: neither), which needs python3-torch, python3-numpy and
     libopenblas0-pthread, and stops when one is missing;
  2. measures both engines' fp32 GEMM peak in this run (1024^3 matmul, best of 12: torch.matmul
     in the peer's own process and settings, and a one-step `brigade bench`), prints the peer's
     settings (torch version, threads, the BLAS library it loaded, its environment), and refuses
     to go on (exit 3, saying why and what to install) when PyTorch's peak is under 70% of
     Brigade's: a ratio against a crippled peer says nothing. --gemm-check-only stops after this.
The same rule is applied again to the fp32 peaks measured during the timed rounds: a config and
precision whose peer peak fell under 70% of Brigade's prints "refused" instead of a ratio.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, seq_len=256, batch_size=4),
    "small": dict(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, seq_len=256, batch_size=8),
}
TORCH_PY = "/usr/bin/python3"
TORCH_MALLOC = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
DEPS_SCRIPT = os.path.join(ROOT, "scripts", "install-bench-deps.sh")
MIN_PEER_PEAK = 0.70  # the peer's fp32 GEMM peak must reach this share of Brigade's for a ratio


def flops_per_token(c):
    L, C, V, T = c["n_layer"], c["n_embd"], c["vocab_size"], c["seq_len"]
    n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # GPT-2 parameters (tied head)
    return 6 * n + 12 * L * T * C


# ------------------------------------------------------------------ the torch worker

def torch_gemm_peak(torch, dtype, n=1024, reps=12):
    """GFLOP/s of an n^3 torch.matmul, best of `reps` (as Brigade's measure_gemm_peak_gflops)."""
    import time
    a = torch.full((n, n), 0.5, dtype=dtype)
    b = torch.full((n, n), 0.25, dtype=dtype)
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def loaded_blas_libraries():
    """The BLAS/LAPACK shared objects mapped into this process (which libblas.so.3 torch got)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if "blas" in name or "lapack" in name:
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    return sorted(libs)


def torch_probe(args):
    """The peer's fp32 GEMM peak and the settings it runs under, as one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    peak32 = torch_gemm_peak(torch, torch.float32)
    print(json.dumps({
        "gemm_peak_f32_gflops": peak32, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "blas": loaded_blas_libraries(),
        "env": {k: os.environ.get(k, "") for k in ("ATEN_CPU_CAPABILITY", "OMP_WAIT_POLICY", "GLIBC_TUNABLES",
                                                    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                                    "LD_LIBRARY_PATH", "LD_PRELOAD")},
    }))


def torch_worker(args):
    import resource
    import time

    import torch

    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from gpt2_ref import GPT2

    c = json.loads(args.config_json)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)

    peak32, peak16 = torch_gemm_peak(torch, torch.float32), torch_gemm_peak(torch, torch.bfloat16)
    model = GPT2(c["vocab_size"], c["seq_len"], c["n_layer"], c["n_head"], c["n_embd"])
    model.init_weights(1337)
    model.train()
    # foreach: torch 1.13's multi-tensor AdamW (its fastest on the CPU; measured ~5% faster a step
    # than the default single-tensor loop for GPT-2 124M here)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    g = torch.Generator().manual_seed(1339)
    ids = torch.randint(0, c["vocab_size"], (c["batch_size"], c["seq_len"] + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    bf16 = args.precision == "bf16"
    times, loss = [], None
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
    med = statistics.median(times)
    tps = c["batch_size"] * c["seq_len"] / med
    achieved = tps * flops_per_token(c) / 1e9
    print(json.dumps({
        "engine": "torch", "precision": args.precision, "step_seconds": times, "median_step_s": med,
        "tokens_per_s": tps, "achieved_gflops": achieved, "gemm_peak_f32_gflops": peak32,
        "gemm_peak_bf16_gflops": peak16, "mfu": achieved / (peak16 if bf16 else peak32),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "last_loss": float(loss), "torch": torch.__version__,
        "capability": os.environ.get("ATEN_CPU_CAPABILITY", ""), "blas": loaded_blas_libraries(),
    }))


# ------------------------------------------------------------------ the driver

def run_brigade(args, c, level):
    sets = [f"model.{k}={c[k]}" for k in ("n_layer", "n_embd", "n_head", "vocab_size")]
    sets += [f"model.block_size={c['seq_len']}", f"train.seq_len={c['seq_len']}", f"train.batch_size={c['batch_size']}",
             "model.dropout=0.0", f"run.threads={args.threads}", "optim.lr=6e-4", "train.grad_clip=1.0",
             f"precision.level={level}", "precision.dtype=bf16", "sample.top_k=1"]
    cmd = [args.brigade, "bench", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + sum([["--set", s] for s in sets], [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def torch_env(precision):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env["ATEN_CPU_CAPABILITY"] = "avx512"
    # PyTorch's CPU allocator is plain malloc/free: every large temporary is mmap'ed and
    # page-faulted anew, and a page fault costs microseconds in a VM like this one (torch.sqrt
    # of 40M floats: 270 ms, 6 ms with this). Keep freed memory in the heap instead.
    env["GLIBC_TUNABLES"] = TORCH_MALLOC
    if precision == "fp32":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def run_torch(args, c, precision):
    cmd = [TORCH_PY, os.path.abspath(__file__), "--torch-worker", "--config-json", json.dumps(c), "--precision",
           precision, "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=torch_env(precision)).stdout
    return json.loads(out.strip().splitlines()[-1])


def brigade_gemm_peak(args):
    """Brigade's fp32 GEMM peak: a one-step `brigade bench` of a tiny model (it measures the peak first)."""
    sets = ["model.n_layer=1", "model.n_embd=64", "model.n_head=2", "model.vocab_size=256", "model.block_size=16",
            "train.seq_len=16", "train.batch_size=1", f"run.threads={args.threads}"]
    cmd = [args.brigade, "bench", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--steps", "1", "--warmup", "0"] + \
        sum([["--set", x] for x in sets], [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["gemm_peak_f32_gflops"]


def peer_too_slow(torch_peak, brigade_peak):
    return torch_peak < MIN_PEER_PEAK * brigade_peak


def refusal(torch_peak, brigade_peak, blas):
    return (f"refusing to print a Brigade/PyTorch ratio: PyTorch's fp32 GEMM peak is {torch_peak:.1f} GFLOP/s, "
            f"{100 * torch_peak / brigade_peak:.0f}% of Brigade's {brigade_peak:.1f} GFLOP/s measured in this run "
            f"(the bar is {100 * MIN_PEER_PEAK:.0f}%). Its BLAS is {', '.join(blas) or 'unknown'}; Debian's "
            "python3-torch does fp32 GEMMs through libblas.so.3, which without OpenBLAS is the reference BLAS. "
            "Run `bash scripts/install-bench-deps.sh` (installs libopenblas0-pthread) and check that "
            "`update-alternatives --display libblas.so.3-x86_64-linux-gnu` points at openblas.")


def preflight(args):
    """Deps check, both fp32 GEMM peaks and the peer's settings; exits when the peer is crippled."""
    if not args.skip_deps_check:
        if not os.path.exists(DEPS_SCRIPT):
            sys.exit(f"error: {DEPS_SCRIPT} is missing; run from a Brigade checkout")
        dep_cmd = ["bash", DEPS_SCRIPT] + ([] if args.install_deps else ["--check"])
        dep = subprocess.run(dep_cmd, capture_output=True, text=True)
        for line in (dep.stdout + dep.stderr).strip().splitlines():
            print(line, flush=True)
        if dep.returncode != 0:
            sys.exit("error: the PyTorch peer's packages are missing (above); run `bash scripts/install-bench-deps.sh` "
                     "or pass --install-deps")
    cmd = [TORCH_PY, os.path.abspath(__file__), "--torch-probe", "--threads", str(args.threads)]
    probe = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                      env=torch_env("fp32")).stdout.strip().splitlines()[-1])
    brigade_peak = brigade_gemm_peak(args)
    env = ", ".join(f"{k}={v}" if v else f"{k} unset" for k, v in probe["env"].items())
    print(f"PyTorch peer: torch {probe['torch']}, {probe['threads']} threads, BLAS {', '.join(probe['blas']) or '?'}; "
          f"{env}", flush=True)
    print(f"fp32 GEMM peak (1024^3, best of 12): PyTorch {probe['gemm_peak_f32_gflops']:.1f} GFLOP/s, "
          f"Brigade {brigade_peak:.1f} GFLOP/s ({100 * probe['gemm_peak_f32_gflops'] / brigade_peak:.0f}%)",
          flush=True)
    if peer_too_slow(probe["gemm_peak_f32_gflops"], brigade_peak):
        print(refusal(probe["gemm_peak_f32_gflops"], brigade_peak, probe["blas"]), flush=True)
        sys.exit(3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--configs", default="gpt2,small")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--install-deps", action="store_true",
                    help="run scripts/install-bench-deps.sh (apt-get, root) instead of only checking")
    ap.add_argument("--skip-deps-check", action="store_true",
                    help="do not run scripts/install-bench-deps.sh (the GEMM peak comparison still runs)")
    ap.add_argument("--gemm-check-only", action="store_true",
                    help="stop after the deps check and the fp32 GEMM peak comparison")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config-json", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    if args.torch_probe:
        return torch_probe(args)

    preflight(args)
    if args.gemm_check_only:
        return 0

    print("PyTorch runs with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset, ATEN_CPU_CAPABILITY=avx512, "
          f"OMP_WAIT_POLICY=PASSIVE for fp32, GLIBC_TUNABLES={TORCH_MALLOC} (malloc keeps freed memory: "
          "no page faults per temporary), AdamW(foreach=True); torch bf16 = autocast(cpu, bfloat16). "
          f"{args.threads} threads, {args.steps} timed steps after {args.warmup} warm-up, {args.rounds} rounds "
          "alternating the engines; medians.", flush=True)
    rows = []
    for name in args.configs.split(","):
        c = CONFIGS[name]
        for precision in args.precisions.split(","):
            engines = [("torch", None), ("brigade O0", "O0")] if precision == "fp32" else \
                [("torch", None), ("brigade O1", "O1"), ("brigade O2", "O2")]
            results = {e: [] for e, _ in engines}
            for r in range(args.rounds):
                for e, level in engines:
                    res = run_torch(args, c, precision) if level is None else run_brigade(args, c, level)
                    results[e].append(res)
                    print(f"  {name} {precision} round {r + 1}: {e:<11} {res['tokens_per_s']:8.1f} tok/s", flush=True)
            torch_tps = statistics.median(x["tokens_per_s"] for x in results["torch"])
            refused = False
            # The rule of preflight(), on the fp32 peaks measured in these rounds (every worker measures
            # it; a bf16 run of the peer still has its fp32 work go through the same BLAS).
            tp = statistics.median(x["gemm_peak_f32_gflops"] for x in results["torch"])
            bp = statistics.median(x["gemm_peak_f32_gflops"] for e, _ in engines if e != "torch" for x in results[e])
            if peer_too_slow(tp, bp):
                refused = True
                print(f"  {name} {precision}: " + refusal(tp, bp, results["torch"][0].get("blas", [])), flush=True)
            for e, _ in engines:
                rs = results[e]
                tps = statistics.median(x["tokens_per_s"] for x in rs)
                rows.append(dict(config=name, precision=precision, engine=e, tokens_per_s=tps,
                                 ratio=None if refused else tps / torch_tps,
                                 gflops=statistics.median(x["achieved_gflops"] for x in rs),
                                 mfu=statistics.median(x["mfu"] for x in rs),
                                 peak32=statistics.median(x["gemm_peak_f32_gflops"] for x in rs),
                                 peak16=statistics.median(x["gemm_peak_bf16_gflops"] for x in rs),
                                 rss=max(x["peak_rss_bytes"] for x in rs) / 2 ** 20))
    hdr = ("| config | precision | engine | tokens/s | vs torch | GFLOP/s | MFU | GEMM peak f32 / bf16 | "
           "peak RSS MiB |")
    print()
    print(hdr)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = "refused" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"| {r['config']} | {r['precision']} | {r['engine']} | {r['tokens_per_s']:.1f} | {ratio} | "
              f"{r['gflops']:.0f} | {100 * r['mfu']:.1f}% | {r['peak32']:.0f} / {r['peak16']:.0f} | {r['rss']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
