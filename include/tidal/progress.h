/* tidal — progress of long work on a stream (stderr), with an ETA.
 *
 * Quiet for short work: nothing is printed before the work has run for 2 s, so small models
 * and tests see no lines. Then at most one update a second on a terminal (rewritten in place
 * with \r), one every 10 s otherwise (a line each, for logs). */
#ifndef TIDAL_PROGRESS_H
#define TIDAL_PROGRESS_H

#include <stdio.h>

#include "tidal/common.h"

TD_BEGIN_DECLS

typedef struct td_progress_s {
    FILE *f;              /* NULL: silent */
    char label[64];
    double t0, last;
    int tty, shown;
    double done, total;   /* for td_progress_add */
} td_progress;

void td_progress_start(td_progress *p, FILE *f, const char *label);
/* done of total units (unit names what is counted: "GB", "layers", "steps") */
void td_progress_update(td_progress *p, double done, double total, const char *unit);
/* done += n of p->total (set by the caller), then as td_progress_update */
void td_progress_add(td_progress *p, double n, const char *unit);
/* a final line with the elapsed time, if anything was shown */
void td_progress_end(td_progress *p);
double td_now(void);   /* monotonic seconds */

TD_END_DECLS

#endif
