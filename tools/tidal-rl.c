/* tidal-rl — GRPO with the rollouts on the inference path and the gradients on the training
 * path, each in its own precision recipe, with importance-sampling corrections and a collapse
 * detector (include/tidal/rl.h has the formulas and which framework each follows). Rewards come
 * from a built-in task's grader or from the user's --reward-command (rl.h, "Rewards").
 *
 *   tidal-rl --model-path DIR --dataset-path FILE --output-dir DIR --dtype bf16 \
 *            --num-generations 8 --per-device-batch-size 16 --learning-rate 1e-5 --max-steps 100
 */
#include "tidal/opts.h"
#include "tidal/rl.h"
#include "tidal/tfevents.h"
#include "tidal/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const DTYPE_TRAIN[] = {"fp32", "bf16-train", "fp16-train", "fp8-unified-train"};
static const char *const DTYPE_INFER[] = {"fp32", "bf16-infer", "fp16-infer", "fp8-unified-infer"};

/* --dtype: tidal's short names and the torch/HF spellings (TRL's --dtype, --torch_dtype) */
static int parse_dtype(void *dest, const char *v, char *why, size_t n)
{
    static const char *const names[][2] = {{"fp32", "float32"}, {"bf16", "bfloat16"}, {"fp16", "float16"}, {"fp8", NULL}};
    for (int i = 0; i < 4; i++)
        if (!strcmp(v, names[i][0]) || (names[i][1] && !strcmp(v, names[i][1]))) { *(int *)dest = i; return 0; }
    if (!strcmp(v, "auto")) snprintf(why, n, "fp32|bf16|fp16|fp8 (or float32|bfloat16|float16): tidal-rl sets the "
                                     "precision of both paths, so 'auto' (the checkpoint's dtype) is not a choice");
    return -1;
}

static int parse_dropout(void *dest, const char *v, char *why, size_t n)
{
    return td_lora_dropout_parse(v, (double *)dest, why, n);
}

static int parse_targets(void *dest, const char *v, char *why, size_t n)
{
    return td_lora_targets_parse(v, (unsigned *)dest, why, n);
}

static int parse_is(void *dest, const char *v, char *why, size_t n)
{
    int m = td_rl_is_from_name(v, NULL);
    if (m < 0) return -1;
    *(td_rl_is *)dest = (td_rl_is)m;
    return 0;
}

/* --model-dtype: HF's torch_dtype names, either spelling */
static int parse_model_dtype(void *dest, const char *v, char *why, size_t n)
{
    int f = td_format_from_name(v);
    if (f != TD_F32 && f != TD_BF16 && f != TD_F16) return -1;
    *(int *)dest = f;
    return 0;
}

/* --resume-from-checkpoint PATH|true: --resume, checked against the run's checkpoint (rl/record.c) */
static int parse_checkpoint(void *dest, const char *v, char *why, size_t n)
{
    if (!*v || !strcmp(v, "false") || !strcmp(v, "False")) return -1;
    *(const char **)dest = v;
    return 0;
}

static int parse_collapse(void *dest, const char *v, char *why, size_t n)
{
    td_error err;
    if (td_collapse_cfg_parse(dest, v, &err)) { snprintf(why, n, "%s", err.msg); return -1; }
    return 0;
}

