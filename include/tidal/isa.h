/* tidal — which vector instructions the CPU kernels may use (src/util/isa.c).
 *
 * Kernels with a wider form (AVX-512, AVX2) pick it at run time by what the CPU has, capped by
 * the environment variable TIDAL_ISA (avx512 | avx2 | portable): TIDAL_ISA=avx2 on an AVX-512
 * machine runs what an AVX2-only machine would (the benches measure the portable paths that
 * way), TIDAL_ISA=portable the plain C forms. Unset or unknown: no cap. Read once. */
#ifndef TIDAL_ISA_H
#define TIDAL_ISA_H

#include "tidal/common.h"

TD_BEGIN_DECLS

typedef enum { TD_ISA_PORTABLE = 0, TD_ISA_AVX2 = 1, TD_ISA_AVX512 = 2 } td_isa;

/* The widest level the kernels may use: AVX2 means AVX2 + FMA + F16C, AVX-512 means F, BW,
 * DQ, VL on top (its BF16 dot products are checked separately by their kernel). */
td_isa td_isa_level(void);

/* 1 when the level is AVX-512 and the CPU has AVX512-BF16 (vdpbf16ps). */
int td_cpu_has_avx512bf16(void);

/* OpenBLAS's core (openblas_get_corename: "SkylakeX", "Haswell", "Zen", ...), NULL when the BLAS
 * is not OpenBLAS. */
const char *td_blas_core(void);

/* The core to set in OPENBLAS_CORETYPE when OpenBLAS fell back to an old core (Prescott, ...) on
 * a CPU with AVX2 + FMA ("Haswell") or AVX-512 ("SkylakeX"); NULL when its choice stands or the
 * variable is set already. The tools apply it before main (src/util/opts.c). */
const char *td_blas_core_to_force(void);

/* Inner loops compiled twice (AVX2 + FMA and the build's x86-64-v2 baseline), picked at load time
 * by the CPU, for element-wise loops that run at half width at the baseline. The build is ISO C11
 * (-std=c11), under which GCC does not contract a * b + c into an FMA (-ffp-contract=off is that
 * mode's default), so a clone gives the baseline's bits wherever each element's operations are
 * its own (no reduction whose order follows the vector width). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TD_CLONES
#endif

TD_END_DECLS

#endif
