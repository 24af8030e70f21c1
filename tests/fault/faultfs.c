/* faultfs: an LD_PRELOAD shim that makes a storage fail on cue, for tests/py/test_storage_faults.py.
 *
 *   make build/tests/fault/faultfs.so
 *   TIDAL_FAULT_PATH=/tmp/x/ TIDAL_FAULT_AT=17 LD_PRELOAD=build/tests/fault/faultfs.so tidal-diff ...
 *
 * Only files whose path contains TIDAL_FAULT_PATH are watched (the run file, its journal and
 * temporaries, checkpoints; not the model being read or stderr). On them every write, pwrite,
 * ftruncate, fsync, fdatasync, and every rename and unlink naming such a path, is one numbered
 * call (1-based). The fault:
 *   TIDAL_FAULT_AT=K      at the K-th call
 *   TIDAL_FAULT_BYTES=N   at the write that would take the bytes written past N (a disk of N bytes)
 *   TIDAL_FAULT_MODE      fail (default), by TIDAL_FAULT_ERRNO:
 *                           ENOSPC (default) or EDQUOT, a full disk: from that call on, every write
 *                           that needs new space (past the file's end) fails; overwrites of what
 *                           the file holds, fsync, rename still work; a write that crosses the
 *                           byte budget writes what fits first (a short write, as a full disk does)
 *                           EIO, a failed device: that call and every later one fails
 *                         kill: the process SIGKILLs itself in that call: a write that spans pages
 *                         writes up to its first page boundary, then dies (a torn write: a fatal
 *                         signal stops a write between pages, never inside one); a write within
 *                         one page is done whole first
 *                         killbefore: it SIGKILLs itself as the call begins (nothing of it done:
 *                         a kill between two calls)
 *   TIDAL_FAULT_LOG=FILE  appends "calls C bytes B" at exit (a clean run tells the sweep its range)
 *   TIDAL_FAULT_TRACE=FILE  writes one line per numbered call: "K op name bytes" (name: the
 *                         file's last path component), so a sweep can aim at a phase
 * Without TIDAL_FAULT_AT or TIDAL_FAULT_BYTES nothing fails; the calls are only counted. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAXFD 65536

static unsigned char watched[MAXFD];
static char *fd_name[MAXFD];
static int trace_fd = -1;
static const char *watch_path;
static long long fault_at = -1, fault_bytes = -1, calls, bytes;
static int fault_errno = ENOSPC, kill_mode, kill_before, failing;

static void init(void) __attribute__((constructor));
static void init(void)
{
    watch_path = getenv("TIDAL_FAULT_PATH");
    const char *s;
    if ((s = getenv("TIDAL_FAULT_AT"))) fault_at = atoll(s);
    if ((s = getenv("TIDAL_FAULT_BYTES"))) fault_bytes = atoll(s);
    if ((s = getenv("TIDAL_FAULT_MODE"))) {
        kill_before = !strcmp(s, "killbefore");
        kill_mode = kill_before || !strcmp(s, "kill");
    }
    if ((s = getenv("TIDAL_FAULT_ERRNO"))) {
        if (!strcmp(s, "EIO")) fault_errno = EIO;
        else if (!strcmp(s, "EDQUOT")) fault_errno = EDQUOT;
        else fault_errno = ENOSPC;
    }
    if ((s = getenv("TIDAL_FAULT_TRACE"))) {
        __typeof__(open) *real_open = (__typeof__(open) *)dlsym(RTLD_NEXT, "open");
        trace_fd = real_open(s, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
}

static void report(void) __attribute__((destructor));
static void report(void)
{
    const char *log = getenv("TIDAL_FAULT_LOG");
    if (!log) return;
    char line[96];
    int n = snprintf(line, sizeof line, "calls %lld bytes %lld\n", calls, bytes);
    int (*real_open)(const char *, int, ...) = dlsym(RTLD_NEXT, "open");
    ssize_t (*real_write)(int, const void *, size_t) = dlsym(RTLD_NEXT, "write");
    int fd = real_open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { real_write(fd, line, (size_t)n); close(fd); }
}

static void trace(const char *op, const char *path, long long n)
{
    if (trace_fd < 0) return;
    static __typeof__(write) *real_write;
    if (!real_write) real_write = (__typeof__(write) *)dlsym(RTLD_NEXT, "write");
    const char *base = path ? strrchr(path, '/') : NULL;
    char line[512];
    int len = snprintf(line, sizeof line, "%lld %s %s %lld\n", calls, op, base ? base + 1 : path ? path : "?", n);
    if (len > 0) real_write(trace_fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
}

static int is_watched_path(const char *p) { return watch_path && p && strstr(p, watch_path); }
static int is_watched_fd(int fd) { return fd >= 0 && fd < MAXFD && watched[fd]; }

static void die(void)
{
    raise(SIGKILL);
    _exit(137);
}

/* A numbered call that writes nothing: whether it fails (or dies). */
static int full_disk(void);

static int plain_call(const char *op, const char *path)
{
    calls++;
    trace(op, path, 0);
    if (failing) return full_disk() ? 0 : -1;
    if (fault_at > 0 && calls >= fault_at) {
        if (kill_mode) die();
        failing = 1;
        return full_disk() ? 0 : -1;
    }
    return 0;
}

