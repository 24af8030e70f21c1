/* tidal — the CPU backend: the op list (src/model/ops.h) as a function table. Each op under a
 * recipe is the same maths as the fp32 reference form (cpu_ref.c) with the recipe's rounding
 * points (recipe.h); a context without a recipe, or with plain fp32, runs the reference form
 * itself, so the fp32 path is exactly cpu_ref.c. Buffers are host memory.
 *
 * Rounding points, for activations dtype D (bf16 or fp16), rs = rsqrt(mean(x^2) + eps):
 *   rmsnorm   unfused (HF, vLLM): D(D(x * rs) * w); fused, fused-add (FlashInfer): D(x * rs * w)
 *             (fused-add: the decoder hands it the unrounded fp32 sum, see decoder.c);
 *             residual fp32 (autocast): (x * rs) * w in fp32, unrounded
 *   rope      unfused (HF): cos, sin rounded to D, D(D(x0 c) - D(x1 s)), D(D(x1 c) + D(x0 s));
 *             fused (FlashInfer): fp32 rotation rounded once; vllm: c, s rounded to D (its
 *             cos_sin_cache), fp32 rotation rounded once
 *   attention full (HF eager): scores D(D(q.k) * scale), fp32 softmax rounded to D, D(P.V);
 *             flash: fp32 scores, online softmax over key blocks of attn_block, P rounded to D
 *             before P.V (as FlashAttention converts P), output D(O / l); decode with
 *             decode_splits > 1: the key range split, each part flash, merged by log-sum-exp
 *   swiglu    D(D(silu(g)) * u)      residual  D(x + y) (fp32 with residual fp32)
 *   logsoftmax  logits / T (fp32, or D_head(l / T) with logits_temperature activations), then
 *             fp32 log-softmax, rounded to D_head with logsoftmax activations (D_head: the
 *             lm_head recipe's activations, fp32 with lm_head_fp32)
 *   GEMMs     see gemm.h
 * Every rounding is td_round (formats.h), the scalar form of the numerics' td_round_row.
 * These are scalar-heavy loops; they run only for non-fp32 recipes. */
#include "cpu.h"
#include "tidal/gemm.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* out = D(a + b) when b, else D(a * s) (s 1: the rounding alone, in place: a == out), for D = f != fp32,
 * in blocks of 4096 whose rounding reads the block while it is in L1: one pass over memory instead
 * of the element-wise op's and then the rounding's, the same bits (each element's sum or product,
 * then its rounding) */
#define ROUND_BLOCK 4096

/* a block's sum or product at the CPU's width (each element one IEEE operation: the same bits at
 * any width; out may be a, the loops read each element before writing it). Inside the OpenMP body
 * they had stayed scalar (GCC's -O2 cost model does not version loops for aliasing), 4 % of a LoRA
 * training step on a Xeon. */
TD_CLONES static void block_sum(float *out, const float *a, const float *b, size_t n)
{
    #pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

TD_CLONES static void block_scale(float *out, const float *a, float s, size_t n)
{
    #pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] * s;
}

static void rows_rounded(const td_ops *ctx, td_format f, float *out, const float *a, const float *b,
                         float s, size_t n)
{
    #pragma omp parallel for num_threads(ctx->nthreads) if (n >= 65536)
    for (size_t k = 0; k < n; k += ROUND_BLOCK) {
        size_t e = n - k < ROUND_BLOCK ? n : k + ROUND_BLOCK;
        if (b) block_sum(out + k, a + k, b + k, e - k);
        else if (s != 1.0f) block_scale(out + k, a + k, s, e - k);
        td_round_row(f, out + k, out + k, e - k, TD_SATFINITE);
    }
}

/* x rounded to the activations dtype (an op boundary; the backward's input gradients too) */
void act_round(const td_ops *ctx, float *x, size_t n)
{
    td_format f = act_of(ctx);
    if (f != TD_F32) rows_rounded(ctx, f, x, x, NULL, 1.0f, n);
}

/* sum_c x[c]^2 in double, in c's order, of n <= 4 rows of C (row stride C): the rows' sums run
 * side by side, four independent chains instead of one serial chain at a time (each row's
 * additions in its own order: the bits of a loop per row) */
static void sumsq_rows(const float *x, int C, int n, double *ss)
{
    if (n < 4) {
        for (int r = 0; r < n; r++) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += (double)x[(size_t)r * C + c] * x[(size_t)r * C + c];
            ss[r] = s;
        }
        return;
    }
    const float *x0 = x, *x1 = x + C, *x2 = x + 2 * (size_t)C, *x3 = x + 3 * (size_t)C;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int c = 0; c < C; c++) {
        s0 += (double)x0[c] * x0[c];
        s1 += (double)x1[c] * x1[c];
        s2 += (double)x2[c] * x2[c];
        s3 += (double)x3[c] * x3[c];
    }
    ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
}

