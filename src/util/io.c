/* File helpers (see include/tidal/io.h). */
#include "tidal/io.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

char *td_read_file(const char *path, size_t max_bytes, size_t *len_out, td_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) { td_fail(err, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        td_fail(err, "%s: not a regular file", path);
        return NULL;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        td_fail(err, "%s: file is %lld bytes, more than the %zu this reader accepts",
                path, (long long)st.st_size, max_bytes);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) { fclose(f); td_fail(err, "%s: out of memory for %zu bytes", path, n); return NULL; }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf); fclose(f);
        td_fail(err, "%s: read failed (file changed or truncated while reading)", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len_out) *len_out = n;
    return buf;
}

int td_mmap_open(td_mmap *m, const char *path, td_error *err)
{
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return td_fail(err, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size == 0) { close(fd); return 0; }
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) { m->size = 0; return td_fail(err, "%s: mmap failed: %s", path, strerror(errno)); }
    m->data = p;
    return 0;
}

void td_mmap_close(td_mmap *m)
{
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

/* An integer literal (no fraction, no exponent) that strtoll cannot hold. */
static bool int_overflows(const char *s, size_t n)
{
    char buf[32];
    if (n >= sizeof buf) return true;          /* 31+ characters: beyond 64 bits whatever they are */
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    (void)strtoll(buf, NULL, 10);
    return errno == ERANGE;
}

/* Copy of the text where every integer literal beyond 64 bits gets ".0" appended, which makes
 * it a JSON real with the value strtod gives the full digit string (int(1e30) is exactly the
 * double 1e30). Strings are skipped with their escapes, so a digit run inside one is left as
 * it is. The rest of the text is copied byte for byte, so any other error stays where it was
 * (same line; a column moved right by 2 per rewritten number before it on that line). */
static char *widen_big_ints(const char *text, size_t len, size_t *len_out)
{
    char *out = td_xmalloc(len + len / 2 + 3), *o = out;   /* each rewrite adds 2 to >= 20 chars */
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == '"') {
            *o++ = text[i++];
            while (i < len && text[i] != '"') {
                if (text[i] == '\\' && i + 1 < len) *o++ = text[i++];
                *o++ = text[i++];
            }
            if (i < len) *o++ = text[i++];
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t a = i;
            if (text[i] == '-') i++;
            while (i < len && text[i] >= '0' && text[i] <= '9') i++;
            bool is_int = i > a + (text[a] == '-') &&
                          !(i < len && (text[i] == '.' || text[i] == 'e' || text[i] == 'E'));
            while (i < len && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.' || text[i] == 'e' ||
                               text[i] == 'E' || text[i] == '+' || text[i] == '-'))
                i++;
            memcpy(o, text + a, i - a);
            o += i - a;
            if (is_int && int_overflows(text + a, i - a)) { *o++ = '.'; *o++ = '0'; }
        } else {
            *o++ = text[i++];
        }
    }
    *len_out = (size_t)(o - out);
    return out;
}

const char *td_json_line_error(json_error_t *je)
{
    char *at = strstr(je->text, "near end of file");
    if (at) snprintf(at, sizeof je->text - (size_t)(at - je->text), "at the end of the line");
    return je->text;
}

json_t *td_json_loadb(const char *text, size_t len, size_t flags, json_error_t *je)
{
    json_t *j = json_loadb(text, len, flags, je);
    if (j || json_error_code(je) != json_error_numeric_overflow) return j;
    /* jansson keeps integers in 64 bits and refuses longer ones ("too big integer"). Files that
     * transformers writes hold some (tokenizer_config.json "model_max_length": int(1e30)), so
     * such integers are read as reals instead; a field that needs an integer then refuses the
     * real by name, and one that only bounds something (model_max_length) keeps its value. */
    size_t n2;
    char *wide = widen_big_ints(text, len, &n2);
    j = json_loadb(wide, n2, flags, je);
    free(wide);
    return j;
}

json_t *td_json_load_text(const char *text, size_t len, const char *what, td_error *err)
{
    json_error_t je;
    json_t *j = td_json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j) td_fail(err, "%s:%d:%d: invalid JSON: %s", what, je.line, je.column, je.text);
    return j;
}

json_t *td_json_load_file(const char *path, td_error *err)
{
    size_t n;
    char *text = td_read_file(path, (size_t)1 << 30, &n, err);
    if (!text) return NULL;
    json_t *j = td_json_load_text(text, n, path, err);
    free(text);
    return j;
}
