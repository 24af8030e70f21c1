/* The CUDA backend's backward ops (src/backend/cuda/NAME_backward.cu: embedding, rmsnorm (hidden
 * rows and q/k-norm heads), rope, swiglu, logsoftmax, attention, matmul) against the CPU backend's
 * backward ops (td_backend_cpu: src/backend/cpu_backward.c over cpu_backward_ref.c) on the same
 * seeded random inputs, under no recipe (the fp32 reference), fp32, bf16-train (HF unfused RoPE:
 * cos/sin rounded to bf16), sglang-bf16 (fused RoPE: fp32 cos/sin) and fp16-train. Every input
 * gradient starts from random values (the ops accumulate), the forward values the ops read are
 * the CPU forward's under the same recipe.
 *
 * Every op runs four ways (simtest.h's sim_four_ways): host buffers (staged by tdc_in / tdc_out) and
 * device buffers (cudaMalloc), each under CUDASIM_ORDER=forward and reverse: the four results
 * must be the same bits (no atomics, no missing barrier: the ops are deterministic).
 *
 * Tolerances against the CPU, per op:
 *   bit-exact: embedding (one thread per column adds the token's rows in row order, the CPU's
 *     order), rmsnorm (dinp: the fp32 operations of the CPU in its order, the row's mean in
 *     double as the CPU's but summed in another order, which moves the fp32 mean only within
 *     ~C 2^-53 of a rounding boundary; dweight: the rows in order), rope (the CPU's angles,
 *     cos/sin and uncontracted rotation), swiglu (td_expf's fp32 steps, the CPU's evaluation
 *     order), logsoftmax (td_expf, two fp32 operations);
 *   attention: the CPU's scores, dP and gradients are OpenBLAS sgemm sums (blocks of ATT_BLOCK
 *     rows, the library's order): the kernels sum the same terms in another order. Normalised
 *     error max|gpu - cpu| / max|cpu| of each of dq, dk, dv <= 1e-5 in fp32, and under
 *     D = bf16 / fp16 <= 2 units in the last place of D at max|cpu| (one flipped rounding of P, dS
 *     or the gradient); under D every gradient value is a D value (the rounding happened), and at
 *     most 2% of them differ from the CPU's in any bit (measured: at most 0.7%, fp16's dv; with
 *     P left unrounded 30-40% of dv differ, and the normalised error alone would not see it).
 *   matmul (dgrad, wgrad, bias; shapes N x IN x OUT 20x256x136 and 131x64x128, K over one and
 *     several 128-wide FP8 groups; with and without dbias, NULL dweight (a frozen LoRA base),
 *     NULL dinp; under the recipes above plus bf16-autocast, fp8-unified-train (1x128 groups),
 *     fp8-rollout, vllm-fp8 (per-tensor), vllm-fp8-per-token and fp8-unified-train with MX
 *     activation blocks): dbias bit-exact (rows in order); the gradients not asked for untouched.
 *     The GEMMs are cuBLASLt's (on the simulator the model's in-order fp32 sums, which here
 *     happen to give OpenBLAS's bits for fp32 and the FP8 flow; td_gemm_bf16dp's order differs):
 *     dweight (fp32) normalised error <= 1e-5 (measured <= 5.5e-7, the bf16 recipes); dinp in
 *     fp32 <= 1e-5 (measured 0), under D = bf16 / fp16 <= 1 unit in the last place of D at
 *     max|cpu| with at most 1% of the values differing (one flipped rounding of D; measured 1 of
 *     8384 values, 7.8e-6 normalised), every value a D value. FP8 operands are quantised by
 *     fp8_quantize_cuda, bit for bit the CPU's, so only the GEMMs' order can differ.
 * The measured figures are printed. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/gemm.h"
}

static td_rng RNG;

/* ---- recipes ------------------------------------------------------------------------------ */

static std::vector<sim_rcase> recipes(void)
{
    std::vector<sim_rcase> v;
    v.push_back({"(none)", sim_preset("fp32"), 1});
    const char *names[] = {"fp32", "bf16-train", "sglang-bf16", "fp16-train"};
    for (const char *n : names) v.push_back({n, sim_preset(n), 0});
    return v;
}

