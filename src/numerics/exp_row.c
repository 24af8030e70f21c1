/* tidal — exp (double) over a row with the C library's own bits, four at a time.
 *
 * The log-softmax of a vocabulary row (td_log_sum_exp) and the per-token metrics take e^x in
 * double for every entry of the row: six calls of exp or expm1 per entry per scored token, 9.5 %
 * of an fp8 tidal-diff (perf). The row's floats must stay the C library's, so this is glibc's
 * algorithm (2.28 and later, here 2.36) step for step, as its x86 FMA variant runs it
 * (__ieee754_exp_fma, read from the disassembly): for |x| in [2^-54, 512)
 *   kd = fma(x, 128/ln2, 0x1.8p52)    k = round(128 x / ln2) in kd's low bits; kd -= 0x1.8p52
 *   r  = fma(kd, -ln2/128 lo, fma(kd, -ln2/128 hi, x))
 *   tail, sbits = T[2 (k mod 128)], T[2 (k mod 128) + 1] + (k << 45);  scale = double(sbits)
 *   tmp = fma(r^2 r^2, fma(r, C5, C4), fma(fma(r, C3, C2), r^2, r + tail))
 *   y = fma(scale, tmp, scale)
 * with the constants and table of glibc's __exp_data (exp_tab.h). The other lanes (tiny |x|, 0,
 * |x| >= 512, Inf, NaN) take the scalar exp. As for td_expf_row, a C library that computes
 * otherwise (another version, no FMA) is caught by a check against exp on 2^18 inputs at first
 * use, and then the scalar loop runs (td_exp_row_vector says which); tests/test_formats.c
 * compares the two on 2^26 patterns over every exponent.
 *
 * expm1 likewise (td_expm1_row: the metrics' k3 = e^r - 1 - r takes two per entry), on the
 * range |x| in [2^-54, ln2 / 2] where glibc's fdlibm-derived expm1 reduces nothing (k = 0):
 *   hfx = x / 2, hxs = x hfx, r1 = fma(hxs^4, fma(hxs, Q5, Q4), fma(hxs^2, fma(hxs, Q3, Q2), fma(hxs, Q1, 1)))
 *   t = 3 - r1 hfx (fma), e = ((r1 - t) / (6 - x t, fma)) hxs, y = x - fma(e, x, -hxs)
 * (its FMA variant, __expm1_fma, from the disassembly; Q1-Q5 fdlibm's). Other lanes: expm1. */
#include "tidal/formats.h"
#include "tidal/isa.h"
#include "exp_tab.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void td_exp_row_scalar(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = exp(x[i]);
}

void td_expm1_row_scalar(const double *x, double *y, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = expm1(x[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TD_HAVE_EXP_VEC 1
#define TGT __attribute__((target("avx2,fma")))

static const uint64_t exp_tab[256] = TD_EXP_TAB_INIT;

static inline double bits_d(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* glibc's __exp_data constants */
#define EXP_INVLN2N 0x40671547652b82fe   /* 128 / ln 2 */
#define EXP_NEGLN2HI 0xbf762e42fefa0000
#define EXP_NEGLN2LO 0xbd0cf79abc9e3b3a
#define EXP_C2 0x3fdffffffffffdbd
#define EXP_C3 0x3fc555555555543c
#define EXP_C4 0x3fa55555cf172b91
#define EXP_C5 0x3f81111167a4d017
#define EXP_SHIFT 0x4338000000000000     /* 0x1.8p52 */
/* glibc's main range: top12(|x|) - top12(0x1p-54) below top12(512) - top12(0x1p-54), unsigned */
#define EXP_TOP_LO 0x3c9
#define EXP_TOP_SPAN 0x3f

/* four lanes of the main range */
TGT static inline __m256d exp4(__m256d x)
{
    const __m256d shift = _mm256_set1_pd(bits_d(EXP_SHIFT));
    __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(bits_d(EXP_INVLN2N)), shift);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(bits_d(EXP_NEGLN2HI)), x);
    r = _mm256_fmadd_pd(kd, _mm256_set1_pd(bits_d(EXP_NEGLN2LO)), r);
    /* lane l's pair (tail, scale bits) at T[2 (k_l mod 128)]: four 16-byte loads, lanes 0 and 2
     * and lanes 1 and 3 side by side, then the tails and the scales unpacked (faster than two
     * gathers on Zen 3) */
    int64_t at[4];
    _mm256_storeu_si256((__m256i *)at, _mm256_and_si256(ki, _mm256_set1_epi64x(127)));
#define PAIR(l) _mm_loadu_si128((const __m128i *)(exp_tab + 2 * at[l]))
    __m256i p02 = _mm256_inserti128_si256(_mm256_castsi128_si256(PAIR(0)), PAIR(2), 1);
    __m256i p13 = _mm256_inserti128_si256(_mm256_castsi128_si256(PAIR(1)), PAIR(3), 1);
#undef PAIR
    __m256d tail = _mm256_castsi256_pd(_mm256_unpacklo_epi64(p02, p13));
    __m256i sbits = _mm256_add_epi64(_mm256_unpackhi_epi64(p02, p13), _mm256_slli_epi64(ki, 45));
    __m256d p23 = _mm256_fmadd_pd(r, _mm256_set1_pd(bits_d(EXP_C3)), _mm256_set1_pd(bits_d(EXP_C2)));
    __m256d rt = _mm256_add_pd(r, tail), r2 = _mm256_mul_pd(r, r);
    __m256d p45 = _mm256_fmadd_pd(r, _mm256_set1_pd(bits_d(EXP_C5)), _mm256_set1_pd(bits_d(EXP_C4)));
    __m256d tmp = _mm256_fmadd_pd(p23, r2, rt);
    tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), p45, tmp);
    __m256d scale = _mm256_castsi256_pd(sbits);
    return _mm256_fmadd_pd(scale, tmp, scale);
}

