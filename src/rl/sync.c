/* tidal — how the engine receives the policy before each rollout (--lora-sync, include/tidal/rl.h)
 * and what that does to the trainer's frozen base.
 *
 *   full fine-tuning  the session's recipe is set from the trainer's fp32 masters (cast by the
 *                     rollout recipe), as before.
 *   merged            td_session_set_recipe_lora(TD_LORA_MERGED): E(W + dW) summed in fp32; with
 *                     the weights prepared on a device, the base is copied there once
 *                     (td_trainer_base_to_device) and each sync folds the adapter there.
 *   adapter           td_session_set_recipe_lora(TD_LORA_PUNICA): E(W) and vLLM's LoRA branch.
 *   merge-unmerge     per adapted matrix, PEFT's arithmetic (src/model/lora_peft.c) in D:
 *                       M = D(W + delta)      merge_adapter(): the engine model's matrix
 *                       W = D(M - D(delta))   unmerge_adapter(): the trainer's base, kept
 *                     then the session is set from the engine model (a copy of the trainer's
 *                     base whose adapted matrices are the merged ones) and the trainer's
 *                     prepared weights are made again from the drifted base.
 *
 * Metrics (rl.h): base_drift_* compare the trainer's base after the sync with W_0, its value at
 * the start (after the --model-dtype rounding); merge_* compare the engine's prepared weights
 * with and without the update, as td_lora_merge_stats does for the merged form:
 *   survival = |E(M) - E(W)|_F / |dW|_F, aligned = <E(M) - E(W), dW> / |dW|^2 with dW = delta.
 *
 * Every sum runs per adapted matrix, each row in double in column order, the rows added in order,
 * then the matrices in order: the order of the device's kernels, so that both give the same bits.
 *
 * On a device (the trainer's weights prepared there, TIDAL_PREPARE_ON_HOST unset, a rollout
 * recipe without FP8 weights): the trainer's base, the engine's copy and W_0 live in device
 * memory (td_trainer_base_to_device, engine_dev, w0_dev) and each sync runs the same arithmetic
 * there (be->lora_peft_sync, be->lora_drift: src/backend/cuda/lora_sync.cu), bringing down 4 + 3
 * doubles per adapted matrix; both models' host copies are then stale (owned_host_current 0) until
 * a save downloads the base.
 *
 * Resume: the drifted base is part of the run's state: checkpoint-K/lora_base.safetensors holds
 * the adapted matrices of the trainer's base (F32, exact for any D) under their HF names. */
