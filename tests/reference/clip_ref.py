"""Plain-PyTorch CLIP (Radford et al. 2021) with Hugging Face CLIPModel's parameter names, the
reference for Brigade's models::CLIP (src/brigade/models/clip/clip.h). No `transformers` import.

Structure (HF CLIPModel): text_model (token + learned position embeddings, pre-LN causal
encoder, final_layer_norm, pooled at the end-of-text position), vision_model (Conv2d patch
embedding without bias, class_embedding, learned position embedding, pre_layrnorm, pre-LN
encoder, CLS token through post_layernorm), visual_projection / text_projection (no bias),
logit_scale (0-d). Activation quick_gelu x * sigmoid(1.702 x) (or exact "gelu").
Pooling rule (Brigade's): the text feature is taken at position lengths[b] - 1, the last
non-padding token (the end-of-text token of data/image/captions.h, which is also the largest
id, so HF's legacy argmax(input_ids) rule picks the same position).

Usage as a checker of Brigade-saved weights:
    clip_ref.py check --weights model.safetensors --batch batch.safetensors
(batch: images, ids, lengths, loss; config in the weights' __metadata__["config"]).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def act_fn(name):
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu
    raise ValueError(f"unknown hidden_act {name}")


class CLIPAttention(nn.Module):
    def __init__(self, D, n_head):
        super().__init__()
        self.n_head = n_head
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.q_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    def forward(self, x, causal):
        B, T, D = x.shape
        H = self.n_head
        hs = D // H
        q = (self.q_proj(x) * hs ** -0.5).view(B, T, H, hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, H, hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, hs).transpose(1, 2)
        s = q @ k.transpose(-1, -2)  # (B, H, T, T)
        if causal:
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        o = torch.softmax(s, dim=-1) @ v
        return self.out_proj(o.transpose(1, 2).reshape(B, T, D))


class CLIPMLP(nn.Module):
    def __init__(self, D, M, act):
        super().__init__()
        self.act = act_fn(act)
        self.fc1 = nn.Linear(D, M)
        self.fc2 = nn.Linear(M, D)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, c, act):
        super().__init__()
        D = c["hidden_size"]
        self.self_attn = CLIPAttention(D, c["num_attention_heads"])
        self.layer_norm1 = nn.LayerNorm(D, eps=c["layer_norm_eps"])
        self.mlp = CLIPMLP(D, c["intermediate_size"], act)
        self.layer_norm2 = nn.LayerNorm(D, eps=c["layer_norm_eps"])

    def forward(self, x, causal):
        x = x + self.self_attn(self.layer_norm1(x), causal)
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, c, act):
        super().__init__()
        self.layers = nn.ModuleList([CLIPEncoderLayer(c, act) for _ in range(c["num_hidden_layers"])])

    def forward(self, x, causal):
        for l in self.layers:
            x = l(x, causal)
        return x


class CLIPTextEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.token_embedding = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embedding = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])

    def forward(self, ids):
        T = ids.shape[1]
        return self.token_embedding(ids) + self.position_embedding.weight[:T]


class CLIPTextTransformer(nn.Module):
    def __init__(self, c, act):
        super().__init__()
        self.embeddings = CLIPTextEmbeddings(c)
        self.encoder = CLIPEncoder(c, act)
        self.final_layer_norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, ids, lengths):
        x = self.final_layer_norm(self.encoder(self.embeddings(ids), causal=True))
        return x[torch.arange(x.shape[0]), lengths.long() - 1]  # (M, D)


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, p = c["hidden_size"], c["patch_size"]
        self.class_embedding = nn.Parameter(torch.zeros(D))
        self.patch_embedding = nn.Conv2d(c["num_channels"], D, kernel_size=p, stride=p, bias=False)
        P = (c["image_size"] // p) ** 2
        self.position_embedding = nn.Embedding(P + 1, D)

    def forward(self, images):
        p = self.patch_embedding(images).flatten(2).transpose(1, 2)  # (N, P, D)
        cls = self.class_embedding.expand(p.shape[0], 1, -1)
        return torch.cat([cls, p], dim=1) + self.position_embedding.weight


class CLIPVisionTransformer(nn.Module):
    def __init__(self, c, act):
        super().__init__()
        D = c["hidden_size"]
        self.embeddings = CLIPVisionEmbeddings(c)
        self.pre_layrnorm = nn.LayerNorm(D, eps=c["layer_norm_eps"])
        self.encoder = CLIPEncoder(c, act)
        self.post_layernorm = nn.LayerNorm(D, eps=c["layer_norm_eps"])

    def forward(self, images):
        x = self.encoder(self.pre_layrnorm(self.embeddings(images)), causal=False)
        return self.post_layernorm(x[:, 0, :])  # (N, D)


class CLIPModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        t, v, E = c["text_config"], c["vision_config"], c["projection_dim"]
        self.text_model = CLIPTextTransformer(t, c["hidden_act"])
        self.vision_model = CLIPVisionTransformer(v, c["hidden_act"])
        self.visual_projection = nn.Linear(v["hidden_size"], E, bias=False)
        self.text_projection = nn.Linear(t["hidden_size"], E, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(c["logit_scale_init_value"]))

    def encode_image(self, images):
        e = self.visual_projection(self.vision_model(images))
        return e / e.norm(p=2, dim=-1, keepdim=True)

    def encode_text(self, ids, lengths):
        e = self.text_projection(self.text_model(ids, lengths))
        return e / e.norm(p=2, dim=-1, keepdim=True)

    def forward(self, images, ids, lengths):
        """-> image embeds (N, E), text embeds (N, E), logits_per_image (N, N), loss (0-d)."""
        img, txt = self.encode_image(images), self.encode_text(ids, lengths)
        logits = self.logit_scale.exp() * img @ txt.t()
        labels = torch.arange(logits.shape[0])
        loss = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))
        return img, txt, logits, loss


def init_weights(model, seed):
    """Brigade's CLIP::init_weights: torch.manual_seed(seed), then over named_parameters in
    order: biases 0, LayerNorm weights 1, logit_scale = logit_scale_init_value, the rest
    normal_(0, std) with HF CLIPPreTrainedModel's stds (factor 1): embeddings (token, position)
    and patch_embedding 0.02; class_embedding D^-0.5; q/k/v_proj D^-0.5 (2 L)^-0.5; out_proj
    D^-0.5; fc1 (2 D)^-0.5; fc2 D^-0.5 (2 L)^-0.5; visual/text_projection D_tower^-0.5."""
    c = model.config
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            tower = c["text_config"] if name.startswith("text_") else c["vision_config"]
            D, L = tower["hidden_size"], tower["num_hidden_layers"]
            if name == "logit_scale":
                p.fill_(c["logit_scale_init_value"])
            elif name.endswith(".bias"):
                p.zero_()
            elif "layer_norm" in name or "layrnorm" in name or "layernorm" in name:
                p.fill_(1.0)
            else:
                if "class_embedding" in name:
                    std = D ** -0.5
                elif "embedding" in name:
                    std = c["initializer_range"]
                elif any(k in name for k in ("q_proj", "k_proj", "v_proj", "fc2")):
                    std = D ** -0.5 * (2 * L) ** -0.5
                elif "out_proj" in name:
                    std = D ** -0.5
                elif "fc1" in name:
                    std = (2 * D) ** -0.5
                else:  # projections
                    std = D ** -0.5
                p.normal_(0.0, std)


def check_loss(a, config, tensors, batch):
    m = CLIPModel(config)
    common.load_named(dict(m.named_parameters()), tensors)
    with torch.no_grad():
        return m(batch["images"].float(), batch["ids"].long(), batch["lengths"].long())[3]


def main():
    common.check_main("clip_ref", check_loss)


if __name__ == "__main__":
    main()
