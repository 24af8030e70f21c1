#!/usr/bin/env python3
"""tidal's tokenizer against the HF `tokenizers` package (reference), token for token.

The test trains byte-level BPE tokenizers with HF `tokenizers` on English text found on the
machine (/usr/share/common-licenses, /usr/share/doc/*/copyright), shaped as GPT-2, Llama 3
and Qwen2 tokenizers are (pre-tokenizer regexes, ByteLevel, NFC, ignore_merges, a BOS
template, special tokens), writes each tokenizer.json to a temp folder and runs
`tidal-tokenize` over thousands of strings: corpus lines and generated strings with Unicode,
emoji, whitespace runs, digits and special tokens. Encode ids and decoded text must be 100 %
identical to HF's (tolerance: none — tokens are integers). Decoding also covers random id
sequences that cut multi-byte characters (U+FFFD replacement as Rust's from_utf8_lossy).
Also: the character vocabulary written by `tidal-tokenize --write-char-vocab` must load in HF
and agree. Exit 0 = pass, 1 = fail, 77 = HF tokenizers missing.
"""
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
except ImportError:
    print("skip: HF tokenizers is not installed")
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
TOOL = os.path.join(BUILD, "bin", "tidal-tokenize")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    text, total = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        text.append(t)
        total += len(t)
        if total > 1_500_000:
            break
    return text


POOL = {
    "word": ["the", "The", "licence", "software", "GNU", "don't", "I'M", "we'RE", "it's", "'S", "'ſ", "'ll", "you'd",
             "Kelvin", "naïve", "café", "Ångström", "straße", "ﬁne", "ΑΘΗΝΑ", "москва", "日本語", "中文字符", "한국어",
             "עברית", "العربية", "हिन्दी", "ภาษาไทย", "x", "a1b2", "snake_case", "CamelCase", "e\u0301", "A\u030a",
             "\u1100\u1161\u11a8", "o\u0308\u0301", "\u0915\u094d\u0937", "ǅ", "İstanbul", "K", "ꓘ"],
    "digit": ["0", "7", "42", "123", "2024", "1234567", "3.14159", "1,000,000", "٣٤٥", "²³", "Ⅻ", "１２３", "🯰🯱"],
    "space": [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\x85", "\u2028", "\u180e",
              "\u200b", "\ufeff", "\x0b", "\x0c", "\x1c", "\t \t", "        ", "\n   \n"],
    "emoji": ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🤖", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "∑∫√", "→", "…", "—", "«»", "©®™"],
    "punct": [".", ",", "!", "?", "...", "!!!", "(", ")", "[]", "{}", "\"", "'", "`", "-", "--", "_", "#", "@",
              "$", "%", "^", "&", "*", "+=", "<", ">", "</", "/>", "|", "\\", ";", ":", "~"],
}


def generated(rng, specials, n):
    kinds = list(POOL)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            if specials and r < 0.06:
                parts.append(rng.choice(specials))
            elif r < 0.08:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF),
                                             rng.randint(0x3000, 0xD7FF), rng.randint(0xE000, 0xFFFD),
                                             rng.randint(0x10000, 0x2FFFF)])))
            else:
                parts.append(rng.choice(POOL[rng.choice(kinds)]))
        out.append("".join(parts))
    return out


def test_strings(rng, lines, specials, n_lines, n_gen):
    picked = rng.sample(lines, min(n_lines, len(lines)))
    s = picked + generated(rng, specials, n_gen)
    s += ["", " ", "\n", "  leading", "trailing  ", "a" * 3000, " " * 500 + "x", "\n" * 40, "9" * 100,
          "😀" * 50, "<|endoftext|>", "<|endoftext|><|endoftext|>", "<|endo", "x<|im_start|>y"]
    return s


