/* tidal — fp16 rows through the CPU's own conversions (F16C: vcvtps2ph, vcvtph2ps), dispatched
 * at run time by formats.c; the scalar loops there stay the reference (td_formats_scalar_only).
 *
 * Why these give NVIDIA's bits:
 *   vcvtph2ps   exact for every finite code and Inf (fp16 widens to fp32 without rounding).
 *   vcvtps2ph   with imm8 = _MM_FROUND_TO_NEAREST_INT rounds to nearest, ties to even, keeps
 *               signed zeros, produces fp16 subnormals (MXCSR.FTZ is not consulted), and rounds
 *               every |x| >= 65520 to Inf: __float2half_rn's semantics. fp32 subnormal inputs
 *               (below 2^-126, far under fp16's 2^-24 quantum) round to a signed zero either
 *               way: tidal never sets MXCSR.DAZ, and with it the result would be the same.
 *   NaN         the instructions keep a NaN's sign and (truncated) payload; NVIDIA's encode gives
 *               the one canonical 0x7FFF and its decode 0x7FFFFFFF, so NaN lanes are blended to
 *               those constants.
 * tests/nv/test_nv_formats.cu compares these rows with NVIDIA's host functions on every fp32
 * pattern (TIDAL_EXHAUSTIVE=1; reports/formats-exhaustive.md) and tests/test_formats.c with the
 * scalar rows. */
#include "formats_simd.h"
#include "tidal/isa.h"
#include "tidal/formats.h"

#if TD_HAVE_F16C_PATH
#include <immintrin.h>
#include <math.h>
#include "bf16_lanes.h"

#define TGT __attribute__((target("avx2,f16c")))

/* 8 fp32 -> 8 fp16 codes, NaN -> 0x7FFF */
TGT static inline __m128i enc8(__m256 x)
{
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extractf128_si256(nan32, 1));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7FFF), nan16);
}

/* 8 fp16 codes -> 8 fp32, NaN -> 0x7FFFFFFF */
TGT static inline __m256 dec8(__m128i h)
{
    __m256 y = _mm256_cvtph_ps(h);
    __m256 nan = _mm256_cmp_ps(y, y, _CMP_UNORD_Q);
    return _mm256_blendv_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), nan);
}

/* the last n < 8 elements go through a zero-padded block on the stack */
TGT void td_f16_encode_row_f16c(const float *x, uint16_t *codes, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(codes + i), enc8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {0};
        uint16_t out[8];
        memcpy(in, x + i, (n - i) * sizeof(float));
        _mm_storeu_si128((__m128i *)out, enc8(_mm256_loadu_ps(in)));
        memcpy(codes + i, out, (n - i) * sizeof(uint16_t));
    }
}

TGT void td_f16_decode_row_f16c(const uint16_t *codes, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, dec8(_mm_loadu_si128((const __m128i *)(codes + i))));
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        memcpy(in, codes + i, (n - i) * sizeof(uint16_t));
        _mm256_storeu_ps(out, dec8(_mm_loadu_si128((const __m128i *)in)));
        memcpy(y + i, out, (n - i) * sizeof(float));
    }
}

/* y = decode(encode(x)); in place allowed (each block is read before it is written) */
TGT void td_f16_round_row_f16c(const float *x, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, dec8(enc8(_mm256_loadu_ps(x + i))));
    if (i < n) {
        float buf[8] = {0};
        memcpy(buf, x + i, (n - i) * sizeof(float));
        _mm256_storeu_ps(buf, dec8(enc8(_mm256_loadu_ps(buf))));
        memcpy(y + i, buf, (n - i) * sizeof(float));
    }
}

/* ---- bf16 rows on AVX2 integer lanes: td_bf16_bits_rne eight at a time (NaN -> 0x7FFF; add
 * 0x7FFF plus the kept lsb, keep the high half: ties to even, overflow carries to Inf). The scalar
 * loop was the last unvectorised row on the training path (-O2 x86-64-v2 leaves it scalar). */
TGT static inline __m256i bf16_hi8(__m256i u)
{
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FFF0000), nan);   /* codes in the high halves */
}

TGT void td_bf16_round_row_avx2(const float *x, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_si256((__m256i *)(y + i), bf16_hi8(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        float buf[8] = {0};
        memcpy(buf, x + i, (n - i) * sizeof(float));
        _mm256_storeu_si256((__m256i *)buf, bf16_hi8(_mm256_loadu_si256((const __m256i *)buf)));
        memcpy(y + i, buf, (n - i) * sizeof(float));
    }
}

TGT void td_bf16_encode_row_avx2(const float *x, uint16_t *codes, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_srli_epi32(bf16_hi8(_mm256_loadu_si256((const __m256i *)(x + i))), 16);
        __m256i b = _mm256_srli_epi32(bf16_hi8(_mm256_loadu_si256((const __m256i *)(x + i + 8))), 16);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);   /* lanes back in order */
        _mm256_storeu_si256((__m256i *)(codes + i), p);
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        codes[i] = td_bf16_bits_rne(u);
    }
}