#include "rl_internal.h"
#include "../model/model_internal.h"
#include "tidal/checkpoint.h"
#include "tidal/gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The adapted base matrix (layer l, LoRA slot s: lora.h) of a model whose weights are its own fp32
 * allocation (td_model_alloc: the trainer's base, the engine copy). */
static float *base_mat(td_model *m, int l, int s)
{
    const td_layer_weights *w = &m->w.layers[l];
    if (s >= TD_LORA_NMOD) return (float *)w->w_experts[s - TD_LORA_NMOD];
    int moe = td_config_layer_moe(&m->cfg, l);
    const float *p[TD_LORA_NMOD] = {w->wq, w->wk, w->wv, w->wo, moe ? w->ws_gate : w->w_gate, moe ? w->ws_up : w->w_up,
                                    moe ? w->ws_down : w->w_down};
    return (float *)p[s];
}

static void mat_name(const td_config *c, char *buf, size_t n, int l, int s)
{
    char path[128];
    td_lora_slot_path(c, l, s, path, sizeof path);
    snprintf(buf, n, "%s.weight", path);
}

int rl_sync_init(rl_run *R, td_error *err)
{
    const td_lora *lo = td_trainer_lora(R->tr);
    if (!lo) return 0;
    td_model *base = td_trainer_base(R->tr);
    size_t total = 0, widest = 1;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        size_t n = (size_t)p->out * p->in;
        total += n;
        if (n > widest) widest = n;
    }
    R->w0 = td_xmalloc((total ? total : 1) * sizeof(float));
    R->n_base = total;
    R->sync_buf = td_xmalloc(3 * widest * sizeof(float));
    float *q = R->w0;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        size_t n = (size_t)p->out * p->in;
        memcpy(q, base_mat(base, i / lo->slots, i % lo->slots), n * sizeof(float));
        q += n;
    }
    /* merged: the frozen base beside the adapter on the device, so each sync folds the adapter
     * into it there (weights_recipe.c, be->lora_fold) and nothing parameter-sized comes down */
    if (R->o->lora_sync == TD_RL_SYNC_MERGED && !R->sync_host) td_trainer_base_to_device(R->tr);
    if (R->o->lora_sync == TD_RL_SYNC_MERGE_UNMERGE) {   /* the engine's own copy of the weights */
        R->engine = td_model_alloc(&base->cfg, err);
        if (!R->engine) return -1;
        R->engine->backend = base->backend;   /* the rollouts run where the trainer does */
        memcpy(R->engine->owned, base->owned, base->owned_floats * sizeof(float));
        td_format E = R->rroll.weights, D = (td_format)R->o->model_dtype;
        const td_backend *be = base->backend;
        if (be && be->lora_peft_sync && lo->owned_dev && !R->sync_host && E != TD_E4M3 && E != TD_E5M2 &&
            (D == TD_F32 || D == TD_BF16 || D == TD_F16)) {
            td_trainer_base_to_device(R->tr);
            if (base->owned_dev) {   /* the sync on the device: the engine and W_0 there too */
                size_t bytes = base->owned_floats * sizeof(float);
                R->sync_be = be;
                R->engine_dev = be->alloc(bytes);
                be->upload(R->engine_dev, R->engine->owned, bytes);
                R->engine->owned_dev = R->engine_dev;
                R->engine->owned_host_current = 1;
                be->alias(R->engine->owned, R->engine_dev, bytes, TD_F32);
                R->w0_dev = be->alloc((total ? total : 1) * sizeof(float));
                be->upload(R->w0_dev, R->w0, total * sizeof(float));
            }
        }
    }
    return 0;
}

void rl_sync_free(rl_run *R)
{
    if (R->sync_be) {
        R->sync_be->release(R->engine->owned);
        R->sync_be->free(R->engine_dev);
        R->sync_be->free(R->w0_dev);
    }
    td_model_free(R->engine);
    free(R->w0);
    free(R->sync_buf);
}

/* the statistics of one matrix's merge (n elements in rows of K): sums in the device's order */
static void merge_sums(const float *pm, const float *pw, const float *delta, size_t n, int K, double s[4])
{
    s[0] = s[1] = s[2] = s[3] = 0;
    for (size_t r0 = 0; r0 < n; r0 += (size_t)K) {
        double kept2 = 0, delta2 = 0, dot = 0;
        for (size_t j = r0; j < r0 + (size_t)K; j++) {
            double d = (double)pm[j] - pw[j];
            kept2 += d * d;
            delta2 += (double)delta[j] * delta[j];
            dot += d * delta[j];
            s[3] += pm[j] != pw[j];
        }
        s[0] += kept2;
        s[1] += delta2;
        s[2] += dot;
    }
}

/* the trainer's base matrix and the engine's, on the device (engine_dev) */
static float *dev_mat(const td_model *m, const float *dev, int l, int mo)
{
    return (float *)dev + (base_mat((td_model *)m, l, mo) - m->owned);
}