static void rmsnorm_cpu(const td_ops *ctx, float *out, float *rstd, const float *inp,
                        const float *weight, int N, int C, float eps)
{
    td_format D = act_of(ctx);
    if (D == TD_F32) { rmsnorm_forward_ref(ctx, out, rstd, inp, weight, N, C, eps); return; }
    /* 0: D(D(x rs) w)   1: D(x rs w)   2: (x rs) w in fp32 (autocast's fp32 stream) */
    int form = ctx->recipe->residual_fp32 ? 2 : ctx->recipe->norm == TD_NORM_UNFUSED ? 0 : 1;
    #pragma omp parallel for num_threads(ctx->nthreads) if (N >= 16)
    for (int i0 = 0; i0 < N; i0 += 4) {
        int n4 = N - i0 < 4 ? N - i0 : 4;
        double sq[4];
        sumsq_rows(inp + (size_t)i0 * C, C, n4, sq);
        for (int i = i0; i < i0 + n4; i++) {
            const float *x = inp + (size_t)i * C;
            float *y = out + (size_t)i * C;
            float rs = 1.0f / sqrtf((float)(sq[i - i0] / C) + eps);
            if (rstd) rstd[i] = rs;
            /* the products in fp32, the roundings as rows (td_round_row: td_round's bits, vectorised) */
            if (form == 1) {
                for (int c = 0; c < C; c++) y[c] = x[c] * rs * weight[c];
                td_round_row(D, y, y, (size_t)C, TD_SATFINITE);
            } else if (form == 0) {
                for (int c = 0; c < C; c++) y[c] = x[c] * rs;
                td_round_row(D, y, y, (size_t)C, TD_SATFINITE);
                for (int c = 0; c < C; c++) y[c] = y[c] * weight[c];
                td_round_row(D, y, y, (size_t)C, TD_SATFINITE);
            } else {
                for (int c = 0; c < C; c++) y[c] = (x[c] * rs) * weight[c];
            }
        }
    }
}

static void rope_cpu(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                     int nheads, int HD)
{
    td_format D = act_of(ctx);
    td_rope_form form = ctx->recipe ? ctx->recipe->rope : TD_ROPE_UNFUSED;
    if (D == TD_F32 || form == TD_ROPE_FUSED) {
        rope_forward_ref(ctx, x, pos, inv_freq, N, nheads, HD);
        act_round(ctx, x, (size_t)N * nheads * HD);
        return;
    }
    int half = HD / 2;
    const float *tab = rope_cos_sin_table(inv_freq, half, pos, N);
    #pragma omp parallel for num_threads(ctx->nthreads) if (N >= 16)
    for (int i = 0; i < N; i++) {
        float cs[512], sn[512];   /* rope_forward_ref's cos and sin, rounded to D */
        const float *t = tab + (size_t)pos[i] * 2 * half;
        for (int k = 0; k < half; k++) {
            cs[k] = td_round(D, t[k]);
            sn[k] = td_round(D, t[half + k]);
        }
        for (int h = 0; h < nheads; h++) {
            float *xh = x + ((size_t)i * nheads + h) * HD;
            /* the products and sums in fp32, each rounding as a row (td_round_row: td_round's bits) */
            if (form == TD_ROPE_VLLM) {   /* fp32 rotation over the dtype cache */
                float r[1024];
                for (int k = 0; k < half; k++) {
                    float x0 = xh[k], x1 = xh[k + half];
                    r[k] = x0 * cs[k] - x1 * sn[k];
                    r[k + half] = x1 * cs[k] + x0 * sn[k];
                }
                td_round_row(D, r, xh, (size_t)HD, TD_SATFINITE);
            } else {   /* D(D(x0 c) - D(x1 s)), D(D(x1 c) + D(x0 s)) */
                float p[2048];   /* x0 c | x1 c | x1 s | x0 s, each half wide */
                for (int k = 0; k < half; k++) {
                    float x0 = xh[k], x1 = xh[k + half];
                    p[k] = x0 * cs[k];
                    p[half + k] = x1 * cs[k];
                    p[2 * half + k] = x1 * sn[k];
                    p[3 * half + k] = x0 * sn[k];
                }
                td_round_row(D, p, p, (size_t)(4 * half), TD_SATFINITE);
                for (int k = 0; k < half; k++) {
                    xh[k] = p[k] - p[2 * half + k];
                    xh[k + half] = p[half + k] + p[3 * half + k];
                }
                td_round_row(D, xh, xh, (size_t)HD, TD_SATFINITE);
            }
        }
    }
}

