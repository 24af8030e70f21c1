/* HDF5 run files (see include/tidal/runfile.h). HDF5's own error printing is switched off;
 * every failure becomes a td_error naming the file and the dataset. */
#include "tidal/runfile.h"
#include "tidal/runschema.h"
#include "commit.h"
#include "guard.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A reader's committed rows (see committed_cut): the groups it bounds. */
enum { CUT_SEQS, CUT_TOKENS, CUT_PROMPTS, CUT_TEXT, CUT_LAYERS, CUT_STEPS, CUT_PROGRESS, CUT_COUNT };
static const char *const CUT_GROUP[CUT_COUNT] = {"/seqs", "/tokens", "/prompts", "/text", "/layers", "/steps", "/progress"};

struct td_runfile {
    hid_t file;
    int writable;
    char path[1024];
    tdc_status st;     /* the commit driver's verdict on every write (writable files) */
    int64_t cut[CUT_COUNT];   /* read-only: rows of each group one commit holds; -1: no bound */
};

static int64_t committed_rows(const td_runfile *rf, const char *path, int64_t rows);
static void committed_cut(td_runfile *rf);

static const hsize_t CHUNK_ROWS = 16384;

static hid_t h5type(td_coltype t)
{
    switch (t) {
    case TD_COL_I8:  return H5T_NATIVE_INT8;
    case TD_COL_U8:  return H5T_NATIVE_UINT8;
    case TD_COL_I32: return H5T_NATIVE_INT32;
    case TD_COL_I64: return H5T_NATIVE_INT64;
    case TD_COL_F32: return H5T_NATIVE_FLOAT;
    default:         return H5T_NATIVE_DOUBLE;
    }
}

/* Stored (file) types are little-endian standard types, so files read the same everywhere. */
static hid_t h5file_type(td_coltype t)
{
    switch (t) {
    case TD_COL_I8:  return H5T_STD_I8LE;
    case TD_COL_U8:  return H5T_STD_U8LE;
    case TD_COL_I32: return H5T_STD_I32LE;
    case TD_COL_I64: return H5T_STD_I64LE;
    case TD_COL_F32: return H5T_IEEE_F32LE;
    default:         return H5T_IEEE_F64LE;
    }
}

