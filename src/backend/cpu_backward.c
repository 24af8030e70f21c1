/* tidal — the CPU backend's backward ops under a recipe: the fp32 reference maths
 * (cpu_backward_ref.c) with the rounding points of mixed-precision training, mirroring the
 * forward's (cpu.c). For activations dtype D and GEMM input format G (recipe.h):
 *
 *   GEMMs      dgrad  dX += G(dY) . W'         W' the weight the forward multiplied (rounded
 *                                               to the recipe's weight format)
 *              wgrad  dW += G(dY)^T . G(X)     fp32 accumulation straight into the fp32
 *                                               gradient (Megatron / Transformer Engine
 *                                               "main_grad" wgrad accumulation)
 *              FP8 (Jet-RL's unified flow, DeepSeek-V3's recipe): the same quantisation as
 *              the forward: dgrad's dY in 1x128 groups along its reduction (OUT), W' the
 *              forward's 128x128-block weight; wgrad's dY and X both in groups of 128 along
 *              their reduction (the tokens: 128x1 tiles of the row-major tensors), with the
 *              recipe's act_scaling; fp32 accumulation.
 *   attention  P and dS rounded to D before the GEMMs that read them (FlashAttention-2's
 *              backward feeds both to the tensor cores in the input dtype), fp32 softmax
 *              recomputation and row sums
 *   RoPE       inverse rotation with cos/sin rounded to D for the HF (unfused) form
 *   everywhere every input gradient an op accumulates is rounded to D after the op, as
 *              autograd holds a bf16 model's gradients in bf16 (between ops, BF16 in the FP8
 *              flow); norm-weight, bias and embedding gradients accumulate in fp32.
 * With bf16 weights and GEMM inputs (and the CPU's bf16 dot products: gemm.h) dgrad and wgrad
 * run on td_gemm_bf16dp over bf16 codes, the forward's larger GEMMs' order, each operand laid
 * out with its reduction contiguous (W'^T for dgrad, dY^T and X^T for wgrad).
 * Rounding goes through the numerics (td_round_row, td_fp8_fake_quant). FP16 overflows to
 * Inf here, which is what dynamic loss scaling detects. */
#include "cpu.h"
#include "tidal/gemm.h"
#include "tidal/isa.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>


/* dst (cols, rows) = src (rows, cols)^T over rows [i0, i1) x cols [j0, j1), 32 x 32 blocks (both
 * sides stay in cache) */
static void transpose_scalar(const float *src, size_t rows, size_t cols, float *dst, size_t i0s,
                             size_t i1, size_t j0s, size_t j1)
{
    for (size_t i0 = i0s; i0 < i1; i0 += 32)
        for (size_t j0 = j0s; j0 < j1; j0 += 32)
            for (size_t i = i0; i < i1 && i < i0 + 32; i++)
                for (size_t j = j0; j < j1 && j < j0 + 32; j++) dst[j * rows + i] = src[i * cols + j];
}

/* the bf16 codes of src rows [i0, i1) x cols [j0, j1), transposed into dst (cols, rows): each
 * value encoded (round to nearest even, td_f32_to_bf16), so src need not be rounded first (a bf16
 * value's code is its high half) */
static void codes_transposed_scalar(const float *src, size_t rows, size_t cols, uint16_t *dst, size_t i0,
                                    size_t i1, size_t j0, size_t j1)
{
    for (size_t i = i0; i < i1; i++)
        for (size_t j = j0; j < j1; j++) dst[j * rows + i] = td_f32_to_bf16(src[i * cols + j]).bits;
}

#if defined(__x86_64__)
#include <immintrin.h>
#include "../recipe/gemm_lanes.h"   /* td_transpose16_regs, td_transpose8_avx2 */
#include "../numerics/bf16_lanes.h"  /* td_bf16_hi16 */
#define TGT512 __attribute__((target("avx512f,avx512bw")))
/* one 16 x 16 block: src rows of stride ls, dst rows of stride ld (the transposed codes); each
 * column encoded (td_bf16_hi16: the scalar encoder's bits) and narrowed to 16 bits */
