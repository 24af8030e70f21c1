/* FP8 scaling recipes (see include/tidal/scaling.h for the exact arithmetic). */
#include "tidal/scaling.h"
#include "tidal/isa.h"
#include "formats_simd.h"

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

/* The element-wise loops below at the CPU's vector width (TD_CLONES; the block maximum in an AVX2
 * form): maxima, products and quotients element by element, so the same bits at any
 * width. They were 9 % of an fp8-unified training step at the build's baseline (SSE) width. */

/* The largest |x| of a block, rows [r0, r1) x cols [c0, c1) (NaN ignored, as fmaxf does: a
 * comparison with NaN is false; max(v, m) below is v > m ? v : m). A maximum is exact in any
 * order, so the rows are folded into running maxima and those into one at the end: on AVX2 four
 * vectors of them, which no chain of one max's latency holds up. (One `omp simd reduction`
 * vector per row, reduced through the stack, was 5.6 % of an fp8-unified training step on a
 * Xeon.) */
static float amax_portable(const float *x, size_t cols, size_t r0, size_t r1, size_t c0, size_t c1)
{
    float t = 0.0f;
    for (size_t r = r0; r < r1; r++)
        for (size_t c = c0; c < c1; c++) {
            float v = fabsf(x[r * cols + c]);
            t = v > t ? v : t;
        }
    return t;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static float amax_avx2(const float *x, size_t cols, size_t r0, size_t r1,
                                                       size_t c0, size_t c1)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 m0 = _mm256_setzero_ps(), m1 = m0, m2 = m0, m3 = m0;   /* registers, not an array in memory */
    float t = 0.0f;
    size_t n = c1 - c0, nv = n - n % 32;
    for (size_t r = r0; r < r1; r++) {
        const float *p = x + r * cols + c0;
        for (size_t i = 0; i < nv; i += 32) {
            m0 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p + i), abs), m0);
            m1 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p + i + 8), abs), m1);
            m2 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p + i + 16), abs), m2);
            m3 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p + i + 24), abs), m3);
        }
        if (nv < n) {
            float e = amax_portable(p, 0, 0, 1, nv, n);
            t = e > t ? e : t;
        }
    }
    float l[8];
    _mm256_storeu_ps(l, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (int q = 0; q < 8; q++) t = l[q] > t ? l[q] : t;
    return t;
}
#endif

static float block_amax(const float *x, size_t cols, size_t r0, size_t r1, size_t c0, size_t c1)
{
#if defined(__x86_64__)
    if (td_isa_level() >= TD_ISA_AVX2) return amax_avx2(x, cols, r0, r1, c0, c1);
#endif
    return amax_portable(x, cols, r0, r1, c0, c1);
}

/* A block's piece scaled for encoding: x * mul (Transformer Engine) or x / div (vLLM); the two
 * factors as floats, not the struct (passed in a register pair, it was built through a store and a
 * wider reload that could not forward: a stall per piece) */
TD_CLONES static void scale_piece(float *buf, const float *x, size_t n, float mul, float div)
{
    if (mul != 0.0f) {
        #pragma omp simd
        for (size_t c = 0; c < n; c++) buf[c] = x[c] * mul;
    } else {
        #pragma omp simd
        for (size_t c = 0; c < n; c++) buf[c] = x[c] / div;
    }
}

/* y = v * scale, element by element (the dequantisation's one rounding) */
TD_CLONES static void times_scale(float *y, const float *v, size_t n, float sc)
{
    #pragma omp simd
    for (size_t k = 0; k < n; k++) y[k] = v[k] * sc;
}

/* 1 when td_fp8_fake_quant's pieces take the one-pass vector row (formats_f16c.c): AVX-512's,
 * or its 8-lane form on AVX2 */
static int fused_fake_quant(td_format f)
{
#if TD_HAVE_F16C_PATH
    return (f == TD_E4M3 || f == TD_E5M2) && td_formats_have_vector_f16() && td_isa_level() >= TD_ISA_AVX2;
#else
    (void)f;
    return 0;
#endif
}

#if TD_HAVE_F16C_PATH
/* a block's piece through the one-pass row of the widest vectors the CPU has */
static void fake_quant_piece(const td_fp8_scheme *s, const float *x, float *y, size_t n, float mul,
                             float div, float scale)
{
    int e5m2 = s->fmt == TD_E5M2, sat = s->sat == TD_SATFINITE;
    if (td_isa_level() >= TD_ISA_AVX512) td_fp8_fake_quant_row_avx512(e5m2, x, y, n, sat, mul, div, scale);
    else                                 td_fp8_fake_quant_row_avx2(e5m2, x, y, n, sat, mul, div, scale);
}
#endif

/* Visits each block: computes its amax and scale, then scales the block's row pieces into a
 * buffer and either encodes them into codes (codes, scales) or, for td_fp8_fake_quant (y), rounds
 * them to the format and back (td_round_row: decode(encode(v)), the table's value) and multiplies
 * by the block's scale (the dequantisation's one rounding): the values quantize + dequantize
 * give, without the codes; on AVX-512 those three steps are one pass over the piece. In place
 * (y == x) allowed: a block's amax is read before any of it is written. */
