/* Fuzz target: chat templates (td_chat_template_parse + render). The input is template text,
 * rendered over a fixed two-turn conversation with tools, as tidal renders a tokenizer's
 * chat_template; the output must be a NUL-terminated string of the length reported. Seeds:
 * the published templates of tests/data/chat_templates and one-feature templates. */
#include "fuzz_util.h"
#include "tidal/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    td_error err;
    td_chat_template *t = td_chat_template_parse((const char *)data, size, &err);
    if (!t) return 0;
    json_t *msgs = json_pack("[{ssss}{ssss}{ssss}]", "role", "system", "content", "Be brief.", "role", "user",
                             "content", " Hi <think>x</think> ", "role", "assistant", "content", "ok");
    json_t *vars = json_pack("{sssssbs[{ss}]}", "bos_token", "<s>", "eos_token", "</s>", "enable_thinking", 0,
                             "tools", "type", "function");
    char *out = NULL;
    size_t n = 0;
    for (int gen = 0; gen < 2; gen++) {
        if (td_chat_template_render(t, msgs, gen, vars, &out, &n, &err) == 0) {
            if (out[n] != 0) abort();
            free(out);
        }
    }
    json_decref(vars);
    json_decref(msgs);
    td_chat_template_free(t);
    return 0;
}
