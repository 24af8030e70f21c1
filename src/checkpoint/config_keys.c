/* Every key transformers writes into config.json for LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM and Qwen3ForCausalLM (4.x and 5.x), classified once:
 *
 *   READ    parsed by td_config_parse (config.c, config_rope.c); values tidal does not model are
 *           refused there with the key named
 *   INERT   does not change the forward's maths (bookkeeping, training-only init, generation
 *           defaults that generation_config.json supersedes, ...)
 *   ZERO    changes the maths unless it holds its neutral value (refused otherwise)
 *   REFUSED changes the maths whenever present and not null (quantised checkpoints)
 *
 * A key in none of these rows is warned about on stderr and recorded in td_config.unknown_keys
 * (tidal-diff writes it into the run file), so a new field never passes unseen.
 * Sources: PretrainedConfig.__init__ / to_dict of transformers 4.46 and 5.x, the four model
 * config classes, and the published configs in tests/fixtures/configs/. */
#include "config_json.h"

#include <string.h>

enum { READ, INERT, ZERO, REFUSED };

static const struct { const char *key; int cls; } keys[] = {
    /* shapes and the maths tidal models */
    {"architectures", READ}, {"model_type", READ}, {"vocab_size", READ}, {"hidden_size", READ},
    {"intermediate_size", READ}, {"num_hidden_layers", READ}, {"num_attention_heads", READ},
    {"num_key_value_heads", READ}, {"head_dim", READ}, {"max_position_embeddings", READ},
    {"rms_norm_eps", READ}, {"hidden_act", READ}, {"tie_word_embeddings", READ},
    {"attention_bias", READ}, {"mlp_bias", READ}, {"bos_token_id", READ}, {"eos_token_id", READ},
    {"torch_dtype", READ}, {"dtype", READ},
    /* RoPE, both generations (config_rope.c) */
    {"rope_theta", READ}, {"rope_scaling", READ}, {"rope_parameters", READ}, {"partial_rotary_factor", READ},
    /* attention layer kinds (config_rope.c) */
    {"layer_types", READ}, {"sliding_window", READ}, {"use_sliding_window", READ}, {"max_window_layers", READ},
    /* neutral value required */
    {"attention_dropout", ZERO},
    /* refused when set */
    {"quantization_config", REFUSED},
    /* bookkeeping and training-time settings that leave the forward unchanged */
    {"_name_or_path", INERT}, {"transformers_version", INERT}, {"initializer_range", INERT},
    {"use_cache", INERT}, {"pad_token_id", INERT}, {"sep_token_id", INERT},
    {"decoder_start_token_id", INERT},
    {"pretraining_tp", INERT},   /* 4.x Llama: splits GEMMs into slices; the same maths up to summation order */
    {"return_dict", INERT}, {"output_hidden_states", INERT}, {"output_attentions", INERT},
    {"torchscript", INERT}, {"use_bfloat16", INERT}, {"tf_legacy_loss", INERT}, {"is_encoder_decoder", INERT},
    {"is_decoder", INERT}, {"add_cross_attention", INERT}, {"tie_encoder_decoder", INERT},
    {"cross_attention_hidden_size", INERT}, {"chunk_size_feed_forward", INERT}, {"pruned_heads", INERT},
    {"id2label", INERT}, {"label2id", INERT}, {"problem_type", INERT}, {"tokenizer_class", INERT},
    {"prefix", INERT}, {"task_specific_params", INERT}, {"finetuning_task", INERT},
    {"_attn_implementation_autoset", INERT}, {"attn_implementation", INERT}, {"_attn_implementation", INERT},
    {"output_router_logits", READ}, {"router_aux_loss_coef", READ},
    /* mixtures of experts (config.c parse_moe; unmodelled routers refused there by key and value) */
    {"num_experts", READ}, {"num_local_experts", READ}, {"num_experts_per_tok", READ},
    {"moe_intermediate_size", READ}, {"shared_expert_intermediate_size", READ}, {"norm_topk_prob", READ},
    {"decoder_sparse_step", READ}, {"mlp_only_layers", READ}, {"router_jitter_noise", READ}, {"clip_qkv", READ},
    {"scoring_func", READ}, {"topk_method", READ}, {"routed_scaling_factor", READ}, {"n_group", READ},
    {"topk_group", READ}, {"e_score_correction_bias", READ}, {"n_routed_experts", READ},
    {"n_shared_experts", READ}, {"first_k_dense_replace", READ}, {"moe_layer_freq", READ},
    {"expert_interval", INERT},   /* the published Qwen1.5-MoE-A2.7B carries it; transformers ignores it */
    {"qkv_bias", READ},    /* transformers 5's Qwen2-MoE: the q/k/v biases (config.c parse_moe) */
    /* generation defaults an old config.json may carry; tidal reads generation_config.json */
    {"max_length", INERT}, {"min_length", INERT}, {"do_sample", INERT}, {"early_stopping", INERT},
    {"num_beams", INERT}, {"num_beam_groups", INERT}, {"diversity_penalty", INERT}, {"temperature", INERT},
    {"top_k", INERT}, {"top_p", INERT}, {"typical_p", INERT}, {"repetition_penalty", INERT},
    {"length_penalty", INERT}, {"no_repeat_ngram_size", INERT}, {"encoder_no_repeat_ngram_size", INERT},
    {"bad_words_ids", INERT}, {"num_return_sequences", INERT}, {"output_scores", INERT},
    {"return_dict_in_generate", INERT}, {"forced_bos_token_id", INERT}, {"forced_eos_token_id", INERT},
    {"remove_invalid_values", INERT}, {"exponential_decay_length_penalty", INERT}, {"suppress_tokens", INERT},
    {"begin_suppress_tokens", INERT},
};

static void note_unknown(const char *path, td_config *c, const char *k)
{
    fprintf(stderr, "warning: %s: key \"%s\" is not in tidal's table of config.json keys; it may change the "
            "model's maths and is recorded in run files\n", path, k);
    size_t n = strlen(c->unknown_keys), room = sizeof c->unknown_keys - n;
    if (room < 2) return;
    int w = snprintf(c->unknown_keys + n, room, "%s%s", n ? "," : "", k);
    if (w < 0 || (size_t)w >= room) {   /* truncated: end with "..." so the list says so */
        size_t L = sizeof c->unknown_keys;
        memcpy(c->unknown_keys + L - 4, "...", 4);
    }
}

int cfgj_classify_keys(const char *path, json_t *j, td_config *c, td_error *err)
{
    c->unknown_keys[0] = 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        size_t i = 0;
        while (i < sizeof keys / sizeof keys[0] && strcmp(k, keys[i].key) != 0) i++;
        if (i == sizeof keys / sizeof keys[0]) { note_unknown(path, c, k); continue; }
        if (json_is_null(v)) continue;
        if (keys[i].cls == REFUSED)
            return td_fail(err, "%s: \"%s\" is set: quantised checkpoints (scales beside the weights) are not "
                           "read by tidal; give it the unquantised checkpoint and an fp8 recipe instead", path, k);
        if (keys[i].cls == ZERO) {
            if (!json_is_number(v))
                return td_fail(err, "%s: \"%s\" must be a number, got %s", path, k, cfgj_type_name(v));
            if (json_number_value(v) != 0)
                return td_fail(err, "%s: \"%s\" is %g; tidal's paths have no dropout (only 0 is modelled)", path, k,
                               json_number_value(v));
        }
    }
    return 0;
}
