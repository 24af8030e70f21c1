# tidal — Training–Inference Divergence Analysis Lab
#
#   make            build libtidal and every tool (CPU; CUDA sources too when nvcc is found)
#   make check      install missing deps, build, run the whole test suite (verdict = exit status)
#   make check-asan the same suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#   make demo       install missing deps, build, run the toolkit's main job on shipped defaults
#   make bench      benchmarks that print ratios against a peer
#   make fuzz       libFuzzer targets (tests/fuzz/fuzz_*.c) into build/fuzz/, built by clang
#   make docs-cli   docs/cli/TOOL.md from each tool's --help (checked current by the tests)
#   make install    the tools, libtidal.a, the headers, a pkg-config file and man pages under
#                   PREFIX (default /usr/local; DESTDIR for staging); make uninstall removes them
#
# Sources are discovered, not listed: every src/**/*.c goes into libtidal, every tools/*.c is
# one CLI, every tests/test_*.c is one cmocka test program, every tests/nv/*.cu is a test built
# by nvcc against NVIDIA's own host conversion functions.

CC      ?= gcc
NVCC    ?= nvcc
BUILD   ?= build
SAN     ?=
OPT     ?= -O2 -march=x86-64-v2

PKGS    := hdf5 libpng openblas jansson libpcre2-8 freetype2 zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter \
           -fopenmp -Iinclude $(PKG_CFLAGS) $(SAN)
LDLIBS  := $(PKG_LIBS) -lgsl -lm -fopenmp $(SAN)

