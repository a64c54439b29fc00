#!/usr/bin/env python3
"""Predicted vs measured memory: the table in docs/memory.md, regenerated.

Runs two training steps of recipes/gpt-kjv.toml (its data, AdamW) per configuration,
three sizes and under accumulation, recompute and ZeRO (dp 2 under mpirun), and prints
one markdown row per rank: MiB, predicted / measured peak per category (a predicted
range as low–high), the total (rank 0's measured peak_total; "–" where not measured),
and the worst error over the categories, against the nearest end of a predicted range.
Each run reads its memory.json (the trainer writes the prediction beside the measurement).

Usage: python3 bench/memory_table.py [--brigade build/bin/brigade] [--out /tmp/brigade_memory_table]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATS = ["params", "grads", "optimizer", "activations", "workspace"]
TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=64", "train.batch_size=4", "train.seq_len=32"]
WIDE = ["model.n_layer=6", "model.n_head=8", "model.n_embd=512", "train.batch_size=8"]
DP2 = ["parallel.dp=2", "run.threads=1"]  # two ranks on two cores
RUNS = [  # (label, sets, ranks)
    ("tiny 2L/64, batch 4×32", TINY, 1),
    ("default 4L/256, batch 16×128", [], 1),
    ("wide 6L/512, batch 8×128", WIDE, 1),
    ("default, batch 8 × accumulation 2", ["train.batch_size=8", "train.accumulation=2"], 1),
    ("default, recompute full", ["memory.recompute=full"], 1),
    ("default, recompute selective", ["memory.recompute=selective"], 1),
    ("default, ZeRO-3 on 1 rank", ["parallel.zero=3"], 1),
    ("default, dp 2 ZeRO-1", DP2 + ["parallel.zero=1"], 2),
    ("default, dp 2 ZeRO-2 overlap off", DP2 + ["parallel.zero=2", "parallel.overlap=false"], 2),
    ("default, dp 2 ZeRO-2", DP2 + ["parallel.zero=2"], 2),
    ("default, dp 2 ZeRO-3", DP2 + ["parallel.zero=3"], 2),
]


def mib(b):
    return f"{b / 2 ** 20:.2f}" if b else "0"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--out", default="/tmp/brigade_memory_table")
    args = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader")
    print("| run | params | grads | optimizer | activations | workspace | total | worst |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (label, sets, ranks) in enumerate(RUNS):
        out_dir = os.path.join(args.out, f"run{i}")
        cmd = [args.brigade, "train", os.path.join(ROOT, "recipes/gpt-kjv.toml"), "--stop-at", "2", "--quiet",
               "--no-sample"]
        for s in sets + [f"run.out_dir={out_dir}"]:
            cmd += ["--set", s]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + cmd
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if run.returncode != 0:
            sys.exit(f"memory_table: {' '.join(cmd)} failed:\n{run.stderr}")
        with open(os.path.join(out_dir, "memory.json")) as f:
            j = json.load(f)
        for p, rank in enumerate(j["ranks"]):
            cells, worst = [], 0.0
            for c in CATS:
                hi, lo = rank["predicted"]["peak"][c], rank["predicted"]["peak_low"][c]
                m = rank["peak"][c]
                near = min(max(m, lo), hi)
                worst = max(worst, abs(near - m) / m if m else (0.0 if near == 0 else 1.0))
                pred = mib(hi) if lo == hi else f"{mib(lo)}–{mib(hi)}"
                cells.append(f"{pred} / {mib(m)}")
            total_m = mib(j["peak_total"]) if p == 0 else "–"
            name = label + (f", rank {p}" if ranks > 1 else "")
            print(f"| {name} | " + " | ".join(cells) + f" | {mib(rank['predicted']['peak_total'])} / {total_m} | "
                  f"{100 * worst:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
