/* Recipe-driven GEMM emulation (see include/tidal/gemm.h). */
#include "tidal/gemm.h"
#include "tidal/isa.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

static int legacy;
static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;
static void legacy_init(void)
{
    const char *v = getenv("TIDAL_GEMM_ORDER");
    legacy = v && !strcmp(v, "openblas");
}

int td_gemm_legacy_order(void)
{
    pthread_once(&legacy_once, legacy_init);
    return legacy;
}

void td_round_act(const td_recipe *r, float *x, size_t n)
{
    if (r->activations != TD_F32) td_round_row(r->activations, x, x, n, TD_SATFINITE);
}

void td_gemm_prepare_weight(const td_recipe *r, const float *w, int N, int K, float *out)
{
    size_t n = (size_t)N * K;
    if (r->weights == TD_E4M3 || r->weights == TD_E5M2) {
        td_fp8_scheme s = r->weight_scaling;
        s.fmt = r->weights;
        td_fp8_fake_quant(&s, w, (size_t)N, (size_t)K, out);
    } else if (r->weights != TD_F32) {
        td_round_row(r->weights, w, out, n, TD_SATFINITE);
    } else if (out != w) {
        memcpy(out, w, n * sizeof(float));
    }
}

void td_gemm_quant_input(const td_recipe *r, const float *in, int M, int K, float *out)
{
    size_t n = (size_t)M * K;
    if (td_recipe_fp8_gemm(r)) {
        td_fp8_scheme s = r->act_scaling;
        s.fmt = r->gemm_inputs;
        td_fp8_fake_quant(&s, in, (size_t)M, (size_t)K, out);
    } else if (r->gemm_inputs != TD_F32) {
        td_round_row(r->gemm_inputs, in, out, n, TD_SATFINITE);
    } else if (out != in) {
        memcpy(out, in, n * sizeof(float));
    }
}

int td_gemm_quant_input_cols(const td_recipe *r, const float *in, int M, int K, float *out)
{
    if (!td_recipe_fp8_gemm(r)) return 0;
    td_fp8_scheme s = r->act_scaling;
    s.fmt = r->gemm_inputs;
    return td_fp8_fake_quant_cols(&s, in, (size_t)M, (size_t)K, out);
}

size_t td_gemm_scratch_floats(const td_recipe *r, int M, int N)
{
    (void)r; (void)M; (void)N;
    return 0;   /* fp8-fast keeps its partials in registers since gemm_fp8fast.c */
}

/* C (M, N) = A[:, k0:k0+kn] · W[:, k0:k0+kn]^T (+ C if beta). Batch-invariant recipes and
 * decode-sized products (M <= TD_GEMM_FIXED_ROWS) take td_gemm_fixed, whose per-element order
 * depends on nothing but the two operand rows (OpenBLAS's sgemm does not promise that: its
 * order can change with M and N); larger products OpenBLAS's sgemm: a different summation order
 * than a decode step's, as an engine's GEMV and GEMM kernels differ. */
static void mm(const float *a, int M, int K, const float *w, int ldw, int N, float *c, int ldc,
               int k0, int kn, float beta, int invariant)
{
    if (invariant || (M <= TD_GEMM_FIXED_ROWS && !td_gemm_legacy_order()))
        td_gemm_fixed(a + k0, K, w + k0, ldw, c, ldc, M, N, kn, beta != 0.0f);
    else if (M == 1)   /* TIDAL_GEMM_ORDER=openblas */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, kn, 1.0f, w + k0, ldw, a + k0, 1, beta, c, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, kn, 1.0f, a + k0, K, w + k0,
                    ldw, beta, c, ldc);
}

/* the K slices of split-K: part p is [*k0, *k0 + *kn); 0 when there is no such part */
static int split_part(const td_recipe *r, int K, int p, int *k0, int *kn)
{
    int parts = r->split_k < K ? r->split_k : 1;
    int per = (K + parts - 1) / parts;
    *k0 = p * per;
    if (p >= parts || *k0 >= K) return 0;
    *kn = *k0 + per <= K ? per : K - *k0;
    return 1;
}

void td_gemm_accumulate_w16(const td_recipe *r, const float *in, int M, int K, const uint16_t *w,
                            td_format wf, int ldw, int N, float *out, int ldo)
{
    int k0, kn;
    for (int p = 0; split_part(r, K, p, &k0, &kn); p++)
        td_gemm_fixed_w16(in + k0, K, w + k0, ldw, wf, out, ldo, M, N, kn, p > 0);
}

int td_gemm_bf16dp_applies(const td_recipe *r)
{
    return r->accumulate == TD_ACC_FP32 && !r->batch_invariant && r->weights == TD_BF16 &&
           r->gemm_inputs == TD_BF16 && !td_recipe_fp8_gemm(r) && !td_gemm_legacy_order() &&
           td_gemm_bf16dp_available();
}

#if defined(__x86_64__) && defined(__GNUC__)
/* 16 codes a step: floats [i, i + 16) are read before codes [i, i + 16) are written to bytes
 * [2i, 2i + 32), all below float i + 16's, so in place is safe too */
__attribute__((target("avx512f,avx512bw"))) static size_t codes_avx512(const float *x, size_t n, uint16_t *codes)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(x + i));
        _mm256_storeu_si256((__m256i *)(codes + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
    return i;
}
#endif

uint16_t *td_gemm_bf16_codes(const float *x, size_t n, uint16_t *codes)
{
    size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (td_isa_level() >= TD_ISA_AVX512) i = codes_avx512(x, n, codes);
#endif
    /* in place, code i lands on bytes [2i, 2i + 2), at or before float i's [4i, 4i + 4), read first */
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        codes[i] = (uint16_t)(u >> 16);
    }
    return codes;
}

void td_gemm_accumulate_bf16dp(const td_recipe *r, const uint16_t *in, int M, int K,
                               const uint16_t *w, int ldw, int N, float *out, int ldo)
{
    int k0, kn;
    for (int p = 0; split_part(r, K, p, &k0, &kn); p++)
        td_gemm_bf16dp(in + k0, K, w + k0, ldw, out, ldo, M, N, kn, p > 0);
}

void td_gemm_accumulate(const td_recipe *r, const float *in, int M, int K, const float *w,
                        int ldw, int N, float *out, int ldo, float *scratch)
{
    if (r->accumulate == TD_ACC_FP32) {
        int k0, kn;
        for (int p = 0; split_part(r, K, p, &k0, &kn); p++)
            mm(in, M, K, w, ldw, N, out, ldo, k0, kn, p ? 1.0f : 0.0f, r->batch_invariant);
        return;
    }
    /* fp8-fast: WGMMA steps of 32 products, truncated partials, promotion every promote_every
     * (src/recipe/gemm_fp8fast.c; one kernel, the same order for every M and batch) */
    td_gemm_fp8_fast(in, K, w, ldw, out, ldo, M, N, K, r->promote_every, r->acc_fraction_bits);
}

void td_gemm_finish(const td_recipe *r, float *out, int M, int N, int ldo, const float *bias)
{
    for (int i = 0; i < M; i++) {
        float *y = out + (size_t)i * ldo;
        if (bias) for (int j = 0; j < N; j++) y[j] += bias[j];
        td_round_act(r, y, (size_t)N);
    }
}
