/* tidal — what an engine's copy of the weights keeps of a LoRA update (tidal-postmortem, and its
 * --preflight projection).
 *
 * An engine that receives merged weights (TRL's merge_adapter + load_weights into vLLM; verl's
 * merged sync) runs E(D(W + dW)): the base W in the model's dtype D (the engine recipe's weight
 * format), PEFT's delta dW = scale * B @ A added in fp32 and rounded back to D
 * (td_lora_peft_merge), then prepared as the engine's GEMMs run it (td_gemm_prepare_weight).
 * What it kept of the update is |E(D(W + dW)) - E(W)|_F / |dW|_F over every adapted matrix (1: all
 * of it, 0: rounded away; rounding noise can push it past 1), aligned = <E(D(W + dW)) - E(W), dW> /
 * |dW|^2 the update's own component kept (1: exactly the update); changed_frac is the share of adapted weights that moved at all. The
 * same quantities tidal-rl logs per sync as merge_survival / merge_changed_frac. */
#include "tidal/gemm.h"
#include "tidal/postmortem.h"
#include "tidal/lora.h"
#include "tidal/rng.h"
#include "tidal/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* LoRA slot s of layer l (lora.h) widened to fp32 (caller frees; NULL when the layer has no such
 * projection): the param table's entry of its HF name */
static float *weight_of(const td_model *m, int l, int s)
{
    char path[128], want[160];
    td_lora_slot_path(&m->cfg, l, s, path, sizeof path);
    snprintf(want, sizeof want, "%s.weight", path);
    size_t n = td_config_params(&m->cfg, NULL, 0);
    td_param_spec *sp = td_xmalloc(n * sizeof *sp);
    td_config_params(&m->cfg, sp, n);
    float *w = NULL;
    for (size_t i = 0; i < n && !w; i++)
        if (!strcmp(sp[i].name, want)) {
            w = td_xmalloc(sp[i].numel * sizeof(float));
            td_model_param_f32(m, i, w);
        }
    free(sp);
    return w;
}

/* kept^2, update^2, <kept, update> and changed count of one matrix: the engine's E(D(W + delta))
 * against E(D(W + prev)) (prev NULL: against E(W)), the update delta - prev */
static void one_from(const td_recipe *engine, const float *w, const float *prev, const float *delta, int out, int in,
                     double *kept2, double *delta2, double *dot, int64_t *changed)
{
    size_t n = (size_t)out * in;
    float *m = td_xmalloc(4 * n * sizeof(float)), *pm = m + n, *pw = pm + n, *m0 = pw + n;
    memcpy(m, w, n * sizeof(float));
    td_lora_peft_merge(engine->weights, m, delta, n);
    td_gemm_prepare_weight(engine, m, out, in, pm);
    memcpy(m0, w, n * sizeof(float));
    if (prev) td_lora_peft_merge(engine->weights, m0, prev, n);
    td_gemm_prepare_weight(engine, m0, out, in, pw);
    for (size_t j = 0; j < n; j++) {
        double d = (double)pm[j] - pw[j], u = (double)delta[j] - (prev ? prev[j] : 0.0f);
        *kept2 += d * d;
        *delta2 += u * u;
        *dot += d * u;
        *changed += pm[j] != pw[j];
    }
    free(m);
}

static void one(const td_recipe *engine, const float *w, const float *delta, int out, int in, double *kept2, double *delta2,
                double *dot, int64_t *changed)
{
    one_from(engine, w, NULL, delta, out, in, kept2, delta2, dot, changed);
}

static void finish(double kept2, double delta2, double dot, int64_t changed, int64_t elements, double *survival,
                   double *aligned, double *changed_frac)
{
    *survival = delta2 > 0 ? sqrt(kept2 / delta2) : NAN;
    *aligned = delta2 > 0 ? dot / delta2 : NAN;
    *changed_frac = elements ? (double)changed / (double)elements : NAN;
}

/* Both measures in one loop: prev NULL = lo's whole update against the base, else the update since
 * prev; every adapted projection, an MoE's experts included. */