static void swiglu_cpu(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                       int F)
{
    td_format D = act_of(ctx);
    if (D == TD_F32) { swiglu_forward_ref(ctx, out, gate, up, N, F); return; }
    size_t n = (size_t)N * F;
    /* D(D(g / (1 + exp(-g))) * up) in blocks: glibc's expf's bits (td_expf_row), the quotient,
     * product and roundings as rows (td_round_row: td_round's bits, vectorised) */
    #pragma omp parallel for num_threads(ctx->nthreads) if (n >= 16384)
    for (size_t b = 0; b < n; b += 1024) {
        size_t m = n - b < 1024 ? n - b : 1024;
        float t[1024];
        for (size_t i = 0; i < m; i++) t[i] = -gate[b + i];
        td_expf_row(t, t, m);
        #pragma omp simd
        for (size_t i = 0; i < m; i++) t[i] = gate[b + i] / (1.0f + t[i]);
        td_round_row(D, t, t, m, TD_SATFINITE);
        #pragma omp simd
        for (size_t i = 0; i < m; i++) t[i] = t[i] * up[b + i];
        td_round_row(D, t, out + b, m, TD_SATFINITE);
    }
}

/* out = D(a + b) (fp32 with residual_fp32) and x = D(s x): rows_rounded's one pass */
static void residual_cpu(const td_ops *ctx, float *out, const float *inp1, const float *inp2,
                         size_t n)
{
    td_format f = ctx->recipe && ctx->recipe->residual_fp32 ? TD_F32 : act_of(ctx);
    if (f == TD_F32) residual_forward_ref(ctx, out, inp1, inp2, n);
    else rows_rounded(ctx, f, out, inp1, inp2, 1.0f, n);
}

static void scale_cpu(const td_ops *ctx, float *x, float s, size_t n)
{
    td_format f = act_of(ctx);
    if (f == TD_F32) scale_forward_ref(ctx, x, s, n);
    else rows_rounded(ctx, f, x, x, NULL, s, n);
}

/* ---------------------------------------------------------------- GEMM */

/* n products of one input under the context's recipe: operand quantisation (once, the input
 * being the same), the recipe's accumulation, bias and output rounding (gemm.h), threads over the
 * products' output columns in one parallel region. Each product is cut into its own fixed tiles
 * (cpu.h), from its first column, and each tile is the one GEMM it was when the products ran one
 * region each: the same calls, so the same bits, with fewer barriers per layer (q, k, v and gate,
 * up share a region) and one quantisation of the input instead of three or two. The weights must
 * share a dtype (the kernel choice below depends on it); matmul_cpu checks. */
