/* tidal — per-thread scratch of the GEMM kernels (gemm_scratch.h) */
#include "gemm_scratch.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_key_t keys[TD_SCRATCH_SLOTS];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void keys_make(void)
{
    for (int s = 0; s < TD_SCRATCH_SLOTS; s++) (void)pthread_key_create(&keys[s], free);
}

float *td_gemm_scratch(td_scratch_slot slot, size_t floats)
{
    pthread_once(&keys_once, keys_make);
    size_t *p = pthread_getspecific(keys[slot]);   /* p[0]: capacity in floats; floats from p + 16 */
    if (p && p[0] >= floats) return (float *)(p + 16);
    free(p);
    (void)pthread_setspecific(keys[slot], NULL);
    p = aligned_alloc(64, 16 * sizeof(size_t) + ((floats * sizeof(float) + 63) & ~(size_t)63));
    if (!p) return NULL;
    p[0] = floats;
    (void)pthread_setspecific(keys[slot], p);
    return (float *)(p + 16);
}
