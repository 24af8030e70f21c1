/* tidal — what the FP8 panel kernel's inner loop costs on this CPU (reports/cpu-speed.md, issue 38):
 * the instruction mixes of its k step alone in a loop, in L1, eight independent accumulators, one
 * thread; best of 5 rounds; printed as 256-bit FMAs per ns and per cycle at the clock given (GHz,
 * default 3.2). Not part of make bench (no peer: the figures locate a bound, they rank nothing).
 *   cc -O2 -std=c11 -D_GNU_SOURCE tests/bench/fp8_mix_probe.c -o /tmp/fp8_mix_probe && taskset -c 1 /tmp/fp8_mix_probe 3.2
 * Lines: FMAs on registers; each FMA with a value of a broadcast from memory (the kernels' rows);
 * one broadcast feeding two FMAs; FMAs with a 256-bit memory operand (a pre-broadcast buffer);
 * the e4m3 decode of 8 codes alone (gemm_fp8fast.h decode8: broadcast, shuffle, shift, and, the
 * scale's multiply; and the sign-extend form: vpmovsxbd, shift, and, multiply), per decode; and
 * the panel kernel's step at R rows x P panels: P decodes, R broadcasts, R x P FMAs. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define TGT __attribute__((target("avx2,fma"), noinline))
#define INL static inline __attribute__((target("avx2,fma"), always_inline))

static float A[4096] __attribute__((aligned(64)));
static float B[8 * 512] __attribute__((aligned(64)));
static uint8_t C[8 * 8192] __attribute__((aligned(64)));

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define ACC __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0
#define SUM return (((a0[0] + a1[0]) + (a2[0] + a3[0])) + ((a4[0] + a5[0]) + (a6[0] + a7[0])))
#define F(x, w, acc) acc = _mm256_fmadd_ps(x, w, acc)
#define BC(i) _mm256_broadcast_ss(A + k + (i))
#define BM(r) _mm256_load_ps(B + 8 * ((k * 4 + (r)) & 511))

INL __m256 dec_shuf(const uint8_t *p, __m256 f)
{
    const __m256i put = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
                                         -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    __m256i d = _mm256_srai_epi32(_mm256_shuffle_epi8(_mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p)), put), 4);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0x87FFFFFF))), f);
}

INL __m256 dec_sx(const uint8_t *p, __m256 f)
{
    __m256i d = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)), 20);
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0x87F00000))), f);
}

/* each function: n passes, returning a sum so that nothing is dropped; FMAs per pass in fmas[] */
TGT static float fma_reg(int n)
{
    ACC;
    __m256 w = _mm256_set1_ps(1.0001f), x = _mm256_set1_ps(0.5f);
    for (int it = 0; it < n; it++)
        for (int k = 0; k < 1024; k++) {
            __asm__("" : "+x"(x));
            F(x, w, a0); F(x, w, a1); F(x, w, a2); F(x, w, a3); F(x, w, a4); F(x, w, a5); F(x, w, a6); F(x, w, a7);
        }
    SUM;
}

/* 8 FMAs a k, each with its own operand X(i): a broadcast (BC) or a 256-bit load (BM) */
#define FMA_EACH(X)                                                                                \
    ACC;                                                                                           \
    __m256 w = _mm256_set1_ps(1.0001f);                                                            \
    for (int it = 0; it < n; it++)                                                                 \
        for (int k = 0; k < 1024; k++) {                                                           \
            F(X(0), w, a0); F(X(1), w, a1); F(X(2), w, a2); F(X(3), w, a3);                        \
            F(X(4), w, a4); F(X(5), w, a5); F(X(6), w, a6); F(X(7), w, a7);                        \
        }                                                                                          \
    SUM
TGT static float fma_bcast(int n) { FMA_EACH(BC); }

TGT static float fma_bcast2(int n)
{
    ACC;
    __m256 w = _mm256_set1_ps(1.0001f), v = _mm256_set1_ps(0.999f), b;
    for (int it = 0; it < n; it++)
        for (int k = 0; k < 1024; k++) {
            b = BC(0); F(b, w, a0); F(b, v, a1); b = BC(1); F(b, w, a2); F(b, v, a3);
            b = BC(2); F(b, w, a4); F(b, v, a5); b = BC(3); F(b, w, a6); F(b, v, a7);
        }
    SUM;
}

TGT static float fma_mem(int n) { FMA_EACH(BM); }

