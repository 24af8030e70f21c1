/* Progress lines with an ETA (include/tidal/progress.h). */
#include "tidal/progress.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

double td_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void td_progress_start(td_progress *p, FILE *f, const char *label)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    snprintf(p->label, sizeof p->label, "%s", label);
    p->t0 = p->last = td_now();
    p->tty = f && isatty(fileno(f));
}

void td_progress_update(td_progress *p, double done, double total, const char *unit)
{
    if (!p->f) return;
    double now = td_now(), el = now - p->t0;
    if (el < 2.0 || now - p->last < (p->tty ? 1.0 : 10.0)) return;
    p->last = now;
    p->shown = 1;
    double eta = done > 0 ? el * (total - done) / done : 0.0;
    fprintf(p->f, "%s%s: %.4g/%.4g %s (%.0f%%)  %.0f s, ETA %.0f s%s", p->tty ? "\r" : "", p->label, done,
            total, unit, total > 0 ? 100.0 * done / total : 0.0, el, eta, p->tty ? "   " : "\n");
    fflush(p->f);
}

void td_progress_add(td_progress *p, double n, const char *unit)
{
    p->done += n;
    td_progress_update(p, p->done, p->total, unit);
}

void td_progress_end(td_progress *p)
{
    if (!p->f || !p->shown) return;
    fprintf(p->f, "%s%s: done in %.1f s%s\n", p->tty ? "\r" : "", p->label, td_now() - p->t0,
            p->tty ? "                    " : "");
    p->shown = 0;
}
