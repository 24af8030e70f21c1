/* tidal — kv_write_cuda and attention_forward_cuda (ops.h kv_write, attention_forward; CPU:
 * kv_write_cpu and attention_cpu in cpu.c, the fp32 reference attention_forward_ref in
 * cpu_ref.c).
 *
 * kv_write: row i of rows (N, KVD) to store + kv_off[i] + pos[i] * KVD, one block per row,
 * rounded there to the recipe's kv_cache format when the context is a KV cache's and that
 * format is not the activations': fp8 as q(x / s) * s (s = kv_scale, 1.0 when 0). A KV cache
 * of codes (ctx->cache with ctx->kv_fmt not fp32: a session on this backend, ops.h
 * td_kv_store_format) gets the code of x / s instead, and attention decodes code * s on
 * loading its K/V tiles (kern.cuh tdc_kv_get): the CPU cache's floats, bit for bit, in 2 bytes
 * (bf16, fp16) or 1 (e4m3) instead of 4.
 *
 * attention: the flash form without split-KV on runs of rows (prefill, teacher forcing: runs
 * averaging 16 rows or more) takes the tiled kernel attn_tile (attention_tiled.cu: 64 query
 * rows a block, the same arithmetic in the same order, so the same bits); everything else one
 * kernel, attn_rows, for the three forms of the CPU, and attn_merge for split-KV.
 * TIDAL_CUDA_ATTN=simple|tiled (or tdc_attn_kernel) forces the choice for the flash form;
 * TIDAL_CUDA_ATTN=mma (tdc_attn_kernel 3) asks for the tensor-core kernel attn_mma
 * (attention_mma.cu: not bit-exact, its own tolerance) wherever the recipe's arithmetic allows it
 * (attention_mma_allowed), the choice by shape elsewhere. It is never taken unasked.
 * A block is (a group of up to 8 query rows, a head, a split part); each warp owns one query row
 * and the lanes own columns c = lane + 32 t of its output (HD <= 256: 8 registers per lane).
 * The rows of a group are consecutive rows of one sequence (same kv_off, consecutive positions:
 * a prefill run), so they read the same keys: K and V pass through shared memory in tiles of
 * TK keys (32, or 16 when HD > 128), loaded once per block for the group's 8 rows. Per tile a
 * lane scores one key; the P.V products run over the tile's keys in key order for every
 * column, as the CPU's loop does, so o carries the CPU's fp32 sums term for term.
 *   reference (no recipe, or full fp32 non-batch-invariant: attention_forward_ref) and
 *   full (HF eager, eager_head): three passes over the keys (max, sum of e^(s - max), P.V),
 *     scores recomputed in each (the same bits each time): no (N, NH, keys) score buffer.
 *     eager: s = D(D(q.k) scale), e = expf(s - max) summed in double, p = D(e * (float)(1 / sum)),
 *     out D(sum p v), lse = max + (float)log(sum); reference: s = q.k scale, td_expf, fp32 sum,
 *     p = e * (1 / sum), out unrounded, lse = max + logf(sum).
 *   flash (flash_part): keys in blocks of attn_block from the part's first key, each block in
 *     segments of at most 256 (the CPU's score buffer), an online softmax per segment: scores
 *     q.k scale in fp32, m_new = max(m, segment max), l and o scaled by expf(m - m_new), then per
 *     key p = expf(s - m_new), l += p (fp32, key order), o += D(p) v; out = D(o / l),
 *     lse = m + logf(l). The segments are the CPU's, so every rounding of P is at its point.
 *   split-KV decode (ctx->decode, decode_splits > 1): row i's nk keys in parts of
 *     ceil(nk / splits), each part a flash pass over its keys (one row per block, part = grid z),
 *     its (o, m, l) to scratch slot TDC_SLOT_ATTN; attn_merge then folds the parts in order by
 *     log-sum-exp exactly as attention_cpu does (log1pf form), out = D(acc).
 * The dot products q.k: fp32, in the order of the CPU's `omp simd reduction` loop as GCC builds
 * it for x86-64-v2 (cpu.c is no target clone): four lanes of partial sums over c = l mod 4, the
 * tail of HD mod 4 into lane 0, then 0 + p0 + p1 + p2 + p3 in that order (checked against the
 * generated code; a build of cpu.c with other vector widths or -O1 sums in another order, and
 * the attention test's tolerances cover that).
 * Exponentials: tdc_expf (glibc's expf but for ~1e-4 of its inputs), td_expf for the reference
 * form (kern.cuh). Under the simulator every form but the reference (whose sums are OpenBLAS's)
 * gives the CPU's bits except where such an expf last bit shows (tests/cudasim/test_ops_sim.cpp).
 * Causal by pos: row i sees keys 0..pos[i]. GQA: head h reads kv head h / (NH / NKV). */