/* bit for bit, in this file's columns */
static void exact(const char *op, const char *rname, const float *g, const float *c, size_t n)
{
    sim_exact(22, 12, op, rname, g, c, n);
}

/* every value a D value (the op rounded its gradient to the activations dtype) */
static void all_in(int D, const char *op, const float *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (td_round((td_format)D, g[i]) != g[i]) fail_msg("%s: value %zu (%g) is not rounded", op, i, g[i]);
}

/* ---- the ops ------------------------------------------------------------------------------ */

static void test_embedding_backward(void **state)
{
    (void)state;
    /* tokens below V - 10 (a host gradient is staged up to the largest token's row only), with
     * repeats; C over one 256-column slice */
    const int V = 40, C = 300, N = 24;
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int)td_rng_below(&RNG, 12) * 2 + (i % 3 == 0);
    tok[5] = tok[9] = tok[17] = 7;
    for (const sim_rcase &rc : recipes()) {
        td_ops ctx = sim_ctx(rc);
        std::vector<float> de = sim_normal(&RNG, (size_t)V * C, 1.0);
        std::vector<float> dout = sim_normal(&RNG, (size_t)N * C, 3.0);
        dout = sim_rounded(dout, sim_D(rc));
        std::vector<float> cpu = de;
        td_backend_cpu.embedding_backward(&ctx, cpu.data(), dout.data(), tok, N, C);
        std::vector<float> gpu = sim_four_ways("embedding_backward", de.size(), [&](sim_bufs &b, float *dst) {
            float *d = b.copy(de), *g = b.copy(dout);
            embedding_backward_cuda(&ctx, d, g, tok, N, C);
            b.get(dst, d, de.size());
        });
        exact("embedding_backward", rc.name, gpu.data(), cpu.data(), de.size());
    }
}

static void test_rmsnorm_backward(void **state)
{
    (void)state;
    struct { int N, C; } shapes[] = {{7, 300}, {12, 64}};   /* hidden rows; q/k-norm heads */
    for (auto sh : shapes)
        for (const sim_rcase &rc : recipes())
            for (int with_dw = 0; with_dw < 2; with_dw++) {
                td_ops ctx = sim_ctx(rc);
                int N = sh.N, C = sh.C, D = sim_D(rc);
                size_t n = (size_t)N * C;
                std::vector<float> x = sim_rounded(sim_normal(&RNG, n, 1.5), D), w = sim_normal(&RNG, C, 0.2);
                for (float &v : w) v += 1.0f;
                std::vector<float> y(n), rs(N);
                td_backend_cpu.rmsnorm_forward(&ctx, y.data(), rs.data(), x.data(), w.data(), N, C, 1e-6f);
                std::vector<float> dy = sim_rounded(sim_normal(&RNG, n, 1.0), D);
                std::vector<float> dx0 = sim_rounded(sim_normal(&RNG, n, 0.5), D);
                std::vector<float> dw0 = sim_normal(&RNG, C, 2.0);
                std::vector<float> cpu(n + C);
                std::copy(dx0.begin(), dx0.end(), cpu.begin());
                std::copy(dw0.begin(), dw0.end(), cpu.begin() + n);
                td_backend_cpu.rmsnorm_backward(&ctx, cpu.data(), with_dw ? cpu.data() + n : NULL, dy.data(),
                                                x.data(), w.data(), rs.data(), N, C);
                std::vector<float> gpu = sim_four_ways("rmsnorm_backward", n + C, [&](sim_bufs &b, float *dst) {
                    float *dx = b.copy(dx0), *dw = b.copy(dw0), *g = b.copy(dy), *in = b.copy(x);
                    float *r = b.copy(rs);
                    rmsnorm_backward_cuda(&ctx, dx, with_dw ? dw : NULL, g, in, w.data(), r, N, C);
                    b.get(dst, dx, n);
                    b.get(dst + n, dw, C);
                });
                char what[48];
                snprintf(what, sizeof what, "rmsnorm_backward C%d%s", C, with_dw ? "" : " dx");
                exact(what, rc.name, gpu.data(), cpu.data(), n + C);
                all_in(D, what, gpu.data(), n);
            }
}

