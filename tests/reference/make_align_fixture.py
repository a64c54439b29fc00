"""Writes the ALIGN parity fixture (run from anywhere):

    /usr/bin/python3 tests/reference/make_align_fixture.py [--out DIR]

tests/fixtures/align_tiny.safetensors (st_io.py; __metadata__: magic=brigade-fixture, version=1,
kind=align_parity, torch, config (align_ref.AlignModel's config, HF AlignConfig layout, as JSON),
weight_seed, input_seed, stats_seed, notes):
  vision: 1x16x16 images, EfficientNet width 0.5 / depth 1.5 / divisor 8, stages k [3, 5, 3],
  strides [1, 2, 2], repeats [1, 1, 2] -> [2, 2, 3] (7 blocks), expand [1, 4, 6], SE 0.25,
  depthwise_padding [4], BatchNorm eps 1e-3 momentum 0.99 (expand_bn: torch's default 0.1),
  pooled width 24; text: BERT vocab 40, T 8, D 32, 2 layers, 4 heads, MLP 64, exact GELU;
  projection 24; batch 4 (image i pairs with caption i).
Holds
  "<name>"            every AlignModel.state_dict() entry by HF name (text_model.pooler omitted):
                      parameters and BatchNorm buffers, float32 (num_batches_tracked int64), drawn
                      by random_weights(model, weight_seed) below
  "images" (4, 1, 16, 16) f32, "ids" (4, 8) i64 (38 = start, words 1..37, 39 = end, then padding
                      0), "lengths" (4) i64 = [8, 5, 6, 3] (position of the end token + 1)
  train-mode forward (BatchNorm batch statistics, dropout 0), computed in float64 from the float32
  weights and cast to float32:
  "image_embeds", "text_embeds" (4, 24), "logits_per_image" (4, 4), 0-d "loss",
  "grad.<name>"       the gradient of loss for every parameter,
  "after_train.<b>"   every BatchNorm buffer after that one train-mode forward;
  "stats_images.{0,1,2}" (4, 1, 16, 16) f32: from the same weights and the ORIGINAL buffers, three
                      train-mode forwards (no weight update) on these with the same ids/lengths,
  "stats.<b>"         every BatchNorm buffer after those three forwards,
  "eval.image_embeds", "eval.logits_per_image", 0-d "eval.loss": then one eval-mode forward
                      (running statistics "stats.<b>") on "images".
The stats.* values check the momentum quirk (0.99 in most BatchNorms, 0.1 in expand_bn).
Before writing, align_ref.selftest() checks the depthwise padding against F.pad + F.conv2d, and
this script checks every after_train buffer against (1 - m) running + m batch_stat computed from
the BatchNorm inputs. Deterministic (single thread, fixed seeds).
"""
import json
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import st_io  # noqa: E402
from align_ref import AlignModel, block_specs, correct_pad, load_named, selftest  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
WEIGHT_SEED = 2718
INPUT_SEED = 4323
STATS_SEED = 1618
NUM_BATCHES_TRACKED = 7

TEXT = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=8, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")
VISION = dict(num_channels=1, image_size=16, width_coefficient=0.5, depth_coefficient=1.5, depth_divisor=8,
              kernel_sizes=[3, 5, 3], in_channels=[32, 16, 32], out_channels=[16, 32, 48], depthwise_padding=[4],
              strides=[1, 2, 2], num_block_repeats=[1, 1, 2], expand_ratios=[1, 4, 6], squeeze_expansion_ratio=0.25,
              hidden_act="swish", hidden_dim=64, pooling_type="mean", batch_norm_eps=1e-3,
              batch_norm_momentum=0.99, drop_connect_rate=0.0)
CFG = dict(text_config=TEXT, vision_config=VISION, projection_dim=24, temperature_init_value=1.0)

# (in, out, stride, k, padding (l, r, t, b), dim_se, residual, expanded dim)
EXPECTED_BLOCKS = [
    (16, 8, 1, 3, "same (1, 1, 1, 1)", 4, False, 16),
    (8, 8, 1, 3, "same (1, 1, 1, 1)", 2, True, 8),
    (8, 16, 2, 5, "zero (1, 2, 1, 2)", 2, False, 32),
    (16, 16, 1, 5, "same (2, 2, 2, 2)", 4, True, 64),
    (16, 24, 2, 3, "zero (1, 1, 1, 1)", 4, False, 96),
    (24, 24, 1, 3, "same (1, 1, 1, 1)", 6, True, 144),
    (24, 24, 1, 3, "same (1, 1, 1, 1)", 6, True, 144),
]


