/* tidal — log-softmax rows kept in a model's backend memory (include/tidal/model.h td_rows_dev):
 * the inference path's rows of a tidal-diff batch, waiting on the device for the training path
 * to score the same positions (td_forward_metrics), so that neither path's V-wide rows come to
 * the host. Only a backend with row_logsoftmax and token_metrics has them (CUDA). */
#include "../model/model_internal.h"
#include "paths_internal.h"

#include <stdlib.h>

td_rows_dev *td_rows_dev_create(const td_model *m, size_t nrows)
{
    const td_backend *be = m->backend ? m->backend : &td_backend_cpu;
    if (!be->row_logsoftmax || !be->token_metrics) return NULL;
    td_rows_dev *r = td_xcalloc(1, sizeof *r);
    td_ops_init(&r->ops, be);
    r->nrows = nrows ? nrows : 1;
    r->V = m->cfg.vocab_size;
    r->rows = be->alloc(r->nrows * (size_t)r->V * sizeof(float));
    return r;
}

float *td_rows_dev_data(td_rows_dev *r) { return r->rows; }

void td_rows_dev_free(td_rows_dev *r)
{
    if (!r) return;
    r->ops.be->free(r->rows);
    free(r);
}
