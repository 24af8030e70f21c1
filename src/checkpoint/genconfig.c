/* generation_config.json: the sampling defaults transformers (and vLLM, which reads the same
 * file) apply when the caller does not set them. They matter for divergence analysis: a rollout
 * engine that inherits repetition_penalty = 1.05 from this file samples from a distribution the
 * trainer never scores, a mismatch that has nothing to do with numerics. */
#include "tidal/checkpoint.h"
#include "tidal/io.h"

#include <math.h>
#include <string.h>

void td_gen_config_defaults(td_gen_config *g)
{
    memset(g, 0, sizeof *g);
    g->temperature = 1.0;
    g->top_p = 1.0;
    g->top_k = 50;
    g->repetition_penalty = 1.0;
    g->do_sample = false;
    g->bos_token_id = -1;
}

static int num(const char *path, json_t *o, const char *key, unsigned bit, double *out, unsigned *present,
               td_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return td_fail(err, "%s: \"%s\" must be a finite number", path, key);
    *out = json_number_value(v);
    *present |= bit;
    return 0;
}

static int token_id(const char *path, const char *key, json_t *v, int *out, td_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return td_fail(err, "%s: \"%s\" must hold non-negative integer token ids", path, key);
    *out = (int)json_integer_value(v);
    return 0;
}

int td_gen_config_parse(const char *path, const td_config *cfg, td_gen_config *g, td_error *err)
{
    td_gen_config_defaults(g);
    json_t *j = NULL;
    int rc = -1;
    if (path) {
        j = td_json_load_file(path, err);
        if (!j) return -1;
        if (!json_is_object(j)) { td_fail(err, "%s: not a JSON object", path); goto done; }
        g->from_file = true;
        double top_k = g->top_k;
        if (num(path, j, "temperature", TD_GEN_TEMPERATURE, &g->temperature, &g->present, err) ||
            num(path, j, "top_p", TD_GEN_TOP_P, &g->top_p, &g->present, err) ||
            num(path, j, "top_k", TD_GEN_TOP_K, &top_k, &g->present, err) ||
            num(path, j, "repetition_penalty", TD_GEN_REPETITION_PENALTY, &g->repetition_penalty, &g->present, err))
            goto done;
        if (top_k != floor(top_k) || top_k < 0 || top_k > INT32_MAX) {
            td_fail(err, "%s: \"top_k\" must be a non-negative integer", path);
            goto done;
        }
        g->top_k = (int)top_k;
        json_t *ds = json_object_get(j, "do_sample");
        if (ds && !json_is_null(ds)) {
            if (!json_is_boolean(ds)) { td_fail(err, "%s: \"do_sample\" must be true or false", path); goto done; }
            g->do_sample = json_is_true(ds);
            g->present |= TD_GEN_DO_SAMPLE;
        }
        json_t *b = json_object_get(j, "bos_token_id");
        if (b && !json_is_null(b)) {
            if (token_id(path, "bos_token_id", b, &g->bos_token_id, err)) goto done;
            g->present |= TD_GEN_BOS;
        }
        json_t *e = json_object_get(j, "eos_token_id");
        if (json_is_array(e)) {
            if (json_array_size(e) > TD_GEN_MAX_EOS) {
                td_fail(err, "%s: \"eos_token_id\" lists %zu ids, tidal keeps at most %d", path,
                        json_array_size(e), TD_GEN_MAX_EOS);
                goto done;
            }
            for (size_t i = 0; i < json_array_size(e); i++)
                if (token_id(path, "eos_token_id", json_array_get(e, i), &g->eos_token_ids[g->n_eos++], err))
                    goto done;
            g->present |= TD_GEN_EOS;
        } else if (e && !json_is_null(e)) {
            if (token_id(path, "eos_token_id", e, &g->eos_token_ids[0], err)) goto done;
            g->n_eos = 1;
            g->present |= TD_GEN_EOS;
        }
    }
    /* transformers' GenerationConfig.from_model_config: ids the file lacks come from config.json */
    if (cfg && !(g->present & TD_GEN_BOS)) g->bos_token_id = cfg->bos_token_id;
    if (cfg && !(g->present & TD_GEN_EOS)) {   /* config.json's whole list (Llama 3: three ids) */
        g->n_eos = td_config_eos_list(cfg, g->eos_token_ids);
    }
    rc = 0;
done:
    if (j) json_decref(j);
    return rc;
}