#include "kern.cuh"

#include <stdlib.h>
#include <string.h>

#define ATT_ROWS 8     /* query rows (warps) per block for prefill runs */
#define ATT_SEG 256    /* the CPU's score buffer: flash segments of at most 256 keys */

enum { ATT_REF = 0, ATT_EAGER = 1, ATT_FLASH = 2 };

int tdc_attn_kernel = 0;   /* cuda_internal.cuh; 3: attn_mma where allowed */

/* attention_mma.cu */
extern "C" int attention_mma_allowed(int D, int residual_fp32, int HD, int vfmt, float vs);
extern "C" void attention_mma_launch(float *out, float *lse, const float *q, const void *k, const void *v,
                                     int kfmt, float ks, const size_t *kv_off, const int *pos,
                                     const int *gstart, int ng, int NH, int NKV, int HD, int D, int block);

typedef struct {
    float *out, *lse;        /* (N, NH * HD), (N, NH) or NULL */
    float *part;             /* split-KV: (N, NH, splits, HD + 2): o, then m, l */
    const float *q;
    const void *k, *v;       /* floats, or a KV cache's codes of format kfmt times ks */
    const size_t *kv_off;
    const int *pos, *gstart; /* groups: rows gstart[g] .. gstart[g + 1] - 1 */
    int NH, group, HD, KVD, mode, D, block, splits, TK, kfmt;
    float scale, ks;
} attn_args;

/* q . k over HD in the CPU's order (see the header) */
__device__ static inline float attn_dot(const float *q, const float *k, int HD)
{
    float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
    int c = 0;
    for (; c + 4 <= HD; c += 4) {
        p0 = tdc_add(p0, tdc_mul(q[c], k[c]));
        p1 = tdc_add(p1, tdc_mul(q[c + 1], k[c + 1]));
        p2 = tdc_add(p2, tdc_mul(q[c + 2], k[c + 2]));
        p3 = tdc_add(p3, tdc_mul(q[c + 3], k[c + 3]));
    }
    for (; c < HD; c++) p0 = tdc_add(p0, tdc_mul(q[c], k[c]));   /* the tail: lane 0 */
    return (((0.0f + p0) + p1) + p2) + p3;
}

/* keys/values j0 .. j0 + nt - 1 of a head (element b of the store, rows KVD apart) into the
 * tile (rows HD + 1 apart), decoded from a KV cache's codes */
__device__ static inline void attn_load(const attn_args *a, float *t, const void *store, size_t b, int j0, int nt)
{
    int HD = a->HD;
    for (int e = threadIdx.x; e < nt * HD; e += blockDim.x) {
        int j = e / HD, c = e - j * HD;
        t[j * (HD + 1) + c] = tdc_kv_get(store, b + (size_t)(j0 + j) * a->KVD + c, a->kfmt, a->ks);
    }
}

/* the score of key row kr for query qs in the full forms */
__device__ static inline float attn_score_full(const attn_args *a, const float *qs, const float *kr)
{
    float d = attn_dot(qs, kr, a->HD);
    if (a->mode == ATT_EAGER) return tdc_round(a->D, tdc_mul(tdc_round(a->D, d), a->scale));
    return tdc_mul(d, a->scale);
}

__device__ static inline float attn_exp(const attn_args *a, float x)
{
    return a->mode == ATT_REF ? tdc_td_expf(x) : tdc_expf(x);
}

