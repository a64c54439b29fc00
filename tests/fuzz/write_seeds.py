#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets added after safetensors and recipe into
tests/fuzz/corpus/<target>/ (seed_* from real files or the formats' own writers' layout, bad_* by
hand). Run from the repository root: python3 tests/fuzz/write_seeds.py. Needs only the standard
library; the Fashion-MNIST seeds read Debian's dataset-fashion-mnist when installed (skipped
otherwise). Files already in the corpus (crash-* inputs kept by scripts/fuzz.sh) are left alone.

A bundle (targets.h split_bundle) is several files in one input: each part is a line "@@ <name>"
followed by the file's bytes up to the next "\\n@@ ".
"""
import gzip
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
FASHION = "/usr/share/datasets/fashion-mnist"


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def bundle(parts):
    out = b""
    for i, (name, data) in enumerate(parts):
        if isinstance(data, str):
            data = data.encode()
        assert b"\n@@ " not in data, name
        out += (b"\n" if i else b"") + b"@@ " + name.encode() + b"\n" + data
    return out


# ---- token_file: data/text/token_file.h (28-byte header: magic, version, dtype, vocab, count) ----
def token_file(tokens, vocab, dtype=None, version=1, magic=b"BRGTOKEN", count=None):
    dtype = dtype if dtype is not None else (2 if vocab <= 65536 else 4)
    count = len(tokens) if count is None else count
    body = b"".join(struct.pack("<H" if dtype == 2 else "<I", t) for t in tokens)
    return magic + struct.pack("<III", version, dtype, vocab) + struct.pack("<Q", count) + body


def seeds_token_file():
    text = "In the beginning God created the heaven and the earth.\n" * 4
    ids = [ord(c) % 4096 for c in text]
    put("token_file", "seed_u16.bin", token_file(ids, 4096))
    put("token_file", "seed_u32.bin", token_file([i * 691 % 70000 for i in range(100)], 70000))
    put("token_file", "seed_empty_tokens.bin", token_file([], 512))
    put("token_file", "bad_magic.bin", token_file(ids[:10], 4096, magic=b"BRGTOKEM"))
    put("token_file", "bad_version.bin", token_file(ids[:10], 4096, version=2))
    put("token_file", "bad_dtype.bin", token_file(ids[:10], 4096, dtype=3))
    put("token_file", "bad_vocab_zero.bin", token_file([], 0, dtype=2))
    put("token_file", "bad_dtype_for_vocab.bin", token_file(ids[:10], 70000, dtype=2))
    put("token_file", "bad_truncated.bin", token_file(ids, 4096)[:-1])
    put("token_file", "bad_count_short.bin", token_file(ids, 4096, count=len(ids) - 1))
    put("token_file", "bad_count_huge.bin", token_file(ids[:4], 4096, count=2**63 + 1))
    put("token_file", "bad_token_ge_vocab.bin", token_file([1, 2, 300, 4], 300))
    put("token_file", "bad_short_header.bin", token_file(ids, 4096)[:10])
    put("token_file", "bad_empty.bin", b"")


# ---- fashion_idx: big-endian IDX, gzip'd (data/image/fashion_mnist.h) ----
def idx(dims, payload, ndim=None, typ=0x08):
    ndim = len(dims) if ndim is None else ndim
    return bytes([0, 0, typ, ndim]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


def seeds_fashion_idx():
    n = 3
    if os.path.isdir(FASHION):
        with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
            head = f.read(16 + n * 784)
        with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
            lhead = f.read(8 + n)
        pixels, labels = head[16:], lhead[8:]
    else:  # no dataset installed: a made-up image
        pixels, labels = bytes((i * 7) % 256 for i in range(n * 784)), bytes([9, 2, 1])
    images_idx, labels_idx = idx([n, 28, 28], pixels), idx([n], labels)
    put("fashion_idx", "seed_t10k_images3.idx3.gz", gz(images_idx))
    put("fashion_idx", "seed_t10k_labels3.idx1.gz", gz(labels_idx))
    put("fashion_idx", "seed_t10k_labels3.idx1", labels_idx)
    put("fashion_idx", "seed_bundle_t10k3", bundle([("images", gz(images_idx)), ("labels", gz(labels_idx))]))
    put("fashion_idx", "seed_bundle_plain1", bundle([("images", idx([1, 28, 28], pixels[:784])),
                                                      ("labels", idx([1], labels[:1]))]))
    put("fashion_idx", "bad_bundle_count_mismatch", bundle([("images", gz(images_idx)), ("labels", gz(idx([2], labels[:2])))]))
    put("fashion_idx", "bad_bundle_label_10", bundle([("images", gz(images_idx)), ("labels", gz(idx([n], bytes([1, 10, 2]))))]))
    put("fashion_idx", "bad_bundle_27x28", bundle([("images", gz(idx([1, 27, 28], pixels[:27 * 28]))),
                                                    ("labels", gz(idx([1], labels[:1])))]))
    put("fashion_idx", "bad_magic.gz", gz(idx([n], labels, typ=0x09)))
    put("fashion_idx", "bad_ndim.gz", gz(idx([n, 28], pixels[:n * 28])))
    put("fashion_idx", "bad_huge_dims.gz", gz(idx([0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b"")))
    put("fashion_idx", "bad_dims_past_data.gz", gz(idx([60000, 28, 28], pixels)))
    put("fashion_idx", "bad_huge_dims_plain", idx([0x10000000, 28, 28], pixels[:100]))
    put("fashion_idx", "bad_truncated_data.gz", gz(idx([n], labels[:2])))
    put("fashion_idx", "bad_trailing.gz", gz(idx([n], labels + b"\x00")))
    put("fashion_idx", "bad_gzip_cut.gz", gz(images_idx)[:200])
    put("fashion_idx", "bad_empty", b"")


# ---- checkpoint_state: train/checkpoint.cpp write_checkpoint_files' state.json ----
def rng_state(seed=1337):
    # core/rng.cpp Generator::state(): magic, seed, index, the 624 Mersenne Twister words, the
    # cached normals (flag, bits); the words of mt19937 seeded with `seed`.
    mt = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    return "brigade-rng-v1 %d 624 %s 0 0 0 0" % (seed, " ".join(str(w) for w in mt))


def state_json(**over):
    s = {"version": 1, "step": 40, "tokens_seen": 40960, "rng_state": "",
         "last_val_loss": 2.4375,
         "accumulation": json.dumps({"current": 4, "ema_s": 0.5, "ema_g": 0.25, "observations": 12},
                                    separators=(",", ":")),
         "loss_scaler": json.dumps({"mode": "dynamic", "scale": 32768.0, "good_steps": 12, "streak": 0,
                                    "overflows": 1, "skipped": 1, "window_amax": 3.5}, separators=(",", ":")),
         "optimizer_steps": 39,
         "step_guard": json.dumps({"losses": [2.5, 2.4, 2.45], "grad_norms": [1.0, 0.9, 1.1], "rolled_back": [17],
                                   "consecutive_skips": 0}, separators=(",", ":")),
         "early_stop": {"best_step": 40, "best_val_loss": 2.4375, "evals_since_best": 0}}
    for k, v in over.items():
        if v is None:
            s.pop(k, None)
        else:
            s[k] = v
    return json.dumps(s, indent=2) + "\n"


def seeds_checkpoint_state():
    t = "checkpoint_state"
    put(t, "seed_full.json", state_json(rng_state=rng_state()))
    put(t, "seed_no_rng.json", state_json())
    put(t, "seed_older.json", json.dumps({"version": 1, "step": 3, "tokens_seen": 96, "rng_state": "",
                                          "last_val_loss": -1}, indent=2) + "\n")
    put(t, "seed_fresh.json", state_json(last_val_loss=None, early_stop=None, step_guard=None, accumulation="",
                                         loss_scaler="").replace('"last_val_loss": 2.4375', '"last_val_loss": null'))
    put(t, "bad_step_float_huge.json", state_json(step=1e300))
    put(t, "bad_step_fraction.json", state_json(step=2.5))
    put(t, "bad_step_negative.json", state_json(step=-1))
    put(t, "bad_tokens_unsigned_huge.json", state_json(tokens_seen=18446744073709551615))
    put(t, "bad_version.json", state_json(version=2))
    put(t, "bad_version_float.json", state_json(version=1e300))
    put(t, "bad_not_object.json", "[1, 2, 3]\n")
    put(t, "bad_not_json.json", "{\"version\": 1, \"step\": ")
    put(t, "bad_missing_step.json", state_json(step=None))
    put(t, "bad_last_val_loss_string.json", state_json(last_val_loss="low"))
    put(t, "bad_early_stop_not_object.json", state_json(early_stop=[40]))
    put(t, "bad_early_stop_float.json", state_json(early_stop={"best_step": 1e300, "best_val_loss": 1,
                                                               "evals_since_best": 0}))
    put(t, "bad_optimizer_steps_float.json", state_json(optimizer_steps=-1e300))
    put(t, "bad_guard_malformed.json", state_json(step_guard="{\"losses\": [1,"))
    put(t, "bad_guard_float_step.json", state_json(step_guard=json.dumps(
        {"losses": [1.0], "grad_norms": [1.0], "rolled_back": [1e300], "consecutive_skips": 0})))
    put(t, "bad_guard_uneven.json", state_json(step_guard=json.dumps(
        {"losses": [1.0, 2.0], "grad_norms": [1.0], "rolled_back": [], "consecutive_skips": 1e300})))
    put(t, "bad_accumulation_float.json", state_json(accumulation=json.dumps(
        {"current": 1e300, "ema_s": 0.5, "ema_g": 0.25, "observations": -1e300})))
    put(t, "bad_scaler_float.json", state_json(loss_scaler=json.dumps(
        {"scale": 1024.0, "good_steps": 1e300, "streak": 0, "overflows": 0, "skipped": 0, "window_amax": 0})))
    put(t, "bad_scaler_zero_scale.json", state_json(loss_scaler=json.dumps(
        {"scale": 0.0, "good_steps": 1, "streak": 0, "overflows": 0, "skipped": 0, "window_amax": 0})))
    put(t, "bad_rng_garbage.json", state_json(rng_state="not a generator"))
    put(t, "bad_rng_truncated.json", state_json(rng_state=rng_state()[:200]))


# ---- optimizer_index: ckpt/checkpoint_dir.cpp write_optimizer_index (json.dump(1)) ----
def opt_index(**over):
    j = {"format": "brigade-flat-shards", "version": 1, "dp": 2, "numel": 8, "states": ["exp_avg", "exp_avg_sq"],
         "layout": [{"name": "w", "offset": 0, "numel": 6}, {"name": "b", "offset": 6, "numel": 2}],
         "shards": [{"file": "optimizer-00000-of-00002.safetensors", "lo": 0, "hi": 4},
                    {"file": "optimizer-00001-of-00002.safetensors", "lo": 4, "hi": 8}]}
    j.update(over)
    return json.dumps(j, indent=1) + "\n"


def seeds_optimizer_index():
    t = "optimizer_index"
    shard = lambda f, lo, hi: {"file": f, "lo": lo, "hi": hi}
    s0, s1 = "optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"
    put(t, "seed_dp2.json", opt_index())
    put(t, "seed_one_state.json", opt_index(states=["exp_avg"]))
    put(t, "bad_file_parent.json", opt_index(shards=[shard("../zero/" + s0, 0, 4), shard(s1, 4, 8)]))
    put(t, "bad_file_absolute.json", opt_index(shards=[shard("/etc/passwd", 0, 4), shard(s1, 4, 8)]))
    put(t, "bad_file_long.json", opt_index(shards=[shard("x" * 300, 0, 4), shard(s1, 4, 8)]))
    put(t, "bad_file_number.json", opt_index(shards=[shard(7, 0, 4), shard(s1, 4, 8)]))
    put(t, "bad_lo_float_huge.json", opt_index(shards=[shard(s0, -1e300, 4), shard(s1, 4, 1e300)]))
    put(t, "bad_hi_before_lo.json", opt_index(shards=[shard(s0, 4, 0), shard(s1, 4, 8)]))
    put(t, "bad_range_size.json", opt_index(shards=[shard(s0, 0, 3), shard(s1, 3, 8)]))
    put(t, "bad_layout_other.json", opt_index(layout=[{"name": "w", "offset": 0, "numel": 1e300},
                                                      {"name": "b", "offset": 6, "numel": 2}]))
    put(t, "bad_layout_count.json", opt_index(layout=[{"name": "w", "offset": 0, "numel": 6}]))
    put(t, "bad_layout_not_array.json", opt_index(layout={"w": 6}))
    put(t, "bad_states_numbers.json", opt_index(states=[1, 2]))
    put(t, "bad_state_missing.json", opt_index(states=["momentum"]))
    put(t, "bad_format.json", opt_index(format="brigade-flat-shards-v9"))
    put(t, "bad_not_object.json", "\"brigade-flat-shards\"\n")
    put(t, "bad_not_json.json", opt_index()[:60])


# ---- hf_config: the fixtures' config.json (tests/reference/make_hf_dirs.py) ----
def seeds_hf_config():
    t = "hf_config"
    hf = os.path.join(FIXTURES, "hf")
    for d in sorted(os.listdir(hf)):
        with open(os.path.join(hf, d, "config.json"), "rb") as f:
            put(t, "seed_%s.json" % d, f.read())
    with open(os.path.join(hf, "gpt2", "config.json")) as f:
        gpt2 = json.load(f)
    with open(os.path.join(hf, "llama", "config.json")) as f:
        llama = json.load(f)
    with open(os.path.join(hf, "llama3_tied", "config.json")) as f:
        llama3 = json.load(f)

    def bad(name, base, **over):
        c = dict(base)
        for k, v in over.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        put(t, "bad_%s.json" % name, json.dumps(c, indent=2) + "\n")

    bad("vocab_float_huge", gpt2, vocab_size=1e300)
    bad("vocab_fraction", gpt2, vocab_size=96.5)
    bad("vocab_huge", gpt2, vocab_size=2**40)
    bad("n_embd_unsigned_huge", gpt2, n_embd=18446744073709551615)
    bad("n_embd_huge_n_inner", gpt2, n_embd=2**61, n_inner=2**63 - 1)
    bad("n_head_zero", gpt2, n_head=0)
    bad("n_layer_negative", gpt2, n_layer=-2)
    bad("n_positions_string", gpt2, n_positions="32")
    bad("gpt2_relu", gpt2, activation_function="relu")
    bad("gpt2_untied", gpt2, tie_word_embeddings=False)
    bad("gpt2_n_inner", gpt2, n_inner=100)
    bad("model_type_missing", gpt2, model_type=None)
    bad("model_type_mistral", llama, model_type="mistral")
    bad("hidden_not_multiple", llama, hidden_size=30)
    bad("kv_heads_zero", llama, num_key_value_heads=0)
    bad("head_dim_float", llama, head_dim=1e300)
    bad("pretraining_tp_float", llama, pretraining_tp=-1e300)
    bad("intermediate_huge", llama, intermediate_size=2**62)
    bad("max_position_float", llama, max_position_embeddings=1e19)
    bad("rope_yarn", llama, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    bad("rope_llama3_huge", llama3, rope_scaling={"rope_type": "llama3", "factor": 1e308, "low_freq_factor": 1,
                                                  "high_freq_factor": 1e308,
                                                  "original_max_position_embeddings": 1e308})
    bad("rope_not_object", llama, rope_scaling=[1, 2])
    bad("attention_bias", llama, attention_bias=True)
    put(t, "bad_not_object.json", "[\"gpt2\"]\n")
    put(t, "bad_not_json.json", "{\"model_type\": \"gpt2\",")


# ---- hf_index: tests/fixtures/hf/llama_sharded/model.safetensors.index.json ----
def seeds_hf_index():
    t = "hf_index"
    p = os.path.join(FIXTURES, "hf", "llama_sharded", "model.safetensors.index.json")
    with open(p, "rb") as f:
        raw = f.read()
    put(t, "seed_llama_sharded.json", raw)
    j = json.loads(raw)
    wm = j["weight_map"]
    first = sorted(wm)[0]

    def bad(name, change):
        k = json.loads(raw)
        change(k)
        put(t, "bad_%s.json" % name, json.dumps(k, indent=2) + "\n")

    bad("shard_parent", lambda k: k["weight_map"].__setitem__(first, "../llama/model.safetensors"))
    bad("shard_absolute", lambda k: k["weight_map"].__setitem__(first, "/etc/passwd"))
    bad("shard_long_name", lambda k: k["weight_map"].__setitem__(first, "m" * 300 + ".safetensors"))
    bad("shard_number", lambda k: k["weight_map"].__setitem__(first, 1))
    bad("shard_null", lambda k: k["weight_map"].__setitem__(first, None))
    bad("shard_missing", lambda k: k["weight_map"].__setitem__(first, "model-00003-of-00003.safetensors"))
    bad("shard_empty_name", lambda k: k["weight_map"].__setitem__(first, ""))
    bad("one_shard_only", lambda k: k.__setitem__("weight_map", {n: "model-00001-of-00002.safetensors" for n in wm}))
    bad("weight_map_array", lambda k: k.__setitem__("weight_map", list(wm.values())))
    bad("weight_map_missing", lambda k: k.pop("weight_map"))
    put(t, "bad_not_json.json", raw[:100])
    put(t, "bad_empty.json", b"")


# ---- tokenizer: tokenizer.json / vocab.json + merges.txt (data/text/bpe.h), as Hugging Face writes them ----
def byte_map():
    # GPT-2's bytes_to_unicode()
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def toy_vocab():
    bm = byte_map()
    vocab = {bm[b]: b for b in range(256)}
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"), ("o", "r"), ("\u0120w", "or"),
                 ("l", "d"), ("\u0120wor", "ld")]:
        vocab[a + b] = len(vocab)
        merges.append(a + " " + b)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


def tokenizer_json(vocab, merges, pairs=False, llama3=False):
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    eot = vocab["<|endoftext|>"]
    j = {"version": "1.0", "truncation": None, "padding": None,
         "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                           "rstrip": False, "normalized": True, "special": True}],
         "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                   "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                   "merges": [m.split(" ") for m in merges] if pairs else merges}}
    if llama3:
        bos = len(vocab)
        j["model"]["ignore_merges"] = True
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                                   "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        j["added_tokens"].append({"id": bos, "content": "<|begin_of_text|>", "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True})
        j["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    return json.dumps(j, ensure_ascii=False)


def seeds_tokenizer():
    t = "tokenizer"
    vocab, merges = toy_vocab()
    tj = tokenizer_json(vocab, merges)
    merges_txt = "#version: 0.2\n" + "\n".join(merges) + "\n"
    vocab_json = json.dumps(vocab, ensure_ascii=False)
    put(t, "seed_tokenizer_gpt2_layout.json", tj)
    put(t, "seed_tokenizer_pairs.json", tokenizer_json(vocab, merges, pairs=True))
    put(t, "seed_tokenizer_llama3_layout.json", tokenizer_json(vocab, merges, pairs=True, llama3=True))
    put(t, "seed_bundle_gpt2_files", bundle([("vocab.json", vocab_json), ("merges.txt", merges_txt)]))
    put(t, "seed_bundle_gpt2_config", bundle([("vocab.json", vocab_json), ("merges.txt", merges_txt),
                                              ("tokenizer_config.json", json.dumps({"eos_token": "<|endoftext|>"}))]))
    put(t, "seed_bundle_marker", bundle([("tokenizer.json", tj), ("brigade_tokenizer.json",
                                         json.dumps({"type": "tokenizer-json", "files": ["tokenizer.json"]}))]))
    big = dict(vocab)
    big["<|endoftext|>"] = 2**30 - 1
    put(t, "bad_id_2p30.json", tokenizer_json(big, merges))
    big["<|endoftext|>"] = 2**63 + 5
    put(t, "bad_id_unsigned_huge.json", tokenizer_json(big, merges))
    dup = dict(vocab)
    dup["xyz"] = 0
    put(t, "bad_id_twice.json", tokenizer_json(dup, merges))
    nob = dict(vocab)
    del nob[byte_map()[0]]
    put(t, "bad_missing_byte.json", tokenizer_json(nob, merges))
    put(t, "bad_merge_unknown.json", tokenizer_json(vocab, merges + ["q z"]))
    post = json.loads(tokenizer_json(vocab, merges, pairs=True, llama3=True))
    post["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = [2**32 + 5]
    put(t, "bad_post_id_wraps.json", json.dumps(post, ensure_ascii=False))
    norm = json.loads(tj)
    norm["normalizer"] = {"type": "NFC"}
    put(t, "bad_normalizer.json", json.dumps(norm, ensure_ascii=False))
    put(t, "bad_not_json.json", tj[:300])
    put(t, "bad_bundle_merges_not_utf8", bundle([("vocab.json", vocab_json),
                                                  ("merges.txt", b"#version: 0.2\nh e\n\xff\xfe x y\n")]))
    put(t, "bad_bundle_merges_one_part", bundle([("vocab.json", vocab_json), ("merges.txt", "h e\nhe\n")]))
    put(t, "bad_bundle_vocab_float_id", bundle([("vocab.json", vocab_json.replace(': 0,', ': 0.5,', 1)),
                                                 ("merges.txt", merges_txt)]))
    put(t, "bad_bundle_eos_unknown", bundle([("vocab.json", vocab_json), ("merges.txt", merges_txt),
                                             ("tokenizer_config.json", json.dumps({"eos_token": {"content": 5}}))]))
    put(t, "bad_bundle_marker_type", bundle([("tokenizer.json", tj), ("brigade_tokenizer.json",
                                             json.dumps({"type": "wordpiece"}))]))
    put(t, "bad_bundle_empty", bundle([("vocab.json", ""), ("merges.txt", "")]))
    seeds_sentencepiece(t)


def seeds_sentencepiece(t):
    # tokenizer.model (SentencePiece's protobuf, parsed by libsentencepiece behind our wrappers): a
    # LLaMA-style model (BPE, byte fallback, unk/bos/eos 0/1/2) trained here on a fixed text, so
    # these seeds need python3-sentencepiece (/usr/bin/python3 on Debian); skipped without it.
    try:
        import sentencepiece as spm
    except ImportError:
        print("tokenizer: python3-sentencepiece missing, tokenizer.model seeds skipped (run with /usr/bin/python3)")
        return
    import io
    text = ["In the beginning God created the heaven and the earth.", "And the earth was without form, and void;",
            "and darkness was upon the face of the deep. 1234 caf\u00e9"] * 20
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=out, vocab_size=300, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        shuffle_input_sentence=False, minloglevel=2)
    model = out.getvalue()
    put(t, "seed_bundle_sentencepiece", bundle([("tokenizer.model", model)]))
    put(t, "seed_bundle_sentencepiece_config", bundle([("tokenizer.model", model), ("tokenizer_config.json",
                                                       json.dumps({"add_bos_token": True, "eos_token": "</s>"}))]))
    put(t, "seed_bundle_sentencepiece_brigade", bundle([("tokenizer.model", model), ("brigade_tokenizer.json",
                                                        json.dumps({"type": "brigade", "files": ["tokenizer.model"]}))]))
    put(t, "bad_bundle_sentencepiece_cut", bundle([("tokenizer.model", model[:len(model) // 2])]))
    flipped = bytearray(model)
    flipped[7] ^= 0x5A
    put(t, "bad_bundle_sentencepiece_flipped", bundle([("tokenizer.model", bytes(flipped))]))
    put(t, "bad_bundle_sentencepiece_empty", bundle([("tokenizer.model", b"")]))


def seeds_sft_jsonl():
    # data/text/sft.h: one sample per line, {"text"}, {"prompt", "completion"} or {"messages"}
    t = "sft_jsonl"
    J = lambda *rows: "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
    put(t, "seed_text.jsonl", J({"text": "hello world"}, {"text": "In the beginning <|endoftext|> caf\u00e9"}))
    put(t, "seed_prompt_completion.jsonl", J({"prompt": "Say hello: ", "completion": "hello world"},
                                             {"prompt": "", "completion": "x"}, {"prompt": "skip me", "completion": ""}))
    put(t, "seed_messages.jsonl", J(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello?"},
                      {"role": "assistant", "content": "world"}]},
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "c"}, {"role": "assistant", "content": "<s>d</s>"}]}))
    put(t, "seed_blank_lines.jsonl", "\n  \t\r\n" + J({"text": "x"}) + "\n\n")
    put(t, "bad_not_json.jsonl", '{"text": "x"\n')
    put(t, "bad_array_line.jsonl", '["text", "x"]\n')
    put(t, "bad_two_shapes.jsonl", J({"text": "x", "prompt": "y", "completion": "z"}))
    put(t, "bad_mixed_shapes.jsonl", J({"text": "x"}, {"prompt": "y", "completion": "z"}))
    put(t, "bad_field_not_string.jsonl", J({"text": 5}))
    put(t, "bad_prompt_only.jsonl", J({"prompt": "y"}))
    put(t, "bad_unknown_role.jsonl", J({"messages": [{"role": "tool", "content": "x"}]}))
    put(t, "bad_no_assistant.jsonl", J({"messages": [{"role": "user", "content": "x"}]}))
    put(t, "bad_messages_not_list.jsonl", J({"messages": {"role": "user", "content": "x"}}))
    put(t, "bad_message_no_content.jsonl", J({"messages": [{"role": "user"}, {"role": "assistant", "content": "b"}]}))
    put(t, "bad_message_not_object.jsonl", J({"messages": ["user", "assistant"]}))
    put(t, "bad_content_null.jsonl", J({"messages": [{"role": "user", "content": None},
                                                     {"role": "assistant", "content": "b"}]}))
    put(t, "bad_deep_nesting.jsonl", '{"text": ' + "[" * 5000 + "]" * 5000 + "}\n")
    put(t, "bad_not_utf8.jsonl", b'{"text": "\xff\xfe"}\n')
    put(t, "bad_empty.jsonl", b"")


if __name__ == "__main__":
    targets = sys.argv[1:] or ["token_file", "fashion_idx", "checkpoint_state", "optimizer_index", "hf_config",
                               "hf_index", "tokenizer", "sft_jsonl"]
    for name in targets:
        globals()["seeds_" + name]()
    for name in targets:
        d = os.path.join(CORPUS, name)
        total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-16s %3d files %7d bytes" % (name, len(os.listdir(d)), total))
        assert total < 200 * 1024, name
