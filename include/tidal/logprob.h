/* tidal — log-softmax over one vocabulary row, the one form outside the op list: the max, the
 * sum of e^(x − max) accumulated in double in index order, one log. Sampling, the rollout's
 * rows (src/paths/rollout.c) and the per-token metrics (src/analysis/metrics.c) all take it
 * from here, so a row's log-probs are the same bits wherever they are computed.
 * (The model's own head, logsoftmax_forward in the op list, is the backend's: fp32 block sums,
 * rows split over threads; it serves the paths' teacher-forced and non-raw rows.) */
#ifndef TIDAL_LOGPROB_H
#define TIDAL_LOGPROB_H

#include "tidal/common.h"

TD_BEGIN_DECLS

/* log Σ_v e^row[v], in double (max + log of the double sum of e^(row[v] − max)); 0 for a row
 * that is −inf everywhere (or NaN: NaN entries are skipped by the max). */
double td_log_sum_exp(const float *row, int V);

/* In-place log-softmax: row[v] −= (float)td_log_sum_exp(row, V). */
void td_log_softmax(float *row, int V);

TD_END_DECLS

#endif
