"""Loads a Brigade-written GPT-2 model.safetensors into the PyTorch reference model
(tests/reference/gpt2_ref.py, by Hugging Face name, read with our own st_io.py), runs the
forward pass on a batch, and compares the loss with an expected value.

Usage:
    /usr/bin/python3 tests/reference/check_checkpoint.py \
        --model MODEL.safetensors --batch BATCH.safetensors \
        [--expected-loss X] [--n-head N] [--eps 1e-5] [--rtol 1e-5]

  MODEL  tensors by HF name (transformer.wte.weight, transformer.h.{i}.attn.c_attn.weight
         in Conv1D (in, out) layout, ...); F32/BF16/F16; lm_head.weight optional (must equal
         wte). V, C, block_size and n_layer come from the shapes.
  BATCH  "ids" and "targets": integer (B, T); optional 0-d "loss" = expected loss.
  --expected-loss  overrides BATCH's "loss"; one of the two is required.
  --n-head         else taken from metadata key "n_head", or "n_head" inside a JSON
                   object stored under "config" or "brigade.config", in MODEL then BATCH.
Prints one line "loss torch=<x> expected=<y> rel_diff=<d>" and exits 0 if
|x - y| <= rtol * |y|, 1 if not, 2 if the inputs are unusable (message on stderr).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from gpt2_ref import GPT2, config_from_tensors  # noqa: E402


def find_n_head(*metas):
    for meta in metas:
        if "n_head" in meta:
            return int(meta["n_head"])
        for key in ("config", "brigade.config"):
            if key in meta:
                try:
                    cfg = json.loads(meta[key])
                except ValueError:
                    continue
                if isinstance(cfg, dict) and "n_head" in cfg:
                    return int(cfg["n_head"])
    return None


def fail(msg):
    print(f"check_checkpoint: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--expected-loss", type=float)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        params, model_meta = st_io.load(args.model)
        batch, batch_meta = st_io.load(args.batch)
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read input: {e}")
    for k in ("ids", "targets"):
        if k not in batch or batch[k].dtype not in (torch.int64, torch.int32) or batch[k].dim() != 2:
            fail(f"{args.batch}: needs integer (B, T) tensors 'ids' and 'targets'")
    expected = args.expected_loss
    if expected is None:
        if "loss" not in batch:
            fail("no expected loss: pass --expected-loss or store a 0-d 'loss' tensor in the batch file")
        expected = float(batch["loss"].double().item())
    n_head = args.n_head or find_n_head(model_meta, batch_meta)
    if n_head is None:
        fail("n_head unknown: pass --n-head or store it in the model metadata ('n_head' or 'config' JSON)")
    for k in ("transformer.wte.weight", "transformer.wpe.weight"):
        if k not in params:
            fail(f"{args.model}: no tensor '{k}'; is this a GPT-2 checkpoint with Hugging Face names?")
    cfg = config_from_tensors(params, n_head)
    if cfg["n_embd"] % n_head:
        fail(f"n_embd {cfg['n_embd']} is not divisible by n_head {n_head}")
    model = GPT2(**cfg, layer_norm_eps=args.eps)
    try:
        model.load_named(params, where=args.model)
    except ValueError as e:
        fail(str(e))
    with torch.no_grad():
        _, loss = model(batch["ids"].long(), batch["targets"].long())
    got = float(loss.item())
    rel = abs(got - expected) / max(abs(expected), 1e-30)
    print(f"loss torch={got:.9g} expected={expected:.9g} rel_diff={rel:.3g}")
    sys.exit(0 if rel <= args.rtol else 1)


if __name__ == "__main__":
    main()
