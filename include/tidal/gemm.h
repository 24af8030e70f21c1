/* tidal — GEMMs as a path with a given recipe computes them (CPU emulation).
 *
 *   out (M, N) = round_act( acc( quant_in(in) (M, K) · W' (N, K)^T ) + bias )
 *
 * W' is the weight prepared once by td_gemm_prepare_weight (rounded to the recipe's weight
 * format; FP8 fake-quantised with its weight scaling). quant_in rounds the activation operand
 * to gemm_inputs (FP8: fake-quantised per act_scaling, e.g. 1x128 groups along K). acc is
 *   fp32      an fp32 sgemm over the rounded operands: products of bf16/fp16/fp8 values are
 *             exact in fp32, so this is what a tensor core with fp32 accumulation computes, up
 *             to summation order; split_k > 1 sums split_k partial GEMMs over K slices in fp32.
 *   fp8-fast  the Hopper FP8 model: K is walked in WGMMA steps of 32 products; after each
 *             step the running partial sum keeps only acc_fraction_bits fraction bits
 *             (truncated), and every promote_every products the partial is added into an
 *             fp32 total and restarts at zero (DeepGEMM's promotion). Operands are the
 *             dequantised values, so scales are folded into the products; truncation is
 *             relative, which makes this match the unscaled hardware sum up to the rounding
 *             of the scale products.
 * Summation order: a recipe with batch_invariant takes td_gemm_fixed below (one order per
 * element, whatever the batch). Any other recipe takes OpenBLAS: sgemm for M > 1, whose kernel
 * blocks K by its GEMM_Q and picks its micro-kernels by the call's M and N (a row's sums can
 * change with the number of rows in the batch, and with the width of the column slice), and
 * sgemv for M = 1 (a decode step of one sequence: another order again). Callers cut the
 * columns into fixed tiles (TD_GEMM_TILE), never by thread count, so results do not depend on
 * the number of threads.
 * The bias is added in fp32 and the result rounded to the activations dtype, as a GEMM kernel
 * writing a bf16 tensor does. Every function here is single-threaded on its slice; callers
 * parallelise over output columns.
 */
#ifndef TIDAL_GEMM_H
#define TIDAL_GEMM_H

#include "tidal/recipe.h"

TD_BEGIN_DECLS

/* W (N, K) -> out (N, K): the values the recipe's GEMMs multiply. out may equal w. */
void td_gemm_prepare_weight(const td_recipe *r, const float *w, int N, int K, float *out);

/* in (M, K) -> out (M, K): the activation operand as the recipe feeds it to a GEMM. */
void td_gemm_quant_input(const td_recipe *r, const float *in, int M, int K, float *out);

/* Floats of scratch td_gemm_accumulate needs for an (M, N) output slice. */
size_t td_gemm_scratch_floats(const td_recipe *r, int M, int N);

/* out (M, N; row stride ldo) = in (M, K) · w (N rows of stride ldw)^T, accumulated as the
 * recipe says (no bias, no output rounding). scratch: td_gemm_scratch_floats floats. */
void td_gemm_accumulate(const td_recipe *r, const float *in, int M, int K, const float *w,
                        int ldw, int N, float *out, int ldo, float *scratch);

/* Bias (may be NULL) and output rounding on an (M, N) slice of stride ldo. */
void td_gemm_finish(const td_recipe *r, float *out, int M, int N, int ldo, const float *bias);

/* Rounds n values to the recipe's activations dtype in place (op boundaries). */
void td_round_act(const td_recipe *r, float *x, size_t n);

/* The batch-invariant GEMM (src/recipe/gemm_fixed.c): c (M, N; ldc) = (add ? c : 0) +
 * a (M, K; lda) . w (N rows of stride ldw)^T with one fixed summation order per element:
 * eight lane sums s_l += a[k] w[k] (k = l mod 8, increasing k, each a fused multiply-add),
 * then ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)). An element's value depends only on its row
 * of a and its row of w: not on M, N, its place in the call, the thread or the machine (the
 * AVX-512, AVX2+FMA and portable fmaf kernels agree bit for bit). Single-threaded; its scratch
 * is allocated per call. */
void td_gemm_fixed(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                   int N, int K, int add);
/* Tests: the widest kernel td_gemm_fixed may take (default: the CPU's widest). All give the
 * same bits; a cap lets a test compare them on one machine. */
typedef enum { TD_GEMM_FIXED_PORTABLE, TD_GEMM_FIXED_AVX2, TD_GEMM_FIXED_AVX512 } td_gemm_fixed_kernel;
extern td_gemm_fixed_kernel td_gemm_fixed_max_kernel;

/* Truncates an fp32 value to `bits` fraction bits (toward zero): the fp8-fast accumulator. */
static inline float td_trunc_fraction(float x, int bits)
{
    union { float f; uint32_t u; } v = {x};
    v.u &= ~((1u << (23 - bits)) - 1u);
    return v.f;
}

TD_END_DECLS

#endif
