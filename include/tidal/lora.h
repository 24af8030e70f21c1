/* tidal — LoRA adapters in PEFT format, applied by either path unmerged or merged.
 *
 * An adapter is a directory as PEFT's save_pretrained writes it:
 *   adapter_config.json        {"peft_type": "LORA", "r": 8, "lora_alpha": 16,
 *                               "target_modules": ["q_proj", "v_proj"], "use_rslora": false, ...}
 *   adapter_model.safetensors  base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight
 *                              (r, in) and .lora_B.weight (out, r); mlp.{gate,up,down}_proj the same
 * The update of an adapted projection W (out, in) is dW = scale * B A, with
 * scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
 *
 * Three ways a path runs it (td_forward_set_recipe_lora / td_session_set_recipe_lora, `mode`):
 *   unmerged   (TD_LORA_UNMERGED) the LoRA branch beside the base projection, as PEFT computes
 *              it in the path's activations dtype D:  y = D(y_base + D(scale * D(B D(A x))))
 *              (A, B rounded to D, fp32 accumulation; the LoRA GEMMs never run in FP8). The
 *              trainer's setup.
 *   punica     (TD_LORA_PUNICA) the LoRA branch as vLLM's native adapter serving runs it, the
 *              Punica Triton kernels lora_shrink / lora_expand (vllm/lora/ops/triton_ops/
 *              kernel_utils.py do_shrink_kernel, do_expand_kernel) after the adapter manager's
 *              LoRALayerWeights.optimize() folded the scaling into B, in the lora dtype D:
 *                A_e = D(A), B_e = D(D(B) * scale)                  (optimize: lora_b *= scaling)
 *                buf = fp32(A_e x), scale 1                         (shrink: fp32 accumulate into
 *                                                                    an fp32 buffer)
 *                y   = D(y_base + D(B_e D(buf)))                    (expand: CAST_TYPE casts the
 *                                                                    buffer to D, fp32 accumulate,
 *                                                                    cast to D, ADD_INPUTS adds
 *                                                                    the base output)
 *              With a power-of-two scale this equals the unmerged form bit for bit; otherwise
 *              the folded B_e rounds differently from PEFT's D(scale * u). What an engine with
 *              native adapter sync (TRL AsyncGRPOTrainer, NeMo-RL) computes.
 *   merged     the path's prepared weights are round_fmt(W + scale B A), the sum taken in fp32:
 *              what a rollout engine does after each weight sync. A small update added to BF16
 *              weights is partly lost to rounding; the merge reports how much survives:
 *                survival     = |prepared(W + dW) - prepared(W)|_F / |dW|_F over all adapted
 *                               matrices (1 in fp32; ~0 when the update is far below half an ulp)
 *                changed_frac = share of adapted elements whose prepared value changed
 *                aligned      = <prepared(W + dW) - prepared(W), dW> / |dW|_F^2
 *              When W is already on the format's grid (a bf16 checkpoint merged in bf16), an
 *              element changes only if its update reaches half an ulp: tiny updates vanish
 *              (survival ~ 0). When W is off the grid (fp32 master weights rounded at load), a few
 *              elements near a rounding midpoint flip by a whole ulp: survival can exceed 1
 *              while aligned stays near 1 on average, the update delivered as rounding noise.
 * Supported: LoRA on q/k/v/o/gate/up/down projections, target_modules as a list (PEFT's
 * suffix match) or a string (PEFT's full-match regex on "model.layers.{i}.self_attn.q_proj",
 * or "all-linear"), layers_to_transform, use_rslora. Rejected with a message naming the file and
 * the key: fan_in_fan_out, use_dora, bias other than "none", modules_to_save, rank_pattern,
 * alpha_pattern, layer_replication, peft_type other than LORA, targets outside those seven.
 *
 * Mixtures of experts: every expert's projections are nn.Linear modules in transformers 4 (the
 * hub's layout), and PEFT adapts each under its own name:
 *   model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj             Qwen2-MoE, Qwen3-MoE
 *   model.layers.{i}.mlp.shared_expert.{gate,up,down}_proj           Qwen2-MoE's shared expert
 *   model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3,w2}         Mixtral (gate, up, down)
 * so target_modules ["gate_proj"] adapts every expert's gate and the shared expert's, as PEFT's
 * suffix match does; Mixtral's w1 / w3 / w2 are its gate / up / down. Each layer's pairs sit at
 * slots (td_lora_slots): 0..6 the seven modules (in an MoE layer 4..6 are the shared expert's),
 * then expert e's gate, up, down at 7 + 3e + {0, 1, 2}. The router (mlp.gate, block_sparse_moe.
 * gate) and the shared expert's sigmoid gate (mlp.shared_expert_gate) are nn.Linear too, which
 * "all-linear" and a matching target would adapt in PEFT: tidal refuses such an adapter by name
 * (a LoRA on the router is not modelled) rather than run it without them. transformers 5 fuses
 * the experts into 3-D parameters that PEFT reaches only through target_parameters: such an
 * adapter (a "target_parameters" key) is refused; tidal writes the per-expert names.
 */
