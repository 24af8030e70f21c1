/* tidal — the GEMMs of the CUDA backend on cuBLASLt: matmul_forward_cuda, the CUDA form of
 * matmul_cpu / matmul_recipe (src/backend/cpu.c) with the semantics of include/tidal/gemm.h:
 *
 *   out[j] (N, OUT[j]) = round_act( acc( quant_in(inp) . W_j^T ) + bias_j )
 *
 * Layout. tidal's buffers are row-major, cuBLASLt's column-major: a row-major (R, C) matrix is a
 * column-major (C, R) one with ld C. So out^T (OUT, N) = W (OUT, IN) . inp^T is computed with
 *   A = the weight, (IN x OUT) column-major, op T;  B = the activations, (IN x N), op N;
 *   D = (OUT x N) column-major with ld OUT, which is out (N, OUT) row-major.
 * That is the TN layout FP8 GEMMs require.
 *
 * Per recipe (its gemm_inputs; no recipe or plain fp32 = the reference):
 *   fp32        A = the weight as fp32 (bf16/fp16/fp8 storage widened once into a cached device
 *               copy, matmul_forget_cuda drops it), B = inp; CUBLAS_COMPUTE_32F (not TF32).
 *   bf16, fp16  B = inp rounded to gemm_inputs as 16-bit codes by a kernel (exact: the values are
 *               on that grid already, and where they are not this is the CPU's rounding), A = the
 *               td_wmat's codes resident as they are (tdc_const); COMPUTE_32F, D fp32. If the
 *               weight's storage is not gemm_inputs (an fp32 copy of rounded weights), both
 *               operands are widened to fp32 and an fp32 GEMM multiplies the same values:
 *               products of 16-bit values are exact in fp32 either way; only the summation order
 *               differs from the tensor-core kernel.
 *   fp8         activations quantised by fp8_quantize_cuda (fp8_quant.cu: td_fp8_quantize's
 *               arithmetic, bit for bit), weights the td_wmat's E4M3 codes and block scales
 *               (converted to cuBLASLt's scale layouts, see below); cuBLASLt FP8 with
 *                 weight one block, act per-tensor       SCALAR_32F scale pointers on A and B
 *                 weight one block or per-row, act per-tensor or per-token
 *                                                        OUTER_VEC_32F on both (scalars repeated)
 *                 weight 128x128 (or one block), act 1x128, K % 128 == 0
 *                                                        BLK128x128_32F on A, VEC128_32F on B
 *                                                        (cuBLAS >= 12.9, Hopper)
 *               FAST_ACCUM = 1 when the recipe accumulates fp8-fast, but not in the block-scaled
 *               modes: cuBLASLt refuses fast accumulation there (as PyTorch's scaled_gemm states),
 *               and those kernels promote into fp32 at each 128-wide K block when they apply the
 *               scales, which is the recipe's fp8-fast with promote_every 128 (fp8-rollout).
 *               The token dimension is zero-padded to a multiple of 16 (codes 0), so a decode
 *               step (N = 1) takes the same kernels. D is fp32; where an FP8 mode has no fp32
 *               output and the product has no bias, D is written in the activations dtype (bf16
 *               / fp16: the fp32 sum rounded once, the same value as round_act(acc)) and widened.
 *               FALLBACK (the CPU's emulation semantics): what cuBLASLt cannot take — MX and other
 *               granularities, K not a multiple of 16 (of 128 for the block modes), OUT not a
 *               multiple of 16, e5m2 x e5m2, split_k > 1, a cuBLAS or GPU without the mode (the
 *               heuristic refuses; noted once on stderr) — multiplies the dequantised operands:
 *               an fp32 GEMM for fp32 accumulation, or for fp8-fast a kernel walking K in steps
 *               of 32 products with the truncated partial sum and promotion of gemm.h.
 *   split_k > 1 (not fp8)  cuBLASLt's split-K (lt.cu: CUBLASLT_ALGO_CONFIG_SPLITK_NUM = split_k,
 *               an fp32 reduction scheme, cublasLtMatmulAlgoCheck); if no algorithm takes it, K slices of
 *               ceil(K / split_k) as the CPU cuts them, each slice's GEMM adding onto D in fp32
 *               (beta = 1): ((p0 + p1) + p2)..., the CPU's order of the partial sums.
 *   batch_invariant  never cuBLASLt (its algorithm, hence its order, follows the shape): fp32
 *               operands (rounded / dequantised values), fixed_kernel in td_gemm_fixed's order over
 *               the CPU's K slices, or fp8_fast_kernel with that order per step: the CPU's bits,
 *               whatever the batch. A plain kernel, one thread per output: slow, but exact.
 * Epilogue (a kernel): bias added in fp32, then rounded to the activations dtype (td_gemm_finish).
 *
 * Scratch slots (cuda_internal.cuh): GEMM_A the activation operand (16-bit or fp8 codes),
 * GEMM_SCALES the activation scales (tidal's order, then cuBLASLt's) and the weight's scale
 * tensor in cuBLASLt's layout, GEMM_OUT the padded fp32 D and the widened activations, WORKSPACE
 * cuBLASLt's 32 MiB (MISC: fp8_quantize_cuda, fp8_quant.cu). The cuBLASLt calls, their checking
 * and the cached plans are lt.cu's. The fp32 weight copies and the plans are dropped by
 * matmul_forget_cuda (be->forget). */