static void test_rope_backward(void **state)
{
    (void)state;
    const int N = 6, NHd = 3, HDs[] = {64, 256};
    for (int HD : HDs)
        for (const sim_rcase &rc : recipes()) {
            td_ops ctx = sim_ctx(rc);
            std::vector<float> f(HD / 2);
            for (int k = 0; k < HD / 2; k++) f[k] = (float)pow(1e6, -2.0 * k / HD);
            int pos[N];
            for (int i = 0; i < N; i++) pos[i] = (int)td_rng_below(&RNG, 40000);
            std::vector<float> g = sim_rounded(sim_normal(&RNG, (size_t)N * NHd * HD, 1.0), sim_D(rc));
            std::vector<float> cpu = g;
            td_backend_cpu.rope_backward(&ctx, cpu.data(), pos, f.data(), N, NHd, HD);
            std::vector<float> gpu = sim_four_ways("rope_backward", g.size(), [&](sim_bufs &b, float *dst) {
                float *d = b.copy(g);
                rope_backward_cuda(&ctx, d, pos, f.data(), N, NHd, HD);
                b.get(dst, d, g.size());
            });
            char what[32];
            snprintf(what, sizeof what, "rope_backward HD%d", HD);
            exact(what, rc.name, gpu.data(), cpu.data(), g.size());
        }
}

static void test_swiglu_backward(void **state)
{
    (void)state;
    const int N = 8, F = 300;
    size_t n = (size_t)N * F;
    for (const sim_rcase &rc : recipes()) {
        td_ops ctx = sim_ctx(rc);
        int D = sim_D(rc);
        std::vector<float> g = sim_rounded(sim_normal(&RNG, n, 4.0), D);
        std::vector<float> u = sim_rounded(sim_normal(&RNG, n, 1.0), D);
        std::vector<float> dy = sim_rounded(sim_normal(&RNG, n, 1.0), D);
        std::vector<float> dg0 = sim_rounded(sim_normal(&RNG, n, 0.3), D);
        std::vector<float> du0 = sim_rounded(sim_normal(&RNG, n, 0.3), D);
        g[0] = 100.0f;   /* td_expf's clamps */
        g[1] = -100.0f;
        std::vector<float> cpu(2 * n);
        std::copy(dg0.begin(), dg0.end(), cpu.begin());
        std::copy(du0.begin(), du0.end(), cpu.begin() + n);
        td_backend_cpu.swiglu_backward(&ctx, cpu.data(), cpu.data() + n, dy.data(), g.data(), u.data(), N, F);
        std::vector<float> gpu = sim_four_ways("swiglu_backward", 2 * n, [&](sim_bufs &b, float *dst) {
            float *dg = b.copy(dg0), *du = b.copy(du0);
            swiglu_backward_cuda(&ctx, dg, du, b.copy(dy), b.copy(g), b.copy(u), N, F);
            b.get(dst, dg, n);
            b.get(dst + n, du, n);
        });
        exact("swiglu_backward", rc.name, gpu.data(), cpu.data(), 2 * n);
        all_in(D, "swiglu_backward", gpu.data(), 2 * n);
    }
}

static void test_logsoftmax_backward(void **state)
{
    (void)state;
    const int N = 4, V = 5000;
    sim_rcase none = recipes()[0];
    td_ops ctx = sim_ctx(none);   /* the CPU table runs the fp32 form under every recipe */
    std::vector<float> lp = sim_normal(&RNG, (size_t)N * V, 3.0);
    td_backend_cpu.logsoftmax_forward(&ctx, lp.data(), N, V);
    const int target[N] = {17, 0, 4999, 3};
    const float dlogp[N] = {-0.25f, 1.5f, 0.0f, -3.0f};   /* row 2 masked: zeros */
    std::vector<float> cpu((size_t)N * V, 7.0f);
    td_backend_cpu.logsoftmax_backward(&ctx, cpu.data(), lp.data(), target, dlogp, N, V);
    for (int inplace = 0; inplace < 2; inplace++) {
        std::vector<float> gpu = sim_four_ways("logsoftmax_backward", cpu.size(), [&](sim_bufs &b, float *dst) {
            float *l = b.copy(lp), *dx = inplace ? l : b.copy(std::vector<float>(cpu.size(), 7.0f));
            logsoftmax_backward_cuda(&ctx, dx, l, target, dlogp, N, V);
            b.get(dst, dx, cpu.size());
        });
        exact(inplace ? "logsoftmax_backward(ip)" : "logsoftmax_backward", "any", gpu.data(),
              cpu.data(), cpu.size());
    }
}

