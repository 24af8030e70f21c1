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
 *                 with kv_scale: x -> D(q(x / s) * s); kv_scale 0 means s = 1.0, vLLM's
 *                 default for kv_cache_dtype="fp8" without calibrated scales (vLLM's
 *                 calculate_kv_scales, an amax of the first batch, is not modelled).
 *   lm_head_fp32  logits from fp32 hidden state and fp32 weights (the MiniMax-M1 fix) instead of
 *                 the native dtype.
 *   norm          RMSNorm's roundings, rs = rsqrt(mean(x^2) + eps) in fp32 (D = activations):
 *                 "unfused"   D(D(x rs) w): HF LlamaRMSNorm / Qwen2RMSNorm (hidden.to(dtype)
 *                             then weight * it) and vLLM, whose rms_norm_kernel and
 *                             fused_add_rms_norm_kernel (csrc/layernorm_kernels.cu) write
 *                             (scalar_t)(x * s_variance) * weight[idx] ("hf", "vllm" accepted)
 *                 "fused"     D(x rs w), fp32 inside, one rounding: FlashInfer RMSNormKernel
 *                             (include/flashinfer/norm.cuh), SGLang's RMSNorm on CUDA
 *                 "fused-add" as "fused", and every residual add followed by a norm (each
 *                             layer's two, and the final norm) is FlashInfer's
 *                             FusedAddRMSNormKernel: the stream keeps D(x + r) but the norm
 *                             reads the fp32 sum x + r (its smem_x), rs from it too (SGLang's
 *                             decoder layers call it with the residual; layer 0's first norm
 *                             has none and is "fused")
 *   rope          RoPE's roundings, angle pos * inv_freq in fp32, c = cos, s = sin:
 *                 "unfused"   HF apply_rotary_pos_emb: c, s rounded to D (cos.to(dtype)), every
 *                             product and sum rounded: D(D(x0 c) - D(x1 s)) ("hf" accepted)
 *                 "fused"     fp32 c, s and fp32 rotation, one rounding D(x0 c - x1 s): FlashInfer
 *                             apply_rope_with_cos_sin_cache (SGLang on CUDA keeps its
 *                             cos_sin_cache in fp32, python/sglang/srt/layers/rotary_embedding.py)
 *                 "vllm"      cos/sin cache in D, fp32 rotation, one rounding
 *                             D(x0 D(c) - x1 D(s)): vLLM apply_token_rotary_embedding
 *                             (csrc/pos_encoding_kernels.cu; the cache is cast to the query
 *                             dtype; older vLLM rotated in scalar_t, i.e. "unfused")
 *                 (fp32 products are not contracted into FMAs here; nvcc may contract them:
 *                 at most one fp32 ulp before the rounding to D)
 *   residual      "activations": the residual stream, embedding and norm weights in D (HF model
 *                 cast to D; FSDP MixedPrecision(param_dtype=bf16): everything bf16).
 *                 "fp32": torch.autocast over an fp32 model: embedding and norm weights stay
 *                 fp32 (biases and GEMM weights are cast to D by autocast's linear), the
 *                 residual adds and the embedding are fp32, and RMSNorm over the fp32 stream is
 *                 fp32 throughout, (x rs) w unrounded (its output is rounded where a GEMM
 *                 reads it, to gemm_inputs). q/k-norm (Qwen3) is modelled the same way
 *                 (torch would round x rs to the bf16 input dtype first).
 *   logits_temperature  where logits are divided by the temperature T (td_forward_set_temperature;
 *                 T = 1 leaves them alone): "fp32" (vLLM's sampler: logits.to(float32) then
 *                 div_) or "activations" (TRL GRPOTrainer and verl dp_actor: logits / T in the
 *                 logits' dtype, D(l / T); the logits' dtype is fp32 with lm_head_fp32)
 *   logsoftmax    "fp32": log-softmax in fp32 with an fp32 result (vLLM; verl with flash-attn's
 *                 cross_entropy_loss; autocast's log_softmax) or "activations": F.log_softmax
 *                 on bf16 logits, result rounded to the logits' dtype (TRL's
 *                 selective_log_softmax and verl's logprobs_from_logits_v2 for bf16 logits)
 *   batch_invariant  a row's result independent of the batch it is in, of the shard and of the
 *                 thread count: GEMMs take td_gemm_fixed (gemm.h: one fixed summation order per
 *                 element, as the engines' batch-invariant kernels fix theirs) and attention
 *                 runs per row even in fp32. A recipe without it keeps OpenBLAS's order for
 *                 GEMMs of more than TD_GEMM_FIXED_ROWS (8) rows, which depends on the batch:
 *                 sgemm's blocking and micro-kernels follow the number of rows M (a decode step
 *                 of at most 8 slots takes the fixed order, as an engine's decode kernel has its
 *                 own), and the fp32 reference attention sums a block of rows' scores by sgemm. Per-tensor dynamic activation scaling
 *                 (act_scaling "tensor") takes its amax over the whole batch: such a recipe is
 *                 never batch-invariant, whatever this field says.
 *   moe           how a mixture of experts' layer weights and sums its k experts (src/model/moe.c):
 *                 "hf" (default; transformers' eager sparse-MoE blocks, FSDP and Megatron's
 *                 default dispatcher alike: routing weights rounded to the stream dtype,
 *                 routing_weights.to(hidden_states.dtype); each expert's output rounded by its
 *                 down GEMM, times the weight, rounded; summed with index_add_ in expert-index
 *                 order, each add rounded) or "fused" (vLLM's fused_moe, which SGLang's Triton
 *                 MoE follows: topk_softmax keeps the weights fp32, renormalised in fp32; the
 *                 down GEMM multiplies its fp32 accumulator by the fp32 weight before its one
 *                 rounding, MUL_ROUTED_WEIGHT in fused_moe_kernel; moe_sum adds the k outputs in
 *                 top-k order in a scalar_t (activations dtype) accumulator, each add rounded,
 *                 csrc/moe/moe_align_sum_kernels.cu moe_sum_kernel). Printed only when "fused"; in
 *                 the fp32 reference and under an fp32 residual stream both are the same maths.
 *   router        the precision of a mixture of experts' router GEMM (src/model/moe.c):
 *                 "activations" (default, unprinted: the router is an nn.Linear like any other,
 *                 its logits rounded to the activations dtype before the fp32 softmax, as
 *                 transformers, FSDP and vLLM's / SGLang's ReplicatedLinear gate compute it) or
 *                 "fp32" (Megatron-Core's moe_router_dtype "fp32", which slime / Miles set for
 *                 Qwen3-30B-A3B: megatron/core/transformer/moe/moe_utils.py
 *                 RouterGatingLinearFunction: logits = linear(x.to(fp32), W.to(fp32)), fp32
 *                 operands and output; backward grad_input = (dlogits @ W).to(x's dtype), the
 *                 logits' gradient left in fp32). The softmax, top-k and combine are "moe"'s.
 * Every recipe gives the same results for any thread count: GEMMs are cut into fixed column
 * tiles, never by thread (src/backend/cpu.h).
 */
#ifndef TIDAL_RECIPE_H
#define TIDAL_RECIPE_H

#include <stdio.h>

#include "tidal/scaling.h"

TD_BEGIN_DECLS

typedef enum { TD_ACC_FP32 = 0, TD_ACC_FP8_FAST = 1 } td_accumulate;
typedef enum { TD_ATTN_FULL = 0, TD_ATTN_FLASH = 1 } td_attention;
typedef enum { TD_NORM_UNFUSED = 0, TD_NORM_FUSED = 1, TD_NORM_FUSED_ADD = 2 } td_norm_form;
typedef enum { TD_ROPE_UNFUSED = 0, TD_ROPE_FUSED = 1, TD_ROPE_VLLM = 2 } td_rope_form;

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
    float kv_scale;                    /* fp8 KV scale; 0 = 1.0 (vLLM default)        */
    bool lm_head_fp32;
    td_norm_form norm;
    td_rope_form rope;
    bool batch_invariant;
    bool residual_fp32;                /* "residual": "fp32" (autocast)               */
    bool temp_in_act;                  /* "logits_temperature": "activations"         */
    bool logsoftmax_act;               /* "logsoftmax": "activations"                 */
    bool moe_fused;                    /* "moe": "fused" (vLLM / SGLang fused_moe)    */
    bool router_fp32;                  /* "router": "fp32" (Megatron moe_router_dtype) */
} td_recipe;

/* The presets, in the order --list-recipes prints them. Each preset's doc (td_recipe_preset_doc)
 * names the engine or trainer code it follows. */
size_t td_recipe_num_presets(void);
const td_recipe *td_recipe_preset(size_t i);
const td_recipe *td_recipe_find_preset(const char *name);   /* NULL if unknown */
const char *td_recipe_preset_doc(size_t i);   /* "" when it has none; NULL past the end */
/* Every preset: name, description, what it follows, its full JSON (--list-recipes). */
void td_recipe_print_presets(FILE *f);

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