#include "lt.cuh"
#include "matmul.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPB 256
static unsigned nblk(size_t n) { return (unsigned)((n + TPB - 1) / TPB); }
static size_t up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* ---- kernels ------------------------------------------------------------------------------- */

#define GTID ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

/* y = x rounded to fmt (bf16 / fp16) as codes */
__global__ void codes16_kernel(const float *x, uint16_t *y, size_t n, int fmt)
{
    size_t i = GTID;
    if (i < n) y[i] = fmt == TD_BF16 ? tdc_bf16_enc(x[i]) : tdc_f16_enc(x[i]);
}

/* y = x rounded to fmt, as fp32 */
__global__ void round_kernel(const float *x, float *y, size_t n, int fmt)
{
    size_t i = GTID;
    if (i < n) y[i] = tdc_round(fmt, x[i]);
}

/* dst (rows, cols) fp32 = src in dtype; fp8: decode(code) * scale[(r / sr) * nbc + c / sc]
 * (td_fp8_dequantize's and wmat_rows's formula) */
__global__ void widen_kernel(const void *src, int dtype, const float *scale, int sr, int sc, int nbc,
                             int rows, int cols, float *dst)
{
    size_t i = GTID;
    if (i >= (size_t)rows * cols) return;
    float v;
    if (dtype == TD_BF16) v = tdc_bf16_dec(((const uint16_t *)src)[i]);
    else if (dtype == TD_F16) v = tdc_f16_dec(((const uint16_t *)src)[i]);
    else {
        uint8_t c = ((const uint8_t *)src)[i];
        size_t r = i / cols, k = i % cols;
        v = (dtype == TD_E4M3 ? tdc_e4m3_dec(c) : tdc_e5m2_dec(c)) * scale[(r / sr) * nbc + k / sc];
    }
    dst[i] = v;
}

/* out (N, O) = round_act(D (N rows of ld ldd) + bias); in place when D == out */
__global__ void finish_kernel(const float *D, int ldd, float *out, const float *bias, int N, int O,
                              int act)
{
    size_t i = GTID;
    if (i >= (size_t)N * O) return;
    size_t n = i / O, o = i % O;
    float v = D[n * ldd + o];
    if (bias) v += bias[o];
    out[i] = tdc_round(act, v);
}

/* td_trunc_fraction on the device */
__device__ static inline float trunc_fraction(float x, int bits)
{
    return tdc_float(tdc_bits(x) & ~((1u << (23 - bits)) - 1u));
}

/* td_gemm_fixed's order for one element (gemm_fixed.c): eight lane sums of fused multiply-adds,
 * k = l mod 8 from the start of the slice, then ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)) */
