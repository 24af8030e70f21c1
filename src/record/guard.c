/* The reader's guard: a damaged or hostile run file must give a clear error in a second, never a
 * hang or a crash (issue 42). libhdf5 (1.10.8, Debian 12's) is not hardened against damaged
 * files: on mutated files it loops for ever in H5C_protect, reads out of bounds in H5Aexists and
 * H5HG_read, and asks for multi-GB allocations. So before any in-process libhdf5 call on a file
 * this process did not write:
 *
 *   1. the superblock is checked here, without libhdf5: the signature, a version HDF5 1.10 reads,
 *      the checksum (superblock v2/v3, which tidal writes since issue 42), and an end-of-file
 *      address the file reaches (a truncated copy);
 *   2. a child process (this executable again, /proc/self/exe, entered through check_child_main
 *      before main) opens the file with libhdf5 and reads everything tidal's readers read: every
 *      root attribute, every group and dataset's header, its chunk index and (within a budget) its
 *      data, under a CPU-time limit. A signal, the limit, a sanitizer report or an HDF5 error on a
 *      tidal run file that did not change meanwhile refuses the file: "PATH: damaged run file (…)".
 *
 * The child is exec'd, not only forked: the parent may be multithreaded (OpenMP, OpenBLAS), and a
 * fresh image carries no parent state (a fuzzer's hooks, files open for writing, sanitizer death
 * callbacks). Its stdout and stderr come back through a pipe, so nothing it hits (an
 * AddressSanitizer report included) reaches the user but the one-line reason. */
#include "guard.h"
#include "tidal/runfile.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CHILD_ENV "TIDAL_RUNFILE_CHECK_CHILD"
#define LIMIT_ENV "TIDAL_RUNFILE_CHECK_SECONDS"
#define EXIT_DAMAGED 3                          /* the child's verdict: an HDF5 error, message on stdout */
#define DATA_FULL ((size_t)1 << 20)             /* a dataset this small (logical bytes) is read whole */
#define DATA_PIECE ((size_t)256 << 10)          /* else its first and last rows, this much each */
#define DATA_BUDGET ((size_t)32 << 20)          /* whole reads stop here; pieces go on */

/* ---------------------------------------------------------------- files this process wrote */

typedef struct { dev_t dev; ino_t ino; off_t size; long long mtime_ns; } file_stamp;

static file_stamp trusted[16];
static int n_trusted;

