/* Loads a run file's token columns for analysis (include/tidal/analysis.h), through the
 * td_runfile layer. Every way a file can be wrong ends in a message naming the file. */
#include "tidal/analysis.h"
#include "tidal/runschema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Deflate cannot compress better than about 1032:1, so a dataset claiming more decoded bytes
 * than 1032 × the file size is lying; refuse before allocating for it. */
static const double MAX_DEFLATE_RATIO = 1032.0;

static void *alloc_rows(td_runfile *rf, const char *name, size_t n, size_t elem, double file_bytes,
                        td_error *err)
{
    if (n > SIZE_MAX / elem || (double)n * (double)elem > file_bytes * MAX_DEFLATE_RATIO) {
        td_fail(err, "%s: %s claims %zu rows, more than the file (%.0f bytes) can hold", td_runfile_path(rf),
                name, n, file_bytes);
        return NULL;
    }
    size_t bytes = n * elem;
    void *p = malloc(bytes ? bytes : 1);
    if (!p) td_fail(err, "%s: out of memory for %s (%zu rows)", td_runfile_path(rf), name, n);
    return p;
}

/* Reads a 1-D column of exactly n rows; required = 0 returns NULL quietly if it is absent. */
static void *read_col(td_runfile *rf, const td_colspec *c, size_t n, double file_bytes, int required,
                      int *failed, td_error *err)
{
    const char *name = c->path;
    td_coltype type = c->type;
    size_t elem = td_coltype_size(type);
    if (*failed) return NULL;
    if (!td_runfile_exists(rf, name)) {
        if (required) {
            td_fail(err, "%s: missing dataset %s (is this a complete tidal-diff run?)", td_runfile_path(rf), name);
            *failed = 1;
        }
        return NULL;
    }
    int64_t rows = td_runfile_rows(rf, name);
    size_t w = td_runfile_width(rf, name);
    if (w != 1 || rows < 0 || (size_t)rows != n) {
        td_fail(err, "%s: %s has %lld rows x %zu, expected %zu rows x 1 (as %s)", td_runfile_path(rf),
                name, (long long)rows, w, n, td_schema_tokens[TD_TOK_LOGP_A].path);
        *failed = 1;
        return NULL;
    }
    void *p = alloc_rows(rf, name, n, elem, file_bytes, err);
    if (!p || td_runfile_read(rf, name, type, 0, (int64_t)n, p, err)) {
        free(p);
        *failed = 1;
        return NULL;
    }
    return p;
}

