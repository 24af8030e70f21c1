/* Joining the run files of --shard K/N jobs into one (tidal-merge). */
#include "tidal/diff.h"
#include "tidal/runschema.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Attributes every shard must share (anything else about the run is in them too). */
static const char *SAME_ATTRS[] = {"tool", "model_fingerprint", "recipe_a", "recipe_b", "sampling",
                                   "seed_str", "batch", "score_prompt", "mode", "prompts_file",
                                   "lora_path", "lora_mode_a", "lora_mode_b"};
/* Attributes copied from the first shard. */
static const char *COPY_ATTRS[] = {"tool", "model_path", "model_fingerprint", "recipe_a", "recipe_b",
                                   "recipe_a_name", "recipe_b_name", "sampling", "seed_str", "batch",
                                   "score_prompt", "mode", "prompts_file", "lora_path", "lora_mode_a", "lora_mode_b",
                                   "device", "eos_token_ids", "config_unknown_keys"};
/* Numeric attributes copied from the first shard when present (the same adapter and recipes
 * give every shard the same merge). */
static const char *COPY_F64_ATTRS[] = {"lora_survival_a", "lora_changed_frac_a", "lora_aligned_a",
                                       "lora_survival_b", "lora_changed_frac_b", "lora_aligned_b"};

/* The rows of group g of the files joined so far: what a reference into g is shifted by. */
static int64_t base_for(const td_colspec *c, const int64_t base[TD_GROUP_COUNT])
{
    for (int g = 0; c->refers_to && g < TD_GROUP_COUNT; g++)
        if (!strcmp(c->refers_to, td_schema_groups[g].name)) return base[g];
    return 0;
}

/* Copies one column of `in` (rows [0, rows)) to `out`, shifting row references. */
static int copy_column(td_runfile *in, td_runfile *out, const td_colspec *c, int64_t rows,
                       const int64_t base[TD_GROUP_COUNT], td_error *err)
{
    const char *path = c->path;
    td_coltype type = c->type;
    if (rows == 0) return td_runfile_append(out, path, type, 1, NULL, 0, err);
    void *buf = td_xmalloc((size_t)rows * 8);
    int rc = td_runfile_read(in, path, type, 0, rows, buf, err);
    int64_t shift = base_for(c, base);
    if (rc == 0 && shift && type == TD_COL_I64)
        for (int64_t i = 0; i < rows; i++) ((int64_t *)buf)[i] += shift;
    if (rc == 0) rc = td_runfile_append(out, path, type, 1, buf, (size_t)rows, err);
    free(buf);
    return rc;
}

/* Optional columns (/tokens/logp_trainer, /text and its /seqs offsets) are joined when every
 * part has them; a column some parts lack is left out, with a warning. */
static int in_every(td_runfile *const *in, int n, const char *const *inputs, const char *path)
{
    int have = 0;
    for (int i = 0; i < n; i++) have += td_runfile_exists(in[i], path) != 0;
    if (have && have < n)
        fprintf(stderr, "tidal-merge: warning: %s is in %d of the %d parts (%s %s it): left out\n", path, have, n,
                inputs[0], td_runfile_exists(in[0], path) ? "has" : "lacks");
    return have == n;
}

/* Did the part finish? Its /progress must hold every batch it planned (files written before
 * tidal recorded batches_planned cannot tell, and pass). */
static int part_finished(td_runfile *in, const char *path, td_error *err)
{
    int64_t planned;
    if (td_runfile_get_i64(in, "batches_planned", &planned, NULL)) return 0;
    int64_t done = td_runfile_rows(in, td_schema_progress[TD_PRG_BATCH].path);
    if (done != planned)
        return td_fail(err, "%s: holds %lld of its %lld batches: the shard did not finish (finish it with "
                       "tidal-diff --resume, or merge anyway with --allow-partial)", path, (long long)done, (long long)planned);
    return 0;
}

