/* tidal — the trainer's optimiser state on disk, for resuming (include/tidal/train.h). */
#include "train_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char MAGIC[8] = {'T', 'D', 'T', 'R', 'S', 'T', '0', '1'};

typedef struct {
    char magic[8];
    uint64_t nparams;
    int64_t step, skipped;
    double scale;
    int64_t growth_tracker;
} state_header;

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

void td_trainer_set_temperature(td_trainer *tr, float T) { td_forward_set_temperature(tr->f, T); }

int td_trainer_save_state(const td_trainer *tr, const char *path, td_error *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return td_fail(err, "%s: cannot write (does the folder exist and is it writable?)", tmp);
    state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, MAGIC, 8);
    h.nparams = tr->nparams;
    h.step = tr->step;
    h.skipped = tr->skipped;
    h.scale = tr->scaler.scale;
    h.growth_tracker = tr->scaler.growth_tracker;
    uint64_t sum = fnv1a(14695981039346656037ull, &h, sizeof h);
    const float *arr[3] = {tr->params, tr->m1, tr->m2};
    int ok = fwrite(&h, sizeof h, 1, f) == 1;
    for (int i = 0; i < 3 && ok; i++) {
        ok = fwrite(arr[i], sizeof(float), tr->nparams, f) == tr->nparams;
        sum = fnv1a(sum, arr[i], tr->nparams * sizeof(float));
    }
    ok = ok && fwrite(&sum, sizeof sum, 1, f) == 1;
    if (fclose(f) || !ok || rename(tmp, path)) {
        remove(tmp);
        return td_fail(err, "%s: write failed (disk full?)", path);
    }
    return 0;
}

int td_trainer_load_state(td_trainer *tr, const char *path, td_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open the trainer state", path);
    state_header h;
    int rc = -1;
    float *buf = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, MAGIC, 8)) {
        td_fail(err, "%s: not a tidal trainer state (magic)", path);
        goto done;
    }
    if (h.nparams != tr->nparams) {
        td_fail(err, "%s: %llu trained parameters, this trainer has %zu (another model, or LoRA "
                "settings?)", path, (unsigned long long)h.nparams, tr->nparams);
        goto done;
    }
    buf = td_xmalloc(3 * tr->nparams * sizeof(float));
    uint64_t sum = fnv1a(14695981039346656037ull, &h, sizeof h), stored;
    if (fread(buf, sizeof(float), 3 * tr->nparams, f) != 3 * tr->nparams ||
        fread(&stored, sizeof stored, 1, f) != 1) {
        td_fail(err, "%s: truncated trainer state", path);
        goto done;
    }
    sum = fnv1a(sum, buf, 3 * tr->nparams * sizeof(float));
    if (sum != stored) {
        td_fail(err, "%s: checksum mismatch (corrupt trainer state)", path);
        goto done;
    }
    memcpy(tr->params, buf, tr->nparams * sizeof(float));
    memcpy(tr->m1, buf + tr->nparams, tr->nparams * sizeof(float));
    memcpy(tr->m2, buf + 2 * tr->nparams, tr->nparams * sizeof(float));
    memset(tr->grads, 0, tr->nparams * sizeof(float));
    tr->step = (int)h.step;
    tr->skipped = (long)h.skipped;
    if (tr->scaler.on) {
        tr->scaler.scale = h.scale;
        tr->scaler.growth_tracker = (int)h.growth_tracker;
    }
    rc = td_forward_set_recipe_lora(tr->f, &tr->recipe, tr->lora, 0, err);
done:
    free(buf);
    fclose(f);
    return rc;
}
