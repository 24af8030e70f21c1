/* tidal — the diff job: replay prompts through the inference path (recipe B: prefill, KV-cache
 * decode, sampling) and score the same tokens with the training path (recipe A: teacher-forced
 * whole sequences), recording per-token divergence into an HDF5 run file.
 *
 * Work is cut into batches of `batch` prompts, fixed by the prompt order of the shard, so a
 * batch holds the same sequences in every run: results do not depend on where a run was
 * interrupted. A batch's rows are appended and the file flushed when the batch completes;
 * /progress records completed batches, and --resume cuts away anything written after the last
 * of them, then carries on. Sampling draws from a per-prompt stream of the seed.
 */
#ifndef TIDAL_DIFF_H
#define TIDAL_DIFF_H

#include "tidal/recipe.h"
#include "tidal/runfile.h"
#include "tidal/sampling.h"

#include <signal.h>

TD_BEGIN_DECLS

typedef struct {
    const char *model_dir;
    const char *prompts_path;
    const char *chat_template;   /* --chat-template FILE: conversational prompts rendered with it, not
                                    the checkpoint's (TRL's chat_template_path; NULL: the checkpoint's) */
    const char *out_path;
    const char *recipe_a_arg, *recipe_b_arg;   /* as given: preset names or file paths */
    td_recipe recipe_a, recipe_b;
    td_sampling sampling;
    int max_new_tokens;
    uint64_t seed;
    int batch;                 /* prompts per batch (decode slots)                       */
    int max_batched_tokens;    /* --max-num-batched-tokens: tokens of one training-path micro-
                                  batch (0: the longest sequence x min(batch, 4)); --device cuda
                                  lowers it, then batch, to what the memory plan fits          */
    int plan_only;             /* print the memory plan from config.json and exit (no weights) */
    int ignore_memory_plan;    /* run even when the plan says it does not fit                 */
    int score_prompt;          /* also score prompt tokens (positions 1..P-1)            */
    int layers;                /* record /layers/rel_err: per-layer residual error       */
    int routing_replay;        /* MoE models: 1 = --routing-replay r3 (A uses B's experts) */
    int shard_k, shard_n;      /* this run does prompts i with i % shard_n == shard_k    */
    int resume, force, skip_bad_lines;
    int stop_at_eos;           /* stop a sequence at the checkpoint's EOS token          */
    const char *command_line;  /* recorded in the file                                   */
    const char *lora_dir;      /* PEFT adapter applied by both paths (NULL: none)        */
    const char *device;        /* where both paths run: "cpu" (NULL) or "cuda[:N]"       */
    int lora_merge_a, lora_merge_b;  /* how that path runs it: TD_LORA_UNMERGED (0), TD_LORA_MERGED
                                        (1) into its weights, TD_LORA_PUNICA (B only: vLLM's form,
                                        tidal-diff --lora-sync adapter) */
    const char *rollout_logprobs;    /* replays: "raw" (NULL) or "processed" (by sampling)  */
    double logprob_temperature;      /* both paths' scored rows at logits / T, as TRL and verl
                                        score (T = the sampling temperature); 0 or 1 = raw rows */
    /* Checked between batches (may be NULL): once non-zero (a SIGINT/SIGTERM handler sets it),
     * the run stops after the batch in flight, closes the file cleanly and returns -1 with
     * TD_DIFF_INTERRUPTED in err.msg and how to --resume. */
    const volatile sig_atomic_t *stop;
} td_diff_opts;

/* What must match of the devices of one run's pieces (a --resume, the shards tidal-merge joins):
 * "cpu", or a run file's device attribute without its GPU index ("(NVIDIA H100 ..., sm_90,
 * 79 GiB)": shards may run on cuda:0 and cuda:1, but another GPU model sums its GEMMs otherwise). */
const char *td_diff_device_key(const char *device_attr);
/* --resume of a run file made on another device (its `device` attribute's key against now's,
 * td_model_device): -1 + err naming both and new_out (the option that starts a new run), else 0.
 * tidal-diff, tidal-sft and tidal-rl. */
int td_resume_device_check(td_runfile *rf, const char *now, const char *new_out, td_error *err);

/* err.msg of a run stopped through opts.stop starts with this. */
#define TD_DIFF_INTERRUPTED "interrupted"

typedef struct {
    int64_t tokens, seqs;
    double mean_abs_dlogp, p99_abs_dlogp, max_abs_dlogp;
    double mean_kl_ba, mean_k3, top1_agree;
    /* this invocation only: batches run, tokens they scored, wall seconds they took (model
     * loading and weight preparation excluded) */
    int64_t run_batches, run_tokens;
    double run_seconds;
    /* a failed or interrupted --force run that had not completed a batch: the previous OUT
     * is kept as it was, so the same command starts over (else --resume continues OUT) */
    int out_untouched;
    /* a replay of a rollout dump: its format ("trl", "verl", ...); "" when B generated. A replay
     * runs recipe A only: B's numbers are the engine's log-probs from the dump, and the
     * distribution-level KL(B||A) and top-1 agreement do not exist (NaN in the summary). */
    char replay_format[16];
    /* a mixture of experts (/routing): per MoE layer, the share of scored tokens whose predicting
     * position chose another expert set on A than on B (the first TD_DIFF_MAX_MOE layers), and the
     * share of tokens with such a flip in at least one layer; moe_layers 0 for a dense model */
    int moe_layers;
    double route_flip_rate[128];
    double route_tokens_flipped;
    char routing_replay[8];   /* "r3" or "" */
} td_diff_summary;

/* Runs the job; progress on stderr. 0, or -1 + err naming the file and the problem. */
int td_diff_run(const td_diff_opts *o, td_diff_summary *sum, td_error *err);

/* Joins the run files of --shard jobs (same model, recipes, sampling, seed) into out_path,
 * shard after shard, shifting the row references (/tokens/seq, /seqs/token_offset,
 * /seqs/tokens_offset). Every shard K of N once: a missing shard is refused unless
 * allow_partial (then recorded as the root attribute `partial`, "shards 0,2 of 4"); a shard
 * that did not finish (its /progress short of its batches) is refused the same way. Refuses to
 * replace out_path unless force; the new file is written to OUT.tmp and renamed, so a failed
 * merge keeps the old one. */
int td_runfile_merge(const char *out_path, const char *const *inputs, int n, const char *command_line,
                     int force, int allow_partial, td_error *err);

/* Summary statistics over the /tokens of a run file. */
int td_diff_summarize(const char *run_path, td_diff_summary *sum, td_error *err);

TD_END_DECLS

#endif
