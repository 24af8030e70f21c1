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
#include "../../numerics/expf_tab.h"

static __constant__ const uint64_t tdc_expf_t[32] = TD_EXPF_TAB_INIT;

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
