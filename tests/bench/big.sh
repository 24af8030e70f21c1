#!/usr/bin/env bash
# An 8B checkpoint on this machine (issue 16): a Llama-3-8B-shaped bf16 checkpoint (C 4096, L 32,
# NH 32, NKV 8, F 14336, V 128256; 16 GB, written by tidal-init into $BIG, default
# $BUILD/big/llama3-8b as reports/big/make.sh makes it) under the fp32 reference forward, its
# weights mapped in bf16 and widened per GEMM tile:
#   big8b-tf            teacher-forced tokens/s (1 sequence of TF_LEN tokens) against PyTorch —
#                       which does not fit: llama_ref holds fp32 weights, 32 GB for 8B, more
#                       than this machine's memory; said so on the line (peer=NA)
#   big8b-decode8       decode tokens/s of 8 slots against the lower of two bounds measured in
#                       the same run (tidal-bench-model --bandwidth): memory, 8 x bandwidth (a
#                       2 GiB streaming read) / bytes one step reads (every weight but the
#                       embedding, bf16); compute, the decode kernel's own ceiling (its instruction
#                       mix, td_gemm_fixed_w16's bf16 widening + fp32 FMAs, on 8 rows against
#                       cache-resident weights, every thread) / flops per token (2 per matrix
#                       weight); ratio = tidal / min(bounds), the fraction of the lower one reached
#   big8b-L4-tf, -decode8   the largest shape PyTorch fits here, against it: the same 8B
#                       shape with 4 layers (1.4B parameters, 5.6 GB as fp32), same cases; each
#                       side best of ROUNDS (2) runs, the two sides in turn
# Skipped (a line saying why) when the machine has less than 18 GiB available or 20 GB of disk.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIG=${BIG:-$BUILD/big/llama3-8b}
TF_LEN=${TF_LEN:-128}
ROUNDS=${ROUNDS:-2}
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}   # as the tools do (src/util/opts.c)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
. tests/bench/common.bash   # best, ratio
SHAPE=(--arch llama --hidden-size 4096 --num-heads 32 --num-kv-heads 8 --intermediate-size 14336
       --vocab-size 128256 --rope-theta 500000 --no-tie --dtype bf16 --seed 1)
avail_gb=$(awk '/MemAvailable/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
disk_gb=$(df -P --block-size=1G "$BUILD" | awk 'NR == 2 { print $4 }')
if [ ! -f "$BIG/model.safetensors" ]; then
  if awk -v a="$avail_gb" -v d="$disk_gb" 'BEGIN { exit !(a < 18 || d < 20) }'; then
    echo "bench: big8b-tf tidal=NA torch=NA ratio=NA (skipped: ${avail_gb} GiB available, ${disk_gb} GB disk; needs 18 and 20)"
    exit 0
  fi
  echo "big.sh: writing the 8B checkpoint to $BIG (16 GB, ~3 min)" >&2
  "$BUILD/bin/tidal-init" "${SHAPE[@]}" --num-layers 32 -o "$BIG" 2>/dev/null || { echo "big.sh: tidal-init failed" >&2; exit 1; }
fi
L4=$BUILD/bench/llama3-8b-L4
[ -f "$L4/model.safetensors" ] || "$BUILD/bin/tidal-init" "${SHAPE[@]}" --num-layers 4 -o "$L4" 2>/dev/null \
  || { echo "big.sh: tidal-init failed" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ARGS=(--tf-batch 1 --tf-len "$TF_LEN" --prompt 4 --steps 4 --decode-batch 8)
val() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
tps() { awk -v c="$2" '$1 == "case" && $2 == c { print $4 }' "$1"; }

"$BUILD/bin/tidal-bench-model" --model "$BIG" "${ARGS[@]}" --only tf > "$tmp/big_tf" || exit 1
"$BUILD/bin/tidal-bench-model" --model "$BIG" "${ARGS[@]}" --only decodeB --bandwidth > "$tmp/big_dec" || exit 1
need=$(awk -v p="$(stat -c %s "$BIG/model.safetensors")" 'BEGIN { printf "%.1f", 2 * p / 1073741824 }')
total=$(awk '/MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
echo "bench: big8b-tf tidal=$(tps "$tmp/big_tf" tf) torch=NA ratio=NA (PyTorch fp32 needs ${need} GiB of weights, this machine has ${total} GiB: compared on big8b-L4 below; tidal peak RSS $(val "$tmp/big_tf" peak_rss_mb) MB)"
d=$(tps "$tmp/big_dec" decode8) bw=$(val "$tmp/big_dec" bandwidth_gbs) by=$(val "$tmp/big_dec" decode_bytes_per_step)
pk=$(val "$tmp/big_dec" peak_gflops) fl=$(val "$tmp/big_dec" decode_flops_per_token)
kg=$(val "$tmp/big_dec" kernel_gflops) kn=$(val "$tmp/big_dec" kernel)
bound=$(awk -v b="$bw" -v n="$by" 'BEGIN { printf "%.3f", 8 * b * 1e9 / n }')
cbound=$(awk -v p="$kg" -v f="$fl" 'BEGIN { printf "%.3f", p * 1e9 / f }')
low=$(awk -v a="$bound" -v b="$cbound" 'BEGIN { print (a < b ? a : b) }')
echo "bench: big8b-decode8 tidal=$d bandwidth_bound=$bound compute_bound=$cbound ratio=$(awk -v a="$d" -v b="$low" 'BEGIN { printf "%.3f", a / b }') (tidal / min(bounds); bandwidth ${bw} GB/s and the decode kernel's in-cache ceiling ${kg} GFLOP/s, ${kn}, measured in the run; plain fp32 FMA peak ${pk} GFLOP/s; $(awk -v n="$by" 'BEGIN { printf "%.2f", n / 1e9 }') GB read per step)"

# tidal and PyTorch in turn, ROUNDS times, each side's best (the VM's speed moves by tens of
# percent within minutes: one run each, minutes apart, read 0.88 and 1.00 on one Zen 3 in a day)
have_torch=0; "$PY" -c "import torch, safetensors" 2>/dev/null && have_torch=1
for c in tf decode8; do
  only=tf; [ $c = tf ] || only=decodeB
  t_all="" p_all=""
  for _ in $(seq "$ROUNDS"); do
    "$BUILD/bin/tidal-bench-model" --model "$L4" "${ARGS[@]}" --only $only > "$tmp/l4" || exit 1
    t_all="$t_all $(tps "$tmp/l4" $c)"
    if [ $have_torch = 1 ]; then
      if "$PY" tests/bench/torch_model.py --model "$L4" "${ARGS[@]}" --only $only > "$tmp/t"; then
        p_all="$p_all $(tps "$tmp/t" $c)"
      else
        echo "big.sh: torch failed" >&2
      fi
    fi
  done
  t=$(echo "$t_all" | best); p=$(echo "$p_all" | best); [ -n "$p" ] || p=NA
  echo "bench: big8b-L4-$c tidal=$t torch=$p ratio=$(ratio "$t" "$p") (best of $ROUNDS, in turn)"
done
