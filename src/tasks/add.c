/* Task "add": multi-digit addition with a scratch-pad (include/tidal/tasks.h).
 *
 *   prompt      "4821+3970\n"
 *   completion  "1+0+0=01\n2+7+0=09\n8+9+0=17\n4+3+1=08\n8791"
 *
 * One scratch line per column from the right: the two digits, the carry coming in, and the
 * column sum as two digits (the carry going out, then the result digit). The answer line is the
 * sum without leading zeros. A response is 10 * digits + 1 or + 2 tokens with EOS. */
#include "tasks_internal.h"

#include <ctype.h>

/* Column-wise sum of two digit strings (any lengths); the scratch-pad goes to pad when not
 * NULL. Returns the sum as a string (caller frees). */
static char *column_sum(const char *a, size_t na, const char *b, size_t nb, tk_text *pad)
{
    size_t n = na > nb ? na : nb;
    char *rev = td_xmalloc(n + 2);
    int carry = 0;
    for (size_t i = 0; i < n; i++) {
        int x = i < na ? a[na - 1 - i] - '0' : 0, y = i < nb ? b[nb - 1 - i] - '0' : 0;
        int s = x + y + carry;
        if (pad) tk_putf(pad, "%d+%d+%d=%02d\n", x, y, carry, s);
        rev[i] = (char)('0' + s % 10);
        carry = s / 10;
    }
    size_t k = n;
    if (carry) rev[k++] = '1';
    while (k > 1 && rev[k - 1] == '0') k--;   /* leading zeros of the operands ("0+0") */
    char *sum = td_xmalloc(k + 1);
    for (size_t i = 0; i < k; i++) sum[i] = rev[k - 1 - i];
    sum[k] = 0;
    free(rev);
    return sum;
}

static int check(const td_task_params *p, td_error *err)
{
    return tk_knob("add", "digits", p->digits, 1, TD_TASK_MAX_DIGITS - 1, err);
}

static void random_operand(td_rng *r, int digits, char *out)
{
    out[0] = (char)('1' + td_rng_below(r, 9));
    for (int i = 1; i < digits; i++) out[i] = (char)('0' + td_rng_below(r, 10));
    out[digits] = 0;
}

static int generate(const td_task_params *p, td_rng *r, td_task_item *it)
{
    char a[TD_TASK_MAX_DIGITS + 1], b[TD_TASK_MAX_DIGITS + 1];
    random_operand(r, p->digits, a);
    random_operand(r, p->digits, b);
    tk_text prompt = {0}, done = {0};
    tk_putf(&prompt, "%s+%s\n", a, b);
    char *sum = column_sum(a, strlen(a), b, strlen(b), &done);
    tk_putf(&done, "%s", sum);
    it->prompt = tk_take(&prompt);
    it->completion = tk_take(&done);
    it->answer = sum;
    return 0;
}

/* The two operands of a prompt "A+B\n" (pointers into it). */
static int split_prompt(const char *prompt, const char **a, size_t *na, const char **b, size_t *nb)
{
    const char *s = prompt;
    *a = s;
    while (isdigit((unsigned char)*s)) s++;
    *na = (size_t)(s - *a);
    if (*s++ != '+') return -1;
    *b = s;
    while (isdigit((unsigned char)*s)) s++;
    *nb = (size_t)(s - *b);
    if (!*na || !*nb || *na >= TD_TASK_MAX_DIGITS || *nb >= TD_TASK_MAX_DIGITS) return -1;
    return strcmp(s, "\n") == 0 ? 0 : -1;
}

static int check_record(const char *prompt, const char *answer, td_error *err)
{
    const char *a, *b;
    size_t na, nb;
    if (split_prompt(prompt, &a, &na, &b, &nb))
        return td_fail(err, "prompt is not an addition \"A+B\\n\" of 1..%d-digit numbers", TD_TASK_MAX_DIGITS - 1);
    char *sum = column_sum(a, na, b, nb, NULL);
    int ok = strcmp(sum, answer) == 0;
    free(sum);
    return ok ? 0 : td_fail(err, "answer \"%.40s\" is not the sum of the prompt's numbers", answer);
}

static double grade(const char *prompt, const char *answer, const char *line, size_t len, td_reward_info *info)
{
    if (len == 0 || len > TD_TASK_MAX_DIGITS) return 0;
    for (size_t i = 0; i < len; i++) if (!isdigit((unsigned char)line[i])) return 0;
    info->parsed = true;
    size_t na = strlen(answer), n = na > len ? na : len, same = 0;
    for (size_t k = 1; k <= na && k <= len; k++) same += answer[na - k] == line[len - k];
    if (same == n && na == len) { info->exact = true; return 1.0; }
    return (double)same / (double)n;
}

const td_task td_task_add = {
    .name = "add",
    .about = "multi-digit addition with a per-column scratch-pad (carries written out)",
    .knobs = "digits",
    .short_params = {.digits = 3},
    .long_params = {.digits = 13},
    .check = check,
    .generate = generate,
    .check_record = check_record,
    .grade = grade,
};
