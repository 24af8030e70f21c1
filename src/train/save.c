/* tidal — what a trainer writes: the gradient dump (one step's fp32 gradients under HF names,
 * with the batch that produced them, so any autograd can recompute them) and checkpoints
 * (a Hugging Face model directory of the masters, or a PEFT adapter). */
#include "train_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int td_trainer_dump_grads(const td_trainer *tr, const char *path, int nseq,
                          const int *const *tokens, const int *lens, const float *const *weights,
                          int pad_id, const char *command, td_error *err)
{
    int T = 0;
    for (int s = 0; s < nseq; s++) T = lens[s] > T ? lens[s] : T;
    td_st_writer *w = td_st_writer_new(path);
    int rc = -1;
    int64_t *row = td_xmalloc((size_t)(T ? T : 1) * sizeof(int64_t));
    float *g = NULL;
    char scale[64];
    snprintf(scale, sizeof scale, "%.17g", tr->scaler.scale);
    if (td_st_writer_meta(w, "tidal_command", command ? command : "", err) ||
        td_st_writer_meta(w, "tidal_recipe", tr->recipe.name, err) ||
        td_st_writer_meta(w, "tidal_loss", "mean token cross-entropy over loss_mask targets "
                          "(sum of -log p(input_ids[t]) over loss_mask[t] = 1, divided by the "
                          "number of such targets), unless the caller's loss says otherwise", err) ||
        td_st_writer_meta(w, "tidal_loss_scale_divided_out", scale, err))
        goto out;
    for (size_t i = 0; i < tr->ntensors; i++)
        if (td_st_writer_declare(w, tr->tensors[i].name, TD_DT_F32, tr->tensors[i].ndim,
                                 tr->tensors[i].shape, err))
            goto out;
    int64_t bt[2] = {nseq, T};
    if (td_st_writer_declare(w, "input_ids", TD_DT_I64, 2, bt, err) ||
        td_st_writer_declare(w, "loss_mask", TD_DT_I64, 2, bt, err) || td_st_writer_begin(w, err))
        goto out;
    float inv = (float)(1.0 / tr->scaler.scale);   /* the gradients are held scaled */
    const float *grads = train_grads_host(tr);     /* a device's: downloaded */
    for (size_t i = 0; i < tr->ntensors; i++) {
        const train_tensor *t = &tr->tensors[i];
        const float *src = grads + t->offset;
        if (tr->scaler.on) {
            g = realloc(g, t->numel * sizeof(float));
            for (size_t k = 0; k < t->numel; k++) g[k] = src[k] * inv;
            src = g;
        }
        if (td_st_writer_write_f32(w, t->name, src, t->numel, err)) goto out;
    }
    for (int s = 0; s < nseq; s++) {   /* little-endian int64, right-padded */
        for (int t = 0; t < T; t++) row[t] = t < lens[s] ? tokens[s][t] : pad_id;
        if (td_st_writer_write_raw(w, "input_ids", row, (size_t)T * 8, err)) goto out;
    }
    for (int s = 0; s < nseq; s++) {   /* token t is a target, predicted from t - 1 */
        for (int t = 0; t < T; t++)
            row[t] = t >= 1 && t < lens[s] && (!weights || weights[s][t - 1] != 0.0f);
        if (td_st_writer_write_raw(w, "loss_mask", row, (size_t)T * 8, err)) goto out;
    }
    rc = td_st_writer_finish(w, err);
out:
    td_st_writer_free(w);
    free(row);
    free(g);
    return rc;
}

int td_trainer_save(const td_trainer *tr, const char *dir, int dtype, const char *command,
                    td_error *err)
{
    const td_config *c = &tr->m->cfg;
    if (tr->lora) return td_lora_save(tr->lora, c, dir, NULL, command, err);
    if ((unsigned)dtype >= TD_DT_COUNT)
        return td_fail(err, "%s: cannot save weights as dtype %d", dir, dtype);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    td_st_writer *w = td_st_writer_new(path);
    int rc = -1;
    if (td_st_writer_meta(w, "tidal_command", command ? command : "", err)) goto out;
    for (size_t i = 0; i < tr->nspecs; i++)
        if (td_st_writer_declare(w, tr->specs[i].name, (td_dtype)dtype, tr->specs[i].ndim,
                                 tr->specs[i].shape, err))
            goto out;
    if (td_st_writer_begin(w, err)) goto out;
    train_masters_to_host(tr);   /* a device's masters, when only it has them current */
    for (size_t i = 0; i < tr->nspecs; i++)
        if (td_st_writer_write_f32(w, tr->specs[i].name, tr->m->owned + tr->specs[i].offset,
                                   tr->specs[i].numel, err))
            goto out;
    if (td_st_writer_finish(w, err)) goto out;
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = td_config_write(path, c, err);
out:
    td_st_writer_free(w);
    return rc;
}
