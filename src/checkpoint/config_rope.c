/* RoPE and attention-layer settings of config.json, from both generations of transformers.
 *
 * transformers 4.x writes   "rope_theta": 1e6, "rope_scaling": null | {"rope_type": ..., ...}
 * transformers 5.x writes   "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}
 *                           (one object per layer type where a model's layer types differ:
 *                            {"full_attention": {...}, "sliding_attention": {...}})
 * Reading only the first generation silently falls back to theta = 10000 on the second, which
 * is every checkpoint transformers 5 re-saves (vLLM, SGLang, lmdeploy and Liger-Kernel each
 * fixed the same bug). Where both are present they must agree; tidal refuses to pick one.
 *
 * Sliding-window attention is not modelled: tidal's attention is full, which equals sliding
 * attention exactly while a sequence holds at most `sliding_window` positions (no key is ever
 * outside the window). So the layers that slide and their window are recorded here, and
 * td_config_check_len refuses longer sequences where they would be computed. */
#include "config_json.h"

#include <math.h>
#include <string.h>

typedef struct {
    bool has_theta;
    double theta;
    const char *type;          /* "default" or "llama3" (others are refused) */
    double factor, low, high;  /* llama3 */
    int orig_max;
} rope_p;

/* One RoPE object (rope_scaling, rope_parameters or one of its per-layer-type entries). */
static int parse_rope_object(const char *path, const char *key, json_t *o, bool type_required, rope_p *r,
                             td_error *err)
{
    static const char *known[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                  "high_freq_factor", "original_max_position_embeddings", "partial_rotary_factor"};
    if (!json_is_object(o)) return td_fail(err, "%s: \"%s\" must be an object or null, got %s", path, key, cfgj_type_name(o));
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(k, known[i]) != 0) i++;
        if (i == sizeof known / sizeof known[0])
            return td_fail(err, "%s: \"%s\" has a key \"%s\" that tidal does not model (it changes the rotary "
                           "embedding); tidal models rope_type \"default\" and \"llama3\"", path, key, k);
    }
    memset(r, 0, sizeof *r);
    json_t *t = json_object_get(o, "rope_type");
    if (!t) t = json_object_get(o, "type");
    if (!t && type_required) return td_fail(err, "%s: \"%s\" needs a \"rope_type\" (or \"type\") string", path, key);
    if (t && !json_is_string(t)) return td_fail(err, "%s: \"%s.rope_type\" must be a string, got %s", path, key, cfgj_type_name(t));
    r->type = t ? json_string_value(t) : "default";
    if (strcmp(r->type, "default") != 0 && strcmp(r->type, "llama3") != 0)
        return td_fail(err, "%s: \"%s.rope_type\" is \"%s\", which tidal does not model (it models \"default\" and "
                       "\"llama3\"; linear, dynamic, yarn, longrope and the others change the rotary frequencies)",
                       path, key, r->type);
    json_t *th = json_object_get(o, "rope_theta");
    if (th && !json_is_null(th)) {
        if (cfgj_num(path, o, "rope_theta", 0, &r->theta, err)) return -1;
        r->has_theta = true;
    }
    double prf;
    if (cfgj_num(path, o, "partial_rotary_factor", 1.0, &prf, err)) return -1;
    if (prf != 1.0)
        return td_fail(err, "%s: \"%s.partial_rotary_factor\" is %g; tidal rotates the whole head (1.0) only", path, key, prf);
    if (strcmp(r->type, "llama3") == 0) {
        json_t *f = json_object_get(o, "factor");
        if (!json_is_number(f)) return td_fail(err, "%s: \"%s.factor\" missing or not a number (rope_type llama3)", path, key);
        r->factor = json_number_value(f);
        if (cfgj_num(path, o, "low_freq_factor", 1.0, &r->low, err) ||
            cfgj_num(path, o, "high_freq_factor", 4.0, &r->high, err) ||
            cfgj_int(path, o, "original_max_position_embeddings", false, 8192, 1, INT32_MAX, &r->orig_max, err))
            return -1;
        if (!(r->factor > 0) || !(r->high > r->low) || !(r->low > 0))
            return td_fail(err, "%s: \"%s\" needs factor > 0 and high_freq_factor > low_freq_factor > 0", path, key);
    }
    return 0;
}

