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

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include <cmocka.h>
#include "tidal/recipe.h"
#include "tidal/rng.h"
const td_backend *td_cuda_backend_open(int index, char *desc, size_t desc_len, td_error *err);
}

static td_rng RNG;
static const td_backend *GPU;

static std::vector<float> normal(size_t n, double sd)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(sd * td_rng_normal(&RNG));
    return v;
}

/* ---- recipes ------------------------------------------------------------------------------ */

struct rcase { const char *name; td_recipe r; int none; };

static td_recipe preset(const char *name)
{
    const td_recipe *p = td_recipe_find_preset(name);
    if (!p) fail_msg("no preset %s", name);
    return *p;
}

static std::vector<rcase> recipes(void)
{
    std::vector<rcase> v;
    v.push_back({"(none)", preset("fp32"), 1});
    const char *names[] = {"fp32", "bf16-train", "bf16-autocast", "vllm-bf16", "sglang-bf16",
                           "fp16-train", "fp16-infer"};
    for (const char *n : names) v.push_back({n, preset(n), 0});
    td_recipe e = preset("bf16-train");
    e.attention = TD_ATTN_FULL;
    v.push_back({"eager-bf16", e, 0});
    td_recipe b = preset("fp32");
    b.batch_invariant = true;
    v.push_back({"fp32-batch-inv", b, 0});
    td_recipe k = preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    v.push_back({"kv-e4m3", k, 0});
    k.kv_scale = 0.0625f;
    v.push_back({"kv-e4m3-s16", k, 0});
    td_recipe fb = preset("vllm-bf16");   /* blocks beyond the CPU's 256-score segments */
    fb.attn_block = 512;
    fb.decode_splits = 2;
    v.push_back({"flash-b512-s2", fb, 0});
    td_recipe f32f = preset("fp32");   /* flash in fp32: no rounding hides a score's last bit */
    f32f.attention = TD_ATTN_FLASH;
    f32f.attn_block = 64;
    f32f.decode_splits = 3;
    v.push_back({"flash-fp32", f32f, 0});
    td_recipe l = preset("bf16-train");
    l.temp_in_act = true;
    l.logsoftmax_act = true;
    v.push_back({"bf16-act-lsm", l, 0});
    return v;
}

static td_ops ctx_of(const rcase &rc)
{
    td_ops c;
    td_ops_init(&c, &td_backend_cpu);
    c.recipe = rc.none ? NULL : &rc.r;
    return c;
}

static int D_of(const rcase &rc) { return rc.none ? TD_F32 : rc.r.activations; }

/* ---- buffers and the four ways ------------------------------------------------------------ */

/* copies of inputs for one run: host (malloc) or device (cudaMalloc), freed at the end */
struct bufs {
    int dev;
    std::vector<void *> host, devp;
    explicit bufs(int d) : dev(d) {}
    ~bufs()
    {
        for (void *p : host) free(p);
        for (void *p : devp) CUDA_CHECK(cudaFree(p));
    }
    template <class T> T *copy(const T *h, size_t n)
    {
        size_t bytes = n ? n * sizeof(T) : 1;
        if (!dev) {
            T *p = (T *)malloc(bytes);
            memcpy(p, h, n * sizeof(T));
            host.push_back(p);
            return p;
        }
        T *p = NULL;
        CUDA_CHECK(cudaMalloc((void **)&p, bytes));
        CUDA_CHECK(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
        devp.push_back(p);
        return p;
    }
    template <class T> T *copy(const std::vector<T> &v) { return copy(v.data(), v.size()); }
    float *zeros(size_t n) { std::vector<float> z(n, 0.0f); return copy(z); }
    void get(float *dst, const float *src, size_t n)
    {
        CUDA_CHECK(cudaDeviceSynchronize());
        if (dev) CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
        else memcpy(dst, src, n * sizeof(float));
    }
};

/* run(b, dst) runs the CUDA op on buffers of b and leaves its n result floats in dst; done four
 * ways (host / device buffers x forward / reverse order), which must agree bit for bit */
template <class F> static std::vector<float> four_ways(const char *what, size_t n, F run)
{
    static const char *ORDER[2] = {"forward", "reverse"};
    std::vector<float> first(n), other(n);
    for (int w = 0; w < 4; w++) {
        setenv("CUDASIM_ORDER", ORDER[w & 1], 1);
        bufs b(w >> 1);
        run(b, w ? other.data() : first.data());
        if (w && memcmp(first.data(), other.data(), n * sizeof(float)))
            fail_msg("%s: %s buffers under CUDASIM_ORDER=%s differ from host buffers, forward", what,
                     w >> 1 ? "device" : "host", ORDER[w & 1]);
    }
    setenv("CUDASIM_ORDER", "forward", 1);
    td_backend_forget(GPU);   /* the weights' device copies: the host arrays are freed next */
    return first;
}

struct diff { double max_abs, max_ref; long ndiff; };

static diff compare(const float *g, const float *c, size_t n)
{
    diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (isnan(g[i]) != isnan(c[i])) fail_msg("element %zu: gpu %g cpu %g", i, g[i], c[i]);
        double e = isnan(c[i]) ? 0 : fabs((double)g[i] - c[i]);
        if (memcmp(&g[i], &c[i], 4)) d.ndiff++;
        d.max_abs = e > d.max_abs ? e : d.max_abs;
        d.max_ref = fabs(c[i]) > d.max_ref ? fabs(c[i]) : d.max_ref;
    }
    return d;
}

