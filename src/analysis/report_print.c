/* Terminal and Markdown renderings of reports (td_report_run JSON). The headline numbers of
 * all runs go into one table, a column per run, so precisions compare side by side; the
 * per-run breakdowns (buckets, worst tokens and sequences, layers) follow run by run. */
#include "tidal/analysis.h"
#include "table.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static json_t *jpath(json_t *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && j; k = strtok_r(NULL, ".", &save)) {
        if (json_is_string(j)) return j;       /* "n/a (replay)" stands for a whole group */
        j = json_object_get(j, k);
    }
    return j;
}

static void fmt(char *buf, size_t n, json_t *v)
{
    if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, n, "%.4g", json_real_value(v));
    else if (json_is_string(v)) snprintf(buf, n, "%s", json_string_value(v));
    else snprintf(buf, n, "—");
}

/* One row: label, then the value at `path` (under `sub` when given) in every report. */
static void row_path(table *t, json_t *const *reps, size_t n, const char *label, json_t *const *sub,
                     const char *path)
{
    char vals[MAX_COLS][64];
    const char *cells[MAX_COLS];
    cells[0] = label;
    for (size_t i = 0; i < n && i + 1 < MAX_COLS; i++) {
        fmt(vals[i], sizeof vals[i], jpath(sub ? sub[i] : reps[i], path));
        cells[i + 1] = vals[i];
    }
    t_row(t, cells);
}

