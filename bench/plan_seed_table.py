#!/usr/bin/env python3
"""The seeds' data-parallel throughput table (ResNet-50, BERT-Large, Swin-B on 8 devices) as the
planner's predictions for 8 nodes of this machine type (one rank of all its cores per node) over
10 and 100 Gb/s links (docs/planning.md).

For each model it calibrates this machine at the bench shapes of bench/vs_torch.py (one
process, fp32, no recompute, its batch per rank), then asks `brigade plan --predict` for
1 rank and for 8 ranks of the same per-rank batch (weak scaling: the global batch grows 8x)
on a described cluster: each node computes as the calibrated machine does, the gradients
cross the links as ring allreduces. Prints items/s, the 8-rank speedup and the share of the
step spent communicating. Predictions, not measurements: the compute is measured here, the
links are described.

Usage: python3 bench/plan_seed_table.py [--brigade build/bin/brigade] [--rows resnet50-224,bert-large,swin-b]
                                         [--out /tmp/brigade_plan_seed]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import vs_torch  # noqa: E402  (the rows' shapes, optimizers and batches)

CLUSTER = """[cluster]
name = "8 nodes x 1 rank, {gbps} Gb/s"
nodes = 8
ranks_per_node = 1
cores_per_node = {cores}
memory_per_rank_gb = 24
[cluster.intra]
latency_us = 1
gbps = 400
[cluster.inter]
latency_us = {latency}
gbps = {gbps}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--rows", default="resnet50-224,bert-large,swin-b")
    ap.add_argument("--out", default="/tmp/brigade_plan_seed")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count()
    clusters = {}
    for gbps, latency in ((10, 20), (100, 5)):
        path = os.path.join(args.out, f"cluster-{gbps}g.toml")
        with open(path, "w") as f:
            f.write(CLUSTER.format(gbps=gbps, latency=latency, cores=cores))
        clusters[gbps] = path

    def run(cmd):
        r = subprocess.run([args.brigade] + cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"failed: brigade {' '.join(cmd)}\n{r.stderr[-1500:]}")
        return r.stdout

    print("| model | batch per rank | 1 rank items/s | link | 8 ranks items/s | speedup | communication share |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name in args.rows.split(","):
        row = vs_torch.ROWS[name]
        sets = dict(row["sets"])
        sets.update({f"optim.{k}": v for k, v in row["optim"].items()})
        sets["train.batch_size"] = row["batch"]
        set_args = []
        for k, v in sets.items():
            set_args += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        recipe = os.path.join(ROOT, "recipes", row["recipe"])
        cal = os.path.join(args.out, f"{name}-calibration.json")
        print(f"calibrating {name} ...", file=sys.stderr)
        run(["calibrate", recipe, "--ranks", "1", "--levels", "O0", "--recompute", "none", "--rows",
             str(row["batch"]), "--steps", str(args.steps), "--warmup", "1", "--out", cal] + set_args)
        one = json.loads(run(["plan", recipe, "--predict", "--calibration", cal] + set_args))
        for gbps, cl in clusters.items():
            eight = json.loads(run(["plan", recipe, "--predict", "--calibration", cal, "--cluster", cl] + set_args +
                                   ["--set", "parallel.dp=8"]))
            if not eight["feasible"]:
                print(f"| {name} | {row['batch']} | {one['items_per_s']:.1f} | {gbps} Gb/s | rejected: "
                      f"{eight['reason']} | | |")
                continue
            speedup = eight["items_per_s"] / one["items_per_s"]
            print(f"| {name} | {row['batch']} | {one['items_per_s']:.1f} {one['item']} | {gbps} Gb/s | "
                  f"{eight['items_per_s']:.1f} | {speedup:.2f}x | {100 * eight['comm_s'] / eight['step_s']:.0f}% |")


if __name__ == "__main__":
    main()