/* glibc's expm1 constants, and its k = 0 range: the high word of |x| in [LO, HI] */
#define EXPM1_Q1 0xbfa11111111110f4
#define EXPM1_Q2 0x3f5a01a019fe5585
#define EXPM1_Q3 0xbf14ce199eaadbb7
#define EXPM1_Q4 0x3ed0cfca86e65239
#define EXPM1_Q5 0xbe8afdb76e09c32d
#define EXPM1_HI_LO 0x3c900000
#define EXPM1_HI_HI 0x3fd62e42

TGT static inline __m256d expm1_4(__m256d x)
{
    __m256d hfx = _mm256_mul_pd(x, _mm256_set1_pd(0.5)), hxs = _mm256_mul_pd(x, hfx);
    __m256d p23 = _mm256_fmadd_pd(hxs, _mm256_set1_pd(bits_d(EXPM1_Q3)), _mm256_set1_pd(bits_d(EXPM1_Q2)));
    __m256d p45 = _mm256_fmadd_pd(hxs, _mm256_set1_pd(bits_d(EXPM1_Q5)), _mm256_set1_pd(bits_d(EXPM1_Q4)));
    __m256d h2 = _mm256_mul_pd(hxs, hxs);
    __m256d p1 = _mm256_fmadd_pd(hxs, _mm256_set1_pd(bits_d(EXPM1_Q1)), _mm256_set1_pd(1.0));
    __m256d r1 = _mm256_fmadd_pd(_mm256_mul_pd(h2, h2), p45, _mm256_fmadd_pd(h2, p23, p1));
    __m256d t = _mm256_fnmadd_pd(r1, hfx, _mm256_set1_pd(3.0));
    __m256d den = _mm256_fnmadd_pd(x, t, _mm256_set1_pd(6.0));
    __m256d e = _mm256_mul_pd(_mm256_div_pd(_mm256_sub_pd(r1, t), den), hxs);
    return _mm256_sub_pd(x, _mm256_fmsub_pd(e, x, hxs));
}

/* lanes of v whose (bits of v >> shift) & mask - lo > span, unsigned: those outside a main range */
TGT static inline unsigned outside(__m256d v, int shift, long long mask, long long lo, long long span)
{
    const __m256i flip = _mm256_set1_epi64x(INT64_MIN);
    __m256i top = _mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(v), shift), _mm256_set1_epi64x(mask));
    __m256i off = _mm256_xor_si256(_mm256_sub_epi64(top, _mm256_set1_epi64x(lo)), flip);
    __m256i lim = _mm256_xor_si256(_mm256_set1_epi64x(span), flip);
    return (unsigned)_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(off, lim)));
}

/* four at a time; a row's last 1-3 through a padded copy; the lanes outside the main range
 * (glibc's other branches) by the scalar function */
