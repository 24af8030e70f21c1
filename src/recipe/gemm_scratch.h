/* tidal — per-thread scratch of the GEMM kernels (src/recipe), internal: each kernel its own slot,
 * kept between calls and grown when a call needs more, freed when the thread ends. A fresh buffer
 * of 0.2-1 MB a call came from mmap, and zeroing its pages took 11 % of a bf16 tidal-diff. */
#ifndef TIDAL_RECIPE_GEMM_SCRATCH_H
#define TIDAL_RECIPE_GEMM_SCRATCH_H

#include <stddef.h>

typedef enum { TD_SCRATCH_BF16DP, TD_SCRATCH_FP8FAST, TD_SCRATCH_FIXED, TD_SCRATCH_SLOTS } td_scratch_slot;

/* at least `floats` floats, 64-byte aligned, contents undefined; NULL when memory runs out (the
 * slot's old buffer is freed then) */
float *td_gemm_scratch(td_scratch_slot slot, size_t floats);

#endif
