/* Fast forms of the number formats: bit manipulation on the fp32 pattern, scalar and row.
 * Semantics: see include/tidal/formats.h. Each function here is tested bit for bit against
 * the reference forms (formats_ref.c) and against NVIDIA's host conversions.
 */
#include "tidal/formats.h"
#include "formats_simd.h"
#include "tidal/isa.h"
#include "narrow.h"

#include <omp.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>

int td_formats_scalar_only = 0;

/* fp16 rows take the F16C forms (formats_f16c.c) where the CPU has them */
static inline int f16_vector(void) { return TD_HAVE_F16C_PATH && !td_formats_scalar_only && td_cpu_has_f16c(); }
int td_formats_have_vector_f16(void) { return f16_vector(); }

/* FP8 decodes through one 256-entry table per format, filled once from the scalar decoder */
static float FP8_LUT[2][256];   /* e4m3, e5m2 */
static pthread_once_t fp8_lut_once = PTHREAD_ONCE_INIT;
static void fp8_lut_init(void)
{
    for (uint32_t c = 0; c < 256; c++) {
        FP8_LUT[0][c] = td_narrow_decode(c, 8, 3, 7, 0);
        FP8_LUT[1][c] = td_narrow_decode(c, 8, 2, 15, 1);
    }
}

const float *td_fp8_decode_table(td_format f)
{
    if (f != TD_E4M3 && f != TD_E5M2) return NULL;
    pthread_once(&fp8_lut_once, fp8_lut_init);
    return FP8_LUT[f == TD_E5M2];
}

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static const td_format_traits TRAITS[TD_FORMAT_COUNT] = {
    /* name    alias        bits E  M  bias  sign   inf    nan     max   max_finite  min_normal  min_sub */
    [TD_F32]  = {"fp32", "float32",  32, 8, 23, 127, true,  true,  0x7FC00000u, 0x7F7FFFFFu,
                 3.40282347e38f, 1.17549435e-38f, 1.40129846e-45f},
    [TD_BF16] = {"bf16", "bfloat16", 16, 8, 7,  127, true,  true,  0x7FFF, 0x7F7F,
                 3.38953139e38f, 1.17549435e-38f, 9.18354962e-41f},
    [TD_F16]  = {"fp16", "float16",  16, 5, 10, 15,  true,  true,  0x7FFF, 0x7BFF,
                 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f},
    [TD_E4M3] = {"e4m3", "fp8-e4m3", 8,  4, 3,  7,   true,  false, 0x7F, 0x7E,
                 448.0f, 0.015625f, 0.001953125f},
    [TD_E5M2] = {"e5m2", "fp8-e5m2", 8,  5, 2,  15,  true,  true,  0x7F, 0x7B,
                 57344.0f, 6.103515625e-05f, 1.52587890625e-05f},
    [TD_E8M0] = {"e8m0", "ue8m0",    8,  8, 0,  127, false, false, 0xFF, 0xFE,
                 1.70141183e38f, 5.87747175e-39f, 5.87747175e-39f},
};

const td_format_traits *td_format_info(td_format f)
{
    if ((unsigned)f >= TD_FORMAT_COUNT) return NULL;
    return &TRAITS[f];
}

int td_format_from_name(const char *name)
{
    if (!name) return -1;
    for (int f = 0; f < TD_FORMAT_COUNT; f++)
        if (!strcasecmp(name, TRAITS[f].name) || !strcasecmp(name, TRAITS[f].alias)) return f;
    if (!strcasecmp(name, "f32") || !strcasecmp(name, "float")) return TD_F32;
    if (!strcasecmp(name, "f16") || !strcasecmp(name, "half")) return TD_F16;
    if (!strcasecmp(name, "fp8") || !strcasecmp(name, "f8_e4m3") || !strcasecmp(name, "float8_e4m3fn"))
        return TD_E4M3;
    if (!strcasecmp(name, "f8_e5m2") || !strcasecmp(name, "float8_e5m2")) return TD_E5M2;
    return -1;
}

