/* tidal — offline analysis of run files: the numbers verl and TRL log, computed over a whole
 * run with GSL (sorting, quantiles, correlations, histograms).
 *
 * Notation (A = training path, B = inference path, per scored token):
 *   dlogp = logp_b − logp_a;  p_b/p_a = exp(dlogp)   (the parity bands use this ratio)
 *   IS weight (trainer over rollout, REFERENCES.md):  ρ_t = exp(logp_a − logp_b) = exp(−dlogp)
 *   sequence weight  W = Π_t ρ_t over the response tokens of a sequence (is_prompt == 0)
 *   geometric weight G = W^(1/T), T = number of response tokens
 * Quantiles interpolate linearly between the order statistics around index f·(n−1), with
 * gsl_stats_quantile_from_sorted_data's formula (order statistics from gsl_stats_select),
 * which is numpy's default ('linear') percentile definition.
 * Non-finite values (NaN columns of replay runs) are left out of every statistic; `count`
 * says how many values entered.
 */
#ifndef TIDAL_ANALYSIS_H
#define TIDAL_ANALYSIS_H

#include "tidal/common.h"

#include <jansson.h>
#include <stdio.h>

TD_BEGIN_DECLS

/* One run file's token columns in memory (n scored tokens, nseq sequences). */
typedef struct {
    char *path;
    char *label;              // "recipe_a→recipe_b", or the file name
    char *recipe_a, *recipe_b, *model_path; // attributes; "" when absent
    int replay;               // B is recorded rollouts (mode "replay"): recipe_b names them, and
                              // metrics needing B's full distribution are "n/a (replay)"
    size_t n;                 // scored tokens (rows of /tokens)
    size_t nseq;              // sequences (rows of /seqs, or 1 + max /tokens/seq)
    double *logp_a, *logp_b;  // (n)
    double *logp_trainer;     // (n) the trainer's own log-probs a replayed dump carried (verl
                              //     old_log_probs, TRL old_per_token_logps); NULL when absent
    double *dlogp;            // (n) logp_b − logp_a
    double *kl_ba, *k3, *tv;  // (n) NaN where the run could not compute them (replay)
    double *entropy_a;        // (n)
    int64_t *seq;             // (n) in [0, nseq)
    int32_t *pos, *token;     // (n)
    int8_t *is_prompt;        // (n) 0 = response token
    int32_t *step;            // (n) generation step: pos − prompt_len (0 = first response token,
                              //     < 0 in the prompt); /tokens/step, or derived from /seqs
    int32_t max_pos;          // largest /tokens/pos
    /* Optional /layers/rel_err: rows aligned with /tokens. NULL when the run has none. */
    size_t n_layers;
    float *layer_err;         // (n, n_layers)
    /* Optional /routing/flip (tidal-diff on a mixture of experts): rows aligned with /tokens, one
     * column per MoE layer (0 same experts, 1 same set other order, 2 other set, -1 not routed by
     * B); NULL for a dense model. route_replay: the run replayed B's routing on A (r3). */
    size_t n_moe_layers;
    int8_t *route_flip;       // (n, n_moe_layers)
    int route_replay;
    /* Token ids of every sequence (prompt + response), for decoded text; NULL if absent. */
    int32_t *ids;             // (n_ids)
    size_t n_ids;
    int64_t *ids_offset;      // (nseq) start of a sequence in ids
    int32_t *seq_len;         // (nseq) prompt_len + response_len
    int32_t *prompt_len;      // (nseq)
    /* Prompt and response text stored by the run (/text, runs with a tokenizer); NULL if
     * absent. Sequence s: prompt text at text + text_offset[s], prompt_text_len[s] bytes, its
     * response the response_text_len[s] bytes after it (UTF-8, not NUL-terminated). */
    char *text;               // (n_text)
    size_t n_text;
    int64_t *text_offset;     // (nseq)
    int32_t *prompt_text_len, *response_text_len;  // (nseq)
} td_run;

/* Loads a run file. Fails with a message naming the file for: not HDF5, not a tidal run, an
 * unknown schema version, a missing required dataset (/tokens/{seq,pos,token,logp_a,logp_b}),
 * columns of unequal length, sequence indices out of range, and an empty run (0 tokens).
 * flags: TD_RUN_LAYERS also reads /layers/rel_err; TD_RUN_PLOT reads only what the plots
 * use (seq, pos, logp_a, logp_b, dlogp, kl_ba): token, k3, tv, entropy_a, is_prompt and the
 * ids stay NULL (decompressing them was half of a heatmap's time at 1M tokens). A file that is
 * being written is read as its last whole commit, and read again when a commit that came during
 * the read made it fail (td_runfile_changed). */
enum { TD_RUN_LAYERS = 1, TD_RUN_PLOT = 2 };
int  td_run_load(td_run *run, const char *path, int flags, td_error *err);
void td_run_free(td_run *run);

/* count, mean, p50, p90, p99, max over the finite values of x (n); x is not modified. */
typedef struct { size_t count; double mean, p50, p90, p99, max; } td_summary;
void td_summary_compute(const double *x, size_t n, td_summary *s);
/* Quantile f (linear interpolation, as above) of v (m >= 1 values, reordered in place). */
double td_quantile_select(double *v, size_t m, double f);
/* rank[i] = the 1-based rank of x[i] among x's m values (finite), tied values sharing the mean of
 * their ranks (-0 ties +0): what gsl_stats_spearman ranks by, in O(m) (a radix sort of the values'
 * ordered bit patterns) instead of GSL's heapsort. */
