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
 * The two sides in turn, best of BENCH_ROUNDS rounds each (bench_pair.h). Prints
 *   bench: NAME-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
 * Built and run by tests/bench/gemm.sh. */
#include "tidal/formats.h"
#include "tidal/gemm.h"
#include "bench_pair.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void openblas_set_num_threads(int);

enum { TILE = 128 };

typedef struct {
    int M, N, K;
    const float *a, *w;            /* fp32 operands (gemm-bf16dp's peer) */
    const uint16_t *a16, *w16;     /* bf16 operands */
    float *tile, *c;
} shape;

/* which: 1 tidal's decode kernel, 0 its peer (widened tiles + sgemm / sgemv);
 * 3 td_gemm_bf16dp, 2 its peer (sgemm on the fp32 values) */
static void run(int which, const void *ctx)
{
    const shape *s = ctx;
    int M = s->M, N = s->N, K = s->K;
    if (which == 3) {
        td_gemm_bf16dp(s->a16, K, s->w16, K, s->c, N, M, N, K, 0);
        return;
    }
    if (which == 2) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, s->a, K, s->w, K, 0.0f, s->c, N);
        return;
    }
    for (int j0 = 0; j0 < N; j0 += TILE) {
        int nj = N - j0 < TILE ? N - j0 : TILE;
        const uint16_t *wt = s->w16 + (size_t)j0 * K;
        if (which) {
            td_gemm_fixed_w16(s->a, K, wt, K, TD_BF16, s->c + j0, N, M, nj, K, 0);
            continue;
        }
        td_decode_row(TD_BF16, wt, s->tile, (size_t)nj * K);
        if (M == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, nj, K, 1.0f, s->tile, K, s->a, 1, 0.0f, s->c + j0, 1);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nj, K, 1.0f, s->a, K, s->tile, K, 0.0f, s->c + j0, N);
    }
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
        shape sh = {M, N, K, a, NULL, NULL, w, tile, c};
        double g[2];
        bench_pair(run, &sh, (const int[2]){1, 0}, 2.0 * M * N * K * 1e-9, g);
        printf("bench: decode-gemm-bf16-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f\n", M, N, K, g[0], g[1], g[0] / g[1]);
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
        shape sh = {M, N, K, a, w, a16, w16, NULL, c};
        double g[2];
        bench_pair(run, &sh, (const int[2]){3, 2}, 2.0 * M * N * K * 1e-9, g);
        printf("bench: gemm-bf16dp-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f (kernel %s)\n", M, N, K, g[0], g[1], g[0] / g[1],
               td_gemm_bf16dp_kernel_name());
        free(a); free(w); free(c); free(a16); free(w16);
    }
    return 0;
}
