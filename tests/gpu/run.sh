#!/usr/bin/env bash
# Everything of the CUDA backend that needs an NVIDIA GPU (issue 17), for the device machine:
#
#   tests/gpu/run.sh STAGE...      (results and logs under $OUT, default out/gpu)
#
#   build       make CUDA=1 -j tests gpu-tests (the whole toolkit with the CUDA backend)
#   check       the CUDA backend's tests on the real GPU: every tests/cudasim/test_*.cpp built
#               against the real backend ($BUILD/gpu/test_*: the ops, the backward ops with
#               matmul_backward's dgrad/wgrad (test_backward_sim), the whole forward and the
#               whole decoder_backward (test_decoder_backward_sim) against the CPU backend,
#               tolerances stated in each; test_sampling_sim: the device sampler's tokens and
#               processed log-probs bit-identical to td_sample's, also with its sequential
#               fallbacks forced, where the GPU's double exp/log replace glibc's;
#               test_rollout_sim: rollouts sampled on the device give the CPU's tokens;
#               test_token_metrics_sim: per-token metrics on the device), tests/py/test_device.py (fp32
#               on the GPU within 1e-4 of the CPU), tests/py/test_device_metrics.py (tidal-diff's
#               metrics on the device: a decode step brings down no V-wide row, the metrics equal
#               the host path's and the CPU's), tests/gpu/test_vs_transformers.py
#   bench       tests/bench/gpu.sh (fractions of cuBLAS peak and HBM bandwidth, tokens/s against
#               transformers)
#   attn-bench  $BUILD/gpu/test_attention_sim --bench: the tiled flash attention kernel against the
#               simple one, 8 x 8,192-token prefill at Llama-3-8B head shapes (bf16-train,
#               vllm-bf16): time of each, and whether their outputs are the same bits (exit 1 if not)
#   fidelity    reports/gpu/fidelity.sh small (trained add model, Qwen2.5-0.5B-shaped random)
#   fidelity-8b reports/gpu/fidelity.sh 8b (Llama-3-8B-shaped random; writes a 16 GB checkpoint)
#   memory      tests/gpu/memory_check.py: the memory plan against what the backend held
#               (memory_peak) and what cudaMemGetInfo saw, Qwen2.5-0.5B-shaped, 8 x (1024 + 64);
#               the 8B / 8K plan on this GPU ($OUT/memory.md; about a minute)
#   rl          tidal-sft and tidal-rl --device cuda against the same tools on the CPU (issue 27):
#               tests/py/test_device_sft.py and test_device_rl.py with DEVICE_BIN=$BUILD/bin (the
#               real backend, matmul_backward_cuda included; tiny models, a minute or two):
#               /steps loss, grad_norm within 1e-4 relative under fp32, bf16 / fp16 within the
#               looser bound each script states, LoRA, --resume on the device bit for bit
#               and tests/py/test_memplan_train.py: the trainers' memory plan >= the run file's
#               memory_peak (the backend's own count) and <= 1.5x it
#   rl-bench    tests/gpu/rl_bench.sh: a GRPO step (64 completions, rollout / pi_old / update) of
#               tidal-rl --device cuda against tests/gpu/grpo_bench.py (PyTorch + transformers) on
#               Qwen2.5-0.5B- and 1.5B-shaped random checkpoints, 1,024-token responses
#               ($RL_BENCH="0.5b:4096 1.5b:4096" for the long ones); $OUT/rl-bench.md
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
      echo "=== tests/py/test_device_metrics.py"; DEVICE_BIN="$BUILD/bin" "$PY" tests/py/test_device_metrics.py || rc=1
      echo "=== tests/gpu/test_vs_transformers.py"; "$PY" tests/gpu/test_vs_transformers.py; r=$?
      [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      return $rc ;;
    bench) bash tests/bench/gpu.sh ;;
    attn-bench) "$BUILD/gpu/test_attention_sim" --bench ;;
    fidelity) bash reports/gpu/fidelity.sh small ;;
    fidelity-8b) bash reports/gpu/fidelity.sh 8b ;;
    memory) "$PY" tests/gpu/memory_check.py ;;
    rl-bench) bash tests/gpu/rl_bench.sh ;;
    rl)
      rc=0
      for t in tests/py/test_device_sft.py tests/py/test_device_rl.py tests/py/test_memplan_train.py; do
        echo "=== $t"; DEVICE_BIN="$BUILD/bin" "$PY" "$t" || rc=1   # 77 (h5py missing) fails here too
      done
      return $rc ;;
    *) echo "run.sh: unknown stage '$1' (build, check, rl, bench, attn-bench, fidelity, fidelity-8b, memory, rl-bench)" >&2; return 2 ;;
  esac
}
[ $# -gt 0 ] || set -- build check rl bench attn-bench fidelity memory rl-bench
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
