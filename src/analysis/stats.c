/* Summary statistics and the importance-sampling simulator (include/tidal/analysis.h).
 * Means, quantiles and correlations go through GSL; ranks by a radix sort (GSL sorts by heapsort). */
#include "tidal/analysis.h"

#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Quantile f of v (m values, m >= 1) by linear interpolation between the order statistics
 * k = floor(f·(m−1)) and k+1, with the same formula as gsl_stats_quantile_from_sorted_data
 * ((1−δ)·v_(k) + δ·v_(k+1)), numpy's default 'linear' percentile. The order statistics come
 * from gsl_stats_select (quickselect, O(m)) rather than a full sort: GSL's sort is a heapsort,
 * and five sorts of a million values were most of tidal-report's time; v_(k+1) by one pass
 * after v_(k) (half the time of a second select). v is reordered. */
double td_quantile_select(double *v, size_t m, double f)
{
    double delta = (double)(m - 1) * f;
    size_t k = (size_t)delta;
    delta -= (double)k;
    double lo = gsl_stats_select(v, 1, m, k);
    if (k + 1 >= m) return lo;
    /* v_(k+1) from v_(k) in one pass, whatever order the select left: lo again when more than
     * k + 1 values are <= lo, else the least value above it */
    size_t le = 0;
    double above = INFINITY;
    for (size_t i = 0; i < m; i++) {
        le += v[i] <= lo;
        if (v[i] > lo && v[i] < above) above = v[i];
    }
    double hi = le >= k + 2 ? lo : above;
    return (1 - delta) * lo + delta * hi;
}

/* the value's bits as an unsigned key in the values' order (-0 as +0) */
static inline uint64_t order_key(double v)
{
    if (v == 0) v = 0.0;
    uint64_t u;
    memcpy(&u, &v, 8);
    return u >> 63 ? ~u : u | 0x8000000000000000ull;
}

void td_average_ranks(const double *x, size_t m, double *rank)
{
    if (m == 0) return;
    uint64_t *key_buf = td_xmalloc(2 * m * sizeof *key_buf), *key = key_buf, *k2 = key_buf + m;
    size_t *idx_buf = td_xmalloc(2 * m * sizeof *idx_buf), *idx = idx_buf, *i2 = idx_buf + m;
    uint64_t all_or = 0, all_and = ~0ull;
    for (size_t i = 0; i < m; i++) {
        key[i] = order_key(x[i]);
        idx[i] = i;
        all_or |= key[i];
        all_and &= key[i];
    }
    /* least significant digit first, 16 bits a pass, stable; a digit every key shares is skipped */
    size_t *count = td_xmalloc(65536 * sizeof *count);
    for (int shift = 0; shift < 64; shift += 16) {
        if (((all_or ^ all_and) >> shift & 0xFFFF) == 0) continue;
        memset(count, 0, 65536 * sizeof *count);
        for (size_t i = 0; i < m; i++) count[key[i] >> shift & 0xFFFF]++;
        size_t sum = 0;
        for (size_t d = 0; d < 65536; d++) { size_t c = count[d]; count[d] = sum; sum += c; }
        for (size_t i = 0; i < m; i++) {
            size_t at = count[key[i] >> shift & 0xFFFF]++;
            k2[at] = key[i];
            i2[at] = idx[i];
        }
        uint64_t *tk = key; key = k2; k2 = tk;
        size_t *ti = idx; idx = i2; i2 = ti;
    }
    free(count);
    for (size_t i = 0; i < m;) {   /* a run of equal values [i, j) holds ranks i+1 .. j */
        size_t j = i + 1;
        while (j < m && key[j] == key[i]) j++;
        double r = 0.5 * (double)(i + 1 + j);
        for (size_t t = i; t < j; t++) rank[idx[t]] = r;
        i = j;
    }
    free(key_buf);
    free(idx_buf);
}

double td_spearman(const double *x, const double *y, size_t m)
{
    if (m < 2) return NAN;
    double *rx = td_xmalloc(2 * m * sizeof *rx), *ry = rx + m;
    td_average_ranks(x, m, rx);
    td_average_ranks(y, m, ry);
    double r = gsl_stats_correlation(rx, 1, ry, 1, m);
    free(rx);
    return r;
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