static int stamp_of(const char *path, file_stamp *s)
{
    struct stat st;
    if (stat(path, &st)) return -1;
    *s = (file_stamp){st.st_dev, st.st_ino, st.st_size, (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
    return 0;
}

void tdg_trust(const char *path)
{
    file_stamp s;
    if (stamp_of(path, &s)) return;
    int i = 0;
    while (i < n_trusted && (trusted[i].dev != s.dev || trusted[i].ino != s.ino)) i++;
    if (i == n_trusted) {
        if (n_trusted < (int)(sizeof trusted / sizeof trusted[0])) n_trusted++;
        else i = 0;   /* the oldest goes (at worst a file is checked again) */
    }
    trusted[i] = s;
}

static int is_trusted(const char *path)
{
    file_stamp s;
    if (stamp_of(path, &s)) return 0;
    for (int i = 0; i < n_trusted; i++)
        if (!memcmp(&trusted[i], &s, sizeof s)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- 1. the superblock */

/* Bob Jenkins' lookup3 hashlittle, byte by byte, as HDF5's H5_checksum_lookup3 (initval 0). */
#define ROT(x, k) (((x) << (k)) | ((x) >> (32 - (k))))
static uint32_t lookup3(const unsigned char *k, size_t length)
{
    uint32_t a, b, c;
    a = b = c = 0xdeadbeefu + (uint32_t)length;
    while (length > 12) {
        a += k[0] + ((uint32_t)k[1] << 8) + ((uint32_t)k[2] << 16) + ((uint32_t)k[3] << 24);
        b += k[4] + ((uint32_t)k[5] << 8) + ((uint32_t)k[6] << 16) + ((uint32_t)k[7] << 24);
        c += k[8] + ((uint32_t)k[9] << 8) + ((uint32_t)k[10] << 16) + ((uint32_t)k[11] << 24);
        a -= c; a ^= ROT(c, 4);  c += b;
        b -= a; b ^= ROT(a, 6);  a += c;
        c -= b; c ^= ROT(b, 8);  b += a;
        a -= c; a ^= ROT(c, 16); c += b;
        b -= a; b ^= ROT(a, 19); a += c;
        c -= b; c ^= ROT(b, 4);  b += a;
        length -= 12;
        k += 12;
    }
    switch (length) {
    case 12: c += (uint32_t)k[11] << 24; /* fall through */
    case 11: c += (uint32_t)k[10] << 16; /* fall through */
    case 10: c += (uint32_t)k[9] << 8;   /* fall through */
    case 9:  c += k[8];                  /* fall through */
    case 8:  b += (uint32_t)k[7] << 24;  /* fall through */
    case 7:  b += (uint32_t)k[6] << 16;  /* fall through */
    case 6:  b += (uint32_t)k[5] << 8;   /* fall through */
    case 5:  b += k[4];                  /* fall through */
    case 4:  a += (uint32_t)k[3] << 24;  /* fall through */
    case 3:  a += (uint32_t)k[2] << 16;  /* fall through */
    case 2:  a += (uint32_t)k[1] << 8;   /* fall through */
    case 1:  a += k[0]; break;
    case 0:  return c;
    }
    c ^= b; c -= ROT(b, 14);
    a ^= c; a -= ROT(c, 11);
    b ^= a; b -= ROT(a, 25);
    c ^= b; c -= ROT(b, 16);
    a ^= c; a -= ROT(c, 4);
    b ^= a; b -= ROT(a, 14);
    c ^= b; c -= ROT(b, 24);
    return c;
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The superblock at the start of the file (tidal writes no user block; HDF5 also looks at 512,
 * 1024, ... and so does this). Returns its version (0..3), or -1 with why. */
static int check_superblock(const char *path, char *why, size_t cap)
{
    static const unsigned char SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(why, cap, "%s: cannot open: %s", path, strerror(errno)); return -1; }
    struct stat st;
    unsigned char sb[128];
    ssize_t got = 0;
    int found = 0;
    if (fstat(fd, &st) == 0)
        for (off_t at = 0; !found && at + 8 <= st.st_size; at = at ? 2 * at : 512) {
            got = pread(fd, sb, sizeof sb, at);
            found = got >= 8 && !memcmp(sb, SIG, 8);
        }
    close(fd);
    if (!found) { snprintf(why, cap, "%s: not an HDF5 file (or truncated)", path); return -1; }
    int ver = got > 8 ? sb[8] : -1;
    if (ver < 0 || ver > 3) {
        snprintf(why, cap, "%s: damaged run file (HDF5 superblock version %d: HDF5 1.10 reads 0 to 3)", path, ver);
        return -1;
    }
    /* where the sizes of addresses are and where the end-of-file address starts */
    int so = ver >= 2 ? sb[9] : sb[13], sl = ver >= 2 ? sb[10] : sb[14];
    if ((so != 2 && so != 4 && so != 8) || (sl != 2 && sl != 4 && sl != 8)) {
        snprintf(why, cap, "%s: damaged run file (superblock: %d-byte addresses, %d-byte lengths)", path, so, sl);
        return -1;
    }
    size_t at_eof = ver >= 2 ? 12 + 2 * (size_t)so : (ver == 1 ? 28 : 24) + 2 * (size_t)so;
    if ((ssize_t)(at_eof + so) > got) { snprintf(why, cap, "%s: damaged run file (superblock cut short)", path); return -1; }
    if (ver >= 2) {
        size_t n = 12 + 4 * (size_t)so;
        if ((ssize_t)(n + 4) > got) { snprintf(why, cap, "%s: damaged run file (superblock cut short)", path); return -1; }
        uint32_t want = (uint32_t)get_le(sb + n, 4), have = lookup3(sb, n);
        if (want != have) {
            snprintf(why, cap, "%s: damaged run file (superblock checksum %08x, its bytes give %08x)", path, want, have);
            return -1;
        }
    }
    uint64_t base_addr = get_le(sb + (ver >= 2 ? 12 : at_eof - 2 * (size_t)so), so);
    uint64_t eof = get_le(sb + at_eof, so);
    if (eof != (so == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * so)) - 1) &&
        (eof > UINT64_MAX - base_addr || base_addr + eof > (uint64_t)st.st_size)) {
        snprintf(why, cap, "%s: damaged run file (truncated: the superblock says %llu bytes, the file has %lld)",
                 path, (unsigned long long)(base_addr + eof), (long long)st.st_size);
        return -1;
    }
    return ver;
}

/* ---------------------------------------------------------------- 2. the child's reading */

static void child_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void child_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("error: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    _exit(EXIT_DAMAGED);
}

typedef struct { int tidal; int odd; char odd_name[256]; } attr_walk;

/* Reads one root attribute as tidal's readers do (strings in their own character set). */
static herr_t child_attr(hid_t loc, const char *name, const H5A_info_t *info, void *user)
{
    (void)info;
    attr_walk *w = user;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) child_fail("attribute %s cannot be opened", name);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    if (t < 0 || sp < 0) child_fail("attribute %s: its type or shape cannot be read", name);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    size_t size = H5Tget_size(t);
    H5T_class_t cls = H5Tget_class(t);
    if (n < 0 || n > (1 << 20) || size == 0 || size > ((size_t)1 << 26) || (size_t)n * size > ((size_t)1 << 26))
        child_fail("attribute %s: %lld values of %zu bytes", name, (long long)n, size);
    size_t count = n ? (size_t)n : 1;
    int rc = 0;
    if (cls == H5T_STRING) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_cset(mt, H5Tget_cset(t));
        if (H5Tis_variable_str(t) > 0) {
            char **p = calloc(count, sizeof *p);
            H5Tset_size(mt, H5T_VARIABLE);
            rc = H5Aread(a, mt, p);
            if (rc >= 0 && !strcmp(name, "format") && n == 1 && p[0] && !strcmp(p[0], "tidal-run")) w->tidal = 1;
        } else {
            char *p = calloc(count, size + 1);
            H5Tset_size(mt, size + 1);
            rc = H5Aread(a, mt, p);
            if (rc >= 0 && !strcmp(name, "format") && n == 1 && !strcmp(p, "tidal-run")) w->tidal = 1;
        }
    } else if (cls == H5T_INTEGER) {
        rc = H5Aread(a, H5T_NATIVE_INT64, calloc(count, 8));
    } else if (cls == H5T_FLOAT) {
        rc = H5Aread(a, H5T_NATIVE_DOUBLE, calloc(count, 8));
    } else {
        rc = H5Aread(a, t, calloc(count, size));   /* not tidal's: read it, refuse it if the file is tidal's */
        if (!w->odd) snprintf(w->odd_name, sizeof w->odd_name, "%s", name);
        w->odd = 1;
    }
    if (rc < 0) child_fail("attribute %s cannot be read", name);
    /* the readers look attributes up by name (H5Aexists), another path through the index */
    if (H5Aexists(loc, name) <= 0) child_fail("attribute %s is listed but not found by name", name);
    return 0;   /* the child exits without freeing: nothing here outlives it */
}

