/* The run-file schema (include/tidal/runschema.h; documented for users in reports/SCHEMA.md). */
#include "tidal/runschema.h"

#include <string.h>

const td_colspec td_schema_tokens[TD_TOK_COUNT] = {
    [TD_TOK_SEQ]          = {"/tokens/seq", TD_COL_I64, "row of /seqs", "/seqs", 0},
    [TD_TOK_POS]          = {"/tokens/pos", TD_COL_I32, "position in prompt + response", NULL, 0},
    [TD_TOK_TOKEN]        = {"/tokens/token", TD_COL_I32, "token id", NULL, 0},
    [TD_TOK_LOGP_A]       = {"/tokens/logp_a", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_LOGP_B]       = {"/tokens/logp_b", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_LOGP_B_PROC]  = {"/tokens/logp_b_proc", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_DLOGP]        = {"/tokens/dlogp", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_KL_BA]        = {"/tokens/kl_ba", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_KL_AB]        = {"/tokens/kl_ab", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_K3]           = {"/tokens/k3", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_TV]           = {"/tokens/tv", TD_COL_F64, "probability", NULL, 0},
    [TD_TOK_ENTROPY_A]    = {"/tokens/entropy_a", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_ENTROPY_B]    = {"/tokens/entropy_b", TD_COL_F64, "nats", NULL, 0},
    [TD_TOK_TOP1_A]       = {"/tokens/top1_a", TD_COL_I32, "token id", NULL, 0},
    [TD_TOK_TOP1_B]       = {"/tokens/top1_b", TD_COL_I32, "token id", NULL, 0},
    [TD_TOK_RANK_A]       = {"/tokens/rank_a", TD_COL_I32, "rank (1 = most probable)", NULL, 0},
    [TD_TOK_RANK_B]       = {"/tokens/rank_b", TD_COL_I32, "rank (1 = most probable)", NULL, 0},
    [TD_TOK_IS_PROMPT]    = {"/tokens/is_prompt", TD_COL_I8, "flag", NULL, 0},
    [TD_TOK_STEP]         = {"/tokens/step", TD_COL_I32, "generation step (pos - prompt_len)", NULL, 0},
    [TD_TOK_LOGP_TRAINER] = {"/tokens/logp_trainer", TD_COL_F64, "nats", NULL, 1},
};

const td_colspec td_schema_seqs[TD_SEQ_COUNT] = {
    [TD_SEQ_PROMPT_INDEX]   = {"/seqs/prompt_index", TD_COL_I64, "line of the prompts file (0-based)", NULL, 0},
    [TD_SEQ_BATCH]          = {"/seqs/batch", TD_COL_I64, "batch index", NULL, 0},
    [TD_SEQ_PROMPT_LEN]     = {"/seqs/prompt_len", TD_COL_I32, "tokens", NULL, 0},
    [TD_SEQ_RESPONSE_LEN]   = {"/seqs/response_len", TD_COL_I32, "tokens", NULL, 0},
    [TD_SEQ_TOKEN_OFFSET]   = {"/seqs/token_offset", TD_COL_I64, "row of /tokens", "/tokens", 0},
    [TD_SEQ_N_SCORED]       = {"/seqs/n_scored", TD_COL_I32, "tokens", NULL, 0},
    [TD_SEQ_FINISH]         = {"/seqs/finish", TD_COL_I8, "0 length, 1 EOS, 2 replayed", NULL, 0},
    [TD_SEQ_SUM_DLOGP]      = {"/seqs/sum_dlogp", TD_COL_F64, "nats", NULL, 0},
    [TD_SEQ_MEAN_ABS_DLOGP] = {"/seqs/mean_abs_dlogp", TD_COL_F64, "nats", NULL, 0},
    [TD_SEQ_MAX_ABS_DLOGP]  = {"/seqs/max_abs_dlogp", TD_COL_F64, "nats", NULL, 0},
    [TD_SEQ_MEAN_KL_BA]     = {"/seqs/mean_kl_ba", TD_COL_F64, "nats", NULL, 0},
    [TD_SEQ_LOG_RATIO]      = {"/seqs/log_ratio", TD_COL_F64, "nats", NULL, 0},
    [TD_SEQ_TOKENS_OFFSET]  = {"/seqs/tokens_offset", TD_COL_I64, "row of /prompts", "/prompts", 0},
    [TD_SEQ_TEXT_OFFSET]    = {"/seqs/text_offset", TD_COL_I64, "row of /text (byte)", "/text", 1},
    [TD_SEQ_PROMPT_TEXT_LEN]   = {"/seqs/prompt_text_len", TD_COL_I32, "bytes", NULL, 1},
    [TD_SEQ_RESPONSE_TEXT_LEN] = {"/seqs/response_text_len", TD_COL_I32, "bytes", NULL, 1},
};

const td_colspec td_schema_text[TD_TXT_COUNT] = {
    [TD_TXT_UTF8] = {"/text/utf8", TD_COL_U8, "UTF-8 byte", NULL, 1},
};

const td_colspec td_schema_prompts[TD_PRM_COUNT] = {
    [TD_PRM_TOKENS] = {"/prompts/tokens", TD_COL_I32, "token id", NULL, 0},
};