/* 8 decodes a k: "FMAs" here are decodes */
#define DECODES(dec)                                                                               \
    ACC;                                                                                           \
    __m256 f = _mm256_set1_ps(0x1p120f);                                                           \
    for (int it = 0; it < n; it++)                                                                 \
        for (int k = 0; k < 1024; k++) {                                                           \
            const uint8_t *p = C + 64 * (k & 1023);                                                \
            a0 = _mm256_add_ps(a0, dec(p, f)); a1 = _mm256_add_ps(a1, dec(p + 8, f));              \
            a2 = _mm256_add_ps(a2, dec(p + 16, f)); a3 = _mm256_add_ps(a3, dec(p + 24, f));        \
            a4 = _mm256_add_ps(a4, dec(p + 32, f)); a5 = _mm256_add_ps(a5, dec(p + 40, f));        \
            a6 = _mm256_add_ps(a6, dec(p + 48, f)); a7 = _mm256_add_ps(a7, dec(p + 56, f));        \
        }                                                                                          \
    SUM
TGT static float decode_shuf(int n) { DECODES(dec_shuf); }
TGT static float decode_sx(int n) { DECODES(dec_sx); }

/* the panel kernel's k step: 4 rows x 1 panel, two lanes (8 FMAs per 2 k); the rows' values X(i):
 * broadcasts (BC, the kernel's), or 256-bit loads from a pre-broadcast buffer (BM) */
#define STEP4X1(X)                                                                                 \
    ACC;                                                                                           \
    __m256 f = _mm256_set1_ps(0x1p120f), w;                                                        \
    for (int it = 0; it < n; it++)                                                                 \
        for (int k = 0; k < 1024; k++) {                                                           \
            w = dec_shuf(C + 8 * k, f); F(X(0), w, a0); F(X(1), w, a1); F(X(2), w, a2); F(X(3), w, a3); \
            w = dec_shuf(C + 8 * k + 8, f); F(X(4), w, a4); F(X(5), w, a5); F(X(6), w, a6); F(X(7), w, a7); \
        }                                                                                          \
    SUM
TGT static float step4x1(int n) { STEP4X1(BC); }
TGT static float step4x1_mem(int n) { STEP4X1(BM); }

/* 8 rows x 1 panel, one lane (8 FMAs per k) */
TGT static float step8x1(int n)
{
    ACC;
    __m256 f = _mm256_set1_ps(0x1p120f);
    for (int it = 0; it < n; it++)
        for (int k = 0; k < 1024; k++) {
            __m256 w = dec_shuf(C + 8 * k, f);
            F(BC(0), w, a0); F(BC(1), w, a1); F(BC(2), w, a2); F(BC(3), w, a3);
            F(BC(4), w, a4); F(BC(5), w, a5); F(BC(6), w, a6); F(BC(7), w, a7);
        }
    SUM;
}

/* 4 rows x 2 panels, one lane (8 FMAs per k, a broadcast feeding two) */
TGT static float step4x2(int n)
{
    ACC;
    __m256 f = _mm256_set1_ps(0x1p120f), g = _mm256_set1_ps(0x1p121f), b;
    for (int it = 0; it < n; it++)
        for (int k = 0; k < 1024; k++) {
            __m256 w = dec_shuf(C + 8 * k, f), v = dec_shuf(C + 8 * k + 32768, g);
            b = BC(0); F(b, w, a0); F(b, v, a1); b = BC(1); F(b, w, a2); F(b, v, a3);
            b = BC(2); F(b, w, a4); F(b, v, a5); b = BC(3); F(b, w, a6); F(b, v, a7);
        }
    SUM;
}

int main(int argc, char **argv)
{
    double ghz = argc > 1 ? atof(argv[1]) : 3.2;
    for (int i = 0; i < 4096; i++) A[i] = 1e-3f;
    for (int i = 0; i < 8 * 512; i++) B[i] = 1e-3f;
    for (int i = 0; i < 8 * 8192; i++) C[i] = (uint8_t)(0x30 + i % 7);   /* normal e4m3 codes */
    struct { float (*fn)(int); const char *name; } T[] = {
        {fma_reg, "fma, registers"}, {fma_bcast, "broadcast + fma"}, {fma_bcast2, "broadcast + 2 fma"},
        {fma_mem, "fma, 256-bit memory operand"}, {decode_shuf, "e4m3 decode (per decode)"},
        {decode_sx, "e4m3 decode, sign-extend form"}, {step4x1, "step 4 rows x 1 panel"},
        {step8x1, "step 8 rows x 1 panel"}, {step4x2, "step 4 rows x 2 panels"},
        {step4x1_mem, "step 4 x 1, fma memory operands"}};
    int nt = (int)(sizeof T / sizeof *T), n = 4000;
    double best[16] = {0};
    volatile float sink = 0;
    for (int round = 0; round < 5; round++)
        for (int v = 0; v < nt; v++) {
            double t0 = now();
            sink += T[v].fn(n);
            double g = (double)n * 1024 * 8 / (now() - t0) / 1e9;
            if (g > best[v]) best[v] = g;
        }
    for (int v = 0; v < nt; v++)
        printf("probe: %-34s %.2f per ns  %.2f per cycle at %.1f GHz\n", T[v].name, best[v], best[v] / ghz, ghz);
    return sink == 12345.0f;
}