static void quiet_hdf5(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* The file format tidal writes (issue 42): superblock v2 and version-2 object headers, the
 * HDF5 1.8 format, whose metadata carries checksums (superblock, object headers, and so every
 * attribute, dataspace, datatype and link message; the fractal heaps and v2 B-trees of dense
 * attribute storage), so libhdf5 refuses a damaged header instead of walking it. Not the 1.10
 * format (superblock v3): a v3 file opened for writing carries a status flag that makes every
 * other reader (h5py included) refuse it while it is written, and for good after a kill, until
 * h5clear. Chunk indexes stay version-1 B-trees (no checksum) in this format: the guard's child
 * reads them (src/record/guard.c). */
static void set_format(hid_t fapl)
{
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
}

td_runfile *td_runfile_create(const char *path, int overwrite, td_error *err)
{
    quiet_hdf5();
    if (!overwrite && access(path, F_OK) == 0) {
        td_fail(err, "%s: already exists; not replacing it (use --resume to continue it, or --force to replace it)", path);
        return NULL;
    }
    /* Crash consistency: a compressed chunk that grows moves to new space and its old space is
     * freed; with HDF5's default strategy another chunk written before the next flush can reuse
     * that space, while the index on disk (last flush) still points there, so a SIGKILL in that
     * window left completed rows undecodable ("inflate() failed"; test_interrupt's stress).
     * With no free-space reuse, bytes that the flushed index points to are never overwritten.
     * The price: every commit leaves the old copies of the datasets' last chunks behind as dead
     * space; td_runfile_compact reclaims it when a run is complete. */
    td_runfile *rf = calloc(1, sizeof *rf);
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_file_space_strategy(fcpl, H5F_FSPACE_STRATEGY_NONE, 0, 0);
    /* deferred: nothing reaches the disk before the first commit, so a run that fails earlier
     * leaves an empty file rather than a torn one */
    hid_t fapl = tdc_fapl(&rf->st, 1);
    set_format(fapl);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    H5Pclose(fapl);
    H5Pclose(fcpl);
    if (f < 0) {
        if (rf->st.locked)
            td_fail(err, "%s: another process is writing this file", path);
        else if (rf->st.err)
            td_fail(err, "%s: cannot create the HDF5 file: %s failed: %s", path, rf->st.what, strerror(rf->st.err));
        else
            td_fail(err, "%s: cannot create the HDF5 file (is the directory there and writable?)", path);
        free(rf);
        return NULL;
    }
    rf->file = f;
    rf->writable = 1;
    snprintf(rf->path, sizeof rf->path, "%s", path);
    if (td_runfile_set_i64(rf, "schema_version", TD_SCHEMA_VERSION, err) ||
        td_runfile_set_str(rf, "tool_version", TD_VERSION, err) ||
        td_runfile_set_str(rf, "format", "tidal-run", err)) {
        td_runfile_close(rf, NULL);
        return NULL;
    }
    return rf;
}

td_runfile *td_runfile_open(const char *path, int writable, td_error *err)
{
    quiet_hdf5();
    if (access(path, F_OK) != 0) { td_fail(err, "%s: no such file", path); return NULL; }
    /* a writer killed inside a commit left PATH.journal: finish it first (a writer's open does it
     * under its lock; a reader does it when no writer holds the file) */
    char why[1200];
    if (tdc_recover(path, why, sizeof why) < 0) { td_fail(err, "%s", why); return NULL; }
    /* a damaged file is refused here, before libhdf5 reads it in this process (guard.c) */
    if (tdg_check(path, why, sizeof why)) { td_fail(err, "%s", why); return NULL; }
    if (H5Fis_hdf5(path) <= 0) { td_fail(err, "%s: not an HDF5 file (or truncated)", path); return NULL; }
    td_runfile *rf = calloc(1, sizeof *rf);
    for (int g = 0; g < CUT_COUNT; g++) rf->cut[g] = -1;
    hid_t fapl = writable ? tdc_fapl(&rf->st, 0) : H5P_DEFAULT;
    hid_t f = H5Fopen(path, writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
    /* a reader that comes while the writer applies a commit (PATH.journal is there) may find the
     * file between two of its writes: open it again a little later (a commit's apply takes
     * milliseconds) */
    char jpath[1100];
    tdc_journal_path(path, jpath, sizeof jpath);
    for (int tries = 0; !writable && f < 0 && tries < 50 && access(jpath, F_OK) == 0; tries++) {
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    if (writable) H5Pclose(fapl);
    if (f < 0) {
        if (rf->st.locked)
            td_fail(err, "%s: another process is writing this file", path);
        else if (rf->st.err)
            td_fail(err, "%s: %s failed: %s", path, rf->st.what, strerror(rf->st.err));
        else
            td_fail(err, "%s: cannot open the HDF5 file%s", path, writable ? " for writing" : "");
        free(rf);
        return NULL;
    }
    rf->file = f;
    rf->writable = writable;
    snprintf(rf->path, sizeof rf->path, "%s", path);
    char *fmt = td_runfile_get_str(rf, "format", NULL);
    int64_t ver = -1;
    int bad = !fmt || strcmp(fmt, "tidal-run") != 0;
    free(fmt);
    if (bad) {
        td_fail(err, "%s: not a tidal run file (no format=\"tidal-run\" attribute)", path);
        td_runfile_close(rf, NULL);
        return NULL;
    }
    if (td_runfile_get_i64(rf, "schema_version", &ver, NULL) || ver < 1 || ver > TD_SCHEMA_VERSION) {
        td_fail(err, "%s: schema version %lld is not one this tidal reads (1..%d)", path, (long long)ver, TD_SCHEMA_VERSION);
        td_runfile_close(rf, NULL);
        return NULL;
    }
    if (!writable) committed_cut(rf);
    return rf;
}

const char *td_runfile_path(const td_runfile *rf) { return rf->path; }

/* A failed write as the user reads it: the file, the call, the errno, and what the file holds. */
static int storage_fail(const char *path, const tdc_status *st, td_error *err)
{
    char jpath[1100];
    tdc_journal_path(path, jpath, sizeof jpath);
    if (st->journal_left)
        return td_fail(err, "%s: %s failed: %s; the last commit is in %s and the next open finishes it (make room first)",
                       path, st->what, strerror(st->err), jpath);
    return td_fail(err, "%s: %s failed: %s; the file holds everything committed before it", path, st->what, strerror(st->err));
}

int td_runfile_failed(const td_runfile *rf) { return rf->st.err != 0; }

int td_runfile_flush(td_runfile *rf, td_error *err)
{
    if (rf->st.err) return storage_fail(rf->path, &rf->st, err);
    if (H5Fflush(rf->file, H5F_SCOPE_GLOBAL) < 0) {
        if (rf->st.err) return storage_fail(rf->path, &rf->st, err);
        return td_fail(err, "%s: flush failed", rf->path);
    }
    if (rf->writable && tdc_commit(rf->file)) return storage_fail(rf->path, &rf->st, err);
    if (rf->writable) tdg_trust(rf->path);   /* what this process wrote: no guard on its next open */
    return 0;
}

int td_runfile_close(td_runfile *rf, td_error *err)
{
    if (!rf) return 0;
    int rc = 0;
    /* the driver commits what the close wrote; after a failed write it drops it */
    if (H5Fclose(rf->file) < 0 && !rf->st.err) rc = td_fail(err, "%s: close failed", rf->path);
    if (rf->st.err) rc = storage_fail(rf->path, &rf->st, err);
    if (rf->writable && !rc) tdg_trust(rf->path);
    free(rf);
    return rc;
}

/* ---------------------------------------------------------------- attributes */

static int set_attr(td_runfile *rf, const char *name, hid_t type, const void *v, td_error *err)
{
    if (H5Aexists(rf->file, name) > 0) H5Adelete(rf->file, name);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(rf->file, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = (a < 0 || H5Awrite(a, type, v) < 0) ? td_fail(err, "%s: cannot write attribute %s", rf->path, name) : 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

/* Variable-length UTF-8, as h5py writes strings: h5py reads those back as str, while a
 * fixed-length string attribute comes back as numpy bytes (b'...') in user scripts. */
int td_runfile_set_str(td_runfile *rf, const char *name, const char *value, td_error *err)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    int rc = set_attr(rf, name, t, &value, err);
    H5Tclose(t);
    return rc;
}

int td_runfile_set_i64(td_runfile *rf, const char *name, int64_t value, td_error *err)
{
    return set_attr(rf, name, H5T_NATIVE_INT64, &value, err);
}

int td_runfile_set_f64(td_runfile *rf, const char *name, double value, td_error *err)
{
    return set_attr(rf, name, H5T_NATIVE_DOUBLE, &value, err);
}

char *td_runfile_get_str(td_runfile *rf, const char *name, td_error *err)
{
    if (H5Aexists(rf->file, name) <= 0) { td_fail(err, "%s: no attribute %s", rf->path, name); return NULL; }
    hid_t a = H5Aopen(rf->file, name, H5P_DEFAULT);
    hid_t ft = H5Aget_type(a);
    char *out = NULL;
    /* HDF5 converts strings only between equal character sets: read in the file's (ASCII or
     * UTF-8; tidal writes UTF-8, h5py writes either) */
    H5T_cset_t cset = H5Tget_class(ft) == H5T_STRING ? H5Tget_cset(ft) : H5T_CSET_ASCII;
    if (H5Tget_class(ft) == H5T_STRING && !H5Tis_variable_str(ft)) {
        size_t n = H5Tget_size(ft);
        if (n < ((size_t)1 << 26)) {
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, n + 1);
            H5Tset_cset(mt, cset);
            out = calloc(1, n + 2);
            if (H5Aread(a, mt, out) < 0) { free(out); out = NULL; }
            H5Tclose(mt);
        }
    } else if (H5Tget_class(ft) == H5T_STRING) {       /* variable-length (h5py's default) */
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, cset);
        char *p = NULL;
        if (H5Aread(a, mt, &p) >= 0 && p) { out = strdup(p); H5free_memory(p); }
        H5Tclose(mt);
    }
    H5Tclose(ft);
    H5Aclose(a);
    if (!out) td_fail(err, "%s: attribute %s is not a readable string", rf->path, name);
    return out;
}

int td_runfile_get_i64(td_runfile *rf, const char *name, int64_t *value, td_error *err)
{
    if (H5Aexists(rf->file, name) <= 0) return td_fail(err, "%s: no attribute %s", rf->path, name);
    hid_t a = H5Aopen(rf->file, name, H5P_DEFAULT);
    hid_t ft = H5Aget_type(a);
    int ok = H5Tget_class(ft) == H5T_INTEGER && H5Aread(a, H5T_NATIVE_INT64, value) >= 0;
    H5Tclose(ft);
    H5Aclose(a);
    return ok ? 0 : td_fail(err, "%s: attribute %s is not an integer", rf->path, name);
}

int td_runfile_get_f64(td_runfile *rf, const char *name, double *value, td_error *err)
{
    if (H5Aexists(rf->file, name) <= 0) return td_fail(err, "%s: no attribute %s", rf->path, name);
    hid_t a = H5Aopen(rf->file, name, H5P_DEFAULT);
    hid_t ft = H5Aget_type(a);
    int ok = H5Tget_class(ft) == H5T_FLOAT && H5Aread(a, H5T_NATIVE_DOUBLE, value) >= 0;
    H5Tclose(ft);
    H5Aclose(a);
    return ok ? 0 : td_fail(err, "%s: attribute %s is not a floating-point number", rf->path, name);
}

/* ---------------------------------------------------------------- datasets */

/* H5Lexists on "/a/b/c" fails if "/a/b" is missing, so walk the path. */
int td_runfile_exists(td_runfile *rf, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (H5Lexists(rf->file, buf, H5P_DEFAULT) <= 0) return 0;
            if (!c) return 1;
            *p = c;
        }
    }
}

