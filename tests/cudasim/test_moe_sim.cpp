/* The CUDA backend's mixture-of-experts row ops (src/backend/cuda/moe.cu, moe_backward.cu: ops.h
 * moe_gather, moe_combine, moe_scatter, moe_sum, moe_shared_combine and the backward's
 * moe_combine_backward, moe_scatter_add, moe_shared_combine_backward) against the CPU backend's
 * (src/backend/cpu_moe.c, the arithmetic src/model/moe.c did on the host), BIT FOR BIT, on seeded
 * random layers: N = 13 rows, E = 5 experts, top-K = 2 and 3, C = 300 columns (two column blocks),
 * each row's K experts distinct and the pairs planned per expert in row order as moe.c plans them
 * (plus a plan with a row listed twice, as a replayed routing could list it: the CPU adds it twice
 * in list order, so must the device). Experts run one call after another, in expert order, on
 * both sides.
 *
 * Recipes: every dtype pair the ops round to, D the activations dtype and R the stream's (R = D, or
 * fp32 under residual_fp32): no recipe and fp32 (D = R = fp32), bf16-train and fp16-train (D = R),
 * bf16-autocast and fp16-train with residual_fp32 (D = bf16 / fp16, R = fp32), vllm-bf16 and
 * vllm-fp16 (the fused path's scatter and moe_sum, D = bf16 / fp16). Inputs are what the ops see
 * in a layer: the stream's rows in R (or D), expert outputs in D (fp32 for the fused down GEMM's
 * accumulator), weights in R; the shared gate's logits spread over [-12, 12] with the edges of
 * expf's ranges (+-88.5, +-104, +-Inf, 0).
 *
 * Every op runs four ways (simtest.h sim_four_ways: host and device buffers, CUDASIM_ORDER forward
 * and reverse): the same bits each way (no race between the blocks of one launch). The shared
 * expert's gate calls expf; the kernels call glibc's algorithm (expf_glibc.cuh), checked first on
 * 2^20 inputs (every 4096th fp32 pattern and the range edges) against this machine's expf: where
 * the C library computes otherwise the bits cannot match and the test says so (it fails). */
#include "cuda_internal.cuh"
#include "expf_glibc.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static td_rng RNG;
enum { N = 13, E = 5, C = 300 };

/* ---- recipes ------------------------------------------------------------------------------ */

static std::vector<sim_rcase> recipes(void)
{
    std::vector<sim_rcase> v;
    v.push_back({"(none)", sim_preset("fp32"), 1});
    const char *names[] = {"fp32", "bf16-train", "fp16-train", "bf16-autocast", "vllm-bf16", "vllm-fp16"};
    for (const char *n : names) v.push_back({n, sim_preset(n), 0});
    td_recipe r = sim_preset("fp16-train");
    r.residual_fp32 = 1;   /* fp16 under autocast: D = fp16, R = fp32 */
    v.push_back({"fp16+res32", r, 0});
    return v;
}

static int stream_D(const sim_rcase &rc) { return rc.none || rc.r.residual_fp32 ? TD_F32 : rc.r.activations; }

static void exact(const char *op, const char *rname, const float *g, const float *c, size_t n)
{
    sim_exact(28, 13, op, rname, g, c, n);
}

/* ---- a layer's routing, planned as moe.c plans it ----------------------------------------- */

struct plan {
    int K;
    std::vector<int> rows, start;   /* every expert's pairs i * K + j in row order; expert e's: [start[e], start[e+1]) */
    std::vector<float> w;           /* (N * K) routing weights */
};

