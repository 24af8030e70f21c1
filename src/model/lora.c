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

const char *td_lora_module_name(int m) { return m >= 0 && m < TD_LORA_NMOD ? MODULE_NAMES[m] : "?"; }

int td_lora_module_from_name(const char *name)
{
    for (int m = 0; m < TD_LORA_NMOD; m++)
        if (!strcmp(name, MODULE_NAMES[m])) return m;
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
    unsigned char *adapt;    /* (L, NMOD): 1 where the config targets that projection */
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

static int parse_targets(const char *path, json_t *tm, const td_config *cfg, lora_plan *p, td_error *err)
{
    int L = cfg->num_layers;
    char key[128];
    if (json_is_array(tm)) {
        if (json_array_size(tm) == 0) return td_fail(err, "%s: target_modules is empty", path);
        size_t i;
        json_t *e;
        json_array_foreach(tm, i, e) {
            if (!json_is_string(e)) return td_fail(err, "%s: target_modules[%zu] is not a string", path, i);
            const char *t = json_string_value(e);
            int hit = 0;
            for (int l = 0; l < L; l++)
                for (int m = 0; m < TD_LORA_NMOD; m++) {
                    snprintf(key, sizeof key, "model.layers.%d.%s.%s", l, MODULE_PARENT[m], MODULE_NAMES[m]);
                    if (suffix_match(key, t)) { p->adapt[l * TD_LORA_NMOD + m] = 1; hit = 1; }
                }
            if (!hit)
                return td_fail(err, "%s: target_modules entry \"%s\" names no projection tidal can adapt "
                               "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)", path, t);
        }
        return 0;
    }
    if (!json_is_string(tm)) return td_fail(err, "%s: target_modules must be a list of names or a string", path);
    const char *t = json_string_value(tm);
    if (!strcmp(t, "all-linear")) {   /* every linear layer but the output head */
        memset(p->adapt, 1, (size_t)L * TD_LORA_NMOD);
        return 0;
    }
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
    int hit = 0;
    for (int l = 0; l < L; l++)
        for (int m = 0; m < TD_LORA_NMOD; m++) {
            snprintf(key, sizeof key, "model.layers.%d.%s.%s", l, MODULE_PARENT[m], MODULE_NAMES[m]);
            if (pcre2_match(re, (PCRE2_SPTR)key, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) >= 0) {
                p->adapt[l * TD_LORA_NMOD + m] = 1;
                hit = 1;
            }
        }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
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
        reject_if_set(path, root, "layer_replication", "replicated layers", err))
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
            if (!keep[l]) memset(p->adapt + (size_t)l * TD_LORA_NMOD, 0, TD_LORA_NMOD);
        free(keep);
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* ---------------------------------------------------------------- adapter_model.safetensors */

#define PREFIX "base_model.model.model.layers."

/* Parses "base_model.model.model.layers.{i}.{parent}.{module}.lora_{A|B}.weight";
 * 0 and (layer, module, which) or -1 when the name is not of that form. */
static int parse_tensor_name(const char *name, int L, int *layer, int *module, int *which)
{
    if (strncmp(name, PREFIX, strlen(PREFIX))) return -1;
    const char *p = name + strlen(PREFIX);
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l >= L) return -1;
    p = end + 1;
    for (int m = 0; m < TD_LORA_NMOD; m++) {
        char tail[96];
        for (int ab = 0; ab < 2; ab++) {
            snprintf(tail, sizeof tail, "%s.%s.lora_%c.weight", MODULE_PARENT[m], MODULE_NAMES[m], ab ? 'B' : 'A');
            if (!strcmp(p, tail)) { *layer = (int)l; *module = m; *which = ab; return 0; }
        }
    }
    return -1;
}

