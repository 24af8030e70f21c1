/* Sampling with engine-style logits processing (see include/tidal/sampling.h). */
#include "tidal/sampling.h"
#include "tidal/formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A logit and its token id: sorted together so the comparison needs no shared state. */
typedef struct { float value; int token; } ranked;

struct td_sampler {
    int V;
    float *work;     /* (V) processed logits        */
    ranked *order;   /* (V) tokens sorted by value  */
    unsigned char *seen_mask; /* (V) */
};

int td_sampling_check(const td_sampling *s, td_error *err)
{
    if (!(s->temperature >= 0) || s->temperature > 1e6) return td_fail(err, "--temperature must be >= 0 (got %g)", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1)) return td_fail(err, "--top-p must be in (0, 1] (got %g)", s->top_p);
    if (s->top_k < 0) return td_fail(err, "--top-k must be >= 0 (got %d)", s->top_k);
    if (!(s->min_p >= 0 && s->min_p <= 1)) return td_fail(err, "--min-p must be in [0, 1] (got %g)", s->min_p);
    if (!(s->repetition_penalty > 0) || s->repetition_penalty > 1e6)
        return td_fail(err, "--repetition-penalty must be > 0 (got %g)", s->repetition_penalty);
    return 0;
}

td_sampler *td_sampler_create(int V)
{
    td_sampler *s = td_xcalloc(1, sizeof *s);
    s->V = V;
    s->work = td_xmalloc((size_t)V * sizeof(float));
    s->order = td_xmalloc((size_t)V * sizeof(ranked));
    s->seen_mask = td_xcalloc((size_t)V, 1);
    return s;
}

void td_sampler_free(td_sampler *s)
{
    if (!s) return;
    free(s->work);
    free(s->order);
    free(s->seen_mask);
    free(s);
}

static int by_value_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return x->token - y->token;   /* ties: lower token id first */
}

int td_sample(td_sampler *smp, const td_sampling *s, const float *logits, const int *seen,
              int n_seen, td_rng *rng, float *logp_proc)
{
    const int V = smp->V;
    float *w = smp->work;
    memcpy(w, logits, (size_t)V * sizeof(float));
    if (s->repetition_penalty != 1.0 && n_seen > 0) {
        for (int i = 0; i < n_seen; i++) {
            int t = seen[i];
            if (t < 0 || t >= V || smp->seen_mask[t]) continue;
            smp->seen_mask[t] = 1;
            float p = (float)s->repetition_penalty;
            w[t] = w[t] > 0 ? w[t] / p : w[t] * p;
        }
        for (int i = 0; i < n_seen; i++) if (seen[i] >= 0 && seen[i] < V) smp->seen_mask[seen[i]] = 0;
    }
    int greedy = s->temperature == 0.0;
    if (!greedy && s->temperature != 1.0) {
        float t = (float)s->temperature;          /* vLLM divides the logits by T */
        for (int v = 0; v < V; v++) w[v] /= t;
    }
    if (!greedy && s->min_p > 0.0) {                /* vLLM: min-p before top-k / top-p */
        float mx = -INFINITY;
        for (int v = 0; v < V; v++) mx = w[v] > mx ? w[v] : mx;
        float cut = mx + (float)log(s->min_p);    /* p_v < min_p * p_max  <=>  l_v < l_max + log min_p */
        for (int v = 0; v < V; v++) if (w[v] < cut) w[v] = -INFINITY;
    }
    int need_sort = !greedy && ((s->top_k > 0 && s->top_k < V) || s->top_p < 1.0);
    if (need_sort) {
        ranked *o = smp->order;
        for (int v = 0; v < V; v++) o[v] = (ranked){w[v], v};
        qsort(o, (size_t)V, sizeof *o, by_value_desc);
        int keep = V;
        if (s->top_k > 0 && s->top_k < keep) {
            /* HF and vLLM remove tokens strictly below the k-th value: ties with it stay */
            keep = s->top_k;
            while (keep < V && o[keep].value == o[keep - 1].value) keep++;
        }
        if (s->top_p < 1.0) {
            double mx = o[0].value, z = 0, cum = 0;
            for (int i = 0; i < keep; i++) z += exp((double)o[i].value - mx);
            int i = 0;
            for (; i < keep; i++) {
                cum += exp((double)o[i].value - mx) / z;
                if (cum >= s->top_p) { i++; break; }
            }
            keep = i < 1 ? 1 : i;
        }
        for (int i = keep; i < V; i++) w[o[i].token] = -INFINITY;
    }
    td_log_softmax(w, V);
    if (logp_proc) memcpy(logp_proc, w, (size_t)V * sizeof(float));
    int tok = 0;
    if (greedy) {
        for (int v = 1; v < V; v++) if (w[v] > w[tok]) tok = v;
        return tok;
    }
    double u = td_rng_uniform(rng), cum = 0, e[TD_EXP_ROW_BLOCK];
    int last = 0;
    for (int v0 = 0, n; v0 < V; v0 += n) {   /* exp's bits a block at a time (td_exp_row_block) */
        n = (int)td_exp_row_block(w + v0, 0.0, e, (size_t)(V - v0));
        for (int i = 0; i < n; i++) {
            if (w[v0 + i] == -INFINITY) continue;
            last = v0 + i;
            cum += e[i];
            if (u < cum) return v0 + i;
        }
    }
    return last;   /* u beyond the rounded total: the last possible token */
}
