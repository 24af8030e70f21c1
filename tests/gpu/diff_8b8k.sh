#!/usr/bin/env bash
# The user's scale on one GPU (issue 39): tidal-diff --device cuda on a Llama-3.1-8B-shaped random
# bf16 checkpoint, 8 prompts of 8,192 tokens, 1,024 tokens generated each (the user's completion
# length), --batch 8, bf16-train (the trainer's forward) against vllm-bf16 (the engine's). Wall
# time and the GPU memory tidal-diff reports (its plan, what it held, what cudaMemGetInfo saw) go
# to $OUT/diff-8b8k.md; its progress lines (every 10 s, with an ETA) stay in the log, so a run cut
# by the stage's limit still says how long the whole would take.
#
#   tests/gpu/diff_8b8k.sh init    write the checkpoint only ($BUILD/big/llama-3.1-8b, 16 GB, once;
#                                  CPU and disk: tests/gpu/run.sh runs it beside the check stages)
#   tests/gpu/diff_8b8k.sh         the diff (writes the checkpoint first if absent)
#
# TIDAL_GPU_TINY=1 (the rehearsal on the CUDA simulator): a tiny Llama, 2 prompts of 64 + 16.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
B=$BUILD/bin
TINY=${TIDAL_GPU_TINY:-0}
W=$OUT/diff-8b8k
mkdir -p "$W"
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
if [ "$TINY" = 1 ]; then
  L=$BUILD/big/tiny-llama INIT=(--preset tiny) N=2 PLEN=64 NEW=16 BATCH=2 VOCAB=250
else
  L=$BUILD/big/llama-3.1-8b INIT=(--preset llama-3.1-8b) N=8 PLEN=8192 NEW=1024 BATCH=8 VOCAB=128000
fi
if [ ! -f "$L/config.json" ]; then
  t0=$(date +%s.%N)
  "$B/tidal-init" "${INIT[@]}" --dtype bf16 --seed 1 -o "$L" > "$W/init.log" 2>&1 ||
    { echo "diff_8b8k.sh: tidal-init of $L failed:"; tail -n 5 "$W/init.log"; exit 1; }
  echo "diff_8b8k.sh: tidal-init ${INIT[*]} --dtype bf16: $(du -sh "$L" | cut -f1) in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
fi
[ "${1:-}" = init ] && exit 0
P=$W/prompts-$PLEN.jsonl
"$PY" -c "import json, random; r = random.Random(1)
for i in range($N): print(json.dumps({'tokens': [r.randrange($VOCAB) for _ in range($PLEN)]}))" > "$P"
CMD=("$B/tidal-diff" --model "$L" --prompts "$P" --recipe-a bf16-train --recipe-b vllm-bf16
     --max-new-tokens "$NEW" --batch "$BATCH" --seed 1 --device cuda --force -o "$W/diff.h5" --json)
echo "diff_8b8k.sh: ${CMD[*]}"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/diff_8b8k.sh: before: /'
t0=$(date +%s.%N)
"${CMD[@]}" > "$W/diff.json" 2> >(tee "$W/diff.err" >&2); rc=$?
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "diff_8b8k.sh: exit $rc after $wall s"
{
  echo "# $(basename "$L")-shaped random bf16, $N x ($PLEN + $NEW) tokens, --batch $BATCH, bf16-train vs vllm-bf16, one GPU"
  echo
  echo "Made by \`tests/gpu/diff_8b8k.sh\` (tests/gpu/run.sh diff-8b8k) on $(date -u +%Y-%m-%d), $(nvidia-smi -L 2>/dev/null | head -n1 | sed 's/ (UUID.*//')."
  echo
  echo "- command: \`${CMD[*]}\`"
  echo "- exit status $rc, wall time $wall s (process start, checkpoint load, both recipes, metrics, run file)"
  grep -E 'memory plan|GPU memory|^tidal-diff:   |done in' "$W/diff.err" | sed 's/^/- /'
  echo
  echo '```'
  cat "$W/diff.json"
  echo '```'
} > "$OUT/diff-8b8k.md"
cat "$OUT/diff-8b8k.md"
exit $rc
