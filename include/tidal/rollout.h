/* tidal — rollouts on the inference path: a batch of prompts prefilled into a session's
 * KV-cache slots, then sampled and decoded together, one token per unfinished sequence per
 * batched decode step, until each draws a token of the stop set or reaches its length limit.
 * tidal-diff generates its responses with it; tidal-rl generates its completions with it.
 *
 * Sampling is engine-style (sampling.h) on the session's raw logits, each sequence drawing from
 * its own stream of the seed (td_rng_stream(seed, stream[s])), so a sequence's tokens depend on
 * the seed and its stream id only, not on which other sequences share the batch (its logits can:
 * a recipe that is not batch-invariant gives a slot different rows in a different batch).
 * The log-softmax of each row is taken here, once (td_log_softmax), so callers get log-probs,
 * not logits:
 *   raw log-prob        log-softmax of the model's logits (what a trainer recomputes)
 *   processed log-prob  after the sampling processing (vLLM's processed_logprobs)
 *
 * For tidal-rl, G completions of one prompt are G sequences with the same prompt and distinct
 * streams (e.g. stream = prompt_index * G + g). */
#ifndef TIDAL_ROLLOUT_H
#define TIDAL_ROLLOUT_H

#include "tidal/model.h"
#include "tidal/runschema.h"
#include "tidal/sampling.h"

TD_BEGIN_DECLS

typedef struct {
    td_sampling sampling;
    int max_new_tokens;      /* response tokens per sequence at most                            */
    int max_len;             /* prompt + response at most (the token buffers' capacity, and at
                                most the session's max_len)                                     */
    const int *eos;          /* the stop set (generation_config.json's eos list, ...)           */
    int n_eos;
    int stop_at_eos;         /* 0: run every sequence to its length limit                        */
    uint64_t seed;
    int prompt_rows;         /* also give row_fn the prompt's rows (positions 1 .. P-1)           */
    double logit_noise;      /* > 0: a synthetic mismatch (tidal-rl's dose-response arm): every
                                response row's raw logits get N(0, logit_noise^2) added per entry
                                before sampling, drawn from td_rng_stream(noise_seed, stream[s])
                                in position order, so the noise is the sequence's alone; the
                                log-probs handed out are those of the noisy logits (the rollout
                                policy is the noisy one)                                          */
    uint64_t noise_seed;
    float row_temperature;   /* rows and logp are log-softmax(logits / T) (fp32 division, as
                                vLLM's sampler does it); 0 or 1 = raw logits                     */
} td_rollout_opts;

typedef struct {
    int n;                   /* sequences; sequence s runs in session slot s (n <= the slots)    */
    int **tokens;            /* (n) buffers of max_len ints: the prompt on entry, prompt +
                                response on return                                               */
    const int *prompt_len;   /* (n) >= 1                                                         */
    const uint64_t *stream;  /* (n) each sequence's RNG stream of the seed                       */
    int *len;                /* (n) out: prompt + response length                                */
    int *finish;             /* (n) out: TD_FINISH_EOS or TD_FINISH_LENGTH (runschema.h)         */
    float **logp;            /* (n) optional (NULL, or a NULL entry): buffers of max_len; out:
                                logp[s][pos] = raw log-prob of the token at pos, for response
                                positions (and prompt positions 1.. with prompt_rows)            */
    float **logp_proc;       /* (n) optional, as logp: the processed log-prob (prompt positions:
                                the raw one; on a device that samples, left unwritten where keep
                                holds the row and neither row_fn nor logp reads it: it is that
                                row's value at the token, td_forward_metrics' logp_b)            */
    td_rows_dev_map keep;    /* optional (keep.rows NULL: none): the raw log-softmax row of every
                                kept position (model.h td_rows_dev_map; response positions, and
                                prompt positions with prompt_rows) is written to the device rows
                                there; neither a decode step's rows nor prefill's (prompt rows,
                                each sequence's last row) then come to the host unless row_fn or
                                logp asks for them                                               */
} td_rollout_batch;

/* Called for every position pos a row predicted (response positions; prompt positions 1 .. P-1
 * with prompt_rows), once the token there is known (tokens[seq][pos]): logp (V) is the raw
 * log-softmax row that predicted it, valid during the call only; logp_proc the token's
 * processed log-prob (prompt positions: logp[token]). */
typedef void (*td_rollout_row_fn)(void *user, int seq, int pos, const float *logp, float logp_proc);

/* Generates the batch's responses on session `s` (its recipe, its layer observer, if set, sees
 * every prefill and decode step), with sampler scratch `smp` (vocab size). Resets slots 0..n-1
 * and sets the session to raw logits. row_fn may be NULL. 0, or -1 + err. */
int td_rollout_generate(td_session *s, td_sampler *smp, const td_rollout_opts *o, td_rollout_batch *b,
                        td_rollout_row_fn row_fn, void *user, td_error *err);

TD_END_DECLS

#endif
