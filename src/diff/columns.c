/* Growable column buffers (see columns.h). */
#include "columns.h"

#include <stdlib.h>
#include <string.h>

void td_columns_init(td_column *cols, const td_colspec *spec, size_t n)
{
    for (size_t i = 0; i < n; i++) cols[i] = (td_column){spec[i].path, spec[i].type, 0, 0, NULL};
}

void td_column_push(td_column *c, const void *value)
{
    size_t sz = td_coltype_size(c->type);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->data = td_xrealloc(c->data, c->cap * sz);
    }
    memcpy((char *)c->data + c->n * sz, value, sz);
    c->n++;
}

void td_column_push_n(td_column *c, const void *values, size_t n)
{
    size_t sz = td_coltype_size(c->type);
    if (c->n + n > c->cap) {
        while (c->n + n > c->cap) c->cap = c->cap ? 2 * c->cap : 1024;
        c->data = td_xrealloc(c->data, c->cap * sz);
    }
    if (n) memcpy((char *)c->data + c->n * sz, values, n * sz);
    c->n += n;
}

void td_column_push_i64(td_column *c, int64_t v) { td_column_push(c, &v); }
void td_column_push_i32(td_column *c, int32_t v) { td_column_push(c, &v); }
void td_column_push_i8(td_column *c, int8_t v) { td_column_push(c, &v); }
void td_column_push_f64(td_column *c, double v) { td_column_push(c, &v); }

void td_columns_push_token(td_column *c, int64_t seq_row, int pos, int token, const td_token_metrics *m,
                           double logp_b_proc, int prompt_len)
{
    td_column_push_i64(&c[TD_TOK_SEQ], seq_row);
    td_column_push_i32(&c[TD_TOK_POS], pos);
    td_column_push_i32(&c[TD_TOK_TOKEN], token);
    td_column_push_f64(&c[TD_TOK_LOGP_A], m->logp_a);
    td_column_push_f64(&c[TD_TOK_LOGP_B], m->logp_b);
    td_column_push_f64(&c[TD_TOK_LOGP_B_PROC], logp_b_proc);
    td_column_push_f64(&c[TD_TOK_DLOGP], m->logp_b - m->logp_a);
    td_column_push_f64(&c[TD_TOK_KL_BA], m->kl_ba);
    td_column_push_f64(&c[TD_TOK_KL_AB], m->kl_ab);
    td_column_push_f64(&c[TD_TOK_K3], m->k3);
    td_column_push_f64(&c[TD_TOK_TV], m->tv);
    td_column_push_f64(&c[TD_TOK_ENTROPY_A], m->entropy_a);
    td_column_push_f64(&c[TD_TOK_ENTROPY_B], m->entropy_b);
    td_column_push_i32(&c[TD_TOK_TOP1_A], m->top1_a);
    td_column_push_i32(&c[TD_TOK_TOP1_B], m->top1_b);
    td_column_push_i32(&c[TD_TOK_RANK_A], m->rank_a);
    td_column_push_i32(&c[TD_TOK_RANK_B], m->rank_b);
    td_column_push_i8(&c[TD_TOK_IS_PROMPT], pos < prompt_len);
    td_column_push_i32(&c[TD_TOK_STEP], pos - prompt_len);   /* generation step; < 0 in the prompt */
}

void td_columns_push_seq(td_column *c, const td_seq_row *r)
{
    td_column_push_i64(&c[TD_SEQ_PROMPT_INDEX], r->prompt_index);
    td_column_push_i64(&c[TD_SEQ_BATCH], r->batch);
    td_column_push_i32(&c[TD_SEQ_PROMPT_LEN], r->prompt_len);
    td_column_push_i32(&c[TD_SEQ_RESPONSE_LEN], r->response_len);
    td_column_push_i64(&c[TD_SEQ_TOKEN_OFFSET], r->token_offset);
    td_column_push_i32(&c[TD_SEQ_N_SCORED], r->n_scored);
    td_column_push_i8(&c[TD_SEQ_FINISH], r->finish);
    td_column_push_f64(&c[TD_SEQ_SUM_DLOGP], r->sum_dlogp);
    td_column_push_f64(&c[TD_SEQ_MEAN_ABS_DLOGP], r->mean_abs_dlogp);
    td_column_push_f64(&c[TD_SEQ_MAX_ABS_DLOGP], r->max_abs_dlogp);
    td_column_push_f64(&c[TD_SEQ_MEAN_KL_BA], r->mean_kl_ba);
    td_column_push_f64(&c[TD_SEQ_LOG_RATIO], r->log_ratio);
    td_column_push_i64(&c[TD_SEQ_TOKENS_OFFSET], r->tokens_offset);
}

void td_columns_clear(td_column *cols, size_t n)
{
    for (size_t i = 0; i < n; i++) cols[i].n = 0;
}

void td_columns_free(td_column *cols, size_t n)
{
    for (size_t i = 0; i < n; i++) { free(cols[i].data); cols[i].data = NULL; cols[i].n = cols[i].cap = 0; }
}

int td_columns_write(td_runfile *rf, td_column *cols, size_t n, td_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (td_runfile_append(rf, cols[i].path, cols[i].type, 1, cols[i].data, cols[i].n, err)) return -1;
    return 0;
}
