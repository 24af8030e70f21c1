/* tidal — the backward ops of the op list (src/model/ops.h) in fp32 on the CPU: the reference
 * forms (`_ref`) that the CPU backend runs for the plain fp32 recipe, and the threaded GEMM
 * helpers the recipe forms (cpu_backward.c) share. Names and argument order are the op list's;
 * every input gradient is accumulated (+=).
 *
 * Determinism: no result depends on the thread count. Reductions over rows (a norm weight's or a
 * bias's gradient) add each output column's rows in order (chunks of columns per thread); GEMMs
 * are cut into per-thread slices of output columns or rows, each a single-threaded sgemm over the
 * whole reduction (as the forward's GEMMs); attention's key/value gradients are summed by the one
 * task that owns their (sequence, key/value head).
 */
#include "cpu.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* see cpu_ref.c: lets GCC vectorise the td_expf loops */
#pragma GCC optimize("no-trapping-math")

/* ---------------------------------------------------------------- threaded GEMMs */

/* C (M, N) += alpha * A (M, K) . B (K, N), threads over slices of C's columns. */
void gemm_nn_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc)
{
    #pragma omp parallel num_threads(gemm_threads(ctx, M, K, N))
    {
        long c0, c1;
        gemm_slice(N, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        if (c0 < c1)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, (int)(c1 - c0), K, alpha,
                        A, lda, B + c0, ldb, 1.0f, C + c0, ldc);
    }
}

/* C (M, N) += alpha * A^T . B with A (K, M), B (K, N): threads over slices of C's rows. */
void gemm_tn_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc)
{
    #pragma omp parallel num_threads(gemm_threads(ctx, N, K, M))
    {
        long r0, r1;
        gemm_slice(M, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        if (r0 < r1)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(r1 - r0), N, K, alpha,
                        A + r0, lda, B, ldb, 1.0f, C + r0 * ldc, ldc);
    }
}

/* C (M, N) += alpha * A . B^T with A (M, K), B (N, K): threads over slices of C's rows. */
void gemm_nt_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc)
{
    #pragma omp parallel num_threads(gemm_threads(ctx, N, K, M))
    {
        long r0, r1;
        gemm_slice(M, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        if (r0 < r1)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), N, K, alpha,
                        A + r0 * lda, lda, B, ldb, 1.0f, C + r0 * ldc, ldc);
    }
}

/* Column sums over rows, each column's rows in order from 0.0f (as one loop per column), run
 * across a chunk of COLS_CHUNK columns at the CPU's width: row i adds its piece to every column's
 * running sum (colsum_row), so each sum takes the same additions in the same order and the loads
 * are contiguous (one column per thread, walking down the rows, had a strided scalar loop: the
 * norm weight's gradient was 0.9 % of a bf16 training step). db[c] += sum_i v(i, c) with v = dout
 * (rs NULL) or dout * (inp * rs[i]) (the norm weight's xhat). Threads over chunks. */
enum { COLS_CHUNK = 64 };

TD_CLONES static void colsum_row(float *s, const float *dy, const float *x, float rs, int n)
{
    if (x) {
        #pragma omp simd
        for (int c = 0; c < n; c++) s[c] += dy[c] * (x[c] * rs);
    } else {
        #pragma omp simd
        for (int c = 0; c < n; c++) s[c] += dy[c];
    }
}

static void column_sums_acc(const td_ops *ctx, float *db, const float *dout, const float *inp, const float *rs,
                            int N, int C)
{
    int chunks = (C + COLS_CHUNK - 1) / COLS_CHUNK;
    #pragma omp parallel for num_threads(ctx->nthreads) if ((long)N * C >= 65536)
    for (int q = 0; q < chunks; q++) {
        int c0 = q * COLS_CHUNK, n = C - c0 < COLS_CHUNK ? C - c0 : COLS_CHUNK;
        float s[COLS_CHUNK];
        for (int c = 0; c < n; c++) s[c] = 0.0f;
        for (int i = 0; i < N; i++)
            colsum_row(s, dout + (size_t)i * C + c0, inp ? inp + (size_t)i * C + c0 : NULL, rs ? rs[i] : 1.0f, n);
        for (int c = 0; c < n; c++) db[c0 + c] += s[c];
    }
}

void bias_grad_acc(const td_ops *ctx, float *db, const float *dout, int N, int OUT)
{
    column_sums_acc(ctx, db, dout, NULL, NULL, N, OUT);   /* db (OUT) += the rows of dout (N, OUT) */
}

/* dx += rs * (g - xhat * m), g = dy * w, xhat = x * rs, element by element (no contraction) */
TD_CLONES static void span_rms_dx(float *dx, const float *dy, const float *w, const float *x, float rs, float m, int C)
{
    #pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += rs * (dy[c] * w[c] - (x[c] * rs) * m);
}

