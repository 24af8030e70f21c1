/* tidal — the first largest element of a row, as the sequential scan
 *     best = 0;  for v in 1..n-1: if (x[v] > x[best]) best = v;
 * defines it: a NaN in x[0] keeps 0 (nothing compares greater than it), later NaNs are never
 * taken, ties (+0 and -0 included) keep the first. The scan carries x[best] from one element to
 * the next, a load and compare per element in one dependent chain: 4 % of a bf16 training step
 * (the trainer's top-1 per row of 4096-32768 log-probs). For rows whose x[0] is not NaN the same
 * index is the first v with x[v] == m, m the largest non-NaN value (a total order there, -0 and
 * +0 equal): on AVX-512 one pass keeps 16 lane maxima (a lane takes x only when x > it, so NaNs
 * stay out), a second finds the first equal element. */
#include "tidal/formats.h"
#include "tidal/isa.h"

#include <math.h>

size_t td_argmax_first_scalar(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t v = 1; v < n; v++) best = x[v] > x[best] ? v : best;
    return best;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static size_t argmax_avx512(const float *x, size_t n)
{
    __m512 m = _mm512_set1_ps(x[0]);
    size_t v = 0;
    for (; v + 16 <= n; v += 16) {
        __m512 a = _mm512_loadu_ps(x + v);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(a, m, _CMP_GT_OQ), a);
    }
    if (v < n) {
        __mmask16 k = (__mmask16)((1u << (n - v)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(k, x + v);
        m = _mm512_mask_mov_ps(m, _mm512_mask_cmp_ps_mask(k, a, m, _CMP_GT_OQ), a);
    }
    float lane[16], mx = x[0];
    _mm512_storeu_ps(lane, m);
    for (int i = 0; i < 16; i++) mx = lane[i] > mx ? lane[i] : mx;
    __m512 mv = _mm512_set1_ps(mx);
    for (v = 0; v + 16 <= n; v += 16) {
        __mmask16 e = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + v), mv, _CMP_EQ_OQ);
        if (e) return v + (size_t)__builtin_ctz(e);
    }
    for (; v < n; v++)
        if (x[v] == mx) return v;
    return 0;   /* not reached: mx is one of x */
}
#endif

size_t td_argmax_first(const float *x, size_t n)
{
    if (n == 0 || isnan(x[0])) return 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (n >= 32 && td_isa_level() >= TD_ISA_AVX512) return argmax_avx512(x, n);
#endif
    return td_argmax_first_scalar(x, n);
}
