/* tidal — attn_mma: the flash form of attention_forward_cuda (attention.cu) for prefill and
 * teacher-forced runs on tensor cores (WMMA m16n16k16, bf16 or fp16 inputs, fp32 accumulation).
 * Not bit-exact: the CPU's flash_part (cpu.c) and the bit-exact tiled kernel (attention_tiled.cu)
 * sum q.k and P.V key by key in fp32; an MMA sums a tile's products in its own order. The
 * recipe's rounding points are kept: P rounded to the activations' format D before P.V, the
 * output rounded to D, an online softmax (fp32 running max and sum) over key segments.
 *
 * Only where the recipe's arithmetic allows it (attention_mma_allowed): D bf16 or fp16 (the MMA's
 * input type is D), no residual_fp32 (bf16-autocast: an unmerged LoRA's fp32 add can reach K and
 * V unrounded), head dims 32, 64 and 128, and K / V exactly representable in D: the rows themselves
 * (q after RoPE, k, v after their projections are rounded to D by the recipe), a KV cache of D
 * codes, or e4m3 / e5m2 codes times a power-of-two kv_scale within D's range. Then converting
 * q, k, v and D(p) to 16-bit codes is exact and every product is the CPU's product exactly;
 * only the summation order and P's rounding (against another running max, below) differ.
 * (Under the simulator a conversion that is not exact aborts.)
 *
 * A block: 64 "query rows" (as attn_tile: GQ query heads of one kv head, GQ = 4, 2 or 1, times
 * 64 / GQ consecutive positions of one run; row r is position r0 + r / GQ, head h0 + r % GQ),
 * 4 warps of 16 rows each; 128 threads. Per key segment of SEG keys from key 0 (the recipe's
 * attn_block when it is 64 or 128: the CPU's own segments; else 128 when attn_block is a
 * multiple of 128, 64 when not):
 *   scores   K in tiles of 64 keys through shared memory as 16-bit codes (decoded from a KV
 *            cache of codes; keys past the segment zero); each warp S = Q K^T for its 16 rows
 *            (Q staged once as codes), fp32 accumulators, stored to the warp's S buffer;
 *   softmax  two lanes per row: s = S scale (fp32), masked past the row's end (causal by pos),
 *            segment max, m_new = max(m, max s), alpha = expf(m - m_new), p = expf(s - m_new)
 *            (tdc_expf, the tiled kernel's: glibc's expf but for rare last bits),
 *            l = l alpha + sum p (fp32: each lane's keys in order, then the two lanes), P = the
 *            D code of p (0 where masked);
 *   P.V      O (16 x HD per warp, HD / 16 accumulator fragments) scaled by each row's alpha, then
 *            O += P V over V tiles of 64 keys on tensor cores.
 * Output D(o / l), lse = m + logf(l). The per-row alpha reaches the accumulator's elements
 * through a fragment of row indices loaded from memory (the element-to-lane mapping of a WMMA
 * fragment is unspecified, but it is one mapping for every fragment of the type, so element i of
 * that fragment is element i's row in any other); the output goes through shared memory.
 * Differences from the CPU: the summation orders of q.k (fp32, another order: the scores differ
 * by fp32 ulps), of P.V and of l; with attn_block 64 or 128 the segments and so the running
 * maxima are the CPU's, otherwise (blocks of 256 or more) a segment's max can be lower than the
 * CPU's and p = expf(s - m_new) is rounded to D from another scale. tests/cudasim/
 * test_attention_sim.cpp (test_mma_*) measures the differences against the CPU, the tiled kernel
 * and the fp32 reference; reports/gpu/README.md has the figures. Asked for by
 * TIDAL_CUDA_ATTN=mma (attention.cu), never the default.
 * Shared memory (bytes): 3 x 64 (HD + 8) x 2 (Q, K, V codes) + 4 warps x (16 x 132 x 4 + 16 x
 * 136 x 2) (S, P) + 1,024: 102 KB at HD 128, 78 KB at HD 64, 67 KB at HD 32 (the launch opts
 * in above 48 KB). */
#include "kern.cuh"

#ifdef TD_CUDASIM
#include "cudasim_wmma.h"
#include <stdio.h>
#include <stdlib.h>
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif
#include <type_traits>

using namespace nvcuda;