typedef struct { char path[512]; int depth; size_t budget; } obj_walk;

/* Reads rows [row0, row0 + nrows) of a dataset in its own (native) type. */
static void child_rows(hid_t d, hid_t mt, const char *path, int rank, hsize_t row0, hsize_t nrows, size_t width, size_t el)
{
    if (!nrows) return;
    void *buf = malloc((size_t)nrows * width * el);
    if (!buf) child_fail("%s: out of memory reading it", path);
    hid_t fs = H5Dget_space(d);
    hsize_t start[2] = {row0, 0}, count[2] = {nrows, width};
    hid_t ms = H5Screate_simple(rank, count, NULL);
    if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 || H5Dread(d, mt, ms, fs, H5P_DEFAULT, buf) < 0)
        child_fail("cannot read %s (rows %llu..%llu)", path, (unsigned long long)row0, (unsigned long long)(row0 + nrows));
    H5Sclose(ms);
    H5Sclose(fs);
    free(buf);
}

static void child_dataset(hid_t d, obj_walk *w)
{
    const char *path = w->path;
    hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
    if (t < 0 || sp < 0) child_fail("%s: its type or shape cannot be read", path);
    H5T_class_t cls = H5Tget_class(t);
    size_t el = H5Tget_size(t);
    if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || el == 0 || el > 8)
        child_fail("%s: a type tidal does not write (class %d, %zu bytes)", path, (int)cls, el);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[2] = {0, 1};
    if (rank < 1 || rank > 2 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) child_fail("%s: rank %d", path, rank);
    hsize_t rows = dims[0];
    size_t width = rank == 2 ? (size_t)dims[1] : 1;
    hid_t dcpl = H5Dget_create_plist(d);
    if (dcpl < 0) child_fail("%s: its storage layout cannot be read", path);
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t nchunks = 0;
        if (H5Dget_num_chunks(d, sp, &nchunks) < 0) child_fail("%s: its chunk index cannot be read", path);
    }
    H5Pclose(dcpl);
    hsize_t stored = H5Dget_storage_size(d);
    /* rows its storage cannot hold are refused by the readers themselves (runfile.c, rows_backed) */
    if (width == 0 || rows > ((hsize_t)1 << 62) / width / el || rows * width * el > stored * 1032 + 65536) return;
    if (width * el > DATA_PIECE) return;   /* no reader asks for rows this wide */
    hid_t mt = H5Tget_native_type(t, H5T_DIR_ASCEND);
    size_t bytes = (size_t)rows * width * el;
    if (bytes <= DATA_FULL && bytes <= w->budget) {
        child_rows(d, mt, path, rank, 0, rows, width, el);
        w->budget -= bytes;
    } else {
        hsize_t piece = DATA_PIECE / (width * el);
        if (piece > rows) piece = rows;
        child_rows(d, mt, path, rank, 0, piece, width, el);
        child_rows(d, mt, path, rank, rows - piece, piece, width, el);
    }
    H5Tclose(mt);
    H5Tclose(t);
    H5Sclose(sp);
}

