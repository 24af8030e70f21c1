/* The commit driver: an HDF5 file driver (VFD) that makes each flush of a run file all or
 * nothing, so a failed write (ENOSPC, EIO, a quota) or a SIGKILL at any instant leaves the file
 * as its last commit made it. reports/SCHEMA.md ("Crash and storage-fault safety") says why this
 * and not SWMR.
 *
 * Run files never reuse freed space (file space strategy NONE), so HDF5 writes in two kinds:
 *   - appends at or past the end of allocation (EOA) of the last commit: new chunks, new
 *     metadata. Nothing the committed file refers to lives there, so they go straight to disk.
 *   - overwrites below it: object headers, chunk B-tree nodes, the superblock. These are held in
 *     memory (reads see them) until the commit.
 * A commit (tdc_commit, after H5Fflush) fsyncs the appends, writes the held overwrites to
 * PATH.journal with a checksum and fsyncs it, applies them to the file, fsyncs, and deletes the
 * journal. Killed before the journal is whole: the file was never touched (the checksum fails, the
 * journal is dropped). Killed after: the next open rolls the journal forward (idempotent). A write
 * that fails while applying is undone from the old bytes kept in memory.
 *
 * The driver never returns a write error to HDF5: a failed write is recorded in tdc_status, the
 * bytes are kept in memory so HDF5's view stays whole, and nothing more reaches the file. The
 * writer asks the status after each flush and close.
 *
 * A writer holds an OFD write lock on the file (not flock, which HDF5's readers use, so h5py and
 * tidal-report can read a file that is being written: they see its last commit). */
#include "commit.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { tdc_status *st; int deferred; } tdc_fapl_info;

typedef struct { haddr_t addr; size_t len; unsigned char *data; int rank; } held_write;

typedef struct {
    H5FD_t pub;              /* HDF5's part; must be first */
    int fd;
    int writable;
    char *path;
    dev_t dev;
    ino_t ino;
    haddr_t eoa, eof;        /* eof: the file's size as HDF5 sees it (held writes included) */
    haddr_t committed;       /* EOA of the last commit: below it, writes are held until the next */
    held_write *held;
    size_t n_held, cap_held;
    size_t held_bytes;
    int truncate_due;        /* HDF5 asked for the size to become EOA: done at the commit */
    tdc_status *st;
    tdc_status own;          /* when the caller gave none */
} tdc_file;

static const char JMAGIC[8] = {'T', 'D', 'J', 'R', 'N', 'L', '0', '1'};
static const char JEND[8] = {'T', 'D', 'J', 'E', 'N', 'D', '0', '1'};
#define JHEADER 40   /* magic, dev, ino, records, size after (UINT64_MAX: unchanged) */
#define JTRAILER 16  /* FNV-1a 64 of everything before it, end magic */
#define MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)

static hid_t tdc_driver_id = -1;

/* ---------------------------------------------------------------- small helpers */

void tdc_journal_path(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s.journal", path);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

static void fail(tdc_file *f, int e, const char *fmt, const char *arg)
{
    if (f->st->err) return;
    f->st->err = e ? e : EIO;
    snprintf(f->st->what, sizeof f->st->what, fmt, arg);
}

static int write_all(int fd, const void *buf, size_t n, off_t off)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = off >= 0 ? pwrite(fd, p, n, off) : write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { if (w == 0) errno = ENOSPC; return -1; }
        p += w; n -= (size_t)w;
        if (off >= 0) off += w;
    }
    return 0;
}

/* Reads what the file holds at [off, off+n); past its end, zeros. */
static int read_all(int fd, void *buf, size_t n, off_t off)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) { memset(p, 0, n); return 0; }
        p += r; n -= (size_t)r; off += r;
    }
    return 0;
}

static int fsync_dir(const char *path)
{
    char *copy = strdup(path);
    int d = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (d < 0) return 0;   /* nothing to sync through (odd mounts): the file's fsync stands */
    int rc = fsync(d);
    close(d);
    return rc < 0 && errno != EINVAL ? -1 : 0;
}

/* -1 when another open file description holds the lock; a file system without OFD locks (some
 * FUSE and network mounts) goes unlocked rather than unwritable. */
static int lock_file(int fd)
{
    struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_OFD_SETLK, &l) == 0) return 0;
    return errno == EAGAIN || errno == EACCES ? -1 : 0;
}

static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* ---------------------------------------------------------------- recovery */

