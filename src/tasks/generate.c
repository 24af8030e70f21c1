/* Seeded generation of a split: per-item td_rng streams, the hash rule that puts each prompt in
 * exactly one split, distinct prompts within a split, and the overlap check across splits. */
#include "tasks_internal.h"

#define MAX_DRAWS 20000   /* draws for one item before the task's space counts as exhausted */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

td_split td_task_split_of(const char *prompt)
{
    return fnv1a(prompt) % TD_TASK_TEST_MOD == 0 ? TD_SPLIT_TEST : TD_SPLIT_TRAIN;
}

/* A set of prompt strings (not owned): open addressing, capacity a power of two. */
typedef struct {
    const char **slot;
    size_t cap;
} prompt_set;

static void set_init(prompt_set *s, size_t n)
{
    s->cap = 16;
    while (s->cap < 2 * n + 2) s->cap *= 2;
    s->slot = td_xcalloc(s->cap, sizeof *s->slot);
}

/* The stored string equal to p, or NULL after inserting p (insert = false: only look). */
static const char *set_find(prompt_set *s, const char *p, bool insert)
{
    size_t i = fnv1a(p) & (s->cap - 1);
    for (; s->slot[i]; i = (i + 1) & (s->cap - 1))
        if (strcmp(s->slot[i], p) == 0) return s->slot[i];
    if (insert) s->slot[i] = p;
    return NULL;
}

static const char *split_name(td_split s) { return s == TD_SPLIT_TEST ? "test" : "train"; }

int td_task_generate(const td_task *t, const td_task_params *p, uint64_t seed, td_split split,
                     size_t n, td_task_item **items, td_error *err)
{
    *items = NULL;
    if (t->check(p, err)) return -1;
    td_task_item *out = td_xcalloc(n ? n : 1, sizeof *out);
    prompt_set seen;
    set_init(&seen, n);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        td_rng r;
        td_rng_stream(&r, seed, ((uint64_t)split << 48) | i);
        td_task_item it = {0};
        int draws = 0;
        for (;;) {
            if (++draws > MAX_DRAWS) {
                rc = td_fail(err, "task %s: found only %zu distinct %s prompts (%d draws for the next): the task's space "
                             "is too small for %zu at these knobs; raise them or ask for fewer",
                             t->name, i, split_name(split), MAX_DRAWS, n);
                break;
            }
            if (t->generate(p, &r, &it) != 0) continue;   /* a rejected puzzle */
            if (td_task_split_of(it.prompt) == split && !set_find(&seen, it.prompt, false)) break;
            free(it.prompt);
            free(it.completion);
            free(it.answer);
        }
        if (rc) break;
        tk_text id = {0};
        tk_putf(&id, "%s-%s-%06zu", t->name, split_name(split), i);
        it.id = tk_take(&id);
        it.task = t;
        it.params = *p;
        out[i] = it;
        set_find(&seen, out[i].prompt, true);
    }
    free(seen.slot);
    if (rc) { td_task_items_free(out, n); return -1; }
    *items = out;
    return 0;
}

int td_task_check_disjoint(const td_task_item *a, size_t na, const td_task_item *b, size_t nb, td_error *err)
{
    prompt_set s;
    set_init(&s, na);
    for (size_t i = 0; i < na; i++) set_find(&s, a[i].prompt, true);
    int rc = 0;
    for (size_t j = 0; j < nb && !rc; j++) {
        const char *hit = set_find(&s, b[j].prompt, false);
        if (!hit) continue;
        size_t i = 0;
        while (a[i].prompt != hit) i++;
        rc = td_fail(err, "prompt \"%.60s\" is in both splits (%s and %s)", b[j].prompt, a[i].id ? a[i].id : "?",
                     b[j].id ? b[j].id : "?");
    }
    free(s.slot);
    return rc;
}

void td_task_items_free(td_task_item *items, size_t n)
{
    if (!items) return;
    for (size_t i = 0; i < n; i++) {
        free(items[i].id);
        free(items[i].prompt);
        free(items[i].completion);
        free(items[i].answer);
    }
    free(items);
}