/* merge_adapter(), the engine's load, unmerge_adapter(); what the engine kept into M */
static int merge_unmerge(rl_run *R, double *M, td_error *err)
{
    const td_lora *lo = td_trainer_lora(R->tr);
    td_model *base = td_trainer_base(R->tr);
    td_format D = (td_format)R->o->model_dtype;
    double kept2 = 0, delta2 = 0, dot = 0, s[4];
    int64_t changed = 0, elements = 0;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        int l = i / lo->slots, mo = i % lo->slots;
        size_t n = (size_t)p->out * p->in;
        if (R->sync_be) {   /* the same arithmetic on the device: the four sums come down */
            R->sync_be->lora_peft_sync(dev_mat(base, base->owned_dev, l, mo), dev_mat(R->engine, R->engine_dev, l, mo),
                                       lo->owned_dev + (p->a - lo->owned), lo->owned_dev + (p->b - lo->owned),
                                       p->out, p->in, lo->rank, lo->scale, D, R->rroll.weights, s);
        } else {
            float *w = base_mat(base, l, mo), *m = base_mat(R->engine, l, mo);
            float *delta = R->sync_buf, *pm = delta + n, *pw = pm + n;
            td_lora_peft_delta(lo, p, delta);
            memcpy(m, w, n * sizeof(float));
            td_lora_peft_merge(D, m, delta, n);                            /* M = D(W + delta)    */
            td_gemm_prepare_weight(&R->rroll, m, p->out, p->in, pm);       /* E(M): what it runs  */
            td_gemm_prepare_weight(&R->rroll, w, p->out, p->in, pw);       /* E(W): without it    */
            merge_sums(pm, pw, delta, n, p->in, s);
            memcpy(w, m, n * sizeof(float));
            td_lora_peft_unmerge(D, TD_PEFT_UNMERGE_ROUNDED, w, delta, n);  /* W = D(M - D(delta)) */
        }
        kept2 += s[0];
        delta2 += s[1];
        dot += s[2];
        changed += (int64_t)s[3];
        elements += (int64_t)n;
    }
    if (R->sync_be) base->owned_host_current = R->engine->owned_host_current = 0;   /* their hosts: stale */
    M[TD_RLM_merge_survival] = delta2 > 0 ? sqrt(kept2 / delta2) : 1.0;
    M[TD_RLM_merge_aligned] = delta2 > 0 ? dot / delta2 : 1.0;
    M[TD_RLM_merge_changed_frac] = elements ? (double)changed / elements : 0.0;
    if (td_session_set_recipe(R->sess, &R->rroll, err) || td_trainer_params_changed(R->tr, err)) return -1;
    return R->fref ? td_forward_set_recipe(R->fref, &R->rtrain, err) : 0;
}

static void drift(rl_run *R, double *M)
{
    const td_lora *lo = td_trainer_lora(R->tr);
    td_model *base = td_trainer_base(R->tr);
    const float *w0 = R->w0;
    double mx = 0, sum = 0, s[3];
    int64_t changed = 0;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        size_t n = (size_t)p->out * p->in;
        int l = i / lo->slots, mo = i % lo->slots;
        if (R->sync_be) {
            R->sync_be->lora_drift(dev_mat(base, base->owned_dev, l, mo), R->w0_dev + (w0 - R->w0), p->out, p->in, s);
        } else {   /* each row's sum in order, the rows' in order (the device's order) */
            const float *w = base_mat(base, l, mo);
            s[0] = s[1] = s[2] = 0;
            for (size_t r0 = 0; r0 < n; r0 += (size_t)p->in) {
                double row = 0;
                for (size_t j = r0; j < r0 + (size_t)p->in; j++) {
                    double d = fabs((double)w[j] - w0[j]);
                    s[0] = fmax(s[0], d);
                    row += d;
                    s[2] += w[j] != w0[j];
                }
                s[1] += row;
            }
        }
        mx = fmax(mx, s[0]);
        sum += s[1];
        changed += (int64_t)s[2];
        w0 += n;
    }
    M[TD_RLM_base_drift_max] = mx;
    M[TD_RLM_base_drift_mean] = R->n_base ? sum / (double)R->n_base : 0.0;
    M[TD_RLM_base_drift_frac] = R->n_base ? (double)changed / (double)R->n_base : 0.0;
}

