/* tidal — attn_tile: the flash form of attention_forward_cuda (attention.cu) for prefill and
 * teacher-forced runs, tiled over many query rows per block (CPU: flash_part in cpu.c).
 *
 * A block is BR "query rows" (64 when HD <= 128, else 32) that share one kv head and one
 * sequence: GQ query heads of one kv head (GQ = 4, 2 or 1, the largest dividing the GQA ratio)
 * times BR / GQ consecutive positions of one run (rows of one sequence at consecutive
 * positions, kv_off equal: a prefill chunk or a teacher-forced sequence). Row r of the block is
 * position r0 + r / GQ under query head h0 + r % GQ. 256 threads.
 *
 * Per key segment (the CPU's: blocks of attn_block keys from key 0, each in segments of at
 * most 256), for every row at once:
 *   scores   K in tiles of 32 keys staged in shared memory, the block's queries staged once;
 *            a thread computes 2 x 4 (row, key) scores (1 x 4 when BR = 32) with four fp32
 *            partial sums each, in the order of cpu.c's 4-lane reduction (attention.cu's
 *            attn_dot), then s = q.k * scale into a (BR, segment) score tile S; keys at or past
 *            a row's end (causal: row sees keys 0..pos) are not used by it;
 *   softmax  4 (8) threads per row: the segment's max (the CPU's running max m_new = max(m,
 *            max s)), alpha = expf(m - m_new), p = expf(s - m_new) in place, then one thread
 *            sums l = l alpha + p in key order (the CPU's fp32 order) and rounds P to the
 *            activations' format D in S (the CPU's D(p) before P.V);
 *   P.V      V in the same 32-key tiles; a thread owns 4 (2) rows x HD/16 columns of o in
 *            registers, scales them by the row's alpha, then adds D(p) v key by key in key order.
 * Output D(o / l) and lse = m + logf(l): every product, sum and rounding is the CPU's in the
 * CPU's order, so the results are the simple kernel's bits (attn_rows, the same tdc_expf) and
 * the CPU's but for expf's rare last bits (tests/cudasim/test_attention_sim.cpp checks both).
 * Arithmetic: fp32 CUDA cores, uncontracted (tdc_mul / tdc_add), no tensor cores: an mma P.V
 * would sum the keys of a tile in another order than the CPU's flash_part.
 * Shared memory: (BR + 32) (HD + 1) + BR (min(attn_block, 256) + 1) + 4 BR floats, 67 KB at
 * HD 128 with blocks of 64 keys, 84 KB with 128 (above the 48 KB default: the launch opts in). */
#include "kern.cuh"

#define AT_THREADS 256
#define AT_TK 32        /* keys per K / V tile: 8 key lanes x 4 keys */
#define AT_SEG 256      /* the CPU's score buffer */

typedef struct {
    float *out, *lse;           /* (N, NH * HD), (N, NH) or NULL */
    const float *q;
    const void *k, *v;          /* floats, or a KV cache's codes of format kfmt times ks */
    const size_t *kv_off;
    const int *pos, *gstart;    /* block x: positions gstart[x] .. gstart[x + 1] - 1 */
    int NH, group, GQ, HD, KVD, D, block, SW, kfmt;
    float scale, ks;
} tile_args;

