"""Writes tiny Hugging Face model directories (tests/models/test_hf_dir.cpp) into
tests/fixtures/hf/, exactly as transformers lays them out: config.json with HF's field names
(GPT2Config / LlamaConfig), model.safetensors or shards with model.safetensors.index.json,
and beside each an expected.safetensors (ids and the reference model's logits):

    /usr/bin/python3 tests/reference/make_hf_dirs.py [--out DIR]

  gpt2/          GPT2LMHeadModel as real GPT-2 checkpoints store it: keys without the
                 "transformer." prefix, the causal-mask buffers h.<i>.attn.bias and
                 h.<i>.attn.masked_bias included, the head tied to wte (no lm_head.weight)
  llama/         LlamaForCausalLM with GQA, untied lm_head, "model." prefix, F32
  llama_bf16/    the same weights stored in BF16 (the logits are the reference's on the
                 BF16-rounded weights)
  llama_sharded/ the same F32 weights in two shards and an index
  llama_linear/  LlamaForCausalLM with the legacy rope_scaling {"type": "linear", "factor": 4}
  llama3_tied/   Llama 3.2's layout: rope_scaling {"rope_type": "llama3", ...} whose
                 frequencies fall in all three bands of the rule (kept, blended, divided),
                 tie_word_embeddings true and no lm_head.weight (as transformers saves a tied
                 model); its expected.safetensors also holds targets, the loss and grad.<name>
                 of every parameter, computed in float64 from the float32 weights
The models are tests/reference/gpt2_ref.py and llama_ref.py (plain PyTorch, HF names).
"""
import argparse
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from gpt2_ref import GPT2  # noqa: E402
from llama_ref import LLaMA, init_test_weights  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}


def ids_for(V, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g)


def write_dir(path, config, tensors, ids, logits, shards=1):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    meta = {"format": "pt"}
    if shards == 1:
        st_io.save(os.path.join(path, "model.safetensors"), tensors, meta)
    else:
        per = (len(tensors) + shards - 1) // shards
        weight_map, total = {}, 0
        for s in range(shards):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = tensors[s * per:(s + 1) * per]
            st_io.save(os.path.join(path, name), part, meta)
            for n, t in part:
                weight_map[n] = name
                total += t.numel() * t.element_size()
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    st_io.save(os.path.join(path, "expected.safetensors"), [("ids", ids), ("logits", logits)],
               dict(MAGIC, kind="hf_dir_expected", torch=torch.__version__))


def gpt2(out):
    cfg = dict(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=32, layer_norm_eps=1e-5)
    m = GPT2(**cfg)
    m.init_weights(77)
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a misplaced one shows
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(torch.empty_like(p).normal_(0.0, 0.05))
    ids = ids_for(cfg["vocab_size"], 2, 16, 5)
    with torch.no_grad():
        logits, _ = m(ids)
    tensors = []
    for n, p in m.named_parameters():
        tensors.append((n[len("transformer."):], p.detach().clone()))
    T = cfg["block_size"]
    for i in range(cfg["n_layer"]):  # the buffers old GPT-2 checkpoints carry
        tensors.append((f"h.{i}.attn.bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T)))
        tensors.append((f"h.{i}.attn.masked_bias", torch.tensor(-1e4)))
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
              "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "bos_token_id": 95, "eos_token_id": 95,
              "initializer_range": 0.02, "layer_norm_epsilon": cfg["layer_norm_eps"], "n_ctx": T,
              "n_embd": cfg["n_embd"], "n_head": cfg["n_head"], "n_inner": None, "n_layer": cfg["n_layer"],
              "n_positions": T, "scale_attn_weights": True, "tie_word_embeddings": True,
              "torch_dtype": "float32", "vocab_size": cfg["vocab_size"]}
    write_dir(os.path.join(out, "gpt2"), config, tensors, ids, logits)


def llama(out):
    cfg = dict(vocab_size=97, hidden_size=48, intermediate_size=128, n_layer=2, n_head=6, n_kv_head=2,
               max_position=32, rms_norm_eps=1e-6, rope_theta=10000.0)
    m = LLaMA(cfg)
    init_test_weights(m, 4321)
    ids = ids_for(cfg["vocab_size"], 2, 12, 6)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
              "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu",
              "hidden_size": cfg["hidden_size"], "initializer_range": 0.02,
              "intermediate_size": cfg["intermediate_size"], "max_position_embeddings": cfg["max_position"],
              "mlp_bias": False, "num_attention_heads": cfg["n_head"], "num_hidden_layers": cfg["n_layer"],
              "num_key_value_heads": cfg["n_kv_head"], "pretraining_tp": 1, "rms_norm_eps": cfg["rms_norm_eps"],
              "rope_scaling": None, "rope_theta": cfg["rope_theta"], "tie_word_embeddings": False,
              "torch_dtype": "float32", "use_cache": True, "vocab_size": cfg["vocab_size"]}
    tensors = [(n, p.detach().clone()) for n, p in m.named_parameters()]
    with torch.no_grad():
        logits, _ = m(ids)
    write_dir(os.path.join(out, "llama"), config, tensors, ids, logits)
    write_dir(os.path.join(out, "llama_sharded"), config, tensors, ids, logits, shards=2)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(p.to(torch.bfloat16).float())
        logits16, _ = m(ids)
    tensors16 = [(n, p.detach().to(torch.bfloat16)) for n, p in m.named_parameters()]
    write_dir(os.path.join(out, "llama_bf16"), dict(config, torch_dtype="bfloat16"), tensors16, ids, logits16)