def nfc_strings(rng):
    """Strings that NFC changes: every canonically decomposable character in NFD form, and
    random base + combining-mark sequences (marks out of canonical order, Hangul jamo), including
    marks assigned after Unicode 9.0, which HF's NFC tables (9.0) treat as class 0."""
    import unicodedata
    dec = [c for c in range(0x80, 0x30000) if unicodedata.decomposition(chr(c))[:1] not in ("", "<")]
    out = [unicodedata.normalize("NFD", chr(c)) + chr(c) for c in dec]
    marks = [c for c in range(0x300, 0x370)] + [0x1DC0, 0x20D0, 0x302A, 0x3099, 0x05B0, 0x0654, 0x093C, 0x0F72,
                                                    0x1DF6, 0x09FE, 0x0898, 0x10EAB, 0x1E130, 0x1DFA, 0x11930]
    bases = "aeiouAEIOUnNcCsSzZ" + "".join(chr(c) for c in (0x3B1, 0x3C9, 0x415, 0x627, 0x915, 0x3042, 0x1100, 0x1161))
    for _ in range(1500):
        s = "".join(rng.choice(bases) + "".join(chr(rng.choice(marks)) for _ in range(rng.randint(0, 4)))
                    for _ in range(rng.randint(1, 6)))
        out.append(s + chr(0x1161 + rng.randrange(21)) + chr(0x11A8 + rng.randrange(27)))
    return out


def run_tool(args, lines):
    p = subprocess.run([TOOL] + args, input="\n".join(lines) + "\n", capture_output=True, text=True, encoding="utf-8")
    if p.returncode != 0:
        print("tidal-tokenize failed:", p.stderr.strip())
        sys.exit(1)
    out = p.stdout.split("\n")
    assert out[-1] == "" and len(out) == len(lines) + 1, (len(out), len(lines))
    return out[:-1]


def ids_of(line):
    return [int(x) for x in line.split()] if line.strip() else []


def train(text, pre, vocab, specials, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, tr)
    return tok


def build(text):
    """The tokenizers under test: (name, HF Tokenizer, its tokenizer.json as a dict)."""
    out = []
    # GPT-2: ByteLevel pre-tokenizer with its own regex, <|endoftext|>, ByteLevel post-processor.
    t = train(text, pre_tokenizers.ByteLevel(add_prefix_space=False), 3000, ["<|endoftext|>"])
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    t.add_tokens(["hello world", "<extra>"])                       # normalized, non-special added tokens
    out.append(("gpt2-style", t))
    # GPT-2 with add_prefix_space (RoBERTa-like) and a special token with lstrip/rstrip.
    t = train(text, pre_tokenizers.ByteLevel(add_prefix_space=True), 2000, ["<|endoftext|>"])
    j = json.loads(t.to_str())
    j["added_tokens"].append({"id": len(j["model"]["vocab"]), "content": "<mask>", "single_word": False,
                              "lstrip": True, "rstrip": True, "normalized": False, "special": True})
    out.append(("gpt2-prefix-space", Tokenizer.from_str(json.dumps(j))))
    # Llama 3: Split(regex) + ByteLevel(use_regex=false), ignore_merges, BOS template, merges as "a b".
    llama_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    t = train(text, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 4000, llama_specials)
    j = json.loads(t.to_str())
    j["model"]["ignore_merges"] = True
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [0], "tokens": ["<|begin_of_text|>"]}}}]}
    out.append(("llama3-style", Tokenizer.from_str(json.dumps(j))))
    # Qwen2: NFC normalizer, Split(regex with single digits) + ByteLevel(use_regex=false).
    t = train(text, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), 4000,
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], normalizer=normalizers.NFC())
    out.append(("qwen2-style", t))
    # Other pre-tokenizer paths: literal Split with MergedWithNext, Digits, Contiguous, an
    # inverted Split, ByteLevel with prefix space but no regex; BPE with "##" / "</w>" affixes.
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"[,.;:!?]+"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"\p{Lu}\p{Ll}*"), behavior="merged_with_previous", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    t = Tokenizer(models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<s>"], show_progress=False, continuing_subword_prefix="##",
        end_of_word_suffix="</w>", initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.append(("misc-pretok", t))
    # Not byte-level: Split on whitespace (removed), unknown characters → fused <unk>, and byte
    # fallback (<0xXX> tokens) in a second copy; Fuse decoder.
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")
    t.decoder = decoders.Fuse()
    t.train_from_iterator(text, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "</s>"],
                                                    show_progress=False, limit_alphabet=80))
    out.append(("unk-fused", t))
    j = json.loads(t.to_str())
    n = len(j["model"]["vocab"])
    for b in range(256):
        j["model"]["vocab"]["<0x%02X>" % b] = n + b
    j["model"]["byte_fallback"] = True
    out.append(("byte-fallback", Tokenizer.from_str(json.dumps(j))))
    return out


