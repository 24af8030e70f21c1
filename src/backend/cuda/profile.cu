/* tidal — the CUDA backend's own profiler: where a run's wall time goes, op by op.
 *
 *   TIDAL_CUDA_PROFILE=1      a table on stderr at exit
 *   TIDAL_CUDA_PROFILE=FILE   the same table appended to FILE (any value but "", "0" and "1")
 *   unset, "" or "0"          off: each TD_LAUNCH costs one test of a global int (tdc_prof_on)
 *
 * When on, every kernel launch (TD_LAUNCH, cuda_internal.cuh), every cublasLtMatmul (lt.cu) and
 * the backend's copies, allocations and memsets (backend.cu) are bracketed by
 * cudaDeviceSynchronize: the device is idle before the event and has finished it after, and the
 * host wall time between (CLOCK_MONOTONIC) is added to the event's name with a call count (and
 * the bytes, for copies). Times are therefore each op alone: launch overhead + run + the sync's
 * return, with no overlap between ops; the run is slower than unprofiled (a sync per launch)
 * but the shares are what a GPU-bound run would spend. Kernel names are the launch's kernel
 * argument and its file ("scale_elems (residual.cu)": two files may have a static kernel of the
 * same name, and the attention files launch a function pointer, `kern`). An event inside
 * another (a tdc_free inside tdc_done) is counted under its own name and taken out of the
 * outer one, so the names' times add up.
 *
 * At exit the table: one line per name by total time, descending (calls, total ms, mean us per
 * call, % of the profiled wall time, MiB and GB/s for copies); the profiled wall time (from the
 * first event to exit); "not in any op", the wall time less the sum of the names: the host's own
 * work between ops (sampling and metrics on the host, the model's loops, cuBLASLt's heuristic,
 * the staging's cudaPointerGetAttributes). Below, the GEMMs by shape ("cublasLtMatmul MxNxK":
 * D is M x N, K deep, as cuBLASLt sees it; a forward GEMM's M is its output features and N its
 * tokens), a breakdown of the cublasLtMatmul line, not added to the sum. Every line starts
 * "tidal-cuda-profile: " so that a script can grep it out of a tool's stderr.
 *
 * Threads: the backend is driven from one host thread (its state in backend.cu, G, is plain
 * data; the tools' OpenMP regions are CPU loops that never call an op), so the accumulators here
 * are plain arrays with no lock. The environment is read when the library loads and again when
 * the backend opens (tdc_prof_setup, which a test may call after setenv). */
#include "cuda_internal.cuh"

extern "C" {
#include "tidal/progress.h"   /* td_now: monotonic seconds */
}

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tdc_prof_on;

enum { PROF_NAMES = 256, PROF_SHAPES = 128, PROF_DEPTH = 8, PROF_LABEL = 96 };

struct prof_entry {
    const char *name, *file;   /* the literals that made it (a fast first match), or NULL */
    char label[PROF_LABEL];
    long calls;
    double seconds;            /* exclusive of events inside it */
    double bytes;
    int detail;                /* a breakdown of another line: printed apart, not summed */
};

static struct {
    prof_entry e[PROF_NAMES];
    int n, nshapes;
    prof_entry other, other_shapes;   /* what comes once the names (the shapes) are all taken */
    double first;              /* CLOCK_MONOTONIC of the first event; 0 before */
    double t0[PROF_DEPTH], inner[PROF_DEPTH];   /* open events: start, time of events inside */
    int depth;
    char dest[4096];           /* "" stderr, else the file appended to */
    int atexit_done;
} P;

static void prof_exit(void) { tdc_prof_report(); }

void tdc_prof_setup(void)
{
    const char *v = getenv("TIDAL_CUDA_PROFILE");
    tdc_prof_on = v && *v && strcmp(v, "0") != 0;
    if (!tdc_prof_on) return;
    snprintf(P.dest, sizeof P.dest, "%s", strcmp(v, "1") ? v : "");
    if (!P.atexit_done) {
        atexit(prof_exit);
        P.atexit_done = 1;
    }
}

/* read when the library loads too, so that a test program that launches kernels without
 * opening the backend is profiled */
__attribute__((constructor)) static void prof_load(void) { tdc_prof_setup(); }

void tdc_prof_begin(void)
{
    CUDA_CHECK(cudaDeviceSynchronize());   /* the work queued before: not this event's */
    double t = td_now();
    if (!P.first) P.first = t;
    if (P.depth < PROF_DEPTH) {
        P.t0[P.depth] = t;
        P.inner[P.depth] = 0;
    }
    P.depth++;
}

/* the entry for (name, file), labelled "name (basename of file)" when file is given; a detail
 * (a GEMM's shape) is a breakdown of another entry. Past PROF_NAMES names (PROF_SHAPES
 * details), the "other" entries. */
