/* PEFT LoRA adapters (include/tidal/lora.h): adapter_config.json, then
 * adapter_model.safetensors read through the checkpoint reader (a bare .safetensors file),
 * every expected tensor checked for shape and converted to fp32, every unexpected one an error. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tidal/lora.h"
#include "tidal/checkpoint.h"
#include "tidal/io.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const MODULE_NAMES[TD_LORA_NMOD] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
static const char *const MODULE_PARENT[TD_LORA_NMOD] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

/* Mixtral's expert projections: gate, up, down */
static const char *const MIXTRAL_LEAF[3] = {"w1", "w3", "w2"};

const char *td_lora_module_name(int m) { return m >= 0 && m < TD_LORA_NMOD ? MODULE_NAMES[m] : "?"; }

int td_lora_module_from_name(const char *name)
{
    for (int m = 0; m < TD_LORA_NMOD; m++)
        if (!strcmp(name, MODULE_NAMES[m])) return m;
    for (int k = 0; k < 3; k++)   /* Mixtral's experts */
        if (!strcmp(name, MIXTRAL_LEAF[k])) return TD_LORA_GATE + k;
    return -1;
}

void td_lora_module_shape(const td_config *c, int m, int *out, int *in)
{
    int C = c->hidden_size, F = c->intermediate_size;
    int QD = c->num_heads * c->head_dim, KVD = c->num_kv_heads * c->head_dim;
    switch (m) {
    case TD_LORA_Q: *out = QD; *in = C; break;
    case TD_LORA_K: case TD_LORA_V: *out = KVD; *in = C; break;
    case TD_LORA_O: *out = C; *in = QD; break;
    case TD_LORA_GATE: case TD_LORA_UP: *out = F; *in = C; break;
    default: *out = C; *in = F; break;
    }
}

int td_lora_slots(const td_config *c) { return TD_LORA_NMOD + 3 * (c->num_experts > 0 ? c->num_experts : 0); }

int td_lora_slot_module(int s) { return s < TD_LORA_NMOD ? s : TD_LORA_GATE + (s - TD_LORA_NMOD) % 3; }

int td_lora_slot_shape(const td_config *c, int l, int s, int *out, int *in)
{
    int m = td_lora_slot_module(s), F;
    if (s < 0 || s >= td_lora_slots(c) || l < 0 || l >= c->num_layers) return -1;
    if (m <= TD_LORA_O) {
        td_lora_module_shape(c, m, out, in);
        return 0;
    }
    if (c->num_experts == 0 || !td_config_layer_moe(c, l)) {   /* a dense MLP */
        if (s >= TD_LORA_NMOD) return -1;
        F = c->intermediate_size;
    } else if (s < TD_LORA_NMOD) {   /* the shared expert */
        if ((F = c->shared_expert_intermediate_size) <= 0) return -1;
    } else {
        F = c->moe_intermediate_size;
    }
    *out = m == TD_LORA_DOWN ? c->hidden_size : F;
    *in = m == TD_LORA_DOWN ? F : c->hidden_size;
    return 0;
}

const char *td_lora_module_leaf(const td_config *c, int m)
{
    if (c->arch == TD_ARCH_MIXTRAL && m >= TD_LORA_GATE && m <= TD_LORA_DOWN) return MIXTRAL_LEAF[m - TD_LORA_GATE];
    return td_lora_module_name(m);
}

void td_lora_slot_path(const td_config *c, int l, int s, char *buf, size_t n)
{
    int m = td_lora_slot_module(s);
    if (m <= TD_LORA_O || c->num_experts == 0 || !td_config_layer_moe(c, l))
        snprintf(buf, n, "model.layers.%d.%s.%s", l, MODULE_PARENT[m], MODULE_NAMES[m]);
    else if (s < TD_LORA_NMOD)
        snprintf(buf, n, "model.layers.%d.mlp.shared_expert.%s", l, MODULE_NAMES[m]);
    else
        snprintf(buf, n, "model.layers.%d.%s.experts.%d.%s", l, c->arch == TD_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp",
                 (s - TD_LORA_NMOD) / 3, td_lora_module_leaf(c, m));
}