/* K distinct experts per row; dup: row 4 chooses expert 1 twice (a replayed routing's list) */
static plan make_plan(int K, int R, int dup)
{
    plan p;
    p.K = K;
    std::vector<int> ex((size_t)N * K);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < K; j++) {
            int e, taken;
            do {
                e = (int)td_rng_below(&RNG, E);
                taken = 0;
                for (int t = 0; t < j; t++) taken |= ex[(size_t)i * K + t] == e;
            } while (taken);
            ex[(size_t)i * K + j] = e;
        }
    if (dup) ex[(size_t)4 * K] = ex[(size_t)4 * K + 1] = 1;
    p.start.assign(E + 1, 0);
    for (int e : ex) p.start[e + 1]++;
    for (int e = 0; e < E; e++) p.start[e + 1] += p.start[e];
    std::vector<int> next(p.start.begin(), p.start.end() - 1);
    p.rows.resize((size_t)N * K);
    for (int q = 0; q < N * K; q++) p.rows[next[ex[q]]++] = q;
    p.w = sim_rounded(sim_normal(&RNG, (size_t)N * K, 0.4), R);
    return p;
}

/* every value an R value */
static void all_in(int R, const char *op, const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (td_round((td_format)R, g[i]) != g[i]) fail_msg("%s: value %zu (%g) is not rounded", op, i, g[i]);
}

/* ---- glibc's expf on the device ----------------------------------------------------------- */

__global__ static void expf_elems(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = tdc_expf_glibc(x[i]);
}

static void test_expf_glibc(void **state)
{
    (void)state;
    const size_t n = (size_t)1 << 20;
    float *x = sim_managed<float>(n), *y = sim_managed<float>(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(i * 4096u + (i >> 8) % 4096u);   /* every 4096th pattern, low bits varied */
        memcpy(&x[i], &u, 4);
    }
    const float edge[] = {88.0f, -88.0f, 0x1.62e42ep6f, 0x1.62e430p6f, -0x1.9fe368p6f, -0x1.9fe36ap6f,
                          -0x1.9d1d9ep6f, -0x1.9d1da0p6f, -87.3f, 88.5f, -88.5f, 0.0f, -0.0f, 1e-30f, -1e-30f,
                          0x1p-149f, INFINITY, -INFINITY, NAN};
    for (size_t e = 0; e < sizeof edge / sizeof *edge; e++) x[e] = edge[e];
    TD_LAUNCH(expf_elems, 1024, 256, 0, (cudaStream_t)0, y, x, n);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    long differ = 0;
    for (size_t i = 0; i < n; i++) {
        float c = expf(x[i]);
        if (memcmp(&c, &y[i], 4) && !(isnan(c) && isnan(y[i]))) {
            if (differ < 5) printf("  expf(%a): the C library %a, the device %a\n", x[i], c, y[i]);
            differ++;
        }
    }
    printf("  tdc_expf_glibc against this machine's expf: %zu inputs, %ld differ\n", n, differ);
    if (differ) fail_msg("the C library's expf is not glibc's __expf_fma here: the shared expert's gate cannot match");
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
}

/* ---- the forward ops ---------------------------------------------------------------------- */

static void test_gather(void **state)
{
    (void)state;
    plan p = make_plan(2, TD_F32, 0);
    std::vector<float> x = sim_normal(&RNG, (size_t)N * C, 1.0);
    size_t n = (size_t)N * p.K * C;   /* every expert's rows, one after another */
    std::vector<float> cpu(n);
    td_ops ctx;
    td_ops_init(&ctx, &td_backend_cpu);
    for (int e = 0; e < E; e++)
        td_backend_cpu.moe_gather(&ctx, cpu.data() + (size_t)p.start[e] * C, x.data(), p.rows.data() + p.start[e],
                                  N, p.start[e + 1] - p.start[e], p.K, C);
    std::vector<float> gpu = sim_four_ways("moe_gather", n, [&](sim_bufs &b, float *dst) {
        float *dx = b.copy(x), *out = b.zeros(n);
        int *rows = b.copy(p.rows);
        for (int e = 0; e < E; e++)
            moe_gather_cuda(&ctx, out + (size_t)p.start[e] * C, dx, rows + p.start[e], N, p.start[e + 1] - p.start[e],
                            p.K, C);
        b.get(dst, out, n);
    });
    exact("moe_gather", "-", gpu.data(), cpu.data(), n);
}