__device__ static inline float dot_fixed(const float *a, const float *w, int K)
{
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < K; k += 8)
        for (int l = 0; l < 8; l++)
            s[l] = k + l < K ? fmaf(a[k + l], w[k + l], s[l]) : fmaf(0.0f, 0.0f, s[l]);
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The batch-invariant GEMM: out (N, O) (+)= a[:, k0:k0+kn] . w[:, k0:k0+kn]^T in td_gemm_fixed's
 * order, one thread per element (the same bits as the CPU's, whatever the batch) */
__global__ void fixed_kernel(const float *a, const float *w, float *out, int N, int O, int K, int k0,
                             int kn, int add)
{
    size_t i = GTID;
    if (i >= (size_t)N * O) return;
    float d = dot_fixed(a + (i / O) * K + k0, w + (i % O) * K + k0, kn);
    out[i] = add ? out[i] + d : d;
}

/* The fp8-fast accumulation of gemm.h over dequantised operands: out (N, O) = a (N, K) . w^T,
 * K walked in promotion groups, each summed in steps of 32 products whose running partial keeps
 * `bits` fraction bits, every group's partial added into an fp32 total. One thread per output;
 * a step is an fma chain, or td_gemm_fixed's order for a batch-invariant recipe (the CPU's). */
__global__ void fp8_fast_kernel(const float *a, const float *w, float *out, int N, int O, int K,
                                int promote, int bits, int invariant)
{
    size_t i = GTID;
    if (i >= (size_t)N * O) return;
    const float *ar = a + (i / O) * K, *wr = w + (i % O) * K;
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += promote) {
        int k1 = k0 + promote < K ? k0 + promote : K;
        float part = 0.0f;
        for (int s0 = k0; s0 < k1; s0 += 32) {
            int s1 = s0 + 32 < k1 ? s0 + 32 : k1;
            float step = 0.0f;
            if (invariant) step = dot_fixed(ar + s0, wr + s0, s1 - s0);
            else for (int k = s0; k < s1; k++) step = fmaf(ar[k], wr[k], step);
            part = trunc_fraction(part + step, bits);
        }
        total += part;
    }
    out[i] = total;
}

/* ---- cuBLASLt's FP8 scale layouts ---------------------------------------------------------
 * (cuBLAS documentation, cublasLtMatmulMatrixScale_t; PyTorch's scaled_gemm checks the same):
 *   OUTER_VEC_32F    A: one scale per row of op(A) (an output column), B: one per column of
 *                    op(B) (a token); D(i, j) = sA[i] sB[j] sum_k A B
 *   VEC128_32F       B (K x Nc, K inner): scale (k / 128, j) at [(k / 128) * Nc + j]
 *   BLK128x128_32F   A (K x M stored, K inner): scale (k / 128, i / 128) at
 *                    [(i / 128) * ldk + k / 128], ldk = ceil(K / 128) rounded up to 4
 * Padded entries (tokens past N, K blocks past K) get 1.0: they multiply zero codes or nothing. */

/* act scales in tidal's order (N rows, nbc per row; one value when `single`) -> B's layout */
__global__ void act_scales_lt_kernel(const float *sc, int single, int N, int Np, int nbc, int vec128,
                                     float *lt)
{
    size_t i = GTID;
    if (i >= (size_t)Np * nbc) return;
    size_t kb = i / Np, n = i % Np;
    lt[i] = n >= (size_t)N ? 1.0f : single ? sc[0] : vec128 ? sc[n * nbc + kb] : sc[n];
}

/* weight scales (blocks sr x sc, nbc per row; one value when `single`) -> A's layout: OUT values
 * (outer vector) or (nob, ldk) 128x128 blocks */
__global__ void w_scales_lt_kernel(const float *ws, int single, int O, int nbc, int nob, int nkb,
                                   int ldk, int blk, float *lt)
{
    size_t i = GTID;
    if (!blk) {
        if (i < (size_t)O) lt[i] = single ? ws[0] : ws[i];
        return;
    }
    if (i >= (size_t)nob * ldk) return;
    size_t ob = i / ldk, kb = i % ldk;
    lt[i] = kb >= (size_t)nkb ? 1.0f : single ? ws[0] : ws[ob * nbc + kb];
}