#define ROW_AVX2(name, vec, scalar, shift, mask, lo, span)                                         \
    TGT static void name(const double *x, double *y, size_t n)                                     \
    {                                                                                              \
        for (size_t i = 0; i < n; i += 4) {                                                        \
            size_t m = n - i < 4 ? n - i : 4;                                                      \
            double xs[4] = {0.25, 0.25, 0.25, 0.25}, out[4];                                       \
            __m256d v;                                                                             \
            if (m == 4) {                                                                          \
                v = _mm256_loadu_pd(x + i);                                                        \
            } else {                                                                               \
                memcpy(xs, x + i, m * sizeof(double));                                             \
                v = _mm256_loadu_pd(xs);                                                           \
            }                                                                                      \
            unsigned special = outside(v, shift, mask, lo, span);                                  \
            __m256d e = vec(v);                                                                    \
            if (special) _mm256_storeu_pd(xs, v);   /* kept before y (possibly x) is written */    \
            if (m == 4) {                                                                          \
                _mm256_storeu_pd(y + i, e);                                                        \
            } else {                                                                               \
                _mm256_storeu_pd(out, e);                                                          \
                memcpy(y + i, out, m * sizeof(double));                                            \
            }                                                                                      \
            for (special &= (1u << m) - 1; special; special &= special - 1) {                      \
                int k = __builtin_ctz(special);                                                    \
                y[i + (size_t)k] = scalar(xs[k]);                                                  \
            }                                                                                      \
        }                                                                                          \
    }

ROW_AVX2(exp_row_avx2, exp4, exp, 52, 0x7ff, EXP_TOP_LO, EXP_TOP_SPAN - 1)
ROW_AVX2(expm1_row_avx2, expm1_4, expm1, 32, 0x7fffffff, EXPM1_HI_LO, EXPM1_HI_HI - EXPM1_HI_LO)

#endif

static int vec_ok;
static pthread_once_t vec_once = PTHREAD_ONCE_INIT;

/* 2^18 inputs: patterns at a stride over all 2^64 (both signs, every exponent), values in the
 * range a log-softmax row takes, and the edges of the main range */
static void vec_check(void)
{
#ifdef TD_HAVE_EXP_VEC
    if (td_isa_level() < TD_ISA_AVX2) return;
    enum { NCHK = 1 << 18 };
    double *in = malloc(3 * (size_t)NCHK * sizeof(double)), *a = in + NCHK, *b = a + NCHK;
    if (!in) return;
    for (uint32_t i = 0; i < NCHK; i++) {
        if (i % 2) {
            uint64_t u = (uint64_t)i * 0x9E3779B97F4A7C15ull;   /* odd multiplier: every bit varies */
            memcpy(&in[i], &u, 8);
        } else {
            in[i] = i % 4 ? -120.0 * i / NCHK : 0.7 * i / NCHK - 0.35;   /* expm1's k = 0 range too */
        }
    }
    static const double edge[] = {512.0, -512.0, 0x1.fffffffffffffp8, -0x1.fffffffffffffp8, 0x1p-54,
                                  -0x1p-54, 0x1.fffffffffffffp-55, 0.0, -0.0, 709.78, -708.4, -745.2,
                                  0x1.62e42fefa39efp-2, -0x1.62e42fefa39efp-2, 0x1.62e42p-2, 0x1.62e43p-2};
    for (size_t e = 0; e < sizeof edge / sizeof *edge; e++) in[e] = edge[e];
    int same = 1;
    for (int f = 0; f < 2 && same; f++) {   /* exp, then expm1 */
        if (f) {
            td_expm1_row_scalar(in, a, NCHK);
            expm1_row_avx2(in, b, NCHK);
        } else {
            td_exp_row_scalar(in, a, NCHK);
            exp_row_avx2(in, b, NCHK);
        }
        for (uint32_t i = 0; i < NCHK && same; i++) same = !memcmp(&a[i], &b[i], 8) || (isnan(a[i]) && isnan(b[i]));
    }
    free(in);
    vec_ok = same;
#endif
}

int td_exp_row_vector(void)
{
    pthread_once(&vec_once, vec_check);
    return vec_ok;
}

void td_exp_row(const double *x, double *y, size_t n)
{
#ifdef TD_HAVE_EXP_VEC
    if (n >= 4 && td_exp_row_vector()) {
        exp_row_avx2(x, y, n);
        return;
    }
#endif
    td_exp_row_scalar(x, y, n);
}

size_t td_exp_row_block(const float *x, double c, double *y, size_t left)
{
    size_t n = left < TD_EXP_ROW_BLOCK ? left : TD_EXP_ROW_BLOCK;
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i] - c;
    td_exp_row(y, y, n);
    return n;
}

void td_expm1_row(const double *x, double *y, size_t n)
{
#ifdef TD_HAVE_EXP_VEC
    if (n >= 4 && td_exp_row_vector()) {
        expm1_row_avx2(x, y, n);
        return;
    }
#endif
    td_expm1_row_scalar(x, y, n);
}
