/* Random PEFT adapters (the library side of tidal-init --lora-for): adapter_config.json as
 * PEFT writes it and adapter_model.safetensors in F32, A and B both N(0, std^2). Tensor t
 * (in declaration order: layer, module, A then B) draws from td_rng_stream(seed, t), so an
 * adapter reproduces from its seed. */
#include "tidal/checkpoint.h"
#include "tidal/lora.h"
#include "tidal/rng.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int write_config(const char *path, const td_config *cfg, int rank, double alpha, unsigned modules,
                        const char *base, td_error *err)
{
    json_t *o = json_object(), *tm = json_array();
    for (int m = 0; m < TD_LORA_NMOD; m++)
        if (modules & (1u << m)) json_array_append_new(tm, json_string(td_lora_module_leaf(cfg, m)));
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "base_model_name_or_path", base ? json_string(base) : json_null());
    json_object_set_new(o, "r", json_integer(rank));
    json_object_set_new(o, "lora_alpha", json_real(alpha));
    json_object_set_new(o, "target_modules", tm);
    json_object_set_new(o, "lora_dropout", json_real(0.0));
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "use_rslora", json_false());
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "modules_to_save", json_null());
    json_object_set_new(o, "inference_mode", json_true());
    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (rc) return td_fail(err, "%s: cannot write: %s", path, strerror(errno));
    return 0;
}

td_lora *td_lora_new(const td_config *cfg, int rank, double alpha, unsigned modules)
{
    int L = cfg->num_layers, S = td_lora_slots(cfg), out, in;
    td_lora *lo = td_xcalloc(1, sizeof *lo);
    lo->rank = rank;
    lo->alpha = alpha;
    lo->scale = (float)(alpha / rank);
    lo->num_layers = L;
    lo->slots = S;
    lo->pairs = td_xcalloc((size_t)L * S, sizeof *lo->pairs);
    size_t total = 0;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S; s++)
            if ((modules & (1u << td_lora_slot_module(s))) && !td_lora_slot_shape(cfg, l, s, &out, &in))
                total += ((size_t)out + in) * rank;
    lo->owned = td_xcalloc(total ? total : 1, sizeof(float));
    float *p = lo->owned;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S; s++) {
            td_lora_pair *pr = &lo->pairs[(size_t)l * S + s];
            if (!(modules & (1u << td_lora_slot_module(s))) || td_lora_slot_shape(cfg, l, s, &pr->out, &pr->in))
                continue;
            pr->a = p;
            p += (size_t)rank * pr->in;
            pr->b = p;
            p += (size_t)pr->out * rank;
            lo->n_adapted++;
            lo->modules |= 1u << td_lora_slot_module(s);
        }
    return lo;
}

int td_lora_save(const td_lora *lo, const td_config *cfg, const char *dir, const char *base_model,
                 const char *command, td_error *err)
{
    /* adapter_config.json names target modules for every layer: refuse a per-layer pattern */
    int S = td_lora_slots(cfg), out, in;
    if (lo->slots != S || lo->num_layers != cfg->num_layers)
        return td_fail(err, "%s: the adapter was made for another model's layout", dir);
    for (int l = 0; l < lo->num_layers; l++)
        for (int s = 0; s < S; s++)
            if (!td_lora_slot_shape(cfg, l, s, &out, &in) &&
                !lo->pairs[(size_t)l * S + s].a != !(lo->modules & (1u << td_lora_slot_module(s)))) {
                char path[128];
                td_lora_slot_path(cfg, l, s, path, sizeof path);
                return td_fail(err, "%s: adapter adapts %s in some places only, not %s (layers_to_transform "
                               "is not written)", dir, td_lora_module_leaf(cfg, td_lora_slot_module(s)), path);
            }
    if (lo->rslora) return td_fail(err, "%s: use_rslora adapters are not written", dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return td_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));
    char fpath[4096], name[192], mpath[128];
    snprintf(fpath, sizeof fpath, "%s/adapter_model.safetensors", dir);
    td_st_writer *w = td_st_writer_new(fpath);
    int rc = -1;
    if (td_st_writer_meta(w, "tidal_command", command ? command : "", err)) goto out;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && td_st_writer_begin(w, err)) goto out;
        for (int l = 0; l < cfg->num_layers; l++)
            for (int s = 0; s < S; s++) {
                const td_lora_pair *pr = &lo->pairs[(size_t)l * S + s];
                if (!pr->a) continue;
                td_lora_slot_path(cfg, l, s, mpath, sizeof mpath);
                for (int ab = 0; ab < 2; ab++) {
                    snprintf(name, sizeof name, "base_model.model.%s.lora_%c.weight", mpath, ab ? 'B' : 'A');
                    int64_t shape[2] = {ab ? pr->out : lo->rank, ab ? lo->rank : pr->in};
                    if (pass == 0 ? td_st_writer_declare(w, name, TD_DT_F32, 2, shape, err)
                                  : td_st_writer_write_f32(w, name, ab ? pr->b : pr->a,
                                                           (size_t)shape[0] * shape[1], err))
                        goto out;
                }
            }
    }
    if (td_st_writer_finish(w, err)) goto out;
    snprintf(fpath, sizeof fpath, "%s/adapter_config.json", dir);
    rc = write_config(fpath, cfg, lo->rank, lo->alpha, lo->modules, base_model, err);
out:
    td_st_writer_free(w);
    return rc;
}

int td_lora_init_random(const char *dir, const td_config *cfg, int rank, double alpha, unsigned modules,
                        double std, uint64_t seed, const char *base_model, const char *command, td_error *err)
{
    if (rank < 1 || !(alpha > 0) || !(std >= 0) || modules == 0 || modules >= 1u << TD_LORA_NMOD)
        return td_fail(err, "%s: bad adapter parameters (rank %d, alpha %g, std %g, %s)", dir, rank, alpha, std,
                       modules ? "modules" : "no target modules");
    /* tensor t (layer, slot, A then B) draws from td_rng_stream(seed, t) */
    td_lora *lo = td_lora_new(cfg, rank, alpha, modules);
    uint64_t t = 0;
    for (int l = 0; l < cfg->num_layers; l++)
        for (int s = 0; s < lo->slots; s++) {
            td_lora_pair *pr = &lo->pairs[(size_t)l * lo->slots + s];
            if (!pr->a) continue;
            for (int ab = 0; ab < 2; ab++, t++) {
                size_t n = (size_t)(ab ? pr->out : pr->in) * rank;
                float *x = (float *)(ab ? pr->b : pr->a);
                td_rng r;
                td_rng_stream(&r, seed, t);
                for (size_t i = 0; i < n; i++) x[i] = (float)(std * td_rng_normal(&r));
            }
        }
    int rc = td_lora_save(lo, cfg, dir, base_model, command, err);
    td_lora_free(lo);
    return rc;
}