/* ---- fp8 codes widened through fp16: an e5m2 code is the high byte of the fp16 code of the same
 * value; an e4m3 code's magnitude shifted by 7 is an fp16 code of its value / 2^8 (the 4-bit
 * exponent in fp16's low exponent bits: normals and subnormals alike), so vcvtph2ps then x 256
 * gives the value exactly, and one multiplication by the block's scale rounds once, as
 * lut[code] * scale does. Blocks of 8 holding a NaN code (e4m3 S.1111.111, e5m2 S.11111.mm with
 * mm != 0) take the table, so NaN payloads are the table's. */
TGT void td_fp8_decode_scaled_row_f16c(int e5m2, const uint8_t *codes, float scale, const float *lut,
                                       float *y, size_t n)
{
    __m256 s = _mm256_set1_ps(scale), k = _mm256_set1_ps(e5m2 ? 1.0f : 256.0f);
    __m128i m7f = _mm_set1_epi16(0x7F), sign = _mm_set1_epi16(0x80);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(codes + i)));
        __m128i mag = _mm_and_si128(b, m7f), h, nan;
        if (e5m2) {
            h = _mm_slli_epi16(b, 8);
            nan = _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7C));
        } else {
            h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, sign), 8), _mm_slli_epi16(mag, 7));
            nan = _mm_cmpeq_epi16(mag, m7f);
        }
        if (!_mm_testz_si128(nan, nan)) {
            for (size_t j = i; j < i + 8; j++) y[j] = lut[codes[j]] * scale;
            continue;
        }
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), k), s));
    }
    for (; i < n; i++) y[i] = lut[codes[i]] * scale;
}

/* The same on AVX-512 (BW): 32 codes per step, the e4m3 scale's x 256 folded into the scale
 * (256 * scale is exact below FLT_MAX / 256, so (v / 256) * (256 * scale) rounds once to the
 * same value; larger or non-finite scales take the AVX2 form). */
#define TGT512 __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
/* bf16_hi8 on 16 lanes (bf16_lanes.h: the same integer arithmetic; NaN by mask); the rows
 * below mask their tails */
TGT512 void td_bf16_round_row_avx512(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 live = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_epi32(y + i, live, td_bf16_hi16(_mm512_maskz_loadu_epi32(live, x + i)));
    }
}

/* the codes: the high halves narrowed (vpmovdw); the weights' encoding at load (5 % of a bf16
 * tidal-diff run on the AVX2 row) */
TGT512 void td_bf16_encode_row_avx512(const float *x, uint16_t *codes, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 live = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512i r = _mm512_srli_epi32(td_bf16_hi16(_mm512_maskz_loadu_epi32(live, x + i)), 16);
        _mm256_mask_storeu_epi16(codes + i, live, _mm512_cvtepi32_epi16(r));
    }
}

/* td_f16_round_row_f16c on 16 lanes: the same two conversions (zmm forms of the same
 * instructions, so the same bits), NaN lanes -> 0x7FFFFFFF by mask, the tail masked */
TGT512 void td_f16_round_row_avx512(const float *x, float *y, size_t n)
{
    const __m512 qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 live = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, x + i);
        __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(y + i, live, _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), qnan));
    }
}

TGT512 void td_fp8_decode_scaled_row_avx512(int e5m2, const uint8_t *codes, float scale, const float *lut,
                                            float *y, size_t n)
{
    if (!e5m2 && !(fabsf(scale) <= 0x1p+119f)) {
        td_fp8_decode_scaled_row_f16c(e5m2, codes, scale, lut, y, n);
        return;
    }
    __m512 s = _mm512_set1_ps(e5m2 ? scale : scale * 256.0f);
    __m512i m7f = _mm512_set1_epi16(0x7F), m3fff = _mm512_set1_epi16(0x3FFF), m8000 = _mm512_set1_epi16((short)0x8000);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(codes + i))), h;
        if (e5m2) {
            if (_mm512_cmpgt_epi16_mask(_mm512_and_si512(b, m7f), _mm512_set1_epi16(0x7C))) goto table;
            h = _mm512_slli_epi16(b, 8);
        } else {
            if (_mm512_cmpeq_epi16_mask(_mm512_and_si512(b, m7f), m7f)) goto table;
            /* bits 0-13 from b << 7 (the 7-bit magnitude at 7-13), bit 15 from b << 8 (the sign) */
            h = _mm512_ternarylogic_epi32(m3fff, _mm512_slli_epi16(b, 7),
                                          _mm512_and_si512(_mm512_slli_epi16(b, 8), m8000), 0xCA);
        }
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), s));
        _mm512_storeu_ps(y + i + 16, _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), s));
        continue;
    table:
        for (size_t j = i; j < i + 32; j++) y[j] = lut[codes[j]] * scale;
    }
    if (i < n) td_fp8_decode_scaled_row_f16c(e5m2, codes + i, scale, lut, y + i, n - i);
}

