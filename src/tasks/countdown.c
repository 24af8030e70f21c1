/* Task "countdown": reach a target from given numbers with + - * / (include/tidal/tasks.h).
 *
 *   prompt      "reach 34 with 3 7 8 1\n"
 *   completion  "8-3=5\n5*7=35\n35-1=34\n(8-3)*7-1"
 *
 * The generator draws count numbers in [1, max_value] and combines them, two at a time, in a
 * random order with a random operation that keeps every step a positive integer no larger than
 * max_target (subtraction only to a positive result, division only when exact, no product or
 * quotient by 1); the last value is the target (a target equal to a given number is redrawn).
 * The reference completion writes those steps and then the expression with the fewest
 * parentheses. Any expression that reaches the target earns 1.0, not only the reference's. */
#include "tasks_internal.h"

#include <ctype.h>
#include <limits.h>

#define CD_MAX_DEPTH 64   /* parentheses nested deeper than this: unparsable */

static int check(const td_task_params *p, td_error *err)
{
    if (tk_knob("countdown", "count", p->count, 2, TD_TASK_MAX_NUMBERS, err) ||
        tk_knob("countdown", "max_value", p->max_value, 2, 1000000, err) ||
        tk_knob("countdown", "max_target", p->max_target, 2, 100000000, err))
        return -1;
    return 0;
}

typedef struct {
    long v;
    char *expr;
    int prec;   /* 3 a number, 2 a product or quotient, 1 a sum or difference */
} cd_term;

static char *wrap(const cd_term *t, int parens)
{
    tk_text s = {0};
    tk_putf(&s, parens ? "(%s)" : "%s", t->expr);
    return tk_take(&s);
}

static int generate(const td_task_params *p, td_rng *r, td_task_item *it)
{
    cd_term pool[TD_TASK_MAX_NUMBERS] = {{0}};
    long given[TD_TASK_MAX_NUMBERS];
    int k = p->count;
    tk_text prompt = {0}, steps = {0};
    for (int i = 0; i < k; i++) {
        given[i] = 1 + (long)td_rng_below(r, (uint64_t)p->max_value);
        tk_text e = {0};
        tk_putf(&e, "%ld", given[i]);
        pool[i] = (cd_term){given[i], tk_take(&e), 3};
    }
    int rejected = 0;
    while (k > 1 && !rejected) {
        int i = (int)td_rng_below(r, (uint64_t)k), j = (int)td_rng_below(r, (uint64_t)k - 1);
        if (j >= i) j++;
        long a = pool[i].v, b = pool[j].v, T = p->max_target;
        char ops[4];
        int n_ops = 0;
        if (a + b <= T) ops[n_ops++] = '+';
        if (a > b) ops[n_ops++] = '-';
        if (a > 1 && b > 1 && a <= T / b) ops[n_ops++] = '*';
        if (b > 1 && a % b == 0) ops[n_ops++] = '/';
        if (!n_ops) { rejected = 1; break; }
        char op = ops[td_rng_below(r, (uint64_t)n_ops)];
        int prec = op == '+' || op == '-' ? 1 : 2;
        long v = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
        tk_putf(&steps, "%ld%c%ld=%ld\n", a, op, b, v);
        char *left = wrap(&pool[i], pool[i].prec < prec);
        char *right = wrap(&pool[j], pool[j].prec < prec || (pool[j].prec == prec && (op == '-' || op == '/')));
        tk_text e = {0};
        tk_putf(&e, "%s%c%s", left, op, right);
        free(left);
        free(right);
        free(pool[i].expr);
        free(pool[j].expr);
        pool[i] = (cd_term){v, tk_take(&e), prec};
        pool[j] = pool[--k];   /* the last term moves into j's place (j == k - 1: dropped) */
    }
    long target = pool[0].v;
    for (int i = 0; i < p->count && !rejected; i++) rejected = given[i] == target;
    if (rejected) {
        for (int i = 0; i < k; i++) free(pool[i].expr);
        free(steps.s);
        return 1;
    }
    tk_putf(&prompt, "reach %ld with", target);
    for (int i = 0; i < p->count; i++) tk_putf(&prompt, " %ld", given[i]);
    tk_putf(&prompt, "\n");
    tk_putf(&steps, "%s", pool[0].expr);
    free(pool[0].expr);
    tk_text ans = {0};
    tk_putf(&ans, "%ld", target);
    it->prompt = tk_take(&prompt);
    it->completion = tk_take(&steps);
    it->answer = tk_take(&ans);
    return 0;
}

/* "reach T with a b c\n" -> target, numbers; -1 if the prompt has another shape. */
static int parse_prompt(const char *prompt, long *target, long *num, int *n)
{
    const char *s = prompt;
    if (strncmp(s, "reach ", 6) != 0) return -1;
    s += 6;
    if ((*target = tk_number(&s)) < 0 || strncmp(s, " with", 5) != 0) return -1;
    s += 5;
    *n = 0;
    while (*s == ' ') {
        s++;
        if (*n == TD_TASK_MAX_NUMBERS || (num[*n] = tk_number(&s)) < 0) return -1;
        (*n)++;
    }
    return *n >= 1 && strcmp(s, "\n") == 0 ? 0 : -1;
}

