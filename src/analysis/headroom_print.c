/* FP16 headroom as JSON and as a table with a verdict (include/tidal/headroom.h). */
#include "tidal/headroom.h"
#include "table.h"

#include <math.h>
#include <string.h>

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *row_json(const td_headroom_row *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "layer", json_integer(r->layer));
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "count", json_integer((json_int_t)r->count));
    json_object_set_new(o, "max_abs", num(r->max_abs));
    json_object_set_new(o, "headroom", num(r->max_abs > 0 ? TD_FP16_MAX / r->max_abs : INFINITY));
    json_object_set_new(o, "overflow", json_integer((json_int_t)r->overflow));
    json_object_set_new(o, "above_max", json_integer((json_int_t)r->above_max));
    json_object_set_new(o, "subnormal", json_integer((json_int_t)r->subnormal));
    json_object_set_new(o, "flushed", json_integer((json_int_t)r->flushed));
    json_object_set_new(o, "nonfinite", json_integer((json_int_t)r->nonfinite));
    return o;
}

/* The totals of rows [a, b) and the row with the largest |x|. */
static void totals(const td_headroom *h, size_t a, size_t b, td_headroom_row *t, size_t *worst)
{
    memset(t, 0, sizeof *t);
    *worst = a;
    for (size_t i = a; i < b; i++) {
        const td_headroom_row *r = &h->rows[i];
        t->count += r->count; t->overflow += r->overflow; t->above_max += r->above_max;
        t->subnormal += r->subnormal; t->flushed += r->flushed; t->nonfinite += r->nonfinite;
        if (r->max_abs > h->rows[*worst].max_abs) *worst = i;
    }
    t->max_abs = b > a ? h->rows[*worst].max_abs : 0;
}

static int safe(const td_headroom *h)
{
    td_headroom_row t;
    size_t w;
    totals(h, 0, h->n, &t, &w);
    return t.overflow == 0 && t.nonfinite == 0;
}

json_t *td_headroom_json(const td_headroom *h)
{
    json_t *o = json_object(), *ops = json_array(), *wts = json_array();
    for (size_t i = 0; i < h->n; i++) json_array_append_new(i < h->n_ops ? ops : wts, row_json(&h->rows[i]));
    json_object_set_new(o, "tokens", json_integer((json_int_t)h->tokens));
    json_object_set_new(o, "fp16_max", json_real(TD_FP16_MAX));
    json_object_set_new(o, "fp16_min_normal", json_real(TD_FP16_MIN_NORMAL));
    json_object_set_new(o, "fp16_safe", json_boolean(safe(h)));
    json_object_set_new(o, "ops", ops);
    json_object_set_new(o, "weights", wts);
    return o;
}

static void pct(char *buf, size_t n, uint64_t k, uint64_t of)
{
    if (!k) snprintf(buf, n, "0");
    else snprintf(buf, n, "%llu (%.3g%%)", (unsigned long long)k, 100.0 * (double)k / (double)of);
}

static void print_rows(FILE *f, const td_headroom *h, size_t a, size_t b, int md, const char *first)
{
    table t = {.md = md, .ncols = 8};
    const char *hdr[] = {first, "values", "max |x|", "65504 / max", "overflow (inf)", "> 65504", "below 2^-14", "to zero"};
    t_row(&t, hdr);
    for (size_t i = a; i < b; i++) {
        const td_headroom_row *r = &h->rows[i];
        char c[8][96];
        if (r->layer >= 0 && strcmp(r->name, "norm") && strncmp(r->name, "lm_head", 7))
            snprintf(c[0], sizeof c[0], "%d %s", r->layer, r->name);
        else snprintf(c[0], sizeof c[0], "%s", r->name);
        snprintf(c[1], sizeof c[1], "%llu", (unsigned long long)r->count);
        snprintf(c[2], sizeof c[2], "%.4g", r->max_abs);
        if (r->max_abs > 0) snprintf(c[3], sizeof c[3], "%.3g", TD_FP16_MAX / r->max_abs);
        else snprintf(c[3], sizeof c[3], "—");
        pct(c[4], sizeof c[4], r->overflow + r->nonfinite, r->count);
        pct(c[5], sizeof c[5], r->above_max, r->count);
        pct(c[6], sizeof c[6], r->subnormal, r->count);
        pct(c[7], sizeof c[7], r->flushed, r->count);
        const char *cells[8];
        for (int k = 0; k < 8; k++) cells[k] = c[k];
        t_row(&t, cells);
    }
    t_print(f, &t);
}