def random_weights(model, seed):
    """torch.Generator().manual_seed(seed), then over named_parameters() in order: temperature
    0.7; LayerNorm / BatchNorm weights 1 + 0.1 randn; every bias 0.1 randn; Conv2d weights randn
    * fan_in^-0.5 (fan_in = in/groups * k * k); Linear weights randn * in^-0.5; embeddings randn.
    Then over the BatchNorm2d modules in named_modules() order: running_mean 0.1 randn,
    running_var 1 + 0.2 rand, num_batches_tracked = NUM_BATCHES_TRACKED."""
    g = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "temperature":
                p.fill_(0.7)
                continue
            mod = mods[name.rsplit(".", 1)[0]]
            r = torch.randn(p.shape, generator=g)
            if name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif isinstance(mod, (nn.LayerNorm, nn.BatchNorm2d)):
                p.copy_(1.0 + 0.1 * r)
            elif isinstance(mod, nn.Conv2d):
                p.copy_(r * (p.shape[1] * p.shape[2] * p.shape[3]) ** -0.5)
            elif isinstance(mod, nn.Linear):
                p.copy_(r * p.shape[1] ** -0.5)
            elif isinstance(mod, nn.Embedding):
                p.copy_(r)
            else:
                raise AssertionError(f"no rule for {name}")
        for _, mod in model.named_modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(0.1 * torch.randn(mod.running_mean.shape, generator=g))
                mod.running_var.copy_(1.0 + 0.2 * torch.rand(mod.running_var.shape, generator=g))
                mod.num_batches_tracked.fill_(NUM_BATCHES_TRACKED)


def block_table(model, images):
    """Prints and asserts the per-block geometry (spatial sizes from a forward with hooks)."""
    sizes = []
    hooks = [b.register_forward_hook(lambda m, i, o: sizes.append((tuple(i[0].shape[2:]), tuple(o.shape[2:]))))
             for b in model.vision_model.encoder.blocks]
    with torch.no_grad():
        model.eval()
        model.vision_model(images)
    for h in hooks:
        h.remove()
    print("block  in  out  stride  k  depthwise padding   dim_se  residual  expanded  spatial")
    specs = block_specs(CFG["vision_config"])
    assert len(specs) == len(EXPECTED_BLOCKS) == len(model.vision_model.encoder.blocks)
    for i, (s, blk, want, sz) in enumerate(zip(specs, model.vision_model.encoder.blocks, EXPECTED_BLOCKS, sizes)):
        k, stride = s["kernel_size"], s["stride"]
        pad = f"zero {correct_pad(k, s['adjust_padding'])}" if stride == 2 else f"same {(k // 2,) * 4}"
        dw = blk.depthwise_conv.depthwise_conv
        row = (s["in_dim"], s["out_dim"], stride, k, pad, blk.squeeze_excite.dim_se, blk.projection.apply_dropout,
               dw.in_channels)
        print(f"{i:5d} {row[0]:3d} {row[1]:4d} {row[2]:7d} {row[3]:2d}  {row[4]:18s} {row[5]:6d}  {str(row[6]):8s}"
              f"  {row[7]:8d}  {sz[0]} -> {sz[1]}")
        assert row == want, f"block {i}: {row} != {want}"
        assert dw.groups == dw.in_channels == dw.out_channels and dw.stride == (stride, stride)
        assert blk.expand == (s["expand_ratio"] != 1) and hasattr(blk, "expansion") == blk.expand
    assert sizes[-1][1] == (2, 2), sizes
    pooled = model.vision_model.encoder.blocks[-1].projection.project_conv.out_channels
    assert pooled == CFG["projection_dim"] == 24
    print(f"stem {tuple(images.shape[2:])} -> {sizes[0][0]}, pooled width {pooled}")


def check_momentum(model, before, images, ids, lengths):
    """One train forward with hooks on every BatchNorm2d: the buffers afterwards must equal
    (1 - m) before + m batch_stat (mean; unbiased variance), m = 0.1 for expand_bn, 0.99 else."""
    stats = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.BatchNorm2d):
            def hook(m, i, o, name=name):
                x = i[0].detach()
                stats[name] = (x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=True))
            hooks.append(mod.register_forward_hook(hook))
    model.train()
    out = model(images, ids, lengths)
    for h in hooks:
        h.remove()
    for name, (mean, var) in stats.items():
        m = 0.1 if name.endswith("expand_bn") else 0.99
        for buf, stat in (("running_mean", mean), ("running_var", var)):
            want = (1 - m) * before[f"{name}.{buf}"].double() + m * stat
            got = model.state_dict()[f"{name}.{buf}"]
            assert torch.allclose(got, want, rtol=1e-12, atol=1e-14), f"{name}.{buf}: momentum {m} not applied"
        assert int(model.state_dict()[f"{name}.num_batches_tracked"]) == NUM_BATCHES_TRACKED + 1
    print(f"momentum check: {len(stats)} BatchNorms, expand_bn at 0.1, the rest at 0.99")
    return out


