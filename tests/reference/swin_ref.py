"""Plain-PyTorch reference Swin Transformer (SwinForImageClassification) with Hugging Face's
parameter names and layouts, written from the paper and the structure of HF's modelling code
without importing `transformers`: the oracle for Brigade's models/swin (fixture from
make_swin_fixture.py; parity test tests/models/test_swin.cpp).

Stages i = 0..S-1 at resolution r_i = image/patch/2^i, dim embed_dim*2^i, num_heads[i] heads;
blocks alternate shift 0 / window_size//2, except where r_i <= window_size (then the window is
the whole grid and nothing shifts, HF's set_shift_and_window_size); the shifted-window mask is
HF's get_attn_mask (-100.0 across regions); relative position bias table ((2ws-1)^2, heads)
indexed by the standard relative_position_index (a buffer, not saved); patch merging is
cat(x0, x1, x2, x3) -> LayerNorm(4C) -> Linear(4C, 2C, bias=False); exact GELU; LayerNorm eps
from the config (1e-5); final LayerNorm, mean over tokens, classifier. No dropout / drop path.
No padding: the window must divide every stage's grid.

Command line (used by the C++ test to load Brigade-saved weights):
    /usr/bin/python3 tests/reference/swin_ref.py check --weights W.safetensors \
        --batch B.safetensors [--rtol 1e-5]
  W  tensors by HF name; the config is the JSON in metadata key "config".
  B  "images", "labels", 0-d "loss" (the expected loss).
Prints "loss torch=<x> expected=<y> rel_diff=<d>", exits 0 when within rtol, 1 if not, 2 on bad input.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402


def window_partition(x, ws):  # (B, H, W, C) -> (B*nW, ws, ws, C)
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W):  # (B*nW, ws, ws, C) -> (B, H, W, C)
    C = windows.shape[-1]
    x = windows.view(-1, H // ws, W // ws, ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


def relative_position_index(ws):
    coords = torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij"))  # 2, ws, ws
    flat = torch.flatten(coords, 1)  # 2, N
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()  # N, N, 2
    rel[:, :, 0] += ws - 1
    rel[:, :, 1] += ws - 1
    rel[:, :, 0] *= 2 * ws - 1
    return rel.sum(-1)  # N, N


def shift_mask(H, W, ws, shift, dtype):  # (nW, N, N) of 0 / -100
    img = torch.zeros((1, H, W, 1), dtype=dtype)
    slices = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    cnt = 0
    for h in slices:
        for w in slices:
            img[:, h, w, :] = cnt
            cnt += 1
    mw = window_partition(img, ws).view(-1, ws * ws)
    m = mw.unsqueeze(1) - mw.unsqueeze(2)
    return m.masked_fill(m != 0, -100.0).masked_fill(m == 0, 0.0)


class SwinSelfAttention(nn.Module):
    def __init__(self, dim, heads, ws):
        super().__init__()
        self.heads, self.ws = heads, ws
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1) ** 2, heads))
        self.register_buffer("relative_position_index", relative_position_index(ws), persistent=False)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x, mask=None):  # (B_, N, C)
        B_, N, C = x.shape
        hs = C // self.heads

        def split(t):
            return t.view(B_, N, self.heads, hs).permute(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        s = q @ k.transpose(-1, -2) / math.sqrt(hs)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        s = s + bias.view(N, N, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            s = s.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            s = s.view(-1, self.heads, N, N)
        p = F.softmax(s, dim=-1)
        return (p @ v).permute(0, 2, 1, 3).contiguous().view(B_, N, C)


class Dense(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.dense = nn.Linear(i, o)


class SwinAttention(nn.Module):
    def __init__(self, dim, heads, ws):
        super().__init__()
        self.self = SwinSelfAttention(dim, heads, ws)
        self.output = Dense(dim, dim)


class SwinLayer(nn.Module):
    def __init__(self, c, dim, heads, res, shift):
        super().__init__()
        ws = c["window_size"]
        if res <= ws:
            ws, shift = res, 0
        self.res, self.ws, self.shift = res, ws, shift
        eps = c["layer_norm_eps"]
        self.layernorm_before = nn.LayerNorm(dim, eps=eps)
        self.attention = SwinAttention(dim, heads, ws)
        self.layernorm_after = nn.LayerNorm(dim, eps=eps)
        M = int(c["mlp_ratio"] * dim)
        self.intermediate = Dense(dim, M)
        self.output = Dense(M, dim)

    def forward(self, x):  # (B, L, C)
        B, L, C = x.shape
        H = W = self.res
        h = self.layernorm_before(x).view(B, H, W, C)
        if self.shift > 0:
            h = torch.roll(h, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = window_partition(h, self.ws).view(-1, self.ws * self.ws, C)
        mask = shift_mask(H, W, self.ws, self.shift, x.dtype) if self.shift > 0 else None
        a = self.attention.output.dense(self.attention.self(win, mask))
        back = window_reverse(a.view(-1, self.ws, self.ws, C), self.ws, H, W)
        if self.shift > 0:
            back = torch.roll(back, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + back.view(B, L, C)
        m = F.gelu(self.intermediate.dense(self.layernorm_after(x)))
        return x + self.output.dense(m)


class SwinPatchMerging(nn.Module):
    def __init__(self, dim, res, eps):
        super().__init__()
        self.res = res
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim, eps=eps)

    def forward(self, x):
        B, L, C = x.shape
        x = x.view(B, self.res, self.res, C)
        x0 = x[:, 0::2, 0::2, :]
        x1 = x[:, 1::2, 0::2, :]
        x2 = x[:, 0::2, 1::2, :]
        x3 = x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        res = (c["image_size"] // c["patch_size"]) >> i
        dim = c["embed_dim"] << i
        self.blocks = nn.ModuleList(
            [SwinLayer(c, dim, c["num_heads"][i], res, 0 if j % 2 == 0 else c["window_size"] // 2)
             for j in range(c["depths"][i])])
        self.downsample = SwinPatchMerging(dim, res, c["layer_norm_eps"]) if i + 1 < len(c["depths"]) else None

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.downsample(x) if self.downsample is not None else x


class SwinPatchEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.projection = nn.Conv2d(c["num_channels"], c["embed_dim"], c["patch_size"], stride=c["patch_size"])


class SwinEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.patch_embeddings = SwinPatchEmbeddings(c)
        self.norm = nn.LayerNorm(c["embed_dim"], eps=c["layer_norm_eps"])

    def forward(self, x):
        return self.norm(self.patch_embeddings.projection(x).flatten(2).transpose(1, 2))


class SwinEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layers = nn.ModuleList([SwinStage(c, i) for i in range(len(c["depths"]))])


class SwinModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = SwinEmbeddings(c)
        self.encoder = SwinEncoder(c)
        self.layernorm = nn.LayerNorm(c["embed_dim"] << (len(c["depths"]) - 1), eps=c["layer_norm_eps"])


class SwinForImageClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.swin = SwinModel(c)
        self.classifier = nn.Linear(c["embed_dim"] << (len(c["depths"]) - 1), c["num_labels"])

    def forward(self, images, labels=None):
        x = self.swin.embeddings(images)
        for s in self.swin.encoder.layers:
            x = s(x)
        x = self.swin.layernorm(x).mean(dim=1)
        logits = self.classifier(x)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss


def check_loss(a, config, tensors, batch):
    m = SwinForImageClassification(config).double()
    common.load_named(dict(m.named_parameters()), tensors)
    with torch.no_grad():
        return m(batch["images"].double(), batch["labels"].long())[1]


def main():
    common.check_main("swin_ref", check_loss)


if __name__ == "__main__":
    main()