/* The nn.Linear modules of an MoE layer that PEFT could adapt and tidal does not: the router and
 * the shared expert's sigmoid gate. Their paths into buf[0..1]; returns how many. */
static int unadaptable_paths(const td_config *c, int l, char buf[2][96])
{
    if (c->num_experts == 0 || !td_config_layer_moe(c, l)) return 0;
    snprintf(buf[0], 96, "model.layers.%d.%s.gate", l, c->arch == TD_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp");
    if (c->shared_expert_intermediate_size <= 0) return 1;
    snprintf(buf[1], 96, "model.layers.%d.mlp.shared_expert_gate", l);
    return 2;
}

void td_lora_free(td_lora *l)
{
    if (!l) return;
    free(l->dir);
    free(l->pairs);
    free(l->owned);
    free(l);
}

/* ---------------------------------------------------------------- adapter_config.json */

typedef struct {
    int rank;
    double alpha;
    int rslora;
    unsigned char *adapt;    /* (L, slots): 1 where the config targets that projection */
    int slots;
} lora_plan;

static int is_true(json_t *v) { return v && json_is_true(v); }

/* A key that must be absent, null, false or empty for tidal to run the adapter faithfully. */
static int reject_if_set(const char *path, json_t *root, const char *key, const char *why, td_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if ((json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0)) return 0;
    return td_fail(err, "%s: \"%s\" is set; tidal does not support it (%s)", path, key, why);
}

/* PEFT's matching of a list entry: key == t or key ends with "." + t. */
static int suffix_match(const char *key, const char *t)
{
    size_t k = strlen(key), n = strlen(t);
    if (k == n) return !strcmp(key, t);
    return k > n && key[k - n - 1] == '.' && !strcmp(key + k - n, t);
}

/* Whether target t (a list entry: suffix match; a regex: full match) selects module path key. */
static int target_hits(const char *key, const char *t, pcre2_code *re, pcre2_match_data *md)
{
    if (!re) return suffix_match(key, t);
    return pcre2_match(re, (PCRE2_SPTR)key, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) >= 0;
}

/* Marks every projection target t selects (all-linear: every one); refuses a target that selects a
 * linear layer tidal does not adapt (an MoE router). Returns the number selected, -1 on error. */
static int mark_target(const char *path, const char *t, pcre2_code *re, pcre2_match_data *md, int all,
                       const td_config *cfg, lora_plan *p, td_error *err)
{
    char key[128], un[2][96];
    int hit = 0, S = p->slots;
    for (int l = 0; l < cfg->num_layers; l++) {
        int nu = unadaptable_paths(cfg, l, un);
        for (int u = 0; u < nu; u++)
            if (all || target_hits(un[u], t, re, md))
                return td_fail(err, "%s: target_modules %s\"%s\" selects %s, %s; tidal does not run a LoRA on it "
                               "(list the projections instead: q_proj, ..., and the experts' %s, %s, %s)", path,
                               re ? "regex " : all ? "" : "entry ", t, un[u],
                               u == 0 ? "the router" : "the shared expert's gate", td_lora_module_leaf(cfg, TD_LORA_GATE),
                               td_lora_module_leaf(cfg, TD_LORA_UP), td_lora_module_leaf(cfg, TD_LORA_DOWN)), -1;
        for (int s = 0; s < S; s++) {
            int out, in;
            if (td_lora_slot_shape(cfg, l, s, &out, &in)) continue;
            td_lora_slot_path(cfg, l, s, key, sizeof key);
            if (all || target_hits(key, t, re, md)) {
                p->adapt[(size_t)l * S + s] = 1;
                hit++;
            }
        }
    }
    return hit;
}

static int parse_targets(const char *path, json_t *tm, const td_config *cfg, lora_plan *p, td_error *err)
{
    if (json_is_array(tm)) {
        if (json_array_size(tm) == 0) return td_fail(err, "%s: target_modules is empty", path);
        size_t i;
        json_t *e;
        json_array_foreach(tm, i, e) {
            if (!json_is_string(e)) return td_fail(err, "%s: target_modules[%zu] is not a string", path, i);
            const char *t = json_string_value(e);
            int hit = mark_target(path, t, NULL, NULL, 0, cfg, p, err);
            if (hit < 0) return -1;
            if (!hit)
                return td_fail(err, "%s: target_modules entry \"%s\" names no projection tidal can adapt "
                               "(q_proj, k_proj, v_proj, o_proj, %s, %s, %s)", path, t, td_lora_module_leaf(cfg, TD_LORA_GATE),
                               td_lora_module_leaf(cfg, TD_LORA_UP), td_lora_module_leaf(cfg, TD_LORA_DOWN));
        }
        return 0;
    }
    if (!json_is_string(tm)) return td_fail(err, "%s: target_modules must be a list of names or a string", path);
    const char *t = json_string_value(tm);
    if (!strcmp(t, "all-linear"))   /* every linear layer but the output head */
        return mark_target(path, t, NULL, NULL, 1, cfg, p, err) < 0 ? -1 : 0;
    /* a string is a regular expression that must match the whole module name (re.fullmatch) */
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)t, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return td_fail(err, "%s: target_modules regex \"%s\": %s at offset %zu", path, t, (const char *)msg, (size_t)eo);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int hit = mark_target(path, t, re, md, 0, cfg, p, err);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (hit < 0) return -1;
    if (!hit) return td_fail(err, "%s: target_modules regex \"%s\" matches no projection of the model", path, t);
    return 0;
}

