/* tidal-logprobs — per-position next-token log-probs of one token sequence under a checkpoint,
 * fp32 CPU forward.
 *
 *   tidal-logprobs --model DIR --tokens 1,2,3[,...] [--decode] [--top-logprobs K]
 *
 * Default: the teacher-forced structure (training path). --decode: prefill the first token,
 * then decode the rest one token at a time through the KV cache (inference path).
 * Prints one line per position t >= 1: "t token logp" with logp = log p(token_t | tokens_<t),
 * and with --top-logprobs K the K most likely tokens after the last position. --recipe NAME|FILE runs
 * the structure under a precision recipe (default fp32).
 */
#include "tidal/memplan.h"
#include "tidal/model.h"
#include "tidal/opts.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "1,2,3" -> ids (caller frees); NULL + message on a bad list. */
static int *parse_tokens(const char *s, int *n)
{
    int cap = 16, *ids = malloc(cap * sizeof(int));
    *n = 0;
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff || (*end && *end != ',')) {
            fprintf(stderr, "tidal-logprobs: --tokens: expected comma-separated non-negative integers, got '%s'\n", s);
            free(ids);
            return NULL;
        }
        if (*n == cap) ids = realloc(ids, (cap *= 2) * sizeof(int));
        ids[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) { fprintf(stderr, "tidal-logprobs: --tokens: expected at least one token id, got ''\n"); free(ids); return NULL; }
    return ids;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *toks = NULL, *recipe_arg = "fp32", *device = "cpu";
    int decode = 0, top = 0;
    td_opt opts[] = {
        TD_OPT_S("model", 0, &dir, "DIR", "checkpoint directory"),
        TD_OPT_S("tokens", 0, &toks, "1,2,3", "the token ids, comma-separated"),
        TD_OPT_F("decode", 0, &decode, 1, "the inference path: prefill the first token, then decode\n"
                 "one token at a time through the KV cache"),
        TD_OPT_I("top-logprobs", 0, &top, "K", 0, 1 << 20, "also print the K most likely tokens after the last\n"
                 "position (OpenAI/vLLM top_logprobs)"),
        TD_OPT_S("recipe", 0, &recipe_arg, "NAME|FILE", "precision recipe (default fp32)"),
        TD_OPT_DEVICE(&device),
        TD_OPT_I("top", 0, &top, "K", 0, 1 << 20, NULL),   /* the old spelling, unlisted */
        {0}};
    td_opt_get(opts, "model")->required = 1;
    td_opt_get(opts, "tokens")->required = 1;
    td_cli cli = {"tidal-logprobs", "--model DIR --tokens 1,2,3 [--decode] [--top-logprobs K] [--recipe NAME|FILE] [--device cpu|cuda]",
                  "Per-position next-token log-probs of one token sequence under a checkpoint: one line per\n"
                  "position t >= 1, \"t token logp\" with logp = log p(token_t | tokens_<t). Default: the\n"
                  "teacher-forced structure (training path).", NULL, opts, 0, 0};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc0 >= 0) return rc0;
    int n;
    int *ids = parse_tokens(toks, &n);
    if (!ids) return 2;
    td_error err;
    td_recipe recipe;
    if (td_recipe_resolve(recipe_arg, &recipe, &err)) { fprintf(stderr, "tidal-logprobs: %s\n", err.msg); free(ids); return 2; }
    td_model *m = td_model_load(dir, &err);
    if (!m || td_model_set_device(m, device, &err)) {
        fprintf(stderr, "tidal-logprobs: %s\n", err.msg);
        td_model_free(m);
        free(ids);
        return 1;
    }
    if (strncmp(device, "cuda", 4) == 0) {   /* the GPU memory plan: printed, refused when short */
        td_memplan_in in = {.cfg = &m->cfg, .storage = td_model_weight_storage(m), .a = decode ? NULL : &recipe,
                            .b = decode || top ? &recipe : NULL, .fwd_tokens = n, .fwd_seq_len = n, .slots = 1,
                            .max_len = n, .nthreads = omp_get_max_threads()};
        td_memplan p = {0};
        if (td_device_mem_info(device, &p.free, &p.device_total, &err)) {
            fprintf(stderr, "tidal-logprobs: %s\n", err.msg);
            td_model_free(m);
            free(ids);
            return 1;
        }
        td_memplan_compute(&in, &p);
        td_memplan_print(stderr, "tidal-logprobs", &p, &in);
        if (!td_memplan_fits(&p)) {
            fprintf(stderr, "tidal-logprobs: %zu tokens do not fit the GPU: the plan needs %.1f MiB, %s has %.1f MiB free "
                    "(less %.1f MiB kept back): fewer tokens, or a GPU with more memory\n", (size_t)n,
                    (double)p.total / (1 << 20), device, (double)p.free / (1 << 20),
                    (double)td_memplan_reserve(p.free) / (1 << 20));
            td_model_free(m);
            free(ids);
            return 1;
        }
    }
    int V = m->cfg.vocab_size, rc = 0;
    float *logp = malloc((size_t)n * sizeof(float));
    float *row = malloc((size_t)V * sizeof(float));
    if (!decode) {
        td_forward *f = td_forward_create(m, n, n, 0, &err);
        const int *seqs[] = {ids};
        rc = !f || td_forward_set_recipe(f, &recipe, &err) || td_forward_logprobs(f, 1, seqs, &n, &logp, NULL, NULL, &err);
        td_forward_free(f);
    }
    td_session *s = NULL;
    if (!rc && (decode || top)) {
        /* the inference path: prefill token 0, then decode; it also gives the last row */
        s = td_session_create(m, 1, n, 0, &err);
        rc = !s || td_session_set_recipe(s, &recipe, &err);
    }
    if (s) {
        rc = td_session_prefill(s, 0, ids, 1, row, NULL, NULL, &err);
        for (int t = 1; t < n && !rc; t++) {
            if (decode) logp[t - 1] = row[ids[t]];
            int slot = 0;
            rc = td_session_decode(s, 1, &slot, &ids[t], row, &err);
        }
    }
    if (rc) {
        fprintf(stderr, "tidal-logprobs: %s\n", err.msg);
    } else {
        printf("# %s path, %d tokens\n# pos token logp\n", decode ? "decode" : "teacher-forced", n);
        for (int t = 1; t < n; t++) printf("%d %d %.6f\n", t, ids[t], logp[t - 1]);
        for (int k = 0; k < top && k < V; k++) {   /* K passes of argmax: K is small */
            int best = 0;
            for (int v = 1; v < V; v++) if (row[v] > row[best]) best = v;
            printf("# top %d: token %d logp %.6f\n", k + 1, best, row[best]);
            row[best] = -1e30f;
        }
    }
    td_session_free(s);
    free(logp); free(row); free(ids);
    td_model_free(m);
    return rc ? 1 : 0;
}
