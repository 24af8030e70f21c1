/* rl_probe — a test driver of libtidal's RL loss pieces (include/tidal/rl.h), not a user tool:
 * the Python cross-checks (tests/py/test_rl_loss.py, test_rl_grad_torch.py) feed it synthetic
 * tensors and compare what it prints with their own numpy / torch implementations.
 *
 *   rl_probe loss IN.json            advantages, IS weights, masks, normalisers, loss, dL/dlogp
 *   rl_probe grad IN.json MODEL OUT  the RL loss through td_trainer_accumulate on MODEL (fp32),
 *                                    gradients to OUT (td_trainer_dump_grads)
 *
 * IN.json: {"cfg": {...}, and for loss: "off", "old", "mu", "mask", "reward", "logp", "ref";
 *           for grad: "tokens" (prompt + response ids), "plen", "reward", "mu_delta",
 *           "old_delta", "ref_delta" (per response token: mu = logp + mu_delta, ...)}
 * cfg keys: policy_loss (ppo|pg), epsilon, epsilon_high, dual_clip, loss_type, beta, is, is_cap,
 * is_cap_low, drop, scale, G, micro, ga, max_completion_length. Prints JSON on stdout. */
#include "tidal/rl.h"
#include "tidal/train.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double num(json_t *o, const char *k, double def)
{
    json_t *v = json_object_get(o, k);
    return v ? json_number_value(v) : def;
}

static const char *str(json_t *o, const char *k, const char *def)
{
    json_t *v = json_object_get(o, k);
    return v ? json_string_value(v) : def;
}

static void cfg_from(json_t *c, td_rl_loss_cfg *lc)
{
    td_rl_loss_cfg_defaults(lc);
    lc->policy_loss = !strcmp(str(c, "policy_loss", "ppo"), "pg") ? TD_PL_PG : TD_PL_PPO;
    lc->epsilon = num(c, "epsilon", 0.2);
    lc->epsilon_high = num(c, "epsilon_high", lc->epsilon);
    lc->dual_clip = num(c, "dual_clip", 0);
    const char *lt = str(c, "loss_type", "dapo");
    lc->loss_type = !strcmp(lt, "grpo") ? TD_LOSS_GRPO : !strcmp(lt, "bnpo") ? TD_LOSS_BNPO
                  : !strcmp(lt, "dr_grpo") ? TD_LOSS_DR_GRPO : TD_LOSS_DAPO;
    lc->beta = num(c, "beta", 0);
    lc->is_mode = (td_rl_is)td_rl_is_from_name(str(c, "is", "none"), NULL);
    lc->is_cap = num(c, "is_cap", 0);
    lc->is_cap_low = num(c, "is_cap_low", 0);
    lc->is_drop_masked = (int)num(c, "drop", 0);
    const char *sc = str(c, "scale", "group");
    lc->scale_rewards = !strcmp(sc, "batch") ? TD_ADVS_BATCH : !strcmp(sc, "none") ? TD_ADVS_NONE : TD_ADVS_GROUP;
    lc->num_generations = (int)num(c, "G", 4);
    lc->micro_batch = (int)num(c, "micro", 4);
    lc->grad_accum = (int)num(c, "ga", 1);
    lc->max_completion_length = (int)num(c, "max_completion_length", 16);
}

static float *floats(json_t *a, size_t n)
{
    float *x = calloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; i < n && i < json_array_size(a); i++) x[i] = (float)json_number_value(json_array_get(a, i));
    return x;
}

static json_t *farr(const float *x, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

static json_t *darr(const double *x, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

/* the loss of a prepared batch given the current log-probs: total, dL/dlogp, clip counts */
static double run_loss(const td_rl_loss_cfg *lc, const td_rl_batch *b, const td_rl_prep *p, const float *logp,
                       const float *ref, float *dlogp, td_rl_clip_stats *st)
{
    double total = 0;
    for (int s = 0; s < b->B; s++) {
        int64_t o = b->off[s];
        total += td_rl_seq_loss(lc, (int)(b->off[s + 1] - o), logp + o, b->old + o, ref ? ref + o : NULL, p->w + o,
                                p->m + o, p->adv[s], p->coef[s], dlogp + o, st);
    }
    return total;
}

static json_t *prep_json(const td_rl_batch *b, const td_rl_prep *p, size_t N)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:i, s:I, s:I, s:i, s:I}", "adv", darr(p->adv, (size_t)b->B), "w", farr(p->w, N),
                     "m", farr(p->m, N), "coef", darr(p->coef, (size_t)b->B), "zero_std", p->zero_std_groups,
                     "n_clipped", (json_int_t)p->n_clipped, "n_masked", (json_int_t)p->n_masked,
                     "n_seq_masked", p->n_seq_masked, "n_loss_tokens", (json_int_t)p->n_loss_tokens);
}

