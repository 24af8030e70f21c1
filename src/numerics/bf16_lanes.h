/* tidal — the bf16 rounding of 16 fp32 lanes (round to nearest even on the bits, NaN as the
 * scalar encoder: 0x7FFF), shared by the format rows (formats_f16c.c) and the backward's
 * transposed codes (src/backend/cpu_backward.c). Internal to src; x86 only. */
#ifndef TIDAL_NUMERICS_BF16_LANES_H
#define TIDAL_NUMERICS_BF16_LANES_H

#include <immintrin.h>

/* the rounded values' bits: codes in the high halves, low halves zero, NaN -> 0x7FFF0000 */
__attribute__((target("avx512f"), always_inline)) static inline __m512i td_bf16_hi16(__m512i u)
{
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
                                 _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FFF0000));
}

#endif
