/* tidal — the run-file schema in one place: every dataset the diff job writes, with its type,
 * its unit and what its values refer to. The writer (src/diff), the reader (src/analysis/
 * runload.c) and tidal-merge (src/diff/merge.c) name datasets only through these tables;
 * reports/SCHEMA.md documents the same columns for users.
 *
 * A group's columns all have one row per unit of the group (a scored token, a sequence, a
 * token id of /prompts/tokens, a completed batch). `refers_to` names the group whose rows a
 * column's values index (tidal-merge shifts them when it joins files); `optional` columns are
 * written only by some runs (replays with the trainer's log-probs). */
#ifndef TIDAL_RUNSCHEMA_H
#define TIDAL_RUNSCHEMA_H

#include "tidal/runfile.h"

TD_BEGIN_DECLS

typedef struct {
    const char *path;       /* "/tokens/logp_a"                                             */
    td_coltype type;        /* as stored                                                     */
    const char *unit;       /* "nats", "token id", "row of /seqs", ...                       */
    const char *refers_to;  /* group whose rows the values index, or NULL                    */
    int optional;           /* absent from runs that have nothing to put there                */
} td_colspec;

/* /tokens: one row per scored token. */
enum { TD_TOK_SEQ, TD_TOK_POS, TD_TOK_TOKEN, TD_TOK_LOGP_A, TD_TOK_LOGP_B, TD_TOK_LOGP_B_PROC,
       TD_TOK_DLOGP, TD_TOK_KL_BA, TD_TOK_KL_AB, TD_TOK_K3, TD_TOK_TV, TD_TOK_ENTROPY_A,
       TD_TOK_ENTROPY_B, TD_TOK_TOP1_A, TD_TOK_TOP1_B, TD_TOK_RANK_A, TD_TOK_RANK_B,
       TD_TOK_IS_PROMPT, TD_TOK_STEP,
       TD_TOK_LOGP_TRAINER,   /* optional: replays whose dump holds the trainer's log-probs */
       TD_TOK_COUNT };
extern const td_colspec td_schema_tokens[TD_TOK_COUNT];

/* /seqs: one row per sequence. */
enum { TD_SEQ_PROMPT_INDEX, TD_SEQ_BATCH, TD_SEQ_PROMPT_LEN, TD_SEQ_RESPONSE_LEN,
       TD_SEQ_TOKEN_OFFSET, TD_SEQ_N_SCORED, TD_SEQ_FINISH, TD_SEQ_SUM_DLOGP, TD_SEQ_MEAN_ABS_DLOGP,
       TD_SEQ_MAX_ABS_DLOGP, TD_SEQ_MEAN_KL_BA, TD_SEQ_LOG_RATIO, TD_SEQ_TOKENS_OFFSET,
       /* optional, written last: runs with text (a tokenizer) */
       TD_SEQ_TEXT_OFFSET, TD_SEQ_PROMPT_TEXT_LEN, TD_SEQ_RESPONSE_TEXT_LEN,
       TD_SEQ_COUNT };
extern const td_colspec td_schema_seqs[TD_SEQ_COUNT];

/* /prompts: every sequence's prompt + response ids, concatenated; a sequence's start is
 * /seqs/tokens_offset and its length prompt_len + response_len. */
enum { TD_PRM_TOKENS, TD_PRM_COUNT };
extern const td_colspec td_schema_prompts[TD_PRM_COUNT];

/* /text: the UTF-8 text of every sequence, its prompt then its response, concatenated (runs
 * with a tokenizer): a sequence's prompt text is bytes [text_offset, + prompt_text_len) and its
 * response text the response_text_len bytes after it (/seqs). */
enum { TD_TXT_UTF8, TD_TXT_COUNT };
extern const td_colspec td_schema_text[TD_TXT_COUNT];

/* /progress: one row per completed batch, the row counts of the groups after it (text_rows:
 * runs with text only). */
enum { TD_PRG_BATCH, TD_PRG_SEQ_ROWS, TD_PRG_TOKEN_ROWS, TD_PRG_PROMPT_ROWS, TD_PRG_TEXT_ROWS, TD_PRG_COUNT };
extern const td_colspec td_schema_progress[TD_PRG_COUNT];

/* /steps: one row per optimiser step of a training run (tidal-sft), appended and flushed after
 * each step; skipped steps (fp16 loss scaling) have rows too. eval_* are NaN on the steps
 * without an evaluation. */
enum { TD_STP_STEP, TD_STP_EPOCH, TD_STP_LOSS, TD_STP_TOKEN_ACCURACY, TD_STP_GRAD_NORM, TD_STP_LR,
       TD_STP_LOSS_SCALE, TD_STP_SKIPPED, TD_STP_SKIPPED_TOTAL, TD_STP_TARGET_TOKENS, TD_STP_EVAL_ACCURACY,
       TD_STP_EVAL_REWARD, TD_STP_SECONDS, TD_STP_AUX_LOSS, TD_STP_COUNT };
extern const td_colspec td_schema_steps[TD_STP_COUNT];
#define TD_SCHEMA_STEPS "/steps"

/* /layers/rel_err: rows aligned with /tokens, one float32 column per layer (--layers). */
#define TD_SCHEMA_LAYERS "/layers"
/* Mixtures of experts (tidal-diff on an MoE model): rows aligned with /tokens, one column per MoE
 * layer (reports/SCHEMA.md): the routing of the position that predicted the token. */
#define TD_SCHEMA_ROUTING "/routing"
extern const td_colspec td_schema_routing_flip, td_schema_routing_margin_a, td_schema_routing_moved,
    td_schema_routing_flips, td_schema_routing_experts_b;
extern const td_colspec td_schema_layers_rel_err;
#define TD_SCHEMA_PROGRESS "/progress"

/* /seqs/finish values. */
enum { TD_FINISH_LENGTH = 0, TD_FINISH_EOS = 1, TD_FINISH_REPLAY = 2 };

/* The groups whose rows the diff job appends batch by batch: their columns, the /progress
 * column that holds their row count after each batch (what --resume cuts back to, what
 * tidal-merge shifts references into them by), and the column whose row count is the group's. */
typedef struct {
    const char *name;                /* "/tokens"                                      */
    const td_colspec *cols;
    int n_cols;
    const td_colspec *progress;      /* its row count in /progress                     */
    const td_colspec *count_col;     /* a column every run writes: the group's rows    */
    int optional;                    /* only some runs have the group (/text)          */
} td_schema_group;
enum { TD_GROUP_SEQS, TD_GROUP_TOKENS, TD_GROUP_PROMPTS, TD_GROUP_TEXT, TD_GROUP_COUNT };
extern const td_schema_group td_schema_groups[TD_GROUP_COUNT];

/* Bytes per value of a column type. */
static inline size_t td_coltype_size(td_coltype t)
{
    return t == TD_COL_I8 || t == TD_COL_U8 ? 1 : (t == TD_COL_I32 || t == TD_COL_F32) ? 4 : 8;
}

/* The group of a dataset path ("/tokens/logp_a" -> the /tokens entry), or NULL. */
const td_schema_group *td_schema_group_of(const char *group_name);

TD_END_DECLS

#endif
