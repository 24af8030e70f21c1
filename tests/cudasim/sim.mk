# tidal — the CUDA simulator build (included by the top Makefile: `-include tests/cudasim/sim.mk`).
#
# Every src/backend/cuda/*.cu is compiled a second time by g++ against tests/cudasim/cudasim.h
# (-DTD_CUDASIM: threads as fibers, see cudasim.h) into $(BUILD)/sim/libtdcuda_sim.a, together
# with the sim's runtime (cudasim.cpp, the engine) and every tests/cudasim/*_sim.cpp (shims of
# CUDA libraries: cudart_sim.cpp, cublaslt_sim.cpp, ...). Each tests/cudasim/test_NAME.cpp is a
# test program $(BUILD)/sim/test_NAME linked with that library and libtidal; SIMTESTS lists them
# for `make check`. No GPU and no nvcc are needed. $(SAN) instruments it for check-asan.
#
# A sim test: tests/cudasim/test_NAME.cpp includes "cuda_internal.cuh" (-Isrc/backend/cuda)
# (or "cudasim.h") and "simtest.h" (cmocka, sim_managed<T>(n); after cuda_internal.cuh the
# harness: recipe cases, an op run four ways, comparisons with the CPU), calls the _cuda ops and
# compares them with the CPU ops of libtidal. Run a test under another thread order to catch a
# missing barrier: CUDASIM_ORDER=reverse build/sim/test_NAME (or shuffle:SEED).

SIM_CXX      ?= g++
# fmaf (CUDA's __fmaf_rn, the kernels' explicit FMAs) as the FMA instruction where the building CPU
# has one, instead of a call into libm: the same roundings (fp-contract=off: no product and sum
# the source does not fuse is fused), a third of the simulator's time in the GEMM-heavy tests
SIM_FMA      := $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo -mfma -ffp-contract=off)
SIM_CXXFLAGS := -std=c++20 -DTD_CUDASIM -Itests/cudasim -Iinclude $(PKG_CFLAGS) -O1 -g -fopenmp $(SIM_FMA) \
                -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-comment -Wno-unknown-pragmas $(SAN)
SIM_CU       := $(sort $(wildcard src/backend/cuda/*.cu))
SIM_CPP      := tests/cudasim/cudasim.cpp \
                $(filter-out tests/cudasim/test_%,$(sort $(wildcard tests/cudasim/*_sim.cpp)))
SIM_OBJ      := $(SIM_CU:src/backend/cuda/%.cu=$(BUILD)/sim/cu/%.o) \
                $(SIM_CPP:tests/cudasim/%.cpp=$(BUILD)/sim/obj/%.o)
SIM_LIB      := $(BUILD)/sim/libtdcuda_sim.a
SIMTEST_SRC  := $(sort $(wildcard tests/cudasim/test_*.cpp))
SIMTESTS     := $(SIMTEST_SRC:tests/cudasim/%.cpp=$(BUILD)/sim/%)

$(BUILD)/sim/cu/%.o: src/backend/cuda/%.cu
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -x c++ -c $< -o $@

$(BUILD)/sim/obj/%.o: tests/cudasim/%.cpp
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) -MMD -MP -c $< -o $@

# the member list, rewritten when a source appears or goes, so the archive never keeps a stale one
$(BUILD)/sim/members: FORCE_SIM
	@mkdir -p $(dir $@)
	@echo '$(SIM_OBJ)' | cmp -s - $@ || echo '$(SIM_OBJ)' > $@

$(SIM_LIB): $(SIM_OBJ) $(BUILD)/sim/members
	@rm -f $@
	ar rcs $@ $(SIM_OBJ)

SIM_DEVICE   := $(BUILD)/sim/obj/device.o
# the sim library and libtidal refer to each other (ops call back into the CPU code): one group.
# $(SIM_DEVICE) (below) as for the tools: td_device_* (the d2h counter, the peak) answer for the
# simulated backend also where libtidal was built with CUDA=0 (check-asan)
$(BUILD)/sim/test_%: tests/cudasim/test_%.cpp $(SIM_DEVICE) $(SIM_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) -Isrc/backend/cuda -MMD -MP -MF $@.d $< $(SIM_DEVICE) -o $@ \
	    -Wl,--start-group $(SIM_LIB) $(LIB) -Wl,--end-group $(LDLIBS) -lcmocka -lstdc++

# The tools that take --device, built to run on the simulated GPU: $(BUILD)/sim/bin/TOOL is
# tools/TOOL.c compiled as the normal tools are, linked with the sim library first. Their
# device.c is $(BUILD)/sim/obj/device.o, src/backend/device.c compiled again with TD_HAVE_CUDA
# and given as an object (not an archive member), so it is the one linked whatever CUDA= the
# main build used, and its td_cuda_backend_open resolves to the sim library's backend (the
# first archive of the group), never to libtidal's nvcc objects. tests/py/test_device_sim.py
# runs them against the CPU tools.
SIMTOOLS     := $(BUILD)/sim/bin/tidal-diff $(BUILD)/sim/bin/tidal-logprobs $(BUILD)/sim/bin/tidal-bench-model \
                $(BUILD)/sim/bin/tidal-sft $(BUILD)/sim/bin/tidal-rl

$(SIM_DEVICE): src/backend/device.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DTD_HAVE_CUDA $(DEPDIR_FLAGS) -c $< -o $@

$(BUILD)/sim/bin/%: tools/%.c $(SIM_DEVICE) $(SIM_LIB) $(LIB)
	@mkdir -p $(dir $@) $(BUILD)/sim/dep
	$(CC) $(CFLAGS) $(DEPDIR_FLAGS) -MF $(BUILD)/sim/dep/$*.d $< $(SIM_DEVICE) -o $@ \
	    -Wl,--start-group $(SIM_LIB) $(LIB) -Wl,--end-group $(LDLIBS) -lstdc++

.PHONY: sim FORCE_SIM
sim: $(SIMTESTS) $(SIMTOOLS)
tests: $(SIMTESTS) $(SIMTOOLS)
