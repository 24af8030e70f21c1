/* tidal — the training step (include/tidal/train.h): fp32 masters and their gradients and
 * AdamW moments carved by the parameter table (or an adapter's A/B block under LoRA), the
 * training path's forward with every activation kept, the loss on target log-probs, the
 * lm_head and decoder backward, and the optimiser step.
 *
 * One micro-batch (whole sequences, at most max_tokens rows):
 *   forward_decoder          the teacher-forced decoder of src/paths/forward.c, activations kept
 *   head_forward             lm_head + log-softmax by chunks of logits_rows rows; each row's
 *                            target log-prob (the very values td_forward_logprobs returns)
 *   loss function            per sequence: its loss and dL/dlogp of each target (x loss scale)
 *   logsoftmax_backward      dlogits in place of the log-softmax rows (recomputed per chunk
 *                            when the micro-batch's logits do not all fit in the buffer)
 *   matmul_backward          the lm_head under its own recipe (td_recipe_for_head)
 *   decoder_backward         every layer back to the embedding
 *
 * On a device (the model's backend, td_model_set_device: --device cuda) the activations, their
 * gradients, the weight gradients and the logits live in the backend's memory and every op of
 * the forward and backward runs there; per micro-batch the host sees only each row's target
 * log-prob and top token (logprob_gather: N floats, N ints) and hands back dL/dlogp (N floats,
 * staged by logsoftmax_backward). The optimiser step runs there too (the table's optim_*
 * entries, optim.c's arithmetic): the fp32 masters and AdamW moments stay in device buffers,
 * unscaling, the per-tensor sums of squares (the host gets ntensors doubles: the norm, the
 * Inf/NaN test, the clip coefficient, the GradScaler's decision), clipping and AdamW run as
 * kernels.
 *
 * The recipe's weights after a step are prepared on the device from the device masters (prep_dev;
 * the backend's prepare / alias / release entries, ops.h; src/backend/cuda/prepare.cu):
 *   full fine-tuning   m->owned_dev = params_dev and the host range of the masters is an alias of
 *                      it (be->alias): every path made on tr->m (this forward, tidal-rl's
 *                      rollout session and pi_old, the greedy evaluation) prepares its recipe
 *                      there (weights_recipe.c: bf16 / fp16 / fp32 copies rounded by the host's
 *                      functions, bit for bit; the embedding a rounding view of the masters,
 *                      no copy), and a recipe that shares the masters (fp32) reads them in
 *                      place. The prepared copies' host buffers are never written (stale keys
 *                      of the device copies, which forget keeps). Nothing comes down per
 *                      step; the host masters are downloaded when a host reader asks
 *                      (train_masters_to_host: a checkpoint, a state file, td_trainer_params, the
 *                      name of a non-finite weight). FP8 weight formats are quantised there
 *                      too (be->prepare_fp8); an adapter merged into FP8 weights brings the
 *                      tensor down and prepares it on the host.
 *   LoRA               lora->owned_dev = params_dev: the paths' unmerged (PEFT) and vLLM adapter
 *                      forms round A and B there (lora_run.c); a step re-rounds only the adapter
 *                      (forward_refresh_lora; tidal-rl's pi_old and --lora-sync adapter session
 *                      too: src/rl/step.c, sync.c), the frozen base's prepared weights stay. The
 *                      adapter (nparams floats, small) still comes down each step for host
 *                      readers (saves). tidal-rl's merged and merge-unmerge syncs also keep the
 *                      base there (td_trainer_base_to_device: base_dev = m->owned_dev, the host
 *                      copy current until merge-unmerge drifts it on the device, src/rl/sync.c).
 * TIDAL_PREPARE_ON_HOST=1 keeps the path before (the masters downloaded, every recipe prepared
 * on the host and uploaded again); TIDAL_STEP_D2H=1 prints each step's bytes device -> host
 * (td_device_d2h_bytes; tests/py/test_device_sft.py and test_device_rl.py compare the two paths:
 * /steps bit for bit). The moments come down only for a state file.
 */
#include "train_internal.h"
#include "tidal/memplan.h"
#include "tidal/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void td_train_opts_defaults(td_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->lr = 5e-5;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->max_grad_norm = 1.0;
    o->schedule = TD_SCHED_LINEAR;
    o->max_steps = 1;
    o->loss_scaling = -1;
    o->init_scale = 65536.0;
    o->growth_factor = 2.0;
    o->backoff_factor = 0.5;
    o->growth_interval = 2000;
    o->lora_alpha = 16.0;
    o->max_tokens = 2048;
    o->max_seq_len = 512;
}

void td_train_opts_resolve_moe(td_train_opts *o, const td_config *c)
{
    if (o->output_router_logits < 0) o->output_router_logits = c->num_experts > 0 && c->output_router_logits;
    if (isnan(o->router_aux_loss_coef)) o->router_aux_loss_coef = c->router_aux_loss_coef;
}