/* ---- weights widened to fp32, cached -------------------------------------------------------- */

struct wcopy { const void *host; size_t n; float *dev; };
static wcopy *WC;
static size_t NWC, CAPWC;

static size_t dtype_size(int dtype) { return dtype == TD_F32 ? 4 : dtype == TD_BF16 || dtype == TD_F16 ? 2 : 1; }

/* w (rows, cols) as fp32 device memory: resident as it is when fp32, else widened once and kept */
static const float *widened(const td_wmat *w, int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    if (w->dtype == TD_F32) return (const float *)tdc_const(w->data, n * sizeof(float));
    for (size_t i = 0; i < NWC; i++)
        if (WC[i].host == w->data && WC[i].n == n) return WC[i].dev;
    const void *src = tdc_const(w->data, n * dtype_size(w->dtype));
    const float *sc = NULL;
    if (w->dtype == TD_E4M3 || w->dtype == TD_E5M2)
        sc = (const float *)tdc_const(w->scale, (size_t)((rows + w->sr - 1) / w->sr) * w->nbc * sizeof(float));
    float *dst = NULL;
    TDC_MALLOC(&dst, n * sizeof(float), "an fp32 copy of a weight (fp32 GEMM operand)");
    TD_LAUNCH(widen_kernel, nblk(n), TPB, 0, tdc_stream(), src, (int)w->dtype, sc, w->sr, w->sc, w->nbc,
              rows, cols, dst);
    CUDA_CHECK_LAUNCH();
    if (NWC == CAPWC) {
        CAPWC = CAPWC ? 2 * CAPWC : 64;
        WC = (wcopy *)realloc(WC, CAPWC * sizeof *WC);
        if (!WC) { fprintf(stderr, "tidal: out of host memory\n"); exit(1); }
    }
    WC[NWC++] = wcopy{w->data, n, dst};
    return dst;
}

extern "C" void matmul_forget_cuda(void)
{
    lt_forget();   /* plans are cheap to find again */
    if (!NWC) return;
    CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
    for (size_t i = 0; i < NWC; i++) tdc_free(WC[i].dev, 0);
    NWC = 0;
}

/* ---- the op ---------------------------------------------------------------------------------- */

static cudaDataType_t lt_type(int fmt)
{
    switch (fmt) {
    case TD_BF16: return CUDA_R_16BF;
    case TD_F16: return CUDA_R_16F;
    case TD_E4M3: return CUDA_R_8F_E4M3;
    case TD_E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
    }
}

static void note_fallback(const char *why)
{
    static int noted;
    if (noted++) return;
    fprintf(stderr, "tidal: note: an FP8 GEMM runs emulated on the GPU (dequantised operands, the "
            "CPU's accumulation model): %s\n", why);
}

/* The activations of one matmul_forward_cuda call, prepared once for its n products. */
typedef struct {
    const td_recipe *r;
    int fin, N, Np, K;
    const float *x;                /* inp on the device                                        */
    const void *b;                 /* fin's operand: x, 16-bit codes or fp8 codes (Np rows)   */
    const float *x32;              /* x rounded to fin as fp32 (16-bit: when a weight needs it) */
    td_fp8_scheme as;              /* fp8: the activation scheme, its block shape and scales   */
    size_t abr, abc;
    int anbc;
    float *ascales, *alt, *wlt;    /* tidal's order; cuBLASLt's layout (alt_mode); weight's    */
    int alt_mode;
    float *dpad, *deq;             /* fp8: padded D; dequantised activations (when needed)      */
} acts;

static void finish(const float *D, int ldd, float *out, const float *bias, int N, int O, int act)
{
    if (D == out && !bias && act == TD_F32) return;   /* nothing to add or round */
    TD_LAUNCH(finish_kernel, nblk((size_t)N * O), TPB, 0, tdc_stream(), D, ldd, out, bias, N, O, act);
    CUDA_CHECK_LAUNCH();
}