/* ---------------------------------------------------------------- bf16 */

/* round to nearest even, NaN -> canonical, overflow carries to Inf: td_bf16_bits_rne (formats.h) */
#define bf16_encode td_bf16_bits_rne

td_bf16 td_f32_to_bf16(float x) { return (td_bf16){bf16_encode(f32_bits(x))}; }
float td_bf16_to_f32(td_bf16 h) { return bits_f32((uint32_t)h.bits << 16); }

/* ------------------------------------------------- narrow IEEE-like formats (fp16, fp8)
 * narrow.h: one generic encoder and decoder with the format's constants, shared with the GPU. */
#define narrow_encode td_narrow_encode
#define narrow_decode td_narrow_decode

#define F16_ENC(u)        narrow_encode((u), 10, 15, 0x8000u, 0x7BFFu, 0x7FFFu, 0x7C00u, 0)
#define E4M3_ENC(u, sat)  narrow_encode((u), 3, 7, 0x80u, 0x7Eu, 0x7Fu, 0x7Fu, (sat) == TD_SATFINITE)
#define E5M2_ENC(u, sat)  narrow_encode((u), 2, 15, 0x80u, 0x7Bu, 0x7Fu, 0x7Cu, (sat) == TD_SATFINITE)

td_f16 td_f32_to_f16(float x) { return (td_f16){(uint16_t)F16_ENC(f32_bits(x))}; }
float td_f16_to_f32(td_f16 h) { return narrow_decode(h.bits, 16, 10, 15, 1); }
uint8_t td_f32_to_e4m3(float x, td_saturation sat) { return (uint8_t)E4M3_ENC(f32_bits(x), sat); }
float td_e4m3_to_f32(uint8_t c) { return narrow_decode(c, 8, 3, 7, 0); }
uint8_t td_f32_to_e5m2(float x, td_saturation sat) { return (uint8_t)E5M2_ENC(f32_bits(x), sat); }
float td_e5m2_to_f32(uint8_t c) { return narrow_decode(c, 8, 2, 15, 1); }

/* ---------------------------------------------------------------- e8m0 */

uint8_t td_f32_to_e8m0(float x, td_saturation sat, td_scale_rounding rnd)
{
    uint32_t a = f32_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFF;
    if (a == 0x7F800000u) return sat == TD_SATFINITE ? 0xFE : 0xFF;
    int e = (int)(a >> 23);             /* biased exponent; 0 for zero and fp32 subnormals */
    uint32_t mant = a & 0x7FFFFFu;
    int p;                              /* result exponent, biased by 127 like fp32 */
    if (e == 0) {
        /* |x| < 2^-126: a subnormal a = mant * 2^-149 */
        if (mant == 0) return 0;
        p = (rnd == TD_ROUND_UP) ? (mant > 0x400000u ? 1 : 0) : 0;  /* 2^-127 = mant 0x400000 */
        return (uint8_t)p;
    }
    p = e;
    if (rnd == TD_ROUND_UP && mant != 0) p += 1;
    if (p > 254) return sat == TD_SATFINITE ? 0xFE : 0xFF;
    return (uint8_t)p;
}

float td_e8m0_to_f32(uint8_t c)
{
    if (c == 0xFF) return bits_f32(0x7FFF0000u);
    if (c == 0) return bits_f32(0x00400000u);   /* 2^-127, an fp32 subnormal */
    return bits_f32((uint32_t)c << 23);
}

/* ---------------------------------------------------------------- generic */

uint32_t td_encode(td_format f, float x, td_saturation sat)
{
    switch (f) {
    case TD_F32:  return f32_bits(x);
    case TD_BF16: return td_f32_to_bf16(x).bits;
    case TD_F16:  return td_f32_to_f16(x).bits;
    case TD_E4M3: return td_f32_to_e4m3(x, sat);
    case TD_E5M2: return td_f32_to_e5m2(x, sat);
    case TD_E8M0: return td_f32_to_e8m0(x, sat, TD_ROUND_UP);
    default:      return 0;
    }
}