const td_colspec td_schema_progress[TD_PRG_COUNT] = {
    [TD_PRG_BATCH]       = {"/progress/batch", TD_COL_I64, "batch index", NULL, 0},
    [TD_PRG_SEQ_ROWS]    = {"/progress/seq_rows", TD_COL_I64, "rows of /seqs", NULL, 0},
    [TD_PRG_TOKEN_ROWS]  = {"/progress/token_rows", TD_COL_I64, "rows of /tokens", NULL, 0},
    [TD_PRG_PROMPT_ROWS] = {"/progress/prompt_rows", TD_COL_I64, "rows of /prompts", NULL, 0},
    [TD_PRG_TEXT_ROWS]   = {"/progress/text_rows", TD_COL_I64, "rows of /text", NULL, 1},
};

const td_colspec td_schema_steps[TD_STP_COUNT] = {
    [TD_STP_STEP]           = {"/steps/step", TD_COL_I32, "optimiser steps done after this one (1-based)", NULL, 0},
    [TD_STP_EPOCH]          = {"/steps/epoch", TD_COL_F64, "epochs of the training set consumed", NULL, 0},
    [TD_STP_LOSS]           = {"/steps/loss", TD_COL_F64, "nats (mean token cross-entropy over the step's masked targets)", NULL, 0},
    [TD_STP_TOKEN_ACCURACY] = {"/steps/token_accuracy", TD_COL_F64, "fraction of masked targets that are their row's argmax", NULL, 0},
    [TD_STP_GRAD_NORM]      = {"/steps/grad_norm", TD_COL_F64, "global L2 norm before clipping (unscaled)", NULL, 0},
    [TD_STP_LR]             = {"/steps/lr", TD_COL_F64, "learning rate used (0 on a skipped step)", NULL, 0},
    [TD_STP_LOSS_SCALE]     = {"/steps/loss_scale", TD_COL_F64, "loss scale the gradients carried (1 without scaling)", NULL, 0},
    [TD_STP_SKIPPED]        = {"/steps/skipped", TD_COL_I8, "flag: non-finite gradients, step skipped", NULL, 0},
    [TD_STP_SKIPPED_TOTAL]  = {"/steps/skipped_total", TD_COL_I64, "steps skipped so far", NULL, 0},
    [TD_STP_TARGET_TOKENS]  = {"/steps/target_tokens", TD_COL_I64, "tokens in the step's loss", NULL, 0},
    [TD_STP_EVAL_ACCURACY]  = {"/steps/eval_accuracy", TD_COL_F64, "greedy exact-answer rate on the eval split (NaN: not evaluated)", NULL, 0},
    [TD_STP_EVAL_REWARD]    = {"/steps/eval_reward", TD_COL_F64, "greedy mean task reward on the eval split (NaN: not evaluated)", NULL, 0},
    [TD_STP_SECONDS]        = {"/steps/seconds", TD_COL_F64, "wall seconds of the step (evaluation included)", NULL, 0},
    [TD_STP_AUX_LOSS]       = {"/steps/aux_loss", TD_COL_F64, "MoE with --output-router-logits: transformers' aux_loss "
                               "(load_balancing_loss_func), the loss trained being loss + router_aux_loss_coef x this", NULL, 1},
};

const td_colspec td_schema_layers_rel_err = {"/layers/rel_err", TD_COL_F32, "relative L2 error per layer", NULL, 1};
const td_colspec td_schema_routing_flip = {"/routing/flip", TD_COL_I8,
    "per MoE layer: 0 A and B chose the same experts in the same order, 1 the same set in another order, 2 another set "
    "(under --routing-replay: what A's own router would have chosen against B's experts); -1 B did not route that "
    "position", NULL, 1};
const td_colspec td_schema_routing_margin_a = {"/routing/margin_a", TD_COL_F32,
    "per MoE layer: path A's router margin, its k-th minus its (k+1)-th largest probability (fp32 softmax)", NULL, 1};
const td_colspec td_schema_routing_moved = {"/routing/moved", TD_COL_F32,
    "per MoE layer: path A's router probability on the experts A chose and B did not", NULL, 1};
const td_colspec td_schema_routing_experts_b = {"/routing/experts_b", TD_COL_I32,
    "per MoE layer, the K experts path B chose at the predicting position, in its top-k order (layer-major: "
    "column m * K + j); -1 where B did not route it", NULL, 1};
const td_colspec td_schema_routing_flips = {"/routing/n_flips", TD_COL_I32,
    "MoE layers whose expert set differs between A and B at the predicting position", NULL, 1};

const td_schema_group td_schema_groups[TD_GROUP_COUNT] = {
    [TD_GROUP_SEQS]    = {"/seqs", td_schema_seqs, TD_SEQ_COUNT, &td_schema_progress[TD_PRG_SEQ_ROWS],
                          &td_schema_seqs[TD_SEQ_PROMPT_INDEX]},
    [TD_GROUP_TOKENS]  = {"/tokens", td_schema_tokens, TD_TOK_COUNT, &td_schema_progress[TD_PRG_TOKEN_ROWS],
                          &td_schema_tokens[TD_TOK_SEQ]},
    [TD_GROUP_PROMPTS] = {"/prompts", td_schema_prompts, TD_PRM_COUNT, &td_schema_progress[TD_PRG_PROMPT_ROWS],
                          &td_schema_prompts[TD_PRM_TOKENS]},
    [TD_GROUP_TEXT]    = {"/text", td_schema_text, TD_TXT_COUNT, &td_schema_progress[TD_PRG_TEXT_ROWS],
                          &td_schema_text[TD_TXT_UTF8], 1},
};

const td_schema_group *td_schema_group_of(const char *group_name)
{
    for (int g = 0; g < TD_GROUP_COUNT; g++)
        if (group_name && !strcmp(td_schema_groups[g].name, group_name)) return &td_schema_groups[g];
    return NULL;
}