/* One FP8 product through cuBLASLt; 0 when it cannot take it (the caller falls back). */
static int fp8_lt(acts *a, const td_wmat *w, int O, float *out, const float *bias)
{
    const td_recipe *r = a->r;
    int K = a->K, g = a->as.group ? a->as.group : 128;
    int wsingle = w->sr >= O && w->sc >= K, wrow = w->sr == 1 && w->nbc == 1;
    int wblk = w->sr == 128 && w->sc == 128;
    int ag = a->as.gran, mode;
    if ((w->dtype != TD_E4M3 && w->dtype != TD_E5M2) || (w->dtype == TD_E5M2 && a->fin == TD_E5M2) ||
        K % 16 || O % 16 || r->split_k > 1) return 0;
    if (wsingle && ag == TD_SCALE_TENSOR) mode = MODE_SCALAR;
    else if ((wsingle || wrow) && (ag == TD_SCALE_TENSOR || ag == TD_SCALE_ROW)) mode = MODE_OUTER;
    else if ((wsingle || wblk) && ag == TD_SCALE_GROUP && g == 128 && K % 128 == 0) mode = MODE_BLK128;
    else return 0;
    cudaStream_t st = tdc_stream();
    const uint8_t *wc = (const uint8_t *)tdc_const(w->data, (size_t)O * K);
    if (lt_align(wc) < 16) return 0;   /* FP8 operands need 16-byte alignment */
    int nob = (O + w->sr - 1) / w->sr;
    const float *ws = (const float *)tdc_const(w->scale, (size_t)nob * w->nbc * sizeof(float));
    lt_gemm gm = {};
    gm.M = O; gm.Nc = a->Np; gm.K = K;
    gm.A = wc; gm.ta = lt_type(w->dtype); gm.lda = K;
    gm.B = a->b; gm.tb = lt_type(a->fin); gm.ldb = K;
    gm.D = a->Np == a->N ? out : a->dpad; gm.ldd = O;
    gm.fast = r->accumulate == TD_ACC_FP8_FAST && mode != MODE_BLK128;
    if (mode == MODE_SCALAR) {
        gm.amode = gm.bmode = MODE_SCALAR;
        gm.ascale = ws;
        gm.bscale = a->ascales;
    } else {
        int blk = mode == MODE_BLK128, nkb = K / 128, ldk = (int)up((size_t)nkb, 4), nob128 = (O + 127) / 128;
        int want = blk ? MODE_VEC128 : MODE_OUTER, nbc = blk ? nkb : 1;
        if (a->alt_mode != want) {   /* the activations' scales in B's layout, once per call */
            TD_LAUNCH(act_scales_lt_kernel, nblk((size_t)a->Np * nbc), TPB, 0, st, a->ascales,
                      ag == TD_SCALE_TENSOR, a->N, a->Np, nbc, blk, a->alt);
            CUDA_CHECK_LAUNCH();
            a->alt_mode = want;
        }
        TD_LAUNCH(w_scales_lt_kernel, nblk(blk ? (size_t)nob128 * ldk : (size_t)O), TPB, 0, st, ws, wsingle,
                  O, w->nbc, nob128, nkb, ldk, blk, a->wlt);
        CUDA_CHECK_LAUNCH();
        gm.amode = blk ? MODE_BLK128 : MODE_OUTER;
        gm.bmode = want;
        gm.ascale = a->wlt;
        gm.bscale = a->alt;
    }
    cublasStatus_t s = lt_matmul(&gm);
    if (s != CUBLAS_STATUS_SUCCESS && !bias && (r->activations == TD_BF16 || r->activations == TD_F16)) {
        /* no fp32 output for this FP8 mode here: D in the activations dtype is the same value
         * (the fp32 sum rounded once, round_act(acc) of gemm.h, when there is no bias), widened */
        gm.td = lt_type(r->activations);
        gm.D = a->dpad;
        if ((s = lt_matmul(&gm)) == CUBLAS_STATUS_SUCCESS) {
            TD_LAUNCH(widen_kernel, nblk((size_t)a->N * O), TPB, 0, st, (const void *)a->dpad, r->activations,
                      (const float *)NULL, 1, 1, 1, a->N, O, out);
            CUDA_CHECK_LAUNCH();
            return 1;
        }
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        char why[256];
        snprintf(why, sizeof why, "cuBLASLt refused %s scaling here (%s: %s)",
                 mode == MODE_SCALAR ? "per-tensor" : mode == MODE_OUTER ? "outer-vector" : "block",
                 lt_last_failure(), cublasLtGetStatusString(s));
        note_fallback(why);
        return 0;
    }
    finish((const float *)gm.D, O, out, bias, a->N, O, r->activations);
    return 1;
}

