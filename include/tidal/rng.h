/* tidal — seeded pseudo-random numbers (xoshiro256** seeded through splitmix64).
 * Every random choice in tidal goes through one of these, so results reproduce from a seed;
 * td_rng_stream derives independent streams (per sequence, per thread) from one seed. */
#ifndef TIDAL_RNG_H
#define TIDAL_RNG_H

#include "tidal/common.h"

TD_BEGIN_DECLS

typedef struct { uint64_t s[4]; } td_rng;

void     td_rng_seed(td_rng *r, uint64_t seed);
/* The stream-th independent generator of a seed (e.g. one per sequence index). */
void     td_rng_stream(td_rng *r, uint64_t seed, uint64_t stream);
uint64_t td_rng_next(td_rng *r);
uint32_t td_rng_u32(td_rng *r);
double   td_rng_uniform(td_rng *r);            /* [0, 1), 53 bits */
double   td_rng_normal(td_rng *r);             /* standard normal (Box-Muller) */
uint64_t td_rng_below(td_rng *r, uint64_t n);  /* uniform in [0, n), unbiased */

TD_END_DECLS

#endif