/* o += p_j v_j over the tile's keys [t0, jn) (p in ps at j - p0), columns of this lane */
__device__ static inline void attn_pv(const attn_args *a, float *o, const float *vt, const float *ps,
                                      int p0, int t0, int jn, int round_p)
{
    int lane = threadIdx.x & 31, HD = a->HD;
    for (int j = t0; j < jn; j++) {
        float p = ps[j - p0];
        if (round_p) p = tdc_round(a->D, p);
        const float *vr = vt + (j - t0) * (HD + 1);
        for (int t = 0; t < 8 && lane + 32 * t < HD; t++)
            o[t] = tdc_add(o[t], tdc_mul(p, vr[lane + 32 * t]));
    }
}

/* The part of keys row i works on: [0, nk), or split part z of it (empty past the end). */
__device__ static inline void attn_range(const attn_args *a, int i, int z, int *j0, int *j1)
{
    int nk = a->pos[i] + 1;
    if (a->splits == 1) { *j0 = 0; *j1 = nk; return; }
    int per = (nk + a->splits - 1) / a->splits;
    *j0 = z * per < nk ? z * per : nk;
    *j1 = *j0 + per < nk ? *j0 + per : nk;
}

__global__ static void attn_rows(attn_args a)
{
    TD_DYN_SMEM(float, sm);
    const int R = blockDim.x >> 5, HD = a.HD, TK = a.TK, QD = a.NH * HD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, z = blockIdx.z, r0 = a.gstart[blockIdx.x];
    const int cnt = a.gstart[blockIdx.x + 1] - r0;
    float *qs = sm + warp * HD, *kt = sm + R * HD, *ps = kt + TK * (HD + 1) + warp * ATT_SEG;
    const int act = warp < cnt, i = r0 + (act ? warp : 0);
    const size_t kvb = a.kv_off[r0] + (size_t)(h / a.group) * HD;   /* the head's element 0 */
    /* this warp's keys [j0, j1); the block's [J0, J1) (the group's rows share their start) */
    int j0, j1, J0 = 0x7fffffff, J1 = 0;
    attn_range(&a, i, z, &j0, &j1);
    for (int r = r0; r < r0 + cnt; r++) {
        int b0, b1;
        attn_range(&a, r, z, &b0, &b1);
        if (b0 < b1) { J0 = b0 < J0 ? b0 : J0; J1 = b1 > J1 ? b1 : J1; }
    }
    if (act) for (int c = lane; c < HD; c += 32) qs[c] = a.q[(size_t)i * QD + (size_t)h * HD + c];
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float m = -INFINITY, l = 0.0f;

    if (a.mode == ATT_FLASH) {
        for (int b0 = J0; b0 < J1; b0 += a.block) {
            int b1 = b0 + a.block < J1 ? b0 + a.block : J1;
            for (int c0 = b0; c0 < b1; c0 += ATT_SEG) {
                int c1 = c0 + ATT_SEG < b1 ? c0 + ATT_SEG : b1;
                int e1 = c1 < j1 ? c1 : j1;            /* this row's end in the segment */
                int live = act && c0 < e1;
                for (int t0 = c0; t0 < c1; t0 += TK) {  /* scores of the segment */
                    int nt = c1 - t0 < TK ? c1 - t0 : TK;
                    __syncthreads();
                    attn_load(&a, kt, a.k, kvb, t0, nt);
                    __syncthreads();
                    if (live && lane < nt && t0 + lane < e1)
                        ps[t0 - c0 + lane] = tdc_mul(attn_dot(qs, kt + lane * (HD + 1), HD), a.scale);
                }
                __syncthreads();
                float m_new = m;
                if (live) {
                    float bm = -INFINITY;
                    for (int j = c0 + lane; j < e1; j += 32) bm = ps[j - c0] > bm ? ps[j - c0] : bm;
                    bm = tdc_warp_max(bm);
                    m_new = bm > m ? bm : m;
                    float alpha = tdc_expf(m - m_new);
                    l = tdc_mul(l, alpha);
                    for (int t = 0; t < 8; t++) o[t] = tdc_mul(o[t], alpha);
                    for (int j = c0 + lane; j < e1; j += 32) ps[j - c0] = tdc_expf(ps[j - c0] - m_new);
                }
                __syncthreads();
                if (live) for (int j = c0; j < e1; j++) l = tdc_add(l, ps[j - c0]);
                for (int t0 = c0; t0 < c1; t0 += TK) {  /* o += D(p) v */
                    int nt = c1 - t0 < TK ? c1 - t0 : TK;
                    __syncthreads();
                    attn_load(&a, kt, a.v, kvb, t0, nt);
                    __syncthreads();
                    if (live) attn_pv(&a, o, kt, ps, c0, t0, t0 + nt < e1 ? t0 + nt : e1, 1);
                }
                m = m_new;
            }
        }
        if (!act) return;
        size_t oi = (size_t)i * QD + (size_t)h * HD;
        if (a.splits == 1) {
            for (int t = 0; t < 8 && lane + 32 * t < HD; t++)
                a.out[oi + lane + 32 * t] = tdc_round(a.D, o[t] / l);
            if (a.lse && lane == 0) a.lse[(size_t)i * a.NH + h] = m + tdc_logf(l);
        } else {
            float *pp = a.part + (((size_t)i * a.NH + h) * a.splits + z) * (HD + 2);
            for (int t = 0; t < 8 && lane + 32 * t < HD; t++) pp[lane + 32 * t] = o[t];
            if (lane == 0) { pp[HD] = m; pp[HD + 1] = l; }
        }
        return;
    }

    /* the full forms: pass 1 the maximum, pass 2 the sum, pass 3 P.V */
    double sumd = 0.0;
    float sumf = 0.0f, inv = 0.0f;
    for (int pass = 0; pass < 3; pass++) {
        for (int t0 = J0; t0 < J1; t0 += TK) {
            int nt = J1 - t0 < TK ? J1 - t0 : TK;
            __syncthreads();
            attn_load(&a, kt, a.k, kvb, t0, nt);
            __syncthreads();
            int mine = act && lane < nt && t0 + lane < j1;
            float s = mine ? attn_score_full(&a, qs, kt + lane * (HD + 1)) : 0.0f;
            if (pass == 0) {
                if (mine) m = s > m ? s : m;
            } else if (pass == 1) {
                if (mine) { float e = attn_exp(&a, s - m); sumd += e; sumf = tdc_add(sumf, e); }
            } else {
                if (mine) {
                    float p = tdc_mul(attn_exp(&a, s - m), inv);
                    ps[lane] = a.mode == ATT_EAGER ? tdc_round(a.D, p) : p;
                }
                __syncthreads();
                attn_load(&a, kt, a.v, kvb, t0, nt);
                __syncthreads();
                if (act) attn_pv(&a, o, kt, ps, t0, t0, t0 + nt < j1 ? t0 + nt : j1, 0);
            }
        }
        if (!act) continue;
        if (pass == 0) {
            m = tdc_warp_max(m);
        } else if (pass == 1) {
            sumd = tdc_warp_sum_d(sumd);
            sumf = tdc_warp_sum(sumf);
            if (a.mode == ATT_EAGER) { l = m + (float)log(sumd); inv = (float)(1.0 / sumd); }
            else { l = m + tdc_logf(sumf); inv = 1.0f / sumf; }
        }
    }
    if (!act) return;
    size_t oi = (size_t)i * QD + (size_t)h * HD;
    for (int t = 0; t < 8 && lane + 32 * t < HD; t++)
        a.out[oi + lane + 32 * t] = a.mode == ATT_EAGER ? tdc_round(a.D, o[t]) : o[t];
    if (a.lse && lane == 0) a.lse[(size_t)i * a.NH + h] = l;
}