/* Rolls PATH.journal forward onto the file open (and locked) as fd, or drops it when it is not
 * whole or belongs to another file (the one this path named before a rename replaced it). */
static int recover_fd(int fd, const char *path, char *why, size_t why_cap)
{
    char jpath[4200];
    tdc_journal_path(path, jpath, sizeof jpath);
    int j = open(jpath, O_RDONLY | O_CLOEXEC);
    if (j < 0) return 0;
    struct stat js, fs;
    unsigned char *buf = NULL;
    int whole = 0, rc = 0;
    if (fstat(j, &js) == 0 && fstat(fd, &fs) == 0 && js.st_size >= JHEADER + JTRAILER && js.st_size < ((off_t)1 << 32)) {
        size_t n = (size_t)js.st_size;
        buf = malloc(n);
        if (buf && read_all(j, buf, n, 0) == 0 && !memcmp(buf, JMAGIC, 8) && !memcmp(buf + n - 8, JEND, 8) &&
            fnv1a(14695981039346656037ull, buf, n - JTRAILER) == get64(buf + n - JTRAILER) &&
            get64(buf + 8) == (uint64_t)fs.st_dev && get64(buf + 16) == (uint64_t)fs.st_ino) {
            uint64_t nrec = get64(buf + 24), size_after = get64(buf + 32);
            size_t at = JHEADER;
            whole = 1;
            for (uint64_t r = 0; r < nrec && whole; r++) {   /* bounds first, then apply */
                if (at + 16 > n - JTRAILER) { whole = 0; break; }
                uint64_t len = get64(buf + at + 8);
                if (len > n - JTRAILER - at - 16) whole = 0;
                at += 16 + (size_t)len;
            }
            at = JHEADER;
            for (uint64_t r = 0; r < nrec && whole && rc == 0; r++) {
                uint64_t addr = get64(buf + at), len = get64(buf + at + 8);
                if (write_all(fd, buf + at + 16, (size_t)len, (off_t)addr)) rc = -1;
                at += 16 + (size_t)len;
            }
            if (whole && rc == 0 && size_after != UINT64_MAX && ftruncate(fd, (off_t)size_after)) rc = -1;
            if (whole && rc == 0 && fdatasync(fd)) rc = -1;
            if (rc) snprintf(why, why_cap, "%s: finishing the commit that %s holds failed: %s (make room and open it again)",
                             path, jpath, strerror(errno));
        }
    }
    free(buf);
    close(j);
    if (rc == 0) unlink(jpath);   /* applied, or never whole (then the file was not touched) */
    (void)whole;
    return rc;
}

int tdc_recover(const char *path, char *why, size_t why_cap)
{
    char jpath[4200];
    tdc_journal_path(path, jpath, sizeof jpath);
    if (access(jpath, F_OK) != 0) return 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_cap, "%s: a commit was cut short (%s is there) and the file cannot be opened for writing "
                 "to finish it: %s", path, jpath, strerror(errno));
        return -1;
    }
    if (lock_file(fd)) { close(fd); return 1; }   /* its writer is alive and will finish it */
    int rc = recover_fd(fd, path, why, why_cap);
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------- held writes */

/* The order a commit applies held writes in, by what they are: raw data and heaps, then the
 * B-tree nodes that point into them, then the object headers (dataset extents) that the reader
 * starts from; the superblock (a larger EOA only) first. A reader of a file whose writer was
 * killed between two of these writes then sees the old extents over data that is a superset of
 * the old. (HDF5's metadata accumulator, which merges writes of every kind, is off: drv_query.) */
static int apply_rank(H5FD_mem_t type)
{
    switch (type) {
    case H5FD_MEM_SUPER: return 0;
    case H5FD_MEM_DRAW:  return 1;
    case H5FD_MEM_GHEAP: return 2;
    case H5FD_MEM_LHEAP: return 3;
    case H5FD_MEM_BTREE: return 4;
    case H5FD_MEM_OHDR:  return 5;
    default:             return 6;
    }
}

static void hold(tdc_file *f, haddr_t addr, size_t len, const void *data, int rank)
{
    if (!len) return;
    if (f->n_held == f->cap_held) {
        f->cap_held = f->cap_held ? 2 * f->cap_held : 64;
        held_write *h = realloc(f->held, f->cap_held * sizeof *h);
        if (!h) { fprintf(stderr, "tidal: out of memory holding a write of %s\n", f->path); exit(2); }
        f->held = h;
    }
    unsigned char *copy = malloc(len);
    if (!copy) { fprintf(stderr, "tidal: out of memory holding a write of %s\n", f->path); exit(2); }
    memcpy(copy, data, len);
    f->held[f->n_held++] = (held_write){addr, len, copy, rank};
    f->held_bytes += len;
}

