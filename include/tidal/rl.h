/* tidal — GRPO-family RL with a training/inference mismatch (tidal-rl), over src/rl/.
 *
 * One step, as an RL framework with an inference engine and a trainer runs it:
 *   0. (--eval-steps N, k % N == 0) the trainer's own policy evaluated greedily on held-out
 *      records (eval_reward, eval_accuracy; below); then the weight sync: the engine receives
 *      the current policy (full fine-tuning: the fp32 masters cast by the rollout recipe; LoRA:
 *      --lora-sync, below);
 *   1. P = B / G prompts from the dataset (a seeded permutation per epoch), B completions in
 *      all (B = per_device_batch_size x gradient_accumulation_steps, TRL's generation batch);
 *   2. rollout: G completions per prompt on the inference path (the rollout recipe, KV-cache
 *      decode, engine-style sampling from per-sequence streams of seed and step): tokens and
 *      mu, the rollout log-probs (processed: after temperature, as vLLM's processed_logprobs;
 *      with --top-p < 1 or --top-k, mu is the truncated distribution's, so the IS ratio also
 *      carries the support mismatch TRL #6789 describes — leave them off to measure precision);
 *   3. rewards: the task's grader (tasks.h) on the decoded completion, or the user's reward
 *      command (below, "Rewards");
 *   4. pi_old: the training path (the training recipe, teacher-forced) recomputes every response
 *      token's log-prob at the sampling temperature; its full rows give the entropy (and, for a
 *      mixture of experts, its routing the flip rates). With one optimiser step per batch that
 *      forward is the update's own (pi_theta = pi_old), and TRL runs no other
 *      (old_per_token_logps = per_token_logps.detach()); tidal does the same: pi_old's values are
 *      read from the update's forward (LoRA included), unless an IS correction needs them before
 *      the loss, or TIDAL_RL_OLD_FORWARD=1 (the separate forward the LoRA grids of reports/rl/lora
 *      ran with, which differed from the update's in rare steps of dying runs; run.c); then a
 *      separate forward without gradient computes them. With beta > 0 the reference model (the initial
 *      weights) is scored by a forward of its own;
 *   5. advantages, IS weights, normalisers (below), then one optimiser step over the B
 *      completions: td_trainer_accumulate with the per-token loss, td_trainer_step.
 * One optimiser step per generation batch (TRL's num_iterations = 1, steps_per_generation =
 * gradient_accumulation_steps): the policy pi_theta being differentiated equals pi_old, so the
 * PPO ratio is exactly 1 at the step (ppo_kl = 0 is logged as a check), and the IS correction is
 * the only off-policy weight — the mismatch between the two paths.
 *
 * ---- the formulas (each named after the framework it follows) ----
 * Advantages (TRL grpo_trainer; verl compute_grpo_outcome_advantage): A = r - mean_group(r),
 * divided by (std + 1e-4) with --scale-rewards group (the group's std) or batch (the whole
 * batch's std; the mean stays per group), not divided with none (Dr.GRPO). std is torch.std's
 * (Bessel-corrected). A group whose rewards are all equal gets A = 0 and is counted
 * (frac_reward_zero_std). Broadcast over the sequence's tokens.
 *
 * IS ratio (decoupled, TRL vllm_importance_sampling_*, verl rollout_correction):
 *   delta_t = pi_old_t - mu_t, clamped to +-20 (verl's safety clamp) before exp;
 *   token   rho_t = exp(delta_t)
 *   seq     rho_s = exp(clamp(sum_t m_t delta_t)) — a product of token ratios (TRL, verl)
 *   geo     g_s   = exp(clamp(mean_t delta_t over m))   (verl seq_mean_k1, slime geometric)
 * detached (a constant in the loss). Corrections (--is-correction; cap C = --is-cap, lower
 * cap c = --is-cap-low, 0 = none):
 *   none        w = 1
 *   token-tis   w_t = clamp(rho_t, c, C)                 TRL token_truncate; verl token (c = 0)
 *   token-mis   w_t = rho_t 1[c <= rho_t <= C]            TRL token_mask
 *   seq-tis     w_t = clamp(rho_s, c, C)                  TRL sequence_truncate; verl sequence
 *   seq-mis     w_t = rho_s 1[c <= rho_s <= C]            TRL sequence_mask (its default); Oat's
 *                                                         ppo_use_seq_is (MIS)
 *   geometric   w_t = g_s 1[c <= g_s <= C]                masked outside a band around 1
 *   icepop      w_t = rho_t 1[c <= rho_t <= C]            two-sided token mask (Ring-1T IcePop)
 * Default caps: token modes C = 2 (TRL PR #3867, verl, slime, SkyRL); sequence modes C = 3 (TRL's
 * default); geometric [0.999, 1.001] (verl preset); icepop [0.5, 5] (Ring-1T, TRL's test).
 * A masked token (weight 0 by a mask mode) either stays in the loss mask and the normaliser —
 * TRL, the default (--is-masked-normaliser keep): the PG term is 0 but the KL term still
 * applies — or leaves both — verl's rejection sampling zeroes response_mask (drop).
 *
 * Per-token loss (TRL _compute_loss; verl compute_policy_loss_vanilla), r = exp(logp - pi_old)
 * (log clamped +-20):
 *   ppo  L_t = max(-A r, -A clip(r, 1 - eps, 1 + eps_high));  with --dual-clip c (verl
 *        clip_ratio_c, > 1) and A < 0: L_t = min(L_t, -A c)
 *   pg   L_t = -A r (no clipping: REINFORCE with the ratio, gradient -A at r = 1)
 *   then L_t *= w_t (after the clip, before the KL: TRL, verl), and with beta > 0
 *   L_t += beta k3_t, k3_t = exp(ref - logp) - (ref - logp) - 1 (TRL: not IS-weighted).
 * Aggregation (TRL loss_type), m = the loss mask, micro-batch = per_device_batch_size
 * sequences in order, GA = gradient_accumulation_steps:
 *   grpo     mean over the micro-batch's sequences of sum_t L m / max(sum_t m, 1), / GA
 *            (a fully masked sequence counts in the mean with 0, as in TRL)
 *   bnpo     sum L m / max(sum m over the micro-batch, 1), / GA
 *   dr_grpo  sum L m / (micro-batch size x max_completion_length), / GA
 *   dapo     sum L m / (sum m over the whole generation batch)   (TRL's default; verl token-mean)
 * --mask-truncated-completions (TRL): a completion that ended without EOS gets m = 0 (out of
 * the loss and of every token count) but its reward still enters its group's mean and std.
 */
