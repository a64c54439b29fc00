"""Plain-PyTorch ALIGN (Jia et al. 2021) with Hugging Face AlignModel's parameter and buffer
names (AlignModel.state_dict() keys), the reference for Brigade's ALIGN. Ported by hand from
transformers/models/align/modeling_align.py; no `transformers` import.

Config: a dict in HF AlignConfig layout, {"text_config": {BertConfig fields}, "vision_config":
{AlignVisionConfig (EfficientNet) fields}, "projection_dim": E, "temperature_init_value": t}.

Vision tower (AlignVisionModel, EfficientNet without its top conv):
  embeddings: ZeroPad2d((0, 1, 0, 1)), `convolution` Conv2d(C, round_filters(32), 3, stride 2,
    "valid", no bias), `batchnorm` BatchNorm2d(eps, momentum=batch_norm_momentum), swish.
  encoder.blocks.{i} (MBConv), for stage s and repeat j: in = round_filters(in_channels[s]) (out
    for j > 0), out = round_filters(out_channels[s]), stride = strides[s] if j == 0 else 1,
    id_skip = (j == 0), adjust_padding = (i not in depthwise_padding),
    drop_rate = drop_connect_rate * i / num_blocks; repeats round_repeats(n) = ceil(depth * n).
    expansion (only if expand_ratio != 1): `expand_conv` 1x1 no bias, `expand_bn` BatchNorm2d(eps)
      -- HF passes no momentum here, so torch's default 0.1 applies -- swish.
    depthwise_conv: stride 2: ZeroPad2d(correct_pad(k, adjust)) then a "valid" conv; stride 1:
      padding "same" (symmetric k//2 for odd k). correct_pad(k, True) = (k//2-1, k//2, k//2-1, k//2),
      correct_pad(k, False) = (k//2,) * 4, as (left, right, top, bottom). `depthwise_conv`
      (groups = channels, no bias), `depthwise_norm` BatchNorm2d(eps, momentum), swish.
    squeeze_excite: dim_se = max(1, int(in * squeeze_expansion_ratio)) from the block's INPUT
      channels; global average, `reduce` 1x1 with bias, swish, `expand` 1x1 with bias, sigmoid,
      times the input.
    projection: `project_conv` 1x1 no bias, `project_bn` BatchNorm2d(eps, momentum); if stride == 1
      and not id_skip: Dropout(drop_rate), then + the block input.
  pooler: AvgPool2d(hidden_dim, ceil_mode=True) reshaped to (N, C): the global spatial mean when
    hidden_dim >= the final spatial size (with ceil_mode the one window is clipped to the input).
  Torch BatchNorm momentum m: running = (1 - m) running + m batch_stat (unbiased variance);
  HF's batch_norm_momentum 0.99 is passed through unchanged, as HF does.
Text tower (AlignTextModel = BertModel): word (padding_idx = pad_token_id, default 0: only its
  gradient row is zeroed) + position (0..T-1) + token type (0) embeddings, LayerNorm; post-LN
  encoder layers, exact GELU; additive attention mask (1 - mask) * finfo(dtype).min from
  `lengths` (position < lengths[b] is real). HF's `text_model.pooler` (dense + tanh) is OMITTED:
  AlignModel never uses it (its text feature is last_hidden_state[:, 0, :]); load_named ignores
  `text_model.pooler.*` keys. No dropout in the text tower (configs asking for nonzero
  hidden_dropout_prob / attention_probs_dropout_prob are rejected).
Head: text_embeds = normalize(text_projection(last_hidden_state[:, 0, :])) (Linear with bias);
  image_embeds = normalize(pooled vision output) (no projection); logits_per_text = text @ image.T
  / temperature (0-d parameter), logits_per_image = its transpose; loss = (CE(logits_per_text,
  arange, label_smoothing=0.1) + CE(logits_per_text.T, arange, label_smoothing=0.1)) / 2.

Command line:
    align_ref.py check --weights model.safetensors --batch batch.safetensors [--mode eval|train]
        [--rtol 1e-5]
  weights: parameters and BatchNorm buffers (running_mean, running_var, num_batches_tracked) by
  HF name (strict; text_model.pooler.* ignored), config JSON in __metadata__["config"];
  batch: images, ids, lengths, 0-d loss. Runs in float64 (BatchNorm batch statistics in train
  mode, running statistics in eval mode), prints "loss torch=<x> expected=<y> rel_diff=<d>",
  exits 0 within rtol, 1 if not, 2 on bad input.
    align_ref.py selftest
  checks the depthwise padding against F.pad + F.conv2d, that padding "same" is symmetric for
  odd k at stride 1, and the pooler against a spatial mean.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import st_io  # noqa: E402


def act_fn(name):
    if name in ("swish", "silu"):
        return nn.SiLU()
    if name == "gelu":
        return nn.GELU()  # exact erf form
    raise ValueError(f"unknown hidden_act {name}")


# ---------------------------------------------------------------- vision (EfficientNet)

def round_filters(vc, num_channels):
    divisor = vc["depth_divisor"]
    num_channels *= vc["width_coefficient"]
    new_dim = max(divisor, int(num_channels + divisor / 2) // divisor * divisor)
    if new_dim < 0.9 * num_channels:  # round down by no more than 10%
        new_dim += divisor
    return int(new_dim)


def round_repeats(vc, repeats):
    return int(math.ceil(vc["depth_coefficient"] * repeats))


def correct_pad(kernel_size, adjust=True):
    c = kernel_size // 2
    if adjust:
        return (c - 1, c, c - 1, c)  # (left, right, top, bottom)
    return (c, c, c, c)


def block_specs(vc):
    """The encoder's blocks as dicts, in HF's construction order."""
    num_blocks = sum(round_repeats(vc, n) for n in vc["num_block_repeats"])
    specs = []
    for i in range(len(vc["in_channels"])):
        in_dim = round_filters(vc, vc["in_channels"][i])
        out_dim = round_filters(vc, vc["out_channels"][i])
        for j in range(round_repeats(vc, vc["num_block_repeats"][i])):
            b = len(specs)
            stride = vc["strides"][i] if j == 0 else 1
            in_dim = out_dim if j > 0 else in_dim
            specs.append(dict(in_dim=in_dim, out_dim=out_dim, stride=stride, kernel_size=vc["kernel_sizes"][i],
                              expand_ratio=vc["expand_ratios"][i], id_skip=(j == 0),
                              adjust_padding=b not in vc["depthwise_padding"],
                              drop_rate=vc["drop_connect_rate"] * b / num_blocks))
    return specs


class AlignVisionEmbeddings(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.out_dim = round_filters(vc, 32)
        self.padding = nn.ZeroPad2d(padding=(0, 1, 0, 1))
        self.convolution = nn.Conv2d(vc["num_channels"], self.out_dim, kernel_size=3, stride=2, padding="valid",
                                     bias=False)
        self.batchnorm = nn.BatchNorm2d(self.out_dim, eps=vc["batch_norm_eps"], momentum=vc["batch_norm_momentum"])
        self.activation = act_fn(vc["hidden_act"])

    def forward(self, x):
        return self.activation(self.batchnorm(self.convolution(self.padding(x))))


class AlignVisionExpansionLayer(nn.Module):
    def __init__(self, vc, in_dim, out_dim):
        super().__init__()
        self.expand_conv = nn.Conv2d(in_dim, out_dim, kernel_size=1, padding="same", bias=False)
        self.expand_bn = nn.BatchNorm2d(out_dim, eps=vc["batch_norm_eps"])  # HF: no momentum -> torch's 0.1
        self.expand_act = act_fn(vc["hidden_act"])

    def forward(self, x):
        return self.expand_act(self.expand_bn(self.expand_conv(x)))


class AlignVisionDepthwiseLayer(nn.Module):
    def __init__(self, vc, in_dim, stride, kernel_size, adjust_padding):
        super().__init__()
        self.stride = stride
        conv_pad = "valid" if stride == 2 else "same"
        self.depthwise_conv_pad = nn.ZeroPad2d(padding=correct_pad(kernel_size, adjust=adjust_padding))
        self.depthwise_conv = nn.Conv2d(in_dim, in_dim, kernel_size=kernel_size, stride=stride, padding=conv_pad,
                                        groups=in_dim, bias=False)
        self.depthwise_norm = nn.BatchNorm2d(in_dim, eps=vc["batch_norm_eps"], momentum=vc["batch_norm_momentum"])
        self.depthwise_act = act_fn(vc["hidden_act"])

    def conv(self, x):  # padding + depthwise convolution (what selftest checks)
        if self.stride == 2:
            x = self.depthwise_conv_pad(x)
        return self.depthwise_conv(x)

    def forward(self, x):
        return self.depthwise_act(self.depthwise_norm(self.conv(x)))


class AlignVisionSqueezeExciteLayer(nn.Module):
    def __init__(self, vc, in_dim, expand_dim, expand):
        super().__init__()
        self.dim = expand_dim if expand else in_dim
        self.dim_se = max(1, int(in_dim * vc["squeeze_expansion_ratio"]))
        self.squeeze = nn.AdaptiveAvgPool2d(output_size=1)
        self.reduce = nn.Conv2d(self.dim, self.dim_se, kernel_size=1, padding="same")
        self.expand = nn.Conv2d(self.dim_se, self.dim, kernel_size=1, padding="same")
        self.act_reduce = act_fn(vc["hidden_act"])
        self.act_expand = nn.Sigmoid()

    def forward(self, x):
        s = self.act_expand(self.expand(self.act_reduce(self.reduce(self.squeeze(x)))))
        return torch.mul(x, s)


class AlignVisionFinalBlockLayer(nn.Module):
    def __init__(self, vc, in_dim, out_dim, stride, drop_rate, id_skip):
        super().__init__()
        self.apply_dropout = stride == 1 and not id_skip
        self.project_conv = nn.Conv2d(in_dim, out_dim, kernel_size=1, padding="same", bias=False)
        self.project_bn = nn.BatchNorm2d(out_dim, eps=vc["batch_norm_eps"], momentum=vc["batch_norm_momentum"])
        self.dropout = nn.Dropout(p=drop_rate)

    def forward(self, embeddings, x):
        x = self.project_bn(self.project_conv(x))
        if self.apply_dropout:
            x = self.dropout(x) + embeddings
        return x


class AlignVisionBlock(nn.Module):
    def __init__(self, vc, in_dim, out_dim, stride, expand_ratio, kernel_size, drop_rate, id_skip, adjust_padding):
        super().__init__()
        self.expand_ratio = expand_ratio
        self.expand = expand_ratio != 1
        expand_in_dim = in_dim * expand_ratio
        if self.expand:
            self.expansion = AlignVisionExpansionLayer(vc, in_dim, expand_in_dim)
        dim = expand_in_dim if self.expand else in_dim
        self.depthwise_conv = AlignVisionDepthwiseLayer(vc, dim, stride, kernel_size, adjust_padding)
        self.squeeze_excite = AlignVisionSqueezeExciteLayer(vc, in_dim, expand_in_dim, self.expand)
        self.projection = AlignVisionFinalBlockLayer(vc, dim, out_dim, stride, drop_rate, id_skip)

    def forward(self, x):
        embeddings = x
        if self.expand:
            x = self.expansion(x)
        x = self.squeeze_excite(self.depthwise_conv(x))
        return self.projection(embeddings, x)


class AlignVisionEncoder(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.blocks = nn.ModuleList([AlignVisionBlock(vc, **s) for s in block_specs(vc)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class AlignVisionModel(nn.Module):
    def __init__(self, vc):
        super().__init__()
        self.embeddings = AlignVisionEmbeddings(vc)
        self.encoder = AlignVisionEncoder(vc)
        if vc["pooling_type"] == "mean":
            self.pooler = nn.AvgPool2d(vc["hidden_dim"], ceil_mode=True)
        elif vc["pooling_type"] == "max":
            self.pooler = nn.MaxPool2d(vc["hidden_dim"], ceil_mode=True)
        else:
            raise ValueError(f"pooling_type must be 'mean' or 'max', got {vc['pooling_type']}")

    def forward(self, images):  # -> pooled (N, C)
        p = self.pooler(self.encoder(self.embeddings(images)))
        return p.reshape(p.shape[:2])


# ---------------------------------------------------------------- text (BERT)

class AlignTextEmbeddings(nn.Module):
    def __init__(self, tc):
        super().__init__()
        D = tc["hidden_size"]
        self.word_embeddings = nn.Embedding(tc["vocab_size"], D, padding_idx=tc.get("pad_token_id", 0))
        self.position_embeddings = nn.Embedding(tc["max_position_embeddings"], D)
        self.token_type_embeddings = nn.Embedding(tc["type_vocab_size"], D)
        self.LayerNorm = nn.LayerNorm(D, eps=tc["layer_norm_eps"])

    def forward(self, ids):
        T = ids.shape[1]
        x = self.word_embeddings(ids) + self.token_type_embeddings(torch.zeros_like(ids))
        x = x + self.position_embeddings(torch.arange(T).expand(1, -1))
        return self.LayerNorm(x)


class AlignTextSelfAttention(nn.Module):
    def __init__(self, tc):
        super().__init__()
        D = tc["hidden_size"]
        self.num_attention_heads = tc["num_attention_heads"]
        if D % self.num_attention_heads:
            raise ValueError(f"hidden_size {D} is not a multiple of num_attention_heads {self.num_attention_heads}")
        self.attention_head_size = D // self.num_attention_heads
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D)
        self.value = nn.Linear(D, D)

    def split(self, x):  # (B, T, D) -> (B, H, T, hs)
        B, T, _ = x.shape
        return x.view(B, T, self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(self, x, additive_mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size) + additive_mask
        o = torch.matmul(F.softmax(s, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        return o.view(o.shape[0], o.shape[1], -1)


class AlignTextSelfOutput(nn.Module):
    def __init__(self, tc, d_in):
        super().__init__()
        self.dense = nn.Linear(d_in, tc["hidden_size"])
        self.LayerNorm = nn.LayerNorm(tc["hidden_size"], eps=tc["layer_norm_eps"])

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class AlignTextAttention(nn.Module):
    def __init__(self, tc):
        super().__init__()
        self.self = AlignTextSelfAttention(tc)
        self.output = AlignTextSelfOutput(tc, tc["hidden_size"])

    def forward(self, x, additive_mask):
        return self.output(self.self(x, additive_mask), x)


class AlignTextIntermediate(nn.Module):
    def __init__(self, tc):
        super().__init__()
        self.dense = nn.Linear(tc["hidden_size"], tc["intermediate_size"])
        self.intermediate_act_fn = act_fn(tc["hidden_act"])

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class AlignTextLayer(nn.Module):
    def __init__(self, tc):
        super().__init__()
        self.attention = AlignTextAttention(tc)
        self.intermediate = AlignTextIntermediate(tc)
        self.output = AlignTextSelfOutput(tc, tc["intermediate_size"])  # HF AlignTextOutput: same layout

    def forward(self, x, additive_mask):
        a = self.attention(x, additive_mask)
        return self.output(self.intermediate(a), a)


class AlignTextEncoder(nn.Module):
    def __init__(self, tc):
        super().__init__()
        self.layer = nn.ModuleList([AlignTextLayer(tc) for _ in range(tc["num_hidden_layers"])])

    def forward(self, x, additive_mask):
        for l in self.layer:
            x = l(x, additive_mask)
        return x


class AlignTextModel(nn.Module):
    """HF AlignTextModel without its pooler (unused by AlignModel)."""

    def __init__(self, tc):
        super().__init__()
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if tc.get(k, 0.0) != 0.0:
                raise ValueError(f"text_config.{k} = {tc[k]}: this reference has no dropout")
        self.embeddings = AlignTextEmbeddings(tc)
        self.encoder = AlignTextEncoder(tc)

    def forward(self, ids, lengths):  # -> last_hidden_state (B, T, D)
        x = self.embeddings(ids)
        T = ids.shape[1]
        mask = (torch.arange(T)[None, :] < lengths[:, None]).to(x.dtype)  # 1 = real token
        additive = (1.0 - mask[:, None, None, :]) * torch.finfo(x.dtype).min  # get_extended_attention_mask
        return self.encoder(x, additive)


# ---------------------------------------------------------------- AlignModel

class AlignModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        tc, vc = c["text_config"], c["vision_config"]
        self.text_model = AlignTextModel(tc)
        self.vision_model = AlignVisionModel(vc)
        self.text_projection = nn.Linear(tc["hidden_size"], c["projection_dim"])
        self.temperature = nn.Parameter(torch.tensor(float(c["temperature_init_value"])))

    def forward(self, images, ids, lengths):
        """-> image_embeds (N, E), text_embeds (N, E), logits_per_image (N, N), loss (0-d)."""
        image_embeds = self.vision_model(images)
        text_embeds = self.text_projection(self.text_model(ids, lengths)[:, 0, :])
        image_embeds = image_embeds / image_embeds.norm(p=2, dim=-1, keepdim=True)
        text_embeds = text_embeds / text_embeds.norm(p=2, dim=-1, keepdim=True)
        logits_per_text = torch.matmul(text_embeds, image_embeds.t()) / self.temperature
        labels = torch.arange(logits_per_text.shape[0])
        loss = (F.cross_entropy(logits_per_text, labels, label_smoothing=0.1) +
                F.cross_entropy(logits_per_text.t(), labels, label_smoothing=0.1)) / 2.0
        return image_embeds, text_embeds, logits_per_text.t(), loss


def load_named(model, tensors):
    """Copies parameters and buffers by HF name (strict; text_model.pooler.* ignored), keeping
    the model's dtypes (float buffers follow the model's float dtype, num_batches_tracked int64)."""
    common.load_named(model.state_dict(keep_vars=True), tensors,
                      ignored=lambda name: name.startswith("text_model.pooler."))


# ---------------------------------------------------------------- self-test

def selftest(verbose=True):
    """Independent checks of the pieces a fixture could get self-consistently wrong."""
    torch.manual_seed(0)
    d = torch.float64
    # stride-2 depthwise: module (ZeroPad2d + "valid" conv) == F.pad(explicit (l, r, t, b)) + F.conv2d
    for k, adjust, H in ((5, True, 8), (3, False, 4), (3, True, 7), (5, False, 9)):
        C = 3
        vc = dict(batch_norm_eps=1e-3, batch_norm_momentum=0.99, hidden_act="swish")
        layer = AlignVisionDepthwiseLayer(vc, C, 2, k, adjust).to(d)
        x = torch.randn(2, C, H, H, dtype=d)
        pad = (k // 2 - 1, k // 2, k // 2 - 1, k // 2) if adjust else (k // 2,) * 4
        want = F.conv2d(F.pad(x, pad), layer.depthwise_conv.weight, stride=2, groups=C)
        got = layer.conv(x)
        assert got.shape == want.shape and torch.equal(got, want), f"depthwise k{k} adjust={adjust}: mismatch"
        if verbose:
            print(f"selftest: stride-2 depthwise k{k} adjust={adjust} pad(l,r,t,b)={pad}: "
                  f"{tuple(x.shape[2:])} -> {tuple(got.shape[2:])} matches F.pad + F.conv2d")
    # stride 1: padding "same" is symmetric k//2 on every side for odd k
    for k in (3, 5):
        C = 4
        vc = dict(batch_norm_eps=1e-3, batch_norm_momentum=0.99, hidden_act="swish")
        layer = AlignVisionDepthwiseLayer(vc, C, 1, k, True).to(d)
        x = torch.randn(2, C, 6, 6, dtype=d)
        want = F.conv2d(F.pad(x, (k // 2,) * 4), layer.depthwise_conv.weight, groups=C)
        got = layer.conv(x)
        assert got.shape == x.shape and torch.equal(got, want), f"same k{k}: mismatch"
        lopsided = F.conv2d(F.pad(x, (k // 2 - 1, k // 2 + 1, k // 2 - 1, k // 2 + 1)), layer.depthwise_conv.weight,
                            groups=C)
        assert not torch.allclose(got, lopsided), "test has no power: lopsided padding gives the same result"
        if verbose:
            print(f"selftest: stride-1 depthwise k{k} padding='same' == symmetric F.pad {(k // 2,) * 4} + F.conv2d")
    # pooler: AvgPool2d(hidden_dim, ceil_mode=True) is the spatial mean for inputs up to hidden_dim
    for S in (1, 2, 3, 7):
        x = torch.randn(2, 5, S, S, dtype=d)
        p = nn.AvgPool2d(64, ceil_mode=True)(x)
        assert p.shape == (2, 5, 1, 1) and torch.allclose(p.reshape(2, 5), x.mean((2, 3)), rtol=1e-14, atol=1e-15)
    if verbose:
        print("selftest: AvgPool2d(64, ceil_mode=True) == spatial mean for 1x1 .. 7x7")
        print("selftest: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["check", "selftest"])
    ap.add_argument("--weights")
    ap.add_argument("--batch")
    ap.add_argument("--mode", choices=["eval", "train"], default="eval")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "selftest":
        selftest()
        return
    if not a.weights or not a.batch:
        print("align_ref: check needs --weights and --batch", file=sys.stderr)
        sys.exit(2)
    try:
        tensors, meta = st_io.load(a.weights)
        batch, _ = st_io.load(a.batch)
        m = AlignModel(json.loads(meta["config"])).double()
        load_named(m, tensors)
        m.train(a.mode == "train")
        with torch.no_grad():
            _, _, _, loss = m(batch["images"].double(), batch["ids"].long(), batch["lengths"].long())
        want = float(batch["loss"])
    except (KeyError, ValueError, OSError) as e:
        print(f"align_ref: {e}", file=sys.stderr)
        sys.exit(2)
    got = float(loss)
    d = abs(got - want) / max(abs(want), 1e-30)
    print(f"loss torch={got:.9g} expected={want:.9g} rel_diff={d:.3g}")
    if d > a.rtol:
        print(f"align_ref: loss differs by a relative {d:.3g} > rtol {a.rtol:g} ({a.mode} mode)", file=sys.stderr)
    sys.exit(0 if d <= a.rtol else 1)


if __name__ == "__main__":
    main()