/* Same frequencies (theta compared only where both name one). */
static bool same_rope(const rope_p *a, const rope_p *b)
{
    if (a->has_theta && b->has_theta && a->theta != b->theta) return false;
    if (strcmp(a->type, b->type) != 0) return false;
    return strcmp(a->type, "llama3") != 0 ||
           (a->factor == b->factor && a->low == b->low && a->high == b->high && a->orig_max == b->orig_max);
}

static bool is_layer_type(const char *s)
{
    return strcmp(s, "full_attention") == 0 || strcmp(s, "sliding_attention") == 0;
}

/* rope_parameters: flat, or one entry per layer type (all must be the same rotation). */
static int parse_rope_parameters(const char *path, json_t *rp, rope_p *r, td_error *err)
{
    if (!json_is_object(rp))
        return td_fail(err, "%s: \"rope_parameters\" must be an object or null, got %s", path, cfgj_type_name(rp));
    const char *k;
    json_t *v;
    bool nested = false;
    json_object_foreach(rp, k, v) if (is_layer_type(k)) nested = true;
    if (!nested) {
        if (parse_rope_object(path, "rope_parameters", rp, false, r, err)) return -1;
        if (!r->has_theta) return td_fail(err, "%s: \"rope_parameters\" has no \"rope_theta\"", path);
        return 0;
    }
    bool first = true;
    json_object_foreach(rp, k, v) {
        char key[96];
        snprintf(key, sizeof key, "rope_parameters.%s", k);
        if (!is_layer_type(k))
            return td_fail(err, "%s: \"%s\": per-layer-type rope_parameters must be keyed by \"full_attention\" / "
                           "\"sliding_attention\"", path, key);
        rope_p e;
        if (parse_rope_object(path, key, v, false, &e, err)) return -1;
        if (!e.has_theta) return td_fail(err, "%s: \"%s\" has no \"rope_theta\"", path, key);
        if (!first && !same_rope(&e, r))
            return td_fail(err, "%s: \"rope_parameters\" gives the layer types different rotary embeddings; tidal "
                           "models one rotation for every layer", path);
        if (first) *r = e;
        first = false;
    }
    return 0;
}

int cfgj_rope(const char *path, json_t *j, td_config *c, td_error *err)
{
    double prf;
    if (cfgj_num(path, j, "partial_rotary_factor", 1.0, &prf, err)) return -1;
    if (prf != 1.0)
        return td_fail(err, "%s: \"partial_rotary_factor\" is %g; tidal rotates the whole head (1.0) only", path, prf);

    rope_p old = {.type = "default"};
    json_t *rt = json_object_get(j, "rope_theta"), *rs = json_object_get(j, "rope_scaling");
    if (rt && !json_is_null(rt)) {
        if (cfgj_num(path, j, "rope_theta", 0, &old.theta, err)) return -1;
        old.has_theta = true;
    }
    bool has_scaling = rs && !json_is_null(rs);
    if (has_scaling) {
        rope_p sc;
        if (parse_rope_object(path, "rope_scaling", rs, true, &sc, err)) return -1;
        bool top = old.has_theta;
        double theta = old.theta;
        old = sc;
        if (top) {   /* the top-level key is the 4.x place for theta */
            if (sc.has_theta && sc.theta != theta)
                return td_fail(err, "%s: \"rope_theta\" (%g) and \"rope_scaling.rope_theta\" (%g) disagree", path, theta, sc.theta);
            old.has_theta = true;
            old.theta = theta;
        }
    }

    rope_p use = old;
    json_t *rp = json_object_get(j, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        rope_p neu;
        if (parse_rope_parameters(path, rp, &neu, err)) return -1;
        if (old.has_theta && old.theta != neu.theta)
            return td_fail(err, "%s: \"rope_theta\" (%g) and \"rope_parameters\" rope_theta (%g) disagree; which "
                           "one the checkpoint was trained with cannot be told, so tidal refuses to guess", path,
                           old.theta, neu.theta);
        if (has_scaling && !same_rope(&old, &neu))
            return td_fail(err, "%s: \"rope_scaling\" (rope_type \"%s\") and \"rope_parameters\" (rope_type \"%s\") "
                           "describe different rotary embeddings", path, old.type, neu.type);
        use = neu;
    }
    c->rope_theta = use.has_theta ? use.theta : 10000.0;
    if (strcmp(use.type, "llama3") == 0) {
        c->rope_factor = use.factor;
        c->rope_low_freq_factor = use.low;
        c->rope_high_freq_factor = use.high;
        c->rope_original_max_position = use.orig_max;
    } else {
        c->rope_factor = 0;
    }
    return 0;
}

