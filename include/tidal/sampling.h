/* tidal — sampling for the inference path, as engines do it, and the two kinds of log-probs
 * they report.
 *
 * Order, as vLLM's sampler applies it: repetition penalty on the raw logits (HF's rule: a
 * logit l of a token already in prompt or response becomes l/p if l > 0, l·p otherwise),
 * temperature (logits divided by T), min-p (drop tokens with probability < min_p · p_max),
 * top-k (keep the k largest, and any tied with the k-th), top-p (keep the smallest set of
 * largest tokens whose probability sums to >= p). HF generate applies min-p last; the two
 * orders differ only when min-p is combined with top-k/top-p.
 * Filtered tokens get -inf. temperature 0 means greedy.
 *   raw log-probs        log-softmax of the model's logits (what a trainer computes)
 *   processed log-probs  log-softmax after the processing above (what vLLM returns with
 *                        logprobs_mode=processed_logprobs)
 * Sampling draws from the processed distribution with a per-sequence seeded stream, so a
 * sequence's tokens do not depend on which other sequences share its batch. */
#ifndef TIDAL_SAMPLING_H
#define TIDAL_SAMPLING_H

#include "tidal/logprob.h"   /* td_log_softmax */
#include "tidal/rng.h"

#include <stdbool.h>

TD_BEGIN_DECLS

typedef struct {
    double temperature;          /* 1 = none, 0 = greedy            */
    double top_p;                /* 1 = none                        */
    int top_k;                   /* 0 = none                        */
    double min_p;                /* 0 = none                        */
    double repetition_penalty;   /* 1 = none                        */
} td_sampling;

static inline td_sampling td_sampling_default(void)
{
    return (td_sampling){.temperature = 1.0, .top_p = 1.0, .top_k = 0, .min_p = 0.0, .repetition_penalty = 1.0};
}

/* Checks ranges; 0 or -1 + err naming the flag. */
int td_sampling_check(const td_sampling *s, td_error *err);

/* Scratch for one vocabulary size; reused across calls (no per-token allocation). */
typedef struct td_sampler td_sampler;
td_sampler *td_sampler_create(int V);
void td_sampler_free(td_sampler *s);

/* Processes `logits` (V, not modified) given the tokens seen so far (for the penalty) and
 * draws a token with rng. Writes processed log-probs to logp_proc (V) if not NULL. Returns the
 * token. */
int td_sample(td_sampler *smp, const td_sampling *s, const float *logits, const int *seen,
              int n_seen, td_rng *rng, float *logp_proc);

TD_END_DECLS

#endif
