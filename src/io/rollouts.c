/* Rollout records as RL frameworks hold and dump them (see rollouts.h and
 * datasets/rollouts/README.md for one example file per format). Each format is recognised by
 * a key only it has, then read field by field; padding is removed by the framework's own
 * masks, and every error names the format, the fields found and the fields expected.
 *
 *   vllm    RequestOutput: prompt_token_ids, outputs[k].token_ids, outputs[k].logprobs
 *           (one {"<token_id>": {"logprob", "rank", "decoded_token"}} per position; the
 *           sampled token's entry is the engine's log-prob); one rollout per output
 *   sglang  /generate response + request: input_ids (the request's), output_ids,
 *           meta_info.output_token_logprobs ([logprob, token_id, text] or {logprob, token_id})
 *   verl    DataProto batch row: prompts (left-padded), responses (right-padded),
 *           attention_mask (prompt + response), response_mask (optional), rollout_log_probs
 *           (the engine's), old_log_probs (the trainer's, optional)
 *   trl     GRPOTrainer batch row: prompt_ids + prompt_mask (left-padded), completion_ids +
 *           completion_mask (right-padded), sampling_per_token_logps (the engine's),
 *           old_per_token_logps (the trainer's, optional)
 *   tidal   prompt_ids, response_ids, rollout_logprobs, trainer_logprobs (optional); aliases
 *           prompt_token_ids, output_token_ids, logprobs */
#include "rollouts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void td_json_key_list(json_t *o, char *out, size_t cap)
{
    size_t n = 0;
    const char *k;
    json_t *v;
    out[0] = 0;
    json_object_foreach(o, k, v) {
        if (n + strlen(k) + 8 >= cap) { snprintf(out + n, cap - n, ", ..."); break; }
        n += (size_t)snprintf(out + n, cap - n, "%s\"%s\"", n ? ", " : "", k);
    }
}

typedef struct {
    json_t *o;
    const char *where, *fmt;
    int vocab;
    td_error *err;
} rd;

static int rfail(const rd *r, const char *expected, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rfail(const rd *r, const char *expected, const char *fmt, ...)
{
    char problem[400], found[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    td_json_key_list(r->o, found, sizeof found);
    return td_fail(r->err, "%s: %s rollout record: %s (fields found: %s; expected: %s)", r->where, r->fmt, problem,
                   found, expected);
}

static json_t *get(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    return v || !b ? v : json_object_get(o, b);
}

/* A JSON array of token ids in [0, vocab); n_want >= 0 demands that length. */
static int ids(const rd *r, json_t *arr, const char *key, int n_want, int32_t **out, int *n, const char *expected)
{
    *out = NULL;
    if (!json_is_array(arr)) return rfail(r, expected, "\"%s\" must be an array of token ids", key);
    size_t len = json_array_size(arr);
    if (len > (1u << 24)) return rfail(r, expected, "\"%s\" has %zu ids, more than tidal accepts", key, len);
    if (n_want >= 0 && (int)len != n_want) return rfail(r, expected, "\"%s\" has %zu entries, expected %d", key, len, n_want);
    int32_t *v = td_xmalloc((len ? len : 1) * sizeof *v);
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(arr, i);
        json_int_t t = json_is_integer(x) ? json_integer_value(x) : -1;
        if (!json_is_integer(x) || t < 0 || t >= r->vocab) {
            free(v);
            if (!json_is_integer(x)) return rfail(r, expected, "\"%s\"[%zu] is not an integer", key, i);
            return rfail(r, expected, "\"%s\"[%zu] = %lld is outside the vocabulary [0, %d)", key, i, (long long)t, r->vocab);
        }
        v[i] = (int32_t)t;
    }
    *out = v;
    *n = (int)len;
    return 0;
}

/* A 0/1 mask of length n (integers or booleans); NULL arr = all ones. */
static int mask(const rd *r, json_t *arr, const char *key, int n, unsigned char **out, const char *expected)
{
    *out = td_xmalloc((size_t)(n ? n : 1));
    if (!arr) { memset(*out, 1, (size_t)(n ? n : 1)); return 0; }
    if (!json_is_array(arr) || (int)json_array_size(arr) != n) {
        free(*out);
        *out = NULL;
        return rfail(r, expected, "\"%s\" must be an array of %d zeros and ones", key, n);
    }
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, (size_t)i);
        int b = json_is_boolean(x) ? json_is_true(x) : json_is_integer(x) ? (int)json_integer_value(x) : -1;
        if (b != 0 && b != 1) { free(*out); *out = NULL; return rfail(r, expected, "\"%s\"[%d] is not 0 or 1", key, i); }
        (*out)[i] = (unsigned char)b;
    }
    return 0;
}