#ifndef TIDAL_LORA_H
#define TIDAL_LORA_H

#include "tidal/common.h"
#include "tidal/config.h"
#include "tidal/model.h"
#include "tidal/recipe.h"

TD_BEGIN_DECLS

/* The seven projections a LoRA may adapt, in the order of the decoder layer. */
typedef enum {
    TD_LORA_Q = 0, TD_LORA_K, TD_LORA_V, TD_LORA_O, TD_LORA_GATE, TD_LORA_UP, TD_LORA_DOWN,
    TD_LORA_NMOD
} td_lora_module;

const char *td_lora_module_name(int m);          /* "q_proj", ..., "down_proj"       */
int td_lora_module_from_name(const char *name);  /* -1 if not one of the seven       */
/* (out, in) of module m's weight under cfg. */
void td_lora_module_shape(const td_config *cfg, int m, int *out, int *in);

typedef struct {
    const float *a;        // (r, in)   lora_A.weight, fp32; NULL when not adapted
    const float *b;        // (out, r)  lora_B.weight, fp32
    int out, in;
} td_lora_pair;

/* The LoRA slots of a layer of cfg: TD_LORA_NMOD for a dense model, TD_LORA_NMOD + 3 E with
 * experts (above). */
int td_lora_slots(const td_config *cfg);
/* The kind of projection at a slot (td_lora_module: an expert's gate is TD_LORA_GATE). */
int td_lora_slot_module(int slot);
/* (out, in) of slot `slot` of layer l; -1 when layer l has no such projection (a dense layer's
 * experts, an MoE layer without a shared expert). */
int td_lora_slot_shape(const td_config *cfg, int layer, int slot, int *out, int *in);
/* The module's name in the model, as PEFT sees it: "model.layers.3.mlp.experts.5.gate_proj". */
void td_lora_slot_path(const td_config *cfg, int layer, int slot, char *buf, size_t n);
/* The name a target_modules list uses for module m on cfg ("w1" for a Mixtral gate). */
const char *td_lora_module_leaf(const td_config *cfg, int m);

typedef struct {
    char *dir;
    int rank;              /* r                                                         */
    double alpha;          /* lora_alpha                                                */
    int rslora;            /* use_rslora                                                */
    float scale;           /* alpha / r, or alpha / sqrt(r) with rslora                 */
    int num_layers;        /* L of the config it was loaded for                         */
    int slots;             /* pairs per layer: td_lora_slots of that config             */
    unsigned modules;      /* bit m set when a projection of kind m is adapted anywhere */
    int n_adapted;         /* adapted matrices                                          */
    td_lora_pair *pairs;   // (L, slots)
    float *owned;          /* every A and B, in one allocation                          */
    const float *owned_dev;/* a trainer's copy of owned in the backend's memory: its paths round A
                              and B from it on the device (src/train/trainer.c); NULL: none */
} td_lora;

/* Reads adapter_config.json and adapter_model.safetensors from dir, checks every tensor's
 * shape against cfg (the base model's config), converts to fp32. NULL + err naming the file,
 * the tensor or key, and what was expected. */
td_lora *td_lora_load(const char *dir, const td_config *cfg, td_error *err);
void td_lora_free(td_lora *l);

/* Writes a PEFT adapter for a model of config cfg: adapter_config.json and
 * adapter_model.safetensors (F32) with both A and B drawn from N(0, std^2) (td_rng stream
 * per tensor of seed). PEFT initialises B to zero, a no-op update: tidal's adapters are random
 * on purpose, for tests and for measuring what a merge keeps. modules: bit mask of
 * td_lora_module. base_model (may be NULL) goes into base_model_name_or_path. */
int td_lora_init_random(const char *dir, const td_config *cfg, int rank, double alpha,
                        unsigned modules, double std, uint64_t seed, const char *base_model,
                        const char *command, td_error *err);

