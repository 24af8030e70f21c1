/* tidal — the post-mortem of an RL run folder (tidal-postmortem): the run's own curves read as the
 * trainers leave them, the collapse detector run over them under their names, and the checkpoints
 * the folder holds, found for measuring.
 *
 * What is read (td_pm_read; the first that exists wins, so one run is never counted twice):
 *   RUN_DIR/rl.h5                     tidal-rl's run file: /steps, each row one optimiser step,
 *                                     counted from 1 as HF counts them (row k = step k + 1)
 *   trainer_state.json                HF Trainer / TRL: RUN_DIR's, else the newest
 *                                     checkpoint-N/'s (HF writes the whole log_history into each);
 *                                     every numeric key of every log_history entry at its "step"
 *   *.jsonl at RUN_DIR's top          verl's file logger ({"step": N, "data": {...}}) and tidal's
 *                                     metrics.jsonl ({"step": N, key: value, ...})
 *   events.out.tfevents.* under it    TensorBoard (any depth <= 4: HF's runs/<date_host>/, verl's
 *                                     tensorboard_log/<project>/<experiment>/): tags as written,
 *                                     HF's rewrite_logs undone (train/X -> X, eval/X -> eval_X)
 * Checkpoints (td_pm_checkpoints): HF/TRL checkpoint-N/ (adapter_model.safetensors +
 * adapter_config.json, or config.json + *.safetensors), verl global_step_N/actor/lora_adapter/ or
 * global_step_N/actor/huggingface/ with weights (verl's FSDP shards, model_world_size_*.pt, are
 * torch pickles: refused with verl's own conversion command), tidal-rl's checkpoint-N/ (the same
 * files) and its final model/.
 */
#ifndef TIDAL_POSTMORTEM_H
#define TIDAL_POSTMORTEM_H

#include "tidal/common.h"
#include "tidal/lora.h"
#include "tidal/model.h"
#include "tidal/recipe.h"
#include "tidal/rl.h"

#include <jansson.h>
#include <stdio.h>

TD_BEGIN_DECLS

/* Every numeric key of a run's log on one step axis. */
typedef struct {
    char *format;          /* "tidal-rl", "trl" (HF Trainer), "verl", "jsonl", "tensorboard" */
    char *source;          /* the file(s) read, for the report */
    size_t n;              /* steps (ascending, unique) */
    int64_t *step;
    size_t nk;             /* keys, in first-seen order */
    char **key;
    double *v;             /* (nk, n): v[k * n + i], NaN where key k was not logged at step i */
} td_pm_curves;

/* Reads RUN_DIR's log (above). -1 + err naming the folder and what it holds when there is none,
 * or the file and line/offset of a malformed one. */
int td_pm_read(const char *run_dir, td_pm_curves *c, td_error *err);
void td_pm_curves_free(td_pm_curves *c);
/* Column of a key (exact), -1 if absent. */
int td_pm_key(const td_pm_curves *c, const char *key);

/* The detector's metrics under the trainers' names: TD_RLM_* index -> the first of these keys the
 * log has (tidal's own name first; TRL's; verl's). */
int td_pm_metric_column(const td_pm_curves *c, int rlm);

/* An event found in the curves. */
typedef struct {
    char name[32];         /* "reward_drop", "reward_dip", "grad_spike", "entropy", "mismatch", "length", "dead",
                              "length_surge", "is_extreme", "logp_diff_rise", "lr_change" */
    int64_t step;          /* the run's step */
    char rule[256];        /* the threshold that fired, with its source */
    char metric[96];       /* the log key it fired on */
} td_pm_event;

typedef struct {
    td_collapse_cfg cfg;
    /* the collapse the run ended in (postmortem.c: its final EMA below its best by the detector's
     * margin): drop_step the first step from which the EMA stays below that level to the end,
     * onset_step the first step of that descent; -1 when the run did not end collapsed (a detector
     * mark it recovered from is the event reward_dip). The reward's best EMA, its EMA at the end. */
    int64_t drop_step, onset_step;
    double best_reward, final_reward, initial_reward;
    int reward_col;
    td_pm_event *ev;
    size_t n_ev;
    size_t rows_used;      /* log rows with a reward (the detector's steps) */
} td_pm_events;

