/* Summary statistics and the importance-sampling simulator (include/tidal/analysis.h).
 * Sorting, means and quantiles go through GSL. */
#include "tidal/analysis.h"

#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Quantile f of v (m values, m >= 1) by linear interpolation between the order statistics
 * k = floor(f·(m−1)) and k+1, with the same formula as gsl_stats_quantile_from_sorted_data
 * ((1−δ)·v_(k) + δ·v_(k+1)), numpy's default 'linear' percentile. The order statistics come
 * from gsl_stats_select (quickselect, O(m)) rather than a full sort: GSL's sort is a heapsort,
 * and five sorts of a million values were most of tidal-report's time. v is reordered. */
double td_quantile_select(double *v, size_t m, double f)
{
    double delta = (double)(m - 1) * f;
    size_t k = (size_t)delta;
    delta -= (double)k;
    double lo = gsl_stats_select(v, 1, m, k);
    if (k + 1 >= m) return lo;
    double hi = gsl_stats_select(v, 1, m, k + 1);
    return (1 - delta) * lo + delta * hi;
}

void td_summary_compute(const double *x, size_t n, td_summary *s)
{
    double *v = td_xmalloc((n ? n : 1) * sizeof(double));
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) v[m++] = x[i];
    s->count = m;
    if (m == 0) {
        s->mean = s->p50 = s->p90 = s->p99 = s->max = NAN;
    } else {
        s->mean = gsl_stats_mean(v, 1, m);
        s->max = gsl_stats_max(v, 1, m);
        s->p50 = td_quantile_select(v, m, 0.50);
        s->p90 = td_quantile_select(v, m, 0.90);
        s->p99 = td_quantile_select(v, m, 0.99);
    }
    free(v);
}

/* ---------------------------------------------------------------- importance sampling */

const char *td_is_level_name(td_is_level l)
{
    return l == TD_IS_TOKEN ? "token" : l == TD_IS_SEQUENCE ? "sequence" : "geometric";
}

const char *td_is_mode_name(td_is_mode m) { return m == TD_IS_TRUNCATE ? "truncate" : "mask"; }

int td_is_spec_parse(const char *s, td_is_spec *spec, td_error *err)
{
    char buf[128], *save = NULL;
    if (strlen(s) >= sizeof buf) return td_fail(err, "--is %s: too long", s);
    strcpy(buf, s);
    char *f[5];
    int nf = 0;
    for (char *t = strtok_r(buf, ":", &save); t && nf < 5; t = strtok_r(NULL, ":", &save)) f[nf++] = t;
    if (nf < 3 || nf > 4)
        return td_fail(err, "--is %s: expected LEVEL:MODE:HI or LEVEL:MODE:LO:HI (e.g. token:truncate:2, token:mask:0.5:5)", s);
    if (!strcmp(f[0], "token")) spec->level = TD_IS_TOKEN;
    else if (!strcmp(f[0], "sequence") || !strcmp(f[0], "seq")) spec->level = TD_IS_SEQUENCE;
    else if (!strcmp(f[0], "geometric") || !strcmp(f[0], "geo")) spec->level = TD_IS_GEOMETRIC;
    else return td_fail(err, "--is %s: level '%s' is not token, sequence or geometric", s, f[0]);
    if (!strcmp(f[1], "truncate") || !strcmp(f[1], "tis")) spec->mode = TD_IS_TRUNCATE;
    else if (!strcmp(f[1], "mask") || !strcmp(f[1], "mis")) spec->mode = TD_IS_MASK;
    else return td_fail(err, "--is %s: mode '%s' is not truncate or mask", s, f[1]);
    char *end;
    spec->lo = 0;
    if (nf == 4) {
        spec->lo = strtod(f[2], &end);
        if (*end || !(spec->lo >= 0)) return td_fail(err, "--is %s: lower cap '%s' is not a number >= 0", s, f[2]);
    }
    spec->hi = strtod(f[nf - 1], &end);
    if (*end || !(spec->hi > spec->lo) || !isfinite(spec->hi))
        return td_fail(err, "--is %s: upper cap '%s' is not a finite number above the lower cap", s, f[nf - 1]);
    return 0;
}

int td_is_log_weights(const td_run *run, td_is_level level, double **logw, size_t *n)
{
    if (level == TD_IS_TOKEN) {
        double *w = td_xmalloc(run->n * sizeof(double));
        size_t m = 0;
        for (size_t i = 0; i < run->n; i++)
            if (!run->is_prompt[i] && isfinite(run->dlogp[i])) w[m++] = -run->dlogp[i];
        *logw = w;
        *n = m;
        return 0;
    }
    /* log W_s = Σ_t (logp_a − logp_b) over the sequence's response tokens; T_s their count */
    double *sum = td_xcalloc(run->nseq ? run->nseq : 1, sizeof(double));
    size_t *cnt = td_xcalloc(run->nseq ? run->nseq : 1, sizeof(size_t));
    for (size_t i = 0; i < run->n; i++)
        if (!run->is_prompt[i] && isfinite(run->dlogp[i])) {
            sum[run->seq[i]] -= run->dlogp[i];
            cnt[run->seq[i]]++;
        }
    size_t m = 0;
    for (size_t s = 0; s < run->nseq; s++)
        if (cnt[s]) sum[m++] = level == TD_IS_GEOMETRIC ? sum[s] / (double)cnt[s] : sum[s];
    free(cnt);
    *logw = sum;
    *n = m;
    return 0;
}