static herr_t child_link(hid_t g, const char *name, const H5L_info_t *info, void *user)
{
    obj_walk *w = user, sub = *w;
    if (snprintf(sub.path, sizeof sub.path, "%s/%s", w->depth ? w->path : "", name) >= (int)sizeof sub.path)
        child_fail("%s/...: a path longer than tidal writes", w->path);
    if (info->type != H5L_TYPE_HARD) child_fail("%s: a soft or external link (tidal writes none)", sub.path);
    if (H5Lexists(g, name, H5P_DEFAULT) <= 0) child_fail("%s is listed but not found by name", sub.path);
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) child_fail("%s cannot be opened", sub.path);
    H5I_type_t type = H5Iget_type(o);
    sub.depth = w->depth + 1;
    if (type == H5I_GROUP) {
        if (sub.depth > 3) child_fail("%s: groups nested deeper than tidal writes them", sub.path);
        if (H5Literate(o, H5_INDEX_NAME, H5_ITER_INC, NULL, child_link, &sub) < 0) child_fail("cannot list %s", sub.path);
        if (H5Lexists(o, "tidal-absent", H5P_DEFAULT) < 0) child_fail("%s: a name lookup fails", sub.path);
    } else if (type == H5I_DATASET) {
        child_dataset(o, &sub);
    } else {
        child_fail("%s: neither a group nor a dataset", sub.path);
    }
    w->budget = sub.budget;
    H5Oclose(o);
    return 0;
}

