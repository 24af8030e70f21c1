/* tidal — the op list (src/model/ops.h) in fp32 on the CPU: the reference forms (`_ref`) that
 * the CPU backend (cpu.c) runs for the plain fp32 recipe, and that every other form is checked
 * against. Names and argument order are the op list's.
 *
 * Threading: one pool only, OpenMP. OpenBLAS is told to use one thread and every GEMM is cut
 * into per-thread slices of output columns, each a single-threaded sgemm; so OpenBLAS's own
 * pthreads never compete with OpenMP's workers for the cores (on 2 cores that
 * oversubscription costs more than it gives).
 *
 * Exponentials go through a vectorisable expf (Cephes polynomial; max relative error 8.3e-8,
 * 1.4 ulp, measured against double exp over every float in [-87, 88] with |x| >= 1e-3);
 * libm's expf is not vectorised without -ffast-math and dominates log-softmax over 150k logits.
 */
#include "cpu.h"
#include "tidal/gemm.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tidal never inspects floating-point exception flags; without this, GCC will not if-convert
 * the clamp in td_expf (a comparison may raise "invalid") and leaves the exp loops scalar. */
#pragma GCC optimize("no-trapping-math")

void cpu_init(td_ops *ctx)
{
    /* OpenBLAS threading is process-global; single-threaded BLAS called from OpenMP slices. */
    openblas_set_num_threads(1);
    ctx->nthreads = omp_get_max_threads();
    if (ctx->nthreads < 1) ctx->nthreads = 1;
}

TD_CLONES static float span_max(const float *x, size_t n)
{
    float mx = -INFINITY;
    #pragma omp simd reduction(max : mx)
    for (size_t j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* sum of e^(x - mx): fp32 partial sums over blocks of 1024 (each term <= 1), the blocks added
 * in double */
TD_CLONES static double span_sumexp(const float *x, size_t n, float mx)
{
    double sum = 0.0;
    for (size_t j0 = 0; j0 < n; j0 += 1024) {
        size_t j1 = j0 + 1024 < n ? j0 + 1024 : n;
        float part = 0.0f;
        #pragma omp simd reduction(+ : part)
        for (size_t j = j0; j < j1; j++) part += td_expf(x[j] - mx);
        sum += part;
    }
    return sum;
}

TD_CLONES static void span_sub(float *x, size_t n, float c)
{
    #pragma omp simd
    for (size_t j = 0; j < n; j++) x[j] -= c;
}

/* out = silu(g) * u, silu(g) = g / (1 + e^-g), the exponentials of a block first
 * (td_expneg_block, cpu.h): in one loop GCC divided every lane by 1 + e^88.3 as well (td_expf's
 * clamp carried through the quotient, blended away), a subnormal quotient and a microcode assist
 * per vector on Intel: 8 % of an fp32 forward (model-tf), the loop 30x slower. Same bits. */
TD_CLONES static void span_swiglu(float *out, const float *g, const float *u, size_t n)
{
    float e[TD_EXP_BLOCK];
    for (size_t i0 = 0, m; i0 < n; i0 += m) {
        m = td_expneg_block(g + i0, n - i0, e);
        #pragma omp simd
        for (size_t i = 0; i < m; i++) out[i0 + i] = g[i0 + i] / (1.0f + e[i]) * u[i0 + i];
    }
}

void embedding_forward_ref(const td_ops *ctx, float *out, const int *tokens, const td_wmat *embed,
                           int N, int C)
{
    (void)ctx;
    for (int i = 0; i < N; i++) {   /* each row widened straight into its place */
        float *o = out + (size_t)i * C;
        const float *row = wmat_rows(embed, tokens[i], 1, C, o);
        if (row != o) memcpy(o, row, (size_t)C * sizeof(float));
    }
}

void rmsnorm_forward_ref(const td_ops *ctx, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps)
{
    /* The mean of squares is accumulated in double (one rounding to fp32 at the end), the
     * scaling in fp32 as HF does: (x * rsqrt(ms + eps)) * w. */
    #pragma omp parallel for num_threads(ctx->nthreads) if (N >= 64)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0.0;
        #pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float ms = (float)(ss / C);
        float rs = 1.0f / sqrtf(ms + eps);
        if (rstd) rstd[i] = rs;
        for (int c = 0; c < C; c++) y[c] = (x[c] * rs) * weight[c];
    }
}

/* The one GEMM under every matrix product of the forward (projections, lm_head, attention's
 * Q.K^T and P.V), single-threaded (callers own the threading):
 *   C (M, N; ldc) = alpha * A (M, K; lda) . op(B) + beta * C,
 *   op(B) = B^T with B (N, K; ldb) when b_trans, else B (K, N; ldb).   Row-major throughout.
 * Precision recipes will round A and B to the GEMM operand format here. */
static void gemm_f32(const td_ops *ctx, int b_trans, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc)
{
    (void)ctx;
    if (M == 1 && b_trans)   /* one row: y = B x, a GEMV (OpenBLAS's sgemm does not switch) */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, 1, beta, C, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, M, N, K,
                    alpha, A, lda, B, ldb, beta, C, ldc);
}