static int parse_config(const char *path, const td_config *cfg, lora_plan *p, td_error *err)
{
    json_t *root = td_json_load_file(path, err);
    if (!root) return -1;
    int rc = -1;
    if (!json_is_object(root)) { td_fail(err, "%s: expected a JSON object", path); goto out; }
    json_t *v = json_object_get(root, "peft_type");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "LORA"))) {
        td_fail(err, "%s: peft_type %s (tidal reads LORA adapters only)", path, json_is_string(v) ? json_string_value(v) : "not a string");
        goto out;
    }
    /* r and lora_alpha default to PEFT's LoraConfig defaults (8, 8) when absent */
    p->rank = 8;
    p->alpha = 8;
    if ((v = json_object_get(root, "r"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536) {
            td_fail(err, "%s: \"r\" must be an integer in 1..65536", path);
            goto out;
        }
        p->rank = (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "lora_alpha"))) {
        if (!json_is_number(v) || !isfinite(json_number_value(v))) { td_fail(err, "%s: \"lora_alpha\" must be a number", path); goto out; }
        p->alpha = json_number_value(v);
    }
    p->rslora = is_true(json_object_get(root, "use_rslora"));
    if (is_true(json_object_get(root, "fan_in_fan_out"))) {
        td_fail(err, "%s: \"fan_in_fan_out\": true (Conv1D-style transposed weights, GPT-2) is not supported: "
                "Llama-family projections are nn.Linear", path);
        goto out;
    }
    if (is_true(json_object_get(root, "use_dora"))) {
        td_fail(err, "%s: \"use_dora\": true (DoRA magnitude vectors) is not supported", path);
        goto out;
    }
    if ((v = json_object_get(root, "bias")) && !(json_is_string(v) && !strcmp(json_string_value(v), "none"))) {
        td_fail(err, "%s: \"bias\" is %s; tidal supports only \"none\" (no trained biases)", path,
                json_is_string(v) ? json_string_value(v) : "not a string");
        goto out;
    }
    if (reject_if_set(path, root, "modules_to_save", "fully trained extra modules", err) ||
        reject_if_set(path, root, "rank_pattern", "per-module ranks", err) ||
        reject_if_set(path, root, "alpha_pattern", "per-module alphas", err) ||
        reject_if_set(path, root, "layer_replication", "replicated layers", err) ||
        reject_if_set(path, root, "target_parameters", "LoRA on nn.Parameter tensors such as transformers 5's fused "
                      "experts; tidal reads the per-expert module names of transformers 4", err))
        goto out;
    if ((v = json_object_get(root, "layers_pattern")) && !json_is_null(v) &&
        !(json_is_string(v) && !strcmp(json_string_value(v), "layers")) &&
        !(json_is_array(v) && json_array_size(v) == 0)) {
        td_fail(err, "%s: \"layers_pattern\" other than \"layers\" is not supported", path);
        goto out;
    }
    json_t *tm = json_object_get(root, "target_modules");
    if (!tm || json_is_null(tm)) { td_fail(err, "%s: \"target_modules\" is missing", path); goto out; }
    if (parse_targets(path, tm, cfg, p, err)) goto out;
    /* layers_to_transform: an int or a list of layer indices; other layers stay unadapted */
    if ((v = json_object_get(root, "layers_to_transform")) && !json_is_null(v)) {
        int L = cfg->num_layers;
        unsigned char *keep = td_xcalloc((size_t)L, 1);
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= L) {
                free(keep);
                td_fail(err, "%s: layers_to_transform entries must be layer indices 0..%d", path, L - 1);
                goto out;
            }
            keep[json_integer_value(e)] = 1;
        }
        for (int l = 0; l < L; l++)
            if (!keep[l]) memset(p->adapt + (size_t)l * p->slots, 0, (size_t)p->slots);
        free(keep);
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- adapter_model.safetensors */

