#!/usr/bin/env python3
"""Tensor- and pipeline-parallel memory: the planner's prediction against the measured dry run.

For one recipe, calibrates this machine at 1 and 2 ranks (unless --calibration names a file
already written), then for every plan of a grid (precision O0 / O2, recompute none / selective;
tp 2 at the recipe's batch and at half of it with accumulation 2; pp 2 under GPipe, 1F1B and ZB-H1
over 2, 4 and 8 micro-batches) prints `brigade plan --predict --json`'s busiest-rank memory beside
`mpirun -np 2 brigade train --dry-run --json`'s (one training step, an evaluation batch and the
checkpoint's gather measured on every rank: the independent side), per category, and the worst
error. Memory is deterministic, so one run is the result (no rounds).

Usage: python3 bench/plan_mesh_memory.py [--brigade build/bin/brigade] [--recipe recipes/gpt-kjv.toml]
                                         [--calibration FILE] [--levels O0,O2] [--recompute none,selective]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATS = ["params", "grads", "optimizer", "activations", "workspace", "other"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader"}


def last_json(text):
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--recipe", default=os.path.join(ROOT, "recipes/gpt-kjv.toml"))
    ap.add_argument("--calibration", help="an existing calibration (default: calibrate into runs/)")
    ap.add_argument("--levels", default="O0,O2")
    ap.add_argument("--recompute", default="none,selective")
    args = ap.parse_args()
    env = dict(os.environ, **MPI_ENV)
    name = os.path.splitext(os.path.basename(args.recipe))[0]
    cal = args.calibration or os.path.join(ROOT, "runs", f"{name}-mesh-calibration.json")
    if not args.calibration:
        cmd = [args.brigade, "calibrate", args.recipe, "--ranks", "1,2", "--levels", args.levels, "--recompute",
               args.recompute, "--steps", "2", "--warmup", "1", "--out", cal]
        print("#", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    half = recipe_batch(args) // 2
    plans = []
    for level in args.levels.split(","):
        for rc in args.recompute.split(","):
            base = [f"precision.level={level}", f"memory.recompute={rc}", "run.threads=1"]
            if level != "O0":
                base.append("precision.dtype=bf16")
            plans.append(base + ["parallel.tp=2"])
            plans.append(base + ["parallel.tp=2", "train.accumulation=2", f"train.batch_size={half}"])
            for sched in ("gpipe", "1f1b", "zb-h1"):
                for m in (2, 4, 8):
                    plans.append(base + ["parallel.pp=2", f"parallel.schedule={sched}", f"parallel.microbatches={m}"])
    print("| plan | approximate | busiest rank predicted / measured MiB | worst category |")
    print("|---|---|---:|---|")
    worst_all, worst_exact = 0.0, 0.0
    for sets in plans:
        a = sum([["--set", s] for s in sets], [])
        p = subprocess.run([args.brigade, "plan", args.recipe, "--predict", "--json", "--calibration", cal] + a,
                           capture_output=True, text=True, env=env)
        pred = last_json(p.stdout)
        d = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", args.brigade, "train",
                            args.recipe, "--dry-run", "--json"] + a, capture_output=True, text=True, env=env)
        meas = last_json(d.stdout)
        label = " ".join(s.split(".", 1)[1] for s in sets if "threads" not in s and "dtype" not in s)
        if p.returncode != 0 or d.returncode != 0 or not pred or not meas or "peak_bytes" not in pred:
            why = (p.stderr or d.stderr).strip().splitlines()[-1:] or ["no output"]
            print(f"| {label} | | failed: {why[0]} | |")
            continue
        busiest = max(meas["ranks"], key=lambda r: r["peak_total"])
        errs = {c: (pred["peak_bytes"][c] - busiest["peak"][c]) / busiest["peak"][c] for c in CATS
                if busiest["peak"][c] > 2 ** 20}
        errs["total"] = (pred["peak_bytes"]["total"] - busiest["peak_total"]) / busiest["peak_total"]
        cat, err = max(errs.items(), key=lambda kv: abs(kv[1]))
        approx = bool(pred.get("memory_approximate"))
        worst_all = max(worst_all, abs(err))
        if not approx:
            worst_exact = max(worst_exact, abs(err))
        print(f"| {label} | {'yes' if approx else 'no'} | {pred['peak_bytes']['total'] / 2**20:.2f} / "
              f"{busiest['peak_total'] / 2**20:.2f} | {cat} {100 * err:+.1f}% |", flush=True)
    print(f"\nworst |error| of the plans not marked approximate: {100 * worst_exact:.2f}%; of all: "
          f"{100 * worst_all:.2f}%")


def recipe_batch(args):
    """train.batch_size, as the dry run's report states it ("micro-batch N rows")."""
    p = subprocess.run([args.brigade, "train", args.recipe, "--dry-run"], capture_output=True, text=True, check=True)
    for line in p.stdout.splitlines():
        if "micro-batch" in line:
            return int(line.split("micro-batch", 1)[1].split()[0])
    sys.exit("plan_mesh_memory: cannot read the recipe's batch from --dry-run")


if __name__ == "__main__":
    main()