/* ---------------------------------------------------------------- ops */

void embedding_backward_ref(const td_ops *ctx, float *dembed, const float *dout,
                            const int *tokens, int N, int C)
{
    /* threads own column slices, so repeated tokens never race */
    #pragma omp parallel num_threads(ctx->nthreads) if ((long)N * C >= 65536)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        int c0 = (int)((long)C * t / k), c1 = (int)((long)C * (t + 1) / k);
        for (int i = 0; i < N; i++) {
            float *d = dembed + (size_t)tokens[i] * C;
            const float *g = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

void rmsnorm_backward_ref(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N, int C)
{
    /* dinp = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd: the mean in
     * double, as the forward's mean of squares */
    #pragma omp parallel for num_threads(ctx->nthreads) if ((long)N * C >= 16384)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C, rs = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)(dy[c] * weight[c]) * (x[c] * rs);
        span_rms_dx(dx, dy, weight, x, rs, (float)(dot / C), C);
    }
    if (dweight) column_sums_acc(ctx, dweight, dout, inp, rstd, N, C);
}

void matmul_backward_ref(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int IN,
                         int OUT)
{
    if (dinp) gemm_nn_acc(ctx, N, IN, OUT, 1.0f, dout, OUT, weight, IN, dinp, IN);
    if (dweight) gemm_tn_acc(ctx, OUT, IN, N, 1.0f, dout, OUT, inp, IN, dweight, IN);
    if (dbias) bias_grad_acc(ctx, dbias, dout, N, OUT);
}

/* the inverse rotation, with cos/sin rounded to D (F32: the reference) */
void rope_backward_rounded(const td_ops *ctx, td_format D, float *dx, const int *pos,
                           const float *inv_freq, int N, int nheads, int HD)
{
    int half = HD / 2;
    const float *tab = rope_cos_sin_table(inv_freq, half, pos, N);
    #pragma omp parallel for num_threads(ctx->nthreads) if (N >= 64)
    for (int i = 0; i < N; i++) {
        float cs[512], sn[512];   /* rope_forward_ref's cos and sin, rounded to D */
        const float *t = tab + (size_t)pos[i] * 2 * half;
        for (int k = 0; k < half; k++) {
            cs[k] = td_round(D, t[k]);
            sn[k] = td_round(D, t[half + k]);
        }
        for (int h = 0; h < nheads; h++) {
            float *g = dx + ((size_t)i * nheads + h) * HD;
            for (int k = 0; k < half; k++) {
                float g0 = g[k], g1 = g[k + half];
                g[k] = g0 * cs[k] + g1 * sn[k];
                g[k + half] = g1 * cs[k] - g0 * sn[k];
            }
        }
    }
}

void rope_backward_ref(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq, int N,
                       int nheads, int HD)
{
    rope_backward_rounded(ctx, TD_F32, dx, pos, inv_freq, N, nheads, HD);
}

/* P = e^(s - lse) and dP (dO.V^T - D) in place over one row of n visible keys (a vector loop at the
 * CPU's width: td_expf's fp32 steps, no contraction under -std=c11, so the same bits at every
 * width); the callers round both rows to D after it */
TD_CLONES static void span_softmax_dp(float *s, float *dp, float lse, float Di, int n)
{
    for (int j = 0; j < n; j++) {
        float p = td_expf(s[j] - lse);
        dp[j] = p * (dp[j] - Di);
        s[j] = p;
    }
}

/* One (sequence, key/value head) of the attention backward: the sequence's n rows start at
 * row r0 (positions 0..n-1); blocks of ATT_BLOCK query rows of each query head of the group
 * against the keys the block's last row sees. P and dS are rounded to D before the GEMMs
 * that read them (FlashAttention's backward feeds P and dS to bf16 tensor cores). */
static void attention_backward_task(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *out, const float *lse, int r0, int n, int kvh,
                                    int NH, int NKV, int HD, td_format D, float *s, float *dp)
{
    int QD = NH * HD, KVD = NKV * HD, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const float *kb = k + (size_t)r0 * KVD + (size_t)kvh * HD;
    const float *vb = v + (size_t)r0 * KVD + (size_t)kvh * HD;
    float *dkb = dk + (size_t)r0 * KVD + (size_t)kvh * HD;
    float *dvb = dv + (size_t)r0 * KVD + (size_t)kvh * HD;
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int b0 = 0; b0 < n; b0 += ATT_BLOCK) {
            int bn = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK, S = b0 + bn;
            size_t row = (size_t)(r0 + b0);
            const float *qh = q + row * QD + (size_t)h * HD;
            const float *doh = dout + row * QD + (size_t)h * HD;
            const float *oh = out + row * QD + (size_t)h * HD;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, S, HD, scale, qh, QD, kb, KVD,
                        0.0f, s, S);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, S, HD, 1.0f, doh, QD, vb, KVD,
                        0.0f, dp, S);
            for (int i = 0; i < bn; i++) {
                float *si = s + (size_t)i * S, *dpi = dp + (size_t)i * S;
                float l = lse[(row + i) * NH + h], Di = 0.0f;
                for (int c = 0; c < HD; c++) Di += doh[(size_t)i * QD + c] * oh[(size_t)i * QD + c];
                int nv = b0 + i + 1;   /* keys 0 .. b0+i are visible to this row */
                span_softmax_dp(si, dpi, l, Di, nv);
                if (D != TD_F32) {
                    td_round_row(D, dpi, dpi, (size_t)nv, TD_SATFINITE);
                    td_round_row(D, si, si, (size_t)nv, TD_SATFINITE);
                }
                for (int j = nv; j < S; j++) si[j] = dpi[j] = 0.0f;
            }
            /* dV += P^T dO,  dK += scale dS^T Q,  dQ += scale dS K */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, HD, bn, 1.0f, s, S, doh, QD,
                        1.0f, dvb, KVD);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, HD, bn, scale, dp, S, qh, QD,
                        1.0f, dkb, KVD);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, HD, S, scale, dp, S, kb, KVD,
                        1.0f, dq + row * QD + (size_t)h * HD, QD);
        }
}

