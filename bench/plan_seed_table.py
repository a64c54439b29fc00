#!/usr/bin/env python3
"""The seeds' data-parallel throughput table (ResNet-50, BERT-Large, Swin-B on 8 devices) as the
planner's predictions for 8 nodes of this machine type (one rank of all its cores per node) over
10 and 100 Gb/s links, beside the 1- and 2-rank measurements on this machine that calibrate it
(docs/planning.md).

For each model it calibrates this machine at the bench shapes of bench/vs_torch.py (fp32, no
recompute, its batch per rank; one process with every core, and two processes of one thread
each under mpirun, with the interconnect), then:
  - measures `brigade bench` at 1 rank x 2 threads, 1 rank x 1 thread and 2 ranks x 1 thread
    (`mpirun -np 2 brigade bench --set parallel.dp=2`: each rank its own batch, the trainer's
    gradient allreduce), and asks `brigade plan --predict` for the 1- and 2-rank ones;
  - asks `brigade plan --predict` for 8 ranks of the same per-rank batch (weak scaling: the
    global batch grows 8x) on described clusters: each node computes as the calibrated machine
    does, the gradients cross the links as ring allreduces.
Prints the measured and predicted items/s, the 2-rank weak-scaling efficiency (2-rank items/s
over twice one rank's at one thread), the 8-rank speedup and the share of the step spent
communicating. The 8-rank numbers are predictions: the compute is measured here, the links are
described.

Usage: python3 bench/plan_seed_table.py [--brigade build/bin/brigade] [--rows resnet50-224,bert-large,swin-b]
                                         [--out /tmp/brigade_plan_seed] [--steps 3] [--no-measure]
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
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-measure", action="store_true", help="predictions only (one-process calibration)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cores = os.cpu_count()
    clusters = {}
    for gbps, latency in ((10, 20), (100, 5)):
        path = os.path.join(args.out, f"cluster-{gbps}g.toml")
        with open(path, "w") as f:
            f.write(CLUSTER.format(gbps=gbps, latency=latency, cores=cores))
        clusters[gbps] = path

    mpi_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpi_env.setdefault("OMPI_MCA_btl", "self,vader")

    def run(cmd):
        r = subprocess.run([args.brigade] + cmd, capture_output=True, text=True, cwd=ROOT, env=mpi_env)
        if r.returncode != 0:
            sys.exit(f"failed: brigade {' '.join(cmd)}\n{r.stderr[-1500:]}")
        return r.stdout

    def bench(recipe, set_args, ranks, threads):
        cmd = [args.brigade, "bench", recipe, "--steps", str(args.steps), "--warmup", "1"] + set_args + \
              ["--set", f"run.threads={threads}", "--set", f"parallel.dp={ranks}"]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=mpi_env)
        if r.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-1500:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    measured, predicted8 = [], []
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
        ranks = "1" if args.no_measure else "1,2"
        print(f"calibrating {name} (ranks {ranks}) ...", file=sys.stderr)
        run(["calibrate", recipe, "--ranks", ranks, "--levels", "O0", "--recompute", "none", "--rows",
             str(row["batch"]), "--steps", str(args.steps), "--warmup", "1", "--out", cal] + set_args)

        def predict(extra, cluster=None):
            cmd = ["plan", recipe, "--predict", "--calibration", cal] + set_args + extra
            return json.loads(run(cmd + (["--cluster", cluster] if cluster else [])))

        one = predict([])
        if not args.no_measure:
            print(f"measuring {name} ...", file=sys.stderr)
            m12, m11, m21 = bench(recipe, set_args, 1, 2), bench(recipe, set_args, 1, 1), bench(recipe, set_args, 2, 1)
            p21 = predict(["--set", "parallel.dp=2", "--set", "run.threads=1"])
            measured.append((name, row["batch"], one, m12, m11, p21, m21))
        for gbps, cl in clusters.items():
            predicted8.append((name, row["batch"], one, gbps, predict(["--set", "parallel.dp=8"], cl)))

    if measured:
        print("Measured on this machine beside the planner's prediction (items/s):\n")
        print("| model | batch per rank | 1 rank x 2 threads: measured / predicted | 1 rank x 1 thread: measured | "
              "2 ranks x 1 thread: measured / predicted | 2-rank weak scaling (measured) |")
        print("|---|---:|---|---:|---|---:|")
        for name, b, p12, m12, m11, p21, m21 in measured:
            def pair(m, p):
                if not p.get("feasible"):
                    return f"{m['items_per_s']:.1f} / rejected: {p['reason']}"
                return f"{m['items_per_s']:.1f} / {p['items_per_s']:.1f} ({100 * (p['items_per_s'] / m['items_per_s'] - 1):+.0f}%)"
            eff = m21["items_per_s"] / (2 * m11["items_per_s"])
            print(f"| {name} | {b} | {pair(m12, p12)} | {m11['items_per_s']:.1f} | {pair(m21, p21)} | {100 * eff:.0f}% |")
        print()
    print("Predicted for 8 nodes of this machine type (one rank of every core each):\n")
    print("| model | batch per rank | 1 rank items/s | link | 8 ranks items/s | speedup | communication share |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, b, one, gbps, eight in predicted8:
        if not eight["feasible"]:
            print(f"| {name} | {b} | {one['items_per_s']:.1f} | {gbps} Gb/s | rejected: {eight['reason']} | | |")
            continue
        speedup = eight["items_per_s"] / one["items_per_s"]
        print(f"| {name} | {b} | {one['items_per_s']:.1f} {one['item']} | {gbps} Gb/s | "
              f"{eight['items_per_s']:.1f} | {speedup:.2f}x | {100 * eight['comm_s'] / eight['step_s']:.0f}% |")


if __name__ == "__main__":
    main()