/* The child: reads what tidal reads, prints "ok" and exits 0, or prints "error: ..." and exits
 * EXIT_DAMAGED; a crash or a loop is the parent's to see. */
static void check_child(const char *path)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) child_fail("libhdf5 cannot open it");
    attr_walk aw = {0};
    if (H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, NULL, child_attr, &aw) < 0) child_fail("cannot list the root attributes");
    if (H5Aexists(f, "tidal-absent") < 0) child_fail("a root attribute lookup fails");
    if (aw.tidal) {   /* another HDF5 file: the reader refuses it by its attributes, which were read safely */
        if (aw.odd) child_fail("root attribute %s has a type tidal does not write", aw.odd_name);
        obj_walk w = {"", 0, DATA_BUDGET};
        if (H5Literate(f, H5_INDEX_NAME, H5_ITER_INC, NULL, child_link, &w) < 0) child_fail("cannot list the root group");
        if (H5Lexists(f, "tidal-absent", H5P_DEFAULT) < 0) child_fail("a name lookup in the root group fails");
    }
    printf("ok\n");
    fflush(stdout);
    _exit(0);   /* no atexit handlers, no HDF5 shutdown: nothing of the parent's is flushed */
}

/* Runs before main in every program linked with libtidal's run-file code; does nothing unless
 * this process is a guard's child. */
__attribute__((constructor)) static void check_child_main(void)
{
    const char *path = getenv(CHILD_ENV);
    if (path && *path) check_child(path);
}

/* ---------------------------------------------------------------- 2. the parent's side */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The innermost libhdf5 (or tidal) frame of a sanitizer report, else the first frame past the
 * sanitizer's own, for the one-line reason. */
static void first_frame(const char *out, char *fn, size_t cap)
{
    fn[0] = 0;
    for (const char *p = strstr(out, "    #"); p; p = strstr(p + 1, "    #")) {
        const char *in = strstr(p, " in ");
        const char *eol = strchr(p, '\n');
        if (!in || (eol && in > eol)) continue;
        in += 4;
        size_t n = strcspn(in, " \n(");
        if (n == 0 || !strncmp(in, "__", 2)) continue;   /* the sanitizer's interceptors */
        int ours = !strncmp(in, "H5", 2) || !strncmp(in, "td", 2);
        if (!fn[0] || ours) snprintf(fn, cap, "%.*s", (int)(n < 100 ? n : 100), in);
        if (ours) return;
    }
}

