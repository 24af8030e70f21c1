/* tidal — prompt and rollout files (JSONL, one object per line).
 *
 *   {"text": "..."}                       tokenised with the checkpoint's tokenizer
 *   {"tokens": [1, 2, 3]}                 token ids as they are
 *   {"prompt_ids": [...], "response_ids": [...], "rollout_logprobs": [...]}
 *                                         a rollout from an external engine (vLLM, SGLang):
 *                                         the response is replayed through the training path
 *                                         and compared with the recorded log-probs
 *                                         ("prompt_token_ids", "output_token_ids", "logprobs"
 *                                         are accepted as aliases)
 * Any other keys (ids, metadata) are ignored. Empty lines are skipped. A malformed line stops
 * the load with its line number, or is skipped with a warning when skip_bad is set.
 */
#ifndef TIDAL_PROMPTS_H
#define TIDAL_PROMPTS_H

#include "tidal/common.h"

#include <stdbool.h>

TD_BEGIN_DECLS

typedef struct {
    int32_t *prompt;          /* (n_prompt) token ids                                   */
    int n_prompt;
    int32_t *response;        /* (n_response) rollouts only, else NULL                  */
    int n_response;
    float *rollout_logp;      /* (n_response) rollouts only                             */
    long line;                /* line number in the file (1-based)                      */
} td_prompt;

typedef struct {
    td_prompt *items;
    size_t n;
    size_t n_skipped;         /* bad lines skipped (skip_bad)                           */
    bool has_rollouts;        /* every item is a rollout                                */
} td_prompt_set;

/* Text -> token ids, supplied by the caller (the checkpoint's tokenizer). Return 0 or -1 + err. */
typedef int (*td_tokenize_fn)(void *user, const char *text, size_t len, int32_t **ids, size_t *n,
                              td_error *err);

/* Loads a JSONL file. vocab_size bounds token ids; max_len bounds prompt + response length
 * (the context); tokenize may be NULL (then "text" lines are errors naming the missing
 * tokenizer). Mixing prompts and rollouts in one file is an error at the first line of the
 * other kind (with skip_bad too: it is the file that is wrong, not one line). */
int td_prompts_load(const char *path, td_tokenize_fn tokenize, void *tok_user, int vocab_size,
                    int max_len, bool skip_bad, td_prompt_set *out, td_error *err);
void td_prompts_free(td_prompt_set *ps);

TD_END_DECLS

#endif