float td_decode(td_format f, uint32_t code)
{
    switch (f) {
    case TD_F32:  return bits_f32(code);
    case TD_BF16: return td_bf16_to_f32((td_bf16){(uint16_t)code});
    case TD_F16:  return td_f16_to_f32((td_f16){(uint16_t)code});
    case TD_E4M3: return td_e4m3_to_f32((uint8_t)code);
    case TD_E5M2: return td_e5m2_to_f32((uint8_t)code);
    case TD_E8M0: return td_e8m0_to_f32((uint8_t)code);
    default:      return 0.0f;
    }
}

float td_round_slow(td_format f, float x)
{
    return td_decode(f, td_encode(f, x, TD_SATFINITE));
}

/* ---------------------------------------------------------------- rows
 * Loops over the inline encoders; the switch is hoisted out of the loop so each loop body is
 * one specialised, vectorisable kernel. */

static void encode_row_1(td_format f, const float *x, void *codes, size_t n, td_saturation sat)
{
    const uint32_t *u = (const uint32_t *)x;
    switch (f) {
    case TD_F32:  memcpy(codes, x, n * 4); break;
    case TD_BF16:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) {
            if (td_isa_level() >= TD_ISA_AVX512) td_bf16_encode_row_avx512(x, codes, n);
            else td_bf16_encode_row_avx2(x, codes, n);
            break;
        }
#endif
        { uint16_t *o = codes; for (size_t i = 0; i < n; i++) o[i] = bf16_encode(u[i]); } break;
    case TD_F16:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) { td_f16_encode_row_f16c(x, codes, n); break; }
#endif
        { uint16_t *o = codes; for (size_t i = 0; i < n; i++) o[i] = (uint16_t)F16_ENC(u[i]); } break;
    case TD_E4M3:
    case TD_E5M2:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) {
            if (td_isa_level() >= TD_ISA_AVX512) td_fp8_encode_row_avx512(f == TD_E5M2, x, codes, n, sat == TD_SATFINITE);
            else                                 td_fp8_encode_row_avx2(f == TD_E5M2, x, codes, n, sat == TD_SATFINITE);
            break;
        }
#endif
        td_fp8_encode_row_scalar(f == TD_E5M2, x, codes, n, sat == TD_SATFINITE);
        break;
    case TD_E8M0: { uint8_t *o = codes; for (size_t i = 0; i < n; i++) o[i] = td_f32_to_e8m0(x[i], sat, TD_ROUND_UP); } break;
    default: break;
    }
}

static void decode_row_1(td_format f, const void *codes, float *y, size_t n)
{
    switch (f) {
    case TD_F32:  memcpy(y, codes, n * 4); break;
    case TD_BF16: { const uint16_t *c = codes; uint32_t *o = (uint32_t *)y;
                    for (size_t i = 0; i < n; i++) o[i] = (uint32_t)c[i] << 16; } break;
    case TD_F16:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) { td_f16_decode_row_f16c(codes, y, n); break; }
#endif
        { const uint16_t *c = codes; for (size_t i = 0; i < n; i++) y[i] = narrow_decode(c[i], 16, 10, 15, 1); } break;
    case TD_E4M3:
    case TD_E5M2: {
        const uint8_t *c = codes;
        if (td_formats_scalar_only) {
            if (f == TD_E4M3) for (size_t i = 0; i < n; i++) y[i] = narrow_decode(c[i], 8, 3, 7, 0);
            else              for (size_t i = 0; i < n; i++) y[i] = narrow_decode(c[i], 8, 2, 15, 1);
        } else {
            td_fp8_decode_scaled_row(f, c, 1.0f, y, n);
        }
    } break;
    case TD_E8M0: { const uint8_t *c = codes; for (size_t i = 0; i < n; i++) y[i] = td_e8m0_to_f32(c[i]); } break;
    default: break;
    }
}

