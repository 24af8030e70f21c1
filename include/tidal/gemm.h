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
 *             fp32 total and restarts at zero (DeepGEMM's promotion); each step summed in
 *             td_gemm_fixed's order, whatever M (td_gemm_fp8_fast). Operands are the
 *             dequantised values, so scales are folded into the products; truncation is
 *             relative, which makes this match the unscaled hardware sum up to the rounding
 *             of the scale products.
 * Summation order: a recipe with batch_invariant takes td_gemm_fixed below (one order per
 * element, whatever the batch), and so does every GEMM of at most TD_GEMM_FIXED_ROWS rows (a
 * decode step's slots, as an engine's decode takes a GEMV-shaped kernel of its own), with 16-bit
 * weights read as stored (td_gemm_fixed_w16: same bits, 2 bytes per weight). Larger GEMMs of
 * recipes whose operands are both bf16 (weights and gemm_inputs bf16, fp32 accumulation) take
 * the CPU's bf16 dot products where it has them (td_gemm_bf16dp: the order of vdpbf16ps, which
 * depends on K alone). Larger GEMMs of any other recipe, or on a CPU without them, take
 * OpenBLAS's sgemm, whose kernel blocks K by its GEMM_Q and picks its
 * micro-kernels by the call's M and N (a row's sums can change with the number of rows in the
 * batch, and with the width of the column slice). Callers cut the
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

/* GEMMs of at most this many rows take the fixed order (see above). */
#define TD_GEMM_FIXED_ROWS 8

/* 1 under TIDAL_GEMM_ORDER=openblas: the summation orders of tidal before the decode kernel and
 * the bf16 dot products (issue 24), OpenBLAS's sgemv for one row and sgemm for more, so a run
 * file made by an earlier version resumes and compares bit for bit (tests/house/ uses it to
 * show that the orders are all that changed). Read once. */
int td_gemm_legacy_order(void);

/* W (N, K) -> out (N, K): the values the recipe's GEMMs multiply. out may equal w. */
void td_gemm_prepare_weight(const td_recipe *r, const float *w, int N, int K, float *out);

/* in (M, K) -> out (M, K): the activation operand as the recipe feeds it to a GEMM. */
void td_gemm_quant_input(const td_recipe *r, const float *in, int M, int K, float *out);
/* in (M, K) -> out (M, K): the values td_gemm_quant_input gives in^T, transposed back (the
 * operand quantised down its columns, along M), for FP8 recipes where td_fp8_fake_quant_cols
 * takes the scheme (1); else 0, out untouched. */
int td_gemm_quant_input_cols(const td_recipe *r, const float *in, int M, int K, float *out);

/* Floats of scratch td_gemm_accumulate needs for an (M, N) output slice. */
size_t td_gemm_scratch_floats(const td_recipe *r, int M, int N);

/* out (M, N; row stride ldo) = in (M, K) · w (N rows of stride ldw)^T, accumulated as the
 * recipe says (no bias, no output rounding). scratch: td_gemm_scratch_floats floats. */
void td_gemm_accumulate(const td_recipe *r, const float *in, int M, int K, const float *w,
                        int ldw, int N, float *out, int ldo, float *scratch);

/* td_gemm_accumulate for fp32 accumulation and M <= TD_GEMM_FIXED_ROWS with w as bf16 or fp16
 * codes (wf) read as stored: the same bits as td_gemm_accumulate on the decoded weights. */
void td_gemm_accumulate_w16(const td_recipe *r, const float *in, int M, int K, const uint16_t *w,
                            td_format wf, int ldw, int N, float *out, int ldo);

/* 1 when r's GEMMs of more than TD_GEMM_FIXED_ROWS rows take td_gemm_bf16dp on this CPU:
 * weights and GEMM inputs bf16, fp32 accumulation, not batch-invariant, the kernel available. */
int td_gemm_bf16dp_applies(const td_recipe *r);

/* The bf16 codes of n floats holding bf16 values; codes may be x's own memory (the codes then
 * sit at its start: td_gemm_pack_bf16). Returns codes. */
uint16_t *td_gemm_bf16_codes(const float *x, size_t n, uint16_t *codes);
static inline uint16_t *td_gemm_pack_bf16(float *x, size_t n) { return td_gemm_bf16_codes(x, n, (uint16_t *)x); }

/* td_gemm_accumulate for a recipe td_gemm_bf16dp_applies to, on bf16 codes: in (M, K), w (N
 * rows of stride ldw); split-K parts summed in fp32 as td_gemm_accumulate does. */
void td_gemm_accumulate_bf16dp(const td_recipe *r, const uint16_t *in, int M, int K,
                               const uint16_t *w, int ldw, int N, float *out, int ldo);

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

/* td_gemm_fixed with w given as bf16 or fp16 codes (wf), N rows of stride ldw codes, widened in
 * registers (src/recipe/gemm_w16.c): bit for bit td_gemm_fixed on the decoded weights, reading
 * 2 bytes per weight. */
void td_gemm_fixed_w16(const float *a, int lda, const uint16_t *w, int ldw, td_format wf, float *c,
                       int ldc, int M, int N, int K, int add);
/* c (M, N; ldc) = (add ? c : 0) + a (M, K) . w (N, K)^T over bf16 codes, in the order of the
 * CPU's bf16 dot-product instruction (AVX512-BF16 vdpbf16ps; src/recipe/gemm_bf16dp.c writes it
 * down): sixteen lane sums over pairs, bf16 subnormals as zeros. td_gemm_bf16dp_ref is that
 * order in portable C (the reference, slow); td_gemm_bf16dp runs a kernel when
 * td_gemm_bf16dp_available (the instruction, or the same order on AVX-512 fp32 FMAs where the
 * instruction is absent or slower; each kernel's bits checked against the reference at first
 * use), else the reference. td_gemm_bf16dp_disabled (tests, benches) turns the kernels off. */
