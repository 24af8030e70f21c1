/* tidal — per-token divergence between the training path (A) and the inference path (B).
 *
 * Inputs are two full log-softmax rows over the vocabulary (V) at the same position and the
 * token y scored there. With p = exp(logp) renormalised in double (float rows sum to 1 only
 * within ~1e-7, which would otherwise move a KL of 1e-8 below zero):
 *   logp_a, logp_b      log-prob of y;  Δ = logp_b − logp_a
 *   kl_ba = Σ p_b (logp_b − logp_a)    KL(B‖A), the rollout policy's view; summed as
 *                                      Σ p_b k3(a, b), each term ≥ 0, so never negative
 *   kl_ab = Σ p_a (logp_a − logp_b)    KL(A‖B), the same way
 *   k3    = e^r − 1 − r, r = logp_a − logp_b   ("vllm-kl" / mismatch_k3_kl, one-sample, ≥ 0)
 *   tv    = ½ Σ |p_a − p_b|            total variation
 *   entropy_a, entropy_b = −Σ p log p
 *   top1_a, top1_b  argmax token of each row; rank_a, rank_b = 1 + #{v : logp[v] > logp[y]}
 * Sums run in double over the whole vocabulary. */
#ifndef TIDAL_METRICS_H
#define TIDAL_METRICS_H

#include "tidal/common.h"

TD_BEGIN_DECLS

typedef struct {
    double logp_a, logp_b;
    double kl_ba, kl_ab, k3, tv;
    double entropy_a, entropy_b;
    int32_t top1_a, top1_b;
    int32_t rank_a, rank_b;
} td_token_metrics;

void td_token_metrics_compute(const float *logp_a, const float *logp_b, int V, int y,
                              td_token_metrics *m);

/* The same when B is known only by the log-prob of y (replayed rollouts): A's row gives
 * logp_a, entropy_a, top1_a, rank_a; k3 comes from the two log-probs; what needs B's whole
 * distribution (kl_ba, kl_ab, tv, entropy_b) is NaN and top1_b / rank_b are -1. */
void td_token_metrics_replay(const float *logp_a, int V, int y, double logp_b, td_token_metrics *m);

/* The entropy -sum_v e^l_v l_v of a log-prob row as it stands (not renormalised; td_token_metrics_replay's
 * entropy_a), exp's bits a block at a time. */
double td_logp_entropy(const float *logp, int V);

/* k3 from the two log-probs of the scored token alone (when only those are known, e.g.
 * replayed rollouts): e^r − 1 − r with r = logp_a − logp_b. */
double td_k3(double logp_a, double logp_b);

TD_END_DECLS

#endif