td_lora *td_lora_load(const char *dir, const td_config *cfg, td_error *err)
{
    char cpath[4096], wpath[4096];
    snprintf(cpath, sizeof cpath, "%s/adapter_config.json", dir);
    snprintf(wpath, sizeof wpath, "%s/adapter_model.safetensors", dir);
    int L = cfg->num_layers;
    lora_plan plan = {0};
    plan.adapt = td_xcalloc((size_t)L * TD_LORA_NMOD, 1);
    td_lora *lo = NULL;
    td_checkpoint *ck = NULL;
    if (parse_config(cpath, cfg, &plan, err)) goto fail;
    ck = td_checkpoint_open(wpath, err);
    if (!ck) goto fail;
    /* every tensor in the file must be an A or B of a targeted projection */
    for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
        const char *name = td_checkpoint_tensor(ck, i)->name;
        int l, m, ab;
        if (parse_tensor_name(name, L, &l, &m, &ab)) {
            td_fail(err, "%s: tensor \"%s\" is not a LoRA A/B of a projection tidal adapts (expected "
                    PREFIX "{0..%d}.{self_attn.{q,k,v,o}_proj|mlp.{gate,up,down}_proj}.lora_{A,B}.weight)",
                    wpath, name, L - 1);
            goto fail;
        }
        if (!plan.adapt[l * TD_LORA_NMOD + m]) {
            td_fail(err, "%s: tensor \"%s\" adapts layer %d %s, which target_modules/layers_to_transform in %s "
                    "do not select", wpath, name, l, MODULE_NAMES[m], cpath);
            goto fail;
        }
    }
    /* sizes: each matrix is at most (out + in) * r floats, bounded by the file's own tensors */
    size_t total = 0;
    int n_adapted = 0;
    for (int l = 0; l < L; l++)
        for (int m = 0; m < TD_LORA_NMOD; m++) {
            if (!plan.adapt[l * TD_LORA_NMOD + m]) continue;
            int out, in;
            td_lora_module_shape(cfg, m, &out, &in);
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
    lo->n_adapted = n_adapted;
    lo->pairs = td_xcalloc((size_t)L * TD_LORA_NMOD, sizeof *lo->pairs);
    /* the file holds every one of these tensors (checked below before reading), so its size
     * bounds the allocation: refuse before allocating when a tensor is missing */
    for (int l = 0; l < L; l++)
        for (int m = 0; m < TD_LORA_NMOD; m++) {
            if (!plan.adapt[l * TD_LORA_NMOD + m]) continue;
            for (int ab = 0; ab < 2; ab++) {
                char name[160];
                snprintf(name, sizeof name, PREFIX "%d.%s.%s.lora_%c.weight", l, MODULE_PARENT[m], MODULE_NAMES[m], ab ? 'B' : 'A');
                if (!td_checkpoint_find(ck, name)) {
                    td_fail(err, "%s: tensor \"%s\" is missing (%s targets layer %d %s)", wpath, name, cpath, l, MODULE_NAMES[m]);
                    goto fail;
                }
            }
        }
    lo->owned = total ? malloc(total * sizeof(float)) : NULL;
    if (total && !lo->owned) { td_fail(err, "%s: out of memory for %zu MB of LoRA weights", wpath, total * 4 >> 20); goto fail; }
    float *p = lo->owned;
    for (int l = 0; l < L; l++)
        for (int m = 0; m < TD_LORA_NMOD; m++) {
            if (!plan.adapt[l * TD_LORA_NMOD + m]) continue;
            int out, in;
            td_lora_module_shape(cfg, m, &out, &in);
            td_lora_pair *pr = &lo->pairs[l * TD_LORA_NMOD + m];
            pr->out = out;
            pr->in = in;
            char name[160];
            int64_t sa[2] = {plan.rank, in}, sb[2] = {out, plan.rank};
            size_t bad = 0;
            snprintf(name, sizeof name, PREFIX "%d.%s.%s.lora_A.weight", l, MODULE_PARENT[m], MODULE_NAMES[m]);
            if (td_checkpoint_read_f32(ck, name, 2, sa, p, &bad, err)) goto fail;
            pr->a = p;
            p += (size_t)plan.rank * in;
            snprintf(name, sizeof name, PREFIX "%d.%s.%s.lora_B.weight", l, MODULE_PARENT[m], MODULE_NAMES[m]);
            if (td_checkpoint_read_f32(ck, name, 2, sb, p, &bad, err)) goto fail;
            pr->b = p;
            p += (size_t)out * plan.rank;
            if (bad) { td_fail(err, "%s: layer %d %s: %zu NaN/Inf values in lora_A/lora_B", wpath, l, MODULE_NAMES[m], bad); goto fail; }
            lo->modules |= 1u << m;
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
