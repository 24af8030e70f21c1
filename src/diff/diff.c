/* The diff job (see include/tidal/diff.h): batches of prompts through the inference path (B,
 * a rollout: src/paths/rollout.c) and the training path (A), metrics per token, rows appended
 * to the run file per batch. The job's parts: src/diff/job.h. */
#include "job.h"
#include "tidal/memplan.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int tokenize_cb(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n, td_error *err)
{
    return td_tokenizer_encode((const td_tokenizer *)user, text, len, model_input, !model_input, ids, n, err);
}

/* Generates the batch's responses with the inference path (B); its rows go to on_row_b. */
static int generate(job *J, batch_state *b, const size_t *idx, td_error *err)
{
    const td_diff_opts *o = J->o;
    td_rollout_opts ro = {.sampling = o->sampling, .max_new_tokens = o->max_new_tokens, .max_len = J->max_len,
                          .eos = J->eos, .n_eos = J->n_eos, .stop_at_eos = o->stop_at_eos, .seed = o->seed,
                          .prompt_rows = o->score_prompt, .row_temperature = (float)o->logprob_temperature};
    uint64_t *stream = td_xmalloc((size_t)b->n * sizeof(uint64_t));
    for (int s = 0; s < b->n; s++) stream[s] = idx[s];   /* a prompt's draws follow its index */
    td_rollout_batch rb = {.n = b->n, .tokens = b->seq, .prompt_len = b->plen, .stream = stream,
                           .len = b->len, .finish = b->finish};
    td_rollout_row_fn row_fn = on_row_b;
    if (b->keep_from) {   /* B's rows stay on the device; its processed log-probs come down */
        rb.keep = (td_rows_dev_map){J->rows_dev, b->keep_from, b->keep_base};
        rb.logp_proc = b->logp_b_proc;
        row_fn = NULL;
    }
    size_t d2h0 = td_device_d2h_bytes();
    int rc = td_rollout_generate(J->sb, J->sampler, &ro, &rb, row_fn, b, err);
    J->d2h_generate += td_device_d2h_bytes() - d2h0;
    free(stream);
    return rc;
}

static int run_batch(job *J, int64_t batch_no, const size_t *idx, int n, td_error *err)
{
    batch_state b;
    batch_alloc(&b, J, idx, n);
    int rc = -1;
    if (b.L) {
        if (J->sb) td_session_set_layer_fn(J->sb, on_layer_b, &b);
        td_forward_set_layer_fn(J->fa, on_layer_a, &b);
    }
    if (b.Lm) {
        if (J->sb) td_session_set_moe_fn(J->sb, on_moe_b, &b);   /* replayed rollouts: no path B session */
        td_forward_set_moe_fn(J->fa, on_moe_a, &b);
        if (b.replay) td_forward_set_moe_replay(J->fa, replay_moe_b, &b);
    }
    if (!J->prompts.has_rollouts && generate(J, &b, idx, err)) goto done;
    size_t d2h0 = td_device_d2h_bytes();
    if (b.keep_from) {   /* both paths' rows on the device: the metrics computed there */
        td_rows_dev_map map = {J->rows_dev, b.keep_from, b.keep_base};
        if (td_forward_metrics(J->fa, n, (const int *const *)b.seq, b.len, &map, b.m, err)) goto done;
        for (int s = 0; s < n; s++)
            for (int pos = b.keep_from[s]; pos < b.len[s]; pos++) {
                b.have[s][pos] = 1;
                /* a prompt row stayed on the device: its "processed" log-prob is the raw one,
                 * the kept row's value at the token (td_rollout_batch.logp_proc) */
                if (pos < b.plen[s]) b.logp_b_proc[s][pos] = (float)b.m[s][pos].logp_b;
            }
    } else if (J->replay_dev && !b.proc) {   /* a replay: A's rows on the device, B's log-probs from the file */
        if (td_forward_metrics_replay(J->fa, n, (const int *const *)b.seq, b.len, b.plen, b.replay_b, b.m, err))
            goto done;
        for (int s = 0; s < n; s++)
            for (int pos = b.plen[s]; pos < b.len[s]; pos++) b.have[s][pos] = 1;
    } else {
        /* on_row_a writes only its token's metrics, except where it samples the processed row
         * into the batch's one buffer (b.proc) */
        td_forward_set_rows_parallel(J->fa, !b.proc);
        if (td_forward_logprobs(J->fa, n, (const int *const *)b.seq, b.len, NULL, on_row_a, &b, err)) goto done;
    }
    J->d2h_score += td_device_d2h_bytes() - d2h0;
    collect(J, &b, idx, batch_no);
    rc = 0;
done:
    if (b.L) { if (J->sb) td_session_set_layer_fn(J->sb, NULL, NULL); td_forward_set_layer_fn(J->fa, NULL, NULL); }
    if (b.Lm) {
        if (J->sb) td_session_set_moe_fn(J->sb, NULL, NULL);
        td_forward_set_moe_fn(J->fa, NULL, NULL);
        td_forward_set_moe_replay(J->fa, NULL, NULL);
    }
    batch_free(&b);
    return rc;
}

