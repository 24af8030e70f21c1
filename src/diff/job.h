/* The diff job's parts (internal to src/diff): the job, one batch's buffers, and the files
 * that do each part of the work.
 *   diff.c         the job: setup, the batch loop (td_diff_run)
 *   batch.c        one batch's buffers
 *   collect.c      metric collection: the paths' rows and layers in, run-file rows out
 *   output.c       the output file: creation and its attributes, committing a batch, --force
 *   resume.c       --resume: the same run, cut back to its last completed batch
 *   fingerprint.c  the model's fingerprint
 *   lora_report.c  a merged adapter's survival
 *   summary.c      the end-of-run summary (td_diff_summarize)
 * Generation itself is the paths layer's (src/paths/rollout.c); the columns are the schema's
 * (src/record/schema.c). */
#ifndef TIDAL_DIFF_JOB_H
#define TIDAL_DIFF_JOB_H

#include "tidal/checkpoint.h"
#include "tidal/diff.h"
#include "tidal/lora.h"
#include "tidal/metrics.h"
#include "tidal/model.h"
#include "tidal/prompts.h"
#include "tidal/rollout.h"
#include "tidal/runschema.h"
#include "tidal/tokenizer.h"
#include "columns.h"

/* ---------------------------------------------------------------- one batch */

typedef struct {
    int n;                    /* sequences in the batch                                   */
    int V;
    int **seq;                /* (n) prompt + response tokens                             */
    int *len, *plen;          /* (n) full and prompt lengths                              */
    int *finish;              /* (n)                                                      */
    float **rows_b;           /* (n) B's raw log-softmax rows: (len, V) by position; NULL
                                 entries when they are kept on the device (rows_dev)      */
    int *keep_from;           /* (n) --device cuda: first scored position of each sequence */
    size_t *keep_base;        /*     and its row in the job's rows_dev                     */
    float **logp_b_proc;      /* (n) processed log-prob of the token at each position     */
    const float **replay_b;   /* (n) rollout mode: recorded log-probs of response tokens  */
    td_sampler *proc;         /* replay of processed log-probs: A's row processed the same way */
    const td_sampling *sampling;
    float *proc_row;          /* (V) scratch for it                                       */
    int score_prompt;
    td_token_metrics **m;     /* (n) metrics by predicted position (len)                  */
    unsigned char **have;     /* (n) which positions were scored                          */
    int L, C;                 /* --layers: layers and hidden size, else L = 0             */
    float **res_b;            /* (n) B's residual stream: (len, L, C) by position         */
    float **rel;              /* (n) relative error at each scored position: (len, L)     */
    /* a mixture of experts (Lm MoE layers, K experts per token, else Lm = 0): B's routing by
     * position, and A's against it for each scored token (the position that predicted it) */
    int Lm, K, replay;        /* replay: A uses B's experts (--routing-replay r3)          */
    int norm_topk;
    int **rexp_b;             /* (n) B's experts: (len, Lm, K), -1 where B did not route   */
    signed char **rflip;      /* (n) (len, Lm) /routing/flip                               */
    float **rmargin, **rmoved;/* (n) (len, Lm) /routing/margin_a, /routing/moved           */
} batch_state;

/* ---------------------------------------------------------------- the job */