TGT512 static void transpose16_codes(const float *src, size_t ls, uint16_t *dst, size_t ld)
{
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(src + (size_t)i * ls));
    td_transpose16_regs(r);
    for (int k = 0; k < 16; k++)
        _mm256_storeu_si256((__m256i *)(dst + (size_t)k * ld),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(td_bf16_hi16(r[k]), 16)));
}

/* the same block of fp32 values, stored whole */
TGT512 static void transpose16_f32(const float *src, size_t ls, float *dst, size_t ld)
{
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(src + (size_t)i * ls));
    td_transpose16_regs(r);
    for (int k = 0; k < 16; k++) _mm512_storeu_si512((void *)(dst + (size_t)k * ld), r[k]);
}

/* an 8 x 8 block of fp32 values (AVX2) */
__attribute__((target("avx2"))) static void transpose8_f32(const float *src, size_t ls, float *dst, size_t ld)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + (size_t)i * ls);
    td_transpose8_avx2(r);
    for (int k = 0; k < 8; k++) _mm256_storeu_ps(dst + (size_t)k * ld, r[k]);
}
#endif

/* src (rows, cols) transposed into dst (cols, rows): fp32 values (codes 0; the FP8 wgrad's operands,
 * grouped along the tokens) or their bf16 codes (codes 1: fp32 values encoded, for the bf16 dot
 * products).
 * 16 x 16 register blocks on AVX-512 (the only CPUs whose bf16 dot products take the codes), 8 x 8
 * blocks of fp32 on AVX2, the edges element by element. */
static void transpose_blocks(int nt, const float *src, size_t rows, size_t cols, void *dst, int codes)
{
    size_t rb = 0, cb = 0;   /* the rows and columns the register blocks cover */
#if defined(__x86_64__)
    if (td_isa_level() >= TD_ISA_AVX512) {
        rb = rows & ~(size_t)15;
        cb = cols & ~(size_t)15;
        /* threads over bands of 16 rows (every element a copy: the same result at any count) */
        #pragma omp parallel for num_threads(nt) if (rows * cols >= 65536)
        for (size_t i0 = 0; i0 < rb; i0 += 16)
            for (size_t j0 = 0; j0 < cb; j0 += 16) {
                size_t at = j0 * rows + i0;
                if (codes) transpose16_codes(src + i0 * cols + j0, cols, (uint16_t *)dst + at, rows);
                else transpose16_f32(src + i0 * cols + j0, cols, (float *)dst + at, rows);
            }
    } else if (!codes && td_isa_level() >= TD_ISA_AVX2) {   /* the FP8 wgrad's operands on AVX2 */
        rb = rows & ~(size_t)7;
        cb = cols & ~(size_t)7;
        #pragma omp parallel for num_threads(nt) if (rows * cols >= 65536)
        for (size_t i0 = 0; i0 < rb; i0 += 8)
            for (size_t j0 = 0; j0 < cb; j0 += 8)
                transpose8_f32(src + i0 * cols + j0, cols, (float *)dst + j0 * rows + i0, rows);
    }
#endif
    if (codes) {
        codes_transposed_scalar(src, rows, cols, dst, 0, rb, cb, cols);   /* the right edge */
        codes_transposed_scalar(src, rows, cols, dst, rb, rows, 0, cols);  /* the bottom rows */
    } else {
        transpose_scalar(src, rows, cols, dst, 0, rb, cb, cols);
        transpose_scalar(src, rows, cols, dst, rb, rows, 0, cols);
    }
}

static void transpose(int nt, const float *src, size_t rows, size_t cols, float *dst)
{
    transpose_blocks(nt, src, rows, cols, dst, 0);
}

static void codes_transposed(int nt, const float *src, size_t rows, size_t cols, uint16_t *dst)
{
    transpose_blocks(nt, src, rows, cols, dst, 1);
}

/* exposed for tests/test_gemm.c: the vector transpose against the scalar one */
void td_test_codes_transposed(const float *src, size_t rows, size_t cols, uint16_t *dst, int scalar)
{
    if (scalar)
        codes_transposed_scalar(src, rows, cols, dst, 0, rows, 0, cols);
    else
        codes_transposed(1, src, rows, cols, dst);
}

/* C (M, N; ldc) += A (M, K) . B (N, K)^T over bf16 codes (td_gemm_bf16dp), threads over slices
 * of C's columns: each element's order depends on K alone */