static void quant_blocks(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols,
                         uint8_t *codes, float *scales, float *y)
{
    size_t br, bc;
    td_fp8_block_shape(s, rows, cols, &br, &bc);
    size_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
    int fused = y && fused_fake_quant(s->fmt);
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
    for (size_t bi = 0; bi < nbr * nbc; bi++) {
        size_t r0 = (bi / nbc) * br, c0 = (bi % nbc) * bc;
        size_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
        block_scale b = block_scale_from_amax(s, block_amax(x, cols, r0, r1, c0, c1));
        if (scales) scales[bi] = b.scale;
#if TD_HAVE_F16C_PATH
        if (fused) {
            for (size_t r = r0; r < r1; r++)
                fake_quant_piece(s, x + r * cols + c0, y + r * cols + c0, c1 - c0, b.mul, b.div, b.scale);
            continue;
        }
#endif
        float buf[256];
        for (size_t r = r0; r < r1; r++)
            for (size_t p0 = c0; p0 < c1; p0 += 256) {
                size_t n = c1 - p0 < 256 ? c1 - p0 : 256;
                scale_piece(buf, x + r * cols + p0, n, b.mul, b.div);
                if (!y) {
                    td_encode_row(s->fmt, buf, codes + r * cols + p0, n, s->sat);
                    continue;
                }
                td_round_row(s->fmt, buf, buf, n, s->sat);
                times_scale(y + r * cols + p0, buf, n, b.scale);
            }
    }
}

/* td_fp8_fake_quant of x^T, transposed back: y (rows, cols) = fake_quant(x^T)^T, blocks over x^T's
 * shape (cols, rows), with no transpose. Taken for blocks of one row of x^T (1 x g groups, MX, per
 * row), each block g consecutive rows of one column of x: the FP8 wgrad's operands, grouped along
 * the tokens, which the wgrad then multiplies as A^T B; 0 otherwise (y untouched; the caller
 * transposes, then calls td_fp8_fake_quant). Per band of a block's rows and chunk of columns:
 * each column's amax as a running maximum down the band's rows (max(|v|, m): a NaN leaves m, as in
 * block_amax), the columns' block scales (block_scale_from_amax), then each row's piece rounded
 * with its columns' factors and scales (td_fp8_fake_quant_row_each_avx2: per element the
 * operations of the block rows'), so every value has td_fp8_fake_quant's bits; rows are read
 * whole and in order, twice (the transposing form before it read 8 floats of every row per
 * strip, a cache miss a quarter of its time). y may be x. */
#if TD_HAVE_F16C_PATH
enum { COLS_CHUNK = 512 };

TD_CLONES static void col_amax(const float *x, size_t ld, size_t n, size_t w, float *m)
{
    for (size_t j = 0; j < w; j++) m[j] = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float *p = x + i * ld;
        #pragma omp simd
        for (size_t j = 0; j < w; j++) {
            float v = fabsf(p[j]);
            m[j] = v > m[j] ? v : m[j];
        }
    }
}
#endif

int td_fp8_fake_quant_cols(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols, float *y)
{
#if TD_HAVE_F16C_PATH
    size_t br, bc;
    td_fp8_block_shape(s, cols, rows, &br, &bc);   /* x^T's blocks: (cols, rows) */
    if (!fused_fake_quant(s->fmt) || br != 1) return 0;
    int e5m2 = s->fmt == TD_E5M2, sat = s->sat == TD_SATFINITE;
    /* the scheme's arm of block_scale_from_amax: x / div (mul 0) or x * mul, whatever the amax */
    int by_div = block_scale_from_amax(s, 1.0f).mul == 0.0f;
    size_t bands = (rows + bc - 1) / bc, chunks = (cols + COLS_CHUNK - 1) / COLS_CHUNK;
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
    for (size_t t = 0; t < bands * chunks; t++) {
        size_t i0 = t / chunks * bc, j0 = t % chunks * COLS_CHUNK;
        size_t n = rows - i0 < bc ? rows - i0 : bc, w = cols - j0 < COLS_CHUNK ? cols - j0 : COLS_CHUNK;
        float f[COLS_CHUNK], sc[COLS_CHUNK];   /* each column's factor (mul, or div) and scale */
        col_amax(x + i0 * cols + j0, cols, n, w, f);
        for (size_t j = 0; j < w; j++) {
            block_scale b = block_scale_from_amax(s, f[j]);
            f[j] = by_div ? b.div : b.mul;
            sc[j] = b.scale;
        }
        for (size_t i = i0; i < i0 + n; i++)
            td_fp8_fake_quant_row_each_avx2(e5m2, x + i * cols + j0, y + i * cols + j0, w, sat, by_div, f, sc);
    }
    return 1;
#else
    (void)s; (void)x; (void)rows; (void)cols; (void)y;
    return 0;
#endif
}

void td_fp8_quantize(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols,
                     uint8_t *codes, float *scales)
{
    quant_blocks(s, x, rows, cols, codes, scales, NULL);
}

void td_fp8_dequantize(const td_fp8_scheme *s, const uint8_t *codes, const float *scales,
                       size_t rows, size_t cols, float *y)
{
    size_t br, bc;
    td_fp8_block_shape(s, rows, cols, &br, &bc);
    size_t nbc = (cols + bc - 1) / bc;
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 16))
    for (size_t r = 0; r < rows; r++) {
        const float *srow = scales + (r / br) * nbc;
        for (size_t c0 = 0, b = 0; c0 < cols; c0 += bc, b++)   /* block by block: one scale */
            td_fp8_decode_scaled_row(s->fmt, codes + r * cols + c0, srow[b], y + r * cols + c0,
                                     c0 + bc < cols ? bc : cols - c0);
    }
}

void td_fp8_fake_quant(const td_fp8_scheme *s, const float *x, size_t rows, size_t cols, float *y)
{
    quant_blocks(s, x, rows, cols, NULL, NULL, y);
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
