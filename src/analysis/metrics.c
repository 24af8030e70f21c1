/* Per-token divergence metrics (definitions in include/tidal/metrics.h). */
#include "tidal/metrics.h"
#include "tidal/logprob.h"
#include "tidal/formats.h"

#include <math.h>

/* k3 of r = logp_a - logp_b from em1 = expm1(r) */
static inline double k3_of(double r, double em1)
{
    /* p_b(y) = 0 < p_a(y): e^r outgrows r, k3 = +inf (expm1(inf) - inf would be NaN) */
    if (r == INFINITY) return INFINITY;
    /* expm1 keeps k3 accurate for tiny r, where e^r - 1 - r cancels catastrophically */
    return em1 - r;
}

double td_k3(double logp_a, double logp_b)
{
    double r = logp_a - logp_b;
    return k3_of(r, expm1(r));
}

/* A float log-softmax row sums to 1 only within ~1e-7, and a KL of two such rows taken as
 * Σ p_b (logp_b − logp_a) then errs by that much: near rows (KL ~ 1e-8) come out negative.
 * So both rows are renormalised in double, and each KL is summed in its termwise non-negative
 * form: KL(B‖A) = Σ [p_b (b − a) − p_b + p_a] = Σ p_b k(a − b), k(r) = e^r − 1 − r ≥ 0 (the
 * added terms sum to 1 − 1 = 0); where p_b = 0 the term is p_a. No rounding can make it < 0. */
void td_token_metrics_compute(const float *la, const float *lb, int V, int y, td_token_metrics *m)
{
    double kl_ba = 0, kl_ab = 0, tv = 0, ha = 0, hb = 0;
    int top_a = 0, top_b = 0, rank_a = 1, rank_b = 1;
    const float ya = la[y], yb = lb[y];
    const double za = td_log_sum_exp(la, V), zb = td_log_sum_exp(lb, V);
    /* a block's p_a, p_b and e^(a-b) - 1, e^(b-a) - 1 at a time: exp's and expm1's bits
     * (td_exp_row_block, td_expm1_row), so each term is td_k3's */
    double ea[TD_EXP_ROW_BLOCK], eb[TD_EXP_ROW_BLOCK], ka[TD_EXP_ROW_BLOCK], kb[TD_EXP_ROW_BLOCK];
    for (int v0 = 0, n; v0 < V; v0 += n) {
        n = (int)td_exp_row_block(la + v0, za, ea, (size_t)(V - v0));
        td_exp_row_block(lb + v0, zb, eb, (size_t)(V - v0));
        for (int i = 0; i < n; i++) {
            ka[i] = (la[v0 + i] - za) - (lb[v0 + i] - zb);
            kb[i] = (lb[v0 + i] - zb) - (la[v0 + i] - za);
        }
        td_expm1_row(ka, ka, (size_t)n);
        td_expm1_row(kb, kb, (size_t)n);
        for (int i = 0; i < n; i++) {
            int v = v0 + i;
            double a = la[v] - za, b = lb[v] - zb, pa = ea[i], pb = eb[i];
            /* p log p -> 0 as p -> 0: a row entry of -inf contributes nothing */
            kl_ba += pb > 0 ? pb * k3_of(a - b, ka[i]) : pa;
            kl_ab += pa > 0 ? pa * k3_of(b - a, kb[i]) : pb;
            if (pb > 0) hb -= pb * b;
            if (pa > 0) ha -= pa * a;
            tv += fabs(pa - pb);
            if (la[v] > la[top_a]) top_a = v;
            if (lb[v] > lb[top_b]) top_b = v;
            rank_a += la[v] > ya;
            rank_b += lb[v] > yb;
        }
    }
    m->logp_a = ya;
    m->logp_b = yb;
    m->kl_ba = kl_ba;
    m->kl_ab = kl_ab;
    m->k3 = td_k3(ya, yb);
    m->tv = 0.5 * tv;
    m->entropy_a = ha;
    m->entropy_b = hb;
    m->top1_a = top_a;
    m->top1_b = top_b;
    m->rank_a = rank_a;
    m->rank_b = rank_b;
}

double td_logp_entropy(const float *logp, int V)
{
    double h = 0, e[TD_EXP_ROW_BLOCK];
    for (int v0 = 0, n; v0 < V; v0 += n) {
        n = (int)td_exp_row_block(logp + v0, 0.0, e, (size_t)(V - v0));
        for (int i = 0; i < n; i++)
            if (e[i] > 0) h -= e[i] * logp[v0 + i];
    }
    return h;
}

/* entropy_a is td_logp_entropy's sum, fused here with the top-1 and rank scans in one pass over
 * the row: as a second pass those scalar compares took as long as the exponentials (152k
 * entries, one Zen 3 core: 1.34-1.45 ms against 0.47-0.51 fused) */
void td_token_metrics_replay(const float *la, int V, int y, double logp_b, td_token_metrics *m)
{
    double ha = 0;
    int top_a = 0, rank_a = 1;
    double ea[TD_EXP_ROW_BLOCK];
    for (int v0 = 0, n; v0 < V; v0 += n) {
        n = (int)td_exp_row_block(la + v0, 0.0, ea, (size_t)(V - v0));
        for (int i = 0; i < n; i++) {
            int v = v0 + i;
            if (ea[i] > 0) ha -= ea[i] * la[v];
            if (la[v] > la[top_a]) top_a = v;
            rank_a += la[v] > la[y];
        }
    }
    m->logp_a = la[y];
    m->logp_b = logp_b;
    m->k3 = td_k3(m->logp_a, logp_b);
    m->kl_ba = m->kl_ab = m->tv = m->entropy_b = NAN;
    m->entropy_a = ha;
    m->top1_a = top_a;
    m->rank_a = rank_a;
    m->top1_b = m->rank_b = -1;
}
