/* FP8 scaling recipes (see include/tidal/scaling.h for the exact arithmetic). */
#include "tidal/scaling.h"

#include <float.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <strings.h>

static size_t group_of(const td_fp8_scheme *s)
{
    if (s->group > 0) return (size_t)s->group;
    return s->gran == TD_SCALE_MX ? 32 : 128;
}

void td_fp8_block_shape(const td_fp8_scheme *s, size_t rows, size_t cols,
                        size_t *block_rows, size_t *block_cols)
{
    size_t g = group_of(s);
    size_t br = 1, bc = cols;
    switch (s->gran) {
    case TD_SCALE_TENSOR: br = rows; bc = cols; break;
    case TD_SCALE_ROW:    br = 1;    bc = cols; break;
    case TD_SCALE_GROUP:
    case TD_SCALE_MX:     br = 1;    bc = g;    break;
    case TD_SCALE_BLOCK:  br = g;    bc = g;    break;
    default: break;
    }
    *block_rows = br ? br : 1;
    *block_cols = bc ? bc : 1;
}

size_t td_fp8_num_scales(const td_fp8_scheme *s, size_t rows, size_t cols)
{
    size_t br, bc;
    td_fp8_block_shape(s, rows, cols, &br, &bc);
    return ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
}

/* The quantisation step: code = enc(x * mul) or enc(x / div), one of them in effect. */
typedef struct { float scale; float mul; float div; } block_scale;

static block_scale block_scale_from_amax(const td_fp8_scheme *s, float amax)
{
    const float fmax = td_format_info(s->fmt)->max_finite;
    block_scale b = {1.0f, 0.0f, 1.0f};
    if (s->gran == TD_SCALE_MX) {
        /* E8M0 rounded up: the smallest power of two s with amax * (1/fmax) <= s, computed as
         * Transformer Engine's MXFP8 cast does (multiply by the fp32 reciprocal of fmax) */
        uint8_t e = td_f32_to_e8m0(amax * (1.0f / fmax), TD_SATFINITE, TD_ROUND_UP);
        b.scale = b.div = td_e8m0_to_f32(e);
        return b;
    }
    if (s->arith == TD_ARITH_DIV) {                   /* vLLM */
        float a = amax > 1e-10f ? amax : 1e-10f;       /* also maps NaN amax to the floor */
        float sc = a / fmax;
        if (s->pow2) sc = td_e8m0_to_f32(td_f32_to_e8m0(sc, TD_SATFINITE, TD_ROUND_UP));
        b.scale = b.div = sc;
        return b;
    }
    /* Transformer Engine: compute_scale_from_amax, then scale_inv = 1 / scale */
    float k = 1.0f;
    if (!(isinf(amax) || amax == 0.0f || isnan(amax))) {
        k = fmax / amax;
        if (isinf(k)) k = FLT_MAX;
    }
    if (s->pow2) {
        uint32_t u;
        memcpy(&u, &k, 4);
        u &= 0xFF800000u;                               /* round down to a power of two */
        memcpy(&k, &u, 4);
    }
    b.mul = k;
    b.scale = 1.0f / k;
    return b;
}

float td_fp8_scale_from_amax(const td_fp8_scheme *s, float amax)
{
    return block_scale_from_amax(s, amax).scale;
}

/* Visits each block: computes its amax and scale, then quantises it into codes. */
void td_fp8_quantize(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols,
                     uint8_t *codes, float *scales)
{
    size_t br, bc;
    td_fp8_block_shape(s, rows, cols, &br, &bc);
    size_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
    for (size_t bi = 0; bi < nbr * nbc; bi++) {
        size_t r0 = (bi / nbc) * br, c0 = (bi % nbc) * bc;
        size_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
        float amax = 0.0f;
        for (size_t r = r0; r < r1; r++)
            for (size_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[r * cols + c]));
        block_scale b = block_scale_from_amax(s, amax);
        scales[bi] = b.scale;
        /* the block's row pieces scaled into a buffer, then encoded by the row form (one
         * specialised loop per format) */
        float buf[256];
        for (size_t r = r0; r < r1; r++) {
            const float *xr = x + r * cols;
            uint8_t *qr = codes + r * cols;
            for (size_t p0 = c0; p0 < c1; p0 += 256) {
                size_t n = c1 - p0 < 256 ? c1 - p0 : 256;
                if (b.mul != 0.0f) for (size_t c = 0; c < n; c++) buf[c] = xr[p0 + c] * b.mul;
                else               for (size_t c = 0; c < n; c++) buf[c] = xr[p0 + c] / b.div;
                td_encode_row(s->fmt, buf, qr + p0, n, s->sat);
            }
        }
    }
}

void td_fp8_dequantize(const td_fp8_scheme *s, const uint8_t *codes, const float *scales,
                       size_t rows, size_t cols, float *y)
{
    size_t br, bc;
    td_fp8_block_shape(s, rows, cols, &br, &bc);
    size_t nbc = (cols + bc - 1) / bc;
    const float *lut = td_fp8_decode_table(s->fmt);
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
    for (size_t r = 0; r < rows; r++) {
        const float *srow = scales + (r / br) * nbc;
        const uint8_t *cr = codes + r * cols;
        float *yr = y + r * cols;
        for (size_t c0 = 0, b = 0; c0 < cols; c0 += bc, b++) {   /* block by block: one scale */
            size_t c1 = c0 + bc < cols ? c0 + bc : cols;
            float sc = srow[b];
            for (size_t c = c0; c < c1; c++) yr[c] = lut[cr[c]] * sc;
        }
    }
}

void td_fp8_fake_quant(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols, float *y)
{
    uint8_t *codes = td_xmalloc(rows * cols);
    float *scales = td_xmalloc(td_fp8_num_scales(s, rows, cols) * sizeof(float));
    td_fp8_quantize(s, x, rows, cols, codes, scales);
    td_fp8_dequantize(s, codes, scales, rows, cols, y);
    free(codes);
    free(scales);
}

static const char *GRAN_NAMES[TD_SCALE_COUNT] = {"tensor", "row", "group", "block", "mx"};

const char *td_scale_granularity_name(td_scale_granularity g)
{
    return (unsigned)g < TD_SCALE_COUNT ? GRAN_NAMES[g] : "?";
}

int td_scale_granularity_from_name(const char *name)
{
    if (!name) return -1;
    for (int g = 0; g < TD_SCALE_COUNT; g++) if (!strcasecmp(name, GRAN_NAMES[g])) return g;
    if (!strcasecmp(name, "token") || !strcasecmp(name, "channel")) return TD_SCALE_ROW;
    if (!strcasecmp(name, "1x128") || !strcasecmp(name, "group128")) return TD_SCALE_GROUP;
    if (!strcasecmp(name, "128x128") || !strcasecmp(name, "block128x128")) return TD_SCALE_BLOCK;
    if (!strcasecmp(name, "mxfp8") || !strcasecmp(name, "mx32")) return TD_SCALE_MX;
    return -1;
}
