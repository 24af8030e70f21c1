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

TD_END_DECLS

#endif