int td_pm_lora_step_survival(const td_model *base, const td_lora *prev, const td_lora *lo, const td_recipe *engine,
                             double *survival, double *aligned, double *changed_frac, td_error *err)
{
    if (prev && (prev->num_layers != lo->num_layers || prev->modules != lo->modules))
        return td_fail(err, "%s and %s adapt different modules: no update between them", prev->dir, lo->dir);
    double kept2 = 0, delta2 = 0, dot = 0;
    int64_t changed = 0, elements = 0;
    if (prev && prev->slots != lo->slots) return td_fail(err, "%s and %s adapt different models", prev->dir, lo->dir);
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i], *q = prev ? &prev->pairs[i] : NULL;
        if (!p->a || (q && !q->a)) continue;
        size_t n = (size_t)p->out * p->in;
        float *delta = td_xmalloc(2 * n * sizeof(float)), *d0 = q ? delta + n : NULL;
        td_lora_peft_delta(lo, p, delta);
        if (q) td_lora_peft_delta(prev, q, d0);
        float *w = weight_of(base, i / lo->slots, i % lo->slots);
        if (w) one_from(engine, w, d0, delta, p->out, p->in, &kept2, &delta2, &dot, &changed);
        free(w);
        elements += (int64_t)n;
        free(delta);
    }
    finish(kept2, delta2, dot, changed, elements, survival, aligned, changed_frac);
    return 0;
}

int td_pm_lora_survival(const td_model *base, const td_lora *lo, const td_recipe *engine, double *survival,
                        double *aligned, double *changed_frac, td_error *err)
{
    return td_pm_lora_step_survival(base, NULL, lo, engine, survival, aligned, changed_frac, err);
}

/* The projection: PEFT's initialisation (lora_A kaiming_uniform_(a=sqrt(5)) = U(-1/sqrt(in),
 * 1/sqrt(in)), lora_B zero), then `steps` Adam steps in which every element of B moved by lr in a
 * fixed random direction (Adam's early step is about lr per element whatever the gradient's
 * scale; A does not move while B is zero at step 1, and little after). dW = (alpha/r) B A. */
int td_pm_lora_projected(const td_model *base, const td_config *cfg, int rank, double alpha, double lr, int steps,
                         uint64_t seed, const td_recipe *engine, double *survival, double *aligned, double *changed_frac, td_error *err)
{
    (void)err;
    double kept2 = 0, delta2 = 0, dot = 0, scale = alpha / rank;
    int64_t changed = 0, elements = 0;
    td_rng g;
    for (int l = 0; l < cfg->num_layers; l++)
        for (int mo = 0; mo < TD_LORA_NMOD; mo++) {
            int out, in;
            if (td_lora_slot_shape(cfg, l, mo, &out, &in)) continue;   /* an MoE layer without a shared expert */
            td_rng_stream(&g, seed, (uint64_t)l * TD_LORA_NMOD + mo);
            float *a = td_xmalloc(((size_t)rank * in + (size_t)out * rank) * sizeof(float)), *b = a + (size_t)rank * in;
            double bound = 1.0 / sqrt((double)in), step = lr * steps;
            for (size_t j = 0; j < (size_t)rank * in; j++) a[j] = (float)((2 * td_rng_uniform(&g) - 1) * bound);
            for (size_t j = 0; j < (size_t)out * rank; j++) b[j] = (float)(td_rng_uniform(&g) < 0.5 ? -step : step);
            size_t n = (size_t)out * in;
            float *delta = td_xmalloc(n * sizeof(float));
            td_lora_pair p = {a, b, out, in};
            td_lora_fold_delta(&p, rank, (float)scale, delta);
            float *w = weight_of(base, l, mo);
            if (w) one(engine, w, delta, out, in, &kept2, &delta2, &dot, &changed);
            free(w);
            elements += (int64_t)n;
            free(delta);
            free(a);
        }
    finish(kept2, delta2, dot, changed, elements, survival, aligned, changed_frac);
    return 0;
}
