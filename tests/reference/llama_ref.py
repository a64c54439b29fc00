"""Plain-PyTorch LLaMA (Touvron et al. 2023), the reference for Brigade's models::LLaMA.

Written from the Hugging Face LlamaForCausalLM description without importing transformers;
the module tree gives exactly HF's parameter names:
  model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
  model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.input_layernorm.weight,
  model.layers.{i}.post_attention_layernorm.weight, model.norm.weight, lm_head.weight
(torch Linear layout (out, in), no biases; with cfg["tie_word_embeddings"] there is no
lm_head and the logits are norm(x) @ embed_tokens.weight^T). RMSNorm, rotary embeddings with
rotate_half, grouped-query attention with repeat_kv, SwiGLU MLP, causal softmax attention.
cfg["rope_scaling"] (optional) is HF's LlamaConfig.rope_scaling dict: None, rope_type (or the
legacy "type") "default", "linear" (inv_freq / factor) or "llama3" (Llama 3.1's blend by
wavelength, from the formula of transformers' _compute_llama3_parameters), see scaled_inv_freq.
Runs in whatever dtype the parameters have (the fixture uses float64 for its oracle values).

As a script, checks a Brigade-written model.safetensors against an expected loss:
    /usr/bin/python3 tests/reference/llama_ref.py --model MODEL.safetensors --batch BATCH.safetensors
  MODEL  tensors by HF name (F32/BF16/F16, widened to float64 here); __metadata__ "config" holds
         the JSON LLaMAConfig (vocab_size, hidden_size, intermediate_size, n_layer, n_head,
         n_kv_head, max_position, rms_norm_eps, rope_theta); BATCH holds integer (B, T) "ids",
         "targets" and a 0-d "loss". Prints "loss torch=<x> expected=<y> rel_diff=<d>", exits 0 when
         |x - y| <= rtol |y| (--rtol, default 1e-5), 1 when not, 2 when the inputs are unusable.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "n_layer", "n_head", "n_kv_head",
               "max_position", "rms_norm_eps", "rope_theta")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def scaled_inv_freq(inv_freq, rope_scaling):
    """HF's rope_scaling applied to the unscaled inverse frequencies (HS/2)."""
    if rope_scaling is None:
        return inv_freq
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind == "default":
        return inv_freq
    factor = float(rope_scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        lo, hi = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
        L = float(rope_scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (L / wavelen - lo) / (hi - lo)
        medium = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        out = torch.where(wavelen > L / lo, inv_freq / factor, medium)  # long wavelengths: interpolated
        return torch.where(wavelen < L / hi, inv_freq, out)             # short ones: kept
    raise ValueError(f"rope_scaling type {kind!r} is not implemented in this reference")


def rope_cos_sin(T, HS, theta, dtype, rope_scaling=None):
    inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=dtype) / HS))  # (HS/2)
    inv_freq = scaled_inv_freq(inv_freq, rope_scaling)
    t = torch.arange(T, dtype=dtype)
    freqs = torch.outer(t, inv_freq)            # (T, HS/2)
    emb = torch.cat((freqs, freqs), dim=-1)     # (T, HS)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    B, NKV, T, HS = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, NKV, n_rep, T, HS).reshape(B, NKV * n_rep, T, HS)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, self.nh, self.nkv = cfg["hidden_size"], cfg["n_head"], cfg["n_kv_head"]
        self.hs = C // self.nh
        self.theta = cfg["rope_theta"]
        self.rope_scaling = cfg.get("rope_scaling")
        self.q_proj = nn.Linear(C, self.nh * self.hs, bias=False)
        self.k_proj = nn.Linear(C, self.nkv * self.hs, bias=False)
        self.v_proj = nn.Linear(C, self.nkv * self.hs, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hs, C, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hs).transpose(1, 2)
        cos, sin = rope_cos_sin(T, self.hs, self.theta, x.dtype, self.rope_scaling)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.nh // self.nkv), repeat_kv(v, self.nh // self.nkv)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hs)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["n_layer"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LLaMA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg["hidden_size"] % cfg["n_head"] == 0 and cfg["n_head"] % cfg["n_kv_head"] == 0
        self.cfg = dict(cfg)
        self.model = Model(cfg)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, ids, targets=None):
        """ids (B, T) -> logits (B, T, V), and the mean cross-entropy when targets are given."""
        assert ids.shape[1] <= self.cfg["max_position"]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        h = self.model.norm(x)
        logits = h @ self.model.embed_tokens.weight.t() if self.tied else self.lm_head(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def init_test_weights(model, seed):
    """The fixtures' weights: torch.manual_seed(seed), then in named_parameters() order 1-d
    1 + normal_(0, 0.1), embed_tokens normal_(0, 0.5), other 2-d normal_(0, 0.08)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + torch.empty_like(p).normal_(0.0, 0.1))
            else:
                p.normal_(0.0, 0.5 if n == "model.embed_tokens.weight" else 0.08)


def fail(msg):
    print(f"llama_ref: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import st_io  # noqa: E402

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    try:
        params, meta = st_io.load(args.model)
        batch, _ = st_io.load(args.batch)
        cfg = json.loads(meta["config"])
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read input (needs a 'config' JSON in the model's metadata): {e}")
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        fail(f"{args.model}: config lacks {missing}")
    for k in ("ids", "targets", "loss"):
        if k not in batch:
            fail(f"{args.batch}: no tensor '{k}'")
    model = LLaMA(cfg).double()
    want = dict(model.named_parameters())
    if set(want) != set(params):
        fail(f"parameter names differ: missing {sorted(set(want) - set(params))}, "
             f"unexpected {sorted(set(params) - set(want))}")
    with torch.no_grad():
        for n, p in want.items():
            if tuple(params[n].shape) != tuple(p.shape):
                fail(f"{n}: shape {tuple(params[n].shape)}, expected {tuple(p.shape)}")
            p.copy_(params[n].double())
        _, loss = model(batch["ids"].long(), batch["targets"].long())
    x, y = loss.item(), float(batch["loss"].double().item())
    d = abs(x - y) / max(abs(y), 1e-30)
    print(f"loss torch={x:.9g} expected={y:.9g} rel_diff={d:.3g}")
    sys.exit(0 if d <= args.rtol else 1)


if __name__ == "__main__":
    main()