/* Runs the detector (cfg) and the post-mortem's own precursor rules over the curves. -1 + err
 * when the log has no reward key (named, with the keys it has). */
int td_pm_events_find(const td_pm_curves *c, const td_collapse_cfg *cfg, td_pm_events *e, td_error *err);
void td_pm_events_free(td_pm_events *e);

/* A checkpoint found in the folder. */
typedef struct {
    int64_t step;
    char *dir;             /* the folder holding the weights or the adapter */
    int adapter;           /* 1: a PEFT adapter (dir has adapter_config.json) */
    char *base;            /* adapter_config.json's base_model_name_or_path ("" if none) */
    char *unreadable;      /* NULL, or why tidal cannot read it and what converts it */
} td_pm_checkpoint;

/* Every checkpoint of run_dir, ascending by step. 0 (n may be 0) or -1 + err. */
int td_pm_checkpoints(const char *run_dir, td_pm_checkpoint **out, size_t *n, td_error *err);
void td_pm_checkpoints_free(td_pm_checkpoint *c, size_t n);

/* Picks at most max of the n readable checkpoints (indices into ck, ascending): the first, the
 * last two before the onset, the first two after it, then evenly spaced; without an onset evenly
 * spaced with the first and the last. Returns how many. */
size_t td_pm_pick(const td_pm_checkpoint *ck, size_t n, int64_t onset, size_t max, size_t *idx);

/* What an engine's merged copy keeps of an adapter's update (src/analysis/pm_lora.c): the share
 * |E(D(W + dW)) - E(W)|_F / |dW|_F, its component along dW (aligned: 1 = exactly the update) and
 * the share of adapted weights that changed, D the engine
 * recipe's weight format. td_pm_lora_projected: the same for an adapter not trained yet, PEFT's
 * initialisation after `steps` Adam steps of size lr on B (the assumption stated in pm_lora.c). */
int td_pm_lora_survival(const td_model *base, const td_lora *lo, const td_recipe *engine, double *survival,
                        double *aligned, double *changed_frac, td_error *err);
/* The update between two checkpoints' adapters (lo - prev) as a merged engine copy sees it:
 * E(D(W + dW_lo)) - E(D(W + dW_prev)) against dW_lo - dW_prev (did the engine see this stretch's
 * updates). */
int td_pm_lora_step_survival(const td_model *base, const td_lora *prev, const td_lora *lo, const td_recipe *engine,
                             double *survival, double *aligned, double *changed_frac, td_error *err);
int td_pm_lora_projected(const td_model *base, const td_config *cfg, int rank, double alpha, double lr, int steps,
                         uint64_t seed, const td_recipe *engine, double *survival, double *aligned, double *changed_frac,
                         td_error *err);

/* ---------------------------------------------------------------- the whole post-mortem
 * What tidal-postmortem does, in library form: the tool parses its options into a td_pm_setup,
 * then calls, in this order, td_pm_open_run (a run folder; not with --preflight), td_pm_measure
 * per checkpoint (or once for --preflight's starting point), td_pm_project (--preflight with a
 * LoRA rank), td_pm_verdict, td_pm_figures, td_pm_json and td_pm_print_markdown. */

/* The settings a tidal-rl run recorded in rl.h5 (rl_config, steps_done): the post-mortem's
 * defaults for what the command line leaves out. */
typedef struct {
    char model[4096], dataset[4096];
    char train_recipe[256], rollout_recipe[256];
    char lora_sync[32];            /* "merged", "adapter" or "" */
    int max_completion;            /* 0: not recorded */
    int steps_done;                /* -1: not recorded */
} td_pm_rl_settings;

