/* The CUDA backend's non-GEMM ops (src/backend/cuda: embedding, rmsnorm, rope, kv_write,
 * attention, swiglu, residual, scale, logsoftmax) against the CPU backend's ops (td_backend_cpu,
 * src/backend/cpu.c and cpu_ref.c) on the same seeded random inputs, under the fp32 reference
 * (no recipe) and the recipes that exercise every rounding form: bf16-train (HF unfused norm
 * and RoPE, flash 128), bf16-autocast (fp32 residual, fused RoPE), vllm-bf16 (vLLM RoPE, flash
 * 64, split-KV decode 4), sglang-bf16 (fused norm and RoPE), fp16-train / fp16-infer, and
 * variants built here: HF eager attention in bf16 and in batch-invariant fp32, an fp8 e4m3 KV
 * cache (kv_scale 1 and 1/16), flash blocks of 512 keys (two 256-key segments each) with
 * split-KV decode in 2, temperature and log-softmax in the activations dtype.
 *
 * Every op runs four ways: host buffers (staged by tdc_in / tdc_out) and device buffers
 * (cudaMalloc), each under CUDASIM_ORDER=forward and reverse (the simulator's order of threads
 * and blocks): the four results must be the same bits (a missing barrier shows as a difference).
 *
 * Tolerances against the CPU, per op:
 *   bit-exact: embedding (a gather and a widening), residual, scale, kv_write (one fp32
 *     operation and a rounding), rmsnorm (double sum of squares: only the order differs, far
 *     below fp32's resolution), rope (the CPU's fp32 angle, double cos/sin rounded to float,
 *     uncontracted products), swiglu (the reference's td_expf step by step; glibc's expf as a
 *     double exp rounded to float under a recipe);
 *   attention: the same arithmetic in the same order as the CPU's flash / eager / split-KV forms
 *     (q.k in the order of cpu.c's 4-lane SSE reduction, then every product, sum and rounding
 *     as cpu.c has them), exponentials excepted: glibc's expf is not correctly rounded for about
 *     1e-4 of its inputs, where the device's double exp rounded to float differs in the last bit.
 *     Hence, under every recipe but the reference, when the CPU build sums q.k in that order
 *     (-O2; probed): at most 0.5% of the outputs differ in any bit
 *     under bf16 / fp16 (a rounding of P or of the output hides most such bits), at most 5% in
 *     fp32 (one p moves a whole row); and for all: normalised error max|gpu - cpu| / max|cpu|
 *     <= 1e-5 in fp32 (the reference sums scores by sgemm in OpenBLAS's order), within two units
 *     in the last place of D (of max|cpu|) under D = bf16 / fp16 (one flipped rounding of P or
 *     of the output); lse within 1e-5, or two units of D at |lse| under D (a score rounded to D
 *     one unit apart moves it as much);
 *   logsoftmax: |gpu - cpu| <= 2e-6 (1 + |cpu|) in fp32 (the 1024-block sums are fp32 sums in
 *     another order than the CPU's vector lanes), within one unit of the last place of bf16
 *     when the result is rounded to it.
 * The measured figures are printed. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static td_rng RNG;

/* ---- recipes ------------------------------------------------------------------------------ */

