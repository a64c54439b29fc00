#!/usr/bin/env python3
"""Training speed across the model zoo: Brigade against PyTorch on the CPU, side by side.

For each row and precision, runs `brigade bench` (the recipe's training step on random inputs of
the row's shape) and the same model in PyTorch (same shapes, optimizer, gradient clipping and
threads), alternating them round by round so machine noise hits both alike, and prints medians:
items/s (images or tokens), the ratio, achieved GFLOP/s, MFU against the GEMM peak each engine
measured in that run (1024^3 matmul, best of 12; bf16 rows against the bf16 peak), and peak RSS.
Both engines' GFLOP/s use Brigade's FLOPs-per-item formula for the row (`flops_per_item` of its
bench JSON), so the GFLOP/s ratio is the throughput ratio. Each row also checks that the two
models have the same number of parameters and says so when they do not.

Rows (the largest batch that fits comfortably here, the same for both engines):
  resnet50-224  ResNet-50, full width, ImageNet stem, 224x224x3, 1000 classes, batch 16
                (torch: torchvision resnet50)
  resnet50-28   ResNet-50, full width, small-input stem (3x3 stride 1, no max-pool), 28x28x1,
                10 classes, batch 32 (torch: torchvision resnet50 with that stem)
                (Brigade runs both ResNet rows with model.memory_format = "channels_last")
  bert-large    BERT-Large shape: 24 layers, 1024 wide, 16 heads, FFN 4096, vocab 30522, T 128,
                batch 4, the masked-LM step (15% masked; both engines run the MLM head on the
                masked positions only; the FLOPs formula counts it on every token)
                (torch: tests/reference/encoder_ref.py BertForMaskedLM)
  vit-b16       ViT-B/16: 224x224x3, patch 16, 12 layers, 768, 12 heads, 1000 classes, batch 8
                (torch: torchvision VisionTransformer, vit_b_16's shape)
  swin-b        Swin-B: 224x224x3, patch 4, window 7, 128 wide, depths 2,2,18,2, heads 4..32,
                1000 classes, batch 8 (torch: torchvision SwinTransformer, swin_b's shape, no
                stochastic depth: Brigade's Swin has none)
  gpt2          GPT-2 124M, T 256, batch 4 (torch: tests/reference/gpt2_ref.py)
  llama         a LLaMA of GPT-2's size: 12 layers, 768, 12 heads, SwiGLU 2048, vocab 32000,
                untied head, T 256, batch 4 (torch: tests/reference/llama_ref.py)
Optimizers: AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, decay 0.01) for the transformers, SGD with
Nesterov momentum 0.9 (lr 0.05, decay 5e-4) for the convnets; gradient-norm clipping at 1.0; no
dropout. Precisions: fp32 (Brigade O0, torch fp32) and bf16 (Brigade O1 and O2, torch
autocast(cpu, bfloat16)); a precision Brigade refuses for a model prints its error as the row.

PyTorch gets its best settings on this machine, in its own process only (bench/gpt_vs_torch.py
explains each): OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, ATEN_CPU_CAPABILITY=avx512,
OMP_WAIT_POLICY=PASSIVE for fp32, glibc malloc told to keep freed memory, the multi-tensor
(foreach) optimizers, and for the convnets the faster of NCHW and channels-last, both timed in
every round (the table says which won). Under bf16 autocast its LayerNorms take fp32 input (a
forward pre-hook), as later PyTorch versions' autocast does: torch 1.13's leaves layer_norm in
the input's dtype and then fails on its fp32 weight (torchvision's Swin does). The preflight of gpt_vs_torch.py runs first: the peer's
packages (libopenblas0-pthread, or its fp32 GEMMs run on the reference BLAS) and both fp32 GEMM
peaks, refusing ratios against a crippled peer.

Usage: python3 bench/vs_torch.py [--brigade build/bin/brigade] [--rows resnet50-224,...]
                                 [--precisions fp32,bf16] [--steps 3] [--warmup 1] [--rounds 3]
                                 [--threads 2] [--batch ROW=N ...] [--json OUT]
                                 [--install-deps | --skip-deps-check]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gpt_vs_torch as g  # noqa: E402  (the peer's settings, GEMM peaks and preflight)

ADAMW = dict(name="adamw", lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
SGD = dict(name="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
SYNTHETIC = {"data.corpus": "synthetic"}
IMAGENET = {"model.image_size": 224, "model.in_channels": 3, "model.num_classes": 1000}

ROWS = {
    "resnet50-224": dict(
        recipe="resnet50-fashion.toml", optim=SGD, batch=16, item="images", convnet=True,
        sets={**SYNTHETIC, **IMAGENET, "model.width": 64, "model.stem": "imagenet", "model.memory_format": "channels_last"},
        torch=dict(kind="resnet50", small_input=False, channels=3, side=224, classes=1000)),
    "resnet50-28": dict(
        recipe="resnet50-fashion.toml", optim=SGD, batch=32, item="images", convnet=True,
        sets={"model.width": 64, "model.memory_format": "channels_last"},
        torch=dict(kind="resnet50", small_input=True, channels=1, side=28, classes=10)),
    "bert-large": dict(
        recipe="bert-kjv.toml", optim=ADAMW, batch=4, item="tokens",
        sets={"model.n_layer": 24, "model.n_embd": 1024, "model.n_head": 16, "model.intermediate_size": 4096,
              "model.vocab_size": 30521, "model.block_size": 512, "train.seq_len": 128, "model.dropout": 0.0,
              "model.layer_norm_eps": 1e-12, "data.mlm_probability": 0.15},  # vocab: + [MASK] = 30522
        torch=dict(kind="bert", vocab=30522, layers=24, width=1024, heads=16, ffn=4096, positions=512, T=128,
                   eps=1e-12, mask_p=0.15)),
    "vit-b16": dict(
        recipe="vit-fashion.toml", optim=ADAMW, batch=8, item="images",
        sets={**SYNTHETIC, **IMAGENET, "model.patch_size": 16, "model.n_layer": 12, "model.n_embd": 768,
              "model.n_head": 12, "model.intermediate_size": 3072, "model.dropout": 0.0, "model.layer_norm_eps": 1e-6},
        torch=dict(kind="vit", side=224, patch=16, layers=12, heads=12, width=768, mlp=3072, classes=1000)),
    "swin-b": dict(
        recipe="swin-fashion.toml", optim=ADAMW, batch=8, item="images",
        sets={**SYNTHETIC, **IMAGENET, "model.patch_size": 4, "model.n_embd": 128, "model.n_head": 4,
              "model.depths": "2,2,18,2", "model.window_size": 7, "model.mlp_ratio": 4.0},
        torch=dict(kind="swin", side=224, patch=4, width=128, depths=[2, 2, 18, 2], heads=[4, 8, 16, 32],
                   window=7, classes=1000)),
    "gpt2": dict(
        recipe="gpt-kjv.toml", optim=ADAMW, batch=4, item="tokens",
        sets={"model.n_layer": 12, "model.n_embd": 768, "model.n_head": 12, "model.vocab_size": 50257,
              "model.block_size": 256, "train.seq_len": 256, "model.dropout": 0.0, "sample.top_k": 1},
        torch=dict(kind="gpt2", vocab=50257, layers=12, width=768, heads=12, T=256)),
    "llama": dict(
        recipe="llama-kjv.toml", optim=ADAMW, batch=4, item="tokens",
        sets={"model.n_layer": 12, "model.n_embd": 768, "model.n_head": 12, "model.n_kv_head": 12,
              "model.intermediate_size": 2048, "model.vocab_size": 32000, "model.block_size": 256,
              "train.seq_len": 256, "model.tie_embeddings": "false", "sample.top_k": 1},
        torch=dict(kind="llama", vocab=32000, layers=12, width=768, heads=12, kv_heads=12, ffn=2048, T=256,
                   theta=10000.0, eps=1e-5)),
}


# ------------------------------------------------------------------ the torch worker

def build_torch_model(torch, t):
    """(model, make_batch(generator) -> inputs, loss_fn(model, inputs) -> loss) for the row."""
    import torch.nn.functional as F
    kind = t["kind"]
    if kind == "resnet50":
        import torchvision
        m = torchvision.models.resnet50(num_classes=t["classes"])
        if t["small_input"]:
            m.conv1 = torch.nn.Conv2d(t["channels"], 64, 3, 1, 1, bias=False)
            m.maxpool = torch.nn.Identity()
        elif t["channels"] != 3:
            m.conv1 = torch.nn.Conv2d(t["channels"], 64, 7, 2, 3, bias=False)

        def batch(gen, B):
            x = torch.rand(B, t["channels"], t["side"], t["side"], generator=gen) * 2 - 1
            return x, torch.randint(0, t["classes"], (B,), generator=gen)
        return m, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if kind == "vit":
        from torchvision.models.vision_transformer import VisionTransformer
        m = VisionTransformer(image_size=t["side"], patch_size=t["patch"], num_layers=t["layers"],
                              num_heads=t["heads"], hidden_dim=t["width"], mlp_dim=t["mlp"],
                              num_classes=t["classes"])

        def batch(gen, B):
            x = torch.rand(B, 3, t["side"], t["side"], generator=gen) * 2 - 1
            return x, torch.randint(0, t["classes"], (B,), generator=gen)
        return m, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if kind == "swin":
        from torchvision.models.swin_transformer import SwinTransformer
        m = SwinTransformer(patch_size=[t["patch"], t["patch"]], embed_dim=t["width"], depths=t["depths"],
                            num_heads=t["heads"], window_size=[t["window"], t["window"]],
                            stochastic_depth_prob=0.0, num_classes=t["classes"])

        def batch(gen, B):
            x = torch.rand(B, 3, t["side"], t["side"], generator=gen) * 2 - 1
            return x, torch.randint(0, t["classes"], (B,), generator=gen)
        return m, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    if kind == "bert":
        from encoder_ref import BertForMaskedLM
        c = dict(vocab_size=t["vocab"], hidden_size=t["width"], num_hidden_layers=t["layers"],
                 num_attention_heads=t["heads"], intermediate_size=t["ffn"],
                 max_position_embeddings=t["positions"], type_vocab_size=2, layer_norm_eps=t["eps"])
        m = BertForMaskedLM(c)

        def batch(gen, B):
            ids = torch.randint(3, t["vocab"] - 1, (B, t["T"]), generator=gen)
            masked = torch.rand(B, t["T"], generator=gen) < t["mask_p"]
            labels = torch.where(masked, ids, torch.full_like(ids, -100))
            return torch.where(masked, torch.full_like(ids, t["vocab"] - 1), ids), labels

        def loss(m, b):  # the MLM head on the masked positions only, as Brigade's masked_logits
            ids, labels = b
            h = m.bert(ids)
            sel = labels.reshape(-1) != -100
            hm = m.cls.predictions.transform(h.reshape(-1, h.shape[-1])[sel])
            logits = F.linear(hm, m.bert.embeddings.word_embeddings.weight, m.cls.predictions.bias)
            return F.cross_entropy(logits, labels.reshape(-1)[sel])
        return m, batch, loss
    if kind == "gpt2":
        from gpt2_ref import GPT2
        m = GPT2(t["vocab"], t["T"], t["layers"], t["heads"], t["width"])
        m.init_weights(1337)

        def batch(gen, B):
            ids = torch.randint(0, t["vocab"], (B, t["T"] + 1), generator=gen)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        return m, batch, lambda m, b: m(b[0], b[1])[1]
    if kind == "llama":
        from llama_ref import LLaMA
        m = LLaMA(dict(vocab_size=t["vocab"], hidden_size=t["width"], n_layer=t["layers"], n_head=t["heads"],
                       n_kv_head=t["kv_heads"], intermediate_size=t["ffn"], rope_theta=t["theta"],
                       rms_norm_eps=t["eps"], max_position=t["T"]))

        def batch(gen, B):
            ids = torch.randint(0, t["vocab"], (B, t["T"] + 1), generator=gen)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        return m, batch, lambda m, b: m(b[0], b[1])[1]
    raise ValueError(f"unknown torch model kind {kind}")


def torch_worker(args):
    import resource
    import time

    import torch
    row = json.loads(args.row_json)
    t, o = row["torch"], row["optim"]
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    peak32, peak16 = g.torch_gemm_peak(torch, torch.float32), g.torch_gemm_peak(torch, torch.bfloat16)
    model, make_batch, loss_fn = build_torch_model(torch, t)
    model.train()
    bf16 = args.precision == "bf16"
    if bf16:
        # torch 1.13's CPU autocast leaves layer_norm in its input's dtype, and a LayerNorm's fp32
        # weight then refuses a bf16 input (torchvision's Swin fails so); later versions run
        # layer_norm in fp32 under autocast, which this pre-hook does
        for mod in model.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.register_forward_pre_hook(lambda _m, inp: tuple(x.float() for x in inp))
    params = sum(p.numel() for p in model.parameters())
    if o["name"] == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                weight_decay=o["weight_decay"], foreach=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                              weight_decay=o["weight_decay"], foreach=True)
    b = make_batch(torch.Generator().manual_seed(1339), row["batch"])
    layouts = ["nchw", "channels_last"] if row.get("convnet") else ["default"]
    results = {}
    for layout in layouts:
        if layout == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            b = (b[0].contiguous(memory_format=torch.channels_last), b[1])
        times, loss = [], None
        for step in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model, b)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        results[layout] = dict(step_seconds=times, median_step_s=statistics.median(times), last_loss=float(loss))
    best = min(results, key=lambda k: results[k]["median_step_s"])
    items = row["batch"] * (t["T"] if row["item"] == "tokens" else 1)
    print(json.dumps({
        "engine": "torch", "precision": args.precision, "layout": best, "layouts": results,
        "median_step_s": results[best]["median_step_s"], "items_per_s": items / results[best]["median_step_s"],
        "parameters": params, "gemm_peak_f32_gflops": peak32, "gemm_peak_bf16_gflops": peak16,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch": torch.__version__, "blas": g.loaded_blas_libraries(),
    }))


# ------------------------------------------------------------------ the driver

def brigade_sets(args, row, level):
    sets = dict(row["sets"])
    sets.update({f"optim.{k}": v for k, v in row["optim"].items()})
    # a constant learning rate, as the peer's (the schedule costs nothing either way)
    sets.update({"schedule.name": "constant", "schedule.warmup_steps": 0, "schedule.min_lr": 0.0})
    sets.update({"train.batch_size": row["batch"], "train.grad_clip": 1.0, "train.accumulation": 1,
                 "run.threads": args.threads, "precision.level": level, "precision.dtype": "bf16"})
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sets.items()]


def run_brigade(args, row, level):
    cmd = [args.brigade, "bench", os.path.join(ROOT, "recipes", row["recipe"]), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + sum([["--set", s] for s in brigade_sets(args, row, level)], [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        err = [line for line in p.stderr.strip().splitlines() if "error" in line] or p.stderr.strip().splitlines()[-1:]
        return {"error": err[-1] if err else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_torch(args, row, precision):
    cmd = [g.TORCH_PY, os.path.abspath(__file__), "--torch-worker", "--row-json", json.dumps(row), "--precision",
           precision, "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=g.torch_env(precision))
    if p.returncode != 0:
        sys.exit(f"error: the PyTorch worker failed for {row['name']} {precision}:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "build/bin/brigade"))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", action="append", default=[], help="ROW=N: another batch size for a row")
    ap.add_argument("--json", help="also write every measurement to this file")
    ap.add_argument("--install-deps", action="store_true")
    ap.add_argument("--skip-deps-check", action="store_true")
    ap.add_argument("--gemm-check-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row-json", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    names = args.rows.split(",")
    for n in names:
        if n not in ROWS:
            sys.exit(f"error: --rows: unknown row '{n}'; the rows are {', '.join(ROWS)}")
    for spec in args.batch:
        n, _, v = spec.partition("=")
        if n not in ROWS or not v.isdigit() or int(v) < 1:
            sys.exit(f"error: --batch {spec}: give ROW=N with a row of {', '.join(ROWS)} and N >= 1")
        ROWS[n]["batch"] = int(v)
    for p in args.precisions.split(","):
        if p not in ("fp32", "bf16"):
            sys.exit(f"error: --precisions: unknown precision '{p}'; use fp32 and/or bf16")

    g.preflight(args)
    print("PyTorch runs with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset, ATEN_CPU_CAPABILITY=avx512, "
          f"OMP_WAIT_POLICY=PASSIVE for fp32, GLIBC_TUNABLES={g.TORCH_MALLOC} (malloc keeps freed memory), "
          "foreach AdamW/SGD, convnets in the faster of NCHW and channels-last (both timed each round); "
          f"torch bf16 = autocast(cpu, bfloat16). {args.threads} threads, {args.steps} timed steps after "
          f"{args.warmup} warm-up, {args.rounds} rounds alternating the engines; medians.", flush=True)
    table, raw = [], []
    printed = 0
    for name in names:
        row = dict(ROWS[name], name=name)
        for precision in args.precisions.split(","):
            engines = [("torch", None), ("brigade O0", "O0")] if precision == "fp32" else \
                [("torch", None), ("brigade O1", "O1"), ("brigade O2", "O2")]
            res = {e: [] for e, _ in engines}
            for r in range(args.rounds):
                for e, level in engines:
                    if res[e] and "error" in res[e][-1]:
                        continue  # a refusal does not change between rounds
                    x = run_torch(args, row, precision) if level is None else run_brigade(args, row, level)
                    res[e].append(x)
                    raw.append(dict(row=name, precision=precision, engine=e, round=r + 1, result=x))
                    what = x["error"] if "error" in x else f"{x['items_per_s']:9.2f} {row['item']}/s" + \
                        (f" ({x['layout']})" if e == "torch" and row.get("convnet") else "")
                    print(f"  {name} {precision} round {r + 1}: {e:<11} {what}", flush=True)
            torch_ips = statistics.median(x["items_per_s"] for x in res["torch"])
            ok = [e for e, _ in engines if e != "torch" and "error" not in res[e][0]]
            tp = statistics.median(x["gemm_peak_f32_gflops"] for x in res["torch"])
            bp = statistics.median(x["gemm_peak_f32_gflops"] for e in ok for x in res[e]) if ok else tp
            refused = g.peer_too_slow(tp, bp)
            if refused:
                print(f"  {name} {precision}: " + g.refusal(tp, bp, res["torch"][0].get("blas", [])), flush=True)
            flops = next((res[e][0]["flops_per_item"] for e in ok), None)
            tparams = res["torch"][0]["parameters"]
            for e, _ in engines:
                rs = res[e]
                if "error" in rs[0]:
                    table.append(dict(row=name, precision=precision, engine=e, error=rs[0]["error"]))
                    continue
                ips = statistics.median(x["items_per_s"] for x in rs)
                p32 = statistics.median(x["gemm_peak_f32_gflops"] for x in rs)
                p16 = statistics.median(x["gemm_peak_bf16_gflops"] for x in rs)
                gflops = ips * flops / 1e9 if flops else None
                layouts = sorted({x.get("layout", "") for x in rs}) if e == "torch" else []
                table.append(dict(
                    row=name, precision=precision, engine=e + (f" ({'/'.join(layouts)})" if row.get("convnet")
                                                                and layouts else ""),
                    items_per_s=ips, item=row["item"], ratio=None if refused else ips / torch_ips,
                    gflops=gflops, mfu=gflops / (p16 if precision == "bf16" else p32) if gflops else None,
                    peak32=p32, peak16=p16, rss=max(x["peak_rss_bytes"] for x in rs) / 2 ** 20,
                    params=rs[0]["parameters"], same_params=rs[0]["parameters"] == tparams))
            # each row's lines as soon as it is done, and the JSON so far: a long run stopped early
            # keeps what it measured
            for r in table[printed:]:
                print("  " + table_line(r), flush=True)
            printed = len(table)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(table=table, raw=raw), f, indent=1)
    print()
    print(TABLE_HEADER)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(table_line(r))


TABLE_HEADER = ("| row | precision | engine | items/s | vs torch | GFLOP/s | MFU | GEMM peak f32 / bf16 | "
                "peak RSS MiB | parameters |")


def table_line(r):
    if "error" in r:
        return f"| {r['row']} | {r['precision']} | {r['engine']} | refused: {r['error']} | | | | | | |"
    ratio = "refused" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    params = f"{r['params']:,}" + ("" if r["same_params"] else " (differs from torch's)")
    return (f"| {r['row']} | {r['precision']} | {r['engine']} | {r['items_per_s']:.1f} {r['item']} | {ratio} | "
            f"{r['gflops']:.0f} | {100 * r['mfu']:.1f}% | {r['peak32']:.0f} / {r['peak16']:.0f} | "
            f"{r['rss']:.0f} | {params} |")


if __name__ == "__main__":
    sys.exit(main())