#ifndef TIDAL_RL_H
#define TIDAL_RL_H

#include "tidal/common.h"

#include <signal.h>
#include <stdint.h>

TD_BEGIN_DECLS

typedef enum { TD_RLIS_NONE = 0, TD_RLIS_TOKEN_TIS, TD_RLIS_TOKEN_MIS, TD_RLIS_SEQ_TIS,
               TD_RLIS_SEQ_MIS, TD_RLIS_GEOMETRIC, TD_RLIS_ICEPOP, TD_RLIS_COUNT } td_rl_is;
typedef enum { TD_ADVS_GROUP = 0, TD_ADVS_BATCH, TD_ADVS_NONE } td_rl_scale;
typedef enum { TD_LOSS_GRPO = 0, TD_LOSS_BNPO, TD_LOSS_DR_GRPO, TD_LOSS_DAPO } td_rl_loss_type;
typedef enum { TD_PL_PPO = 0, TD_PL_PG } td_rl_policy_loss;

#define TD_RL_IS_NAMES "none|token-tis|token-mis|seq-tis|seq-mis|geometric|icepop"
#define TD_RL_LOSS_NAMES "grpo|bnpo|dr_grpo|dapo"
#define TD_RL_SCALE_NAMES "group|batch|none"
#define TD_RL_LOG_CLAMP 20.0
#define TD_RL_ADV_EPS 1e-4

const char *td_rl_is_name(td_rl_is m);
const char *td_rl_loss_type_name(td_rl_loss_type t);   /* "grpo", "bnpo", "dr_grpo", "dapo" */
/* -1 + err listing the names when unknown. */
int td_rl_is_from_name(const char *name, td_error *err);
/* The default caps of a correction (above). */
void td_rl_is_default_caps(td_rl_is m, double *lo, double *hi);

