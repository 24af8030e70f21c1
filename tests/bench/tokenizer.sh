#!/usr/bin/env bash
# Encode speed of tidal's tokenizer against HF `tokenizers` (Rust, via Python) on the same
# English text: the licence and copyright files under /usr/share (about 8 MB), one encode per
# line, a Llama-3-style byte-level BPE tokenizer (Split regex + ByteLevel, 16k vocab) trained
# by HF on that text. Both single-threaded: HF's encode_batch with TOKENIZERS_PARALLELISM=false
# (so no per-call Python overhead), tidal-tokenize --bench (encode time only, load excluded).
# Prints: bench: tokenizer-encode tidal=X MB/s hf=Y MB/s ratio=R (R = tidal / hf).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
{ cat /usr/share/common-licenses/* /usr/share/doc/*/copyright 2>/dev/null || true; } | head -c 8000000 \
  | iconv -f utf-8 -t utf-8 -c > "$tmp/corpus.txt"
TOKENIZERS_PARALLELISM=false "$PY" - "$tmp" <<'PYEOF' || { echo "bench: tokenizer-encode skipped (HF tokenizers missing)"; exit 0; }
import sys, time
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
d = sys.argv[1]
text = open(d + "/corpus.txt", encoding="utf-8").read()
lines = text.split("\n")
rx = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
      r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(rx), "isolated"),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=16000, show_progress=False,
                        special_tokens=["<|begin_of_text|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(d + "/tokenizer.json")
best = 1e9
for _ in range(3):
    t0 = time.perf_counter(); tok.encode_batch(lines); best = min(best, time.perf_counter() - t0)
open(d + "/hf.txt", "w").write("%.3f" % (len(text.encode()) / 1e6 / best))
PYEOF
best=0
for _ in 1 2 3; do
  r=$("$BUILD/bin/tidal-tokenize" --tokenizer "$tmp/tokenizer.json" --bench < "$tmp/corpus.txt" | sed 's/.*MB\/s //')
  best=$(awk -v a="$best" -v b="$r" 'BEGIN { print (b > a) ? b : a }')
done
hf=$(cat "$tmp/hf.txt")
awk -v t="$best" -v h="$hf" 'BEGIN { printf "bench: tokenizer-encode tidal=%.2f MB/s hf=%.2f MB/s ratio=%.2f\n", t, h, t / h }'