static int ensure_groups(td_runfile *rf, const char *path, td_error *err)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (H5Lexists(rf->file, buf, H5P_DEFAULT) <= 0) {
            hid_t g = H5Gcreate2(rf->file, buf, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (g < 0) return td_fail(err, "%s: cannot create group %s", rf->path, buf);
            H5Gclose(g);
        }
        *p = '/';
    }
    return 0;
}

/* A new dataset's chunk rows, from the rows of its first append: 16 appends' worth (a power of two),
 * at least 64 and at most CHUNK_ROWS (CHUNK_ROWS / width for a row of width values). HDF5 deflates
 * a chunk whole, the rows not yet written included, and every commit rewrites the last chunk of each
 * dataset it extended: with 16384-row chunks a run that appends a row per step (tidal-rl's and
 * tidal-sft's /steps, ~110 columns) deflated 110 x 128 KB each step, 10 % of an MoE GRPO step on
 * the CPU, for a few hundred bytes of data. */
static hsize_t chunk_rows(size_t width, size_t first_rows)
{
    hsize_t most = width > 1 ? (CHUNK_ROWS / width > 64 ? CHUNK_ROWS / width : 64) : CHUNK_ROWS, c = 64;
    while (c < most && c < 16 * (hsize_t)first_rows) c *= 2;
    return c < most ? c : most;
}

