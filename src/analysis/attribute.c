/* Attribution of a recipe pair's mismatch to its fields (include/tidal/attribute.h): the
 * players, the pairs of a subset of them, the subsets to evaluate and Shapley values. */
#include "tidal/attribute.h"
#include "tidal/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A recipe as a JSON object with every field: td_recipe_to_json leaves out the fields that hold
 * their default ("moe": "hf", "router": "activations"), and a field only one side prints would
 * otherwise never be a player (bf16-train against vllm-bf16 differ in "moe") */
static json_t *recipe_obj(const td_recipe *r)
{
    static const char *const OPTIONAL[][2] = {{"moe", "hf"}, {"router", "activations"}};
    char *s = td_recipe_to_json(r);
    json_t *j = json_loads(s, 0, NULL);
    free(s);
    for (size_t i = 0; j && i < sizeof OPTIONAL / sizeof OPTIONAL[0]; i++)
        if (!json_object_get(j, OPTIONAL[i][0])) json_object_set_new(j, OPTIONAL[i][0], json_string(OPTIONAL[i][1]));
    return j;
}

static int is_meta(const char *k) { return !strcmp(k, "name") || !strcmp(k, "description"); }

static int has_key(const td_attr_player *p, const char *k)
{
    for (int i = 0; i < p->nkeys; i++) if (!strcmp(p->keys[i], k)) return 1;
    return 0;
}

/* The group of `key` in groups ("k1+k2,k3"): copies the group's keys into out (NULL if none). */
static int group_of(const char *groups, const char *key, char out[TD_ATTR_MAX_KEYS][32])
{
    if (!groups) return 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", groups);
    char *s1 = NULL;
    for (char *g = strtok_r(buf, ",", &s1); g; g = strtok_r(NULL, ",", &s1)) {
        char tmp[1024], *s2 = NULL;
        snprintf(tmp, sizeof tmp, "%s", g);
        int n = 0, hit = 0;
        for (char *k = strtok_r(tmp, "+", &s2); k && n < TD_ATTR_MAX_KEYS; k = strtok_r(NULL, "+", &s2)) {
            snprintf(out[n++], 32, "%s", k);
            hit |= !strcmp(k, key);
        }
        if (hit) return n;
    }
    return 0;
}

static void describe(td_attr_player *p, json_t *from, json_t *to)
{
    p->from[0] = p->to[0] = p->name[0] = 0;
    for (int i = 0; i < p->nkeys; i++) {
        char *f = json_dumps(json_object_get(from, p->keys[i]), JSON_ENCODE_ANY | JSON_COMPACT);
        char *t = json_dumps(json_object_get(to, p->keys[i]), JSON_ENCODE_ANY | JSON_COMPACT);
        size_t nl = strlen(p->name), fl = strlen(p->from), tl = strlen(p->to);
        snprintf(p->name + nl, sizeof p->name - nl, "%s%s", i ? "+" : "", p->keys[i]);
        if (p->nkeys == 1) {
            snprintf(p->from, sizeof p->from, "%s", f);
            snprintf(p->to, sizeof p->to, "%s", t);
        } else {
            snprintf(p->from + fl, sizeof p->from - fl, "%s%s=%s", i ? ", " : "", p->keys[i], f);
            snprintf(p->to + tl, sizeof p->to - tl, "%s%s=%s", i ? ", " : "", p->keys[i], t);
        }
        free(f);
        free(t);
    }
}

