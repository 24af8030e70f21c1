/* tidal — the training step: the training path's forward (teacher-forced, activations kept),
 * a loss on each target token's log-prob, the backward through the op list under the training
 * recipe, and AdamW on fp32 master weights — full fine-tuning or LoRA.
 *
 * Precision, as mixed-precision trainers run it (ops.h, src/backend/cpu_backward.c):
 *   fp32 master weights and fp32 gradients/moments, carved by the parameter table
 *   (td_config_params: one allocation each, same offsets); the recipe's forward rounds where
 *   its kernels write (the path tidal-diff measures, bit for bit), the backward mirrors it
 *   (GEMM operands and grad-outputs in the recipe's dtype, fp32 accumulation); FP8 recipes
 *   run dgrad and wgrad GEMMs in FP8 with the forward's 1x128 / 128x128 quantisation and keep
 *   the gradients between ops in BF16 (Jet-RL's unified flow). After every optimiser step the
 *   recipe's rounded weights are made again from the masters.
 *   FP16 (activations fp16): dynamic loss scaling with torch.cuda.amp.GradScaler's semantics:
 *   the loss is multiplied by the scale (init 2^16); after the backward the gradients are
 *   checked for Inf/NaN; an overflowing step is skipped (no update, counted) and the scale
 *   multiplied by backoff (0.5); otherwise the gradients are unscaled before clipping and the
 *   step taken, and after growth_interval (2000, PyTorch's default) consecutive good steps the
 *   scale is multiplied by growth (2).
 *
 * Loss: the caller owns it. For each sequence the trainer gives the log-probs of its targets,
 * logp[t] = log pi(tokens[t+1] | tokens[..t]) for t = 0 .. len-2, and the caller's loss
 * function returns its value and writes dL/dlogp[t] (0 for tokens outside the loss). Then
 *   SFT  (td_trainer_accumulate_sft):  L = -sum_t w_t logp_t / Z   (w = loss mask or weights;
 *        Z = sum of w over the batch unless given: the mean token cross-entropy over the masked
 *        targets, as HF's labels != -100);
 *   RL   dL/dlogp_t = -A_t * rho_t / Z for a policy gradient with per-token advantages and
 *        importance weights, or any per-token function (PPO-clip's derivative) — the callback
 *        sees the current log-probs first, so ratios to rollout log-probs can be formed.
 * The gradients of several calls add up (gradient accumulation) until td_trainer_step.
 *
 * Optimiser: torch.optim.AdamW (bias correction, decoupled weight decay lr * wd * param, the
 * same operation order), global-norm clipping as torch.nn.utils.clip_grad_norm_ (pre-clip
 * norm returned, coefficient max_norm / (norm + 1e-6) clamped to 1), learning-rate schedules
 * as transformers' get_scheduler (constant, constant_with_warmup, linear, cosine; warmup
 * steps = ceil(warmup_ratio * max_steps) as TrainingArguments). Weight decay skips biases and
 * norm weights (HF Trainer's get_decay_parameter_names) unless decay_all.
 * LoRA: PEFT's init (A ~ kaiming_uniform(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)); B = 0),
 * the base frozen, A and B trained, saved as a PEFT adapter directory.
 */
#ifndef TIDAL_TRAIN_H
#define TIDAL_TRAIN_H

#include "tidal/common.h"
#include "tidal/lora.h"
#include "tidal/model.h"
#include "tidal/recipe.h"

TD_BEGIN_DECLS

typedef enum {
    TD_SCHED_CONSTANT = 0,          /* lr throughout (HF "constant": no warmup)           */
    TD_SCHED_CONSTANT_WARMUP,       /* linear warmup, then lr                               */
    TD_SCHED_LINEAR,                /* linear warmup, linear decay to 0 at max_steps        */
    TD_SCHED_COSINE,                /* linear warmup, half-cosine decay to 0 at max_steps   */
    TD_SCHED_COUNT
} td_lr_schedule;

/* "constant", "constant_with_warmup", "linear", "cosine" (HF SchedulerType names); -1 if not. */
int td_lr_schedule_from_name(const char *name);
const char *td_lr_schedule_name(td_lr_schedule s);