void td_average_ranks(const double *x, size_t m, double *rank);
/* Spearman's rank correlation of the m pairs (x, y), all finite: Pearson (gsl_stats_correlation)
 * of the average ranks in the pairs' order; NAN for m < 2. The value of gsl_stats_spearman up to
 * the last bits (that one correlates in its sort's order). */
double td_spearman(const double *x, const double *y, size_t m);

/* Importance-sampling simulator. A correction is a level, a mode and a band [lo, hi]:
 * truncate clamps w into [lo, hi] (TIS: lo = 0, hi = C); mask zeroes w outside [lo, hi]
 * (MIS, IcePop α..β, geometric 0.999..1.001). Log weights are clamped to ±20 before exp,
 * as trainers do, so one runaway sequence cannot overflow (the raw log range is reported). */
typedef enum { TD_IS_TOKEN = 0, TD_IS_SEQUENCE, TD_IS_GEOMETRIC } td_is_level;
typedef enum { TD_IS_TRUNCATE = 0, TD_IS_MASK } td_is_mode;
typedef struct { td_is_level level; td_is_mode mode; double lo, hi; } td_is_spec;
#define TD_IS_LOG_CLAMP 20.0

/* Parses "LEVEL:MODE:HI" or "LEVEL:MODE:LO:HI" (token|sequence|geometric, truncate|mask). */
int td_is_spec_parse(const char *s, td_is_spec *spec, td_error *err);
const char *td_is_level_name(td_is_level l);
const char *td_is_mode_name(td_is_mode m);

/* Weight statistics before any correction. ess = 1 / mean((w / mean w)²) as a fraction of n;
 * inv_ess_m1 = 1/ess − 1 = mean(w²)/mean(w)² − 1 = Var(w)/mean(w)² (≥ 0: the spread of the
 * weights alone, the mean normalised away).
 * chi2: token and sequence levels mean(w²) − 1, verl's chi2_token / chi2_seq. It mixes the spread
 * with the sampling noise of the mean weight (mean(w²) − 1 = Var(w) + (mean w)² − 1), which
 * dominates at small mismatch, hence inv_ess_m1 beside it. Geometric level: G = W^(1/T) is not an
 * unbiased ratio (E_μ[G] ≤ 1 by Jensen), so mean(G²) − 1 goes negative whenever mean G < 1 with
 * little spread; there chi2 is defined on the self-normalised weights, mean((G / mean G)²) − 1,
 * i.e. equal to inv_ess_m1, never negative. */
typedef struct {
    size_t n;
    double log_min, log_max;          // raw log weights, before the ±20 clamp
    double w_min, w_mean, w_max, ess_frac, chi2, inv_ess_m1;
} td_is_raw;
/* After one correction: shares of weights below lo / above hi (clipped or masked), and the
 * mean and ess of the corrected weights. */
typedef struct { double frac_lo, frac_hi, w_mean, ess_frac; } td_is_corr;

/* Log weights of a level from a run's response tokens: token level n = response tokens;
 * sequence and geometric n = sequences with ≥ 1 response token. Caller frees *logw. */
int  td_is_log_weights(const td_run *run, td_is_level level, double **logw, size_t *n);
void td_is_raw_stats(const double *logw, size_t n, td_is_level level, td_is_raw *r);

/* The mismatch diagnostics verl logs (verl/trainer/ppo/rollout_corr_helper.py,
 * compute_offpolicy_metrics; π_old = path A, μ = rollout = path B), over the response tokens:
 *   kl = mean_t(logp_b − logp_a) (k1, signed: can be negative), k3_kl = mean_t k3,
 *   per sequence d_i = mean_t logp_b − mean_t logp_a (rollout log-ppl minus training log-ppl
 *   with the sign verl uses: log_ppl_diff = log PPL_train − log PPL_rollout),
 *   log_ppl_diff = mean_i d_i, log_ppl_abs_diff = mean_i |d_i|, its max and min,
 *   ppl_ratio = mean_i exp(d_i) (PPL_train / PPL_rollout per sequence, averaged),
 *   training_ppl = mean_i exp(−mean_t logp_a), rollout_ppl likewise with logp_b, and their logs
 *   training_log_ppl = mean_i (−mean_t logp_a), rollout_log_ppl.
 * Sequences without response tokens are left out; NaN when there is none. */
typedef struct {
    size_t n_tokens, n_seqs;
    double kl, k3_kl, log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min, ppl_ratio;
    double training_ppl, rollout_ppl, training_log_ppl, rollout_log_ppl;
} td_verl_metrics;
void td_verl_metrics_compute(const td_run *run, td_verl_metrics *v);
void td_is_apply(const double *logw, size_t n, const td_is_spec *spec, td_is_corr *c);

/* The whole report of one run as JSON (what --json prints): summaries, parity bands,
 * correlations, buckets, worst tokens/sequences (decoded when tok_decode is given), IS. */
typedef char *(*td_decode_fn)(void *ctx, const int32_t *ids, size_t n);
typedef struct {
    const td_is_spec *is;     // corrections to simulate
    size_t n_is;
    size_t n_worst;           // worst tokens and sequences listed
    td_decode_fn decode;      // NULL: ids are printed (or the stored text, below)
    void *decode_ctx;
    int stored_text;          // no decode: a worst sequence's response from the run's /text
} td_report_opts;
json_t *td_report_run(const td_run *run, const td_report_opts *opts, td_error *err);

/* Text renderings of one or more reports (runs side by side in one table). */
void td_report_print_text(FILE *f, json_t *const *reps, size_t n);
void td_report_print_markdown(FILE *f, json_t *const *reps, size_t n, const char *const *figures,
                              size_t n_figures);

TD_END_DECLS

#endif
