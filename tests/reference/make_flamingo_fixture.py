"""Writes the Flamingo parity fixture (run from anywhere):

    /usr/bin/python3 tests/reference/make_flamingo_fixture.py [--out DIR]

tests/fixtures/flamingo_tiny.safetensors (st_io.py; __metadata__: magic=brigade-fixture, version=1,
kind=flamingo_parity, config (flamingo_ref.Flamingo's config as JSON), config_all_media (the same
with only_attend_immediate_media false and ff_act relu), notes):
  vision 1x8x8 images, patch 4 (1 + 4 tokens), Dv 16, 1 layer, 2 heads, MLP 32, quick_gelu;
  LM GPT-2 vocab 20 (+ <|endofchunk|> 20, <image> 21), block 16, 3 layers, 2 heads, C 16;
  resampler depth 2, 2 heads of 8, 3 latents, MLP 2 Dv; gated blocks every 2 layers (before
  layers 0 and 2: 2 blocks for 3 layers), 2 heads of 8, MLP 2 C.
Holds "<name>" for every parameter (normal(0, 0.02) weights, LayerNorms 1 / biases 0, latents
normal(0, 1), then + 0.05 * randn on everything so no bias or LayerNorm sits at its trivial init,
and the gates set to non-zero values in [-0.9, -0.3] U [0.3, 0.9]), the batch "images" (5, 1, 8, 8)
f32, "ids" (2, 12) i64 (sequence 0: two tokens before its first image, images at 2 and 6;
sequence 1: images at 1, 4 and 6, so its media has 3 slots and sequence 0 one empty slot),
"targets" (2, 12) i64 (the next token, -100 where the next token is <image> and at the end),
and the outputs "logits" (2, 12, 22), 0-d "loss" and "grad.<name>" for every trainable parameter
(requires_grad: resampler, gated blocks, transformer.wte.additional_embedding.weight), computed
in float64 from the float32 weights and cast to float32; "all_media.logits", "all_media.loss" and
"all_media.grad.<name>" are the same with config_all_media. Deterministic (single thread, fixed seeds).
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import st_io  # noqa: E402
from flamingo_ref import Flamingo  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
SEED = 2024

VISION = dict(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
              num_attention_heads=2, intermediate_size=32, layer_norm_eps=1e-5)
LM = dict(vocab_size=20, block_size=16, n_layer=3, n_head=2, n_embd=16, layer_norm_eps=1e-5)
CFG = dict(vision_config=VISION, vision_hidden_act="quick_gelu", lm_config=LM, resampler_depth=2,
           resampler_n_heads=2, resampler_head_dim=8, resampler_n_latents=3, resampler_ff_mult=2,
           cross_attn_every_n_layers=2, cross_attn_heads=2, cross_attn_head_dim=8, cross_attn_ff_mult=2,
           only_attend_immediate_media=True, ff_act="gelu", layer_norm_eps=1e-5)
CFG_ALL = dict(CFG, only_attend_immediate_media=False, ff_act="relu")

EOC, IMG = 20, 21
IDS = [[3, 5, IMG, 7, 8, EOC, IMG, 9, 10, 11, EOC, 4],
       [6, IMG, 2, 3, IMG, 4, IMG, 5, 6, 7, EOC, 8]]


def make_weights(model, g):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha_cross_attn") or name.endswith("alpha_dense"):
                continue
            if name == "perceiver_resampler.latents":
                p.normal_(0.0, 1.0, generator=g)
            elif any(k in name for k in ("layer_norm", "layernorm", "layrnorm", ".ln_", ".ln.")):
                p.fill_(0.0 if name.endswith(".bias") else 1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith("alpha_cross_attn") or name.endswith("alpha_dense"):
                u = 0.3 + 0.6 * torch.rand(1, generator=g)
                p.copy_(u if torch.rand(1, generator=g) < 0.5 else -u)


def run(cfg, params, images, ids, targets, prefix):
    m = Flamingo(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(dict(params)[n])
    m.double()
    logits, loss = m.loss(images.double(), ids, targets)
    loss.backward()
    f = lambda t: t.detach().float()  # noqa: E731
    out = [(prefix + "logits", f(logits)), (prefix + "loss", f(loss).reshape(()))]
    out += [(f"{prefix}grad.{n}", f(p.grad)) for n, p in m.named_parameters() if p.requires_grad]
    return out, float(loss)


def main():
    out = common.fixture_out_dir()
    g = torch.Generator().manual_seed(SEED)
    model = Flamingo(CFG)
    make_weights(model, g)
    params = [(n, p.detach().clone()) for n, p in model.named_parameters()]

    ids = torch.tensor(IDS, dtype=torch.int64)
    n_img = int((ids == IMG).sum())
    images = torch.randn(n_img, VISION["num_channels"], VISION["image_size"], VISION["image_size"], generator=g)
    targets = torch.full_like(ids, -100)
    targets[:, :-1] = ids[:, 1:]
    targets[targets == IMG] = -100

    outs, loss = run(CFG, params, images, ids, targets, "")
    outs_all, loss_all = run(CFG_ALL, params, images, ids, targets, "all_media.")
    meta = dict(MAGIC, kind="flamingo_parity", torch=torch.__version__, config=json.dumps(CFG),
                config_all_media=json.dumps(CFG_ALL), seed=str(SEED),
                params="normal / LayerNorm / latents init + 0.05 * randn, gates +-U(0.3, 0.9); generator seeded seed",
                batch="ids as make_flamingo_fixture.IDS, images randn from the same generator; float64 reference")
    tensors = params + [("images", images), ("ids", ids), ("targets", targets)] + outs + outs_all
    st_io.save(os.path.join(out, "flamingo_tiny.safetensors"), tensors, meta)
    print(f"loss {loss:.9g} all_media.loss {loss_all:.9g}")


if __name__ == "__main__":
    main()
