/* Fuzz target: prompts / rollouts JSONL (td_prompts_read), strict and with skip_bad, with a
 * byte-per-token tokenizer for text lines and a ChatML chat template for conversations; seeds
 * include one rollout dump per framework (datasets/rollouts). vocab 512 and context 64 bound what is accepted;
 * every accepted item is checked against those bounds. */
#include "fuzz_util.h"
#include "tidal/prompts.h"

static int byte_tok(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n, td_error *err)
{
    *ids = malloc((len ? len : 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = len;
    return 0;
}

static const char *const CHATML =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "prompts.jsonl", data, size);
    for (int skip = 0; skip < 2; skip++) {
        td_error err;
        td_prompt_set ps;
        /* with a chat template (ChatML, as Qwen's) so conversational records are rendered too */
        td_prompt_reader r = {.tokenize = byte_tok, .chat_template = CHATML, .chat_template_from = "fuzz",
                              .bos_token = "<s>", .vocab_size = 512, .max_len = 64, .skip_bad = skip};
        if (td_prompts_read(path, &r, &ps, &err) != 0) continue;
        for (size_t i = 0; i < ps.n; i++) {
            const td_prompt *p = &ps.items[i];
            if (p->n_prompt < 0 || p->n_response < 0 || p->n_prompt + p->n_response > 64) abort();
            for (int j = 0; j < p->n_prompt; j++) if (p->prompt[j] < 0 || p->prompt[j] >= 512) abort();
            for (int j = 0; j < p->n_response; j++) if (p->response[j] < 0 || p->response[j] >= 512) abort();
        }
        td_prompts_free(&ps);
    }
    return 0;
}
