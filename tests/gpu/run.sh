#!/usr/bin/env bash
# Everything of the CUDA backend that needs an NVIDIA GPU (issue 17), for the device machine:
#
#   tests/gpu/run.sh STAGE...      (results and logs under $OUT, default out/gpu)
#
# The device machine lends one call of at most 10 minutes, so the stages run in the order given
# (most important first: check, rl, then the benches), each under its own time limit (GNU
# timeout, the whole process group killed) and all within TIDAL_GPU_BUDGET_S (default 540 s): a
# stage that hangs is logged as timed out and the next one runs; a stage's limit is cut to what
# is left of the budget, and once less than 20 s is left the remaining stages are listed as not
# run. $OUT/summary.md (stage, status, seconds, expected, limit), run.log (the stages' logs) and
# results.tar.gz (their result files) are rewritten after every stage and the running stage logs
# to $OUT/stage.log, so a call killed from outside still returns what was done (at most 6 files:
# the device tool returns 8; below). $OUT/env.log says first what the machine has (GPU, the python
# and which of torch / CUDA / transformers / numpy / h5py / safetensors it imports, the tools'
# shared libraries). Exit status 1 if any stage failed or timed out.
#
#   stage       expected on an H100 / limit   what
#   build       -     / 600 s  make CUDA=1 -j tests gpu-tests (where nvcc is; not in the packed run)
#   profile    150 s / 420 s  tests/gpu/profile.sh: TIDAL_CUDA_PROFILE's op-by-op tables of the cases the
#               H200 found slow (0.5B tf / decode1 / decode64, a 0.5B diff, an 8B diff of 8,192 + 32
#               tokens, one 0.5B GRPO step); profile.md (the next GPU session's first stage)
#   init-8b     90 s / 240 s  tests/gpu/diff_8b8k.sh init: the Llama-3.1-8B-shaped checkpoint (15 GB, CPU
#               and disk: run beside the check stages, "check+init-8b")
#   diff-8b8k  120 s / 300 s  tests/gpu/diff_8b8k.sh: tidal-diff 8 x (8192 + 1024) on it, --batch 8,
#               bf16-train vs vllm-bf16: wall time and GPU memory (diff-8b8k.md); ~8 min on the H200 of
#               2026-11-29 (cut at 180 s there: its progress lines give the ETA)
#   A+B+C       stages run side by side (each under its own limit and log): only stages that time
#               nothing and read no free-memory figure (check, fidelity, rl, moe without its timing,
#               init-8b); the H200 ran "check+fidelity+rl+moe+init-8b" in 182 s
#   check       150 s / 240 s  the CUDA backend's tests on the real GPU: every tests/cudasim/test_*.cpp
#               built against the real backend ($BUILD/gpu/test_*: the ops, the backward ops with
#               matmul_backward's dgrad/wgrad (test_backward_sim), the whole forward and the
#               whole decoder_backward (test_decoder_backward_sim) against the CPU backend,
#               tolerances stated in each; test_sampling_sim: the device sampler's tokens and
#               processed log-probs bit-identical to td_sample's, also with its sequential
#               fallbacks forced, where the GPU's double exp/log replace glibc's;
#               test_rollout_sim: rollouts sampled on the device give the CPU's tokens;
#               test_token_metrics_sim: per-token metrics on the device; test_moe_sim: the MoE row
#               ops, gather, combines, their backward, bit for bit the CPU's), tests/py/test_device.py (fp32
#               on the GPU within 1e-4 of the CPU), tests/py/test_device_metrics.py (tidal-diff's
#               metrics on the device: a decode step brings down no V-wide row, the metrics equal
#               the host path's and the CPU's), tests/gpu/test_vs_transformers.py. Time: thirteen
#               test programs whose CPU references dominate (~5 s each), a Qwen2.5-0.5B-shaped
#               checkpoint written (1 GB, ~10 s), 40 tidal-logprobs runs (~1.5 s each: process,
#               CUDA context, checkpoint) and ten transformers loads (~3 s each)
#   rl           60 s / 150 s  tidal-sft and tidal-rl --device cuda against the same tools on the CPU
#               (issue 27): tests/py/test_device_sft.py and test_device_rl.py with
#               DEVICE_BIN=$BUILD/bin (the real backend, matmul_backward_cuda included; tiny models:
#               the CPU side and ~40 process starts dominate, rl_base_sft's 150 CPU steps ~10 s):
#               /steps loss, grad_norm within 1e-4 relative under fp32, bf16 / fp16 within the
#               looser bound each script states, LoRA, --resume on the device bit for bit;
#               tests/py/test_memplan_train.py: the trainers' memory plan >= the run file's
#               memory_peak (the backend's own count) and <= 1.15x it
#   moe          30 s / 120 s  tests/py/test_device_moe.py with DEVICE_BIN=$BUILD/bin: tidal-diff on tiny
#               Qwen2-MoE and Mixtral (fp32 within 1e-5 of the CPU with the same experts; bf16
#               mismatch within 2x of the CPU's, vllm-bf16's fused_moe, R3), tidal-sft on add-moe with
#               the aux loss, full and LoRA on the experts (loss, grad_norm within 1e-4); the routing
#               decision is the host's, the rows stay on the device (src/model/moe.c); then
#               tidal-bench-model bf16-infer on Qwen3-30B-A3B's widths with 2 layers (tidal-init,
#               ~1.3 GB), device and CPU: what the device-resident MoE costs with its experts run one
#               after another, a figure to decide on grouped expert GEMMs
#   bench        90 s / 180 s  tests/bench/gpu.sh (fractions of cuBLAS peak and HBM bandwidth, tokens/s
#               against transformers): 0.5B forward 4 x 512 (~1 TFLOP: ms), 64 decode steps at
#               batch 1 and 64, transformers' three rounds, eight peer GEMM shapes x 20, the 4 GiB
#               bandwidth read, a 32 x (256 + 128) diff both ways; ~10 process starts that load 1 GB
#   attn-bench   30 s / 90 s   $BUILD/gpu/test_attention_sim --bench: the tiled flash attention kernel
#               against the simple one and the tensor-core one (attn_mma), 8 x 8,192-token prefill at
#               Llama-3-8B head shapes (bf16-train, vllm-bf16; 4.4e12 flops a call, ~0.2-1 s each on
#               CUDA cores, 1 GB of inputs drawn on the host ~10 s): time of each, whether tiled and
#               simple are the same bits and attn_mma within its tolerance (exit 1 if not)
#   fidelity    150 s / 300 s  reports/gpu/fidelity.sh small: 8 recipe pairs x 2 checkpoints x CPU and
#               GPU = 32 tidal-diff runs; the CPU runs of the Qwen2.5-0.5B-shaped model (4 x (32 +
#               64) tokens, 64 decode steps reading ~2 GB of weights each) dominate, ~10 s each
#   memory       40 s / 120 s  tests/gpu/memory_check.py: the memory plan against what the backend held
#               (memory_peak) and what cudaMemGetInfo saw, Qwen2.5-0.5B-shaped, 8 x (1024 + 64);
#               the 8B / 8K plan on this GPU (memory.md in results.tar.gz)
#   rl-bench    150 s / 300 s  tests/gpu/rl_bench.sh: a GRPO step (64 completions, rollout / pi_old /
#               update) of tidal-rl --device cuda against tests/gpu/grpo_bench.py (PyTorch +
#               transformers) on a Qwen2.5-0.5B-shaped random checkpoint, 1,024-token responses
#               (2 steps: 2 x 1,024 decode steps at batch 64, ~20 ms each untuned, and the update's
#               ~0.4 PFLOP; the peer one step); $RL_BENCH="0.5b:1024 1.5b:1024" adds the 1.5B
#               (another ~200 s: a call of its own), "0.5b:4096" the long responses; rl-bench.md
#   fidelity-8b  -    / 600 s  reports/gpu/fidelity.sh 8b (Llama-3-8B-shaped random; writes a 16 GB
#               checkpoint, ~1-2 min; its CPU runs read 32 GB of weights a decode step: more than
#               one call's 10 minutes on 16 cores, run it alone and expect it to be cut)
#
# The default list, check rl moe bench attn-bench fidelity memory rl-bench, is ~700 s expected: more
# than TIDAL_GPU_BUDGET_S, so the last stage gets what is left (rl-bench.md keeps the rows done).
#
# Rehearsal without a GPU (TIDAL_GPU_REHEARSAL=1, tests/py/test_gpu_rehearsal.py): the same stages
# and scripts, run by the CUDA simulator (tests/cudasim/sim.mk) with tiny shapes: BUILD becomes
# $OUT/rehearsal-build, whose bin/ holds the simulator's tools (build/sim/bin, the others from
# build/bin), gpu/ the simulated test programs (build/sim/test_*) and a stand-in for the
# cuBLASLt peer (fixed figures); a stand-in nvidia-smi comes first on PATH; TIDAL_GPU_TINY=1 tells
# every stage script to use tiny models and shapes; run files are read through tidal-export (as
# where the python has no h5py). What needs real CUDA (attn-bench, peer) says so (exit 77,
# listed as skipped). TIDAL_GPU_CHECK="test_round_sim ..." limits check's test programs;
# TIDAL_GPU_TEST_LIMIT (default 90 s) is each one's time limit.
# (The whole script is one { ... } block: bash reads it entirely before running it, so an edit of
# this file while it runs cannot change what the running call does.)
{
set -u
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build} OUT=${OUT:-out/gpu} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STAGES="build profile check rl moe bench attn-bench fidelity fidelity-8b init-8b diff-8b8k memory rl-bench"
# expected seconds on an H100, and the limit
declare -A EXPECT=([build]=0 [profile]=150 [check]=150 [rl]=60 [moe]=60 [bench]=90 [attn-bench]=30 [fidelity]=150 [fidelity-8b]=0
                   [init-8b]=90 [diff-8b8k]=120 [memory]=40 [rl-bench]=150)