/* The scalar fp8 encoding rows: the reference, and what the vector rows (formats_f16c.c) take
 * for a block holding a NaN or a value past the format's range. */
void td_fp8_encode_row_scalar(int e5m2, const float *x, uint8_t *o, size_t n, int sat)
{
    const uint32_t *u = (const uint32_t *)x;
    if (e5m2 && sat)  for (size_t i = 0; i < n; i++) o[i] = (uint8_t)E5M2_ENC(u[i], TD_SATFINITE);
    else if (e5m2)    for (size_t i = 0; i < n; i++) o[i] = (uint8_t)E5M2_ENC(u[i], TD_NOSAT);
    else if (sat)     for (size_t i = 0; i < n; i++) o[i] = (uint8_t)E4M3_ENC(u[i], TD_SATFINITE);
    else              for (size_t i = 0; i < n; i++) o[i] = (uint8_t)E4M3_ENC(u[i], TD_NOSAT);
}

/* The scalar fp8 rounding rows: td_round_row's form without vectors, and what the vector rows
 * (formats_f16c.c) take for a block holding a NaN or a value past the format's range. */
void td_fp8_round_row_scalar(int e5m2, const float *x, float *y, size_t n, int sat)
{
    const uint32_t *u = (const uint32_t *)x;
    if (e5m2 && sat)  for (size_t i = 0; i < n; i++) y[i] = narrow_decode(E5M2_ENC(u[i], TD_SATFINITE), 8, 2, 15, 1);
    else if (e5m2)    for (size_t i = 0; i < n; i++) y[i] = narrow_decode(E5M2_ENC(u[i], TD_NOSAT), 8, 2, 15, 1);
    else if (sat)     for (size_t i = 0; i < n; i++) y[i] = narrow_decode(E4M3_ENC(u[i], TD_SATFINITE), 8, 3, 7, 0);
    else              for (size_t i = 0; i < n; i++) y[i] = narrow_decode(E4M3_ENC(u[i], TD_NOSAT), 8, 3, 7, 0);
}

static void fp8_round_row(int e5m2, const float *x, float *y, size_t n, int sat)
{
#if TD_HAVE_F16C_PATH
    if (f16_vector()) {
        if (td_isa_level() >= TD_ISA_AVX512) td_fp8_round_row_avx512(e5m2, x, y, n, sat);
        else                                 td_fp8_round_row_avx2(e5m2, x, y, n, sat);
        return;
    }
#endif
    td_fp8_round_row_scalar(e5m2, x, y, n, sat);
}

void td_fp8_decode_scaled_row(td_format f, const uint8_t *codes, float scale, float *y, size_t n)
{
    const float *lut = td_fp8_decode_table(f);
    if (!lut) return;
#if TD_HAVE_F16C_PATH
    if (f16_vector()) {
        if (td_isa_level() >= TD_ISA_AVX512) td_fp8_decode_scaled_row_avx512(f == TD_E5M2, codes, scale, lut, y, n);
        else                                 td_fp8_decode_scaled_row_f16c(f == TD_E5M2, codes, scale, lut, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) y[i] = lut[codes[i]] * scale;
}

static void round_row_1(td_format f, const float *x, float *y, size_t n, td_saturation sat)
{
    const uint32_t *u = (const uint32_t *)x;
    uint32_t *o = (uint32_t *)y;
    switch (f) {
    case TD_F32:  if (x != y) memmove(y, x, n * 4); break;
    case TD_BF16:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) {
            if (td_isa_level() >= TD_ISA_AVX512) td_bf16_round_row_avx512(x, y, n);
            else                                 td_bf16_round_row_avx2(x, y, n);
            break;
        }
#endif
        for (size_t i = 0; i < n; i++) o[i] = (uint32_t)bf16_encode(u[i]) << 16;
        break;
    case TD_F16:
#if TD_HAVE_F16C_PATH
        if (f16_vector()) {
            if (td_isa_level() >= TD_ISA_AVX512) td_f16_round_row_avx512(x, y, n);
            else                                 td_f16_round_row_f16c(x, y, n);
            break;
        }
#endif
        for (size_t i = 0; i < n; i++) y[i] = narrow_decode(F16_ENC(u[i]), 16, 10, 15, 1);
        break;
    case TD_E4M3: fp8_round_row(0, x, y, n, sat == TD_SATFINITE); break;
    case TD_E5M2: fp8_round_row(1, x, y, n, sat == TD_SATFINITE); break;
    case TD_E8M0: for (size_t i = 0; i < n; i++) y[i] = td_e8m0_to_f32(td_f32_to_e8m0(x[i], sat, TD_ROUND_UP)); break;
    default: break;
    }
}