static void headline(FILE *f, json_t *const *reps, size_t n, int md)
{
    if (n + 1 > MAX_COLS) n = MAX_COLS - 1;
    table t = {.md = md, .ncols = n + 1};
    /* column titles: the recipes; two runs of the same recipes (a seed, a batch size, a
     * checkpoint apart) would share one, so then the file name (the path when those match too)
     * joins every title */
    const char *titles[MAX_COLS] = {"run (A = train vs B = infer)"};
    char buf[MAX_COLS][320];
    int same_label = 0, same_base = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++) {
            same_label |= json_equal(json_object_get(reps[i], "label"), json_object_get(reps[k], "label"));
            const char *fi = json_string_value(json_object_get(reps[i], "file")), *fk = json_string_value(json_object_get(reps[k], "file"));
            const char *bi = fi && strrchr(fi, '/') ? strrchr(fi, '/') + 1 : fi, *bk = fk && strrchr(fk, '/') ? strrchr(fk, '/') + 1 : fk;
            same_base |= bi && bk && !strcmp(bi, bk);
        }
    for (size_t i = 0; i < n; i++) {
        const char *label = json_string_value(json_object_get(reps[i], "label"));
        const char *file = json_string_value(json_object_get(reps[i], "file"));
        const char *base = file && strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
        if (same_label) snprintf(buf[i], sizeof buf[i], "%s (%s)", label ? label : "?", (same_base ? file : base) ? (same_base ? file : base) : "?");
        else snprintf(buf[i], sizeof buf[i], "%s", label ? label : "?");
        titles[i + 1] = buf[i];
    }
    t_row(&t, titles);
    row_path(&t, reps, n, "scored tokens", NULL, "n_tokens");
    row_path(&t, reps, n, "sequences", NULL, "n_seqs");
    static const struct { const char *key, *name; } m[] = {
        {"abs_dlogp", "|Δlogp|"}, {"kl_ba", "KL(B‖A)"}, {"k3", "k3"}, {"tv", "TV"}, {"abs_prob_diff", "|p_b − p_a|"}};
    static const char *stats[] = {"mean", "p50", "p90", "p99", "max"};
    char label[96], path[96];
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++)
        for (size_t s = 0; s < 5; s++) {
            snprintf(label, sizeof label, "%s %s", m[k].name, stats[s]);
            snprintf(path, sizeof path, "%s.%s", m[k].key, stats[s]);
            row_path(&t, reps, n, label, NULL, path);
        }
    static const struct { const char *key, *name; } v[] = {
        {"verl.kl", "verl kl = mean Δlogp (signed, k1)"}, {"verl.log_ppl_diff", "verl log_ppl_diff"},
        {"verl.log_ppl_abs_diff", "verl log_ppl_abs_diff"}, {"verl.ppl_ratio", "verl ppl_ratio"}};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) row_path(&t, reps, n, v[k].name, NULL, v[k].key);
    int any_trainer = 0;
    for (size_t i = 0; i < n; i++) any_trainer |= json_is_object(json_object_get(reps[i], "three_way"));
    if (any_trainer) {   /* replays of dumps that carried the trainer's own log-probs */
        static const struct { const char *key, *name; } tw[] = {
            {"three_way.engine_vs_trainer", "|Δ| engine vs trainer"},
            {"three_way.tidal_vs_trainer", "|Δ| tidal A vs trainer"},
            {"three_way.engine_vs_tidal", "|Δ| engine vs tidal A"}};
        static const char *tws[] = {"mean", "p99", "max", "signed_mean"};
        for (size_t k = 0; k < 3; k++)
            for (size_t s2 = 0; s2 < 4; s2++) {
                snprintf(label, sizeof label, "%s %s", tw[k].name, tws[s2]);
                snprintf(path, sizeof path, "%s.%s", tw[k].key, tws[s2]);
                row_path(&t, reps, n, label, NULL, path);
            }
    }
    static const char *bands[] = {"0.1%", "1%", "5%"};
    for (size_t b = 0; b < 3; b++) {
        snprintf(label, sizeof label, "share p_b/p_a within ±%s", bands[b]);
        /* keys hold a '.', so look them up directly */
        json_t *sub[MAX_COLS];
        for (size_t i = 0; i < n; i++) sub[i] = json_object_get(reps[i], "parity");
        char vals[MAX_COLS][64];
        const char *cells[MAX_COLS] = {label};
        for (size_t i = 0; i < n; i++) { fmt(vals[i], 64, json_object_get(sub[i], bands[b])); cells[i + 1] = vals[i]; }
        t_row(&t, cells);
    }
    static const struct { const char *key, *name; } c[] = {
        {"prob_a", "p_a"}, {"entropy_a", "entropy_a"}, {"pos", "position"}};
    for (size_t k = 0; k < 3; k++)
        for (int s = 0; s < 2; s++) {
            snprintf(label, sizeof label, "%s corr(|Δlogp|, %s)", s ? "Spearman" : "Pearson", c[k].name);
            snprintf(path, sizeof path, "correlation.%s.%s", c[k].key, s ? "spearman" : "pearson");
            row_path(&t, reps, n, label, NULL, path);
        }
    /* importance sampling: raw weights per level, then each correction */
    size_t nlev = json_array_size(json_object_get(reps[0], "is"));
    for (size_t l = 0; l < nlev; l++) {
        json_t *lev[MAX_COLS];
        for (size_t i = 0; i < n; i++) lev[i] = json_array_get(json_object_get(reps[i], "is"), l);
        const char *ln = json_string_value(json_object_get(lev[0], "level"));
        static const struct { const char *key, *name; } w[] = {
            {"n", "n"}, {"w_min", "w min"}, {"w_mean", "w mean"}, {"w_max", "w max"},
            {"ess_frac", "ESS / n"}, {"chi2", "chi² as verl: E[w²] − 1, raw w (may be < 0)"},
            {"inv_ess_m1", "chi² self-normalised: 1/ESS − 1"}};
        for (size_t k = 0; k < 7; k++) {
            snprintf(label, sizeof label, "IS %s: %s", ln, w[k].name);
            row_path(&t, reps, n, label, lev, w[k].key);
        }
        size_t nc = json_array_size(json_object_get(lev[0], "corrections"));
        for (size_t ci = 0; ci < nc; ci++) {
            json_t *cor[MAX_COLS];
            for (size_t i = 0; i < n; i++) cor[i] = json_array_get(json_object_get(lev[i], "corrections"), ci);
            const char *mode = json_string_value(json_object_get(cor[0], "mode"));
            double lo = json_real_value(json_object_get(cor[0], "lo")), hi = json_real_value(json_object_get(cor[0], "hi"));
            const char *verb = !strcmp(mode, "mask") ? "masked" : "clipped";
            static const char *ck[] = {"frac_lo", "frac_hi", "ess_frac"};
            for (int k = 0; k < 3; k++) {
                if (k == 0 && lo == 0) continue;  // one-sided cap: nothing below 0
                if (k < 2) snprintf(label, sizeof label, "IS %s %s [%g, %g]: %s %s", ln, mode, lo, hi, verb, k ? "above" : "below");
                else snprintf(label, sizeof label, "IS %s %s [%g, %g]: ESS / n after", ln, mode, lo, hi);
                row_path(&t, reps, n, label, cor, ck[k]);
            }
        }
    }
    t_print(f, &t);
}

