/* What the paths layer's files share among themselves (not part of libtidal's API). */
#ifndef TIDAL_PATHS_INTERNAL_H
#define TIDAL_PATHS_INTERNAL_H

#include <stdio.h>

#include "tidal/model.h"
#include "../model/ops.h"

/* Where the host reads n floats of a backend buffer (logits rows, after be->download): the
 * buffer itself on the CPU, whose buffers are host memory; a host allocation on a device. */
static inline float *paths_host_mirror(const td_ops *ops, float *buf, size_t n)
{
    return ops->be->sync ? td_xmalloc(n * sizeof(float)) : buf;
}

/* Rows kept in backend memory (model.h td_rows_dev): nrows * V floats at rows. */
struct td_rows_dev {
    td_ops ops;              /* the model's backend (row_logsoftmax, token_metrics, upload)  */
    float *rows;
    size_t nrows;
    int V;
};

/* The kept row of position pos of sequence s under map m, or -1 when pos is not kept. */
static inline long rows_dev_row(const td_rows_dev_map *m, int s, int pos)
{
    return m && m->rows && pos >= m->from[s] ? (long)(m->base[s] + (size_t)(pos - m->from[s])) : -1;
}

/* The vocabulary size of the session's model: the length of its rows. */
int session_vocab(const td_session *s);
/* Where long work on the session's model reports progress (m->progress; NULL: silent). */
FILE *session_progress(const td_session *s);
/* Called by session_prefill_dev with R consecutive rows in backend memory (raw logits or
 * log-softmax, as the session is set): row r, at rows + r * V, follows position pos0 + r of
 * the slot (it predicts pos0 + r + 1). Valid during the call; work the callee queues on the
 * backend's stream (row_logsoftmax) runs before the buffer is written again. */
typedef void (*session_rows_fn)(void *user, int slot, int pos0, const float *rows, int R);

/* td_session_prefill whose outputs stay in backend memory (the rollout on a device): last_dev
 * (V floats of backend memory, not NULL) receives the row after the last token, rows_fn (if
 * set) every appended position's row chunk by chunk, in backend memory. Nothing comes to the
 * host. */
int session_prefill_dev(td_session *s, int slot, const int *tokens, int n, float *last_dev,
                        session_rows_fn rows_fn, void *user, td_error *err);

/* The session's op context (its backend: be->sample, be->alloc for rows kept on the device). */
const td_ops *session_ops(const td_session *s);

#endif