/* ---- attention ---------------------------------------------------------------------------- */

struct att_shape { int NH, NKV, HD; };

/* two packed sequences of 70 and 9 rows (positions from 0 each; 70: two of the CPU's ATT_BLOCK
 * row blocks), teacher forcing */
static void attention_backward_case(const sim_rcase &rc, att_shape sh)
{
    const int L0 = 70, L1 = 9, N = L0 + L1;
    int NH = sh.NH, NKV = sh.NKV, HD = sh.HD, KVD = NKV * HD, QD = NH * HD, D = sim_D(rc);
    std::vector<size_t> off(N);
    std::vector<int> pos(N);
    for (int i = 0; i < N; i++) {
        int r0 = i < L0 ? 0 : L0;
        off[i] = (size_t)r0 * KVD;
        pos[i] = i - r0;
    }
    td_ops ctx = sim_ctx(rc);
    int max_keys = L0;
    std::vector<float> q = sim_rounded(sim_normal(&RNG, (size_t)N * QD, 1.5), D);
    std::vector<float> k = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), D);
    std::vector<float> v = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), D);
    std::vector<float> out((size_t)N * QD), lse((size_t)N * NH);
    std::vector<float> scratch((size_t)ctx.nthreads * 2 * ATT_BLOCK * max_keys);
    td_backend_cpu.attention_forward(&ctx, out.data(), lse.data(), q.data(), k.data(), v.data(),
                                     off.data(), pos.data(), N, NH, NKV, HD, scratch.data(), max_keys);
    std::vector<float> dout = sim_rounded(sim_normal(&RNG, (size_t)N * QD, 1.0), D);
    std::vector<float> dq0 = sim_rounded(sim_normal(&RNG, (size_t)N * QD, 0.1), D);
    std::vector<float> dk0 = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 0.1), D);
    std::vector<float> dv0 = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 0.1), D);
    size_t nq = dq0.size(), nk = dk0.size();
    std::vector<float> cpu(nq + 2 * nk);
    std::copy(dq0.begin(), dq0.end(), cpu.begin());
    std::copy(dk0.begin(), dk0.end(), cpu.begin() + nq);
    std::copy(dv0.begin(), dv0.end(), cpu.begin() + nq + nk);
    td_backend_cpu.attention_backward(&ctx, cpu.data(), cpu.data() + nq, cpu.data() + nq + nk,
                                      dout.data(), q.data(), k.data(), v.data(), out.data(),
                                      lse.data(), pos.data(), N, NH, NKV, HD, scratch.data(), max_keys);
    std::vector<float> gpu = sim_four_ways("attention_backward", cpu.size(), [&](sim_bufs &b, float *dst) {
        float *dq = b.copy(dq0), *dk = b.copy(dk0), *dv = b.copy(dv0);
        attention_backward_cuda(&ctx, dq, dk, dv, b.copy(dout), b.copy(q), b.copy(k), b.copy(v),
                                b.copy(out), b.copy(lse), pos.data(), N, NH, NKV, HD, NULL, max_keys);
        b.get(dst, dq, nq);
        b.get(dst + nq, dk, nk);
        b.get(dst + nq + nk, dv, nk);
    });
    const char *names[3] = {"dq", "dk", "dv"};
    size_t at[3] = {0, nq, nq + nk}, len[3] = {nq, nk, nk};
    for (int t = 0; t < 3; t++) {
        sim_diff d = sim_compare(gpu.data() + at[t], cpu.data() + at[t], len[t]);
        double nerr = d.max_abs / d.max_ref;
        double lim = D == TD_F32 ? 1e-5 : 2 * sim_ulp(D, d.max_ref) / d.max_ref;
        printf("  %-22s %-12s NH%d/%d HD%d %s: %ld of %zu differ, normalised %.3g (limit %.3g)\n",
               "attention_backward", rc.name, NH, NKV, HD, names[t], d.ndiff, len[t], nerr, lim);
        double frac = (double)d.ndiff / len[t];
        if (nerr > lim || (D != TD_F32 && frac > 0.02))
            fail_msg("attention_backward %s under %s (NH %d/%d HD %d): beyond the tolerance",
                     names[t], rc.name, NH, NKV, HD);
    }
    all_in(D, "attention_backward", gpu.data(), gpu.size());
}

