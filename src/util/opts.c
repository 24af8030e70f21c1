/* The command-line convention of every tool (include/tidal/opts.h): GNU long options, one
 * message format for usage errors, --help and --version everywhere. */
#include "tidal/opts.h"
#include "tidal/isa.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* OpenMP threads that wait at a barrier sleep (OMP_WAIT_POLICY=PASSIVE) unless the user chose
 * otherwise, after a short spin (GOMP_SPINCOUNT=1000, about 10 us). libgomp spins for about 3 ms
 * by default, and reads the variables once, when it is loaded (before main): so a tool started
 * without OMP_WAIT_POLICY sets both and executes itself again, before main, through an ELF
 * constructor of the executable (glibc passes argc, argv and envp to it). Why passive: with
 * spinning workers, anything else on the machine (a second tool, tidal-sweep's workers, a build)
 * turns every barrier into a wait for a descheduled thread. Measured on the 2-core dev machine
 * with other jobs running: tidal-diff fp16 on datasets/models/add 68 tokens/s spinning against
 * 616-1246 passive. Why the short spin: a sleeping worker costs each parallel region a futex wake
 * (66 us a region on a 2-core Zen 3 VM, 2.8 us with the spin; a training step runs about 400
 * regions), and the worker is still spinning when the next region follows at once. Measured there,
 * interleaved, 5 rounds: train_probe fp8-unified-train 1,849 -> 2,160 tokens/s (medians), fp16-train
 * 2,258 -> 2,483; two trainings at once 1,494-1,573 tokens/s each either way (spins of 10,000
 * and more halved them). A GOMP_SPINCOUNT or OMP_WAIT_POLICY the user set stands. Executables
 * that do not link this object (some unit tests) keep libgomp's default. The same pass sets
 * OpenBLAS's core where its own choice fell back to an old one (td_blas_core_to_force,
 * src/util/isa.c): one exec for all. */
__attribute__((constructor)) static void startup_env(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)envp;
    if (!argv || !argv[0]) return;
    const char *core = td_blas_core_to_force();
    int again = 0;
    if (core && setenv("OPENBLAS_CORETYPE", core, 1) == 0) again = 1;
    if (!getenv("OMP_WAIT_POLICY")) {
        if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0) again = 1;
        if (!getenv("GOMP_SPINCOUNT") && setenv("GOMP_SPINCOUNT", "1000", 1) == 0) again = 1;
    }
    if (again) execv("/proc/self/exe", argv);   /* returns only on failure: go on as loaded */
}

static void hint(const td_cli *cli)
{
    fprintf(stderr, "Try '%s --help' for the options.\n", cli->prog);
}

int td_cli_bad(const td_cli *cli, const char *opt, const char *value, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (value) fprintf(stderr, "%s: %s: expected %s, got '%s'\n", cli->prog, opt, what, value);
    else fprintf(stderr, "%s: %s: %s\n", cli->prog, opt, what);
    hint(cli);
    return 2;
}

/* Does `word` (length n, underscores read as dashes) spell `name`? */
static int same_name(const char *name, const char *word, size_t n)
{
    if (strlen(name) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = word[i] == '_' ? '-' : word[i];
        char d = name[i] == '_' ? '-' : name[i];
        if (c != d) return 0;
    }
    return 1;
}

static int has_alias(const char *aliases, const char *word, size_t n)
{
    for (const char *p = aliases; p && *p;) {
        while (*p == ' ') p++;
        size_t k = strcspn(p, " ");
        if (k && k == n) {
            char a[64];
            snprintf(a, sizeof a, "%.*s", (int)k, p);
            if (same_name(a, word, n)) return 1;
        }
        p += k;
    }
    return 0;
}

static const td_opt *find_long(const td_opt *opts, const char *word, size_t n)
{
    for (const td_opt *o = opts; o->name; o++)
        if (same_name(o->name, word, n) || has_alias(o->aliases, word, n)) return o;
    return NULL;
}

