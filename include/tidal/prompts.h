/* tidal — prompt and rollout files (JSONL, one object per line).
 *
 * Prompts (exactly one of these keys):
 *   {"text": "..."}                       tokenised with the checkpoint's tokenizer, its
 *                                         post-processor adding BOS/EOS (HF add_special_tokens)
 *   {"prompt": "..."}                     TRL's standard prompt: text as the model sees it
 *                                         (already templated), tokenised as TRL does: special
 *                                         tokens written in it are recognised, none are added
 *   {"prompt": [{"role", "content"}...]}  TRL's conversational prompt, and
 *   {"messages": [...]}                   a conversation: the checkpoint's chat template
 *                                         (tokenizer_config.json "chat_template", or
 *                                         chat_template.jinja) is applied as TRL applies it
 *                                         (last message from the user: add_generation_prompt;
 *                                         from the assistant: continue_final_message), then
 *                                         tokenised as "prompt" text is
 *   {"tokens": [1, 2, 3]}                 token ids as they are
 * Rollouts, replayed through the training path and compared with the engine's log-probs, in
 * the shapes RL frameworks write them (src/io/rollouts.c; one example file per format in
 * datasets/rollouts/): tidal's own {"prompt_ids", "response_ids", "rollout_logprobs",
 * "trainer_logprobs"?}, TRL's batch rows (prompt_ids/prompt_mask, completion_ids/
 * completion_mask, sampling_per_token_logps, old_per_token_logps), verl's DataProto rows
 * (prompts, responses, attention_mask, response_mask, rollout_log_probs, old_log_probs),
 * vLLM's RequestOutput (prompt_token_ids, outputs[].token_ids, outputs[].logprobs) and
 * SGLang's /generate (input_ids, output_ids, meta_info.output_token_logprobs). Padding is
 * removed by the record's masks. Where the record holds the trainer's own log-probs (TRL
 * old_per_token_logps, verl old_log_probs) they are kept as a third column.
 * Other keys (ids, answers, metadata) are ignored beside a recognised one; a record with none
 * of them is an error naming the keys it has. Empty lines are skipped. A malformed line stops
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
    float *rollout_logp;      /* (n_response) rollouts only: the engine's log-probs     */
    float *trainer_logp;      /* (n_response) the trainer's log-probs, or NULL          */
    long line;                /* line number in the file (1-based)                      */
} td_prompt;

typedef struct {
    td_prompt *items;
    size_t n;
    size_t n_skipped;         /* bad lines skipped (skip_bad)                           */
    bool has_rollouts;        /* every item is a rollout                                */
    bool has_trainer_logp;    /* some rollout carries the trainer's log-probs           */
    const char *rollout_format; /* "tidal", "trl", "verl", "vllm", "sglang"; NULL: prompts */
} td_prompt_set;

/* Text -> token ids, supplied by the caller (the checkpoint's tokenizer). model_input: the text
 * is a whole model input ("prompt" text, a rendered chat template): special tokens written in
 * it are recognised and none are added (TRL; apply_chat_template(tokenize=True)); otherwise
 * ("text") special tokens are plain text and the post-processor adds BOS/EOS. 0 or -1 + err. */
typedef int (*td_tokenize_fn)(void *user, const char *text, size_t len, bool model_input, int32_t **ids,
                              size_t *n, td_error *err);

/* Everything a load needs besides the path. */
typedef struct {
    td_tokenize_fn tokenize;      /* NULL: text records are errors naming the missing tokenizer  */
    void *tok_user;
    const char *chat_template;    /* template text, NULL: conversational records are errors      */
    const char *chat_template_from; /* where it came from (named in errors)                      */
    const char *bos_token, *eos_token;  /* template variables (NULL: "")                         */
    int vocab_size;               /* bounds token ids                                            */
    int max_len;                  /* bounds prompt + response (the context)                      */
    bool skip_bad;
} td_prompt_reader;

int td_prompts_read(const char *path, const td_prompt_reader *r, td_prompt_set *out, td_error *err);

/* td_prompts_read without a chat template. Loads a JSONL file. vocab_size bounds token ids; max_len bounds prompt + response length
 * (the context); tokenize may be NULL (then "text" lines are errors naming the missing
 * tokenizer). Mixing prompts and rollouts in one file is an error at the first line of the
 * other kind (with skip_bad too: it is the file that is wrong, not one line). */
int td_prompts_load(const char *path, td_tokenize_fn tokenize, void *tok_user, int vocab_size,
                    int max_len, bool skip_bad, td_prompt_set *out, td_error *err);
void td_prompts_free(td_prompt_set *ps);

/* A conversation (msgs: a JSON array of {"role", "content"} objects) as the text TRL feeds the
 * model (maybe_apply_chat_template): template t rendered with bos/eos (NULL: "") and
 * add_generation_prompt when the last message is the user's; cut after the final message's
 * content when it is the assistant's (continue_final_message). from names the template's file
 * and key the record's field in errors, which start with where. *text malloc'd, NUL-terminated,
 * *n bytes. 0 or -1 + err. */
struct json_t;
struct td_chat_template;
int td_prompt_chat_text(const struct td_chat_template *t, const char *from, const char *bos, const char *eos,
                        struct json_t *msgs, const char *key, const char *where, char **text, size_t *n, td_error *err);

TD_END_DECLS

#endif