declare -A LIMIT=([build]=600 [profile]=420 [check]=240 [rl]=150 [moe]=120 [bench]=180 [attn-bench]=90 [fidelity]=300 [fidelity-8b]=600
                  [init-8b]=240 [diff-8b8k]=300 [memory]=120 [rl-bench]=300)
BUDGET=${TIDAL_GPU_BUDGET_S:-540}
# TIDAL_GPU_LIMITS="stage=S ...": other limits; TIDAL_GPU_LIMIT_SCALE=K multiplies every limit (the
# rehearsal's default is 4: the simulator is slower than a GPU, and the budget grows with it)

# one stage, run in a process of its own under timeout (run.sh --one STAGE)
stage() {
  case "$1" in
    build) make CUDA=1 -j"$(nproc)" tests gpu-tests ;;
    check)
      rc=0
      for t in "$BUILD"/gpu/test_*; do
        [ -x "$t" ] && [ ! -d "$t" ] || continue
        case $t in *.o|*.d) continue ;; esac
        if [ -n "${TIDAL_GPU_CHECK:-}" ] && ! [[ " $TIDAL_GPU_CHECK " == *" $(basename "$t") "* ]]; then continue; fi
        # 77: skipped (a simulator-only test); each program under its own limit, so that one
        # that hangs leaves the stage's time to the others (--foreground: in the stage's process
        # group, which the stage's own limit kills)
        echo "=== $t"; s0=$(date +%s); timeout --foreground -k 5 "${TIDAL_GPU_TEST_LIMIT:-90}" "$t"; r=$?
        [ $r -eq 124 ] || [ $r -eq 137 ] && echo "=== $t: killed after ${TIDAL_GPU_TEST_LIMIT:-90} s"
        echo "=== $t: exit $r, $(( $(date +%s) - s0 )) s"
        [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      done
      echo "=== tests/py/test_device.py"; "$PY" tests/py/test_device.py; r=$?
      [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      echo "=== tests/py/test_device_metrics.py"; DEVICE_BIN="$BUILD/bin" "$PY" tests/py/test_device_metrics.py; r=$?
      [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      echo "=== tests/gpu/test_vs_transformers.py"; "$PY" tests/gpu/test_vs_transformers.py; r=$?
      [ $r -ne 0 ] && [ $r -ne 77 ] && rc=1
      return $rc ;;
    bench) bash tests/bench/gpu.sh ;;
    attn-bench) "$BUILD/gpu/test_attention_sim" --bench ;;
    fidelity) bash reports/gpu/fidelity.sh small ;;
    fidelity-8b) bash reports/gpu/fidelity.sh 8b ;;
    profile) bash tests/gpu/profile.sh ;;
    init-8b) bash tests/gpu/diff_8b8k.sh init ;;
    diff-8b8k) bash tests/gpu/diff_8b8k.sh ;;
    memory) "$PY" tests/gpu/memory_check.py ;;
    rl-bench) bash tests/gpu/rl_bench.sh ;;
    rl)
      rc=0
      for t in tests/py/test_device_sft.py tests/py/test_device_rl.py tests/py/test_memplan_train.py; do
        echo "=== $t"; DEVICE_BIN="$BUILD/bin" "$PY" "$t"; r=$?   # 77: numpy missing, or the tools
        echo "=== $t: exit $r"
        [ $r -ne 0 ] && rc=1   # a skip is a failure here: this stage exists to run them
      done
      return $rc ;;
    moe)   # mixtures of experts on the device against the CPU (issues 34, 35)
      echo "=== tests/py/test_device_moe.py"; DEVICE_BIN="$BUILD/bin" "$PY" tests/py/test_device_moe.py; r=$?
      echo "=== tests/py/test_device_moe.py: exit $r"
      # what the MoE layer costs on the device: Qwen3-30B-A3B's widths (128 experts, top-8, C 2048,
      # FE 768) with 2 layers, bf16, on the device and on this machine's CPU (a figure, no target:
      # the router logits come down and the routing decision goes up per layer, every expert's
      # gather, GEMMs and combine are launches of their own; reports/gpu/README.md)
      q=$BUILD/gpu/q30b-L2; A=(--tf-batch 2 --tf-len 256 --prompt 32 --steps 16 --decode-batch 16 --recipe bf16-infer)
      [ "${TIDAL_GPU_TINY:-0}" = 1 ] && A=(--tf-batch 1 --tf-len 16 --prompt 4 --steps 4 --decode-batch 2 --recipe bf16-infer)
      if [ ! -f "$q/config.json" ]; then
        if [ "${TIDAL_GPU_TINY:-0}" = 1 ]; then
          "$BUILD/bin/tidal-init" --arch qwen3_moe --preset tiny --dtype bf16 --seed 1 -o "$q" >/dev/null
        else
          "$BUILD/bin/tidal-init" --preset qwen3-30b-a3b --num-layers 2 --dtype bf16 --seed 1 -o "$q" >/dev/null
        fi || { echo "=== moe: tidal-init failed"; return 1; }
      fi
      if [ -n "${TIDAL_GPU_BESIDE:-}" ]; then   # a timing beside other stages would say nothing
        echo "=== moe: the Qwen3-30B-A3B-width timing not run: beside the stages $TIDAL_GPU_BESIDE (run moe alone for it)"
        return $r
      fi
      for dev in cuda cpu; do
        echo "=== tidal-bench-model --device $dev on $q"
        "$BUILD/bin/tidal-bench-model" --model "$q" "${A[@]}" --device $dev | sed "s/^/moe-q30b-L2 $dev: /" || r=1
      done
      return $r ;;   # a skip (77) is a failure here too
    *) echo "run.sh: unknown stage '$1' ($STAGES)" >&2; return 2 ;;
  esac
}
if [ "${1:-}" = --one ]; then PY=${TIDAL_PY:-python3}; stage "$2"; exit $?; fi

