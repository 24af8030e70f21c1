/* tidal — loading a model from a HF checkpoint directory. F32 tensors are used in place
 * (pointers into the read-only maps of the shards); tensors of other dtypes are converted to
 * fp32 into one owned allocation, sized by a first pass over the parameter list. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

td_model *td_model_load(const char *dir, td_error *err)
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

    size_t np;
    td_param_spec *specs = param_table(cfg, &np);
    /* Pass 1: map what can be mapped, count the floats of the rest. */
    size_t need = 0;
    for (size_t i = 0; i < np; i++) {
        const float **slot = param_slot(&m->w, cfg->num_layers, &specs[i]);
        if (!slot) {
            td_fail(err, "%s: parameter %s has no place in the model", dir, specs[i].name);
            goto fail;
        }
        td_error why;
        *slot = td_checkpoint_map_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, &why);
        if (!*slot) need += specs[i].numel;
    }
    /* Pass 2: convert the others into the owned allocation. */
    if (need) {
        m->owned = td_xmalloc(need * sizeof(float));
        m->owned_floats = need;
        float *p = m->owned;
        for (size_t i = 0; i < np; i++) {
            const float **slot = param_slot(&m->w, cfg->num_layers, &specs[i]);
            if (*slot) continue;
            if (td_checkpoint_read_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, p,
                                       NULL, err))
                goto fail;
            *slot = p;
            p += specs[i].numel;
        }
    }
    if (cfg->tie_word_embeddings) m->w.lm_head = m->w.embed;
    free(specs);
    return m;
fail:
    free(specs);
    td_model_free(m);
    return NULL;
}