static int check_opts(const td_train_opts *o, td_error *err)
{
    if (!(o->lr >= 0) || !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) ||
        !(o->eps >= 0) || !(o->weight_decay >= 0))
        return td_fail(err, "training options: lr %g, betas (%g, %g), eps %g, weight_decay %g "
                       "(expected lr, eps, weight_decay >= 0 and betas in [0, 1))", o->lr, o->beta1,
                       o->beta2, o->eps, o->weight_decay);
    if ((unsigned)o->schedule >= TD_SCHED_COUNT || o->max_steps < 1 || !(o->warmup_ratio >= 0) ||
        o->warmup_ratio > 1 || o->warmup_steps < 0)
        return td_fail(err, "training options: lr scheduler %d, max_steps %d, warmup_ratio %g, "
                       "warmup_steps %d (expected a scheduler, max_steps >= 1, warmup_ratio in "
                       "[0, 1])", (int)o->schedule, o->max_steps, o->warmup_ratio, o->warmup_steps);
    if (!(o->init_scale > 0) || !(o->growth_factor >= 1) || !(o->backoff_factor > 0) ||
        o->backoff_factor >= 1 || o->growth_interval < 1)
        return td_fail(err, "loss scaling: init_scale %g, growth_factor %g, backoff_factor %g, "
                       "growth_interval %d (expected > 0, >= 1, in (0, 1), >= 1)", o->init_scale,
                       o->growth_factor, o->backoff_factor, o->growth_interval);
    if (o->lora_r < 0 || (o->lora_r > 0 && !(o->lora_alpha > 0)) ||
        o->lora_modules >= 1u << TD_LORA_NMOD)
        return td_fail(err, "LoRA: r %d, alpha %g, modules 0x%x (expected r >= 0, alpha > 0, "
                       "modules among q/k/v/o/gate/up/down)", o->lora_r, o->lora_alpha, o->lora_modules);
    if (o->lora_base_dtype != TD_F32 && (o->lora_r == 0 || (o->lora_base_dtype != TD_BF16 && o->lora_base_dtype != TD_F16)))
        return td_fail(err, "LoRA base dtype %s: expected fp32, bf16 or fp16, and only under LoRA (full "
                       "fine-tuning keeps fp32 masters)", td_format_info((td_format)o->lora_base_dtype) ? td_format_info((td_format)o->lora_base_dtype)->name : "?");
    if (o->max_tokens < 1 || o->max_seq_len < 2 || o->max_seq_len > o->max_tokens)
        return td_fail(err, "training options: max_tokens %d, max_seq_len %d (expected "
                       "2 <= max_seq_len <= max_tokens)", o->max_tokens, o->max_seq_len);
    return 0;
}

/* A fresh adapter as PEFT initialises it: A (r, in) from kaiming_uniform_(a = sqrt(5)), i.e.
 * U(-1/sqrt(in), 1/sqrt(in)); B zero. Pair i draws from td_rng_stream(seed, i). */
static td_lora *lora_fresh(const td_config *c, const td_train_opts *o)
{
    unsigned mods = o->lora_modules ? o->lora_modules : (1u << TD_LORA_Q) | (1u << TD_LORA_V);
    td_lora *lo = td_lora_new(c, o->lora_r, o->lora_alpha, mods);
    for (int i = 0; i < c->num_layers * lo->slots; i++) {
        td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        td_rng r;
        td_rng_stream(&r, o->seed, (uint64_t)i);
        float bound = 1.0f / sqrtf((float)p->in);
        float *a = (float *)p->a;
        for (size_t k = 0; k < (size_t)o->lora_r * p->in; k++)
            a[k] = (float)((2.0 * td_rng_uniform(&r) - 1.0) * bound);
    }
    return lo;
}

static td_lora *lora_copy(const td_lora *src, const td_config *c, td_error *err)
{
    if (src->num_layers != c->num_layers)
        return td_fail(err, "%s: adapter for %d layers, model has %d", src->dir ? src->dir : "adapter",
                       src->num_layers, c->num_layers), NULL;
    td_lora *lo = td_lora_new(c, src->rank, src->alpha, src->modules);
    lo->rslora = src->rslora;
    lo->scale = src->scale;
    for (int i = 0; i < c->num_layers * lo->slots; i++) {
        const td_lora_pair *s = &src->pairs[i];
        td_lora_pair *d = &lo->pairs[i];
        if (src->slots != lo->slots || !s->a != !d->a) {
            char path[128];
            td_lora_slot_path(c, i / lo->slots, i % lo->slots, path, sizeof path);
            td_lora_free(lo);
            return td_fail(err, "%s: adapts %s in some places only (not %s): not trainable here",
                           src->dir ? src->dir : "adapter", td_lora_module_name(td_lora_slot_module(i % lo->slots)), path), NULL;
        }
        if (!s->a) continue;
        memcpy((float *)d->a, s->a, (size_t)lo->rank * d->in * sizeof(float));
        memcpy((float *)d->b, s->b, (size_t)d->out * lo->rank * sizeof(float));
    }
    return lo;
}