static prof_entry *entry(const char *name, const char *file, int detail)
{
    for (int i = 0; i < P.n; i++)
        if (P.e[i].name == name && P.e[i].file == file && name) return &P.e[i];
    char label[PROF_LABEL];
    const char *base = file ? strrchr(file, '/') : NULL;
    base = base ? base + 1 : file;
    if (base) snprintf(label, sizeof label, "%s (%s)", name, base);
    else snprintf(label, sizeof label, "%s", name);
    for (int i = 0; i < P.n; i++)
        if (!strcmp(P.e[i].label, label)) return &P.e[i];
    if (P.n == PROF_NAMES || (detail && P.nshapes == PROF_SHAPES)) {
        prof_entry *o = detail ? &P.other_shapes : &P.other;
        if (!o->label[0]) snprintf(o->label, sizeof o->label, "other %s", detail ? "shapes" : "names");
        o->detail = detail;
        return o;
    }
    P.nshapes += detail;
    prof_entry *e = &P.e[P.n++];
    memset(e, 0, sizeof *e);
    snprintf(e->label, sizeof e->label, "%s", label);
    e->detail = detail;
    /* literals only: a label formatted by the caller (a GEMM's shape) is matched by its text */
    if (!detail) { e->name = name; e->file = file; }
    return e;
}

double tdc_prof_end(const char *name, const char *file, size_t bytes)
{
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {   /* a faulting kernel is reported here, by its name */
        char what[PROF_LABEL + 64];
        snprintf(what, sizeof what, "cudaDeviceSynchronize after %s%s%s (TIDAL_CUDA_PROFILE)", name,
                 file ? " in " : "", file ? file : "");
        tdc_check_cuda(err, what, __FILE__, __LINE__);
    }
    double t = td_now();
    if (P.depth <= 0) {
        fprintf(stderr, "tidal: tdc_prof_end(%s) without tdc_prof_begin (a tidal bug)\n", name);
        abort();
    }
    P.depth--;
    if (P.depth >= PROF_DEPTH) return 0;   /* too deep to be timed apart: the outer event has it */
    double all = t - P.t0[P.depth], self = all - P.inner[P.depth];
    if (P.depth > 0) P.inner[P.depth - 1] += all;
    prof_entry *e = entry(name, file, 0);
    e->calls++;
    e->seconds += self;
    e->bytes += (double)bytes;
    return self;
}

void tdc_prof_detail(const char *label, double seconds)
{
    prof_entry *e = entry(label, NULL, 1);
    e->calls++;
    e->seconds += seconds;
}

static int by_time(const void *a, const void *b)
{
    const prof_entry *x = *(const prof_entry *const *)a, *y = *(const prof_entry *const *)b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : strcmp(x->label, y->label);
}

static void line(FILE *f, const prof_entry *e, double wall)
{
    char mib[48] = "";
    if (e->bytes > 0)
        snprintf(mib, sizeof mib, " %10.2f %8.2f", e->bytes / (1 << 20),
                 e->seconds > 0 ? e->bytes / e->seconds / 1e9 : 0.0);
    fprintf(f, "tidal-cuda-profile: %-44s %9ld %11.3f %10.1f %6.1f%s\n", e->label, e->calls, 1e3 * e->seconds,
            e->calls ? 1e6 * e->seconds / (double)e->calls : 0.0, wall > 0 ? 100 * e->seconds / wall : 0.0, mib);
}

void tdc_prof_report(void)
{
    if (!tdc_prof_on || !P.first) return;
    FILE *f = stderr;
    if (P.dest[0] && !(f = fopen(P.dest, "a"))) {
        fprintf(stderr, "tidal: TIDAL_CUDA_PROFILE=%s: %s (the table goes to stderr)\n", P.dest, strerror(errno));
        f = stderr;
    }
    double wall = td_now() - P.first, sum = 0;
    int n = 0;
    prof_entry *sorted[PROF_NAMES + 2];
    for (int i = 0; i < P.n + 2; i++) {
        prof_entry *e = i < P.n ? &P.e[i] : i == P.n ? &P.other : &P.other_shapes;
        if (!e->calls) continue;
        sorted[n++] = e;
        if (!e->detail) sum += e->seconds;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_time);
    fprintf(f, "tidal-cuda-profile: == %s (pid %d): each op between two cudaDeviceSynchronize, host wall time\n",
            program_invocation_short_name, (int)getpid());
    fprintf(f, "tidal-cuda-profile: %-44s %9s %11s %10s %6s %10s %8s\n", "name", "calls", "total ms", "mean us",
            "% wall", "MiB", "GB/s");
    for (int i = 0; i < n; i++)
        if (!sorted[i]->detail) line(f, sorted[i], wall);
    fprintf(f, "tidal-cuda-profile: %-44s %9s %11.3f %10s %6.1f\n", "sum of the above", "", 1e3 * sum, "",
            wall > 0 ? 100 * sum / wall : 0.0);
    fprintf(f, "tidal-cuda-profile: %-44s %9s %11.3f %10s %6.1f\n", "not in any op (host work between ops)", "",
            1e3 * (wall - sum), "", wall > 0 ? 100 * (wall - sum) / wall : 0.0);
    fprintf(f, "tidal-cuda-profile: %-44s %9s %11.3f %10s %6.1f\n", "profiled wall time (first op to exit)", "",
            1e3 * wall, "", 100.0);
    int shapes = 0;
    for (int i = 0; i < n; i++)
        if (sorted[i]->detail) {
            if (!shapes++) fprintf(f, "tidal-cuda-profile: -- by shape (M x N x K; part of the line above of the same "
                                      "name, not in the sum) --\n");
            line(f, sorted[i], wall);
        }
    if (f != stderr) fclose(f);
    else fflush(f);
}