typedef struct {
    /* AdamW, torch.optim.AdamW's arguments; defaults as HF TrainingArguments */
    double lr;                 /* 5e-5 */
    double beta1, beta2;       /* 0.9, 0.999 */
    double eps;                /* 1e-8 */
    double weight_decay;       /* 0 */
    int decay_all;             /* 0: no decay on biases and norm weights (HF Trainer) */
    int freeze_router;         /* mixtures of experts: the routers are not trained (no gradient, no
                                  optimiser state; they keep the checkpoint's weights)          */
    int output_router_logits;  /* mixtures of experts: 1 adds transformers' load-balancing loss
                                  (load_balancing_loss_func) times router_aux_loss_coef to the
                                  loss, as a model with output_router_logits on does (below);
                                  0 not; -1 config.json's output_router_logits (transformers'
                                  default: the model's config)                                */
    double router_aux_loss_coef; /* its weight; NAN: config.json's router_aux_loss_coef        */
    double max_grad_norm;      /* 1.0; <= 0: no clipping (the norm is still reported) */
    /* schedule: the multiplier of lr at optimiser step k (0-based) */
    td_lr_schedule schedule;   /* TD_SCHED_LINEAR (HF's default) */
    int max_steps;             /* the schedule's length (needed by linear / cosine) */
    double warmup_ratio;       /* 0; warmup steps = ceil(warmup_ratio * max_steps) */
    int warmup_steps;          /* > 0 overrides warmup_ratio */
    /* dynamic loss scaling: -1 = on for fp16 activations, 0 off, 1 on */
    int loss_scaling;
    double init_scale;         /* 65536 */
    double growth_factor;      /* 2 */
    double backoff_factor;     /* 0.5 */
    int growth_interval;       /* 2000 */
    /* LoRA: r = 0 trains every weight; r > 0 trains an adapter on `lora_modules` */
    int lora_r;
    double lora_alpha;         /* 16 when 0 */
    unsigned lora_modules;     /* bit mask of td_lora_module; 0 = q_proj | v_proj (PEFT's Llama default) */
    uint64_t seed;             /* LoRA A initialisation */
    /* LoRA: the dtype the frozen base is held in (HF from_pretrained's torch_dtype: TD_F32,
     * TD_BF16, TD_F16): every weight of the model is rounded to it once at creation, as a
     * model loaded in that dtype holds it. 0 (TD_F32): the fp32 masters. Full fine-tuning
     * keeps fp32 masters whatever this says (td_trainer_create refuses another value). */
    int lora_base_dtype;
    /* gradient checkpointing (HF's gradient_checkpointing): keep only the stream entering each
     * layer and recompute the layer's activations in the backward; the same gradients bit for
     * bit, activations memory ~L times smaller, one more forward per micro-batch */
    int gradient_checkpointing;
    /* sizes */
    int max_tokens;            /* rows of one micro-batch (sum of sequence lengths) */
    int max_seq_len;
    int logits_rows;           /* lm_head chunk, 0 = 256 */
} td_train_opts;

void td_train_opts_defaults(td_train_opts *o);
/* output_router_logits -1 and router_aux_loss_coef NAN replaced by the model config's (what
 * td_trainer_create does with them; callers that record the settings call it first). */
void td_train_opts_resolve_moe(td_train_opts *o, const td_config *c);
/* PEFT's target_modules as a flag spells them: "q_proj,v_proj" or "all-linear" (every linear
 * layer of the block) into a lora_modules mask. 0, or -1 with why (the accepted names). */
int td_lora_targets_parse(const char *value, unsigned *mask, char *why, size_t whylen);
/* --lora-dropout as PEFT's lora_dropout: only 0 is accepted (why says why otherwise). */
int td_lora_dropout_parse(const char *value, double *p, char *why, size_t whylen);

typedef struct td_trainer td_trainer;

/* A trainer for model m (its weights are copied into fp32 masters: m itself is not changed
 * and may be freed afterwards) under recipe r (NULL = fp32). With lora_init (may be NULL) and
 * opts->lora_r > 0, training continues that adapter instead of a fresh PEFT initialisation.
 * NULL + err on bad options. */
td_trainer *td_trainer_create(const td_model *m, const td_recipe *r, const td_train_opts *opts,
                              const td_lora *lora_init, td_error *err);
void td_trainer_free(td_trainer *tr);

/* Per sequence: given the target log-probs logp[0 .. n-1] (n = len - 1), write dL/dlogp into
 * dlogp[0 .. n-1] and return this sequence's loss contribution. Called once per sequence and
 * micro-batch, in order of s. */
typedef double (*td_loss_fn)(void *user, int seq, int n, const float *logp, float *dlogp);

/* Forward + backward of nseq sequences (lens[s] >= 2), in micro-batches of whole sequences
 * that fit max_tokens; gradients accumulate. *loss (may be NULL) receives the sum of the loss
 * function's returns. 0, or -1 + err (bad token, length, non-finite loss). */