int td_checkpoint_stop_ids(const char *dir, const td_config *cfg, int tok_eos, int *ids, td_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    td_gen_config g;
    if (td_gen_config_parse(f ? path : NULL, cfg, &g, err)) return -1;
    memcpy(ids, g.eos_token_ids, (size_t)g.n_eos * sizeof *ids);
    if (g.n_eos == 0 && tok_eos >= 0) ids[g.n_eos++] = tok_eos;
    return g.n_eos;
}

int td_gen_config_write(const char *path, const td_gen_config *g, td_error *err)
{
    json_t *j = json_object();
    if (g->bos_token_id >= 0) json_object_set_new(j, "bos_token_id", json_integer(g->bos_token_id));
    if (g->n_eos == 1) json_object_set_new(j, "eos_token_id", json_integer(g->eos_token_ids[0]));
    else if (g->n_eos > 1) {
        json_t *a = json_array();
        for (int i = 0; i < g->n_eos; i++) json_array_append_new(a, json_integer(g->eos_token_ids[i]));
        json_object_set_new(j, "eos_token_id", a);
    }
    if (g->present & TD_GEN_DO_SAMPLE) json_object_set_new(j, "do_sample", json_boolean(g->do_sample));
    if (g->present & TD_GEN_TEMPERATURE) json_object_set_new(j, "temperature", json_real(g->temperature));
    if (g->present & TD_GEN_TOP_P) json_object_set_new(j, "top_p", json_real(g->top_p));
    if (g->present & TD_GEN_TOP_K) json_object_set_new(j, "top_k", json_integer(g->top_k));
    if (g->present & TD_GEN_REPETITION_PENALTY)
        json_object_set_new(j, "repetition_penalty", json_real(g->repetition_penalty));
    int rc = 0;
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        rc = td_fail(err, "%s: cannot write generation_config.json", path);
    json_decref(j);
    return rc;
}

void td_gen_config_print(FILE *f, const td_gen_config *g)
{
    /* only what the file says: a library default it does not contain is not the checkpoint's */
    if (!g->from_file) { fprintf(f, "generation: no generation_config.json\n"); return; }
    fprintf(f, "generation: generation_config.json sets");
    if (g->present & TD_GEN_DO_SAMPLE) fprintf(f, " do_sample=%s", g->do_sample ? "true" : "false");
    if (g->present & TD_GEN_TEMPERATURE) fprintf(f, " temperature=%g", g->temperature);
    if (g->present & TD_GEN_TOP_P) fprintf(f, " top_p=%g", g->top_p);
    if (g->present & TD_GEN_TOP_K) fprintf(f, " top_k=%d", g->top_k);
    if (g->present & TD_GEN_REPETITION_PENALTY) fprintf(f, " repetition_penalty=%g", g->repetition_penalty);
    if (g->present & TD_GEN_BOS) fprintf(f, " bos_token_id=%d", g->bos_token_id);
    if (g->present & TD_GEN_EOS) {
        fprintf(f, " eos_token_id=");
        for (int i = 0; i < g->n_eos; i++) fprintf(f, i ? ",%d" : "%d", g->eos_token_ids[i]);
    }
    if (!(g->present & (TD_GEN_DO_SAMPLE | TD_GEN_TEMPERATURE | TD_GEN_TOP_P | TD_GEN_TOP_K | TD_GEN_REPETITION_PENALTY |
                        TD_GEN_BOS | TD_GEN_EOS)))
        fprintf(f, " nothing tidal reads");
    fprintf(f, "\n");
    if ((g->present & TD_GEN_REPETITION_PENALTY) && g->repetition_penalty != 1.0)
        fprintf(f, "warning: generation_config.json sets repetition_penalty=%g: engines that inherit it "
                   "(transformers generate, vLLM) sample from a penalised distribution that a trainer scoring "
                   "plain log-probs never sees; set it explicitly on both sides\n", g->repetition_penalty);
}