static hid_t create_dataset(td_runfile *rf, const char *path, td_coltype type, size_t width, size_t first_rows,
                            td_error *err)
{
    if (ensure_groups(rf, path, err)) return -1;
    int rank = width > 1 ? 2 : 1;
    hsize_t dims[2] = {0, width}, maxdims[2] = {H5S_UNLIMITED, width};
    hsize_t chunk[2] = {chunk_rows(width, first_rows), width};
    hid_t sp = H5Screate_simple(rank, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, rank, chunk);
    H5Pset_shuffle(dcpl);
    H5Pset_deflate(dcpl, 4);
    hid_t d = H5Dcreate2(rf->file, path, h5file_type(type), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(sp);
    if (d < 0) td_fail(err, "%s: cannot create dataset %s", rf->path, path);
    return d;
}

/* Whether the rows a dataset claims are held by its storage. HDF5 happily reports any extent
 * for a chunked dataset (unwritten chunks read as the fill value), so a corrupt or hostile file
 * can claim 2^60 rows in a few KB, and a reader that sizes a buffer by the claim would allocate
 * that. tidal writes every row it extends by; deflate inflates at most 1032:1 and shuffle not
 * at all, so the logical bytes can never exceed 1032 x the stored bytes (+ a chunk's slack). */
static int rows_backed(hid_t d, hsize_t rows, size_t width)
{
    if (rows == 0) return 1;
    hid_t ft = H5Dget_type(d);
    size_t el = ft >= 0 ? H5Tget_size(ft) : 0;
    if (ft >= 0) H5Tclose(ft);
    hsize_t stored = H5Dget_storage_size(d);
    if (el == 0 || el > 16 || width == 0 || rows > ((hsize_t)1 << 62) / width / el) return 0;
    return rows * width * el <= stored * 1032 + 65536;
}

/* Opens a dataset and reports its rows and width. */
static hid_t open_dataset(td_runfile *rf, const char *path, hsize_t *rows, size_t *width)
{
    if (!td_runfile_exists(rf, path)) return -1;
    hid_t d = H5Dopen2(rf->file, path, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    int rank = H5Sget_simple_extent_ndims(sp);
    if (rank < 1 || rank > 2) { H5Sclose(sp); H5Dclose(d); return -1; }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    *rows = dims[0];
    *width = rank == 2 ? (size_t)dims[1] : 1;
    return d;
}

int td_runfile_append(td_runfile *rf, const char *path, td_coltype type, size_t width,
                      const void *data, size_t nrows, td_error *err)
{
    hsize_t rows = 0;
    size_t w = 0;
    hid_t d = open_dataset(rf, path, &rows, &w);
    if (d < 0) {
        d = create_dataset(rf, path, type, width, nrows, err);
        if (d < 0) return -1;
        rows = 0;
        w = width;
    }
    int rc = 0;
    hid_t ft = H5Dget_type(d);
    hid_t want = h5file_type(type);
    if (w != width || H5Tget_class(ft) != H5Tget_class(want) || H5Tget_size(ft) != H5Tget_size(want)) {
        rc = td_fail(err, "%s: dataset %s has another type or width than the rows appended", rf->path, path);
        goto done;
    }
    if (nrows == 0) goto done;
    hsize_t newdims[2] = {rows + nrows, width};
    if (H5Dset_extent(d, newdims) < 0) { rc = td_fail(err, "%s: cannot extend %s", rf->path, path); goto done; }
    int rank = width > 1 ? 2 : 1;
    hid_t fs = H5Dget_space(d);
    hsize_t start[2] = {rows, 0}, count[2] = {nrows, width};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
    hid_t ms = H5Screate_simple(rank, count, NULL);
    if (H5Dwrite(d, h5type(type), ms, fs, H5P_DEFAULT, data) < 0)
        rc = td_fail(err, "%s: cannot write %zu rows to %s", rf->path, nrows, path);
    if (rf->st.err) rc = storage_fail(rf->path, &rf->st, err);
    H5Sclose(ms);
    H5Sclose(fs);
done:
    H5Tclose(ft);
    H5Dclose(d);
    return rc;
}

int64_t td_runfile_rows(td_runfile *rf, const char *path)
{
    hsize_t rows = 0;
    size_t w;
    hid_t d = open_dataset(rf, path, &rows, &w);
    if (d < 0) return 0;
    int ok = rows_backed(d, rows, w);
    H5Dclose(d);
    return ok ? committed_rows(rf, path, (int64_t)rows) : -1;
}

size_t td_runfile_width(td_runfile *rf, const char *path)
{
    hsize_t rows;
    size_t w = 0;
    hid_t d = open_dataset(rf, path, &rows, &w);
    if (d < 0) return 0;
    H5Dclose(d);
    return w;
}

typedef struct { td_runfile *rf; int64_t nrows; int failed; } trunc_ctx;

static herr_t trunc_one(hid_t group, const char *name, const H5L_info_t *info, void *user)
{
    (void)info;
    trunc_ctx *c = user;
    hid_t d = H5Dopen2(group, name, H5P_DEFAULT);
    if (d < 0) return 0;   /* not a dataset */
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    int rank = H5Sget_simple_extent_ndims(sp);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    if (rank >= 1 && dims[0] > (hsize_t)c->nrows) {
        dims[0] = (hsize_t)c->nrows;
        if (H5Dset_extent(d, dims) < 0) c->failed = 1;
    }
    H5Dclose(d);
    return 0;
}

int td_runfile_truncate_group(td_runfile *rf, const char *group, int64_t nrows, td_error *err)
{
    if (!td_runfile_exists(rf, group)) return 0;
    hid_t g = H5Gopen2(rf->file, group, H5P_DEFAULT);
    if (g < 0) return td_fail(err, "%s: cannot open group %s", rf->path, group);
    trunc_ctx c = {rf, nrows, 0};
    H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, trunc_one, &c);
    H5Gclose(g);
    return c.failed ? td_fail(err, "%s: cannot truncate group %s", rf->path, group) : 0;
}

int td_runfile_read(td_runfile *rf, const char *path, td_coltype type, int64_t row0,
                    int64_t nrows, void *out, td_error *err)
{
    hsize_t rows;
    size_t width;
    hid_t d = open_dataset(rf, path, &rows, &width);
    if (d < 0) return td_fail(err, "%s: missing dataset %s", rf->path, path);
    int rc = 0;
    hsize_t seen = (hsize_t)committed_rows(rf, path, (int64_t)rows);   /* a reader: the last commit's rows */
    if (row0 < 0 || nrows < 0 || row0 > INT64_MAX - nrows || (hsize_t)(row0 + nrows) > seen) {
        rc = td_fail(err, "%s: rows %lld..%lld outside %s (%llu rows)", rf->path, (long long)row0,
                     (long long)row0 + (long long)(nrows > 0 ? nrows : 0), path, (unsigned long long)seen);
    } else if (!rows_backed(d, rows, width)) {
        rc = td_fail(err, "%s: %s claims %llu rows that its storage cannot hold (corrupt file?)", rf->path, path,
                     (unsigned long long)rows);
    } else if (nrows > 0) {
        int rank = width > 1 ? 2 : 1;
        hid_t fs = H5Dget_space(d);
        hsize_t start[2] = {(hsize_t)row0, 0}, count[2] = {(hsize_t)nrows, width};
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        hid_t ms = H5Screate_simple(rank, count, NULL);
        if (H5Dread(d, h5type(type), ms, fs, H5P_DEFAULT, out) < 0)
            rc = td_fail(err, "%s: cannot read %s (corrupt file?)", rf->path, path);
        H5Sclose(ms);
        H5Sclose(fs);
    }
    H5Dclose(d);
    return rc;
}

/* ---------------------------------------------------------------- a reader's committed rows */

/* A file that a writer is committing to (or one whose writer was killed inside a commit's apply,
 * read without the journal beside it) can hold datasets of one group at different lengths: each
 * dataset's extent lives in its own object header, and the apply writes them one by one (rows
 * past the old extents were written before, so the new rows are whole wherever an extent says
 * they are). /progress says what each commit held: the largest k such that every dataset of
 * every group it counts holds the rows of its k-th row is a commit the reader sees whole. A
 * reader then sees those rows and no more, in every group, so /tokens never refers to a /seqs
 * row it cannot see and the /steps columns of a tidal-rl run all have k rows. Files without
 * /progress (tidal-merge output, which is written whole and renamed; tidal-sft's) are read as
 * they are. */

typedef struct { int64_t min; } min_ctx;

static herr_t min_one(hid_t group, const char *name, const H5L_info_t *info, void *user)
{
    (void)info;
    min_ctx *c = user;
    hid_t d = H5Dopen2(group, name, H5P_DEFAULT);
    if (d < 0) return 0;   /* not a dataset */
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    if (H5Sget_simple_extent_ndims(sp) >= 1) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        if (c->min < 0 || (int64_t)dims[0] < c->min) c->min = (int64_t)dims[0];
    }
    H5Sclose(sp);
    H5Dclose(d);
    return 0;
}