/* What the loss needs to know. */
typedef struct {
    td_rl_policy_loss policy_loss;
    double epsilon, epsilon_high;      /* 0.2, 0.2 */
    double dual_clip;                  /* 0 = off; > 1 */
    td_rl_loss_type loss_type;         /* dapo */
    double beta;                       /* 0 */
    td_rl_is is_mode;
    double is_cap, is_cap_low;         /* resolved caps (td_rl_is_default_caps unless given) */
    int is_drop_masked;                /* 1: masked tokens leave the loss mask (verl) */
    td_rl_scale scale_rewards;         /* group */
    int num_generations;               /* G */
    int micro_batch;                   /* per_device_batch_size (sequences) */
    int grad_accum;
    int max_completion_length;
} td_rl_loss_cfg;

void td_rl_loss_cfg_defaults(td_rl_loss_cfg *c);

/* A generation batch: B sequences, sequence s's response tokens at [off[s], off[s+1]). */
typedef struct {
    int B;
    const int64_t *off;    /* (B + 1) */
    const float *old;      /* (N) pi_old of each response token            */
    const float *mu;       /* (N) rollout log-prob                         */
    const float *mask;     /* (N) 1 in the loss (0: truncated and masked)  */
    const double *reward;  /* (B) */
} td_rl_batch;

/* What the corrections and normalisers make of a batch. */
typedef struct {
    double *adv;           /* (B) */
    float *w;              /* (N) IS weight */
    float *m;              /* (N) the loss mask the loss uses (mask, minus dropped tokens) */
    double *coef;          /* (B) sequence s's loss = coef[s] * sum_t L_t m_t */
    int zero_std_groups;
    int64_t n_clipped;     /* loss tokens whose weight a truncation changed */
    int64_t n_masked;      /* loss tokens a mask mode zeroed */
    int n_seq_masked;      /* sequences with every loss token masked */
    int64_t n_loss_tokens; /* tokens with mask = 1 */
} td_rl_prep;

/* Advantages (above); zero_std (may be NULL) gets the groups whose rewards are all equal.
 * B must be a multiple of G. */
void td_rl_advantages(const td_rl_loss_cfg *c, int B, const double *reward, double *adv,
                      int *zero_std);
/* Fills prep (caller-allocated arrays) from a batch: advantages, IS weights, the effective mask
 * and each sequence's normaliser. */
void td_rl_prepare(const td_rl_loss_cfg *c, const td_rl_batch *b, td_rl_prep *p);

/* PPO-clip statistics of a loss evaluation (token counts over m). */
typedef struct {
    double n_tokens, clipped, clipped_lower, ratio_log_sum;   /* ratio_log_sum: sum (pi_old - logp) */
} td_rl_clip_stats;

/* One sequence's loss and dL/dlogp (T response tokens): logp = the current policy's, old, ref
 * (NULL when beta = 0), w and m from td_rl_prepare, adv its advantage, coef its normaliser.
 * dlogp[t] receives the derivative; st (may be NULL) accumulates the clip counts. */
double td_rl_seq_loss(const td_rl_loss_cfg *c, int T, const float *logp, const float *old,
                      const float *ref, const float *w, const float *m, double adv, double coef,
                      float *dlogp, td_rl_clip_stats *st);

enum { TD_RL_REPLAY_NONE = 0, TD_RL_REPLAY_R2 = 1, TD_RL_REPLAY_R3 = 2 };   /* --routing-replay none|r2|r3 */

