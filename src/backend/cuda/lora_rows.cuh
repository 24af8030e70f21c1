/* tidal — what the LoRA row kernels share (prepare.cu's fold_rows, lora_sync.cu's peft_rows): the
 * update dW[i][j] = scale (B A)[i][j] in td_lora_fold_delta's order (an fma chain over k from +0,
 * then the scale), and a row's four merge statistics summed in double in column order
 * (uncontracted, as the host compiles them: sync.c / td_lora_fold_stats). */
#ifndef TIDAL_CUDA_LORA_ROWS_CUH
#define TIDAL_CUDA_LORA_ROWS_CUH
#include "kern.cuh"

__device__ static inline float lora_row_delta(const float *a, const float *b, int i, int j, int K, int r, float scale)
{
    float acc = 0.0f;
    for (int k = 0; k < r; k++) acc = __fmaf_rn(b[(size_t)i * r + k], a[(size_t)k * K + j], acc);
    return tdc_mul(acc, scale);
}

/* kept2 = sum d^2, delta2 = sum dW^2, dot = sum d dW, changed = #{d != 0} with d = R(W + dW) - R(W) */
typedef struct { double kept2, delta2, dot, changed; } lora_row_stats;

__device__ static inline void lora_row_add(lora_row_stats *s, float merged, float base, float delta)
{
    double d = __dadd_rn((double)merged, -(double)base);
    s->kept2 = __dadd_rn(s->kept2, __dmul_rn(d, d));
    s->delta2 = __dadd_rn(s->delta2, __dmul_rn((double)delta, (double)delta));
    s->dot = __dadd_rn(s->dot, __dmul_rn(d, (double)delta));
    s->changed += merged != base;
}

__device__ static inline void lora_row_store(const lora_row_stats *s, double *row_stats, int i)
{
    row_stats[4 * (size_t)i] = s->kept2;
    row_stats[4 * (size_t)i + 1] = s->delta2;
    row_stats[4 * (size_t)i + 2] = s->dot;
    row_stats[4 * (size_t)i + 3] = s->changed;
}
#endif
