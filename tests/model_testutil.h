/* A random in-memory model for the cmocka tests of the paths (header-only; include after
 * <cmocka.h> and tidal/model.h, tidal/rng.h). */
#ifndef TIDAL_MODEL_TESTUTIL_H
#define TIDAL_MODEL_TESTUTIL_H

/* A random in-memory model with every feature on (biases, q/k norm, llama3 RoPE scaling). */
static td_model *random_model(uint64_t seed)
{
    td_config c = {0};
    c.arch = TD_ARCH_QWEN3;
    c.vocab_size = 301; c.hidden_size = 48; c.intermediate_size = 80; c.num_layers = 3;
    c.num_heads = 6; c.num_kv_heads = 2; c.head_dim = 12; c.max_position = 256;
    c.rms_norm_eps = 1e-5; c.rope_theta = 10000.0;
    c.rope_factor = 8.0; c.rope_low_freq_factor = 1.0; c.rope_high_freq_factor = 4.0;
    c.rope_original_max_position = 32;
    c.qkv_bias = true; c.qk_norm = true; c.tie_word_embeddings = false;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    td_rng r;
    td_rng_seed(&r, seed);
    /* every parameter ~ N(0, 0.25^2), then norm weights moved to around 1 */
    for (size_t i = 0; i < m->owned_floats; i++) m->owned[i] = 0.25f * (float)td_rng_normal(&r);
    for (int l = 0; l < c.num_layers; l++) {
        td_layer_weights *w = &m->w.layers[l];
        float *norms[] = {(float *)w->attn_norm, (float *)w->mlp_norm};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < c.hidden_size; i++) norms[k][i] += 1.0f;
        for (int i = 0; i < c.head_dim; i++) {
            ((float *)w->q_norm)[i] += 1.0f;
            ((float *)w->k_norm)[i] += 1.0f;
        }
    }
    for (int i = 0; i < c.hidden_size; i++) ((float *)m->w.final_norm)[i] += 1.0f;
    return m;
}

#endif
