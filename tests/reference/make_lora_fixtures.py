"""Writes the LoRA parity fixtures (tests/models/test_lora.cpp) into tests/fixtures/:

    /usr/bin/python3 tests/reference/make_lora_fixtures.py [--out DIR]

A plain-PyTorch LoRA (the `LoraLayer` below, written from the paper and PEFT's documented
semantics, not from PEFT's code) on the reference GPT-2 (c_attn, HF Conv1D) and LLaMA
(q_proj, v_proj): y = base(x) + lora_B(lora_A(x)) * alpha / r, lora_A kaiming-uniform(a=sqrt 5)
drawn from torch.manual_seed(lora_seed) in module order, lora_B zero, every base parameter
frozen. Then 10 AdamW steps on the adapters only. Files: lora_gpt2.safetensors,
lora_llama.safetensors, each holding the base parameters, lora_A at init ("init.<name>"), the
batch, the losses after k = 0..10 steps, the adapter gradients at step 0 and after 10 steps
("grad0.<name>", "grad10.<name>"), and the adapters after 10 steps ("final.<name>").
Deterministic (one thread, fixed seeds).
"""
import argparse
import json
import math
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from gpt2_ref import GPT2, Conv1D  # noqa: E402
from llama_ref import LLaMA, init_test_weights  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
LORA = dict(r=4, alpha=8.0, lora_seed=99)
ADAMW = dict(lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01, steps=10)


class Weight(nn.Module):
    """A bias-free torch.nn.Linear whose weight (out, in) is left for the caller to initialise
    (nn.Linear's constructor would draw from the generator itself)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))

    def forward(self, x):
        return F.linear(x, self.weight)


class LoraLayer(nn.Module):
    """base(x) + B(A(x)) * alpha / r; A (r, in), B (out, r) in torch.nn.Linear layout; A is the
    only draw from the generator (kaiming_uniform_, a = sqrt 5), B starts at zero."""

    def __init__(self, base, n_in, n_out, r, alpha):
        super().__init__()
        self.base = base
        self.lora_A = Weight(n_in, r)
        self.lora_B = Weight(r, n_out)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


def adapt(model, targets, r, alpha, seed):
    """Replaces each targeted module by a LoraLayer, in named_modules order; returns the names."""
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    names = []
    for name, mod in list(model.named_modules()):
        if name.split(".")[-1] not in targets:
            continue
        if isinstance(mod, Conv1D):
            n_in, n_out = mod.weight.shape  # HF Conv1D: weight (in, out)
        else:
            n_out, n_in = mod.weight.shape
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        setattr(parent, name.rsplit(".", 1)[1], LoraLayer(mod, n_in, n_out, r, alpha))
        names.append(name)
    return names


def lora_named(model):
    """The adapters under the engine's names (<layer>.lora_A.weight), in parameter order."""
    out = []
    for n, p in model.named_parameters():
        if ".lora_A." in n or ".lora_B." in n:
            out.append((n.replace(".base.", "."), p))
    return out


def run(model, ids, targets, loss_of):
    named = lora_named(model)
    init = [(f"init.{n}", p.detach().clone()) for n, p in named if ".lora_A." in n]
    opt = torch.optim.AdamW([p for _, p in named], lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    losses, grad0, grad10 = [], [], []
    for k in range(ADAMW["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, ids, targets)
        losses.append(loss.item())
        loss.backward()
        if k == 0:
            grad0 = [(f"grad0.{n}", p.grad.detach().clone()) for n, p in named]
        if k == ADAMW["steps"]:
            grad10 = [(f"grad10.{n}", p.grad.detach().clone()) for n, p in named]
            break
        opt.step()
    final = [(f"final.{n}", p.detach().clone()) for n, p in named]
    return init, losses, grad0, grad10, final


def batch(V, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, V, (B, T + 1), generator=g)  # (B, T+1)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def write(path, kind, cfg, base, targets, model, ids, tgt, loss_of):
    names = adapt(model, targets, LORA["r"], LORA["alpha"], LORA["lora_seed"])
    init, losses, grad0, grad10, final = run(model, ids, tgt, loss_of)
    meta = dict(MAGIC, kind=kind, torch=torch.__version__, config=json.dumps(cfg), lora=json.dumps(LORA),
                targets=json.dumps(targets), adapted=json.dumps(names), adamw=json.dumps(ADAMW),
                losses="losses[k] = loss after k AdamW steps on the adapters, k = 0..steps")
    tensors = base + init + [("ids", ids), ("targets", tgt), ("losses", torch.tensor(losses, dtype=torch.float32))]
    st_io.save(path, tensors + grad0 + grad10 + final, meta)
    print(f"wrote {os.path.normpath(path)}: losses {losses[0]:.6f} -> {losses[-1]:.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    gcfg = dict(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=32, layer_norm_eps=1e-5)
    gpt = GPT2(**gcfg)
    gpt.init_weights(1234)
    gbase = [(n, p.detach().clone()) for n, p in gpt.named_parameters()]
    ids, tgt = batch(gcfg["vocab_size"], 2, 16, 4321)
    write(os.path.join(args.out, "lora_gpt2.safetensors"), "lora_gpt2", gcfg, gbase, ["c_attn"], gpt, ids, tgt,
          lambda m, i, t: m(i, t)[1])

    lcfg = dict(vocab_size=97, hidden_size=48, intermediate_size=128, n_layer=2, n_head=6, n_kv_head=2,
                max_position=32, rms_norm_eps=1e-6, rope_theta=10000.0)
    llama = LLaMA(lcfg)
    init_test_weights(llama, 1234)
    lbase = [(n, p.detach().clone()) for n, p in llama.named_parameters()]
    ids, tgt = batch(lcfg["vocab_size"], 2, 12, 7)
    write(os.path.join(args.out, "lora_llama.safetensors"), "lora_llama", lcfg, lbase, ["q_proj", "v_proj"], llama,
          ids, tgt, lambda m, i, t: m(i, t)[1])


if __name__ == "__main__":
    main()