/* The players of one side: keys whose values differ between from and to. */
static int side_players(td_attr_game *g, int side, json_t *from, json_t *to, const char *groups, int by_side,
                        td_error *err)
{
    const char *key;
    json_t *v;
    int first = g->n;
    json_object_foreach(from, key, v) {
        if (is_meta(key) || json_equal(v, json_object_get(to, key))) continue;
        int placed = 0;
        for (int i = first; i < g->n && !placed; i++) placed = has_key(&g->p[i], key);
        if (placed) continue;
        td_attr_player *p = NULL;
        if (by_side && g->n > first) p = &g->p[first];
        if (!p) {
            char grp[TD_ATTR_MAX_KEYS][32];
            int ng = group_of(groups, key, grp);
            /* a key of an earlier player's --group */
            for (int i = first; i < g->n && !p; i++)
                for (int k = 0; k < ng && !p; k++) if (has_key(&g->p[i], grp[k])) p = &g->p[i];
        }
        /* gemm_inputs and kv_cache that equal activations on both ends follow it */
        if (!p && (!strcmp(key, "gemm_inputs") || !strcmp(key, "kv_cache"))) {
            json_t *af = json_object_get(from, "activations"), *at = json_object_get(to, "activations");
            if (!json_equal(af, at) && json_equal(v, af) && json_equal(json_object_get(to, key), at))
                for (int i = first; i < g->n && !p; i++) if (has_key(&g->p[i], "activations")) p = &g->p[i];
        }
        if (!p) {
            if (g->n == TD_ATTR_MAX_PLAYERS)
                return td_fail(err, "more than %d differing fields: join some with --group K1+K2 (or --by-side)", TD_ATTR_MAX_PLAYERS);
            p = &g->p[g->n++];
            memset(p, 0, sizeof *p);
            p->side = side;
        }
        if (p->nkeys == TD_ATTR_MAX_KEYS) return td_fail(err, "player %s: more than %d fields", p->keys[0], TD_ATTR_MAX_KEYS);
        snprintf(p->keys[p->nkeys++], 32, "%s", key);
    }
    /* activations that moved after its followers were seen: pull them in */
    for (int i = first; i < g->n; i++) {
        if (!has_key(&g->p[i], "activations")) continue;
        for (int k = first; k < g->n; k++) {
            if (k == i || g->p[k].nkeys != 1) continue;
            char kk[32];
            memcpy(kk, g->p[k].keys[0], sizeof kk);
            if (strcmp(kk, "gemm_inputs") && strcmp(kk, "kv_cache")) continue;
            json_t *af = json_object_get(from, "activations"), *at = json_object_get(to, "activations");
            if (json_equal(json_object_get(from, kk), af) && json_equal(json_object_get(to, kk), at)) {
                memcpy(g->p[i].keys[g->p[i].nkeys++], kk, sizeof kk);
                memmove(&g->p[k], &g->p[k + 1], (size_t)(g->n - k - 1) * sizeof g->p[0]);
                g->n--;
                if (k < i) i--;
                k--;
            }
        }
    }
    for (int i = first; i < g->n; i++) describe(&g->p[i], from, to);
    if (by_side && g->n > first) {
        static const char *const label[2] = {"training side (all its fields)", "inference side (all its fields)"};
        memcpy(g->p[first].name, label[side], strlen(label[side]) + 1);
    }
    return 0;
}

int td_attr_game_init(td_attr_game *g, const td_recipe *a0, const td_recipe *b0, const td_recipe *a1,
                      const td_recipe *b1, const char *groups, int by_side, td_error *err)
{
    memset(g, 0, sizeof *g);
    g->a0 = *a0; g->b0 = *b0; g->a1 = *a1; g->b1 = *b1;
    json_t *ja0 = recipe_obj(a0), *ja1 = recipe_obj(a1), *jb0 = recipe_obj(b0), *jb1 = recipe_obj(b1);
    int rc = side_players(g, 0, ja0, ja1, groups, by_side, err) || side_players(g, 1, jb0, jb1, groups, by_side, err) ? -1 : 0;
    json_decref(ja0); json_decref(ja1); json_decref(jb0); json_decref(jb1);
    if (rc == 0 && g->n == 0) rc = td_fail(err, "the two pairs are the same recipes: nothing to attribute");
    return rc;
}

