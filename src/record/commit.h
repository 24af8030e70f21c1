/* The commit driver (src/record/commit.c): the HDF5 file driver every run file tidal writes goes
 * through. Internal to src/record. */
#ifndef TIDAL_RECORD_COMMIT_H
#define TIDAL_RECORD_COMMIT_H

#include <hdf5.h>

/* What a file's writes came to, owned by the caller and filled by the driver: the first failed
 * system call and its errno (0: none). The driver never reports a failed write to HDF5 (which
 * does not recover from one: a failed flush left its file ids half-closed and the process
 * crashed at exit); tidal asks here after every flush and close instead. */
typedef struct {
    int err;              /* errno of the first failure, 0 when none */
    char what[1200];      /* the call that failed: "write", "fsync of PATH.journal", ... */
    int journal_left;     /* a complete journal stayed behind (the file is recovered on its next open) */
    int locked;           /* opening for writing failed: another process is writing the file */
} tdc_status;

/* A file access property list for the commit driver. `deferred`: a new file keeps every byte in
 * memory until its first commit (a run that fails before then leaves an empty file, not a torn
 * one); for files written whole and renamed into place (compaction, merge) leave it 0. */
hid_t tdc_fapl(tdc_status *st, int deferred);
/* Makes what HDF5 wrote since the last commit part of the file, all or nothing (after H5Fflush). */
int tdc_commit(hid_t file);
/* Finishes or discards what a writer killed during a commit left in PATH.journal. Returns 0 when
 * there was nothing to do or it was done, 1 when a live writer holds the file, -1 on an error. */
int tdc_recover(const char *path, char *why, size_t why_cap);
/* The journal's path for a run file. */
void tdc_journal_path(const char *path, char *out, size_t cap);

#endif
