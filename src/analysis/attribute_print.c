/* Attribution results: JSON, terminal / Markdown table, bar chart (include/tidal/attribute.h). */
#include "tidal/attribute.h"
#include "tidal/render.h"
#include "../render/render_internal.h"
#include "table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *metric_json(const td_attr_game *g, const td_attr_opts *o, const double *v)
{
    unsigned full = (1u << g->n) - 1, side_b = 0;
    double phi[TD_ATTR_MAX_PLAYERS], total = v[full] - v[0], sum_aoi = 0, sum_loo = 0;
    td_attr_shapley(g, o, v, phi);
    json_t *m = json_object(), *aoi = json_array(), *aoie = json_array(), *loo = json_array(), *looe = json_array();
    json_t *sh = json_array(), *share = json_array();
    for (int i = 0; i < g->n; i++) {
        double a = v[1u << i], l = v[full & ~(1u << i)];
        json_array_append_new(aoi, num(a));
        json_array_append_new(aoie, num(a - v[0]));
        json_array_append_new(loo, num(l));
        json_array_append_new(looe, num(v[full] - l));
        json_array_append_new(sh, num(phi[i]));
        json_array_append_new(share, num(total != 0 ? phi[i] / total : NAN));
        sum_aoi += a - v[0];
        sum_loo += v[full] - l;
        if (g->p[i].side) side_b |= 1u << i;
    }
    json_object_set_new(m, "start", num(v[0]));
    json_object_set_new(m, "end", num(v[full]));
    json_object_set_new(m, "change", num(total));
    json_object_set_new(m, "add_one_in", aoi);
    json_object_set_new(m, "add_one_in_effect", aoie);
    json_object_set_new(m, "leave_one_out", loo);
    json_object_set_new(m, "leave_one_out_effect", looe);
    json_object_set_new(m, "shapley", sh);
    json_object_set_new(m, "shapley_share", share);
    /* how far the effects are from adding up: 0 when every field acts alone */
    json_object_set_new(m, "additivity_gap_add_one_in", num(total - sum_aoi));
    json_object_set_new(m, "additivity_gap_leave_one_out", num(total - sum_loo));
    if (side_b && side_b != full) {
        json_object_set_new(m, "inference_side_only", num(v[side_b]));
        json_object_set_new(m, "training_side_only", num(v[full & ~side_b]));
    }
    return m;
}

json_t *td_attr_json(const td_attr_game *g, const td_attr_opts *o, const double *v_abs, const double *v_kl, int64_t tokens)
{
    json_t *j = json_object(), *pl = json_array(), *ev = json_array();
    int transition = strcmp(g->a0.name, g->a1.name) || strcmp(g->b0.name, g->a0.name);
    json_object_set_new(j, "mode", json_string(transition ? "transition" : "pair"));
    json_object_set_new(j, "start", json_pack("{s:s, s:s}", "a", g->a0.name, "b", g->b0.name));
    json_object_set_new(j, "end", json_pack("{s:s, s:s}", "a", g->a1.name, "b", g->b1.name));
    json_object_set_new(j, "tokens", json_integer((json_int_t)tokens));
    for (int i = 0; i < g->n; i++) {
        json_t *p = json_pack("{s:s, s:s, s:s, s:s}", "name", g->p[i].name, "side", g->p[i].side ? "inference" : "training",
                              "from", g->p[i].from, "to", g->p[i].to);
        json_array_append_new(pl, p);
    }
    json_object_set_new(j, "players", pl);
    json_object_set_new(j, "shapley_method", json_string(g->n <= o->exact_max ? "exact" : "sampled permutations"));
    json_object_set_new(j, "permutations", json_integer(g->n <= o->exact_max ? 0 : o->permutations));
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "abs_dlogp", metric_json(g, o, v_abs));
    json_object_set_new(j, "kl_ba", metric_json(g, o, v_kl));
    for (unsigned m = 0; m < 1u << g->n; m++)
        if (isfinite(v_abs[m])) json_array_append_new(ev, json_pack("{s:i, s:o, s:o}", "mask", (int)m, "abs_dlogp", num(v_abs[m]),
                                                                    "kl_ba", num(v_kl[m])));
    json_object_set_new(j, "evaluated", ev);
    return j;
}

/* s cut to fit n bytes with "…" (3 bytes) where it was cut */
static void clip(char *out, size_t n, const char *s)
{
    if (strlen(s) < n) { memcpy(out, s, strlen(s) + 1); return; }
    size_t k = n - 4;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;   /* not inside a UTF-8 character */
    memcpy(out, s, k);
    memcpy(out + k, "…", 4);
}

static double at(json_t *m, const char *k, size_t i) { return json_real_value(json_array_get(json_object_get(m, k), i)); }

