#!/usr/bin/env python3
"""Model-parallel benchmark: each pipeline schedule, and tensor parallelism, on the default recipe.

Runs `brigade train recipes/gpt-kjv.toml` (same model, same global batch of 16 x 128 tokens,
2 processes x 1 thread, or 1 process x 2 threads for the baseline) in each layout, interleaved
round by round so machine noise hits all of them alike, and prints medians:

  tokens/s and the ratio to one process; per-rank peak memory (model state and activations,
  from memory.json's tags); for pipelines the measured bubble of the last step beside the one the
  simulator predicts from the measured stage times, and the micro-batches in flight per rank.

Usage: python3 bench/mp_bench.py [--brigade build/bin/brigade] [--steps 12] [--rounds 2]
                                 [--microbatches 8]
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
            "--set", f"run.threads={threads}"] + sum([["--set", s] for s in sets], [])
    if np_ > 1:
        args = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)] + args
    env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"bench: run failed ({' '.join(args)}):\n{r.stderr[-2000:]}")
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]
    mem = json.load(open(os.path.join(out, "memory.json")))
    pipe_path = os.path.join(out, "pipeline.json")
    pipe = json.load(open(pipe_path)) if os.path.exists(pipe_path) else None
    return recs, mem, pipe


def mib(b):
    return f"{b / 2**20:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    args = ap.parse_args()
    if not os.path.exists(args.brigade):
        sys.exit(f"bench: {args.brigade} not found; build it with scripts/build.sh brigade")
    if shutil.which("mpirun") is None:
        sys.exit("bench: mpirun not found; run scripts/install-deps.sh")
    tmp = tempfile.mkdtemp(prefix="brigade_mp_bench_")
    skip = 3  # the first steps include primitive creation and page faults
    m = f"parallel.microbatches={args.microbatches}"
    layouts = [  # (label, processes, threads per process, settings)
        ("1 process x 2 threads", 1, 2, []),
        ("dp 2", 2, 1, ["parallel.dp=2", "train.batch_size=8"]),
        ("tp 2", 2, 1, ["parallel.tp=2"]),
        ("pp 2, gpipe", 2, 1, ["parallel.pp=2", m, "parallel.schedule=gpipe"]),
        ("pp 2, 1f1b", 2, 1, ["parallel.pp=2", m, "parallel.schedule=1f1b"]),
        ("pp 2, interleaved v=2", 2, 1, ["parallel.pp=2", m, "parallel.schedule=interleaved",
                                          "parallel.virtual_stages=2"]),
        ("pp 2, zb-h1", 2, 1, ["parallel.pp=2", m, "parallel.schedule=zb-h1"]),
        ("pp 2, dynamic", 2, 1, ["parallel.pp=2", m, "parallel.schedule=dynamic", "parallel.virtual_stages=2"]),
    ]
    rates = {l[0]: [] for l in layouts}
    last = {}
    for rnd in range(args.rounds):
        for label, np_, threads, sets in layouts:
            out = os.path.join(tmp, f"r{rnd}_{len(rates[label])}")
            recs, mem, pipe = run(args.brigade, out, np_, threads, sets, args.steps)
            rates[label] += [r["tokens_per_s"] for r in recs[skip:]]
            last[label] = (mem, pipe)
            print(f"  round {rnd + 1}: {label}: {statistics.median(rates[label]):.0f} tok/s", file=sys.stderr)
    base = statistics.median(rates[layouts[0][0]])
    print(f"GPT-KJV (recipes/gpt-kjv.toml), global batch 16 x 128, {args.microbatches} pipeline micro-batches, "
          f"{args.steps} steps x {args.rounds} rounds, medians after {skip} warm-up steps")
    print()
    print("| layout | tokens/s | vs 1 process | peak MiB per rank (params + grads + optimizer / activations) | bubble measured / predicted "
          "| in flight per rank |")
    print("|---|---:|---:|---|---|---|")
    for label, np_, threads, sets in layouts:
        mem, pipe = last[label]
        ranks = mem.get("ranks", [])
        peaks = " · ".join(f"{mib(r['peak']['params'] + r['peak']['grads'] + r['peak']['optimizer'])} / "
                           f"{mib(r['peak']['activations'])}" for r in ranks)
        med = statistics.median(rates[label])
        bubble = f"{100 * pipe['measured_bubble']:.0f}% / {100 * pipe['predicted_bubble']:.0f}%" if pipe else "–"
        flight = " · ".join(str(x) for x in pipe["peak_in_flight"]) if pipe else "–"
        sched = f" ({pipe['schedule']}, v={pipe['virtual_stages']})" if pipe and "dynamic" in label else ""
        print(f"| {label}{sched} | {med:.0f} | {med / base:.2f}x | {peaks} | {bubble} | {flight} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
