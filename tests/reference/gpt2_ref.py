"""GPT-2 reference in plain PyTorch (no `transformers`), with Hugging Face parameter
names and layouts, and the torch-identical initialisation that Brigade reproduces.

Names: transformer.wte.weight (V,C), transformer.wpe.weight (block_size,C),
transformer.h.{i}.ln_1.{weight,bias}, .attn.c_attn.{weight (C,3C), bias},
.attn.c_proj.{weight (C,C), bias}, .ln_2.*, .mlp.c_fc.{weight (C,4C), bias},
.mlp.c_proj.{weight (4C,C), bias}, transformer.ln_f.*. Conv1D layout (in, out):
y = x @ W + b. lm_head is tied to wte (logits = x @ wte^T). Dropout 0.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    """HF Conv1D: weight (in, out); y = addmm(b, x, W)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        size_out = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(size_out)


class LayerNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Attention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        NH = self.n_head
        HS = C // NH
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q = q.view(B, T, NH, HS).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HS)  # (B, NH, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v)  # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head, eps):
        super().__init__()
        self.ln_1 = LayerNorm(C, eps)
        self.attn = Attention(C, n_head)
        self.ln_2 = LayerNorm(C, eps)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, layer_norm_eps=1e-5):
        super().__init__()
        self.config = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, layer_norm_eps=layer_norm_eps)
        C = n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, C),
            wpe=nn.Embedding(block_size, C),
            h=nn.ModuleList([Block(C, n_head, layer_norm_eps) for _ in range(n_layer)]),
            ln_f=LayerNorm(C, layer_norm_eps),
        ))

    def init_weights(self, seed):
        """torch.manual_seed(seed), then normal_ fills in exactly this order on the
        default generator (contiguous f32, HF layout); LayerNorm 1/0 and biases 0."""
        n_layer = self.config["n_layer"]
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        t = self.transformer
        torch.manual_seed(seed)
        with torch.no_grad():
            t.wte.weight.normal_(0.0, 0.02)
            t.wpe.weight.normal_(0.0, 0.02)
            for blk in t.h:
                blk.ln_1.weight.fill_(1.0); blk.ln_1.bias.zero_()
                blk.attn.c_attn.weight.normal_(0.0, 0.02); blk.attn.c_attn.bias.zero_()
                blk.attn.c_proj.weight.normal_(0.0, proj_std); blk.attn.c_proj.bias.zero_()
                blk.ln_2.weight.fill_(1.0); blk.ln_2.bias.zero_()
                blk.mlp.c_fc.weight.normal_(0.0, 0.02); blk.mlp.c_fc.bias.zero_()
                blk.mlp.c_proj.weight.normal_(0.0, proj_std); blk.mlp.c_proj.bias.zero_()
            t.ln_f.weight.fill_(1.0); t.ln_f.bias.zero_()

    def forward(self, ids, targets=None):
        B, T = ids.shape
        t = self.transformer
        assert T <= self.config["block_size"], (T, self.config["block_size"])
        x = t.wte(ids) + t.wpe(torch.arange(T))  # (B, T, C)
        for blk in t.h:
            x = blk(x)
        x = t.ln_f(x)
        logits = F.linear(x, t.wte.weight)  # (B, T, V), lm_head tied to wte
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def load_named(self, tensors, where="checkpoint"):
        """Copies tensors (HF names -> tensor) into the model, checking names and shapes.
        lm_head.weight, if present, must equal wte (tied)."""
        params = dict(self.named_parameters())
        missing = [n for n in params if n not in tensors]
        extra = [n for n in tensors if n not in params and n != "lm_head.weight"]
        if missing or extra:
            raise ValueError(f"{where}: missing {missing[:5]} unexpected {extra[:5]}")
        with torch.no_grad():
            for n, p in params.items():
                src = tensors[n]
                if tuple(src.shape) != tuple(p.shape):
                    raise ValueError(f"{where}: {n} has shape {tuple(src.shape)}, the HF layout is {tuple(p.shape)}")
                p.copy_(src.to(torch.float32))
            if "lm_head.weight" in tensors and not torch.equal(tensors["lm_head.weight"].float(), params["transformer.wte.weight"]):
                raise ValueError(f"{where}: lm_head.weight differs from transformer.wte.weight (GPT-2 ties them)")


def config_from_tensors(tensors, n_head):
    V, C = tensors["transformer.wte.weight"].shape
    block_size = tensors["transformer.wpe.weight"].shape[0]
    n_layer = 0
    while f"transformer.h.{n_layer}.ln_1.weight" in tensors:
        n_layer += 1
    return dict(vocab_size=V, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=C)