int td_trainer_accumulate(td_trainer *tr, int nseq, const int *const *tokens, const int *lens,
                          td_loss_fn fn, void *user, double *loss, td_error *err);

/* The SFT loss: weights[s][t] on target t (token t+1; a 0/1 loss mask or a weight),
 * L = -sum w logp / normaliser; normaliser <= 0 takes sum of w over these sequences. */
int td_trainer_accumulate_sft(td_trainer *tr, int nseq, const int *const *tokens,
                              const int *lens, const float *const *weights, double normaliser,
                              double *loss, td_error *err);

typedef struct {
    int step;                  /* optimiser steps taken so far (skipped ones not counted) */
    double lr;                 /* the learning rate this step used */
    double grad_norm;          /* global L2 norm before clipping (unscaled), Inf/NaN on overflow */
    double loss_scale;         /* the scale the gradients carried (1 without loss scaling) */
    int skipped;               /* this step was skipped (non-finite gradients) */
    long skipped_total;        /* skipped steps so far */
    int nonfinite_param;       /* index in the parameter table of the first non-finite
                                  gradient, -1 if none */
} td_step_info;

/* Checks the gradients (Inf/NaN), unscales, clips, updates (AdamW at the schedule's lr),
 * zeroes the gradients and prepares the recipe's weights from the new masters. With loss
 * scaling an overflowing step is skipped and reported (a non-finite loss in a micro-batch counts
 * as an overflow: td_trainer_accumulate then skips that micro-batch's backward, as GradScaler
 * skips the step an inf loss makes); without it a non-finite gradient is an error naming the
 * first tensor (nothing is updated), and a non-finite loss an error of td_trainer_accumulate
 * naming the first non-finite weight, or saying the weights are finite (the forward overflowed). */
int td_trainer_step(td_trainer *tr, td_step_info *info, td_error *err);

/* Learning-rate multiplier of optimiser step k (0-based) for these options (HF get_scheduler). */
double td_lr_lambda(const td_train_opts *o, int k);

/* The current master weights as a model (valid until the trainer is freed or steps): for
 * rollouts on the inference path, or evaluation. Under LoRA: the frozen base. */
const td_model *td_trainer_model(const td_trainer *tr);
/* Mixtures of experts: the update's forward (and so its backward) takes the experts fn supplies
 * for each token and MoE layer (routing replay, model.h td_moe_replay_fn), seq being the index of
 * the sequence in td_trainer_accumulate's call; NULL: the trainer routes itself. */
void td_trainer_set_moe_replay(td_trainer *tr, td_moe_replay_fn fn, void *user);
/* Observers of the update's forward, seq again the index in td_trainer_accumulate's call: row_fn
 * gets every row's full log-prob row (pos: the position it follows, as td_forward_logprobs hands
 * them), route_fn every MoE layer's routing (model.h td_moe_fn), in the order the forward makes
 * them (sequences in order, micro-batch by micro-batch). Either may be NULL. With one optimiser
 * step per batch this forward is pi_old's: tidal-rl takes pi_old's log-probs, entropy and routing
 * from it, as TRL does (rl.h). */
void td_trainer_set_observers(td_trainer *tr, td_row_fn row_fn, td_moe_fn route_fn, void *user);
/* The adapter being trained (fp32 A and B), NULL without LoRA: set it on a path with
 * td_session_set_recipe_lora to roll out the current policy. */
const td_lora *td_trainer_lora(const td_trainer *tr);
/* Under LoRA, the frozen base as a writable model (NULL without LoRA): a caller that changes it
 * (PEFT's merge/unmerge drift, a resumed run's drifted base) calls td_trainer_params_changed. */
td_model *td_trainer_base(td_trainer *tr);
/* Under LoRA with the weights prepared on the device: keeps a copy of the frozen base there
 * (m->owned_dev, the host copy current too), so a merged adapter is folded on the device
 * (weights_recipe.c) and the base is prepared there; td_trainer_params_changed uploads it again.
 * A no-op otherwise (the CPU, TIDAL_PREPARE_ON_HOST=1, full fine-tuning, a second call). Costs
 * one fp32 copy of the model on the device. */
void td_trainer_base_to_device(td_trainer *tr);

/* Writes the gradients accumulated so far (unscaled fp32, before clipping) as safetensors under
 * the HF tensor names (PEFT names under LoRA), with the batch that produced them:
 *   input_ids  I64 (nseq, T) right-padded with pad_id, T = the longest sequence
 *   loss_mask  I64 (nseq, T): 1 where token t is a target (predicted from position t-1) with
 *              a non-zero weight, as HF's labels != -100
 * and metadata (loss, normaliser, recipe, command). weights as td_trainer_accumulate_sft. */
