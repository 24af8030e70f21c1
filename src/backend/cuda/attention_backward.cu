/* tidal — attention_backward_cuda (ops.h attention_backward; CPU: attention_backward_cpu in
 * cpu_backward.c over attention_backward_rounded in cpu_backward_ref.c): causal GQA attention of
 * packed whole sequences (teacher forcing: rows of one sequence consecutive, positions 0, 1, ...;
 * a sequence starts where pos does not count up by one, as the CPU finds them). P is recomputed
 * from q, k and the forward's log-sum-exp, FlashAttention-2's backward with the CPU's rounding
 * points, D the activations dtype:
 *   s = scale (q . k),  p = td_expf(s - lse),  dp = dout . v,  Di = sum_c dout[c] out[c]
 *   P = D(p),  dS = D(p (dp - Di))                    (the GEMM operands, rounded as the CPU)
 *   dq = D(dq + scale sum_j dS_ij k_j)
 *   dk = D(dk + scale sum_{i, h in the group} dS_ij q_i),  dv = D(dv + sum_{i, h} P_ij dout_i)
 * Two kernels, no atomics, so every run gives the same bits:
 *   attn_bwd_dq   one warp per (query row, head); lanes own columns c = lane + 32 t (HD <= 256:
 *                 8 registers); Di summed in fp32 in column order as the CPU (each lane the
 *                 same sum; written to scratch slot TDC_SLOT_ATTN for the second kernel); then the
 *                 row's keys in order, each score and dp a warp sum, dS k accumulated per column
 *   attn_bwd_dkv  one warp per (key row, kv head): the group's heads in order, for each the
 *                 query rows that see the key (its own row to the sequence's end) in order,
 *                 scores recomputed (the same sums as attn_bwd_dq's, so the same p and dS)
 * The CPU computes its scores, dp and the three gradients with OpenBLAS's sgemm (blocks of
 * ATT_BLOCK query rows, the library's own summation order), so the fp32 sums are the same terms
 * in another order: not bit for bit. Di and the roundings of P, dS and the gradients are the
 * CPU's; fp32 operations uncontracted (tdc_mul / tdc_add). The test's tolerance
 * (tests/cudasim/test_backward_sim.cpp) is a normalised error. Not tuned: the scores are computed
 * twice (once per kernel) and each warp walks its keys one at a time. `scratch` and `max_keys`
 * (the CPU's score buffers) are not used. Scratch: TDC_SLOT_ATTN (N * NH floats, Di). */
#include "kern.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define AB_MAXT 8   /* columns per lane: HD <= 256 */

/* the warp's sum of a . b over HD columns, lanes over c = lane + 32 t, fp32 uncontracted */
TDC_DEV float warp_dot(const float *a, const float *b, int HD)
{
    float s = 0.0f;
    for (int c = threadIdx.x & 31; c < HD; c += 32) s = tdc_add(s, tdc_mul(a[c], b[c]));
    for (int o = 16; o > 0; o >>= 1) s = tdc_add(s, __shfl_xor_sync(TDC_FULL, s, o));
    return s;
}

__global__ static void attn_bwd_dq(float *dq, float *Dbuf, const float *dout, const float *q,
                                   const float *k, const float *v, const float *out,
                                   const float *lse, const int *sstart, int NH, int NKV, int HD,
                                   float scale, int D)
{
    int i = blockIdx.x / NH, h = blockIdx.x % NH, lane = threadIdx.x;
    int QD = NH * HD, KVD = NKV * HD, kvh = h / (NH / NKV);
    const float *qh = q + (size_t)i * QD + (size_t)h * HD;
    const float *doh = dout + (size_t)i * QD + (size_t)h * HD;
    const float *oh = out + (size_t)i * QD + (size_t)h * HD;
    float Di = 0.0f;
    for (int c = 0; c < HD; c++) Di = tdc_add(Di, tdc_mul(doh[c], oh[c]));
    if (lane == 0) Dbuf[(size_t)i * NH + h] = Di;
    float l = lse[(size_t)i * NH + h], acc[AB_MAXT];
    for (int t = 0; t < AB_MAXT; t++) acc[t] = 0.0f;
    for (int j = sstart[i]; j <= i; j++) {
        const float *kj = k + (size_t)j * KVD + (size_t)kvh * HD;
        const float *vj = v + (size_t)j * KVD + (size_t)kvh * HD;
        float s = tdc_mul(scale, warp_dot(qh, kj, HD)), dp = warp_dot(doh, vj, HD);
        float p = tdc_td_expf(tdc_sub(s, l));
        float ds = tdc_round(D, tdc_mul(p, tdc_sub(dp, Di)));
        for (int t = 0, c = lane; c < HD; t++, c += 32) acc[t] = tdc_add(acc[t], tdc_mul(ds, kj[c]));
    }
    float *dqh = dq + (size_t)i * QD + (size_t)h * HD;
    for (int t = 0, c = lane; c < HD; t++, c += 32)
        dqh[c] = tdc_round(D, tdc_add(dqh[c], tdc_mul(scale, acc[t])));
}