static void matmul_recipe(const td_ops *ctx, int n, float *const *outs, const float *inp,
                          const td_wmat *weights, const float *const *bias, int N, int IN,
                          const int *OUTS)
{
    const td_recipe *r = ctx->recipe;
    float *qin = ctx->qin;
    td_gemm_quant_input(r, inp, N, IN, qin);
    /* how these products are summed (gemm.h): decode-sized products with fp32 accumulation read
     * 16-bit weights as stored; larger ones of bf16 operands take the CPU's bf16 dot products,
     * over the input as bf16 codes (in place in qin) and weights as stored (bf16 codes) or
     * as codes of their fp32 copy (bf16 values), written into the tile scratch */
    td_format wdt = weights[0].dtype;
    int w16 = N <= TD_GEMM_FIXED_ROWS && r->accumulate == TD_ACC_FP32 && !td_gemm_legacy_order() &&
              (wdt == TD_BF16 || wdt == TD_F16);
    int dp = N > TD_GEMM_FIXED_ROWS && td_gemm_bf16dp_applies(r) &&
             (wdt == TD_BF16 || (wdt == TD_F32 && ctx->wtile));
    const uint16_t *qcodes = dp ? td_gemm_pack_bf16(qin, (size_t)N * IN) : NULL;
    /* work items: product j's tiles of TD_GEMM_TILE columns, product after product */
    long items = 0, cols = 0;
    for (int j = 0; j < n; j++) {
        items += (OUTS[j] + TD_GEMM_TILE - 1) / TD_GEMM_TILE;
        cols += OUTS[j];
    }
    #pragma omp parallel num_threads(gemm_threads(ctx, N, IN, cols))
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long i0 = items * t / nt, i1 = items * (t + 1) / nt, item = 0;
        /* gscratch is NULL when no recipe needs it (NULL + 0 is undefined behaviour in C) */
        float *scratch = ctx->gscratch ? ctx->gscratch + (size_t)t * ctx->gscratch_per_thread : NULL;
        float *tile = wtile_scratch(ctx, t);
        for (int j = 0; j < n && item < i1; j++) {
            const td_wmat *weight = &weights[j];
            float *out = outs[j];
            int OUT = OUTS[j];
            const float *b = bias ? bias[j] : NULL;
            for (int c0 = 0; c0 < OUT; c0 += TD_GEMM_TILE, item++) {
                if (item < i0 || item >= i1) continue;
                int nc = c0 + TD_GEMM_TILE <= OUT ? TD_GEMM_TILE : OUT - c0;
                if (dp && weight->dtype == TD_BF16) {
                    /* the bf16 dot-product order depends on K alone (gemm.h): the thread's run of
                     * this product's tiles in one call, the same bits as tile by tile, with the
                     * input's codes split once instead of once per tile (0.58 -> 0.08 Gcycles of
                     * a bf16 tidal-diff) */
                    long run = (OUT - c0 + TD_GEMM_TILE - 1) / TD_GEMM_TILE;
                    if (run > i1 - item) run = i1 - item;
                    nc = c0 + run * TD_GEMM_TILE <= OUT ? (int)run * TD_GEMM_TILE : OUT - c0;
                    td_gemm_accumulate_bf16dp(r, qcodes, N, IN, (const uint16_t *)weight->data + (size_t)c0 * IN,
                                              IN, nc, out + c0, OUT);
                    td_gemm_finish(r, out + c0, N, nc, OUT, b ? b + c0 : NULL);
                    c0 += (int)(run - 1) * TD_GEMM_TILE;
                    item += run - 1;
                    continue;
                }
                if (w16) {
                    td_gemm_accumulate_w16(r, qin, N, IN, (const uint16_t *)weight->data + (size_t)c0 * IN,
                                           weight->dtype, IN, nc, out + c0, OUT);
                } else if (dp) {   /* fp32 weights: a tile's codes at a time, in the tile scratch */
                    const uint16_t *wc = td_gemm_pack_bf16(memcpy(tile, (const float *)weight->data + (size_t)c0 * IN,
                                                                  (size_t)nc * IN * sizeof(float)), (size_t)nc * IN);
                    td_gemm_accumulate_bf16dp(r, qcodes, N, IN, wc, IN, nc, out + c0, OUT);
                } else if (r->accumulate == TD_ACC_FP8_FAST && weight->panels &&
                           td_gemm_fp8_fast_panels(qin, IN, (const uint8_t *)weight->data + (size_t)c0 * IN,
                                                   weight->dtype, weight->scale, c0, weight->sr, weight->sc,
                                                   weight->nbc, out + c0, OUT, N, nc, IN, r->promote_every,
                                                   r->acc_fraction_bits, weight->nan_free)) {
                    /* codes in panels of 8 rows (c0 a multiple of 8: the tile's first panel), every
                     * row count: the bits of the widened rows */
                } else if (r->accumulate == TD_ACC_FP8_FAST && N <= TD_GEMM_FIXED_ROWS && !weight->panels &&
                           (weight->dtype == TD_E4M3 || weight->dtype == TD_E5M2) &&
                           td_gemm_fp8_fast_codes(qin, IN, (const uint8_t *)weight->data + (size_t)c0 * IN, IN,
                                                  weight->dtype, weight->scale, c0, weight->sr, weight->sc,
                                                  weight->nbc, out + c0, OUT, N, nc, IN, r->promote_every,
                                                  r->acc_fraction_bits, weight->nan_free)) {
                    /* a decode step: fp8 codes decoded in registers, the bits of the widened rows */
                } else {
                    const float *wt = wmat_rows(weight, c0, nc, IN, tile);   /* widened to fp32 */
                    td_gemm_accumulate(r, qin, N, IN, wt, IN, nc, out + c0, OUT, scratch);
                }
                td_gemm_finish(r, out + c0, N, nc, OUT, b ? b + c0 : NULL);
            }
        }
    }
}

