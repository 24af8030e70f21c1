/* tidal — loading a model from a HF checkpoint directory. F32 tensors are used in place
 * (pointers into the read-only maps of the shards); tensors of other dtypes are converted to
 * fp32 into one owned allocation, sized by a first pass over the parameter list. */
#include "model_internal.h"
#include "tidal/checkpoint.h"

#include <stdlib.h>
#include <string.h>

/* The weights field a HF parameter name fills. */
static const float **param_slot(td_model *m, const td_param_spec *p)
{
    if (p->layer < 0) {
        if (!strcmp(p->name, "model.embed_tokens.weight")) return &m->w.embed;
        if (!strcmp(p->name, "model.norm.weight")) return &m->w.final_norm;
        if (!strcmp(p->name, "lm_head.weight")) return &m->w.lm_head;
        return NULL;
    }
    if (p->layer >= m->cfg.num_layers) return NULL;
    td_layer_weights *w = &m->w.layers[p->layer];
    const char *s = strchr(p->name + strlen("model.layers."), '.');
    if (!s) return NULL;
    s++;
    static const struct { const char *suffix; size_t off; } map[] = {
        {"input_layernorm.weight", offsetof(td_layer_weights, attn_norm)},
        {"self_attn.q_proj.weight", offsetof(td_layer_weights, wq)},
        {"self_attn.k_proj.weight", offsetof(td_layer_weights, wk)},
        {"self_attn.v_proj.weight", offsetof(td_layer_weights, wv)},
        {"self_attn.q_proj.bias", offsetof(td_layer_weights, bq)},
        {"self_attn.k_proj.bias", offsetof(td_layer_weights, bk)},
        {"self_attn.v_proj.bias", offsetof(td_layer_weights, bv)},
        {"self_attn.q_norm.weight", offsetof(td_layer_weights, q_norm)},
        {"self_attn.k_norm.weight", offsetof(td_layer_weights, k_norm)},
        {"self_attn.o_proj.weight", offsetof(td_layer_weights, wo)},
        {"post_attention_layernorm.weight", offsetof(td_layer_weights, mlp_norm)},
        {"mlp.gate_proj.weight", offsetof(td_layer_weights, w_gate)},
        {"mlp.up_proj.weight", offsetof(td_layer_weights, w_up)},
        {"mlp.down_proj.weight", offsetof(td_layer_weights, w_down)},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(s, map[i].suffix)) return (const float **)((char *)w + map[i].off);
    return NULL;
}

static size_t spec_numel(const td_param_spec *p)
{
    return p->ndim == 1 ? (size_t)p->shape[0] : (size_t)p->shape[0] * (size_t)p->shape[1];
}

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

    size_t np = td_config_params(cfg, NULL, 0);
    td_param_spec *specs = td_xcalloc(np, sizeof *specs);
    td_config_params(cfg, specs, np);
    /* Pass 1: map what can be mapped, count the floats of the rest. */
    size_t need = 0;
    for (size_t i = 0; i < np; i++) {
        const float **slot = param_slot(m, &specs[i]);
        if (!slot) {
            td_fail(err, "%s: parameter %s has no place in the model", dir, specs[i].name);
            goto fail;
        }
        td_error why;
        *slot = td_checkpoint_map_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, &why);
        if (!*slot) need += spec_numel(&specs[i]);
    }
    /* Pass 2: convert the others into the owned allocation. */
    if (need) {
        m->owned = td_xmalloc(need * sizeof(float));
        m->owned_floats = need;
        float *p = m->owned;
        for (size_t i = 0; i < np; i++) {
            const float **slot = param_slot(m, &specs[i]);
            if (*slot) continue;
            if (td_checkpoint_read_f32(ck, specs[i].name, specs[i].ndim, specs[i].shape, p,
                                       NULL, err))
                goto fail;
            *slot = p;
            p += spec_numel(&specs[i]);
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
