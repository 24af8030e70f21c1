#!/usr/bin/env bash
# Regenerates the seed corpora of the fuzz targets (tests/fuzz/corpus/NAME/) with tidal's own
# tools, so the seeds are files tidal itself writes. Usage: bash tests/fuzz/make_corpus.sh
# (after `make`). Hand-written seeds (prompts, recipes, index files) are kept as they are; files
# named crash-* are inputs that once crashed a target (regression seeds), never regenerated.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build}/bin
C=tests/fuzz/corpus
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p $C/safetensors $C/shard_index $C/config $C/tokenizer $C/prompts $C/recipe $C/runfile

# safetensors and config: minute models of every architecture and dtype
small="--hidden-size 8 --num-layers 1 --num-heads 2 --num-kv-heads 1 --head-dim 4 --intermediate-size 8 --vocab-size 16"
for a in llama mistral qwen2 qwen3; do
  for dt in f32 bf16 f16; do
    $B/tidal-init --arch $a $small --dtype $dt --seed 1 -o $T/$a-$dt >/dev/null 2>&1
    cp $T/$a-$dt/model.safetensors $C/safetensors/$a-$dt.safetensors
  done
  cp $T/$a-f32/config.json $C/config/$a.json
  cp $T/$a-f32/generation_config.json $C/config/$a-generation.json
done
$B/tidal-init --arch qwen2 --preset tiny --seed 1 -o $T/tiny >/dev/null 2>&1
cp $T/tiny/config.json $C/config/tiny-qwen2.json

# tokenizer: the character vocabulary tidal writes
mkdir -p $T/tok; $B/tidal-tokenize --write-char-vocab $T/tok >/dev/null
cp $T/tok/tokenizer.json $C/tokenizer/charvocab.json

# runfile: a tiny run of tidal-diff (2 batches), and the same run with the score-prompt columns
printf '{"tokens": [1, 5, 9, 3]}\n{"tokens": [1, 7]}\n{"tokens": [1, 2, 3, 4, 5, 6]}\n' > $T/p.jsonl
$B/tidal-diff --model $T/tiny --prompts $T/p.jsonl -o $C/runfile/tiny.h5 --force --batch 2 \
  --max-new-tokens 3 --seed 7 --no-stop-at-eos >/dev/null 2>&1
$B/tidal-diff --model $T/tiny --prompts $T/p.jsonl -o $C/runfile/tiny-score-prompt.h5 --force --batch 3 \
  --max-new-tokens 2 --seed 7 --score-prompt --recipe-a fp32 --recipe-b fp8-rollout >/dev/null 2>&1
ls -la $C/*