#define PREFIX "base_model.model.model.layers."

/* The tensor name of slot s of layer l, A (ab 0) or B (ab 1), as PEFT writes it. */
static void tensor_name(const td_config *c, int l, int s, int ab, char *buf, size_t n)
{
    char path[128];
    td_lora_slot_path(c, l, s, path, sizeof path);
    snprintf(buf, n, "base_model.model.%s.lora_%c.weight", path, ab ? 'B' : 'A');
}

/* Parses a tensor name of one of cfg's projections; 0 and (layer, slot, which) or -1 when the name
 * is not of that form. */
static int parse_tensor_name(const char *name, const td_config *cfg, int *layer, int *slot, int *which)
{
    if (strncmp(name, PREFIX, strlen(PREFIX))) return -1;
    const char *p = name + strlen(PREFIX);
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l >= cfg->num_layers) return -1;
    size_t skip = (size_t)(end - name);   /* the same prefix up to the layer index */
    char want[192];
    for (int s = 0; s < td_lora_slots(cfg); s++) {
        int out, in;
        if (td_lora_slot_shape(cfg, (int)l, s, &out, &in)) continue;
        for (int ab = 0; ab < 2; ab++) {
            tensor_name(cfg, (int)l, s, ab, want, sizeof want);
            if (strlen(want) > skip && !strcmp(name + skip, want + skip)) {
                *layer = (int)l;
                *slot = s;
                *which = ab;
                return 0;
            }
        }
    }
    return -1;
}

