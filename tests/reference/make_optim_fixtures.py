"""Writes the optimizer fixtures into tests/fixtures/ (run from anywhere):

    /usr/bin/python3 tests/reference/make_optim_fixtures.py [--out DIR]

Files (safetensors written by st_io.py; __metadata__ has magic=brigade-fixture,
version=1, kind, the options as JSON and the parameter names in order):
  optim_lamb.safetensors  LAMB (You et al. 2019, Algorithm 2 with Adam bias correction),
                          written here from the formula in PyTorch (torch has no LAMB)
  optim_sgd.safetensors   torch.optim.SGD, two cases: "momentum" (nesterov=False) and
                          "nesterov" (nesterov=True), both with weight decay

Each file holds, for every case prefix C ("lamb", "momentum", "nesterov"):
  C.init.<name>           parameters before the first step
  grad.<t>.<name>         gradient given at step t (0..9), shared by the cases of a file
  lr                      (10,) f64: learning rate of each step
  C.param.<t>.<name>      parameters after step t
  C.<state>.<name>        optimizer state after the last step (exp_avg / exp_avg_sq, or
                          momentum_buffer)
  lamb.trust_ratio        (10, P) f64: the trust ratio of each parameter at each step
Parameters have different shapes: two matrices (weight decay in LAMB), a 1-D bias, a
zero-initialised 1-D bias (||w|| = 0 at the first step: ratio 1) and a LayerNorm-like
weight whose first gradient is all zero (||r|| = 0 at the first step: ratio 1).
Deterministic: single thread, fixed seed; re-running gives identical bytes.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st_io  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
STEPS = 10
# name, shape, LAMB weight decay applies (matrices only, as Brigade's default rule)
PARAMS = [("h.0.attn.c_attn.weight", (4, 6), True),
          ("h.0.attn.c_attn.bias", (6,), False),
          ("wte.weight", (5, 4), True),
          ("h.0.mlp.c_fc.bias", (7,), False),      # zero-initialised
          ("h.0.ln_1.weight", (4,), False)]        # first gradient all zero
LRS = [0.01 * (1.0 + 0.25 * t) if t < 4 else 0.02 - 0.001 * t for t in range(STEPS)]


def make_problem():
    g = torch.Generator().manual_seed(20240607)
    init, grads = {}, []
    for name, shape, _ in PARAMS:
        if name.endswith("c_fc.bias"):
            init[name] = torch.zeros(shape)
        elif name.endswith("ln_1.weight"):
            init[name] = torch.ones(shape) + 0.1 * torch.randn(shape, generator=g)
        else:
            init[name] = torch.randn(shape, generator=g) * 0.5
    for t in range(STEPS):
        step = {}
        for name, shape, _ in PARAMS:
            # a gradient with a drift (so momentum matters) plus noise that changes each step
            gt = 0.3 * torch.ones(shape) + torch.randn(shape, generator=g) * (0.5 + 0.1 * t)
            if name.endswith("ln_1.weight") and t == 0:
                gt = torch.zeros(shape)
            step[name] = gt.float()
        grads.append(step)
    return init, grads


def lamb_reference(init, grads, o):
    """LAMB from the formula, fp32 state and arithmetic, norms in float64."""
    b1, b2, eps, wd = o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
    params = {n: init[n].clone() for n, _, _ in PARAMS}
    m = {n: torch.zeros_like(init[n]) for n, _, _ in PARAMS}
    v = {n: torch.zeros_like(init[n]) for n, _, _ in PARAMS}
    history, ratios = [], []
    for t in range(STEPS):
        k = t + 1
        bc1, bc2 = 1.0 - b1 ** k, 1.0 - b2 ** k
        row = []
        for name, _, decays in PARAMS:
            p, g = params[name], grads[t][name]
            m[name].mul_(b1).add_(g, alpha=1.0 - b1)
            v[name].mul_(b2).addcmul_(g, g, value=1.0 - b2)
            r = (m[name] / bc1) / ((v[name] / bc2).sqrt() + eps)
            if decays:
                r = r + wd * p
            w_norm = p.double().norm().item()
            r_norm = r.double().norm().item()
            ratio = w_norm / r_norm if (w_norm > 0.0 and r_norm > 0.0) else 1.0
            p.add_(r, alpha=-LRS[t] * ratio)
            row.append(ratio)
        ratios.append(row)
        history.append({n: params[n].clone() for n, _, _ in PARAMS})
    state = {}
    for n, _, _ in PARAMS:
        state["exp_avg." + n] = m[n]
        state["exp_avg_sq." + n] = v[n]
    return history, state, torch.tensor(ratios, dtype=torch.float64)


def sgd_reference(init, grads, o):
    """torch.optim.SGD itself (one group: weight decay on every parameter)."""
    params = [torch.nn.Parameter(init[n].clone()) for n, _, _ in PARAMS]
    opt = torch.optim.SGD(params, lr=LRS[0], momentum=o["momentum"], weight_decay=o["weight_decay"],
                          nesterov=o["nesterov"])
    history = []
    for t in range(STEPS):
        for p, (n, _, _) in zip(params, PARAMS):
            p.grad = grads[t][n].clone()
        for group in opt.param_groups:
            group["lr"] = LRS[t]
        opt.step()
        history.append({n: p.detach().clone() for p, (n, _, _) in zip(params, PARAMS)})
    state = {"momentum_buffer." + n: opt.state[p]["momentum_buffer"].clone() for p, (n, _, _) in zip(params, PARAMS)}
    return history, state


def case_tensors(prefix, init, history, state):
    out = [(f"{prefix}.init.{n}", init[n]) for n, _, _ in PARAMS]
    for t, params in enumerate(history):
        out += [(f"{prefix}.param.{t}.{n}", params[n]) for n, _, _ in PARAMS]
    out += [(f"{prefix}.{k}", v) for k, v in state.items()]
    return out


def common_tensors(grads):
    out = [("lr", torch.tensor(LRS, dtype=torch.float64))]
    for t in range(STEPS):
        out += [(f"grad.{t}.{n}", grads[t][n]) for n, _, _ in PARAMS]
    return out


def meta(kind, options):
    return dict(MAGIC, kind=kind, torch=torch.__version__, steps=str(STEPS),
                params=json.dumps([n for n, _, _ in PARAMS]),
                decay=json.dumps([d for _, _, d in PARAMS]), options=json.dumps(options, sort_keys=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    init, grads = make_problem()

    lamb_o = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.1}
    history, state, ratios = lamb_reference(init, grads, lamb_o)
    tensors = common_tensors(grads) + case_tensors("lamb", init, history, state) + [("lamb.trust_ratio", ratios)]
    st_io.save(os.path.join(args.out, "optim_lamb.safetensors"), tensors, meta("optim_lamb", {"lamb": lamb_o}))

    tensors = common_tensors(grads)
    options = {}
    for prefix, nesterov in (("momentum", False), ("nesterov", True)):
        o = {"momentum": 0.9, "weight_decay": 0.01, "nesterov": nesterov}
        options[prefix] = o
        history, state = sgd_reference(init, grads, o)
        tensors += case_tensors(prefix, init, history, state)
    st_io.save(os.path.join(args.out, "optim_sgd.safetensors"), tensors, meta("optim_sgd", options))
    print("wrote optim_lamb.safetensors, optim_sgd.safetensors to", os.path.abspath(args.out))


if __name__ == "__main__":
    main()
