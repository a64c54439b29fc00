#!/usr/bin/env python3
"""The instruction-tuning set of recipes/gpt-kjv-books-lora.toml: each KJV verse as a prompt,
its book's name as the completion (66 classes), from Debian's `bible` program (bible-kjv).

    python3 scripts/make-kjv-books.py [OUT_DIR]      # default data/kjv-books

Writes OUT_DIR/books.jsonl ({"prompt": "<verse> Book:", "completion": " <Book name>"}, one
line per verse, in a seeded shuffle, so the recipe's val split, the file's last 5%, is a
random held-out sample of every book) and OUT_DIR/baselines.json: the majority-class
exact-match accuracy on that split. Verses are cut to their first 160 characters (at a word)
so a prompt and its completion fit the recipe's 64 tokens. Standard library only."""
import json
import os
import random
import re
import subprocess
import sys

BOOKS = [  # the `bible` program's abbreviations, in order, with full names (numbers spelled out:
    # the engine's KJV tokenizer has no digits)
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"), ("Deu", "Deuteronomy"),
    ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"), ("1Sm", "First Samuel"), ("2Sm", "Second Samuel"),
    ("1Ki", "First Kings"), ("2Ki", "Second Kings"), ("1Chr", "First Chronicles"), ("2Chr", "Second Chronicles"),
    ("Ezra", "Ezra"), ("Neh", "Nehemiah"), ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"),
    ("Prv", "Proverbs"), ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"),
    ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "First Corinthians"), ("2Cor", "Second Corinthians"), ("Gal", "Galatians"),
    ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"), ("1Th", "First Thessalonians"),
    ("2Th", "Second Thessalonians"), ("1Tim", "First Timothy"), ("2Tim", "Second Timothy"), ("Titus", "Titus"),
    ("Phmn", "Philemon"), ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "First Peter"), ("2Pet", "Second Peter"),
    ("1Jn", "First John"), ("2Jn", "Second John"), ("3Jn", "Third John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]
VAL_FRACTION = 0.05  # the recipe's data.val_fraction


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "data/kjv-books"
    try:
        text = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"make-kjv-books: cannot run `bible` ({e}); install bible-kjv and bible-kjv-text "
                 "(scripts/install-deps.sh)")
    names = dict(BOOKS)
    ref = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    samples = []
    for line in text.splitlines():
        m = ref.match(line)
        if not m:
            continue
        abbr, verse = m.group(1), m.group(4).strip()
        if abbr not in names:
            sys.exit(f"make-kjv-books: unknown book abbreviation {abbr!r} in {line[:40]!r}")
        if len(verse) > 160:
            verse = verse[:160].rsplit(" ", 1)[0]
        samples.append({"prompt": verse + " Book:", "completion": " " + names[abbr]})
    if len(samples) < 30000:
        sys.exit(f"make-kjv-books: only {len(samples)} verses read; reinstall bible-kjv-text")
    random.Random(1337).shuffle(samples)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "books.jsonl"), "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    n_val = max(1, int(len(samples) * VAL_FRACTION))
    val = samples[-n_val:]
    counts = {}
    for s in val:
        counts[s["completion"]] = counts.get(s["completion"], 0) + 1
    top = max(counts, key=counts.get)
    base = {"val_samples": n_val, "majority_class": top.strip(), "majority_exact_match": counts[top] / n_val,
            "classes_in_val": len(counts)}
    with open(os.path.join(out, "baselines.json"), "w") as f:
        json.dump(base, f, indent=1)
    print(f"make-kjv-books: {len(samples)} verses -> {out}/books.jsonl; val {n_val} samples, majority class "
          f"{top.strip()!r} = {100 * base['majority_exact_match']:.2f}% exact match")


if __name__ == "__main__":
    main()