/* split-KV: fold row i's parts (in order) by log-sum-exp, one block of 32 per (row, head) */
__global__ static void attn_merge(attn_args a)
{
    int i = blockIdx.x, h = blockIdx.y, HD = a.HD, lane = threadIdx.x;
    int nk = a.pos[i] + 1, per = (nk + a.splits - 1) / a.splits;
    const float *pp = a.part + ((size_t)i * a.NH + h) * a.splits * (HD + 2);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, lse_acc = -INFINITY;
    for (int z = 0; z * per < nk; z++, pp += HD + 2) {
        float m = pp[HD], l = pp[HD + 1];
        float lse_p = m + tdc_logf(l);
        float lse_new = lse_p > lse_acc ? lse_p + tdc_log1pf(tdc_expf(lse_acc - lse_p))
                                        : lse_acc + tdc_log1pf(tdc_expf(lse_p - lse_acc));
        float keep = tdc_expf(lse_acc - lse_new), add = tdc_expf(lse_p - lse_new) / l;
        for (int t = 0; t < 8 && lane + 32 * t < HD; t++)
            acc[t] = tdc_add(tdc_mul(acc[t], keep), tdc_mul(add, pp[lane + 32 * t]));
        lse_acc = lse_new;
    }
    size_t oi = (size_t)i * a.NH * HD + (size_t)h * HD;
    for (int t = 0; t < 8 && lane + 32 * t < HD; t++) a.out[oi + lane + 32 * t] = tdc_round(a.D, acc[t]);
    if (a.lse && lane == 0) a.lse[(size_t)i * a.NH + h] = lse_acc;
}