void matmul_forward_ref(const td_ops *ctx, int n, float *const *out, const float *inp,
                        const td_wmat *weight, const float *const *bias, int N, int IN,
                        const int *OUT)
{
    /* The outputs' columns, laid end to end, are cut into fixed tiles (cpu.h), whole tiles per
     * thread; a tile may span two outputs, each piece one GEMM over its weight rows widened to
     * fp32 (in place when stored fp32), or, for at most TD_GEMM_FIXED_ROWS rows, the fixed-order
     * GEMM reading 16-bit weights as stored (gemm.h). One parallel region for all n products keeps the
     * barriers per layer few (they hurt most in decode). */
    long total = 0;
    for (int j = 0; j < n; j++) total += OUT[j];
    #pragma omp parallel num_threads(gemm_threads(ctx, N, IN, total))
    {
        long s0, s1;
        gemm_slice(total, omp_get_thread_num(), omp_get_num_threads(), &s0, &s1);
        float *tile = wtile_scratch(ctx, omp_get_thread_num());
        for (long c0 = s0; c0 < s1; c0 += TD_GEMM_TILE) {
            long c1 = c0 + TD_GEMM_TILE < s1 ? c0 + TD_GEMM_TILE : s1, base = 0;
            for (int j = 0; j < n; base += OUT[j], j++) {
                long o0 = c0 > base ? c0 - base : 0, o1 = c1 - base < OUT[j] ? c1 - base : OUT[j];
                if (o0 >= o1) continue;
                if (N <= TD_GEMM_FIXED_ROWS && !td_gemm_legacy_order()) {   /* a decode step: the fixed order (gemm.h) */
                    wmat_gemm_fixed(&weight[j], o0, o1 - o0, IN, inp, N, out[j] + o0, OUT[j], tile);
                } else {
                    const float *wt = wmat_rows(&weight[j], o0, o1 - o0, IN, tile);
                    gemm_f32(ctx, 1, N, (int)(o1 - o0), IN, 1.0f, inp, IN, wt, IN, 0.0f,
                             out[j] + o0, OUT[j]);
                }
                if (bias && bias[j])
                    for (int i = 0; i < N; i++) {
                        float *y = out[j] + (size_t)i * OUT[j];
                        for (long o = o0; o < o1; o++) y[o] += bias[j][o];
                    }
            }
        }
    }
}

/* The rotary angles' cos and sin, (float)cos((double)a) and (float)sin((double)a) of the fp32
 * angle a = (float)p * inv_freq[k] as HF forms it, for positions 0 .. npos - 1: one table per
 * inv_freq (compared by value) kept for the process and extended (doubling) when a longer position
 * comes, so that the L layers' q and k rotations and the backward's stop computing the same
 * 2 L sincos per row (about 2 % of a small model's training step). Row p holds half cos then half
 * sin. A table once returned is never changed or freed before exit (a longer one is a new table),
 * so callers read it from any thread without a lock. */
typedef struct rope_table {
    struct rope_table *next;
    int half, npos;
    float *inv_freq, *cs;
} rope_table;
static rope_table *rope_tables;

static void rope_tables_free(void)
{
    while (rope_tables) {
        rope_table *t = rope_tables;
        rope_tables = t->next;
        free(t->inv_freq);
        free(t->cs);
        free(t);
    }
}

const float *rope_cos_sin_table(const float *inv_freq, int half, const int *pos, int N)
{
    int npos = 1;
    for (int i = 0; i < N; i++) {
        if (pos[i] < 0) {   /* positions are the program's own, never negative */
            fprintf(stderr, "tidal: internal error: RoPE position %d\n", pos[i]);
            abort();
        }
        npos = pos[i] >= npos ? pos[i] + 1 : npos;
    }
    const float *out = NULL;
    #pragma omp critical(td_rope_table)
    {
        rope_table *have = NULL;
        for (rope_table *t = rope_tables; t && !out; t = t->next)
            if (t->half == half && memcmp(t->inv_freq, inv_freq, (size_t)half * sizeof(float)) == 0) {
                if (t->npos >= npos) out = t->cs;
                else if (!have) have = t;   /* the newest of this inv_freq: the longest */
            }
        if (!out) {
            static int registered;
            if (!registered) registered = atexit(rope_tables_free) == 0;
            rope_table *t = td_xmalloc(sizeof *t);
            t->half = half;
            t->npos = have && 2 * have->npos > npos ? 2 * have->npos : npos;
            t->inv_freq = td_xmalloc((size_t)half * sizeof(float));
            memcpy(t->inv_freq, inv_freq, (size_t)half * sizeof(float));
            t->cs = td_xmalloc((size_t)t->npos * 2 * half * sizeof(float));
            for (int p = 0; p < t->npos; p++)
                for (int k = 0; k < half; k++) {
                    float a = (float)p * inv_freq[k];
                    t->cs[(size_t)p * 2 * half + k] = (float)cos((double)a);
                    t->cs[(size_t)p * 2 * half + half + k] = (float)sin((double)a);
                }
            t->next = rope_tables;   /* newest first */
            rope_tables = t;
            out = t->cs;
        }
    }
    return out;
}

