/* tidal — the collapse detector (include/tidal/rl.h): a pure function of the metric trace, so
 * a resumed run replays the stored /steps rows through it and reaches the same marks. */
#include "tidal/rl.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *const td_collapse_signal_names[TD_CLP_NSIGNALS] = {"reward_drop", "grad_spike", "entropy",
                                                               "mismatch", "length", "dead"};

void td_collapse_cfg_defaults(td_collapse_cfg *c)
{
    *c = (td_collapse_cfg){.ema_alpha = 0.1, .drop_abs = 0.3, .drop_rel = 0.5, .min_gain = 0.1,
                           .hold = 10, .spike_factor = 10.0, .spike_window = 50,
                           .spike_min_history = 5, .entropy_hi = 2.0, .entropy_lo = 0.2,
                           .entropy_hold = 10, .k3_factor = 10.0, .k3_baseline = 20,
                           .kl_abs = 0.1, .chi2_max = 1.0, .ess_min = 0.3, .trunc_max = 0.5,
                           .dead_hold = 5};
}

/* the fields, by name, for parsing and JSON */
typedef struct { const char *name; size_t off; int is_int; } cfg_field;
#define F(n) {#n, offsetof(td_collapse_cfg, n), 0}
#define I(n) {#n, offsetof(td_collapse_cfg, n), 1}
static const cfg_field FIELDS[] = {F(ema_alpha), F(drop_abs), F(drop_rel), F(min_gain), I(hold),
                                   F(spike_factor), I(spike_window), I(spike_min_history),
                                   F(entropy_hi), F(entropy_lo), I(entropy_hold), F(k3_factor),
                                   F(k3_min), I(k3_baseline), F(kl_abs), F(chi2_max), F(ess_min), F(trunc_max),
                                   I(dead_hold)};
#undef F
#undef I
enum { NFIELDS = sizeof FIELDS / sizeof FIELDS[0] };

int td_collapse_cfg_parse(td_collapse_cfg *c, const char *spec, td_error *err)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return td_fail(err, "--collapse: '%s' is not KEY=VALUE", kv);
        *eq = 0;
        const cfg_field *f = NULL;
        for (int i = 0; i < NFIELDS; i++)
            if (!strcmp(FIELDS[i].name, kv)) f = &FIELDS[i];
        if (!f) {
            char names[512] = "";
            for (int i = 0; i < NFIELDS; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " " : "", FIELDS[i].name);
            return td_fail(err, "--collapse: unknown key '%s' (expected one of: %s)", kv, names);
        }
        char *end;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(v) || v < 0 || (f->is_int && v != floor(v)))
            return td_fail(err, "--collapse: %s: expected a non-negative %s, got '%s'", kv,
                           f->is_int ? "integer" : "number", eq + 1);
        if (f->is_int) *(int *)((char *)c + f->off) = (int)v;
        else *(double *)((char *)c + f->off) = v;
    }
    if (c->hold < 1 || c->entropy_hold < 1 || c->spike_window < 1 || c->k3_baseline < 1 || c->dead_hold < 1 ||
        !(c->ema_alpha > 0 && c->ema_alpha <= 1))
        return td_fail(err, "--collapse: hold, entropy_hold, spike_window, k3_baseline, dead_hold must be >= 1 "
                       "and ema_alpha in (0, 1]");
    return 0;
}

char *td_collapse_cfg_json(const td_collapse_cfg *c)
{
    json_t *o = json_object();
    for (int i = 0; i < NFIELDS; i++) {
        const void *p = (const char *)c + FIELDS[i].off;
        json_object_set_new(o, FIELDS[i].name, FIELDS[i].is_int ? json_integer(*(const int *)p)
                                                                 : json_real(*(const double *)p));
    }
    char *s = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(o);
    return s;
}

struct td_collapse {
    td_collapse_cfg c;
    int k;                       /* steps pushed */
    int first[TD_CLP_NSIGNALS];
    unsigned active;
    double ema, best, initial;
    int drop_run;                /* consecutive steps in the dropped state */
    double *gnorm;               /* (k) history */
    int gcap;
    int spike_prev[2];           /* spike flags of the two previous steps */
    double entropy0;
    int ent_run;
    int dead_run;                /* consecutive steps without a policy gradient */
    double *k3;                  /* the first k3_baseline values */
    double k3_median;
};

td_collapse *td_collapse_new(const td_collapse_cfg *c)
{
    td_collapse *d = calloc(1, sizeof *d);
    d->c = *c;
    for (int i = 0; i < TD_CLP_NSIGNALS; i++) d->first[i] = -1;
    d->k3 = calloc((size_t)c->k3_baseline, sizeof(double));
    d->k3_median = NAN;
    return d;
}