/* ---- per-step metrics: one column of /steps each (reports/SCHEMA.md, "RL runs") ---- */
#define TD_RL_METRICS(X) \
    X(step, "optimiser step (0-based)") \
    X(epoch, "epoch of the step's first prompt") \
    X(lr, "learning rate used") \
    X(loss, "loss of the step (sum over micro-batches)") \
    X(reward, "mean reward (TRL reward)") \
    X(reward_std, "std of rewards over the batch") \
    X(accuracy, "share of built-in task completions with an exact answer (nan: none)") \
    X(frac_reward_zero_std, "share of groups whose rewards are all equal (TRL)") \
    X(zero_std_groups, "groups whose rewards are all equal") \
    X(entropy, "mean token entropy of pi_old over response tokens (nats)") \
    X(grad_norm, "global gradient norm before clipping (nan/inf on overflow)") \
    X(loss_scale, "the loss scale the step's gradients carried (1 without)") \
    X(skipped, "1 when the step was skipped (fp16 overflow)") \
    X(skipped_total, "skipped steps so far") \
    X(nonfinite, "non-finite log-probs or losses seen this step") \
    X(pg_clipfrac, "share of loss tokens where PPO's clip is active (verl)") \
    X(pg_clipfrac_lower, "share where the dual clip is active (verl)") \
    X(ppo_kl, "mean (pi_old - pi_theta) over loss tokens (0 on policy)") \
    X(kl, "TRL kl: mean k3 KL to the reference policy over loss tokens (--beta > 0; nan without)") \
    X(response_length_mean, "mean response tokens") \
    X(response_length_max, "longest response") \
    X(response_length_clip_ratio, "share of completions without EOS (truncated)") \
    X(rollout_corr_kl, "verl rollout_corr/kl: mean (mu - pi_old) over response tokens (k1)") \
    X(k3_kl, "verl k3_kl: mean (rho - log rho - 1)") \
    X(chi2_token, "verl chi2_token: E[rho^2] - 1 over the raw weights (negative when E[rho] < 1; self-normalised: 1/ESS - 1)") \
    X(chi2_seq, "verl chi2_seq: E[rho_seq^2] - 1 over the raw weights (may be negative)") \
    X(logp_diff_mean, "TRL sampling_logp_difference/mean: mean |pi_old - mu|") \
    X(logp_diff_max, "TRL sampling_logp_difference/max") \
    X(probs_diff_mean, "verl training/rollout_probs_diff_mean: mean |p_old - p_mu|") \
    X(probs_diff_max, "verl training/rollout_probs_diff_max") \
    X(probs_pearson, "verl training/rollout_actor_probs_pearson_corr") \
    X(training_ppl, "verl training_ppl") \
    X(rollout_ppl, "verl rollout_ppl") \
    X(ppl_ratio, "verl ppl_ratio (mean over sequences of PPL_train / PPL_rollout)") \
    X(log_ppl_abs_diff, "verl log_ppl_abs_diff") \
    X(rollout_is_mean, "raw token rho: mean") \
    X(rollout_is_std, "raw token rho: std") \
    X(rollout_is_min, "raw token rho: min") \
    X(rollout_is_max, "raw token rho: max") \
    X(rollout_is_eff_sample_size, "raw token rho: ESS fraction 1/mean((rho/mean rho)^2)") \
    X(rollout_is_seq_mean, "raw sequence rho: mean") \
    X(rollout_is_seq_min, "raw sequence rho: min") \
    X(rollout_is_seq_max, "raw sequence rho: max") \
    X(rollout_is_seq_eff_sample_size, "raw sequence rho: ESS fraction") \
    X(rollout_is_clipped_fraction, "share of loss tokens whose weight a truncation changed") \
    X(rollout_rs_masked_fraction, "share of loss tokens a mask mode zeroed") \
    X(rollout_rs_seq_masked_fraction, "share of sequences entirely masked") \
    X(base_drift_max, "LoRA: max |W_t - W_0| over the adapted base weights after the step's sync (nan: full FT)") \
    X(base_drift_mean, "LoRA: mean |W_t - W_0| over the adapted base weights") \
    X(base_drift_frac, "LoRA: share of adapted base weights with W_t != W_0") \
    X(merge_survival, "merged syncs: |E(W + dW) - E(W)|_F / |dW|_F, what the engine's weights kept (nan: adapter, full FT)") \
    X(merge_aligned, "merged syncs: <E(W + dW) - E(W), dW> / |dW|^2, the update's own component kept") \
    X(merge_changed_frac, "merged syncs: share of adapted engine weights the update changed") \
    X(eval_reward, "--eval-steps: mean reward of the trainer's policy, greedy, on the eval records (nan between)") \
    X(eval_accuracy, "--eval-steps: share of eval records answered exactly (own records: reward >= 1; greedy; nan between)") \
    X(routing_flip_rate, "MoE: share of (response token, MoE layer) routing decisions where pi_old's own top-k experts differ from the rollout's as a set (under --routing-replay r3 what pi_old's router would have chosen; nan: a dense model)") \
    X(routing_tokens_flipped, "MoE: share of response tokens whose predicting position has such a flip in at least one MoE layer") \
    X(routing_mismatch_flipped, "MoE: mean |pi_old - mu| over the response tokens with a flip") \
    X(routing_mismatch_unflipped, "MoE: mean |pi_old - mu| over the response tokens without one") \
    X(routing_expert_load, "MoE: the rollout's expert load, max over MoE layers of (tokens of the busiest expert / mean tokens per expert), over the positions that predict response tokens (1 = even)") \
    X(aux_loss, "MoE: transformers' aux_loss of the update, load_balancing_loss_func over every token and MoE layer of each forward (the loss gains router_aux_loss_coef x this; nan: --output-router-logits off)") \
    X(time_rollout, "seconds: generation (and the weight sync) on the inference path") \
    X(time_reward, "seconds: decoding and grading") \
    X(time_old, "seconds: pi_old's separate forward (when it runs, rl.h step 4) and the reference's") \
    X(time_update, "seconds: loss, backward, optimiser step") \
    X(time_step, "seconds: the whole step")