/* ---- fp8 rounding (y = decode(encode(x)), e4m3 / e5m2) in the value domain: |x| rounded to the
 * format's quantum at its binade by adding and subtracting C = 1.5 * 2^(e + 23 - M), e the
 * binade's exponent clamped below to the smallest normal's (the subnormals' fixed quantum) and
 * above to one past the largest finite binade: the fp32 addition rounds to nearest even at
 * exactly the format's quantum (narrow.h's integer rounding and its subnormal magic number, in
 * one), the subtraction is exact; the sign is put back by OR (signed zeros kept). A block
 * holding a NaN or a value that rounds past the largest finite one takes the scalar encoder
 * (saturation, Inf and the canonical NaN are its). Checked on every fp32 pattern against the
 * scalar rows (tests/test_formats.c with TIDAL_EXHAUSTIVE=1). */
typedef struct { int m, min_field, cap_field; float max; } fp8_round_k;
static fp8_round_k fp8_k(int e5m2)
{
    /* e4m3: 3 mantissa bits, smallest normal 2^-6, largest binade 2^8, max 448;
     * e5m2: 2 bits, 2^-14, 2^15, 57344 */
    return e5m2 ? (fp8_round_k){2, 127 - 14, 127 + 16, 57344.0f} : (fp8_round_k){3, 127 - 6, 127 + 9, 448.0f};
}

static void fp8_round_scalar(int e5m2, const float *x, float *y, size_t n, int sat)
{
    td_fp8_round_row_scalar(e5m2, x, y, n, sat);
}

/* 8 values of x rounded in the value domain (above): |x| rounded (*r) and x's bits (*u); 0 when a
 * lane holds a NaN or rounds past the largest finite value (the scalar encoder's cases) */
TGT static inline int fp8_round8v(fp8_round_k k, __m256 v, __m256i *u, __m256 *r)
{
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    *u = _mm256_castps_si256(v);
    __m256i a = _mm256_and_si256(*u, absm);
    __m256i f = _mm256_min_epi32(_mm256_max_epi32(_mm256_srli_epi32(a, 23), _mm256_set1_epi32(k.min_field)),
                                 _mm256_set1_epi32(k.cap_field));
    __m256 c = _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(f, _mm256_set1_epi32(23 - k.m)), 23),
                                                   _mm256_set1_epi32(0x400000)));
    *r = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), c), c);
    __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)),
                                  _mm256_castps_si256(_mm256_cmp_ps(*r, _mm256_set1_ps(k.max), _CMP_GT_OQ)));
    return _mm256_testz_si256(bad, bad);
}

TGT static inline int fp8_round8(fp8_round_k k, const float *x, __m256i *u, __m256 *r)
{
    return fp8_round8v(k, _mm256_loadu_ps(x), u, r);
}

TGT void td_fp8_round_row_avx2(int e5m2, const float *x, float *y, size_t n, int sat)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u;
        __m256 r;
        if (!fp8_round8(k, x + i, &u, &r)) {
            fp8_round_scalar(e5m2, x + i, y + i, 8, sat);
            continue;
        }
        _mm256_storeu_ps(y + i, _mm256_or_ps(r, _mm256_castsi256_ps(_mm256_andnot_si256(absm, u))));
    }
    if (i < n) fp8_round_scalar(e5m2, x + i, y + i, n - i, sat);
}

/* the codes of 8 rounded magnitudes r (exact fp8 values) with the signs of x's bits u: a normal's
 * code is its fp32 exponent and top mantissa bits rebased, a subnormal's its count of quanta */
