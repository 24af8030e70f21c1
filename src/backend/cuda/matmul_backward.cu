/* tidal — matmul_backward_cuda (ops.h matmul_backward; CPU: matmul_backward_cpu in
 * cpu_backward.c over matmul_backward_ref in cpu_backward_ref.c). For out = inp . W^T + bias:
 *
 *   dgrad  dinp (N, IN)    = D( dinp + G(dY) . W' )      W' the weight the forward multiplied
 *   wgrad  dweight (OUT, IN) += G(dY)^T . G(X)            fp32, never rounded (main_grad)
 *   bias   dbias (OUT)      += sum_rows dY                fp32
 *
 * with D the recipe's activations dtype and G(.) td_gemm_quant_input's operand rounding (no
 * recipe / plain fp32: none of them, the reference). Every GEMM accumulates in fp32 straight
 * into the gradient (cuBLASLt, beta = 1), as the CPU's sgemm calls do.
 *
 * Layouts (tidal row-major, cuBLASLt column-major: row-major (R, C) is column-major (C x R)):
 *   dgrad  dinp^T (IN x N) += W^T (IN x OUT) . dY^T (OUT x N):  A = W stored (IN x OUT), op N;
 *          B = dY stored (OUT x N), op N; D = dinp, ld IN.                           (NN)
 *   wgrad  dW^T (IN x OUT) += X^T (IN x N) . dY (N x OUT):  A = X stored (IN x N), op N;
 *          B = dY stored (OUT x N), op T; D = dweight, ld IN.                        (NT)
 *   FP8 wgrad (operands quantised along the tokens, so transposed first):
 *          dW^T += (X^T)^T-stored . (dY^T):  A = X^T row-major (IN, N) = stored (N x IN), op T;
 *          B = dY^T row-major (OUT, N) = stored (N x OUT), op N.                     (TN)
 *
 * Per recipe, what the CPU multiplies and how it runs here:
 *   none, fp32 inputs   fp32 cuBLASLt GEMMs (CUBLAS_COMPUTE_32F, not TF32) over dY, W', X.
 *   16-bit inputs G with weights stored in G (bf16-train, fp16-train, sglang-bf16, ...): W' is
 *               on G's grid (the recipe's rounded copy), so the GEMMs run on G codes: dY, X
 *               rounded to G by a kernel (td_round_row's rounding), W' converted exactly; fp32
 *               accumulation. The CPU's td_gemm_bf16dp (bf16 weights and inputs) sums the same
 *               exact products in its own order, sgemm in OpenBLAS's: the sums agree up to order.
 *   16-bit inputs, other weights: fp32 GEMMs over the rounded operands (W' as it is), the CPU's
 *               products.
 *   FP8 (DeepSeek-V3 / Jet-RL flow, cpu_backward.c): dgrad's dY quantised in the recipe's
 *               act_scaling groups along OUT, wgrad's dY^T and X^T along the tokens, by
 *               fp8_quantize_cuda (fp8_quant.cu: td_fp8_quantize bit for bit), dequantised
 *               (td_fp8_dequantize's decode(code) * scale), then fp32 GEMMs, with W' the
 *               forward's dequantised weight. This is the forward's fallback (matmul.cu
 *               fp8_emulated) and exactly the CPU's arithmetic: the CPU's FP8 backward
 *               multiplies the dequantised values in fp32 with fp32 accumulation (its
 *               accumulate / fp8-fast model and split_k apply to the forward only). cuBLASLt's
 *               FP8 kernels cannot express that: they apply the scales to each K block's sum
 *               (another rounding than scaling each operand), need W' as FP8 codes with
 *               128x128 scales (the backward gets W' as fp32 values) and the TN layout.
 *   batch_invariant, split_k, fp8-fast: not used by the CPU's backward (sgemm over the whole
 *               reduction), so not here either.
 * dbias: one thread per column summing the rows in order from 0 (bias_grad_acc's order: the
 * CPU's bits). The dgrad's D rounding is a kernel over dinp after the GEMM (act_round).
 * Memory: gradients, dY and X are device buffers or host ones staged per call (tdc_in /
 * tdc_out); W' in host memory is uploaded once through tdc_const's cache (keyed by its address,
 * dropped by be->forget), so weights updated in place on the host need be->forget before the
 * next backward, as when a trainer prepares the recipe again after its optimiser step.
 *
 * Scratch slots (cuda_internal.cuh): GEMM_A dY as the GEMMs read it, GEMM_OUT the second
 * operand (W' codes, X as read), GEMM_SCALES FP8 codes and scales, GEMM_T the transposes of the
 * FP8 wgrad (MISC is fp8_quantize_cuda's, WORKSPACE cuBLASLt's). */
#include "kern.cuh"
#include "lt.cuh"
#include "matmul.cuh"