/* ---------------------------------------------------------------- rows on the tool's threads
 * A long row (a weight being prepared: td_encode_row at load time was 30 % of loading the 0.5B
 * model for a bf16 diff, one thread) is cut into chunks that the OpenMP threads share. Each value
 * is converted on its own, so the bits do not depend on the cut or the thread count. Inside a
 * parallel region, for a short row, or for an output that overlaps the input other than exactly
 * (in place, the same element size), the row runs on the calling thread as before. */
enum { PAR_MIN = 1 << 18, PAR_CHUNK = 1 << 16 };   /* chunks of 64 Ki values, a multiple of any vector width */

static int rows_in_parallel(size_t n)
{
    return n >= PAR_MIN && !omp_in_parallel() && omp_get_max_threads() > 1;
}

static size_t code_bytes(td_format f)
{
    const td_format_traits *t = td_format_info(f);
    return t ? (size_t)t->storage_bits / 8 : 4;   /* an unknown format converts nothing */
}

/* 1 when [a, a + na) and [b, b + nb) share a byte */
static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *p = a, *q = b;
    return p < q + nb && q < p + na;
}

typedef enum { ROW_ENCODE, ROW_DECODE, ROW_ROUND } row_op;

static void row_1(row_op op, td_format f, const void *in, void *out, size_t n, td_saturation sat)
{
    if (op == ROW_ENCODE)      encode_row_1(f, in, out, n, sat);
    else if (op == ROW_DECODE) decode_row_1(f, in, out, n);
    else                       round_row_1(f, in, out, n, sat);
}

/* n values from in (in_es bytes each) to out (out_es bytes each) */
static void rows(row_op op, td_format f, const void *in, size_t in_es, void *out, size_t out_es, size_t n,
                 td_saturation sat)
{
    int in_place = in == out && in_es == out_es;   /* each chunk reads its values, then writes them */
    if (!rows_in_parallel(n) || (!in_place && overlap(in, n * in_es, out, n * out_es))) {
        row_1(op, f, in, out, n, sat);
        return;
    }
    long nch = (long)((n + PAR_CHUNK - 1) / PAR_CHUNK);
    #pragma omp parallel for schedule(static)
    for (long c = 0; c < nch; c++) {
        size_t a = (size_t)c * PAR_CHUNK, m = n - a < PAR_CHUNK ? n - a : PAR_CHUNK;
        row_1(op, f, (const char *)in + a * in_es, (char *)out + a * out_es, m, sat);
    }
}

void td_encode_row(td_format f, const float *x, void *codes, size_t n, td_saturation sat)
{
    rows(ROW_ENCODE, f, x, 4, codes, code_bytes(f), n, sat);
}

void td_decode_row(td_format f, const void *codes, float *y, size_t n)
{
    rows(ROW_DECODE, f, codes, code_bytes(f), y, 4, n, TD_SATFINITE);
}

void td_round_row(td_format f, const float *x, float *y, size_t n, td_saturation sat)
{
    rows(ROW_ROUND, f, x, 4, y, 4, n, sat);
}
