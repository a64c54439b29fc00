"""Plain-PyTorch reference ViT (ViTForImageClassification) and BERT (BertForMaskedLM) with
Hugging Face's parameter names and layouts, written from the papers and HF's modelling code's
structure without importing `transformers`: the oracle for Brigade's models/vit and models/bert
(fixtures from make_encoder_fixtures.py; parity tests tests/models/test_{vit,bert}.cpp).

ViT: pre-LN encoder, exact GELU, LayerNorm eps from the config (1e-12), Conv2d patch projection,
classifier on the final-LayerNorm CLS token. BERT: post-LN encoder, exact GELU, position ids
0..T-1, token type ids (0 by default), the MLM head (dense, GELU, LayerNorm) and a decoder tied
to word_embeddings plus cls.predictions.bias; the attention mask is added as HF does,
(1 - mask) * finfo(float32).min. No dropout anywhere (parity runs use 0).

Initialisation `init_weights(model, seed)`: torch.manual_seed(seed), then over named_parameters()
in order: LayerNorm weights 1, biases 0, everything else normal_(0, std). Brigade's
ViT/BERT::init_weights draw the same values bit for bit.

Command line (used by the C++ tests to load Brigade-saved weights):
    /usr/bin/python3 tests/reference/encoder_ref.py check --model vit|bert \
        --weights W.safetensors --batch B.safetensors [--rtol 1e-5]
  W      tensors by HF name; the config is the JSON in metadata key "config".
  B      vit: "images", "labels"; bert: "ids", "labels", "attention_mask", optional
         "token_type_ids"; both: 0-d "loss", the expected loss.
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


def split_heads(x, n_head):  # (B, T, D) -> (B, NH, T, HS)
    B, T, D = x.shape
    return x.view(B, T, n_head, D // n_head).transpose(1, 2)


def attention(q, k, v, additive_mask=None):  # (B, NH, T, HS) -> (B, NH, T, HS)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if additive_mask is not None:
        s = s + additive_mask
    return torch.softmax(s, dim=-1) @ v


class SelfAttention(nn.Module):  # HF ViTSelfAttention / BertSelfAttention
    def __init__(self, D, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D)
        self.value = nn.Linear(D, D)

    def forward(self, x, additive_mask=None):
        q, k, v = (split_heads(f(x), self.n_head) for f in (self.query, self.key, self.value))
        o = attention(q, k, v, additive_mask)
        B, NH, T, HS = o.shape
        return o.transpose(1, 2).reshape(B, T, NH * HS)


class Dense(nn.Module):  # a module holding one Linear called "dense"
    def __init__(self, i, o):
        super().__init__()
        self.dense = nn.Linear(i, o)


# ---------------------------------------------------------------- ViT

class ViTAttention(nn.Module):
    def __init__(self, D, n_head):
        super().__init__()
        self.attention = SelfAttention(D, n_head)
        self.output = Dense(D, D)


class ViTLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, M, eps = c["hidden_size"], c["intermediate_size"], c["layer_norm_eps"]
        self.attention = ViTAttention(D, c["num_attention_heads"])
        self.intermediate = Dense(D, M)
        self.output = Dense(M, D)
        self.layernorm_before = nn.LayerNorm(D, eps=eps)
        self.layernorm_after = nn.LayerNorm(D, eps=eps)

    def forward(self, x):
        x = x + self.attention.output.dense(self.attention.attention(self.layernorm_before(x)))
        h = F.gelu(self.intermediate.dense(self.layernorm_after(x)))
        return x + self.output.dense(h)


class ViTPatchEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        p = c["patch_size"]
        self.projection = nn.Conv2d(c["num_channels"], c["hidden_size"], kernel_size=p, stride=p)

    def forward(self, x):  # (N, C, H, W) -> (N, P, D)
        return self.projection(x).flatten(2).transpose(1, 2)


class ViTEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        D = c["hidden_size"]
        P = (c["image_size"] // c["patch_size"]) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.patch_embeddings = ViTPatchEmbeddings(c)
        self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + P, D))

    def forward(self, x):
        p = self.patch_embeddings(x)
        cls = self.cls_token.expand(p.shape[0], -1, -1)
        return torch.cat([cls, p], dim=1) + self.position_embeddings


class ViTEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([ViTLayer(c) for _ in range(c["num_hidden_layers"])])


class ViTModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = ViTEmbeddings(c)
        self.encoder = ViTEncoder(c)
        self.layernorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, x):
        x = self.embeddings(x)
        for l in self.encoder.layer:
            x = l(x)
        return self.layernorm(x)


class ViTForImageClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        self.vit = ViTModel(c)
        self.classifier = nn.Linear(c["hidden_size"], c["num_labels"])

    def forward(self, images, labels=None):
        logits = self.classifier(self.vit(images)[:, 0, :])
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss


# ---------------------------------------------------------------- BERT

class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        D = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], D)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], D)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], D)
        self.LayerNorm = nn.LayerNorm(D, eps=c["layer_norm_eps"])

    def forward(self, ids, token_type_ids=None):
        T = ids.shape[1]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        x = self.word_embeddings(ids) + self.position_embeddings(torch.arange(T)) + \
            self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class BertSelfOutput(nn.Module):
    def __init__(self, D, eps):
        super().__init__()
        self.dense = nn.Linear(D, D)
        self.LayerNorm = nn.LayerNorm(D, eps=eps)


class BertAttention(nn.Module):
    def __init__(self, D, n_head, eps):
        super().__init__()
        self.self = SelfAttention(D, n_head)
        self.output = BertSelfOutput(D, eps)

    def forward(self, x, additive_mask):
        return self.output.LayerNorm(x + self.output.dense(self.self(x, additive_mask)))


class BertOutput(nn.Module):
    def __init__(self, M, D, eps):
        super().__init__()
        self.dense = nn.Linear(M, D)
        self.LayerNorm = nn.LayerNorm(D, eps=eps)


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, M, eps = c["hidden_size"], c["intermediate_size"], c["layer_norm_eps"]
        self.attention = BertAttention(D, c["num_attention_heads"], eps)
        self.intermediate = Dense(D, M)
        self.output = BertOutput(M, D, eps)

    def forward(self, x, additive_mask):
        x = self.attention(x, additive_mask)
        h = F.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(h))


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c["num_hidden_layers"])])


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)

    def forward(self, ids, attention_mask=None, token_type_ids=None):
        x = self.embeddings(ids, token_type_ids)
        additive = None
        if attention_mask is not None:  # HF's get_extended_attention_mask
            additive = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for l in self.encoder.layer:
            x = l(x, additive)
        return x


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, D, eps):
        super().__init__()
        self.dense = nn.Linear(D, D)
        self.LayerNorm = nn.LayerNorm(D, eps=eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c["hidden_size"], c["layer_norm_eps"])
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        self.bert = BertModel(c)
        self.cls = BertOnlyMLMHead(c)

    def forward(self, ids, attention_mask=None, token_type_ids=None, labels=None):
        h = self.cls.predictions.transform(self.bert(ids, attention_mask, token_type_ids))
        # decoder tied to the word embeddings
        logits = F.linear(h, self.bert.embeddings.word_embeddings.weight, self.cls.predictions.bias)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        return logits, loss


# ---------------------------------------------------------------- init, loading, check

def init_weights(model, seed, std=0.02):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "layernorm" in name.lower():
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)


def load_named(model, tensors):
    """Copies tensors (name -> tensor, any float dtype) into the (float32) model by HF name; every
    parameter must be present; extra names other than a tied decoder weight are an error."""
    common.load_named(dict(model.named_parameters()), tensors,
                      ignored=lambda name: name == "cls.predictions.decoder.weight")


def check_loss(a, cfg, tensors, batch):
    if a.model == "vit":
        m = ViTForImageClassification(cfg)
        load_named(m, tensors)
        _, loss = m(batch["images"].float(), batch["labels"].long())
    else:
        m = BertForMaskedLM(cfg)
        load_named(m, tensors)
        _, loss = m(batch["ids"].long(), batch["attention_mask"], batch.get("token_type_ids"), batch["labels"].long())
    return loss


def main():
    common.check_main("encoder_ref", check_loss,
                      add_args=lambda ap: ap.add_argument("--model", choices=["vit", "bert"], required=True))


if __name__ == "__main__":
    main()