__global__ static void attn_bwd_dkv(float *dk, float *dv, const float *Dbuf, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, const int *send, int NH, int NKV, int HD,
                                    float scale, int D)
{
    int j = blockIdx.x / NKV, kvh = blockIdx.x % NKV, lane = threadIdx.x, group = NH / NKV;
    int QD = NH * HD, KVD = NKV * HD;
    const float *kj = k + (size_t)j * KVD + (size_t)kvh * HD;
    const float *vj = v + (size_t)j * KVD + (size_t)kvh * HD;
    float ak[AB_MAXT], av[AB_MAXT];
    for (int t = 0; t < AB_MAXT; t++) ak[t] = av[t] = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int i = j; i < send[j]; i++) {
            const float *qh = q + (size_t)i * QD + (size_t)h * HD;
            const float *doh = dout + (size_t)i * QD + (size_t)h * HD;
            float s = tdc_mul(scale, warp_dot(qh, kj, HD)), dp = warp_dot(doh, vj, HD);
            float p = tdc_td_expf(tdc_sub(s, lse[(size_t)i * NH + h]));
            float ds = tdc_round(D, tdc_mul(p, tdc_sub(dp, Dbuf[(size_t)i * NH + h])));
            float P = tdc_round(D, p);
            for (int t = 0, c = lane; c < HD; t++, c += 32) {
                av[t] = tdc_add(av[t], tdc_mul(P, doh[c]));
                ak[t] = tdc_add(ak[t], tdc_mul(ds, qh[c]));
            }
        }
    float *dkj = dk + (size_t)j * KVD + (size_t)kvh * HD;
    float *dvj = dv + (size_t)j * KVD + (size_t)kvh * HD;
    for (int t = 0, c = lane; c < HD; t++, c += 32) {
        dvj[c] = tdc_round(D, tdc_add(dvj[c], av[t]));
        dkj[c] = tdc_round(D, tdc_add(dkj[c], tdc_mul(scale, ak[t])));
    }
}

extern "C" void attention_backward_cuda(const td_ops *ctx, float *dq, float *dk, float *dv,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        const int *pos, int N, int NH, int NKV, int HD,
                                        float *scratch, int max_keys)
{
    (void)scratch;
    (void)max_keys;
    if (N <= 0 || NH <= 0 || NKV <= 0 || HD <= 0) return;
    if (HD > 32 * AB_MAXT || NH % NKV) {
        fprintf(stderr, "tidal: attention_backward_cuda: head dim %d (at most %d) or %d heads over "
                "%d kv heads not supported\n", HD, 32 * AB_MAXT, NH, NKV);
        exit(1);
    }
    /* each row's sequence: its first row and one past its last (pos is host memory) */
    std::vector<int> se((size_t)2 * N);
    for (int i = 0; i < N; i++) se[i] = i == 0 || pos[i] != pos[i - 1] + 1 ? i : se[i - 1];
    for (int i = N - 1; i >= 0; i--) se[N + i] = i == N - 1 || se[i + 1] != se[i] ? i + 1 : se[N + i + 1];
    int D = tdc_recipe_of(ctx).act;
    float scale = 1.0f / sqrtf((float)HD);
    size_t qb = (size_t)N * NH * HD * sizeof(float), kb = (size_t)N * NKV * HD * sizeof(float);
    const int *d_se = (const int *)tdc_in(se.data(), se.size() * sizeof(int));
    const float *d_dout = (const float *)tdc_in(dout, qb), *d_q = (const float *)tdc_in(q, qb);
    const float *d_out = (const float *)tdc_in(out, qb);
    const float *d_k = (const float *)tdc_in(k, kb), *d_v = (const float *)tdc_in(v, kb);
    const float *d_lse = (const float *)tdc_in(lse, (size_t)N * NH * sizeof(float));
    float *d_dq = (float *)tdc_out(dq, qb, 1), *d_dk = (float *)tdc_out(dk, kb, 1);
    float *d_dv = (float *)tdc_out(dv, kb, 1);
    float *Dbuf = (float *)tdc_scratch(TDC_SLOT_ATTN, (size_t)N * NH * sizeof(float));
    TD_LAUNCH(attn_bwd_dq, (unsigned)N * NH, 32, 0, tdc_stream(), d_dq, Dbuf, d_dout, d_q, d_k, d_v,
              d_out, d_lse, d_se, NH, NKV, HD, scale, D);
    CUDA_CHECK_LAUNCH();
    TD_LAUNCH(attn_bwd_dkv, (unsigned)N * NKV, 32, 0, tdc_stream(), d_dk, d_dv, Dbuf, d_dout, d_q,
              d_k, d_v, d_lse, d_se + N, NH, NKV, HD, scale, D);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
