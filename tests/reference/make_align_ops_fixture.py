"""Writes tests/fixtures/align_ops.safetensors for tests/ops/test_conv_norm_ops.cpp:

    /usr/bin/python3 tests/reference/make_align_ops_fixture.py [--out DIR]

The ops HF's ALIGN image tower (EfficientNet) needs, computed by PyTorch:
  conv.<case>.{x, w, b, r}      inputs (b absent without bias) and the loss weights r
  conv.<case>.{y, gx, gw, gb}   y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride,
                                groups=groups) and the gradients of L = sum(y * r)
  ce.<case>.{logits, targets}   logits (N, V) f32, targets (N) i64 (-100 rows ignored)
  ce.<case>.{loss, glogits}     F.cross_entropy(logits, targets, label_smoothing=eps) and its
                                gradient with respect to the logits
Metadata: magic=brigade-fixture, kind=align_ops, conv.<case> / ce.<case> = JSON of the
geometry (stride, pad_top, pad_bottom, pad_left, pad_right, groups) or of eps.
Deterministic (one thread, fixed seed). The depthwise cases use HF EfficientNet's padding of a
stride-2 depthwise convolution, nn.ZeroPad2d(correct_pad(k)) = (k//2 - 1, k//2, k//2 - 1, k//2)
as (left, right, top, bottom).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402


def correct_pad(k):  # transformers.models.efficientnet.modeling_efficientnet.correct_pad, adjust=True
    c = k // 2
    return (c - 1, c, c - 1, c)  # (left, right, top, bottom)


# name: (x shape, w shape, bias, stride, (left, right, top, bottom), groups)
CONVS = {
    "dw_k5_s2": ((2, 6, 9, 8), (6, 1, 5, 5), True, 2, correct_pad(5), 6),
    "dw_k3_s2": ((2, 4, 8, 8), (4, 1, 3, 3), True, 2, correct_pad(3), 4),
    "dw_k3_same": ((2, 4, 7, 7), (4, 1, 3, 3), False, 1, (1, 1, 1, 1), 4),
    "grouped": ((2, 4, 7, 6), (6, 2, 3, 3), True, 1, (1, 1, 1, 1), 2),
    "stem": ((2, 3, 9, 9), (5, 3, 3, 3), False, 2, (0, 1, 0, 1), 1),  # EfficientNet's stem ZeroPad2d
}

# name: (N, V, eps, ignored rows)
CES = {
    "eps0.1": (7, 10, 0.1, [2, 5]),
    "eps0.3": (5, 13, 0.3, []),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(2024)
    tensors = []
    meta = {"magic": "brigade-fixture", "version": "1", "kind": "align_ops", "torch": torch.__version__}
    for name, (xs, ws, bias, stride, (left, right, top, bottom), groups) in CONVS.items():
        # inputs drawn in f32 (what the fixture stores), computed in double
        x = torch.randn(xs).double().requires_grad_()
        w = (torch.randn(ws) * 0.5).double().requires_grad_()
        b = torch.randn(ws[0]).double().requires_grad_() if bias else None
        y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=stride, groups=groups)
        r = torch.randn(y.shape).double()
        (y * r).sum().backward()
        p = f"conv.{name}"
        out = [("x", x), ("w", w), ("r", r), ("y", y), ("gx", x.grad), ("gw", w.grad)]
        if bias:
            out += [("b", b), ("gb", b.grad)]
        tensors += [(f"{p}.{k}", v.detach().float()) for k, v in out]
        meta[p] = json.dumps(dict(stride=stride, pad_top=top, pad_bottom=bottom, pad_left=left, pad_right=right,
                                  groups=groups, bias=bias), sort_keys=True)
    for name, (N, V, eps, ignored) in CES.items():
        logits = (torch.randn(N, V) * 2).double().requires_grad_()
        targets = torch.randint(0, V, (N,), dtype=torch.int64)
        targets[ignored] = -100
        loss = F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=eps)
        loss.backward()
        p = f"ce.{name}"
        tensors += [(f"{p}.logits", logits.detach().float()), (f"{p}.targets", targets),
                    (f"{p}.loss", loss.detach().float()), (f"{p}.glogits", logits.grad.float())]
        meta[p] = json.dumps(dict(eps=eps), sort_keys=True)
    path = os.path.join(args.out, "align_ops.safetensors")
    st_io.save(path, tensors, meta)
    print(f"wrote {path} ({len(tensors)} tensors)")


if __name__ == "__main__":
    main()
