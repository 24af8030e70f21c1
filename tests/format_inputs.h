/* Test inputs for the number formats, shared by the C tests and the NVIDIA reference tests:
 * special values, random fp32 bit patterns (every exponent, NaN and Inf included), and the
 * rounding ties of a format with their fp32 neighbours (where round-to-nearest-even decides).
 * Header-only so the nvcc-compiled tests can use it too. */
#ifndef TIDAL_TEST_FORMAT_INPUTS_H
#define TIDAL_TEST_FORMAT_INPUTS_H

#include "tidal/formats.h"
#include "tidal/rng.h"

#include <math.h>
#include <string.h>

static inline float ti_bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static inline uint32_t ti_f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

static const uint32_t TI_SPECIAL_BITS[] = {
    0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
    0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FA00000u,            /* NaNs, quiet and signalling */
    0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00800000u, 0x00400000u, /* fp32 subnormals, min normal */
    0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u, 0xBF800000u,
};

/* Values of interest for the narrow formats: thresholds and neighbours. */
static const float TI_SPECIAL_VALUES[] = {
    448.0f, 464.0f, 463.99997f, 464.00003f, 480.0f, 500.0f, -464.0f, -470.0f,
    57344.0f, 61440.0f, 61439.996f, 61440.004f, 65504.0f, 65519.996f, 65520.0f, 65536.0f,
    6.103515625e-05f, 5.9604644775390625e-08f, 2.98023224e-08f, 2.98023259e-08f,
    0.001953125f, 0.0009765625f, 0.00097656256f, 0.015625f,
    1.52587890625e-05f, 7.62939453125e-06f, 3.38953139e38f, 3.3961e38f,
    1e-10f, -1e-10f, 1e-40f, 5.87747175e-39f, 1.5f, 3.0f, 0.1f, -0.1f,
};

#define TI_N_SPECIAL (sizeof TI_SPECIAL_BITS / 4 + sizeof TI_SPECIAL_VALUES / 4)

static inline float ti_special(size_t i)
{
    size_t nb = sizeof TI_SPECIAL_BITS / 4;
    return i < nb ? ti_bits_f32(TI_SPECIAL_BITS[i]) : TI_SPECIAL_VALUES[i - nb];
}

/* The i-th input of a random-bits stream: uniform over all 2^32 fp32 patterns. */
static inline float ti_random_bits(uint64_t seed, uint64_t i)
{
    td_rng r;
    td_rng_stream(&r, seed, i);
    return ti_bits_f32(td_rng_u32(&r));
}

/* The i-th tie input of format f (not e8m0): the exact midpoint between two adjacent codes
 * (the last one lies between max finite and the next grid point: the overflow threshold),
 * or its fp32 neighbour below (i%3 == 1) or above (i%3 == 2), with a random sign. */
static inline float ti_tie(td_format f, uint64_t seed, uint64_t i)
{
    const td_format_traits *t = td_format_info(f);
    td_rng r;
    td_rng_stream(&r, seed, i / 3);
    uint32_t code = (uint32_t)td_rng_below(&r, t->max_code + 1);  /* magnitude code */
    int neg = (int)(td_rng_next(&r) & 1);
    double v = (double)td_decode_ref(f, code);
    int e;
    frexp(v == 0.0 ? (double)t->min_normal : v, &e);
    int binade = e - 1, emin = 1 - t->bias;
    if (binade < emin) binade = emin;
    double mid = v + ldexp(1.0, binade - t->man_bits - 1);
    float m = (float)mid;               /* exact: midpoints have at most man_bits+2 bits */
    if (i % 3 == 1) m = nextafterf(m, 0.0f);
    if (i % 3 == 2) m = nextafterf(m, INFINITY);
    return neg ? -m : m;
}

/* Inputs around powers of two for e8m0: 2^k and its fp32 neighbours. */
static inline float ti_pow2_neighbour(uint64_t seed, uint64_t i)
{
    td_rng r;
    td_rng_stream(&r, seed, i / 3);
    int k = (int)td_rng_below(&r, 278) - 149;           /* 2^-149 .. 2^128 */
    float p = k == 128 ? INFINITY : ldexpf(1.0f, k);
    if (i % 3 == 1) p = nextafterf(p, 0.0f);
    if (i % 3 == 2) p = nextafterf(p, INFINITY);
    return p;
}

#endif