/* the experts' output rows: D values (fp32 accumulators under the fused path) */
static std::vector<float> expert_rows(size_t rows, int D) { return sim_rounded(sim_normal(&RNG, rows * C, 2.0), D); }

static void test_combine(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes())
        for (int K = 2; K <= 3; K++)
            for (int dup = 0; dup < 2; dup++) {
                td_ops ctx = sim_ctx(rc);
                int D = sim_D(rc), R = stream_D(rc);
                plan p = make_plan(K, R, dup);
                std::vector<float> y = expert_rows((size_t)N * K, D);
                std::vector<float> out0 = sim_rounded(sim_normal(&RNG, (size_t)N * C, 0.5), R);
                std::vector<float> cpu = out0;
                for (int e = 0; e < E; e++)
                    td_backend_cpu.moe_combine(&ctx, cpu.data(), y.data() + (size_t)p.start[e] * C,
                                               p.rows.data() + p.start[e], p.w.data(), N, p.start[e + 1] - p.start[e],
                                               K, C);
                std::vector<float> gpu = sim_four_ways("moe_combine", cpu.size(), [&](sim_bufs &b, float *dst) {
                    float *out = b.copy(out0), *dy = b.copy(y), *w = b.copy(p.w);
                    int *rows = b.copy(p.rows);
                    for (int e = 0; e < E; e++)
                        moe_combine_cuda(&ctx, out, dy + (size_t)p.start[e] * C, rows + p.start[e], w, N,
                                         p.start[e + 1] - p.start[e], K, C);
                    b.get(dst, out, cpu.size());
                });
                char what[48];
                snprintf(what, sizeof what, "moe_combine K%d%s", K, dup ? " row twice" : "");
                exact(what, rc.name, gpu.data(), cpu.data(), cpu.size());
                all_in(R, what, gpu.data(), cpu.size());
            }
}

static void test_fused(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes())
        for (int K = 2; K <= 3; K++) {
            td_ops ctx = sim_ctx(rc);
            int D = sim_D(rc);
            plan p = make_plan(K, TD_F32, 0);   /* fused_moe: fp32 weights */
            std::vector<float> y = expert_rows((size_t)N * K, TD_F32);
            size_t nv = (size_t)N * K * C, no = (size_t)N * C;
            std::vector<float> cpu(nv + no, 0.0f);
            for (int e = 0; e < E; e++)
                td_backend_cpu.moe_scatter(&ctx, cpu.data(), y.data() + (size_t)p.start[e] * C,
                                           p.rows.data() + p.start[e], p.w.data(), N, p.start[e + 1] - p.start[e], K, C);
            td_backend_cpu.moe_sum(&ctx, cpu.data() + nv, cpu.data(), N, K, C);
            std::vector<float> gpu = sim_four_ways("moe_scatter, moe_sum", nv + no, [&](sim_bufs &b, float *dst) {
                float *v = b.zeros(nv), *out = b.zeros(no), *dy = b.copy(y), *w = b.copy(p.w);
                int *rows = b.copy(p.rows);
                for (int e = 0; e < E; e++)
                    moe_scatter_cuda(&ctx, v, dy + (size_t)p.start[e] * C, rows + p.start[e], w, N,
                                     p.start[e + 1] - p.start[e], K, C);
                moe_sum_cuda(&ctx, out, v, N, K, C);
                b.get(dst, v, nv);
                b.get(dst + nv, out, no);
            });
            char what[48];
            snprintf(what, sizeof what, "moe_scatter K%d", K);
            exact(what, rc.name, gpu.data(), cpu.data(), nv);
            snprintf(what, sizeof what, "moe_sum K%d", K);
            exact(what, rc.name, gpu.data() + nv, cpu.data() + nv, no);
            all_in(D, what, gpu.data(), nv + no);
        }
}