/* What a post-mortem reads and measures, and how (tidal-postmortem's options, defaults filled). */
typedef struct {
    int preflight;                             /* 1: a set-up before a run, no run folder */
    const char *run_dir;                       /* NULL under preflight */
    const char *model;                         /* the base of adapters (and preflight's model) */
    const char *adapter;                       /* preflight: a PEFT adapter to start from (NULL: none) */
    const char *dataset;                       /* the prompts' records (TRL's shapes) */
    const char *train_recipe, *rollout_recipe; /* the run's pair */
    const char *train16, *rollout16;           /* its FP16 counterfactual (td_pm_fp16_of) */
    int max_prompts, max_completion;           /* prompts sampled; tokens generated per prompt */
    int lora_sync;                             /* 1: the engine ran vLLM's LoRA kernels; 0: merged weights */
    int lora_r;                                /* preflight: the LoRA rank to be trained (0: none) */
    double lora_alpha, lr;                     /* preflight: its alpha and the run's learning rate */
    unsigned long long seed;                   /* prompt sampling and generation */
    const char *device;                        /* where the diffs run ("cpu" or NULL, "cuda[:N]") */
    char *command;                             /* the command line, recorded in every output */
    const volatile sig_atomic_t *stop;         /* checked between diff batches (NULL: never) */
    td_collapse_cfg collapse;                  /* the detector's thresholds */
} td_pm_setup;

/* One tidal-diff run file's numbers over its completion tokens (NaN: not measured). */
typedef struct {
    int ok;                        /* 1: read, with completion tokens */
    char file[4400];               /* the run file */
    size_t tokens, seqs;
    double mean, p99, max;         /* |dlogp| per completion token */
    double k3, kl;                 /* mean k3; verl's kl */
    double seq_abs_mean, seq_abs_max;   /* |log W| of the sequences' IS weights */
    double seq_ess, tok_ess;       /* the sequences' and the tokens' ESS fraction */
    double is_mean, chi2;          /* the tokens' mean IS weight, chi2_token */
} td_pm_diff;

/* What an engine's merged copy keeps of an adapter (td_pm_lora_survival's three numbers). */
typedef struct { double surv, aligned, changed; } td_pm_keep;

/* One checkpoint measured (or --preflight's starting point). */
typedef struct {
    int64_t step;
    const td_pm_checkpoint *ck;    /* NULL: the starting point */
    td_pm_diff run, fp16;          /* in the run's recipes; in their FP16 counterfactual */
    td_pm_keep keep, keep16;       /* the whole adapter as a rollout / fp16 engine copy keeps it (NaN: no adapter) */
    td_pm_keep upd, upd16;         /* the update since the checkpoint before (prev_step) as the engine copy sees it */
    int64_t prev_step;             /* -1: no adapter checkpoint before this one */
} td_pm_meas;

/* A hypothesis of the verdict and its evidence, worded for the report. */
typedef struct {
    const char *name, *question;
    char for_[400], against[400];
    char reading[16];              /* "supported", "mixed", "against", "no data" */
    int64_t first;                 /* the step of its earliest evidence, for ranking (-1: none) */
    const char *next;              /* what to try next when it is supported */
} td_pm_hypothesis;

#define TD_PM_NHYP 6
#define TD_PM_NPROJ 3
/* The Adam steps after which --preflight projects LoRA's update: 1, 10, 100. */
extern const int td_pm_proj_steps[TD_PM_NPROJ];

typedef struct {
    td_pm_setup set;
    td_pm_curves curves;           /* the run's log (empty under preflight) */
    td_pm_events events;           /* drop_step = onset_step = -1 until read */
    td_pm_checkpoint *ck;          /* every checkpoint of the folder */
    size_t nck;
    td_pm_meas *meas;              /* those measured, in order */
    size_t nmeas;
    size_t nprompts;               /* prompts the diffs ran on */
    int any_adapter;               /* a checkpoint picked for measuring is an adapter */
    td_pm_keep proj[TD_PM_NPROJ][2];   /* preflight: LoRA's projected update kept, rollout recipe / fp16 */
    int nproj;
    td_pm_hypothesis hyp[TD_PM_NHYP];
    int order[TD_PM_NHYP];         /* hyp's indices: supported first, earliest evidence first */
    json_t *figures;               /* names of the PNGs written (td_pm_figures) */
    json_t *alarms;                /* the health checks crossed, as sentences (td_pm_verdict) */
} td_postmortem;