/* The valid span [*a, *b) of a mask: its ones must be contiguous. */
static int span(const rd *r, const unsigned char *m, int n, const char *key, int *a, int *b, const char *expected)
{
    *a = 0;
    while (*a < n && !m[*a]) (*a)++;
    *b = *a;
    while (*b < n && m[*b]) (*b)++;
    for (int i = *b; i < n; i++)
        if (m[i])
            return rfail(r, expected, "\"%s\" has a 0 at position %d between ones: interior masked tokens (multi-turn "
                         "tool output) are not supported, only padding at the ends", key, *b);
    return 0;
}

/* Per-token log-probs at positions [a, b) of an array of n numbers (the rest is padding). */
static int logps(const rd *r, json_t *arr, const char *key, int n, int a, int b, float **out, const char *expected)
{
    *out = NULL;
    if (!json_is_array(arr) || (int)json_array_size(arr) != n)
        return rfail(r, expected, "\"%s\" must be an array of %d log-probs, one per response position", key, n);
    float *v = td_xmalloc((size_t)(b - a + 1) * sizeof *v);
    for (int i = a; i < b; i++) {
        json_t *x = json_array_get(arr, (size_t)i);
        double lp = json_is_number(x) ? json_number_value(x) : NAN;
        if (!isfinite(lp) || lp > 0) {
            free(v);
            return rfail(r, expected, "\"%s\"[%d] must be a finite log-probability <= 0", key, i);
        }
        v[i - a] = (float)lp;
    }
    *out = v;
    return 0;
}

/* Fills p from full arrays and their valid spans; takes nothing over (copies). */
static int finish(const rd *r, td_prompt *p, const int32_t *pid, int pa, int pb, const int32_t *rid, int ra, int rb,
                  const char *expected)
{
    if (pb <= pa) return rfail(r, expected, "empty prompt (no unmasked prompt token)");
    if (rb <= ra) return rfail(r, expected, "empty response (no unmasked response token)");
    if (ra != 0) return rfail(r, expected, "the response starts with %d masked positions: responses are padded on the right", ra);
    p->n_prompt = pb - pa;
    p->prompt = td_xmalloc((size_t)p->n_prompt * sizeof(int32_t));
    memcpy(p->prompt, pid + pa, (size_t)p->n_prompt * sizeof(int32_t));
    p->n_response = rb - ra;
    p->response = td_xmalloc((size_t)p->n_response * sizeof(int32_t));
    memcpy(p->response, rid + ra, (size_t)p->n_response * sizeof(int32_t));
    return 0;
}

static void prompt_clear(td_prompt *p)
{
    free(p->prompt); free(p->response); free(p->rollout_logp); free(p->trainer_logp);
    memset(p, 0, sizeof *p);
}

/* TRL and verl: padded batch rows with masks. */
static int padded(const rd *r, td_prompt *p, bool trl)
{
    static const char *const exp_trl = "\"prompt_ids\", \"completion_ids\", \"sampling_per_token_logps\"; optional "
                                       "\"prompt_mask\", \"completion_mask\", \"old_per_token_logps\"";
    static const char *const exp_verl = "\"prompts\", \"responses\", \"attention_mask\", \"rollout_log_probs\"; optional "
                                        "\"response_mask\", \"old_log_probs\"";
    const char *expected = trl ? exp_trl : exp_verl;
    const char *k_p = trl ? "prompt_ids" : "prompts", *k_r = trl ? "completion_ids" : "responses";
    const char *k_eng = trl ? "sampling_per_token_logps" : "rollout_log_probs";
    const char *k_tr = trl ? "old_per_token_logps" : "old_log_probs";
    int32_t *pid = NULL, *rid = NULL;
    unsigned char *pm = NULL, *rm = NULL;
    int np = 0, nr = 0, pa, pb, ra, rb, rc = -1;
    if (ids(r, json_object_get(r->o, k_p), k_p, -1, &pid, &np, expected) ||
        ids(r, json_object_get(r->o, k_r), k_r, -1, &rid, &nr, expected)) goto out;
    if (trl) {
        if (mask(r, json_object_get(r->o, "prompt_mask"), "prompt_mask", np, &pm, expected) ||
            mask(r, json_object_get(r->o, "completion_mask"), "completion_mask", nr, &rm, expected)) goto out;
    } else {
        json_t *am = json_object_get(r->o, "attention_mask");
        unsigned char *all = NULL;
        if (!am) { rfail(r, expected, "no \"attention_mask\": verl's prompts are left-padded and only it says where"); goto out; }
        if (mask(r, am, "attention_mask", np + nr, &all, expected)) goto out;
        pm = td_xmalloc((size_t)np + 1);
        memcpy(pm, all, (size_t)np);
        if (json_object_get(r->o, "response_mask")) {
            free(all);
            if (mask(r, json_object_get(r->o, "response_mask"), "response_mask", nr, &rm, expected)) goto out;
        } else {
            rm = td_xmalloc((size_t)nr + 1);
            memcpy(rm, all + np, (size_t)nr);
            free(all);
        }
    }
    if (span(r, pm, np, trl ? "prompt_mask" : "attention_mask", &pa, &pb, expected) ||
        span(r, rm, nr, trl ? "completion_mask" : "response_mask", &ra, &rb, expected)) goto out;
    json_t *eng = json_object_get(r->o, k_eng), *tr = json_object_get(r->o, k_tr);
    if (!eng) {
        rfail(r, expected, "no engine log-probs \"%s\"%s", k_eng,
              trl ? " (TRL keeps vLLM's log-probs under this name when vllm_importance_sampling_correction is on)"
                  : " (verl records them with actor_rollout_ref.rollout.calculate_log_probs=True)");
        goto out;
    }
    if (finish(r, p, pid, pa, pb, rid, ra, rb, expected) ||
        logps(r, eng, k_eng, nr, ra, rb, &p->rollout_logp, expected) ||
        (tr && !json_is_null(tr) && logps(r, tr, k_tr, nr, ra, rb, &p->trainer_logp, expected))) goto out;
    rc = 1;
out:
    free(pid); free(rid); free(pm); free(rm);
    return rc;
}