static void prep_alloc(td_rl_prep *p, int B, size_t N)
{
    p->adv = calloc((size_t)B, sizeof(double));
    p->coef = calloc((size_t)B, sizeof(double));
    p->w = calloc(N ? N : 1, sizeof(float));
    p->m = calloc(N ? N : 1, sizeof(float));
}

static int cmd_loss(json_t *root)
{
    td_rl_loss_cfg lc;
    cfg_from(json_object_get(root, "cfg"), &lc);
    json_t *joff = json_object_get(root, "off");
    int B = (int)json_array_size(joff) - 1;
    int64_t *off = calloc((size_t)B + 1, sizeof(int64_t));
    for (int s = 0; s <= B; s++) off[s] = json_integer_value(json_array_get(joff, (size_t)s));
    size_t N = (size_t)off[B];
    float *old = floats(json_object_get(root, "old"), N), *mu = floats(json_object_get(root, "mu"), N);
    float *mask = floats(json_object_get(root, "mask"), N), *logp = floats(json_object_get(root, "logp"), N);
    json_t *jref = json_object_get(root, "ref");
    float *ref = jref ? floats(jref, N) : NULL;
    double *reward = calloc((size_t)B, sizeof(double));
    for (int s = 0; s < B; s++) reward[s] = json_number_value(json_array_get(json_object_get(root, "reward"), (size_t)s));
    td_rl_batch b = {B, off, old, mu, mask, reward};
    td_rl_prep p;
    prep_alloc(&p, B, N);
    td_rl_prepare(&lc, &b, &p);
    float *dl = calloc(N ? N : 1, sizeof(float));
    td_rl_clip_stats st = {0};
    double loss = run_loss(&lc, &b, &p, logp, ref, dl, &st);
    json_t *out = prep_json(&b, &p, N);
    json_object_set_new(out, "loss", json_real(loss));
    json_object_set_new(out, "dlogp", farr(dl, N));
    json_object_set_new(out, "clipped", json_real(st.clipped));
    json_object_set_new(out, "clipped_lower", json_real(st.clipped_lower));
    char *s = json_dumps(out, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(out);
    return 0;
}

/* grad: the trainer's callback gives logp; the loss is the same td_rl_seq_loss as tidal-rl's */
typedef struct {
    const td_rl_loss_cfg *lc;
    const int *plen;
    const td_rl_batch *b;
    const td_rl_prep *p;
    const float *ref;
    float *logp_out;      /* first pass: the current log-probs of the response tokens */
    int record;
} grad_ctx;

static double grad_fn(void *user, int s, int n, const float *logp, float *dlogp)
{
    grad_ctx *g = user;
    int P = g->plen[s];
    int64_t o = g->b->off[s];
    int T = (int)(g->b->off[s + 1] - o);
    memset(dlogp, 0, (size_t)n * sizeof(float));
    if (g->record) {
        memcpy(g->logp_out + o, logp + P - 1, (size_t)T * sizeof(float));
        return 0.0;
    }
    return td_rl_seq_loss(g->lc, T, logp + P - 1, g->b->old + o, g->ref ? g->ref + o : NULL, g->p->w + o,
                          g->p->m + o, g->p->adv[s], g->p->coef[s], dlogp + P - 1, NULL);
}

static int cmd_grad(json_t *root, const char *model_dir, const char *out_path)
{
    td_error err;
    td_rl_loss_cfg lc;
    cfg_from(json_object_get(root, "cfg"), &lc);
    json_t *jt = json_object_get(root, "tokens");
    int B = (int)json_array_size(jt), maxlen = 0;
    int **tok = calloc((size_t)B, sizeof(int *)), *lens = calloc((size_t)B, sizeof(int)), *plen = calloc((size_t)B, sizeof(int));
    int64_t *off = calloc((size_t)B + 1, sizeof(int64_t));
    for (int s = 0; s < B; s++) {
        json_t *row = json_array_get(jt, (size_t)s);
        lens[s] = (int)json_array_size(row);
        plen[s] = (int)json_integer_value(json_array_get(json_object_get(root, "plen"), (size_t)s));
        tok[s] = malloc((size_t)lens[s] * sizeof(int));
        for (int t = 0; t < lens[s]; t++) tok[s][t] = (int)json_integer_value(json_array_get(row, (size_t)t));
        off[s + 1] = off[s] + lens[s] - plen[s];
        if (lens[s] > maxlen) maxlen = lens[s];
    }
    size_t N = (size_t)off[B];
    td_model *m = td_model_load(model_dir, &err);
    if (!m) { fprintf(stderr, "rl_probe: %s\n", err.msg); return 1; }
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.max_seq_len = maxlen;
    o.max_tokens = maxlen * B;
    td_trainer *tr = td_trainer_create(m, NULL, &o, NULL, &err);
    if (!tr) { fprintf(stderr, "rl_probe: %s\n", err.msg); return 1; }
    float *logp = calloc(N, sizeof(float)), *old = calloc(N, sizeof(float)), *mu = calloc(N, sizeof(float));
    float *ref = calloc(N, sizeof(float)), *mask = calloc(N, sizeof(float));
    grad_ctx g = {&lc, plen, NULL, NULL, NULL, logp, 1};
    td_rl_batch b = {B, off, old, mu, mask, NULL};
    g.b = &b;
    double unused;
    if (td_trainer_accumulate(tr, B, (const int *const *)tok, lens, grad_fn, &g, &unused, &err)) {
        fprintf(stderr, "rl_probe: %s\n", err.msg);
        return 1;
    }
    json_t *md = json_object_get(root, "mu_delta"), *od = json_object_get(root, "old_delta"), *rd = json_object_get(root, "ref_delta");
    json_t *jm = json_object_get(root, "mask");
    for (size_t i = 0; i < N; i++) {
        old[i] = logp[i] + (float)json_number_value(json_array_get(od, i));
        mu[i] = old[i] + (float)json_number_value(json_array_get(md, i));
        ref[i] = logp[i] + (float)json_number_value(json_array_get(rd, i));
        mask[i] = jm ? (float)json_number_value(json_array_get(jm, i)) : 1.0f;
    }
    double *reward = calloc((size_t)B, sizeof(double));
    for (int s = 0; s < B; s++) reward[s] = json_number_value(json_array_get(json_object_get(root, "reward"), (size_t)s));
    b.reward = reward;
    td_rl_prep p;
    prep_alloc(&p, B, N);
    td_rl_prepare(&lc, &b, &p);
    g.p = &p;
    g.ref = ref;
    g.record = 0;
    double loss;
    if (td_trainer_accumulate(tr, B, (const int *const *)tok, lens, grad_fn, &g, &loss, &err) ||
        td_trainer_dump_grads(tr, out_path, B, (const int *const *)tok, lens, NULL, 0, "rl_probe", &err)) {
        fprintf(stderr, "rl_probe: %s\n", err.msg);
        return 1;
    }
    json_t *out = prep_json(&b, &p, N);
    json_object_set_new(out, "loss", json_real(loss));
    json_object_set_new(out, "logp", farr(logp, N));
    json_object_set_new(out, "old", farr(old, N));
    json_object_set_new(out, "mu", farr(mu, N));
    json_object_set_new(out, "ref", farr(ref, N));
    char *s = json_dumps(out, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(out);
    td_trainer_free(tr);
    td_model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "rl_probe: usage: rl_probe loss IN.json | grad IN.json MODEL OUT\n"); return 2; }
    json_error_t je;
    json_t *root = json_load_file(argv[2], 0, &je);
    if (!root) { fprintf(stderr, "rl_probe: %s: %s\n", argv[2], je.text); return 1; }
    int rc = !strcmp(argv[1], "loss") ? cmd_loss(root)
           : !strcmp(argv[1], "grad") && argc == 5 ? cmd_grad(root, argv[3], argv[4]) : 2;
    json_decref(root);
    return rc;
}
