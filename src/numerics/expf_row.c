/* tidal — expf over a row with the C library's own bits, 8 or 16 at a time.
 *
 * The rounded recipes call expf where PyTorch's CPU kernels and the CUDA kernels they model take
 * an exponential (SiLU's sigmoid, attention's softmax): tidal keeps glibc's expf element by element
 * so that its bits are one fixed, known function. That scalar call was 5 % of an MoE GRPO step.
 *
 * glibc (2.28 and later, here 2.36) computes expf(x) for |x| < ~88 in double precision from a
 * 32-entry table of 2^(i/32) and a cubic; with FMA (its __expf_fma, the variant x86 CPUs with FMA
 * run) every step below rounds once:
 *   kd = fma(32/ln2, x, 0x1.8p52)       k = round(32 x / ln2) in kd's low bits
 *   r  = fma(32/ln2, x, -(kd - 0x1.8p52))
 *   s  = double(T[k mod 32] + (k << 47))   2^(k/32)
 *   y  = fma(fma(C0, r, C1), r*r, fma(r, C2, 1)) * s,  rounded to float
 * The constants and the table are those values (the correctly rounded 2^(i/32), less i << 47 in
 * the bit pattern; the cubic's coefficients scaled by 1/32, 1/32^2, 1/32^3). The same operations on
 * eight doubles at a time give the same bits; the lanes outside that range (overflow, underflow,
 * Inf, NaN) take the scalar expf. Because a C library other than the one measured may compute
 * otherwise (another glibc, musl, a CPU without FMA: __expf_sse2 rounds each product), the vector
 * path is checked against the library's expf once, on 2^18 inputs spread over every exponent and
 * the range's edges, and is used only where they agree (td_expf_row_vector says which); else the
 * scalar loop runs. tests/test_formats.c compares the two on every 61st fp32 pattern
 * (TIDAL_EXHAUSTIVE=1: every one).
 *
 * Two vector forms of the same operations: AVX-512 (two times eight doubles, the table read by
 * a gather of eight) and AVX2 + FMA (two times four doubles) for the CPUs without AVX-512 (Zen 3
 * and older), where the scalar call had stayed: 5-7 % of an MoE GRPO step on Zen 3 (perf), in
 * the SwiGLU of the experts and attention's softmax. */
#include "tidal/formats.h"
#include "tidal/isa.h"
#include "expf_tab.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void td_expf_row_scalar(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TD_HAVE_EXPF_VEC 1
#define TGT __attribute__((target("avx512f,avx512dq,avx512vl,fma")))
#define TGT2 __attribute__((target("avx2,fma")))

static const uint64_t expf_tab[32] = TD_EXPF_TAB_INIT;

/* glibc's constants: 32 / ln 2, the rounding shift 0x1.8p52, the cubic's C0, C1, C2 */
#define EXPF_INV 0x40471547652b82fe
#define EXPF_SHIFT 0x4338000000000000
#define EXPF_C0 0x3ebc6af84b912394
#define EXPF_C1 0x3f2ebfce50fac4f3
#define EXPF_C2 0x3f962e42ff0c52d6
/* glibc's test for its other branches: the top 12 bits of |x| above those of 88 */
#define EXPF_TOPMASK 0x7ff
#define EXPF_LIMIT 0x42a

static inline double bits_d(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* eight lanes of the main range, x widened to double */
TGT static inline __m256 expf8(__m256 x)
{
    const __m512d inv = _mm512_set1_pd(bits_d(EXPF_INV)), shift = _mm512_set1_pd(bits_d(EXPF_SHIFT));
    __m512d xd = _mm512_cvtps_pd(x);
    __m512d kd = _mm512_fmadd_pd(inv, xd, shift);
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fmsub_pd(inv, xd, kd);
    __m512i t = _mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)), (const void *)expf_tab, 8);
    __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(bits_d(EXPF_C0)), r, _mm512_set1_pd(bits_d(EXPF_C1)));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(bits_d(EXPF_C2)), _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

TGT static void expf_row_avx512(const float *x, float *y, size_t n)
{
    const __m512i topmask = _mm512_set1_epi32(EXPF_TOPMASK), limit = _mm512_set1_epi32(EXPF_LIMIT);
    size_t i = 0;
    for (; i < n; i += 16) {
        size_t m = n - i < 16 ? n - i : 16;
        __mmask16 live = m == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << m) - 1);
        __m512 v = _mm512_maskz_loadu_ps(live, x + i);
        /* glibc's other branches (EXPF_LIMIT), here scalar */
        __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), topmask);
        __mmask16 special = _mm512_cmpgt_epi32_mask(top, limit) & live;
        __m256 lo = expf8(_mm512_castps512_ps256(v)), hi = expf8(_mm512_extractf32x8_ps(v, 1));
        __m512 out = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        float xs[16];   /* the inputs of special lanes, kept before y (possibly x itself) is written */
        if (special) _mm512_storeu_ps(xs, v);
        _mm512_mask_storeu_ps(y + i, live, out);
        for (unsigned sp = special; sp; sp &= sp - 1) {
            int k = __builtin_ctz(sp);
            y[i + (size_t)k] = expf(xs[k]);
        }
    }
}