/* from with the keys of the players of `side` in mask set to to's values. */
static int mix(const td_attr_game *g, unsigned mask, int side, const td_recipe *from, const td_recipe *to, td_recipe *out,
               td_error *err)
{
    json_t *jf = recipe_obj(from), *jt = recipe_obj(to);
    char names[200] = "";
    for (int i = 0; i < g->n; i++) {
        if (!(mask >> i & 1) || g->p[i].side != side) continue;
        for (int k = 0; k < g->p[i].nkeys; k++)
            json_object_set(jf, g->p[i].keys[k], json_object_get(jt, g->p[i].keys[k]));
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? "," : "", g->p[i].name);
    }
    char nm[64];
    if (names[0]) snprintf(nm, sizeof nm, "%.20s+%s", from->name, names);
    else snprintf(nm, sizeof nm, "%s", from->name);
    json_object_set_new(jf, "name", json_string(nm));
    char *text = json_dumps(jf, JSON_COMPACT);
    td_error e2;
    int rc = td_recipe_from_json(text, strlen(text), "mixed recipe", out, &e2);
    if (rc) td_fail(err, "switching only %s on the %s side gives no valid recipe (%s): join fields that must move together "
                    "with --group K1+K2", names, side ? "inference" : "training", e2.msg);
    free(text);
    json_decref(jf);
    json_decref(jt);
    return rc;
}

int td_attr_pair(const td_attr_game *g, unsigned mask, td_recipe *a, td_recipe *b, td_error *err)
{
    return mix(g, mask, 0, &g->a0, &g->a1, a, err) || mix(g, mask, 1, &g->b0, &g->b1, b, err) ? -1 : 0;
}

/* The orders sampled for Shapley: perm k of n players from the seed. */
static void perm_k(const td_attr_opts *o, int n, int k, int *perm)
{
    td_rng r;
    td_rng_stream(&r, o->seed, (uint64_t)k);
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)td_rng_below(&r, (uint64_t)i + 1);
        int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
}

static void add(unsigned **m, size_t *n, size_t *cap, unsigned v)
{
    for (size_t i = 0; i < *n; i++) if ((*m)[i] == v) return;
    if (*n == *cap) { *cap = *cap ? 2 * *cap : 64; *m = td_xrealloc(*m, *cap * sizeof **m); }
    (*m)[(*n)++] = v;
}

void td_attr_plan(const td_attr_game *g, const td_attr_opts *o, unsigned **masks, size_t *n)
{
    unsigned full = (1u << g->n) - 1, side_b = 0;
    size_t cap = 0;
    *masks = NULL;
    *n = 0;
    add(masks, n, &cap, 0);
    add(masks, n, &cap, full);
    for (int i = 0; i < g->n; i++) {
        add(masks, n, &cap, 1u << i);
        add(masks, n, &cap, full & ~(1u << i));
        if (g->p[i].side) side_b |= 1u << i;
    }
    if (side_b && side_b != full) { add(masks, n, &cap, side_b); add(masks, n, &cap, full & ~side_b); }
    if (g->n <= o->exact_max) {
        for (unsigned m = 0; m <= full; m++) add(masks, n, &cap, m);
        return;
    }
    int perm[TD_ATTR_MAX_PLAYERS];
    for (int k = 0; k < o->permutations; k++) {
        perm_k(o, g->n, k, perm);
        unsigned m = 0;
        for (int i = 0; i < g->n; i++) add(masks, n, &cap, m |= 1u << perm[i]);
    }
}

void td_attr_shapley(const td_attr_game *g, const td_attr_opts *o, const double *v, double *phi)
{
    int n = g->n;
    unsigned full = (1u << n) - 1;
    for (int i = 0; i < n; i++) phi[i] = 0;
    if (n <= o->exact_max) {
        /* φ_i = Σ_{S ∌ i} |S|! (n − |S| − 1)! / n! · (v(S ∪ i) − v(S)) */
        double fact[TD_ATTR_MAX_PLAYERS + 1] = {1};
        for (int k = 1; k <= n; k++) fact[k] = fact[k - 1] * k;
        for (unsigned s = 0; s <= full; s++) {
            int sz = __builtin_popcount(s);
            for (int i = 0; i < n; i++)
                if (!(s >> i & 1)) phi[i] += fact[sz] * fact[n - sz - 1] / fact[n] * (v[s | 1u << i] - v[s]);
        }
        return;
    }
    int perm[TD_ATTR_MAX_PLAYERS];
    for (int k = 0; k < o->permutations; k++) {
        perm_k(o, n, k, perm);
        unsigned m = 0;
        for (int i = 0; i < n; i++) {
            unsigned m2 = m | 1u << perm[i];
            phi[perm[i]] += v[m2] - v[m];
            m = m2;
        }
    }
    for (int i = 0; i < n; i++) phi[i] /= o->permutations;
}