/* The fp32 reference does all n products in one parallel region (few barriers per layer); so
 * does a recipe when the n weights share a dtype (always, but for a mixed checkpoint). */
static void matmul_cpu(const td_ops *ctx, int n, float *const *out, const float *inp,
                       const td_wmat *weight, const float *const *bias, int N, int IN,
                       const int *OUT)
{
    if (td_recipe_is_plain_fp32(ctx->recipe)) {
        matmul_forward_ref(ctx, n, out, inp, weight, bias, N, IN, OUT);
        return;
    }
    int same = 1;
    for (int j = 1; j < n; j++) same = same && weight[j].dtype == weight[0].dtype;
    if (same) {
        matmul_recipe(ctx, n, out, inp, weight, bias, N, IN, OUT);
        return;
    }
    for (int j = 0; j < n; j++)
        matmul_recipe(ctx, 1, &out[j], inp, &weight[j], bias ? &bias[j] : NULL, N, IN, &OUT[j]);
}

/* ---------------------------------------------------------------- attention */

/* Flash-style attention of one query head over keys [j0, j1): returns the unnormalised
 * output o (HD), the running max m and the sum l (P rounded to D before P.V). */
static void flash_part(const float *qh, const float *kb, const float *vb, int KVD, int HD, int j0,
                       int j1, int block, float scale, td_format D, float *o, float *m_out, float *l_out)
{
    float m = -INFINITY, l = 0.0f;
    for (int c = 0; c < HD; c++) o[c] = 0.0f;
    float s[256];
    for (int b0 = j0; b0 < j1; b0 += block) {
        int b1 = b0 + block < j1 ? b0 + block : j1;
        for (int c0 = b0; c0 < b1; c0 += 256) {   /* s[] holds 256 scores at a time */
            int c1 = c0 + 256 < b1 ? c0 + 256 : b1;
            float bm = -INFINITY;
            for (int j = c0; j < c1; j++) {
                const float *kj = kb + (size_t)j * KVD;
                float d = 0.0f;
                #pragma omp simd reduction(+ : d)
                for (int c = 0; c < HD; c++) d += qh[c] * kj[c];
                s[j - c0] = d * scale;
                bm = s[j - c0] > bm ? s[j - c0] : bm;
            }
            float m_new = bm > m ? bm : m;
            float alpha = expf(m - m_new);
            l *= alpha;
            for (int c = 0; c < HD; c++) o[c] *= alpha;
            for (int j = c0; j < c1; j++) s[j - c0] -= m_new;
            td_expf_row(s, s, (size_t)(c1 - c0));   /* expf's bits, 16 at a time */
            for (int j = c0; j < c1; j++) {
                float p = s[j - c0];
                l += p;
                float pr = td_round(D, p);
                const float *vj = vb + (size_t)j * KVD;
                #pragma omp simd
                for (int c = 0; c < HD; c++) o[c] += pr * vj[c];
            }
            m = m_new;
        }
    }
    *m_out = m;
    *l_out = l;
}

/* HF eager attention in dtype D for one query head over keys [0, nk). s: nk floats. */
static void eager_head(const float *qh, const float *kb, const float *vb, int KVD, int HD, int nk,
                       float scale, td_format D, float *s, float *oh, float *lse)
{
    float mx = -INFINITY;
    for (int j = 0; j < nk; j++) {
        const float *kj = kb + (size_t)j * KVD;
        float d = 0.0f;
        #pragma omp simd reduction(+ : d)
        for (int c = 0; c < HD; c++) d += qh[c] * kj[c];
        s[j] = td_round(D, td_round(D, d) * scale);
        mx = s[j] > mx ? s[j] : mx;
    }
    double sum = 0.0;
    for (int j = 0; j < nk; j++) s[j] -= mx;
    td_expf_row(s, s, (size_t)nk);
    for (int j = 0; j < nk; j++) sum += s[j];
    if (lse) *lse = mx + (float)log(sum);
    float inv = (float)(1.0 / sum);
    for (int c = 0; c < HD; c++) oh[c] = 0.0f;
    for (int j = 0; j < nk; j++) {
        float p = td_round(D, s[j] * inv);
        const float *vj = vb + (size_t)j * KVD;
        #pragma omp simd
        for (int c = 0; c < HD; c++) oh[c] += p * vj[c];
    }
    for (int c = 0; c < HD; c++) oh[c] = td_round(D, oh[c]);
}

