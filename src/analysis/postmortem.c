/* tidal — the post-mortem's reading of a run folder: curves, events, checkpoints
 * (include/tidal/postmortem.h). */
#include "tidal/postmortem.h"
#include "tidal/runfile.h"
#include "tidal/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- the step table */

/* (step, key, value) triples gathered from any source, then laid out as a table. */
typedef struct {
    int64_t *step;
    int *key;
    double *v;
    size_t n, cap;
    char **keys;
    size_t nk, kcap;
} triples;

static int key_id(triples *t, const char *k)
{
    for (size_t i = 0; i < t->nk; i++)
        if (!strcmp(t->keys[i], k)) return (int)i;
    if (t->nk == t->kcap) {
        t->kcap = t->kcap ? 2 * t->kcap : 64;
        t->keys = td_xrealloc(t->keys, t->kcap * sizeof *t->keys);
    }
    t->keys[t->nk] = strdup(k);
    return (int)t->nk++;
}

/* HF's rewrite_logs undone: train/X -> X, eval/X -> eval_X (TensorBoard tags back to log keys). */
static void canon_key(const char *tag, char *out, size_t n)
{
    if (!strncmp(tag, "train/", 6)) snprintf(out, n, "%s", tag + 6);
    else if (!strncmp(tag, "eval/", 5)) snprintf(out, n, "eval_%s", tag + 5);
    else snprintf(out, n, "%s", tag);
}

static void add(triples *t, int64_t step, const char *key, double v)
{
    char k[256];
    canon_key(key, k, sizeof k);
    if (!strcmp(k, "step") || !strcmp(k, "global_step")) return;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->step = td_xrealloc(t->step, t->cap * sizeof *t->step);
        t->key = td_xrealloc(t->key, t->cap * sizeof *t->key);
        t->v = td_xrealloc(t->v, t->cap * sizeof *t->v);
    }
    t->step[t->n] = step;
    t->key[t->n] = key_id(t, k);
    t->v[t->n] = v;
    t->n++;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t step_index(const int64_t *s, size_t n, int64_t v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (s[m] < v) lo = m + 1;
        else hi = m;
    }
    return lo;
}

/* The table; the last value logged for a (step, key) wins (a resumed HF run logs steps again). */
static void layout(triples *t, td_pm_curves *c)
{
    int64_t *s = td_xmalloc((t->n ? t->n : 1) * sizeof *s);
    memcpy(s, t->step, t->n * sizeof *s);
    qsort(s, t->n, sizeof *s, cmp_i64);
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        if (!n || s[n - 1] != s[i]) s[n++] = s[i];
    c->n = n;
    c->step = s;
    c->nk = t->nk;
    c->key = t->keys;
    c->v = td_xmalloc((c->nk * n > 0 ? c->nk * n : 1) * sizeof(double));
    for (size_t i = 0; i < c->nk * n; i++) c->v[i] = NAN;
    for (size_t i = 0; i < t->n; i++) c->v[(size_t)t->key[i] * n + step_index(s, n, t->step[i])] = t->v[i];
    free(t->step); free(t->key); free(t->v);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- sources */

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* tidal-rl: /steps, HF's step = row + 1 */
static int read_tidal_rl(const char *path, triples *t, td_error *err)
{
    td_runfile *rf = td_runfile_open(path, 0, err);
    if (!rf) return -1;
    size_t n = td_runfile_list(rf, "/steps", NULL, 0);
    char **names = td_xcalloc(n ? n : 1, sizeof *names);
    size_t got = td_runfile_list(rf, "/steps", names, n);
    if (got < n) n = got;
    int rc = 0;
    int64_t rows = -1;
    for (size_t i = 0; i < n && !rc; i++) {
        char p[300];
        snprintf(p, sizeof p, "/steps/%s", names[i]);
        if (td_runfile_width(rf, p) != 1 || !strcmp(names[i], "step")) continue;
        int64_t r = td_runfile_rows(rf, p);
        if (r < 0 || (rows >= 0 && r != rows)) {
            rc = td_fail(err, "%s: %s has %lld rows, the other /steps columns %lld (damaged run file?)", path, p,
                         (long long)r, (long long)rows);
            break;
        }
        rows = r;
        double *v = td_xmalloc((size_t)(r ? r : 1) * sizeof(double));
        if (td_runfile_read(rf, p, TD_COL_F64, 0, r, v, err)) rc = -1;
        for (int64_t k = 0; k < r && !rc; k++) add(t, k + 1, names[i], v[k]);
        free(v);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    td_runfile_close(rf, NULL);
    return rc;
}

static void add_object(triples *t, int64_t step, json_t *o, const char *prefix)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char key[256];
        snprintf(key, sizeof key, "%s%s", prefix, k);
        if (json_is_number(v)) add(t, step, key, json_number_value(v));
        else if (json_is_null(v)) add(t, step, key, NAN);
    }
}

