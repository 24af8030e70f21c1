/* The reader's guard for run files that are damaged or hostile (src/record/guard.c). Internal to
 * src/record: td_runfile_open and td_runfile_compact call it, so every tool that reads a run file
 * gets it. reports/SCHEMA.md ("Damaged files") says what it checks and what it costs. */
#ifndef TIDAL_RECORD_GUARD_H
#define TIDAL_RECORD_GUARD_H

#include <stddef.h>

/* Checks an existing file before libhdf5 reads it: the superblock in-process (signature,
 * version, checksum, end of file), then every object tidal reads, in a child process under a
 * CPU-time limit. Returns 0 when the file may be opened; -1 with why ("PATH: ...") when it is
 * refused. A file this process wrote and has not seen change since is not checked again. */
int tdg_check(const char *path, char *why, size_t cap);
/* Records a file this process has just written (created, committed, closed, compacted) as
 * trusted while its size and modification time stay as they are now. */
void tdg_trust(const char *path);

#endif