static char *attr_or_empty(td_runfile *rf, const char *name)
{
    char *s = td_runfile_get_str(rf, name, NULL);
    if (!s) { s = malloc(1); s[0] = 0; }
    return s;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = td_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

/* Prompt + response ids per sequence, for decoded text. Optional: any inconsistency leaves
 * ids NULL (the report then prints token ids) rather than failing the whole analysis. */
static void load_ids(td_run *run, td_runfile *rf, double file_bytes)
{
    int64_t nr = td_runfile_rows(rf, td_schema_prompts[TD_PRM_TOKENS].path);
    if (nr <= 0 || td_runfile_rows(rf, td_schema_seqs[TD_SEQ_TOKENS_OFFSET].path) != (int64_t)run->nseq ||
        td_runfile_rows(rf, td_schema_seqs[TD_SEQ_PROMPT_LEN].path) != (int64_t)run->nseq ||
        td_runfile_rows(rf, td_schema_seqs[TD_SEQ_RESPONSE_LEN].path) != (int64_t)run->nseq)
        return;
    int failed = 0;
    size_t ns = run->nseq;
    int64_t *off = read_col(rf, &td_schema_seqs[TD_SEQ_TOKENS_OFFSET], ns, file_bytes, 1, &failed, NULL);
    int32_t *pl = read_col(rf, &td_schema_seqs[TD_SEQ_PROMPT_LEN], ns, file_bytes, 1, &failed, NULL);
    int32_t *rl = read_col(rf, &td_schema_seqs[TD_SEQ_RESPONSE_LEN], ns, file_bytes, 1, &failed, NULL);
    int32_t *ids = read_col(rf, &td_schema_prompts[TD_PRM_TOKENS], (size_t)nr, file_bytes, 1, &failed, NULL);
    for (size_t s = 0; !failed && s < ns; s++) {
        int64_t len = (int64_t)pl[s] + rl[s];
        if (pl[s] < 0 || rl[s] < 0 || len > INT32_MAX || off[s] < 0 || off[s] + len > nr) failed = 1;
        else rl[s] = (int32_t)len;
    }
    if (failed) { free(off); free(pl); free(rl); free(ids); return; }
    run->ids = ids;
    run->n_ids = (size_t)nr;
    run->ids_offset = off;
    run->seq_len = rl;
    run->prompt_len = pl;
}

/* The prompt and response text the run stored (/text): optional, as the ids are; any
 * inconsistency leaves text NULL. */
static void load_text(td_run *run, td_runfile *rf, double file_bytes)
{
    const td_colspec *off_c = &td_schema_seqs[TD_SEQ_TEXT_OFFSET], *pl_c = &td_schema_seqs[TD_SEQ_PROMPT_TEXT_LEN];
    const td_colspec *rl_c = &td_schema_seqs[TD_SEQ_RESPONSE_TEXT_LEN], *txt_c = &td_schema_text[TD_TXT_UTF8];
    int64_t nt = td_runfile_rows(rf, txt_c->path);
    if (nt < 0 || !td_runfile_exists(rf, txt_c->path) || run->nseq == 0) return;
    int failed = 0;
    size_t ns = run->nseq;
    int64_t *off = read_col(rf, off_c, ns, file_bytes, 1, &failed, NULL);
    int32_t *pl = read_col(rf, pl_c, ns, file_bytes, 1, &failed, NULL);
    int32_t *rl = read_col(rf, rl_c, ns, file_bytes, 1, &failed, NULL);
    char *text = read_col(rf, txt_c, (size_t)nt, file_bytes, 1, &failed, NULL);
    for (size_t s = 0; !failed && s < ns; s++)
        if (off[s] < 0 || pl[s] < 0 || rl[s] < 0 || off[s] + pl[s] + rl[s] > nt) failed = 1;
    if (failed) { free(off); free(pl); free(rl); free(text); return; }
    run->text = text;
    run->n_text = (size_t)nt;
    run->text_offset = off;
    run->prompt_text_len = pl;
    run->response_text_len = rl;
}

static int load_once(td_run *run, const char *path, int flags, td_error *err);

/* A file that its writer commits to while we read it: a load that failed while the file changed
 * is tried again (td_runfile_changed); commits come every batch or step, so a few tries do. */
int td_run_load(td_run *run, const char *path, int flags, td_error *err)
{
    for (int attempt = 0;; attempt++) {
        td_runfile_stamp stamp;
        td_runfile_stamp_take(path, &stamp);
        if (load_once(run, path, flags, err) == 0) return 0;
        if (attempt == 20 || !td_runfile_changed(path, &stamp)) return -1;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
}

static int load_once(td_run *run, const char *path, int flags, td_error *err)
{
    memset(run, 0, sizeof *run);
    td_runfile *rf = td_runfile_open(path, 0, err);
    if (!rf) return -1;
    struct stat st;
    double file_bytes = stat(path, &st) == 0 ? (double)st.st_size : 0;
    run->path = xstrdup(path);
    run->recipe_a = attr_or_empty(rf, "recipe_a_name");
    run->recipe_b = attr_or_empty(rf, "recipe_b_name");
    run->model_path = attr_or_empty(rf, "model_path");
    char *mode = attr_or_empty(rf, "mode");
    run->replay = strcmp(mode, "replay") == 0;
    free(mode);
    if (run->replay) {          /* B did not run: the recorded rollouts stand in its place */
        char *fmt = attr_or_empty(rf, "rollout_format");
        size_t len = strlen(fmt) + 40;
        free(run->recipe_b);
        run->recipe_b = td_xmalloc(len);
        snprintf(run->recipe_b, len, "%s%srollouts (replay)", fmt, fmt[0] ? " " : "recorded ");
        free(fmt);
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (run->recipe_a[0] && run->recipe_b[0]) {
        size_t len = strlen(run->recipe_a) + strlen(run->recipe_b) + 8;
        run->label = td_xmalloc(len);
        snprintf(run->label, len, "%s vs %s", run->recipe_a, run->recipe_b);
    } else {
        run->label = xstrdup(base);
    }

    if (!td_runfile_exists(rf, td_schema_tokens[TD_TOK_LOGP_A].path) &&
        td_runfile_rows(rf, td_schema_progress[TD_PRG_BATCH].path) == 0 && !td_runfile_exists(rf, TD_SCHEMA_STEPS)) {
        td_fail(err, "%s: empty run: no batch or step is committed yet (a run being written: try again later)", path);
        goto fail;
    }
    if (!td_runfile_exists(rf, td_schema_tokens[TD_TOK_LOGP_A].path)) {
        td_fail(err, "%s: missing dataset %s (is this a complete tidal-diff run?)", path, td_schema_tokens[TD_TOK_LOGP_A].path);
        goto fail;
    }
    int64_t rows = td_runfile_rows(rf, td_schema_tokens[TD_TOK_LOGP_A].path);
    if (rows <= 0) {
        td_fail(err, "%s: empty run: /tokens holds no scored tokens (did tidal-diff finish a batch?)", path);
        goto fail;
    }
    size_t n = run->n = (size_t)rows;
    int failed = 0;
    run->seq = read_col(rf, &td_schema_tokens[TD_TOK_SEQ], n, file_bytes, 1, &failed, err);
    run->pos = read_col(rf, &td_schema_tokens[TD_TOK_POS], n, file_bytes, 1, &failed, err);
    int full = !(flags & TD_RUN_PLOT);
    if (full) run->token = read_col(rf, &td_schema_tokens[TD_TOK_TOKEN], n, file_bytes, 1, &failed, err);
    run->logp_a = read_col(rf, &td_schema_tokens[TD_TOK_LOGP_A], n, file_bytes, 1, &failed, err);
    run->logp_b = read_col(rf, &td_schema_tokens[TD_TOK_LOGP_B], n, file_bytes, 1, &failed, err);
    run->kl_ba = read_col(rf, &td_schema_tokens[TD_TOK_KL_BA], n, file_bytes, 1, &failed, err);
    run->dlogp = read_col(rf, &td_schema_tokens[TD_TOK_DLOGP], n, file_bytes, 0, &failed, err);
    if (full) {
        run->k3 = read_col(rf, &td_schema_tokens[TD_TOK_K3], n, file_bytes, 0, &failed, err);
        run->tv = read_col(rf, &td_schema_tokens[TD_TOK_TV], n, file_bytes, 0, &failed, err);
        run->entropy_a = read_col(rf, &td_schema_tokens[TD_TOK_ENTROPY_A], n, file_bytes, 0, &failed, err);
        run->is_prompt = read_col(rf, &td_schema_tokens[TD_TOK_IS_PROMPT], n, file_bytes, 0, &failed, err);
    }
    run->step = read_col(rf, &td_schema_tokens[TD_TOK_STEP], n, file_bytes, 0, &failed, err);
    if (full) run->logp_trainer = read_col(rf, &td_schema_tokens[TD_TOK_LOGP_TRAINER], n, file_bytes, 0, &failed, err);
    if (failed) goto fail;
    /* Columns a writer may leave out are derived (dlogp, k3) or filled with "unknown". */
    if (!run->dlogp) {
        run->dlogp = td_xmalloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) run->dlogp[i] = run->logp_b[i] - run->logp_a[i];
    }
    if (!full) goto columns_done;
    if (!run->k3) {
        run->k3 = td_xmalloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            double r = run->logp_a[i] - run->logp_b[i];
            run->k3[i] = expm1(r) - r;
        }
    }
    if (!run->tv) { run->tv = td_xmalloc(n * sizeof(double)); for (size_t i = 0; i < n; i++) run->tv[i] = NAN; }
    if (!run->entropy_a) {
        run->entropy_a = td_xmalloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) run->entropy_a[i] = NAN;
    }
    if (!run->is_prompt) run->is_prompt = td_xcalloc(n, 1);
columns_done:;

    int64_t nseq_file = td_runfile_rows(rf, td_schema_seqs[TD_SEQ_PROMPT_LEN].path);
    int64_t max_seq = -1;
    run->max_pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (run->seq[i] < 0 || (nseq_file > 0 && run->seq[i] >= nseq_file)) {
            td_fail(err, "%s: /tokens/seq[%zu] = %lld is not a row of /seqs (%lld rows)", path, i,
                    (long long)run->seq[i], (long long)nseq_file);
            goto fail;
        }
        if (run->pos[i] < 0) {
            td_fail(err, "%s: /tokens/pos[%zu] = %d is negative", path, i, run->pos[i]);
            goto fail;
        }
        if (run->seq[i] > max_seq) max_seq = run->seq[i];
        if (run->pos[i] > run->max_pos) run->max_pos = run->pos[i];
    }
    run->nseq = nseq_file > 0 ? (size_t)nseq_file : (size_t)(max_seq + 1);
    if (nseq_file <= 0 && (double)run->nseq > (double)n) {
        td_fail(err, "%s: /tokens/seq reaches %lld with only %zu tokens and no /seqs group", path,
                (long long)max_seq, n);
        goto fail;
    }

    if (!run->step) {   /* files written before /tokens/step: from /seqs/prompt_len when there */
        run->step = td_xmalloc(n * sizeof(int32_t));
        int32_t *pl = NULL;
        if (nseq_file > 0 && td_runfile_rows(rf, td_schema_seqs[TD_SEQ_PROMPT_LEN].path) == nseq_file)
            pl = read_col(rf, &td_schema_seqs[TD_SEQ_PROMPT_LEN], (size_t)nseq_file, file_bytes, 0, &failed, err);
        if (failed) goto fail;
        for (size_t i = 0; i < n; i++) run->step[i] = run->pos[i] - (pl ? pl[run->seq[i]] : 0);
        free(pl);
    }

    if ((flags & TD_RUN_LAYERS) && td_runfile_exists(rf, td_schema_layers_rel_err.path)) {
        size_t L = td_runfile_width(rf, td_schema_layers_rel_err.path);
        int64_t lr = td_runfile_rows(rf, td_schema_layers_rel_err.path);
        if (L > 4096) {  // pictures and tables hold one row per layer: a corrupt width would not fit
            td_fail(err, "%s: /layers/rel_err has %zu columns; expected one per layer (at most 4096)", path, L);
            goto fail;
        }
        if (lr != rows || L < 1) {
            td_fail(err, "%s: /layers/rel_err has %lld rows, expected %zu (one per /tokens row)", path,
                    (long long)lr, n);
            goto fail;
        }
        if (n > SIZE_MAX / L) { td_fail(err, "%s: /layers/rel_err too large", path); goto fail; }
        run->layer_err = alloc_rows(rf, td_schema_layers_rel_err.path, n * L, sizeof(float), file_bytes, err);
        if (!run->layer_err || td_runfile_read(rf, td_schema_layers_rel_err.path, TD_COL_F32, 0, rows, run->layer_err, err))
            goto fail;
        run->n_layers = L;
    }
    if (!(flags & TD_RUN_PLOT) && td_runfile_exists(rf, td_schema_routing_flip.path)) {
        size_t Lm = td_runfile_width(rf, td_schema_routing_flip.path);
        int64_t fr = td_runfile_rows(rf, td_schema_routing_flip.path);
        if (Lm < 1 || Lm > 4096 || fr != rows) {
            td_fail(err, "%s: /routing/flip has %lld rows of %zu columns; expected %zu rows (one per /tokens row) of "
                    "one column per MoE layer (1 to 4096)", path, (long long)fr, Lm, n);
            goto fail;
        }
        run->route_flip = alloc_rows(rf, td_schema_routing_flip.path, n * Lm, 1, file_bytes, err);
        if (!run->route_flip || td_runfile_read(rf, td_schema_routing_flip.path, TD_COL_I8, 0, rows, run->route_flip, err))
            goto fail;
        run->n_moe_layers = Lm;
        td_error e2;
        char *rr = td_runfile_get_str(rf, "routing_replay", &e2);
        run->route_replay = rr && !strcmp(rr, "r3");
        free(rr);
    }
    if (full) load_ids(run, rf, file_bytes);
    if (full) load_text(run, rf, file_bytes);
    td_runfile_close(rf, NULL);
    return 0;
fail:
    td_runfile_close(rf, NULL);
    td_run_free(run);
    return -1;
}

void td_run_free(td_run *run)
{
    free(run->path); free(run->label); free(run->recipe_a); free(run->recipe_b); free(run->model_path);
    free(run->logp_a); free(run->logp_b); free(run->logp_trainer); free(run->dlogp); free(run->kl_ba); free(run->k3); free(run->tv);
    free(run->entropy_a); free(run->seq); free(run->pos); free(run->token); free(run->is_prompt); free(run->step);
    free(run->layer_err); free(run->route_flip); free(run->ids); free(run->ids_offset); free(run->seq_len); free(run->prompt_len);
    free(run->text); free(run->text_offset); free(run->prompt_text_len); free(run->response_text_len);
    memset(run, 0, sizeof *run);
}
