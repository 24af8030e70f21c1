/* tidal — the FP8 recipes' GEMMs against the FP16 recipes' on the same shapes, one thread each,
 * GFLOP/s, the way the CPU backend runs both (src/backend/cpu.c, matmul_recipe), in tiles of 128
 * output columns (TD_GEMM_TILE). Where the backend lays fp8 weights out in panels of 8 rows
 * (td_gemm_fp8_panels_preferred: AVX2 without AVX-512), both fp8 lines run the panel kernel on
 * codes so laid out (td_gemm_fp8_fast_panels), as the backend does; else:
 *   gemm-fp8fast   a prefill product under fp8-unified: each tile's e4m3 codes widened with their
 *                  128 x 128 block scales (td_fp8_decode_scaled_row), then DeepGEMM's fast
 *                  accumulation (td_gemm_fp8_fast: 32-product steps, 13 kept bits, promotion every
 *                  128); peer: the fp16 recipe's product, each tile's fp16 codes widened
 *                  (td_decode_row, F16C) and OpenBLAS's sgemm
 *   decode-gemm-fp8   a decode step (4 rows) under fp8-unified: the codes decoded in registers
 *                  (td_gemm_fp8_fast_codes; on a CPU without AVX2, where it declines, the widened
 *                  rows and td_gemm_fp8_fast, as the backend); peer: the fp16 recipe's decode kernel
 *                  (td_gemm_fixed_w16 on fp16 codes)
 * ratio = fp8 / fp16 (issue 38's goal: >= 0.8). Qwen2.5-0.5B's MLP shapes. The two sides in
 * turn, best of BENCH_ROUNDS rounds each (bench_pair.h). Built and run by tests/bench/gemm.sh. */
#include "tidal/formats.h"
#include "tidal/gemm.h"
#include "bench_pair.h"

#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void openblas_set_num_threads(int);

enum { TILE = 128, BLOCK = 128, PROMOTE = 128, BITS = 13 };

typedef struct {
    int M, N, K, nbc;
    const float *a;
    const uint8_t *w8, *w8p;   /* codes row-major, and in panels of 8 rows */
    const uint16_t *w16;
    const float *scale;
    float *tile, *c;
} shape;

/* 1 when this CPU has a td_gemm_fp8_fast_codes kernel (AVX-512 or AVX2); else a decode step takes
 * the widened rows, as the CPU backend does when the kernel declines */
static int codes_kernel;
/* 1 when the backend keeps fp8 weights in panels here (then s->w8p holds them so) */
static int panels;

/* which: 0 fp16 prefill, 1 fp8 prefill, 2 fp16 decode, 3 fp8 decode */
static void run(int which, const void *ctx)
{
    const shape *s = ctx;
    int M = s->M, N = s->N, K = s->K;
    for (int j0 = 0; j0 < N; j0 += TILE) {
        int nj = N - j0 < TILE ? N - j0 : TILE;
        float *c = s->c + j0;
        if ((which == 1 || which == 3) && panels) {
            td_gemm_fp8_fast_panels(s->a, K, s->w8p + (size_t)j0 * K, TD_E4M3, s->scale, j0, BLOCK, BLOCK, s->nbc, c, N,
                                    M, nj, K, PROMOTE, BITS, 1);
        } else if (which == 0) {
            td_decode_row(TD_F16, s->w16 + (size_t)j0 * K, s->tile, (size_t)nj * K);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nj, K, 1.0f, s->a, K, s->tile, K, 0.0f, c, N);
        } else if (which == 1 || !codes_kernel) {   /* prefill, or a decode step without the codes kernel */
            for (int j = 0; j < nj; j++)
                for (int k0 = 0; k0 < K; k0 += BLOCK)
                    td_fp8_decode_scaled_row(TD_E4M3, s->w8 + (size_t)(j0 + j) * K + k0,
                                             s->scale[(size_t)((j0 + j) / BLOCK) * s->nbc + k0 / BLOCK],
                                             s->tile + (size_t)j * K + k0, K - k0 < BLOCK ? K - k0 : BLOCK);
            td_gemm_fp8_fast(s->a, K, s->tile, K, c, N, M, nj, K, PROMOTE, BITS);
        } else if (which == 2) {
            td_gemm_fixed_w16(s->a, K, s->w16 + (size_t)j0 * K, K, TD_F16, c, N, M, nj, K, 0);
        } else {
            td_gemm_fp8_fast_codes(s->a, K, s->w8 + (size_t)j0 * K, K, TD_E4M3, s->scale, j0, BLOCK, BLOCK,
                                   s->nbc, c, N, M, nj, K, PROMOTE, BITS, 1);
        }
    }
}