static void drop_held(tdc_file *f)
{
    for (size_t i = 0; i < f->n_held; i++) free(f->held[i].data);
    f->n_held = 0;
    f->held_bytes = 0;
}

/* A new file holds everything until its first commit; one that grows past this before it has
 * committed once (a merge, written whole and renamed) spills to disk and writes through: until
 * that first commit there is nothing on disk to keep. */
#define SPILL_BYTES ((size_t)32 << 20)

static void spill(tdc_file *f)
{
    for (size_t i = 0; i < f->n_held && !f->st->err; i++)
        if (write_all(f->fd, f->held[i].data, f->held[i].len, (off_t)f->held[i].addr)) fail(f, errno, "write%s", "");
    if (f->st->err) return;   /* kept in memory, as after any failed write */
    drop_held(f);
    f->committed = 0;
}

/* Puts the held writes in apply order (stable by apply_rank), unless two of different ranks
 * overlap: then the order they were made in decides the bytes, and it stays. */
static void order_held(tdc_file *f)
{
    for (size_t i = 0; i < f->n_held; i++)
        for (size_t j = i + 1; j < f->n_held; j++) {
            const held_write *a = &f->held[i], *b = &f->held[j];
            if (a->rank != b->rank && a->addr < b->addr + b->len && b->addr < a->addr + a->len) return;
        }
    /* a new file's first commit writes the superblock last: until then it is no HDF5 file at all */
    if (f->committed == MAXADDR)
        for (size_t i = 0; i < f->n_held; i++)
            if (f->held[i].rank == 0) f->held[i].rank = 7;
    for (size_t i = 1; i < f->n_held; i++)   /* insertion sort: stable, and n is small */
        for (size_t j = i; j > 0 && f->held[j - 1].rank > f->held[j].rank; j--) {
            held_write t = f->held[j];
            f->held[j] = f->held[j - 1];
            f->held[j - 1] = t;
        }
}

