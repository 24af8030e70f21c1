/* Dataset files: JSON Lines or a JSON array, optionally gzip-compressed (include/tidal/dataset.h). */
#include "tidal/dataset.h"
#include "tidal/io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* The whole uncompressed text of path (zlib reads a plain file as it is). */
static char *read_all(const char *path, size_t *len, td_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0) { td_fail(err, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    if (S_ISDIR(st.st_mode)) {
        td_fail(err, "%s: is a directory; expected a dataset file (.jsonl, .json or .json.gz: one JSON object "
                "per record, as datasets' Dataset.to_json writes it)", path);
        return NULL;
    }
    gzFile f = gzopen(path, "rb");
    if (!f) { td_fail(err, "%s: cannot open: %s", path, strerror(errno ? errno : ENOMEM)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = td_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) { cap *= 2; buf = td_xrealloc(buf, cap + 1); }
        int chunk = (int)((cap - n) < (1u << 30) ? (cap - n) : (1u << 30));
        int k = gzread(f, buf + n, (unsigned)chunk), code = Z_OK;
        const char *msg = k <= 0 ? gzerror(f, &code) : NULL;   /* a truncated .gz ends with Z_BUF_ERROR */
        if (k < 0 || (k == 0 && code != Z_OK && code != Z_STREAM_END)) {
            size_t pl = strlen(path);   /* zlib's message starts with the path: once is enough */
            if (msg && !strncmp(msg, path, pl) && !strncmp(msg + pl, ": ", 2)) msg += pl + 2;
            td_fail(err, "%s: read error after %zu bytes: %s (a damaged or truncated .gz file?)", path, n, msg ? msg : "?");
            gzclose(f);
            free(buf);
            return NULL;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    gzclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

static void push(td_record **r, size_t *n, size_t *cap, json_t *o, long line)
{
    if (*n == *cap) { *cap = *cap ? 2 * *cap : 256; *r = td_xrealloc(*r, *cap * sizeof **r); }
    (*r)[(*n)++] = (td_record){o, line};
}

/* The line where each element of the top-level array in text starts: a scan that follows
 * strings (with escapes) and nesting. Returns the number of elements found (at most max). */
static size_t element_lines(const char *text, size_t len, long first_line, long *lines, size_t max)
{
    long line = first_line;
    int depth = 0, in_str = 0, want = 0;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\n') line++;
        if (in_str) {
            if (c == '\\') { if (i + 1 < len && text[i + 1] == '\n') line++; i++; }
            else if (c == '"') in_str = 0;
            continue;
        }
        if (depth == 1 && want && c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != ']') {
            if (k < max) lines[k] = line;
            k++;
            want = 0;
        }
        if (c == '"') in_str = 1;
        else if (c == '[' || c == '{') { depth++; if (depth == 1) want = 1; }
        else if (c == ']' || c == '}') depth--;
        else if (c == ',' && depth == 1) want = 1;
    }
    return k;
}

static int read_array(const char *path, const char *text, size_t len, long first_line, td_record **out, size_t *n,
                      td_error *err)
{
    json_error_t je;
    json_t *a = td_json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!a) return td_fail(err, "%s:%d: invalid JSON at column %d: %s", path, je.line + (int)first_line - 1, je.column, je.text);
    size_t m = json_array_size(a), cap = 0;
    long *lines = td_xcalloc(m ? m : 1, sizeof *lines);
    if (element_lines(text, len, first_line, lines, m) != m)   /* cannot happen on valid JSON; lines stay 0 */
        memset(lines, 0, (m ? m : 1) * sizeof *lines);
    int rc = 0;
    for (size_t i = 0; i < m; i++) {
        json_t *o = json_array_get(a, i);
        if (!json_is_object(o)) {
            rc = td_fail(err, "%s:%ld: record %zu of the array is not a JSON object (a record is {\"prompt\": ..., ...})",
                         path, lines[i], i + 1);
            break;
        }
        push(out, n, &cap, json_incref(o), lines[i]);
    }
    free(lines);
    json_decref(a);
    return rc;
}

static int read_lines(const char *path, const char *text, size_t len, long first_line, td_record **out, size_t *n,
                      td_error *err)
{
    size_t cap = 0;
    long line = first_line;
    for (size_t at = 0; at < len; line++) {
        const char *s = text + at, *nl = memchr(s, '\n', len - at);
        size_t l = nl ? (size_t)(nl - s) : len - at;
        at += l + (nl != NULL);
        while (l && (s[l - 1] == '\r' || s[l - 1] == ' ' || s[l - 1] == '\t')) l--;
        size_t b = 0;
        while (b < l && (s[b] == ' ' || s[b] == '\t')) b++;
        if (b == l) continue;
        json_error_t je;
        json_t *o = td_json_loadb(s + b, l - b, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
        if (!o) {
            /* a pretty-printed object over several lines is not JSON Lines: say so */
            json_error_t je2;
            json_t *whole = td_json_loadb(text, len, JSON_ALLOW_NUL, &je2);
            int one_object = whole && json_is_object(whole);
            json_decref(whole);
            if (one_object)
                return td_fail(err, "%s: holds one JSON object over several lines; expected JSON Lines (one record "
                               "object per line) or a JSON array of records", path);
            td_fail(err, "%s:%ld: invalid JSON at column %d: %s", path, line, je.column + (int)b, td_json_line_error(&je));
            return -1;
        }
        if (!json_is_object(o)) {
            json_decref(o);
            return td_fail(err, "%s:%ld: not a JSON object (a record is {\"prompt\": ..., ...})", path, line);
        }
        push(out, n, &cap, o, line);
    }
    return 0;
}

int td_records_read(const char *path, td_record **out, size_t *n, td_error *err)
{
    *out = NULL;
    *n = 0;
    size_t len;
    char *text = read_all(path, &len, err);
    if (!text) return -1;
    const char *t = text;
    if (len >= 3 && !memcmp(t, "\xEF\xBB\xBF", 3)) { t += 3; len -= 3; }   /* UTF-8 byte-order mark */
    size_t b = 0;
    long first_line = 1;
    while (b < len && (t[b] == ' ' || t[b] == '\t' || t[b] == '\r' || t[b] == '\n')) first_line += t[b++] == '\n';
    int rc = b < len && t[b] == '[' ? read_array(path, t + b, len - b, first_line, out, n, err)
                                    : read_lines(path, t + b, len - b, first_line, out, n, err);
    free(text);
    if (!rc && *n == 0) rc = td_fail(err, "%s: no records (the file is empty)", path);
    if (rc) { td_records_free(*out, *n); *out = NULL; *n = 0; return -1; }
    return 0;
}

void td_records_free(td_record *r, size_t n)
{
    for (size_t i = 0; r && i < n; i++) json_decref(r[i].obj);
    free(r);
}
