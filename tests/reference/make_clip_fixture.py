"""Writes the CLIP parity fixture (run from anywhere):

    /usr/bin/python3 tests/reference/make_clip_fixture.py [--out DIR]

tests/fixtures/clip_tiny.safetensors (st_io.py; __metadata__: magic=brigade-fixture, version=1,
kind=clip_parity, config (clip_ref.CLIPModel's config as JSON), init_seed, notes):
  vision 1x12x12 images, patch 4, D 32, 2 layers, 4 heads, MLP 64; text vocab 40, T 8, D 32,
  2 layers, 4 heads, MLP 64; projection 16; quick_gelu; batch 4 (image i pairs with caption i).
Holds "init.<name>" (init_weights(model, init_seed), float32: what Brigade's init_weights must
reproduce bit for bit), "<name>" (those weights + 0.05 * randn, so no bias or LayerNorm sits at
its trivial init; logit_scale gets +0.05 * randn too), the inputs "images" (N, C, H, W) f32,
"ids" (N, T) i64 (start 38, words 1..37, end 39 = the largest id, then padding 0), "lengths"
(N) i64 (position of the end token + 1), and the outputs "image_embeds", "text_embeds" (N, E),
"logits_per_image" (N, N), 0-d "loss" and "grad.<name>" for every parameter, computed in float64
from the float32 weights and cast to float32. Deterministic (single thread, fixed seeds).
"""
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import st_io  # noqa: E402
from clip_ref import CLIPModel, init_weights  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
INIT_SEED = 1234
PERTURB_SEED = 777

TEXT = dict(vocab_size=40, max_position_embeddings=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, layer_norm_eps=1e-5)
VISION = dict(image_size=12, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=64, layer_norm_eps=1e-5)
CFG = dict(text_config=TEXT, vision_config=VISION, projection_dim=16, hidden_act="quick_gelu",
           logit_scale_init_value=math.log(1 / 0.07), initializer_range=0.02)


def main():
    out = common.fixture_out_dir()
    model = CLIPModel(CFG)
    init, params = common.init_and_perturb(model, init_weights, INIT_SEED, PERTURB_SEED)

    g = torch.Generator().manual_seed(4323)
    N, T, V = 4, TEXT["max_position_embeddings"], TEXT["vocab_size"]
    images = torch.randn(N, VISION["num_channels"], VISION["image_size"], VISION["image_size"], generator=g)
    lengths = torch.tensor([8, 5, 6, 3], dtype=torch.int64)
    ids = common.caption_ids(lengths, T, V, g)

    model.double()
    img, txt, logits, loss = model(images.double(), ids, lengths)
    loss.backward()
    f = lambda t: t.detach().float()  # noqa: E731
    grads = [(f"grad.{n}", f(p.grad)) for n, p in model.named_parameters()]
    meta = dict(MAGIC, kind="clip_parity", torch=torch.__version__, config=json.dumps(CFG),
                init_seed=str(INIT_SEED), perturb_seed=str(PERTURB_SEED),
                init="clip_ref.init_weights(model, init_seed)",
                params="init.<name> + 0.05 * randn(generator seeded perturb_seed), in named_parameters order",
                batch="images randn(N, C, H, W) generator seed 4323; ids [38, randint(1, 38), ..., 39, 0...], "
                      "lengths [8, 5, 6, 3]; reference computed in float64")
    tensors = init + params + [("images", images), ("ids", ids), ("lengths", lengths), ("image_embeds", f(img)),
                               ("text_embeds", f(txt)), ("logits_per_image", f(logits)),
                               ("loss", f(loss).reshape(()))] + grads
    st_io.save(os.path.join(out, "clip_tiny.safetensors"), tensors, meta)
    print(f"loss {float(loss):.9g}")


if __name__ == "__main__":
    main()