#define TPB 256
static unsigned nblk(size_t n) { return (unsigned)((n + TPB - 1) / TPB); }
static size_t up(size_t x, size_t m) { return (x + m - 1) / m * m; }

#define GTID ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

/* ---- kernels ------------------------------------------------------------------------------- */

/* y = x rounded to fmt (bf16 / fp16) as codes */
__global__ static void bwd_codes16(const float *x, uint16_t *y, size_t n, int fmt)
{
    size_t i = GTID;
    if (i < n) y[i] = fmt == TD_BF16 ? tdc_bf16_enc(x[i]) : tdc_f16_enc(x[i]);
}

/* y = x rounded to fmt (TD_F32: copied); in place allowed */
__global__ static void bwd_round(const float *x, float *y, size_t n, int fmt)
{
    size_t i = GTID;
    if (i < n) y[i] = tdc_round(fmt, x[i]);
}

/* y (rows, cols) = decode(codes) * scale[(r / br) * nbc + c / bc]: td_fp8_dequantize */
__global__ static void bwd_dequant(const uint8_t *codes, int fmt, const float *scales, int br, int bc,
                                   int nbc, int rows, int cols, float *y)
{
    size_t i = GTID;
    if (i >= (size_t)rows * cols) return;
    size_t r = i / cols, c = i % cols;
    float v = fmt == TD_E4M3 ? tdc_e4m3_dec(codes[i]) : tdc_e5m2_dec(codes[i]);
    y[i] = tdc_mul(v, scales[(r / br) * nbc + c / bc]);
}

/* dst (cols, rows) = src (rows, cols)^T */
__global__ static void bwd_transpose(const float *src, int rows, int cols, float *dst)
{
    size_t i = GTID;
    if (i >= (size_t)rows * cols) return;
    size_t r = i / cols, c = i % cols;
    dst[c * rows + r] = src[i];
}

/* db[o] += sum_i dout[i, o], rows in order (bias_grad_acc) */
__global__ static void bwd_bias(float *db, const float *dout, int N, int OUT)
{
    size_t o = GTID;
    if (o >= (size_t)OUT) return;
    float s = 0.0f;
    for (int i = 0; i < N; i++) s = tdc_add(s, dout[(size_t)i * OUT + o]);
    db[o] = tdc_add(db[o], s);
}

/* ---- the operands ---------------------------------------------------------------------------- */

/* out (rows, cols) = x fake-quantised by the recipe's FP8 activation scheme along cols
 * (td_gemm_quant_input for an FP8 recipe): quantised on the device, then dequantised */
static void fake_quant(const td_recipe *r, const float *x, int rows, int cols, float *out)
{
    td_fp8_scheme s = r->act_scaling;
    s.fmt = r->gemm_inputs;
    size_t br, bc, n = (size_t)rows * cols;
    td_fp8_block_shape(&s, (size_t)rows, (size_t)cols, &br, &bc);
    size_t nsc = td_fp8_num_scales(&s, (size_t)rows, (size_t)cols);
    uint8_t *codes = (uint8_t *)tdc_scratch(TDC_SLOT_GEMM_SCALES, up(n, 64) + nsc * sizeof(float));
    float *scales = (float *)(codes + up(n, 64));
    fp8_quantize_cuda(&s, x, rows, cols, codes, scales);
    TD_LAUNCH(bwd_dequant, nblk(n), TPB, 0, tdc_stream(), (const uint8_t *)codes, (int)s.fmt,
              (const float *)scales, (int)br, (int)bc, (int)((cols + bc - 1) / bc), rows, cols, out);
    CUDA_CHECK_LAUNCH();
}

static void codes16(const float *x, uint16_t *y, size_t n, int fmt)
{
    TD_LAUNCH(bwd_codes16, nblk(n), TPB, 0, tdc_stream(), x, y, n, fmt);
    CUDA_CHECK_LAUNCH();
}

static void round_to(const float *x, float *y, size_t n, int fmt)
{
    TD_LAUNCH(bwd_round, nblk(n), TPB, 0, tdc_stream(), x, y, n, fmt);
    CUDA_CHECK_LAUNCH();
}

static void transpose(const float *src, int rows, int cols, float *dst)
{
    TD_LAUNCH(bwd_transpose, nblk((size_t)rows * cols), TPB, 0, tdc_stream(), src, rows, cols, dst);
    CUDA_CHECK_LAUNCH();
}

