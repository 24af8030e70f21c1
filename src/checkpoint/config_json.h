/* Internal to src/checkpoint: typed getters over a config.json object, and the parts of
 * td_config_parse that live in their own files (RoPE from both config generations, attention
 * layer kinds, the key table). Every getter treats an absent key or null as "use the default",
 * a wrong type as an error naming the file and the key. */
#ifndef TIDAL_CONFIG_JSON_H
#define TIDAL_CONFIG_JSON_H

#include "tidal/checkpoint.h"
#include "tidal/io.h"

#include <stdbool.h>

const char *cfgj_type_name(const json_t *v);
int cfgj_int(const char *path, json_t *o, const char *key, bool required, int def, int lo, int hi, int *out,
             td_error *err);
int cfgj_num(const char *path, json_t *o, const char *key, double def, double *out, td_error *err);
int cfgj_bool(const char *path, json_t *o, const char *key, bool def, bool *out, td_error *err);

/* RoPE settings from either layout (config_rope.c):
 *   transformers 4.x: "rope_theta" and "rope_scaling" at the top level;
 *   transformers 5.x: "rope_parameters" {"rope_theta", "rope_type", factors...}, or one such
 *                     object per layer type ({"full_attention": {...}, "sliding_attention": ...}).
 * Both present and disagreeing: refused, naming both keys. Modelled rope types: "default" and
 * "llama3"; any other, and a partial_rotary_factor below 1, are refused by key and value. */
int cfgj_rope(const char *path, json_t *j, td_config *c, td_error *err);

/* Which layers attend through a sliding window (config_rope.c): "layer_types" when present
 * (length num_hidden_layers, each "full_attention" or "sliding_attention"), otherwise the 4.x
 * rules: Mistral's "sliding_window" applies to every layer; Qwen2/Qwen3 slide only with
 * "use_sliding_window": true, on layers >= "max_window_layers". A null sliding_window means
 * full attention everywhere, as in transformers. */
int cfgj_attention_layers(const char *path, json_t *j, td_config *c, td_error *err);

/* The key table (config_keys.c): refuses keys whose value changes the maths in a way tidal does
 * not model, and collects keys the table does not know into c->unknown_keys (each warned about
 * on stderr once per parse). */
int cfgj_classify_keys(const char *path, json_t *j, td_config *c, td_error *err);

#endif