/* HF Trainer's trainer_state.json: {"log_history": [{"step": N, key: value...}...], ...} */
static int read_trainer_state(const char *path, triples *t, td_error *err)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return td_fail(err, "%s:%d: not valid JSON: %s", path, je.line, je.text);
    json_t *h = json_object_get(j, "log_history");
    if (!json_is_array(h)) {
        json_decref(j);
        return td_fail(err, "%s: no \"log_history\" list (HF Trainer's trainer_state.json holds one)", path);
    }
    size_t i;
    json_t *e;
    json_array_foreach(h, i, e) {
        json_t *s = json_object_get(e, "step");
        if (!json_is_object(e) || !json_is_integer(s)) {
            json_decref(j);
            return td_fail(err, "%s: log_history[%zu] has no integer \"step\"", path, i);
        }
        add_object(t, json_integer_value(s), e, "");
    }
    json_decref(j);
    return 0;
}

/* verl's file logger {"step": N, "data": {...}} or a flat {"step": N, ...} per line. */
static int read_jsonl(const char *path, triples *t, int *verl, td_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long ln = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        ln++;
        if (line[strspn(line, " \t\r\n")] == 0) continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *s = o ? json_object_get(o, "step") : NULL;
        if (!o || !json_is_object(o) || !json_is_integer(s)) {
            rc = td_fail(err, "%s:%ld: %s", path, ln, o ? "no integer \"step\"" : je.text);
            json_decref(o);
            break;
        }
        json_t *d = json_object_get(o, "data");
        if (json_is_object(d)) { *verl = 1; add_object(t, json_integer_value(s), d, ""); }
        else add_object(t, json_integer_value(s), o, "");
        json_decref(o);
    }
    free(line);
    fclose(f);
    return rc;
}

static int tb_scalar(void *ctx, int64_t step, const char *tag, double v)
{
    add(ctx, step, tag, v);
    return 0;
}

/* every events file under dir (depth <= 4), in name order per folder */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void find_events(const char *dir, int depth, char ***list, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char **names = NULL;
    size_t nn = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = td_xrealloc(names, (nn + 1) * sizeof *names);
        names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    if (nn) qsort(names, nn, sizeof *names, cmp_str);
    for (size_t i = 0; i < nn; i++) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!strncmp(names[i], "events.out.tfevents.", 20) && is_file(p)) {
            *list = td_xrealloc(*list, (*n + 1) * sizeof **list);
            (*list)[(*n)++] = strdup(p);
        } else if (depth > 0 && is_dir(p) && strncmp(names[i], "checkpoint-", 11) && strncmp(names[i], "global_step_", 12)) {
            find_events(p, depth - 1, list, n);
        }
        free(names[i]);
    }
    free(names);
}

/* the newest checkpoint-N/trainer_state.json */
static int newest_trainer_state(const char *run_dir, char *out, size_t n)
{
    DIR *d = opendir(run_dir);
    if (!d) return 0;
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long k;
        int used = 0;
        if (sscanf(e->d_name, "checkpoint-%lld%n", &k, &used) != 1 || e->d_name[used] || k <= best) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", run_dir, e->d_name);
        if (!is_file(p)) continue;
        best = k;
        snprintf(out, n, "%s", p);
    }
    closedir(d);
    return best >= 0;
}

