#!/usr/bin/env python3
"""The seeds' LLaMA-7B case as the planner's predicted ladder on a described cluster
(docs/planning.md "The LLaMA-7B ladder").

LLaMA-7B (recipes/llama-7b.toml: 32 layers, 4096 wide, vocabulary 32000, 2048-token rows, a
global batch of 32 rows) is too large to build on this machine, so its calibration comes from
models of 1 and 2 blocks at its full width (`brigade calibrate --proxy-layers 1,2`): memory from
their measured dry steps and compute from their measured forward + backward, every per-block
quantity extrapolated linearly to 32 blocks (exact for memory at small scale:
tests/cli/test_plan_cli.cpp). The cluster is described (recipes/clusters/8x24g-25gbps.toml:
8 nodes of this machine type, 24 GiB per rank, 25 Gb/s between them).

The ladder starts from the fp32 data-parallel baseline and adds one technique per row
(cumulative): bf16 O2, ZeRO-1, ZeRO-2, ZeRO-3, selective then full recompute, accumulation;
then the fastest plan with tensor or pipeline parallelism and the planner's own pick, both
from `brigade plan --json`. Each row: predicted peak memory per rank (and how far over the
24 GiB it is), tokens/s and its parts, against the baseline.

Usage: python3 bench/plan_llama7b_ladder.py [--brigade build/bin/brigade] [--calibration FILE]
           [--cluster recipes/clusters/8x24g-25gbps.toml] [--calibrate] [--json OUT]
  --calibrate runs the proxy calibration first (about 15 minutes here, 16 GiB of memory).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECIPE = "recipes/llama-7b.toml"
GIB = float(1 << 30)

# (row, --set overrides added to the previous row's)
LADDER = [
    ("fp32 data parallel (baseline)",
     ["precision.level=O0", "parallel.zero=0", "memory.recompute=none", "train.batch_size=4",
      "train.accumulation=1"]),
    ("+ bf16 O2", ["precision.level=O2", "precision.dtype=bf16"]),
    ("+ ZeRO-1", ["parallel.zero=1"]),
    ("+ ZeRO-2", ["parallel.zero=2"]),
    ("+ ZeRO-3", ["parallel.zero=3"]),
    ("+ recompute selective", ["memory.recompute=selective"]),
    ("+ recompute full", ["memory.recompute=full"]),
    ("+ accumulation 4 (batch 1)", ["train.batch_size=1", "train.accumulation=4"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--calibration", default=os.path.join(ROOT, "runs/llama-7b-calibration.json"))
    ap.add_argument("--cluster", default=os.path.join(ROOT, "recipes/clusters/8x24g-25gbps.toml"))
    ap.add_argument("--calibrate", action="store_true", help="run the proxy calibration first")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()

    if args.calibrate or not os.path.exists(args.calibration):
        print(f"calibrating {RECIPE} from proxies of 1 and 2 blocks -> {args.calibration}", file=sys.stderr)
        subprocess.run([args.brigade, "calibrate", RECIPE, "--proxy-layers", "1,2", "--levels", "O0,O2",
                        "--recompute", "none,selective,full", "--rows", "1", "--steps", "1", "--out",
                        args.calibration], cwd=ROOT, check=True)

    def brigade(cmd):
        r = subprocess.run([args.brigade] + cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
        return r

    common = ["--calibration", args.calibration, "--cluster", args.cluster]
    rows, sets = [], []
    for name, add in LADDER:
        sets = [s for s in sets if s.split("=")[0] not in {a.split("=")[0] for a in add}] + add
        cmd = ["plan", RECIPE, "--predict"] + common
        for s in sets:
            cmd += ["--set", s]
        p = json.loads(brigade(cmd).stdout)
        rows.append((name, " ".join(add), p))
    # the fastest model-parallel plan and the planner's pick, over every plan of 8 ranks
    listing = brigade(["plan", RECIPE, "--json"] + common)
    plans = [json.loads(l) for l in listing.stdout.splitlines() if l.strip()]
    feasible = [p for p in plans if p["feasible"] and p["ranks"] == 8]
    def key(p, k):
        return next(o.split("=", 1)[1] for o in p["overrides"] if o.startswith(k + "="))

    mp = [p for p in feasible if key(p, "parallel.tp") != "1" or key(p, "parallel.pp") != "1"]
    if mp:
        rows.append(("+ tensor / pipeline parallel (fastest)", mp[0]["plan"], mp[0]))
    if feasible:
        rows.append(("the planner's pick", feasible[0]["plan"], feasible[0]))

    cl = open(args.cluster).read()
    limit = None
    for line in cl.splitlines():
        if line.strip().startswith("memory_per_rank_gb"):
            limit = float(line.split("=")[1].split("#")[0]) * GIB
    base = rows[0][2]
    base_mem, base_tps = base["peak_bytes"]["total"], base["items_per_s"]
    print(f"LLaMA-7B ({RECIPE}, global batch 32 x 2048 tokens) on {os.path.relpath(args.cluster, ROOT)}: "
          f"predicted per rank (calibration {os.path.relpath(args.calibration, ROOT)}, proxies of 1 and 2 blocks)\n")
    print("| row | added | peak / rank | vs baseline | fits 24 GiB? | tokens/s | x baseline | step s "
          "(compute + update + comm) |")
    print("|---|---|---:|---:|---|---:|---:|---|")
    out = []
    for name, added, p in rows:
        mem = p["peak_bytes"]["total"]
        fits = "yes" if limit is None or mem <= limit else f"no: {(mem - limit) / GIB:.1f} GiB over"
        tps = p["items_per_s"]
        print(f"| {name} | {added} | {mem / GIB:.1f} GiB | {100 * (mem / base_mem - 1):+.0f}% | {fits} | "
              f"{tps:.1f} | {tps / base_tps:.2f} | {p['step_s']:.0f} ({p['compute_s']:.0f} + {p['update_s']:.1f} + "
              f"{p['comm_s']:.1f}) |")
        out.append({"row": name, "added": added, "prediction": p})
    print("\nper category (GiB) of each row: params, grads, optimizer, activations, workspace, other")
    for name, _, p in rows:
        b = p["peak_bytes"]
        print(f"  {name:42s} " + "  ".join(f"{b[k] / GIB:6.1f}" for k in
                                           ("params", "grads", "optimizer", "activations", "workspace", "other")))
    first70 = next((n for n, _, p in rows if p["peak_bytes"]["total"] <= 0.3 * base_mem), None)
    first4x = next((n for n, _, p in rows if p["items_per_s"] >= 4 * base_tps), None)
    best = max(rows, key=lambda r: r[2]["items_per_s"] if r[2]["peak_bytes"]["total"] <= (limit or 1e30) else 0)
    print(f"\n-70% memory first reached at: {first70 or 'never'}")
    print(f"4x the baseline's tokens/s first reached at: {first4x or 'never'} "
          f"(fastest plan that fits: {best[0]}, {best[2]['items_per_s'] / base_tps:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