int main(void)
{
    openblas_set_num_threads(1);
    /* one thread for tidal's row conversions too: td_decode_row splits rows of 2^18 values and
     * more over OpenMP's threads outside a parallel region, which gave the peer's tile widening
     * both cores; the backend widens its tiles inside its own region, one thread each */
    omp_set_num_threads(1);
    const int shapes[][3] = {{128, 4864, 896}, {128, 896, 4864}, {4, 4864, 896}, {4, 896, 4864}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], nbc = (K + BLOCK - 1) / BLOCK;
        float *a = malloc(sizeof(float) * M * K), *tile = malloc(sizeof(float) * TILE * K);
        float *c = malloc(sizeof(float) * M * N), *scale = malloc(sizeof(float) * ((N + BLOCK - 1) / BLOCK) * nbc);
        uint8_t *w8 = malloc((size_t)N * K), *w8p = malloc((size_t)(N + 7) / 8 * 8 * K);
        uint16_t *w16 = malloc(sizeof(uint16_t) * N * K);
        if (!a || !tile || !c || !scale || !w8 || !w8p || !w16) {
            fprintf(stderr, "fp8_bench: out of memory\n");
            return 1;
        }
        for (long i = 0; i < (long)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (long i = 0; i < (long)N * K; i++) {
            float v = (float)((i * 104729) % 1000) * 1e-4f - 0.05f;
            w16[i] = (uint16_t)td_encode(TD_F16, v, TD_SATFINITE);
            w8[i] = (uint8_t)td_encode(TD_E4M3, v * (448.0f / 0.05f), TD_SATFINITE);
        }
        for (int b = 0; b < ((N + BLOCK - 1) / BLOCK) * nbc; b++) scale[b] = 0.05f / 448.0f;
        td_fp8_codes_to_panels(w8, (size_t)N, (size_t)K, w8p);
        shape s = {M, N, K, nbc, a, w8, w8p, w16, scale, tile, c};
        panels = td_gemm_fp8_panels_preferred(TD_E4M3, BLOCK, BLOCK, PROMOTE);
        int decode = M <= TD_GEMM_FIXED_ROWS;
        codes_kernel = td_gemm_fp8_fast_codes(a, K, w8, K, TD_E4M3, scale, 0, BLOCK, BLOCK, nbc, c, N, M, 1, K,
                                              PROMOTE, BITS, 1);
        double g[2];
        bench_pair(run, &s, decode ? (const int[2]){3, 2} : (const int[2]){1, 0}, 2.0 * M * N * K * 1e-9, g);
        double fp8 = g[0], fp16 = g[1];
        printf("bench: %s-%dx%dx%d tidal=%.2f peer=%.2f ratio=%.3f (tidal: fp8-unified's %s; peer: fp16's %s)\n",
               decode ? "decode-gemm-fp8" : "gemm-fp8fast", M, N, K, fp8, fp16, fp8 / fp16,
               panels ? "codes in panels of 8 rows, decoded in registers"
               : !decode ? "widened tiles + fast accumulation"
               : codes_kernel ? "codes decoded in registers"
                              : "widened rows + fast accumulation: no codes kernel on this CPU",
               decode ? "td_gemm_fixed_w16" : "widened tiles + sgemm");
        free(a); free(tile); free(c); free(scale); free(w8); free(w8p); free(w16);
    }
    return 0;
}