/* The commit: see the top of the file. Returns 0, or -1 with the status set. */
static int commit_file(tdc_file *f)
{
    if (!f->writable) return 0;
    if (f->st->err) return -1;
    if (!f->n_held && !f->truncate_due) {
        if (fdatasync(f->fd)) { fail(f, errno, "fsync%s", ""); return -1; }
        f->committed = f->eoa;
        return 0;
    }
    if (fdatasync(f->fd)) { fail(f, errno, "fsync%s", ""); return -1; }
    order_held(f);
    /* the journal: header, records, checksum */
    size_t n = JHEADER + JTRAILER;
    for (size_t i = 0; i < f->n_held; i++) n += 16 + f->held[i].len;
    unsigned char *buf = malloc(n);
    if (!buf) { fprintf(stderr, "tidal: out of memory committing %s\n", f->path); exit(2); }
    memcpy(buf, JMAGIC, 8);
    put64(buf + 8, (uint64_t)f->dev);
    put64(buf + 16, (uint64_t)f->ino);
    put64(buf + 24, (uint64_t)f->n_held);
    put64(buf + 32, f->truncate_due ? (uint64_t)f->eoa : UINT64_MAX);
    size_t at = JHEADER;
    for (size_t i = 0; i < f->n_held; i++) {
        put64(buf + at, (uint64_t)f->held[i].addr);
        put64(buf + at + 8, (uint64_t)f->held[i].len);
        memcpy(buf + at + 16, f->held[i].data, f->held[i].len);
        at += 16 + f->held[i].len;
    }
    put64(buf + at, fnv1a(14695981039346656037ull, buf, at));
    memcpy(buf + at + 8, JEND, 8);
    char jpath[4200];
    tdc_journal_path(f->path, jpath, sizeof jpath);
    int j = open(jpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int ok = j >= 0 && write_all(j, buf, n, -1) == 0 && fsync(j) == 0;
    int e = errno;
    if (j >= 0 && close(j) != 0 && ok) { ok = 0; e = errno; }
    ok = ok && fsync_dir(jpath) == 0;
    free(buf);
    if (!ok) {
        if (!e) e = errno;
        unlink(jpath);   /* not whole: the file itself was not touched */
        fail(f, e, "write of %.1100s", jpath);
        return -1;
    }
    /* apply, keeping the old bytes to undo a write that fails */
    struct stat s0;
    off_t size0 = fstat(f->fd, &s0) == 0 ? s0.st_size : -1;
    size_t n_old = f->n_held;   /* drop_held below empties f->held: free by this count */
    unsigned char **old = calloc(n_old, sizeof *old);
    int rc = n_old && !old ? -1 : 0;
    size_t done = 0;
    /* a superblock whose EOA is past the file's end makes HDF5 call the file truncated: grow it
     * (sparse) before; a shrink waits for the end */
    if (size0 >= 0 && (off_t)f->eoa > size0 && ftruncate(f->fd, (off_t)f->eoa)) rc = -1;
    for (; done < f->n_held && rc == 0; done++) {
        held_write *h = &f->held[done];
        old[done] = malloc(h->len);
        if (!old[done] || read_all(f->fd, old[done], h->len, (off_t)h->addr) ||
            write_all(f->fd, h->data, h->len, (off_t)h->addr)) rc = -1;
    }
    if (rc == 0 && f->truncate_due && (off_t)f->eoa < size0 && ftruncate(f->fd, (off_t)f->eoa)) rc = -1;
    if (rc == 0 && fdatasync(f->fd)) rc = -1;
    if (rc) {
        fail(f, errno, "write%s", "");
        int undone = size0 >= 0;
        for (size_t i = done; i-- > 0;)
            if (old[i] && write_all(f->fd, old[i], f->held[i].len, (off_t)f->held[i].addr)) undone = 0;
        if (undone && (ftruncate(f->fd, size0) || fdatasync(f->fd))) undone = 0;
        if (undone) unlink(jpath);
        else f->st->journal_left = 1;   /* rolled forward by the next open */
    } else {
        unlink(jpath);
        fsync_dir(jpath);
        drop_held(f);
        f->truncate_due = 0;
        f->committed = f->eoa;
    }
    for (size_t i = 0; old && i < n_old; i++) free(old[i]);
    free(old);
    return rc;
}

int tdc_commit(hid_t file)
{
    void *h = NULL;
    if (H5Fget_vfd_handle(file, H5P_DEFAULT, &h) < 0 || !h) return -1;
    return commit_file((tdc_file *)h);
}

/* ---------------------------------------------------------------- the driver's callbacks */

static H5FD_t *drv_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr)
{
    (void)maxaddr;
    const tdc_fapl_info *info = H5Pget_driver_info(fapl);
    tdc_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->st = info && info->st ? info->st : &f->own;
    f->writable = (flags & H5F_ACC_RDWR) != 0;
    int o = f->writable ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_CREAT) o |= O_CREAT;
    if (flags & H5F_ACC_EXCL) o |= O_EXCL;
    f->fd = open(name, o | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        /* HDF5 first tries without creating: a missing file is no failure then */
        if (errno != ENOENT || (flags & H5F_ACC_CREAT)) fail(f, errno, "open%s", "");
        free(f);
        return NULL;
    }
    char why[512];
    if (f->writable && lock_file(f->fd)) {
        f->st->locked = 1;
        close(f->fd);
        free(f);
        return NULL;
    }
    struct stat s;
    if (f->writable && (flags & H5F_ACC_TRUNC)) {
        char jpath[4200];
        tdc_journal_path(name, jpath, sizeof jpath);
        unlink(jpath);   /* the old file's: it would not apply (another inode) but is clutter */
        if (ftruncate(f->fd, 0)) { fail(f, errno, "truncate%s", ""); close(f->fd); free(f); return NULL; }
    } else if (f->writable && recover_fd(f->fd, name, why, sizeof why)) {
        f->st->err = errno ? errno : EIO;
        snprintf(f->st->what, sizeof f->st->what, "recovery of %.80s", name);
        close(f->fd);
        free(f);
        return NULL;
    }
    if (fstat(f->fd, &s)) { close(f->fd); free(f); return NULL; }
    f->dev = s.st_dev;
    f->ino = s.st_ino;
    f->eof = (haddr_t)s.st_size;
    f->committed = (info && info->deferred && s.st_size == 0) ? MAXADDR : (haddr_t)s.st_size;
    f->path = strdup(name);
    return &f->pub;
}

static herr_t drv_close(H5FD_t *file)
{
    tdc_file *f = (tdc_file *)file;
    if (f->writable && !f->st->err) commit_file(f);
    drop_held(f);
    free(f->held);
    close(f->fd);
    free(f->path);
    free(f);
    return 0;
}

