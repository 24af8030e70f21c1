/* tidal — model configuration of a Llama-family decoder, as read from config.json.
 *
 * Dimension letters used across tidal (as llm.c fixes them once):
 *   B batch, T time (sequence positions), C hidden size, V vocabulary, L layers,
 *   NH query heads, NKV key/value heads, HD head dim, F MLP intermediate size.
 */
#ifndef TIDAL_CONFIG_H
#define TIDAL_CONFIG_H

#include "tidal/common.h"

#include <stdbool.h>

TD_BEGIN_DECLS

typedef enum {
    TD_ARCH_LLAMA = 0,   /* LlamaForCausalLM  (Llama 2/3)                          */
    TD_ARCH_MISTRAL,     /* MistralForCausalLM                                     */
    TD_ARCH_QWEN2,       /* Qwen2ForCausalLM  (q/k/v projections carry biases)     */
    TD_ARCH_QWEN3,       /* Qwen3ForCausalLM  (per-head RMSNorm on q and k)        */
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
    bool qk_norm;              /* Qwen3 */
    int bos_token_id, eos_token_id;   /* -1 when absent */
    char torch_dtype[16];      /* as written in config.json ("bfloat16", ...), informative */
} td_config;

const char *td_arch_name(td_arch a);   /* "LlamaForCausalLM", ... */

TD_END_DECLS

#endif