static int vllm(const rd *r, td_prompt *out, int n_max)
{
    static const char *const expected = "\"prompt_token_ids\" and \"outputs\": [{\"token_ids\", \"logprobs\": "
                                        "[{\"<token_id>\": {\"logprob\", ...}}, ...]}, ...]";
    int32_t *pid = NULL;
    int np = 0, n = 0;
    json_t *outs = json_object_get(r->o, "outputs");
    if (ids(r, json_object_get(r->o, "prompt_token_ids"), "prompt_token_ids", -1, &pid, &np, expected)) return -1;
    if (!json_is_array(outs) || json_array_size(outs) == 0) { free(pid); return rfail(r, expected, "\"outputs\" must be a non-empty array"); }
    if ((int)json_array_size(outs) > n_max) { free(pid); return rfail(r, expected, "more than %d outputs", n_max); }
    for (size_t k = 0; k < json_array_size(outs); k++, n++) {
        json_t *o = json_array_get(outs, k), *lp = json_object_get(o, "logprobs");
        char key[64];
        int32_t *rid = NULL;
        int nr = 0;
        snprintf(key, sizeof key, "outputs[%zu].token_ids", k);
        if (ids(r, json_object_get(o, "token_ids"), key, -1, &rid, &nr, expected)) goto bad;
        if (!json_is_array(lp)) {
            free(rid);
            rfail(r, expected, "outputs[%zu].logprobs is %s: ask vLLM for them (SamplingParams(logprobs=0) returns the "
                  "sampled token's)", k, lp ? "not a list" : "missing");
            goto bad;
        }
        if ((int)json_array_size(lp) != nr) {
            free(rid);
            rfail(r, expected, "outputs[%zu].logprobs has %zu positions for %d token_ids", k, json_array_size(lp), nr);
            goto bad;
        }
        td_prompt *p = &out[n];
        if (finish(r, p, pid, 0, np, rid, 0, nr, expected)) { free(rid); goto bad; }
        p->rollout_logp = td_xmalloc((size_t)nr * sizeof(float));
        for (int i = 0; i < nr; i++) {
            char id[24];
            snprintf(id, sizeof id, "%d", rid[i]);
            json_t *e = json_object_get(json_array_get(lp, (size_t)i), id), *v = json_object_get(e, "logprob");
            double x = json_is_number(v) ? json_number_value(v) : json_is_number(e) ? json_number_value(e) : NAN;
            if (!isfinite(x) || x > 0) {
                free(rid);
                rfail(r, expected, "outputs[%zu].logprobs[%d] has no finite \"logprob\" <= 0 for the sampled token %s", k, i, id);
                n++;
                goto bad;
            }
            p->rollout_logp[i] = (float)x;
        }
        free(rid);
    }
    free(pid);
    return n;
bad:
    free(pid);
    for (int i = 0; i < n && i < n_max; i++) prompt_clear(&out[i]);
    return -1;
}