void td_collapse_free(td_collapse *d)
{
    if (!d) return;
    free(d->gnorm);
    free(d->k3);
    free(d);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of the finite values among x[0..n) (NaN if none) */
static double median(const double *x, int n)
{
    double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
    int m = 0;
    for (int i = 0; i < n; i++) if (isfinite(x[i])) v[m++] = x[i];
    double r = NAN;
    if (m) {
        qsort(v, (size_t)m, sizeof(double), cmp_double);
        r = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    }
    free(v);
    return r;
}

/* marks signal s at step `at` if it has not fired; returns its bit when it fires now */
static unsigned mark(td_collapse *d, td_collapse_signal s, int at)
{
    if (d->first[s] >= 0) return 0;
    d->first[s] = at;
    return 1u << s;
}

unsigned td_collapse_push(td_collapse *d, const double *m)
{
    const td_collapse_cfg *c = &d->c;
    int k = d->k++;
    unsigned fired = 0, active = 0;

    /* reward_drop */
    double r = m[TD_RLM_reward];
    if (k == 0) d->ema = d->best = d->initial = r;
    else if (isfinite(r)) d->ema = c->ema_alpha * r + (1.0 - c->ema_alpha) * d->ema;
    if (d->ema > d->best) d->best = d->ema;
    double gain = d->best - d->initial, drop = d->best - d->ema;
    int dropped = drop >= c->drop_abs || (gain >= c->min_gain && drop >= c->drop_rel * gain);
    d->drop_run = dropped ? d->drop_run + 1 : 0;
    if (dropped) active |= 1u << TD_CLP_REWARD;
    if (d->drop_run >= c->hold) fired |= mark(d, TD_CLP_REWARD, k - c->hold + 1);

    /* grad_spike: against the median of the previous window */
    double g = m[TD_RLM_grad_norm];
    int lo = k - c->spike_window > 0 ? k - c->spike_window : 0, hist = k - lo;
    int spike = !isfinite(g);
    if (!spike && hist >= c->spike_min_history) {
        double med = median(d->gnorm + lo, hist);
        spike = isfinite(med) && g > c->spike_factor * med;
    }
    if (spike) active |= 1u << TD_CLP_GRAD;
    if (spike && (d->spike_prev[0] || d->spike_prev[1]))
        fired |= mark(d, TD_CLP_GRAD, d->spike_prev[1] ? k - 2 : k - 1);
    d->spike_prev[1] = d->spike_prev[0];
    d->spike_prev[0] = spike;
    if (k >= d->gcap) {
        d->gcap = d->gcap ? 2 * d->gcap : 64;
        d->gnorm = realloc(d->gnorm, (size_t)d->gcap * sizeof(double));
    }
    d->gnorm[k] = g;

    /* entropy band around the step-0 value */
    double e = m[TD_RLM_entropy];
    if (k == 0) d->entropy0 = e;
    int out = d->entropy0 > 0 && isfinite(e) && (e > c->entropy_hi * d->entropy0 || e < c->entropy_lo * d->entropy0);
    d->ent_run = out ? d->ent_run + 1 : 0;
    if (out) active |= 1u << TD_CLP_ENTROPY;
    if (d->ent_run >= c->entropy_hold) fired |= mark(d, TD_CLP_ENTROPY, k - c->entropy_hold + 1);

    /* mismatch: k3 against its early median, and verl's alarms */
    double k3 = m[TD_RLM_k3_kl];
    if (k < c->k3_baseline) d->k3[k] = k3;
    if (k == c->k3_baseline - 1) d->k3_median = median(d->k3, c->k3_baseline);
    int mis = (k >= c->k3_baseline && isfinite(d->k3_median) && k3 > c->k3_factor * d->k3_median &&
               k3 > c->k3_min) ||
              fabs(m[TD_RLM_rollout_corr_kl]) > c->kl_abs || m[TD_RLM_chi2_token] > c->chi2_max ||
              m[TD_RLM_rollout_is_eff_sample_size] < c->ess_min;
    if (mis) {
        active |= 1u << TD_CLP_MISMATCH;
        fired |= mark(d, TD_CLP_MISMATCH, k);
    }

    /* length */
    if (m[TD_RLM_response_length_clip_ratio] > c->trunc_max) {
        active |= 1u << TD_CLP_LENGTH;
        fired |= mark(d, TD_CLP_LENGTH, k);
    }
    /* dead: nothing to learn from, step after step */
    int dead = m[TD_RLM_response_length_clip_ratio] >= 1.0 || m[TD_RLM_frac_reward_zero_std] >= 1.0;
    d->dead_run = dead ? d->dead_run + 1 : 0;
    if (dead) active |= 1u << TD_CLP_DEAD;
    if (d->dead_run >= c->dead_hold) fired |= mark(d, TD_CLP_DEAD, k - c->dead_hold + 1);
    d->active = active;
    return fired;
}

int td_collapse_first(const td_collapse *d, td_collapse_signal s) { return d->first[s]; }
unsigned td_collapse_active(const td_collapse *d) { return d->active; }