/* the list of trained tensors: the parameter table, or each adapted pair's A and B */
static void build_tensors(td_trainer *tr)
{
    const td_config *c = &tr->m->cfg;
    if (!tr->lora) {
        tr->tensors = td_xcalloc(tr->nspecs, sizeof *tr->tensors);
        tr->ntensors = 0;
        for (size_t i = 0; i < tr->nspecs; i++) {
            const td_param_spec *p = &tr->specs[i];
            if (tr->o.freeze_router && p->role == TD_ROLE_ROUTER) continue;   /* frozen: no gradient slot */
            train_tensor *t = &tr->tensors[tr->ntensors++];
            snprintf(t->name, sizeof t->name, "%s", p->name);
            t->offset = p->offset;
            t->numel = p->numel;
            t->ndim = p->ndim;
            t->shape[0] = p->shape[0];
            t->shape[1] = p->shape[1];
            t->decay = tr->o.decay_all || p->kind == TD_PARAM_MATRIX || p->kind == TD_PARAM_EMBED;
            *param_slot(&tr->gw, c->num_layers, p) = tr->grads + p->offset;
        }
        if (c->tie_word_embeddings) tr->gw.lm_head = tr->gw.embed;
        return;
    }
    td_lora *lo = tr->lora;
    tr->ntensors = 2 * (size_t)lo->n_adapted;
    tr->tensors = td_xcalloc(tr->ntensors, sizeof *tr->tensors);
    size_t k = 0;
    for (int i = 0; i < c->num_layers * lo->slots; i++) {
        const td_lora_pair *p = &lo->pairs[i];
        if (!p->a) continue;
        char path[128];
        td_lora_slot_path(c, i / lo->slots, i % lo->slots, path, sizeof path);
        for (int ab = 0; ab < 2; ab++, k++) {
            train_tensor *t = &tr->tensors[k];
            const float *x = ab ? p->b : p->a;
            snprintf(t->name, sizeof t->name, "base_model.model.%s.lora_%c.weight", path, ab ? 'B' : 'A');
            t->offset = (size_t)(x - lo->owned);
            t->ndim = 2;
            t->shape[0] = ab ? p->out : lo->rank;
            t->shape[1] = ab ? lo->rank : p->in;
            t->numel = (size_t)t->shape[0] * t->shape[1];
            t->decay = 1;   /* HF decays every Linear weight, LoRA's included */
        }
        tr->lg[i].da = tr->grads + (p->a - lo->owned);
        tr->lg[i].db = tr->grads + (p->b - lo->owned);
    }
}

int td_lora_targets_parse(const char *value, unsigned *mask, char *why, size_t whylen)
{
    unsigned m = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", value);
    if (!strcmp(value, "all-linear") || !strcmp(value, "all_linear")) {
        *mask = (1u << TD_LORA_NMOD) - 1;
        return 0;
    }
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = td_lora_module_from_name(t);
        if (k < 0) {
            snprintf(why, whylen, "modules among q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (or "
                     "all-linear), comma-separated; the model has no '%s'", t);
            return -1;
        }
        m |= 1u << k;
    }
    if (!m) { snprintf(why, whylen, "at least one module"); return -1; }
    *mask = m;
    return 0;
}

int td_lora_dropout_parse(const char *value, double *p, char *why, size_t whylen)
{
    char *end;
    double x = strtod(value, &end);
    if (*value && !*end && x == 0) { *p = 0; return 0; }
    snprintf(why, whylen, "0 (PEFT's lora_dropout masks the adapter's input in training only: a train/inference "
             "difference by design, which tidal would count as mismatch)");
    return -1;
}