static double clamped_exp(double lw)
{
    return exp(lw > TD_IS_LOG_CLAMP ? TD_IS_LOG_CLAMP : lw < -TD_IS_LOG_CLAMP ? -TD_IS_LOG_CLAMP : lw);
}

/* ESS fraction 1 / mean((w / mean w)²) = mean(w)² / mean(w²); 0 when every weight is 0. */
static double ess_frac(double mean_w, double mean_w2)
{
    return mean_w2 > 0 ? mean_w * mean_w / mean_w2 : 0.0;
}

void td_is_raw_stats(const double *logw, size_t n, td_is_level level, td_is_raw *r)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    if (!n) {
        r->log_min = r->log_max = r->w_min = r->w_mean = r->w_max = r->ess_frac = r->chi2 = r->inv_ess_m1 = NAN;
        return;
    }
    double *w = td_xmalloc(n * sizeof(double)), *w2 = td_xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) { w[i] = clamped_exp(logw[i]); w2[i] = w[i] * w[i]; }
    gsl_stats_minmax(&r->log_min, &r->log_max, logw, 1, n);
    gsl_stats_minmax(&r->w_min, &r->w_max, w, 1, n);
    r->w_mean = gsl_stats_mean(w, 1, n);
    double m2 = gsl_stats_mean(w2, 1, n);
    r->ess_frac = ess_frac(r->w_mean, m2);
    r->inv_ess_m1 = r->w_mean > 0 ? m2 / (r->w_mean * r->w_mean) - 1.0 : NAN;
    /* geometric: the self-normalised chi² (analysis.h); a few ulps below 0 are rounding */
    r->chi2 = level == TD_IS_GEOMETRIC ? (r->inv_ess_m1 > 0 ? r->inv_ess_m1 : 0.0) : m2 - 1.0;
    if (r->inv_ess_m1 < 0) r->inv_ess_m1 = 0.0;
    free(w);
    free(w2);
}

void td_is_apply(const double *logw, size_t n, const td_is_spec *spec, td_is_corr *c)
{
    memset(c, 0, sizeof *c);
    if (!n) { c->frac_lo = c->frac_hi = c->w_mean = c->ess_frac = NAN; return; }
    double *w = td_xmalloc(n * sizeof(double)), *w2 = td_xmalloc(n * sizeof(double));
    size_t below = 0, above = 0;
    for (size_t i = 0; i < n; i++) {
        double v = clamped_exp(logw[i]);
        if (v < spec->lo) { below++; v = spec->mode == TD_IS_TRUNCATE ? spec->lo : 0.0; }
        else if (v > spec->hi) { above++; v = spec->mode == TD_IS_TRUNCATE ? spec->hi : 0.0; }
        w[i] = v;
        w2[i] = v * v;
    }
    c->frac_lo = (double)below / (double)n;
    c->frac_hi = (double)above / (double)n;
    c->w_mean = gsl_stats_mean(w, 1, n);
    c->ess_frac = ess_frac(c->w_mean, gsl_stats_mean(w2, 1, n));
    free(w);
    free(w2);
}

/* ---------------------------------------------------------------- verl's diagnostics */

void td_verl_metrics_compute(const td_run *run, td_verl_metrics *v)
{
    memset(v, 0, sizeof *v);
    size_t ns = run->nseq ? run->nseq : 1;
    double *sa = td_xcalloc(ns, sizeof(double)), *sb = td_xcalloc(ns, sizeof(double));
    size_t *cnt = td_xcalloc(ns, sizeof(size_t));
    double kl = 0, k3 = 0;
    for (size_t i = 0; i < run->n; i++) {
        if (run->is_prompt[i] || !isfinite(run->logp_a[i]) || !isfinite(run->logp_b[i])) continue;
        kl += run->logp_b[i] - run->logp_a[i];
        k3 += run->k3[i];
        sa[run->seq[i]] += run->logp_a[i];
        sb[run->seq[i]] += run->logp_b[i];
        cnt[run->seq[i]]++;
        v->n_tokens++;
    }
    double ld = 0, lad = 0, lmax = -INFINITY, lmin = INFINITY, ratio = 0, tp = 0, rp = 0, tlp = 0, rlp = 0;
    for (size_t s = 0; s < run->nseq; s++) {
        if (!cnt[s]) continue;
        double ma = sa[s] / (double)cnt[s], mb = sb[s] / (double)cnt[s], d = mb - ma;
        ld += d;
        lad += fabs(d);
        if (d > lmax) lmax = d;
        if (d < lmin) lmin = d;
        ratio += exp(d);
        tp += exp(-ma);
        rp += exp(-mb);
        tlp += -ma;
        rlp += -mb;
        v->n_seqs++;
    }
    double nt = (double)v->n_tokens, nq = (double)v->n_seqs;
    v->kl = v->n_tokens ? kl / nt : NAN;
    v->k3_kl = v->n_tokens ? k3 / nt : NAN;
    v->log_ppl_diff = v->n_seqs ? ld / nq : NAN;
    v->log_ppl_abs_diff = v->n_seqs ? lad / nq : NAN;
    v->log_ppl_diff_max = v->n_seqs ? lmax : NAN;
    v->log_ppl_diff_min = v->n_seqs ? lmin : NAN;
    v->ppl_ratio = v->n_seqs ? ratio / nq : NAN;
    v->training_ppl = v->n_seqs ? tp / nq : NAN;
    v->rollout_ppl = v->n_seqs ? rp / nq : NAN;
    v->training_log_ppl = v->n_seqs ? tlp / nq : NAN;
    v->rollout_log_ppl = v->n_seqs ? rlp / nq : NAN;
    free(sa);
    free(sb);
    free(cnt);
}
