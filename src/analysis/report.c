/* The report of one run as JSON (include/tidal/analysis.h): the single source the text,
 * Markdown and --json outputs are printed from. Non-finite numbers become JSON null. */
#include "tidal/analysis.h"

#include <gsl/gsl_histogram.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NA_REPLAY "n/a (replay)"

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *summary_json(const double *x, size_t n)
{
    td_summary s;
    td_summary_compute(x, n, &s);
    json_t *o = json_object();
    json_object_set_new(o, "count", json_integer((json_int_t)s.count));
    json_object_set_new(o, "mean", num(s.mean));
    json_object_set_new(o, "p50", num(s.p50));
    json_object_set_new(o, "p90", num(s.p90));
    json_object_set_new(o, "p99", num(s.p99));
    json_object_set_new(o, "max", num(s.max));
    return o;
}

/* Pearson and Spearman correlation of x and y over the pairs where both are finite
 * (gsl_stats_correlation; td_spearman = Pearson of average ranks, as gsl_stats_spearman). */
typedef struct { size_t n; double pearson, spearman; } corr_result;

static void correlation(const double *x, const double *y, size_t n, corr_result *r)
{
    double *a = td_xmalloc((n ? n : 1) * sizeof(double)), *b = td_xmalloc((n ? n : 1) * sizeof(double));
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && isfinite(y[i])) { a[m] = x[i]; b[m] = y[i]; m++; }
    r->n = m;
    r->pearson = r->spearman = NAN;
    if (m >= 2) {
        r->pearson = gsl_stats_correlation(a, 1, b, 1, m);
        r->spearman = td_spearman(a, b, m);
    }
    free(a);
    free(b);
}

static json_t *correlation_json(const corr_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "n", json_integer((json_int_t)r->n));
    json_object_set_new(o, "pearson", num(r->pearson));
    json_object_set_new(o, "spearman", num(r->spearman));
    return o;
}

/* Buckets of key (edges e[0] < ... < e[nb]): count, mean and max |dlogp|, mean KL(B‖A) over
 * tokens with a finite KL ("n/a (replay)" when kl is NULL). Counting and sums are GSL histograms with those ranges. */
static json_t *buckets_json(const double *key, const double *absd, const double *kl, size_t n,
                            const double *edges, size_t nb)
{
    gsl_histogram *cnt = gsl_histogram_alloc(nb), *sum = gsl_histogram_alloc(nb);
    gsl_histogram *kcnt = gsl_histogram_alloc(nb), *ksum = gsl_histogram_alloc(nb);
    gsl_histogram_set_ranges(cnt, edges, nb + 1);
    gsl_histogram_set_ranges(sum, edges, nb + 1);
    gsl_histogram_set_ranges(kcnt, edges, nb + 1);
    gsl_histogram_set_ranges(ksum, edges, nb + 1);
    double *mx = td_xcalloc(nb, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        size_t b;
        if (!isfinite(absd[i]) || gsl_histogram_find(cnt, key[i], &b)) continue;
        gsl_histogram_increment(cnt, key[i]);
        gsl_histogram_accumulate(sum, key[i], absd[i]);
        if (absd[i] > mx[b]) mx[b] = absd[i];
        if (kl && isfinite(kl[i])) { gsl_histogram_increment(kcnt, key[i]); gsl_histogram_accumulate(ksum, key[i], kl[i]); }
    }
    json_t *arr = json_array();
    for (size_t b = 0; b < nb; b++) {
        double c = gsl_histogram_get(cnt, b), kc = gsl_histogram_get(kcnt, b);
        json_t *o = json_object();
        json_object_set_new(o, "lo", num(edges[b]));
        json_object_set_new(o, "hi", num(edges[b + 1]));
        json_object_set_new(o, "count", json_integer((json_int_t)c));
        json_object_set_new(o, "mean_abs_dlogp", num(c > 0 ? gsl_histogram_get(sum, b) / c : NAN));
        json_object_set_new(o, "max_abs_dlogp", num(c > 0 ? mx[b] : NAN));
        json_object_set_new(o, "mean_kl_ba", !kl ? json_string(NA_REPLAY) : num(kc > 0 ? gsl_histogram_get(ksum, b) / kc : NAN));
        json_array_append_new(arr, o);
    }
    free(mx);
    gsl_histogram_free(cnt); gsl_histogram_free(sum); gsl_histogram_free(kcnt); gsl_histogram_free(ksum);
    return arr;
}