/* Runs the child on path; returns 0 (read whole), 1 (refused: why) or -1 (no child could run). */
static int run_child(const char *path, int cpu_s, char *why, size_t cap)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return -1;
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = calloc(n_env + 4, sizeof *envp);
    char *child_env = malloc(strlen(path) + sizeof CHILD_ENV + 2);
    if (!envp || !child_env) { free(envp); free(child_env); close(p[0]); close(p[1]); return -1; }
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], CHILD_ENV "=", sizeof CHILD_ENV) && strncmp(environ[i], "OPENBLAS_NUM_THREADS=", 21))
            envp[k++] = environ[i];
    sprintf(child_env, "%s=%s", CHILD_ENV, path);
    envp[k++] = child_env;
    envp[k++] = "OPENBLAS_NUM_THREADS=1";   /* the child does no GEMM: do not start BLAS threads */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    char *argv[] = {"tidal-runfile-check", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    free(child_env);
    close(p[1]);
    if (rc) { close(p[0]); return -1; }
    /* CPU time, not wall time: a loop inside libhdf5 spins; a busy machine only slows a sound file */
    struct rlimit cpu = {(rlim_t)cpu_s, (rlim_t)cpu_s + 1}, core = {0, 0};
    prlimit(pid, RLIMIT_CPU, &cpu, NULL);
    prlimit(pid, RLIMIT_CORE, &core, NULL);
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TDG_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(TDG_ASAN)
    struct rlimit as = {(rlim_t)8 << 30, (rlim_t)8 << 30};   /* a claimed multi-GB allocation fails in the child */
    prlimit(pid, RLIMIT_AS, &as, NULL);
#endif
    char out[16384];
    size_t n_out = 0;
    double deadline = now_s() + 10.0 * cpu_s + 10;   /* a child stuck without spinning (it should not be) */
    int killed = 0;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) { kill(pid, SIGKILL); killed = 1; break; }
        struct pollfd pf = {p[0], POLLIN, 0};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char buf[4096];
        ssize_t got = read(p[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;   /* the child closed its end: it is exiting */
        size_t take = (size_t)got < sizeof out - 1 - n_out ? (size_t)got : sizeof out - 1 - n_out;
        memcpy(out + n_out, buf, take);
        n_out += take;
    }
    close(p[0]);
    out[n_out] = 0;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !killed) return 0;
    char fn[128];
    first_frame(out, fn, sizeof fn);
    const char *san = strstr(out, "ERROR: AddressSanitizer: ");
    const char *ub = strstr(out, "runtime error: ");
    const char *msg = strstr(out, "error: ");
    if (killed) {
        snprintf(why, cap, "%s: damaged run file (libhdf5 did not finish reading it in %.0f s)", path, 10.0 * cpu_s + 10);
    } else if (WIFSIGNALED(status) && (WTERMSIG(status) == SIGXCPU || WTERMSIG(status) == SIGKILL)) {
        snprintf(why, cap, "%s: damaged run file (libhdf5 did not finish reading it within %d s of CPU time: "
                 "a loop on damaged metadata)", path, cpu_s);
    } else if (WIFSIGNALED(status)) {
        snprintf(why, cap, "%s: damaged run file (libhdf5 crashed reading it: %s%s%s)", path, strsignal(WTERMSIG(status)),
                 fn[0] ? " in " : "", fn);
    } else if (san) {
        san += strlen("ERROR: AddressSanitizer: ");
        size_t n = strcspn(san, "\n(");   /* "heap-buffer-overflow on address ...", "SEGV on unknown address ..." */
        const char *on = strstr(san, " on ");
        if (on && (size_t)(on - san) < n) n = (size_t)(on - san);
        snprintf(why, cap, "%s: damaged run file (libhdf5 reading it: AddressSanitizer: %.*s%s%s)", path,
                 (int)(n < 80 ? n : 80), san, fn[0] ? " in " : "", fn);
    } else if (ub) {
        snprintf(why, cap, "%s: damaged run file (reading it: %.*s)", path, (int)strcspn(ub, "\n"), ub);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_DAMAGED && msg) {
        msg += strlen("error: ");
        snprintf(why, cap, "%s: damaged run file (%.*s)", path, (int)strcspn(msg, "\n"), msg);
    } else {
        snprintf(why, cap, "%s: damaged run file (the check of it exited with status %d)", path,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    return 1;
}

int tdg_check(const char *path, char *why, size_t cap)
{
    if (is_trusted(path)) return 0;
    if (check_superblock(path, why, cap) < 0) return -1;
    const char *e = getenv(LIMIT_ENV);
    int cpu_s = e && *e ? atoi(e) : 2;
    if (cpu_s <= 0) return 0;   /* TIDAL_RUNFILE_CHECK_SECONDS=0: no child (files you trust) */
    if (cpu_s > 600) cpu_s = 600;
    /* a file that a writer commits to while the child reads it can fail the read (HDF5 reads
     * metadata lazily: see td_runfile_stamp): read it again, as tidal's loaders do */
    for (int tries = 0;; tries++) {
        td_runfile_stamp s;
        td_runfile_stamp_take(path, &s);
        int rc = run_child(path, cpu_s, why, cap);
        if (rc < 0) return 0;   /* no child could be started (no /proc): the superblock check stands */
        if (rc == 0) return 0;
        if (tries >= 20 || !td_runfile_changed(path, &s)) return -1;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        if (check_superblock(path, why, cap) < 0) return -1;
    }
}
