/* tidal — weight matrices widened to fp32 on the fly (td_wmat, src/model/ops.h): the GEMMs of
 * the CPU backend take one tile of TD_GEMM_TILE rows (output columns) at a time, widen it into
 * the thread's scratch and hand that to the same fp32 kernel as before, with the same leading
 * dimension, so a product's bits do not depend on how its weights are stored. bf16 widens by
 * a shift; fp16 through td_decode_row (what the loader used; F16C's vcvtph2ps where the CPU has it); fp8 codes as
 * td_fp8_dequantize does, lut[code] * scale of its block (codes in panels gathered row by row
 * first: only where the panel kernel declines, e.g. a NaN code). Decode-sized products
 * (wmat_gemm_fixed) read 16-bit weights as stored instead. */
#include "cpu.h"
#include "tidal/gemm.h"

#include <string.h>

TD_CLONES static void widen_bf16(const uint16_t *src, float *dst, size_t n)
{
    uint32_t *o = (uint32_t *)dst;
    #pragma omp simd
    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)src[i] << 16;
}

static void widen_fp8_row(td_format f, const uint8_t *codes, const float *srow, int sc, int cols,
                          float *dst)
{
    for (int c0 = 0, b = 0; c0 < cols; c0 += sc, b++)
        td_fp8_decode_scaled_row(f, codes + c0, srow[b], dst + c0, (size_t)(c0 + sc < cols ? sc : cols - c0));
}

const float *wmat_rows(const td_wmat *w, long r0, long nr, int cols, float *dst)
{
    size_t n = (size_t)nr * cols, at = (size_t)r0 * cols;
    switch (w->dtype) {
    case TD_F32:
        return (const float *)w->data + at;
    case TD_BF16:
        widen_bf16((const uint16_t *)w->data + at, dst, n);
        return dst;
    case TD_F16:
        td_decode_row(TD_F16, (const uint16_t *)w->data + at, dst, n);
        return dst;
    case TD_E4M3:
    case TD_E5M2: {
        if (w->panels) {   /* each row's codes gathered out of its panel, then widened as below */
            uint8_t row[4096];
            for (long r = 0; r < nr; r++) {
                const float *srow = w->scale + (size_t)((r0 + r) / w->sr) * w->nbc;
                for (int c0 = 0; c0 < cols; c0 += (int)sizeof row) {
                    int len = cols - c0 < (int)sizeof row ? cols - c0 : (int)sizeof row;
                    td_fp8_panels_piece((const uint8_t *)w->data, (size_t)cols, (size_t)(r0 + r), (size_t)c0,
                                        (size_t)len, row);
                    for (int k = 0; k < len;) {   /* pieces of one scale block */
                        int b = (c0 + k) / w->sc, m = (b + 1) * w->sc - (c0 + k);
                        if (m > len - k) m = len - k;
                        td_fp8_decode_scaled_row(w->dtype, row + k, srow[b], dst + (size_t)r * cols + c0 + k,
                                                 (size_t)m);
                        k += m;
                    }
                }
            }
            return dst;
        }
        const uint8_t *codes = (const uint8_t *)w->data + at;
        for (long r = 0; r < nr; r++)
            widen_fp8_row(w->dtype, codes + (size_t)r * cols, w->scale + (size_t)((r0 + r) / w->sr) * w->nbc,
                          w->sc, cols, dst + (size_t)r * cols);
        return dst;
    }
    default:
        return NULL;   /* no other storage is made (weights_recipe.c, load.c) */
    }
}

float *wtile_scratch(const td_ops *ctx, int t)
{
    return ctx->wtile ? ctx->wtile + (size_t)t * ctx->wtile_per_thread : NULL;
}

/* out (N, nr; stride ldo) = inp (N, cols) . rows [r0, r0 + nr) of w ^T in td_gemm_fixed's order
 * (the decode-sized products of gemm.h): bf16 and fp16 weights read as stored, others widened
 * into dst first. The same bits either way. */
void wmat_gemm_fixed(const td_wmat *w, long r0, long nr, int cols, const float *inp, int N,
                     float *out, int ldo, float *dst)
{
    if (w->dtype == TD_BF16 || w->dtype == TD_F16) {
        td_gemm_fixed_w16(inp, cols, (const uint16_t *)w->data + (size_t)r0 * cols, cols, w->dtype,
                          out, ldo, N, (int)nr, cols, 0);
        return;
    }
    td_gemm_fixed(inp, cols, wmat_rows(w, r0, nr, cols, dst), cols, out, ldo, N, (int)nr, cols, 0);
}
