/* tidal — supervised fine-tuning on a task dataset (tidal-sft's library side, src/train/sft*.c).
 *
 * Data. Records of a task dataset JSONL (tasks.h: "prompt", "completion", "answer", "task").
 * Each becomes one sequence, tokenised as TRL's SFTTrainer does a prompt-completion record:
 *   encode(prompt, add_special_tokens=True) + encode(completion, add_special_tokens=False) + [eos]
 * (the character vocabulary's post-processor prepends <bos>; eos is the tokenizer's eos_token).
 * The loss mask is 1 on the completion tokens and the EOS (TRL's completion_only_loss), so the
 * loss is the mean token cross-entropy over the masked targets of the whole optimiser step (all
 * its micro-batches: per_device_batch_size x gradient_accumulation_steps sequences), as
 * transformers >= 4.46 normalises over accumulation with num_items_in_batch.
 *
 * Order. The examples form one stream: epoch e is a Fisher-Yates shuffle of the training records
 * drawn from td_rng_stream(seed, e), epochs concatenated; optimiser step k takes the stream's
 * examples [k*B*GA, (k+1)*B*GA). So the data a step sees depends on (seed, k) alone, and a resumed
 * run needs only the step number to continue the order. Steps: max_steps, or
 * ceil(epochs * N / (B*GA)).
 *
 * Output (output_dir). Every save_steps, and when stopped by a signal, output_dir/checkpoint-K
 * (K = steps done) with the model (model.safetensors, config.json, generation_config.json,
 * tokenizer.json, tokenizer_config.json; under LoRA a PEFT adapter), optimizer.safetensors
 * (td_trainer_save_state: fp32 masters, AdamW moments, step, loss scaler) and trainer_state.json
 * (global step, epoch, seed, the command); written as checkpoint-K.tmp and renamed. At the end
 * the model files go to output_dir itself. The run file (output_dir/sft.h5 unless given) gets
 * one /steps row per optimiser step (runschema.h: td_schema_steps), flushed as it goes.
 * resume continues from the newest checkpoint-K: the run file is cut back to K rows and the
 * final weights are bit-identical to an uninterrupted run's (any thread count). The last step's
 * checkpoint-N is always written, so resume with a larger max_steps (or epochs) extends a
 * finished run, as HF's Trainer does: the schedule is recomputed from the new total (constant:
 * the extended run equals an uninterrupted run of the new total bit for bit; linear / cosine /
 * warmup: the steps done kept the old total's learning rates). Every checkpoint's
 * trainer_state.json records the run's settings ("tidal_settings": recipe, optimiser, schedule,
 * LoRA, seed, batch, evaluation); a resume with other values is refused, each differing option
 * named with both values (td_settings_diff). max_steps / epochs, save_steps, save_dtype and the
 * evaluation batch may change. stop set by a signal: the step in flight finishes, checkpoint-K
 * is written and td_sft_run fails with "interrupted after step K" (tidal-sft exits 130 with the
 * command that continues).
 *
 * Evaluation. Greedy decoding (temperature 0) of the evaluation records through the rollout
 * loop (rollout.h) on the inference path under eval_recipe, each completion graded by its task's
 * reward (tasks.h): accuracy = the fraction with an exact answer (reward 1), mean reward as well.
 */
#ifndef TIDAL_SFT_H
#define TIDAL_SFT_H

#include "tidal/recipe.h"
#include "tidal/tasks.h"
#include "tidal/tokenizer.h"
#include "tidal/train.h"

#include <signal.h>
#include <stdio.h>

TD_BEGIN_DECLS

