/* tidal — tidal-rl's options: defaults (TRL's GRPOConfig where it has one), the checks made
 * before any work, and the metric names of /steps. */
#include "tidal/recipe.h"
#include "tidal/rl.h"
#include "tidal/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TD_RL_X_NAME(name, doc) #name,
#define TD_RL_X_DOC(name, doc) doc,
const char *const td_rl_metric_names[TD_RLM_COUNT] = {TD_RL_METRICS(TD_RL_X_NAME)};
const char *const td_rl_metric_docs[TD_RLM_COUNT] = {TD_RL_METRICS(TD_RL_X_DOC)};
#undef TD_RL_X_NAME
#undef TD_RL_X_DOC

const char *td_rl_lora_sync_name(td_rl_lora_sync s)
{
    static const char *const N[] = {"merged", "merge-unmerge", "adapter"};
    return (unsigned)s < 3 ? N[s] : "?";
}

int td_rl_metric_index(const char *name)
{
    for (int i = 0; i < TD_RLM_COUNT; i++)
        if (!strcmp(name, td_rl_metric_names[i])) return i;
    return -1;
}

void td_rl_opts_defaults(td_rl_opts *o)
{
    memset(o, 0, sizeof *o);
    td_rl_loss_cfg_defaults(&o->loss);
    o->train_recipe = "bf16-train";
    o->rollout_recipe = "bf16-infer";
    o->learning_rate = 1e-6;           /* TRL GRPOConfig */
    o->max_grad_norm = 1.0;
    o->lr_schedule = TD_SCHED_CONSTANT;
    o->lora_alpha = 16.0;
    o->temperature = 1.0;
    o->top_p = 1.0;
    o->repetition_penalty = 1.0;
    o->epochs = 1.0;
    o->max_seq_length = 1024;
    o->max_completion_length = 256;
    o->n_jobs = 1;
    o->seed = 42;                      /* HF TrainingArguments */
    o->save_steps = 0;
    o->log_completions = 4;
    td_collapse_cfg_defaults(&o->collapse);
    o->reward_timeout = 600;
    o->output_router_logits = -1;      /* transformers: the model config's */
    o->router_aux_loss_coef = NAN;
}

int td_rl_opts_check(const td_rl_opts *o, td_error *err)
{
    const td_rl_loss_cfg *c = &o->loss;
    int B = c->micro_batch * c->grad_accum;
    if (o->reward_weights && !o->reward_command)
        return td_fail(err, "--reward-weights given without --reward-command (the built-in tasks' rewards have "
                       "no components)");
    if (o->reward_command) {
        int n;
        char **names;
        double *w;
        if (td_rl_reward_weights_parse(o->reward_weights, &n, &names, &w, err)) return -1;
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        free(w);
        if (!(o->reward_timeout > 0))
            return td_fail(err, "--reward-timeout %g: expected seconds > 0", o->reward_timeout);
    }
    if (c->num_generations < 2)
        return td_fail(err, "--num-generations %d: GRPO needs at least 2 completions per prompt "
                       "(a group's std)", c->num_generations);
    if (B % c->num_generations)
        return td_fail(err, "the generation batch --per-device-batch-size %d x "
                       "--gradient-accumulation-steps %d = %d is not divisible by "
                       "--num-generations %d", c->micro_batch, c->grad_accum, B, c->num_generations);
    if (c->policy_loss == TD_PL_PPO && (c->epsilon_high < 0 || c->epsilon < 0 || c->epsilon >= 1))
        return td_fail(err, "--epsilon %g / --epsilon-high %g (expected 0 <= epsilon < 1, epsilon-high >= 0)",
                       c->epsilon, c->epsilon_high);
    if (c->dual_clip != 0 && !(c->dual_clip > 1))
        return td_fail(err, "--dual-clip %g: verl's clip_ratio_c must be > 1 (0 = off)", c->dual_clip);
    if (c->dual_clip != 0 && c->policy_loss == TD_PL_PG)
        return td_fail(err, "--dual-clip applies to --policy-loss ppo, not pg");
    if (c->is_mode != TD_RLIS_NONE && c->is_cap > 0 && c->is_cap_low > c->is_cap)
        return td_fail(err, "--is-cap-low %g is above --is-cap %g", c->is_cap_low, c->is_cap);
    if (c->is_mode == TD_RLIS_NONE && (o->is_cap_given || o->is_cap_low_given))
        return td_fail(err, "--is-cap / --is-cap-low given with --is-correction none");
    if (c->is_mode == TD_RLIS_NONE && c->is_drop_masked)
        return td_fail(err, "--is-masked-normaliser drop given with --is-correction none "
                       "(nothing is masked)");
    if (o->exact_match && o->rollout_logit_noise > 0)
        return td_fail(err, "--exact-match and --rollout-logit-noise contradict each other "
                       "(the control has no mismatch; the noise arm adds one)");
    if (o->lora_r == 0 && o->lora_alpha != 16.0)
        return td_fail(err, "--lora-alpha given without --lora-r");
    if (o->lora_r == 0 && (o->lora_sync_given || o->model_dtype_given))
        return td_fail(err, "%s given without --lora-r (full fine-tuning syncs its fp32 master weights cast to the "
                       "engine's dtype)", o->lora_sync_given ? "--lora-sync" : "--model-dtype");
    if (o->model_dtype != TD_F32 && o->model_dtype != TD_BF16 && o->model_dtype != TD_F16)
        return td_fail(err, "--model-dtype: expected fp32, bf16 or fp16");
    if ((unsigned)o->lora_sync > TD_RL_SYNC_ADAPTER)
        return td_fail(err, "--lora-sync: expected " TD_RL_SYNC_NAMES);
    if (o->max_completion_length < 1 || o->max_seq_length <= o->max_completion_length)
        return td_fail(err, "--max-seq-length %d must exceed --max-completion-length %d (the "
                       "prompt needs room)", o->max_seq_length, o->max_completion_length);
    if (o->temperature <= 0)
        return td_fail(err, "--temperature %g: RL samples (greedy rollouts have no policy "
                       "gradient); expected > 0", o->temperature);
    if (o->eval_steps == 0 && (o->eval_dataset_path || o->eval_max_samples))
        return td_fail(err, "%s given without --eval-steps", o->eval_dataset_path ? "--eval-dataset-path" : "--eval-max-samples");
    if (o->resume && o->overwrite)
        return td_fail(err, "--resume and --overwrite-output-dir contradict each other");
    if (o->max_steps <= 0 && !(o->epochs > 0))
        return td_fail(err, "give --max-steps or --epochs > 0");
    return 0;
}