void td_headroom_print(FILE *f, const td_headroom *h, int md, int all_rows)
{
    td_headroom_row t, tw;
    size_t w, ww;
    totals(h, 0, h->n_ops, &t, &w);
    totals(h, h->n_ops, h->n, &tw, &ww);
    const td_headroom_row *r = &h->rows[w];
    char where[96];
    if (r->layer >= 0 && strcmp(r->name, "norm") && strncmp(r->name, "lm_head", 7))
        snprintf(where, sizeof where, "layer %d %s", r->layer, r->name);
    else snprintf(where, sizeof where, "%s", r->name);
    fprintf(f, "%sFP16 headroom over %lld token rows: ", md ? "**" : "", (long long)h->tokens);
    if (t.overflow || t.nonfinite) {
        fprintf(f, "NOT SAFE — %llu op outputs overflow FP16 (|x| >= 65520 becomes inf)", (unsigned long long)(t.overflow + t.nonfinite));
    } else {
        fprintf(f, "no overflow");
    }
    fprintf(f, "; largest |x| %.4g (%s), %.3g x below 65504.%s\n", t.max_abs, where,
            t.max_abs > 0 ? TD_FP16_MAX / t.max_abs : INFINITY, md ? "**" : "");
    fprintf(f, "%s%.3g%% of op outputs are below FP16's normal range (0 < |x| < 2^-14 = 6.1e-5: fewer significant "
               "bits), %.3g%% would flush to zero (|x| <= 2^-25).\n", md ? "\n" : "",
            t.count ? 100.0 * (double)t.subnormal / (double)t.count : 0.0,
            t.count ? 100.0 * (double)t.flushed / (double)t.count : 0.0);
    fprintf(f, "%sWeights: largest |w| %.4g (%s); %llu above 65504; %.3g%% below 2^-14, %.3g%% flush to zero in FP16.\n\n",
            md ? "\n" : "", tw.max_abs, h->n > h->n_ops ? h->rows[ww].name : "-", (unsigned long long)tw.above_max,
            tw.count ? 100.0 * (double)tw.subnormal / (double)tw.count : 0.0,
            tw.count ? 100.0 * (double)tw.flushed / (double)tw.count : 0.0);
    if (all_rows) {
        print_rows(f, h, 0, h->n_ops, md, "layer op (output)");
    } else {
        /* the rows that matter: any overflow or the op outputs within 16x of the limit, else the 10 largest */
        size_t keep[1024], nk = 0;
        for (size_t i = 0; i < h->n_ops && nk < 1024; i++)
            if (h->rows[i].overflow || h->rows[i].nonfinite || h->rows[i].max_abs * 16 >= TD_FP16_MAX) keep[nk++] = i;
        if (!nk) {
            for (size_t k = 0; k < 10 && k < h->n_ops; k++) {
                size_t best = (size_t)-1;
                for (size_t i = 0; i < h->n_ops; i++) {
                    int used = 0;
                    for (size_t q = 0; q < nk; q++) used |= keep[q] == i;
                    if (!used && (best == (size_t)-1 || h->rows[i].max_abs > h->rows[best].max_abs)) best = i;
                }
                keep[nk++] = best;
            }
        }
        td_headroom h2 = *h;
        td_headroom_row *sel = td_xmalloc(nk * sizeof *sel);
        for (size_t q = 0; q < nk; q++) sel[q] = h->rows[keep[q]];
        h2.rows = sel;
        fprintf(f, "%s (--all for every layer and op):\n\n", t.overflow ? "Op outputs that overflow or come within 16x of 65504"
                                                                      : "The 10 op outputs with the largest |x|");
        print_rows(f, &h2, 0, nk, md, "layer op (output)");
        free(sel);
    }
    fprintf(f, "\n");
    print_rows(f, h, h->n_ops, h->n, md, "weights (all layers)");
}
