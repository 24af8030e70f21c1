/* tidal — one command-line convention for every tool (GNU long options).
 *
 *   --name VALUE and --name=VALUE; -o VALUE and -oVALUE for the short ones; -- ends the options;
 *   operands may come before, between or after options. A value may start with '-' (--top-k -1).
 *   Underscores in a long name are read as dashes, so HF/TRL spellings work (--max_new_tokens);
 *   other spellings users bring (vLLM's --max-tokens) are listed as aliases.
 *   -h/--help prints the full help on stdout and exits 0; --version prints "PROG (tidal) X.Y.Z".
 *   Usage errors print one format and exit 2:
 *       PROG: --opt: expected WHAT, got 'VALUE'
 *       PROG: --opt: unknown option[; did you mean --option?]   (a close name, or the one
 *                                                               name it abbreviates)
 *       Try 'PROG --help' for the options.
 *   Runtime failures (a file that cannot be read, a run that fails) exit 1: that is the tool's job.
 *
 * A tool describes its options in a table (the macros below) and calls td_cli_parse:
 *
 *   const td_opt opts[] = {TD_OPT_S("model", 0, &dir, "DIR", "checkpoint directory"),
 *                          TD_OPT_I("batch", 0, &batch, "B", 1, 4096, "prompts per batch"), {0}};
 *   td_cli cli = {"tidal-x", "--model DIR [options]", "What it does.", NULL, opts, 0, 0};
 *   int rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
 *   if (rc >= 0) return rc;        // --help, --version (0) or a usage error (2)
 */
#ifndef TIDAL_OPTS_H
#define TIDAL_OPTS_H

#include "tidal/common.h"

#include <signal.h>
#include <stdio.h>

TD_BEGIN_DECLS

typedef enum {
    TD_OPT_FLAG,     /* int *: stores `value`                                               */
    TD_OPT_STR,      /* const char **                                                       */
    TD_OPT_INT,      /* int *, within [lo, hi]                                              */
    TD_OPT_U64,      /* unsigned long long *, within [lo, hi] (hi 0: any)                   */
    TD_OPT_DOUBLE,   /* double *, finite, within [lo, hi] ((lo, hi] when lo_open)           */
    TD_OPT_CHOICE,   /* int *: index of the value among `choices` ("seqpos|layers|hist")    */
    TD_OPT_FN        /* fn(dest, value, why, whylen): 0, or -1 with why (or `expect`) filled */
} td_opt_kind;

typedef struct {
    const char *name;       /* long name without the dashes; NULL ends a table               */
    char short_name;        /* 'o', or 0                                                     */
    td_opt_kind kind;
    void *dest;
    const char *meta;       /* value placeholder in the help ("N", "DIR"); NULL for a flag    */
    const char *help;       /* NULL: accepted but not listed (an old spelling)               */
    double lo, hi;
    int lo_open;            /* DOUBLE: lo itself is out of range                             */
    int value;              /* FLAG: what it stores                                          */
    const char *choices;    /* CHOICE: '|'-separated values                                  */
    const char *aliases;    /* other long names, space-separated ("max-tokens max_tokens")   */
    const char *expect;     /* FN: what a value must look like, for the message              */
    int (*fn)(void *dest, const char *value, char *why, size_t whylen);
    int required;           /* a usage error when absent                                     */
    int *given;             /* set to 1 when the option appears (NULL: not tracked)          */
} td_opt;

#define TD_OPT_F(name, sh, dest, val, help) {name, sh, TD_OPT_FLAG, dest, NULL, help, 0, 0, 0, val, NULL, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_S(name, sh, dest, meta, help) {name, sh, TD_OPT_STR, dest, meta, help, 0, 0, 0, 0, NULL, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_I(name, sh, dest, meta, lo, hi, help) {name, sh, TD_OPT_INT, dest, meta, help, lo, hi, 0, 0, NULL, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_U(name, sh, dest, meta, help) {name, sh, TD_OPT_U64, dest, meta, help, 0, 0, 0, 0, NULL, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_D(name, sh, dest, meta, lo, hi, help) {name, sh, TD_OPT_DOUBLE, dest, meta, help, lo, hi, 0, 0, NULL, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_C(name, sh, dest, choices, help) {name, sh, TD_OPT_CHOICE, dest, choices, help, 0, 0, 0, 0, choices, NULL, NULL, NULL, 0, NULL}
#define TD_OPT_FUN(name, sh, dest, meta, fn, expect, help) {name, sh, TD_OPT_FN, dest, meta, help, 0, 0, 0, 0, NULL, NULL, expect, fn, 0, NULL}

typedef struct {
    const char *prog;       /* "tidal-diff"                                                  */
    const char *usage;      /* after "usage: PROG "; several forms separated by '\n'         */
    const char *about;      /* a paragraph after the usage line (may be NULL)                */
    const char *footer;     /* text after the option list (may be NULL)                      */
    const td_opt *opts;     /* table ending with {0}; -h/--help and --version are implicit    */
    int min_operands;       /* operands (non-option arguments) allowed                       */
    int max_operands;       /* -1: any number                                                */
} td_cli;