static void exact(const char *op, const char *rname, const float *g, const float *c, size_t n)
{
    diff d = compare(g, c, n);
    printf("  %-12s %-15s %7zu values, %ld differ (bit-exact required), max |d| %.3g\n", op, rname,
           n, d.ndiff, d.max_abs);
    if (d.ndiff) fail_msg("%s under %s: %ld of %zu values differ from the CPU", op, rname, d.ndiff, n);
}

/* a unit in the last place of format D at magnitude x (fp32: 2^-23 x) */
static double ulp_of(int D, double x)
{
    int m = D == TD_BF16 ? 7 : D == TD_F16 ? 10 : 23;
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 1 - m);
}

/* ---- the ops ------------------------------------------------------------------------------ */

static void test_embedding(void **state)
{
    (void)state;
    const int V = 40, C = 70, N = 9, SR = 16, SC = 32, NBC = (C + SC - 1) / SC;
    const int tok[N] = {0, 5, 39, 5, 17, 2, 33, 39, 11};
    std::vector<float> f = normal((size_t)V * C, 2.0);
    std::vector<float> scale((size_t)((V + SR - 1) / SR) * NBC);
    for (float &s : scale) s = (float)ldexp(1.0 + td_rng_uniform(&RNG), -3);
    rcase none = recipes()[0];
    td_ops ctx = ctx_of(none);
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
        std::vector<float> gpu = four_ways("embedding", cpu.size(), [&](bufs &b, float *dst) {
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
        for (const rcase &rc : recipes()) {
            td_ops ctx = ctx_of(rc);
            int N = sh.N, C = sh.C;
            std::vector<float> x = normal((size_t)N * C, 1.5), w = normal(C, 0.2);
            for (float &v : w) v += 1.0f;
            size_t n = (size_t)N * C;
            std::vector<float> cpu(n + N);
            td_backend_cpu.rmsnorm_forward(&ctx, cpu.data(), cpu.data() + n, x.data(), w.data(), N, C, 1e-6f);
            for (int inplace = 0; inplace < 2; inplace++) {
                std::vector<float> gpu = four_ways("rmsnorm", n + N, [&](bufs &b, float *dst) {
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
        for (const rcase &rc : recipes()) {
            td_ops ctx = ctx_of(rc);
            std::vector<float> x = normal((size_t)N * NHd * HD, 1.0), f(HD / 2);
            for (int k = 0; k < HD / 2; k++) f[k] = (float)pow(1e6, -2.0 * k / HD);
            int pos[N];
            for (int i = 0; i < N; i++) pos[i] = (int)td_rng_below(&RNG, 40000);
            for (float &v : x) v = td_round((td_format)D_of(rc), v);
            std::vector<float> cpu = x;
            td_backend_cpu.rope_forward(&ctx, cpu.data(), pos, f.data(), N, NHd, HD);
            std::vector<float> gpu = four_ways("rope", x.size(), [&](bufs &b, float *dst) {
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
    for (const rcase &rc : recipes()) {
        td_ops ctx = ctx_of(rc);
        std::vector<float> g = normal(n, 4.0), u = normal(n, 1.0);
        std::vector<float> cpu(n);
        td_backend_cpu.swiglu_forward(&ctx, cpu.data(), g.data(), u.data(), N, F);
        std::vector<float> gpu = four_ways("swiglu", n, [&](bufs &b, float *dst) {
            float *dg = b.copy(g), *du = b.copy(u);
            swiglu_forward_cuda(&ctx, dg, dg, du, N, F);   /* in place on gate, as decoder.c */
            b.get(dst, dg, n);
        });
        exact("swiglu", rc.name, gpu.data(), cpu.data(), n);

        td_backend_cpu.residual_forward(&ctx, cpu.data(), g.data(), u.data(), n);
        gpu = four_ways("residual", n, [&](bufs &b, float *dst) {
            float *a = b.copy(g), *c = b.copy(u);
            residual_forward_cuda(&ctx, a, a, c, n);
            b.get(dst, a, n);
        });
        exact("residual", rc.name, gpu.data(), cpu.data(), n);

        cpu = g;
        td_backend_cpu.scale_forward(&ctx, cpu.data(), 0.37f, n);
        gpu = four_ways("scale", n, [&](bufs &b, float *dst) {
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
    for (const rcase &rc : recipes())
        for (float T : temps) {
            td_recipe head = rc.r;
            if (!rc.none) head = td_recipe_for_head(&rc.r);
            head.temp_in_act = rc.r.temp_in_act;
            head.logsoftmax_act = rc.r.logsoftmax_act;
            td_ops ctx = ctx_of(rc);
            if (!rc.none) ctx.recipe = &head;
            ctx.temperature = T;
            std::vector<float> x = normal((size_t)N * V, 3.0);
            for (float &v : x) v = td_round((td_format)D_of(rc), v);
            std::vector<float> cpu = x;
            td_backend_cpu.logsoftmax_forward(&ctx, cpu.data(), N, V);
            std::vector<float> gpu = four_ways("logsoftmax", x.size(), [&](bufs &b, float *dst) {
                float *d = b.copy(x);
                logsoftmax_forward_cuda(&ctx, d, N, V);
                b.get(dst, d, x.size());
            });
            int R = !rc.none && head.logsoftmax_act ? head.activations : TD_F32;
            double worst = 0;   /* |d| / allowed */
            for (size_t i = 0; i < x.size(); i++) {
                double e = fabs((double)gpu[i] - cpu[i]);
                double lim = R == TD_F32 ? 2e-6 * (1 + fabs(cpu[i])) : ulp_of(R, fabs(cpu[i])) * 1.001;
                worst = e / lim > worst ? e / lim : worst;
            }
            diff d = compare(gpu.data(), cpu.data(), x.size());
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
    for (const rcase &rc : recipes())
        for (int cache = 0; cache < 2; cache++) {
            td_ops ctx = ctx_of(rc);
            ctx.cache = cache;
            std::vector<float> store = normal((size_t)SLOTS * T * KVD, 1.0), rows = normal((size_t)N * KVD, 3.0);
            std::vector<float> cpu = store;
            td_backend_cpu.kv_write(&ctx, cpu.data(), rows.data(), off, pos, N, KVD);
            std::vector<float> gpu = four_ways("kv_write", store.size(), [&](bufs &b, float *dst) {
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
            gpu = four_ways("kv_write in place", store.size(), [&](bufs &b, float *dst) {
                float *s = b.copy(store);
                kv_write_cuda(&ctx, s, s, off0, pos0, N, KVD);
                b.get(dst, s, store.size());
            });
            exact(cache ? "kv_write(ci)" : "kv_write(i)", rc.name, gpu.data(), cpu.data(), store.size());
        }
}

struct att_shape { int NH, NKV, HD; };

/* Whether this build of cpu.c sums q.k as the kernels do (GCC's 4-lane SSE reduction at -O2;
 * -O1, as check-asan builds it, sums in order). Probed through the CPU's own flash attention of
 * one row over one key, whose lse is q.k scale. */
static int cpu_dot_like_kernels(void)
{
    static int known = -1;
    if (known >= 0) return known;
    td_recipe r = preset("bf16-train");
    r.activations = TD_F32;
    rcase rc = {"probe", r, 0};
    td_ops ctx = ctx_of(rc);
    const int HD = 64;
    const size_t off = 0;
    const int pos = 0;
    int same = 0, n = 20;
    for (int t = 0; t < n; t++) {
        std::vector<float> q = normal(HD, 1.0), k = normal(HD, 1.0), v = normal(HD, 1.0), out(HD);
        std::vector<float> scratch((size_t)ctx.nthreads * ATT_BLOCK);
        float lse;
        td_backend_cpu.attention_forward(&ctx, out.data(), &lse, q.data(), k.data(), v.data(), &off,
                                         &pos, 1, 1, 1, HD, scratch.data(), 1);
        float p[4] = {0, 0, 0, 0};
        for (int c = 0; c < HD; c++) p[c % 4] += q[c] * k[c];
        float d = (((0.0f + p[0]) + p[1]) + p[2]) + p[3];
        same += d * (1.0f / sqrtf((float)HD)) == lse;
    }
    known = same == n;
    printf("  the CPU's q.k order is %s\n", known ? "the kernels' (4-lane SSE): bits compared"
                                                   : "another (not vectorised?): bits not compared");
    return known;
}

/* rows: a prefill run of seq 0 at positions 0..36, 4 rows of seq 1 at 300..303 (a chunk after a
 * cached prefix); decode: one row each of seqs 0, 1, 2 at positions 36, 303, 0 */
static void attention_case(const rcase &rc, att_shape sh, int decode)
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
    td_ops ctx = ctx_of(rc);
    ctx.decode = decode;
    ctx.cache = 1;
    int D = D_of(rc);
    std::vector<float> k = normal((size_t)SEQS * T * KVD, 1.0), v = normal((size_t)SEQS * T * KVD, 1.0);
    std::vector<float> q = normal((size_t)N * NH * HD, 2.0);
    for (float &x : k) x = td_round((td_format)D, x);
    for (float &x : v) x = td_round((td_format)D, x);
    for (float &x : q) x = td_round((td_format)D, x);
    size_t no = (size_t)N * NH * HD;
    std::vector<float> cpu(no + (size_t)N * NH);
    std::vector<float> scratch((size_t)ctx.nthreads * ATT_BLOCK * max_keys);
    td_backend_cpu.attention_forward(&ctx, cpu.data(), cpu.data() + no, q.data(), k.data(), v.data(),
                                     off.data(), pos.data(), N, NH, NKV, HD, scratch.data(), max_keys);
    std::vector<float> gpu = four_ways("attention", cpu.size(), [&](bufs &b, float *dst) {
        float *dq = b.copy(q), *dk = b.copy(k), *dv = b.copy(v), *out = b.zeros(no), *lse = b.zeros((size_t)N * NH);
        attention_forward_cuda(&ctx, out, lse, dq, dk, dv, off.data(), pos.data(), N, NH, NKV, HD, NULL, max_keys);
        b.get(dst, out, no);
        b.get(dst + no, lse, (size_t)N * NH);
    });
    diff d = compare(gpu.data(), cpu.data(), no);
    diff dl = compare(gpu.data() + no, cpu.data() + no, (size_t)N * NH);
    double nerr = d.max_abs / d.max_ref;
    double lim = D == TD_F32 ? 1e-5 : 2 * ulp_of(D, d.max_ref) / d.max_ref;
    printf("  %-12s %-15s %s NH%d/%d HD%d: out %ld of %zu differ, normalised %.3g (limit %.3g); "
           "lse %ld differ, max %.3g\n", "attention", rc.name, decode ? "decode " : "prefill", NH,
           NKV, HD, d.ndiff, no, nerr, lim, dl.ndiff, dl.max_abs);
    double llim = 1e-5;   /* lse: scores O(1); a score moved by one unit of D moves it as much */
    for (size_t j = 0; D != TD_F32 && j < (size_t)N * NH; j++) {
        double u = 2 * ulp_of(D, fabs(cpu[no + j]) > 1 ? fabs(cpu[no + j]) : 1.0);
        llim = u > llim ? u : llim;
    }
    /* bits: every form but the reference (sgemm order) is the CPU's arithmetic, expf aside */
    int reference = rc.none || (rc.r.attention == TD_ATTN_FULL && D == TD_F32 && !rc.r.batch_invariant);
    double frac = (double)d.ndiff / no, flim = reference ? 1.0 : D == TD_F32 ? 0.05 : 0.005;
    if (!cpu_dot_like_kernels()) flim = 1.0;
    if (nerr > lim || dl.max_abs > llim || frac > flim)
        fail_msg("attention under %s (%s, HD %d): beyond the tolerance", rc.name,
                 decode ? "decode" : "prefill", HD);
}

static void test_attention(void **state)
{
    (void)state;
    const att_shape shapes[] = {{4, 2, 64}, {2, 1, 256}, {3, 3, 38}};   /* 38: a tail of HD mod 4 */
    for (const rcase &rc : recipes())
        for (att_shape sh : shapes)
            for (int decode = 0; decode < 2; decode++) attention_case(rc, sh, decode);
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261123);
    td_error err;
    GPU = td_cuda_backend_open(0, NULL, 0, &err);
    if (!GPU) { fprintf(stderr, "%s\n", err.msg); return -1; }
    return 0;
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
