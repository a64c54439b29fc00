"""What the reference scripts share: the `check` command of the *_ref.py scripts (Brigade-saved
weights loaded by name into the reference, its loss on a batch against the loss Brigade wrote),
and the make_*_fixture*.py scripts' output folder and caption batches. Imported after the
script has put this folder on sys.path.
"""
import argparse
import json
import os
import sys

import torch

import st_io

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


def load_named(targets, tensors, ignored=lambda name: False):
    """Copies `tensors` (name -> tensor) into `targets` (name -> parameter or buffer) by name, in
    the targets' dtypes: every target must be given, with its shape; a given name that is not a
    target is an error unless `ignored(name)`."""
    given = {k: v for k, v in tensors.items() if not ignored(k)}
    extra = set(given) - set(targets)
    if extra:
        raise ValueError(f"unknown tensors: {sorted(extra)}")
    with torch.no_grad():
        for name, p in targets.items():
            if name not in given:
                raise ValueError(f"missing tensor {name}")
            t = given[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, model has {tuple(p.shape)}")
            p.copy_(t.to(p.dtype))


def check_main(prog, loss_of, add_args=lambda ap: None, errors=()):
    """The command `prog check [options] --weights W --batch B [--rtol R]`: loss_of(args, config,
    tensors, batch) builds the reference from the weights' config (their __metadata__["config"]
    JSON), loads `tensors` into it and returns its loss on `batch`. Exits 0 when that loss is
    within rtol (relative) of the batch's "loss", 1 when not, and 2 when the files do not fit
    (KeyError, ValueError, OSError and `errors`)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["check"])
    add_args(ap)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    try:
        tensors, meta = st_io.load(a.weights)
        batch, _ = st_io.load(a.batch)
        loss = loss_of(a, json.loads(meta["config"]), tensors, batch)
        want = float(batch["loss"])
    except (KeyError, ValueError, OSError) + tuple(errors) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)
    got = float(loss)
    d = abs(got - want) / max(abs(want), 1e-30)
    print(f"loss torch={got:.9g} expected={want:.9g} rel_diff={d:.3g}")
    sys.exit(0 if d <= a.rtol else 1)


def fixture_out_dir():
    """The folder a fixture script writes to (--out, tests/fixtures by default), made; single
    threaded, so the fixture is deterministic."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=FIXTURES)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    return a.out


def init_and_perturb(model, init_weights, init_seed, perturb_seed):
    """init_weights(model, init_seed), then + 0.05 * randn (a generator seeded perturb_seed, in
    named_parameters order), so no bias or LayerNorm sits at its trivial init: the parameters
    before ("init.<name>") and after ("<name>"), as (name, tensor) lists."""
    init_weights(model, init_seed)
    init = [(f"init.{n}", p.detach().clone()) for n, p in model.named_parameters()]
    g = torch.Generator().manual_seed(perturb_seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return init, [(n, p.detach().clone()) for n, p in model.named_parameters()]


def caption_ids(lengths, T, V, g):
    """Caption ids (N, T) of the given lengths: start token V - 2, words 1 .. V - 3 drawn from
    `g`, end token V - 1 (the largest id), then padding 0."""
    ids = torch.zeros(len(lengths), T, dtype=torch.int64)
    for b in range(len(lengths)):
        L = int(lengths[b])
        ids[b, 0] = V - 2
        ids[b, 1:L - 1] = torch.randint(1, V - 2, (L - 2,), generator=g)
        ids[b, L - 1] = V - 1
    return ids
