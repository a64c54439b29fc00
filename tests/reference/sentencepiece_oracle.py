#!/usr/bin/python3
"""Reference for tests/data/test_sentencepiece_hf.cpp: trains a LLaMA-style SentencePiece model
with python3-sentencepiece and writes what sentencepiece's encode() gives for each test string.

    /usr/bin/python3 sentencepiece_oracle.py TRAIN.txt MODEL_PREFIX VOCAB_SIZE IN.json OUT.json

Training uses LLaMA's tokenizer.model settings (BPE, byte_fallback, identity normalization,
add_dummy_prefix, whitespace kept, digits split, unk/bos/eos = 0/1/2, no pad), one thread.
OUT.json: {"ids": [[...], ...], "decoded": [...], "bos_id": 1, "eos_id": 2, "vocab_size": N}; ids are
sp.encode(s) exactly, without BOS (the C++ side adds it when asked, as LlamaTokenizer does),
decoded is sp.decode(ids).
Needs Debian's python3-sentencepiece (scripts/install-deps.sh); run by /usr/bin/python3.
"""
import json
import sys

try:
    import sentencepiece as spm
except ImportError:
    sys.exit("python3-sentencepiece is missing for /usr/bin/python3: run scripts/install-deps.sh")


def main():
    train, prefix, vocab, in_path, out_path = sys.argv[1:6]
    spm.SentencePieceTrainer.train(
        input=train, model_prefix=prefix, vocab_size=int(vocab), model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    with open(in_path, encoding="utf-8") as f:
        strings = json.load(f)
    ids = [sp.encode(s) for s in strings]
    out = {"ids": ids, "decoded": [sp.decode(i) for i in ids], "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
           "vocab_size": sp.get_piece_size()}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
