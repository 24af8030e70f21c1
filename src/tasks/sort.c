/* Task "sort": sort a list of non-negative integers ascending (include/tidal/tasks.h).
 *
 *   prompt      "sort 42 7 19 3\n"
 *   completion  "3 7 19 42"          (also the answer)
 *
 * Values are uniform in [0, 10^digits), repeats allowed. With digits 2 a response is about
 * 2.9 * count tokens. */
#include "tasks_internal.h"

#define SORT_MAX_COUNT 512

static int check(const td_task_params *p, td_error *err)
{
    return tk_knob("sort", "count", p->count, 2, SORT_MAX_COUNT, err) || tk_knob("sort", "digits", p->digits, 1, 6, err) ? -1 : 0;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void put_list(tk_text *t, const long *v, int n)
{
    for (int i = 0; i < n; i++) tk_putf(t, i ? " %ld" : "%ld", v[i]);
}

static int generate(const td_task_params *p, td_rng *r, td_task_item *it)
{
    long v[SORT_MAX_COUNT], top = 1;
    for (int i = 0; i < p->digits; i++) top *= 10;
    for (int i = 0; i < p->count; i++) v[i] = (long)td_rng_below(r, (uint64_t)top);
    tk_text prompt = {0}, done = {0};
    tk_putf(&prompt, "sort ");
    put_list(&prompt, v, p->count);
    tk_putf(&prompt, "\n");
    qsort(v, (size_t)p->count, sizeof v[0], cmp_long);
    put_list(&done, v, p->count);
    it->prompt = tk_take(&prompt);
    it->completion = tk_take(&done);
    it->answer = strdup(it->completion);
    return 0;
}

/* Numbers of 1..9 digits separated by single spaces, the whole of s[0, len): their count, or -1
 * (not that shape, or more than cap). */
static int parse_list(const char *s, size_t len, long *v, int cap)
{
    const char *p = s, *end = s + len;
    int n = 0;
    for (;;) {
        if (n == cap) return -1;
        const char *q = p;
        long x = tk_number(&q);
        if (x < 0 || q > end) return -1;
        v[n++] = x;
        p = q;
        if (p == end) return n;
        if (*p != ' ') return -1;
        p++;
    }
}

static int check_record(const char *prompt, const char *answer, td_error *err)
{
    long v[SORT_MAX_COUNT], w[SORT_MAX_COUNT];
    size_t pl = strlen(prompt);
    int n = strncmp(prompt, "sort ", 5) == 0 && pl > 6 && prompt[pl - 1] == '\n' ? parse_list(prompt + 5, pl - 6, v, SORT_MAX_COUNT) : -1;
    if (n < 1) return td_fail(err, "prompt is not \"sort N N ...\\n\" (1..%d numbers of 1..9 digits)", SORT_MAX_COUNT);
    int m = parse_list(answer, strlen(answer), w, SORT_MAX_COUNT);
    qsort(v, (size_t)n, sizeof v[0], cmp_long);
    if (m != n || memcmp(v, w, (size_t)n * sizeof v[0]) != 0)
        return td_fail(err, "answer \"%.40s\" is not the prompt's numbers sorted", answer);
    return 0;
}

static double grade(const char *prompt, const char *answer, const char *line, size_t len, td_reward_info *info)
{
    long want[SORT_MAX_COUNT], *got = td_xmalloc(TD_TASK_MAX_COMPLETION * sizeof(long));
    int n = parse_list(answer, strlen(answer), want, SORT_MAX_COUNT);
    int m = len ? parse_list(line, len, got, TD_TASK_MAX_COMPLETION) : -1;
    double r = 0;
    if (m > 0) {
        info->parsed = true;
        int same = 0;
        for (int i = 0; i < n && i < m; i++) same += got[i] == want[i];
        info->exact = same == n && m == n;
        r = info->exact ? 1.0 : (double)same / (double)(n > m ? n : m);
    }
    free(got);
    return r;
}

const td_task td_task_sort = {
    .name = "sort",
    .about = "sort a list of non-negative integers ascending",
    .knobs = "count digits",
    .short_params = {.count = 11, .digits = 2},
    .long_params = {.count = 45, .digits = 2},
    .check = check,
    .generate = generate,
    .check_record = check_record,
    .grade = grade,
};