td_trainer *td_trainer_create(const td_model *src, const td_recipe *r, const td_train_opts *opts_in,
                              const td_lora *lora_init, td_error *err)
{
    td_train_opts resolved = *opts_in, *opts = &resolved;
    td_train_opts_resolve_moe(opts, &src->cfg);
    if (check_opts(opts, err)) return NULL;
    const td_config *c = &src->cfg;
    if (td_config_check_len(c, opts->max_seq_len, err)) return NULL;
    if (opts->freeze_router && c->num_experts <= 0)
        return td_fail(err, "--freeze-router: %s is a dense model: it has no router to freeze", td_arch_name(c->arch)), NULL;
    if (opts->output_router_logits && c->num_experts <= 0)
        return td_fail(err, "--output-router-logits: %s is a dense model: it has no router logits (the load-balancing "
                       "loss is a mixture of experts')", td_arch_name(c->arch)), NULL;
    if (opts->output_router_logits && !(opts->router_aux_loss_coef >= 0 && isfinite(opts->router_aux_loss_coef)))
        return td_fail(err, "--router-aux-loss-coef %g: expected a finite value >= 0", opts->router_aux_loss_coef), NULL;
    if (src->backend && !td_backend_has_backward(src->backend))
        return td_fail(err, "training: the %s backend lacks backward ops (matmul_backward): train on "
                       "the CPU (--device cpu)", src->backend->name), NULL;
    td_model *m = td_model_alloc(c, err);
    if (!m) return NULL;
    m->backend = src->backend;   /* the forward, backward and the paths made on tr->m run there */
    td_trainer *tr = td_xcalloc(1, sizeof *tr);
    tr->o = *opts;
    tr->m = m;
    tr->recipe = r ? *r : *td_recipe_find_preset("fp32");
    tr->specs = param_table(c, &tr->nspecs);
    for (size_t i = 0; i < tr->nspecs; i++)   /* the masters: an fp32 copy of every tensor (widened) */
        model_param_rows_f32(src, i, &tr->specs[i], 0, tr->specs[i].ndim == 2 ? (size_t)tr->specs[i].shape[0] : 1,
                             m->owned + tr->specs[i].offset);
    if (opts->lora_r > 0 && opts->lora_base_dtype != TD_F32)   /* the base loaded in torch_dtype */
        td_round_row((td_format)opts->lora_base_dtype, m->owned, m->owned, m->owned_floats, TD_SATFINITE);
    if (opts->lora_r > 0) {
        tr->lora = lora_init ? lora_copy(lora_init, c, err) : lora_fresh(c, opts);
        if (!tr->lora) goto fail;
        size_t total = 0;
        for (int i = 0; i < c->num_layers * tr->lora->slots; i++)
            if (tr->lora->pairs[i].a) total += ((size_t)tr->lora->pairs[i].in + tr->lora->pairs[i].out) * tr->lora->rank;
        tr->params = tr->lora->owned;
        tr->nparams = total;
    } else {
        tr->params = m->owned;
        tr->nparams = m->owned_floats;
    }
    tr->be = m->backend ? m->backend : &td_backend_cpu;
    tr->grads = tr->be->alloc(tr->nparams * sizeof(float));
    tr->be->zero(tr->grads, tr->nparams * sizeof(float));
    tr->grads_host = tr->be->sync ? td_xcalloc(tr->nparams, sizeof(float)) : tr->grads;
    tr->m1 = td_xcalloc(tr->nparams, sizeof(float));
    tr->m2 = td_xcalloc(tr->nparams, sizeof(float));
    if (tr->be->sync) {   /* a device: its own masters and moments, uploaded now */
        tr->params_dev = tr->be->alloc(tr->nparams * sizeof(float));
        tr->m1_dev = tr->be->alloc(tr->nparams * sizeof(float));
        tr->m2_dev = tr->be->alloc(tr->nparams * sizeof(float));
    } else {
        tr->params_dev = tr->params;
        tr->m1_dev = tr->m1;
        tr->m2_dev = tr->m2;
    }
    train_state_to_device(tr);
    const char *on_host = getenv("TIDAL_PREPARE_ON_HOST");   /* diagnostic: the download path */
    tr->prep_dev = tr->be->prepare && !(on_host && *on_host && strcmp(on_host, "0"));
    const char *log = getenv("TIDAL_STEP_D2H");
    tr->log_d2h = log && *log && strcmp(log, "0");
    if (tr->prep_dev && tr->lora) {
        tr->lora->owned_dev = tr->params_dev;   /* its paths round A and B from the device copy */
    } else if (tr->prep_dev) {
        /* the masters live on the device: every path of this model prepares its recipe from them
         * there, and host pointers into them (fp32 recipes share the masters) find them */
        m->owned_dev = tr->params_dev;
        tr->be->alias(m->owned, tr->params_dev, m->owned_floats * sizeof(float), TD_F32);
    }
    td_model_weights_layers(&tr->gw, c, NULL);
    tr->lg = td_xcalloc((size_t)c->num_layers * td_lora_slots(c), sizeof *tr->lg);
    build_tensors(tr);

    size_t V = (size_t)c->vocab_size;
    int rows = opts->logits_rows;
    if (rows <= 0) rows = (size_t)opts->max_tokens * V <= (1u << 25) ? opts->max_tokens : 256;
    tr->logits_rows = rows < opts->max_tokens ? rows : opts->max_tokens;
    tr->f = td_forward_create(m, opts->max_tokens, opts->max_seq_len, tr->logits_rows, err);
    if (!tr->f) goto fail;
    if (opts->gradient_checkpointing && tr->recipe.norm == TD_NORM_FUSED_ADD && !tr->recipe.residual_fp32) {
        td_fail(err, "--gradient-checkpointing: recipe %s's fused-add norm reads the unrounded residual sum, which "
                "a recomputation from the stored stream cannot give back; use a training recipe without it",
                tr->recipe.name);
        goto fail;
    }
    forward_keep_activations(tr->f, opts->gradient_checkpointing ? TD_ACTS_CHECKPOINT : TD_ACTS_ALL);
    if (td_forward_set_recipe_lora(tr->f, &tr->recipe, tr->lora, 0, err)) goto fail;
    td_ops ops;
    td_ops_init(&ops, tr->be);
    grad_acts_alloc(&tr->ga, c, &ops, opts->max_tokens, opts->max_seq_len, tr->lora ? tr->lora->rank : 0);
    train_aux_init(tr);
    tr->logits = tr->be->alloc((size_t)tr->logits_rows * V * sizeof(float));
    tr->tlogp = td_xmalloc((size_t)opts->max_tokens * sizeof(float));
    tr->dlogp = td_xmalloc((size_t)opts->max_tokens * sizeof(float));
    tr->target = td_xmalloc((size_t)opts->max_tokens * sizeof(int));
    tr->top1 = td_xmalloc((size_t)opts->max_tokens * sizeof(int));
    tr->scaler = (train_scaler){
        .on = opts->loss_scaling == 1 || (opts->loss_scaling < 0 && tr->recipe.activations == TD_F16),
        .scale = opts->init_scale, .growth = opts->growth_factor, .backoff = opts->backoff_factor,
        .interval = opts->growth_interval};
    if (!tr->scaler.on) tr->scaler.scale = 1.0;
    return tr;
fail:
    td_trainer_free(tr);
    return NULL;
}

