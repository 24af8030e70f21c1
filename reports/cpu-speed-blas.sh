#!/usr/bin/env bash
# reports/cpu-speed.md, "OpenBLAS's fallback core": the same binaries with OpenBLAS's Prescott
# kernels (OPENBLAS_CORETYPE=Prescott: what the tools ran on a Xeon OpenBLAS 0.3.21 does not know,
# before they forced the CPU's family) against the variable unset (the tools' own choice now),
# interleaved, ROUNDS rounds. train_probe on tests/bench/train.sh's model and batch (tokens/s);
# tidal-diff on tests/bench/diff.sh's 0.5B model, 4 prompts x (32 + 32) tokens (scored tokens/s).
# On a CPU whose core OpenBLAS knows, "auto" is OpenBLAS's choice and the two columns measure
# Prescott against it. Usage: BUILD=build reports/cpu-speed-blas.sh (after make all tests)
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}; ROUNDS=${ROUNDS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
. reports/cpu-speed-inputs.sh $B
core_env() { if [ $1 = Prescott ]; then echo OPENBLAS_CORETYPE=Prescott; else echo -u OPENBLAS_CORETYPE; fi; }
for round in $(seq $ROUNDS); do
  for rec in fp32 fp16-train fp8-unified-train bf16-train; do
    for core in Prescott auto; do
      t=$(env $(core_env $core) $B/tests/helpers/train_probe --model $D --batch $T/batch.json --recipe $rec \
          --lr 1e-5 --bench-seconds 5 | awk '$1 == "tokens_per_s" { print $2 }')
      echo "train_probe $rec $core ${t:-NA}"
    done
  done
  for pair in fp32:fp32 fp16-train:fp16-infer fp8-unified-train:fp8-unified-infer; do
    for core in Prescott auto; do
      t=$(env $(core_env $core) $B/bin/tidal-diff --model $M --prompts $T/p.jsonl --recipe-a ${pair%%:*} \
          --recipe-b ${pair##*:} --max-new-tokens 32 --no-stop-at-eos --batch 4 -o $T/r.h5 --force 2>/dev/null \
          | awk '$1 == "throughput" { print $2 }')
      echo "tidal-diff $pair $core ${t:-NA}"
    done
  done
done
