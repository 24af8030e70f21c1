/* tidal — FP16 headroom: before switching a checkpoint to FP16, how close do its values come to
 * FP16's limits? The teacher-forced forward runs over the user's sequences (by default in fp32,
 * the magnitudes an FP16 run would have to hold) and every op output a kernel writes to memory
 * in the activation dtype is observed, per layer and op: the largest |value| against FP16's
 * 65504, how many would overflow (|x| ≥ 65520 rounds to ±inf; (65504, 65520) rounds to 65504),
 * how many are nonzero and below FP16's normal range (|x| < 2^-14 ≈ 6.1e-5: subnormal, fewer
 * significant bits) and how many flush to zero (|x| ≤ 2^-25). Accumulators inside kernels (GEMM
 * sums, softmax, norm statistics) are fp32 in FP16 recipes and are not counted. Weights are
 * checked the same way, per tensor kind.
 *
 * The observation wraps the CPU backend's op table (src/model/ops.h): the forward itself is not
 * changed, and the op is named from its place in the layer (decoder.c's order). */
#ifndef TIDAL_HEADROOM_H
#define TIDAL_HEADROOM_H

#include "tidal/recipe.h"
#include "tidal/seqset.h"

#include <jansson.h>

TD_BEGIN_DECLS

#define TD_FP16_MAX 65504.0
#define TD_FP16_OVERFLOW 65520.0          /* |x| >= this rounds to inf            */
#define TD_FP16_MIN_NORMAL 6.103515625e-05 /* 2^-14                                */
#define TD_FP16_FLUSH 2.98023223876953125e-08 /* 2^-25: |x| <= this rounds to 0  */

typedef struct {
    int layer;             /* -1: embedding, 0..L-1, L: final norm and lm_head; weights: -2 */
    char name[40];         /* op ("q_proj", "input_layernorm", ...) or weight tensor kind  */
    uint64_t count;        /* values observed                                              */
    uint64_t nonfinite;    /* NaN or inf already in the observed run                       */
    uint64_t overflow;     /* |x| >= 65520: ±inf in FP16                                   */
    uint64_t above_max;    /* |x| > 65504 (overflow included)                              */
    uint64_t subnormal;    /* 0 < |x| < 2^-14                                              */
    uint64_t flushed;      /* 0 < |x| <= 2^-25 (a subset of subnormal)                     */
    double max_abs;        /* largest finite |x|                                           */
} td_headroom_row;

typedef struct {
    td_headroom_row *rows; /* ops in forward order, then weights                            */
    size_t n, n_ops;       /* rows, of which the first n_ops are op outputs                 */
    int64_t tokens;        /* token rows run                                                */
} td_headroom;

/* Runs the teacher-forced forward of the checkpoint in model_dir over every sequence of s under
 * recipe r (NULL: fp32), observing every op output. progress: a line per batch (may be NULL). */
int td_headroom_run(const char *model_dir, const td_seqset *s, const td_recipe *r, td_headroom *out,
                    FILE *progress, td_error *err);
void td_headroom_free(td_headroom *h);

/* As JSON (what --json prints), and as a table (text or Markdown) with a verdict. */
json_t *td_headroom_json(const td_headroom *h);
void td_headroom_print(FILE *f, const td_headroom *h, int markdown, int all_rows);

TD_END_DECLS

#endif
