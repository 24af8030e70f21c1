/* Per-token divergence metrics (definitions in include/tidal/metrics.h). */
#include "tidal/metrics.h"
#include "tidal/logprob.h"
#include "tidal/formats.h"

#include <math.h>

double td_k3(double logp_a, double logp_b)
{
    double r = logp_a - logp_b;
    /* p_b(y) = 0 < p_a(y): e^r outgrows r, k3 = +inf (expm1(inf) - inf would be NaN) */
    if (r == INFINITY) return INFINITY;
    /* expm1 keeps k3 accurate for tiny r, where e^r - 1 - r cancels catastrophically */
    return expm1(r) - r;
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
     * (td_exp_row, td_expm1_row), so each term is td_k3's */
    enum { BL = TD_EXP_ROW_BLOCK };
    double ea[BL], eb[BL], ka[BL], kb[BL];
    for (int v = 0; v < V; v++) {
        int i = v % BL;
        if (i == 0) {
            int n = V - v < BL ? V - v : BL;
            for (int j = 0; j < n; j++) {
                ka[j] = (la[v + j] - za) - (lb[v + j] - zb);
                kb[j] = (lb[v + j] - zb) - (la[v + j] - za);
            }
            td_exp_row_shifted(la + v, za, ea, (size_t)n);
            td_exp_row_shifted(lb + v, zb, eb, (size_t)n);
            td_expm1_row(ka, ka, (size_t)n);
            td_expm1_row(kb, kb, (size_t)n);
        }
        double a = la[v] - za, b = lb[v] - zb, pa = ea[i], pb = eb[i];
        /* td_k3(a, b) and td_k3(b, a) */
        double k_ab = a - b == INFINITY ? INFINITY : ka[i] - (a - b);
        double k_ba = b - a == INFINITY ? INFINITY : kb[i] - (b - a);
        /* p log p -> 0 as p -> 0: a row entry of -inf contributes nothing */
        kl_ba += pb > 0 ? pb * k_ab : pa;
        kl_ab += pa > 0 ? pa * k_ba : pb;
        if (pb > 0) hb -= pb * b;
        if (pa > 0) ha -= pa * a;
        tv += fabs(pa - pb);
        if (la[v] > la[top_a]) top_a = v;
        if (lb[v] > lb[top_b]) top_b = v;
        rank_a += la[v] > ya;
        rank_b += lb[v] > yb;
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

void td_token_metrics_replay(const float *la, int V, int y, double logp_b, td_token_metrics *m)
{
    double ha = 0;
    int top_a = 0, rank_a = 1;
    double ea[TD_EXP_ROW_BLOCK];
    for (int v = 0; v < V; v++) {
        if (v % TD_EXP_ROW_BLOCK == 0)
            td_exp_row_shifted(la + v, 0.0, ea, (size_t)(V - v < TD_EXP_ROW_BLOCK ? V - v : TD_EXP_ROW_BLOCK));
        double pa = ea[v % TD_EXP_ROW_BLOCK];
        if (pa > 0) ha -= pa * la[v];
        if (la[v] > la[top_a]) top_a = v;
        rank_a += la[v] > la[y];
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