TGT static inline __m128i fp8_codes8(fp8_round_k k, __m256i u, __m256 r)
{
    __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(r), 23 - k.m),
                                      _mm256_set1_epi32((k.min_field - 1) << k.m));
    __m256 per_quantum = _mm256_castsi256_ps(_mm256_set1_epi32((127 - (k.min_field - 127 - k.m)) << 23));
    __m256i sub = _mm256_cvttps_epi32(_mm256_mul_ps(r, per_quantum));
    __m256 tiny = _mm256_cmp_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(k.min_field << 23)), _CMP_LT_OQ);
    __m256i mag = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(sub), tiny));
    __m256i code = _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80)));
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    return _mm_packus_epi16(w, w);
}

/* td_fp8_encode_row_avx512's arithmetic on 8 lanes */
TGT void td_fp8_encode_row_avx2(int e5m2, const float *x, uint8_t *codes, size_t n, int sat)
{
    fp8_round_k k = fp8_k(e5m2);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u;
        __m256 r;
        if (!fp8_round8(k, x + i, &u, &r)) {
            td_fp8_encode_row_scalar(e5m2, x + i, codes + i, 8, sat);
            continue;
        }
        _mm_storel_epi64((__m128i *)(codes + i), fp8_codes8(k, u, r));
    }
    if (i < n) td_fp8_encode_row_scalar(e5m2, x + i, codes + i, n - i, sat);
}

/* 16 values of x rounded in the value domain (above): |x| rounded (*r) and x's bits (*u); 0 when a
 * lane holds a NaN or rounds past the largest finite value (the scalar encoder's cases) */
TGT512 static inline int fp8_round16v(fp8_round_k k, __m512 v, __m512i *u, __m512 *r)
{
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    *u = _mm512_castps_si512(v);
    __m512i a = _mm512_and_si512(*u, absm);
    __m512i f = _mm512_min_epi32(_mm512_max_epi32(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(k.min_field)),
                                 _mm512_set1_epi32(k.cap_field));
    __m512 c = _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(f, _mm512_set1_epi32(23 - k.m)), 23),
                                                   _mm512_set1_epi32(0x400000)));
    *r = _mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(a), c), c);
    return !(_mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000)) |
             _mm512_cmp_ps_mask(*r, _mm512_set1_ps(k.max), _CMP_GT_OQ));
}

TGT512 static inline int fp8_round16(fp8_round_k k, const float *x, __m512i *u, __m512 *r)
{
    return fp8_round16v(k, _mm512_loadu_ps(x), u, r);
}

TGT512 void td_fp8_round_row_avx512(int e5m2, const float *x, float *y, size_t n, int sat)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u;
        __m512 r;
        if (!fp8_round16(k, x + i, &u, &r)) {
            fp8_round_scalar(e5m2, x + i, y + i, 16, sat);
            continue;
        }
        _mm512_storeu_si512(y + i, _mm512_or_si512(_mm512_castps_si512(r), _mm512_andnot_si512(absm, u)));
    }
    if (i < n) td_fp8_round_row_avx2(e5m2, x + i, y + i, n - i, sat);
}

/* td_fp8_fake_quant's piece of a block in one pass (scaling.c): y = round(x * mul) * scale, or
 * round(x / div) * scale when mul is 0, round being the rows above (decode(encode(v))) and each
 * product or quotient one fp32 rounding: the same arithmetic as scaling the piece into a buffer,
 * rounding the buffer and multiplying it by the scale, without the two passes over the buffer. A
 * block the vector rounding does not take goes through the scalar row. y may be x. */
static void fp8_fake_quant_scalar(int e5m2, const float *x, float *y, size_t n, int sat, float mul,
                                  float div, float scale)
{
    float buf[16];
    for (size_t i = 0; i < n; i += 16) {
        size_t m = n - i < 16 ? n - i : 16;
        for (size_t j = 0; j < m; j++) buf[j] = mul != 0.0f ? x[i + j] * mul : x[i + j] / div;
        td_fp8_round_row_scalar(e5m2, buf, buf, m, sat);
        for (size_t j = 0; j < m; j++) y[i + j] = buf[j] * scale;
    }
}

TGT512 void td_fp8_fake_quant_row_avx512(int e5m2, const float *x, float *y, size_t n, int sat, float mul,
                                         float div, float scale)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512 vm = _mm512_set1_ps(mul), vd = _mm512_set1_ps(div), vs = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        v = mul != 0.0f ? _mm512_mul_ps(v, vm) : _mm512_div_ps(v, vd);
        __m512i u;
        __m512 r;
        if (!fp8_round16v(k, v, &u, &r)) {
            fp8_fake_quant_scalar(e5m2, x + i, y + i, 16, sat, mul, div, scale);
            continue;
        }
        r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_andnot_si512(absm, u)));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(r, vs));
    }
    if (i < n) fp8_fake_quant_scalar(e5m2, x + i, y + i, n - i, sat, mul, div, scale);
}