def main():
    out = common.fixture_out_dir()
    selftest()

    model = AlignModel(CFG)
    random_weights(model, WEIGHT_SEED)
    state = [(n, t.detach().clone()) for n, t in model.state_dict().items()]
    param_names = [n for n, _ in model.named_parameters()]
    buffer_names = [n for n, _ in model.named_buffers()]
    assert all(n.startswith("vision_model.") and n.rsplit(".", 1)[1] in
               ("running_mean", "running_var", "num_batches_tracked") for n in buffer_names)

    g = torch.Generator().manual_seed(INPUT_SEED)
    N, T, V = 4, TEXT["max_position_embeddings"], TEXT["vocab_size"]
    C, S = VISION["num_channels"], VISION["image_size"]
    images = torch.randn(N, C, S, S, generator=g)
    lengths = torch.tensor([8, 5, 6, 3], dtype=torch.int64)
    ids = common.caption_ids(lengths, T, V, g)
    gs = torch.Generator().manual_seed(STATS_SEED)
    stats_images = [torch.randn(N, C, S, S, generator=gs) for _ in range(3)]

    model.double()
    block_table(model, images.double())
    f = lambda t: t.detach().float() if t.is_floating_point() else t.detach().clone()  # noqa: E731

    # train-mode forward + backward from the initial buffers
    load_named(model, dict(state))
    img, txt, logits, loss = check_momentum(model, dict(state), images.double(), ids, lengths)
    loss.backward()
    grads = [(f"grad.{n}", f(p.grad)) for n, p in model.named_parameters()]
    after = [(f"after_train.{n}", f(b)) for n, b in model.named_buffers()]

    # three train-mode forwards from the original buffers, then eval
    load_named(model, dict(state))
    model.train()
    with torch.no_grad():
        for x in stats_images:
            model(x.double(), ids, lengths)
    stats = [(f"stats.{n}", f(b)) for n, b in model.named_buffers()]
    model.eval()
    with torch.no_grad():
        e_img, _, e_logits, e_loss = model(images.double(), ids, lengths)

    meta = dict(MAGIC, kind="align_parity", torch=torch.__version__, config=json.dumps(CFG),
                weight_seed=str(WEIGHT_SEED), input_seed=str(INPUT_SEED), stats_seed=str(STATS_SEED),
                weights="make_align_fixture.random_weights(model, weight_seed): temperature 0.7, LayerNorm/"
                        "BatchNorm weights 1 + 0.1 randn, biases 0.1 randn, Conv2d/Linear weights randn * "
                        "fan_in^-0.5, embeddings randn, running_mean 0.1 randn, running_var 1 + 0.2 rand, "
                        f"num_batches_tracked {NUM_BATCHES_TRACKED}; stored in state_dict order",
                batch="images randn(4, 1, 16, 16) generator seed input_seed, then ids [38, randint(1, 38), ..., "
                      "39, 0...] from the same generator, lengths [8, 5, 6, 3]; stats_images.{0,1,2} randn from "
                      "a generator seeded stats_seed",
                notes="float64 reference cast to float32. Train pass: batch statistics, dropout 0 -> image_embeds, "
                      "text_embeds, logits_per_image, loss, grad.<param>, after_train.<buffer>. Then original "
                      "buffers, three train forwards on stats_images (no update) -> stats.<buffer>, then eval "
                      "forward on images -> eval.*. text_model.pooler is omitted (AlignModel never uses it).")
    tensors = [(n, f(t)) for n, t in state]
    tensors += [("images", images), ("ids", ids), ("lengths", lengths), ("image_embeds", f(img)),
                ("text_embeds", f(txt)), ("logits_per_image", f(logits)), ("loss", f(loss).reshape(()))]
    tensors += grads + after
    tensors += [(f"stats_images.{i}", x) for i, x in enumerate(stats_images)] + stats
    tensors += [("eval.image_embeds", f(e_img)), ("eval.logits_per_image", f(e_logits)),
                ("eval.loss", f(e_loss).reshape(()))]
    path = os.path.join(out, "align_tiny.safetensors")
    st_io.save(path, tensors, meta)
    print(f"{len(param_names)} parameters ({sum(p.numel() for p in model.parameters())} values), "
          f"{len(buffer_names)} buffers, {len(tensors)} tensors, {os.path.getsize(path)} bytes -> {path}")
    print(f"train loss {float(loss):.9g}")
    print(f"eval loss  {float(e_loss):.9g}")


if __name__ == "__main__":
    main()