static void test_attention_backward(void **state)
{
    (void)state;
    const att_shape shapes[] = {{4, 2, 64}, {2, 1, 256}, {3, 3, 38}};
    for (const sim_rcase &rc : recipes())
        for (att_shape sh : shapes) attention_backward_case(rc, sh);
}

/* ---- matmul_backward ---------------------------------------------------------------------- */

/* Recipes for the GEMMs' backward: those of the other ops, bf16-autocast, and every FP8 preset
 * (the training flow fp8-unified-train and the engines' schemes, so each act_scaling granularity
 * the CPU's backward quantises with: 1x128 groups, per-tensor, per-token), plus fp8-unified-train
 * with MX blocks of 32. */
static std::vector<sim_rcase> gemm_recipes(void)
{
    std::vector<sim_rcase> v = recipes();
    const char *more[] = {"bf16-autocast", "fp8-unified-train", "fp8-rollout", "vllm-fp8",
                          "vllm-fp8-per-token"};
    for (const char *n : more) v.push_back({n, sim_preset(n), 0});
    td_recipe mx = sim_preset("fp8-unified-train");
    mx.act_scaling.gran = TD_SCALE_MX;
    mx.act_scaling.group = 32;
    v.push_back({"fp8-mx-acts", mx, 0});
    return v;
}

/* The measured worst cases, printed at the end (the figures of the header comment). */
static double MM_WORST[4];   /* fp32 dinp, D dinp (fraction differing, normalised), dW */

