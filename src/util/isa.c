/* The vector level the CPU kernels may use (include/tidal/isa.h). */
#include "tidal/isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
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

static td_isa level;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static void level_init(void)
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
    const char *cap = getenv("TIDAL_ISA");
    td_isa want = TD_ISA_AVX512;
    if (cap && !strcmp(cap, "avx2")) want = TD_ISA_AVX2;
    else if (cap && !strcmp(cap, "portable")) want = TD_ISA_PORTABLE;
    level = have < want ? have : want;
}

td_isa td_isa_level(void)
{
    pthread_once(&level_once, level_init);
    return level;
}

int td_cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return td_isa_level() >= TD_ISA_AVX512 && cpuid_bit(7, 1, 0, 5);   /* leaf 7.1 EAX bit 5 */
#else
    return 0;
#endif
}