if [ "${TIDAL_GPU_REHEARSAL:-0}" = 1 ]; then
  SRC=$(cd "${TIDAL_REHEARSAL_FROM:-$BUILD}" 2>/dev/null && pwd) ||
    { echo "run.sh: rehearsal: no build tree ${TIDAL_REHEARSAL_FROM:-$BUILD}" >&2; exit 1; }
  [ -x "$SRC/sim/bin/tidal-rl" ] ||
    { echo "run.sh: rehearsal needs the simulator's tools: make tests (tests/cudasim/sim.mk builds $SRC/sim/bin)" >&2; exit 1; }
  R=$OUT/rehearsal-build
  rm -rf "$R/bin" "$R/gpu/test_"* "$R/fakebin" "$R/tests"
  mkdir -p "$R/bin" "$R/gpu" "$R/fakebin" "$R/tests/helpers"
  for t in "$SRC"/bin/*; do
    n=$(basename "$t")
    if [ -x "$SRC/sim/bin/$n" ]; then ln -s "$SRC/sim/bin/$n" "$R/bin/$n"; else ln -s "$t" "$R/bin/$n"; fi
  done
  for t in "$SRC"/sim/test_*; do
    case $t in *.d|*/test_cudasim*) continue ;; esac
    [ -x "$t" ] && ln -s "$t" "$R/gpu/$(basename "$t")"
  done
  ln -s "$SRC/tests/helpers/rl_base_sft" "$R/tests/helpers/rl_base_sft"
  cat > "$R/gpu/peer" <<'EOF'
