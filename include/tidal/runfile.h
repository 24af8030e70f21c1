/* tidal — HDF5 run files: the contract users read with h5py or pandas.
 *
 * Column layout: one dataset per metric, grouped by what a row is:
 *   /tokens/<name>   one row per scored token        (1-D, or 2-D rows x width for /layers)
 *   /seqs/<name>     one row per sequence
 *   /prompts/<name>  prompt token ids and offsets
 *   /steps/<name>    one row per optimiser step (RL runs)
 *   /layers/rel_err  rows aligned with /tokens, one column per layer
 *   /text/utf8       prompt and response text, UTF-8 bytes (runs with a tokenizer)
 * Every dataset is chunked, deflate-compressed and unlimited along rows; rows are appended as
 * work completes and the file is committed after each completed unit (src/record/commit.c: all
 * or nothing, through a journal), so an interrupted run or a failed write keeps
 * what it finished. Root attributes: schema_version, tool_version, command_line, and whatever
 * the tool records (model, recipes as JSON, seed, sampling). docs: reports/SCHEMA.md.
 */
#ifndef TIDAL_RUNFILE_H
#define TIDAL_RUNFILE_H

#include "tidal/common.h"

TD_BEGIN_DECLS

#define TD_SCHEMA_VERSION 1

typedef enum { TD_COL_I8 = 0, TD_COL_I32, TD_COL_I64, TD_COL_F32, TD_COL_F64, TD_COL_U8 } td_coltype;  /* U8: UTF-8 bytes */

typedef struct td_runfile td_runfile;

/* Creates a new run file. Refuses to replace an existing file unless overwrite is set, so a
 * mistyped command cannot destroy hours of results. Writes schema_version and tool_version. */
td_runfile *td_runfile_create(const char *path, int overwrite, td_error *err);
/* Opens an existing run file for appending (resume) or reading (writable = 0); checks that it
 * is a tidal run file of a schema version this build reads. A reader sees the last whole commit
 * of a file that is being written: in a file with /progress, every group it counts (and /layers,
 * /steps) holds the rows of the last /progress row that all their columns hold, for rows and
 * reads alike (reports/SCHEMA.md, "Reading a file while it is written"). */
td_runfile *td_runfile_open(const char *path, int writable, td_error *err);
int  td_runfile_close(td_runfile *rf, td_error *err);
const char *td_runfile_path(const td_runfile *rf);

/* Root attributes. */
int td_runfile_set_str(td_runfile *rf, const char *name, const char *value, td_error *err);
int td_runfile_set_i64(td_runfile *rf, const char *name, int64_t value, td_error *err);
int td_runfile_set_f64(td_runfile *rf, const char *name, double value, td_error *err);
/* Caller frees; NULL if absent (err says so). */
char *td_runfile_get_str(td_runfile *rf, const char *name, td_error *err);
int   td_runfile_get_i64(td_runfile *rf, const char *name, int64_t *value, td_error *err);
int   td_runfile_get_f64(td_runfile *rf, const char *name, double *value, td_error *err);

/* Appends nrows rows to dataset `path` (e.g. "/tokens/logp_a"), creating it (and its group)
 * on first use with the given type and width (1 = a 1-D dataset, > 1 = rows x width).
 * Appending to an existing dataset of another type or width is an error. */
int td_runfile_append(td_runfile *rf, const char *path, td_coltype type, size_t width,
                      const void *data, size_t nrows, td_error *err);
/* Rows in a dataset; 0 if it does not exist; -1 if the file claims more rows than the dataset's
 * storage can hold (corrupt or hostile file: never size a buffer by such a claim). */
int64_t td_runfile_rows(td_runfile *rf, const char *path);
int td_runfile_exists(td_runfile *rf, const char *path);
/* Cuts every dataset of a group to nrows rows (resume: drops a half-written unit). */
int td_runfile_truncate_group(td_runfile *rf, const char *group, int64_t nrows, td_error *err);
/* Reads rows [row0, row0+nrows) of a dataset converted to `type` into out (nrows*width). */
int td_runfile_read(td_runfile *rf, const char *path, td_coltype type, int64_t row0,
                    int64_t nrows, void *out, td_error *err);
/* The names of the datasets in a group ("/tokens"), in name order, into names[0..max) (caller
 * frees each); returns how many the group holds (0 if it is absent). */
size_t td_runfile_list(td_runfile *rf, const char *group, char **names, size_t max);
/* The width of a dataset (1 for 1-D); 0 if absent. */
size_t td_runfile_width(td_runfile *rf, const char *path);

/* Commits everything written so far (H5Fflush, then the commit driver's journal: see
 * src/record/commit.c): call after each completed unit of work. All or nothing: a failed write
 * (ENOSPC, EIO, a quota) or a SIGKILL at any instant leaves the file as its last commit made it,
 * readable by h5py. After a failed write the file takes no more writes: every later flush and the
 * close fail with the same message (the file, the call, the errno). */
int td_runfile_flush(td_runfile *rf, td_error *err);
/* Whether a write to the file has failed (then nothing more reaches it). */
int td_runfile_failed(const td_runfile *rf);
/* Renames a finished file into place (compaction, --force, merge), dropping the replaced
 * file's leftover journal. */
int td_runfile_replace(const char *from, const char *to);
/* Removes an unfinished file (a --force run's OUT.new.tmp, a merge's OUT.tmp) and its journal. */
int td_runfile_remove(const char *path);

/* A reader's check that a file did not change under it. Read-only handles see the last whole
 * commit at their open (the rows /progress names), but HDF5 reads metadata lazily: a writer that
 * commits while a reader reads can move what the reader has not read yet past the end the
 * reader's open saw, and that read fails. Take a stamp before opening; when a load fails and
 * td_runfile_changed says the file changed since (a commit came, or one is being applied), open
 * it again and load again. */
typedef struct { long long mtime_ns, size; int journal; } td_runfile_stamp;
void td_runfile_stamp_take(const char *path, td_runfile_stamp *s);
int  td_runfile_changed(const char *path, const td_runfile_stamp *s);

/* Rewrites a closed run file without the dead space that appends leave behind (old copies of
 * rewritten chunks), through PATH.compact.tmp and a rename: interrupted, it leaves PATH as it
 * was. Data are copied chunk for chunk (identical bytes). Call when a run is complete. */
int td_runfile_compact(const char *path, td_error *err);

TD_END_DECLS

#endif