static std::vector<sim_rcase> recipes(void)
{
    std::vector<sim_rcase> v;
    v.push_back({"(none)", sim_preset("fp32"), 1});
    const char *names[] = {"fp32", "bf16-train", "bf16-autocast", "vllm-bf16", "sglang-bf16",
                           "fp16-train", "fp16-infer"};
    for (const char *n : names) v.push_back({n, sim_preset(n), 0});
    td_recipe e = sim_preset("bf16-train");
    e.attention = TD_ATTN_FULL;
    v.push_back({"eager-bf16", e, 0});
    td_recipe b = sim_preset("fp32");
    b.batch_invariant = true;
    v.push_back({"fp32-batch-inv", b, 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    v.push_back({"kv-e4m3", k, 0});
    k.kv_scale = 0.0625f;
    v.push_back({"kv-e4m3-s16", k, 0});
    td_recipe fb = sim_preset("vllm-bf16");   /* blocks beyond the CPU's 256-score segments */
    fb.attn_block = 512;
    fb.decode_splits = 2;
    v.push_back({"flash-b512-s2", fb, 0});
    td_recipe f32f = sim_preset("fp32");   /* flash in fp32: no rounding hides a score's last bit */
    f32f.attention = TD_ATTN_FLASH;
    f32f.attn_block = 64;
    f32f.decode_splits = 3;
    v.push_back({"flash-fp32", f32f, 0});
    td_recipe l = sim_preset("bf16-train");
    l.temp_in_act = true;
    l.logsoftmax_act = true;
    v.push_back({"bf16-act-lsm", l, 0});
    return v;
}

/* bit for bit, in this file's columns */
static void exact(const char *op, const char *rname, const float *g, const float *c, size_t n)
{
    sim_exact(12, 15, op, rname, g, c, n);
}

/* ---- the ops ------------------------------------------------------------------------------ */

static void test_embedding(void **state)
{
    (void)state;
    const int V = 40, C = 70, N = 9, SR = 16, SC = 32, NBC = (C + SC - 1) / SC;
    const int tok[N] = {0, 5, 39, 5, 17, 2, 33, 39, 11};
    std::vector<float> f = sim_normal(&RNG, (size_t)V * C, 2.0);
    std::vector<float> scale((size_t)((V + SR - 1) / SR) * NBC);
    for (float &s : scale) s = (float)ldexp(1.0 + td_rng_uniform(&RNG), -3);
    sim_rcase none = recipes()[0];
    td_ops ctx = sim_ctx(none);
    const td_format fmts[] = {TD_F32, TD_BF16, TD_F16, TD_E4M3, TD_E5M2};
    const char *names[] = {"f32 table", "bf16 table", "f16 table", "e4m3 table", "e5m2 table"};
    for (int t = 0; t < 5; t++) {
        td_format F = fmts[t];
        std::vector<uint16_t> c16((size_t)V * C);
        std::vector<uint8_t> c8((size_t)V * C);
        td_wmat w = {};
        w.dtype = F;
        if (F == TD_F32) w.data = f.data();
        else if (F == TD_BF16 || F == TD_F16) {
            td_encode_row(F, f.data(), c16.data(), f.size(), TD_SATFINITE);
            w.data = c16.data();
        } else {
            for (int r = 0; r < V; r++)
                for (int c = 0; c < C; c++)
                    c8[(size_t)r * C + c] = (uint8_t)td_encode(F, f[(size_t)r * C + c] / scale[(size_t)(r / SR) * NBC + c / SC], TD_SATFINITE);
            w.data = c8.data();
            w.scale = scale.data();
            w.sr = SR; w.sc = SC; w.nbc = NBC;
        }
        std::vector<float> cpu((size_t)N * C);
        td_backend_cpu.embedding_forward(&ctx, cpu.data(), tok, &w, N, C);
        std::vector<float> gpu = sim_four_ways("embedding", cpu.size(), [&](sim_bufs &b, float *dst) {
            float *out = b.zeros(cpu.size());
            embedding_forward_cuda(&ctx, out, tok, &w, N, C);
            b.get(dst, out, cpu.size());
        });
        exact("embedding", names[t], gpu.data(), cpu.data(), cpu.size());
    }
}

static void test_rmsnorm(void **state)
{
    (void)state;
    struct { int N, C; } shapes[] = {{7, 300}, {12, 64}};   /* hidden rows; q/k-norm heads */
    for (auto sh : shapes)
        for (const sim_rcase &rc : recipes()) {
            td_ops ctx = sim_ctx(rc);
            int N = sh.N, C = sh.C;
            std::vector<float> x = sim_normal(&RNG, (size_t)N * C, 1.5), w = sim_normal(&RNG, C, 0.2);
            for (float &v : w) v += 1.0f;
            size_t n = (size_t)N * C;
            std::vector<float> cpu(n + N);
            td_backend_cpu.rmsnorm_forward(&ctx, cpu.data(), cpu.data() + n, x.data(), w.data(), N, C, 1e-6f);
            for (int inplace = 0; inplace < 2; inplace++) {
                std::vector<float> gpu = sim_four_ways("rmsnorm", n + N, [&](sim_bufs &b, float *dst) {
                    float *in = b.copy(x), *out = inplace ? in : b.zeros(n), *rs = b.zeros(N);
                    rmsnorm_forward_cuda(&ctx, out, rs, in, w.data(), N, C, 1e-6f);
                    b.get(dst, out, n);
                    b.get(dst + n, rs, N);
                });
                char what[48];
                snprintf(what, sizeof what, "rmsnorm%s C%d", inplace ? "(ip)" : "", C);
                exact(what, rc.name, gpu.data(), cpu.data(), n + N);
            }
        }
}

static void test_rope(void **state)
{
    (void)state;
    const int N = 6, NHd = 3, HDs[] = {64, 256};
    for (int HD : HDs)
        for (const sim_rcase &rc : recipes()) {
            td_ops ctx = sim_ctx(rc);
            std::vector<float> x = sim_normal(&RNG, (size_t)N * NHd * HD, 1.0), f(HD / 2);
            for (int k = 0; k < HD / 2; k++) f[k] = (float)pow(1e6, -2.0 * k / HD);
            int pos[N];
            for (int i = 0; i < N; i++) pos[i] = (int)td_rng_below(&RNG, 40000);
            for (float &v : x) v = td_round((td_format)sim_D(rc), v);
            std::vector<float> cpu = x;
            td_backend_cpu.rope_forward(&ctx, cpu.data(), pos, f.data(), N, NHd, HD);
            std::vector<float> gpu = sim_four_ways("rope", x.size(), [&](sim_bufs &b, float *dst) {
                float *d = b.copy(x);
                rope_forward_cuda(&ctx, d, pos, f.data(), N, NHd, HD);
                b.get(dst, d, x.size());
            });
            char what[32];
            snprintf(what, sizeof what, "rope HD%d", HD);
            exact(what, rc.name, gpu.data(), cpu.data(), x.size());
        }
}

static void test_swiglu_residual_scale(void **state)
{
    (void)state;
    const int N = 8, F = 300;
    size_t n = (size_t)N * F;
    for (const sim_rcase &rc : recipes()) {
        td_ops ctx = sim_ctx(rc);
        std::vector<float> g = sim_normal(&RNG, n, 4.0), u = sim_normal(&RNG, n, 1.0);
        std::vector<float> cpu(n);
        td_backend_cpu.swiglu_forward(&ctx, cpu.data(), g.data(), u.data(), N, F);
        std::vector<float> gpu = sim_four_ways("swiglu", n, [&](sim_bufs &b, float *dst) {
            float *dg = b.copy(g), *du = b.copy(u);
            swiglu_forward_cuda(&ctx, dg, dg, du, N, F);   /* in place on gate, as decoder.c */
            b.get(dst, dg, n);
        });
        exact("swiglu", rc.name, gpu.data(), cpu.data(), n);

        td_backend_cpu.residual_forward(&ctx, cpu.data(), g.data(), u.data(), n);
        gpu = sim_four_ways("residual", n, [&](sim_bufs &b, float *dst) {
            float *a = b.copy(g), *c = b.copy(u);
            residual_forward_cuda(&ctx, a, a, c, n);
            b.get(dst, a, n);
        });
        exact("residual", rc.name, gpu.data(), cpu.data(), n);

        cpu = g;
        td_backend_cpu.scale_forward(&ctx, cpu.data(), 0.37f, n);
        gpu = sim_four_ways("scale", n, [&](sim_bufs &b, float *dst) {
            float *a = b.copy(g);
            scale_forward_cuda(&ctx, a, 0.37f, n);
            b.get(dst, a, n);
        });
        exact("scale", rc.name, gpu.data(), cpu.data(), n);
    }
}

static void test_logsoftmax(void **state)
{
    (void)state;
    const int N = 3, V = 5000;
    const float temps[] = {1.0f, 0.7f};
    for (const sim_rcase &rc : recipes())
        for (float T : temps) {
            td_recipe head = rc.r;
            if (!rc.none) head = td_recipe_for_head(&rc.r);
            head.temp_in_act = rc.r.temp_in_act;
            head.logsoftmax_act = rc.r.logsoftmax_act;
            td_ops ctx = sim_ctx(rc);
            if (!rc.none) ctx.recipe = &head;
            ctx.temperature = T;
            std::vector<float> x = sim_normal(&RNG, (size_t)N * V, 3.0);
            for (float &v : x) v = td_round((td_format)sim_D(rc), v);
            std::vector<float> cpu = x;
            td_backend_cpu.logsoftmax_forward(&ctx, cpu.data(), N, V);
            std::vector<float> gpu = sim_four_ways("logsoftmax", x.size(), [&](sim_bufs &b, float *dst) {
                float *d = b.copy(x);
                logsoftmax_forward_cuda(&ctx, d, N, V);
                b.get(dst, d, x.size());
            });
            int R = !rc.none && head.logsoftmax_act ? head.activations : TD_F32;
            double worst = 0;   /* |d| / allowed */
            for (size_t i = 0; i < x.size(); i++) {
                double e = fabs((double)gpu[i] - cpu[i]);
                double lim = R == TD_F32 ? 2e-6 * (1 + fabs(cpu[i])) : sim_ulp(R, fabs(cpu[i])) * 1.001;
                worst = e / lim > worst ? e / lim : worst;
            }
            sim_diff d = sim_compare(gpu.data(), cpu.data(), x.size());
            printf("  %-12s %-15s T=%.1f %ld of %zu differ, max |d| %.3g (%.2f of the limit)\n",
                   "logsoftmax", rc.name, T, d.ndiff, x.size(), d.max_abs, worst);
            if (worst > 1.0) fail_msg("logsoftmax under %s: beyond the tolerance", rc.name);
        }
}

/* ---- KV write and attention --------------------------------------------------------------- */

static void test_kv_write(void **state)
{
    (void)state;
    const int SLOTS = 3, T = 12, KVD = 40, N = 5;
    const size_t off[N] = {0, 0, (size_t)T * KVD, (size_t)2 * T * KVD, (size_t)2 * T * KVD};
    const int pos[N] = {3, 4, 0, 7, 8};
    for (const sim_rcase &rc : recipes())
        for (int cache = 0; cache < 2; cache++) {
            td_ops ctx = sim_ctx(rc);
            ctx.cache = cache;
            std::vector<float> store = sim_normal(&RNG, (size_t)SLOTS * T * KVD, 1.0);
            std::vector<float> rows = sim_normal(&RNG, (size_t)N * KVD, 3.0);
            std::vector<float> cpu = store;
            td_backend_cpu.kv_write(&ctx, cpu.data(), rows.data(), off, pos, N, KVD);
            std::vector<float> gpu = sim_four_ways("kv_write", store.size(), [&](sim_bufs &b, float *dst) {
                float *s = b.copy(store), *r = b.copy(rows);
                kv_write_cuda(&ctx, s, r, off, pos, N, KVD);
                b.get(dst, s, store.size());
            });
            exact(cache ? "kv_write(c)" : "kv_write", rc.name, gpu.data(), cpu.data(), store.size());
            if (cache && rc.r.kv_cache == TD_E4M3) {   /* the fp8 rounding did happen */
                long rounded = 0;
                for (int i = 0; i < N; i++)
                    for (int c = 0; c < KVD; c++)
                        rounded += cpu[off[i] + (size_t)pos[i] * KVD + c] != rows[(size_t)i * KVD + c];
                assert_true(rounded > N * KVD / 2);
            }
            /* teacher forcing: the rows are the store itself (rows i at position i) */
            const size_t off0[N] = {0, 0, 0, 0, 0};
            const int pos0[N] = {0, 1, 2, 3, 4};
            cpu = store;
            td_backend_cpu.kv_write(&ctx, cpu.data(), cpu.data(), off0, pos0, N, KVD);
            gpu = sim_four_ways("kv_write in place", store.size(), [&](sim_bufs &b, float *dst) {
                float *s = b.copy(store);
                kv_write_cuda(&ctx, s, s, off0, pos0, N, KVD);
                b.get(dst, s, store.size());
            });
            exact(cache ? "kv_write(ci)" : "kv_write(i)", rc.name, gpu.data(), cpu.data(), store.size());
        }
}

struct att_shape { int NH, NKV, HD; };

/* rows: a prefill run of seq 0 at positions 0..36, 4 rows of seq 1 at 300..303 (a chunk after a
 * cached prefix); decode: one row each of seqs 0, 1, 2 at positions 36, 303, 0 */
static void attention_case(const sim_rcase &rc, att_shape sh, int decode)
{
    const int T = 320, SEQS = 3;
    int NH = sh.NH, NKV = sh.NKV, HD = sh.HD, KVD = NKV * HD;
    std::vector<size_t> off;
    std::vector<int> pos;
    if (!decode) {
        for (int i = 0; i < 37; i++) { off.push_back(0); pos.push_back(i); }
        for (int i = 0; i < 4; i++) { off.push_back((size_t)T * KVD); pos.push_back(300 + i); }
    } else {
        off = {0, (size_t)T * KVD, (size_t)2 * T * KVD};
        pos = {36, 303, 0};
    }
    int N = (int)pos.size(), max_keys = 304;
    td_ops ctx = sim_ctx(rc);
    ctx.decode = decode;
    ctx.cache = 1;
    int D = sim_D(rc);
    std::vector<float> k = sim_rounded(sim_normal(&RNG, (size_t)SEQS * T * KVD, 1.0), D);
    std::vector<float> v = sim_rounded(sim_normal(&RNG, (size_t)SEQS * T * KVD, 1.0), D);
    std::vector<float> q = sim_rounded(sim_normal(&RNG, (size_t)N * NH * HD, 2.0), D);
    size_t no = (size_t)N * NH * HD;
    std::vector<float> cpu(no + (size_t)N * NH);
    std::vector<float> scratch((size_t)ctx.nthreads * ATT_BLOCK * max_keys);
    td_backend_cpu.attention_forward(&ctx, cpu.data(), cpu.data() + no, q.data(), k.data(), v.data(),
                                     off.data(), pos.data(), N, NH, NKV, HD, scratch.data(), max_keys);
    std::vector<float> gpu = sim_four_ways("attention", cpu.size(), [&](sim_bufs &b, float *dst) {
        float *dq = b.copy(q), *dk = b.copy(k), *dv = b.copy(v), *out = b.zeros(no), *lse = b.zeros((size_t)N * NH);
        attention_forward_cuda(&ctx, out, lse, dq, dk, dv, off.data(), pos.data(), N, NH, NKV, HD, NULL, max_keys);
        b.get(dst, out, no);
        b.get(dst + no, lse, (size_t)N * NH);
    });
    sim_att_figures f = sim_attention_figures(rc, gpu.data(), cpu.data(), no, (size_t)N * NH);
    printf("  %-12s %-15s %s NH%d/%d HD%d: out %ld of %zu differ, normalised %.3g (limit %.3g); "
           "lse %ld differ, max %.3g\n", "attention", rc.name, decode ? "decode " : "prefill", NH,
           NKV, HD, f.out.ndiff, no, f.nerr, f.lim, f.lse.ndiff, f.lse.max_abs);
    if (!sim_cpu_dot_like_kernels(&RNG)) f.flim = 1.0;
    if (!sim_attention_within(f))
        fail_msg("attention under %s (%s, HD %d): beyond the tolerance", rc.name,
                 decode ? "decode" : "prefill", HD);
}

static void test_attention(void **state)
{
    (void)state;
    const att_shape shapes[] = {{4, 2, 64}, {2, 1, 256}, {3, 3, 38}};   /* 38: a tail of HD mod 4 */
    for (const sim_rcase &rc : recipes())
        for (att_shape sh : shapes)
            for (int decode = 0; decode < 2; decode++) attention_case(rc, sh, decode);
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261123);
    return sim_open_gpu() ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu_residual_scale),
        cmocka_unit_test(test_logsoftmax),
        cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
