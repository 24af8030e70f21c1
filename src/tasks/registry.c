/* The task registry, the length presets and knobs by name, and the reward entry point that
 * prepares a completion the same way for every task (include/tidal/tasks.h, "Rewards"). */
#include "tasks_internal.h"

static const td_task *const tasks[] = {&td_task_add, &td_task_sort, &td_task_countdown};
#define N_TASKS (sizeof tasks / sizeof tasks[0])

size_t td_task_count(void) { return N_TASKS; }

const td_task *td_task_at(size_t i) { return i < N_TASKS ? tasks[i] : NULL; }

const td_task *td_task_find(const char *name, td_error *err)
{
    for (size_t i = 0; i < N_TASKS; i++)
        if (name && strcmp(tasks[i]->name, name) == 0) return tasks[i];
    td_fail(err, "unknown task \"%s\": expected one of add, sort, countdown", name ? name : "(none)");
    return NULL;
}

int td_task_preset(const td_task *t, const char *length, td_task_params *out, td_error *err)
{
    if (strcmp(length, "short") == 0) *out = t->short_params;
    else if (strcmp(length, "long") == 0) *out = t->long_params;
    else return td_fail(err, "unknown length preset \"%s\": expected short or long", length);
    return 0;
}

int *td_task_param(td_task_params *p, const char *knob)
{
    if (strcmp(knob, "digits") == 0) return &p->digits;
    if (strcmp(knob, "count") == 0) return &p->count;
    if (strcmp(knob, "max_value") == 0) return &p->max_value;
    if (strcmp(knob, "max_target") == 0) return &p->max_target;
    return NULL;
}

int td_task_reward(const td_task *t, const char *prompt, const char *answer, const char *completion,
                   size_t len, double *reward, td_reward_info *info, td_error *err)
{
    td_reward_info dummy;
    if (!info) info = &dummy;
    *info = (td_reward_info){false, false};
    *reward = 0;
    td_error rerr;
    if (t->check_record(prompt, answer, &rerr)) return td_fail(err, "task %s: %s", t->name, rerr.msg);
    /* 1. cut at the first EOS */
    size_t eos_len = strlen(TD_TASK_EOS);
    for (size_t i = 0; i + eos_len <= len; i++)
        if (completion[i] == TD_TASK_EOS[0] && memcmp(completion + i, TD_TASK_EOS, eos_len) == 0) { len = i; break; }
    /* 2. overlong */
    if (len > TD_TASK_MAX_COMPLETION) return 0;
    /* 3. trailing spaces and newlines; the last line */
    while (len && (completion[len - 1] == ' ' || completion[len - 1] == '\n')) len--;
    size_t start = len;
    while (start && completion[start - 1] != '\n') start--;
    /* the graders read a NUL-terminated copy (a NUL inside the text makes it unparsable) */
    char line[TD_TASK_MAX_COMPLETION + 1];
    size_t n = len - start;
    memcpy(line, completion + start, n);
    line[n] = 0;
    if (memchr(line, 0, n)) return 0;
    *reward = t->grade(prompt, answer, line, n, info);
    return 0;
}
