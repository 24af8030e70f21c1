/* tidal — speed of the batch-invariant GEMM (td_gemm_fixed, src/recipe/gemm_fixed.c) against
 * OpenBLAS sgemm on the same product, one thread each, Qwen2.5-0.5B shapes:
 *   C (M, N) = A (M, K) . W (N, K)^T     M = token rows, N = output features, K = input features
 * The two sides in turn, best of BENCH_ROUNDS rounds each (bench_pair.h). Prints
 *   bench: gemm-fixed-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R   (peer = sgemm; R = tidal / peer)
 * Built and run by tests/bench/gemm.sh. */
#include "tidal/gemm.h"
#include "bench_pair.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

void openblas_set_num_threads(int);

typedef struct { int M, N, K; const float *a, *w; float *c; } shape;

/* which: 1 tidal, 0 sgemm */
static void run(int which, const void *ctx)
{
    const shape *s = ctx;
    if (which) td_gemm_fixed(s->a, s->K, s->w, s->K, s->c, s->N, s->M, s->N, s->K, 0);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->M, s->N, s->K, 1.0f, s->a, s->K, s->w, s->K, 0.0f, s->c, s->N);
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
        shape sh = {M, N, K, a, w, c};
        double g[2];
        bench_pair(run, &sh, (const int[2]){1, 0}, 2.0 * M * N * K * 1e-9, g);
        printf("bench: gemm-fixed-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f\n", M, N, K, g[0], g[1], g[0] / g[1]);
        free(a); free(w); free(c);
    }
    return 0;
}