static int check_record(const char *prompt, const char *answer, td_error *err)
{
    long target, num[TD_TASK_MAX_NUMBERS];
    int n;
    if (parse_prompt(prompt, &target, num, &n))
        return td_fail(err, "prompt is not \"reach T with N N ...\\n\" (1..%d numbers of 1..9 digits)", TD_TASK_MAX_NUMBERS);
    const char *a = answer;
    if (tk_number(&a) != target || *a) return td_fail(err, "answer \"%.40s\" is not the prompt's target %ld", answer, target);
    return 0;
}

/* ---- the expression grader: recursive descent that evaluates as it parses ----
 *   expr   := term (('+' | '-') term)*
 *   term   := factor (('*' | '/') factor)*
 *   factor := number | '(' expr ')'          number: "0" or [1-9][0-9]*
 * A parse error makes the whole line unparsable; an arithmetic problem (or a number not on
 * offer) only makes it invalid, and parsing goes on to tell the two apart. */
typedef struct {
    const char *s;
    int depth;
    bool bad_syntax, invalid;
    long *used;       /* literals seen, in order */
    int n_used, cap_used;
} cd_parser;

static int64_t cd_expr(cd_parser *p);

static int64_t cd_factor(cd_parser *p)
{
    if (*p->s == '(') {
        if (++p->depth > CD_MAX_DEPTH) { p->bad_syntax = true; return 0; }
        p->s++;
        int64_t v = cd_expr(p);
        if (*p->s != ')') { p->bad_syntax = true; return 0; }
        p->s++;
        p->depth--;
        return v;
    }
    if (!isdigit((unsigned char)*p->s) || (p->s[0] == '0' && isdigit((unsigned char)p->s[1]))) {
        p->bad_syntax = true;
        return 0;
    }
    long v = 0;
    int k = 0;
    for (; isdigit((unsigned char)*p->s); p->s++, k++) if (k < 10) v = 10 * v + (*p->s - '0');
    if (k > 9) { p->invalid = true; v = -1; }   /* no given number is that long */
    if (p->n_used < p->cap_used) p->used[p->n_used++] = v;
    return v;
}

static int64_t cd_apply(cd_parser *p, char op, int64_t a, int64_t b)
{
    int64_t v = 0;
    bool over = false;
    switch (op) {
    case '+': over = __builtin_add_overflow(a, b, &v); break;
    case '-': over = __builtin_sub_overflow(a, b, &v); break;
    case '*': over = __builtin_mul_overflow(a, b, &v); break;
    default:
        if (b == 0 || (a == INT64_MIN && b == -1) || a % b != 0) over = true;
        else v = a / b;
    }
    if (over) { p->invalid = true; return 0; }
    return v;
}

/* level 0: expr (terms joined by + -); level 1: term (factors joined by * /) */
static int64_t cd_chain(cd_parser *p, int level)
{
    const char *ops = level ? "*/" : "+-";
    int64_t v = level ? cd_factor(p) : cd_chain(p, 1);
    while (!p->bad_syntax && *p->s && strchr(ops, *p->s)) {
        char op = *p->s++;
        int64_t b = level ? cd_factor(p) : cd_chain(p, 1);
        v = cd_apply(p, op, v, b);
    }
    return v;
}

static int64_t cd_expr(cd_parser *p) { return cd_chain(p, 0); }

static double grade(const char *prompt, const char *answer, const char *line, size_t len, td_reward_info *info)
{
    long target, num[TD_TASK_MAX_NUMBERS];
    int n;
    if (len == 0 || parse_prompt(prompt, &target, num, &n)) return 0;
    long used[TD_TASK_MAX_NUMBERS + 1];
    cd_parser p = {.s = line, .used = used, .cap_used = TD_TASK_MAX_NUMBERS + 1};
    int64_t v = cd_expr(&p);
    if (p.bad_syntax || p.s != line + len) return 0;
    info->parsed = true;
    /* each literal takes one unused given number of its value */
    bool taken[TD_TASK_MAX_NUMBERS] = {false};
    if (p.n_used > n) p.invalid = true;
    for (int i = 0; i < p.n_used && !p.invalid; i++) {
        int k = 0;
        while (k < n && (taken[k] || num[k] != used[i])) k++;
        if (k == n) p.invalid = true;
        else taken[k] = true;
    }
    if (p.invalid || v != target) return 0.1;
    info->exact = true;
    return 1.0;
}

const td_task td_task_countdown = {
    .name = "countdown",
    .about = "reach a target from given numbers with + - * / (each at most once, exact integers)",
    .knobs = "count max_value max_target",
    .short_params = {.count = 4, .max_value = 20, .max_target = 200},
    .long_params = {.count = 11, .max_value = 50, .max_target = 1000},
    .check = check,
    .generate = generate,
    .check_record = check_record,
    .grade = grade,
};