/* RS rows x 4 keys of scores per thread, RP rows x CT columns of o */
template <int RS, int RP, int CT>
__global__ static void attn_tile(tile_args a)
{
    TD_DYN_SMEM(float, sm);
    const int BR = 32 * RS, HD = a.HD, QP = HD + 1, SW = a.SW, tid = threadIdx.x;
    const int TPR = AT_THREADS / BR;   /* softmax threads per row */
    const int r0 = a.gstart[blockIdx.x], cnt = a.gstart[blockIdx.x + 1] - r0;
    const int h0 = blockIdx.y * a.GQ, QD = a.NH * HD;
    float *qs = sm, *kv = qs + BR * QP, *S = kv + AT_TK * QP, *rm = S + BR * SW, *rl = rm + BR,
          *ra = rl + BR;
    int *re = (int *)(ra + BR);   /* row r's end: keys [0, re[r]) (0: a padding row) */
    const size_t kvb = a.kv_off[r0] + (size_t)(h0 / a.group) * HD;   /* the head's element 0 */

    for (int r = tid; r < BR; r += AT_THREADS) {
        int p = r / a.GQ;
        re[r] = p < cnt ? a.pos[r0 + p] + 1 : 0;
        rm[r] = -INFINITY;
        rl[r] = 0.0f;
    }
    for (int e = tid; e < BR * HD; e += AT_THREADS) {
        int r = e / HD, c = e - r * HD, p = r / a.GQ;
        qs[r * QP + c] = p < cnt ? a.q[(size_t)(r0 + p) * QD + (size_t)(h0 + r % a.GQ) * HD + c] : 0.0f;
    }
    __syncthreads();
    int J1 = 0;   /* the block's keys [0, J1) */
    for (int r = 0; r < BR; r++) J1 = re[r] > J1 ? re[r] : J1;

    /* P.V ownership: rows pr + 16 u, columns pc + 16 t */
    const int pr = tid >> 4, pc = tid & 15;
    float o[RP][CT];
    #pragma unroll
    for (int u = 0; u < RP; u++)
        #pragma unroll
        for (int t = 0; t < CT; t++) o[u][t] = 0.0f;
    /* score ownership: rows sr + 32 u, keys sk + 8 m of a tile */
    const int sr = tid >> 3, sk = tid & 7;
    /* softmax ownership: row xr, lane xs of its TPR */
    const int xr = tid / TPR, xs = tid % TPR;

    for (int b0 = 0; b0 < J1; b0 += a.block) {
        int b1 = b0 + a.block < J1 ? b0 + a.block : J1;
        for (int c0 = b0; c0 < b1; c0 += AT_SEG) {
            int c1 = c0 + AT_SEG < b1 ? c0 + AT_SEG : b1;
            /* scores of the segment */
            for (int t0 = c0; t0 < c1; t0 += AT_TK) {
                int nt = c1 - t0 < AT_TK ? c1 - t0 : AT_TK;
                __syncthreads();
                for (int e = tid; e < nt * HD; e += AT_THREADS) {
                    int j = e / HD, c = e - j * HD;
                    kv[j * QP + c] = tdc_kv_get(a.k, kvb + (size_t)(t0 + j) * a.KVD + c, a.kfmt, a.ks);
                }
                __syncthreads();
                float acc[RS][4][4];
                #pragma unroll
                for (int u = 0; u < RS; u++)
                    #pragma unroll
                    for (int m = 0; m < 4; m++)
                        #pragma unroll
                        for (int l = 0; l < 4; l++) acc[u][m][l] = 0.0f;
                int c = 0;
                for (; c + 4 <= HD; c += 4) {
                    float qv[RS][4], kx[4][4];
                    #pragma unroll
                    for (int u = 0; u < RS; u++)
                        #pragma unroll
                        for (int l = 0; l < 4; l++) qv[u][l] = qs[(sr + 32 * u) * QP + c + l];
                    #pragma unroll
                    for (int m = 0; m < 4; m++)
                        #pragma unroll
                        for (int l = 0; l < 4; l++) kx[m][l] = kv[(sk + 8 * m) * QP + c + l];
                    #pragma unroll
                    for (int u = 0; u < RS; u++)
                        #pragma unroll
                        for (int m = 0; m < 4; m++)
                            #pragma unroll
                            for (int l = 0; l < 4; l++)
                                acc[u][m][l] = tdc_add(acc[u][m][l], tdc_mul(qv[u][l], kx[m][l]));
                }
                for (; c < HD; c++)   /* the tail of HD mod 4: partial 0 */
                    #pragma unroll
                    for (int u = 0; u < RS; u++)
                        #pragma unroll
                        for (int m = 0; m < 4; m++)
                            acc[u][m][0] = tdc_add(acc[u][m][0], tdc_mul(qs[(sr + 32 * u) * QP + c],
                                                                         kv[(sk + 8 * m) * QP + c]));
                #pragma unroll
                for (int u = 0; u < RS; u++)
                    #pragma unroll
                    for (int m = 0; m < 4; m++) {
                        int r = sr + 32 * u, j = t0 + sk + 8 * m;
                        if (sk + 8 * m >= nt || j >= re[r]) continue;
                        float d = (((0.0f + acc[u][m][0]) + acc[u][m][1]) + acc[u][m][2]) + acc[u][m][3];
                        S[r * SW + j - c0] = tdc_mul(d, a.scale);
                    }
            }
            __syncthreads();
            /* online softmax of the segment, row xr */
            {
                float *sx = S + xr * SW;
                int e1 = c1 < re[xr] ? c1 : re[xr];
                int live = c0 < e1;
                float bm = -INFINITY;
                for (int j = c0 + xs; j < e1; j += TPR) bm = sx[j - c0] > bm ? sx[j - c0] : bm;
                for (int w = 1; w < TPR; w <<= 1) {
                    float x = __shfl_xor_sync(TDC_FULL, bm, w);
                    bm = x > bm ? x : bm;
                }
                float m = rm[xr], m_new = bm > m ? bm : m;
                if (live)
                    for (int j = c0 + xs; j < e1; j += TPR) sx[j - c0] = tdc_expf(tdc_sub(sx[j - c0], m_new));
                __syncwarp();
                if (xs == 0) {
                    if (live) {
                        float alpha = tdc_expf(tdc_sub(m, m_new));
                        float l = tdc_mul(rl[xr], alpha);
                        for (int j = c0; j < e1; j++) {
                            float p = sx[j - c0];
                            l = tdc_add(l, p);
                            sx[j - c0] = tdc_round(a.D, p);
                        }
                        rl[xr] = l;
                        rm[xr] = m_new;
                        ra[xr] = alpha;
                    } else {
                        ra[xr] = 1.0f;
                    }
                }
            }
            __syncthreads();
            #pragma unroll
            for (int u = 0; u < RP; u++) {
                float al = ra[pr + 16 * u];
                #pragma unroll
                for (int t = 0; t < CT; t++) o[u][t] = tdc_mul(o[u][t], al);
            }
            /* o += D(p) v, key by key */
            for (int t0 = c0; t0 < c1; t0 += AT_TK) {
                int nt = c1 - t0 < AT_TK ? c1 - t0 : AT_TK;
                __syncthreads();
                for (int e = tid; e < nt * HD; e += AT_THREADS) {
                    int j = e / HD, c = e - j * HD;
                    kv[j * QP + c] = tdc_kv_get(a.v, kvb + (size_t)(t0 + j) * a.KVD + c, a.kfmt, a.ks);
                }
                __syncthreads();
                for (int j = 0; j < nt; j++) {
                    float vv[CT];
                    #pragma unroll
                    for (int t = 0; t < CT; t++) vv[t] = pc + 16 * t < HD ? kv[j * QP + pc + 16 * t] : 0.0f;
                    #pragma unroll
                    for (int u = 0; u < RP; u++) {
                        int r = pr + 16 * u;
                        if (t0 + j >= re[r]) continue;
                        float p = S[r * SW + t0 + j - c0];
                        #pragma unroll
                        for (int t = 0; t < CT; t++) o[u][t] = tdc_add(o[u][t], tdc_mul(p, vv[t]));
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int u = 0; u < RP; u++) {
        int r = pr + 16 * u, p = r / a.GQ;
        if (p >= cnt) continue;
        size_t oi = (size_t)(r0 + p) * QD + (size_t)(h0 + r % a.GQ) * HD;
        float l = rl[r];
        #pragma unroll
        for (int t = 0; t < CT; t++)
            if (pc + 16 * t < HD) a.out[oi + pc + 16 * t] = tdc_round(a.D, o[u][t] / l);
        if (a.lse && pc == 0) a.lse[(size_t)(r0 + p) * a.NH + h0 + r % a.GQ] = rm[r] + tdc_logf(l);
    }
}

/* The heads per block for a GQA ratio: the largest of 4, 2, 1 dividing it */
static int tile_gq(int group) { return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1; }

extern "C" int attention_tiled_rows(int HD, int NH, int NKV)
{
    return (HD <= 128 ? 64 : 32) / tile_gq(NH / NKV);
}

/* q, k, v, kv_off, pos: device pointers (k, v: floats, or codes of kfmt times ks: kern.cuh
 * tdc_kv_get); gstart: device, ng + 1 entries (runs of at most attention_tiled_rows positions) */
extern "C" void attention_tiled_launch(float *out, float *lse, const float *q, const void *k,
                                       const void *v, int kfmt, float ks, const size_t *kv_off,
                                       const int *pos, const int *gstart, int ng, int NH, int NKV,
                                       int HD, int D, int block)
{
    tile_args a;
    a.out = out; a.lse = lse; a.q = q; a.k = k; a.v = v; a.kfmt = kfmt; a.ks = ks;
    a.kv_off = kv_off; a.pos = pos;
    a.gstart = gstart;
    a.NH = NH; a.group = NH / NKV; a.GQ = tile_gq(a.group); a.HD = HD; a.KVD = NKV * HD; a.D = D;
    a.block = block;
    a.SW = (block < AT_SEG ? block : AT_SEG) + 1;
    a.scale = 1.0f / sqrtf((float)HD);
    void (*kern)(tile_args) = HD <= 64 ? attn_tile<2, 4, 4> : HD <= 128 ? attn_tile<2, 4, 8>
                                                                        : attn_tile<1, 2, 16>;
    int BR = HD <= 128 ? 64 : 32;
    size_t smem = ((size_t)(BR + AT_TK) * (HD + 1) + (size_t)BR * a.SW + 4 * (size_t)BR) * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    TD_LAUNCH(kern, dim3(ng, NH / a.GQ), AT_THREADS, smem, tdc_stream(), a);
    CUDA_CHECK_LAUNCH();
}
