/* tidal-sft — supervised fine-tuning on a task dataset (include/tidal/sft.h over the trainer of
 * include/tidal/train.h), with the flags HF TrainingArguments / TRL SFTConfig users know.
 *
 *   tidal-sft --model-path M --dataset-path datasets/tasks/add --output-dir out/add \
 *             --learning-rate 1e-3 --max-steps 600 --per-device-batch-size 16 --eval-steps 200
 *   tidal-sft --model-path out/add --dataset-path datasets/tasks/add --eval-only
 */
#include "tidal/checkpoint.h"
#include "tidal/opts.h"
#include "tidal/sft.h"
#include "tidal/tfevents.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_recipe(void *dest, const char *value, char *why, size_t whylen)
{
    td_error err;
    if (td_recipe_resolve(value, dest, &err) == 0) return 0;
    snprintf(why, whylen, "%s", err.msg);
    return -1;
}

static int parse_dropout(void *dest, const char *v, char *why, size_t n)
{
    return td_lora_dropout_parse(v, (double *)dest, why, n);
}

static int parse_targets(void *dest, const char *value, char *why, size_t whylen)
{
    return td_lora_targets_parse(value, (unsigned *)dest, why, whylen);
}

/* --resume-from-checkpoint PATH|true (checked by the run: src/train/sft.c) */
static int parse_checkpoint(void *dest, const char *v, char *why, size_t n)
{
    if (!*v || !strcmp(v, "false") || !strcmp(v, "False")) return -1;
    *(const char **)dest = v;
    return 0;
}

static const char *const ABOUT =
    "Supervised fine-tuning of a Llama-family checkpoint on a task dataset (datasets/tasks/: add,\n"
    "sort, countdown; tidal-task generate makes more) or your own data in TRL's SFT shapes, full or\n"
    "LoRA, in any training recipe.\n\n"
    "A task record becomes encode(prompt) + encode(completion) + <eos> (the prompt with the tokenizer's\n"
    "special tokens). Your own records (.jsonl, .json, .json.gz) are tokenised as TRL's SFTTrainer\n"
    "does: {\"prompt\", \"completion\"} strings as tok(prompt + completion) + <eos>, conversations\n"
    "through the chat template (the prompt with add_generation_prompt), {\"messages\"} and {\"text\"}\n"
    "with every token in the loss. The loss is on the\n"
    "completion tokens and the EOS only: the mean token cross-entropy over those masked targets of\n"
    "the whole optimiser step (per-device-batch-size x gradient-accumulation-steps sequences), as\n"
    "transformers normalises across gradient accumulation. AdamW as torch.optim.AdamW, clipping\n"
    "as clip_grad_norm_, schedules as transformers' get_scheduler, fp16 recipes with GradScaler's\n"
    "dynamic loss scaling (overflowing steps skipped and counted).";

static const char *const FOOTER =
    "Data order: epoch e is a shuffle of the training records seeded by (--seed, e); step k takes\n"
    "the next B x GA examples of the concatenated epochs, so --resume needs only the step.\n"
    "Output: OUTPUT_DIR/checkpoint-K every --save-steps (model, tokenizer, optimizer.safetensors,\n"
    "trainer_state.json; written as checkpoint-K.tmp and renamed), the final model in OUTPUT_DIR\n"
    "(model.safetensors, config.json, generation_config.json, tokenizer.json, tokenizer_config.json;\n"
    "under LoRA a PEFT adapter) and the run file OUTPUT_DIR/sft.h5: one /steps row per optimiser step\n"
    "(loss, token_accuracy, grad_norm, lr, loss_scale, skipped, eval_accuracy ...; reports/SCHEMA.md).\n"
    "--resume continues from the newest checkpoint-K to the same final weights, bit for bit; the\n"
    "last step's checkpoint is always written, so --resume with a larger --max-steps (or --epochs)\n"
    "extends a finished run, as HF's Trainer does: the learning-rate schedule is recomputed from the\n"
    "new total (constant: the extended run equals an uninterrupted run of the new total bit for bit;\n"
    "linear/cosine and warmup: the steps done kept the old total's learning rates, the rest follow\n"
    "the new total's schedule); the old last step's /steps row keeps its final evaluation. Any other\n"
    "setting must be the run's: a change is refused, naming each differing option with both values.\n"
    "SIGINT/SIGTERM (Ctrl-C): the step in flight finishes, a checkpoint of the steps done is written\n"
    "and the command that continues is printed (exit 130); a second Ctrl-C stops at once.\n"
    "Evaluation (--eval-steps, and after the last step): greedy decoding of the test split through\n"
    "the rollout loop under --eval-recipe, graded by the task's reward; eval_accuracy is the\n"
    "fraction with an exact answer.\n\n"
    "Exit status: 0 done, 1 failed (bad input file, non-finite loss), 2 usage error, 130 stopped by\n"
    "a signal.";

