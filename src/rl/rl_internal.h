/* tidal-rl's parts (internal to src/rl):
 *   data.c      the dataset: built-in task records and the user's own (TRL's shapes)
 *   reward.c    the user's reward process (--reward-command)
 *   loss.c      advantages, IS weights, normalisers, the per-token loss (pure functions)
 *   collapse.c  the collapse detector
 *   opts.c      defaults, checks, metric names
 *   run.c       the run: setup, resume, the step loop, progress
 *   step.c      one step: rollout, rewards, pi_old, update, metrics
 *   sync.c      the weight sync to the engine (--lora-sync) and the base drift
 *   record.c    the run file: attributes, /steps rows, the /tokens sample, checkpoints */
#ifndef TIDAL_RL_INTERNAL_H
#define TIDAL_RL_INTERNAL_H

#include "tidal/metrics.h"
#include "tidal/model.h"
#include "tidal/recipe.h"
#include "tidal/rl.h"
#include "tidal/rollout.h"
#include "tidal/runfile.h"
#include "tidal/tfevents.h"
#include "tidal/tasks.h"
#include "tidal/tokenizer.h"
#include "tidal/train.h"
#include "../diff/columns.h"

/* reward.c: the --reward-command process */
typedef struct rl_reward rl_reward;
rl_reward *rl_reward_start(const td_rl_opts *o, td_error *err);
/* Scores n completions: req[i] is the JSON line for completion i, where[i] names its record in
 * errors. reward[i] gets the (weighted) reward, comp (NULL, or n x the --reward-weights names)
 * the components (nan: null). 0 or -1 + err (the process is stopped on a timeout). */
int rl_reward_score(rl_reward *p, int n, char *const *req, double *reward, double *comp,
                    const char *const *where, td_error *err);
/* The --reward-weights names (their count). */
int rl_reward_names(const rl_reward *p, const char *const **names);
/* Closes its input, waits a few seconds for it to exit, then kills its process group. */
void rl_reward_stop(rl_reward *p);

/* A file of records (data.c): each a built-in task's (items[i].task set) or the user's own (its
 * prompt rendered into items[i].prompt); records[i] the JSON object (the reward command's input),
 * chat[i] 1 for a conversational prompt. */
typedef struct {
    td_task_item *items;
    struct json_t **records;
    char *chat;
    size_t n;
} rl_records;

typedef struct {
    const td_rl_opts *o;
    td_model *model;              /* the initial weights (and the reference policy)           */
    td_tokenizer *tkz;
    td_task_item *items;
    size_t n_items;
    rl_records ev;                /* --eval-steps: the evaluation records (n_eval used)      */
    size_t n_eval;
    int **eval_ids, *eval_len;    /* with --reward-command: the n_eval prompts, tokenized once  */
    char eval_path[4200];
    int **prompt_ids, *prompt_len;/* (n_items) tokenized prompts                              */
    td_recipe rtrain, rroll;
    td_trainer *tr;
    td_forward *fold, *fref;      /* pi_old on the trainer's weights; the reference           */
    td_session *sess;
    int old_in_update;            /* pi_old's log-probs, entropy and routing taken from the update's
                                     own forward (rl_old_in_update), fold not created         */
    int fold_set, sess_set;       /* their recipe and adapter set once: under LoRA with the adapter
                                     on the device and the base unchanged (not merge-unmerge), a
                                     step re-rounds the adapter only (step.c, sync.c)         */
    td_sampler *smp;
    /* the sync (sync.c) */
    td_model *engine;             /* merge-unmerge: the engine's weights (merged matrices)    */
    float *w0;                    /* LoRA: the adapted base matrices at the start, in order  */
    size_t n_base;                /* their elements                                          */
    float *sync_buf;              /* 3 x the largest adapted matrix                          */
    const struct td_backend *sync_be; /* merge-unmerge on the device (sync.c): its backend, the
                                     engine's device copy and w0's; NULL: on the host          */
    float *engine_dev, *w0_dev;
    int sync_host;                /* the memory plan keeps the LoRA sync on the host (memory.c)  */
    int B, G, P, V, max_len, nlog;
    int eos[TD_CONFIG_MAX_EOS], n_eos;
    int total_steps;
    /* one step's buffers */
    int **tok;                    /* (B) max_len                                              */
    int *len, *plen, *finish;
    size_t *item;                 /* (B) dataset record of each sequence                      */
    float **mu_pos, **old_pos;    /* (B) max_len: by position (mu: processed rollout log-prob) */
    float *rows_b;                /* (nlog, max_len, V) rollout rows of the logged sequences  */
    td_token_metrics *tm;         /* (nlog, max_len) token metrics of the logged sequences    */
    int64_t *off;                 /* (B + 1) response token offsets                           */
    float *old, *mu, *ref, *mask, *w, *m;   /* (B * max_completion) flattened response tokens */
    double *reward, *adv, *coef;
    int *exact;
    double entropy_sum, entropy_n;
    td_rl_loss_cfg lc;
    td_rl_clip_stats clip;
    float *dump_logp, *dump_dlogp;/* --dump-step: (N) pi_theta and dloss/dlogp of the step dumped */
    int nonfinite;
    long skipped_extra;           /* steps skipped for a non-finite gradient without loss scaling */
    char *memory_plan;            /* the GPU memory plan (JSON) recorded in rl.h5; NULL on the CPU */
    /* the run file */
    td_runfile *rf;
    td_column tcols[TD_TOK_COUNT], scols[TD_SEQ_COUNT], pcols[TD_PRM_COUNT];
    int64_t rows[3];              /* /seqs, /tokens, /prompts rows in the file               */
    td_collapse *det;
    int collapse_step;
    /* the user's task: items[i].task NULL for a record the reward command scores */
    struct json_t **records;      /* (n_items) the dataset records (the reward command's input) */
    char *chat;                   /* (n_items) 1: a conversational prompt                      */
    rl_reward *reward_proc;       /* NULL: built-in rewards                                    */
    int n_comp;                   /* --reward-weights components, logged as /steps columns     */
    const char *const *comp_names;/* (n_comp) */
    double *comp;                 /* (B, n_comp) this step's components                        */
    td_steplog *log;              /* --report-to: each committed /steps row, as it is written   */
    /* a mixture of experts (Lm MoE layers, K experts per token; Lm = 0: dense): the rollout's and
     * pi_old's experts per sequence, position, MoE layer: (B, max_len, Lm, K), -1 = not routed */
    int Lm, K;
    int *route_b, *route_old;
    unsigned char *route_tok_flip;/* (B, max_len) pi_old's routing at the position flipped in a layer */
    int64_t route_flips, route_routed;
    int64_t *route_flips_l, *route_routed_l; /* (Lm) the same per MoE layer                     */
    double *flip_rate_l;          /* (Lm) this step's /steps/routing_flip_rate_layers row           */
    char *carried_eval_path;      /* --resume: the run's --eval-dataset-path (rl_carry_over)         */
} rl_run;