#!/usr/bin/env bash
# rehearsal stand-in for tests/gpu/peer.cu (cuBLASLt cannot run on the simulator): its output format, fixed figures
case "${1:-}" in
  gemm) [ $# -ge 4 ] || exit 2; echo "gemm $2 $3 $4 tflops 600.000" ;;
  bandwidth) echo "bandwidth_gbs 3000.0" ;;
  *) echo "usage: peer gemm M N K [REPS] | peer bandwidth" >&2; exit 2 ;;
esac
EOF
  printf '#!/bin/sh\necho "GPU 0: cudasim rehearsal (the CUDA simulator, no GPU) (UUID: GPU-rehearsal)"\n' > "$R/fakebin/nvidia-smi"
  chmod +x "$R/gpu/peer" "$R/fakebin/nvidia-smi"
  mkdir -p "$R/lib"   # as a pack's (empty: this machine's libraries are the system's)
  export BUILD=$R PATH=$R/fakebin:$PATH TIDAL_GPU_TINY=1 TIDAL_RUNFILE_READER=tidal-export TIDAL_TORCH_DEVICE=cpu
  echo "run.sh: rehearsal on the CUDA simulator (BUILD=$R, tiny shapes)" >&2
  SCALE=${TIDAL_GPU_LIMIT_SCALE:-4}
