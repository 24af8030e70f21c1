/* tidal — sample_cuda: td_sample (src/sampling/sampling.c) on the device, one block per row,
 * drawing the token td_sample draws for the same stream, so a decode step needs to bring down
 * only the tokens (and the processed log-prob of each) instead of full-vocabulary rows.
 *
 * The processors run in td_sample's order with its arithmetic, element by element the same fp32
 * operations: repetition penalty on the raw logits (each distinct seen token once: a bit mask
 * per row, atomicOr picks the first thread to reach a token), w / T, min-p (w < max + (float)
 * log(min_p) -> -inf), top-k (a 4-pass radix select of the k-th largest value on order-keeping
 * 32-bit keys, -0 read as +0: the kept set is every value >= it, ties included, as the CPU's),
 * top-p, log-softmax, then the draw (or the argmax, first index on ties, when greedy).
 *
 * td_sample sums in double sequentially (the log-softmax's sum, top-p's normaliser and running
 * sum in sorted order, the draw's running sum in token order); a block sums in another order.
 * Every decision that depends on one of those sums is therefore CERTIFIED: the block's sum is
 * within m = (2n + 16) 2^-53 S (n terms, S the total; both summation orders' worst-case error,
 * and a few ulp of exp per term on a real GPU) of td_sample's, and a decision is taken on the
 * device only when it holds for every value in that interval:
 *   log-softmax   (float)(mx + log(sum)) the same float at both ends of the interval; else
 *                 thread 0 sums the row in td_sample's order (rare: about 1e-4 of the rows of a
 *                 151,936-wide vocabulary)
 *   draw          the first token whose running sum passes u, with u at least m inside both of
 *                 its running sums; else thread 0 runs td_sample's loop (rare: ~1e-10)
 *   top-p         the crossing token found by a radix select over 64-bit keys (value, then
 *                 ~token: td_sample's sort order, lower token first on ties), masses of the
 *                 candidates summed per digit; certified as above, else the row is marked and
 *                 the host samples it with td_sample itself (rare: ~1e-5 of 151,936-wide rows)
 * The uniform u of a row is drawn on the host from the row's td_rng, as td_sample draws it
 * (one td_rng_uniform per non-greedy call), so the streams advance exactly as on the CPU.
 * On the simulator exp and log are glibc's: the tokens and processed log-probs are td_sample's
 * bit for bit. On a GPU, exp/log (double) are within an ulp or two of glibc's: the margins cover
 * them, the rare sequential fallbacks use the device's exp.
 * Scratch: slot 6, the processed rows (n, V) floats and the seen masks (n, ceil(V/32)) words. */
#include "kern.cuh"
#include "tidal/sampling.h"

#include <stdlib.h>
#include <string.h>

#define SMP_THREADS 256
#define SMP_SLOT 6
#define U53 1.1102230246251565e-16

typedef struct {
    float rep;          /* repetition penalty (1 = none)                 */
    int greedy;
    float T;            /* applied when != 1 and not greedy              */
    int minp;           /* min-p on                                      */
    float log_minp;     /* (float)log(min_p)                             */
    int top_k;          /* 0 = none (or >= V)                            */
    double top_p;       /* 1 = none                                      */
    int force;          /* no certified decision: every fallback (tests)  */
} smp_params;

extern "C" { int sample_cuda_force_exact = 0; }