int td_pm_read(const char *run_dir, td_pm_curves *c, td_error *err)
{
    memset(c, 0, sizeof *c);
    if (!is_dir(run_dir)) return td_fail(err, "%s: no such folder (give the run's output_dir)", run_dir);
    triples t = {0};
    char p[4400], src[4600] = "";
    const char *fmt = NULL;
    int rc = 0;
    snprintf(p, sizeof p, "%s/rl.h5", run_dir);
    if (is_file(p)) {
        fmt = "tidal-rl";
        snprintf(src, sizeof src, "%s (/steps)", p);
        rc = read_tidal_rl(p, &t, err);
    }
    if (!fmt) {
        snprintf(p, sizeof p, "%s/trainer_state.json", run_dir);
        if (is_file(p) || newest_trainer_state(run_dir, p, sizeof p)) {
            fmt = "trl";
            snprintf(src, sizeof src, "%s (HF Trainer log_history)", p);
            rc = read_trainer_state(p, &t, err);
        }
    }
    if (!fmt) {   /* JSON-lines logs at the top */
        DIR *d = opendir(run_dir);
        struct dirent *e;
        char **files = NULL;
        size_t nf = 0;
        while (d && (e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l > 6 && !strcmp(e->d_name + l - 6, ".jsonl")) {
                files = td_xrealloc(files, (nf + 1) * sizeof *files);
                files[nf++] = strdup(e->d_name);
            }
        }
        if (d) closedir(d);
        if (nf) qsort(files, nf, sizeof *files, cmp_str);
        int verl = 0;
        for (size_t i = 0; i < nf; i++) {
            snprintf(p, sizeof p, "%s/%s", run_dir, files[i]);
            if (!rc) {
                rc = read_jsonl(p, &t, &verl, err);
                size_t l = strlen(src);
                snprintf(src + l, sizeof src - l, "%s%s", l ? ", " : "", p);
            }
            free(files[i]);
        }
        free(files);
        if (nf) fmt = verl ? "verl" : "jsonl";
    }
    if (!fmt) {
        char **files = NULL;
        size_t nf = 0;
        find_events(run_dir, 4, &files, &nf);
        for (size_t i = 0; i < nf; i++) {
            if (!rc) rc = td_tfevents_read(files[i], tb_scalar, &t, err);
            free(files[i]);
        }
        free(files);
        if (nf) {
            fmt = "tensorboard";
            snprintf(src, sizeof src, "%zu TensorBoard events file%s under %s", nf, nf > 1 ? "s" : "", run_dir);
        }
    }
    if (!rc && !fmt)
        rc = td_fail(err, "%s: no run log: expected rl.h5 (tidal-rl), trainer_state.json (HF Trainer / TRL, in the "
                     "folder or a checkpoint-N/), *.jsonl (verl's file logger, tidal's metrics.jsonl) or TensorBoard "
                     "events files (events.out.tfevents.*)", run_dir);
    if (!rc && t.n == 0) rc = td_fail(err, "%s: the log holds no numeric values", src);
    if (rc) {
        for (size_t i = 0; i < t.nk; i++) free(t.keys[i]);
        free(t.keys); free(t.step); free(t.key); free(t.v);
        return -1;
    }
    /* verl's keys in a TensorBoard log */
    if (!strcmp(fmt, "tensorboard"))
        for (size_t i = 0; i < t.nk; i++)
            if (!strncmp(t.keys[i], "critic/", 7) || !strncmp(t.keys[i], "actor/", 6)) { fmt = "verl"; break; }
    c->format = strdup(fmt);
    c->source = strdup(src);
    layout(&t, c);
    return 0;
}

void td_pm_curves_free(td_pm_curves *c)
{
    for (size_t i = 0; i < c->nk; i++) free(c->key[i]);
    free(c->key); free(c->step); free(c->v); free(c->format); free(c->source);
    memset(c, 0, sizeof *c);
}

int td_pm_key(const td_pm_curves *c, const char *key)
{
    for (size_t i = 0; i < c->nk; i++)
        if (!strcmp(c->key[i], key)) return (int)i;
    return -1;
}

/* ---------------------------------------------------------------- names */

