/* tidal — the bit arithmetic of the narrow IEEE-like formats (fp16, e4m3, e5m2), written once for
 * the CPU (formats.c, whose fast forms are checked against the reference forms and NVIDIA's host
 * conversions) and the GPU (src/backend/cuda/round.cuh: compiled by nvcc these are __host__
 * __device__), so a kernel's rounding is the CPU's by construction. `static inline` with
 * constant format arguments folds each use into straight-line code.
 *   M      mantissa bits          BIAS  exponent bias
 *   SIGN   sign bit of the code   MAXC  largest finite magnitude code    NANC  the NaN code
 *   OVF    code for overflow without saturation (Inf, or NaN for e4m3), signed
 * Subnormals need IEEE fp32 adds with denormals (no flush-to-zero, no fast-math). */
#ifndef TIDAL_NUMERICS_NARROW_H
#define TIDAL_NUMERICS_NARROW_H

#include <stdint.h>

#ifdef __CUDACC__
#define TD_NARROW_FN __host__ __device__ static inline
#else
#define TD_NARROW_FN static inline
#endif

TD_NARROW_FN uint32_t td_narrow_bits(float x) { union { float f; uint32_t u; } v; v.f = x; return v.u; }
TD_NARROW_FN float td_narrow_float(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }

/* the code of the fp32 pattern u */
TD_NARROW_FN uint32_t td_narrow_encode(uint32_t u, int M, int BIAS, uint32_t SIGN, uint32_t MAXC,
                                       uint32_t NANC, uint32_t OVF, int saturate)
{
    uint32_t sign = (u >> 31) ? SIGN : 0;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return NANC;
    if (a == 0x7F800000u) return sign | (saturate ? MAXC : OVF);
    const int shift = 23 - M;
    const uint32_t min_normal = (uint32_t)(128 - BIAS) << 23;  /* fp32 bits of 2^(1-BIAS) */
    uint32_t code;
    if (a >= min_normal) {
        a += ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);  /* round to nearest even */
        code = (a - ((uint32_t)(127 - BIAS) << 23)) >> shift;   /* rebias exponent */
    } else {
        /* subnormal range: adding 2^(1-BIAS-M+23) makes the fp32 unit in the last place equal
         * the format's subnormal quantum 2^(1-BIAS-M), so the FPU rounds (nearest even) for us */
        const float magic = td_narrow_float((uint32_t)(1 - BIAS - M + 23 + 127) << 23);
        code = td_narrow_bits(td_narrow_float(a) + magic) - td_narrow_bits(magic);
    }
    if (code > MAXC) return sign | (saturate ? MAXC : OVF);
    return sign | code;
}

/* Decoding: normal and subnormal codes are converted by placing the fields into an fp32 and
 * multiplying by 2^(127-BIAS) (exact). */
TD_NARROW_FN float td_narrow_decode(uint32_t code, int BITS, int M, int BIAS, int HAS_INF)
{
    uint32_t sign = (code >> (BITS - 1)) & 1u;
    uint32_t mag = code & ((1u << (BITS - 1)) - 1u);
    uint32_t exp_all = ((1u << (BITS - 1 - M)) - 1u) << M;
    if (HAS_INF) {
        if ((mag & exp_all) == exp_all)
            return mag == exp_all ? td_narrow_float((sign << 31) | 0x7F800000u) : td_narrow_float(0x7FFFFFFFu);
    } else if (mag == ((1u << (BITS - 1)) - 1u)) {
        return td_narrow_float(0x7FFFFFFFu);
    }
    /* mag << (23 - M) puts the fields where fp32 keeps them; as an fp32 that value is
     * 2^(BIAS-127) times the true one, for normals and subnormals alike. */
    float v = td_narrow_float(mag << (23 - M)) * td_narrow_float((uint32_t)(254 - BIAS) << 23);
    return sign ? -v : v;
}

#endif
