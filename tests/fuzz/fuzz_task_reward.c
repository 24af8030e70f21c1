/* Fuzz target: the task rewards (td_task_reward: EOS cut, last line, the add/sort/countdown
 * graders with the countdown expression parser) and the record checks.
 * Input: one mode byte, then bytes. mode % 3 picks the task. With mode & 4 the bytes are
 * "prompt\0answer\0completion" (a record from the input, which may be refused); otherwise a
 * fixed valid record of the task and the bytes are the completion. Checked on every input:
 * reward in [0, 1]; exact <=> reward 1; unparsable => reward 0; a refused record leaves 0. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tidal/tasks.h"

static const char *const PROMPT[3] = {"4821+3970\n", "sort 42 7 19 3 7\n", "reach 34 with 3 7 8 1 999999999\n"};
static const char *const ANSWER[3] = {"8791", "3 7 7 19 42", "34"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    td_error err;
    const td_task *t = td_task_at(data[0] % 3);
    const char *prompt = PROMPT[data[0] % 3], *answer = ANSWER[data[0] % 3];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *own = NULL;
    if (data[0] & 4) {
        own = malloc(size + 1);   /* NUL-terminated copy: prompt and answer are C strings */
        memcpy(own, data + 1, size - 1);
        own[size - 1] = 0;
        size_t pl = strlen(own);
        if (pl + 1 >= size - 1 + 1) { free(own); return 0; }
        size_t al = strlen(own + pl + 1);
        if (pl + 1 + al + 1 > size - 1) { free(own); return 0; }
        prompt = own;
        answer = own + pl + 1;
        text = own + pl + 1 + al + 1;
        len = size - 1 - (pl + 1 + al + 1);
    }
    double r = -1;
    td_reward_info info;
    int rc = td_task_reward(t, prompt, answer, text, len, &r, &info, &err);
    if (rc == 0) {
        if (!(r >= 0 && r <= 1)) abort();
        if (info.exact != (r == 1.0)) abort();
        if (!info.parsed && r != 0) abort();
    } else if (r != 0 || !err.msg[0]) {
        abort();
    }
    free(own);
    return 0;
}
