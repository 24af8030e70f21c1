/* xoshiro256** (Blackman & Vigna), seeded through splitmix64. */
#include "tidal/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void td_rng_seed(td_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

void td_rng_stream(td_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    td_rng_seed(r, splitmix64(&x) ^ stream);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t td_rng_next(td_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t td_rng_u32(td_rng *r) { return (uint32_t)(td_rng_next(r) >> 32); }

double td_rng_uniform(td_rng *r) { return (double)(td_rng_next(r) >> 11) * 0x1.0p-53; }

double td_rng_normal(td_rng *r)
{
    double u1 = td_rng_uniform(r), u2 = td_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t td_rng_below(td_rng *r, uint64_t n)
{
    if (n == 0) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;   /* reject the short last bucket */
    uint64_t x;
    do x = td_rng_next(r); while (x >= limit);
    return x % n;
}
