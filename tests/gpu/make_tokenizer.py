#!/usr/bin/env python3
"""A byte-level BPE tokenizer.json for a random checkpoint that has none (tidal-init writes weights
and config.json only; tidal-rl needs a tokenizer to decode completions for the reward): the 256
byte symbols, filler tokens up to the model's vocab_size (so every id the random policy samples
decodes to text), no merges, and config.json's eos_token_id as <|endoftext|>. For timing runs
only (tests/gpu/run.sh rl-bench): the text it makes is meaningless.

  make_tokenizer.py MODEL_DIR
"""
import json
import os
import sys


def byte_symbols():
    """GPT-2's byte-to-unicode table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    V = cfg["vocab_size"]
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None or not 256 <= eos < V:
        eos = V - 1
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for i in range(256, V):
        if i != eos:
            vocab[f"tok{i}"] = i
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []},
    }
    vocab["<|endoftext|>"] = eos
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "bos_token": None, "model_max_length": 1 << 20}, f)
    print(f"make_tokenizer.py: {d}/tokenizer.json, vocab {V}, eos {eos}", file=sys.stderr)


if __name__ == "__main__":
    main()