#define TD_RL_X_ENUM(name, doc) TD_RLM_##name,
enum { TD_RL_METRICS(TD_RL_X_ENUM) TD_RLM_COUNT };
#undef TD_RL_X_ENUM
extern const char *const td_rl_metric_names[TD_RLM_COUNT];
extern const char *const td_rl_metric_docs[TD_RLM_COUNT];
/* "/steps/<name>"; -1 if not a metric. */
int td_rl_metric_index(const char *name);

/* ---- rewards: the built-in tasks, or the user's own (--reward-command) ----
 * Dataset records (--dataset-path; any file dataset.h reads: .jsonl, .json, .json.gz) come in
 * TRL's shapes:
 *   {"task": "add", "prompt": "...", "answer": ...}   a built-in task's record (tasks.h): its
 *                                       prompt tokenised as tidal-sft trains it, its grader scores
 *   {"prompt": "text", ...}             TRL's standard prompt: the text as the model sees it,
 *                                       special tokens written in it recognised, none added
 *   {"prompt": [messages], ...}         TRL's conversational prompt, and
 *   {"messages": [messages], ...}       a conversation: the checkpoint's chat template applied as
 *                                       TRL applies it (prompts.h, td_prompt_chat_text)
 * with any other fields ("solution", "tests", "id", ...): they are passed to the reward, as TRL
 * passes dataset columns to reward functions as keyword arguments.
 * With --reward-command CMD every completion is scored by CMD (started once, /bin/sh -c CMD);
 * without it every record must be a built-in task's. For each completion CMD reads one line
 * on stdin, a JSON object: the record's fields, and
 *   "prompt"          the record's prompt as given (a string, or the list of messages; a
 *                     "messages" record's list)
 *   "completion"      the decoded completion, special tokens skipped (TRL's
 *                     skip_special_tokens=True): a string for a standard prompt, for a
 *                     conversational one [{"role": "assistant", "content": text}] (TRL; when the
 *                     prompt ends with an assistant message, text starts with its content)
 *   "completion_ids"  the generated token ids (the EOS included when one ended it)
 * and writes one line on stdout, in the same order: a finite number, or a JSON object of named
 * components {"correct": 1, "format": 0.5} combined as TRL combines reward_funcs, reward =
 * sum_i w_i r_i over the non-null components (null: does not apply; at least one is not null);
 * w_i from --reward-weights NAME=W,... (every name must be in every object, no other), 1 for
 * every component without it. All the step's lines are written before any is read (a script
 * may score them in parallel, answering in order). No line within --reward-timeout seconds of
 * the previous one (of the step's start), a line that is not a reward, more lines than
 * completions, or a process that exits: the run stops with exit 1 and a message naming the
 * record (file:line) and the line of CMD's output; the steps before stay in rl.h5, and --resume
 * continues from the last checkpoint. tidal never executes generated text itself:
 * datasets/rewards/python_exec.py is an example reward that runs generated Python in a
 * sandboxed subprocess. accuracy is then the share of built-in task records answered exactly
 * (nan when the step has none). */
/* Parses --reward-weights "a=1,b=0.5": *n names and weights (caller frees each name and both
 * arrays); 0 or -1 + err naming the bad pair. */
int td_rl_reward_weights_parse(const char *spec, int *n, char ***names, double **w, td_error *err);