typedef struct {
    const td_diff_opts *o;
    td_model *model;
    td_tokenizer *tok;
    td_prompt_set prompts;
    size_t *mine;            /* prompt indices of this shard, in order */
    size_t n_mine;
    td_forward *fa;
    td_session *sb;
    td_lora *lora;           /* --lora adapter, or NULL */
    char *memory_plan;       /* the device memory plan as JSON (run file attribute), or NULL */
    size_t mem_free0, mem_free_min;  /* --device cuda: cudaMemGetInfo's free memory at the plan,
                                        and the least seen after a batch                     */
    td_sampler *sampler;
    int keep_rows;           /* the memory plan's: B's rows kept on the device per slot (0 = host) */
    td_rows_dev *rows_dev;   /* those rows (slots x keep_rows), NULL: B's rows come to the host */
    int replay_dev;          /* a replay of raw log-probs whose metrics the device computes from A's
                                rows (td_forward_metrics_replay): A's rows stay there         */
    size_t d2h_generate, d2h_score;   /* bytes the device copied to the host in either phase */
    td_runfile *rf;
    int max_len;             /* longest prompt + max_new_tokens (context-bounded) */
    int eos[TD_CONFIG_MAX_EOS];  /* ids that end a sequence: generation_config.json's list, else config.json's */
    int n_eos;
    td_column tcols[TD_TOK_COUNT], scols[TD_SEQ_COUNT], pcols[TD_PRM_COUNT], xcols[TD_TXT_COUNT];
    int has_text;            /* /text: prompt and response text (a tokenizer; --resume: as the file) */
    float *layer_rows;       /* --layers: (rows, L) of the batch being collected */
    size_t n_layer_rows, cap_layer_rows;
    int moe_layers;          /* an MoE model's MoE layers (0: dense): /routing is written        */
    signed char *route_flip; /* (rows, moe_layers) of the batch being collected                  */
    float *route_margin, *route_moved;
    int32_t *route_nflips;   /* (rows)                                                           */
    int32_t *route_experts;  /* (rows, moe_layers * K) B's experts                               */
    int moe_k;
    size_t n_route_rows, cap_route_rows;
    int64_t *flips_by_layer, *routed_by_layer;  /* (moe_layers) over the run: set flips, tokens  */
    int64_t rows[TD_GROUP_COUNT];   /* rows of each group in the file (completed batches) */
    /* --force over a finished file: the new run is written to OUT.new.tmp and takes OUT's
     * place only once it holds a completed batch (or is complete), so a mistake in the new
     * command (a mistyped prompts file, a model that fails to load) keeps the old result. */
    int replacing;
    char write_path[4200];
} job;

/* batch.c */
void batch_alloc(batch_state *b, const job *J, const size_t *idx, int n);
void batch_free(batch_state *b);

/* collect.c: observers of the two paths, and the rows of a finished batch */
void on_row_a(void *user, int s, int t, const float *logp_a);
void on_row_b(void *user, int s, int pos, const float *logp_b, float logp_b_proc);
void on_layer_a(void *user, int l, int N, const int *seq, const int *pos, const float *x);
void on_layer_b(void *user, int l, int N, const int *slot, const int *pos, const float *x);
void on_moe_a(void *user, const td_moe_route *r);
void on_moe_b(void *user, const td_moe_route *r);
int replay_moe_b(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts);
void collect(job *J, batch_state *b, const size_t *idx, int64_t batch_no);

/* output.c */
int open_output(job *J, td_error *err);
int commit_batch(job *J, int64_t batch_no, td_error *err);
int take_place(job *J, int reopen, td_error *err);
char *sampling_json(const td_diff_opts *o);

/* resume.c: the attributes --resume requires unchanged (keys[i] = vals[i]), then the groups
 * cut back to the last completed batch; mark_done marks the prompts already in the file */
int resume_output(job *J, const char *const *keys, const char *const *vals, size_t n, td_error *err);
int mark_done(job *J, unsigned char *done, td_error *err);

/* fingerprint.c: FNV-1a over config.json and the safetensors headers' bytes and sizes */
void model_fingerprint(const char *dir, char out[32]);

/* lora_report.c */
int lora_report(job *J, char path, td_lora_merge_stats st, const td_recipe *r, td_error *err);

/* memory.c: the device memory plan before the paths are created: prints it, lowers o->batch and
 * the training path's micro-batch (*fwd_tokens; *chunk the prefill chunk; *slots the session's
 * slots: the batch, at most the shard's prompts) to what the GPU holds,
 * records it in J->memory_plan; -1 + err (the numbers, what helps) when one sequence does not fit. */
int diff_memory_plan(job *J, td_diff_opts *o, const td_config *cfg, td_format storage, int *fwd_tokens,
                     int *chunk, int *slots, td_error *err);
/* After a batch: cudaMemGetInfo's free memory sampled (its least value kept). At the end: the
 * run file's memory_peak (td_device_mem_peak) and memory_used_max (free at the plan less the
 * least free seen) attributes, and a line on stderr. Nothing on the CPU. */
void diff_memory_sample(job *J);
/* TIDAL_METRICS_ON_HOST=1 (a diagnostic): a device run downloads the paths' rows and computes
 * the per-token metrics on the host, as before they moved to the device. */
int diff_metrics_on_host(void);
int diff_memory_record(job *J, td_error *err);

#endif