void attention_backward_rounded(const td_ops *ctx, td_format D, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse,
                                const int *pos, int N, int NH, int NKV, int HD, float *scratch,
                                int max_keys)
{
    /* the sequences: runs of rows whose positions count up from 0 */
    int nseq = 0;
    for (int i = 0; i < N; i++) nseq += i == 0 || pos[i] != pos[i - 1] + 1;
    int *start = malloc((size_t)(nseq + 1) * sizeof(int));
    for (int i = 0, s = 0; i < N; i++)
        if (i == 0 || pos[i] != pos[i - 1] + 1) start[s++] = i;
    start[nseq] = N;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
    for (int task = 0; task < nseq * NKV; task++) {
        int sq = task / NKV, kvh = task % NKV;
        float *s = scratch + (size_t)omp_get_thread_num() * 2 * ATT_BLOCK * max_keys;
        attention_backward_task(dq, dk, dv, dout, q, k, v, out, lse, start[sq],
                                start[sq + 1] - start[sq], kvh, NH, NKV, HD, D, s,
                                s + (size_t)ATT_BLOCK * max_keys);
    }
    free(start);
}

void attention_backward_ref(const td_ops *ctx, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int *pos, int N, int NH, int NKV, int HD,
                            float *scratch, int max_keys)
{
    attention_backward_rounded(ctx, TD_F32, dq, dk, dv, dout, q, k, v, out, lse, pos, N, NH, NKV,
                               HD, scratch, max_keys);
}

/* the exponentials of a block first (td_expneg_block, cpu.h: in one loop GCC ran the arm of
 * g < -88.3, sigmoid 1 / (1 + e^88.3), a subnormal, on every lane); 1.36x faster apart on a
 * Xeon. Same bits. */
TD_CLONES static void span_swiglu_backward(float *dg, float *du, const float *dy, const float *g,
                                           const float *u, size_t n)
{
    float e[TD_EXP_BLOCK];
    for (size_t i0 = 0, m; i0 < n; i0 += m) {
        m = td_expneg_block(g + i0, n - i0, e);
        #pragma omp simd
        for (size_t j = 0; j < m; j++) {
            size_t i = i0 + j;
            float sg = 1.0f / (1.0f + e[j]);
            dg[i] += dy[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
            du[i] += dy[i] * (g[i] * sg);
        }
    }
}

void swiglu_backward_ref(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, int N, int F)
{
    size_t n = (size_t)N * F;
    int nt = n >= 16384 ? ctx->nthreads : 1;
    #pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        size_t a = n * t / k, b = n * (t + 1) / k;
        span_swiglu_backward(dgate + a, dup + a, dout + a, gate + a, up + a, b - a);
    }
}

TD_CLONES static void span_logsoftmax_backward(float *dx, const float *logp, float c, size_t n)
{
    #pragma omp simd
    for (size_t j = 0; j < n; j++) dx[j] = -c * td_expf(logp[j]);
}

void logsoftmax_backward_ref(const td_ops *ctx, float *dx, const float *logp, const int *target,
                             const float *dlogp, int N, int V)
{
    #pragma omp parallel for num_threads(ctx->nthreads) if ((long)N * V >= 65536)
    for (int i = 0; i < N; i++) {
        float *d = dx + (size_t)i * V;
        float c = dlogp[i];
        if (c == 0.0f) { memset(d, 0, (size_t)V * sizeof(float)); continue; }
        span_logsoftmax_backward(d, logp + (size_t)i * V, c, (size_t)V);
        d[target[i]] += c;
    }
}