def llama_scaled(out):
    base = dict(vocab_size=89, hidden_size=32, intermediate_size=64, n_layer=2, n_head=2, n_kv_head=1,
                max_position=256, rms_norm_eps=1e-5, rope_theta=10000.0)

    def hf_config(cfg, rope_scaling, tied):
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16,
                "hidden_act": "silu", "hidden_size": cfg["hidden_size"], "initializer_range": 0.02,
                "intermediate_size": cfg["intermediate_size"], "max_position_embeddings": cfg["max_position"],
                "mlp_bias": False, "num_attention_heads": cfg["n_head"], "num_hidden_layers": cfg["n_layer"],
                "num_key_value_heads": cfg["n_kv_head"], "pretraining_tp": 1, "rms_norm_eps": cfg["rms_norm_eps"],
                "rope_scaling": rope_scaling, "rope_theta": cfg["rope_theta"], "tie_word_embeddings": tied,
                "torch_dtype": "float32", "use_cache": True, "vocab_size": cfg["vocab_size"]}

    # linear, legacy "type" key, untied: logits only.
    linear = {"type": "linear", "factor": 4.0}
    cfg = dict(base, rope_scaling=linear)
    m = LLaMA(cfg)
    init_test_weights(m, 97)
    ids = ids_for(cfg["vocab_size"], 2, 20, 8)
    with torch.no_grad():
        logits, _ = m(ids)
    tensors = [(n, p.detach().clone()) for n, p in m.named_parameters()]
    write_dir(os.path.join(out, "llama_linear"), hf_config(cfg, linear, False), tensors, ids, logits)

    # llama3 + tied head: logits, loss and gradients in float64 from the float32 weights.
    # HS = 16, theta 1e4: wavelengths 2 pi / inv_freq = 6.3, 19.9, 62.8, 199, ...; with
    # original_max_position_embeddings 128, low 1, high 4 the bands are < 32 (kept), 32..128
    # (blended) and > 128 (divided by the factor).
    llama3 = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
              "original_max_position_embeddings": 128, "rope_type": "llama3"}
    cfg = dict(base, rope_scaling=llama3, tie_word_embeddings=True)
    m = LLaMA(cfg)
    init_test_weights(m, 98)
    assert "lm_head.weight" not in dict(m.named_parameters())
    tensors = [(n, p.detach().clone()) for n, p in m.named_parameters()]
    g = torch.Generator().manual_seed(9)
    data = torch.randint(0, cfg["vocab_size"], (2, 25), generator=g)  # (B, T+1)
    ids, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    m = m.double()
    logits, loss = m(ids, targets)
    loss.backward()
    path = os.path.join(out, "llama3_tied")
    write_dir(path, hf_config(cfg, llama3, True), tensors, ids, logits.detach().float())
    extra = [("ids", ids), ("logits", logits.detach().float()), ("targets", targets),
             ("loss", loss.detach().float().reshape(()))]
    extra += [(f"grad.{n}", p.grad.detach().float()) for n, p in m.named_parameters()]
    st_io.save(os.path.join(path, "expected.safetensors"), extra,
               dict(MAGIC, kind="hf_dir_expected", torch=torch.__version__,
                    oracle="llama_ref.py in float64 on the float32 weights; outputs rounded to float32"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures", "hf"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    gpt2(args.out)
    llama(args.out)
    llama_scaled(args.out)
    for d in sorted(os.listdir(args.out)):
        print(d, sorted(os.listdir(os.path.join(args.out, d))))


if __name__ == "__main__":
    main()