/* ---- the collapse detector ----
 * Signals, each with a first step and configurable thresholds (defaults: issue 13 /
 * shared/RL.md section 5; recorded in the run file):
 *   reward_drop   EMA(alpha) of the reward falls >= drop_abs below its best so far, or
 *                 >= drop_rel x (best - initial) when best - initial >= min_gain, and stays
 *                 so for hold steps. The step marked is the first of those hold steps.
 *                 Confirms a collapse.
 *   grad_spike    grad_norm > spike_factor x the median of the previous spike_window steps
 *                 (at least spike_min_history of them), or non-finite, on 2 of 3
 *                 consecutive steps; marked at the first of the two.
 *   entropy       entropy > entropy_hi x or < entropy_lo x its step-0 value for hold steps;
 *                 marked at the first.
 *   mismatch      k3_kl > k3_factor x the median of its first k3_baseline steps (after them)
 *                 and k3_kl > k3_min (0 by default: the rule; a floor such as 1e-4 keeps
 *                 a k3 at the 1e-7 noise level, fp16's, from tripping it), or a verl alarm:
 *                 |rollout_corr_kl| > kl_abs, chi2_token > chi2_max, ESS < ess_min.
 *   length        response_length_clip_ratio > trunc_max.
 *   dead          no policy gradient: every completion truncated (response_length_clip_ratio
 *                 1; with --mask-truncated-completions nothing is in the loss) or every group's
 *                 rewards equal (frac_reward_zero_std 1: every advantage 0), for dead_hold
 *                 steps; marked at the first. tidal-rl says so on stderr when it fires.
 * Precursors (all but reward_drop) are recorded; a collapse is a reward_drop. */
typedef enum { TD_CLP_REWARD = 0, TD_CLP_GRAD, TD_CLP_ENTROPY, TD_CLP_MISMATCH, TD_CLP_LENGTH,
               TD_CLP_DEAD, TD_CLP_NSIGNALS } td_collapse_signal;
extern const char *const td_collapse_signal_names[TD_CLP_NSIGNALS];

typedef struct {
    double ema_alpha, drop_abs, drop_rel, min_gain;
    int hold;
    double spike_factor;
    int spike_window, spike_min_history;
    double entropy_hi, entropy_lo;
    int entropy_hold;
    double k3_factor, k3_min;
    int k3_baseline;
    double kl_abs, chi2_max, ess_min;
    double trunc_max;
    int dead_hold;
} td_collapse_cfg;

void td_collapse_cfg_defaults(td_collapse_cfg *c);
/* Applies "key=value,key=value" (the field names above) onto c; -1 + err naming the key. */
int td_collapse_cfg_parse(td_collapse_cfg *c, const char *spec, td_error *err);
/* The configuration as a JSON object (caller frees). */
char *td_collapse_cfg_json(const td_collapse_cfg *c);

typedef struct td_collapse td_collapse;
td_collapse *td_collapse_new(const td_collapse_cfg *c);
void td_collapse_free(td_collapse *d);
/* Feeds step k's metrics (steps in order from 0). Returns the bit mask of signals that fired
 * for the first time at this call (bit = td_collapse_signal). */
unsigned td_collapse_push(td_collapse *d, const double *metrics);
/* The step a signal was first marked at, -1 if never. */
int td_collapse_first(const td_collapse *d, td_collapse_signal s);
/* A bit mask of signals active (their condition true) at the last pushed step. */
unsigned td_collapse_active(const td_collapse *d);

/* ---- how the engine receives a LoRA policy before each rollout (--lora-sync) ----
 *   merged         the engine's weights are E(W + scale B A), the sum in fp32 from the trainer's
 *                  exact weights, rounded once to the rollout recipe's weight format E: TRL with
 *                  a model loaded in fp32 (its default), up to PEFT's fp32 merge/unmerge noise.
 *   merge-unmerge  TRL GRPOTrainer's sync (v0.16-v0.26 _move_model_to_vllm, v1.x
 *                  VLLMGeneration.sync_weights): PEFT merge_adapter() on the trainer's base held
 *                  in --model-dtype D, every weight to the engine (cast to its recipe), then
 *                  unmerge_adapter() (lora.h has PEFT's arithmetic, peft >= 0.16's unmerge). The
 *                  engine gets E(D(W + delta)); the trainer's base keeps D(D(W + delta) - D(delta)),
 *                  which drifts from W step after step (0 drift only where both roundings are
 *                  exact; in fp32 the drift stays at the fp32 rounding level).
 *   adapter        native adapter sync (TRL AsyncGRPOTrainer /v1/load_lora_adapter, NeMo-RL):
 *                  the engine runs the base E(W) and the LoRA branch unmerged as vLLM's Punica
 *                  kernels do (lora.h, TD_LORA_PUNICA).
 * --model-dtype D (HF torch_dtype: fp32, bf16, fp16; also float32, bfloat16, float16): the dtype
 * the trainer's model is loaded in under LoRA, every weight rounded to it once at the start
 * (the trainer computes W x + s B (A x) on that base under its recipe). Full fine-tuning syncs
 * the fp32 masters cast to the engine's dtype, as before; both flags need --lora-r.
 * /steps records the base drift (base_drift_*) and what a merge kept (merge_*). */