/* tidal's name, then TRL's (GRPOTrainer's _metrics keys), then verl's (trainer/ppo/metric_utils.py,
 * rollout_corr_helper.py) */
static const struct { int rlm; const char *names[6]; } ALIASES[] = {
    {TD_RLM_reward, {"reward", "critic/score/mean", "critic/rewards/mean", "rewards/mean", NULL}},
    {TD_RLM_reward_std, {"reward_std", "critic/score/std", NULL}},
    {TD_RLM_entropy, {"entropy", "actor/entropy", "entropy/mean", NULL}},
    {TD_RLM_grad_norm, {"grad_norm", "actor/grad_norm", NULL}},
    {TD_RLM_kl, {"kl", "actor/kl_loss", NULL}},
    {TD_RLM_k3_kl, {"k3_kl", "rollout_corr/k3_kl", NULL}},
    {TD_RLM_rollout_corr_kl, {"rollout_corr_kl", "rollout_corr/kl", NULL}},
    {TD_RLM_chi2_token, {"chi2_token", "rollout_corr/chi2_token", NULL}},
    {TD_RLM_rollout_is_eff_sample_size, {"rollout_is_eff_sample_size", "rollout_corr/rollout_is_eff_sample_size", NULL}},
    {TD_RLM_response_length_clip_ratio, {"response_length_clip_ratio", "completions/clipped_ratio", "response_length/clip_ratio", NULL}},
    {TD_RLM_response_length_mean, {"response_length_mean", "completions/mean_length", "response_length/mean", NULL}},
    {TD_RLM_frac_reward_zero_std, {"frac_reward_zero_std", NULL}},
    {TD_RLM_lr, {"lr", "learning_rate", "actor/lr", NULL}},
    {TD_RLM_logp_diff_mean, {"logp_diff_mean", "sampling/sampling_logp_difference/mean", NULL}},
    {TD_RLM_logp_diff_max, {"logp_diff_max", "sampling/sampling_logp_difference/max", NULL}},
    {TD_RLM_rollout_is_mean, {"rollout_is_mean", "sampling/importance_sampling_ratio/mean", "rollout_corr/rollout_is_mean", NULL}},
    {TD_RLM_rollout_is_min, {"rollout_is_min", "sampling/importance_sampling_ratio/min", "rollout_corr/rollout_is_min", NULL}},
    {TD_RLM_rollout_is_max, {"rollout_is_max", "sampling/importance_sampling_ratio/max", "rollout_corr/rollout_is_max", NULL}},
    {TD_RLM_eval_accuracy, {"eval_accuracy", NULL}},
};