else
  SCALE=${TIDAL_GPU_LIMIT_SCALE:-1}
fi
export TIDAL_GPU_TEST_LIMIT=$(( ${TIDAL_GPU_TEST_LIMIT:-90} * SCALE ))   # check: each test program's
if [ "$SCALE" != 1 ]; then
  for k in "${!LIMIT[@]}"; do LIMIT[$k]=$(( LIMIT[$k] * SCALE )); done
  [ -n "${TIDAL_GPU_BUDGET_S:-}" ] || BUDGET=$(( BUDGET * SCALE ))
fi
for kv in ${TIDAL_GPU_LIMITS:-}; do LIMIT[${kv%%=*}]=${kv#*=}; done

# Libraries. The tools of a pack (tests/gpu/pack.sh) need $BUILD/lib: this build machine's
# HDF5, GSL, OpenBLAS ... and their dependencies (OpenSSL, zlib, libffi, zstd, ...). run.sh puts it
# first on the tools' LD_LIBRARY_PATH itself (the command need not, and one that sets
# LD_LIBRARY_PATH=$PWD/build-gpu/lib is taken apart the same way), but python starts without it:
# those copies must not shadow the libraries torch and python's own modules were built against
# (tests/gpu/py.sh; its sitecustomize hands the tools' path to what python starts).
PACKLIB=
[ -d "$BUILD/lib" ] && PACKLIB=$(cd "$BUILD/lib" && pwd)
rest=
IFS=: read -ra parts <<< "${LD_LIBRARY_PATH:-}"
for d in "${parts[@]}"; do
  [ -n "$d" ] || continue
  [ -n "$PACKLIB" ] && [ "$(cd "$d" 2>/dev/null && pwd)" = "$PACKLIB" ] && continue
  rest=${rest:+$rest:}$d
done
export TIDAL_PY_LD_LIBRARY_PATH=$rest
if [ -n "$PACKLIB" ]; then export LD_LIBRARY_PATH=$PACKLIB${rest:+:$rest}; fi

# the python every stage uses: TIDAL_PY, else the tree's .venv (absent on the device machine
# unless carried), else python3; started through tests/gpu/py.sh (above)
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=$(command -v python3)
case $PY in /*) ;; */*) PY=$PWD/$PY ;; esac