/* elements of a K/V store the rows reach: keys 0..pos[i] at kv_off[i] */
static size_t kv_extent(const size_t *kv_off, const int *pos, int N, int KVD)
{
    size_t hi = 0;
    for (int i = 0; i < N; i++) {
        size_t e = kv_off[i] + (size_t)(pos[i] + 1) * KVD;
        hi = e > hi ? e : hi;
    }
    return hi;
}

/* whether the K/V store of this call holds codes (a KV cache of ctx->kv_fmt: ops.h), and the
 * scale of its values: kv_write's divisor of a rounded fp8 cache (kv_scale, 1.0 when 0), else 1 */
static int kv_codes(const td_ops *ctx) { return ctx->cache && ctx->kv_fmt != TD_F32; }
static int kv_rounds(const td_ops *ctx)
{
    const td_recipe *r = ctx->recipe;
    return r && ctx->cache && r->kv_cache != r->activations && r->kv_cache != TD_F32;
}
static float kv_code_scale(const td_ops *ctx)
{
    return kv_rounds(ctx) && ctx->recipe->kv_scale > 0 ? ctx->recipe->kv_scale : 1.0f;
}

extern "C" void attention_forward_cuda(const td_ops *ctx, float *out, float *lse, const float *q,
                                       const float *k, const float *v, const size_t *kv_off,
                                       const int *pos, int N, int NH, int NKV, int HD,
                                       float *scratch, int max_keys)
{
    (void)scratch; (void)max_keys;   /* the CPU's score buffer: the kernels need none */
    if (N <= 0) return;
    if (HD > 256 || NH % NKV) {
        fprintf(stderr, "tidal: attention_forward_cuda: head dim %d (at most 256) or %d heads over "
                "%d kv heads not supported by the CUDA kernels\n", HD, NH, NKV);
        exit(1);
    }
    const td_recipe *r = ctx->recipe;
    attn_args a;
    a.NH = NH; a.group = NH / NKV; a.HD = HD; a.KVD = NKV * HD;
    a.D = r ? (int)r->activations : (int)TD_F32;
    a.mode = (!r || (r->attention == TD_ATTN_FULL && r->activations == TD_F32 && !r->batch_invariant))
                 ? ATT_REF : r->attention == TD_ATTN_FULL ? ATT_EAGER : ATT_FLASH;
    a.block = r ? r->attn_block : 64;
    a.splits = a.mode == ATT_FLASH && ctx->decode && r->decode_splits > 1 ? r->decode_splits : 1;
    a.TK = HD <= 128 ? 32 : 16;
    a.scale = 1.0f / sqrtf((float)HD);
    a.kfmt = kv_codes(ctx) ? ctx->kv_fmt : (int)TD_F32;
    a.ks = kv_code_scale(ctx);

    /* row groups: runs of one sequence at consecutive positions, at most `run` rows (single
     * rows under split-KV, whose parts differ per row). The flash form without split-KV takes
     * the tiled kernel (attention_tiled.cu) when its runs average 16 rows or more (prefill,
     * teacher forcing), the simple one otherwise (decode); tdc_attn_kernel overrides. */
    static int *gs;
    static int gcap;
    if (N + 1 > gcap) {
        CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
        free(gs);
        gs = (int *)malloc((size_t)(N + 1) * sizeof(int));
        if (!gs) { fprintf(stderr, "tidal: attention_forward_cuda: out of host memory\n"); exit(1); }
        gcap = N + 1;
    }
    static int env_kernel = -1;   /* TIDAL_CUDA_ATTN=simple|tiled|mma: tdc_attn_kernel's default */
    if (env_kernel < 0) {
        const char *e = getenv("TIDAL_CUDA_ATTN");
        env_kernel = e && !strcmp(e, "simple") ? 1 : e && !strcmp(e, "tiled") ? 2 : e && !strcmp(e, "mma") ? 3 : 0;
        if (!tdc_attn_kernel) tdc_attn_kernel = env_kernel;
    }
    /* the tensor-core kernel, asked for: K / V values are the KV cache's format times its scale
     * where kv_write rounds to it, else the activations' format (the rows) */
    int mma = a.mode == ATT_FLASH && a.splits == 1 && tdc_attn_kernel == 3 &&
              attention_mma_allowed(a.D, r->residual_fp32, HD, kv_rounds(ctx) ? (int)r->kv_cache : a.D, a.ks);
    static int mma_noted;
    if (tdc_attn_kernel == 3 && !mma && a.mode == ATT_FLASH && a.splits == 1 && !mma_noted) {
        mma_noted = 1;
        fprintf(stderr, "tidal: TIDAL_CUDA_ATTN=mma: not under this recipe and shape (activations %s, KV "
                "cache %s, kv_scale %g, residual %s, head dim %d; the tensor-core kernel needs q, k, v exact "
                "in bf16 / fp16 and a head dim of 32, 64 or 128): the bit-exact kernels run\n",
                td_format_info((td_format)a.D)->name, td_format_info(r->kv_cache)->name, (double)r->kv_scale,
                r->residual_fp32 ? "fp32" : "activations", HD);
    }
    int tiled = a.mode == ATT_FLASH && a.splits == 1 && tdc_attn_kernel != 1;
    int ng = 0, widest = 1;
    for (int pass = 0; pass < 2; pass++) {
        int run = tiled ? attention_tiled_rows(HD, NH, NKV) : a.splits == 1 ? ATT_ROWS : 1;
        ng = 0;
        widest = 1;
        for (int i = 0; i < N;) {
            int n = 1;
            while (n < run && i + n < N && kv_off[i + n] == kv_off[i] && pos[i + n] == pos[i] + n) n++;
            gs[ng++] = i;
            widest = n > widest ? n : widest;
            i += n;
        }
        gs[ng] = N;
        if (!tiled || tdc_attn_kernel == 2 || mma || N >= 16 * ng) break;
        tiled = 0;   /* short runs: the simple kernel */
    }
    int R = widest > 1 ? ATT_ROWS : 1;   /* decode: a warp per block */

    size_t kvn = kv_extent(kv_off, pos, N, a.KVD) * td_kv_esize(a.kfmt);
    a.q = (const float *)tdc_in(q, (size_t)N * NH * HD * sizeof(float));
    a.k = tdc_in(k, kvn);
    a.v = tdc_in(v, kvn);
    a.kv_off = (const size_t *)tdc_in(kv_off, (size_t)N * sizeof(size_t));
    a.pos = (const int *)tdc_in(pos, (size_t)N * sizeof(int));
    a.gstart = (const int *)tdc_in(gs, (size_t)(ng + 1) * sizeof(int));
    a.out = (float *)tdc_out(out, (size_t)N * NH * HD * sizeof(float), 0);
    a.lse = lse ? (float *)tdc_out(lse, (size_t)N * NH * sizeof(float), 0) : NULL;
    a.part = a.splits > 1 ? (float *)tdc_scratch(TDC_SLOT_ATTN, (size_t)N * NH * a.splits * (HD + 2) * sizeof(float))
                          : NULL;
    if (mma) {
        attention_mma_launch(a.out, a.lse, a.q, a.k, a.v, a.kfmt, a.ks, a.kv_off, a.pos, a.gstart, ng, NH,
                             NKV, HD, a.D, a.block);
        tdc_done();
        return;
    }
    if (tiled) {
        attention_tiled_launch(a.out, a.lse, a.q, a.k, a.v, a.kfmt, a.ks, a.kv_off, a.pos, a.gstart,
                               ng, NH, NKV, HD, a.D, a.block);
        tdc_done();
        return;
    }
    size_t smem = ((size_t)R * HD + (size_t)a.TK * (HD + 1) + (size_t)R * ATT_SEG) * sizeof(float);
    TD_LAUNCH(attn_rows, dim3(ng, NH, a.splits), 32 * R, smem, tdc_stream(), a);
    CUDA_CHECK_LAUNCH();
    if (a.splits > 1) {
        TD_LAUNCH(attn_merge, dim3(N, NH), 32, 0, tdc_stream(), a);
        CUDA_CHECK_LAUNCH();
    }
    tdc_done();
}