static int sglang(const rd *r, td_prompt *p)
{
    static const char *const expected = "\"input_ids\" (the /generate request's), \"output_ids\", "
                                        "\"meta_info\": {\"output_token_logprobs\": [[logprob, token_id, text], ...]}";
    json_t *meta = json_object_get(r->o, "meta_info"), *otl = json_object_get(meta, "output_token_logprobs");
    int32_t *pid = NULL, *rid = NULL;
    int np = 0, nr = 0, rc = -1;
    if (!json_object_get(r->o, "input_ids")) return rfail(r, expected, "no \"input_ids\": SGLang's response does not echo the "
                                                          "prompt's token ids; keep the request's \"input_ids\" in the record");
    if (ids(r, json_object_get(r->o, "input_ids"), "input_ids", -1, &pid, &np, expected) ||
        ids(r, json_object_get(r->o, "output_ids"), "output_ids", -1, &rid, &nr, expected)) goto out;
    if (!json_is_array(otl) || (int)json_array_size(otl) != nr) {
        rfail(r, expected, "meta_info.output_token_logprobs must hold one entry per output id (%d)%s", nr,
              otl ? "" : ": send \"return_logprob\": true");
        goto out;
    }
    if (finish(r, p, pid, 0, np, rid, 0, nr, expected)) goto out;
    p->rollout_logp = td_xmalloc((size_t)nr * sizeof(float));
    for (int i = 0; i < nr; i++) {
        json_t *e = json_array_get(otl, (size_t)i);
        json_t *lp = json_is_array(e) ? json_array_get(e, 0) : json_object_get(e, "logprob");
        json_t *id = json_is_array(e) ? json_array_get(e, 1) : json_object_get(e, "token_id");
        double x = json_is_number(lp) ? json_number_value(lp) : NAN;
        if (!json_is_integer(id) || json_integer_value(id) != rid[i]) {
            rfail(r, expected, "meta_info.output_token_logprobs[%d] is not for output_ids[%d] = %d", i, i, rid[i]);
            goto out;
        }
        if (!isfinite(x) || x > 0) { rfail(r, expected, "meta_info.output_token_logprobs[%d] has no finite log-prob <= 0", i); goto out; }
        p->rollout_logp[i] = (float)x;
    }
    rc = 1;
out:
    free(pid); free(rid);
    if (rc < 0) prompt_clear(p);
    return rc;
}

static int native(const rd *r, td_prompt *p)
{
    static const char *const expected = "\"prompt_ids\", \"response_ids\", \"rollout_logprobs\"; optional \"trainer_logprobs\" "
                                        "(aliases \"prompt_token_ids\", \"output_token_ids\", \"logprobs\")";
    int32_t *pid = NULL, *rid = NULL;
    int np = 0, nr = 0, rc = -1;
    json_t *jr = get(r->o, "response_ids", "output_token_ids");
    if (!jr) return rfail(r, expected, "a rollout needs \"response_ids\" with \"prompt_ids\"");
    if (ids(r, get(r->o, "prompt_ids", "prompt_token_ids"), "prompt_ids", -1, &pid, &np, expected) ||
        ids(r, jr, "response_ids", -1, &rid, &nr, expected) || finish(r, p, pid, 0, np, rid, 0, nr, expected)) goto out;
    json_t *tr = json_object_get(r->o, "trainer_logprobs");
    if (logps(r, get(r->o, "rollout_logprobs", "logprobs"), "rollout_logprobs", nr, 0, nr, &p->rollout_logp, expected) ||
        (tr && logps(r, tr, "trainer_logprobs", nr, 0, nr, &p->trainer_logp, expected))) goto out;
    rc = 1;
out:
    free(pid); free(rid);
    if (rc < 0) prompt_clear(p);
    return rc;
}

int td_rollouts_from_json(json_t *o, const char *where, int vocab, td_prompt *out, int n_max, const char **format,
                          td_error *err)
{
    rd r = {o, where, "", vocab, err};
    int n;
    if (json_object_get(o, "outputs")) { r.fmt = "vllm"; n = vllm(&r, out, n_max); }
    else if (json_object_get(o, "meta_info") || json_object_get(o, "output_ids")) { r.fmt = "sglang"; n = sglang(&r, out); }
    else if (json_object_get(o, "responses")) { r.fmt = "verl"; n = padded(&r, out, false); }
    else if (json_object_get(o, "completion_ids")) { r.fmt = "trl"; n = padded(&r, out, true); }
    else if (get(o, "prompt_ids", "prompt_token_ids") || get(o, "response_ids", "output_token_ids")) { r.fmt = "tidal"; n = native(&r, out); }
    else return 0;
    if (n < 0) { if (r.fmt[0] == 't' || r.fmt[0] == 'v') prompt_clear(out); return -1; }
    *format = r.fmt;
    return n;
}
