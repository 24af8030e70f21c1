/* The vector level the CPU kernels may use (include/tidal/isa.h). */
#include "tidal/isa.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* a CPUID feature bit (what __builtin_cpu_supports cannot name in every compiler: clang 14 knows
 * neither "f16c" nor "avx512bf16"); the AVX state it needs is checked by the avx2 / avx512f
 * tests beside it */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit)
{
    unsigned r[4] = {0};
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1u;
}
#endif

/* the level once known (-1 before): the kernels ask per row, and a pthread_once call each time was
 * 1-2 % of an fp8 diff's profile on an AVX2 CPU */
static _Atomic int level_known = -1;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

/* what the CPU has, whatever TIDAL_ISA says */
static td_isa cpu_level(void)
{
    td_isa have = TD_ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_bit(1, 0, 2, 29)) {  /* F16C: ECX 29 */
        have = TD_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
            have = TD_ISA_AVX512;
    }
#endif
    return have;
}

static void level_init(void)
{
    td_isa have = cpu_level();
    const char *cap = getenv("TIDAL_ISA");
    td_isa want = TD_ISA_AVX512;
    if (cap && !strcmp(cap, "avx2")) want = TD_ISA_AVX2;
    else if (cap && !strcmp(cap, "portable")) want = TD_ISA_PORTABLE;
    atomic_store_explicit(&level_known, (int)(have < want ? have : want), memory_order_relaxed);
}

td_isa td_isa_level(void)
{
    int l = atomic_load_explicit(&level_known, memory_order_relaxed);
    if (l < 0) {   /* the first calls: pthread_once orders them after level_init's store */
        pthread_once(&level_once, level_init);
        l = atomic_load_explicit(&level_known, memory_order_relaxed);
    }
    return (td_isa)l;
}

int td_cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return td_isa_level() >= TD_ISA_AVX512 && cpuid_bit(7, 1, 0, 5);   /* leaf 7.1 EAX bit 5 */
#else
    return 0;
#endif
}

/* OpenBLAS (built with DYNAMIC_ARCH, as Debian's is) picks its kernels by the CPU model when it is
 * loaded. A model its table does not know falls back to an old core: Debian 12's 0.3.21 on a
 * recent Xeon (AVX-512 with BF16 and FP16) runs Prescott, SSE3 without FMA, and every fp32 GEMM of
 * tidal at a quarter to a third of the speed (a training step in fp16-train: about 940 tokens/s
 * against 2,730 with SkylakeX, reports/cpu-speed.md; issue 40 found the fallback). The variable OPENBLAS_CORETYPE names the core instead, read
 * at load time too, so a program that needs it sets it and executes itself again, before main:
 * the tools' start-up does (src/util/opts.c), which every program of the build that loads OpenBLAS
 * links (ldd, 2026-11-30). */
char *openblas_get_corename(void) __attribute__((weak));

const char *td_blas_core(void)
{
    return openblas_get_corename ? openblas_get_corename() : NULL;
}

const char *td_blas_core_to_force(void)
{
    if (getenv("OPENBLAS_CORETYPE")) return NULL;   /* the user's choice (or an earlier pass's) */
    const char *core = td_blas_core();
    if (!core) return NULL;
    static const char *const old[] = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
        "Atom", "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3",
        "Barcelona", "Nano", "Sandybridge", "Bobcat"};
    int fallback = 0;
    for (size_t i = 0; i < sizeof old / sizeof *old; i++) fallback |= !strcasecmp(core, old[i]);
    if (!fallback) return NULL;
    td_isa have = cpu_level();
    return have == TD_ISA_AVX512 ? "SkylakeX" : have == TD_ISA_AVX2 ? "Haswell" : NULL;
}
