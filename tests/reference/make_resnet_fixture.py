"""Writes tests/fixtures/resnet_tiny.safetensors for tests/models/test_resnet.cpp:

    /usr/bin/python3 tests/reference/make_resnet_fixture.py [--out DIR]

Three tiny configs of tests/reference/resnet_ref.py (10 classes, batch 4), prefixed "basic."
(width 8, layers 1,1,1,1, basic blocks) and "bottleneck." (width 4, layers 1,1,1,1,
bottlenecks), both 1 channel, small_input, 12x12 images; and "imagenet_stem." (the bottleneck
config with torchvision's ImageNet stem, 7x7 stride-2 conv and 3x3 stride-2 max-pool, on
3-channel 24x24 images). For each prefix P:
  P.param.<name>   initial weights (BatchNorm weights/biases perturbed away from 1/0 so
                   they matter), P.buffer.<name> initial buffers (running stats perturbed)
  P.images (4,C,S,S) f32, P.labels (4) i64
  P.logits_train, P.loss_train   train-mode forward (batch statistics)
  P.grad.<name>                  gradient of loss_train for every parameter
  P.after.<buffer name>          buffers after that one train-mode forward
  P.logits_eval                  eval-mode forward, with the *initial* buffers
Metadata: magic=brigade-fixture, kind=resnet_parity, config.<P> = JSON of the config.
Deterministic (one thread, fixed seeds).
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402
from resnet_ref import ResNet  # noqa: E402

CONFIGS = {
    "basic": dict(layers=[1, 1, 1, 1], bottleneck=False, num_classes=10, in_channels=1, width=8, small_input=True),
    "bottleneck": dict(layers=[1, 1, 1, 1], bottleneck=True, num_classes=10, in_channels=1, width=4,
                       small_input=True),
    "imagenet_stem": dict(layers=[1, 1, 1, 1], bottleneck=True, num_classes=10, in_channels=3, width=4,
                          small_input=False),
}
SIDE = {"imagenet_stem": 24}  # image side per config (default 12)


def make(prefix, cfg, seed):
    torch.manual_seed(seed)
    m = ResNet(**cfg)
    with torch.no_grad():  # non-trivial BatchNorm affine parameters and running statistics
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.num_batches_tracked.fill_(3)
    params = [(n, p.detach().clone()) for n, p in m.named_parameters()]
    buffers = [(n, b.detach().clone()) for n, b in m.named_buffers()]
    side = SIDE.get(prefix, 12)
    images = torch.randn(4, cfg["in_channels"], side, side)
    labels = torch.tensor([3, 0, 7, 3], dtype=torch.int64)

    m.eval()
    with torch.no_grad():
        logits_eval = m(images)
    m.train()
    logits = m(images)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()

    out = [(f"{prefix}.param.{n}", t) for n, t in params]
    out += [(f"{prefix}.buffer.{n}", t) for n, t in buffers]
    out += [(f"{prefix}.images", images), (f"{prefix}.labels", labels),
            (f"{prefix}.logits_train", logits.detach()), (f"{prefix}.loss_train", loss.detach()),
            (f"{prefix}.logits_eval", logits_eval)]
    out += [(f"{prefix}.grad.{n}", p.grad.detach().clone()) for n, p in m.named_parameters()]
    out += [(f"{prefix}.after.{n}", b.detach().clone()) for n, b in m.named_buffers()]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    tensors = []
    meta = {"magic": "brigade-fixture", "version": "1", "kind": "resnet_parity", "torch": torch.__version__}
    for i, (prefix, cfg) in enumerate(CONFIGS.items()):
        tensors += make(prefix, cfg, 1000 + i)
        meta[f"config.{prefix}"] = json.dumps(cfg, sort_keys=True)
    path = os.path.join(args.out, "resnet_tiny.safetensors")
    st_io.save(path, tensors, meta)
    print(f"wrote {path} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