int td_pm_metric_column(const td_pm_curves *c, int rlm)
{
    for (size_t a = 0; a < sizeof ALIASES / sizeof *ALIASES; a++) {
        if (ALIASES[a].rlm != rlm) continue;
        for (int i = 0; ALIASES[a].names[i]; i++) {
            int k = td_pm_key(c, ALIASES[a].names[i]);
            if (k >= 0) return k;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- events */

static void event(td_pm_events *e, const char *name, int64_t step, const char *metric, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void event(td_pm_events *e, const char *name, int64_t step, const char *metric, const char *fmt, ...)
{
    e->ev = td_xrealloc(e->ev, (e->n_ev + 1) * sizeof *e->ev);
    td_pm_event *v = &e->ev[e->n_ev++];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    snprintf(v->metric, sizeof v->metric, "%s", metric ? metric : "");
    v->step = step;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->rule, sizeof v->rule, fmt, ap);
    va_end(ap);
}

static double median_of(const double *x, size_t n)
{
    double *v = td_xmalloc((n ? n : 1) * sizeof *v);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i])) v[m++] = x[i];
    double r = NAN;
    if (m) {
        for (size_t i = 1; i < m; i++)   /* insertion sort: a few dozen values */
            for (size_t j = i; j > 0 && v[j] < v[j - 1]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
        r = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    }
    free(v);
    return r;
}

static int cmp_event(const void *a, const void *b)
{
    const td_pm_event *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

int td_pm_events_find(const td_pm_curves *c, const td_collapse_cfg *cfg, td_pm_events *e, td_error *err)
{
    memset(e, 0, sizeof *e);
    e->cfg = *cfg;
    e->drop_step = e->onset_step = -1;
    int rc = td_pm_metric_column(c, TD_RLM_reward);
    if (rc < 0) {
        char keys[600] = "";
        for (size_t i = 0; i < c->nk && strlen(keys) < 500; i++) {
            size_t l = strlen(keys);
            snprintf(keys + l, sizeof keys - l, "%s%s", i ? ", " : "", c->key[i]);
        }
        return td_fail(err, "%s: no reward in the log (looked for reward, critic/score/mean, critic/rewards/mean, "
                       "rewards/mean); it has: %s", c->source, keys[0] ? keys : "nothing");
    }
    e->reward_col = rc;
    const double *R = c->v + (size_t)rc * c->n;
    int col[TD_RLM_COUNT];
    for (int m = 0; m < TD_RLM_COUNT; m++) col[m] = td_pm_metric_column(c, m);
    /* the detector over the rows with a reward (HF logs every logging_steps: a row is a logged step) */
    td_collapse *d = td_collapse_new(cfg);
    size_t *row_of = td_xmalloc((c->n ? c->n : 1) * sizeof *row_of), nr = 0;
    double *ema = td_xmalloc((c->n ? c->n : 1) * sizeof *ema), em = NAN;
    for (size_t i = 0; i < c->n; i++) {
        if (!isfinite(R[i])) continue;
        double M[TD_RLM_COUNT];
        for (int m = 0; m < TD_RLM_COUNT; m++) M[m] = col[m] >= 0 ? c->v[(size_t)col[m] * c->n + i] : NAN;
        td_collapse_push(d, M);
        em = nr == 0 ? R[i] : cfg->ema_alpha * R[i] + (1 - cfg->ema_alpha) * em;
        ema[nr] = em;
        row_of[nr++] = i;
    }
    e->rows_used = nr;
    if (nr) {
        e->initial_reward = R[row_of[0]];
        e->final_reward = ema[nr - 1];
    }
    static const char *const rule[TD_CLP_NSIGNALS] = {
        "EMA(%.2g) of the reward %.2g below its best (or %.0f%% of the gain) for %d logged steps (tidal's detector, RL.md s.5)",
        "grad_norm > %.0fx the median of the previous %d logged steps, on 2 of 3 (tidal's detector)",
        "entropy outside [%.2g, %.2g] x its first value for %d logged steps (tidal's detector)",
        "k3 > %.0fx its first-%d median, or a verl alarm: |kl| > %.2g, chi2_token > %.2g, ESS < %.2g (verl rollout_corr health checks)",
        "truncated share > %.2g (tidal's detector)",
        "no policy gradient (all truncated, or every group's rewards equal) for %d logged steps (tidal's detector)"};
    int sig_col[TD_CLP_NSIGNALS] = {rc, col[TD_RLM_grad_norm], col[TD_RLM_entropy], col[TD_RLM_k3_kl] >= 0 ? col[TD_RLM_k3_kl] : col[TD_RLM_rollout_corr_kl],
                                    col[TD_RLM_response_length_clip_ratio],
                                    col[TD_RLM_frac_reward_zero_std] >= 0 ? col[TD_RLM_frac_reward_zero_std] : col[TD_RLM_response_length_clip_ratio]};
    for (int s = 0; s < TD_CLP_NSIGNALS; s++) {
        int k = td_collapse_first(d, (td_collapse_signal)s);
        if (k < 0 || (size_t)k >= nr) continue;
        int64_t st = c->step[row_of[k]];
        const char *mname = sig_col[s] >= 0 ? c->key[sig_col[s]] : "";
        switch (s) {
        case TD_CLP_REWARD: event(e, "reward_drop", st, mname, rule[s], cfg->ema_alpha, cfg->drop_abs, 100 * cfg->drop_rel, cfg->hold); break;
        case TD_CLP_GRAD: event(e, "grad_spike", st, mname, rule[s], cfg->spike_factor, cfg->spike_window); break;
        case TD_CLP_ENTROPY: event(e, "entropy", st, mname, rule[s], cfg->entropy_lo, cfg->entropy_hi, cfg->entropy_hold); break;
        case TD_CLP_MISMATCH: event(e, "mismatch", st, mname, rule[s], cfg->k3_factor, cfg->k3_baseline, cfg->kl_abs, cfg->chi2_max, cfg->ess_min); break;
        case TD_CLP_LENGTH: event(e, "length", st, mname, rule[s], cfg->trunc_max); break;
        default: event(e, "dead", st, mname, rule[s], cfg->dead_hold); break;
        }
        if (s == TD_CLP_REWARD) e->drop_step = st;
    }
    /* The collapse the run ended in, not its first dip: the detector marks its first reward_drop
     * only, and a run can dip, recover and die later. The run ended collapsed when its final EMA
     * is below its best EMA by the detector's margin (drop_abs; drop_rel of the gain when the gain
     * reached min_gain and the run did not fall by drop_abs). Then the confirmation is the first row from which the EMA stays
     * below that level to the end, and the onset the row after the last one before it whose raw
     * reward was within drop_abs/2 of the best EMA reached before it; a stretch below the level
     * shorter than the detector's hold at the end of the log is not called a collapse. A detector
     * mark that the reward recovered from is kept as the event reward_dip. */
    double best = -INFINITY;
    for (size_t k = 0; k < nr; k++)
        if (ema[k] > best) best = ema[k];
    e->best_reward = nr ? best : NAN;
    double margin = cfg->drop_abs, gain = nr ? best - ema[0] : 0;
    /* the detector's relative margin only when the run did not fall by drop_abs: a run that ends far
     * below its best is dated by its big fall, not by the first sag of a few hundredths */
    if (gain >= cfg->min_gain && cfg->drop_rel * gain < margin && !(nr && best - ema[nr - 1] >= cfg->drop_abs))
        margin = cfg->drop_rel * gain;
    int ended = nr > 0 && best - ema[nr - 1] >= margin;
    size_t kc = nr;
    while (ended && kc > 0 && best - ema[kc - 1] >= margin) kc--;
    if (ended && nr - kc < (size_t)cfg->hold) ended = 0;   /* a dip at the very end: too short to call */
    if (ended) {
        double bb = ema[0];
        for (size_t k = 0; k < kc; k++)
            if (ema[k] > bb) bb = ema[k];
        size_t on = 0;
        for (size_t k = 0; k < kc; k++)
            if (R[row_of[k]] >= bb - 0.5 * cfg->drop_abs) on = k + 1;
        if (on > kc) on = kc;
        e->onset_step = c->step[row_of[on]];
        e->drop_step = c->step[row_of[kc]];
    } else {
        e->drop_step = -1;
    }
    int have_final = 0;
    for (size_t i = 0; i < e->n_ev; i++) {
        td_pm_event *v = &e->ev[i];
        if (strcmp(v->name, "reward_drop")) continue;
        if (ended && v->step >= e->onset_step) { have_final = 1; continue; }
        snprintf(v->name, sizeof v->name, "reward_dip");
        size_t l = strlen(v->rule);
        snprintf(v->rule + l, sizeof v->rule - l, "; the reward recovered afterwards");
    }
    if (ended && !have_final)
        event(e, "reward_drop", e->drop_step, c->key[rc], "the collapse the run ended in: EMA(%.2g) of the reward %.2g below "
              "its best from here to the end (the detector's margin; its own mark came earlier, at a dip)",
              cfg->ema_alpha, margin);
    td_collapse_free(d);
    /* the post-mortem's own precursors, on what TRL and verl log beside the detector's inputs */
    size_t base = nr < 20 ? (nr + 1) / 2 : 20;   /* the early window: the detector's k3 baseline */
    double *tmp = td_xmalloc((nr ? nr : 1) * sizeof *tmp);
    /* response length surging: mean length > 1.5x its early median for 3 logged steps in a row */
    int lc = col[TD_RLM_response_length_mean];
    if (lc >= 0 && nr > base) {
        for (size_t k = 0; k < base; k++) tmp[k] = c->v[(size_t)lc * c->n + row_of[k]];
        double med = median_of(tmp, base);
        int run = 0;
        for (size_t k = base; k < nr && isfinite(med) && med > 0; k++) {
            run = c->v[(size_t)lc * c->n + row_of[k]] > 1.5 * med ? run + 1 : 0;
            if (run == 3) {
                event(e, "length_surge", c->step[row_of[k - 2]], c->key[lc],
                      "mean completion length > 1.5x its median over the first %zu logged steps (%.3g) for 3 logged steps", base, med);
                break;
            }
        }
    }
    /* TRL's mismatch: mean |logp difference| > 10x its early median (the detector's k3 factor) */
    int dc = col[TD_RLM_logp_diff_mean];
    if (dc >= 0 && col[TD_RLM_k3_kl] < 0 && nr > base) {
        for (size_t k = 0; k < base; k++) tmp[k] = c->v[(size_t)dc * c->n + row_of[k]];
        double med = median_of(tmp, base);
        for (size_t k = base; k < nr && isfinite(med) && med > 0; k++)
            if (c->v[(size_t)dc * c->n + row_of[k]] > cfg->k3_factor * med) {
                event(e, "logp_diff_rise", c->step[row_of[k]], c->key[dc],
                      "mean |logp_train - logp_engine| > %.0fx its median over the first %zu logged steps (%.3g)", cfg->k3_factor, base, med);
                break;
            }
    }
    /* IS weights outside verl's health band: mean outside [0.5, 2] */
    int ic = col[TD_RLM_rollout_is_mean];
    if (ic >= 0)
        for (size_t k = 0; k < nr; k++) {
            double w = c->v[(size_t)ic * c->n + row_of[k]];
            if (isfinite(w) && (w < 0.5 || w > 2.0)) {
                event(e, "is_extreme", c->step[row_of[k]], c->key[ic],
                      "mean importance weight %.3g outside [0.5, 2] (verl rollout_corr health check)", w);
                break;
            }
        }
    /* the learning rate: its last change by more than 1 % before the onset (a warm-up ending, a
     * schedule), for the report to place beside the drop */
    int rl = col[TD_RLM_lr];
    if (rl >= 0 && e->onset_step >= 0) {
        int64_t last = -1;
        double prev = NAN, at = NAN;
        for (size_t i = 0; i < c->n && c->step[i] <= e->onset_step; i++) {
            double v = c->v[(size_t)rl * c->n + i];
            if (!isfinite(v)) continue;
            if (isfinite(prev) && fabs(v - prev) > 0.01 * fabs(prev)) { last = c->step[i]; at = v; }
            prev = v;
        }
        if (last >= 0)
            event(e, "lr_change", last, c->key[rl], "learning rate changed by more than 1 %% (to %.3g): the schedule's last change before the onset", at);
    }
    free(tmp);
    free(row_of);
    free(ema);
    if (e->n_ev) qsort(e->ev, e->n_ev, sizeof *e->ev, cmp_event);
    return 0;
}

void td_pm_events_free(td_pm_events *e)
{
    free(e->ev);
    memset(e, 0, sizeof *e);
}

/* ---------------------------------------------------------------- checkpoints */

static int has_safetensors(const char *dir)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (is_file(p)) return 1;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    return is_file(p);
}

static void add_ck(td_pm_checkpoint **out, size_t *n, int64_t step, const char *dir, int adapter, const char *unreadable)
{
    *out = td_xrealloc(*out, (*n + 1) * sizeof **out);
    td_pm_checkpoint *c = &(*out)[(*n)++];
    memset(c, 0, sizeof *c);
    c->step = step;
    c->dir = strdup(dir);
    c->adapter = adapter;
    c->base = strdup("");
    c->unreadable = unreadable ? strdup(unreadable) : NULL;
    if (adapter) {
        char p[4400];
        snprintf(p, sizeof p, "%s/adapter_config.json", dir);
        json_t *j = json_load_file(p, 0, NULL);
        json_t *b = j ? json_object_get(j, "base_model_name_or_path") : NULL;
        if (json_is_string(b)) { free(c->base); c->base = strdup(json_string_value(b)); }
        json_decref(j);
    }
}

/* a folder's weights: an adapter, full weights, or neither */
static int weights_kind(const char *dir)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    if (is_file(p)) return 2;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return is_file(p) && has_safetensors(dir) ? 1 : 0;
}

