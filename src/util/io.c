/* File helpers (see include/tidal/io.h). */
#include "tidal/io.h"

#include <errno.h>
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

json_t *td_json_load_text(const char *text, size_t len, const char *what, td_error *err)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
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
