/* tidal — cudasim: the CUDA-only math and bit intrinsics, on the host (included by cudasim.h).
 *
 * The C math functions (expf, logf, sqrtf, erff, sincosf, exp10f, ...) are glibc's, as is.
 * The _rn intrinsics are the IEEE operations they name (round to nearest even, no contraction:
 * g++ -std=c++20 does not fuse a*b+c). The fast intrinsics follow the hardware's recipe where it
 * sets the error: __expf(x) is ex2(x * log2 e) and __logf(x) is lg2(x) * ln 2, so the rounding of
 * the scaling step is the GPU's; the ex2 / lg2 / sin / cos cores are glibc's correctly rounded
 * ones, whereas the GPU's MUFU approximations are off by up to 2 ulp (and flush subnormals): a
 * kernel result that depends on those last bits is not reproduced. glibc's math.h already declares
 * __expf, __logf, __sinf, ... (its internal aliases), hence the cudasim_ names behind macros. */
#ifndef TIDAL_CUDASIM_MATH_H
#define TIDAL_CUDASIM_MATH_H

#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

/* ---- bit casts ---- */
template <class To, class From> static inline To cudasim_bits(From v)
{
    static_assert(sizeof(To) == sizeof(From), "bit cast between different sizes");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
static inline unsigned int __float_as_uint(float x) { return cudasim_bits<unsigned int>(x); }
static inline float __uint_as_float(unsigned int u) { return cudasim_bits<float>(u); }
static inline int __float_as_int(float x) { return cudasim_bits<int>(x); }
static inline float __int_as_float(int i) { return cudasim_bits<float>(i); }
static inline long long __double_as_longlong(double x) { return cudasim_bits<long long>(x); }
static inline double __longlong_as_double(long long i) { return cudasim_bits<double>(i); }

/* ---- IEEE operations with a named rounding (round to nearest even) ---- */
/* A GPU's fp32 arithmetic gives the canonical NaN 0x7fffffff where the host's keeps an operand's
 * payload (seen on an H200, 2026-11-29: test_prepare_sim's NaN x 0.37): so do these. */
static inline float cudasim_fnan(float r) { return r != r ? __uint_as_float(0x7fffffffu) : r; }
static inline float __fadd_rn(float a, float b) { return cudasim_fnan(a + b); }
static inline float __fsub_rn(float a, float b) { return cudasim_fnan(a - b); }
static inline float __fmul_rn(float a, float b) { return cudasim_fnan(a * b); }
static inline float __fdiv_rn(float a, float b) { return cudasim_fnan(a / b); }
static inline float __fmaf_rn(float a, float b, float c) { return cudasim_fnan(fmaf(a, b, c)); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; } /* NaN -> 0 */

/* ---- fast intrinsics (see the header comment) ---- */
static inline float cudasim_expf(float x) { return exp2f(x * 1.44269504088896341f); }
static inline float cudasim_logf(float x) { return log2f(x) * 0.693147180559945309f; }
static inline float cudasim_log2f(float x) { return log2f(x); }
static inline float cudasim_log10f(float x) { return log2f(x) * 0.301029995663981195f; }
static inline float cudasim_exp10f(float x) { return exp2f(x * 3.32192809488736234f); }
static inline float cudasim_powf(float x, float y) { return exp2f(y * log2f(x)); }
static inline float cudasim_sinf(float x) { return sinf(x); }
static inline float cudasim_cosf(float x) { return cosf(x); }
static inline float cudasim_tanf(float x) { return sinf(x) / cosf(x); }
static inline void cudasim_sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
#define __expf cudasim_expf
#define __logf cudasim_logf
#define __log2f cudasim_log2f
#define __log10f cudasim_log10f
#define __exp10f cudasim_exp10f
#define __powf cudasim_powf
#define __sinf cudasim_sinf
#define __cosf cudasim_cosf
#define __tanf cudasim_tanf
#define __sincosf cudasim_sincosf
static inline float __fdividef(float a, float b) { return a * (1.0f / b); }
static inline float fdividef(float a, float b) { return a / b; }

/* ---- conversions: CUDA saturates out-of-range values and maps NaN to 0 ---- */
static inline int cudasim_f2i(float r)
{
    if (r != r) return 0;
    if (r >= 2147483648.0f) return INT_MAX;
    if (r < -2147483648.0f) return INT_MIN;
    return (int)r;
}
static inline unsigned cudasim_f2u(float r)
{
    if (r != r || r <= 0.0f) return 0;
    if (r >= 4294967296.0f) return UINT_MAX;
    return (unsigned)r;
}
static inline int __float2int_rn(float x) { return cudasim_f2i(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return cudasim_f2i(truncf(x)); }
static inline int __float2int_rd(float x) { return cudasim_f2i(floorf(x)); }
static inline int __float2int_ru(float x) { return cudasim_f2i(ceilf(x)); }
static inline unsigned __float2uint_rn(float x) { return cudasim_f2u(nearbyintf(x)); }
static inline unsigned __float2uint_rz(float x) { return cudasim_f2u(truncf(x)); }
static inline float __int2float_rn(int i) { return (float)i; }
static inline float __uint2float_rn(unsigned u) { return (float)u; }

/* ---- integer bit intrinsics ---- */
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }

/* ---- min / max as CUDA overloads them (float and double: fminf/fmaxf, NaN-ignoring) ---- */
template <class A, class B>
    requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
static inline std::common_type_t<A, B> max(A a, B b)
{
    typedef std::common_type_t<A, B> T;
    if constexpr (std::is_floating_point_v<T>) return fmax((T)a, (T)b);
    else return (T)a > (T)b ? (T)a : (T)b;
}
template <class A, class B>
    requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B>
static inline std::common_type_t<A, B> min(A a, B b)
{
    typedef std::common_type_t<A, B> T;
    if constexpr (std::is_floating_point_v<T>) return fmin((T)a, (T)b);
    else return (T)a < (T)b ? (T)a : (T)b;
}
static inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static inline long long llmax(long long a, long long b) { return a > b ? a : b; }
static inline long long llmin(long long a, long long b) { return a < b ? a : b; }

#endif