static void bf16dp_acc(const td_ops *ctx, int M, int N, int K, const uint16_t *A,
                       const uint16_t *B, float *C, int ldc)
{
    #pragma omp parallel num_threads(gemm_threads(ctx, M, K, N))
    {
        long c0, c1;
        gemm_slice(N, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        if (c0 < c1)
            td_gemm_bf16dp(A, K, B + (size_t)c0 * K, K, C + c0, ldc, M, (int)(c1 - c0), K, 1);
    }
}

/* The backward GEMMs' scratch: one block per thread, grown to the largest call and kept (a
 * buffer of tens of MB malloc'd and freed per call went back to the kernel each time, and its
 * pages faulted in again on the next: 5 % of a bf16 training step), until scratch_release. */
static _Thread_local struct { char *p; size_t cap; } bw_scratch;

void cpu_scratch_release(void)
{
    free(bw_scratch.p);
    bw_scratch.p = NULL;
    bw_scratch.cap = 0;
}

static size_t al64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* parts[i] of sizes[i] bytes (n parts), carved from the thread's scratch */
static void scratch_parts(int n, const size_t *sizes, void **parts)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += al64(sizes[i]);
    if (total > bw_scratch.cap) {
        free(bw_scratch.p);
        bw_scratch.p = td_xmalloc(total);
        bw_scratch.cap = total;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        parts[i] = bw_scratch.p + off;
        off += al64(sizes[i]);
    }
}

/* dgrad and wgrad of a recipe td_gemm_bf16dp_applies to (its GEMM inputs bf16): the operands'
 * codes straight from the fp32 values, G(dY) and X rounded to bf16 by the encoding itself (a
 * rounded value's code is the value's encoding), so neither is rounded into a buffer first (those
 * two passes were 2.6 % of a bf16 training step); p and q hold max(N, IN) * max(OUT, IN) codes each */
static void matmul_backward_bf16dp(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                                   const float *inp, const float *weight, int N, int IN, int OUT,
                                   uint16_t *p, uint16_t *q)
{
    if (dinp) {
        td_encode_row(TD_BF16, dout, p, (size_t)N * OUT, TD_SATFINITE);   /* dY's codes (N, OUT), W'^T's (IN, OUT) */
        codes_transposed(ctx->nthreads, weight, (size_t)OUT, (size_t)IN, q);
        bf16dp_acc(ctx, N, IN, OUT, p, q, dinp, IN);
        act_round(ctx, dinp, (size_t)N * IN);
    }
    if (dweight) {   /* dY^T (OUT, N), X^T (IN, N): X rounded as the forward fed it */
        codes_transposed(ctx->nthreads, dout, (size_t)N, (size_t)OUT, p);
        codes_transposed(ctx->nthreads, inp, (size_t)N, (size_t)IN, q);
        bf16dp_acc(ctx, OUT, IN, N, p, q, dweight, IN);
    }
}

/* x (rows, cols) as the recipe feeds an activation-like operand to a GEMM whose reduction runs
 * along cols: fp8 groups of act_scaling along cols, else rounded to gemm_inputs */
static void quant_operand(const td_recipe *r, const float *x, size_t rows, size_t cols, float *out)
{
    td_gemm_quant_input(r, x, (int)rows, (int)cols, out);
}

void embedding_backward_cpu(const td_ops *ctx, float *dembed, const float *dout,
                                   const int *tokens, int N, int C)
{
    embedding_backward_ref(ctx, dembed, dout, tokens, N, C);   /* an fp32 gradient */
}

void rmsnorm_backward_cpu(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                                 const float *inp, const float *weight, const float *rstd, int N,
                                 int C)
{
    rmsnorm_backward_ref(ctx, dinp, dweight, dout, inp, weight, rstd, N, C);
    act_round(ctx, dinp, (size_t)N * C);
}

