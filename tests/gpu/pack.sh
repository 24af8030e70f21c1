#!/usr/bin/env bash
# Prepares what a GPU machine needs to run tests/gpu/run.sh when it cannot install tidal's build
# dependencies (the device machine of this workplace reaches no package registry). Run it HERE,
# on the machine where `make check` works and nvcc is installed:
#
#   tests/gpu/slim.sh on         (first) reports' packed runs stay behind the call (out of the index for the call)
#   tests/gpu/pack.sh            -> build-gpu/ (tools, GPU tests, peer; stripped) + build-gpu/lib,
#                                   what runs packed into .gpu-pack/build-gpu.tar.xz (~15.4 MiB; git
#                                   ignores it); it fails if the tree and the pack are over the
#                                   64 MiB a device call carries
#   tests/gpu/slim.sh off        after the device call
#
# build-gpu/lib holds the shared libraries those programs load that are not glibc's (libresolv
# included), the GCC runtime's or NVIDIA's (HDF5, GSL, OpenBLAS, jansson, PCRE2, libpng, FreeType,
# cmocka, their dependencies), copied from this machine (Debian 12: the tools need glibc >= 2.34
# and GLIBCXX_3.4.29 on the GPU machine). On the GPU machine, from the repository root:
#
#   tar xJf .gpu-pack/build-gpu.tar.xz &&
#   BUILD=build-gpu OUT=$OUT tests/gpu/run.sh check rl moe bench attn-bench fidelity memory rl-bench
#
# run.sh puts build-gpu/lib on the tools' library path itself and keeps it from python (whose
# torch, ssl and zlib must not load this machine's copies); LD_LIBRARY_PATH=$PWD/build-gpu/lib
# before the command does the same. (The device tool: carry [".gpu-pack"]; unpacked build-gpu/
# is ~95 MB, over the 64 MiB a call carries, the archive is not.) Before it spends device time:
#   TIDAL_GPU_REHEARSAL=1 tests/gpu/run.sh STAGES   (the same stages on the CUDA simulator)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpu}
command -v nvcc >/dev/null || { echo "pack.sh: nvcc not found: the CUDA backend cannot be built here" >&2; exit 1; }
# (tests/helpers/rl_base_sft: the rl stage's tidal-rl test trains its tiny base with it)
make --no-print-directory BUILD="$B" CUDA=1 -j"$(nproc)" all gpu-tests "$B/tests/helpers/rl_base_sft" >/dev/null
rm -rf "$B/lib" && mkdir -p "$B/lib"
progs=("$B"/bin/* "$B"/gpu/peer "$B"/tests/helpers/rl_base_sft $(ls "$B"/gpu/test_* 2>/dev/null | grep -v '\.o$' || true))
strip --strip-debug "${progs[@]}" 2>/dev/null || true
{ ldd "${progs[@]}" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r so; do
  case "$(basename "$so")" in
    # glibc's own (libresolv too: a copy from another glibc fails on its GLIBC_PRIVATE symbols)
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libnsl.so*|libutil.so*|libanl.so*) ;;
    ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
    libcublas*|libcudart*) ;;   # the GPU image has CUDA's own (same major version)
    *) cp -L "$so" "$B/lib/" ;;
  esac
done
du -sh "$B/bin" "$B/gpu" "$B/lib" | sed 's/^/pack.sh: /'
# what tests/gpu/run.sh's stages start (tests/py/test_gpu_rehearsal.py checks the list against
# the stage scripts)
for p in bin/tidal-diff bin/tidal-logprobs bin/tidal-bench-model bin/tidal-sft bin/tidal-rl bin/tidal-init \
         bin/tidal-tokenize bin/tidal-export bin/tidal-report gpu/peer gpu/test_attention_sim gpu/test_backward_sim \
         gpu/test_decoder_backward_sim gpu/test_forward_sim gpu/test_sampling_sim tests/helpers/rl_base_sft; do
  [ -x "$B/$p" ] || { echo "pack.sh: $B/$p was not built" >&2; exit 1; }
done
# only what runs there (no objects, libtidal.a, dependency files, tools no stage starts), xz -9:
# the device tool carries 64 MiB in all, the tracked files included (~44 MiB on 2026-11-26: 50.5
# before reports/rl/pack_runs.py stored the packed run files' columns as float32; 72.7 on
# 2026-11-29 with the LoRA and MoE grids' runs, 49.8 once those were repacked in HDF5 1.10's
# format), so every MiB counts
mkdir -p .gpu-pack
gpu_progs=$(cd "$B" && ls gpu/test_* | grep -v '\.[od]$')
# the tools the stages start (the list checked above), not every tool: each links libtidal and
# CUDA's runtime statically, and the other tools would only swell the archive
tools=$(for p in bin/tidal-diff bin/tidal-logprobs bin/tidal-bench-model bin/tidal-sft bin/tidal-rl bin/tidal-init \
              bin/tidal-tokenize bin/tidal-export bin/tidal-report; do echo "$p"; done)
tar -C "$(dirname "$B")" -cf - $(for p in $tools gpu/peer $gpu_progs lib tests/helpers/rl_base_sft; do echo "$(basename "$B")/$p"; done) |
  xz --lzma2=preset=9e,dict=256MiB -T1 > .gpu-pack/build-gpu.tar.xz.part   # one block, a window over all the programs that share libtidal
mv .gpu-pack/build-gpu.tar.xz.part .gpu-pack/build-gpu.tar.xz
du -sh .gpu-pack/build-gpu.tar.xz | sed 's/^/pack.sh: /'
# what one device call would carry, as the device tool counts it (2026-11-29: every file git ls-files
# lists, nested repositories or not): the tracked and untracked-not-ignored files, and the pack
tree=$( { git ls-files; git ls-files --others --exclude-standard; } |
        tr '\n' '\0' | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
packb=$(stat -c %s .gpu-pack/build-gpu.tar.xz)
echo "pack.sh: a device call carries $(( (tree + packb) >> 20 )) MiB of 64 (tree $(( tree >> 20 )) MiB + pack $(( packb >> 20 )) MiB)"
[ $(( tree + packb )) -lt $(( 64 << 20 )) ] || { echo "pack.sh: over the 64 MiB a device call carries: 'tests/gpu/slim.sh on' keeps reports' packed runs behind (then 'off' after the call)" >&2; exit 1; }