# cuBLASLt: the backend dlopens libcublasLt.so.MAJOR by name, then from the build machine's
# CUDA_HOME/lib64 (src/backend/cuda/lt_dl.cu), and the peer links it. Where the loader would not
# find it, the first copy in the image's CUDA or python's nvidia-cublas wheel joins the tools' path.
LT=$(ldd "$BUILD/gpu/peer" 2>/dev/null | awk '/libcublasLt/ { print $1; exit }')
LT=${LT:-libcublasLt.so.13}
LTDIR=
if ! ldconfig -p 2>/dev/null | grep -q "$LT "; then
  for d in ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 \
           $("$PY" -c 'import nvidia.cublas as m; print(*[p + "/lib" for p in m.__path__])' 2>/dev/null) \
           $(find /usr/local /opt -maxdepth 8 -name "$LT" -printf '%h\n' 2>/dev/null | head -n1); do
    if [ -e "$d/$LT" ]; then LTDIR=$d; break; fi
  done
  [ -n "$LTDIR" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$LTDIR
fi
export TIDAL_PY_REAL=$PY TIDAL_PY=$PWD/tests/gpu/py.sh
PY=$TIDAL_PY

# What comes back. The device tool returns at most 8 files from $OUT (16 MiB each, 64 MiB in
# all), so the stages write into a work folder, WORK (TIDAL_GPU_WORK, default $BUILD/gpu-work: the
# stage scripts' own OUT), and $OUT holds no more than: env.log, summary.md, bench-lines.txt,
# run.log (every finished stage's log, each cut to its first and last MiB beyond 2 MiB),
# stage.log (the running stage's, live; gone when it ends) and results.tar.gz (WORK's text
# results, logs and run files, less checkpoints; without the .h5 files if over 15 MiB), the last
# rewritten after every stage.
RET=$OUT
WORK=${TIDAL_GPU_WORK:-$BUILD/gpu-work}
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
[ "$WORK" != "$RET" ] || { echo "run.sh: TIDAL_GPU_WORK must not be OUT" >&2; exit 2; }
rm -f "$RET/run.log" "$RET/stage.log" "$RET/results.tar.gz"
export OUT=$WORK

GPU=$(nvidia-smi -L 2>/dev/null | head -n1)
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "gpu: ${GPU:-none (nvidia-smi -L failed)}"
  echo "BUILD=$BUILD OUT=$RET WORK=$WORK budget ${BUDGET} s; stages: $*"
  echo "python: $TIDAL_PY_REAL ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)), through tests/gpu/py.sh"
  echo "libraries: tools ${LD_LIBRARY_PATH:-(system)}; python ${TIDAL_PY_LD_LIBRARY_PATH:-(system)}"
  echo "cuBLASLt: $LT $([ -n "$LTDIR" ] && echo "from $LTDIR" || (ldconfig -p 2>/dev/null | grep -q "$LT " && echo "(ldconfig)" || echo "NOT FOUND: --device cuda will fail"))"
  "$PY" - <<'EOF' 2>&1
import importlib
for m in ["numpy", "h5py", "safetensors", "ml_dtypes", "torch", "transformers"]:
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"  {m} MISSING ({e.__class__.__name__}: {e})")
try:
    import torch
    print(f"  torch.cuda.is_available() = {torch.cuda.is_available()}")