int main(int argc, char **argv)
{
    td_rl_opts o;
    td_rl_opts_defaults(&o);
    int dtype = -1, scale = 0, loss_type = 3, policy = 0, masknorm = 0, sched = TD_SCHED_CONSTANT;
    int gave_train = 0, gave_roll = 0, gave_alpha = 0, gave_eps_high = 0, gave_targets = 0;
    double lora_dropout = 0;
    unsigned long long seed = o.seed;
    td_opt opts[] = {
        TD_OPT_S("model-path", 0, &o.model_path, "DIR", "the policy to start from (config.json, safetensors,\ntokenizer.json)"),
        TD_OPT_DEVICE(&o.device),
        TD_OPT_S("dataset-path", 0, &o.dataset_path, "FILE", "records, .jsonl/.json/.json.gz: a built-in task's\n"
                 "(task, prompt, answer: datasets/tasks) or TRL's shapes\n"
                 "({\"prompt\": str|messages} or {\"messages\"}, any other\n"
                 "fields) scored by --reward-command"),
        TD_OPT_S("output-dir", 'o', &o.output_dir, "DIR", "where rl.h5, checkpoint-K/ and model/ go"),
        TD_OPT_S("chat-template", 0, &o.chat_template, "FILE", "a Jinja chat template for conversational prompts, used\n"
                 "instead of the checkpoint's (TRL's chat_template_path)"),
        TD_OPT_S("reward-command", 0, &o.reward_command, "CMD", "your reward, any language (/bin/sh -c CMD, started\n"
                 "once): one JSON object per completion on its stdin\n"
                 "(prompt, completion, completion_ids, the record's\n"
                 "fields), one reward per line on its stdout: a number or\n"
                 "{\"name\": value, ...} (rl.h \"Rewards\"; example:\n"
                 "datasets/rewards/python_exec.py)"),
        TD_OPT_S("reward-weights", 0, &o.reward_weights, "NAME=W,...", "weights of the named components (TRL reward_weights;\n"
                 "default 1 each); each is logged as /steps/reward_NAME"),
        TD_OPT_D("reward-timeout", 0, &o.reward_timeout, "SECONDS", 0, 1e9, "longest wait for one reward line (default 600)"),
        TD_OPT_FUN("dtype", 0, &dtype, "fp32|bf16|fp16|fp8", parse_dtype, "fp32|bf16|fp16|fp8 (or float32|bfloat16|float16)",
                   "both paths at once (float32, bfloat16, float16 too):\nbf16 = bf16-train + bf16-infer,\n"
                 "fp16 = fp16-train + fp16-infer (loss scaling on),\nfp8 = fp8-unified-train + fp8-unified-infer"),
        TD_OPT_S("train-recipe", 0, &o.train_recipe, "NAME|FILE", "the training path's recipe (default bf16-train)"),
        TD_OPT_S("rollout-recipe", 0, &o.rollout_recipe, "NAME|FILE", "the inference path's recipe (default bf16-infer)"),
        TD_OPT_C("routing-replay", 0, &o.routing_replay, "none|r2|r3", "mixtures of experts: r3 = pi_old and pi_theta take\n"
                 "the experts the rollout chose for each token and layer\n(Rollout Routing Replay), weighted by their own router;\n"
                 "r2 = pi_theta takes pi_old's (vanilla routing replay)"),
        TD_OPT_F("freeze-router", 0, &o.freeze_router, 1, "mixtures of experts: do not train the routers (they keep\n"
                 "the checkpoint's weights)"),
        TD_OPT_FUN("output-router-logits", 0, &o.output_router_logits, "true|false", td_opt_parse_bool, "true or false",
                   "mixtures of experts: add transformers' load-balancing\n"
                   "loss (load_balancing_loss_func over every token and MoE\n"
                   "layer) x --router-aux-loss-coef to the loss, as a model\n"
                   "with output_router_logits on does; /steps/aux_loss\n"
                   "(default: config.json's output_router_logits, false\n"
                   "unless it says true)"),
        TD_OPT_D("router-aux-loss-coef", 0, &o.router_aux_loss_coef, "X", 0, 1e6, "the load-balancing loss's weight (default: config.json's\n"
                 "router_aux_loss_coef; transformers' default 0.001)"),
        TD_OPT_F("exact-match", 0, &o.exact_match, 1, "control: mu is scored by the training path itself (one\n"
                 "recipe, one structure: the mismatch is exactly 0)"),
        TD_OPT_D("rollout-logit-noise", 0, &o.rollout_logit_noise, "SIGMA", 0, 100, "synthetic mismatch: N(0, SIGMA^2) on every rollout\n"
                 "logit (the dose-response arm; 0 = off)"),
        TD_OPT_I("num-generations", 0, &o.loss.num_generations, "G", 1, 4096, "completions per prompt (default 8)"),
        TD_OPT_I("per-device-batch-size", 0, &o.loss.micro_batch, "N", 1, 65536, "completions per micro-batch (default 8)"),
        TD_OPT_I("gradient-accumulation-steps", 0, &o.loss.grad_accum, "N", 1, 65536, "micro-batches per optimiser step (default 1);\n"
                 "completions per step = the two multiplied"),
        TD_OPT_D("learning-rate", 0, &o.learning_rate, "LR", 0, 1, "AdamW learning rate (default 1e-6)"),
        TD_OPT_C("lr-scheduler-type", 0, &sched, "constant|constant_with_warmup|linear|cosine", "schedule (default constant)"),
        TD_OPT_D("warmup-ratio", 0, &o.warmup_ratio, "R", 0, 1, "warmup share of the steps (default 0)"),
        TD_OPT_D("weight-decay", 0, &o.weight_decay, "W", 0, 10, "AdamW weight decay (default 0)"),
        TD_OPT_D("max-grad-norm", 0, &o.max_grad_norm, "N", 0, 1e9, "gradient clipping (default 1; 0 = off)"),
        TD_OPT_F("gradient-checkpointing", 0, &o.gradient_checkpointing, 1, "recompute each layer's activations in the backward\n"
                 "(HF's activation checkpointing): ~L x less activation\nmemory, one more forward, the same results bit for bit"),
        TD_OPT_F("plan-only", 0, &o.plan_only, 1, "print the GPU memory plan (weights, optimizer state,\n"
                 "activations, rollout KV cache, workspace) from config.json\nfor sequences of --max-seq-length tokens and exit 0: no\n"
                 "weights read, nothing written (with --device cuda: against\nthe GPU's free memory)"),
        TD_OPT_F("ignore-memory-plan", 0, &o.ignore_memory_plan, 1, "--device cuda: run even when the plan says it does not\n"
                 "fit (the plan is an upper bound)"),
        TD_OPT_FUN("lora-target-modules", 0, &o.lora_modules, "LIST", parse_targets, NULL,
                   "q_proj,k_proj,... or all-linear (default q_proj,v_proj);\n"
                   "on a mixture of experts gate_proj,up_proj,down_proj (Mixtral:\nw1,w3,w2) adapt every expert and "
                   "the shared expert, all-linear\nevery projection but the routers (the adapter's config\nlists them)"),
        TD_OPT_FUN("lora-dropout", 0, &lora_dropout, "P", parse_dropout, "0", "PEFT's lora_dropout: 0 only (the engine has none)"),
        TD_OPT_I("lora-r", 0, &o.lora_r, "R", 0, 4096, "LoRA rank (default 0 = full fine-tuning)"),
        TD_OPT_D("lora-alpha", 0, &o.lora_alpha, "A", 0, 1e6, "LoRA alpha (default 16)"),
        TD_OPT_C("lora-sync", 0, &o.lora_sync, TD_RL_SYNC_NAMES, "how the engine gets the LoRA policy (default merged):\n"
                 "merged = W + sBA summed in fp32, rounded once;\nmerge-unmerge = TRL GRPOTrainer's PEFT merge_adapter/\n"
                 "unmerge_adapter in --model-dtype (the base drifts);\nadapter = native adapter sync (vLLM's LoRA kernels)"),
        TD_OPT_FUN("model-dtype", 0, &o.model_dtype, "fp32|bf16|fp16", parse_model_dtype,
                   "fp32, bf16, fp16 (or float32, bfloat16, float16)",
                   "LoRA: the torch_dtype the trainer's base is loaded in\n(default fp32, TRL's default)"),
        TD_OPT_D("beta", 0, &o.loss.beta, "B", 0, 1e6, "k3 KL to the reference policy (default 0 = none)"),
        TD_OPT_C("loss-type", 0, &loss_type, TD_RL_LOSS_NAMES, "aggregation as TRL (default dapo)"),
        TD_OPT_C("scale-rewards", 0, &scale, TD_RL_SCALE_NAMES, "advantage scaling (default group; none = Dr.GRPO)"),
        TD_OPT_C("policy-loss", 0, &policy, "ppo|pg", "PPO-clip (default) or plain policy gradient"),
        TD_OPT_D("epsilon", 0, &o.loss.epsilon, "E", 0, 1, "PPO clip (default 0.2)"),
        TD_OPT_D("epsilon-high", 0, &o.loss.epsilon_high, "E", 0, 100, "upper clip (default --epsilon; DAPO 0.28)"),
        TD_OPT_D("dual-clip", 0, &o.loss.dual_clip, "C", 0, 1e6, "verl dual-clip for A < 0 (clip_ratio_c, e.g. 3; default off)"),
        TD_OPT_F("mask-truncated-completions", 0, &o.mask_truncated, 1, "completions without EOS leave the loss (TRL)"),
        TD_OPT_FUN("is-correction", 0, &o.loss.is_mode, "NAME", parse_is, TD_RL_IS_NAMES,
                   "rollout/trainer IS correction (default none):\n" TD_RL_IS_NAMES),
        TD_OPT_D("is-cap", 0, &o.loss.is_cap, "C", 0, 1e12, "upper cap (default: token 2, seq 3, geometric 1.001,\nicepop 5)"),
        TD_OPT_D("is-cap-low", 0, &o.loss.is_cap_low, "C", 0, 1e12, "lower cap (default: 0; geometric 0.999, icepop 0.5)"),
        TD_OPT_C("is-masked-normaliser", 0, &masknorm, "keep|drop", "tokens a mask mode zeroes stay in the loss mask and\n"
                 "normaliser (keep: TRL, default) or leave them (drop: verl)"),
        TD_OPT_D("temperature", 0, &o.temperature, "T", 0, 100, "sampling temperature (default 1)"),
        TD_OPT_D("top-p", 0, &o.top_p, "P", 0, 1, "nucleus sampling (default 1)"),
        TD_OPT_I("top-k", 0, &o.top_k, "K", -1, 1 << 30, "top-k (default 0 = off)"),
        TD_OPT_D("repetition-penalty", 0, &o.repetition_penalty, "R", 0, 100, "repetition penalty (default 1)"),
        TD_OPT_D("epochs", 0, &o.epochs, "E", 0, 1e6, "passes over the prompts when --max-steps is 0 (default 1)"),
        TD_OPT_I("max-steps", 0, &o.max_steps, "N", 0, 1 << 30, "optimiser steps (default 0: from --epochs)"),
        TD_OPT_I("max-seq-length", 0, &o.max_seq_length, "N", 2, 1 << 20, "prompt + completion at most (default 1024)"),
        TD_OPT_I("max-completion-length", 0, &o.max_completion_length, "N", 1, 1 << 20, "tokens generated at most (default 256)"),
        TD_OPT_I("n-jobs", 0, &o.n_jobs, "N", 1, 1024, "threads (default 1; results do not depend on it)"),
        TD_OPT_U("seed", 0, &seed, "S", "seed of prompts order, sampling and LoRA init (default 42)"),
        TD_OPT_I("dump-step", 0, &o.dump_step, "K", 0, 1 << 30, "write step K's per-token tensors (TRL's names: per_token_logps,\n"
                 "old/sampling/ref_per_token_logps, completion_mask, advantages,\n"
                 "importance_sampling_ratio, per_token_loss_grad; MoE: the\n"
                 "rollout's and pi_old's experts, sampling/old_routed_experts)\n"
                 "to OUTPUT_DIR/dump-step-K.safetensors, to check the loss against\n"
                 "TRL's or verl's code (K counts from 1, as the progress line)"),
        TD_OPT_I("eval-steps", 0, &o.eval_steps, "N", 0, 1 << 30, "clean evaluation every N steps (default 0 = never): the\n"
                 "trainer's policy, greedy, training recipe, no engine sync\nor noise -> /steps eval_reward, eval_accuracy (your own\nrecords: your reward; accuracy = share with reward >= 1)"),
        TD_OPT_S("eval-dataset-path", 0, &o.eval_dataset_path, "FILE", "evaluation records (default: test.jsonl beside\n--dataset-path)"),
        TD_OPT_I("eval-max-samples", 0, &o.eval_max_samples, "N", 0, 100000000, "evaluate the first N records (default all)"),
        TD_OPT_F("resume", 0, &o.resume, 1, "continue OUTPUT_DIR from its last checkpoint: a stopped run,\n"
                 "or a finished one to a larger --max-steps (the schedule\nrecomputed from the new total, as HF's Trainer); "
                 "other\nsettings must be the run's (a change is refused, named);\n--report-to, --save-steps, "
                 "--save-total-limit,\n--log-completions and --eval-* carry over unless given"),
        TD_OPT_FUN("resume-from-checkpoint", 0, &o.resume_checkpoint, "PATH", parse_checkpoint, "a checkpoint folder or true",
                   "HF's spelling of --resume: PATH must be OUTPUT_DIR's\nnewest checkpoint-K (the one the run file names); "
                   "true = it"),
        TD_OPT_F("overwrite-output-dir", 0, &o.overwrite, 1, "replace an existing run in OUTPUT_DIR"),
        TD_OPT_I("save-steps", 0, &o.save_steps, "N", 0, 1 << 30, "checkpoint every N steps too (default 0: only the last\n"
                 "step's, which --resume continues); each checkpoint-K/\nholds the policy (model.safetensors or the PEFT\n"
                 "adapter), trainer_state.json (HF's log_history) and\ntidal's state"),
        TD_OPT_I("save-total-limit", 0, &o.save_total_limit, "N", 0, 1 << 30, "keep only the newest N checkpoints (default 0: all,\nas HF's Trainer)"),
        TD_OPT_I("log-completions", 0, &o.log_completions, "N", 0, 1 << 20, "completions per step kept in /tokens (default 4)"),
        TD_OPT_FUN("collapse", 0, &o.collapse, "K=V,...", parse_collapse, "KEY=VALUE pairs of the detector",
                   "collapse detector settings (rl.h), keys: ema_alpha,\ndrop_abs, drop_rel, min_gain, hold, spike_factor,\n"
                   "spike_window, spike_min_history, entropy_hi, entropy_lo,\nentropy_hold, k3_factor, k3_min, k3_baseline, kl_abs,\n"
                   "chi2_max, ess_min, trunc_max, dead_hold"),
        TD_OPT_F("stop-on-collapse", 0, &o.stop_on_collapse, 1, "stop at a confirmed collapse (reward_drop)"),
        TD_OPT_FUN("report-to", 0, &o.report_to, "LIST", td_report_to_parse, TD_REPORT_TO_EXPECT,
                   "each step's /steps values also to: tensorboard (event\nfiles in OUTPUT_DIR/runs), jsonl (OUTPUT_DIR/\n"
                   "metrics.jsonl), both (all), or none (default)"),
        TD_OPT_F("quiet", 'q', &o.quiet, 1, "no progress lines: only the end-of-run summary (stdout)"),
        {0}};
    td_opt_get(opts, "train-recipe")->given = &gave_train;
    td_opt_get(opts, "rollout-recipe")->given = &gave_roll;
    td_opt_get(opts, "lora-alpha")->given = &gave_alpha;
    td_opt_get(opts, "lora-sync")->given = &o.lora_sync_given;
    td_opt_get(opts, "model-dtype")->given = &o.model_dtype_given;
    td_opt_get(opts, "epsilon-high")->given = &gave_eps_high;
    td_opt_get(opts, "is-cap")->given = &o.is_cap_given;
    td_opt_get(opts, "is-cap-low")->given = &o.is_cap_low_given;
    td_opt_get(opts, "per-device-batch-size")->aliases = "per-device-train-batch-size";
    td_opt_get(opts, "model-path")->aliases = "model-name-or-path";   /* TRL's ModelConfig */
    td_opt_get(opts, "dtype")->aliases = "torch-dtype";
    td_opt_get(opts, "lora-r")->aliases = "lora-rank";   /* verl's lora_rank; TRL/PEFT say lora_r / r */
    td_opt_get(opts, "lora-target-modules")->given = &gave_targets;
    /* --resume: the settings not given carry over from the run (rl.h, td_rl_opts.given) */
    td_opt_get(opts, "report-to")->given = &o.given.report_to;
    td_opt_get(opts, "save-steps")->given = &o.given.save_steps;
    td_opt_get(opts, "save-total-limit")->given = &o.given.save_total_limit;
    td_opt_get(opts, "log-completions")->given = &o.given.log_completions;
    td_opt_get(opts, "eval-steps")->given = &o.given.eval_steps;
    td_opt_get(opts, "eval-max-samples")->given = &o.given.eval_max_samples;
    td_opt_get(opts, "model-path")->required = 1;
    td_cli cli = {"tidal-rl", "--model-path DIR --dataset-path FILE --output-dir DIR [options]",
                  "GRPO on a built-in verifiable task, or on your own records scored by your own reward\n"
                  "program (--reward-command, any language, as TRL's reward functions): rollouts on the\n"
                  "inference path (--rollout-recipe), log-probs and gradients on the training path\n"
                  "(--train-recipe), IS corrections for the mismatch, per-step metrics (verl/TRL names) in\n"
                  "OUTPUT_DIR/rl.h5 and a collapse detector.",
                  "SIGINT/SIGTERM (Ctrl-C): the step in flight finishes, its checkpoint is written, and the\n"
                  "command that continues is printed (exit 130); a second Ctrl-C stops at once (--resume then\n"
                  "continues from the last checkpoint). --resume with a larger --max-steps extends a finished run;\n"
                  "the learning-rate schedule is recomputed from the new total (HF's Trainer does the same):\n"
                  "constant gives an uninterrupted run of the new total bit for bit; under linear / cosine or a\n"
                  "--warmup-ratio the steps done kept the old total's rates and the rest follow the new total's.\n"
                  "Exit status: 0 done, 1 failed (or --stop-on-collapse stopped it: 3), 2 usage error, 130 stopped\n"
                  "by a signal.\n"
                  "Formulas and their sources: include/tidal/rl.h. Run file: reports/SCHEMA.md.",
                  opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    o.seed = seed;
    if (!o.output_dir && !o.plan_only) return td_cli_bad(&cli, "--output-dir", NULL, "required (DIR)");
    /* --plan-only plans from config.json at --max-seq-length: no records read */
    if (!o.dataset_path && !o.plan_only) return td_cli_bad(&cli, "--dataset-path", NULL, "required (FILE)");
    if (dtype >= 0 && (gave_train || gave_roll))
        return td_cli_bad(&cli, "--dtype", NULL, "sets both recipes: give it or --train-recipe/--rollout-recipe, not both");
    if (gave_targets && o.lora_r == 0)
        return td_cli_bad(&cli, "--lora-target-modules", NULL, "applies with --lora-r R > 0");
    if (dtype >= 0) { o.train_recipe = DTYPE_TRAIN[dtype]; o.rollout_recipe = DTYPE_INFER[dtype]; }
    if (o.exact_match && gave_roll)
        return td_cli_bad(&cli, "--exact-match", NULL, "scores mu with the training path: --rollout-recipe contradicts it");
    if (!gave_eps_high) o.loss.epsilon_high = o.loss.epsilon;
    if (!gave_alpha && o.lora_r == 0) o.lora_alpha = 16.0;
    if (o.top_k < 0) o.top_k = 0;
    o.loss.scale_rewards = (td_rl_scale)scale;
    o.loss.loss_type = (td_rl_loss_type)loss_type;
    o.loss.policy_loss = policy ? TD_PL_PG : TD_PL_PPO;
    o.loss.is_drop_masked = masknorm;
    o.lr_schedule = sched;
    td_error err;
    if (td_rl_opts_check(&o, &err)) return td_cli_bad(&cli, "options", NULL, "%s", err.msg);
    if (o.resume_checkpoint) {
        if (o.overwrite) return td_cli_bad(&cli, "--resume-from-checkpoint", NULL, "contradicts --overwrite-output-dir");
        o.resume = 1;
    }
    o.command_line = td_command_line(argc, argv);
    o.stop = td_stop_on_signals("tidal-rl", "step");
    rc = td_rl_run(&o, &err);
    if (rc < 0) fprintf(stderr, "tidal-rl: %s\n", err.msg);
    free((char *)o.command_line);
    if (rc == 2 || (rc < 0 && *o.stop)) {   /* the same command, continuing the run */
        static const char *const drop[] = {"--overwrite-output-dir", "--overwrite_output_dir", "--resume-from-checkpoint=",
                                           "--resume_from_checkpoint=", NULL};
        td_stop_print_command("tidal-rl", "continue", argc, argv, drop, "--resume");
        return TD_EXIT_STOPPED;
    }
    return rc < 0 ? 1 : rc == 1 ? 3 : 0;
}