static void attention_cpu(const td_ops *ctx, float *out, float *lse, const float *q,
                          const float *k, const float *v, const size_t *kv_off, const int *pos,
                          int N, int NH, int NKV, int HD, float *scratch, int max_keys)
{
    const td_recipe *r = ctx->recipe;
    /* the reference's blocked attention sums a row's scores by sgemm over the rows of its run
     * (batch-dependent); a batch-invariant recipe takes the per-row form below even in fp32 */
    if (!r || (r->attention == TD_ATTN_FULL && r->activations == TD_F32 && !r->batch_invariant)) {
        attention_forward_ref(ctx, out, lse, q, k, v, kv_off, pos, N, NH, NKV, HD, scratch, max_keys);
        return;
    }
    td_format D = r->activations;
    int KVD = NKV * HD, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    int splits = (ctx->decode && r->decode_splits > 1) ? r->decode_splits : 1;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
    for (int task = 0; task < N * NH; task++) {
        int i = task / NH, h = task % NH, kvh = h / group;
        int nk = pos[i] + 1;
        const float *qh = q + (size_t)i * NH * HD + (size_t)h * HD;
        const float *kb = k + kv_off[i] + (size_t)kvh * HD;
        const float *vb = v + kv_off[i] + (size_t)kvh * HD;
        float *oh = out + (size_t)i * NH * HD + (size_t)h * HD;
        float *lse_ih = lse ? lse + (size_t)i * NH + h : NULL;
        if (r->attention == TD_ATTN_FULL) {
            eager_head(qh, kb, vb, KVD, HD, nk, scale, D, scratch + (size_t)omp_get_thread_num() * max_keys, oh, lse_ih);
            continue;
        }
        float o[1024], acc[1024], m, l;
        if (splits == 1) {
            flash_part(qh, kb, vb, KVD, HD, 0, nk, r->attn_block, scale, D, o, &m, &l);
            for (int c = 0; c < HD; c++) oh[c] = td_round(D, o[c] / l);
            if (lse_ih) *lse_ih = m + logf(l);
            continue;
        }
        /* split-KV: each part's normalised output o_p / l_p and log-sum-exp lse_p, merged in
         * fp32 as the combine kernel of flash-decoding does: sum_p e^(lse_p - lse) o_p / l_p */
        int per = (nk + splits - 1) / splits;
        float lse_acc = -INFINITY;
        for (int c = 0; c < HD; c++) acc[c] = 0.0f;
        for (int j0 = 0; j0 < nk; j0 += per) {
            int j1 = j0 + per < nk ? j0 + per : nk;
            flash_part(qh, kb, vb, KVD, HD, j0, j1, r->attn_block, scale, D, o, &m, &l);
            float lse_p = m + logf(l);
            float lse_new = lse_p > lse_acc ? lse_p + log1pf(expf(lse_acc - lse_p))
                                            : lse_acc + log1pf(expf(lse_p - lse_acc));
            float keep = expf(lse_acc - lse_new), add = expf(lse_p - lse_new) / l;
            for (int c = 0; c < HD; c++) acc[c] = acc[c] * keep + add * o[c];
            lse_acc = lse_new;
        }
        for (int c = 0; c < HD; c++) oh[c] = td_round(D, acc[c]);
        if (lse_ih) *lse_ih = lse_acc;
    }
}

/* ---------------------------------------------------------------- KV write */

/* The rows' keys or values to their place in the store (no copy when the store is the
 * projection buffer itself, teacher forcing), rounded there to the recipe's kv_cache format
 * when this is a KV cache (inference path) whose format differs from the activations. fp8 uses
 * the recipe's kv_scale, 1.0 when 0 (vLLM's k_scale/v_scale default for kv_cache_dtype="fp8"
 * without calibrated scales; recipe.h): x -> D(q(x/s) * s). */
