/* Helpers shared by the task files: a growing text buffer for building prompts and
 * completions, and knob range checks with one message format. */
#ifndef TIDAL_TASKS_INTERNAL_H
#define TIDAL_TASKS_INTERNAL_H

#include "tidal/tasks.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *s;
    size_t len, cap;
} tk_text;

static inline void tk_putf(tk_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void tk_putf(tk_text *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (t->s && (size_t)k < t->cap - t->len) { t->len += (size_t)k; return; }
        t->cap = 2 * t->cap + (size_t)k + 64;
        t->s = td_xrealloc(t->s, t->cap);
    }
}

/* The buffer's string (caller frees), leaving t empty. */
static inline char *tk_take(tk_text *t)
{
    if (!t->s) tk_putf(t, "%s", "");
    char *s = t->s;
    *t = (tk_text){0};
    return s;
}

/* "<task>: --<knob> N: expected lo..hi" when v is outside [lo, hi]. */
static inline int tk_knob(const char *task, const char *knob, int v, int lo, int hi, td_error *err)
{
    if (v >= lo && v <= hi) return 0;
    return td_fail(err, "task %s: %s %d out of range: expected %d..%d", task, knob, v, lo, hi);
}

/* Parses a decimal number of at most 9 digits at *p (no sign); advances *p. -1 if none. */
static inline long tk_number(const char **p)
{
    const char *s = *p;
    long v = 0;
    int k = 0;
    while (*s >= '0' && *s <= '9' && k < 10) { v = 10 * v + (*s++ - '0'); k++; }
    if (k == 0 || k > 9) return -1;
    *p = s;
    return v;
}

extern const td_task td_task_add, td_task_sort, td_task_countdown;

#endif
