/* Reference forms of the number formats: written from the definition of each format
 * (sign, exponent field, mantissa field, bias) with exact double arithmetic, slow and
 * obvious. Every fast form in formats.c is tested bit for bit against these, and these are
 * tested against NVIDIA's host conversions (tests/nv/test_nv_formats.cu).
 *
 * The one rule for every format: take |x| exactly (fp32 -> double is exact), find its binade
 * 2^e (clamped below at the format's smallest normal exponent, which makes the subnormal
 * range share the quantum of the first binade), divide by the quantum 2^(e - M), round that
 * integer to nearest-even, multiply back. What remains per format is only what it does at
 * the top end (Inf, NaN or saturation) and which NaN code it emits.
 */
#include "tidal/formats.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Value of |x| rounded to nearest-even on the grid of a format with M mantissa bits and
 * smallest normal exponent emin, ignoring overflow. */
static double round_to_grid(double a, int man_bits, int emin)
{
    if (a == 0.0) return 0.0;
    int e;
    frexp(a, &e);                      /* a = f * 2^e, f in [0.5, 1): binade is 2^(e-1) */
    int binade = e - 1;
    if (binade < emin) binade = emin;  /* subnormals share the first binade's quantum */
    double quantum = ldexp(1.0, binade - man_bits);
    double n = a / quantum;            /* exact: a power-of-two division of a 24-bit value */
    double r = nearbyint(n);           /* default rounding mode: to nearest, ties to even */
    return r * quantum;
}

/* Bit pattern of a finite, already representable magnitude v (>= 0) in the format. */
static uint32_t pack(double v, int man_bits, int bias, int emin)
{
    if (v == 0.0) return 0;
    int e;
    frexp(v, &e);
    int binade = e - 1;
    if (binade < emin)                 /* subnormal: exponent field 0 */
        return (uint32_t)(v / ldexp(1.0, emin - man_bits));
    uint32_t mant = (uint32_t)(v / ldexp(1.0, binade - man_bits)) - (1u << man_bits);
    return ((uint32_t)(binade + bias) << man_bits) | mant;
}

uint32_t td_encode_ref(td_format f, float x, td_saturation sat)
{
    const td_format_traits *t = td_format_info(f);
    if (f == TD_F32) return f32_bits(x);
    if (f == TD_E8M0) return td_encode_e8m0_ref(x, sat, TD_ROUND_UP);
    uint32_t sign_bit = 1u << (t->storage_bits - 1);
    if (isnan(x)) return t->nan_code;
    uint32_t sign = signbit(x) ? sign_bit : 0;
    double a = fabs((double)x);
    int emin = 1 - t->bias;
    /* bf16 and fp16 conversions have no saturating form: overflow is Inf */
    bool saturate = (sat == TD_SATFINITE) && (f == TD_E4M3 || f == TD_E5M2);
    uint32_t inf_code = t->has_inf ? ((uint32_t)((1u << t->exp_bits) - 1) << t->man_bits) : 0;

    if (isinf(a) || round_to_grid(a, t->man_bits, emin) > t->max_finite) {
        if (saturate) return sign | t->max_code;
        if (t->has_inf) return sign | inf_code;
        return sign | t->nan_code;     /* e4m3 NOSAT: a NaN that keeps the sign (0xFF below) */
    }
    double v = round_to_grid(a, t->man_bits, emin);
    return sign | pack(v, t->man_bits, t->bias, emin);
}

uint32_t td_encode_e8m0_ref(float x, td_saturation sat, td_scale_rounding rnd)
{
    if (isnan(x)) return 0xFF;
    double a = fabs((double)x);
    if (isinf(a)) return sat == TD_SATFINITE ? 0xFE : 0xFF;
    if (a == 0.0) return 0;            /* below 2^-127: clipped to the smallest scale */
    int e;
    double f = frexp(a, &e);           /* a = f * 2^e */
    int p = e - 1;                     /* 2^p <= a < 2^(p+1) */
    if (rnd == TD_ROUND_UP && f != 0.5) p += 1;
    if (p < -127) p = -127;
    if (p > 127) return sat == TD_SATFINITE ? 0xFE : 0xFF;
    return (uint32_t)(p + 127);
}

float td_decode_ref(td_format f, uint32_t code)
{
    const td_format_traits *t = td_format_info(f);
    switch (f) {
    case TD_F32:  return bits_f32(code);
    case TD_BF16: return bits_f32(code << 16);   /* bf16 is the top half of an fp32 */
    case TD_E8M0:
        if (code == 0xFF) return bits_f32(0x7FFF0000u);
        return (float)ldexp(1.0, (int)code - 127);
    default: break;
    }
    uint32_t sign = (code >> (t->storage_bits - 1)) & 1;
    uint32_t exp_field = (code >> t->man_bits) & ((1u << t->exp_bits) - 1);
    uint32_t mant = code & ((1u << t->man_bits) - 1);
    uint32_t exp_max = (1u << t->exp_bits) - 1;
    double v;
    if (t->has_inf && exp_field == exp_max) {
        if (mant != 0) return bits_f32(0x7FFFFFFFu);   /* NVIDIA's canonical fp32 NaN */
        v = INFINITY;
    } else if (!t->has_inf && (code & ~(1u << (t->storage_bits - 1))) == t->nan_code) {
        return bits_f32(0x7FFFFFFFu);                  /* e4m3: S.1111.111 */
    } else if (exp_field == 0) {
        v = ldexp((double)mant, 1 - t->bias - t->man_bits);
    } else {
        v = ldexp((double)(mant | (1u << t->man_bits)), (int)exp_field - t->bias - t->man_bits);
    }
    return (float)(sign ? -v : v);
}