int main(int argc, char **argv)
{
    td_sft_opts o;
    td_sft_opts_defaults(&o);
    td_train_opts *t = &o.train;
    t->lr = 5e-5;
    t->output_router_logits = -1;   /* transformers: the model config's */
    t->router_aux_loss_coef = NAN;
    const char *save_dtype = "f32", *completions = NULL;
    unsigned long long seed = 42;   /* HF TrainingArguments' default */
    int eval_only = 0, lora_given = 0;
    double lora_dropout = 0;
    double epochs = 3.0;
    td_opt opts[] = {
        TD_OPT_S("model-path", 0, &o.model_path, "DIR", "checkpoint to start from (tidal-init's random one, or trained)"),
        TD_OPT_DEVICE(&o.device),
        TD_OPT_S("tokenizer-path", 0, &o.tokenizer_path, "PATH", "tokenizer.json or its folder (default: the model's)"),
        TD_OPT_S("dataset-path", 0, &o.dataset_path, "PATH", "folder with train.jsonl (test.jsonl), or a .jsonl, .json or\n"
                 ".json.gz file of task records or TRL-shaped records"),
        TD_OPT_S("eval-dataset-path", 0, &o.eval_dataset_path, "FILE", "evaluation records (default: test.jsonl beside the data)"),
        TD_OPT_S("output-dir", 'o', &o.output_dir, "DIR", "where checkpoints, the final model and sft.h5 go"),
        TD_OPT_S("run-file", 0, &o.run_file, "FILE", "the HDF5 run file (default OUTPUT_DIR/sft.h5)"),
        TD_OPT_S("recipe", 0, NULL, "NAME|FILE", "training recipe (default fp32; tidal-diff --list-recipes)"),
        TD_OPT_S("eval-recipe", 0, NULL, "NAME|FILE", "inference-path recipe of evaluation (default fp32)"),
        TD_OPT_D("learning-rate", 0, &t->lr, "LR", 0, 10, "AdamW learning rate (default 5e-5)"),
        TD_OPT_I("max-steps", 0, &o.max_steps, "N", -1, 100000000, "optimiser steps; wins over --epochs (default: from epochs)"),
        TD_OPT_D("epochs", 0, &epochs, "E", 0, 1e6, "passes over the training records (default 3)"),
        TD_OPT_I("per-device-batch-size", 0, &o.batch, "B", 1, 65536, "sequences per micro-batch (default 8)"),
        TD_OPT_I("gradient-accumulation-steps", 0, &o.grad_accum, "GA", 1, 65536, "micro-batches per optimiser step (default 1)"),
        TD_OPT_D("warmup-ratio", 0, &t->warmup_ratio, "R", 0, 1, "fraction of the steps warming up linearly (default 0)"),
        TD_OPT_I("warmup-steps", 0, &t->warmup_steps, "N", 0, 100000000, "warmup steps (wins over --warmup-ratio)"),
        TD_OPT_C("lr-scheduler", 0, NULL, "constant|constant_with_warmup|linear|cosine", "schedule (default linear)"),
        TD_OPT_D("weight-decay", 0, &t->weight_decay, "WD", 0, 10, "AdamW decoupled weight decay (default 0; not on\nbiases and norm weights)"),
        TD_OPT_D("max-grad-norm", 0, &t->max_grad_norm, "N", 0, 1e30, "clip the global gradient norm (default 1; 0 = off)"),
        TD_OPT_F("freeze-router", 0, &t->freeze_router, 1, "mixtures of experts: do not train the routers (they keep\n"
                 "the checkpoint's weights)"),
        TD_OPT_FUN("output-router-logits", 0, &t->output_router_logits, "true|false", td_opt_parse_bool, "true or false",
                   "mixtures of experts: add transformers' load-balancing\n"
                   "loss (load_balancing_loss_func over every token and MoE\n"
                   "layer) x --router-aux-loss-coef to the loss, as a model\n"
                   "with output_router_logits on does; /steps/aux_loss\n"
                   "(default: config.json's output_router_logits, false\n"
                   "unless it says true)"),
        TD_OPT_D("router-aux-loss-coef", 0, &t->router_aux_loss_coef, "X", 0, 1e6, "the load-balancing loss's weight (default: config.json's\n"
                 "router_aux_loss_coef; transformers' default 0.001)"),
        TD_OPT_F("gradient-checkpointing", 0, &t->gradient_checkpointing, 1, "recompute each layer's activations in the backward\n"
                 "(HF's activation checkpointing): ~L x less activation\nmemory, one more forward, the same results bit for bit"),
        TD_OPT_F("plan-only", 0, &o.plan_only, 1, "print the GPU memory plan (weights, optimizer state,\n"
                 "activations, evaluation, workspace) from config.json and\nthe data, and exit 0: no weights read, nothing written\n"
                 "(with --device cuda: against the GPU's free memory)"),
        TD_OPT_F("ignore-memory-plan", 0, &o.ignore_memory_plan, 1, "--device cuda: train even when the plan says it does not\n"
                 "fit (the plan is an upper bound)"),
        TD_OPT_D("adam-beta1", 0, &t->beta1, "B1", 0, 0.999999, "AdamW beta1 (default 0.9)"),
        TD_OPT_D("adam-beta2", 0, &t->beta2, "B2", 0, 0.999999999, "AdamW beta2 (default 0.999)"),
        TD_OPT_D("adam-epsilon", 0, &t->eps, "EPS", 0, 1, "AdamW epsilon (default 1e-8)"),
        TD_OPT_I("lora-r", 0, &t->lora_r, "R", 0, 65536, "train a LoRA adapter of rank R (default 0: full fine-tuning)"),
        TD_OPT_D("lora-alpha", 0, &t->lora_alpha, "A", 0, 1e6, "lora_alpha (default 16)"),
        TD_OPT_FUN("lora-dropout", 0, &lora_dropout, "P", parse_dropout, "0", "PEFT's lora_dropout: 0 only (the engine has none)"),
        TD_OPT_FUN("lora-target-modules", 0, &t->lora_modules, "LIST", parse_targets, NULL,
                   "q_proj,k_proj,... or all-linear (default q_proj,v_proj);\n"
                   "on a mixture of experts gate_proj,up_proj,down_proj (Mixtral:\nw1,w3,w2) adapt every expert and "
                   "the shared expert, all-linear\nevery projection but the routers (the adapter's config\nlists them)"),
        TD_OPT_U("seed", 0, &seed, "S", "data order and LoRA init (default 42)"),
        TD_OPT_F("resume", 0, &o.resume, 1, "continue from OUTPUT_DIR's newest checkpoint-K: a stopped\n"
                 "run, or a finished one to a larger --max-steps (--epochs)"),
        TD_OPT_FUN("resume-from-checkpoint", 0, &o.resume_checkpoint, "PATH", parse_checkpoint,
                   "a checkpoint folder or true", "HF's spelling: continue from OUTPUT_DIR/checkpoint-K\n"
                   "(true: the newest, as --resume)"),
        TD_OPT_F("overwrite-output-dir", 0, &o.overwrite, 1, "replace a run OUTPUT_DIR already holds"),
        TD_OPT_I("save-steps", 0, &o.save_steps, "N", 0, 100000000, "checkpoint every N steps (default 0: only the last\n"
                 "step's, which --resume extends)"),
        TD_OPT_I("eval-steps", 0, &o.eval_steps, "N", 0, 100000000, "evaluate every N steps (default 0: only the end)"),
        TD_OPT_I("eval-max-samples", 0, &o.eval_max_samples, "N", 0, 100000000, "evaluate the first N records (default all)"),
        TD_OPT_I("per-device-eval-batch-size", 0, &o.eval_batch, "B", 1, 65536, "sequences decoded together (default 32)"),
        TD_OPT_I("max-new-tokens", 0, &o.max_new_tokens, "N", 0, 1000000, "evaluation response budget (default longest\nreference + 16)"),
        TD_OPT_S("save-dtype", 0, &save_dtype, "f32|bf16", "dtype of model.safetensors (default f32)"),
        TD_OPT_S("dump-grads", 0, &o.dump_grads, "FILE", "write the first step's fp32 gradients (HF names) with its\n"
                 "input_ids and loss_mask as safetensors"),
        TD_OPT_FUN("report-to", 0, &o.report_to, "LIST", td_report_to_parse, TD_REPORT_TO_EXPECT,
                   "each step's /steps values also to: tensorboard (event\nfiles in OUTPUT_DIR/runs), jsonl (OUTPUT_DIR/\n"
                   "metrics.jsonl), both (all), or none (default)"),
        TD_OPT_F("eval-only", 0, &eval_only, 1, "evaluate --model-path on the test split; no training"),
        TD_OPT_S("completions", 0, &completions, "FILE", "--eval-only: one JSON line per record (id, completion,\nreward, exact)"),
        {0}};
    td_recipe recipe = o.recipe, eval_recipe = o.eval_recipe;
    int sched = 2;
    td_opt_get(opts, "recipe")->kind = TD_OPT_FN;
    td_opt_get(opts, "recipe")->dest = &recipe;
    td_opt_get(opts, "recipe")->fn = parse_recipe;
    td_opt_get(opts, "eval-recipe")->kind = TD_OPT_FN;
    td_opt_get(opts, "eval-recipe")->dest = &eval_recipe;
    td_opt_get(opts, "eval-recipe")->fn = parse_recipe;
    td_opt_get(opts, "lr-scheduler")->dest = &sched;
    td_opt_get(opts, "model-path")->aliases = "model model-name-or-path";
    td_opt_get(opts, "tokenizer-path")->aliases = "tokenizer tokenizer-name";
    td_opt_get(opts, "epochs")->aliases = "num-train-epochs";
    td_opt_get(opts, "per-device-batch-size")->aliases = "per-device-train-batch-size";
    td_opt_get(opts, "lr-scheduler")->aliases = "lr-scheduler-type";
    td_opt_get(opts, "lora-r")->aliases = "lora-rank";   /* verl's lora_rank; TRL/PEFT say lora_r / r */
    td_opt_get(opts, "per-device-eval-batch-size")->aliases = "eval-batch-size";
    td_opt_get(opts, "eval-steps")->lo_open = 0;
    td_opt_get(opts, "lora-alpha")->lo_open = 1;
    td_opt_get(opts, "model-path")->required = 1;
    td_opt_get(opts, "dataset-path")->required = 1;
    td_opt_get(opts, "lora-target-modules")->given = &lora_given;
    td_cli cli = {"tidal-sft", "--model-path DIR --dataset-path PATH --output-dir DIR [options]\n"
                  "--model-path DIR --dataset-path PATH --eval-only [--completions FILE]",
                  ABOUT, FOOTER, opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    if (o.plan_only && eval_only) return td_cli_bad(&cli, "--plan-only", NULL, "plans a training run: not with --eval-only");
    if (!eval_only && !o.output_dir && !o.plan_only) return td_cli_bad(&cli, "--output-dir", NULL, "required (where the model goes)");
    if (lora_given && t->lora_r == 0)
        return td_cli_bad(&cli, "--lora-target-modules", NULL, "applies with --lora-r R > 0");
    int dt = td_dtype_parse(save_dtype);
    if (dt != TD_DT_F32 && dt != TD_DT_BF16) return td_cli_bad(&cli, "--save-dtype", save_dtype, "f32 or bf16");
    if (o.max_steps < 0) o.max_steps = 0;   /* HF's -1: from the epochs */
    if (o.resume_checkpoint) {
        if (o.overwrite) return td_cli_bad(&cli, "--resume-from-checkpoint", NULL, "contradicts --overwrite-output-dir");
        o.resume = 1;
    }
    o.save_dtype = dt;
    o.epochs = epochs;
    o.recipe = recipe;
    o.eval_recipe = eval_recipe;
    t->schedule = (td_lr_schedule)sched;
    t->seed = seed;
    /* the command recorded in outputs: a resumed run's is the original one */
    const char *drop[] = {"--resume", "--resume-from-checkpoint=", "--resume_from_checkpoint=", NULL};
    char *cmd = td_command_line_edit(argc, argv, drop, NULL);
    o.command = cmd;
    o.progress = stderr;
    if (!eval_only) o.stop = td_stop_on_signals("tidal-sft", "step");
    td_error err;
    td_sft_result res;
    if (eval_only) {
        FILE *f = NULL;
        if (completions && !(f = fopen(completions, "w"))) {
            fprintf(stderr, "tidal-sft: %s: cannot write\n", completions);
            free(cmd);
            return 1;
        }
        rc = td_sft_eval(&o, f, &res, &err);
        if (f && fclose(f) != 0 && !rc) rc = td_fail(&err, "%s: cannot write", completions);
    } else {
        rc = td_sft_run(&o, &res, &err);
    }
    free(cmd);
    if (rc) fprintf(stderr, "tidal-sft: %s\n", err.msg);
    if (rc && o.stop && *o.stop) {   /* the command that continues: this one with --resume (opts.h) */
        static const char *const fresh[] = {"--overwrite-output-dir", "--overwrite_output_dir", "--resume-from-checkpoint=",
                                            "--resume_from_checkpoint=", NULL};
        if (res.steps > 0 || o.resume) td_stop_print_command("tidal-sft", "continue", argc, argv, fresh, "--resume");
        else td_stop_print_command("tidal-sft", "start it again", argc, argv, NULL, "--overwrite-output-dir");
        return TD_EXIT_STOPPED;
    }
    if (rc) return 1;
    if (o.plan_only) return 0;
    if (eval_only || !isnan(res.eval_accuracy))
        printf("{\"eval_accuracy\": %.6f, \"eval_reward\": %.6f, \"eval_records\": %d, \"steps\": %d, \"seconds\": %.1f}\n",
               res.eval_accuracy, res.eval_reward, res.eval_n, res.steps, res.seconds);
    else
        printf("{\"steps\": %d, \"loss\": %.6f, \"seconds\": %.1f}\n", res.steps, res.loss, res.seconds);
    return 0;
}