static void kv_write_cpu(const td_ops *ctx, float *store, const float *rows, const size_t *kv_off,
                         const int *pos, int N, int KVD)
{
    const td_recipe *r = ctx->recipe;
    int round = r && ctx->cache && r->kv_cache != r->activations && r->kv_cache != TD_F32;
    float s = round && r->kv_scale > 0 ? r->kv_scale : 1.0f;
    for (int i = 0; i < N; i++) {
        float *d = store + kv_off[i] + (size_t)pos[i] * KVD;
        const float *src = rows + (size_t)i * KVD;
        if (d != src) memcpy(d, src, (size_t)KVD * sizeof(float));
        if (round)
            for (int c = 0; c < KVD; c++) d[c] = td_round(r->kv_cache, d[c] / s) * s;
    }
}

/* ---------------------------------------------------------------- log-softmax */

/* Log-softmax of the logits / T under the context's recipe (the lm_head's): fp32 recipes with
 * T = 1 and fp32 log-softmax are the reference itself. */
static void logsoftmax_cpu(const td_ops *ctx, float *x, int N, int V)
{
    const td_recipe *r = ctx->recipe;
    float T = ctx->temperature > 0 ? ctx->temperature : 1.0f;
    size_t n = (size_t)N * V;
    if (T != 1.0f) {   /* also under the fp32 reference recipe (r == NULL) */
        td_format L = r && r->temp_in_act ? act_of(ctx) : TD_F32;   /* the logits' dtype */
        #pragma omp parallel for num_threads(ctx->nthreads) if (n >= 65536)
        for (size_t i = 0; i < n; i++) x[i] = td_round(L, x[i] / T);
    }
    logsoftmax_forward_ref(ctx, x, N, V);
    if (r && r->logsoftmax_act) act_round(ctx, x, n);
}

/* ---------------------------------------------------------------- the table */

static void *cpu_alloc(size_t bytes) { return td_xmalloc(bytes ? bytes : 1); }
static void cpu_free(void *p) { free(p); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { if (dst != src) memcpy(dst, src, bytes); }
static void cpu_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

/* ops.h logprob_gather: each row's target log-prob and its first largest column */
static void logprob_gather_cpu(const td_ops *ctx, float *tlogp, int *top1, const float *logp,
                               const int *target, int N, int V)
{
    (void)ctx;
    for (int i = 0; i < N; i++) {
        const float *row = logp + (size_t)i * V;
        tlogp[i] = row[target[i]];
        top1[i] = (int)td_argmax_first(row, (size_t)V);
    }
}

const td_backend td_backend_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .fp8_panels = 1,
    .embedding_forward = embedding_forward_ref,   /* a gather: nothing to round */
    .rmsnorm_forward = rmsnorm_cpu,
    .matmul_forward = matmul_cpu,
    .rope_forward = rope_cpu,
    .kv_write = kv_write_cpu,
    .attention_forward = attention_cpu,
    .swiglu_forward = swiglu_cpu,
    .residual_forward = residual_cpu,
    .scale_forward = scale_cpu,
    .logsoftmax_forward = logsoftmax_cpu,
    .logprob_gather = logprob_gather_cpu,
    /* the backward (cpu_backward.c) */
    .embedding_backward = embedding_backward_cpu,
    .rmsnorm_backward = rmsnorm_backward_cpu,
    .matmul_backward = matmul_backward_cpu,
    .rope_backward = rope_backward_cpu,
    .attention_backward = attention_backward_cpu,
    .swiglu_backward = swiglu_backward_cpu,
    .logsoftmax_backward = logsoftmax_backward_ref,  /* fp32 over fp32 log-probs */
    .optim_adamw = optim_adamw_cpu,
    .optim_sumsq = optim_sumsq_cpu,
    .optim_scale = optim_scale_cpu,
    .scratch_release = cpu_scratch_release,
    /* mixtures of experts (cpu_moe.c) */
    .moe_gather = moe_gather_cpu,
    .moe_combine = moe_combine_cpu,
    .moe_scatter = moe_scatter_cpu,
    .moe_sum = moe_sum_cpu,
    .moe_shared_combine = moe_shared_combine_cpu,
    .moe_combine_backward = moe_combine_backward_cpu,
    .moe_scatter_add = moe_scatter_add_cpu,
    .moe_shared_combine_backward = moe_shared_combine_backward_cpu,
};