void td_attr_print(FILE *f, json_t *res, int md, int metric_kl)
{
    const char *mk = metric_kl ? "kl_ba" : "abs_dlogp", *mname = metric_kl ? "mean KL(B‖A)" : "mean |Δlogp|";
    json_t *m = json_object_get(res, mk), *pl = json_object_get(res, "players");
    int pair = !strcmp(json_string_value(json_object_get(res, "mode")), "pair");
    json_t *st = json_object_get(res, "start"), *en = json_object_get(res, "end");
    const char *a0 = json_string_value(json_object_get(st, "a")), *b0 = json_string_value(json_object_get(st, "b"));
    const char *a1 = json_string_value(json_object_get(en, "a")), *b1 = json_string_value(json_object_get(en, "b"));
    double v0 = json_real_value(json_object_get(m, "start")), v1 = json_real_value(json_object_get(m, "end"));
    double tot = v1 - v0;
    const char *b = md ? "**" : "";
    fprintf(f, "%sAttribution of %s%s over %lld replayed response tokens%s\n\n", b, mname,
            pair ? "" : " (transition)", (long long)json_integer_value(json_object_get(res, "tokens")), b);
    if (pair) {
        fprintf(f, "%s%s / %s (structure only: the same recipe in both paths): %.4g%s\n", md ? "- " : "", a0, b0, v0, "");
        fprintf(f, "%s%s / %s (the pair): %.4g — the recipe differences add %+.4g (%.0f%% of the pair's mismatch)\n",
                md ? "- " : "", a1, b1, v1, tot, v1 > 0 ? 100 * tot / v1 : 0.0);
    } else {
        fprintf(f, "%sfrom %s / %s: %.4g\n%sto   %s / %s: %.4g (change %+.4g)\n", md ? "- " : "", a0, b0, v0, md ? "- " : "", a1, b1, v1, tot);
        json_t *io = json_object_get(m, "inference_side_only"), *to = json_object_get(m, "training_side_only");
        if (io && to) {
            fprintf(f, "%sonly the inference side moves (%s / %s): %.4g (%+.0f%% of the full move's change)\n", md ? "- " : "", a0, b1,
                    json_real_value(io), tot != 0 ? 100 * (json_real_value(io) - v0) / tot : 0.0);
            fprintf(f, "%sonly the training side moves (%s / %s): %.4g (%+.0f%% of the full move's change)\n", md ? "- " : "", a1, b0,
                    json_real_value(to), tot != 0 ? 100 * (json_real_value(to) - v0) / tot : 0.0);
        }
    }
    fprintf(f, "%seffects %s: add-one-in effects sum to %.4g, leave-one-out effects to %.4g, of %.4g%s\n\n", md ? "- " : "",
            fabs(json_real_value(json_object_get(m, "additivity_gap_add_one_in"))) <= 0.1 * fabs(tot) ? "nearly add up"
                                                                                                    : "do not add up",
            tot - json_real_value(json_object_get(m, "additivity_gap_add_one_in")),
            tot - json_real_value(json_object_get(m, "additivity_gap_leave_one_out")), tot, "");
    table t = {.md = md, .ncols = 8};
    const char *hdr[] = {"field (player)", "side", "from → to", "only it switched", "effect", "only it reverted", "effect",
                         "Shapley (share)"};
    t_row(&t, hdr);
    for (size_t i = 0; i < json_array_size(pl); i++) {
        json_t *p = json_array_get(pl, i);
        char c[8][300];
        snprintf(c[0], sizeof c[0], "%s", json_string_value(json_object_get(p, "name")));
        snprintf(c[1], sizeof c[1], "%s", json_string_value(json_object_get(p, "side")));
        char fr[80], to[80];
        clip(fr, sizeof fr, json_string_value(json_object_get(p, "from")));
        clip(to, sizeof to, json_string_value(json_object_get(p, "to")));
        snprintf(c[2], sizeof c[2], "%s → %s", fr, to);
        snprintf(c[3], sizeof c[3], "%.4g", at(m, "add_one_in", i));
        snprintf(c[4], sizeof c[4], "%+.4g", at(m, "add_one_in_effect", i));
        snprintf(c[5], sizeof c[5], "%.4g", at(m, "leave_one_out", i));
        snprintf(c[6], sizeof c[6], "%+.4g", at(m, "leave_one_out_effect", i));
        snprintf(c[7], sizeof c[7], "%+.4g (%.0f%%)", at(m, "shapley", i), 100 * at(m, "shapley_share", i));
        const char *cells[8];
        for (int k = 0; k < 8; k++) cells[k] = c[k];
        t_row(&t, cells);
    }
    t_print(f, &t);
    fprintf(f, "\n%s: %s%s. \"only it switched\": the start pair with this field moved to the end's value (add-one-in); "
               "\"only it reverted\": the end pair with this field moved back (leave-one-out).\n",
            "Shapley values", json_string_value(json_object_get(res, "shapley_method")),
            json_integer_value(json_object_get(res, "permutations")) ? " (seeded)" : " over every subset");
}