#define AM_THREADS 128
#define AM_BR 64      /* query rows a block, 16 a warp */
#define AM_TK 64      /* keys a K / V tile */
#define AM_SEGMAX 128 /* keys a softmax segment, at most */
#define AM_SLD (AM_SEGMAX + 4)
#define AM_PLD (AM_SEGMAX + 8)

typedef struct {
    float *out, *lse;           /* (N, NH * HD), (N, NH) or NULL */
    const float *q;
    const void *k, *v;          /* floats, or a KV cache's codes of format kfmt times ks */
    const size_t *kv_off;
    const int *pos, *gstart;    /* block x: positions gstart[x] .. gstart[x + 1] - 1 */
    int NH, group, GQ, KVD, D, seg, kfmt;
    float scale, ks;
} mma_args;

/* the 16-bit code of x in D (bf16 or fp16), x a value of D: exact */
template <class T> __device__ static inline uint16_t am_code(float x)
{
    uint16_t c = std::is_same<T, __nv_bfloat16>::value ? tdc_bf16_enc(x) : tdc_f16_enc(x);
#ifdef TD_CUDASIM
    float back = std::is_same<T, __nv_bfloat16>::value ? tdc_bf16_dec(c) : tdc_f16_dec(c);
    if (tdc_bits(back) != tdc_bits(x)) {
        fprintf(stderr, "attn_mma: operand %a is not a value of the MMA's input type: the recipe's "
                "arithmetic does not allow the tensor-core kernel here (attention_mma_allowed)\n", (double)x);
        abort();
    }
#endif
    return c;
}

