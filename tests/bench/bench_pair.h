/* tidal — the timing loop of the kernel benches (gemm_bench.c, kernels_bench.c, fp8_bench.c).
 * A line's two sides (tidal's kernel and its peer) run in turn, round after round, each round
 * until BENCH_ROUND_S seconds have passed, and each side keeps its best round. The VMs these
 * benches run on change speed by 20-60 % within minutes: with each side's three rounds run
 * back to back (before 2026-12-02), the same build read gemm-fixed-256x4864x896 at 0.47, 0.57,
 * 0.96 and 0.99 of sgemm in four runs a minute apart, tidal 40-82 GFLOP/s against a peer of
 * 76-86. In turn, both sides see the same minutes; the better of two rounds in a row is the
 * machine's, not the code's. One call of each side before the clock starts takes the first
 * touch of its buffers and scratch out of the rounds. */
#ifndef TIDAL_BENCH_PAIR_H
#define TIDAL_BENCH_PAIR_H

#include "tidal/progress.h"   /* td_now: monotonic seconds */

enum { BENCH_ROUNDS = 5 };
#define BENCH_ROUND_S 0.3

/* one call of side `which` (the bench's own numbering) on the bench's shape `ctx` */
typedef void bench_side(int which, const void *ctx);

/* calls per second over one round */
static double bench_round(bench_side *side, int which, const void *ctx)
{
    int reps = 0;
    double t0 = td_now(), t;
    do {
        side(which, ctx);
        reps++;
    } while ((t = td_now() - t0) < BENCH_ROUND_S);
    return reps / t;
}

/* best[i]: side which[i]'s best rate over BENCH_ROUNDS rounds taken in turn, times per_call
 * (the work of one call, e.g. its flops x 1e-9 for GFLOP/s) */
static void bench_pair(bench_side *side, const void *ctx, const int which[2], double per_call, double best[2])
{
    best[0] = best[1] = 0;
    for (int i = 0; i < 2; i++) side(which[i], ctx);
    for (int round = 0; round < BENCH_ROUNDS; round++)
        for (int i = 0; i < 2; i++) {
            double r = bench_round(side, which[i], ctx) * per_call;
            if (r > best[i]) best[i] = r;
        }
}

#endif
