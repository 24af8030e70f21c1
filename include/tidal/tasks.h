/* tidal — verifiable tasks for SFT and RL: seeded generators, reference completions and rewards.
 *
 * Three tasks (src/tasks/, one file each, a registry in registry.c):
 *   add        multi-digit addition with a scratch-pad, one line per digit from the right:
 *                prompt      "4821+3970\n"
 *                completion  "1+0+0=01\n2+7+0=09\n8+9+0=17\n4+3+1=08\n8791"
 *              each line is  digit + digit + carry-in = two-digit column sum (carry-out, digit);
 *              knob: digits (per operand, leading digit non-zero)
 *   sort       sort a list of non-negative integers ascending:
 *                prompt      "sort 42 7 19 3\n"           completion "3 7 19 42"
 *              knobs: count (list length), digits (values uniform in [0, 10^digits))
 *   countdown  reach a target from given numbers with + - * / (each number at most once,
 *              integers only: every division exact):
 *                prompt      "reach 34 with 3 7 8 1\n"
 *                completion  "8-3=5\n5*7=35\n35-1=34\n(8-3)*7-1"
 *              the lines before the last are steps (a scratch-pad), the last is the expression;
 *              knobs: count (numbers given), max_value (each in [1, max_value]),
 *              max_target (bound on the target and on every step's result)
 *
 * Text and tokens. Every character a task emits is in TD_TASK_ALPHABET, a subset of the character
 * vocabulary (td_charvocab_default_alphabet, one token per character). The end of an answer is
 * the vocabulary's EOS token, TD_TASK_EOS: a record's "completion" holds the text without it (as
 * TRL's prompt-completion records do; SFT appends eos_token_id, RL stops generating on it), so a
 * response is strlen(completion) + 1 tokens.
 *
 * Rewards (td_task_reward). The same preparation for every task, then the task's grader:
 *   1. the text is cut at the first TD_TASK_EOS (a decoder that keeps special tokens writes it);
 *   2. more than TD_TASK_MAX_COMPLETION bytes: unparsable;
 *   3. trailing spaces and newlines are dropped; the answer is the last line (the text after the
 *      last '\n'); lines before it are a scratch-pad and are not graded;
 *   4. the grader: 1.0 for an exact match; partial credit as each task defines it (below); 0 for
 *      an answer line that does not parse.
 *   add        the line must be 1..TD_TASK_MAX_DIGITS digits. Partial: the fraction of digit
 *              positions (aligned from the right) that equal the true sum's, over the longer of
 *              the two lengths ("8792" for 8791: 0.75; "08791": 0.8).
 *   sort       the line must be integers of 1..9 digits separated by single spaces. Partial: the
 *              fraction of positions i holding the value sorted() puts there, over the longer of
 *              the two lists.
 *   countdown  the line must be an expression of non-negative integer literals (no leading
 *              zeros), + - * / and parentheses, nothing else (no spaces, no unary minus). A
 *              well-formed expression earns TinyZero's format score 0.1 when it misses: it uses a
 *              number not given or more often than given, divides by zero or inexactly, leaves
 *              int64, or evaluates to another value than the target; 1.0 when it reaches it.
 *
 * Splits. A prompt belongs to the test split iff its FNV-1a-64 hash is 0 mod TD_TASK_TEST_MOD,
 * so train and test cannot share a prompt whatever their sizes, and each split is the same for
 * a seed whatever the other's size; within a split prompts are distinct. Generation is serial,
 * from td_rng streams of the seed: the same items on every platform and thread count.
 */
#ifndef TIDAL_TASKS_H
#define TIDAL_TASKS_H

#include "tidal/common.h"
#include "tidal/rng.h"

#include <stdbool.h>

TD_BEGIN_DECLS

#define TD_TASK_ALPHABET "0123456789abcdefghijklmnopqrstuvwxyz +-*/=()\n"
#define TD_TASK_EOS "<eos>"
#define TD_TASK_MAX_COMPLETION 4096   /* bytes of completion text a reward looks at        */
#define TD_TASK_MAX_DIGITS 80         /* longest answer line the add grader accepts         */
#define TD_TASK_MAX_NUMBERS 12        /* countdown: most numbers in a prompt                */
#define TD_TASK_TEST_MOD 8            /* 1 prompt in 8 of a task's space is a test prompt   */

/* The generator knobs. Each task reads the ones it names in td_task.knobs; 0 = unset. */
typedef struct {
    int digits;       /* add: digits per operand; sort: digits per value      */
    int count;        /* sort: list length; countdown: numbers given          */
    int max_value;    /* countdown: largest given number                      */
    int max_target;   /* countdown: largest target and step result            */
} td_task_params;

typedef enum { TD_SPLIT_TRAIN = 0, TD_SPLIT_TEST = 1 } td_split;