template <class T, int HD>
__global__ static void attn_mma(mma_args a)
{
    TD_DYN_SMEM(unsigned char, raw);
    constexpr int QLD = HD + 8, NF = HD / 16;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_t;
    unsigned char *base = (unsigned char *)(((uintptr_t)raw + 127) & ~(uintptr_t)127);
    uint16_t *qs = (uint16_t *)base, *ks = qs + AM_BR * QLD, *vs = ks + AM_TK * QLD;
    float *sbuf = (float *)(vs + AM_TK * QLD);
    uint16_t *pbuf = (uint16_t *)(sbuf + 4 * 16 * AM_SLD);
    float *rm = (float *)(pbuf + 4 * 16 * AM_PLD), *rl = rm + AM_BR, *ra = rl + AM_BR;
    int *re = (int *)(ra + AM_BR);   /* row r's end: keys [0, re[r]) (0: a padding row) */

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int r0 = a.gstart[blockIdx.x], cnt = a.gstart[blockIdx.x + 1] - r0;
    const int h0 = blockIdx.y * a.GQ, QD = a.NH * HD, SEG = a.seg;
    const size_t kvb = a.kv_off[r0] + (size_t)(h0 / a.group) * HD;   /* the head's element 0 */
    const int fast = a.kfmt == a.D && a.ks == 1.0f;   /* K/V codes of D: copied as they are */
    float *sw = sbuf + w * 16 * AM_SLD;
    uint16_t *pw = pbuf + w * 16 * AM_PLD;

    for (int r = tid; r < AM_BR; r += AM_THREADS) {
        int p = r / a.GQ;
        re[r] = p < cnt ? a.pos[r0 + p] + 1 : 0;
        rm[r] = -INFINITY;
        rl[r] = 0.0f;
    }
    for (int e = tid; e < AM_BR * HD; e += AM_THREADS) {
        int r = e / HD, c = e - r * HD, p = r / a.GQ;
        float x = p < cnt ? a.q[(size_t)(r0 + p) * QD + (size_t)(h0 + r % a.GQ) * HD + c] : 0.0f;
        qs[r * QLD + c] = am_code<T>(x);
    }
    /* the row index of each accumulator element: a fragment loaded from r at (r, c) */
    for (int e = lane; e < 256; e += 32) sw[(e >> 4) * AM_SLD + (e & 15)] = (float)(e >> 4);
    __syncthreads();
    acc_t rowid;
    wmma::load_matrix_sync(rowid, sw, AM_SLD, wmma::mem_row_major);
    int J1 = 0, wend = 0;   /* the block's keys [0, J1), this warp's [0, wend) */
    for (int r = 0; r < AM_BR; r++) {
        J1 = re[r] > J1 ? re[r] : J1;
        if (r >> 4 == w) wend = re[r] > wend ? re[r] : wend;
    }
    acc_t o[NF];
    #pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
    const int lr = lane >> 1, half = lane & 1, row = 16 * w + lr;   /* softmax: a row, half its keys */

    for (int s0 = 0; s0 < J1; s0 += SEG) {
        const int s1 = s0 + SEG < J1 ? s0 + SEG : J1;
        const int live = s0 < wend;   /* warp-uniform */
        /* S = Q K^T over the segment, tiles of 64 keys */
        for (int t0 = s0; t0 < s1; t0 += AM_TK) {
            __syncthreads();
            for (int e = tid; e < AM_TK * HD; e += AM_THREADS) {
                int j = e / HD, c = e - j * HD;
                size_t idx = kvb + (size_t)(t0 + j) * a.KVD + c;
                ks[j * QLD + c] = t0 + j >= s1 ? (uint16_t)0
                                : fast ? ((const uint16_t *)a.k)[idx] : am_code<T>(tdc_kv_get(a.k, idx, a.kfmt, a.ks));
            }
            __syncthreads();
            if (!live || t0 >= wend) continue;
            #pragma unroll
            for (int n = 0; n < AM_TK / 16; n++) {
                acc_t s;
                wmma::fill_fragment(s, 0.0f);
                #pragma unroll
                for (int kk = 0; kk < NF; kk++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
                    wmma::load_matrix_sync(qf, (const T *)(qs + 16 * w * QLD + 16 * kk), QLD);
                    wmma::load_matrix_sync(kf, (const T *)(ks + 16 * n * QLD + 16 * kk), QLD);
                    wmma::mma_sync(s, qf, kf, s);
                }
                wmma::store_matrix_sync(sw + (t0 - s0) + 16 * n, s, AM_SLD, wmma::mem_row_major);
            }
        }
        if (live) {
            __syncwarp();
            /* online softmax of the segment: row `row`, keys s0 + half, s0 + half + 2, ... */
            float *sx = sw + lr * AM_SLD;
            const int e1 = s1 < re[row] ? s1 : re[row];
            float bm = -INFINITY;
            for (int j = s0 + half; j < e1; j += 2) {
                float s = tdc_mul(sx[j - s0], a.scale);
                sx[j - s0] = s;
                bm = s > bm ? s : bm;
            }
            float x = __shfl_xor_sync(TDC_FULL, bm, 1);
            bm = x > bm ? x : bm;
            const float m = rm[row], m_new = bm > m ? bm : m;
            const float alpha = m_new == m ? 1.0f : tdc_expf(tdc_sub(m, m_new));
            float sum = 0.0f;
            for (int j = s0 + half; j < s0 + SEG; j += 2) {
                float p = j < e1 ? tdc_expf(tdc_sub(sx[j - s0], m_new)) : 0.0f;
                sum = tdc_add(sum, p);
                pw[lr * AM_PLD + j - s0] = std::is_same<T, __nv_bfloat16>::value ? tdc_bf16_enc(p) : tdc_f16_enc(p);
            }
            sum = tdc_add(sum, __shfl_xor_sync(TDC_FULL, sum, 1));
            __syncwarp();
            if (half == 0) {
                rl[row] = tdc_add(tdc_mul(rl[row], alpha), sum);
                rm[row] = m_new;
                ra[row] = alpha;
            }
            __syncwarp();
            #pragma unroll
            for (int f = 0; f < NF; f++)
                for (int i = 0; i < o[f].num_elements; i++)
                    o[f].x[i] = tdc_mul(o[f].x[i], ra[16 * w + (int)rowid.x[i]]);
        }
        /* O += P V, tiles of 64 keys */
        for (int t0 = s0; t0 < s1; t0 += AM_TK) {
            __syncthreads();
            for (int e = tid; e < AM_TK * HD; e += AM_THREADS) {
                int j = e / HD, c = e - j * HD;
                size_t idx = kvb + (size_t)(t0 + j) * a.KVD + c;
                vs[j * QLD + c] = t0 + j >= s1 ? (uint16_t)0
                                : fast ? ((const uint16_t *)a.v)[idx] : am_code<T>(tdc_kv_get(a.v, idx, a.kfmt, a.ks));
            }
            __syncthreads();
            if (!live || t0 >= wend) continue;
            #pragma unroll
            for (int kk = 0; kk < AM_TK / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf;
                wmma::load_matrix_sync(pf, (const T *)(pw + (t0 - s0) + 16 * kk), AM_PLD);
                #pragma unroll
                for (int f = 0; f < NF; f++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
                    wmma::load_matrix_sync(vf, (const T *)(vs + 16 * kk * QLD + 16 * f), QLD);
                    wmma::mma_sync(o[f], pf, vf, o[f]);
                }
            }
        }
    }
    /* out = D(o / l) through the warp's S buffer (16 x HD floats), lse = m + logf(l) */
    __syncwarp();
    #pragma unroll
    for (int f = 0; f < NF; f++) wmma::store_matrix_sync(sw + 16 * f, o[f], AM_SLD, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * HD; e += 32) {
        int r = 16 * w + e / HD, c = e % HD, p = r / a.GQ;
        if (p >= cnt) continue;
        size_t oi = (size_t)(r0 + p) * QD + (size_t)(h0 + r % a.GQ) * HD + c;
        a.out[oi] = tdc_round(a.D, sw[(e / HD) * AM_SLD + c] / rl[r]);
    }
    if (a.lse && lane < 16) {
        int r = 16 * w + lane, p = r / a.GQ;
        if (p < cnt) a.lse[(size_t)(r0 + p) * a.NH + h0 + r % a.GQ] = rm[r] + tdc_logf(rl[r]);
    }
}