int cfgj_attention_layers(const char *path, json_t *j, td_config *c, td_error *err)
{
    c->sliding_window = 0;
    c->n_sliding_layers = 0;
    c->first_sliding_layer = -1;
    if (c->arch == TD_ARCH_LLAMA) return 0;   /* LlamaAttention has no window: the keys are inert */
    int window = 0, max_window_layers = 28;
    bool use_sw = c->arch == TD_ARCH_MISTRAL || c->arch == TD_ARCH_MIXTRAL;  /* a non-null window is always used */
    /* transformers 5's Qwen2-MoE config writes "sliding_window": 0 beside use_sliding_window false:
     * 0 is read as no window where use_sliding_window decides (not for Mistral / Mixtral) */
    int slides_always = c->arch == TD_ARCH_MISTRAL || c->arch == TD_ARCH_MIXTRAL;
    if (cfgj_int(path, j, "sliding_window", false, 0, slides_always ? 1 : 0, INT32_MAX, &window, err)) return -1;
    if (!slides_always &&
        (cfgj_bool(path, j, "use_sliding_window", false, &use_sw, err) ||
         cfgj_int(path, j, "max_window_layers", false, 28, 0, INT32_MAX, &max_window_layers, err)))
        return -1;
    if (use_sw && window < 1 && json_is_integer(json_object_get(j, "sliding_window")))
        return td_fail(err, "%s: \"use_sliding_window\" is true but \"sliding_window\" is %d", path, window);
    if (!use_sw) window = 0;   /* transformers: sliding_window = None unless use_sliding_window */
    json_t *lt = json_object_get(j, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt))
            return td_fail(err, "%s: \"layer_types\" must be a list, got %s", path, cfgj_type_name(lt));
        if ((int)json_array_size(lt) != c->num_layers)
            return td_fail(err, "%s: \"layer_types\" lists %zu layers but \"num_hidden_layers\" is %d", path,
                           json_array_size(lt), c->num_layers);
    }
    for (int l = 0; l < c->num_layers; l++) {
        bool slides;
        if (lt && !json_is_null(lt)) {
            json_t *e = json_array_get(lt, (size_t)l);
            if (!json_is_string(e) || !is_layer_type(json_string_value(e)))
                return td_fail(err, "%s: \"layer_types\"[%d] must be \"full_attention\" or \"sliding_attention\"", path, l);
            slides = strcmp(json_string_value(e), "sliding_attention") == 0;
        } else {
            slides = c->arch == TD_ARCH_MISTRAL || c->arch == TD_ARCH_MIXTRAL || l >= max_window_layers;
        }
        if (slides && window > 0) {
            if (c->n_sliding_layers++ == 0) c->first_sliding_layer = l;
        }
    }
    if (c->n_sliding_layers) c->sliding_window = window;
    return 0;
}

int td_config_check_len(const td_config *c, int64_t len, td_error *err)
{
    if (c->n_sliding_layers == 0 || len <= c->sliding_window) return 0;
    return td_fail(err, "sequences of up to %lld positions exceed the sliding window of %d positions of %d layer(s) "
                   "(first: layer %d): tidal computes full attention, which equals sliding-window attention only up "
                   "to %d positions; shorten the prompts or --max-new-tokens", (long long)len, c->sliding_window,
                   c->n_sliding_layers, c->first_sliding_layer, c->sliding_window);
}