static json_t *ids_json(const int32_t *ids, size_t n, const td_report_opts *o)
{
    if (o->decode) {
        char *s = o->decode(o->decode_ctx, ids, n);
        if (s) { json_t *j = json_string(s); free(s); if (j) return j; }
    }
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *worst_tokens_json(const td_run *r, const double *absd, const td_report_opts *o)
{
    size_t k = o->n_worst < r->n ? o->n_worst : r->n;
    size_t *idx = td_xmalloc((k ? k : 1) * sizeof(size_t));
    gsl_sort_largest_index(idx, k, absd, 1, r->n);
    json_t *arr = json_array();
    for (size_t j = 0; j < k; j++) {
        size_t i = idx[j];
        if (absd[i] < 0) break;  // only non-finite Δlogp left
        json_t *t = json_object();
        json_object_set_new(t, "row", json_integer((json_int_t)i));
        json_object_set_new(t, "seq", json_integer(r->seq[i]));
        json_object_set_new(t, "pos", json_integer(r->pos[i]));
        json_object_set_new(t, "token", json_integer(r->token[i]));
        json_object_set_new(t, "logp_a", num(r->logp_a[i]));
        json_object_set_new(t, "logp_b", num(r->logp_b[i]));
        json_object_set_new(t, "dlogp", num(r->dlogp[i]));
        json_object_set_new(t, "kl_ba", num(r->kl_ba[i]));
        json_object_set_new(t, "text", ids_json(&r->token[i], 1, o));
        if (r->ids && r->pos[i] < r->seq_len[r->seq[i]]) {
            /* up to 8 tokens before the scored one, from the sequence's own ids */
            int32_t p0 = r->pos[i] > 8 ? r->pos[i] - 8 : 0;
            json_object_set_new(t, "context", ids_json(r->ids + r->ids_offset[r->seq[i]] + p0,
                                                       (size_t)(r->pos[i] - p0), o));
        }
        json_array_append_new(arr, t);
    }
    free(idx);
    return arr;
}

/* Sequences ranked by |log W|, W the sequence IS weight over response tokens. */
static json_t *worst_seqs_json(const td_run *r, const double *absd, const td_report_opts *o)
{
    size_t ns = r->nseq ? r->nseq : 1;
    double *logw = td_xcalloc(ns, sizeof(double)), *sumabs = td_xcalloc(ns, sizeof(double));
    double *mx = td_xcalloc(ns, sizeof(double)), *key = td_xmalloc(ns * sizeof(double));
    size_t *cnt = td_xcalloc(ns, sizeof(size_t));
    for (size_t i = 0; i < r->n; i++) {
        if (!(absd[i] >= 0)) continue;  // non-finite dlogp, marked -1 by the caller
        int64_t s = r->seq[i];
        cnt[s]++;
        sumabs[s] += absd[i];
        if (absd[i] > mx[s]) mx[s] = absd[i];
        if (!r->is_prompt[i]) logw[s] -= r->dlogp[i];
    }
    for (size_t s = 0; s < r->nseq; s++) key[s] = cnt[s] ? fabs(logw[s]) : -1;
    size_t k = o->n_worst < r->nseq ? o->n_worst : r->nseq;
    size_t *idx = td_xmalloc((k ? k : 1) * sizeof(size_t));
    gsl_sort_largest_index(idx, k, key, 1, r->nseq);
    json_t *arr = json_array();
    for (size_t j = 0; j < k; j++) {
        size_t s = idx[j];
        if (!cnt[s]) break;
        json_t *t = json_object();
        json_object_set_new(t, "seq", json_integer((json_int_t)s));
        json_object_set_new(t, "n_scored", json_integer((json_int_t)cnt[s]));
        json_object_set_new(t, "log_w", num(logw[s]));
        json_object_set_new(t, "mean_abs_dlogp", num(sumabs[s] / (double)cnt[s]));
        json_object_set_new(t, "max_abs_dlogp", num(mx[s]));
        if (!o->decode && o->stored_text && r->text) {   /* no tokenizer at hand: the text the run stored */
            const char *resp = r->text + r->text_offset[s] + r->prompt_text_len[s];
            json_t *js = json_stringn(resp, (size_t)r->response_text_len[s]);   /* NULL if not UTF-8 */
            if (js) json_object_set_new(t, "response", js);
        }
        if (!json_object_get(t, "response") && r->ids) {
            int32_t pl = r->prompt_len[s], len = r->seq_len[s];
            json_object_set_new(t, "response", ids_json(r->ids + r->ids_offset[s] + pl, (size_t)(len - pl), o));
        }
        json_array_append_new(arr, t);
    }
    free(idx); free(logw); free(sumabs); free(mx); free(key); free(cnt);
    return arr;
}

static json_t *is_json(const td_run *r, const td_report_opts *o)
{
    json_t *arr = json_array();
    for (int l = TD_IS_TOKEN; l <= TD_IS_GEOMETRIC; l++) {
        double *logw;
        size_t n;
        td_is_log_weights(r, (td_is_level)l, &logw, &n);
        td_is_raw raw;
        td_is_raw_stats(logw, n, (td_is_level)l, &raw);
        json_t *j = json_object();
        json_object_set_new(j, "level", json_string(td_is_level_name((td_is_level)l)));
        json_object_set_new(j, "n", json_integer((json_int_t)n));
        json_object_set_new(j, "log_w_min", num(raw.log_min));
        json_object_set_new(j, "log_w_max", num(raw.log_max));
        json_object_set_new(j, "w_min", num(raw.w_min));
        json_object_set_new(j, "w_mean", num(raw.w_mean));
        json_object_set_new(j, "w_max", num(raw.w_max));
        json_object_set_new(j, "ess_frac", num(raw.ess_frac));
        json_object_set_new(j, "chi2", num(raw.chi2));
        json_object_set_new(j, "inv_ess_m1", num(raw.inv_ess_m1));
        json_t *corr = json_array();
        for (size_t c = 0; c < o->n_is; c++) {
            if ((int)o->is[c].level != l) continue;
            td_is_corr res;
            td_is_apply(logw, n, &o->is[c], &res);
            json_t *cj = json_object();
            json_object_set_new(cj, "mode", json_string(td_is_mode_name(o->is[c].mode)));
            json_object_set_new(cj, "lo", num(o->is[c].lo));
            json_object_set_new(cj, "hi", num(o->is[c].hi));
            json_object_set_new(cj, "frac_lo", num(res.frac_lo));
            json_object_set_new(cj, "frac_hi", num(res.frac_hi));
            json_object_set_new(cj, "w_mean", num(res.w_mean));
            json_object_set_new(cj, "ess_frac", num(res.ess_frac));
            json_array_append_new(corr, cj);
        }
        json_object_set_new(j, "corrections", corr);
        json_array_append_new(arr, j);
        free(logw);
    }
    return arr;
}

/* verl's rollout_corr diagnostics under verl's names (analysis.h) */
static json_t *verl_json(const td_run *r)
{
    td_verl_metrics v;
    td_verl_metrics_compute(r, &v);
    json_t *o = json_object();
    json_object_set_new(o, "n_tokens", json_integer((json_int_t)v.n_tokens));
    json_object_set_new(o, "n_seqs", json_integer((json_int_t)v.n_seqs));
    json_object_set_new(o, "kl", num(v.kl));
    json_object_set_new(o, "k3_kl", num(v.k3_kl));
    json_object_set_new(o, "log_ppl_diff", num(v.log_ppl_diff));
    json_object_set_new(o, "log_ppl_abs_diff", num(v.log_ppl_abs_diff));
    json_object_set_new(o, "log_ppl_diff_max", num(v.log_ppl_diff_max));
    json_object_set_new(o, "log_ppl_diff_min", num(v.log_ppl_diff_min));
    json_object_set_new(o, "ppl_ratio", num(v.ppl_ratio));
    json_object_set_new(o, "training_ppl", num(v.training_ppl));
    json_object_set_new(o, "rollout_ppl", num(v.rollout_ppl));
    json_object_set_new(o, "training_log_ppl", num(v.training_log_ppl));
    json_object_set_new(o, "rollout_log_ppl", num(v.rollout_log_ppl));
    return o;
}

/* A replay whose dump carried the trainer's own log-probs: the three pairwise gaps, so a user
 * sees engine vs trainer (their real mismatch), tidal's recipe A vs the trainer (how well the
 * recipe models their trainer) and engine vs tidal (abs_dlogp). Signed means are x − y. */
static json_t *pair_json(const double *x, const double *y, size_t n)
{
    double *d = td_xmalloc(n * sizeof(double)), sum = 0;
    size_t fin = 0;
    for (size_t i = 0; i < n; i++) {
        double v = x[i] - y[i];
        d[i] = fabs(v);
        if (isfinite(v)) { sum += v; fin++; }
    }
    json_t *o = summary_json(d, n);
    json_object_set_new(o, "signed_mean", num(fin ? sum / (double)fin : NAN));
    free(d);
    return o;
}

static json_t *three_way_json(const td_run *r)
{
    if (!r->logp_trainer) return json_null();
    json_t *o = json_object();
    json_object_set_new(o, "engine_vs_trainer", pair_json(r->logp_b, r->logp_trainer, r->n));
    json_object_set_new(o, "tidal_vs_trainer", pair_json(r->logp_a, r->logp_trainer, r->n));
    json_object_set_new(o, "engine_vs_tidal", pair_json(r->logp_b, r->logp_a, r->n));
    return o;
}

static json_t *layers_json(const td_run *r)
{
    if (!r->layer_err) return json_null();
    size_t L = r->n_layers;
    double *col = td_xmalloc(r->n * sizeof(double));
    json_t *mean = json_array(), *p99 = json_array();
    for (size_t l = 0; l < L; l++) {
        for (size_t i = 0; i < r->n; i++) col[i] = r->layer_err[i * L + l];
        td_summary s;
        td_summary_compute(col, r->n, &s);
        json_array_append_new(mean, num(s.mean));
        json_array_append_new(p99, num(s.p99));
    }
    free(col);
    json_t *o = json_object();
    json_object_set_new(o, "n_layers", json_integer((json_int_t)L));
    json_object_set_new(o, "mean_rel_err", mean);
    json_object_set_new(o, "p99_rel_err", p99);
    return o;
}

/* A mixture of experts' routing (/routing/flip): per MoE layer the share of tokens whose predicting
 * position chose another expert set on A than on B (and the same set in another order), the share
 * of tokens with a set flip in any layer, and how much of the mismatch those tokens carry: their
 * share of sum |dlogp| and of sum k3, and mean |dlogp| of flipped against unflipped tokens. Under
 * --routing-replay r3 the flips are what A's own router would have chosen: replay removed them. */
static json_t *routing_json(const td_run *r)
{
    if (!r->route_flip) return json_null();
    size_t L = r->n_moe_layers;
    json_t *set = json_array(), *order = json_array();
    for (size_t l = 0; l < L; l++) {
        size_t routed = 0, f_set = 0, f_order = 0;
        for (size_t i = 0; i < r->n; i++) {
            int8_t v = r->route_flip[i * L + l];
            routed += v >= 0;
            f_set += v == 2;
            f_order += v == 1;
        }
        json_array_append_new(set, num(routed ? (double)f_set / routed : NAN));
        json_array_append_new(order, num(routed ? (double)f_order / routed : NAN));
    }
    size_t routed = 0, flipped = 0;
    double abs_f = 0, abs_u = 0, k3_f = 0, k3_all = 0;
    for (size_t i = 0; i < r->n; i++) {
        int any = 0, seen = 0;
        for (size_t l = 0; l < L; l++) { any |= r->route_flip[i * L + l] == 2; seen |= r->route_flip[i * L + l] >= 0; }
        if (!seen) continue;
        routed++;
        double a = fabs(r->dlogp[i]), k = r->k3 && isfinite(r->k3[i]) ? r->k3[i] : 0;
        k3_all += k;
        if (any) { flipped++; abs_f += a; k3_f += k; }
        else abs_u += a;
    }
    json_t *o = json_object();
    json_object_set_new(o, "n_moe_layers", json_integer((json_int_t)L));
    json_object_set_new(o, "routing_replay", json_string(r->route_replay ? "r3" : "none"));
    json_object_set_new(o, "flip_rate", set);
    json_object_set_new(o, "order_flip_rate", order);
    json_object_set_new(o, "tokens_routed", json_integer((json_int_t)routed));
    json_object_set_new(o, "tokens_flipped", num(routed ? (double)flipped / routed : NAN));
    json_object_set_new(o, "share_abs_dlogp_flipped", num(abs_f + abs_u > 0 ? abs_f / (abs_f + abs_u) : NAN));
    json_object_set_new(o, "share_k3_flipped", num(k3_all > 0 ? k3_f / k3_all : NAN));
    json_object_set_new(o, "mean_abs_dlogp_flipped", num(flipped ? abs_f / flipped : NAN));
    json_object_set_new(o, "mean_abs_dlogp_unflipped", num(routed > flipped ? abs_u / (routed - flipped) : NAN));
    return o;
}

json_t *td_report_run(const td_run *r, const td_report_opts *o, td_error *err)
{
    size_t n = r->n;
    double *absd = td_xmalloc(n * sizeof(double)), *pa = td_xmalloc(n * sizeof(double));
    double *pos = td_xmalloc(n * sizeof(double)), *pdiff = td_xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        absd[i] = fabs(r->dlogp[i]);
        pa[i] = exp(r->logp_a[i]);
        pos[i] = (double)r->pos[i];
        pdiff[i] = fabs(exp(r->logp_b[i]) - pa[i]);
    }
    json_t *j = json_object();
    json_object_set_new(j, "file", json_string(r->path));
    json_object_set_new(j, "label", json_string(r->label));
    json_object_set_new(j, "recipe_a", json_string(r->recipe_a));
    json_object_set_new(j, "recipe_b", json_string(r->recipe_b));
    json_object_set_new(j, "model_path", json_string(r->model_path));
    json_object_set_new(j, "n_tokens", json_integer((json_int_t)n));
    json_object_set_new(j, "n_seqs", json_integer((json_int_t)r->nseq));
    json_object_set_new(j, "abs_dlogp", summary_json(absd, n));
    /* a replay has only the engine's log-prob of each token, not its distribution */
    json_object_set_new(j, "mode", json_string(r->replay ? "replay" : "generate"));
    json_object_set_new(j, "kl_ba", r->replay ? json_string(NA_REPLAY) : summary_json(r->kl_ba, n));
    json_object_set_new(j, "k3", summary_json(r->k3, n));
    json_object_set_new(j, "tv", r->replay ? json_string(NA_REPLAY) : summary_json(r->tv, n));
    json_object_set_new(j, "abs_prob_diff", summary_json(pdiff, n));

    /* parity bands: share of tokens with |p_b/p_a − 1| ≤ band, p_b/p_a = exp(dlogp) */
    static const double bands[3] = {0.001, 0.01, 0.05};
    static const char *band_names[3] = {"0.1%", "1%", "5%"};
    size_t fin = 0, in[3] = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r->dlogp[i])) continue;
        fin++;
        double dev = fabs(expm1(r->dlogp[i]));
        for (int b = 0; b < 3; b++) in[b] += dev <= bands[b];
    }
    json_t *par = json_object();
    for (int b = 0; b < 3; b++) json_object_set_new(par, band_names[b], num(fin ? (double)in[b] / (double)fin : NAN));
    json_object_set_new(j, "parity", par);

    /* the three rank correlations sort a million pairs each: one per thread */
    const double *against[3] = {pa, r->entropy_a, pos};
    corr_result cr[3];