/* step.c: the routing observers and replays of a mixture of experts (run.c sets them) */
void rl_moe_on_rollout(void *user, const td_moe_route *r);
void rl_moe_on_old(void *user, const td_moe_route *r);
/* whether pi_old is read from the update's own forward (run.c says why): no IS correction, no LoRA,
 * TIDAL_RL_OLD_FORWARD unset or 0 */
int rl_old_in_update(const td_rl_opts *o);
int rl_moe_replay_rollout(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts);
int rl_moe_replay_old(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts);

/* data.c: R->items, R->records and R->chat from --dataset-path (R->tkz loaded); -1 + err naming
 * the record. rl_records_free frees records and chat (items are td_task_items_free's).
 * rl_read_records reads any such file into *out (rl_records_clear frees it all). */
int rl_load_records(rl_run *R, td_error *err);
void rl_records_free(rl_run *R);
int rl_read_records(rl_run *R, const char *path, rl_records *out, td_error *err);
void rl_records_clear(rl_records *set);
/* A record's prompt as the run feeds it: a built-in task's as tidal-sft trained it (BOS added),
 * the user's as TRL tokenises a model input (special tokens in the text recognised, none added).
 * *ids malloc'd; -1 + err (where names the record). */
int rl_encode_prompt(const rl_run *R, const td_task_item *it, const char *where, int **ids, int *n, td_error *err);

/* step.c: step k into metrics (TD_RLM_COUNT values); -1 + err */
int rl_step(rl_run *R, int k, double *metrics, td_error *err);
/* the epoch and dataset record of the j-th prompt of step k */
size_t rl_prompt_of(const rl_run *R, int k, int j, int *epoch);

/* sync.c: before the trainer's first step and the session (the engine's model); the sync
 * of step k into the session with its metrics; the drifted base into / from a checkpoint */
int rl_sync_init(rl_run *R, td_error *err);
void rl_sync_free(rl_run *R);
int rl_sync(rl_run *R, double *metrics, td_error *err);
int rl_sync_save(rl_run *R, const char *dir, td_error *err);
int rl_sync_load(rl_run *R, const char *dir, td_error *err);

/* record.c */
int rl_file_open(rl_run *R, int *start_step, td_error *err);
int rl_file_commit(rl_run *R, int k, const double *metrics, td_error *err);
int rl_checkpoint_save(rl_run *R, int k, td_error *err);
int rl_file_finish(rl_run *R, int steps_done, int stopped, td_error *err);
/* --resume: the settings that are not the maths (report_to, save_steps, save_total_limit,
 * log_completions, eval_*) the command did not give (o->given), set from the run file's rl_config,
 * before the inputs are read; said on stderr unless quiet. No run file: nothing. 0 or -1 + err. */
int rl_carry_over(rl_run *R, td_rl_opts *o, td_error *err);
/* the configuration a resumed run must share with the file (JSON; caller frees) */
char *rl_config_json(const rl_run *R);

/* The GPU memory plan (memory.c, include/tidal/memplan.h) of a run whose inputs are loaded, before
 * anything is allocated on the device or written: printed, kept in R->memory_plan, and a refusal
 * with the numbers (-1 + err) when it does not fit (--ignore-memory-plan: run anyway). No-op on
 * the CPU. */
int rl_memory_plan(rl_run *R, td_error *err);
/* --plan-only: the plan from config.json alone, for sequences of --max-seq-length tokens. */
int rl_plan_only(const td_rl_opts *o, td_error *err);

#endif