void td_trainer_free(td_trainer *tr)
{
    if (!tr) return;
    td_forward_free(tr->f);
    if (tr->ga.be) grad_acts_free(&tr->ga);
    if (tr->m && tr->m->owned_dev) {   /* the masters' alias, before the masters go */
        tr->be->release(tr->m->owned);
        tr->m->owned_dev = NULL;
    }
    if (tr->base_dev) tr->be->free(tr->base_dev);
    if (tr->be) {
        if (tr->grads_host != tr->grads) free(tr->grads_host);
        if (tr->params_dev != tr->params) tr->be->free(tr->params_dev);
        if (tr->m1_dev != tr->m1) tr->be->free(tr->m1_dev);
        if (tr->m2_dev != tr->m2) tr->be->free(tr->m2_dev);
        tr->be->free(tr->grads);
        tr->be->free(tr->logits);
        if (tr->be->scratch_release) tr->be->scratch_release();
    }
    td_lora_free(tr->lora);
    td_model_free(tr->m);
    free(tr->specs);
    free(tr->tensors);
    free(tr->m1); free(tr->m2);
    td_model_weights_free_layers(&tr->gw);
    free(tr->mb_seq);
    free(tr->rows_host);
    free(tr->lg);
    free(tr->tlogp); free(tr->dlogp); free(tr->target); free(tr->top1);
    train_aux_free(tr);
    free(tr);
}

/* ---------------------------------------------------------------- forward + backward */

/* The first trained tensor whose master holds a non-finite value, or -1. */
static int first_nonfinite_tensor(const td_trainer *tr)
{
    train_masters_to_host(tr);
    for (size_t i = 0; i < tr->ntensors; i++)
        if (!isfinite(td_backend_cpu.optim_sumsq(tr->params + tr->tensors[i].offset, tr->tensors[i].numel)))
            return (int)i;
    return -1;
}

/* the micro-batch's sequence indices seq[0..N) in td_trainer_accumulate's numbering (mb_seq, N <=
 * max_tokens), for the routing replay and observer callers */
static const int *caller_seq(td_trainer *tr, int N, const int *seq)
{
    if (!tr->mb_seq) tr->mb_seq = td_xmalloc((size_t)tr->o.max_tokens * sizeof(int));
    for (int i = 0; i < N; i++) tr->mb_seq[i] = seq[i] + tr->mb_s0;
    return tr->mb_seq;
}

/* td_trainer_set_observers: rows r0 .. r0 + R - 1 of the micro-batch starting at sequence s0,
 * their full log-prob rows (the lm_head's, as td_forward_logprobs hands them) to the caller */
static void observe_rows(td_trainer *tr, const td_forward_rows *rows, int s0, int r0, int R)
{
    size_t V = (size_t)tr->m->cfg.vocab_size;
    const float *h = tr->logits;
    if (!backend_host_memory(tr->be)) {
        if (!tr->rows_host) tr->rows_host = td_xmalloc((size_t)tr->logits_rows * V * sizeof(float));
        tr->be->download(tr->rows_host, tr->logits, (size_t)R * V * sizeof(float));
        h = tr->rows_host;
    }
    for (int r = 0; r < R; r++)
        tr->row_fn(tr->obs_user, s0 + rows->row_seq[r0 + r], rows->pos[r0 + r], h + (size_t)r * V);
}

/* the forward's routing observer while a caller's is set: the load-balancing loss's (when on), then
 * the caller's with its own sequence numbering */
static void route_dispatch(void *user, const td_moe_route *r)
{
    td_trainer *tr = user;
    if (tr->aux_cnt) train_aux_observe(tr, r);
    td_moe_route g = *r;
    g.seq = caller_seq(tr, r->N, r->seq);
    tr->route_fn(tr->obs_user, &g);
}

