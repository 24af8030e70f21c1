/* tidal — the CPU backend's own GEMM kernels against OpenBLAS, one thread each, GFLOP/s:
 *   C (M, N) = A (M, K) . W (N, K)^T     M = rows (decode slots, tokens), N = output features
 *   decode-gemm-bf16   a decode step over bf16 weights (td_gemm_fixed_w16, src/recipe/gemm_w16.c:
 *                      the weights read as stored, widened in registers) against what the backend
 *                      did before it and what OpenBLAS offers for fp32 activations and bf16
 *                      weights: each 128-column tile (TD_GEMM_TILE) widened to fp32 in memory,
 *                      then sgemm (sgemv for one row); Llama-3-8B shapes
 *   gemm-bf16dp        a GEMM of bf16 operands on the CPU's bf16 dot products (td_gemm_bf16dp,
 *                      src/recipe/gemm_bf16dp.c) against sgemm over the same values in fp32;
 *                      Qwen2.5-0.5B shapes; "NA" where the CPU has neither kernel (vdpbf16ps or AVX-512 FMAs)
 * Each side runs until 0.3 s have passed, best of 3. Prints
 *   bench: NAME-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
 * Built and run by tests/bench/gemm.sh. */
#include "tidal/formats.h"
#include "tidal/gemm.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);

enum { TILE = 128 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void step(int which, const float *a, const uint16_t *w, float *tile, float *c, int M, int N, int K)
{
    for (int j0 = 0; j0 < N; j0 += TILE) {
        int nj = N - j0 < TILE ? N - j0 : TILE;
        const uint16_t *wt = w + (size_t)j0 * K;
        if (which) {
            td_gemm_fixed_w16(a, K, wt, K, TD_BF16, c + j0, N, M, nj, K, 0);
            continue;
        }
        td_decode_row(TD_BF16, wt, tile, (size_t)nj * K);
        if (M == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, nj, K, 1.0f, tile, K, a, 1, 0.0f, c + j0, 1);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nj, K, 1.0f, a, K, tile, K, 0.0f, c + j0, N);
    }
}

static double gflops_dp(int which, const uint16_t *a16, const uint16_t *w16, const float *a,
                        const float *w, float *c, int M, int N, int K)
{
    double best = 0;
    for (int round = 0; round < 3; round++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            if (which) td_gemm_bf16dp(a16, K, w16, K, c, N, M, N, K, 0);
            else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, c, N);
            reps++;
        } while ((t = now() - t0) < 0.3);
        double g = 2.0 * M * N * K * reps / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

static double gflops(int which, const float *a, const uint16_t *w, float *tile, float *c, int M, int N, int K)
{
    double best = 0;
    for (int round = 0; round < 3; round++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            step(which, a, w, tile, c, M, N, K);
            reps++;
        } while ((t = now() - t0) < 0.3);
        double g = 2.0 * M * N * K * reps / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

int main(void)
{
    openblas_set_num_threads(1);
    /* one thread for tidal's row conversions too: td_decode_row splits rows of 2^18 values and
     * more over OpenMP's threads outside a parallel region, which gave the peer's tile widening
     * both cores; the backend widens its tiles inside its own region, one thread each */
    omp_set_num_threads(1);
    /* q_proj-like, gate/up-like, down-like, lm_head slice (one thread's share is a few tiles) */
    const int shapes[][3] = {{8, 4096, 4096}, {8, 14336, 4096}, {8, 4096, 14336}, {1, 14336, 4096}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *a = malloc(sizeof(float) * M * K), *c = malloc(sizeof(float) * M * N);
        float *tile = malloc(sizeof(float) * TILE * K);
        uint16_t *w = malloc(sizeof(uint16_t) * (size_t)N * K);
        for (long i = 0; i < (long)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (long i = 0; i < (long)N * K; i++) w[i] = td_f32_to_bf16((float)((i * 104729) % 1000) * 1e-4f - 0.05f).bits;
        double mine = gflops(1, a, w, tile, c, M, N, K), peer = gflops(0, a, w, tile, c, M, N, K);
        printf("bench: decode-gemm-bf16-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f\n", M, N, K, mine, peer, mine / peer);
        free(a); free(c); free(tile); free(w);
    }
    const int dshapes[][3] = {{256, 4864, 896}, {256, 896, 4864}, {256, 1152, 896}};
    for (size_t s = 0; s < sizeof dshapes / sizeof dshapes[0]; s++) {
        int M = dshapes[s][0], N = dshapes[s][1], K = dshapes[s][2];
        if (!td_gemm_bf16dp_available()) {
            printf("bench: gemm-bf16dp-%dx%dx%d tidal=NA peer=NA ratio=NA (no kernel for the order on this CPU: neither AVX512-BF16 nor AVX-512)\n", M, N, K);
            continue;
        }
        float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
        uint16_t *a16 = malloc(sizeof(uint16_t) * M * K), *w16 = malloc(sizeof(uint16_t) * N * K);
        for (long i = 0; i < (long)M * K; i++) {
            a16[i] = td_f32_to_bf16((float)((i * 7919) % 1000) * 1e-3f - 0.5f).bits;
            a[i] = td_bf16_to_f32((td_bf16){a16[i]});
        }
        for (long i = 0; i < (long)N * K; i++) {
            w16[i] = td_f32_to_bf16((float)((i * 104729) % 1000) * 1e-4f - 0.05f).bits;
            w[i] = td_bf16_to_f32((td_bf16){w16[i]});
        }
        double mine = gflops_dp(1, a16, w16, a, w, c, M, N, K), peer = gflops_dp(0, a16, w16, a, w, c, M, N, K);
        printf("bench: gemm-bf16dp-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f (kernel %s)\n", M, N, K, mine, peer, mine / peer,
               td_gemm_bf16dp_kernel_name());
        free(a); free(w); free(c); free(a16); free(w16);
    }
    return 0;
}
