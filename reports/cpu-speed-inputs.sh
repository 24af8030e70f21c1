# Sourced by reports/cpu-speed-*.sh: the bench's inputs under build dir $1, made when missing —
# tests/bench/train.sh's model ($D) and batch ($T/batch.json), tests/bench/diff.sh's 0.5B model ($M)
# and 4 prompts of 32 random tokens ($T/p.jsonl); $T a temporary folder removed on exit.
B_IN=$1
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
D=$B_IN/bench/train-small; M=$B_IN/bench/qwen2.5-0.5b
mkdir -p $B_IN/bench
[ -f $D/model.safetensors ] || $B_IN/bin/tidal-init --arch qwen2 --hidden 256 --layers 4 --heads 8 --kv-heads 4 \
  --head-dim 32 --intermediate 688 --vocab 4096 --no-tie --seed 1 --dtype f32 -o $D 2>/dev/null || exit 1
[ -f $M/model.safetensors ] || $B_IN/bin/tidal-init --preset qwen2.5-0.5b --dtype f32 --seed 1 -o $M 2>/dev/null || exit 1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$PY" tests/bench/make_batch.py 4096 4 128 > $T/batch.json
"$PY" -c "
import json, random
random.seed(1)
for _ in range(4): print(json.dumps({'tokens': [random.randrange(151936) for _ in range(32)]}))" > $T/p.jsonl