/* One micro-batch: sequences s0..s1-1. */
static int micro_batch(td_trainer *tr, int s0, int s1, const int *const *tokens, const int *lens,
                       td_loss_fn fn, void *user, double *loss, td_error *err)
{
    const td_model *m = tr->m;
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    td_forward_rows rows;
    tr->mb_s0 = s0;
    train_aux_begin(tr);   /* the load-balancing loss counts this forward's routing */
    if (tr->route_fn) td_forward_set_moe_fn(tr->f, route_dispatch, tr);   /* and the caller's observer */
    int N = forward_decoder(tr->f, s1 - s0, tokens + s0, lens + s0, &rows);
    if (tr->route_fn) td_forward_set_moe_fn(tr->f, NULL, NULL);
    train_aux_end(tr, N, tr->scaler.scale);
    const td_ops *ops = rows.ops;
    const td_acts *a = forward_acts(tr->f);
    for (int i = 0; i < N; i++) {
        int s = s0 + rows.row_seq[i], t = rows.pos[i];
        tr->target[i] = t + 1 < lens[s] ? tokens[s][t + 1] : 0;
    }
    /* the target log-probs, chunk by chunk; the logits of the last chunk stay in the buffer */
    for (int r0 = 0; r0 < N; r0 += tr->logits_rows) {
        int R = N - r0 < tr->logits_rows ? N - r0 : tr->logits_rows;
        head_forward(ops, m, tr->logits, a->xn + (size_t)r0 * C, R, 0);
        logprob_gather(ops, tr->tlogp + r0, tr->top1 + r0, tr->logits, tr->target + r0, R, V);
        if (tr->row_fn) observe_rows(tr, &rows, s0, r0, R);
    }
    /* the loss: each sequence's targets are its rows but the last */
    double sum = 0.0;
    for (int s = s0, row = 0; s < s1; row += lens[s], s++) {
        double l = fn(user, s, lens[s] - 1, tr->tlogp + row, tr->dlogp + row);
        if (!isfinite(l) && !tr->scaler.on) {
            int bad = first_nonfinite_tensor(tr);
            return td_fail(err, "training step %d: loss of sequence %d is %g (%s%s)", tr->step, s, l,
                           bad >= 0 ? "first non-finite weight: " : "the weights are finite: the forward "
                           "overflowed", bad >= 0 ? tr->tensors[bad].name : "");
        }
        sum += l;
        tr->dlogp[row + lens[s] - 1] = 0.0f;
    }
    *loss += sum;
    if (!isfinite(sum)) {   /* loss scaling: an overflowing forward skips the step, as GradScaler */
        tr->loss_overflow = 1;
        return 0;
    }
    for (int i = 0; i < N; i++)   /* token accuracy over the targets in the loss */
        if (tr->dlogp[i] != 0.0f) {
            tr->acc_total++;
            tr->acc_correct += tr->top1[i] == tr->target[i];
        }
    float scale = (float)tr->scaler.scale;
    if (tr->scaler.on)
        for (int i = 0; i < N; i++) tr->dlogp[i] *= scale;
    /* the lm_head backward (its own recipe), chunk by chunk, then the decoder's */
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    td_ops head = td_ops_gemm(ops, ops->head, ops->qin, ops->gscratch);
    tr->be->zero(tr->ga.dxn, (size_t)N * C * sizeof(float));
    for (int r0 = 0; r0 < N; r0 += tr->logits_rows) {
        int R = N - r0 < tr->logits_rows ? N - r0 : tr->logits_rows;
        if (N > tr->logits_rows) head_forward(ops, m, tr->logits, a->xn + (size_t)r0 * C, R, 0);
        logsoftmax_backward(ops, tr->logits, tr->logits, tr->target + r0, tr->dlogp + r0, R, V);
        matmul_backward(&head, tr->ga.dxn + (size_t)r0 * C, (float *)tr->gw.lm_head, NULL, tr->logits,
                        a->xn + (size_t)r0 * C, W->lm_head, R, C, V);
    }
    decoder_backward(ops, m, a, &tr->ga, &tr->gw, tr->lg, rows.tok, rows.pos, N);
    return 0;
}

int td_trainer_accumulate(td_trainer *tr, int nseq, const int *const *tokens, const int *lens,
                          td_loss_fn fn, void *user, double *loss, td_error *err)
{
    int V = tr->m->cfg.vocab_size;
    for (int s = 0; s < nseq; s++) {
        if (lens[s] < 2 || lens[s] > tr->o.max_seq_len)
            return td_fail(err, "training batch: sequence %d has length %d (expected 2..%d)", s,
                           lens[s], tr->o.max_seq_len);
        for (int t = 0; t < lens[s]; t++)
            if (tokens[s][t] < 0 || tokens[s][t] >= V)
                return td_fail(err, "training batch: sequence %d position %d: token %d outside "
                               "the vocabulary 0..%d", s, t, tokens[s][t], V - 1);
    }
    double total = 0.0;
    tr->aux_rows_call = 0;
    for (int s = 0; s < nseq; s++) tr->aux_rows_call += lens[s];
    for (int s0 = 0; s0 < nseq;) {   /* greedy packing of whole sequences, as td_forward */
        int s1 = s0, rows = 0;
        while (s1 < nseq && rows + lens[s1] <= tr->o.max_tokens) rows += lens[s1++];
        if (micro_batch(tr, s0, s1, tokens, lens, fn, user, &total, err)) return -1;
        s0 = s1;
    }
    if (loss) *loss = total;
    return 0;
}

