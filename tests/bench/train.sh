#!/usr/bin/env bash
# Training throughput (forward + backward + AdamW step, tokens/s) of libtidal's training step
# (tests/helpers/train_probe) against PyTorch autograd doing the same step
# (tests/bench/torch_train.py: fp32 master weights, mean token cross-entropy over the mask,
# clip_grad_norm_, torch.optim.AdamW), both on 2 threads, on the same checkpoint and batch:
#   a small Qwen2-shaped random model (C=256 L=4 NH=8 NKV=4 HD=32 F=688 V=4096, q/k/v biases;
#   tidal-init, cached in $BUILD/bench/), BATCH sequences of LEN random tokens, 90% of
#   targets in the loss mask. Cases
#     fp32   tidal's fp32 recipe vs torch fp32
#     bf16   tidal's bf16-train recipe (emulated bf16 rounding at every kernel boundary, fp32
#            masters) vs torch.autocast("cpu", bfloat16)
#     fp16   tidal's fp16-train recipe (with its loss scaling) vs torch.autocast("cpu", float16)
#     fp8    tidal's fp8-unified-train recipe (block FP8 GEMMs) vs tidal's own bf16-train: PyTorch
#            has no FP8 GEMM on the CPU
#     lora   the LoRA grids' step (reports/rl/lora: rank 1, alpha 2, all seven linear modules, bf16):
#            tidal's bf16-train recipe with LoRA vs transformers + PEFT 0.17 (bf16 base, fp32
#            adapters, autocast bf16: what TRL runs; skipped without transformers/peft)
# Each side runs SECONDS of steps after a warm-up step; every case, both sides, once per round
# for ROUNDS rounds (so fp8 and fp16 alternate as tidal and torch do), best of the rounds kept
# (the machine is shared). Prints
#   bench: train-fp32 tidal=X torch=Y ratio=R     (training tokens/s; R = tidal / torch)
#   bench: train-bf16 tidal=X torch=Y ratio=R
#   bench: train-fp16 tidal=X torch=Y ratio=R
#   bench: train-fp8-vs-bf16 fp8=X bf16=Y ratio=R
#   bench: train-fp8-vs-fp16 fp8=X fp16=Y ratio=R   (target >= 0.8)
#   bench: train-lora-bf16 tidal=X torch_peft=Y ratio=R
set -u
cd "$(dirname "$0")/../.."
. tests/bench/common.bash   # best, ratio
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}; SECONDS_PER=${SECONDS_PER:-8}; BATCH=${BATCH:-4}; LEN=${LEN:-128}
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}   # as the tools do (src/util/opts.c)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
DIR=$BUILD/bench/train-small
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
PROBE=$BUILD/tests/helpers/train_probe
[ -x "$PROBE" ] || { echo "train.sh: $PROBE missing (make tests)" >&2; exit 1; }
mkdir -p "$(dirname "$DIR")"
if [ ! -f "$DIR/model.safetensors" ] || [ ! -f "$DIR/config.json" ]; then
  "$BUILD/bin/tidal-init" --arch qwen2 --hidden 256 --layers 4 --heads 8 --kv-heads 4 --head-dim 32 \
      --intermediate 688 --vocab 4096 --no-tie --seed 1 --dtype f32 -o "$DIR" 2>/dev/null \
    || { echo "train.sh: tidal-init failed" >&2; exit 1; }
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" tests/bench/make_batch.py 4096 "$BATCH" "$LEN" > "$tmp/batch.json"
have_torch=1
"$PY" -c "import torch, safetensors" 2>/dev/null || have_torch=0
have_peft=$have_torch
"$PY" -c "import peft, transformers" 2>/dev/null || have_peft=0
LORA_MODS=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
CASES="fp32 bf16 fp16 fp8 lora"
for case in $CASES; do : > "$tmp/t_$case"; : > "$tmp/p_$case"; done
# every case in every round, one after the other: a ratio's two sides (fp8 against fp16 most of all)
# see the same spells of a shared machine's speed
for r in $(seq "$ROUNDS"); do
  for case in $CASES; do
    rec=$case-train; tdt=$case; extra=(); popt=(); peer=$have_torch
    case $case in
      fp32) rec=fp32; tdt=float32 ;;
      bf16) tdt=bfloat16 ;;
      fp16) tdt=float16 ;;
      fp8)  rec=fp8-unified-train; peer=0 ;;   # PyTorch has no FP8 GEMM on the CPU: against tidal's own
      lora) rec=bf16-train; tdt=bfloat16; peer=$have_peft
            extra=(--lora-r 1 --lora-alpha 2 --lora-modules $LORA_MODS); popt=(--lora 1) ;;
    esac
    "$PROBE" --model "$DIR" --batch "$tmp/batch.json" --recipe $rec "${extra[@]}" --lr 1e-5 --bench-seconds "$SECONDS_PER" \
      | awk '$1 == "tokens_per_s" { print $2 }' >> "$tmp/t_$case"
    [ $case = fp16 ] && [ "$r" -gt 1 ] && [ ! -s "$tmp/p_fp16" ] && peer=0   # no float16 CPU GEMM: tried once
    [ $peer = 1 ] && "$PY" tests/bench/torch_train.py --model "$DIR" --batch "$tmp/batch.json" --dtype $tdt "${popt[@]}" \
      --seconds "$SECONDS_PER" 2>/dev/null | awk '$1 == "tokens_per_s" { print $2 }' >> "$tmp/p_$case"
  done
done
tidal_of() { best < "$tmp/t_$1"; }
peer_of() { best < "$tmp/p_$1"; }
for case in fp32 bf16 fp16; do
  t=$(tidal_of $case) p=$(peer_of $case)
  why=""; [ -z "$p" ] && [ $case = fp16 ] && why=" (this PyTorch has no float16 GEMM on the CPU)"
  echo "bench: train-$case tidal=${t:-NA} torch=${p:-NA} ratio=$(ratio "$t" "$p")$why"
done
t8=$(tidal_of fp8) t16=$(tidal_of bf16) th=$(tidal_of fp16) tl=$(tidal_of lora) pl=$(peer_of lora)
echo "bench: train-fp8-vs-bf16 fp8=${t8:-NA} bf16=${t16:-NA} ratio=$(ratio "$t8" "$t16")"
echo "bench: train-fp8-vs-fp16 fp8=${t8:-NA} fp16=${th:-NA} ratio=$(ratio "$t8" "$th")"
why=""; [ $have_peft = 0 ] && why=" (transformers/peft not installed)"
echo "bench: train-lora-bf16 tidal=${tl:-NA} torch_peft=${pl:-NA} ratio=$(ratio "$tl" "$pl")$why"
