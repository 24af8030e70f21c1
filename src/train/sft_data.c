/* tidal — tidal-sft's data: task records read (tasks.h) and tokenised as TRL's SFTTrainer
 * tokenises prompt-completion records (include/tidal/sft.h). */
#include "sft_internal.h"

#include <stdlib.h>
#include <string.h>

/* 0, or -1 + err naming the first character the tokenizer does not know (its <unk>) or an id
 * outside the model's vocabulary. */
static int check_ids(const td_tokenizer *tok, const int32_t *ids, size_t n, int vocab, const char *text,
                     const char *what, td_error *err)
{
    int32_t unk = td_tokenizer_token_id(tok, "<unk>");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return td_fail(err, "%s: token id %d is outside the model's vocabulary (vocab_size %d): the "
                           "tokenizer does not match the checkpoint", what, (int)ids[i], vocab);
        if (unk >= 0 && ids[i] == unk && !strstr(text, "<unk>"))
            return td_fail(err, "%s: the text holds a character the tokenizer's vocabulary lacks (it "
                           "encodes to <unk>): the tokenizer does not match the data", what);
    }
    return 0;
}

int td_sft_encode_prompt(const td_tokenizer *tok, const char *text, int vocab, int **ids, int *n, td_error *err)
{
    int32_t *raw = NULL;
    size_t k = 0;
    if (td_tokenizer_encode(tok, text, strlen(text), false, true, &raw, &k, err)) return -1;
    if (check_ids(tok, raw, k, vocab, text, "prompt", err)) { free(raw); return -1; }
    *ids = td_xmalloc((k ? k : 1) * sizeof(int));
    for (size_t i = 0; i < k; i++) (*ids)[i] = raw[i];
    *n = (int)k;
    free(raw);
    return 0;
}

static int encode_record(const td_tokenizer *tok, const td_task_item *it, int vocab, int eos, sft_example *e,
                         const char *where, td_error *err)
{
    td_error why;
    int *p = NULL, np = 0;
    if (td_sft_encode_prompt(tok, it->prompt, vocab, &p, &np, &why))
        return td_fail(err, "%s: %s", where, why.msg);
    int32_t *c = NULL;
    size_t nc = 0;
    if (it->completion) {
        if (td_tokenizer_encode(tok, it->completion, strlen(it->completion), false, false, &c, &nc, &why) ||
            check_ids(tok, c, nc, vocab, it->completion, "completion", &why)) {
            free(p);
            free(c);
            return td_fail(err, "%s: %s", where, why.msg);
        }
    }
    e->plen = np;
    e->len = it->completion ? np + (int)nc + 1 : np;
    e->ids = td_xmalloc((size_t)(e->len ? e->len : 1) * sizeof(int));
    memcpy(e->ids, p, (size_t)np * sizeof(int));
    for (size_t i = 0; i < nc; i++) e->ids[np + i] = c[i];
    if (it->completion) e->ids[e->len - 1] = eos;
    free(p);
    free(c);
    if (np < 1) return td_fail(err, "%s: the prompt encodes to no token", where);
    return 0;
}

int sft_data_load(sft_data *d, const char *path, const td_tokenizer *tok, int vocab, int need_completion,
                  td_error *err)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    if (td_task_read_jsonl(path, &d->items, &d->n, err)) return -1;
    if (d->n == 0) return td_fail(err, "%s: no records", path);
    int eos = td_tokenizer_eos_id(tok);
    if (eos < 0 || eos >= vocab)
        return td_fail(err, "the tokenizer has no eos_token inside the model's vocabulary (eos id %d, vocab_size "
                       "%d): SFT appends it to every completion", eos, vocab);
    d->ex = td_xcalloc(d->n, sizeof *d->ex);
    for (size_t i = 0; i < d->n; i++) {
        const td_task_item *it = &d->items[i];
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", path, it->line);
        if (need_completion && !it->completion)
            return td_fail(err, "%s: no \"completion\": SFT needs the reference completion of every "
                           "training record", where);
        if (encode_record(tok, it, vocab, eos, &d->ex[i], where, err)) return -1;
        if (d->ex[i].len > d->max_len) d->max_len = d->ex[i].len;
        if (d->ex[i].len - d->ex[i].plen > d->max_response) d->max_response = d->ex[i].len - d->ex[i].plen;
    }
    return 0;
}

void sft_data_free(sft_data *d)
{
    for (size_t i = 0; d->ex && i < d->n; i++) free(d->ex[i].ids);
    free(d->ex);
    td_task_items_free(d->items, d->n);
    memset(d, 0, sizeof *d);
}