/* Parses argv (left as it is, for the command line a tool records) against cli. The operands
 * go, in order, to operands[0 .. *n_operands) (room for max_operands, or for argc when that is
 * -1; NULL when the tool takes none).
 * Returns -1 when the tool should go on, else the exit status to return at once: 0 after --help
 * or --version, 2 after a usage error (the message is printed). */
int td_cli_parse(const td_cli *cli, int argc, char **argv, const char **operands, int *n_operands);

/* The entry of a table by its long name (to set aliases, given, required beside the macros);
 * NULL if absent. */
td_opt *td_opt_get(td_opt *opts, const char *name);

/* A TD_OPT_FN parser for a boolean as transformers' and TRL's configs spell it: true/True/1 and
 * false/False/0 into an int (1 or 0); anything else is refused with the option's `expect`. */
int td_opt_parse_bool(void *dest, const char *value, char *why, size_t whylen);

/* A usage error found by the tool itself, in the one format: "PROG: OPT: expected WHAT, got
 * 'VALUE'" (value NULL: "PROG: OPT: WHAT") and the --help hint. Returns 2, the exit status. */
int td_cli_bad(const td_cli *cli, const char *opt, const char *value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Edit distance between two names (insertions, deletions, substitutions, adjacent swaps), with
 * underscores read as dashes: what "did you mean" suggestions measure (99 past 60 characters). */
int td_name_distance(const char *a, const char *b);

/* The full help text (what --help prints). */
void td_cli_help(const td_cli *cli, FILE *f);

/* argv[0..argc) as the command to run again, shell-quoted, with every argument equal to one of
 * `drop` removed and `add` (if not NULL and not there yet) appended. A `drop` entry ending in '='
 * ("--resume-from-checkpoint=") removes that option with its value, given as "--opt VALUE" or
 * "--opt=VALUE". Caller frees. */
char *td_command_line_edit(int argc, char **argv, const char *const *drop, const char *add);

/* Creates the directories above `path` (mkdir -p of its dirname), so `-o a/b/out` works on a
 * fresh tree. 0, or -1 + err naming the directory. */
int td_make_parent_dirs(const char *path, td_error *err);

/* ---- Stopping a long run (tidal-diff, tidal-rl, tidal-sft, tidal-sweep) ----
 * SIGINT / SIGTERM set a flag that the tool reads between units of work (a batch, an optimiser
 * step, a run), and "PROG: stopping after the UNIT in flight (Ctrl-C again to stop now)" goes
 * to stderr. The handler resets itself (SA_RESETHAND): a second Ctrl-C stops the process at
 * once, losing only the unit in flight (what is on disk is whole at every unit boundary). The
 * tool then keeps what it finished, prints the exact command that continues
 * (td_stop_print_command) and exits TD_EXIT_STOPPED. A SIGINT the process inherited as ignored
 * (a background job of a script) stays ignored. Returns the flag (the same one on every call;
 * non-zero once a signal came). */
volatile sig_atomic_t *td_stop_on_signals(const char *prog, const char *unit);
#define TD_EXIT_STOPPED 130   /* 128 + SIGINT, as a shell reports an interrupted job */
/* "PROG: to WHAT, run:\n  COMMAND" on stderr, COMMAND = td_command_line_edit(argc, argv, drop,
 * add): the tool's own command line with --resume added (and, e.g., --force dropped). */
void td_stop_print_command(const char *prog, const char *what, int argc, char **argv, const char *const *drop,
                           const char *add);

/* ---- Resume refusals that name what differs ----
 * A run file records its settings as a JSON object; a resume whose command gives other values is
 * refused with one line per differing setting, both values as they would be typed:
 *   "  --learning-rate: run has 0.01, command gives 0.003"
 * The option of a key is the table's (key "is_drop_masked" -> "--is-masked-normaliser", with
 * choices "keep|drop" naming integer / boolean values by index), else "--" + the key with '_'
 * read as '-'. A nested object is compared key by key ("sampling.top_p" looked up as such; one
 * not in the table prints as "--recipe-a (gemm.accum)"), unless both carry a "name" that differs:
 * then the names are the two values. A key missing on one side is "(not set)"; keys (or dotted
 * paths) in `ignore` (NULL-terminated, may be NULL) are not compared (--max-steps may grow).
 * Writes the lines, without a final newline, to buf. Returns how many differ, -1 when either
 * text is not a JSON object. */
typedef struct {
    const char *key;        /* "learning_rate", or a dotted path "sampling.top_p"             */
    const char *flag;       /* "--learning-rate"                                              */
    const char *choices;    /* NULL, or "keep|drop": the names of values 0, 1, ...            */
} td_setting_flag;
int td_settings_diff(const char *run, const char *now, const td_setting_flag *flags, const char *const *ignore,
                     char *buf, size_t cap);

TD_END_DECLS

#endif