/* out (N, O) = a . w^T over fp32 operands with the recipe's split_k: cuBLASLt, or for a
 * batch-invariant recipe fixed_kernel over the CPU's K slices (the CPU's bits) */
static void gemm_f32(const td_recipe *r, const float *a, const float *w, float *out, int N, int O, int K)
{
    int split = r && r->split_k < K ? r->split_k : 1;
    if (r && r->batch_invariant) {
        int per = (K + split - 1) / split;
        for (int p = 0, k0 = 0; p < split && k0 < K; p++, k0 += per) {
            TD_LAUNCH(fixed_kernel, nblk((size_t)N * O), TPB, 0, tdc_stream(), a, w, out, N, O, K, k0,
                      k0 + per <= K ? per : K - k0, p > 0);
            CUDA_CHECK_LAUNCH();
        }
        return;
    }
    lt_gemm gm = {};
    gm.M = O; gm.Nc = N; gm.K = K;
    gm.A = w; gm.ta = CUDA_R_32F; gm.lda = K;
    gm.B = a; gm.tb = CUDA_R_32F; gm.ldb = K;
    gm.D = out; gm.ldd = O;
    gm.amode = gm.bmode = MODE_NONE;
    lt_gemm_split(gm, split);
}

/* One FP8 product emulated over the dequantised operands (see the top). */
static void fp8_emulated(acts *a, const td_wmat *w, int O, float *out, const float *bias)
{
    const td_recipe *r = a->r;
    int N = a->N, K = a->K;
    if (!a->x32) {
        TD_LAUNCH(widen_kernel, nblk((size_t)N * K), TPB, 0, tdc_stream(), a->b, a->fin, a->ascales,
                  (int)a->abr, (int)a->abc, a->anbc, N, K, a->deq);
        CUDA_CHECK_LAUNCH();
        a->x32 = a->deq;
    }
    const float *wf = widened(w, O, K);
    if (r->accumulate == TD_ACC_FP8_FAST) {
        int promote = r->promote_every < 32 ? 32 : r->promote_every;
        TD_LAUNCH(fp8_fast_kernel, nblk((size_t)N * O), TPB, 0, tdc_stream(), a->x32, wf, out, N, O, K,
                  promote, r->acc_fraction_bits, (int)r->batch_invariant);
        CUDA_CHECK_LAUNCH();
    } else {
        gemm_f32(r, a->x32, wf, out, N, O, K);
    }
    finish(out, O, out, bias, N, O, r->activations);
}