except Exception:  # noqa: BLE001
    pass
EOF
  echo "needs: check/rl/memory: numpy (h5py optional: tidal-export reads run files without it);"
  echo "       test_vs_transformers, the bench peers: torch with CUDA + transformers (else skipped / NA)"
  for t in tidal-diff tidal-rl tidal-export; do
    if [ -x "$BUILD/bin/$t" ]; then
      miss=$(ldd "$BUILD/bin/$t" 2>/dev/null | grep 'not found' | tr -s ' \t' ' ')
      [ -n "$miss" ] && echo "$t: MISSING shared libraries:$miss (LD_LIBRARY_PATH=\$PWD/build-gpu/lib?)"
      "$BUILD/bin/$t" --version >/dev/null 2>&1 || echo "$t: does not start ($("$BUILD/bin/$t" --version 2>&1 | tail -n1))"
    else
      echo "$t: not built in $BUILD/bin"
    fi
  done
} > "$RET/env.log" 2>&1
cat "$RET/env.log" >&2


[ $# -gt 0 ] || set -- check rl moe bench attn-bench fidelity memory rl-bench
for s in "$@"; do   # a+b+c: stages run side by side (below)
  for p in ${s//+/ }; do
    [ -n "${LIMIT[$p]:-}" ] || { echo "run.sh: unknown stage '$p' ($STAGES)" >&2; exit 2; }
  done
done
command -v timeout >/dev/null || { echo "run.sh: GNU timeout not found (coreutils)" >&2; exit 1; }
T0=$(date +%s)
status=0
: > "$RET/bench-lines.txt"
rows=()
summary() {
  {
    echo "# tests/gpu/run.sh on ${GPU:-no GPU (nvidia-smi -L failed)}" | sed 's/ (UUID[^)]*)//' 
    echo
    echo "Budget ${BUDGET} s, $(( $(date +%s) - T0 )) s used. Logs: run.log beside this file (stage.log: the stage"
    echo "that was running when the call ended), every file in results.tar.gz."
    echo
    echo "| stage | status | seconds | expected (H100) | limit |"
    echo "|---|---|---|---|---|"
    for r in "${rows[@]}"; do echo "$r"; done
  } > "$RET/summary.md"
}
pack() {   # WORK's results into $RET/results.tar.gz
  local ex=(--exclude='*.safetensors' --exclude='*.tmp' --exclude='prompts-8192.jsonl')
  tar -czf "$RET/results.tar.gz.part" -C "$WORK" "${ex[@]}" . 2>/dev/null
  if [ "$(stat -c %s "$RET/results.tar.gz.part" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
    tar -czf "$RET/results.tar.gz.part" -C "$WORK" "${ex[@]}" --exclude='*.h5' . 2>/dev/null
  fi
  mv -f "$RET/results.tar.gz.part" "$RET/results.tar.gz"
}
# the end of one stage: its row, its log into run.log (cut beyond 2 MiB), its bench lines, the pack
finish() {   # STAGE RC SECONDS LIMIT
  local s=$1 rc=$2 dt=$3 lim=$4 st
  case $rc in
    0) st=ok ;;
    77) st="skipped (exit 77)" ;;
    124|137) st="TIMED OUT after $lim s"; echo "run.sh: $s killed after $lim s (limit)" >> "$WORK/$s.log" ;;
    *) st="FAILED (exit $rc)" ;;
  esac
  case $rc in 0|77) ;; *) status=1 ;; esac
  rows+=("| $s | $st | $dt | ${EXPECT[$s]} | ${LIMIT[$s]} |")
  {
    echo "### $s: $st, $dt s"
    if [ "$(stat -c %s "$WORK/$s.log")" -gt $((2 << 20)) ]; then
      head -c $((1 << 20)) "$WORK/$s.log"; echo; echo "[... cut: the whole log is $s.log in results.tar.gz ...]"
      tail -c $((1 << 20)) "$WORK/$s.log"
    else
      cat "$WORK/$s.log"
    fi
    echo
  } >> "$RET/run.log"
  grep -h '^bench: ' "$WORK/$s.log" >> "$RET/bench-lines.txt" 2>/dev/null
  summary
  pack
  echo "### $s: $st, $dt s; tail of its log:" >&2
  tail -n 25 "$WORK/$s.log" >&2
}
for s in "$@"; do
  parts=(${s//+/ })
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 20 ]; then
    for p in "${parts[@]}"; do
      echo "### $p: not run, ${left} s of the budget left" >&2
      rows+=("| $p | not run (budget: ${left} s left) | 0 | ${EXPECT[$p]} | ${LIMIT[$p]} |"); status=1
    done
    summary
    continue
  fi
  if [ ${#parts[@]} -eq 1 ]; then
    lim=${LIMIT[$s]}; [ "$lim" -gt "$left" ] && lim=$left
    echo "### $s (limit $lim s)" >&2
    t0=$(date +%s)
    log=$RET/stage.log
    echo "### $s (limit $lim s), started $(date -u +%H:%M:%S)" > "$log"
    timeout -k 10 "$lim" bash tests/gpu/run.sh --one "$s" >> "$log" 2>&1; rc=$?
    mv -f "$log" "$WORK/$s.log"
    finish "$s" "$rc" $(( $(date +%s) - t0 )) "$lim"
    continue
  fi
  # Side by side: stages that time nothing and do not read the GPU's free memory (the tests, the
  # fidelity diffs, the 8B checkpoint's writing: mostly CPU work on the machine's 16 cores), each
  # under its own limit and log; $RET/stage.log shows the tail of each every 5 s while they run.
  t0=$(date +%s)
  declare -A LIMS=() PIDS=()
  for p in "${parts[@]}"; do
    lim=${LIMIT[$p]}; [ "$lim" -gt "$left" ] && lim=$left
    LIMS[$p]=$lim
    echo "### $p (limit $lim s, beside: ${parts[*]})" >&2
    echo "### $p (limit $lim s), started $(date -u +%H:%M:%S) beside ${parts[*]}" > "$WORK/$p.log"
    rm -f "$WORK/$p.end"
    { TIDAL_GPU_BESIDE="${parts[*]}" timeout -k 10 "$lim" bash tests/gpu/run.sh --one "$p" >> "$WORK/$p.log" 2>&1; r=$?; date +%s > "$WORK/$p.end"; exit $r; } &
    PIDS[$p]=$!
  done
  while :; do
    running=0
    for p in "${parts[@]}"; do kill -0 "${PIDS[$p]}" 2>/dev/null && running=1; done
    [ $running = 1 ] || break
    { for p in "${parts[@]}"; do echo "=== $p (live, last lines)"; tail -n 15 "$WORK/$p.log"; done; } > "$RET/stage.log.part"
    mv -f "$RET/stage.log.part" "$RET/stage.log"
    sleep 5
  done
  for p in "${parts[@]}"; do
    wait "${PIDS[$p]}"; rc=$?
    t1=$(cat "$WORK/$p.end" 2>/dev/null || date +%s); rm -f "$WORK/$p.end"
    finish "$p" "$rc" $(( t1 - t0 )) "${LIMS[$p]}"
  done
  rm -f "$RET/stage.log"
done
cat "$RET/summary.md" >&2
exit $status
}