/* An adapter of rank r on `modules` of every layer (every slot of those kinds: each expert's
 * too), A and B zero (one allocation, pairs in layer, slot order, A then B): for trainers and
 * writers to fill. scale = alpha / r. */
td_lora *td_lora_new(const td_config *cfg, int rank, double alpha, unsigned modules);
/* Writes lo as PEFT's save_pretrained does (adapter_config.json, adapter_model.safetensors
 * in F32); td_lora_load reads it back. Refuses adapters whose layers differ in what they adapt. */
int td_lora_save(const td_lora *lo, const td_config *cfg, const char *dir, const char *base_model,
                 const char *command, td_error *err);

/* What a merge kept (see above); merged = 0 when the structure has no merged adapter. */
typedef struct {
    int merged;
    double survival;       /* |prepared(W+dW) - prepared(W)|_F / |dW|_F                 */
    double changed_frac;   /* changed elements / adapted elements                       */
    double aligned;        /* <prepared change, dW> / |dW|^2: the update's own component */
    int64_t elements, changed;
} td_lora_merge_stats;

/* How a path runs an adapter (above). */
enum { TD_LORA_UNMERGED = 0, TD_LORA_MERGED = 1, TD_LORA_PUNICA = 2 };

/* Sets a structure's recipe with an adapter (lora may be NULL: the same as set_recipe).
 * mode TD_LORA_MERGED folds it into the recipe's prepared weights, TD_LORA_UNMERGED runs it
 * beside them as PEFT does, TD_LORA_PUNICA as vLLM's LoRA kernels do (A and B are copied,
 * rounded, when the recipe is set: the adapter may be freed afterwards). */
int td_forward_set_recipe_lora(td_forward *f, const td_recipe *r, const td_lora *lora, int mode,
                               td_error *err);
int td_session_set_recipe_lora(td_session *s, const td_recipe *r, const td_lora *lora, int mode,
                               td_error *err);

/* ---- PEFT's merge_adapter() / unmerge_adapter() on a base weight held in dtype D ----
 * (peft/tuners/lora/layer.py, Linear.get_delta_weight / merge / unmerge; what TRL's GRPOTrainer
 * runs around every weight sync to vLLM). With an fp32 adapter (PEFT's autocast_adapter_dtype,
 * TRL's default) and the base W (out, in) in D:
 *   delta = fp32(fp32(B @ A) * scale)                 get_delta_weight, lora_B's dtype (fp32);
 *                                                     B @ A is one sgemm (tidal and torch's CPU
 *                                                     matmul share the BLAS; rank 1 is exact)
 *   merge:    W = D(fp32(W + delta))                  weight.data += delta_weight: torch adds in
 *                                                     the promoted fp32 and rounds to W's dtype
 *   unmerge:  W = D(fp32(W - D(delta)))               peft >= 0.16 (PR #2433):
 *                                                     weight.data -= delta_weight.to(orig_dtype)
 *             W = D(fp32(W - delta))                  peft < 0.16: weight.data -= delta_weight
 * Each D rounds to nearest even without saturation (torch's cast). In D = fp32 every D is the
 * identity, and W + delta - delta still differs from W at the fp32 rounding level. */
typedef enum { TD_PEFT_UNMERGE_ROUNDED = 0, TD_PEFT_UNMERGE_FP32 = 1 } td_peft_unmerge;

/* delta (p->out, p->in) of one adapted pair of lo. */
void td_lora_peft_delta(const td_lora *lo, const td_lora_pair *p, float *delta);
/* dW = fl(alpha * fl(B A)) of one adapted pair (p->out, p->in), the product's sum over the rank an
 * fma chain in k = 0..rank-1 from +0: OpenBLAS's sgemm kernel (cblas_sgemm(alpha, B, A), beta 0)
 * made explicit (every rank 1..16 checked bit for bit on the project's machine), so a device fold
 * (the backend's lora_fold, weights_recipe.c's merged form) can reproduce it on any host. */
void td_lora_fold_delta(const td_lora_pair *p, int rank, float alpha, float *dw);
void td_lora_peft_merge(td_format D, float *w, const float *delta, size_t n);
void td_lora_peft_unmerge(td_format D, td_peft_unmerge form, float *w, const float *delta, size_t n);
td_lora_merge_stats td_forward_lora_stats(const td_forward *f);
td_lora_merge_stats td_session_lora_stats(const td_session *s);

TD_END_DECLS

#endif