/* Edit distance (insertions, deletions, substitutions, adjacent swaps) between a and b, with
 * underscores read as dashes; capped at 99 for long words. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    if (na > 60 || nb > 60) return 99;
    int d[61][61];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            char x = a[i - 1] == '_' ? '-' : a[i - 1], y = b[j - 1] == '_' ? '-' : b[j - 1];
            int v = d[i - 1][j - 1] + (x != y);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x == (b[j - 2] == '_' ? '-' : b[j - 2]) && (a[i - 2] == '_' ? '-' : a[i - 2]) == y &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[na][nb];
}

int td_name_distance(const char *a, const char *b)
{
    return edit_distance(a, strlen(a), b, strlen(b));
}

/* The option a mistyped long name most likely meant: the closest name or alias within a few
 * edits (1 for short words, up to 3 for long ones), else the one name it is a prefix of
 * (argparse's abbreviations, which tidal does not accept but names). NULL if none. */
static const char *did_you_mean(const td_opt *opts, const char *word, size_t n, char *buf, size_t cap)
{
    int best = n <= 4 ? 2 : n <= 9 ? 3 : 4;   /* one more than the largest accepted distance */
    const char *hit = NULL, *prefix = NULL;
    const void *prefix_of = NULL;   /* the option (or built-in) the prefix names */
    int n_prefix = 0;
    const char *builtin[] = {"help", "version"};
    for (int pass = 0; pass < 2; pass++)
        for (const td_opt *o = opts; pass == 0 ? o->name != NULL : o < opts + 2; o++) {
            const char *names[2] = {pass == 0 ? o->name : builtin[o - opts], pass == 0 ? o->aliases : NULL};
            if (pass == 0 && !o->help) continue;   /* old spellings are not suggested */
            for (int k = 0; k < 2; k++)
                for (const char *p = names[k]; p && *p;) {
                    while (*p == ' ') p++;
                    size_t len = k == 0 ? strlen(p) : strcspn(p, " ");
                    if (!len) break;
                    int dist = edit_distance(word, n, p, len);
                    if (dist < best) { best = dist; snprintf(buf, cap, "%.*s", (int)len, p); hit = buf; }
                    if (len > n && n >= 3 && edit_distance(word, n, p, n) == 0 && prefix_of != (const void *)o) {
                        prefix = k == 0 ? p : (pass == 0 ? o->name : p);   /* named by its canonical name */
                        prefix_of = o;
                        n_prefix++;
                    }
                    p += len;
                }
        }
    if (hit) return hit;
    if (n_prefix == 1) {
        snprintf(buf, cap, "%.*s", (int)strcspn(prefix, " "), prefix);
        return buf;
    }
    return NULL;
}

td_opt *td_opt_get(td_opt *opts, const char *name)
{
    for (td_opt *o = opts; o->name; o++)
        if (!strcmp(o->name, name)) return o;
    return NULL;
}

static const td_opt *find_short(const td_opt *opts, char c)
{
    for (const td_opt *o = opts; o->name; o++)
        if (o->short_name == c) return o;
    return NULL;
}

/* How the option is named in messages: its canonical long name. */
static void opt_label(const td_opt *o, char *buf, size_t n)
{
    snprintf(buf, n, "--%s", o->name);
}

static int choice_index(const char *choices, const char *v)
{
    int i = 0;
    for (const char *p = choices; *p; i++) {
        size_t k = strcspn(p, "|");
        if (strlen(v) == k && !strncmp(p, v, k)) return i;
        p += k;
        if (*p) p++;
    }
    return -1;
}

static void range_text(const td_opt *o, char *buf, size_t n)
{
    snprintf(buf, n, "%s%.17g, %.17g]", o->lo_open ? "(" : "[", o->lo, o->hi);
}

