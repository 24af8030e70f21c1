/* tidal — the model object: configuration checks, the owned parameter allocation, RoPE
 * inverse frequencies (with Llama-3 rope_scaling), and freeing. Loading from a checkpoint
 * lives in load.c. */
#include "model_internal.h"
#include "tidal/checkpoint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int td_model_check_config(const td_config *cfg, const char *what, td_error *err)
{
    if (cfg->arch < 0 || cfg->arch >= TD_ARCH_COUNT)
        return td_fail(err, "%s: unknown architecture %d", what, (int)cfg->arch);
    struct { const char *name; int v, max; } dims[] = {
        {"vocab_size", cfg->vocab_size, 1 << 24},
        {"hidden_size", cfg->hidden_size, 1 << 16},
        {"intermediate_size", cfg->intermediate_size, 1 << 18},
        {"num_hidden_layers", cfg->num_layers, 1024},
        {"num_attention_heads", cfg->num_heads, 1024},
        {"num_key_value_heads", cfg->num_kv_heads, 1024},
        {"head_dim", cfg->head_dim, 1024},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v < 1 || dims[i].v > dims[i].max)
            return td_fail(err, "%s: %s = %d (expected 1..%d)", what, dims[i].name, dims[i].v,
                           dims[i].max);
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return td_fail(err, "%s: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d", what, cfg->num_heads, cfg->num_kv_heads);
    if (cfg->head_dim % 2 != 0)
        return td_fail(err, "%s: head_dim %d is odd (RoPE rotates pairs)", what, cfg->head_dim);
    if (!(cfg->rms_norm_eps > 0.0) || !(cfg->rope_theta > 1.0))
        return td_fail(err, "%s: rms_norm_eps %g / rope_theta %g (expected > 0 / > 1)", what,
                       cfg->rms_norm_eps, cfg->rope_theta);
    if (cfg->rope_factor != 0.0 &&
        (!(cfg->rope_factor > 0.0) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
         !(cfg->rope_low_freq_factor > 0.0) || cfg->rope_original_max_position < 1))
        return td_fail(err, "%s: rope_scaling llama3 factor %g, low_freq_factor %g, "
                       "high_freq_factor %g, original_max_position_embeddings %d (expected "
                       "positive, high > low)", what, cfg->rope_factor, cfg->rope_low_freq_factor,
                       cfg->rope_high_freq_factor, cfg->rope_original_max_position);
    return 0;
}

/* inv_freq[k] = theta^(-2k/HD), then HF's _compute_llama3_parameters when rope_factor != 0:
 * long wavelengths (> original_max / low_freq_factor) divided by factor, short ones
 * (< original_max / high_freq_factor) kept, the band between interpolated smoothly. */
static void compute_inv_freq(const td_config *cfg, float *inv_freq)
{
    int HD = cfg->head_dim;
    for (int k = 0; k < HD / 2; k++) {
        double f = 1.0 / pow(cfg->rope_theta, (double)(2 * k) / HD);
        if (cfg->rope_factor != 0.0) {
            double old = cfg->rope_original_max_position;
            double low_wl = old / cfg->rope_low_freq_factor;
            double high_wl = old / cfg->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / cfg->rope_factor;
            } else if (wl >= high_wl) {
                double smooth = (old / wl - cfg->rope_low_freq_factor) /
                                (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                f = (1.0 - smooth) * f / cfg->rope_factor + smooth * f;
            }
        }
        inv_freq[k] = (float)f;
    }
}

void td_model_weights_layers(td_model_weights *w, const td_config *c, const td_model_weights *src)
{
    size_t L = (size_t)c->num_layers, per = (size_t)c->num_experts * 3;
    w->layers = td_xcalloc(L, sizeof *w->layers);
    w->experts = per ? td_xcalloc(L * per, sizeof *w->experts) : NULL;
    if (src) {
        memcpy(w->layers, src->layers, L * sizeof *w->layers);
        if (per && src->experts) memcpy(w->experts, src->experts, L * per * sizeof *w->experts);
    }
    for (size_t l = 0; l < L; l++)
        w->layers[l].w_experts = per && td_config_layer_moe(c, (int)l) ? w->experts + l * per : NULL;
}

void td_model_weights_free_layers(td_model_weights *w)
{
    free(w->layers);
    free(w->experts);
    w->layers = NULL;
    w->experts = NULL;
}

td_model *model_new(const td_config *cfg, const char *what, td_error *err)
{
    if (td_model_check_config(cfg, what, err)) return NULL;
    td_model *m = td_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    td_model_weights_layers(&m->w, cfg, NULL);
    m->inv_freq = td_xmalloc((size_t)cfg->head_dim / 2 * sizeof(float));
    compute_inv_freq(cfg, m->inv_freq);
    return m;
}

td_model *td_model_alloc(const td_config *cfg, td_error *err)
{
    td_model *m = model_new(cfg, "td_model_alloc", err);
    if (!m) return NULL;
    /* carved by the parameter table: each tensor at its offset in one allocation */
    size_t n;
    td_param_spec *specs = param_table(cfg, &n);
    m->owned_floats = specs[n - 1].offset + specs[n - 1].numel;
    m->owned = td_xcalloc(m->owned_floats, sizeof(float));
    for (size_t i = 0; i < n; i++) *param_slot(&m->w, cfg->num_layers, &specs[i]) = m->owned + specs[i].offset;
    if (cfg->tie_word_embeddings) m->w.lm_head = m->w.embed;
    free(specs);
    return m;
}

void td_model_free(td_model *m)
{
    if (!m) return;
    td_model_weights_free_layers(&m->w);
    free(m->inv_freq);
    free(m->owned);
    if (m->store) {
        free(m->store->t);
        free(m->store->nan);
        free(m->store->owned);
        free(m->store);
    }
    if (m->ck) td_checkpoint_close(m->ck);   /* the maps the mapped tensors point into */
    free(m);
}

td_format td_model_weight_storage(const td_model *m)
{
    /* a loaded 16-bit checkpoint keeps its matrices in their dtype (load.c); norms are fp32 */
    for (size_t i = 0; m->store && i < m->store->n; i++)
        if (m->store->t[i].dtype == TD_BF16 || m->store->t[i].dtype == TD_F16) return m->store->t[i].dtype;
    return TD_F32;
}
