/* tidal — embedding_forward_cuda (ops.h embedding_forward; CPU: embedding_forward_ref):
 * out (N, C) = embed[tokens[i]] widened to fp32 from the table's storage dtype, as wmat_rows
 * (src/backend/cpu_wmat.c) widens it: bf16 by a shift, fp16 exactly, fp8 codes decoded and
 * multiplied by the scale of their (sr, sc) block. A gather: nothing is rounded.
 *
 * Where the table lives: the op is not told the vocabulary size, so the table cannot be
 * uploaded whole with tdc_const (which needs its size). The rows used are gathered on the host
 * instead (tokens and the table are host memory, ops.h), N * C storage elements plus, for fp8,
 * each row's nbc block scales, and uploaded with tdc_in: N * C * 2 bytes per call for a bf16
 * table (a 4096-token prefill of a 4096-wide model: 32 MiB), nothing kept on the device.
 * The widening runs on the device. A table prepared on the device (a trainer's masters there:
 * be->prepare / alias, tdc_const_find) has stale host bytes: its rows are gathered on the device
 * from the device copy instead (the tokens uploaded); a rounding view (weights_recipe.c: a bf16 /
 * fp16 table of fp32 masters) is gathered from the masters and rounded on the way, td_round's
 * value, which is what decoding the table's codes gives. Scratch slots: none. */
#include "kern.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t esize(td_format f)
{
    return f == TD_F32 ? 4 : (f == TD_BF16 || f == TD_F16) ? 2 : 1;
}

/* out[i, c] = widen(rows[i, c]) (* scales[i, c / sc] for fp8) */
__global__ static void embed_widen(float *out, const void *rows, const float *scales, int dtype,
                                   int N, int C, int sc, int nbc)
{
    size_t n = (size_t)N * C;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        float v;
        switch (dtype) {
        case TD_BF16: v = tdc_bf16_dec(((const uint16_t *)rows)[e]); break;
        case TD_F16: v = tdc_f16_dec(((const uint16_t *)rows)[e]); break;
        case TD_E4M3:
        case TD_E5M2: {
            uint8_t code = ((const uint8_t *)rows)[e];
            float d = dtype == TD_E4M3 ? tdc_e4m3_dec(code) : tdc_e5m2_dec(code);
            size_t i = e / (size_t)C;
            int c = (int)(e - i * (size_t)C);
            v = d * scales[i * (size_t)nbc + (size_t)(c / sc)];
            break;
        }
        default: v = ((const float *)rows)[e]; break;
        }
        out[e] = v;
    }
}

/* out[i, c] = widen(table[tokens[i], c]): a 16-bit or fp32 table on the device; view != TD_F32:
 * table is fp32 and each value is rounded to view */
__global__ static void embed_gather(float *out, const void *table, const int *tokens, int dtype, int view, int N,
                                    int C)
{
    size_t n = (size_t)N * C;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)C, src = (size_t)tokens[i] * C + (e - i * (size_t)C);
        float v;
        if (view != TD_F32) {
            v = tdc_round(view, ((const float *)table)[src]);
        } else {
            switch (dtype) {
            case TD_BF16: v = tdc_bf16_dec(((const uint16_t *)table)[src]); break;
            case TD_F16: v = tdc_f16_dec(((const uint16_t *)table)[src]); break;
            default: v = ((const float *)table)[src]; break;
            }
        }
        out[e] = v;
    }
}

extern "C" void embedding_forward_cuda(const td_ops *ctx, float *out, const int *tokens,
                                       const td_wmat *embed, int N, int C)
{
    (void)ctx;
    if (N <= 0 || C <= 0) return;
    size_t es = esize(embed->dtype), row = (size_t)C * es;
    int fp8 = embed->dtype == TD_E4M3 || embed->dtype == TD_E5M2;
    int view = TD_F32;
    const void *dtab = fp8 ? NULL : tdc_const_find(embed->data, &view);
    if (dtab) {   /* prepared on the device: the host table is stale */
        const int *d_tok = (const int *)tdc_in(tokens, (size_t)N * sizeof(int));
        float *d_o = (float *)tdc_out(out, (size_t)N * C * sizeof(float), 0);
        TD_LAUNCH(embed_gather, tdc_blocks((size_t)N * C, 256), 256, 0, tdc_stream(), d_o, dtab, d_tok,
                  (int)embed->dtype, view, N, C);
        CUDA_CHECK_LAUNCH();
        tdc_done();
        return;
    }
    /* the used rows (and their block scales) gathered on the host into a grow-only buffer
     * (pageable memory: a copy from it has read it by the time cudaMemcpyAsync returns; the
     * stream is synchronised before it is replaced all the same) */
    static unsigned char *host;
    static size_t host_cap;
    size_t need = (size_t)N * row + (fp8 ? (size_t)N * embed->nbc * sizeof(float) : 0);
    if (need > host_cap) {
        CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));   /* the old buffer is no longer read */
        free(host);
        host = (unsigned char *)malloc(need);
        if (!host) {
            fprintf(stderr, "tidal: embedding_forward_cuda: out of host memory (%zu bytes)\n", need);
            exit(1);
        }
        host_cap = need;
    }
    float *hscale = fp8 ? (float *)(host + (size_t)N * row) : NULL;
    const unsigned char *table = (const unsigned char *)embed->data;
    for (int i = 0; i < N; i++) {
        memcpy(host + (size_t)i * row, table + (size_t)tokens[i] * row, row);
        if (fp8)
            memcpy(hscale + (size_t)i * embed->nbc,
                   embed->scale + (size_t)(tokens[i] / embed->sr) * embed->nbc,
                   (size_t)embed->nbc * sizeof(float));
    }
    const void *d_rows = tdc_in(host, (size_t)N * row);
    const float *d_scale = fp8 ? (const float *)tdc_in(hscale, (size_t)N * embed->nbc * sizeof(float)) : NULL;
    float *d_out = (float *)tdc_out(out, (size_t)N * C * sizeof(float), 0);
    TD_LAUNCH(embed_widen, tdc_blocks((size_t)N * C, 256), 256, 0, tdc_stream(), d_out, d_rows,
              d_scale, (int)embed->dtype, N, C, fp8 ? embed->sc : 1, fp8 ? embed->nbc : 0);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