static void job_free(job *J)
{
    td_rows_dev_free(J->rows_dev);
    td_forward_free(J->fa);
    td_session_free(J->sb);
    td_sampler_free(J->sampler);
    td_columns_free(J->tcols, TD_TOK_COUNT);
    td_columns_free(J->scols, TD_SEQ_COUNT);
    td_columns_free(J->pcols, TD_PRM_COUNT);
    td_columns_free(J->xcols, TD_TXT_COUNT);
    td_prompts_free(&J->prompts);
    free(J->mine);
    free(J->layer_rows);
    free(J->route_flip); free(J->route_experts); free(J->route_margin); free(J->route_moved); free(J->route_nflips);
    free(J->flips_by_layer); free(J->routed_by_layer);
    if (J->tok) td_tokenizer_free(J->tok);
    free(J->memory_plan);
    td_lora_free(J->lora);
    if (J->model) td_model_free(J->model);
}

int td_diff_run(const td_diff_opts *opts, td_diff_summary *sum, td_error *err)
{
    job J;
    memset(&J, 0, sizeof J);
    td_diff_opts eff = *opts;   /* the options as run: the memory plan may lower the batch */
    td_diff_opts *o = &eff;
    J.o = o;
    td_columns_init(J.tcols, td_schema_tokens, TD_TOK_COUNT);
    td_columns_init(J.scols, td_schema_seqs, TD_SEQ_COUNT);
    td_columns_init(J.pcols, td_schema_prompts, TD_PRM_COUNT);
    td_columns_init(J.xcols, td_schema_text, TD_TXT_COUNT);
    int rc = -1;
    unsigned char *done = NULL;
    if (o->batch < 1 || o->max_new_tokens < 0 || o->shard_n < 1 || o->shard_k < 0 || o->shard_k >= o->shard_n) {
        td_fail(err, "bad options: --batch %d, --max-new-tokens %d, --shard %d/%d", o->batch, o->max_new_tokens, o->shard_k, o->shard_n);
        goto out;
    }
    if (td_sampling_check(&o->sampling, err)) goto out;
    /* fail on an unwritable output before the long work, not after it; a finished file that
     * --force replaces stays until the new run has a completed batch (take_place) */
    J.replacing = !o->plan_only && !o->resume && o->force && access(o->out_path, F_OK) == 0;
    snprintf(J.write_path, sizeof J.write_path, J.replacing ? "%s.new.tmp" : "%s", o->out_path ? o->out_path : "");
    if (!o->resume && !o->plan_only) {
        if (!o->force && access(o->out_path, F_OK) == 0) {
            td_fail(err, "%s: already exists; not replacing it (use --resume to continue it, or --force to replace it)", o->out_path);
            goto out;
        }
        int fd = open(J.write_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            td_fail(err, "%s: cannot create the file: %s (is the directory there and writable?)", J.write_path, strerror(errno));
            goto out;
        }
        close(fd);
        remove(J.write_path);
    }
    td_config cfg_only;   /* --plan-only: config.json alone, no weights */
    const td_config *cfg;
    td_format storage;
    if (o->plan_only) {
        char cpath[4096];
        snprintf(cpath, sizeof cpath, "%s/config.json", o->model_dir);
        if (td_config_parse(cpath, &cfg_only, err)) goto out;
        cfg = &cfg_only;
        storage = !strcmp(cfg->torch_dtype, "bfloat16") ? TD_BF16 : !strcmp(cfg->torch_dtype, "float16") ? TD_F16 : TD_F32;
    } else {
        fprintf(stderr, "tidal-diff: loading %s\n", o->model_dir);
        J.model = td_model_load_progress(o->model_dir, stderr, err);   /* progress of long work: stderr */
        if (!J.model || td_model_set_device(J.model, o->device ? o->device : "cpu", err)) goto out;
        cfg = &J.model->cfg;
        storage = td_model_weight_storage(J.model);
    }
    if (o->lora_dir && !(J.lora = td_lora_load(o->lora_dir, cfg, err))) goto out;
    if (o->routing_replay && cfg->num_experts <= 0) {
        td_fail(err, "--routing-replay r3: %s is a dense model (%s): it has no routing to replay", o->model_dir,
                td_arch_name(cfg->arch));
        goto out;
    }
    J.moe_layers = cfg->num_experts > 0 ? td_config_num_moe_layers(cfg) : 0;
    J.moe_k = cfg->num_experts_per_tok;
    if (J.moe_layers) {
        J.flips_by_layer = td_xcalloc((size_t)J.moe_layers, sizeof(int64_t));
        J.routed_by_layer = td_xcalloc((size_t)J.moe_layers, sizeof(int64_t));
    }
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o->model_dir);
    struct stat st;
    if (stat(tok_path, &st) == 0) {
        J.tok = td_tokenizer_load(tok_path, err);
        if (!J.tok) goto out;
    }
    if (o->chat_template && (!J.tok ? td_fail(err, "--chat-template: %s has no tokenizer.json to tokenise the rendered "
                                              "prompts with", o->model_dir)
                                    : td_tokenizer_set_chat_template(J.tok, o->chat_template, err)))
        goto out;
    /* the stop set: generation_config.json's eos list wins over config.json's, as in transformers */
    J.n_eos = td_checkpoint_stop_ids(o->model_dir, cfg, J.tok ? td_tokenizer_eos_id(J.tok) : -1, J.eos, err);
    if (J.n_eos < 0) goto out;
    int ctx = cfg->max_position > 0 ? cfg->max_position : 1 << 20;
    td_prompt_reader reader = {.tokenize = J.tok ? tokenize_cb : NULL, .tok_user = J.tok, .vocab_size = cfg->vocab_size,
                               .max_len = ctx, .skip_bad = o->skip_bad_lines};
    if (J.tok) {
        reader.chat_template = td_tokenizer_chat_template(J.tok, &reader.chat_template_from);
        reader.bos_token = td_tokenizer_token_str(J.tok, td_tokenizer_bos_id(J.tok));
        reader.eos_token = td_tokenizer_token_str(J.tok, td_tokenizer_eos_id(J.tok));
    }
    if (td_prompts_read(o->prompts_path, &reader, &J.prompts, err)) goto out;
    if (J.prompts.has_rollouts && o->score_prompt) { td_fail(err, "--score-prompt applies to generated runs, not to replayed rollouts"); goto out; }
    if (J.prompts.has_rollouts && o->routing_replay) { td_fail(err, "--routing-replay r3 needs the inference path's routing: it applies to generated runs (a rollout dump carries no experts)"); goto out; }
    if (J.prompts.has_rollouts && o->layers) { td_fail(err, "--layers needs the inference path's hidden states: it applies to generated runs, not to replayed rollouts"); goto out; }
    /* this shard's prompts, in file order */
    J.mine = td_xmalloc(J.prompts.n * sizeof(size_t));
    int max_prompt = 0;
    for (size_t i = 0; i < J.prompts.n; i++) {
        if ((int)(i % (size_t)o->shard_n) != o->shard_k) continue;
        J.mine[J.n_mine++] = i;
        int l = J.prompts.items[i].n_prompt + J.prompts.items[i].n_response;
        /* a generated sequence must fit the context whole: refuse it here, not cut it short */
        if (!J.prompts.has_rollouts && (int64_t)l + o->max_new_tokens > ctx) {
            td_fail(err, "%s:%ld: prompt of %d tokens + --max-new-tokens %d is past the model's context of %d "
                    "positions (max_position_embeddings); shorten the prompt or lower --max-new-tokens",
                    o->prompts_path, J.prompts.items[i].line, l, o->max_new_tokens, ctx);
            goto out;
        }
        td_error why;
        if (td_config_check_len(cfg, (int64_t)l + (J.prompts.has_rollouts ? 0 : o->max_new_tokens), &why)) {
            td_fail(err, "%s:%ld: %s", o->prompts_path, J.prompts.items[i].line, why.msg);
            goto out;
        }
        if (l > max_prompt) max_prompt = l;
    }
    J.max_len = max_prompt + (J.prompts.has_rollouts ? 0 : o->max_new_tokens);
    if (J.max_len > ctx) J.max_len = ctx;
    if (J.max_len < 2) J.max_len = 2;

    int fwd_tokens, chunk, slots;
    if (diff_memory_plan(&J, o, cfg, storage, &fwd_tokens, &chunk, &slots, err)) goto out;
    if (o->plan_only) { rc = 0; goto out; }

    J.has_text = J.tok != NULL;   /* --resume: as the file has it (resume_output) */
    if (open_output(&J, err)) goto out;
    done = td_xcalloc(J.prompts.n, 1);
    if (mark_done(&J, done, err)) goto out;

    J.fa = td_forward_create(J.model, fwd_tokens, J.max_len, 0, err);
    if (!J.fa || td_forward_set_recipe_lora(J.fa, &o->recipe_a, J.lora, o->lora_merge_a, err)) goto out;
    if (lora_report(&J, 'a', td_forward_lora_stats(J.fa), &o->recipe_a, err)) goto out;
    if (o->logprob_temperature > 0 && o->logprob_temperature != 1) td_forward_set_temperature(J.fa, (float)o->logprob_temperature);
    /* a replay of raw log-probs on a device: A's rows scored there (processed ones are formed
     * from A's rows by td_sample on the host: those rows come down) */
    J.replay_dev = J.prompts.has_rollouts && td_forward_device_metrics(J.fa) && !diff_metrics_on_host() &&
                   !(o->rollout_logprobs && !strcmp(o->rollout_logprobs, "processed"));
    if (!J.prompts.has_rollouts) {
        J.sb = td_session_create(J.model, slots, J.max_len, chunk, err);
        if (!J.sb || td_session_set_recipe_lora(J.sb, &o->recipe_b, J.lora, o->lora_merge_b, err)) goto out;
        if (lora_report(&J, 'b', td_session_lora_stats(J.sb), &o->recipe_b, err)) goto out;
        J.sampler = td_sampler_create(cfg->vocab_size);
        if (J.keep_rows > 0) J.rows_dev = td_rows_dev_create(J.model, (size_t)slots * (size_t)J.keep_rows);
    } else if (o->lora_merge_b) {
        fprintf(stderr, "tidal-diff: note: --lora-merge-b has no effect when replaying rollouts (path B is the recorded log-probs)\n");
    }
    size_t nbatches = (J.n_mine + (size_t)o->batch - 1) / (size_t)o->batch, skipped = 0;
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    int64_t tokens0 = J.rows[TD_GROUP_TOKENS], ran = 0;
    time_t w0 = time(NULL);
    int tty = isatty(fileno(stderr));
    for (size_t bi = 0; bi < nbatches; bi++) {
        size_t i0 = bi * (size_t)o->batch, n = J.n_mine - i0 < (size_t)o->batch ? J.n_mine - i0 : (size_t)o->batch;
        if (done[J.mine[i0]]) { skipped++; continue; }   /* batches are all-or-nothing */
        if (o->stop && *o->stop) {
            fprintf(stderr, "\n");
            if (J.replacing)
                td_fail(err, TD_DIFF_INTERRUPTED ": stopped before batch %zu of %zu; nothing of the new run was "
                        "kept and %s is as it was", bi + 1, nbatches, o->out_path);
            else
                td_fail(err, TD_DIFF_INTERRUPTED ": stopped before batch %zu of %zu; %s holds every batch "
                        "completed so far (--resume finishes it)", bi + 1, nbatches, o->out_path);
            goto out;
        }
        if (run_batch(&J, (int64_t)bi, J.mine + i0, (int)n, err)) goto out;
        if (commit_batch(&J, (int64_t)bi, err)) goto out;
        diff_memory_sample(&J);
        ran++;
        double el = difftime(time(NULL), w0);
        fprintf(stderr, "%stidal-diff: batch %zu/%zu  sequences %lld  tokens %lld  %.0f s%s", tty ? "\r" : "", bi + 1,
                nbatches, (long long)J.rows[TD_GROUP_SEQS], (long long)J.rows[TD_GROUP_TOKENS], el, tty ? "" : "\n");
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    if (tty && nbatches) fprintf(stderr, "\n");
    if (skipped) fprintf(stderr, "tidal-diff: resumed: %zu batches were already complete\n", skipped);
    if (J.moe_layers && !J.prompts.has_rollouts && ran) {   /* this run's batches (a resumed file: its new ones) */
        fprintf(stderr, "tidal-diff: routing: expert-set flips between A and B per MoE layer%s:",
                o->routing_replay ? " (A's own router against B's experts, which A replayed)" : "");
        for (int m = 0; m < J.moe_layers; m++)
            fprintf(stderr, " %.4f", J.routed_by_layer[m] ? (double)J.flips_by_layer[m] / J.routed_by_layer[m] : 0.0);
        fprintf(stderr, "\n");
    }
    if (J.model && J.model->backend && ran)
        fprintf(stderr, "tidal-diff: device to host: generation %zu bytes (%s), scoring %zu bytes (per-token "
                "metrics %s)\n", J.d2h_generate,
                J.prompts.has_rollouts ? "a replay: none" : J.rows_dev ? "B's rows kept on the device" : "B's rows downloaded",
                J.d2h_score, J.rows_dev || J.replay_dev ? "computed on the device" : "computed on the host");
    if (diff_memory_record(&J, err)) goto out;
    if (td_runfile_close(J.rf, err)) { J.rf = NULL; goto out; }
    J.rf = NULL;
    if (take_place(&J, 0, err)) goto out;   /* a run with no batch to do */
    if (td_runfile_compact(o->out_path, err)) goto out;   /* complete: drop the appends' dead space */
    rc = sum ? td_diff_summarize(o->out_path, sum, err) : 0;
    if (sum) {
        sum->run_batches = ran;
        sum->run_tokens = J.rows[TD_GROUP_TOKENS] - tokens0;
        sum->run_seconds = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
        snprintf(sum->replay_format, sizeof sum->replay_format, "%s",
                 J.prompts.has_rollouts && J.prompts.rollout_format ? J.prompts.rollout_format : "");
    }
out:
    if (J.rf) td_runfile_close(J.rf, NULL);
    if (J.replacing) td_runfile_remove(J.write_path);   /* the old OUT stays */
    if (rc && sum) sum->out_untouched = J.replacing;
    free(done);
    job_free(&J);
    return rc;
}