static int cmp_ck(const void *a, const void *b)
{
    const td_pm_checkpoint *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

int td_pm_checkpoints(const char *run_dir, td_pm_checkpoint **out, size_t *n, td_error *err)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(run_dir);
    if (!d) return td_fail(err, "%s: cannot list: %s", run_dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        long long k;
        int used = 0;
        char p[4400], q[4500];
        if (sscanf(e->d_name, "checkpoint-%lld%n", &k, &used) == 1 && !e->d_name[used]) {
            snprintf(p, sizeof p, "%s/%s", run_dir, e->d_name);
            int w = weights_kind(p);
            if (w) add_ck(out, n, k, p, w == 2, NULL);
            else add_ck(out, n, k, p, 0, "holds neither an adapter (adapter_config.json) nor weights (config.json + "
                                       "model.safetensors): saved with save_only_model and no weights, or an older tidal-rl "
                                       "that kept only trainer_state.bin");
        } else if (sscanf(e->d_name, "global_step_%lld%n", &k, &used) == 1 && !e->d_name[used]) {
            snprintf(p, sizeof p, "%s/%s/actor/lora_adapter", run_dir, e->d_name);
            snprintf(q, sizeof q, "%s/%s/actor/huggingface", run_dir, e->d_name);
            if (weights_kind(p) == 2) add_ck(out, n, k, p, 1, NULL);
            else if (weights_kind(q) == 1) add_ck(out, n, k, q, 0, NULL);
            else {
                char why[9000];
                snprintf(why, sizeof why, "verl's FSDP shards (model_world_size_*_rank_*.pt) are torch pickles: convert them "
                         "with `python -m verl.model_merger merge --backend fsdp --local_dir %s/%s/actor --target_dir %s`",
                         run_dir, e->d_name, q);
                snprintf(p, sizeof p, "%s/%s/actor", run_dir, e->d_name);
                add_ck(out, n, k, p, 0, why);
            }
        }
    }
    closedir(d);
    if (*n) qsort(*out, *n, sizeof **out, cmp_ck);
    return 0;
}