typedef enum { TD_RL_SYNC_MERGED = 0, TD_RL_SYNC_MERGE_UNMERGE, TD_RL_SYNC_ADAPTER } td_rl_lora_sync;
#define TD_RL_SYNC_NAMES "merged|merge-unmerge|adapter"
const char *td_rl_lora_sync_name(td_rl_lora_sync s);

/* ---- the run ---- */
typedef struct {
    const char *model_path, *dataset_path, *output_dir;
    const char *device;        /* where rollouts, pi_old and the update run: "cpu" (NULL), "cuda[:N]" */
    const char *train_recipe, *rollout_recipe;   /* names or JSON files */
    int exact_match;           /* control: mu := pi_old scored by the training path itself */
    int freeze_router;         /* mixtures of experts: the routers are not trained (--freeze-router) */
    int routing_replay;        /* mixtures of experts: TD_RL_REPLAY_NONE, _R2 (pi_theta takes
                                  pi_old's experts), _R3 (pi_old and pi_theta take the rollout's) */
    int output_router_logits;  /* mixtures of experts: the update's loss gains HF's load-balancing
                                  loss x router_aux_loss_coef (train.h); -1: config.json's      */
    double router_aux_loss_coef; /* NAN: config.json's                                          */
    double rollout_logit_noise;/* synthetic mismatch (dose-response arm); 0 = none */
    td_rl_loss_cfg loss;
    int is_cap_given, is_cap_low_given;
    int mask_truncated;
    double learning_rate, warmup_ratio, weight_decay, max_grad_norm;
    int gradient_checkpointing;   /* the trainer recomputes activations (train.h); same results */
    int plan_only;             /* print the GPU memory plan (config.json, --max-seq-length) and stop */
    int ignore_memory_plan;    /* --device cuda: run even when the plan says it does not fit */
    int lr_schedule;           /* td_lr_schedule */
    int lora_r;
    double lora_alpha;
    int lora_sync;             /* td_rl_lora_sync (merged) */
    int model_dtype;           /* td_format of the LoRA base: TD_F32 (default), TD_BF16, TD_F16 */
    int lora_sync_given, model_dtype_given;
    /* clean evaluation (HF's eval_steps): every eval_steps steps (0 = never), before step k's
     * rollout (k % eval_steps == 0, the policy that step samples from), the trainer's own policy
     * (its weights: the fp32 masters, or the LoRA base and the adapter unmerged as PEFT runs it) on
     * the training recipe, decoded greedily on the KV-cache path (no --rollout-logit-noise, no
     * engine sync), graded by the task: /steps eval_reward, eval_accuracy. With --reward-command
     * the records may be the user's own (TRL's shapes): eval_reward is then the command's mean
     * reward and eval_accuracy the share of built-in task records answered exactly, or, when
     * every record is the user's own, the share whose reward is at least 1. Records:
     * eval_dataset_path, else the test.jsonl beside --dataset-path; the first eval_max_samples
     * (0 = all). */
    int eval_steps;
    const char *eval_dataset_path;
    int eval_max_samples;
    double temperature, top_p, repetition_penalty;
    int top_k;
    int max_steps;             /* 0: from epochs */
    double epochs;
    int max_seq_length, max_completion_length;
    int n_jobs;
    uint64_t seed;
    int resume, overwrite;
    const char *resume_checkpoint; /* --resume-from-checkpoint PATH: must be the checkpoint the run
                                      file names (NULL: that one) */
    int save_steps;
    int save_total_limit;      /* --save-total-limit: checkpoints kept, the newest (0: all, HF's default) */
    int log_completions;       /* sequences per step written to /tokens /seqs /prompts */
    td_collapse_cfg collapse;
    int stop_on_collapse;
    const char *command_line;
    int quiet;                 /* no progress lines */
    const char *reward_command;/* NULL: built-in task rewards ("Rewards" above)              */
    const char *reward_weights;/* "name=w,..." or NULL                                       */
    double reward_timeout;     /* seconds a reward line may take (default 600)              */
    unsigned lora_modules;     /* --lora-target-modules: td_train_opts.lora_modules (0: q, v) */
    /* --dump-step K (1-based, as the progress line counts; 0 = none): step K's per-token tensors
     * in TRL's names and shapes, padded [B, T] with completion_mask, written to
     * OUTPUT_DIR/dump-step-K.safetensors (step.c, dump_step): prompt_ids/prompt_mask (left-padded
     * as TRL's tokenizer pads), completion_ids, completion_mask (0 on padding and on truncated
     * completions under --mask-truncated-completions), per_token_logps (pi_theta in the loss),
     * old_per_token_logps (pi_old), sampling_per_token_logps (the engine's mu),
     * ref_per_token_logps (with --beta), importance_sampling_ratio (the IS weight the loss uses),
     * loss_mask (the mask after IS masking), per_token_loss_grad (d loss / d per_token_logps:
     * the coefficient of each token in the gradient), advantages and rewards [B]; metadata: the
     * loss, loss_type, epsilon(s), beta, the step and the command line. A mixture of experts adds
     * sampling_routed_experts (the rollout's) and old_routed_experts (pi_old's forward's), int64
     * [B, P + T, Lm, K] over cat(prompt_ids, completion_ids), -1 where not routed, and metadata
     * moe_layers. Output only: not part of the run's configuration. */
    int dump_step;
    unsigned report_to;        /* --report-to: TD_REPORT_* mask (tfevents.h; default 0, none) */
    const char *chat_template; /* --chat-template FILE (TRL's chat_template_path): conversational
                                  prompts rendered with it, not the checkpoint's (NULL: that one) */
    /* --resume: which of the settings that are not the maths this command gives (1 = given). The
     * others carry over from the run file's rl_config (record.c, rl_carry_over): --report-to,
     * --save-steps, --save-total-limit, --log-completions and the --eval-* trio. --quiet and
     * --stop-on-collapse are this invocation's (a flag cannot be given as off). */
    struct { int report_to, save_steps, save_total_limit, log_completions, eval_steps, eval_max_samples; } given;
    volatile sig_atomic_t *stop; /* set by a signal (td_stop_on_signals): at the next step boundary
                                    the steps done are checkpointed and the run returns 2 */
} td_rl_opts;