int td_runfile_merge(const char *out_path, const char *const *inputs, int n, const char *command_line,
                     int force, int allow_partial, td_error *err)
{
    if (n < 1) return td_fail(err, "tidal-merge: no input files");
    td_runfile **in = td_xcalloc((size_t)n, sizeof *in);
    td_runfile *out = NULL;
    char tmp_path[4200] = "";
    int rc = -1;
    char *first[sizeof SAME_ATTRS / sizeof SAME_ATTRS[0]] = {0};
    for (int i = 0; i < n; i++) {
        in[i] = td_runfile_open(inputs[i], 0, err);
        if (!in[i]) goto done;
        for (size_t a = 0; a < sizeof SAME_ATTRS / sizeof SAME_ATTRS[0]; a++) {
            td_error e2;
            char *v = td_runfile_get_str(in[i], SAME_ATTRS[a], &e2);
            if (i == 0) { first[a] = v; continue; }
            int same = (!v && !first[a]) || (v && first[a] && !strcmp(v, first[a]));
            free(v);
            if (!same) { td_fail(err, "%s: its %s differs from %s's: not shards of one run", inputs[i], SAME_ATTRS[a], inputs[0]); goto done; }
        }
        /* the same device kind and GPU model (cuda:0 and cuda:1 of one machine may share a run) */
        td_error e3;
        char *d0 = td_runfile_get_str(in[0], "device", &e3), *di = td_runfile_get_str(in[i], "device", &e3);
        int same_dev = !strcmp(td_diff_device_key(d0 ? d0 : "cpu"), td_diff_device_key(di ? di : "cpu"));
        if (!same_dev)
            td_fail(err, "%s: made on %s, %s on %s: the devices' kernels give other numbers, not shards of one run",
                    inputs[i], di ? di : "cpu", inputs[0], d0 ? d0 : "cpu");
        free(d0);
        free(di);
        if (!same_dev) goto done;
    }
    /* parts of one split: the same N, each K once, every K there, each finished */
    int shard_n = -1;
    unsigned char *seen = NULL;
    char partial[1024] = "";
    for (int i = 0; i < n; i++) {
        td_error e2;
        char *sh = td_runfile_get_str(in[i], "shard", &e2);
        int k = -1, nn = -1;
        int ok = sh && sscanf(sh, "%d/%d", &k, &nn) == 2 && nn >= 1 && k >= 0 && k < nn;
        free(sh);
        if (!ok) { free(seen); td_fail(err, "%s: no shard K/N attribute (not a tidal-diff --shard part)", inputs[i]); goto done; }
        if (shard_n < 0) { shard_n = nn; seen = td_xcalloc((size_t)nn, 1); }
        if (nn != shard_n) { free(seen); td_fail(err, "%s: shard %d/%d, but %s is a part of %d", inputs[i], k, nn, inputs[0], shard_n); goto done; }
        if (seen[k]++) { free(seen); td_fail(err, "%s: shard %d/%d given twice", inputs[i], k, nn); goto done; }
        td_error e3;
        if (part_finished(in[i], inputs[i], &e3)) {
            if (!allow_partial) { free(seen); *err = e3; goto done; }
            fprintf(stderr, "tidal-merge: warning: %s\n", e3.msg);
            size_t l = strlen(partial);
            snprintf(partial + l, sizeof partial - l, "%sshard %d/%d unfinished", l ? "; " : "", k, nn);
        }
    }
    char missing[512] = "";
    int n_missing = 0;
    for (int k = 0; k < shard_n; k++)
        if (!seen[k]) {
            size_t l = strlen(missing);
            if (l < sizeof missing - 16) snprintf(missing + l, sizeof missing - l, "%s%d", n_missing ? "," : "", k);
            n_missing++;
        }
    free(seen);
    if (n_missing) {
        if (!allow_partial) {
            td_fail(err, "shard%s %s of %d missing: the parts cover %d of %d shards (give every part, or merge a "
                    "subset on purpose with --allow-partial)", n_missing > 1 ? "s" : "", missing, shard_n,
                    shard_n - n_missing, shard_n);
            goto done;
        }
        fprintf(stderr, "tidal-merge: warning: shard%s %s of %d missing (--allow-partial)\n", n_missing > 1 ? "s" : "", missing, shard_n);
        size_t l = strlen(partial);
        snprintf(partial + l, sizeof partial - l, "%sshard%s %s of %d missing", l ? "; " : "", n_missing > 1 ? "s" : "", missing, shard_n);
    }
    if (!force && access(out_path, F_OK) == 0) {
        td_fail(err, "%s: already exists; not replacing it (use --force to replace it)", out_path);
        goto done;
    }
    /* written beside it and renamed when complete: a failed merge keeps what was there */
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", out_path);
    out = td_runfile_create(tmp_path, 1, err);
    if (!out) goto done;
    if (td_runfile_set_str(out, "partial", partial, err)) goto done;
    for (size_t a = 0; a < sizeof COPY_ATTRS / sizeof COPY_ATTRS[0]; a++) {
        td_error e2;
        char *v = td_runfile_get_str(in[0], COPY_ATTRS[a], &e2);
        if (v && td_runfile_set_str(out, COPY_ATTRS[a], v, err)) { free(v); goto done; }
        free(v);
    }
    int64_t seed = 0;
    if (td_runfile_get_i64(in[0], "seed", &seed, NULL) == 0 && td_runfile_set_i64(out, "seed", seed, err)) goto done;
    for (size_t a = 0; a < sizeof COPY_F64_ATTRS / sizeof COPY_F64_ATTRS[0]; a++) {
        double v;
        if (td_runfile_get_f64(in[0], COPY_F64_ATTRS[a], &v, NULL) == 0 && td_runfile_set_f64(out, COPY_F64_ATTRS[a], v, err)) goto done;
    }
    size_t len = 64;
    for (int i = 0; i < n; i++) len += strlen(inputs[i]) + 2;
    char *joined = td_xmalloc(len), *cmds = NULL;
    snprintf(joined, len, "merged from %d shards", n);
    if (td_runfile_set_str(out, "shard", joined, err) || td_runfile_set_str(out, "command_line", command_line ? command_line : "", err)) { free(joined); goto done; }
    /* the shards' own command lines, one per line */
    size_t clen = 1;
    for (int i = 0; i < n; i++) { td_error e2; char *c = td_runfile_get_str(in[i], "command_line", &e2); clen += (c ? strlen(c) : 0) + 1; free(c); }
    cmds = td_xcalloc(clen, 1);
    for (int i = 0; i < n; i++) { td_error e2; char *c = td_runfile_get_str(in[i], "command_line", &e2); if (c) { strcat(cmds, c); strcat(cmds, "\n"); } free(c); }
    int bad = td_runfile_set_str(out, "source_command_lines", cmds, err);
    free(joined); free(cmds);
    if (bad) goto done;
    int64_t base[TD_GROUP_COUNT] = {0};
    unsigned char keep[TD_GROUP_COUNT][TD_TOK_COUNT + TD_SEQ_COUNT];   /* more than any group's columns */
    for (int g = 0; g < TD_GROUP_COUNT; g++)
        for (int c = 0; c < td_schema_groups[g].n_cols; c++) {
            const td_colspec *col = &td_schema_groups[g].cols[c];
            keep[g][c] = !col->optional || in_every(in, n, inputs, col->path);
        }
    for (int i = 0; i < n; i++) {
        int64_t rows[TD_GROUP_COUNT];
        for (int g = 0; g < TD_GROUP_COUNT; g++) rows[g] = td_runfile_rows(in[i], td_schema_groups[g].count_col->path);
        for (int g = 0; g < TD_GROUP_COUNT; g++)
            for (int c = 0; c < td_schema_groups[g].n_cols; c++) {
                const td_colspec *col = &td_schema_groups[g].cols[c];
                if (!keep[g][c]) continue;
                if (copy_column(in[i], out, col, rows[g], base, err)) goto done;
            }
        for (int g = 0; g < TD_GROUP_COUNT; g++) base[g] += rows[g];
        fprintf(stderr, "tidal-merge: %s: %lld sequences, %lld tokens\n", inputs[i], (long long)rows[TD_GROUP_SEQS],
                (long long)rows[TD_GROUP_TOKENS]);
    }
    rc = td_runfile_flush(out, err);
done:
    for (size_t a = 0; a < sizeof first / sizeof first[0]; a++) free(first[a]);
    for (int i = 0; i < n; i++) if (in[i]) td_runfile_close(in[i], NULL);
    free(in);
    if (out && td_runfile_close(out, rc ? NULL : err)) rc = -1;
    if (out && rc == 0 && td_runfile_replace(tmp_path, out_path) != 0)
        rc = td_fail(err, "%s: cannot rename %s to it: %s", out_path, tmp_path, strerror(errno));
    if (rc && tmp_path[0]) td_runfile_remove(tmp_path);   /* a create that failed may have left it too */
    return rc;
}