static void buckets(FILE *f, json_t *rep, const char *key, const char *what, int md)
{
    table t = {.md = md, .ncols = 5};
    const char *hdr[] = {what, "tokens", "mean |Δlogp|", "max |Δlogp|", "mean KL(B‖A)"};
    t_row(&t, hdr);
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(rep, key), i, b) {
        char c[5][64];
        const char *cells[5];
        snprintf(c[0], 64, "[%g, %g)", json_real_value(json_object_get(b, "lo")), json_real_value(json_object_get(b, "hi")));
        if (!strcmp(key, "by_prob_a") && json_real_value(json_object_get(b, "hi")) > 1) snprintf(c[0], 64, "[%g, 1]", json_real_value(json_object_get(b, "lo")));
        fmt(c[1], 64, json_object_get(b, "count"));
        fmt(c[2], 64, json_object_get(b, "mean_abs_dlogp"));
        fmt(c[3], 64, json_object_get(b, "max_abs_dlogp"));
        fmt(c[4], 64, json_object_get(b, "mean_kl_ba"));
        for (int k = 0; k < 5; k++) cells[k] = c[k];
        t_row(&t, cells);
    }
    t_print(f, &t);
}

/* A text cell for decoded text or an id list, one line, | and newlines escaped, bounded. */
static void text_cell(char *out, size_t n, json_t *v)
{
    char raw[512];
    if (json_is_string(v)) snprintf(raw, sizeof raw, "%s", json_string_value(v));
    else if (json_is_array(v)) {
        size_t i, len = 0;
        json_t *x;
        raw[0] = 0;
        json_array_foreach(v, i, x) {
            if (len + 16 > sizeof raw) break;
            len += (size_t)snprintf(raw + len, sizeof raw - len, "%s%lld", i ? " " : "[", (long long)json_integer_value(x));
        }
        snprintf(raw + len, sizeof raw - len, "]");
    } else snprintf(raw, sizeof raw, "—");
    size_t o = 0, w = 0;
    for (const char *s = raw; *s && o + 4 < n; s++) {
        if ((*s & 0xC0) != 0x80 && ++w > 60) { memcpy(out + o, "…", 3); o += 3; break; }
        if (*s == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if ((unsigned char)*s < 32) out[o++] = ' ';
        else out[o++] = *s;
    }
    out[o] = 0;
}

static void worst(FILE *f, json_t *rep, int md)
{
    table t = {.md = md, .ncols = 8};
    const char *hdr[] = {"seq", "pos", "token", "text", "logp_a", "logp_b", "Δlogp", "context before"};
    t_row(&t, hdr);
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(rep, "worst_tokens"), i, w) {
        char c[8][256];
        const char *cells[8];
        fmt(c[0], 256, json_object_get(w, "seq"));
        fmt(c[1], 256, json_object_get(w, "pos"));
        fmt(c[2], 256, json_object_get(w, "token"));
        text_cell(c[3], 256, json_object_get(w, "text"));
        /* log-probs with 7 digits: they differ in the 4th to 6th */
        snprintf(c[4], 256, "%.7g", json_real_value(json_object_get(w, "logp_a")));
        snprintf(c[5], 256, "%.7g", json_real_value(json_object_get(w, "logp_b")));
        fmt(c[6], 256, json_object_get(w, "dlogp"));
        text_cell(c[7], 256, json_object_get(w, "context"));
        for (int k = 0; k < 8; k++) cells[k] = c[k];
        t_row(&t, cells);
    }
    t_print(f, &t);
    fprintf(f, "\n");
    table s = {.md = md, .ncols = 6};
    const char *sh[] = {"seq", "scored", "log W (seq IS)", "mean |Δlogp|", "max |Δlogp|", "response"};
    t_row(&s, sh);
    json_array_foreach(json_object_get(rep, "worst_seqs"), i, w) {
        char c[6][256];
        const char *cells[6];
        fmt(c[0], 256, json_object_get(w, "seq"));
        fmt(c[1], 256, json_object_get(w, "n_scored"));
        fmt(c[2], 256, json_object_get(w, "log_w"));
        fmt(c[3], 256, json_object_get(w, "mean_abs_dlogp"));
        fmt(c[4], 256, json_object_get(w, "max_abs_dlogp"));
        text_cell(c[5], 256, json_object_get(w, "response"));
        for (int k = 0; k < 6; k++) cells[k] = c[k];
        t_row(&s, cells);
    }
    t_print(f, &s);
}

static void layers(FILE *f, json_t *rep, int md)
{
    json_t *l = json_object_get(rep, "layers");
    if (!json_is_object(l)) {
        fprintf(f, "No per-layer errors in this run (/layers/rel_err is absent; tidal-diff --layers records them).\n");
        return;
    }
    table t = {.md = md, .ncols = 3};
    const char *hdr[] = {"layer", "mean ‖h_a − h_b‖/‖h_a‖", "p99"};
    t_row(&t, hdr);
    for (size_t i = 0; i < json_array_size(json_object_get(l, "mean_rel_err")); i++) {
        char c[3][64];
        const char *cells[3] = {c[0], c[1], c[2]};
        snprintf(c[0], 64, "%zu", i);
        fmt(c[1], 64, json_array_get(json_object_get(l, "mean_rel_err"), i));
        fmt(c[2], 64, json_array_get(json_object_get(l, "p99_rel_err"), i));
        t_row(&t, cells);
    }
    t_print(f, &t);
}