td_lora *td_lora_load(const char *dir, const td_config *cfg, td_error *err)
{
    char cpath[4096], wpath[4096], path[128];
    snprintf(cpath, sizeof cpath, "%s/adapter_config.json", dir);
    snprintf(wpath, sizeof wpath, "%s/adapter_model.safetensors", dir);
    int L = cfg->num_layers, S = td_lora_slots(cfg);
    lora_plan plan = {0};
    plan.slots = S;
    plan.adapt = td_xcalloc((size_t)L * S, 1);
    td_lora *lo = NULL;
    td_checkpoint *ck = NULL;
    if (parse_config(cpath, cfg, &plan, err)) goto fail;
    ck = td_checkpoint_open(wpath, err);
    if (!ck) goto fail;
    /* every tensor in the file must be an A or B of a targeted projection */
    for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
        const char *name = td_checkpoint_tensor(ck, i)->name;
        int l, s, ab;
        if (parse_tensor_name(name, cfg, &l, &s, &ab)) {
            td_fail(err, "%s: tensor \"%s\" is not a LoRA A/B of a projection tidal adapts (expected "
                    PREFIX "{0..%d}.{self_attn.{q,k,v,o}_proj|mlp.{gate,up,down}_proj%s}.lora_{A,B}.weight)",
                    wpath, name, L - 1, cfg->num_experts == 0 ? ""
                    : cfg->arch == TD_ARCH_MIXTRAL ? "|block_sparse_moe.experts.{e}.{w1,w3,w2}"
                    : "|mlp.experts.{e}.{gate,up,down}_proj|mlp.shared_expert.{gate,up,down}_proj");
            goto fail;
        }
        if (!plan.adapt[(size_t)l * S + s]) {
            td_lora_slot_path(cfg, l, s, path, sizeof path);
            td_fail(err, "%s: tensor \"%s\" adapts %s, which target_modules/layers_to_transform in %s "
                    "do not select", wpath, name, path, cpath);
            goto fail;
        }
    }
    /* sizes: each matrix is at most (out + in) * r floats, bounded by the file's own tensors */
    size_t total = 0;
    int n_adapted = 0;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S; s++) {
            int out, in;
            if (!plan.adapt[(size_t)l * S + s] || td_lora_slot_shape(cfg, l, s, &out, &in)) continue;
            total += ((size_t)out + in) * plan.rank;
            n_adapted++;
        }
    lo = td_xcalloc(1, sizeof *lo);
    lo->dir = strdup(dir);
    lo->rank = plan.rank;
    lo->alpha = plan.alpha;
    lo->rslora = plan.rslora;
    lo->scale = (float)(plan.rslora ? plan.alpha / sqrt((double)plan.rank) : plan.alpha / plan.rank);
    lo->num_layers = L;
    lo->slots = S;
    lo->n_adapted = n_adapted;
    lo->pairs = td_xcalloc((size_t)L * S, sizeof *lo->pairs);
    /* the file holds every one of these tensors (checked below before reading), so its size
     * bounds the allocation: refuse before allocating when a tensor is missing */
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S; s++) {
            if (!plan.adapt[(size_t)l * S + s]) continue;
            for (int ab = 0; ab < 2; ab++) {
                char name[192];
                tensor_name(cfg, l, s, ab, name, sizeof name);
                if (!td_checkpoint_find(ck, name)) {
                    td_lora_slot_path(cfg, l, s, path, sizeof path);
                    td_fail(err, "%s: tensor \"%s\" is missing (%s targets %s)", wpath, name, cpath, path);
                    goto fail;
                }
            }
        }
    lo->owned = total ? malloc(total * sizeof(float)) : NULL;
    if (total && !lo->owned) { td_fail(err, "%s: out of memory for %zu MB of LoRA weights", wpath, total * 4 >> 20); goto fail; }
    float *p = lo->owned;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S; s++) {
            int out, in;
            if (!plan.adapt[(size_t)l * S + s] || td_lora_slot_shape(cfg, l, s, &out, &in)) continue;
            td_lora_pair *pr = &lo->pairs[(size_t)l * S + s];
            pr->out = out;
            pr->in = in;
            char name[192];
            int64_t sa[2] = {plan.rank, in}, sb[2] = {out, plan.rank};
            size_t bad = 0;
            tensor_name(cfg, l, s, 0, name, sizeof name);
            if (td_checkpoint_read_f32(ck, name, 2, sa, p, &bad, err)) goto fail;
            pr->a = p;
            p += (size_t)plan.rank * in;
            tensor_name(cfg, l, s, 1, name, sizeof name);
            if (td_checkpoint_read_f32(ck, name, 2, sb, p, &bad, err)) goto fail;
            pr->b = p;
            p += (size_t)out * plan.rank;
            if (bad) {
                td_lora_slot_path(cfg, l, s, path, sizeof path);
                td_fail(err, "%s: %s: %zu NaN/Inf values in lora_A/lora_B", wpath, path, bad);
                goto fail;
            }
            lo->modules |= 1u << td_lora_slot_module(s);
        }
    td_checkpoint_close(ck);
    free(plan.adapt);
    return lo;
fail:
    if (ck) td_checkpoint_close(ck);
    free(plan.adapt);
    td_lora_free(lo);
    return NULL;
}
