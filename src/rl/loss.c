/* tidal — the GRPO-family loss pieces (include/tidal/rl.h has the formulas and whom each
 * follows): advantages, IS weights, the effective loss mask, the aggregation normalisers and
 * the per-token PPO-clip / PG loss with its derivative. Pure functions of arrays: the tests
 * hold them against an independent numpy implementation (tests/py/test_rl_loss.py). */
#include "tidal/rl.h"

#include <math.h>
#include <string.h>

static const char *const IS_NAMES[TD_RLIS_COUNT] = {"none", "token-tis", "token-mis", "seq-tis",
                                                     "seq-mis", "geometric", "icepop"};

const char *td_rl_loss_type_name(td_rl_loss_type t)
{
    static const char *const names[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

const char *td_rl_is_name(td_rl_is m) { return (unsigned)m < TD_RLIS_COUNT ? IS_NAMES[m] : "?"; }

int td_rl_is_from_name(const char *name, td_error *err)
{
    for (int i = 0; i < TD_RLIS_COUNT; i++)
        if (name && !strcmp(name, IS_NAMES[i])) return i;
    return td_fail(err, "unknown IS correction '%s' (expected %s)", name ? name : "",
                   TD_RL_IS_NAMES);
}

void td_rl_is_default_caps(td_rl_is m, double *lo, double *hi)
{
    *lo = 0.0;
    *hi = 0.0;
    switch (m) {
    case TD_RLIS_TOKEN_TIS: case TD_RLIS_TOKEN_MIS: *hi = 2.0; break;
    case TD_RLIS_SEQ_TIS: case TD_RLIS_SEQ_MIS: *hi = 3.0; break;
    case TD_RLIS_GEOMETRIC: *lo = 0.999; *hi = 1.001; break;
    case TD_RLIS_ICEPOP: *lo = 0.5; *hi = 5.0; break;
    default: break;
    }
}

void td_rl_loss_cfg_defaults(td_rl_loss_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->policy_loss = TD_PL_PPO;
    c->epsilon = 0.2;
    c->epsilon_high = 0.2;
    c->loss_type = TD_LOSS_DAPO;
    c->is_mode = TD_RLIS_NONE;
    c->scale_rewards = TD_ADVS_GROUP;
    c->num_generations = 8;
    c->micro_batch = 8;
    c->grad_accum = 1;
    c->max_completion_length = 256;
}

static double clamp_log(double x)
{
    return x > TD_RL_LOG_CLAMP ? TD_RL_LOG_CLAMP : x < -TD_RL_LOG_CLAMP ? -TD_RL_LOG_CLAMP : x;
}

/* torch.std: Bessel-corrected; 0 for a single value (torch gives NaN: TRL then divides by
 * NaN + eps; a group of one is refused before any work, so this is only the batch of one) */
static double std_unbiased(const double *x, int n)
{
    if (n < 2) return 0.0;
    double m = 0.0, s = 0.0;
    for (int i = 0; i < n; i++) m += x[i];
    m /= n;
    for (int i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return sqrt(s / (n - 1));
}

void td_rl_advantages(const td_rl_loss_cfg *c, int B, const double *reward, double *adv,
                      int *zero_std)
{
    int G = c->num_generations, zs = 0;
    double batch_std = std_unbiased(reward, B);
    for (int g0 = 0; g0 < B; g0 += G) {
        double mean = 0.0;
        for (int i = 0; i < G; i++) mean += reward[g0 + i];
        mean /= G;
        double sd = std_unbiased(reward + g0, G);
        int same = 1;
        for (int i = 1; i < G; i++) same &= reward[g0 + i] == reward[g0];
        zs += same;
        double div = c->scale_rewards == TD_ADVS_GROUP ? sd + TD_RL_ADV_EPS
                   : c->scale_rewards == TD_ADVS_BATCH ? batch_std + TD_RL_ADV_EPS : 1.0;
        for (int i = 0; i < G; i++) adv[g0 + i] = (reward[g0 + i] - mean) / div;
    }
    if (zero_std) *zero_std = zs;
}

static int is_sequence_level(td_rl_is m)
{
    return m == TD_RLIS_SEQ_TIS || m == TD_RLIS_SEQ_MIS || m == TD_RLIS_GEOMETRIC;
}

static int is_mask_mode(td_rl_is m)
{
    return m == TD_RLIS_TOKEN_MIS || m == TD_RLIS_SEQ_MIS || m == TD_RLIS_GEOMETRIC || m == TD_RLIS_ICEPOP;
}

/* The weight of ratio x under the correction's band [lo, hi] (hi 0: no upper cap). */
static double band_weight(const td_rl_loss_cfg *c, double x, int *clipped, int *masked)
{
    double lo = c->is_cap_low, hi = c->is_cap > 0 ? c->is_cap : INFINITY;
    if (is_mask_mode(c->is_mode)) {
        if (x < lo || x > hi) { *masked = 1; return 0.0; }
        return x;
    }
    if (x > hi) { *clipped = 1; return hi; }
    if (x < lo) { *clipped = 1; return lo; }
    return x;
}

void td_rl_prepare(const td_rl_loss_cfg *c, const td_rl_batch *b, td_rl_prep *p)
{
    int B = b->B;
    td_rl_advantages(c, B, b->reward, p->adv, &p->zero_std_groups);
    p->n_clipped = p->n_masked = p->n_loss_tokens = 0;
    p->n_seq_masked = 0;
    for (int s = 0; s < B; s++) {
        int64_t t0 = b->off[s], t1 = b->off[s + 1];
        double sum = 0.0, cnt = 0.0;
        for (int64_t t = t0; t < t1; t++)
            if (b->mask[t] != 0.0f) { sum += (double)b->old[t] - (double)b->mu[t]; cnt += 1.0; }
        double seq_w = 1.0;
        int seq_clipped = 0, seq_masked = 0;
        if (is_sequence_level(c->is_mode)) {
            double lw = c->is_mode == TD_RLIS_GEOMETRIC ? (cnt > 0 ? sum / cnt : 0.0) : sum;
            seq_w = band_weight(c, exp(clamp_log(lw)), &seq_clipped, &seq_masked);
        }
        int64_t kept = 0, loss_tok = 0;
        for (int64_t t = t0; t < t1; t++) {
            int in_loss = b->mask[t] != 0.0f, clipped = seq_clipped, masked = seq_masked;
            double w = 1.0;
            if (c->is_mode == TD_RLIS_NONE) w = 1.0;
            else if (is_sequence_level(c->is_mode)) w = seq_w;
            else w = band_weight(c, exp(clamp_log((double)b->old[t] - (double)b->mu[t])), &clipped, &masked);
            p->w[t] = (float)w;
            p->m[t] = in_loss && !(masked && c->is_drop_masked) ? b->mask[t] : 0.0f;
            if (in_loss) {
                loss_tok++;
                p->n_clipped += clipped;
                p->n_masked += masked;
                kept += !masked;
            }
        }
        p->n_loss_tokens += loss_tok;
        if (loss_tok > 0 && kept == 0) p->n_seq_masked++;
    }
    /* normalisers over the effective mask */
    int MB = c->micro_batch, GA = c->grad_accum;
    double total = 0.0;
    for (int64_t t = 0; t < b->off[B]; t++) total += p->m[t];
    for (int s0 = 0; s0 < B; s0 += MB) {
        int s1 = s0 + MB < B ? s0 + MB : B, nb = s1 - s0;
        double micro = 0.0;
        for (int64_t t = b->off[s0]; t < b->off[s1]; t++) micro += p->m[t];
        for (int s = s0; s < s1; s++) {
            double ms = 0.0;
            for (int64_t t = b->off[s]; t < b->off[s + 1]; t++) ms += p->m[t];
            switch (c->loss_type) {
            case TD_LOSS_GRPO: p->coef[s] = 1.0 / (fmax(ms, 1.0) * nb * GA); break;
            case TD_LOSS_BNPO: p->coef[s] = 1.0 / (fmax(micro, 1.0) * GA); break;
            case TD_LOSS_DR_GRPO: p->coef[s] = 1.0 / ((double)nb * c->max_completion_length * GA); break;
            default: p->coef[s] = 1.0 / fmax(total, 1.0); break;
            }
        }
    }
}

double td_rl_seq_loss(const td_rl_loss_cfg *c, int T, const float *logp, const float *old,
                      const float *ref, const float *w, const float *m, double adv, double coef,
                      float *dlogp, td_rl_clip_stats *st)
{
    double loss = 0.0;
    for (int t = 0; t < T; t++) {
        if (m[t] == 0.0f) { dlogp[t] = 0.0f; continue; }
        double lr = clamp_log((double)logp[t] - (double)old[t]), r = exp(lr);
        double pg, dpg;                         /* the PG term and its derivative in logp */
        if (c->policy_loss == TD_PL_PG) {
            pg = -adv * r;
            dpg = -adv * r;
        } else {
            double rc = r < 1.0 - c->epsilon ? 1.0 - c->epsilon : r > 1.0 + c->epsilon_high ? 1.0 + c->epsilon_high : r;
            double l1 = -adv * r, l2 = -adv * rc;
            int clipped = l2 > l1;
            pg = clipped ? l2 : l1;
            dpg = clipped ? 0.0 : -adv * r;
            if (st) st->clipped += clipped;
            if (c->dual_clip > 1.0 && adv < 0.0) {
                double l3 = -adv * c->dual_clip;
                if (pg > l3) {
                    pg = l3;
                    dpg = 0.0;
                    if (st) st->clipped_lower += 1;
                }
            }
        }
        double lt = pg * w[t], dt = dpg * w[t];
        if (c->beta > 0 && ref) {
            double d = clamp_log((double)ref[t] - (double)logp[t]), e = exp(d);
            lt += c->beta * (e - d - 1.0);
            dt += c->beta * (1.0 - e);        /* d/dlogp of e^(ref - logp) - (ref - logp) - 1 */
        }
        loss += lt * m[t];
        dlogp[t] = (float)(coef * dt * m[t]);
        if (st) {
            st->n_tokens += 1;
            st->ratio_log_sum += (double)old[t] - (double)logp[t];
        }
    }
    return coef * loss;
}
