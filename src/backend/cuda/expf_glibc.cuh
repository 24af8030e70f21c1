/* tidal — glibc's expf on the device, bit for bit (included by the .cu files whose CPU op calls
 * expf itself and must be matched exactly: moe.cu, moe_backward.cu, the shared expert's gate).
 *
 * glibc 2.28 and later computes expf(x) for |x| < ~88 in double from a 32-entry table of 2^(i/32)
 * and a cubic; its __expf_fma (what x86 CPUs with FMA run) rounds once per step: the steps are
 * src/numerics/expf_row.c's (which checks them against the running C library):
 *   kd = fma(32/ln2, x, 0x1.8p52)       k = round(32 x / ln2) in kd's low bits
 *   r  = fma(32/ln2, x, -(kd - 0x1.8p52))
 *   s  = double(T[k mod 32] + (k << 47))   2^(k/32)
 *   y  = fma(fma(C0, r, C1), r*r, fma(r, C2, 1)) * s,  rounded to float
 * and outside that range glibc's own answers (|x| >= 88 still takes the main steps up to the
 * overflow and underflow thresholds). kern.cuh's tdc_expf, a double exp rounded to float, differs
 * from it in the last bit for ~1e-4 of inputs; this one has the CPU's bits wherever the C library
 * is that glibc (tests/cudasim/test_moe_sim.cpp checks 2^20 inputs against the host's expf). fma()
 * and lone products and sums: nothing for nvcc to contract. */
#ifndef TIDAL_CUDA_EXPF_GLIBC_CUH
#define TIDAL_CUDA_EXPF_GLIBC_CUH

#include "kern.cuh"

static __constant__ const uint64_t tdc_expf_t[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

TDC_DEV double tdc_u2d(uint64_t u) { union { double d; uint64_t u; } v; v.u = u; return v.d; }
TDC_DEV uint64_t tdc_d2u(double d) { union { double d; uint64_t u; } v; v.d = d; return v.u; }

TDC_DEV float tdc_expf_glibc(float x)
{
    uint32_t top = (tdc_bits(x) >> 20) & 0x7ff;
    if (top >= 0x42b) {   /* |x| >= 88, Inf or NaN */
        if (tdc_bits(x) == 0xff800000u) return 0.0f;   /* -Inf */
        if (top >= 0x7f8) return x + x;                 /* +Inf, NaN */
        if (x > 0x1.62e42ep6f) return INFINITY;         /* above log(2^128) */
        if (x < -0x1.9fe368p6f) return 0.0f;            /* below log(2^-150) */
    }
    const double inv = tdc_u2d(0x40471547652b82feull), shift = tdc_u2d(0x4338000000000000ull);
    double xd = (double)x;
    double kd = fma(inv, xd, shift);
    uint64_t ki = tdc_d2u(kd);
    kd = kd - shift;
    double r = fma(inv, xd, -kd);
    double s = tdc_u2d(tdc_expf_t[ki & 31] + (ki << 47));
    double z = fma(tdc_u2d(0x3ebc6af84b912394ull), r, tdc_u2d(0x3f2ebfce50fac4f3ull));
    double r2 = r * r;
    double y = fma(r, tdc_u2d(0x3f962e42ff0c52d6ull), 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

#endif
