/* tidal — a mixture of experts' row ops on the CPU (td_backend_cpu's moe_* entries, ops.h): the
 * gather of an expert's rows, the combines (transformers' index_add_, vLLM's fused_moe scatter
 * and moe_sum, Qwen2-MoE's gated shared expert) and their backward, with the roundings ops.h
 * states. This is the arithmetic src/model/moe.c did on the host before these were ops, in the
 * same order: each row's products and sums in fp32, rounded as rows (td_round_row: td_round's
 * bits), the dot products in double in index order. Host memory; one thread (a row's operations
 * are few next to the experts' GEMMs). */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* R the stream's dtype: D (act_of), or fp32 under residual_fp32 */
static td_format stream_of(const td_ops *ctx)
{
    return !ctx->recipe || ctx->recipe->residual_fp32 ? TD_F32 : ctx->recipe->activations;
}

/* o = R(o + X(y * w)) over n values, as rows; tmp holds n */
static void add_scaled_rounded(td_format X, td_format R, float *o, const float *y, float w, size_t n, float *tmp)
{
    for (size_t h = 0; h < n; h++) tmp[h] = y[h] * w;
    td_round_row(X, tmp, tmp, n, TD_SATFINITE);
    for (size_t h = 0; h < n; h++) tmp[h] = o[h] + tmp[h];
    td_round_row(R, tmp, o, n, TD_SATFINITE);
}

static double dot(const float *x, const float *y, int n)
{
    double s = 0;
    for (int h = 0; h < n; h++) s += (double)x[h] * y[h];
    return s;
}

void moe_gather_cpu(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n, int K, int C)
{
    (void)ctx;
    for (int q = 0; q < n; q++)
        memcpy(out + (size_t)q * C, x + (size_t)(rows[q] / K) * C, (size_t)C * sizeof(float));
}

void moe_combine_cpu(const td_ops *ctx, float *out, const float *y, const int *rows, const float *w, int N, int n,
                     int K, int C)
{
    td_format R = stream_of(ctx);
    float *tmp = td_xmalloc((size_t)C * sizeof(float));
    for (int q = 0; q < n; q++)
        add_scaled_rounded(R, R, out + (size_t)(rows[q] / K) * C, y + (size_t)q * C, w[rows[q]], (size_t)C, tmp);
    free(tmp);
}

void moe_scatter_cpu(const td_ops *ctx, float *v, const float *y, const int *rows, const float *w, int N, int n,
                     int K, int C)
{
    td_format D = act_of(ctx);
    for (int q = 0; q < n; q++) {
        float wq = w[rows[q]];
        const float *yq = y + (size_t)q * C;
        float *vq = v + (size_t)rows[q] * C;
        for (int h = 0; h < C; h++) vq[h] = yq[h] * wq;
        td_round_row(D, vq, vq, (size_t)C, TD_SATFINITE);
    }
}

void moe_sum_topk(td_format D, int N, int K, int C, const float *v, float *out)
{
    for (int i = 0; i < N; i++) {   /* o = 0; o = D(o + v_j) for j = 0 .. K-1, as rows */
        float *o = out + (size_t)i * C;
        for (int h = 0; h < C; h++) o[h] = 0.0f;
        for (int j = 0; j < K; j++) {
            const float *vj = v + ((size_t)i * K + j) * C;
            for (int h = 0; h < C; h++) o[h] = o[h] + vj[h];
            td_round_row(D, o, o, (size_t)C, TD_SATFINITE);
        }
    }
}

void moe_sum_cpu(const td_ops *ctx, float *out, const float *v, int N, int K, int C)
{
    moe_sum_topk(act_of(ctx), N, K, C, v, out);
}

void moe_shared_combine_cpu(const td_ops *ctx, float *out, const float *y, const float *z, int N, int C)
{
    td_format D = act_of(ctx), R = stream_of(ctx);
    float *tmp = td_xmalloc((size_t)C * sizeof(float));
    for (int i = 0; i < N; i++) {   /* o = R(o + D(g y)) */
        float g = td_round(D, 1.0f / (1.0f + expf(-z[i])));   /* F.sigmoid on the D gate */
        add_scaled_rounded(D, R, out + (size_t)i * C, y + (size_t)i * C, g, (size_t)C, tmp);
    }
    free(tmp);
}

void moe_combine_backward_cpu(const td_ops *ctx, float *dw, float *dy, const float *dout, const float *y,
                              const int *rows, const float *w, int N, int n, int K, int C)
{
    td_format D = act_of(ctx);
    for (int q = 0; q < n; q++) {   /* dw_ij = <dout_i, y>, dy = w_ij dout_i */
        int pr = rows[q], i = pr / K;
        const float *d = dout + (size_t)i * C;
        dw[pr] = (float)dot(d, y + (size_t)q * C, C);
        float *dyq = dy + (size_t)q * C;
        for (int h = 0; h < C; h++) dyq[h] = td_round(D, w[pr] * d[h]);
    }
}

void moe_scatter_add_cpu(const td_ops *ctx, float *dx, const float *dxe, const int *rows, int N, int n, int K,
                         int C, int rounded)
{
    td_format R = stream_of(ctx);
    for (int q = 0; q < n; q++) {
        float *d = dx + (size_t)(rows ? rows[q] / K : q) * C;
        const float *s = dxe + (size_t)q * C;
        if (rounded && R != TD_F32)
            for (int h = 0; h < C; h++) d[h] = td_round(R, d[h] + td_round(R, s[h]));
        else
            for (int h = 0; h < C; h++) d[h] += s[h];
    }
}

void moe_shared_combine_backward_cpu(const td_ops *ctx, float *dz, float *dy, const float *dout,
                                     const float *y, const float *z, int N, int C)
{
    td_format D = act_of(ctx);
    for (int i = 0; i < N; i++) {
        float sg = 1.0f / (1.0f + expf(-z[i])), s = td_round(D, sg);
        const float *d = dout + (size_t)i * C;
        dz[i] = td_round(D, (float)(dot(d, y + (size_t)i * C, C) * sg * (1.0f - sg)));
        float *dyi = dy + (size_t)i * C;
        for (int h = 0; h < C; h++) dyi[h] = td_round(D, s * d[h]);
    }
}