/* An empty post-mortem of set (its events' steps -1). */
void td_pm_init(td_postmortem *pm, const td_pm_setup *set);
void td_postmortem_free(td_postmortem *pm);

/* Reads pm->set.run_dir: its log (td_pm_read), the events (td_pm_events_find), tidal-rl's settings
 * into rl (when the log is rl.h5; rl is left as it was otherwise) and the checkpoints, tidal-rl's
 * final model/ among them. 0 or -1 + err. */
int td_pm_open_run(td_postmortem *pm, td_pm_rl_settings *rl, td_error *err);

/* fp16's counterpart of a recipe name: the engine's own family where there is one (vllm-bf16 ->
 * vllm-fp16), else fp16-train (train) or fp16-infer. */
const char *td_pm_fp16_of(const char *recipe, int train);

/* max_prompts records of dataset, drawn without replacement by the seed, written to path as
 * tidal-diff's prompts (a built-in task's record as {"text"}; TRL's prompt/messages as they are).
 * *n: how many. 0 or -1 + err. */
int td_pm_write_prompts(const char *dataset, int max_prompts, unsigned long long seed, const char *path, size_t *n,
                        td_error *err);
/* The prompts of `in` as token ids through tok_dir's tokenizer, to `out` ({"tokens": [...]} lines),
 * so that checkpoints without a tokenizer, and adapters, are diffed on the same ids. */
int td_pm_tokenize_prompts(const char *tok_dir, const char *in, const char *out, td_error *err);

/* Measures one checkpoint ck of pm->ck (NULL: --preflight's starting point, set.model with
 * set.adapter) into m: tidal-diff of the token prompts in the run's recipes and in fp16, to
 * diffs_dir/step-N-run.h5 and step-N-fp16.h5 (an existing file is resumed, or, finished, read);
 * for an adapter what a rollout and an fp16 engine copy keep of it and of the update since the
 * adapter checkpoint before it (a failure there is said on stderr and leaves NaN). 0, or -1 + err
 * when a diff fails (interrupted through set.stop: TD_DIFF_INTERRUPTED). */
int td_pm_measure(const td_postmortem *pm, const td_pm_checkpoint *ck, const char *tokens, const char *diffs_dir,
                  td_pm_meas *m, td_error *err);

/* --preflight with set.lora_r: LoRA's update after each of td_pm_proj_steps as a rollout-recipe
 * and an fp16 engine copy keep it (td_pm_lora_projected) into pm->proj. 0 or -1 + err. */
int td_pm_project(td_postmortem *pm, td_error *err);

/* 1 when event v (not NULL) comes at or before the drop's onset, or the run did not collapse. */
int td_pm_before_onset(const td_pm_events *e, const td_pm_event *v);

/* Weighs the hypotheses (pm->hyp, pm->order) on the events and the measurements, and lists the
 * health checks crossed (pm->alarms: verl's on preflight's step-0 diff, the projected LoRA
 * update kept below 0.5). */
void td_pm_verdict(td_postmortem *pm);

/* The PNG figures into out_dir (the curves around the drop, the checkpoints measured), their
 * names in pm->figures; a figure that cannot be drawn or written is left out. */
void td_pm_figures(td_postmortem *pm, const char *out_dir);

/* postmortem.json (a new reference); seconds: the time measuring took. */
json_t *td_pm_json(const td_postmortem *pm, double seconds);

/* report.md: curves and measurements on one step axis, the verdict worded as evidence, what to
 * try next ranked by it, the thresholds and their sources. */
void td_pm_print_markdown(FILE *f, const td_postmortem *pm);

TD_END_DECLS

#endif
