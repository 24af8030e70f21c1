/* tidal — embedding_backward_cuda (ops.h embedding_backward; CPU: embedding_backward_cpu, which
 * is embedding_backward_ref in cpu_backward_ref.c): dembed[tokens[i]] += dout[i] for every row i,
 * an fp32 gradient (never rounded, under any recipe).
 *
 * Deterministic, without atomics: the rows are grouped by token on the host (tokens are host
 * memory, ops.h), a stable sort of the row indices by token, so the rows of one token stay in
 * increasing order. Then one block per (distinct token, slice of 256 columns), one thread per
 * column, which reads the gradient's value and adds that token's rows to it one after another in
 * increasing row order: the CPU's fp32 additions in the CPU's order, bit for bit. A token's row
 * is written by one thread per column only, so no two threads touch one element.
 *
 * dembed's size is not given (ops.h passes no vocabulary size, as for embedding.cu): a device
 * gradient is used as it is; a host one is staged up to the largest token's row (copied in and
 * back). Scratch: none (the groups travel as a per-call input, tdc_in). */
#include "kern.cuh"

#include <algorithm>
#include <vector>

#define EMB_THREADS 256

/* grp: utok[U], then ustart[U + 1] (offsets into rows), then rows[N] (row indices by token) */
__global__ static void embed_scatter_add(float *dembed, const float *dout, const int *grp, int U,
                                         int C)
{
    int g = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int *ustart = grp + U, *rows = grp + 2 * U + 1;
    float *d = dembed + (size_t)grp[g] * C + c;
    float acc = *d;
    for (int r = ustart[g]; r < ustart[g + 1]; r++) acc = tdc_add(acc, dout[(size_t)rows[r] * C + c]);
    *d = acc;
}

extern "C" void embedding_backward_cuda(const td_ops *ctx, float *dembed, const float *dout,
                                        const int *tokens, int N, int C)
{
    (void)ctx;
    if (!dembed || N <= 0 || C <= 0) return;
    std::vector<int> rows(N);
    for (int i = 0; i < N; i++) rows[i] = i;
    std::stable_sort(rows.begin(), rows.end(), [&](int a, int b) { return tokens[a] < tokens[b]; });
    std::vector<int> utok, ustart;
    for (int r = 0; r < N; r++)
        if (r == 0 || tokens[rows[r]] != tokens[rows[r - 1]]) {
            utok.push_back(tokens[rows[r]]);
            ustart.push_back(r);
        }
    ustart.push_back(N);
    int U = (int)utok.size(), maxtok = utok.back();
    std::vector<int> grp;
    grp.reserve((size_t)2 * U + 1 + N);
    grp.insert(grp.end(), utok.begin(), utok.end());
    grp.insert(grp.end(), ustart.begin(), ustart.end());
    grp.insert(grp.end(), rows.begin(), rows.end());
    const int *d_grp = (const int *)tdc_in(grp.data(), grp.size() * sizeof(int));
    const float *d_dout = (const float *)tdc_in(dout, (size_t)N * C * sizeof(float));
    float *d_emb = (float *)tdc_out(dembed, (size_t)(maxtok + 1) * C * sizeof(float), 1);
    dim3 grid((unsigned)U, (unsigned)((C + EMB_THREADS - 1) / EMB_THREADS));
    TD_LAUNCH(embed_scatter_add, grid, EMB_THREADS, 0, tdc_stream(), d_emb, d_dout, d_grp, U, C);
    CUDA_CHECK_LAUNCH();
    tdc_done();   /* synchronises when it copies back; grp's staging copy was made before */
}
