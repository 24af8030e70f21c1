/* tidal — a trainer's resumable state (include/tidal/train.h: td_trainer_save_state /
 * td_trainer_load_state): every trained tensor's fp32 master and both AdamW moments as one
 * safetensors file, with the optimiser step, the skipped-step count and the GradScaler state in
 * its metadata, so a run continued from it takes exactly the steps the uninterrupted run takes
 * (the masters are kept in fp32 whatever dtype the checkpoint beside it stores).
 *
 *   param.<name>  exp_avg.<name>  exp_avg_sq.<name>    F32, the tensor's shape
 *   metadata: tidal_state_step, tidal_state_skipped, tidal_state_scale (%.17g, exact),
 *             tidal_state_growth_tracker, tidal_state_recipe, tidal_state_lora_r
 */
#include "train_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const PART[3] = {"param", "exp_avg", "exp_avg_sq"};

static float *part_buf(const td_trainer *tr, int k)
{
    return k == 0 ? tr->params : k == 1 ? tr->m1 : tr->m2;
}

int td_trainer_save_state(const td_trainer *tr, const char *path, td_error *err)
{
    td_st_writer *w = td_st_writer_new(path);
    char v[64], name[200];
    int rc = -1;
    snprintf(v, sizeof v, "%d", tr->step);
    if (td_st_writer_meta(w, "tidal_state_step", v, err)) goto out;
    snprintf(v, sizeof v, "%ld", tr->skipped);
    if (td_st_writer_meta(w, "tidal_state_skipped", v, err)) goto out;
    snprintf(v, sizeof v, "%.17g", tr->scaler.scale);
    if (td_st_writer_meta(w, "tidal_state_scale", v, err)) goto out;
    snprintf(v, sizeof v, "%d", tr->scaler.growth_tracker);
    if (td_st_writer_meta(w, "tidal_state_growth_tracker", v, err)) goto out;
    snprintf(v, sizeof v, "%d", tr->lora ? tr->lora->rank : 0);
    if (td_st_writer_meta(w, "tidal_state_lora_r", v, err) ||
        td_st_writer_meta(w, "tidal_state_recipe", tr->recipe.name, err))
        goto out;
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < tr->ntensors; i++) {
            snprintf(name, sizeof name, "%s.%s", PART[k], tr->tensors[i].name);
            if (td_st_writer_declare(w, name, TD_DT_F32, tr->tensors[i].ndim, tr->tensors[i].shape, err))
                goto out;
        }
    if (td_st_writer_begin(w, err)) goto out;
    train_state_to_host(tr);   /* a device's masters and moments */
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < tr->ntensors; i++) {
            snprintf(name, sizeof name, "%s.%s", PART[k], tr->tensors[i].name);
            if (td_st_writer_write_f32(w, name, part_buf(tr, k) + tr->tensors[i].offset,
                                       tr->tensors[i].numel, err))
                goto out;
        }
    rc = td_st_writer_finish(w, err);
out:
    td_st_writer_free(w);
    return rc;
}

static int meta_num(const td_checkpoint *ck, const char *path, const char *key, double *out, td_error *err)
{
    const char *s = td_checkpoint_metadata(ck, key);
    char *end = NULL;
    if (s) *out = strtod(s, &end);
    if (!s || end == s || *end)
        return td_fail(err, "%s: metadata %s is %s (not a trainer state file?)", path, key,
                       s ? "not a number" : "missing");
    return 0;
}

int td_trainer_load_state(td_trainer *tr, const char *path, td_error *err)
{
    td_checkpoint *ck = td_checkpoint_open(path, err);
    if (!ck) return -1;
    int rc = -1;
    double step, skipped, scale, tracker, lora_r;
    if (meta_num(ck, path, "tidal_state_step", &step, err) ||
        meta_num(ck, path, "tidal_state_skipped", &skipped, err) ||
        meta_num(ck, path, "tidal_state_scale", &scale, err) ||
        meta_num(ck, path, "tidal_state_growth_tracker", &tracker, err) ||
        meta_num(ck, path, "tidal_state_lora_r", &lora_r, err))
        goto out;
    int r = tr->lora ? tr->lora->rank : 0;
    if ((int)lora_r != r) {
        td_fail(err, "%s: state of a run with LoRA rank %d, this run has %d", path, (int)lora_r, r);
        goto out;
    }
    if (td_checkpoint_num_tensors(ck) != 3 * tr->ntensors) {
        td_fail(err, "%s: %zu tensors, a state of this model holds %zu", path,
                td_checkpoint_num_tensors(ck), 3 * tr->ntensors);
        goto out;
    }
    char name[200];
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < tr->ntensors; i++) {
            const train_tensor *t = &tr->tensors[i];
            size_t bad = 0;
            snprintf(name, sizeof name, "%s.%s", PART[k], t->name);
            if (td_checkpoint_read_f32(ck, name, t->ndim, t->shape, part_buf(tr, k) + t->offset, &bad, err))
                goto out;
            if (bad) {
                td_fail(err, "%s: %s holds %zu non-finite values", path, name, bad);
                goto out;
            }
        }
    tr->step = (int)step;
    tr->skipped = (long)skipped;
    if (tr->scaler.on) {
        tr->scaler.scale = scale;
        tr->scaler.growth_tracker = (int)tracker;
    }
    train_zero_grads(tr);
    train_state_to_device(tr);
    rc = td_forward_set_recipe_lora(tr->f, &tr->recipe, tr->lora, 0, err);
out:
    td_checkpoint_close(ck);
    return rc;
}

void td_trainer_token_accuracy(td_trainer *tr, long *correct, long *total, int reset)
{
    if (correct) *correct = tr->acc_correct;
    if (total) *total = tr->acc_total;
    if (reset) tr->acc_correct = tr->acc_total = 0;
}