void td_gemm_bf16dp(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                    int M, int N, int K, int add);
void td_gemm_bf16dp_ref(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                        int M, int N, int K, int add);
int td_gemm_bf16dp_available(void);
extern int td_gemm_bf16dp_disabled;
/* which kernel runs that order here: vdpbf16ps, or fp32 FMAs on an AVX-512 CPU where the
 * instruction is absent or slower (the faster of the two whose bits match the reference at first
 * use; TIDAL_BF16DP_KERNEL=dp|fma keeps one); "none (the reference)" when neither */
const char *td_gemm_bf16dp_kernel_name(void);

/* The kernel td_gemm_fixed_w16 takes on this CPU: 2 AVX-512, 1 AVX2, 0 portable. Tests set
 * td_gemm_w16_force: 1 the portable kernel, 2 AVX2 even where AVX-512 is. */
int td_gemm_w16_kernel(void);
extern int td_gemm_w16_force;

/* The fp8-fast accumulation (above) as one kernel (src/recipe/gemm_fp8fast.c): c (M, N; ldc) =
 * a (M, K; lda) . w (N rows of stride ldw)^T, steps of 32 products in td_gemm_fixed's order,
 * partials truncated to `bits` fraction bits, promoted into an fp32 total every `promote`
 * products (at least 32). Its bits depend only on the two operand rows, promote and bits (the
 * AVX-512, AVX2 and portable kernels agree; td_gemm_fixed_max_kernel caps the choice). */
void td_gemm_fp8_fast(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                      int N, int K, int promote, int bits);

/* td_gemm_fp8_fast with w as fp8 codes (wf e4m3 or e5m2, N rows of stride ldw) decoded in
 * registers: row j's code k is the value decode(code) * scale[((row0 + j) / sr) * nbc + k / sc]
 * (td_fp8_decode_scaled_row's), bit for bit td_gemm_fp8_fast on the decoded rows (a NaN result
 * NaN in both). Returns 0 without computing where it does not apply (no AVX2, sc or promote
 * not a multiple of 8, an e4m3 block scale above 2^119): the caller widens the rows instead. */
int td_gemm_fp8_fast_codes(const float *a, int lda, const uint8_t *w, int ldw, td_format wf,
                           const float *scale, int row0, int sr, int sc, int nbc, float *c, int ldc,
                           int M, int N, int K, int promote, int bits, int nan_free);
/* (nan_free 1: the caller knows that no code of w is a NaN, td_fp8_codes_have_nan's answer
 * kept from when the codes were made; 0: the rows are scanned first, and rows with a NaN code
 * are declined.) 1 when one of the n codes of format f (e4m3 or e5m2) is a NaN. */
int td_fp8_codes_have_nan(const uint8_t *codes, size_t n, td_format f);

/* fp8 codes in k-major panels of 8 rows: panel p holds rows 8p..8p+7, row 8p + i's code k at
 * byte p * 8 * cols + k * 8 + i; a last panel's missing rows are code 0. A decode step's 8
 * columns at k are then 8 contiguous bytes, one decode for 8 outputs' lane (the CPU backend
 * stores an fp8-fast recipe's weights this way where td_gemm_fp8_panels_preferred says so).
 * td_fp8_codes_to_panels lays out a (rows, cols) matrix of codes (out: (rows + 7) / 8 * 8 * cols
 * bytes); td_fp8_panels_piece copies row r's codes [c0, c0 + n) back out. */
void td_fp8_codes_to_panels(const uint8_t *codes, size_t rows, size_t cols, uint8_t *out);
void td_fp8_panels_piece(const uint8_t *panels, size_t cols, size_t r, size_t c0, size_t n, uint8_t *out);
/* 1 when td_gemm_fp8_fast_panels runs on this CPU for weights of format wf with block scales of
 * sr rows x sc columns and the promotion interval promote (AVX2 and not capped below it by
 * TIDAL_ISA / td_gemm_fixed_max_kernel; sc and promote multiples of 32, so that a step's 32
 * products share one scale). */
int td_gemm_fp8_panels_apply(td_format wf, int sr, int sc, int promote);
/* 1 when the CPU backend lays such weights out in panels: the panel kernel applies and the CPU
 * has no AVX-512 codes kernel (where it has one, the row-major kernels were measured and stay). */
int td_gemm_fp8_panels_preferred(td_format wf, int sr, int sc, int promote);
/* td_gemm_fp8_fast_codes over panels: p is the panel holding row row0 (a multiple of 8) of the
 * weight, whose rows have K codes; N rows from row0. Bit for bit td_gemm_fp8_fast on the
 * decoded rows. Returns 0 without computing where it does not apply (td_gemm_fp8_panels_apply,
 * a panel straddling two row blocks of scales, an e4m3 block scale above 2^7, a NaN code when
 * nan_free is 0): the caller widens the rows (td_fp8_panels_piece) instead. */
int td_gemm_fp8_fast_panels(const float *a, int lda, const uint8_t *p, td_format wf, const float *scale,
                            int row0, int sr, int sc, int nbc, float *c, int ldc, int M, int N, int K,
                            int promote, int bits, int nan_free);

/* Truncates an fp32 value to `bits` fraction bits (toward zero): the fp8-fast accumulator. */
static inline float td_trunc_fraction(float x, int bits)
{
    union { float f; uint32_t u; } v = {x};
    v.u &= ~((1u << (23 - bits)) - 1u);
    return v.f;
}

TD_END_DECLS

#endif
