"""Writes the Swin parity fixture (run from anywhere):

    /usr/bin/python3 tests/reference/make_swin_fixture.py [--out DIR]

swin_tiny.safetensors (st_io.py; __metadata__: magic=brigade-fixture, version=1, kind=swin_parity,
config (JSON), notes): swin_ref.SwinForImageClassification with 1 channel, 16x16 images, patch 2
(an 8x8 grid), embed 16, depths [2, 2], heads [2, 4], window 4 (stage 0: 4 windows, block 1
shifted by 2; stage 1: a 4x4 grid = one window, no shift), mlp_ratio 2, 10 classes, batch 2.
Weights: normal(0, 0.02) linear / conv weights, LayerNorm 1 / 0, biases 0, then every parameter
(the relative position bias tables included) + 0.05 * randn, so nothing sits at a trivial
value. Computed in float64 and stored as float32: the weights "<name>", "images", "labels",
"logits", 0-d "loss" and "grad.<name>" for every parameter. Deterministic (fixed seeds).
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import st_io  # noqa: E402
from swin_ref import SwinForImageClassification  # noqa: E402

CFG = dict(image_size=16, patch_size=2, num_channels=1, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
           window_size=4, mlp_ratio=2.0, num_labels=10, layer_norm_eps=1e-5)


def main():
    out = common.fixture_out_dir()
    torch.manual_seed(1234)
    model = SwinForImageClassification(CFG)
    g = torch.Generator().manual_seed(777)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or ".norm." in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias") or "relative_position_bias_table" in name:
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
            p.add_(0.05 * torch.randn(p.shape, generator=g))
            p.copy_(p.float())  # values representable in float32
    params = [(n, p.detach().clone().float()) for n, p in model.named_parameters()]
    model = model.double()
    gi = torch.Generator().manual_seed(4321)
    N, C, S = 2, CFG["num_channels"], CFG["image_size"]
    images = torch.randn(N, C, S, S, generator=gi)
    labels = torch.randint(0, CFG["num_labels"], (N,), generator=gi)
    logits, loss = model(images.double(), labels)
    loss.backward()
    grads = [(f"grad.{n}", p.grad.detach().float()) for n, p in model.named_parameters()]
    meta = {"magic": "brigade-fixture", "version": "1", "kind": "swin_parity", "torch": torch.__version__,
            "config": json.dumps(CFG),
            "notes": "weights: init + 0.05*randn(seed 777); computed in float64, stored float32; "
                     "images randn, labels randint, generator seed 4321"}
    tensors = params + [("images", images), ("labels", labels), ("logits", logits.detach().float()),
                        ("loss", loss.detach().float().reshape(()))] + grads
    st_io.save(os.path.join(out, "swin_tiny.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
