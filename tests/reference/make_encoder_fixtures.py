"""Writes the encoder parity fixtures (run from anywhere):

    /usr/bin/python3 tests/reference/make_encoder_fixtures.py [--out DIR]

Files (safetensors by st_io.py; __metadata__: magic=brigade-fixture, version=1, kind, config
(the model config as JSON), init_seed, batch notes):
  vit_tiny.safetensors   ViT (encoder_ref.ViTForImageClassification): 1 channel, 12x12 images,
                         patch 4, D 32, 2 layers, 4 heads, MLP 64, 10 classes, batch 3
  bert_tiny.safetensors  BERT (encoder_ref.BertForMaskedLM): vocab 50, T 10, D 32, 2 layers,
                         4 heads, MLP 64, batch 2 with padded keys, token types and -100 labels
Each holds "init.<name>" (init_weights(model, init_seed): what Brigade's init_weights must
reproduce bit for bit), "<name>" (those weights perturbed by 0.05 * randn so no bias or LayerNorm
sits at its trivial init: the parity weights), the inputs, "logits", 0-d "loss" and
"grad.<name>" for every parameter (float32). Deterministic (single thread, fixed seeds).
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import st_io  # noqa: E402
from encoder_ref import BertForMaskedLM, ViTForImageClassification, init_weights  # noqa: E402

MAGIC = {"magic": "brigade-fixture", "version": "1"}
INIT_SEED = 1234
PERTURB_SEED = 777

VIT_CFG = dict(image_size=12, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, intermediate_size=64, num_labels=10, layer_norm_eps=1e-12)
BERT_CFG = dict(vocab_size=50, max_position_embeddings=16, type_vocab_size=2, hidden_size=32,
                num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, layer_norm_eps=1e-12)


def prepared(model):
    return common.init_and_perturb(model, init_weights, INIT_SEED, PERTURB_SEED)


def grads(model):
    return [(f"grad.{n}", p.grad.detach().clone()) for n, p in model.named_parameters()]


def write_vit(path):
    model = ViTForImageClassification(VIT_CFG)
    init, params = prepared(model)
    g = torch.Generator().manual_seed(4321)
    N, C, S = 3, VIT_CFG["num_channels"], VIT_CFG["image_size"]
    images = torch.randn(N, C, S, S, generator=g)
    labels = torch.randint(0, VIT_CFG["num_labels"], (N,), generator=g)
    logits, loss = model(images, labels)
    loss.backward()
    meta = dict(MAGIC, kind="vit_parity", torch=torch.__version__, config=json.dumps(VIT_CFG),
                init_seed=str(INIT_SEED),
                init="init_weights: torch.manual_seed(init_seed); over named_parameters in order: biases 0, "
                     "LayerNorm weights 1, the rest normal_(0, 0.02)",
                params="init.<name> + 0.05 * randn(generator seeded perturb_seed), in named_parameters order",
                perturb_seed=str(PERTURB_SEED),
                batch="images = randn(N, C, H, W), labels = randint(0, num_labels, (N,)), generator seed 4321")
    tensors = init + params + [("images", images), ("labels", labels), ("logits", logits.detach()),
                               ("loss", loss.detach().reshape(()))] + grads(model)
    st_io.save(path, tensors, meta)


def write_bert(path):
    model = BertForMaskedLM(BERT_CFG)
    init, params = prepared(model)
    g = torch.Generator().manual_seed(4322)
    B, T, V = 2, 10, BERT_CFG["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=g)
    attention_mask = torch.ones(B, T, dtype=torch.int64)
    attention_mask[0, 7:] = 0   # three padded positions
    attention_mask[1, 9:] = 0   # one
    token_type_ids = torch.zeros(B, T, dtype=torch.int64)
    token_type_ids[1, 5:] = 1   # a second segment
    labels = torch.full((B, T), -100, dtype=torch.int64)
    for b, t in [(0, 1), (0, 4), (0, 5), (1, 0), (1, 3), (1, 6), (1, 8)]:
        labels[b, t] = int(torch.randint(0, V, (), generator=g))
    logits, loss = model(ids, attention_mask, token_type_ids, labels)
    loss.backward()
    meta = dict(MAGIC, kind="bert_parity", torch=torch.__version__, config=json.dumps(BERT_CFG),
                init_seed=str(INIT_SEED),
                init="init_weights: torch.manual_seed(init_seed); over named_parameters in order: biases 0, "
                     "LayerNorm weights 1, the rest normal_(0, 0.02)",
                params="init.<name> + 0.05 * randn(generator seeded perturb_seed), in named_parameters order",
                perturb_seed=str(PERTURB_SEED),
                batch="ids randint(0, V, (B, T)) with generator seed 4322; attention_mask 0 at [0, 7:] and [1, 9:]; "
                      "token_type_ids 1 at [1, 5:]; labels -100 except 7 positions (random ids)")
    tensors = init + params + [("ids", ids), ("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                               ("labels", labels), ("logits", logits.detach()),
                               ("loss", loss.detach().reshape(()))] + grads(model)
    st_io.save(path, tensors, meta)


def main():
    out = common.fixture_out_dir()
    write_vit(os.path.join(out, "vit_tiny.safetensors"))
    write_bert(os.path.join(out, "bert_tiny.safetensors"))


if __name__ == "__main__":
    main()