typedef struct {
    const char *model_path;        /* HF checkpoint directory (tidal-init or a trained one)          */
    const char *device;            /* where training and evaluation run: "cpu" (NULL), "cuda[:N]"   */
    const char *tokenizer_path;    /* tokenizer.json or its folder; NULL: model_path's              */
    const char *dataset_path;      /* a folder with train.jsonl (and test.jsonl), or a JSONL file    */
    const char *eval_dataset_path; /* NULL: the folder's test.jsonl (or the file's sibling test.jsonl) */
    const char *output_dir;
    const char *run_file;          /* NULL: output_dir/sft.h5                                         */
    const char *dump_grads;        /* NULL, or the safetensors file for the first step's gradients    */
    const char *command;           /* recorded in every output                                         */
    td_recipe recipe;              /* the training recipe                                              */
    td_recipe eval_recipe;         /* the inference path's recipe for evaluation                      */
    td_train_opts train;           /* AdamW, schedule, loss scaling, LoRA (max_steps/sizes are set here) */
    int max_steps;                 /* > 0 wins over epochs                                             */
    double epochs;
    int batch;                     /* per_device_batch_size                                            */
    int grad_accum;                /* gradient_accumulation_steps                                      */
    int save_steps, eval_steps;    /* 0: only at the end                                               */
    int eval_max_samples;          /* 0: every evaluation record                                       */
    int eval_batch;                /* sequences decoded together                                       */
    int max_new_tokens;            /* 0: longest reference response + 16                              */
    int save_dtype;                /* td_dtype of model.safetensors (F32 or BF16)                      */
    int resume;                    /* continue from output_dir's newest checkpoint                    */
    const char *resume_checkpoint; /* or from this one (HF's resume_from_checkpoint PATH): an
                                      output_dir/checkpoint-K; NULL, "true", "last": the newest      */
    int overwrite;                 /* replace what output_dir holds (else refused)                    */
    volatile sig_atomic_t *stop;   /* set by a signal: checkpoint at the next step boundary and stop  */
    FILE *progress;                /* stderr, or NULL                                                  */
    unsigned report_to;            /* --report-to: TD_REPORT_* mask (tfevents.h; 0 = none, default)   */
    int plan_only;                 /* print the GPU memory plan (config.json, the data) and stop: no
                                      weights read, nothing written                                   */
    int ignore_memory_plan;        /* --device cuda: train even when the plan says it does not fit   */
} td_sft_opts;

void td_sft_opts_defaults(td_sft_opts *o);

typedef struct {
    int steps;                     /* optimiser steps done (skipped ones included)                     */
    long skipped;                  /* steps skipped under fp16 loss scaling                            */
    double loss;                   /* the last step's loss                                             */
    double eval_accuracy;          /* last evaluation's exact-answer rate (NaN: none)                  */
    double eval_reward;            /* and mean reward                                                  */
    int eval_n;                    /* records evaluated                                                */
    double seconds;                /* wall time of this invocation                                    */
} td_sft_result;

/* Trains and saves. 0, or -1 + err (bad input named by file and line, a non-finite loss named by
 * step, a stop by signal after its checkpoint was written). */
int td_sft_run(const td_sft_opts *o, td_sft_result *res, td_error *err);

/* A task prompt's ids as tidal-sft trains on them and evaluates them (the character vocabulary:
 * <bos> then one id per character): td_tokenizer_encode with add_special_tokens=True, refusing
 * characters that encode to <unk> and ids past vocab. RL on the shipped task models must feed
 * prompts this way. *ids malloc'd. 0 or -1 + err. */
int td_sft_encode_prompt(const td_tokenizer *tok, const char *text, int vocab, int **ids, int *n, td_error *err);

/* Evaluation only (no training): o's model (model_path, no adapter) on o's evaluation records
 * (eval_dataset_path, or dataset_path's test.jsonl; eval_max_samples), completions as in
 * td_sft_evaluate. res gets eval_accuracy, eval_reward, eval_n, seconds. */
int td_sft_eval(const td_sft_opts *o, FILE *completions, td_sft_result *res, td_error *err);

/* Greedy evaluation of a model (and adapter, may be NULL) on task records: accuracy (exact
 * answers / n), mean reward. completions (may be NULL) gets one JSON line per record
 * {"id", "completion", "reward", "exact"}. 0 or -1 + err. */
typedef struct {
    const td_recipe *recipe;       /* NULL: fp32                                                      */
    int max_new_tokens;            /* 0: longest reference response + 16                              */
    int batch;                     /* 0: 32                                                            */
} td_sft_eval_opts;
int td_sft_evaluate(const td_model *m, const td_lora *lora, const td_tokenizer *tok,
                    const td_task_item *items, size_t n, const td_sft_eval_opts *o, double *accuracy,
                    double *mean_reward, FILE *completions, td_error *err);

/* Greedy completions of n tokenized prompts by a model (and adapter, may be NULL) under a recipe
 * (NULL: fp32), `batch` at a time (0: 32), at most new_tokens each, stopping at any of the n_eos
 * ids: fn(user, i, tokens, plen, len, err) gets prompt i's sequence (prompt + completion, len
 * tokens) and returns 0, or -1 + err to stop. 0 or -1 + err. */
typedef int (*td_greedy_fn)(void *user, size_t i, const int *tokens, int plen, int len, td_error *err);
int td_greedy_complete(const td_model *m, const td_lora *lora, const td_recipe *rec, int *const *prompt,
                       const int *plen, size_t n, int batch, int new_tokens, const int *eos, int n_eos,
                       td_greedy_fn fn, void *user, td_error *err);

TD_END_DECLS

#endif
