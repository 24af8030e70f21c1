/* Growable column buffers for one batch of run-file rows (internal to the diff job). */
#ifndef TIDAL_DIFF_COLUMNS_H
#define TIDAL_DIFF_COLUMNS_H

#include "tidal/metrics.h"
#include "tidal/runschema.h"

typedef struct {
    const char *path;     /* dataset path, e.g. "/tokens/logp_a" */
    td_coltype type;
    size_t n, cap;
    void *data;
} td_column;

/* Empty buffers for the schema's columns spec[0..n). */
void td_columns_init(td_column *cols, const td_colspec *spec, size_t n);
void td_column_push(td_column *c, const void *value);
void td_column_push_n(td_column *c, const void *values, size_t n);
void td_column_push_i64(td_column *c, int64_t v);
void td_column_push_i32(td_column *c, int32_t v);
void td_column_push_i8(td_column *c, int8_t v);
void td_column_push_f64(td_column *c, double v);
void td_columns_clear(td_column *cols, size_t n);
void td_columns_free(td_column *cols, size_t n);
/* One scored token's /tokens row (the schema's columns but the optional last one): its
 * sequence row, position, token, the two paths' metrics, B's processed log-prob and the
 * generation step (pos - prompt_len; < 0 and is_prompt set in the prompt). */
void td_columns_push_token(td_column *tcols, int64_t seq_row, int pos, int token, const td_token_metrics *m,
                           double logp_b_proc, int prompt_len);

/* One /seqs row (the schema's columns before the optional text ones). */
typedef struct {
    int64_t prompt_index, batch, token_offset, tokens_offset;
    int32_t prompt_len, response_len, n_scored;
    int8_t finish;
    double sum_dlogp, mean_abs_dlogp, max_abs_dlogp, mean_kl_ba, log_ratio;
} td_seq_row;
void td_columns_push_seq(td_column *scols, const td_seq_row *r);

/* Appends every column's rows to the run file (same row count expected per group). */
int td_columns_write(td_runfile *rf, td_column *cols, size_t n, td_error *err);

#endif