def compare(name, hf, path, strings, rng):
    ok = True
    specials = [a.content for a in hf.get_added_tokens_decoder().values() if a.special]
    enc = [json.dumps(s) for s in strings]
    # encode, HF defaults: specials matched in text, post-processor on
    got = run_tool(["--tokenizer", path, "--json"], enc)
    ref = [hf.encode(s).ids for s in strings]
    same = sum(ids_of(g) == r for g, r in zip(got, ref))
    print(f"{name} encode: {same}/{len(strings)} identical to HF tokenizers")
    for g, r, s in [(g, r, s) for g, r, s in zip(got, ref, strings) if ids_of(g) != r][:3]:
        print(f"  mismatch on {s!r}\n    tidal {ids_of(g)}\n    hf    {r}")
    ok &= same == len(strings)
    unk, fb = hf.token_to_id("<unk>"), hf.token_to_id("<0xE2>")
    if unk is not None:             # the unknown-character and byte-fallback paths are exercised
        n_unk = sum(unk in r for r in ref)
        n_fb = sum(any(hf.id_to_token(i).startswith("<0x") for i in r) for r in ref) if fb is not None else 0
        print(f"{name}: {n_unk} strings encode with <unk>, {n_fb} with byte-fallback tokens")
        ok &= (n_fb > 100) if fb is not None else (n_unk > 100)
    # encode without special-token matching and without the post-processor
    sub = strings[:1500]
    got = run_tool(["--tokenizer", path, "--json", "--no-special", "--no-add-special"], [json.dumps(s) for s in sub])
    hf.encode_special_tokens = True
    ref2 = [hf.encode(s, add_special_tokens=False).ids for s in sub]
    hf.encode_special_tokens = False
    same = sum(ids_of(g) == r for g, r in zip(got, ref2))
    print(f"{name} encode --no-special --no-add-special: {same}/{len(sub)} identical")
    for g, r, s in [(g, r, s) for g, r, s in zip(got, ref2, sub) if ids_of(g) != r][:3]:
        print(f"  mismatch on {s!r}\n    tidal {ids_of(g)}\n    hf    {r}")
    ok &= same == len(sub)
    # decode: the ids of each string, and random id sequences that split multi-byte characters
    vs = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet() if hf.token_to_id(c) is not None]
    seqs = [r for r in ref]
    for _ in range(2000):
        k = rng.randint(1, 20)
        seqs.append([rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(vs + 3) for _ in range(k)])
    for skip in (False, True):
        args = ["--tokenizer", path, "--decode", "--json"] + (["--skip-special"] if skip else [])
        got = [json.loads(x) for x in run_tool(args, [" ".join(map(str, q)) for q in seqs])]
        refd = [hf.decode([i for i in q if i < vs], skip_special_tokens=skip) for q in seqs]
        same = sum(g == r for g, r in zip(got, refd))
        print(f"{name} decode (skip_special={skip}): {same}/{len(seqs)} identical to HF tokenizers")
        for g, r, q in [(g, r, q) for g, r, q in zip(got, refd, seqs) if g != r][:3]:
            print(f"  mismatch on ids {q}\n    tidal {g!r}\n    hf    {r!r}")
        ok &= same == len(seqs)
    if (json.loads(hf.to_str()).get("decoder") or {}).get("type") == "ByteLevel":
        lossy = sum("\ufffd" in r for r in refd)
        print(f"{name} decode: {lossy} of the sequences decode to text with U+FFFD (cut characters)")
        ok &= lossy > 100
    return ok, specials


