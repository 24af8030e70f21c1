/* tidal — --report-to: each step's /steps values to TensorBoard (tfevents.c) and to a JSON-lines
 * file, and the cut-back of both a --resume makes (include/tidal/tfevents.h). One writer for
 * tidal-rl and tidal-sft; tidal-sweep passes the flag on to its runs. */
#include "tidal/tfevents.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int td_report_to_parse(void *dest, const char *value, char *why, size_t whylen)
{
    unsigned mask = 0;
    int none = 0;
    const char *p = value;
    while (1) {
        size_t n = strcspn(p, ",");
        if (n == 4 && !strncmp(p, "none", 4)) none = 1;
        else if (n == 3 && !strncmp(p, "all", 3)) mask |= TD_REPORT_TENSORBOARD | TD_REPORT_JSONL;
        else if (n == 11 && !strncmp(p, "tensorboard", 11)) mask |= TD_REPORT_TENSORBOARD;
        else if (n == 5 && !strncmp(p, "jsonl", 5)) mask |= TD_REPORT_JSONL;
        else return -1;   /* the option's expect text says what is */
        if (!p[n]) break;
        p += n + 1;
    }
    if (none && mask) {
        snprintf(why, whylen, "%s ('none' with another is a contradiction)", TD_REPORT_TO_EXPECT);
        return -1;
    }
    *(unsigned *)dest = mask;
    return 0;
}

const char *td_report_to_name(unsigned mask)
{
    static const char *const N[] = {"none", "tensorboard", "jsonl", "tensorboard,jsonl"};
    return N[mask & 3];
}

void td_report_tag(const char *name, char *buf, size_t n)
{
    if (!strncmp(name, "eval_", 5)) snprintf(buf, n, "eval/%s", name + 5);
    else snprintf(buf, n, "train/%s", name);
}

#define JSONL_NAME "metrics.jsonl"
#define RUNS_DIR "runs"

struct td_steplog {
    unsigned mask;
    td_tfevents *tb;
    FILE *jl;
    char jl_path[4200];
};

/* metrics.jsonl cut back to its lines of "step" < keep_below (a torn or foreign line ends it);
 * removed when no line is left. */
static int trim_jsonl(const char *path, int64_t keep_below, td_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long keep = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] != '\n') break;
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        json_t *s = json_object_get(j, "step");
        int ok = json_is_integer(s) && json_integer_value(s) < keep_below;
        json_decref(j);
        if (!ok) break;
        keep += (long)len;
    }
    int rerr = ferror(f);
    free(line);
    fclose(f);
    if (rerr) return td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    if (keep == 0) return remove(path) == 0 ? 0 : td_fail(err, "%s: cannot remove: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size == keep) return 0;
    if (truncate(path, keep) != 0) return td_fail(err, "%s: cannot truncate to %ld bytes: %s", path, keep, strerror(errno));
    return 0;
}

td_steplog *td_steplog_open(const char *output_dir, unsigned mask, int64_t keep_below, td_error *err)
{
    td_steplog *L = td_xcalloc(1, sizeof *L);
    L->mask = mask;
    char runs[4200];
    snprintf(runs, sizeof runs, "%s/" RUNS_DIR, output_dir);
    snprintf(L->jl_path, sizeof L->jl_path, "%s/" JSONL_NAME, output_dir);
    if (td_tfevents_trim(runs, keep_below, err) || trim_jsonl(L->jl_path, keep_below, err)) goto fail;
    if ((mask & TD_REPORT_TENSORBOARD) && !(L->tb = td_tfevents_create(runs, err))) goto fail;
    if ((mask & TD_REPORT_JSONL) && !(L->jl = fopen(L->jl_path, "ab"))) {
        td_fail(err, "%s: cannot open for appending: %s", L->jl_path, strerror(errno));
        goto fail;
    }
    return L;
fail:
    td_steplog_close(L, NULL);
    return NULL;
}

/* a JSON string of a column name (reward components are named by the user's program) */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* the shortest %g that reads back as the same double */
static void put_json_number(FILE *f, double v, int integer)
{
    if (!isfinite(v)) { fputs("null", f); return; }
    if (integer && fabs(v) < 9.2e18) { fprintf(f, "%lld", (long long)v); return; }
    char s[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v) break;
    }
    /* a whole number stays a JSON real: 1 -> 1.0 */
    fputs(s, f);
    if (!strpbrk(s, ".eE")) fputs(".0", f);
}

int td_steplog_write(td_steplog *L, int64_t step, const td_step_value *v, int n, td_error *err)
{
    if (!L || !L->mask) return 0;
    if (L->tb) {
        const char **tags = td_xmalloc((size_t)(n ? n : 1) * sizeof *tags);
        char **own = td_xmalloc((size_t)(n ? n : 1) * sizeof *own);
        float *vals = td_xmalloc((size_t)(n ? n : 1) * sizeof *vals);
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (isnan(v[i].value)) continue;   /* "not measured at this step" */
            size_t len = strlen(v[i].name) + 8;
            own[m] = td_xmalloc(len);
            td_report_tag(v[i].name, own[m], len);
            tags[m] = own[m];
            vals[m++] = (float)v[i].value;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int rc = td_tfevents_scalars(L->tb, step, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, tags, vals, m, err);
        for (int i = 0; i < m; i++) free(own[i]);
        free(own);
        free(tags);
        free(vals);
        if (rc) return -1;
    }
    if (L->jl) {
        fprintf(L->jl, "{\"step\": %lld", (long long)step);
        for (int i = 0; i < n; i++) {
            fputs(", ", L->jl);
            put_json_string(L->jl, v[i].name);
            fputs(": ", L->jl);
            put_json_number(L->jl, v[i].value, v[i].integer);
        }
        fputs("}\n", L->jl);
        if (fflush(L->jl) != 0 || ferror(L->jl)) return td_fail(err, "%s: cannot write: %s", L->jl_path, strerror(errno));
    }
    return 0;
}

int td_steplog_close(td_steplog *L, td_error *err)
{
    if (!L) return 0;
    int rc = td_tfevents_close(L->tb, err);
    if (L->jl && fclose(L->jl) != 0 && rc == 0) rc = td_fail(err, "%s: cannot write: %s", L->jl_path, strerror(errno));
    free(L);
    return rc;
}