int rl_sync(rl_run *R, double *M, td_error *err)
{
    const td_lora *lo = td_trainer_lora(R->tr);
    if (!lo) return td_session_set_recipe_lora(R->sess, &R->rroll, NULL, TD_LORA_UNMERGED, err);
    switch ((td_rl_lora_sync)R->o->lora_sync) {
    case TD_RL_SYNC_MERGE_UNMERGE:
        if (merge_unmerge(R, M, err)) return -1;
        break;
    case TD_RL_SYNC_ADAPTER:   /* the base unchanged: with the adapter on the device, its B_e only */
        if (R->sess_set && lo->owned_dev) {
            session_refresh_lora(R->sess, lo);
        } else {
            if (td_session_set_recipe_lora(R->sess, &R->rroll, lo, TD_LORA_PUNICA, err)) return -1;
            R->sess_set = 1;
        }
        break;
    default: {
        if (td_session_set_recipe_lora(R->sess, &R->rroll, lo, TD_LORA_MERGED, err)) return -1;
        td_lora_merge_stats st = td_session_lora_stats(R->sess);
        M[TD_RLM_merge_survival] = st.survival;
        M[TD_RLM_merge_aligned] = st.aligned;
        M[TD_RLM_merge_changed_frac] = st.changed_frac;
    }
    }
    drift(R, M);
    return 0;
}

int rl_sync_save(rl_run *R, const char *dir, td_error *err)
{
    if (!R->engine) return 0;   /* only merge-unmerge changes the base */
    const td_lora *lo = td_trainer_lora(R->tr);
    td_model *base = td_trainer_base(R->tr);
    if (R->sync_be && !base->owned_host_current) {   /* the drifted base from the device */
        R->sync_be->sync();
        R->sync_be->download(base->owned, base->owned_dev, base->owned_floats * sizeof(float));
        base->owned_host_current = 1;
    }
    char path[4400], name[160];
    snprintf(path, sizeof path, "%s/lora_base.safetensors", dir);
    td_st_writer *w = td_st_writer_new(path);
    int rc = -1;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        int64_t shape[2] = {p->out, p->in};
        mat_name(&base->cfg, name, sizeof name, i / lo->slots, i % lo->slots);
        if (td_st_writer_declare(w, name, TD_DT_F32, 2, shape, err)) goto out;
    }
    if (td_st_writer_begin(w, err)) goto out;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        mat_name(&base->cfg, name, sizeof name, i / lo->slots, i % lo->slots);
        if (td_st_writer_write_f32(w, name, base_mat(base, i / lo->slots, i % lo->slots),
                                   (size_t)p->out * p->in, err))
            goto out;
    }
    rc = td_st_writer_finish(w, err);
out:
    td_st_writer_free(w);
    return rc;
}

int rl_sync_load(rl_run *R, const char *dir, td_error *err)
{
    if (!R->engine) return 0;
    const td_lora *lo = td_trainer_lora(R->tr);
    td_model *base = td_trainer_base(R->tr);
    char path[4400], name[160];
    snprintf(path, sizeof path, "%s/lora_base.safetensors", dir);
    td_error why;
    td_checkpoint *ck = td_checkpoint_open(path, &why);
    if (!ck) return td_fail(err, "%s (a --lora-sync merge-unmerge run keeps its drifted base there)", why.msg);
    int rc = -1;
    for (int i = 0; i < lo->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        int64_t shape[2] = {p->out, p->in};
        size_t bad = 0;
        mat_name(&base->cfg, name, sizeof name, i / lo->slots, i % lo->slots);
        if (td_checkpoint_read_f32(ck, name, 2, shape, base_mat(base, i / lo->slots, i % lo->slots), &bad, err))
            goto out;
        if (bad) { td_fail(err, "%s: %s holds %zu non-finite values", path, name, bad); goto out; }
    }
    if (R->sync_be) base->owned_host_current = 1;   /* the host's base is the truth: uploaded */
    rc = td_trainer_params_changed(R->tr, err);
out:
    td_checkpoint_close(ck);
    return rc;
}