TDC_DEV uint32_t smp_key(float f)
{
    uint32_t u = tdc_bits(f == 0.0f ? 0.0f : f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

TDC_DEV double smp_margin(double n, double S) { return (2.0 * n + 16.0) * U53 * S * 1.01; }

__global__ static void sample_rows(const float *logits, float *work, unsigned *masks, int V,
                                   const int *seen, const int *seen_off, const double *u,
                                   smp_params p, int *tok, float *lp, int *status)
{
    __shared__ double hmass[256];
    __shared__ int hcnt[256];
    __shared__ double dred[SMP_THREADS / 32];
    __shared__ float fred[SMP_THREADS / 32];
    __shared__ double part[SMP_THREADS];
    __shared__ int cj[SMP_THREADS], cok[SMP_THREADS];
    __shared__ int sh_d, sh_stop, sh_fail, sh_best;
    __shared__ double sh_acc, sh_mass;
    __shared__ float sh_lse;
    const int row = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const float *lg = logits + (size_t)row * V;
    float *w = work + (size_t)row * V;
    int nwords = (V + 31) / 32;
    unsigned *mask = masks + (size_t)row * nwords;
    for (int j = tid; j < V; j += nt) w[j] = lg[j];
    if (p.rep != 1.0f) {
        for (int j = tid; j < nwords; j += nt) mask[j] = 0;
        __syncthreads();
        for (int i = seen_off[row] + tid; i < seen_off[row + 1]; i += nt) {
            int t = seen[i];
            if (t < 0 || t >= V) continue;
            unsigned bit = 1u << (t & 31);
            if (atomicOr(&mask[t >> 5], bit) & bit) continue;
            w[t] = w[t] > 0 ? w[t] / p.rep : w[t] * p.rep;
        }
    }
    __syncthreads();
    if (!p.greedy && p.T != 1.0f)
        for (int j = tid; j < V; j += nt) w[j] = w[j] / p.T;
    if (!p.greedy && p.minp) {
        float mx = -INFINITY;
        for (int j = tid; j < V; j += nt) mx = w[j] > mx ? w[j] : mx;
        mx = tdc_block_max(mx, fred);
        float cut = mx + p.log_minp;
        for (int j = tid; j < V; j += nt) if (w[j] < cut) w[j] = -INFINITY;
        __syncthreads();
    }
    if (!p.greedy && p.top_k > 0 && p.top_k < V) {
        /* the k-th largest key, 8 bits at a time */
        uint32_t prefix = 0;
        int k = p.top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int d = tid; d < 256; d += nt) hcnt[d] = 0;
            __syncthreads();
            for (int j = tid; j < V; j += nt) {
                uint32_t key = smp_key(w[j]);
                if (shift == 24 || (key >> (shift + 8)) == prefix) atomicAdd(&hcnt[(key >> shift) & 255], 1);
            }
            __syncthreads();
            if (tid == 0) {
                int acc = 0, d = 255;
                for (; d > 0; d--) {
                    if (acc + hcnt[d] >= k) break;
                    acc += hcnt[d];
                }
                sh_d = d;
                sh_best = k - acc;
            }
            __syncthreads();
            prefix = (prefix << 8) | (uint32_t)sh_d;
            k = sh_best;
            __syncthreads();
        }
        for (int j = tid; j < V; j += nt) if (smp_key(w[j]) < prefix) w[j] = -INFINITY;
        __syncthreads();
    }
    if (tid == 0) sh_fail = 0;
    if (!p.greedy && p.top_p < 1.0) {
        float fmx = -INFINITY;
        for (int j = tid; j < V; j += nt) fmx = w[j] > fmx ? w[j] : fmx;
        fmx = tdc_block_max(fmx, fred);
        double mx = fmx, z = 0, n = 0;
        for (int j = tid; j < V; j += nt) {
            double e = exp((double)w[j] - mx);
            z += e;
            n += e > 0;
        }
        z = tdc_block_sum_d(z, dred);
        n = tdc_block_sum_d(n, dred);
        double dz = (2.0 * n + 16.0) * U53 * 1.01;            /* relative, z against td_sample's */
        double m = smp_margin(n, 1.1) + 2.0 * dz;              /* on a running sum of the t = e / z */
        double tot = 0;
        for (int j = tid; j < V; j += nt) tot += exp((double)w[j] - mx) / z;
        tot = tdc_block_sum_d(tot, dred);
        if (p.force || !(tot + m < p.top_p)) {                            /* else td_sample keeps them all */
            /* the crossing token: radix select on (key << 32 | ~token), descending */
            uint64_t prefix = 0;
            int shift = 56;
            double acc = 0;
            for (;; shift -= 8) {
                for (int d = tid; d < 256; d += nt) { hcnt[d] = 0; hmass[d] = 0; }
                __syncthreads();
                for (int j = tid; j < V; j += nt) {
                    uint64_t K = (uint64_t)smp_key(w[j]) << 32 | (uint32_t)(0xFFFFFFFFu - (uint32_t)j);
                    if (shift == 56 || (K >> (shift + 8)) == prefix) {
                        int d = (int)((K >> shift) & 255);
                        atomicAdd(&hcnt[d], 1);
                        atomicAdd(&hmass[d], exp((double)w[j] - mx) / z);
                    }
                }
                __syncthreads();
                if (tid == 0) {
                    int d = 255;
                    double a = acc;
                    for (; d >= 0; d--) {
                        if (!hcnt[d]) continue;
                        if (a + hmass[d] >= p.top_p) break;
                        a += hmass[d];
                    }
                    if (d < 0) sh_fail = 1;
                    else { sh_d = d; sh_acc = a; sh_mass = hmass[d]; sh_stop = hcnt[d] == 1 || shift == 0; }
                }
                __syncthreads();
                if (sh_fail) break;
                prefix = (prefix << 8) | (uint64_t)sh_d;
                acc = sh_acc;
                if (sh_stop) break;
                __syncthreads();
            }
            if (!sh_fail && (p.force || !(acc + m < p.top_p && acc + sh_mass - m >= p.top_p))) sh_fail = 1;
            __syncthreads();
            if (sh_fail) {
                if (tid == 0) { status[row] = 1; tok[row] = -1; lp[row] = NAN; }
                return;   /* the host samples this row with td_sample */
            }
            for (int j = tid; j < V; j += nt) {
                uint64_t K = (uint64_t)smp_key(w[j]) << 32 | (uint32_t)(0xFFFFFFFFu - (uint32_t)j);
                if ((K >> shift) < prefix) w[j] = -INFINITY;
            }
            __syncthreads();
        }
    }
    /* log-softmax: (float)td_log_sum_exp, certified (kern.cuh) */
    {
        float fmx = -INFINITY;
        for (int j = tid; j < V; j += nt) fmx = w[j] > fmx ? w[j] : fmx;
        fmx = tdc_block_max(fmx, fred);
        tdc_block_log_softmax_certified(w, V, fmx, p.force, fred, dred, &sh_lse);
    }
    if (p.greedy) {   /* first index of the maximum */
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int j = tid; j < V; j += nt) if (w[j] > bv || (w[j] == bv && j < bi)) { bv = w[j]; bi = j; }
        if (tid == 0) sh_best = 0x7fffffff;
        float m = tdc_block_max(bv, fred);
        if (bv == m) atomicMin(&sh_best, bi);
        __syncthreads();
        if (tid == 0) {
            int t = sh_best == 0x7fffffff ? 0 : sh_best;
            tok[row] = t; lp[row] = w[t]; status[row] = 0;
        }
        return;
    }
    /* the draw: contiguous chunks, a prefix of the chunk sums, then each chunk's running sum */
    const double ur = u[row];
    int chunk = (V + nt - 1) / nt, j0 = tid * chunk, j1 = j0 + chunk < V ? j0 + chunk : V;
    double s = 0, n = 0;
    int last = -1;
    for (int j = j0; j < j1; j++)
        if (w[j] != -INFINITY) { s += exp((double)w[j]); n += 1; last = j; }
    part[tid] = s;
    double ntot = tdc_block_sum_d(n, dred);
    __syncthreads();
    double pre = 0, tot = 0;
    for (int t = 0; t < nt; t++) { if (t < tid) pre += part[t]; tot += part[t]; }
    double m = smp_margin(ntot, tot > 1.0 ? tot : 1.0) + 4.0 * U53;
    double a = pre;
    cj[tid] = -1;
    for (int j = j0; j < j1; j++) {
        if (w[j] == -INFINITY) continue;
        double e = exp((double)w[j]);
        a += e;
        if (ur < a) {   /* this chunk's first crossing; certified: u inside both running sums */
            cj[tid] = j;
            cok[tid] = a - e + m <= ur && ur < a - m;
            break;
        }
    }
    __syncthreads();
    int lastall = (int)tdc_block_max((float)last, fred);   /* exact for V < 2^24 */
    if (tid == 0) {
        int t = -1, fail = 0;
        for (int c = 0; c < nt; c++)
            if (cj[c] >= 0) { t = cj[c]; fail = !cok[c]; break; }
        if (t < 0) {                      /* u past every running sum */
            t = lastall < 0 ? 0 : lastall;
            if (!(tot + m <= ur)) fail = 1;
        }
        if (fail || p.force) {   /* td_sample's loop itself */
            double cum = 0;
            int l = 0;
            t = -1;
            for (int j = 0; j < V; j++) {
                if (w[j] == -INFINITY) continue;
                l = j;
                cum += exp((double)w[j]);
                if (ur < cum) { t = j; break; }
            }
            if (t < 0) t = l;
        }
        tok[row] = t; lp[row] = w[t]; status[row] = 0;
    }
}