void td_pm_checkpoints_free(td_pm_checkpoint *c, size_t n)
{
    for (size_t i = 0; i < n; i++) { free(c[i].dir); free(c[i].base); free(c[i].unreadable); }
    free(c);
}

size_t td_pm_pick(const td_pm_checkpoint *ck, size_t n, int64_t onset, size_t max, size_t *idx)
{
    size_t *ok = td_xmalloc((n ? n : 1) * sizeof *ok), m = 0, k = 0;
    for (size_t i = 0; i < n; i++)
        if (!ck[i].unreadable) ok[m++] = i;
    char *take = td_xcalloc(m ? m : 1, 1);
    if (max > m) max = m;
    if (m && max) {
        take[0] = 1;
        size_t got = 1;
        if (onset >= 0) {
            size_t first_after = m;
            for (size_t j = 0; j < m; j++)
                if (ck[ok[j]].step > onset) { first_after = j; break; }
            size_t want[4] = {first_after >= 1 ? first_after - 1 : m, first_after, first_after >= 2 ? first_after - 2 : m,
                              first_after + 1};
            for (int w = 0; w < 4 && got < max; w++)
                if (want[w] < m && !take[want[w]]) { take[want[w]] = 1; got++; }
        } else if (max > 1 && !take[m - 1]) { take[m - 1] = 1; got++; }
        for (size_t s = 1; got < max && s < 64; s++)   /* evenly spaced fill */
            for (size_t j = 0; j < m && got < max; j += (m / (max + s)) + 1)
                if (!take[j]) { take[j] = 1; got++; }
        for (size_t j = 0; j < m && got < max; j++)
            if (!take[j]) { take[j] = 1; got++; }
    }
    for (size_t j = 0; j < m; j++)
        if (take[j]) idx[k++] = ok[j];
    free(ok);
    free(take);
    return k;
}