/* the shared expert's gate logits: spread, and expf's edges */
static std::vector<float> gate_logits(int D)
{
    std::vector<float> z = sim_rounded(sim_normal(&RNG, N, 5.0), D);
    const float edge[] = {0.0f, 88.5f, -88.5f, 104.0f, -104.0f, INFINITY, -INFINITY};
    for (size_t e = 0; e < sizeof edge / sizeof *edge; e++) z[e] = edge[e];
    return z;
}

static void test_shared_combine(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes()) {
        td_ops ctx = sim_ctx(rc);
        int D = sim_D(rc), R = stream_D(rc);
        std::vector<float> y = expert_rows(N, D), z = gate_logits(D);
        std::vector<float> out0 = sim_rounded(sim_normal(&RNG, (size_t)N * C, 0.5), R);
        std::vector<float> cpu = out0;
        td_backend_cpu.moe_shared_combine(&ctx, cpu.data(), y.data(), z.data(), N, C);
        std::vector<float> gpu = sim_four_ways("moe_shared_combine", cpu.size(), [&](sim_bufs &b, float *dst) {
            float *out = b.copy(out0);
            moe_shared_combine_cuda(&ctx, out, b.copy(y), b.copy(z), N, C);
            b.get(dst, out, cpu.size());
        });
        exact("moe_shared_combine", rc.name, gpu.data(), cpu.data(), cpu.size());
        all_in(R, "moe_shared_combine", gpu.data(), cpu.size());
    }
}

/* ---- the backward ops --------------------------------------------------------------------- */

static void test_combine_backward(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes())
        for (int K = 2; K <= 3; K++) {
            td_ops ctx = sim_ctx(rc);
            int D = sim_D(rc);
            plan p = make_plan(K, stream_D(rc), 0);
            std::vector<float> y = expert_rows((size_t)N * K, D);
            std::vector<float> dout = sim_rounded(sim_normal(&RNG, (size_t)N * C, 1.0), D);
            size_t nw = (size_t)N * K, ny = (size_t)N * K * C;
            std::vector<float> dw0 = sim_normal(&RNG, nw, 1.0), cpu(nw + ny);
            std::copy(dw0.begin(), dw0.end(), cpu.begin());
            for (int e = 0; e < E; e++)
                td_backend_cpu.moe_combine_backward(&ctx, cpu.data(), cpu.data() + nw + (size_t)p.start[e] * C,
                                                    dout.data(), y.data() + (size_t)p.start[e] * C,
                                                    p.rows.data() + p.start[e], p.w.data(), N,
                                                    p.start[e + 1] - p.start[e], K, C);
            std::vector<float> gpu = sim_four_ways("moe_combine_backward", nw + ny, [&](sim_bufs &b, float *dst) {
                float *dw = b.copy(dw0), *dy = b.zeros(ny), *g = b.copy(dout), *yy = b.copy(y), *w = b.copy(p.w);
                int *rows = b.copy(p.rows);
                for (int e = 0; e < E; e++)
                    moe_combine_backward_cuda(&ctx, dw, dy + (size_t)p.start[e] * C, g, yy + (size_t)p.start[e] * C,
                                              rows + p.start[e], w, N, p.start[e + 1] - p.start[e], K, C);
                b.get(dst, dw, nw);
                b.get(dst + nw, dy, ny);
            });
            char what[48];
            snprintf(what, sizeof what, "moe_combine_backward dw K%d", K);
            exact(what, rc.name, gpu.data(), cpu.data(), nw);
            snprintf(what, sizeof what, "moe_combine_backward dy K%d", K);
            exact(what, rc.name, gpu.data() + nw, cpu.data() + nw, ny);
            all_in(D, what, gpu.data() + nw, ny);
        }
}