/* one (shape, recipe, which gradients) case; want: dinp, dweight, dbias */
static void matmul_backward_case(const sim_rcase &rc, int N, int IN, int OUT, const int want[3])
{
    td_ops ctx = sim_ctx(rc);
    int D = sim_D(rc);
    const td_recipe *r = rc.none ? NULL : &rc.r;
    size_t nX = (size_t)N * IN, nW = (size_t)OUT * IN, nY = (size_t)N * OUT;
    std::vector<float> w = sim_normal(&RNG, nW, 0.05), x = sim_rounded(sim_normal(&RNG, nX, 1.0), D);
    if (r) td_gemm_prepare_weight(r, w.data(), OUT, IN, w.data());   /* the forward's W' */
    std::vector<float> dy = sim_rounded(sim_normal(&RNG, nY, 0.3), D);
    dy[3] = 200.0f;   /* an outlier: FP8 scales differ across groups */
    std::vector<float> dx0 = sim_rounded(sim_normal(&RNG, nX, 0.5), D), dw0 = sim_normal(&RNG, nW, 0.5);
    std::vector<float> db0 = sim_normal(&RNG, OUT, 0.5);
    std::vector<float> cpu(nX + nW + OUT);
    std::copy(dx0.begin(), dx0.end(), cpu.begin());
    std::copy(dw0.begin(), dw0.end(), cpu.begin() + nX);
    std::copy(db0.begin(), db0.end(), cpu.begin() + nX + nW);
    td_backend_cpu.matmul_backward(&ctx, want[0] ? cpu.data() : NULL, want[1] ? cpu.data() + nX : NULL,
                                   want[2] ? cpu.data() + nX + nW : NULL, dy.data(), x.data(), w.data(),
                                   N, IN, OUT);
    std::vector<float> gpu = sim_four_ways("matmul_backward", cpu.size(), [&](sim_bufs &b, float *dst) {
        float *dx = b.copy(dx0), *dw = b.copy(dw0), *db = b.copy(db0);
        matmul_backward_cuda(&ctx, want[0] ? dx : NULL, want[1] ? dw : NULL, want[2] ? db : NULL,
                             b.copy(dy), b.copy(x), b.copy(w), N, IN, OUT);
        b.get(dst, dx, nX);
        b.get(dst + nX, dw, nW);
        b.get(dst + nX + nW, db, OUT);
    });
    char what[64];
    snprintf(what, sizeof what, "matmul_backward %dx%dx%d%s%s%s", N, IN, OUT, want[0] ? "" : " -dinp",
             want[1] ? "" : " -dW", want[2] ? " +db" : "");
    /* what was not asked for is untouched */
    if (!want[0] && memcmp(gpu.data(), dx0.data(), nX * 4)) fail_msg("%s: dinp written", what);
    if (!want[1] && memcmp(gpu.data() + nX, dw0.data(), nW * 4)) fail_msg("%s: dweight written", what);
    if (!want[2] && memcmp(gpu.data() + nX + nW, db0.data(), OUT * 4)) fail_msg("%s: dbias written", what);
    if (want[2]) exact(what, rc.name, gpu.data() + nX + nW, cpu.data() + nX + nW, OUT);   /* rows in order */
    if (want[0]) {
        sim_diff d = sim_compare(gpu.data(), cpu.data(), nX);
        double nerr = d.max_abs / d.max_ref, frac = (double)d.ndiff / nX;
        double lim = D == TD_F32 ? 1e-5 : sim_ulp(D, d.max_ref) / d.max_ref;
        printf("  %-34s %-18s dinp: %5ld of %6zu differ, normalised %.3g (limit %.3g)\n", what,
               rc.name, d.ndiff, nX, nerr, lim);
        if (D != TD_F32) {
            all_in(D, what, gpu.data(), nX);
            MM_WORST[1] = frac > MM_WORST[1] ? frac : MM_WORST[1];
            MM_WORST[3] = nerr > MM_WORST[3] ? nerr : MM_WORST[3];
        } else {
            MM_WORST[0] = nerr > MM_WORST[0] ? nerr : MM_WORST[0];
        }
        if (nerr > lim || (D != TD_F32 && frac > 0.01))
            fail_msg("%s under %s: dinp beyond the tolerance", what, rc.name);
    }
    if (want[1]) {
        sim_diff d = sim_compare(gpu.data() + nX, cpu.data() + nX, nW);
        double nerr = d.max_abs / d.max_ref;
        printf("  %-34s %-18s dW:   %5ld of %6zu differ, normalised %.3g (limit 1e-05)\n", what,
               rc.name, d.ndiff, nW, nerr);
        MM_WORST[2] = nerr > MM_WORST[2] ? nerr : MM_WORST[2];
        if (nerr > 1e-5) fail_msg("%s under %s: dweight beyond the tolerance", what, rc.name);
    }
}

static void test_matmul_backward(void **state)
{
    (void)state;
    /* K of every GEMM over one and several 128-wide FP8 groups, tokens over two groups along N */
    const int shapes[][3] = {{20, 256, 136}, {131, 64, 128}};
    const int wants[][3] = {{1, 1, 1}, {1, 1, 0}, {1, 0, 1}, {0, 1, 0}};   /* all; no bias; frozen
                                                                              weight; no dinp */
    for (int s = 0; s < 2; s++)
        for (const sim_rcase &rc : gemm_recipes())
            for (int k = 0; k < 4; k += 1 + s)   /* the second shape: all, frozen weight */
                matmul_backward_case(rc, shapes[s][0], shapes[s][1], shapes[s][2], wants[k]);
    printf("  matmul_backward worst: fp32 dinp normalised %.3g; 16-bit dinp values differing %.3g%%, "
           "normalised %.3g; dW normalised %.3g\n", MM_WORST[0], 100 * MM_WORST[1], MM_WORST[3],
           MM_WORST[2]);
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261126);
    return sim_open_gpu() ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_backward),
        cmocka_unit_test(test_rmsnorm_backward),
        cmocka_unit_test(test_rope_backward),
        cmocka_unit_test(test_swiglu_backward),
        cmocka_unit_test(test_logsoftmax_backward),
        cmocka_unit_test(test_attention_backward),
        cmocka_unit_test(test_matmul_backward),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
