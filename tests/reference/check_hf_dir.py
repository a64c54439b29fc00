"""Reads a Hugging Face model directory written by Brigade (config.json + model.safetensors)
into the plain-PyTorch reference model (gpt2_ref.py / llama_ref.py) from HF's config field
names alone, runs `ids` from BATCH, and compares the logits with BATCH's "logits":

    /usr/bin/python3 tests/reference/check_hf_dir.py DIR BATCH.safetensors [--rtol 1e-5]

Prints "max_rel_err=<e>" and exits 0 if it is <= rtol, 1 if not, 2 if DIR is unusable.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402
from gpt2_ref import GPT2  # noqa: E402
from llama_ref import LLaMA  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("batch")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    try:
        cfg = json.load(open(os.path.join(a.dir, "config.json")))
        tensors, _ = st_io.load(os.path.join(a.dir, "model.safetensors"))
        batch, _ = st_io.load(a.batch)
    except (OSError, ValueError) as e:
        print(f"unusable: {e}", file=sys.stderr)
        return 2
    if cfg["model_type"] == "gpt2":
        assert cfg["activation_function"] == "gelu_new" and cfg.get("n_inner") is None
        m = GPT2(vocab_size=cfg["vocab_size"], block_size=cfg["n_positions"], n_layer=cfg["n_layer"],
                 n_head=cfg["n_head"], n_embd=cfg["n_embd"], layer_norm_eps=cfg["layer_norm_epsilon"])
        m.load_named(tensors, where=a.dir)
    elif cfg["model_type"] == "llama":
        m = LLaMA(dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                       intermediate_size=cfg["intermediate_size"], n_layer=cfg["num_hidden_layers"],
                       n_head=cfg["num_attention_heads"], n_kv_head=cfg["num_key_value_heads"],
                       max_position=cfg["max_position_embeddings"], rms_norm_eps=cfg["rms_norm_eps"],
                       rope_theta=cfg["rope_theta"], rope_scaling=cfg.get("rope_scaling"),
                       tie_word_embeddings=cfg.get("tie_word_embeddings", False)))
        params = dict(m.named_parameters())
        if set(params) != set(tensors):
            print(f"keys differ: {sorted(set(params) ^ set(tensors))[:5]}", file=sys.stderr)
            return 2
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(tensors[n].float())
    else:
        print(f"model_type {cfg['model_type']}", file=sys.stderr)
        return 2
    m.eval()
    with torch.no_grad():
        logits, _ = m(batch["ids"])
    want = batch["logits"].float()
    err = ((logits - want).abs().max() / want.abs().max()).item()
    print(f"max_rel_err={err:.3e}")
    return 0 if err <= a.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
