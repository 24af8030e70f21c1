#!/usr/bin/env bash
# Regenerates reports/headroom/README.md's tables: is FP16 safe? tidal-headroom on the demo
# checkpoint and on copies of it with PLANTED outlier channels (tidal-init --outlier-channels;
# synthetic, recorded in their metadata), over the 32 demo prompts.
# Usage: reports/headroom/make.sh   (seconds). Checkpoints: out/headroom/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=out/headroom
mkdir -p "$OUT"
SHAPE="--arch qwen2 --hidden 192 --layers 4 --heads 6 --kv-heads 2 --head-dim 32 --intermediate 512 --vocab 100 --no-tie --embed-std 0.2 --dtype bf16 --seed 2026"
MD=reports/headroom/tables.md
{
  echo "# tidal-headroom on the demo checkpoint, with and without planted outliers"
  echo
  echo "Made by \`reports/headroom/make.sh\` on $(date -u +%Y-%m-%d). **The outliers below are planted** (synthetic,"
  echo "\`tidal-init --outlier-channels\`), to show what the tool reports when a checkpoint would overflow."
  for m in "demo|" "norm-1e5|--outlier-channels 3 --outlier-scale 1e5" "embed-1e5|--outlier-channels 3 --outlier-scale 1e5 --outlier-site embed"; do
    name=${m%%|*} flags=${m#*|}
    if [ "$name" = demo ]; then dir=datasets/demo-model; else
      dir=$OUT/$name
      "$BUILD/bin/tidal-init" $SHAPE $flags -o "$dir" 2>/dev/null
      cp datasets/demo-model/tokenizer.json datasets/demo-model/tokenizer_config.json "$dir/"
      echo
      echo "Checkpoint \`$dir\`: \`tidal-init $SHAPE $flags\`."
    fi
    echo
    echo "## $name"
    echo
    "$BUILD/bin/tidal-headroom" --model "$dir" --prompts datasets/demo-prompts.jsonl --markdown 2>/dev/null | sed 's/^# /### /'
  done
} > "$MD.tmp"
mv "$MD.tmp" "$MD"
echo "wrote $MD"