void rope_forward_ref(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                      int nheads, int HD)
{
    int half = HD / 2;
    const float *tab = rope_cos_sin_table(inv_freq, half, pos, N);
    #pragma omp parallel for num_threads(ctx->nthreads) if (N >= 64)
    for (int i = 0; i < N; i++) {
        /* the angle pos * inv_freq formed in fp32 as HF does, cos/sin rounded to fp32 */
        const float *cs = tab + (size_t)pos[i] * 2 * half, *sn = cs + half;
        for (int h = 0; h < nheads; h++) {
            float *xh = x + ((size_t)i * nheads + h) * HD;
            for (int k = 0; k < half; k++) {
                float x0 = xh[k], x1 = xh[k + half];
                xh[k] = x0 * cs[k] - x1 * sn[k];
                xh[k + half] = x1 * cs[k] + x0 * sn[k];
            }
        }
    }
}

/* Softmax of the first nv of the n scores in s (the rest, masked, set to 0); *lse, if lse is
 * not NULL, gets log sum e^s = max + log(sum e^(s - max)). */
TD_CLONES static void masked_softmax(float *s, int nv, int n, float *lse)
{
    float mx = -INFINITY;
    for (int j = 0; j < nv; j++) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
    #pragma omp simd reduction(+ : sum)
    for (int j = 0; j < nv; j++) { s[j] = td_expf(s[j] - mx); sum += s[j]; }
    if (lse) *lse = mx + logf(sum);
    float inv = 1.0f / sum;
    for (int j = 0; j < nv; j++) s[j] *= inv;
    for (int j = nv; j < n; j++) s[j] = 0.0f;
}

/* One query row, one head: scores, softmax, weighted sum of values (decode, short runs). */
TD_CLONES static void attend_row(float *oh, float *lse, const float *qh, const float *kb,
                                 const float *vb, int nk, int KVD, int HD, float scale, float *s)
{
    for (int j = 0; j < nk; j++) {
        const float *kj = kb + (size_t)j * KVD;
        float d = 0.0f;
        #pragma omp simd reduction(+ : d)
        for (int c = 0; c < HD; c++) d += qh[c] * kj[c];
        s[j] = d * scale;
    }
    masked_softmax(s, nk, nk, lse);
    for (int c = 0; c < HD; c++) oh[c] = 0.0f;
    for (int j = 0; j < nk; j++) {
        const float *vj = vb + (size_t)j * KVD;
        float p = s[j];
        #pragma omp simd
        for (int c = 0; c < HD; c++) oh[c] += p * vj[c];
    }
}

