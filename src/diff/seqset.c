/* Token sequences from a prompts file or a run file (include/tidal/seqset.h). */
#include "tidal/seqset.h"
#include "tidal/prompts.h"
#include "tidal/runfile.h"
#include "tidal/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void alloc_set(td_seqset *s, int n)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->tok = td_xcalloc((size_t)(n ? n : 1), sizeof(int32_t *));
    s->len = td_xcalloc((size_t)(n ? n : 1), sizeof(int));
    s->plen = td_xcalloc((size_t)(n ? n : 1), sizeof(int));
    s->batch = td_xcalloc((size_t)(n ? n : 1), sizeof(int64_t));
}

/* as the diff job reads prompts (src/diff/diff.c): model inputs keep their special tokens */
static int tokenize_cb(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n,
                       td_error *err)
{
    return td_tokenizer_encode((const td_tokenizer *)user, text, len, model_input, !model_input, ids, n, err);
}

int td_seqset_from_prompts(td_seqset *s, const char *model_dir, const char *prompts_path, int vocab_size,
                           int ctx, td_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    struct stat st;
    td_tokenizer *tok = NULL;
    if (stat(path, &st) == 0 && !(tok = td_tokenizer_load(path, err))) return -1;
    td_prompt_set ps;
    td_prompt_reader reader = {.tokenize = tok ? tokenize_cb : NULL, .tok_user = tok, .vocab_size = vocab_size, .max_len = ctx};
    if (tok) {
        reader.chat_template = td_tokenizer_chat_template(tok, &reader.chat_template_from);
        reader.bos_token = td_tokenizer_token_str(tok, td_tokenizer_bos_id(tok));
        reader.eos_token = td_tokenizer_token_str(tok, td_tokenizer_eos_id(tok));
    }
    int rc = td_prompts_read(prompts_path, &reader, &ps, err);
    if (tok) td_tokenizer_free(tok);
    if (rc) return -1;
    alloc_set(s, (int)ps.n);
    for (size_t i = 0; i < ps.n; i++) {
        const td_prompt *p = &ps.items[i];
        s->plen[i] = p->n_prompt;
        s->len[i] = p->n_prompt + p->n_response;
        s->tok[i] = td_xmalloc((size_t)(s->len[i] ? s->len[i] : 1) * sizeof(int32_t));
        memcpy(s->tok[i], p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
        if (p->n_response) memcpy(s->tok[i] + p->n_prompt, p->response, (size_t)p->n_response * sizeof(int32_t));
        s->batch[i] = (int64_t)i / 8;
        if (s->len[i] > s->max_len) s->max_len = s->len[i];
    }
    td_prompts_free(&ps);
    return 0;
}

int td_seqset_from_run(td_seqset *s, const char *run_path, td_error *err)
{
    td_runfile *rf = td_runfile_open(run_path, 0, err);
    if (!rf) return -1;
    int64_t n = td_runfile_rows(rf, "/seqs/prompt_len"), nt = td_runfile_rows(rf, "/prompts/tokens");
    if (n < 0 || nt < 0) {
        td_runfile_close(rf, NULL);
        return td_fail(err, "%s: no readable /seqs/prompt_len or /prompts/tokens (not a tidal-diff run file?)", run_path);
    }
    alloc_set(s, (int)n);
    int32_t *rl = td_xmalloc((size_t)(n ? n : 1) * 4), *all = td_xmalloc((size_t)(nt ? nt : 1) * 4);
    int64_t *off = td_xmalloc((size_t)(n ? n : 1) * 8);
    int rc = -1;
    if (td_runfile_read(rf, "/seqs/prompt_len", TD_COL_I32, 0, n, s->plen, err) ||
        td_runfile_read(rf, "/seqs/response_len", TD_COL_I32, 0, n, rl, err) ||
        td_runfile_read(rf, "/seqs/tokens_offset", TD_COL_I64, 0, n, off, err) ||
        td_runfile_read(rf, "/seqs/batch", TD_COL_I64, 0, n, s->batch, err) ||
        td_runfile_read(rf, "/prompts/tokens", TD_COL_I32, 0, nt, all, err))
        goto done;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = (int64_t)s->plen[i] + rl[i];
        if (s->plen[i] < 1 || rl[i] < 0 || off[i] < 0 || off[i] + len > nt) {
            td_fail(err, "%s: /seqs row %lld: prompt_len %d, response_len %d, tokens_offset %lld do not fit /prompts/tokens "
                    "(%lld ids; corrupt file?)", run_path, (long long)i, s->plen[i], rl[i], (long long)off[i], (long long)nt);
            goto done;
        }
        s->len[i] = (int)len;
        s->tok[i] = td_xmalloc((size_t)len * sizeof(int32_t));
        memcpy(s->tok[i], all + off[i], (size_t)len * sizeof(int32_t));
        if (s->len[i] > s->max_len) s->max_len = s->len[i];
    }
    rc = 0;
done:
    free(rl); free(all); free(off);
    td_runfile_close(rf, NULL);
    if (rc) td_seqset_free(s);
    return rc;
}

void td_seqset_free(td_seqset *s)
{
    if (!s->tok) return;
    for (int i = 0; i < s->n; i++) free(s->tok[i]);
    free(s->tok); free(s->len); free(s->plen); free(s->batch);
    memset(s, 0, sizeof *s);
}