/* whether a value of format f times s (a KV cache's element: its code's value times kv_scale)
 * is always a value of D (bf16 or fp16) */
static int am_exact(int D, int f, float s)
{
    if (f == D) return s == 1.0f;
    if (f != TD_E4M3 && f != TD_E5M2) return 0;
    int e;
    if (!(s > 0) || frexpf(s, &e) != 0.5f) return 0;   /* s = 2^(e - 1) */
    e -= 1;
    /* the format's smallest subnormal and largest finite value: 2^lo, (7/4) 2^hi */
    int lo = f == TD_E4M3 ? -9 : -16, hi = f == TD_E4M3 ? 8 : 15;
    if (D == TD_BF16) return lo + e >= -133 && hi + e <= 126;
    return lo + e >= -24 && hi + e <= 15 && ldexp(1.75, hi + e) <= 65504.0;
}

/* the recipe's arithmetic allows the tensor-core kernel: D (activations) bf16 or fp16, no
 * residual_fp32, HD 32, 64 or 128, K / V values of vfmt times vs (the KV cache's format and scale
 * where kv_write rounds to it, else D and 1) exact in D */
extern "C" int attention_mma_allowed(int D, int residual_fp32, int HD, int vfmt, float vs)
{
    if ((D != TD_BF16 && D != TD_F16) || residual_fp32 || (HD != 32 && HD != 64 && HD != 128)) return 0;
    return am_exact(D, vfmt, vs);
}

/* as attention_tiled_launch (runs of at most attention_tiled_rows positions: 64 rows a block) */
extern "C" void attention_mma_launch(float *out, float *lse, const float *q, const void *k, const void *v,
                                     int kfmt, float ks, const size_t *kv_off, const int *pos,
                                     const int *gstart, int ng, int NH, int NKV, int HD, int D, int block)
{
    mma_args a;
    a.out = out; a.lse = lse; a.q = q; a.k = k; a.v = v; a.kfmt = kfmt; a.ks = ks;
    a.kv_off = kv_off; a.pos = pos; a.gstart = gstart;
    a.NH = NH; a.group = NH / NKV;
    a.GQ = a.group % 4 == 0 ? 4 : a.group % 2 == 0 ? 2 : 1;   /* attention_tiled.cu's tile_gq */
    a.KVD = NKV * HD; a.D = D;
    a.seg = block == 64 || block % 128 ? 64 : 128;
    a.scale = 1.0f / sqrtf((float)HD);
    void (*kern)(mma_args) =
        D == TD_BF16 ? (HD == 32 ? attn_mma<__nv_bfloat16, 32> : HD == 64 ? attn_mma<__nv_bfloat16, 64> : attn_mma<__nv_bfloat16, 128>)
                     : (HD == 32 ? attn_mma<__half, 32> : HD == 64 ? attn_mma<__half, 64> : attn_mma<__half, 128>);
    size_t smem = 128 + (size_t)(AM_BR + 2 * AM_TK) * (HD + 8) * 2 + 4 * 16 * ((size_t)AM_SLD * 4 + AM_PLD * 2)
                + 4 * AM_BR * 4;
    CUDA_CHECK(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    TD_LAUNCH(kern, dim3(ng, NH / a.GQ), AM_THREADS, smem, tdc_stream(), a);
    CUDA_CHECK_LAUNCH();
}