/* Stores one option's value; 2 (after the message) when it does not fit. */
static int store(const td_cli *cli, const td_opt *o, const char *v)
{
    char label[80], why[256] = "";
    opt_label(o, label, sizeof label);
    char *end;
    switch (o->kind) {
    case TD_OPT_FLAG: *(int *)o->dest = o->value; return 0;
    case TD_OPT_STR:
        if (!*v) return td_cli_bad(cli, label, v, "a non-empty %s", o->meta ? o->meta : "value");
        *(const char **)o->dest = v;
        return 0;
    case TD_OPT_INT: {
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!*v || *end || errno || x < o->lo || x > o->hi)
            return td_cli_bad(cli, label, v, "an integer in %.0f..%.0f", o->lo, o->hi);
        *(int *)o->dest = (int)x;
        return 0;
    }
    case TD_OPT_U64: {
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-' || (o->hi > 0 && (double)x > o->hi))
            return td_cli_bad(cli, label, v, "a non-negative integer");
        *(unsigned long long *)o->dest = x;
        return 0;
    }
    case TD_OPT_DOUBLE: {
        errno = 0;
        double x = strtod(v, &end);
        int in = isfinite(x) && (o->lo_open ? x > o->lo : x >= o->lo) && x <= o->hi;
        if (!*v || *end || errno || !in) {
            range_text(o, why, sizeof why);
            return td_cli_bad(cli, label, v, "a number in %s", why);
        }
        *(double *)o->dest = x;
        return 0;
    }
    case TD_OPT_CHOICE: {
        int i = choice_index(o->choices, v);
        if (i < 0) return td_cli_bad(cli, label, v, "one of %s", o->choices);
        *(int *)o->dest = i;
        return 0;
    }
    case TD_OPT_FN:
        if (o->fn(o->dest, v, why, sizeof why))
            return td_cli_bad(cli, label, v, "%s", why[0] ? why : o->expect ? o->expect : "a valid value");
        return 0;
    }
    return 0;
}

int td_cli_parse(const td_cli *cli, int argc, char **argv, const char **operands, int *n_operands)
{
    size_t n_opts = 0;
    while (cli->opts[n_opts].name) n_opts++;
    unsigned char *seen = calloc(n_opts + 1, 1);
    int n = 0, rc = -1, only_operands = 0;
    const char *extra = NULL;   /* the first operand past max_operands */
    for (int i = 1; i < argc && rc < 0; i++) {
        char *a = argv[i];
        /* an operand: not an option, "-" alone, after "--", or a negative number */
        int number = a[0] == '-' && (a[1] == '.' || (a[1] >= '0' && a[1] <= '9'));
        if (only_operands || a[0] != '-' || !a[1] || number) {
            if (cli->max_operands < 0 || n < cli->max_operands) { if (operands) operands[n] = a; }
            else if (!extra) extra = a;
            n++;
            continue;
        }
        if (!strcmp(a, "--")) { only_operands = 1; continue; }
        const td_opt *o;
        const char *inline_v = NULL;
        char label[80];
        if (a[1] == '-') {
            const char *word = a + 2, *eq = strchr(word, '=');
            size_t len = eq ? (size_t)(eq - word) : strlen(word);
            if (same_name("help", word, len)) { td_cli_help(cli, stdout); rc = 0; break; }
            if (same_name("version", word, len)) { printf("%s (tidal) %s\n", cli->prog, TD_VERSION); rc = 0; break; }
            o = find_long(cli->opts, word, len);
            snprintf(label, sizeof label, "--%.*s", (int)len, word);
            if (eq) inline_v = eq + 1;
        } else {
            if (a[1] == 'h' && !a[2]) { td_cli_help(cli, stdout); rc = 0; break; }
            o = find_short(cli->opts, a[1]);
            snprintf(label, sizeof label, "-%c", a[1]);
            if (a[2]) inline_v = a + 2;
        }
        char guess[80];
        const char *mean = !o && a[1] == '-' ? did_you_mean(cli->opts, a + 2, strcspn(a + 2, "="), guess, sizeof guess) : NULL;
        if (!o && mean) { rc = td_cli_bad(cli, label, NULL, "unknown option; did you mean --%s?", mean); break; }
        if (!o) { rc = td_cli_bad(cli, label, NULL, "unknown option"); break; }
        if (o->kind == TD_OPT_FLAG) {
            if (inline_v) { rc = td_cli_bad(cli, label, inline_v, "no value (it is a switch)"); break; }
        } else if (!inline_v) {
            if (i + 1 >= argc) { rc = td_cli_bad(cli, label, NULL, "expected a value (%s)", o->meta ? o->meta : "VALUE"); break; }
            inline_v = argv[++i];
        }
        int r = store(cli, o, inline_v);
        if (r) { rc = r; break; }
        seen[o - cli->opts] = 1;
        if (o->given) *o->given = 1;
    }
    for (size_t k = 0; rc < 0 && k < n_opts; k++)
        if (cli->opts[k].required && !seen[k]) {
            char label[80];
            opt_label(&cli->opts[k], label, sizeof label);
            rc = td_cli_bad(cli, label, NULL, "required (%s)", cli->opts[k].meta ? cli->opts[k].meta : "a value");
        }
    if (rc < 0 && n < cli->min_operands)
        rc = td_cli_bad(cli, "arguments", NULL, "expected at least %d operand%s (%s)", cli->min_operands,
                        cli->min_operands == 1 ? "" : "s", cli->usage);
    if (rc < 0 && cli->max_operands >= 0 && n > cli->max_operands)
        rc = td_cli_bad(cli, extra, NULL, "unexpected argument%s", cli->max_operands ? " (too many operands)" : "");
    free(seen);
    *n_operands = n;
    return rc;
}