typedef struct {
    const float *const *w;
    double z;
} sft_loss;

static double sft_fn(void *user, int seq, int n, const float *logp, float *dlogp)
{
    const sft_loss *L = user;
    double l = 0.0;
    for (int t = 0; t < n; t++) {
        double w = L->w ? L->w[seq][t] : 1.0;
        l -= w * logp[t];
        dlogp[t] = (float)(-w / L->z);
    }
    return l / L->z;
}

int td_trainer_accumulate_sft(td_trainer *tr, int nseq, const int *const *tokens,
                              const int *lens, const float *const *weights, double normaliser,
                              double *loss, td_error *err)
{
    sft_loss L = {weights, normaliser};
    if (!(normaliser > 0)) {
        L.z = 0.0;
        for (int s = 0; s < nseq; s++)
            for (int t = 0; t + 1 < lens[s]; t++) L.z += weights ? weights[s][t] : 1.0;
        if (!(L.z > 0)) return td_fail(err, "training batch: no target token has a weight (loss mask all 0)");
    }
    return td_trainer_accumulate(tr, nseq, tokens, lens, sft_fn, &L, loss, err);
}

/* ---------------------------------------------------------------- optimiser step */

int td_trainer_step(td_trainer *tr, td_step_info *info, td_error *err)
{
    td_step_info in = {.loss_scale = tr->scaler.scale, .nonfinite_param = -1};
    size_t d2h0 = td_device_d2h_bytes();
    const td_backend *be = tr->be;   /* the gradients, masters and moments are its buffers */
    size_t n = tr->nparams;
    if (tr->scaler.on) be->optim_scale(tr->grads, n, (float)(1.0 / tr->scaler.scale));   /* unscale_ */
    double sumsq = 0.0;
    for (size_t i = 0; i < tr->ntensors; i++) {
        double s = be->optim_sumsq(tr->grads + tr->tensors[i].offset, tr->tensors[i].numel);
        if (!isfinite(s) && in.nonfinite_param < 0) in.nonfinite_param = (int)i;
        sumsq += s;
    }
    in.grad_norm = tr->loss_overflow ? NAN : sqrt(sumsq);
    if (in.nonfinite_param >= 0 || tr->loss_overflow) {
        if (!tr->scaler.on)
            return td_fail(err, "training step %d: gradient of %s is not finite (no loss scaling "
                           "to skip the step)", tr->step, tr->tensors[in.nonfinite_param].name);
        train_zero_grads(tr);   /* GradScaler: the step is skipped */
        scaler_update(&tr->scaler, 1);
        tr->skipped++;
        tr->loss_overflow = 0;
        in.skipped = 1;
    } else {
        if (tr->o.max_grad_norm > 0) {
            float coef = clip_coef(in.grad_norm, tr->o.max_grad_norm);
            if (coef < 1.0f) be->optim_scale(tr->grads, n, coef);
        }
        in.lr = tr->o.lr * td_lr_lambda(&tr->o, tr->step);
        tr->step++;
        for (size_t i = 0; i < tr->ntensors; i++) {
            const train_tensor *t = &tr->tensors[i];
            td_adamw_k k = adamw_scalars(in.lr, tr->o.beta1, tr->o.beta2, tr->o.eps,
                                         t->decay ? tr->o.weight_decay : 0.0, tr->step);
            be->optim_adamw(tr->params_dev + t->offset, tr->grads + t->offset, tr->m1_dev + t->offset,
                            tr->m2_dev + t->offset, t->numel, &k);
        }
        train_zero_grads(tr);
        if (tr->scaler.on) scaler_update(&tr->scaler, 0);
        if (tr->lora) {
            /* the adapter (small) for host readers (a merge, a save), its rounded A and B again
             * (on the device where it trains there); the frozen base's prepared weights stay as
             * they are (preparing them again each step cost a rank-1 LoRA step on the CPU 9%) */
            if (tr->params_dev != tr->params) be->download(tr->params, tr->params_dev, n * sizeof(float));
            forward_refresh_lora(tr->f);
        } else if (tr->prep_dev) {
            /* the recipe's weights from the device masters, on the device: nothing comes down */
            if (td_forward_set_recipe_lora(tr->f, &tr->recipe, NULL, 0, err)) return -1;
        } else {
            /* the host masters (a device's, downloaded), then the recipe's rounded weights */
            if (tr->params_dev != tr->params) be->download(tr->params, tr->params_dev, n * sizeof(float));
            if (td_forward_set_recipe_lora(tr->f, &tr->recipe, NULL, 0, err)) return -1;
        }
    }
    if (be->scratch_release) be->scratch_release();   /* the backward's GEMM scratch, until the next */
    if (tr->log_d2h)
        fprintf(stderr, "tidal: optimiser step %d: %zu bytes device -> host (%zu parameters; weights prepared on "
                "the %s)\n", tr->step, td_device_d2h_bytes() - d2h0, n, tr->prep_dev ? "device" : "host");
    in.step = tr->step;
    in.skipped_total = tr->skipped;
    if (info) *info = in;
    return 0;
}

