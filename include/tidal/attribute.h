/* tidal — attribution: which setting to change? A recipe pair (A = training path, B = inference
 * path) differs in several fields; this says how much of the mismatch each one causes.
 *
 * The game. Players are the recipe fields in which the pairs differ (fields that must move
 * together are one player: gemm_inputs and kv_cache follow activations when they equal it on
 * both sides; --group joins more). v(S) = the mismatch (mean |Δlogp|, mean KL(B‖A)) with the
 * players in S switched from the start pair to the end pair, the others left at the start:
 *   default     start = (A, A), end = (A, B): every player is a field of B; v(∅) is the
 *               structure-only mismatch (the same recipe in both paths, teacher-forced against
 *               KV-cache decode), v(all) the pair's own mismatch;
 *   transition  start = (A, B), end = (A', B') (--to-a / --to-b): players are the fields of
 *               either side that move; "the rollout side only" is v(B's players).
 * Reported per player: add-one-in v({i}) − v(∅) (only that field switched), leave-one-out
 * v(all) − v(all ∖ {i}) (only that field reverted), and its Shapley value (exact over every
 * subset for up to `exact_max` players, else the mean over `permutations` random orders from
 * `seed`: sampled permutations sum to v(all) − v(∅) exactly, as exact ones do).
 *
 * The replay. The tokens are generated once, by the diff job (tidal-diff's run file, recipe B
 * of the run: prefill, KV-cache decode, sampling), and held fixed: every v(S) rescores those
 * same tokens, the training side teacher-forced under S's A recipe and the inference side by
 * prefill + KV-cache decode of the recorded tokens (no sampling) under S's B recipe, in the
 * run's batches, slots and step schedule, so the run's own pair reproduces the run file's
 * logp_a and logp_b bit for bit. Held fixed besides the tokens: the batches (which prompts share
 * a decode step), the model and the thread count. A given A recipe is scored once for every
 * configuration that uses it. What the replay cannot show: how a setting would change which
 * tokens get sampled (a different B would sample different tokens). */
#ifndef TIDAL_ATTRIBUTE_H
#define TIDAL_ATTRIBUTE_H

#include "tidal/recipe.h"

#include <jansson.h>
#include <stdio.h>

TD_BEGIN_DECLS

/* ---- rescoring a run's tokens under other recipe pairs ------------------------------------ */

typedef struct td_rescorer td_rescorer;

/* Opens a tidal-diff run file (generate mode, no LoRA) and the checkpoint it names (model_dir
 * NULL: its model_path). Its recipes come back in *a, *b. */
td_rescorer *td_rescorer_open(const char *run_path, const char *model_dir, td_recipe *a, td_recipe *b, td_error *err);
void td_rescorer_free(td_rescorer *r);
int64_t td_rescorer_tokens(const td_rescorer *r);   /* response tokens scored */

typedef struct { double abs_dlogp, kl_ba, k3, dlogp; int64_t n; } td_rescore_stat;

/* Mean |Δlogp|, KL(B‖A), k3 and signed Δ over the run's response tokens for n pairs
 * (a[i], b[i]). progress (may be NULL): a line per pair. */
int td_rescorer_eval(td_rescorer *r, int n, const td_recipe *a, const td_recipe *b, td_rescore_stat *out,
                     FILE *progress, td_error *err);

/* ---- the game ----------------------------------------------------------------------------- */

#define TD_ATTR_MAX_PLAYERS 12
#define TD_ATTR_MAX_KEYS 8

typedef struct {
    char name[96];          /* "activations+gemm_inputs+kv_cache"                        */
    int side;               /* 0: training path (A), 1: inference path (B)               */
    char keys[TD_ATTR_MAX_KEYS][32];
    int nkeys;
    char from[256], to[256];/* the values, as JSON                                        */
} td_attr_player;

typedef struct {
    td_recipe a0, b0, a1, b1;   /* start pair, end pair                                   */
    int n;
    td_attr_player p[TD_ATTR_MAX_PLAYERS];
} td_attr_game;

/* Players of the move from (a0, b0) to (a1, b1). groups: NULL, or "k1+k2,k3+k4": keys that
 * move together. by_side: two players, all of A's fields and all of B's. */
int td_attr_game_init(td_attr_game *g, const td_recipe *a0, const td_recipe *b0, const td_recipe *a1,
                      const td_recipe *b1, const char *groups, int by_side, td_error *err);
/* The pair with the players of mask (bit i = player i) switched. */
int td_attr_pair(const td_attr_game *g, unsigned mask, td_recipe *a, td_recipe *b, td_error *err);

typedef struct {
    int exact_max;          /* exact Shapley up to this many players (default 5)          */
    int permutations;       /* otherwise sampled orders (default 64)                       */
    uint64_t seed;
} td_attr_opts;

/* The subsets the report needs (∅, all, singletons, complements, each side, Shapley's). Caller
 * frees *masks. */
void td_attr_plan(const td_attr_game *g, const td_attr_opts *o, unsigned **masks, size_t *n);

/* Shapley values of players from v over the planned subsets (v indexed by mask; NaN where not
 * evaluated): exact when g->n <= exact_max, else the seeded sampled-permutation mean. */
void td_attr_shapley(const td_attr_game *g, const td_attr_opts *o, const double *v, double *phi);

/* The whole result as JSON (values by metric, per player add-one-in / leave-one-out / Shapley),
 * and its renderings. v_abs, v_kl: (1 << g->n) values, NaN where not evaluated. */
json_t *td_attr_json(const td_attr_game *g, const td_attr_opts *o, const double *v_abs, const double *v_kl,
                     int64_t tokens);
void td_attr_print(FILE *f, json_t *res, int markdown, int metric_kl);
/* A bar chart PNG of add-one-in, leave-one-out and Shapley per player (font NULL: default). */
int td_attr_plot(json_t *res, int metric_kl, const char *png_path, const char *command_line, td_error *err);

TD_END_DECLS

#endif