void td_cli_help(const td_cli *cli, FILE *f)
{
    const char *u = cli->usage;
    for (int first = 1; u && *u; first = 0) {
        size_t k = strcspn(u, "\n");
        fprintf(f, "%s %s %.*s\n", first ? "usage:" : "      ", cli->prog, (int)k, u);
        u += k;
        if (*u) u++;
    }
    if (cli->about) fprintf(f, "\n%s\n", cli->about);
    fprintf(f, "\noptions:\n");
    for (const td_opt *o = cli->opts; o->name; o++) {
        if (!o->help) continue;
        char left[128];
        int k = snprintf(left, sizeof left, "  %s%c%s--%s%s%s", o->short_name ? "-" : "", o->short_name ? o->short_name : ' ',
                         o->short_name ? ", " : "  ", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
        if (!o->short_name) k = snprintf(left, sizeof left, "      --%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
        fprintf(f, "%s", left);
        /* help text aligned in a column; its continuation lines too */
        const char *h = o->help;
        int col = 30;
        if (k >= col) { fputc('\n', f); k = 0; }
        for (int first = 1; *h; first = 0) {
            size_t len = strcspn(h, "\n");
            fprintf(f, "%*s%.*s\n", first ? col - k : col, "", (int)len, h);
            h += len;
            if (*h) h++;
        }
        if (o->aliases) {
            fprintf(f, "%*s(also", col, "");
            for (const char *p = o->aliases; *p;) {
                size_t len = strcspn(p, " ");
                if (len) fprintf(f, " --%.*s", (int)len, p);
                p += len;
                while (*p == ' ') p++;
            }
            fprintf(f, ")\n");
        }
    }
    fprintf(f, "  -h, --help                  this help\n      --version               the version\n");
    if (cli->footer) fprintf(f, "\n%s\n", cli->footer);
    fprintf(f, "\nLong options take --opt VALUE or --opt=VALUE; --opt_name is read as --opt-name.\n"
               "Exit status: 0 done, 1 failed (bad input file, failed run), 2 usage error.\n");
}

char *td_command_line_edit(int argc, char **argv, const char *const *drop, const char *add)
{
    char **v = td_xmalloc(((size_t)argc + 2) * sizeof *v);
    int n = 0, have_add = 0;
    for (int i = 0; i < argc; i++) {
        int skip = 0;
        for (const char *const *d = drop; d && *d; d++) {
            size_t k = strlen(*d);
            if (k > 1 && (*d)[k - 1] == '=') {   /* "--opt=": the option and its value, either form */
                if (!strncmp(argv[i], *d, k)) skip = 1;
                else if (!strncmp(argv[i], *d, k - 1) && !argv[i][k - 1]) { skip = 1; i++; }
                if (skip) break;
            } else if (!strcmp(argv[i], *d)) {
                skip = 1;
            }
        }
        if (skip) continue;
        if (add && !strcmp(argv[i], add)) have_add = 1;
        v[n++] = argv[i];
    }
    if (add && !have_add) v[n++] = (char *)add;
    char *s = td_command_line(n, v);
    free(v);
    return s;
}

int td_make_parent_dirs(const char *path, td_error *err)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1; ; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        struct stat st;
        if (stat(dir, &st) != 0 && mkdir(dir, 0755) != 0 && errno != EEXIST)
            return td_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));
        *p = c;
        if (!c) break;
    }
    return 0;
}

int td_opt_parse_bool(void *dest, const char *v, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1")) *(int *)dest = 1;
    else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "0")) *(int *)dest = 0;
    else return -1;
    return 0;
}