/* D (M x Nc, ld ldd) += op(A) op(B) in fp32 (beta = 1) */
static void gemm_acc(int M, int Nc, int K, const void *A, int lda, int a_n, const void *B, int ldb,
                     int b_t, cudaDataType_t t, float *D, int ldd)
{
    lt_gemm gm = {};
    gm.M = M; gm.Nc = Nc; gm.K = K;
    gm.A = A; gm.ta = t; gm.lda = lda; gm.a_n = a_n;
    gm.B = B; gm.tb = t; gm.ldb = ldb; gm.b_t = b_t;
    gm.D = D; gm.ldd = ldd;
    gm.beta = 1.0f;
    gm.amode = gm.bmode = MODE_NONE;
    lt_matmul_or_die(&gm);
}

/* ---- the op ---------------------------------------------------------------------------------- */

extern "C" void matmul_backward_cuda(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *weight, int N,
                                     int IN, int OUT)
{
    if (N <= 0 || IN <= 0 || OUT <= 0 || (!dinp && !dweight && !dbias)) return;
    const td_recipe *r = td_recipe_is_plain_fp32(ctx->recipe) ? NULL : ctx->recipe;
    cudaStream_t st = tdc_stream();
    size_t nY = (size_t)N * OUT, nX = (size_t)N * IN, nW = (size_t)OUT * IN;
    const float *dy = (const float *)tdc_in(dout, nY * sizeof(float));
    if (dbias) {
        float *db = (float *)tdc_out(dbias, (size_t)OUT * sizeof(float), 1);
        TD_LAUNCH(bwd_bias, nblk((size_t)OUT), TPB, 0, st, db, dy, N, OUT);
        CUDA_CHECK_LAUNCH();
    }
    if (!dinp && !dweight) { tdc_done(); return; }
    int G = r ? r->gemm_inputs : TD_F32, act = r ? r->activations : TD_F32;
    int fp8 = r && td_recipe_fp8_gemm(r);
    int w16 = !fp8 && (G == TD_BF16 || G == TD_F16) && r->weights == G;   /* GEMMs on G codes */
    cudaDataType_t t16 = G == TD_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float *x = dweight ? (const float *)tdc_in(inp, nX * sizeof(float)) : NULL;

    /* G(dY) along OUT: dgrad's operand, and the non-FP8 wgrad's */
    const void *gy = dy;
    if (r && G != TD_F32 && (dinp || !fp8)) {
        void *buf = tdc_scratch(TDC_SLOT_GEMM_A, nY * sizeof(float));
        if (w16) codes16(dy, (uint16_t *)buf, nY, G);
        else if (fp8) fake_quant(r, dy, N, OUT, (float *)buf);
        else round_to(dy, (float *)buf, nY, G);
        gy = buf;
    }

    if (dinp) {
        float *dx = (float *)tdc_out(dinp, nX * sizeof(float), 1);
        const float *w = (const float *)tdc_const(weight, nW * sizeof(float));
        if (w16) {
            uint16_t *wc = (uint16_t *)tdc_scratch(TDC_SLOT_GEMM_OUT, nW * sizeof(uint16_t));
            codes16(w, wc, nW, G);   /* exact: W' is on G's grid */
            gemm_acc(IN, N, OUT, wc, IN, 1, gy, OUT, 0, t16, dx, IN);
        } else {
            gemm_acc(IN, N, OUT, w, IN, 1, gy, OUT, 0, CUDA_R_32F, dx, IN);
        }
        if (act != TD_F32) round_to(dx, dx, nX, act);   /* act_round */
    }

    if (dweight) {
        float *dw = (float *)tdc_out(dweight, nW * sizeof(float), 1);
        if (fp8) {   /* dY^T (OUT, N) and X^T (IN, N), quantised along the tokens */
            size_t big = nY > nX ? nY : nX;
            float *tr = (float *)tdc_scratch(TDC_SLOT_GEMM_T, 3 * up(big, 64) * sizeof(float));
            float *qy = tr + up(big, 64), *qx = qy + up(big, 64);
            transpose(dy, N, OUT, tr);
            fake_quant(r, tr, OUT, N, qy);
            transpose(x, N, IN, tr);
            fake_quant(r, tr, IN, N, qx);
            gemm_acc(IN, OUT, N, qx, N, 0, qy, N, 0, CUDA_R_32F, dw, IN);
        } else if (w16) {
            uint16_t *xc = (uint16_t *)tdc_scratch(TDC_SLOT_GEMM_OUT, nX * sizeof(uint16_t));
            codes16(x, xc, nX, G);
            gemm_acc(IN, OUT, N, xc, IN, 1, gy, OUT, 1, t16, dw, IN);
        } else {
            const float *gx = x;
            if (r && G != TD_F32) {
                float *buf = (float *)tdc_scratch(TDC_SLOT_GEMM_OUT, nX * sizeof(float));
                round_to(x, buf, nX, G);
                gx = buf;
            }
            gemm_acc(IN, OUT, N, gx, IN, 1, gy, OUT, 1, CUDA_R_32F, dw, IN);
        }
    }
    tdc_done();
}
