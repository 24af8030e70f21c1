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

/* Into L2, part `part` of `parts` of the cache lines of nrows rows of `bytes` bytes, `stride`
 * bytes apart from base: the kernels spread the lines of the operand block they read next over
 * the tiles of the current one, so that its packing reads cache instead of waiting on memory. */
static inline void td_prefetch_rows(const void *base, size_t stride, int nrows, size_t bytes,
                                    int part, int parts)
{
    size_t per_row = (bytes + 63) / 64, total = per_row * (size_t)nrows;
    size_t from = total * part / parts, to = total * (part + 1) / parts;
    for (size_t l = from; l < to; l++)
        __builtin_prefetch((const char *)base + (l / per_row) * stride + (l % per_row) * 64, 0, 2);
}

#endif
