/* tidal — precision recipes: what "running a path in BF16 / FP16 / FP8" means, exactly.
 *
 * A recipe is data (a named preset, or a small JSON file deriving from one), never a compile-
 * time switch, so one process runs two of them side by side: recipe A drives the training
 * path, recipe B the inference path. The forward (src/model) reads these fields at each of its
 * rounding points:
 *
 *   weights       storage of GEMM weights: every weight matrix is rounded once, at load, to this
 *                 format (fp8: fake-quantised with weight_scaling, e.g. 128x128 blocks), and the
 *                 GEMM multiplies the rounded values. Embedding and norm weights follow
 *                 `activations` (HF casts the whole model to one dtype).
 *   activations   dtype of the residual stream and of every op output (norm, RoPE, attention,
 *                 GEMM outputs): values are rounded to it where a kernel would write them.
 *   gemm_inputs   format of activation operands of the GEMMs: the activations dtype, or fp8
 *                 (dynamic, act_scaling, e.g. 1x128 groups per token) for FP8 recipes.
 *   accumulate    fp32 (tensor cores with fp32 accumulation: products of 16/8-bit values are
 *                 exact in fp32, so an fp32 GEMM over rounded operands is what the tensor core
 *                 computes, up to summation order), or fp8-fast: Hopper FP8 accumulation keeping
 *                 acc_fraction_bits (~13-14) fraction bits within each promote_every (128)
 *                 products, then promoted into an fp32 sum (DeepSeek-V3 / DeepGEMM).
 *   split_k       GEMM reduction split into this many partial sums added in fp32 (another kernel).
 *   attention     full: scores materialised, fp32 softmax, P·V in fp32; flash: key blocks of
 *                 attn_block with an online softmax and P rounded to `activations` before P·V, as
 *                 FlashAttention does. decode_splits > 1: decode splits the KV range and merges
 *                 the partial results by log-sum-exp (split-KV / flash-decoding).
 *   kv_cache      format of cached K and V (inference path): the activations dtype, or fp8 e4m3
 *                 with kv_scale (0 = per-tensor scale from the first prefill's amax).
 *   lm_head_fp32  logits from fp32 hidden state and fp32 weights (the MiniMax-M1 fix) instead of
 *                 the native dtype.
 *   norm_fused    RMSNorm rounds once (fused kernel, fp32 inside) instead of HF's two roundings
 *                 (normalised x rounded to dtype, then times the weight rounded again).
 *   rope_fused    RoPE in fp32 with one rounding, instead of HF's dtype cos/sin products.
 *   batch_invariant  a row's result independent of the batch it is in: GEMMs of one row use
 *                 the GEMM kernel (not GEMV), whose summation order does not depend on the
 *                 number of rows; attention is computed per row anyway.
 */
#ifndef TIDAL_RECIPE_H
#define TIDAL_RECIPE_H

#include "tidal/scaling.h"

TD_BEGIN_DECLS

typedef enum { TD_ACC_FP32 = 0, TD_ACC_FP8_FAST = 1 } td_accumulate;
typedef enum { TD_ATTN_FULL = 0, TD_ATTN_FLASH = 1 } td_attention;

typedef struct {
    char name[64];
    char description[160];
    td_format weights;
    td_fp8_scheme weight_scaling;      /* used when weights is fp8                    */
    td_format activations;             /* fp32, bf16 or fp16                          */
    td_format gemm_inputs;             /* == activations, or e4m3 / e5m2              */
    td_fp8_scheme act_scaling;         /* used when gemm_inputs is fp8                */
    td_accumulate accumulate;
    int promote_every;                 /* products per promotion (fp8-fast), 128      */
    int acc_fraction_bits;             /* fraction bits kept (fp8-fast), 13           */
    int split_k;                       /* >= 1                                        */
    td_attention attention;
    int attn_block;                    /* key block size of flash attention           */
    int decode_splits;                 /* >= 1; > 1 = split-KV decode, LSE merge      */
    td_format kv_cache;                /* activations dtype, or e4m3                  */
    float kv_scale;                    /* fp8 KV scale; 0 = from the first prefill    */
    bool lm_head_fp32;
    bool norm_fused;
    bool rope_fused;
    bool batch_invariant;
} td_recipe;

/* The presets, in the order --list-recipes prints them. */
size_t td_recipe_num_presets(void);
const td_recipe *td_recipe_preset(size_t i);
const td_recipe *td_recipe_find_preset(const char *name);   /* NULL if unknown */

/* A preset name, or the path of a JSON recipe file: {"base": "bf16-infer", "lm_head": "fp32",
 * ...} — every field above may be given (formats by name, scaling as {"granularity": "block",
 * "arith": "div", "pow2": false, "group": 128}); unknown keys and bad values are errors that
 * name the file and the field. 0 or -1 + err. */
int td_recipe_resolve(const char *name_or_path, td_recipe *out, td_error *err);
int td_recipe_from_json(const char *json_text, size_t len, const char *what, td_recipe *out,
                        td_error *err);

/* The full recipe as a JSON object (caller frees): printed into every output file. Parsing it
 * back with td_recipe_from_json gives the same recipe. */
char *td_recipe_to_json(const td_recipe *r);

/* Checks internal consistency (formats allowed per field, sizes positive); 0 or -1 + err. */
int td_recipe_check(const td_recipe *r, const char *what, td_error *err);

/* The plain fp32 reference (NULL counts as fp32): every op then runs its fp32 reference form,
 * on the model's own weights. */
bool td_recipe_is_plain_fp32(const td_recipe *r);

/* The recipe the lm_head GEMM runs with: fp32 throughout with lm_head_fp32; otherwise the
 * activations dtype for its operands (an fp8 weight format falls back to it: engines keep the
 * lm_head out of FP8 GEMMs), always fp32 accumulation. */
td_recipe td_recipe_for_head(const td_recipe *r);

/* Whether a path's GEMM inputs / weights are fp8. */
static inline bool td_recipe_fp8_gemm(const td_recipe *r)
{
    return r->gemm_inputs == TD_E4M3 || r->gemm_inputs == TD_E5M2;
}

TD_END_DECLS

#endif