/* A write of n bytes: how many to let through (n: all), or -1 to fail it. */
static ssize_t write_call(const char *op, int fd, off_t off, size_t n)
{
    calls++;
    trace(op, fd_name[fd], (long long)n);
    if (failing) return -1;
    size_t allow = n;
    int fault = 0;
    if (fault_at > 0 && calls >= fault_at) {
        fault = 1;
        allow = 0;
        if (kill_mode && !kill_before) {   /* torn at the first page boundary it crosses */
            if (off < 0) off = lseek(fd, 0, SEEK_CUR);
            off_t page_end = (off / 4096 + 1) * 4096;
            allow = off >= 0 && off + (off_t)n > page_end ? (size_t)(page_end - off) : n;
        }
    }
    if (fault_bytes >= 0 && bytes + (long long)n > fault_bytes) {
        fault = 1;
        size_t fit = fault_bytes > bytes ? (size_t)(fault_bytes - bytes) : 0;
        if (fit < allow) allow = fit;
    }
    if (!fault) { bytes += (long long)n; return (ssize_t)n; }
    if (!kill_mode) failing = 1;
    bytes += (long long)allow;
    if (kill_mode) return -(ssize_t)allow - 2;   /* write `allow` bytes, then die */
    return allow ? (ssize_t)allow : -1;
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

static void track(int fd, const char *path)
{
    if (fd < 0 || fd >= MAXFD) return;
    watched[fd] = is_watched_path(path) ? 1 : 0;
    free(fd_name[fd]);
    fd_name[fd] = watched[fd] ? strdup(path) : NULL;
}

int open(const char *path, int flags, ...)
{
    REAL(open);
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    int fd = real_open(path, flags, mode);
    track(fd, path);
    return fd;
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int __open_2(const char *path, int flags)
{
    return open(path, flags);
}
int __open64_2(const char *path, int flags) __attribute__((alias("__open_2")));

int openat(int dirfd, const char *path, int flags, ...)
{
    REAL(openat);
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }
    int fd = real_openat(dirfd, path, flags, mode);
    track(fd, path);
    return fd;
}
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int creat(const char *path, mode_t mode)
{
    return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int close(int fd)
{
    REAL(close);
    if (fd >= 0 && fd < MAXFD && fd != trace_fd) { watched[fd] = 0; free(fd_name[fd]); fd_name[fd] = NULL; }
    return real_close(fd);
}

/* A full disk (ENOSPC, EDQUOT) still takes writes that need no new space: within the file. */
static int full_disk(void) { return fault_errno != EIO && !kill_mode; }

static int within_file(int fd, off_t off, size_t n)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return 0;
    if (off < 0) off = lseek(fd, 0, SEEK_CUR);
    return off >= 0 && off + (off_t)n <= st.st_size;
}

ssize_t write(int fd, const void *buf, size_t n)
{
    REAL(write);
    if (!is_watched_fd(fd)) return real_write(fd, buf, n);
    if (full_disk() && (failing || (fault_at > 0 && calls + 1 >= fault_at)) && within_file(fd, -1, n)) {
        calls++;   /* a full disk still overwrites what the file holds */
        trace("write", fd_name[fd], (long long)n);
        failing = 1;
        return real_write(fd, buf, n);
    }
    ssize_t allow = write_call("write", fd, -1, n);
    if (allow == (ssize_t)n) return real_write(fd, buf, n);
    if (allow < -1) { if (allow < -2) real_write(fd, buf, (size_t)(-allow - 2)); die(); }
    if (allow > 0) return real_write(fd, buf, (size_t)allow);
    errno = fault_errno;
    return -1;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    REAL(pwrite);
    if (!is_watched_fd(fd)) return real_pwrite(fd, buf, n, off);
    if (full_disk() && (failing || (fault_at > 0 && calls + 1 >= fault_at)) && within_file(fd, off, n)) {
        calls++;   /* a full disk still overwrites what the file holds */
        trace("pwrite", fd_name[fd], (long long)n);
        failing = 1;
        return real_pwrite(fd, buf, n, off);
    }
    ssize_t allow = write_call("pwrite", fd, off, n);
    if (allow == (ssize_t)n) return real_pwrite(fd, buf, n, off);
    if (allow < -1) { if (allow < -2) real_pwrite(fd, buf, (size_t)(-allow - 2), off); die(); }
    if (allow > 0) return real_pwrite(fd, buf, (size_t)allow, off);
    errno = fault_errno;
    return -1;
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) __attribute__((alias("pwrite")));

int ftruncate(int fd, off_t len)
{
    REAL(ftruncate);
    if (is_watched_fd(fd) && plain_call("ftruncate", fd_name[fd])) { errno = fault_errno; return -1; }
    return real_ftruncate(fd, len);
}
int ftruncate64(int fd, off_t len) __attribute__((alias("ftruncate")));

int fsync(int fd)
{
    REAL(fsync);
    if (is_watched_fd(fd) && plain_call("fsync", fd_name[fd])) { errno = fault_errno; return -1; }
    return real_fsync(fd);
}

int fdatasync(int fd)
{
    REAL(fdatasync);
    if (is_watched_fd(fd) && plain_call("fdatasync", fd_name[fd])) { errno = fault_errno; return -1; }
    return real_fdatasync(fd);
}

int rename(const char *from, const char *to)
{
    REAL(rename);
    if ((is_watched_path(from) || is_watched_path(to)) && plain_call("rename", to)) { errno = fault_errno; return -1; }
    return real_rename(from, to);
}

int unlink(const char *path)
{
    REAL(unlink);
    /* counted (a kill may land here) but never failed: removing is how failures are cleaned up */
    if (is_watched_path(path) && !failing) {
        calls++;
        trace("unlink", path, 0);
        if (fault_at > 0 && calls >= fault_at && kill_mode) die();
        if (fault_at > 0 && calls >= fault_at) failing = 1;
    }
    return real_unlink(path);
}
