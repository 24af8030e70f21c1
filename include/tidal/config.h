/* tidal — model configuration of a Llama-family decoder, as read from config.json.
 *
 * Dimension letters used across tidal (as llm.c fixes them once):
 *   B batch, T time (sequence positions), C hidden size, V vocabulary, L layers,
 *   NH query heads, NKV key/value heads, HD head dim, F MLP intermediate size.
 * Mixtures of experts add E experts, K experts per token (top-k), FE each expert's intermediate
 * size, FS the shared expert's (Qwen2-MoE).
 */
#ifndef TIDAL_CONFIG_H
#define TIDAL_CONFIG_H

#include "tidal/common.h"

#include <stdbool.h>

TD_BEGIN_DECLS

#define TD_CONFIG_MAX_EOS 8

typedef enum {
    TD_ARCH_LLAMA = 0,   /* LlamaForCausalLM  (Llama 2/3)                          */
    TD_ARCH_MISTRAL,     /* MistralForCausalLM                                     */
    TD_ARCH_QWEN2,       /* Qwen2ForCausalLM  (q/k/v projections carry biases)     */
    TD_ARCH_QWEN3,       /* Qwen3ForCausalLM  (per-head RMSNorm on q and k)        */
    TD_ARCH_QWEN2_MOE,   /* Qwen2MoeForCausalLM (qkv bias; experts + a shared expert with a
                            sigmoid gate)                                           */
    TD_ARCH_QWEN3_MOE,   /* Qwen3MoeForCausalLM (q/k norm; experts)                 */
    TD_ARCH_MIXTRAL,     /* MixtralForCausalLM (experts in block_sparse_moe, w1/w3/w2) */
    TD_ARCH_OLMOE,       /* OlmoeForCausalLM (q/k norm over the whole projection; experts of width
                            intermediate_size in every layer, no shared expert)    */
    TD_ARCH_COUNT
} td_arch;

typedef struct {
    td_arch arch;
    int vocab_size;            /* V   */
    int hidden_size;           /* C   */
    int intermediate_size;     /* F   */
    int num_layers;            /* L   */
    int num_heads;             /* NH  */
    int num_kv_heads;          /* NKV (GQA: NH % NKV == 0) */
    int head_dim;              /* HD  (Qwen3: NH*HD may differ from C) */
    int max_position;          /* max_position_embeddings */
    double rms_norm_eps;
    double rope_theta;
    /* Llama-3 rope_scaling ("rope_type": "llama3"); factor == 0 means none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    bool tie_word_embeddings;
    bool qkv_bias;             /* Qwen2 */
    bool qk_norm;              /* Qwen3, OLMoE */
    bool qk_norm_full;         /* OLMoE: q_norm over NH*HD, k_norm over NKV*HD (the whole projection,
                                  before the heads split), not per head as Qwen3's */
    int bos_token_id, eos_token_id;   /* -1 when absent; eos_token_id = eos_token_ids[0] */
    int eos_token_ids[TD_CONFIG_MAX_EOS];  /* config.json's whole eos list (Llama 3: 3 ids) */
    int n_eos;
    /* sliding-window attention (Mistral, Qwen2/3 with use_sliding_window, "sliding_attention"
     * layer_types): the window of the layers that slide, 0 when every layer attends fully.
     * tidal computes full attention, exact for sequences of at most sliding_window positions;
     * td_config_check_len refuses longer ones. */
    int sliding_window;
    int n_sliding_layers, first_sliding_layer;
    /* mixture of experts (num_experts > 0; 0 = a dense model). A layer l is sparse when l is not
     * in mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (transformers' Qwen2-MoE /
     * Qwen3-MoE rule; Mixtral: every layer); a dense layer of an MoE model has the plain SwiGLU
     * MLP of intermediate_size. Routing (transformers): logits = router(x) in the model dtype,
     * softmax in fp32, top-k, divided by their sum when norm_topk_prob (Mixtral: always). */
    int num_experts;                     /* E   num_experts / num_local_experts          */
    int num_experts_per_tok;             /* K                                            */
    int moe_intermediate_size;           /* FE  (Mixtral: intermediate_size)             */
    int shared_expert_intermediate_size; /* FS  Qwen2-MoE's shared expert, 0 = none      */
    bool norm_topk_prob;
    int decoder_sparse_step;
    int n_mlp_only;
    int mlp_only_layers[32];
    double router_aux_loss_coef;         /* recorded; the training loss's weight (issue 35) */
    bool output_router_logits;
    char torch_dtype[16];      /* as written in config.json ("dtype" or "torch_dtype"), informative */
    char unknown_keys[256];    /* config.json keys tidal's key table does not know, comma-separated */
} td_config;

const char *td_arch_name(td_arch a);   /* "LlamaForCausalLM", ... */

/* Whether layer l of the model is a mixture-of-experts layer (the rule above). */
bool td_config_layer_moe(const td_config *c, int l);
/* The number of MoE layers, and the index of layer l among them (-1 for a dense layer). */
int td_config_num_moe_layers(const td_config *c);
int td_config_moe_index(const td_config *c, int l);
/* The width of the dense MLP's activation buffers: intermediate_size when any layer has a dense MLP,
 * 0 when every layer is a mixture of experts (Mixtral, OLMoE, Qwen3-30B-A3B), whose
 * intermediate_size then sizes nothing the model computes. */
int td_config_dense_mlp_width(const td_config *c);

/* 0 when a sequence of `len` positions is computed exactly by tidal's full attention; -1 + err
 * when it would pass the sliding window of a layer that slides. */
/* The ids that end a sequence according to config.json: its eos list, or the single
 * eos_token_id of a hand-built config (n_eos == 0); ids has room for TD_CONFIG_MAX_EOS. */
int td_config_eos_list(const td_config *c, int *ids);
int td_config_check_len(const td_config *c, int64_t len, td_error *err);

TD_END_DECLS

#endif