static void test_scatter_add(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes())
        for (int form = 0; form < 4; form++) {   /* 0, 1: an expert's rows (1: a row twice); 2: all rows; 3: rounded */
            td_ops ctx = sim_ctx(rc);
            int D = sim_D(rc), R = stream_D(rc), K = 2, rounded = form == 3;
            plan p = make_plan(K, R, form == 1);
            std::vector<float> dxe = sim_normal(&RNG, (size_t)N * K * C, 1.0);
            if (!rounded) dxe = sim_rounded(dxe, D);   /* (rounded: the router's fp32 GEMM output) */
            std::vector<float> dx0 = sim_rounded(sim_normal(&RNG, (size_t)N * C, 1.0), rounded ? R : D);
            std::vector<float> cpu = dx0;
            if (form >= 2)
                td_backend_cpu.moe_scatter_add(&ctx, cpu.data(), dxe.data(), NULL, N, N, K, C, rounded);
            else
                for (int e = 0; e < E; e++)
                    td_backend_cpu.moe_scatter_add(&ctx, cpu.data(), dxe.data() + (size_t)p.start[e] * C,
                                                   p.rows.data() + p.start[e], N, p.start[e + 1] - p.start[e], K, C, 0);
            std::vector<float> gpu = sim_four_ways("moe_scatter_add", cpu.size(), [&](sim_bufs &b, float *dst) {
                float *dx = b.copy(dx0), *s = b.copy(dxe);
                int *rows = b.copy(p.rows);
                if (form >= 2)
                    moe_scatter_add_cuda(&ctx, dx, s, NULL, N, N, K, C, rounded);
                else
                    for (int e = 0; e < E; e++)
                        moe_scatter_add_cuda(&ctx, dx, s + (size_t)p.start[e] * C, rows + p.start[e], N,
                                             p.start[e + 1] - p.start[e], K, C, 0);
                b.get(dst, dx, cpu.size());
            });
            const char *name[] = {"moe_scatter_add", "moe_scatter_add row twice", "moe_scatter_add all rows",
                                  "moe_scatter_add rounded"};
            exact(name[form], rc.name, gpu.data(), cpu.data(), cpu.size());
            if (rounded) all_in(R, name[form], gpu.data(), cpu.size());
        }
}

static void test_shared_combine_backward(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes()) {
        td_ops ctx = sim_ctx(rc);
        int D = sim_D(rc);
        std::vector<float> y = expert_rows(N, D), z = gate_logits(D);
        z[5] = 3.0f;   /* (no Inf here: the gradient's s (1 - s) would be NaN on both sides) */
        z[6] = -3.0f;
        std::vector<float> dout = sim_rounded(sim_normal(&RNG, (size_t)N * C, 1.0), D);
        size_t ny = (size_t)N * C;
        std::vector<float> cpu(N + ny);
        td_backend_cpu.moe_shared_combine_backward(&ctx, cpu.data(), cpu.data() + N, dout.data(), y.data(), z.data(),
                                                   N, C);
        std::vector<float> gpu = sim_four_ways("moe_shared_combine_backward", N + ny, [&](sim_bufs &b, float *dst) {
            float *dz = b.zeros(N), *dy = b.zeros(ny);
            moe_shared_combine_backward_cuda(&ctx, dz, dy, b.copy(dout), b.copy(y), b.copy(z), N, C);
            b.get(dst, dz, N);
            b.get(dst + N, dy, ny);
        });
        exact("moe_shared_backward dz", rc.name, gpu.data(), cpu.data(), N);
        exact("moe_shared_backward dy", rc.name, gpu.data() + N, cpu.data() + N, ny);
        all_in(D, "moe_shared_combine_backward", gpu.data(), N + ny);
    }
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261129);
    return sim_open_gpu() ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_glibc),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_fused),
        cmocka_unit_test(test_shared_combine),
        cmocka_unit_test(test_combine_backward),
        cmocka_unit_test(test_scatter_add),
        cmocka_unit_test(test_shared_combine_backward),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
