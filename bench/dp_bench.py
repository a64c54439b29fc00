#!/usr/bin/env python3
"""Data-parallel benchmark: what splitting the default recipe over MPI ranks costs and buys.

Runs `brigade train recipes/gpt-kjv.toml` (same model, same global batch of 16 x 128 tokens)
in several layouts, interleaved round by round so machine noise hits all of them alike,
and prints medians:

  speed   1 rank x 2 threads vs 2 ranks x 1 thread (overlap on/off, mpi/ring/tree):
          tokens/s, ratio to 1 rank, share of the step rank 0 spent waiting on
          gradient communication, bytes rank 0 sent per step (and the ring formula)
  memory  per-rank live bytes at the end and peak bytes, by tag (params, grads,
          optimizer, activations), for ZeRO 0/1/2/3 at dp 2 and dp 4

Usage: python3 bench/dp_bench.py [--brigade build/bin/brigade] [--steps 25] [--rounds 2]
                                 [--only speed|memory] [--markdown]
Needs the KJV data prepared (`brigade prepare recipes/gpt-kjv.toml`, done on first use).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,vader",
    "OMPI_MCA_mpi_yield_when_idle": "1",
}


def run(brigade, out, np_, threads, sets, steps):
    args = [brigade, "train", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--quiet", "--no-sample",
            "--set", f"run.out_dir={out}", "--set", f"train.steps={steps}", "--set", "train.eval_every=0",
            "--set", "train.eval_batches=1", "--set", "train.log_every=1", "--set", "schedule.warmup_steps=0",
            "--set", f"run.threads={threads}", "--set", f"parallel.dp={np_}"] + sum([["--set", s] for s in sets], [])
    if np_ > 1:
        args = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)] + args
    env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench: run failed ({' '.join(args)}):\n{r.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    mem = json.load(open(os.path.join(out, "memory.json")))
    return recs, mem


def mib(b):
    return f"{b / 2**20:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["speed", "memory"])
    ap.add_argument("--bucket-mb", type=float, default=1.0, help="parallel.bucket_mb of the memory runs")
    args = ap.parse_args()
    if not os.path.exists(args.brigade):
        sys.exit(f"bench: {args.brigade} not found; build it with scripts/build.sh brigade")
    if shutil.which("mpirun") is None:
        sys.exit("bench: mpirun not found; run scripts/install-deps.sh")
    tmp = tempfile.mkdtemp(prefix="brigade_dp_bench_")
    skip = 3  # first steps include primitive creation and page faults

    if args.only in (None, "speed"):
        # (label, ranks, threads per rank, batch per rank, extra settings)
        layouts = [
            ("1 rank x 2 threads", 1, 2, 16, []),
            ("2 ranks x 1 thread, mpi, overlap", 2, 1, 8, ["parallel.allreduce=mpi", "parallel.overlap=true"]),
            ("2 ranks x 1 thread, mpi, no overlap", 2, 1, 8, ["parallel.allreduce=mpi", "parallel.overlap=false"]),
            ("2 ranks x 1 thread, ring, overlap", 2, 1, 8, ["parallel.allreduce=ring", "parallel.overlap=true"]),
            ("2 ranks x 1 thread, tree, overlap", 2, 1, 8, ["parallel.allreduce=tree", "parallel.overlap=true"]),
            ("2 ranks x 1 thread, ZeRO-3, overlap", 2, 1, 8, ["parallel.zero=3", "parallel.overlap=true"]),
        ]
        samples = {l[0]: {"tok": [], "dt": [], "wait": [], "bytes": []} for l in layouts}
        for rnd in range(args.rounds):
            for label, np_, th, b, sets in layouts:
                out = os.path.join(tmp, f"speed{rnd}_{len(samples[label]['tok'])}_{np_}_{abs(hash(label))}")
                recs, _ = run(args.brigade, out, np_, th, sets + [f"train.batch_size={b}"], args.steps)
                for r in recs[skip:]:
                    samples[label]["tok"].append(r["tokens_per_s"])
                    dt = 16 * 128 / r["tokens_per_s"]
                    samples[label]["dt"].append(dt)
                    samples[label]["wait"].append(r.get("comm_wait_s", 0.0))
                    samples[label]["bytes"].append(r.get("bytes_sent", 0))
                print(f"  round {rnd + 1}: {label}: {statistics.median(samples[label]['tok']):.0f} tok/s",
                      file=sys.stderr)
        base = statistics.median(samples[layouts[0][0]]["tok"])
        print(f"\nSpeed: recipes/gpt-kjv.toml model, global batch 16 x 128 tokens, {args.steps} steps "
              f"(first {skip} dropped) x {args.rounds} interleaved rounds, medians\n")
        print("| layout | tokens/s | vs 1 rank | waiting on communication | bytes sent per step (rank 0) |")
        print("|---|---|---|---|---|")
        for label, *_ in layouts:
            s = samples[label]
            tok = statistics.median(s["tok"])
            wait = statistics.median(s["wait"]) / statistics.median(s["dt"])
            print(f"| {label} | {tok:.0f} | {tok / base:.2f}x | {100 * wait:.1f}% | "
                  f"{int(statistics.median(s['bytes'])):,} |")

    if args.only in (None, "memory"):
        print("\nMemory per rank (MiB) at the end of a run (live) and its peak, by tag; "
              f"recipes/gpt-kjv.toml model, 4 steps, parallel.bucket_mb = {args.bucket_mb}\n")
        print("| dp | ZeRO | params live / peak | grads live / peak | optimizer live / peak | activations peak |")
        print("|---|---|---|---|---|---|")
        for np_ in (1, 2, 4):
            for z in ((0,) if np_ == 1 else (0, 1, 2, 3)):
                out = os.path.join(tmp, f"mem_{np_}_{z}")
                _, mem = run(args.brigade, out, np_, 1, [f"parallel.zero={z}", f"train.batch_size={16 // np_}",
                                                         f"parallel.bucket_mb={args.bucket_mb}"], 4)
                r0 = mem["ranks"][0]
                live, peak = r0["live"], r0["peak"]
                print(f"| {np_} | {z} | {mib(live['params'])} / {mib(peak['params'])} | "
                      f"{mib(live['grads'])} / {mib(peak['grads'])} | "
                      f"{mib(live['optimizer'])} / {mib(peak['optimizer'])} | {mib(peak['activations'])} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