LIB_SRC   := $(shell find src -name '*.c' | sort)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
LIB       := $(BUILD)/libtidal.a
TOOL_SRC  := $(wildcard tools/*.c)
TOOLS     := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
TEST_SRC  := $(wildcard tests/test_*.c)
TESTS     := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
NVTEST_SRC := $(wildcard tests/nv/*.cu)
# drivers the Python checks and benches run (tests/helpers/NAME.c -> $(BUILD)/tests/helpers/NAME)
HELPER_SRC := $(wildcard tests/helpers/*.c)
HELPERS   := $(HELPER_SRC:tests/helpers/%.c=$(BUILD)/tests/helpers/%)
# LD_PRELOAD shims for the storage-fault tests (tests/fault/NAME.c -> $(BUILD)/tests/fault/NAME.so)
FAULT_SRC := $(wildcard tests/fault/*.c)
FAULTLIBS := $(FAULT_SRC:tests/fault/%.c=$(BUILD)/tests/fault/%.so)

HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_NVCC),1)
  NVTESTS := $(NVTEST_SRC:tests/nv/%.cu=$(BUILD)/tests/nv/%)
  CUDA_SRC := $(shell find src -name '*.cu' | sort)
  $(info ✓ nvcc found: NVIDIA host-conversion tests build ($(words $(NVTESTS))), CUDA sources build ($(words $(CUDA_SRC))))
else
  NVTESTS :=
  $(info ✗ nvcc not found: NVIDIA reference tests and CUDA sources are skipped)
endif

# The CUDA backend (src/backend/cuda/*.cu, `--device cuda`) is part of libtidal when nvcc is
# found (CUDA=0 leaves it out: then --device cuda says the build has none). Kernels for Hopper
# (sm_90, H100/H200) and PTX for anything newer; cudart static, cuBLASLt loaded by the backend
# when it opens (src/backend/cuda/lt_dl.cu: a CPU-only run never maps it).
# No fast-math: the kernels' roundings need IEEE fp32 with denormals (round.cuh).
CUDA      ?= $(HAVE_NVCC)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
NVFLAGS   ?= -O2 -g -std=c++20 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
             -Iinclude -Xcompiler -fopenmp,-Wall -Werror all-warnings -DTD_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' 
ifeq ($(CUDA),1)
  CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.cu.o)
  CFLAGS   += -DTD_HAVE_CUDA
  LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ \
              -Wl,-rpath,$(CUDA_HOME)/lib64
else
  CUDA_OBJ :=
endif

# GPU-side programs, run by tests/gpu/run.sh on a machine with an NVIDIA GPU: the CUDA backend's
# tests of tests/cudasim built against the real backend (the simulator's own tests,
# test_cudasim*.cpp, excepted) and the benchmarks' peer. With CUDA=1 `make tests` builds them
# too (CI compiles them; nothing runs them without a GPU).
GPUTESTS := $(patsubst tests/cudasim/%.cpp,$(BUILD)/gpu/%,$(filter-out tests/cudasim/test_cudasim%.cpp,$(wildcard tests/cudasim/test_*.cpp)))
GPUPROGS := $(if $(filter 1,$(CUDA)),$(GPUTESTS) $(BUILD)/gpu/peer)

DEPDIR_FLAGS = -MMD -MP
comma := ,
space := $(subst ,, )
# nvcc splits -Xcompiler arguments at commas, so sanitizer flags travel comma-joined
SAN_NV := $(if $(SAN),$(comma)$(subst $(space),$(comma),$(strip $(SAN))))

.PHONY: all deps check check-asan demo bench clean tests install uninstall
all: $(LIB) $(TOOLS)

deps:
	@bash .ci/deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPDIR_FLAGS) -c $< -o $@

# sqrtf without its errno path, so that the AdamW loop vectorises (a #pragma GCC optimize does
# not reach the target_clones bodies); tidal never reads errno there
$(BUILD)/src/backend/cpu_optim.o: CFLAGS += -fno-math-errno

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

# device.c is the one C file that knows whether the CUDA backend is linked in (TD_HAVE_CUDA):
# it is rebuilt when CUDA changes in the same build tree
$(BUILD)/cuda-flag: FORCE_CUDA_FLAG
	@mkdir -p $(dir $@)
	@echo '$(CUDA)' | cmp -s - $@ || echo '$(CUDA)' > $@
$(BUILD)/src/backend/device.o: $(BUILD)/cuda-flag
.PHONY: FORCE_CUDA_FLAG

$(LIB): $(LIB_OBJ) $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/%: tools/%.c $(LIB)
	@mkdir -p $(dir $@) $(BUILD)/dep
	$(CC) $(CFLAGS) $(DEPDIR_FLAGS) -MF $(BUILD)/dep/$*.d $< -o $@ $(LIB) $(LDLIBS)

$(BUILD)/tests/helpers/%: tests/helpers/%.c $(LIB)
	@mkdir -p $(dir $@) $(BUILD)/dep
	$(CC) $(CFLAGS) $(DEPDIR_FLAGS) -MF $(BUILD)/dep/helper-$*.d $< -o $@ $(LIB) $(LDLIBS)

# plain -O2, no sanitizer: preloaded into tools that may carry their own
$(BUILD)/tests/fault/%.so: tests/fault/%.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -g -std=gnu11 -Wall -Wextra -fPIC -shared $< -o $@ -ldl

$(BUILD)/tests/%: tests/%.c $(LIB)
	@mkdir -p $(dir $@) $(BUILD)/dep
	$(CC) $(CFLAGS) $(DEPDIR_FLAGS) -MF $(BUILD)/dep/$*.d $< -o $@ $(LIB) $(LDLIBS) -lcmocka

# NVIDIA reference tests: host code only, compiled by nvcc (which drives g++), linked with the
# C library. No GPU is needed: cuda_bf16.h / cuda_fp16.h / cuda_fp8.h conversions are __host__.
$(BUILD)/tests/nv/%: tests/nv/%.cu $(LIB)
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -Iinclude -Xcompiler -fopenmp$(SAN_NV) $< -o $@ $(LIB) -lcmocka -lm -Xlinker -lgomp$(if $(SAN), -Xcompiler $(subst $(space),$(comma),$(strip $(SAN))))

tests: $(TESTS) $(NVTESTS) $(TOOLS) $(HELPERS) $(FAULTLIBS) $(GPUPROGS)

.PHONY: gpu-tests
gpu-tests: $(TOOLS) $(GPUTESTS) $(BUILD)/gpu/peer

$(BUILD)/gpu/peer: tests/gpu/peer.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< -o $@ -lcublasLt

$(BUILD)/gpu/%.o: tests/cudasim/%.cpp
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -x cu -Isrc/backend/cuda -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/gpu/%: $(BUILD)/gpu/%.o $(LIB)
	$(CXX) $< -o $@ $(LIB) $(LDLIBS) -lcmocka

-include tests/cudasim/sim.mk

# the builds of check and check-asan use every CPU (CI runs a plain `make check`)
NPROC := $(shell nproc 2>/dev/null || echo 1)
check: deps
	@$(MAKE) --no-print-directory -j$(NPROC) tests
	@BUILD=$(BUILD) bash tests/run.sh $(TESTS) $(NVTESTS) $(SIMTESTS)

# Sanitizer build lives in its own tree so it never mixes objects with the normal build.
# ASAN_SKIP_PY: Python checks `make check` runs and check-asan leaves out, to keep CI inside its
# 90 minutes (each of these runs over 200 s under ASan on the 2-core machines, test_attribute 234 s;
# CI ran out of time with them on 2026-11-30). What each leaves out is run under ASan elsewhere:
#   test_device_rl/sft, test_device_sim, test_gpu_rehearsal: the device trainers and tools on the
#     CUDA simulator, and the GPU script's rehearsal; the device backend's host code stays under
#     ASan through test_device.py, test_device_metrics.py, test_device_moe.py and the sim/ C tests
#   test_memplan, test_memplan_moe, test_memplan_train: plans against measured peaks, which ASan's
#     shadow memory and redzones make meaningless; the planner itself runs in tests/test_memplan.c
#   test_batch_invariance: tidal-diff's bits across batch and thread counts (numerics only;
#     tidal-diff's code paths run under ASan in test_cli, test_resume, test_kills and others)
#   test_rl_moe: the MoE RL runs (MoE code under ASan in test_moe_forward, test_grad_moe,
#     test_lora_moe, test_moe_aux, test_device_moe; tidal-rl in test_rl_loss, test_rl_owntask, ...)
#   test_attribute: tidal-attribute's figures (the tool runs under ASan in test_router_fp32)
#   test_docs: the docs' examples (the tools' paths run under ASan in test_cli, test_newcomer)
#   test_rlstats: Python alone, no tidal binary
#   test_fuzz_smoke: the libFuzzer targets are ASan + UBSan builds of their own ($(FUZZ_SAN),
#     whatever BUILD is), so make check's run is the same run; again here it cost 269 s more (Zen 3)
ASAN_SKIP_PY := test_device_rl.py test_device_sft.py test_device_sim.py test_gpu_rehearsal.py \
                test_memplan.py test_memplan_moe.py test_memplan_train.py test_batch_invariance.py \
                test_rl_moe.py test_attribute.py test_docs.py test_rlstats.py test_fuzz_smoke.py
check-asan: deps
	@$(MAKE) --no-print-directory -j$(NPROC) BUILD=build-asan CUDA=0 OPT="-O1 -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined" tests
	@BUILD=build-asan ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 TIDAL_SKIP_PY="$(ASAN_SKIP_PY)" \
	    bash tests/run.sh $(TESTS:$(BUILD)/%=build-asan/%) $(NVTESTS:$(BUILD)/%=build-asan/%) \
	    $(SIMTESTS:$(BUILD)/%=build-asan/%)

demo: deps
	@$(MAKE) --no-print-directory all
	@bash datasets/demo.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory all $(HELPERS)
	@BUILD=$(BUILD) bash tests/bench.sh

clean:
	rm -rf build build-asan

# make install: what a C toolkit installs. tidal.pc gives a program that links libtidal (static)
# its flags: `cc prog.c $(pkg-config --cflags --libs --static tidal)`; man pages are made from
# each tool's --help by tools/man.sh, so they say what the installed tool says.
PREFIX  ?= /usr/local
BINDIR  := $(DESTDIR)$(PREFIX)/bin
LIBDIR  := $(DESTDIR)$(PREFIX)/lib
INCDIR  := $(DESTDIR)$(PREFIX)/include
MANDIR  := $(DESTDIR)$(PREFIX)/share/man/man1
VERSION := $(shell sed -n 's/^\#define TD_VERSION "\(.*\)"/\1/p' include/tidal/common.h)

install: all
	install -d $(BINDIR) $(LIBDIR)/pkgconfig $(INCDIR)/tidal $(MANDIR)
	install -m 755 $(TOOLS) $(BINDIR)
	install -m 644 $(LIB) $(LIBDIR)
	install -m 644 include/tidal/*.h $(INCDIR)/tidal
	@for t in $(notdir $(TOOLS)); do bash tools/man.sh $(BUILD)/bin/$$t $(VERSION) > $(MANDIR)/$$t.1 || exit 1; done
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	  'Name: tidal' 'Description: Training-Inference Divergence Analysis Lab: precision recipes, both paths, run files' \
	  'Version: $(VERSION)' 'Requires.private: $(PKGS)' 'Cflags: -I$${includedir} -fopenmp$(if $(filter 1,$(CUDA)), -DTD_HAVE_CUDA)' \
	  'Libs: -L$${libdir} -ltidal' \
	  'Libs.private: -lgsl -lm -fopenmp$(if $(filter 1,$(CUDA)), -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++ -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64)' \
	  > $(LIBDIR)/pkgconfig/tidal.pc
	@echo "installed under $(DESTDIR)$(PREFIX): $(words $(TOOLS)) tools, libtidal.a, include/tidal, lib/pkgconfig/tidal.pc, man pages"

uninstall:
	rm -f $(addprefix $(BINDIR)/,$(notdir $(TOOLS))) $(LIBDIR)/libtidal.a $(LIBDIR)/pkgconfig/tidal.pc
	rm -f $(addprefix $(MANDIR)/,$(addsuffix .1,$(notdir $(TOOLS))))
	rm -rf $(INCDIR)/tidal

# docs/cli/TOOL.md: each tool's --help as Markdown (tools/cli-docs.sh); tests/py/test_docs.py
# fails when one is not what the built tool prints (run `make docs-cli` after changing options).
.PHONY: docs-cli
docs-cli: $(TOOLS)
	@bash tools/cli-docs.sh $(BUILD)/bin docs/cli
	@echo "docs/cli: $(words $(TOOLS)) tools' --help"


# Fuzz targets: libFuzzer needs clang, so libtidal is compiled a second time, instrumented, under
# $(BUILD)/fuzz/obj (the main build stays on $(CC)). Each tests/fuzz/fuzz_NAME.c becomes
# $(BUILD)/fuzz/fuzz_NAME; corpora in tests/fuzz/corpus/NAME; smoke run: tests/py/test_fuzz_smoke.py.
FUZZ_CC    ?= clang
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined
# No -fopenmp when compiling: clang 14 rejects a local union inside `omp declare simd` (ops.c), and
# the parsers fuzzed here are serial; libomp is linked for the omp_* calls of the model code.
FUZZ_FLAGS := -O1 -g -fno-omit-frame-pointer -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
              -Wno-unknown-pragmas -Iinclude $(PKG_CFLAGS) $(FUZZ_SAN)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZERS    := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
# Only the sources the targets use are compiled again (tests/fuzz/members.sh finds them from a
# link of each target against $(LIB): 44 of 147 files; all of them took 7-8 min on 2 Zen 3 cores).
# `make fuzz-targets` alone compiles FUZZ_LIB_SRC, all of libtidal unless given.
FUZZ_LIB_SRC ?= $(LIB_SRC)
FUZZ_OBJ   := $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)

.PHONY: fuzz fuzz-targets
fuzz: $(LIB)
	@srcs=$$(bash tests/fuzz/members.sh '$(CC)' '$(LIB)' '$(CFLAGS)' '$(LDLIBS)' $(LIB_SRC)) || exit 1; \
	$(MAKE) --no-print-directory fuzz-targets FUZZ_LIB_SRC="$$srcs"
fuzz-targets: $(FUZZERS)

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(DEPDIR_FLAGS) -c $< -o $@

$(BUILD)/fuzz/libtidal.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h $(BUILD)/fuzz/libtidal.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $(DEPDIR_FLAGS) $< -o $@ $(BUILD)/fuzz/libtidal.a $(PKG_LIBS) -lgsl -lm -fopenmp

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