/* AVX2: four lanes of the main range, as expf8's */
TGT2 static inline __m128 expf4(__m128 x)
{
    const __m256d inv = _mm256_set1_pd(bits_d(EXPF_INV)), shift = _mm256_set1_pd(bits_d(EXPF_SHIFT));
    __m256d xd = _mm256_cvtps_pd(x);
    __m256d kd = _mm256_fmadd_pd(inv, xd, shift);
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)expf_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(bits_d(EXPF_C0)), r, _mm256_set1_pd(bits_d(EXPF_C1)));
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(bits_d(EXPF_C2)), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* eight at a time; a row's last 1-7 go through a zero-padded copy */
TGT2 static void expf_row_avx2(const float *x, float *y, size_t n)
{
    const __m256i topmask = _mm256_set1_epi32(EXPF_TOPMASK), limit = _mm256_set1_epi32(EXPF_LIMIT);
    for (size_t i = 0; i < n; i += 8) {
        size_t m = n - i < 8 ? n - i : 8;
        float xs[8] = {0}, out[8];
        __m256 v;
        if (m == 8) {
            v = _mm256_loadu_ps(x + i);
        } else {
            memcpy(xs, x + i, m * sizeof(float));
            v = _mm256_loadu_ps(xs);
        }
        __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 20), topmask);
        unsigned special = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, limit)));
        __m256 e = _mm256_set_m128(expf4(_mm256_extractf128_ps(v, 1)), expf4(_mm256_castps256_ps128(v)));
        if (special) _mm256_storeu_ps(xs, v);   /* kept before y (possibly x itself) is written */
        if (m == 8) {
            _mm256_storeu_ps(y + i, e);
        } else {
            _mm256_storeu_ps(out, e);
            memcpy(y + i, out, m * sizeof(float));
        }
        for (special &= (1u << m) - 1; special; special &= special - 1) {
            int k = __builtin_ctz(special);
            y[i + (size_t)k] = expf(xs[k]);
        }
    }
}
#endif

static int vec_ok;
static pthread_once_t vec_once = PTHREAD_ONCE_INIT;

/* 2^18 inputs: patterns at a stride over all 2^32, both signs, the edges of the main range
 * and of the special branches */
static void vec_check(void)
{
#ifdef TD_HAVE_EXPF_VEC
    if (td_isa_level() < TD_ISA_AVX2) return;
    enum { NCHK = 1 << 18 };
    float *in = malloc(3 * (size_t)NCHK * sizeof(float)), *a = in + NCHK, *b = a + NCHK;
    if (!in) return;
    for (uint32_t i = 0; i < NCHK; i++) {
        uint32_t u = i * 16381u + (i >> 5);   /* odd stride over all 2^32: low and high bits vary */
        memcpy(&in[i], &u, 4);
    }
    static const float edge[] = {88.0f, -88.0f, 0x1.62e42ep6f, 0x1.62e430p6f, -0x1.9fe368p6f, -0x1.9fe36ap6f,
                                 -0x1.9d1d9ep6f, -0x1.9d1da0p6f, 0.0f, -0.0f, 1e-30f, -1e-30f, 0x1p-149f};
    for (size_t e = 0; e < sizeof edge / sizeof *edge; e++) in[e] = edge[e];
    td_expf_row_scalar(in, a, NCHK);
    if (td_isa_level() >= TD_ISA_AVX512) expf_row_avx512(in, b, NCHK);
    else expf_row_avx2(in, b, NCHK);
    int same = 1;
    for (uint32_t i = 0; i < NCHK && same; i++) same = !memcmp(&a[i], &b[i], 4) || (isnan(a[i]) && isnan(b[i]));
    free(in);
    vec_ok = same;
#endif
}

int td_expf_row_vector(void)
{
    pthread_once(&vec_once, vec_check);
    return vec_ok;
}

void td_expf_row(const float *x, float *y, size_t n)
{
#ifdef TD_HAVE_EXPF_VEC
    if (n >= 8 && td_expf_row_vector()) {
        if (td_isa_level() >= TD_ISA_AVX512) expf_row_avx512(x, y, n);
        else expf_row_avx2(x, y, n);
        return;
    }
#endif
    td_expf_row_scalar(x, y, n);
}
