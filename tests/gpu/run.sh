#!/usr/bin/env bash
# Everything of the CUDA backend that needs an NVIDIA GPU (issue 17), for the device machine:
#
#   tests/gpu/run.sh STAGE...      (results and logs under $OUT, default out/gpu)
#
#   build       make CUDA=1 -j tests gpu-tests (the whole toolkit with the CUDA backend)
#   check       the CUDA backend's tests on the real GPU: every tests/cudasim/test_*.cpp built
#               against the real backend ($BUILD/gpu/test_*: the ops and the whole forward
#               against the CPU backend, tolerances stated in each), tests/py/test_device.py (fp32
#               on the GPU within 1e-4 of the CPU), tests/gpu/test_vs_transformers.py
#   bench       tests/bench/gpu.sh (fractions of cuBLAS peak and HBM bandwidth, tokens/s against
#               transformers)
#   attn-bench  $BUILD/gpu/test_attention_sim --bench: the tiled flash attention kernel against the
#               simple one, 8 x 8,192-token prefill at Llama-3-8B head shapes (bf16-train,
#               vllm-bf16): time of each, and whether their outputs are the same bits (exit 1 if not)
#   fidelity    reports/gpu/fidelity.sh small (trained add model, Qwen2.5-0.5B-shaped random)
#   fidelity-8b reports/gpu/fidelity.sh 8b (Llama-3-8B-shaped random; writes a 16 GB checkpoint)
#
# Each stage's log goes to $OUT/STAGE.log; the exit status is 1 if any stage failed.
set -u
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build} OUT=${OUT:-out/gpu} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
status=0
stage() {
  case "$1" in
    build) make CUDA=1 -j"$(nproc)" tests gpu-tests ;;
    check)
      rc=0
      for t in "$BUILD"/gpu/test_*; do
        [ -x "$t" ] || continue
        echo "=== $t"; "$t"; r=$?   # 77: skipped (a simulator-only test)
        [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      done
      echo "=== tests/py/test_device.py"; "$PY" tests/py/test_device.py || rc=1
      echo "=== tests/gpu/test_vs_transformers.py"; "$PY" tests/gpu/test_vs_transformers.py; r=$?
      [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      return $rc ;;
    bench) bash tests/bench/gpu.sh ;;
    attn-bench) "$BUILD/gpu/test_attention_sim" --bench ;;
    fidelity) bash reports/gpu/fidelity.sh small ;;
    fidelity-8b) bash reports/gpu/fidelity.sh 8b ;;
    *) echo "run.sh: unknown stage '$1' (build, check, bench, attn-bench, fidelity, fidelity-8b)" >&2; return 2 ;;
  esac
}
[ $# -gt 0 ] || set -- build check bench attn-bench fidelity
nvidia-smi -L 2>/dev/null | head -n1 || echo "run.sh: no NVIDIA GPU here (nvidia-smi -L failed)"
for s in "$@"; do
  echo "### $s" >&2
  t0=$(date +%s)
  stage "$s" > "$OUT/$s.log" 2>&1; rc=$?
  echo "### $s: exit $rc, $(( $(date +%s) - t0 )) s; tail of $OUT/$s.log:" >&2
  tail -n 25 "$OUT/$s.log" >&2
  [ $rc -ne 0 ] && status=1
done
exit $status
