/* tidal — loading a model from a HF checkpoint directory, keeping every weight in its storage
 * dtype. F32 tensors are used in place (pointers into the read-only maps of the shards); BF16
 * and F16 matrices, embedding and lm_head too, as td_wmat views (the GEMMs widen them per tile,
 * src/backend/cpu_wmat.c), copied only when misaligned in the file; norms, biases and F8
 * tensors are converted to fp32 into one owned allocation (small). Each 16-bit tensor is
 * scanned once for NaN (weights_recipe.c shares a tensor as "already rounded" only without). */
#include "model_internal.h"
#include "tidal/progress.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Kept in the checkpoint's dtype: the big tensors, when 16-bit. */
static int keeps_dtype(const td_param_spec *p, const td_tensor *t)
{
    return p->kind != TD_PARAM_NORM && p->kind != TD_PARAM_BIAS &&
           (t->dtype == TD_DT_BF16 || t->dtype == TD_DT_F16);
}

static int has_nan16(const uint16_t *x, size_t n, uint16_t inf_bits)
{
    int bad = 0;
    #pragma omp parallel for reduction(| : bad) if (n >= (1u << 20))
    for (size_t i = 0; i < n; i++) bad |= (x[i] & 0x7FFFu) > inf_bits;
    return bad;
}

td_wmat model_param_wmat(const td_model *m, size_t i, const td_param_spec *p, int *has_nan)
{
    if (m->store) {
        if (has_nan) *has_nan = m->store->nan[i];
        return m->store->t[i];
    }
    if (has_nan) *has_nan = 0;   /* fp32: every rounding of it is computed, never assumed */
    return td_wmat_f32(*param_slot((td_model_weights *)&m->w, m->cfg.num_layers, p));
}

void model_param_rows_f32(const td_model *m, size_t i, const td_param_spec *p, size_t r0, size_t nr,
                          float *dst)
{
    size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : (size_t)p->numel;
    td_wmat w = model_param_wmat(m, i, p, NULL);
    const float *src = wmat_rows(&w, (long)r0, (long)nr, (int)cols, dst);
    if (src != dst) memcpy(dst, src, nr * cols * sizeof(float));
}

void td_model_param_f32(const td_model *m, size_t i, float *dst)
{
    size_t n;
    td_param_spec *specs = param_table(&m->cfg, &n);
    if (i < n) model_param_rows_f32(m, i, &specs[i], 0, specs[i].ndim == 2 ? (size_t)specs[i].shape[0] : 1, dst);
    free(specs);
}

td_model *td_model_load_progress(const char *dir, FILE *progress, td_error *err)
{
    td_checkpoint *ck = td_checkpoint_open(dir, err);
    if (!ck) return NULL;
    const td_config *cfg = td_checkpoint_config(ck);
    if (!cfg) {
        td_fail(err, "%s: no config.json (a model needs a checkpoint directory)", dir);
        td_checkpoint_close(ck);
        return NULL;
    }
    if (td_checkpoint_validate(ck, err)) { td_checkpoint_close(ck); return NULL; }
    td_model *m = model_new(cfg, dir, err);
    if (!m) { td_checkpoint_close(ck); return NULL; }
    m->ck = ck;
    m->progress = progress;

    size_t np;
    td_param_spec *specs = param_table(cfg, &np);
    struct td_wstore *st = td_xcalloc(1, sizeof *st);
    m->store = st;
    st->n = np;
    st->t = td_xcalloc(np, sizeof *st->t);
    st->nan = td_xcalloc(np, 1);
    /* Pass 1: map what can be mapped, count what must be copied (fp32 floats, 16-bit bytes). */
    size_t need = 0, need16 = 0, bytes16 = 0;
    for (size_t i = 0; i < np; i++) {
        const float **slot = param_slot(&m->w, cfg->num_layers, &specs[i]);
        if (!slot) {
            td_fail(err, "%s: parameter %s has no place in the model", dir, specs[i].name);
            goto fail;
        }
        const td_tensor *t = td_checkpoint_find(ck, specs[i].name);   /* validated: present */
        if (keeps_dtype(&specs[i], t)) {
            st->t[i].dtype = t->dtype == TD_DT_BF16 ? TD_BF16 : TD_F16;
            if ((uintptr_t)t->data % 2 == 0) st->t[i].data = t->data;
            else need16 += t->nbytes;
            bytes16 += t->nbytes;
            continue;
        }
        td_error why;
        *slot = td_checkpoint_map_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, &why);
        if (!*slot) need += specs[i].numel;
        else st->t[i] = td_wmat_f32(*slot);
    }
    /* Pass 2: convert the others into the owned allocations. */
    if (need) {
        m->owned = td_xmalloc(need * sizeof(float));
        m->owned_floats = need;
    }
    st->owned = need16 ? td_xmalloc(need16) : NULL;
    float *p = m->owned;
    unsigned char *q = st->owned;
    td_progress pr;
    td_progress_start(&pr, progress, "loading (NaN scan of the 16-bit weights)");
    size_t scanned = 0;
    for (size_t i = 0; i < np; i++) {
        const float **slot = param_slot(&m->w, cfg->num_layers, &specs[i]);
        const td_tensor *t = td_checkpoint_find(ck, specs[i].name);
        if (keeps_dtype(&specs[i], t)) {
            if (!st->t[i].data) {   /* misaligned in the file: an aligned copy */
                memcpy(q, t->data, t->nbytes);
                st->t[i].data = q;
                q += t->nbytes;
            }
            st->nan[i] = (unsigned char)has_nan16(st->t[i].data, t->numel, st->t[i].dtype == TD_BF16 ? 0x7F80 : 0x7C00);
            scanned += t->nbytes;
            td_progress_update(&pr, (double)scanned / 1e9, (double)bytes16 / 1e9, "GB");
            continue;
        }
        if (*slot) continue;
        if (td_checkpoint_read_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, p, NULL, err))
            goto fail;
        *slot = p;
        st->t[i] = td_wmat_f32(p);
        p += specs[i].numel;
    }
    td_progress_end(&pr);
    if (cfg->tie_word_embeddings) m->w.lm_head = m->w.embed;
    free(specs);
    return m;
fail:
    free(specs);
    td_model_free(m);
    return NULL;
}

td_model *td_model_load(const char *dir, td_error *err)
{
    return td_model_load_progress(dir, NULL, err);
}