/* ---------------------------------------------------------------- KV write */

/* row i to its place: floats rounded as kv_write_cpu rounds them (fmt: the kv_cache format when
 * it rounds, TD_F32 when not), or into a KV cache of codes of cfmt, the code of x / s */
__global__ static void kv_rows(void *store, const float *rows, const size_t *kv_off, const int *pos,
                               int KVD, int fmt, int cfmt, float s)
{
    int i = blockIdx.x;
    size_t d = kv_off[i] + (size_t)pos[i] * KVD;
    const float *src = rows + (size_t)i * KVD;
    for (int c = threadIdx.x; c < KVD; c += blockDim.x) {
        float x = src[c];
        if (cfmt != TD_F32) tdc_kv_put(store, d + c, cfmt, x / s);
        else ((float *)store)[d + c] = fmt == TD_F32 ? x : tdc_round(fmt, x / s) * s;
    }
}

extern "C" void kv_write_cuda(const td_ops *ctx, float *store, const float *rows,
                              const size_t *kv_off, const int *pos, int N, int KVD)
{
    if (N <= 0) return;
    const td_recipe *r = ctx->recipe;
    int round = kv_rounds(ctx), codes = kv_codes(ctx);
    float s = kv_code_scale(ctx);
    int moved = codes;   /* a row not already in its place (a cache of codes is never the rows) */
    for (int i = 0; i < N && !moved; i++)
        moved = store + kv_off[i] + (size_t)pos[i] * KVD != rows + (size_t)i * KVD;
    if (!moved && !round) return;   /* teacher forcing: the rows are the store */
    size_t hi = kv_extent(kv_off, pos, N, KVD);
    void *d_store = tdc_out(store, hi * td_kv_esize(codes ? ctx->kv_fmt : (int)TD_F32), 1);
    const float *d_rows;
    if (!moved)                      /* in place: the rows are inside the staged store */
        d_rows = (const float *)d_store + (rows - store);
    else
        d_rows = (const float *)tdc_in(rows, (size_t)N * KVD * sizeof(float));
    const size_t *d_off = (const size_t *)tdc_in(kv_off, (size_t)N * sizeof(size_t));
    const int *d_pos = (const int *)tdc_in(pos, (size_t)N * sizeof(int));
    TD_LAUNCH(kv_rows, N, 128, 0, tdc_stream(), d_store, d_rows, d_off, d_pos, KVD,
              round ? (int)r->kv_cache : (int)TD_F32, codes ? ctx->kv_fmt : (int)TD_F32, s);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