void td_rl_opts_defaults(td_rl_opts *o);
/* Checks ranges and combinations (a batch not divisible by G, contradictory flags); 0 or -1 +
 * err naming the flags. */
int td_rl_opts_check(const td_rl_opts *o, td_error *err);
/* Runs (or resumes) the run; writes OUTPUT_DIR/rl.h5, checkpoint-K/ and model/. 0, 1 when it
 * stopped on a collapse (--stop-on-collapse), 2 when o->stop stopped it (the steps done are in
 * checkpoint-K and rl.h5; --resume continues), -1 + err.
 *
 * Resume and extension (as HF Trainer's resume_from_checkpoint). The last step's state is kept
 * as checkpoint-N whatever --save-steps says (each checkpoint-K/ holds the policy, HF's
 * trainer_state.json and tidal's state; all are kept unless --save-total-limit), so --resume
 * continues a stopped run and extends a finished one: with a larger --max-steps (or --epochs)
 * the run goes on to the new total. Every other setting of the run configuration (rl_config)
 * must be the run's own; a resume that changes one is refused, each differing option named
 * with both values. The steps a resumed run takes are the ones the uninterrupted run of the
 * same total takes, bit for bit: the rollouts of step k depend on the seed and k only, and the
 * trainer's state is restored exactly. The learning-rate schedule is recomputed from the new
 * total, as HF's Trainer does (it builds the scheduler from max_steps when it resumes): under
 * constant the extended run equals an uninterrupted run of the new total bit for bit; under
 * linear / cosine (and a --warmup-ratio) the steps after the extension point follow the new
 * total's schedule while the steps already done keep the old one's learning rates. */
int td_rl_run(const td_rl_opts *o, td_error *err);

#define TD_RL_RUNFILE "rl.h5"

TD_END_DECLS

#endif