extern "C" void matmul_forward_cuda(const td_ops *ctx, int n, float *const *out, const float *inp,
                                    const td_wmat *weight, const float *const *bias, int N, int IN,
                                    const int *OUT)
{
    if (N <= 0 || IN <= 0) return;   /* nothing to multiply (an empty launch is an error) */
    const td_recipe *r = td_recipe_is_plain_fp32(ctx->recipe) ? NULL : ctx->recipe;
    cudaStream_t st = tdc_stream();
    acts a = {};
    a.r = r;
    a.fin = r ? r->gemm_inputs : TD_F32;
    a.N = a.Np = N;
    a.K = IN;
    a.x = (const float *)tdc_in(inp, (size_t)N * IN * sizeof(float));
    a.b = a.x;
    a.alt_mode = MODE_NONE;
    int fp8 = r && td_recipe_fp8_gemm(r), maxo = 0;
    for (int j = 0; j < n; j++) maxo = OUT[j] > maxo ? OUT[j] : maxo;
    if (fp8) {
        a.Np = (int)up((size_t)N, 16);
        a.as = r->act_scaling;
        a.as.fmt = (td_format)a.fin;
        td_fp8_block_shape(&a.as, (size_t)N, (size_t)IN, &a.abr, &a.abc);
        a.anbc = (int)((IN + a.abc - 1) / a.abc);
        size_t nas = td_fp8_num_scales(&a.as, (size_t)N, (size_t)IN);
        size_t nkb = (IN + 127) / 128, nalt = (size_t)a.Np * (nkb > 1 ? nkb : 1);
        size_t nwlt = (size_t)maxo > ((maxo + 127) / 128) * up(nkb, 4) ? (size_t)maxo : ((maxo + 127) / 128) * up(nkb, 4);
        uint8_t *codes = (uint8_t *)tdc_scratch(TDC_SLOT_GEMM_A, (size_t)a.Np * IN);
        a.ascales = (float *)tdc_scratch(TDC_SLOT_GEMM_SCALES, (up(nas, 64) + up(nalt, 64) + nwlt) * sizeof(float));
        a.alt = a.ascales + up(nas, 64);
        a.wlt = a.alt + up(nalt, 64);
        a.deq = (float *)tdc_scratch(TDC_SLOT_GEMM_OUT, (up((size_t)N * IN, 64) + (size_t)a.Np * maxo) * sizeof(float));
        a.dpad = a.deq + up((size_t)N * IN, 64);
        fp8_quantize_cuda(&a.as, a.x, N, IN, codes, a.ascales);
        if (a.Np > N) CUDA_CHECK(cudaMemsetAsync(codes + (size_t)N * IN, 0, (size_t)(a.Np - N) * IN, st));
        a.b = codes;
    } else if (a.fin == TD_BF16 || a.fin == TD_F16) {
        uint16_t *codes = (uint16_t *)tdc_scratch(TDC_SLOT_GEMM_A, (size_t)N * IN * sizeof(uint16_t));
        TD_LAUNCH(codes16_kernel, nblk((size_t)N * IN), TPB, 0, st, a.x, codes, (size_t)N * IN, a.fin);
        CUDA_CHECK_LAUNCH();
        a.b = codes;
    } else {
        a.x32 = a.x;
    }
    for (int j = 0; j < n; j++) {
        const td_wmat *w = &weight[j];
        int O = OUT[j];
        if (O <= 0) continue;
        float *o = (float *)tdc_out(out[j], (size_t)N * O * sizeof(float), 0);
        const float *b = bias && bias[j] ? (const float *)tdc_const(bias[j], (size_t)O * sizeof(float)) : NULL;
        if (fp8) {   /* a batch-invariant recipe never takes cuBLASLt: its order depends on the shape */
            if (r->batch_invariant || !fp8_lt(&a, w, O, o, b)) fp8_emulated(&a, w, O, o, b);
            continue;
        }
        if (a.fin != TD_F32 && w->dtype == a.fin && !r->batch_invariant) {   /* 16-bit, tensor cores */
            lt_gemm gm = {};
            gm.M = O; gm.Nc = N; gm.K = IN;
            gm.A = tdc_const(w->data, (size_t)O * IN * sizeof(uint16_t));
            gm.ta = gm.tb = lt_type(a.fin);
            gm.lda = gm.ldb = IN;
            gm.B = a.b;
            gm.D = o; gm.ldd = O;
            gm.amode = gm.bmode = MODE_NONE;
            lt_gemm_split(gm, r->split_k);
        } else {                                  /* fp32 operands holding the same values */
            if (!a.x32) {
                float *x32 = (float *)tdc_scratch(TDC_SLOT_GEMM_OUT, (size_t)N * IN * sizeof(float));
                TD_LAUNCH(round_kernel, nblk((size_t)N * IN), TPB, 0, st, a.x, x32, (size_t)N * IN, a.fin);
                CUDA_CHECK_LAUNCH();
                a.x32 = x32;
            }
            gemm_f32(r, a.x32, widened(w, O, IN), o, N, O, IN);
        }
        finish(o, O, o, b, N, O, r ? r->activations : TD_F32);
    }
    tdc_done();
}