/* One record: what a dataset line holds. Strings are malloc'd (td_task_items_free). */
typedef struct {
    char *id;              /* "add-train-000017"                                       */
    char *prompt;
    char *completion;      /* the reference completion (without EOS); NULL if absent    */
    char *answer;          /* add: the sum; sort: the sorted list; countdown: the target */
    const struct td_task *task;
    td_task_params params;
    long line;             /* line in the file it was read from (1-based), 0 if generated */
} td_task_item;

/* What a reward saw. */
typedef struct {
    bool parsed;           /* the answer line parsed (a reward of 0 with parsed = false: garbage) */
    bool exact;            /* reward 1.0                                                           */
} td_reward_info;

typedef struct td_task {
    const char *name;            /* "add"                                                  */
    const char *about;           /* one line for listings                                  */
    const char *knobs;           /* space-separated knob names it reads ("count digits")   */
    td_task_params short_params; /* ~32-token responses                                    */
    td_task_params long_params;  /* ~128-token responses                                   */
    /* 0, or -1 + err naming the knob and its range. */
    int (*check)(const td_task_params *p, td_error *err);
    /* One item from r into *it (prompt, completion, answer); 1 to ask for another draw (a
     * rejected puzzle), 0 done. */
    int (*generate)(const td_task_params *p, td_rng *r, td_task_item *it);
    /* Is (prompt, answer) a record this task can grade? 0, or -1 + err naming what is wrong. */
    int (*check_record)(const char *prompt, const char *answer, td_error *err);
    /* Grades the answer line (len bytes, no newline) of a completion; the record was checked. */
    double (*grade)(const char *prompt, const char *answer, const char *line, size_t len,
                    td_reward_info *info);
} td_task;

/* ---- registry ---- */
size_t td_task_count(void);
const td_task *td_task_at(size_t i);
/* By name; NULL + err listing the known names. */
const td_task *td_task_find(const char *name, td_error *err);
/* The task's knobs for a length preset ("short" or "long"); -1 + err for another name. */
int td_task_preset(const td_task *t, const char *length, td_task_params *out, td_error *err);
/* The value of a knob by name (pointer into p), NULL if there is no such knob. */
int *td_task_param(td_task_params *p, const char *knob);

/* ---- generation ---- */
/* n distinct items of split `split` from seed: ids "<task>-<split>-<index>". -1 + err when the
 * knobs are out of range or the task's space holds too few distinct prompts of the split. */
int td_task_generate(const td_task *t, const td_task_params *p, uint64_t seed, td_split split,
                     size_t n, td_task_item **items, td_error *err);
/* The split a prompt belongs to (the hash rule above). */
td_split td_task_split_of(const char *prompt);
/* 0 when no prompt of a is also in b; -1 + err naming the first shared prompt and its ids. */
int td_task_check_disjoint(const td_task_item *a, size_t na, const td_task_item *b, size_t nb,
                           td_error *err);
void td_task_items_free(td_task_item *items, size_t n);

/* ---- rewards ---- */
/* The reward of completion (len bytes, any content) for a record; info may be NULL. -1 + err
 * only when the record itself cannot be graded (td_task.check_record). */
int td_task_reward(const td_task *t, const char *prompt, const char *answer, const char *completion,
                   size_t len, double *reward, td_reward_info *info, td_error *err);

/* ---- JSONL ---- */
/* Writes items as JSONL ({"id", "task", "split", "prompt", "completion", "answer", knobs...}),
 * to a temporary file renamed over path when complete. */
int td_task_write_jsonl(const char *path, const td_task_item *items, size_t n, td_split split,
                        td_error *err);
/* Reads a dataset (dataset.h: JSON Lines or a JSON array, .json.gz, a BOM): every record an
 * object with string "prompt", "answer" and "task" (a known task), optional "completion" and
 * "id" (default "line-N", N the record's line); the record must be gradable. Errors name the
 * file and line. */
int td_task_read_jsonl(const char *path, td_task_item **items, size_t *n, td_error *err);
/* One such record from a parsed JSON object o into *it (zeroed by the caller; freed with the
 * items on failure too); errors start with where ("file:line"). */
struct json_t;
int td_task_item_from_json(struct json_t *o, const char *where, td_task_item *it, td_error *err);

/* A completions file for scoring: every non-empty line an object with a string "completion"
 * (any text, "\u0000" included) and optionally "id", the dataset record it answers (several
 * lines may answer one record); without ids line k answers the dataset's k-th record. */
typedef struct {
    char *id;              /* NULL when the line has none */
    char *completion;
    size_t len;            /* bytes of completion */
    long line;
} td_task_completion;
int td_task_read_completions(const char *path, td_task_completion **out, size_t *n, td_error *err);
void td_task_completions_free(td_task_completion *c, size_t n);

TD_END_DECLS

#endif