/* td_fp8_fake_quant_row_avx512 on 8 lanes (a CPU with AVX2 and no AVX-512) */
TGT void td_fp8_fake_quant_row_avx2(int e5m2, const float *x, float *y, size_t n, int sat, float mul,
                                    float div, float scale)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256 vm = _mm256_set1_ps(mul), vd = _mm256_set1_ps(div), vs = _mm256_set1_ps(scale);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        v = mul != 0.0f ? _mm256_mul_ps(v, vm) : _mm256_div_ps(v, vd);
        __m256i u;
        __m256 r;
        if (!fp8_round8v(k, v, &u, &r)) {
            fp8_fake_quant_scalar(e5m2, x + i, y + i, 8, sat, mul, div, scale);
            continue;
        }
        r = _mm256_or_ps(r, _mm256_castsi256_ps(_mm256_andnot_si256(absm, u)));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(r, vs));
    }
    if (i < n) fp8_fake_quant_scalar(e5m2, x + i, y + i, n - i, sat, mul, div, scale);
}

/* td_fp8_fake_quant_row_avx2 with each element's own factor and scale (the FP8 wgrad's operands,
 * quantised down their columns: a row's elements belong to as many blocks): the same operations
 * per element, so a value's bits are those of its block's row */
TGT void td_fp8_fake_quant_row_each_avx2(int e5m2, const float *x, float *y, size_t n, int sat, int by_div,
                                         const float *f, const float *scale)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), vf = _mm256_loadu_ps(f + i);
        v = by_div ? _mm256_div_ps(v, vf) : _mm256_mul_ps(v, vf);
        __m256i u;
        __m256 r;
        if (!fp8_round8v(k, v, &u, &r)) {
            for (size_t j = i; j < i + 8; j++)
                fp8_fake_quant_scalar(e5m2, x + j, y + j, 1, sat, by_div ? 0.0f : f[j], f[j], scale[j]);
            continue;
        }
        r = _mm256_or_ps(r, _mm256_castsi256_ps(_mm256_andnot_si256(absm, u)));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(r, _mm256_loadu_ps(scale + i)));
    }
    for (; i < n; i++) fp8_fake_quant_scalar(e5m2, x + i, y + i, 1, sat, by_div ? 0.0f : f[i], f[i], scale[i]);
}

/* fp8 encoding (td_encode_row, e4m3 / e5m2): the rounding above, then the code read off the
 * rounded value r (a value of the format, its sign put back by OR): a normal r's fp32 exponent
 * and top M mantissa bits, rebiased ((bits >> (23 - M)) - ((127 - bias) << M)); a subnormal r
 * (below the smallest normal) is a multiple of the subnormal quantum, r / quantum its code (an
 * exact product and conversion); the sign bit on top. Blocks holding a NaN or a value past the
 * largest finite one, and the tail, take the scalar encoder, as the rounding row does. Checked on
 * every fp32 pattern against the scalar rows (tests/test_formats.c with TIDAL_EXHAUSTIVE=1). */
TGT512 void td_fp8_encode_row_avx512(int e5m2, const float *x, uint8_t *codes, size_t n, int sat)
{
    fp8_round_k k = fp8_k(e5m2);
    const __m512i rebias = _mm512_set1_epi32((k.min_field - 1) << k.m), sign = _mm512_set1_epi32(0x80);
    const __m512 min_normal = _mm512_castsi512_ps(_mm512_set1_epi32(k.min_field << 23));
    const __m512 per_quantum = _mm512_castsi512_ps(_mm512_set1_epi32((127 - (k.min_field - 127 - k.m)) << 23));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u;
        __m512 r;
        if (!fp8_round16(k, x + i, &u, &r)) {
            td_fp8_encode_row_scalar(e5m2, x + i, codes + i, 16, sat);
            continue;
        }
        __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(r), 23 - k.m), rebias);
        __m512i sub = _mm512_cvttps_epi32(_mm512_mul_ps(r, per_quantum));
        __m512i mag = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(r, min_normal, _CMP_LT_OQ), normal, sub);
        __m512i code = _mm512_or_si512(mag, _mm512_and_si512(_mm512_srli_epi32(u, 24), sign));
        _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(code));
    }
    if (i < n) td_fp8_encode_row_scalar(e5m2, x + i, codes + i, n - i, sat);
}

int td_cpu_has_f16c(void)
{
    return td_isa_level() >= TD_ISA_AVX2;   /* AVX2 + FMA + F16C, unless TIDAL_ISA caps it */
}
#else
int td_cpu_has_f16c(void) { return 0; }
#endif
