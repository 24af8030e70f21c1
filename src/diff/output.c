/* The diff job's output file (src/diff/job.h): created with the run's attributes (or reopened
 * by --resume), a batch committed at a time, and --force's replacement of a finished file. */
#include "job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

char *sampling_json(const td_diff_opts *o)
{
    char *s = td_xmalloc(512);
    snprintf(s, 512, "{\"temperature\":%.17g,\"top_p\":%.17g,\"top_k\":%d,\"min_p\":%.17g,"
             "\"repetition_penalty\":%.17g,\"max_new_tokens\":%d,\"stop_at_eos\":%s}",
             o->sampling.temperature, o->sampling.top_p, o->sampling.top_k, o->sampling.min_p,
             o->sampling.repetition_penalty, o->max_new_tokens, o->stop_at_eos ? "true" : "false");
    return s;
}

/* The stop set as the run file records it: "[128001,128008,128009]". */
static void eos_json(const job *J, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < J->n_eos && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", J->eos[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* The attributes of a new file: what made it and with what. */
static int write_attributes(job *J, const char *const *keys, const char *const *vals, size_t n_keys, td_error *err)
{
    const td_diff_opts *o = J->o;
    /* absolute, so that tools run from another directory still find the tokenizer (the
     * fingerprint tells them whether the checkpoint there is still the one that was run) */
    char *model_abs = realpath(o->model_dir, NULL);
    char created[64];
    time_t now = time(NULL);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    int rc = -1;
    if (td_runfile_set_str(J->rf, "command_line", o->command_line ? o->command_line : "", err) ||
        td_runfile_set_str(J->rf, "tool", "tidal-diff", err) ||
        td_runfile_set_str(J->rf, "created", created, err) ||
        td_runfile_set_str(J->rf, "model_path", model_abs ? model_abs : o->model_dir, err) ||
        td_runfile_set_i64(J->rf, "seed", (int64_t)o->seed, err) ||
        td_runfile_set_str(J->rf, "recipe_a_name", o->recipe_a.name, err) ||
        td_runfile_set_str(J->rf, "recipe_b_name", o->recipe_b.name, err) ||
        td_runfile_set_str(J->rf, "device", td_model_device(J->model), err) ||
        td_runfile_set_str(J->rf, "mode", J->prompts.has_rollouts ? "replay" : "generate", err) ||
        td_runfile_set_i64(J->rf, "batches_planned", (int64_t)((J->n_mine + (size_t)o->batch - 1) / (size_t)o->batch), err))
        goto done;
    char eos[16 * TD_CONFIG_MAX_EOS];
    eos_json(J, eos, sizeof eos);
    if (td_runfile_set_str(J->rf, "eos_token_ids", eos, err) ||
        td_runfile_set_str(J->rf, "config_unknown_keys", J->model->cfg.unknown_keys, err) ||
        (J->memory_plan && td_runfile_set_str(J->rf, "memory_plan", J->memory_plan, err)))
        goto done;
    /* a replay: where the engine's log-probs came from, and what they are (raw log-softmax, or
     * after the engine's temperature / top-p / top-k: --rollout-logprobs) */
    if (J->prompts.has_rollouts &&
        (td_runfile_set_str(J->rf, "rollout_format", J->prompts.rollout_format, err) ||
         td_runfile_set_str(J->rf, "rollout_logprobs", o->rollout_logprobs ? o->rollout_logprobs : "raw", err) ||
         td_runfile_set_str(J->rf, "trainer_logprobs", J->prompts.has_trainer_logp ? "yes" : "no", err)))
        goto done;
    for (size_t i = 0; i < n_keys; i++)
        if (td_runfile_set_str(J->rf, keys[i], vals[i], err)) goto done;
    if (td_runfile_flush(J->rf, err)) goto done;
    rc = 0;
done:
    free(model_abs);
    return rc;
}

int open_output(job *J, td_error *err)
{
    const td_diff_opts *o = J->o;
    char fp[32], shard[64], seed[32];
    model_fingerprint(o->model_dir, fp);
    snprintf(shard, sizeof shard, "%d/%d", o->shard_k, o->shard_n);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    char *ra = td_recipe_to_json(&o->recipe_a), *rb = td_recipe_to_json(&o->recipe_b), *sj = sampling_json(o);
    char batch[32], score[8], layers[8];
    snprintf(batch, sizeof batch, "%d", o->batch);
    snprintf(score, sizeof score, "%d", o->score_prompt);
    snprintf(layers, sizeof layers, "%d", o->layers);
    const char *mode_a = !o->lora_dir ? "none" : o->lora_merge_a ? "merged" : "unmerged";
    const char *mode_b = !o->lora_dir || J->prompts.has_rollouts ? "none"
                         : o->lora_merge_b == TD_LORA_PUNICA ? "adapter" : o->lora_merge_b ? "merged" : "unmerged";
    /* what --resume requires unchanged */
    const char *keys[] = {"model_fingerprint", "recipe_a", "recipe_b", "sampling", "seed_str", "shard", "batch", "score_prompt", "prompts_file",
                          "layers", "lora_path", "lora_mode_a", "lora_mode_b", "logprob_temperature", "routing_replay"};
    char lt[32];
    snprintf(lt, sizeof lt, "%.17g", o->logprob_temperature > 0 ? o->logprob_temperature : 1.0);
    const char *vals[] = {fp, ra, rb, sj, seed, shard, batch, score, o->prompts_path, layers, o->lora_dir ? o->lora_dir : "", mode_a, mode_b, lt,
                          o->routing_replay ? "r3" : "none"};
    /* routing_replay: MoE models only (a dense run's file has no such attribute) */
    size_t n_keys = sizeof keys / sizeof keys[0] - (J->moe_layers ? 0 : 1);
    int rc;
    struct stat st;
    int there = stat(o->out_path, &st) == 0;
    int empty = o->resume && there && st.st_size == 0;
    if (empty)   /* created, then stopped before its first commit (which writes the attributes) */
        fprintf(stderr, "tidal-diff: %s is empty (the run stopped before its first commit): starting it afresh\n", o->out_path);
    /* stopped before it made the file (a kill while the model loaded): a job that is always
     * restarted with --resume starts it, as tidal-rl --resume does */
    int missing = o->resume && !there && errno == ENOENT;
    if (missing) {
        fprintf(stderr, "tidal-diff: %s does not exist (the run stopped before it made it): starting it\n", o->out_path);
        empty = 1;
    }
    if (o->resume && !empty) {
        rc = resume_output(J, keys, vals, n_keys, err);
    } else {
        J->rf = td_runfile_create(J->write_path, o->force || empty, err);
        rc = J->rf ? write_attributes(J, keys, vals, n_keys, err) : -1;
    }
    free(ra); free(rb); free(sj);
    return rc;
}

/* --force: the new file (J->write_path, closed or open) replaces OUT by a rename; reopened for
 * appending when the run goes on. */
int take_place(job *J, int reopen, td_error *err)
{
    if (!J->replacing) return 0;
    if (J->rf && td_runfile_close(J->rf, err)) { J->rf = NULL; return -1; }
    J->rf = NULL;
    if (td_runfile_replace(J->write_path, J->o->out_path) != 0)
        return td_fail(err, "%s: cannot replace it with %s", J->o->out_path, J->write_path);
    J->replacing = 0;
    if (reopen && !(J->rf = td_runfile_open(J->o->out_path, 1, err))) return -1;
    return 0;
}

/* Writes the buffered batch rows, then its /progress row, then flushes. */
int commit_batch(job *J, int64_t batch_no, td_error *err)
{
    /* /tokens/logp_trainer (the last column) only for replays that carry it */
    size_t n_tok = J->prompts.has_trainer_logp ? TD_TOK_COUNT : TD_TOK_LOGP_TRAINER;
    /* /seqs' text columns (the last ones) and /text only for runs with text */
    size_t n_seq = J->has_text ? TD_SEQ_COUNT : TD_SEQ_TEXT_OFFSET;
    if (td_columns_write(J->rf, J->tcols, n_tok, err) || td_columns_write(J->rf, J->scols, n_seq, err) ||
        td_columns_write(J->rf, J->pcols, TD_PRM_COUNT, err) ||
        (J->has_text && td_columns_write(J->rf, J->xcols, TD_TXT_COUNT, err))) return -1;
    if (J->o->layers && td_runfile_append(J->rf, td_schema_layers_rel_err.path, td_schema_layers_rel_err.type,
                                          (size_t)J->model->cfg.num_layers, J->layer_rows, J->n_layer_rows, err)) return -1;
    J->n_layer_rows = 0;
    if (J->moe_layers) {
        size_t Lm = (size_t)J->moe_layers, n = J->n_route_rows;
        if (td_runfile_append(J->rf, td_schema_routing_flip.path, td_schema_routing_flip.type, Lm, J->route_flip, n, err) ||
            td_runfile_append(J->rf, td_schema_routing_margin_a.path, td_schema_routing_margin_a.type, Lm, J->route_margin,
                              n, err) ||
            td_runfile_append(J->rf, td_schema_routing_moved.path, td_schema_routing_moved.type, Lm, J->route_moved, n,
                              err) ||
            td_runfile_append(J->rf, td_schema_routing_flips.path, td_schema_routing_flips.type, 1, J->route_nflips, n,
                              err) ||
            td_runfile_append(J->rf, td_schema_routing_experts_b.path, td_schema_routing_experts_b.type,
                              Lm * (size_t)J->moe_k, J->route_experts, n, err))
            return -1;
        J->n_route_rows = 0;
    }
    J->rows[TD_GROUP_TOKENS] += (int64_t)J->tcols[TD_TOK_SEQ].n;
    J->rows[TD_GROUP_SEQS] += (int64_t)J->scols[TD_SEQ_PROMPT_INDEX].n;
    J->rows[TD_GROUP_PROMPTS] += (int64_t)J->pcols[TD_PRM_TOKENS].n;
    J->rows[TD_GROUP_TEXT] += (int64_t)J->xcols[TD_TXT_UTF8].n;
    td_columns_clear(J->tcols, TD_TOK_COUNT);
    td_columns_clear(J->scols, TD_SEQ_COUNT);
    td_columns_clear(J->pcols, TD_PRM_COUNT);
    td_columns_clear(J->xcols, TD_TXT_COUNT);
    int64_t prog[TD_PRG_COUNT] = {[TD_PRG_BATCH] = batch_no, [TD_PRG_SEQ_ROWS] = J->rows[TD_GROUP_SEQS],
                                  [TD_PRG_TOKEN_ROWS] = J->rows[TD_GROUP_TOKENS], [TD_PRG_PROMPT_ROWS] = J->rows[TD_GROUP_PROMPTS],
                                  [TD_PRG_TEXT_ROWS] = J->rows[TD_GROUP_TEXT]};
    for (int k = 0; k < (J->has_text ? TD_PRG_COUNT : TD_PRG_TEXT_ROWS); k++)
        if (td_runfile_append(J->rf, td_schema_progress[k].path, td_schema_progress[k].type, 1, &prog[k], 1, err)) return -1;
    if (td_runfile_flush(J->rf, err)) return -1;
    return take_place(J, 1, err);
}
