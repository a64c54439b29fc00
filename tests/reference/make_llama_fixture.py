"""Writes tests/fixtures/llama_tiny.safetensors, the LLaMA parity fixture for
tests/models/test_llama.cpp (run from anywhere):

    /usr/bin/python3 tests/reference/make_llama_fixture.py [--out DIR]

Contents (st_io.py writer; __metadata__: magic=brigade-fixture, version=1, kind=llama_parity,
config = the JSON LLaMAConfig, batch = {B, T, data_seed}, and how each tensor was made):
  every parameter by Hugging Face name (float32), drawn from torch.manual_seed(init_seed):
    in named_parameters() order, 2-d weights normal_(0, std) with std 0.5 for embed_tokens and
    0.08 for the projections and lm_head (larger than LLaMA's 0.02 so attention is far from
    uniform and every term matters), RMSNorm weights 1 + normal_(0, 0.1) (not all ones, so a
    missing or misplaced norm weight shows);
  ids, targets (int64 (B, T)); logits (B, T, V) float32; loss (0-d) float32;
  grad.<name> for every parameter (float32).
The outputs and gradients are computed by llama_ref.py in float64 from the float32
parameters and rounded to float32 once, so the oracle carries no float32 error of its own.
Deterministic: re-running gives identical bytes.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from llama_ref import LLaMA  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
CFG = dict(vocab_size=97, hidden_size=48, intermediate_size=128, n_layer=2, n_head=6, n_kv_head=2,
           max_position=32, rms_norm_eps=1e-6, rope_theta=10000.0)
BATCH = dict(B=2, T=12, data_seed=7)
INIT_SEED = 1234


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(INIT_SEED)
    model = LLaMA(CFG)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + torch.empty_like(p).normal_(0.0, 0.1))
            else:
                p.normal_(0.0, 0.5 if n == "model.embed_tokens.weight" else 0.08)
    params32 = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    g = torch.Generator().manual_seed(BATCH["data_seed"])
    data = torch.randint(0, CFG["vocab_size"], (BATCH["B"], BATCH["T"] + 1), generator=g)  # (B, T+1)
    ids, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    model = model.double()
    logits, loss = model(ids, targets)
    loss.backward()
    grads = [(f"grad.{n}", p.grad.detach().float()) for n, p in model.named_parameters()]
    meta = dict(MAGIC, kind="llama_parity", torch=torch.__version__, config=json.dumps(CFG),
                batch=json.dumps(BATCH), init_seed=str(INIT_SEED),
                init="torch.manual_seed(init_seed); in named_parameters() order: 1-d 1 + normal_(0, 0.1); "
                     "embed_tokens normal_(0, 0.5); other 2-d normal_(0, 0.08)",
                oracle="llama_ref.py in float64 on the float32 parameters; outputs rounded to float32",
                ids="torch.randint(0, V, (B, T+1), generator=torch.Generator().manual_seed(data_seed)): "
                    "ids = [:, :-1], targets = [:, 1:]")
    tensors = params32 + [("ids", ids), ("targets", targets), ("logits", logits.detach().float()),
                          ("loss", loss.detach().float().reshape(()))] + grads
    path = os.path.join(args.out, "llama_tiny.safetensors")
    st_io.save(path, tensors, meta)
    print(f"wrote {os.path.normpath(path)}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