/* The fewest rows of any dataset directly in the group; -1 when it has none (or is absent). */
static int64_t group_min_rows(td_runfile *rf, const char *group)
{
    if (H5Lexists(rf->file, group, H5P_DEFAULT) <= 0) return -1;
    hid_t g = H5Gopen2(rf->file, group, H5P_DEFAULT);
    if (g < 0) return -1;
    min_ctx c = {-1};
    H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, min_one, &c);
    H5Gclose(g);
    return c.min;
}

_Static_assert((int)CUT_SEQS == (int)TD_GROUP_SEQS && (int)CUT_TOKENS == (int)TD_GROUP_TOKENS &&
               (int)CUT_PROMPTS == (int)TD_GROUP_PROMPTS && (int)CUT_TEXT == (int)TD_GROUP_TEXT,
               "the cut's groups follow td_schema_groups");

static void committed_cut(td_runfile *rf)
{
    int64_t have[CUT_COUNT];
    for (int g = 0; g < CUT_COUNT; g++) have[g] = group_min_rows(rf, CUT_GROUP[g]);
    int64_t nb = have[CUT_PROGRESS];
    if (nb < 0 || !td_runfile_exists(rf, td_schema_progress[TD_PRG_BATCH].path)) return;
    if (nb > ((int64_t)1 << 40)) return;   /* not a count of commits: leave it to the readers' own checks */
    /* the /progress column of each group it counts (CUT_SEQS.. follow TD_GROUP_SEQS..) */
    int64_t *prog[TD_GROUP_COUNT] = {0};
    int ok = 1;
    for (int g = 0; g < TD_GROUP_COUNT && ok; g++) {
        const char *col = td_schema_groups[g].progress->path;
        if (!nb || !td_runfile_exists(rf, col)) continue;
        if (td_runfile_rows(rf, col) < nb) { ok = 0; break; }   /* rows its storage cannot hold (-1): a corrupt file */
        prog[g] = malloc((size_t)nb * sizeof(int64_t));
        ok = prog[g] && td_runfile_read(rf, col, TD_COL_I64, 0, nb, prog[g], NULL) == 0;
    }
    int64_t k = ok ? nb : 0;
    for (; k > 0; k--) {
        int whole = have[CUT_STEPS] < 0 || have[CUT_STEPS] >= k;   /* tidal-rl: a /steps row per /progress row */
        for (int g = 0; g < TD_GROUP_COUNT && whole; g++)
            if (prog[g] && have[g] >= 0 && prog[g][k - 1] > have[g]) whole = 0;
        if (whole && prog[TD_GROUP_TOKENS] && have[CUT_LAYERS] >= 0 && prog[TD_GROUP_TOKENS][k - 1] > have[CUT_LAYERS])
            whole = 0;   /* /layers rows are /tokens rows */
        if (whole) break;
    }
    for (int g = 0; g < TD_GROUP_COUNT; g++)
        if (prog[g]) rf->cut[g] = k ? prog[g][k - 1] : 0;
    if (prog[TD_GROUP_TOKENS]) rf->cut[CUT_LAYERS] = rf->cut[CUT_TOKENS];
    rf->cut[CUT_STEPS] = k;
    rf->cut[CUT_PROGRESS] = k;
    for (int g = 0; g < TD_GROUP_COUNT; g++) free(prog[g]);
}

