/* tidal — greedy evaluation of a task model (td_sft_evaluate, include/tidal/sft.h): each
 * record's prompt decoded greedily through the rollout loop on the inference path (td_greedy_complete,
 * which tidal-rl's evaluation of the user's own records uses too), the response graded by its
 * task's reward. */
#include "sft_internal.h"
#include "tidal/rollout.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int td_greedy_complete(const td_model *m, const td_lora *lora, const td_recipe *rec, int *const *prompt,
                       const int *plen, size_t n, int batch, int new_tokens, const int *eos, int n_eos,
                       td_greedy_fn fn, void *user, td_error *err)
{
    const int B = batch > 0 ? batch : 32;
    int max_prompt = 0, rc = -1;
    for (size_t i = 0; i < n; i++)
        if (plen[i] > max_prompt) max_prompt = plen[i];
    int max_len = max_prompt + new_tokens;
    if (td_config_check_len(&m->cfg, max_len, err)) return -1;
    td_session *s = td_session_create(m, B, max_len, 0, err);
    td_sampler *smp = NULL;
    int **buf = td_xcalloc((size_t)B, sizeof *buf), *len = td_xcalloc((size_t)B, sizeof(int));
    int *fin = td_xcalloc((size_t)B, sizeof(int)), *pl = td_xcalloc((size_t)B, sizeof(int));
    uint64_t *stream = td_xcalloc((size_t)B, sizeof(uint64_t));
    for (int b = 0; b < B; b++) buf[b] = td_xmalloc((size_t)max_len * sizeof(int));
    if (!s || td_session_set_recipe_lora(s, rec ? rec : td_recipe_find_preset("fp32"), lora, 0, err)) goto out;
    smp = td_sampler_create(m->cfg.vocab_size);
    td_rollout_opts ro = {.sampling = td_sampling_default(), .max_new_tokens = new_tokens, .max_len = max_len,
                          .eos = eos, .n_eos = n_eos, .stop_at_eos = 1, .seed = 0};
    ro.sampling.temperature = 0.0;
    for (size_t i0 = 0; i0 < n; i0 += (size_t)B) {
        int nb = n - i0 < (size_t)B ? (int)(n - i0) : B;
        for (int b = 0; b < nb; b++) {
            memcpy(buf[b], prompt[i0 + b], (size_t)plen[i0 + b] * sizeof(int));
            pl[b] = plen[i0 + b];
            stream[b] = i0 + (size_t)b;
        }
        td_rollout_batch rb = {.n = nb, .tokens = buf, .prompt_len = pl, .stream = stream, .len = len, .finish = fin};
        if (td_rollout_generate(s, smp, &ro, &rb, NULL, NULL, err)) goto out;
        for (int b = 0; b < nb; b++)
            if (fn(user, i0 + (size_t)b, buf[b], pl[b], len[b], err)) goto out;
    }
    rc = 0;
out:
    for (int b = 0; b < B; b++) free(buf[b]);
    free(buf); free(len); free(fin); free(pl); free(stream);
    td_sampler_free(smp);
    td_session_free(s);
    return rc;
}

/* td_sft_evaluate's grading of one greedy completion */
typedef struct {
    const td_tokenizer *tok;
    const td_task_item *items;
    FILE *completions;
    double exact, reward;
    int32_t *resp;
} sft_eval_ctx;

static int grade_one(void *user, size_t i, const int *tokens, int plen, int len, td_error *err)
{
    sft_eval_ctx *c = user;
    const td_task_item *it = &c->items[i];
    int nr = len - plen;
    for (int t = 0; t < nr; t++) c->resp[t] = tokens[plen + t];
    size_t tl = 0;
    char *text = td_tokenizer_decode(c->tok, c->resp, (size_t)nr, false, &tl);
    double r = 0;
    td_reward_info info = {0};
    if (td_task_reward(it->task, it->prompt, it->answer, text, tl, &r, &info, err)) { free(text); return -1; }
    c->exact += info.exact;
    c->reward += r;
    if (c->completions) {
        json_t *j = json_pack("{s:s, s:s%, s:f, s:b}", "id", it->id, "completion", text, tl, "reward", r, "exact",
                              (int)info.exact);
        char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fprintf(c->completions, "%s\n", line);
        free(line);
        json_decref(j);
    }
    free(text);
    return 0;
}

int td_sft_evaluate(const td_model *m, const td_lora *lora, const td_tokenizer *tok,
                    const td_task_item *items, size_t n, const td_sft_eval_opts *o, double *accuracy,
                    double *mean_reward, FILE *completions, td_error *err)
{
    const int V = m->cfg.vocab_size;
    int eos = td_tokenizer_eos_id(tok);
    if (eos < 0 || eos >= V) return td_fail(err, "evaluation: the tokenizer has no eos_token in the vocabulary");
    /* every prompt, and the length budget */
    int **prompt = td_xcalloc(n ? n : 1, sizeof *prompt), *plen = td_xcalloc(n ? n : 1, sizeof *plen);
    int max_prompt = 0, max_ref = 0, rc = -1;
    for (size_t i = 0; i < n; i++) {
        td_error why;
        if (td_sft_encode_prompt(tok, items[i].prompt, V, &prompt[i], &plen[i], &why)) {
            td_fail(err, "evaluation record %s (line %ld): %s", items[i].id, items[i].line, why.msg);
            goto out;
        }
        if (plen[i] > max_prompt) max_prompt = plen[i];
        int r = items[i].completion ? (int)strlen(items[i].completion) + 1 : 0;   /* a character vocabulary's count */
        if (r > max_ref) max_ref = r;
    }
    int new_tokens = o && o->max_new_tokens > 0 ? o->max_new_tokens : max_ref + 16;
    sft_eval_ctx c = {.tok = tok, .items = items, .completions = completions,
                      .resp = td_xmalloc((size_t)(new_tokens + 1) * sizeof(int32_t))};
    rc = td_greedy_complete(m, lora, o ? o->recipe : NULL, prompt, plen, n, o ? o->batch : 0, new_tokens, &eos, 1,
                            grade_one, &c, err);
    free(c.resp);
    if (!rc) {
        *accuracy = n ? c.exact / (double)n : 0.0;
        if (mean_reward) *mean_reward = n ? c.reward / (double)n : 0.0;
    }
out:
    for (size_t i = 0; i < n; i++) free(prompt[i]);
    free(prompt);
    free(plen);
    return rc;
}
