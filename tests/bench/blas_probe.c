/* tidal — which OpenBLAS core this process runs, and whether it computes right on the benchmarks'
 * GEMM shapes (tests/bench.sh, issue 40). Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels at
 * load time from the CPU it recognises; on a CPU it does not know (a recent Xeon with AVX-512 BF16
 * and FP16) it falls back to its Prescott kernels (SSE3, no FMA), 3-8x slower than the AVX2 /
 * AVX-512 kernels the CPU can run. make bench then measures every OpenBLAS-based peer on that slow
 * core. bench.sh asks this program for the core (--core), for the family the CPU can run (--best),
 * and whether a core forced with OPENBLAS_CORETYPE gives right products (--check) before it uses
 * it for the whole bench.
 *   blas_probe --core     prints OpenBLAS's core name
 *   blas_probe --best     prints the OpenBLAS family this CPU's instructions allow: SkylakeX
 *                         (AVX-512 F/BW/DQ/VL), Haswell (AVX2 + FMA), or nothing
 *   blas_probe --check    sgemm on gemm_bench.c's shapes (all threads) against a float64 product
 *                         of the same operands, within the fp32 bound K * 2^-23 * sum |a||w| per
 *                         element; exit 0 when every element is inside, 1 otherwise */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *openblas_get_corename(void);

/* cores with AVX2 kernels: nothing faster to force on any CPU these run on */
static int vector_core(const char *c)
{
    static const char *fast[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    for (int i = 0; fast[i]; i++)
        if (!strcasecmp(c, fast[i])) return 1;
    return 0;
}

static int check(void)
{
    const int shapes[][3] = {{256, 4864, 896}, {256, 896, 4864}, {16, 896, 896}, {1, 4864, 896}};
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
        if (!a || !w || !c) { fprintf(stderr, "blas_probe: out of memory\n"); return 1; }
        for (long i = 0; i < (long)M * K; i++) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (long i = 0; i < (long)N * K; i++) w[i] = (float)((i * 104729) % 1000) * 1e-4f - 0.05f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, 0.0f, c, N);
        long wrong = 0;
        for (int m = 0; m < M; m += (M > 16 ? 17 : 1))   /* every 17th row of the large shapes: all columns */
            for (int n = 0; n < N; n++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)a[(long)m * K + k] * w[(long)n * K + k];
                    ref += p;
                    mag += fabs(p);
                }
                if (!(fabs(c[(long)m * N + n] - ref) <= K * 0x1p-23 * mag)) wrong++;
            }
        if (wrong) { printf("wrong %ld elements of %dx%dx%d\n", wrong, M, N, K); bad = 1; }
        free(a); free(w); free(c);
    }
    return bad;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "--core";
    if (!strcmp(mode, "--core")) { printf("%s\n", openblas_get_corename()); return 0; }
    if (!strcmp(mode, "--best")) {
        __builtin_cpu_init();
        const char *core = openblas_get_corename();
        if (vector_core(core)) return 0;   /* OpenBLAS already runs vector kernels */
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
            printf("SkylakeX\n");
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            printf("Haswell\n");
        return 0;
    }
    if (!strcmp(mode, "--check")) return check();
    fprintf(stderr, "usage: blas_probe [--core | --best | --check]\n");
    return 2;
}
