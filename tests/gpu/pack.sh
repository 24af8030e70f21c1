#!/usr/bin/env bash
# Prepares what a GPU machine needs to run tests/gpu/run.sh when it cannot install tidal's build
# dependencies (the device machine of this workplace reaches no package registry). Run it HERE,
# on the machine where `make check` works and nvcc is installed:
#
#   tests/gpu/pack.sh            -> build-gpu/ (tools, GPU tests, peer; stripped) + build-gpu/lib,
#                                   packed into .gpu-pack/build-gpu.tar.xz (~17 MB; git ignores it)
#
# build-gpu/lib holds the shared libraries those programs load that are not glibc's or NVIDIA's
# driver's (HDF5, GSL, OpenBLAS, jansson, PCRE2, libpng, FreeType, cmocka, their dependencies),
# copied from this machine. On the GPU machine, from the repository root:
#
#   tar xJf .gpu-pack/build-gpu.tar.xz &&
#   LD_LIBRARY_PATH=$PWD/build-gpu/lib BUILD=build-gpu tests/gpu/run.sh check bench fidelity
#
# (the device tool: carry [".gpu-pack"]; unpacked build-gpu/ is ~95 MB, over the 64 MiB a call
# carries, the archive is not).
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
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
    libcublas*|libcudart*) ;;   # the GPU image has CUDA's own (same major version)
    *) cp -L "$so" "$B/lib/" ;;
  esac
done
du -sh "$B/bin" "$B/gpu" "$B/lib" | sed 's/^/pack.sh: /'
mkdir -p .gpu-pack
tar -cJf .gpu-pack/build-gpu.tar.xz "$B"
du -sh .gpu-pack/build-gpu.tar.xz | sed 's/^/pack.sh: /'