static int drv_cmp(const H5FD_t *a, const H5FD_t *b)
{
    const tdc_file *x = (const tdc_file *)a, *y = (const tdc_file *)b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return 0;
}

static herr_t drv_query(const H5FD_t *file, unsigned long *flags)
{
    (void)file;
    /* as sec2 does, so files are laid out the same, but without the metadata accumulator: each
     * metadata write comes with its kind, which orders a commit's writes (apply_rank) */
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA |
             H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
    return 0;
}

static haddr_t drv_get_eoa(const H5FD_t *file, H5FD_mem_t type) { (void)type; return ((const tdc_file *)file)->eoa; }
static herr_t drv_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) { (void)type; ((tdc_file *)file)->eoa = addr; return 0; }
static haddr_t drv_get_eof(const H5FD_t *file, H5FD_mem_t type) { (void)type; return ((const tdc_file *)file)->eof; }

static herr_t drv_get_handle(H5FD_t *file, hid_t fapl, void **handle)
{
    (void)fapl;
    *handle = file;
    return 0;
}

static herr_t drv_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf)
{
    (void)type; (void)dxpl;
    tdc_file *f = (tdc_file *)file;
    if (addr == HADDR_UNDEF || addr > MAXADDR || size > MAXADDR - addr) return -1;
    if (read_all(f->fd, buf, size, (off_t)addr)) return -1;
    for (size_t i = 0; i < f->n_held; i++) {   /* later writes over earlier ones */
        const held_write *h = &f->held[i];
        haddr_t lo = addr > h->addr ? addr : h->addr;
        haddr_t hi = addr + size < h->addr + h->len ? addr + size : h->addr + h->len;
        if (lo < hi) memcpy((unsigned char *)buf + (lo - addr), h->data + (lo - h->addr), hi - lo);
    }
    return 0;
}

static herr_t drv_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf)
{
    (void)dxpl;
    tdc_file *f = (tdc_file *)file;
    if (addr == HADDR_UNDEF || addr > MAXADDR || size > MAXADDR - addr || !f->writable) return -1;
    if (addr + size > f->eof) f->eof = addr + size;
    int rank = apply_rank(type);
    if (f->st->err) { hold(f, addr, size, buf, rank); return 0; }   /* nothing more reaches the file */
    size_t below = addr < f->committed ? (size < f->committed - addr ? size : (size_t)(f->committed - addr)) : 0;
    hold(f, addr, below, buf, rank);
    if (f->committed == MAXADDR && f->held_bytes > SPILL_BYTES) spill(f);
    if (size > below && write_all(f->fd, (const unsigned char *)buf + below, size - below, (off_t)(addr + below))) {
        fail(f, errno, "write%s", "");
        hold(f, addr + below, size - below, (const unsigned char *)buf + below, rank);
    }
    return 0;
}

static herr_t drv_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing)
{
    (void)dxpl; (void)closing;
    tdc_file *f = (tdc_file *)file;
    if (f->writable && f->eoa != f->eof) f->truncate_due = 1;
    f->eof = f->eoa;
    return 0;
}

static herr_t drv_lock(H5FD_t *file, hbool_t rw) { (void)file; (void)rw; return 0; }   /* the OFD lock of drv_open */
static herr_t drv_unlock(H5FD_t *file) { (void)file; return 0; }

static const H5FD_class_t tdc_class = {
    "tidal-commit", MAXADDR, H5F_CLOSE_WEAK,
    NULL,                                   /* terminate */
    NULL, NULL, NULL,                       /* no driver info in the superblock: h5py reads the files as sec2's */
    sizeof(tdc_fapl_info), NULL, NULL, NULL,
    0, NULL, NULL,
    drv_open, drv_close, drv_cmp, drv_query, NULL,
    NULL, NULL,                             /* alloc, free: HDF5's own */
    drv_get_eoa, drv_set_eoa, drv_get_eof, drv_get_handle,
    drv_read, drv_write,
    NULL,                                   /* flush: tdc_commit, called by the writer */
    drv_truncate, drv_lock, drv_unlock,
    H5FD_FLMAP_DICHOTOMY
};

hid_t tdc_fapl(tdc_status *st, int deferred)
{
    if (tdc_driver_id < 0 || H5Iis_valid(tdc_driver_id) <= 0) tdc_driver_id = H5FDregister(&tdc_class);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    tdc_fapl_info info = {st, deferred};
    H5Pset_driver(fapl, tdc_driver_id, &info);
    return fapl;
}
