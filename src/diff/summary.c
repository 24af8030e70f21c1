/* The end-of-run summary of a run file (td_diff_summarize, include/tidal/diff.h). */
#include "tidal/diff.h"
#include "tidal/runschema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int td_diff_summarize(const char *run_path, td_diff_summary *s, td_error *err)
{
    memset(s, 0, sizeof *s);
    td_runfile *rf = td_runfile_open(run_path, 0, err);
    if (!rf) return -1;
    int64_t n = td_runfile_rows(rf, td_schema_tokens[TD_TOK_LOGP_A].path);
    s->seqs = td_runfile_rows(rf, td_schema_seqs[TD_SEQ_PROMPT_INDEX].path);
    s->tokens = n;
    int rc = 0;
    if (n < 0 || s->seqs < 0) {
        td_runfile_close(rf, NULL);
        return td_fail(err, "%s: /tokens or /seqs claims more rows than the file holds (corrupt file?)", run_path);
    }
    if (n > 0) {
        double *d = td_xmalloc((size_t)n * sizeof(double)), *kl = td_xmalloc((size_t)n * sizeof(double));
        double *k3 = td_xmalloc((size_t)n * sizeof(double));
        int32_t *ta = td_xmalloc((size_t)n * 4), *tb = td_xmalloc((size_t)n * 4);
        rc = td_runfile_read(rf, td_schema_tokens[TD_TOK_DLOGP].path, TD_COL_F64, 0, n, d, err) ||
             td_runfile_read(rf, td_schema_tokens[TD_TOK_KL_BA].path, TD_COL_F64, 0, n, kl, err) ||
             td_runfile_read(rf, td_schema_tokens[TD_TOK_K3].path, TD_COL_F64, 0, n, k3, err) ||
             td_runfile_read(rf, td_schema_tokens[TD_TOK_TOP1_A].path, TD_COL_I32, 0, n, ta, err) ||
             td_runfile_read(rf, td_schema_tokens[TD_TOK_TOP1_B].path, TD_COL_I32, 0, n, tb, err) ? -1 : 0;
        if (rc == 0) {
            double sa = 0, sk = 0, s3 = 0;
            int64_t agree = 0, nkl = 0;
            for (int64_t i = 0; i < n; i++) {
                d[i] = fabs(d[i]);
                sa += d[i];
                if (!isnan(kl[i])) { sk += kl[i]; nkl++; }
                s3 += k3[i];
                agree += ta[i] == tb[i];
            }
            qsort(d, (size_t)n, sizeof(double), cmp_double);
            s->mean_abs_dlogp = sa / n;
            s->p99_abs_dlogp = d[(size_t)((n - 1) * 0.99)];
            s->max_abs_dlogp = d[n - 1];
            s->mean_kl_ba = nkl ? sk / nkl : NAN;
            s->mean_k3 = s3 / n;
            s->top1_agree = tb[0] < 0 ? NAN : (double)agree / n;
        }
        free(d); free(kl); free(k3); free(ta); free(tb);
    }
    if (rc == 0 && n > 0 && td_runfile_exists(rf, td_schema_routing_flip.path)) {
        size_t Lm = td_runfile_width(rf, td_schema_routing_flip.path);
        signed char *fl = Lm ? td_xmalloc((size_t)n * Lm) : NULL;
        if (fl && td_runfile_read(rf, td_schema_routing_flip.path, TD_COL_I8, 0, n, fl, err)) rc = -1;
        if (fl && rc == 0) {
            s->moe_layers = (int)Lm;
            int64_t any = 0, routed = 0;
            for (size_t m = 0; m < Lm && m < 128; m++) {
                int64_t f = 0, r = 0;
                for (int64_t i = 0; i < n; i++) {
                    signed char v = fl[(size_t)i * Lm + m];
                    r += v >= 0;
                    f += v == 2;
                }
                s->route_flip_rate[m] = r ? (double)f / r : NAN;
            }
            for (int64_t i = 0; i < n; i++) {
                int f = 0, r = 0;
                for (size_t m = 0; m < Lm; m++) { f |= fl[(size_t)i * Lm + m] == 2; r |= fl[(size_t)i * Lm + m] >= 0; }
                any += f;
                routed += r;
            }
            s->route_tokens_flipped = routed ? (double)any / routed : NAN;
            td_error e2;
            char *rr = td_runfile_get_str(rf, "routing_replay", &e2);
            snprintf(s->routing_replay, sizeof s->routing_replay, "%s", rr && strcmp(rr, "none") ? rr : "");
            free(rr);
        }
        free(fl);
    }
    td_runfile_close(rf, NULL);
    return rc;
}
