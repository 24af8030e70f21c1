/* tidal — greedy evaluation of a task model (td_sft_evaluate, include/tidal/sft.h): each
 * record's prompt decoded greedily through the rollout loop on the inference path, the response
 * graded by its task's reward. */
#include "sft_internal.h"
#include "tidal/rollout.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int td_sft_evaluate(const td_model *m, const td_lora *lora, const td_tokenizer *tok,
                    const td_task_item *items, size_t n, const td_sft_eval_opts *o, double *accuracy,
                    double *mean_reward, FILE *completions, td_error *err)
{
    const int V = m->cfg.vocab_size, B = o && o->batch > 0 ? o->batch : 32;
    const td_recipe *rec = o && o->recipe ? o->recipe : td_recipe_find_preset("fp32");
    int eos = td_tokenizer_eos_id(tok);
    if (eos < 0 || eos >= V) return td_fail(err, "evaluation: the tokenizer has no eos_token in the vocabulary");
    /* every prompt, and the length budget */
    int **prompt = td_xcalloc(n ? n : 1, sizeof *prompt), *plen = td_xcalloc(n ? n : 1, sizeof *plen);
    int max_prompt = 0, max_ref = 0, rc = -1;
    for (size_t i = 0; i < n; i++) {
        td_error why;
        if (td_sft_encode_prompt(tok, items[i].prompt, V, &prompt[i], &plen[i], &why)) {
            td_fail(err, "evaluation record %s (line %ld): %s", items[i].id, items[i].line, why.msg);
            goto out0;
        }
        if (plen[i] > max_prompt) max_prompt = plen[i];
        int r = items[i].completion ? (int)strlen(items[i].completion) + 1 : 0;   /* a character vocabulary's count */
        if (r > max_ref) max_ref = r;
    }
    int new_tokens = o && o->max_new_tokens > 0 ? o->max_new_tokens : max_ref + 16;
    int max_len = max_prompt + new_tokens;
    if (td_config_check_len(&m->cfg, max_len, err)) goto out0;
    td_session *s = td_session_create(m, B, max_len, 0, err);
    td_sampler *smp = NULL;
    int **buf = td_xcalloc((size_t)B, sizeof *buf), *len = td_xcalloc((size_t)B, sizeof(int));
    int *fin = td_xcalloc((size_t)B, sizeof(int)), *pl = td_xcalloc((size_t)B, sizeof(int));
    uint64_t *stream = td_xcalloc((size_t)B, sizeof(uint64_t));
    int32_t *resp = td_xmalloc((size_t)max_len * sizeof(int32_t));
    for (int b = 0; b < B; b++) buf[b] = td_xmalloc((size_t)max_len * sizeof(int));
    if (!s || td_session_set_recipe_lora(s, rec, lora, 0, err)) goto out;
    smp = td_sampler_create(V);
    td_rollout_opts ro = {.sampling = td_sampling_default(), .max_new_tokens = new_tokens, .max_len = max_len,
                          .eos = &eos, .n_eos = 1, .stop_at_eos = 1, .seed = 0};
    ro.sampling.temperature = 0.0;
    double exact = 0, reward = 0;
    for (size_t i0 = 0; i0 < n; i0 += (size_t)B) {
        int nb = n - i0 < (size_t)B ? (int)(n - i0) : B;
        for (int b = 0; b < nb; b++) {
            memcpy(buf[b], prompt[i0 + b], (size_t)plen[i0 + b] * sizeof(int));
            pl[b] = plen[i0 + b];
            stream[b] = i0 + (size_t)b;
        }
        td_rollout_batch rb = {.n = nb, .tokens = buf, .prompt_len = pl, .stream = stream, .len = len, .finish = fin};
        if (td_rollout_generate(s, smp, &ro, &rb, NULL, NULL, err)) goto out;
        for (int b = 0; b < nb; b++) {
            const td_task_item *it = &items[i0 + b];
            int nr = len[b] - pl[b];
            for (int t = 0; t < nr; t++) resp[t] = buf[b][pl[b] + t];
            size_t tl = 0;
            char *text = td_tokenizer_decode(tok, resp, (size_t)nr, false, &tl);
            double r = 0;
            td_reward_info info = {0};
            if (td_task_reward(it->task, it->prompt, it->answer, text, tl, &r, &info, err)) { free(text); goto out; }
            exact += info.exact;
            reward += r;
            if (completions) {
                json_t *j = json_pack("{s:s, s:s%, s:f, s:b}", "id", it->id, "completion", text, tl, "reward", r,
                                      "exact", (int)info.exact);
                char *line = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
                fprintf(completions, "%s\n", line);
                free(line);
                json_decref(j);
            }
            free(text);
        }
    }
    *accuracy = n ? exact / (double)n : 0.0;
    if (mean_reward) *mean_reward = n ? reward / (double)n : 0.0;
    rc = 0;
out:
    for (int b = 0; b < B; b++) free(buf[b]);
    free(buf); free(len); free(fin); free(pl); free(stream); free(resp);
    td_sampler_free(smp);
    td_session_free(s);
out0:
    for (size_t i = 0; i < n; i++) free(prompt[i]);
    free(prompt);
    free(plen);
    return rc;
}