#pragma omp parallel for schedule(static, 1)
    for (int k = 0; k < 3; k++) correlation(absd, against[k], n, &cr[k]);
    json_t *cor = json_object();
    json_object_set_new(cor, "prob_a", correlation_json(&cr[0]));
    json_object_set_new(cor, "entropy_a", correlation_json(&cr[1]));
    json_object_set_new(cor, "pos", correlation_json(&cr[2]));
    json_object_set_new(j, "correlation", cor);

    /* position buckets: [0,16), [16,32), [32,64), ... doubling until past max_pos */
    double pedges[40];
    size_t npb = 0;
    pedges[0] = 0;
    for (double hi = 16; npb < 38; hi *= 2) {
        pedges[++npb] = hi;
        if (hi > r->max_pos) break;
    }
    json_object_set_new(j, "by_position", buckets_json(pos, absd, r->replay ? NULL : r->kl_ba, n, pedges, npb));
    static const double prob_edges[8] = {0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 1.0 + 1e-12};
    json_object_set_new(j, "by_prob_a", buckets_json(pa, absd, r->replay ? NULL : r->kl_ba, n, prob_edges, 7));

    for (size_t i = 0; i < n; i++) if (!isfinite(absd[i])) absd[i] = -1;  // never among the worst
    json_object_set_new(j, "worst_tokens", worst_tokens_json(r, absd, o));
    json_object_set_new(j, "worst_seqs", worst_seqs_json(r, absd, o));
    json_object_set_new(j, "verl", verl_json(r));
    json_object_set_new(j, "three_way", three_way_json(r));
    json_object_set_new(j, "is", is_json(r, o));
    json_object_set_new(j, "layers", layers_json(r));
    json_object_set_new(j, "routing", routing_json(r));
    free(absd); free(pa); free(pos); free(pdiff);
    (void)err;
    return j;
}