void td_runfile_stamp_take(const char *path, td_runfile_stamp *s)
{
    struct stat st;
    char jpath[1100];
    memset(s, 0, sizeof *s);
    if (stat(path, &st) == 0) {
        s->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        s->size = (long long)st.st_size;
    }
    tdc_journal_path(path, jpath, sizeof jpath);
    s->journal = access(jpath, F_OK) == 0;
}

int td_runfile_changed(const char *path, const td_runfile_stamp *s)
{
    td_runfile_stamp now;
    td_runfile_stamp_take(path, &now);
    return s->journal || now.journal || now.mtime_ns != s->mtime_ns || now.size != s->size;
}

/* rows of the dataset at path as this handle sees them: a reader's, bounded by the cut */
static int64_t committed_rows(const td_runfile *rf, const char *path, int64_t rows)
{
    if (rf->writable) return rows;
    for (int g = 0; g < CUT_COUNT; g++) {
        size_t n = strlen(CUT_GROUP[g]);
        if (rf->cut[g] >= 0 && !strncmp(path, CUT_GROUP[g], n) && path[n] == '/')
            return rows < rf->cut[g] ? rows : rf->cut[g];
    }
    return rows;
}

typedef struct { char **names; size_t max, n; } name_list;

static herr_t list_one(hid_t group, const char *name, const H5L_info_t *info, void *user)
{
    (void)group; (void)info;
    name_list *l = user;
    if (l->n < l->max) l->names[l->n] = strdup(name);
    l->n++;
    return 0;
}