/* ---------------------------------------------------------------- views */

const td_model *td_trainer_model(const td_trainer *tr) { return tr->m; }

/* the micro-batch's rows carry sequence indices relative to its first: the caller's are global */
static int replay_offset(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts)
{
    td_trainer *tr = user;
    return tr->moe_replay(tr->moe_replay_user, moe_layer, N, caller_seq(tr, N, seq), pos, K, experts);
}

void td_trainer_set_observers(td_trainer *tr, td_row_fn row_fn, td_moe_fn route_fn, void *user)
{
    tr->row_fn = row_fn;
    tr->route_fn = route_fn;
    tr->obs_user = user;
}

void td_trainer_set_moe_replay(td_trainer *tr, td_moe_replay_fn fn, void *user)
{
    tr->moe_replay = fn;
    tr->moe_replay_user = user;
    td_forward_set_moe_replay(tr->f, fn ? replay_offset : NULL, fn ? tr : NULL);
}
const td_lora *td_trainer_lora(const td_trainer *tr) { return tr->lora; }
td_model *td_trainer_base(td_trainer *tr) { return tr->lora ? tr->m : NULL; }
size_t td_trainer_num_params(const td_trainer *tr) { return tr->nparams; }
const float *td_trainer_grads(const td_trainer *tr) { return train_grads_host(tr); }

float *train_grads_host(const td_trainer *tr)
{
    if (tr->grads_host != tr->grads) {
        td_ops_sync(&(td_ops){.be = tr->be});
        tr->be->download(tr->grads_host, tr->grads, tr->nparams * sizeof(float));
    }
    return tr->grads_host;
}

void train_zero_grads(td_trainer *tr)
{
    tr->be->zero(tr->grads, tr->nparams * sizeof(float));
    if (tr->grads_host != tr->grads) memset(tr->grads_host, 0, tr->nparams * sizeof(float));
}

void td_trainer_zero_grads(td_trainer *tr) { train_zero_grads(tr); }
float *td_trainer_params(td_trainer *tr)
{
    train_masters_to_host(tr);
    return tr->params;
}

void train_masters_to_host(const td_trainer *tr)
{
    if (tr->prep_dev && !tr->lora) tr->be->download(tr->params, tr->params_dev, tr->nparams * sizeof(float));
}

void td_trainer_base_to_device(td_trainer *tr)
{
    td_model *m = tr->m;
    if (!tr->lora || !tr->prep_dev || tr->base_dev || !tr->lora->owned_dev) return;
    tr->base_dev = tr->be->alloc(m->owned_floats * sizeof(float));
    tr->be->upload(tr->base_dev, m->owned, m->owned_floats * sizeof(float));
    m->owned_dev = tr->base_dev;
    m->owned_host_current = 1;
    tr->be->alias(m->owned, tr->base_dev, m->owned_floats * sizeof(float), TD_F32);
}

int td_trainer_params_changed(td_trainer *tr, td_error *err)
{
    if (tr->params_dev != tr->params)
        tr->be->upload(tr->params_dev, tr->params, tr->nparams * sizeof(float));
    if (tr->base_dev && tr->m->owned_host_current)   /* the base changed on the host (a resumed base) */
        tr->be->upload(tr->base_dev, tr->m->owned, tr->m->owned_floats * sizeof(float));
    return td_forward_set_recipe_lora(tr->f, &tr->recipe, tr->lora, 0, err);
}

void train_state_to_host(const td_trainer *tr)
{
    if (tr->params_dev == tr->params) return;
    tr->be->download(tr->params, tr->params_dev, tr->nparams * sizeof(float));
    tr->be->download(tr->m1, tr->m1_dev, tr->nparams * sizeof(float));
    tr->be->download(tr->m2, tr->m2_dev, tr->nparams * sizeof(float));
}

void train_state_to_device(td_trainer *tr)
{
    if (tr->params_dev == tr->params) return;
    tr->be->upload(tr->params_dev, tr->params, tr->nparams * sizeof(float));
    tr->be->upload(tr->m1_dev, tr->m1, tr->nparams * sizeof(float));
    tr->be->upload(tr->m2_dev, tr->m2, tr->nparams * sizeof(float));
}

int td_trainer_grads_finite(const td_trainer *tr)
{
    return isfinite(tr->be->optim_sumsq(tr->grads, tr->nparams));
}

double td_trainer_loss_scale(const td_trainer *tr) { return tr->scaler.scale; }
void td_trainer_set_temperature(td_trainer *tr, float T) { td_forward_set_temperature(tr->f, T); }