void attention_forward_ref(const td_ops *ctx, float *out, float *lse, const float *q,
                           const float *k, const float *v, const size_t *kv_off, const int *pos,
                           int N, int NH, int NKV, int HD, float *scratch, int max_keys)
{
    int KVD = NKV * HD, QD = NH * HD, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    /* Rows come in runs: consecutive rows of one sequence at consecutive positions (a
     * teacher-forced sequence, a prefill chunk) or single rows (decode). A long run is done
     * by blocks of ATT_BLOCK query rows as two GEMMs per head, over the keys the block's last
     * row sees (later keys masked to probability 0); short runs row by row. */
    for (int r = 0; r < N;) {
        int n = 1;
        while (r + n < N && kv_off[r + n] == kv_off[r] && pos[r + n] == pos[r] + n) n++;
        const float *kb = k + kv_off[r], *vb = v + kv_off[r];
        int p0 = pos[r];
        if (n >= ATT_MIN_RUN) {
            int nblk = (n + ATT_BLOCK - 1) / ATT_BLOCK;
            #pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
            for (int task = 0; task < nblk * NH; task++) {
                int b = nblk - 1 - task / NH, h = task % NH, kvh = h / group; /* big first */
                int b0 = b * ATT_BLOCK, bn = n - b0 < ATT_BLOCK ? n - b0 : ATT_BLOCK;
                int S = p0 + b0 + bn;   /* keys seen by the block's last row */
                float *s = scratch + (size_t)omp_get_thread_num() * ATT_BLOCK * max_keys;
                const float *qh = q + (size_t)(r + b0) * QD + (size_t)h * HD;
                gemm_f32(ctx, 1, bn, S, HD, scale, qh, QD, kb + (size_t)kvh * HD, KVD, 0.0f,
                         s, S);
                for (int i = 0; i < bn; i++)
                    masked_softmax(s + (size_t)i * S, p0 + b0 + i + 1, S,
                                   lse ? lse + (size_t)(r + b0 + i) * NH + h : NULL);
                gemm_f32(ctx, 0, bn, HD, S, 1.0f, s, S, vb + (size_t)kvh * HD, KVD, 0.0f,
                         out + (size_t)(r + b0) * QD + (size_t)h * HD, QD);
            }
        } else {
            /* a decode step's few rows: threads only when the keys make it worth a fork */
            long work = 0;
            for (int i = r; i < r + n; i++) work += (long)(pos[i] + 1) * NH * HD;
            int nt = work >= 1L << 20 ? ctx->nthreads : 1;
            #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
            for (int task = 0; task < n * NH; task++) {
                int i = r + task / NH, h = task % NH, kvh = h / group;
                float *s = scratch + (size_t)omp_get_thread_num() * ATT_BLOCK * max_keys;
                attend_row(out + (size_t)i * QD + (size_t)h * HD, lse ? lse + (size_t)i * NH + h : NULL,
                           q + (size_t)i * QD + (size_t)h * HD, kb + (size_t)kvh * HD,
                           vb + (size_t)kvh * HD, pos[i] + 1, KVD, HD, scale, s);
            }
        }
        r += n;
    }
}

void swiglu_forward_ref(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                        int F)
{
    size_t n = (size_t)N * F;
    int nt = n >= 16384 ? ctx->nthreads : 1;
    #pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        size_t a = n * t / k, b = n * (t + 1) / k;
        span_swiglu(out + a, gate + a, up + a, b - a);
    }
}

void residual_forward_ref(const td_ops *ctx, float *out, const float *inp1, const float *inp2,
                          size_t n)
{
    #pragma omp parallel for simd num_threads(ctx->nthreads) if (n >= 65536)
    for (size_t i = 0; i < n; i++) out[i] = inp1[i] + inp2[i];
}

void scale_forward_ref(const td_ops *ctx, float *x, float s, size_t n)
{
    #pragma omp parallel for num_threads(ctx->nthreads) if (n >= 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* One row of V split over nt threads: max, the sum of e^(x - max), subtract. The threads take
 * whole 1024-blocks of span_sumexp and the block sums are added in block order, so the sum is
 * the one a single thread forms (span_sumexp over the row): the same for any thread count,
 * and the same whether the row came alone (decode) or with others. */
static void logsoftmax_row_split(float *x, int V, int nt)
{
    size_t nb = ((size_t)V + 1023) / 1024;
    double part[nb];
    float mx = -INFINITY;
    if ((size_t)nt > nb) nt = (int)nb;
    #pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        size_t b0 = nb * t / k, b1 = nb * (t + 1) / k;
        size_t a = b0 * 1024, b = b1 * 1024 < (size_t)V ? b1 * 1024 : (size_t)V;
        float m = span_max(x + a, b - a);
        #pragma omp critical
        if (m > mx) mx = m;
        #pragma omp barrier
        for (size_t q = b0; q < b1; q++) {
            size_t e = (q + 1) * 1024 < (size_t)V ? (q + 1) * 1024 : (size_t)V;
            part[q] = span_sumexp(x + q * 1024, e - q * 1024, mx);
        }
        #pragma omp barrier
        #pragma omp single
        {
            double sum = 0.0;
            for (size_t q = 0; q < nb; q++) sum += part[q];
            mx = mx + (float)log(sum);   /* the row's log-normaliser, shared */
        }
        span_sub(x + a, b - a, mx);
    }
}

void logsoftmax_forward_ref(const td_ops *ctx, float *x, int N, int V)
{
    if (N < ctx->nthreads) {  /* few rows (decode): threads split each row */
        for (int i = 0; i < N; i++) logsoftmax_row_split(x + (size_t)i * V, V, ctx->nthreads);
        return;
    }
    #pragma omp parallel for num_threads(ctx->nthreads)
    for (int i = 0; i < N; i++) {
        float *row = x + (size_t)i * V;
        float mx = span_max(row, V);
        span_sub(row, V, mx + (float)log(span_sumexp(row, V, mx)));
    }
}