size_t td_runfile_list(td_runfile *rf, const char *group, char **names, size_t max)
{
    quiet_hdf5();
    if (H5Lexists(rf->file, group, H5P_DEFAULT) <= 0) return 0;
    hid_t g = H5Gopen2(rf->file, group, H5P_DEFAULT);
    if (g < 0) return 0;
    name_list l = {names, max, 0};
    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, list_one, &l);
    H5Gclose(g);
    return l.n;
}

/* ---------------------------------------------------------------- compaction */

/* Root attribute copy (H5Aiterate2 callback): read and write in the file's own type, so vlen
 * strings travel as char pointers and integers as stored. */
static herr_t copy_attr(hid_t loc, const char *name, const H5A_info_t *info, void *user)
{
    (void)info;
    hid_t dst = *(hid_t *)user;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    size_t sz = H5Tget_size(t);
    herr_t rc = -1;
    void *buf = n >= 0 && n < (1 << 20) && sz && sz < (1 << 20) ? calloc((size_t)(n ? n : 1), sz) : NULL;
    if (buf && H5Aread(a, t, buf) >= 0) {
        hid_t b = H5Acreate2(dst, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (b >= 0 && H5Awrite(b, t, buf) >= 0) rc = 0;
        if (b >= 0) H5Aclose(b);
        if (H5Tis_variable_str(t) > 0 || H5Tdetect_class(t, H5T_VLEN) > 0) H5Dvlen_reclaim(t, sp, H5P_DEFAULT, buf);
    }
    free(buf);
    H5Sclose(sp);
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

static herr_t copy_link(hid_t loc, const char *name, const H5L_info_t *info, void *user)
{
    (void)info;
    return H5Ocopy(loc, name, *(hid_t *)user, name, H5P_DEFAULT, H5P_DEFAULT) < 0 ? -1 : 0;
}

int td_runfile_compact(const char *path, td_error *err)
{
    quiet_hdf5();
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.compact.tmp", path);
    char why[1200];
    if (tdc_recover(path, why, sizeof why) < 0) return td_fail(err, "%s", why);
    if (tdg_check(path, why, sizeof why)) return td_fail(err, "%s", why);
    hid_t src = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (src < 0) return td_fail(err, "%s: cannot open the HDF5 file to compact it", path);
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_file_space_strategy(fcpl, H5F_FSPACE_STRATEGY_NONE, 0, 0);
    tdc_status st = {0};
    hid_t fapl = tdc_fapl(&st, 0);   /* written whole, then renamed: no journal needed, but every write checked */
    set_format(fapl);
    hid_t dst = H5Fcreate(tmp, H5F_ACC_TRUNC, fcpl, fapl);
    H5Pclose(fapl);
    H5Pclose(fcpl);
    int ok = dst >= 0 && H5Aiterate2(src, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, copy_attr, &dst) >= 0 &&
             H5Literate(src, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, copy_link, &dst) >= 0;
    if (dst >= 0 && H5Fclose(dst) < 0) ok = 0;   /* the driver fsyncs it at close */
    H5Fclose(src);
    if (st.err || !ok || td_runfile_replace(tmp, path) != 0) {
        int e = st.err ? st.err : errno;
        td_runfile_remove(tmp);
        return td_fail(err, "%s: could not compact the file (%s%s%s); it is complete and intact as it is, %s removed",
                       path, st.err ? st.what : "copy failed", e ? ": " : "", e ? strerror(e) : "", tmp);
    }
    tdg_trust(path);
    return 0;
}

int td_runfile_replace(const char *from, const char *to)
{
    /* a journal left by a writer of the file being replaced must not outlive it (it would not
     * apply to another inode, but it is not the new file's) */
    char jpath[1100];
    tdc_journal_path(to, jpath, sizeof jpath);
    unlink(jpath);
    return rename(from, to);
}

int td_runfile_remove(const char *path)
{
    char jpath[1100];
    tdc_journal_path(path, jpath, sizeof jpath);
    unlink(jpath);
    return remove(path);
}