int td_attr_plot(json_t *res, int metric_kl, const char *png, const char *cmd, td_error *err)
{
    json_t *m = json_object_get(res, metric_kl ? "kl_ba" : "abs_dlogp"), *pl = json_object_get(res, "players");
    size_t n = json_array_size(pl);
    td_font *font = td_font_open(NULL, err);
    if (!font) return -1;
    static const char *keys[3] = {"add_one_in_effect", "leave_one_out_effect", "shapley"};
    static const char *names[3] = {"only it switched (add-one-in)", "only it reverted (leave-one-out)", "Shapley value"};
    static const td_rgb col[3] = {{68, 114, 196}, {237, 125, 49}, {84, 130, 53}};
    double lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) { double v = at(m, keys[k], i); if (v < lo) lo = v; if (v > hi) hi = v; }
    if (hi - lo <= 0) hi = lo + 1e-12;
    int lab = 0;
    for (size_t i = 0; i < n; i++) {
        int w = td_font_width(font, 13, json_string_value(json_object_get(json_array_get(pl, i), "name")));
        if (w > lab) lab = w;
    }
    int W = 1000, left = lab + 30, right = 30, top = 70, rowh = 54, H = top + (int)n * rowh + 90;
    if (left > 420) left = 420;
    td_canvas *c = td_canvas_new(W, H, (td_rgb){255, 255, 255});
    char title[256], sub[256];
    snprintf(title, sizeof title, "Which setting causes the mismatch? Effect on %s per field", metric_kl ? "mean KL(B||A)" : "mean |dlogp|");
    json_t *st = json_object_get(res, "start"), *en = json_object_get(res, "end");
    snprintf(sub, sizeof sub, "from %s / %s (%.4g) to %s / %s (%.4g), %lld replayed tokens",
             json_string_value(json_object_get(st, "a")), json_string_value(json_object_get(st, "b")),
             json_real_value(json_object_get(m, "start")), json_string_value(json_object_get(en, "a")),
             json_string_value(json_object_get(en, "b")), json_real_value(json_object_get(m, "end")),
             (long long)json_integer_value(json_object_get(res, "tokens")));
    td_figure_title(c, font, title, sub);
    int pw = W - left - right;
    double span = hi - lo;
    int x0 = left + (int)lround((0 - lo) / span * pw);
    for (size_t i = 0; i < n; i++) {
        int y = top + (int)i * rowh;
        td_font_draw(font, c, left - 8, y + rowh / 2, 13, 2, 1, 0, (td_rgb){0, 0, 0},
                     json_string_value(json_object_get(json_array_get(pl, i), "name")));
        for (int k = 0; k < 3; k++) {
            double v = at(m, keys[k], i);
            if (!isfinite(v)) continue;
            int x1 = left + (int)lround((v - lo) / span * pw);
            int bx = x1 < x0 ? x1 : x0, bw = abs(x1 - x0);
            td_canvas_rect(c, bx, y + 6 + k * 14, bw > 0 ? bw : 1, 12, col[k]);
        }
    }
    td_canvas_line(c, x0, top, x0, top + (int)n * rowh, (td_rgb){0, 0, 0}, 0);
    int ya = top + (int)n * rowh + 4;
    double ticks[16];
    int nt = td_nice_ticks(lo, hi, 6, ticks, 16);
    for (int k = 0; k < nt; k++) {
        int x = left + (int)lround((ticks[k] - lo) / span * pw);
        char buf[32];
        td_fmt_tick(buf, sizeof buf, ticks[k]);
        td_canvas_line(c, x, ya, x, ya + 5, (td_rgb){0, 0, 0}, 0);
        td_font_draw(font, c, x, ya + 8, 12, 1, 0, 0, (td_rgb){0, 0, 0}, buf);
    }
    for (int k = 0; k < 3; k++) {
        int x = left + k * 250, y = H - 28;
        td_canvas_rect(c, x, y, 14, 12, col[k]);
        td_font_draw(font, c, x + 20, y + 6, 12, 0, 1, 0, (td_rgb){0, 0, 0}, names[k]);
    }
    const char *kv[2] = {"command_line", cmd ? cmd : ""};
    int rc = td_canvas_write_png(c, png, kv, 1, err);
    td_canvas_free(c);
    td_font_close(font);
    return rc;
}