extern "C" int sample_cuda(const td_ops *ctx, const td_sampling *s, const float *logits, int n, int V,
                           const int *const *seen, const int *n_seen, td_rng *rng, int *tok,
                           float *logp, float *proc)
{
    (void)ctx;
    if (n <= 0 || V <= 0) return 0;
    smp_params p;
    p.rep = (float)s->repetition_penalty;
    p.greedy = s->temperature == 0.0;
    p.T = (float)s->temperature;
    p.minp = s->min_p > 0.0;
    p.log_minp = p.minp ? (float)log(s->min_p) : 0.0f;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.force = sample_cuda_force_exact;
    int *off = (int *)malloc((size_t)(n + 1) * sizeof(int));
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + (seen && p.rep != 1.0f && n_seen ? n_seen[i] : 0);
    int *flat = (int *)malloc((size_t)(off[n] > 0 ? off[n] : 1) * sizeof(int));
    for (int i = 0; i < n; i++)
        if (off[i + 1] > off[i]) memcpy(flat + off[i], seen[i], (size_t)(off[i + 1] - off[i]) * sizeof(int));
    double *u = (double *)malloc((size_t)n * sizeof(double));
    td_rng *before = (td_rng *)malloc((size_t)n * sizeof(td_rng));
    for (int i = 0; i < n; i++) {
        before[i] = rng ? rng[i] : td_rng{};
        u[i] = !p.greedy && rng ? td_rng_uniform(&rng[i]) : 0.0;
    }
    int *status = (int *)malloc((size_t)n * sizeof(int));
    float *lp = logp ? logp : (float *)malloc((size_t)n * sizeof(float));
    int nwords = (V + 31) / 32;
    char *scr = (char *)tdc_scratch(SMP_SLOT, (size_t)n * V * sizeof(float) + (size_t)n * nwords * sizeof(unsigned));
    float *d_w = (float *)scr;
    unsigned *d_mask = (unsigned *)(scr + (size_t)n * V * sizeof(float));
    const float *d_lg = (const float *)tdc_in(logits, (size_t)n * V * sizeof(float));
    const int *d_seen = (const int *)tdc_in(flat, (size_t)(off[n] > 0 ? off[n] : 1) * sizeof(int));
    const int *d_off = (const int *)tdc_in(off, (size_t)(n + 1) * sizeof(int));
    const double *d_u = (const double *)tdc_in(u, (size_t)n * sizeof(double));
    int *d_tok = (int *)tdc_out(tok, (size_t)n * sizeof(int), 0);
    float *d_lp = (float *)tdc_out(lp, (size_t)n * sizeof(float), 0);
    int *d_st = (int *)tdc_out(status, (size_t)n * sizeof(int), 0);
    TD_LAUNCH(sample_rows, n, SMP_THREADS, 0, tdc_stream(), d_lg, d_w, d_mask, V, d_seen, d_off, d_u, p,
              d_tok, d_lp, d_st);
    CUDA_CHECK_LAUNCH();
    if (proc) {
        float *d_proc = (float *)tdc_out(proc, (size_t)n * V * sizeof(float), 0);
        CUDA_CHECK(cudaMemcpyAsync(d_proc, d_w, (size_t)n * V * sizeof(float), cudaMemcpyDeviceToDevice, tdc_stream()));
    }
    tdc_done();
    CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
    int nhost = 0;
    td_sampler *smp = NULL;
    float *row = NULL, *prow = NULL;
    for (int i = 0; i < n; i++) {
        if (!status[i]) continue;
        if (!smp) {
            smp = td_sampler_create(V);
            row = (float *)malloc((size_t)V * sizeof(float));
            prow = (float *)malloc((size_t)V * sizeof(float));
        }
        CUDA_CHECK(cudaMemcpy(row, logits + (size_t)i * V, (size_t)V * sizeof(float), cudaMemcpyDefault));
        tdc_d2h_count((size_t)V * sizeof(float));
        rng[i] = before[i];
        tok[i] = td_sample(smp, s, row, seen ? seen[i] : NULL, seen && n_seen ? n_seen[i] : 0, &rng[i], prow);
        lp[i] = prow[tok[i]];
        if (proc) CUDA_CHECK(cudaMemcpy(proc + (size_t)i * V, prow, (size_t)V * sizeof(float), cudaMemcpyDefault));
        nhost++;
    }
    td_sampler_free(smp);
    free(row); free(prow);
    free(off); free(flat); free(u); free(before); free(status);
    if (lp != logp) free(lp);
    return nhost;
}
