/* tidal — speed of the batch-invariant GEMM (td_gemm_fixed, src/recipe/gemm_fixed.c) against
 * OpenBLAS sgemm on the same product, one thread each, Qwen2.5-0.5B shapes:
 *   C (M, N) = A (M, K) . W (N, K)^T     M = token rows, N = output features, K = input features
 * Each side runs until 0.3 s have passed, best of 3. Prints
 *   bench: gemm-fixed-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R   (peer = sgemm; R = tidal / peer)
 * Built and run by tests/bench/gemm.sh. */
#include "tidal/gemm.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static double gflops(int which, const float *a, const float *w, float *c, int M, int N, int K)
{
    double best = 0;
    for (int round = 0; round < 3; round++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            if (which) td_gemm_fixed(a, K, w, K, c, N, M, N, K, 0);
            else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, c, N);
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
    /* prefill (256 rows), a small batch, decode steps of 8 slots (the MLP's down projection: K
     * longer than one span of the packed driver) and of one slot */
    const int shapes[][3] = {{256, 4864, 896}, {256, 896, 4864}, {16, 896, 896}, {8, 896, 4864}, {1, 4864, 896}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
        for (long i = 0; i < (long)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (long i = 0; i < (long)N * K; i++) w[i] = (float)((i * 104729) % 1000) * 1e-4f - 0.05f;
        double mine = gflops(1, a, w, c, M, N, K), peer = gflops(0, a, w, c, M, N, K);
        printf("bench: gemm-fixed-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f\n", M, N, K, mine, peer, mine / peer);
        free(a); free(w); free(c);
    }
    return 0;
}