static void routing(FILE *f, json_t *rep, int md)
{
    json_t *r = json_object_get(rep, "routing");
    if (!json_is_object(r)) return;
    int replay = !strcmp(json_string_value(json_object_get(r, "routing_replay")), "r3");
    fprintf(f, md ? "\n### Routing (mixture of experts)\n\n" : "\nrouting (mixture of experts):\n");
    char a[64], b[64], c[64], d[64], e[64];
    fmt(a, 64, json_object_get(r, "tokens_flipped"));
    fmt(b, 64, json_object_get(r, "share_abs_dlogp_flipped"));
    fmt(c, 64, json_object_get(r, "share_k3_flipped"));
    fmt(d, 64, json_object_get(r, "mean_abs_dlogp_flipped"));
    fmt(e, 64, json_object_get(r, "mean_abs_dlogp_unflipped"));
    fprintf(f, "%s%s tokens whose predicting position chose another expert set in at least one layer; they carry "
            "%s of sum |Δlogp| and %s of sum k3; mean |Δlogp| %s flipped against %s unflipped.%s\n\n",
            md ? "" : "  ", a, b, c, d, e,
            replay ? " Path A replayed B's experts (--routing-replay r3): the flips are what A's own router would have "
                     "chosen, which replay removed." : "");
    table t = {.md = md, .ncols = 3};
    const char *hdr[] = {"MoE layer", "expert-set flips", "same set, other order"};
    t_row(&t, hdr);
    for (size_t i = 0; i < json_array_size(json_object_get(r, "flip_rate")); i++) {
        char cc[3][64];
        const char *cells[3] = {cc[0], cc[1], cc[2]};
        snprintf(cc[0], 64, "%zu", i);
        fmt(cc[1], 64, json_array_get(json_object_get(r, "flip_rate"), i));
        fmt(cc[2], 64, json_array_get(json_object_get(r, "order_flip_rate"), i));
        t_row(&t, cells);
    }
    t_print(f, &t);
}

static void details(FILE *f, json_t *const *reps, size_t n, int md)
{
    for (size_t i = 0; i < n; i++) {
        const char *label = json_string_value(json_object_get(reps[i], "label"));
        const char *file = json_string_value(json_object_get(reps[i], "file"));
        fprintf(f, md ? "\n## %s (`%s`)\n\n### By position\n\n" : "\n=== %s (%s)\n\nby position:\n", label, file);
        buckets(f, reps[i], "by_position", "position", md);
        fprintf(f, md ? "\n### By token probability under A\n\n" : "\nby token probability under A:\n");
        buckets(f, reps[i], "by_prob_a", "p_a", md);
        fprintf(f, md ? "\n### Worst tokens and sequences\n\n" : "\nworst tokens (by |Δlogp|) and sequences (by |log W|):\n");
        worst(f, reps[i], md);
        fprintf(f, md ? "\n### Layers\n\n" : "\nlayers:\n");
        layers(f, reps[i], md);
        routing(f, reps[i], md);
    }
}

void td_report_print_text(FILE *f, json_t *const *reps, size_t n)
{
    headline(f, reps, n, 0);
    details(f, reps, n, 0);
}

void td_report_print_markdown(FILE *f, json_t *const *reps, size_t n, const char *const *figures,
                              size_t n_figures)
{
    fprintf(f, "## Mismatch side by side\n\nA = training path, B = inference path; Δlogp = logp_B − logp_A; "
               "IS weight w = p_A/p_B of the sampled token (sequence: product over the response, "
               "geometric: its T-th root); ESS / n = 1 / mean((w / mean w)²); chi² = mean(w²) − 1 as verl logs it "
               "(geometric: mean((w / mean w)²) − 1, never negative); 1/ESS − 1 = Var(w) / mean(w)²; verl's kl = "
               "mean Δlogp over response tokens (signed), log_ppl_diff = mean over sequences of "
               "(mean logp_B − mean logp_A), ppl_ratio = mean over sequences of exp of that; quantiles "
               "interpolate linearly.\n\n");
    headline(f, reps, n, 1);
    if (n_figures) {
        fprintf(f, "\n## Figures\n\n");
        for (size_t i = 0; i < n_figures; i++) fprintf(f, "![%s](%s)\n\n", figures[i], figures[i]);
    }
    details(f, reps, n, 1);
}