int td_trainer_dump_grads(const td_trainer *tr, const char *path, int nseq,
                          const int *const *tokens, const int *lens, const float *const *weights,
                          int pad_id, const char *command, td_error *err);

/* Saves a Hugging Face checkpoint directory (model.safetensors in dtype dt, config.json) of the
 * master weights; under LoRA a PEFT adapter directory (adapter_config.json,
 * adapter_model.safetensors, F32). Files are written under temporary names and renamed. */
int td_trainer_save(const td_trainer *tr, const char *dir, int dtype, const char *command,
                    td_error *err);

/* Read-only views for tests and tools: the parameter count trained, and the gradient / master
 * buffers carved by the parameter table (LoRA: A and B of each adapted pair in layer, module
 * order). */
size_t td_trainer_num_params(const td_trainer *tr);
/* On a device (the model given to td_trainer_create had one) the gradients are downloaded by
 * this call into a host copy: read it, do not write it; td_trainer_zero_grads zeroes both. */
const float *td_trainer_grads(const td_trainer *tr);
void td_trainer_zero_grads(td_trainer *tr);
/* Whether every accumulated gradient is finite (their sum of squares, on the trainer's device:
 * nothing but one double crosses). */
int td_trainer_grads_finite(const td_trainer *tr);
/* The trained parameters on the host. On a device whose masters only it keeps current (full
 * fine-tuning, src/train/trainer.c) each call downloads them first: call it once, write, then
 * td_trainer_params_changed (which uploads them). */
float *td_trainer_params(td_trainer *tr);
/* After writing into td_trainer_params (tests: finite differences): prepares the recipe's
 * weights again. 0 or -1 + err. */
int td_trainer_params_changed(td_trainer *tr, td_error *err);
/* The current loss scale (1 without loss scaling). */
double td_trainer_loss_scale(const td_trainer *tr);

/* Resumable state (src/train/state.c): the fp32 masters of the trained tensors and both AdamW
 * moments (safetensors: param.NAME, exp_avg.NAME, exp_avg_sq.NAME under the HF / PEFT names),
 * the optimiser step, the skipped-step count and the GradScaler's scale and growth tracker (in
 * the metadata). Loading it into a trainer created with the same model, recipe and options
 * continues bit for bit where the saved one stood; gradients are zeroed. 0 or -1 + err (a file
 * of another model, rank or shape, non-finite values). */
int td_trainer_save_state(const td_trainer *tr, const char *path, td_error *err);
int td_trainer_load_state(td_trainer *tr, const char *path, td_error *err);

/* HF's auxiliary load-balancing loss (opts.output_router_logits; src/train/aux_loss.c). Each
 * micro-batch (one forward) adds coef * aux to the loss, aux = load_balancing_loss_func over its
 * rows and every MoE layer (transformers concatenates the layers' router logits):
 *   aux = E * sum_e f_e P_e,  f_e = (selections of e by the rows' own top-k) / (rows * layers),
 *                             P_e = (sum of the router softmax p_e over rows and layers) / (rows * layers)
 * with the gradient through P only (top-k has none), as autograd gives it. The top-k is the path's
 * own, recomputed from its probabilities as transformers does from the logits, also under routing
 * replay. With several micro-batches in an optimiser step each one's aux is weighted by its share
 * of the step's rows (transformers averages the per-forward losses over gradient accumulation);
 * the step's rows are those of one td_trainer_accumulate call unless set here (rows > 0: the rows
 * of all calls up to the next td_trainer_step; 0: per call again). */
void td_trainer_set_aux_rows(td_trainer *tr, long rows);
/* The aux value (unscaled: transformers' outputs.aux_loss) of the micro-batches since the last
 * reset, weighted as above; NAN when the loss is off. reset: zero it after reading. */
double td_trainer_aux_loss(td_trainer *tr, int reset);

/* Token accuracy (TRL's mean_token_accuracy): of the targets with a non-zero dL/dlogp seen by
 * td_trainer_accumulate since the last reset, how many were their row's most probable token
 * (argmax of the training path's log-softmax). reset: zero the counters after reading. */
void td_trainer_token_accuracy(td_trainer *tr, long *correct, long *total, int reset);

/* The training path's rows become log-softmax(logits / T) (td_forward_set_temperature): an RL
 * trainer scores sampled tokens at the sampling temperature, as TRL and verl do. */
void td_trainer_set_temperature(td_trainer *tr, float T);

TD_END_DECLS

#endif
