/* The vector level the CPU kernels may use (include/tidal/isa.h). */
#include "tidal/isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static td_isa level;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static void level_init(void)
{
    td_isa have = TD_ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
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
