"""Plain-PyTorch Flamingo (Alayrac et al. 2022) with IDEFICS's layout and OpenFlamingo's media
masking, the reference for Brigade's models::Flamingo (src/brigade/models/flamingo/flamingo.h,
which documents the names and their IDEFICS / OpenFlamingo counterparts). No `transformers`,
`open_flamingo` or `einops` import; the CLIP vision tower is clip_ref's, the GPT-2 blocks gpt2_ref's.

Structure:
  vision_model (clip_ref.CLIPVisionTransformer, frozen): visual tokens = the last encoder layer's
    output for all 1 + P tokens, no post_layernorm (HF last_hidden_state, as IDEFICS).
  perceiver_resampler (IDEFICS IdeficsPerceiverResampler): latents repeated per image; per block
    latents += attn(context, latents) (LayerNorms on both, q from latents, k/v from
    cat(context, latents), no biases), latents += mlp(latents) (ln, fc, gelu|relu, c_proj, no
    biases); final layer_norm.
  transformer (GPT-2, gpt2_ref names, frozen) with wte an IDEFICS DecoupledEmbedding: ids >= V
    read additional_embedding (trainable); the tied head is [x wte^T | x additional^T].
  gated_cross_attn_layers.{j} before LM layer j * n: x += tanh(alpha_cross_attn) *
    xattn(input_layernorm(x)); x += tanh(alpha_dense) * mlp(post_attention_layernorm(x)).
  media mask (OpenFlamingo MaskedCrossAttention): text_time = cumsum(ids == <image>); a token
    attends to image text_time (immediate) or images <= text_time; masked scores get
    -finfo.max, and tokens with text_time 0 have their attention zeroed in both modes.
Images: one per <image> token of ids, in row-major order.

Usage as a checker of Brigade-saved weights:
    flamingo_ref.py check --weights model.safetensors --batch batch.safetensors
(batch: images, ids, targets, loss; config in the weights' __metadata__["config"]).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from clip_ref import CLIPVisionTransformer  # noqa: E402
from gpt2_ref import Block, LayerNorm  # noqa: E402


class FlamingoMLP(nn.Module):
    """IDEFICS IdeficsMLP names (ln, fc, c_proj), OpenFlamingo FeedForward math, no biases."""

    def __init__(self, D, M, act, with_ln, eps):
        super().__init__()
        if with_ln:
            self.ln = nn.LayerNorm(D, eps=eps)
        self.with_ln = with_ln
        self.fc = nn.Linear(D, M, bias=False)
        self.c_proj = nn.Linear(M, D, bias=False)
        self.act = {"gelu": F.gelu, "relu": F.relu}[act]

    def forward(self, x):
        if self.with_ln:
            x = self.ln(x)
        return self.c_proj(self.act(self.fc(x)))


class PerceiverAttention(nn.Module):
    """IDEFICS IdeficsPerceiverAttention (qk_layer_norms off)."""

    def __init__(self, D, n_heads, head_dim, eps):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.context_layer_norm = nn.LayerNorm(D, eps=eps)
        self.latents_layer_norm = nn.LayerNorm(D, eps=eps)
        inner = n_heads * head_dim
        self.q_proj = nn.Linear(D, inner, bias=False)
        self.k_proj = nn.Linear(D, inner, bias=False)
        self.v_proj = nn.Linear(D, inner, bias=False)
        self.output_proj = nn.Linear(inner, D, bias=False)

    def forward(self, context, latents):
        context = self.context_layer_norm(context)
        latents = self.latents_layer_norm(latents)
        N = context.shape[0]
        q = self.q_proj(latents)
        k = self.k_proj(torch.cat([context, latents], dim=-2))
        v = self.v_proj(torch.cat([context, latents], dim=-2))
        q, k, v = [x.reshape(N, x.shape[1], self.n_heads, self.head_dim).transpose(1, 2) for x in (q, k, v)]
        scores = torch.einsum("... i d, ... j d -> ... i j", q * self.head_dim ** -0.5, k)
        attn = (scores - scores.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
        out = torch.einsum("... i j, ... j d -> ... i d", attn, v)
        return self.output_proj(out.transpose(1, 2).flatten(-2))


class PerceiverResampler(nn.Module):
    def __init__(self, c):
        super().__init__()
        D = c["vision_config"]["hidden_size"]
        eps = c["layer_norm_eps"]
        self.latents = nn.Parameter(torch.zeros(c["resampler_n_latents"], D))
        self.blocks = nn.ModuleList([
            nn.ModuleList([PerceiverAttention(D, c["resampler_n_heads"], c["resampler_head_dim"], eps),
                           FlamingoMLP(D, c["resampler_ff_mult"] * D, c["ff_act"], True, eps)])
            for _ in range(c["resampler_depth"])])
        self.layer_norm = nn.LayerNorm(D, eps=eps)

    def forward(self, context):
        latents = self.latents.repeat(context.shape[0], 1, 1)
        for attn, ff in self.blocks:
            latents = attn(context, latents) + latents
            latents = ff(latents) + latents
        return self.layer_norm(latents)


class MaskedCrossAttention(nn.Module):
    """OpenFlamingo MaskedCrossAttention's masking with IDEFICS's projection names."""

    def __init__(self, C, Dv, heads, head_dim, only_immediate):
        super().__init__()
        self.heads, self.head_dim, self.only_immediate = heads, head_dim, only_immediate
        inner = heads * head_dim
        self.q_proj = nn.Linear(C, inner, bias=False)
        self.k_proj = nn.Linear(Dv, inner, bias=False)
        self.v_proj = nn.Linear(Dv, inner, bias=False)
        self.o_proj = nn.Linear(inner, C, bias=False)

    def forward(self, x, media, text_time):
        """x (B, T, C) normalised, media (B, M, L, Dv), text_time (B, T) -> (B, T, C)."""
        B, T, _ = x.shape
        _, M, L, Dv = media.shape
        H, hd = self.heads, self.head_dim
        kv = media.reshape(B, M * L, Dv)
        q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2) * hd ** -0.5
        k = self.k_proj(kv).view(B, M * L, H, hd).transpose(1, 2)
        v = self.v_proj(kv).view(B, M * L, H, hd).transpose(1, 2)
        sim = q @ k.transpose(-1, -2)  # (B, H, T, M*L)
        media_time = (torch.arange(M) + 1).repeat_interleave(L)  # slot m's latents at time m + 1
        op = torch.eq if self.only_immediate else torch.ge
        mask = op(text_time[:, None, :, None], media_time[None, None, None, :])
        sim = sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)
        sim = sim - sim.amax(dim=-1, keepdim=True).detach()
        attn = sim.softmax(dim=-1)
        attn = attn.masked_fill((text_time == 0)[:, None, :, None], 0.0)  # before any image: nothing
        out = (attn @ v).transpose(1, 2).reshape(B, T, H * hd)
        return self.o_proj(out)


class GatedCrossAttentionBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, eps = c["lm_config"]["n_embd"], c["layer_norm_eps"]
        self.input_layernorm = nn.LayerNorm(C, eps=eps)
        self.cross_attn = MaskedCrossAttention(C, c["vision_config"]["hidden_size"], c["cross_attn_heads"],
                                               c["cross_attn_head_dim"], c["only_attend_immediate_media"])
        self.alpha_cross_attn = nn.Parameter(torch.zeros(1))
        self.post_attention_layernorm = nn.LayerNorm(C, eps=eps)
        self.mlp = FlamingoMLP(C, c["cross_attn_ff_mult"] * C, c["ff_act"], False, eps)
        self.alpha_dense = nn.Parameter(torch.zeros(1))

    def forward(self, x, media, text_time):
        if media is not None:
            x = x + torch.tanh(self.alpha_cross_attn) * self.cross_attn(self.input_layernorm(x), media, text_time)
        return x + torch.tanh(self.alpha_dense) * self.mlp(self.post_attention_layernorm(x))


class DecoupledEmbedding(nn.Embedding):
    """IDEFICS DecoupledEmbedding: weight (V, C) + additional_embedding (A, C) for ids >= V."""

    def __init__(self, V, A, C):
        super().__init__(V, C)
        self.additional_embedding = nn.Embedding(A, C)

    def forward(self, ids):
        ids = ids.clone()
        extra = torch.where(ids >= self.num_embeddings)
        extra_ids = ids[extra] - self.num_embeddings
        ids[extra] = 0
        out = F.embedding(ids, self.weight)
        out[extra] = self.additional_embedding(extra_ids)
        return out

    def attend(self, x):  # IDEFICS DecoupledLinear, tied
        return torch.cat([F.linear(x, self.weight), F.linear(x, self.additional_embedding.weight)], dim=-1)


class Flamingo(nn.Module):
    NUM_ADDITIONAL = 2  # <|endofchunk|> = V, <image> = V + 1

    def __init__(self, c):
        super().__init__()
        self.config = dict(c)
        v, lm = c["vision_config"], c["lm_config"]
        self.vision_model = CLIPVisionTransformer(v, c["vision_hidden_act"])
        self.perceiver_resampler = PerceiverResampler(c)
        n = c["cross_attn_every_n_layers"]
        self.gated_cross_attn_layers = nn.ModuleList(
            [GatedCrossAttentionBlock(c) for _ in range((lm["n_layer"] + n - 1) // n)])
        C, eps = lm["n_embd"], lm["layer_norm_eps"]
        self.transformer = nn.ModuleDict(dict(
            wte=DecoupledEmbedding(lm["vocab_size"], self.NUM_ADDITIONAL, C),
            wpe=nn.Embedding(lm["block_size"], C),
            h=nn.ModuleList([Block(C, lm["n_head"], eps) for _ in range(lm["n_layer"])]),
            ln_f=LayerNorm(C, eps),
        ))
        for name, p in self.named_parameters():  # frozen: vision tower, LM but the new rows
            if name.startswith("vision_model.") or (
                    name.startswith("transformer.") and name != "transformer.wte.additional_embedding.weight"):
                p.requires_grad_(False)

    @property
    def image_token_id(self):
        return self.config["lm_config"]["vocab_size"] + 1

    def visual_tokens(self, images):
        vm = self.vision_model
        return vm.encoder(vm.pre_layrnorm(vm.embeddings(images)), causal=False)  # (N, 1 + P, Dv)

    def forward(self, images, ids):
        """images (N, C, H, W) (one per <image> token, row-major), ids (B, T) -> logits (B, T, V + 2)."""
        B, T = ids.shape
        is_img = ids == self.image_token_id
        text_time = is_img.long().cumsum(dim=-1)  # (B, T)
        counts = is_img.sum(dim=-1).tolist()
        assert sum(counts) == (0 if images is None else images.shape[0]), (counts, images.shape)
        media = None
        if sum(counts) > 0:
            lat = self.perceiver_resampler(self.visual_tokens(images))  # (N, L, Dv)
            M = max(counts)
            rows, i = [], 0
            for b in range(B):
                pad = lat.new_zeros(M - counts[b], *lat.shape[1:])
                rows.append(torch.cat([lat[i:i + counts[b]], pad], dim=0))
                i += counts[b]
            media = torch.stack(rows)  # (B, M, L, Dv)
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(T))
        n = self.config["cross_attn_every_n_layers"]
        for i, blk in enumerate(t.h):
            if i % n == 0:
                x = self.gated_cross_attn_layers[i // n](x, media, text_time)
            x = blk(x)
        return t.wte.attend(t.ln_f(x))  # (B, T, V + 2)

    def loss(self, images, ids, targets):
        logits = self.forward(images, ids)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def check_loss(a, config, tensors, batch):
    m = Flamingo(config)
    common.load_named(dict(m.named_parameters()), tensors)
    with torch.no_grad():
        images = batch["images"].float() if "images" in batch else None
        return m.loss(images, batch["ids"].long(), batch["targets"].long())[1]


def main():
    common.check_main("flamingo_ref", check_loss, errors=(AssertionError,))


if __name__ == "__main__":
    main()