void matmul_backward_cpu(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight, int N,
                                int IN, int OUT)
{
    const td_recipe *r = ctx->recipe;
    if (td_recipe_is_plain_fp32(r)) {
        matmul_backward_ref(ctx, dinp, dweight, dbias, dout, inp, weight, N, IN, OUT);
        return;
    }
    if (dbias) bias_grad_acc(ctx, dbias, dout, N, OUT);
    if (!dinp && !dweight) return;
    size_t nmax = (size_t)N * (IN > OUT ? IN : OUT);
    int fp8 = td_recipe_fp8_gemm(r);
    void *part[4];
    if (td_gemm_bf16dp_applies(r)) {   /* the two operands' codes */
        size_t big = (size_t)(N > IN ? N : IN) * (OUT > IN ? OUT : IN);
        size_t sizes[2] = {big * sizeof(uint16_t), big * sizeof(uint16_t)};
        scratch_parts(2, sizes, part);
        matmul_backward_bf16dp(ctx, dinp, dweight, dout, inp, weight, N, IN, OUT, part[0], part[1]);
        return;
    }
    size_t sizes[3] = {(size_t)N * OUT * sizeof(float), dweight ? nmax * sizeof(float) : 0, 0};
    scratch_parts(3, sizes, part);   /* dY and X; the FP8 wgrad's transpose only where it takes one */
    float *dy = part[0], *x = part[1], *t;
    if (dinp || !fp8) quant_operand(r, dout, (size_t)N, (size_t)OUT, dy);   /* groups along OUT */
    if (dinp) {
        gemm_nn_acc(ctx, N, IN, OUT, 1.0f, dy, OUT, weight, IN, dinp, IN);
        act_round(ctx, dinp, (size_t)N * IN);
    }
    if (dweight) {
        if (fp8) {   /* both operands quantised along the tokens */
            /* down the columns where it can (else both redone transposed, below): dY
             * (N, OUT) and X (N, IN) as they are, multiplied as dY^T X */
            if (td_gemm_quant_input_cols(r, dout, N, OUT, dy) && td_gemm_quant_input_cols(r, inp, N, IN, x)) {
                gemm_tn_acc(ctx, OUT, IN, N, 1.0f, dy, OUT, x, IN, dweight, IN);
            } else {   /* nothing in the scratch is live here: carved again with the transpose */
                sizes[2] = nmax * sizeof(float);
                scratch_parts(3, sizes, part);
                dy = part[0], x = part[1], t = part[2];
                transpose(ctx->nthreads, dout, (size_t)N, (size_t)OUT, t);
                quant_operand(r, t, (size_t)OUT, (size_t)N, dy);     /* dY^T (OUT, N) */
                transpose(ctx->nthreads, inp, (size_t)N, (size_t)IN, t);
                quant_operand(r, t, (size_t)IN, (size_t)N, x);       /* X^T (IN, N) */
                gemm_nt_acc(ctx, OUT, IN, N, 1.0f, dy, N, x, N, dweight, IN);
            }
        } else {   /* dy as rounded for dgrad: the same operand */
            quant_operand(r, inp, (size_t)N, (size_t)IN, x);
            gemm_tn_acc(ctx, OUT, IN, N, 1.0f, dy, OUT, x, IN, dweight, IN);
        }
    }
}

void rope_backward_cpu(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq,
                              int N, int nheads, int HD)
{
    td_format D = act_of(ctx);
    int fused = ctx->recipe && ctx->recipe->rope != TD_ROPE_UNFUSED;   /* trainers rotate as HF (unfused); others: fp32 rotation */
    rope_backward_rounded(ctx, fused ? TD_F32 : D, dx, pos, inv_freq, N, nheads, HD);
    act_round(ctx, dx, (size_t)N * nheads * HD);
}

void attention_backward_cpu(const td_ops *ctx, float *dq, float *dk, float *dv,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, const float *out, const float *lse,
                                   const int *pos, int N, int NH, int NKV, int HD, float *scratch,
                                   int max_keys)
{
    td_format D = act_of(ctx);
    attention_backward_rounded(ctx, D, dq, dk, dv, dout, q, k, v, out, lse, pos, N, NH, NKV, HD,
                               scratch, max_keys);
    act_round(ctx, dq, (size_t)N * NH * HD);
    act_round(ctx, dk, (size_t)N * NKV * HD);
    act_round(ctx, dv, (size_t)N * NKV * HD);
}

void swiglu_backward_cpu(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                                const float *gate, const float *up, int N, int F)
{
    swiglu_backward_ref(ctx, dgate, dup, dout, gate, up, N, F);
    act_round(ctx, dgate, (size_t)N * F);
    act_round(ctx, dup, (size_t)N * F);
}