# Split regexes beyond the three families (Oniguruma semantics that PCRE2 spells differently:
# \s, \w, \h, \v; anchors; case folding; DeepSeek-V3's patterns).
REGEXES = [r"\w+", r"\W+", r"\v|\h+", r"\d+", r"\s+", r"\S+", r"[^\s\p{L}]+", r"(?i:ab|st|k)", r"\p{Lu}\p{Ll}+",
           r"^\s*\w+", r"\w+$", r".+", r"[\r\n]+|[^\r\n]+", r"\p{N}{1,3}", r"[一-龥\u3040-ゟ゠-ヿ]+",
           r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+", r"x*", r"\b"]


def regex_battery(hf_gpt2, tmp, strings):
    """Each regex as a Split (Isolated) before ByteLevel(use_regex=false) on the trained GPT-2
    vocabulary: piece boundaries show in the ids, since merges never cross pieces."""
    ok, total, same = True, 0, 0
    base = json.loads(hf_gpt2.to_str())
    for k, rx in enumerate(REGEXES):
        j = dict(base)
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        hf = Tokenizer.from_str(json.dumps(j))
        d = os.path.join(tmp, "regex%d" % k)
        os.makedirs(d)
        path = os.path.join(d, "tokenizer.json")
        hf.save(path)
        got = run_tool(["--tokenizer", path, "--json"], [json.dumps(x) for x in strings])
        n = sum(ids_of(g) == hf.encode(x).ids for g, x in zip(got, strings))
        if n != len(strings):
            bad = [x for g, x in zip(got, strings) if ids_of(g) != hf.encode(x).ids][:2]
            print(f"  regex {rx!r}: {n}/{len(strings)} identical, e.g. {bad}")
            ok = False
        total += len(strings)
        same += n
    print(f"split-regex battery ({len(REGEXES)} patterns) encode: {same}/{total} identical to HF tokenizers")
    return ok


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"{TOOL} is not built")
        return 1
    rng = random.Random(20261121)
    text = corpus()
    lines = [l for t in text for l in t.split("\n") if l.strip()]
    if len(lines) < 2000:
        print("not enough English text on this machine for the corpus")
        return 1
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, hf in build(text):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            path = os.path.join(d, "tokenizer.json")
            hf.save(path)
            specials = [a.content for a in hf.get_added_tokens_decoder().values()]
            strings = test_strings(rng, lines, specials, 2000, 3000)
            if name == "qwen2-style":
                strings += nfc_strings(rng)
            good, _ = compare(name, hf, path, strings, rng)
            ok &= good
            if name == "gpt2-style":
                ok &= regex_battery(hf, tmp, strings[:600] + strings[2000:2400])
        # the character vocabulary: written by tidal, loaded by HF
        d = os.path.join(tmp, "charvocab")
        os.makedirs(d)
        subprocess.run([TOOL, "--write-char-vocab", d], check=True)
        path = os.path.join(d, "tokenizer.json")
        hf = Tokenizer.from_file(path)
        alpha = "0123456789abcdefghijklmnopqrstuvwxyzABCDEF +-*/=()<>.,:;!?\n"
        strings = ["".join(rng.choice(alpha) for _ in range(rng.randint(0, 60))) for _ in range(2000)]
        strings += ["12+34=46", "<bos>1+1=2<eos>", "é unknown ☃", "<pad><unk>x", ""]
        got = run_tool(["--tokenizer", path, "--json"], [json.dumps(s) for s in strings])
        same = sum(ids_of(g) == hf.encode(s).ids for g, s in zip(got, strings))
        print(f"charvocab encode: {same}/{len(strings)} identical to HF tokenizers")
        ok &= same == len(strings)
        dec = [json.loads(x) for x in run_tool(["--tokenizer", path, "--decode", "--json"], got)]
        same = sum(g == hf.decode(ids_of(i), skip_special_tokens=False) for g, i in zip(dec, got))
        rt = sum(g == "<bos>" + s for g, s in zip(dec, strings[:2000]))
        print(f"charvocab decode: {same}/{len(strings)} identical to HF tokenizers, round trip {rt}/2000")
        ok &= same == len(strings) and rt == 2000
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
