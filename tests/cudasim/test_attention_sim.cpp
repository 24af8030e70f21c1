/* The CUDA backend's attention kernels at prefill scale: the tiled flash kernel (attn_tile,
 * src/backend/cuda/attention_tiled.cu) against the simple one (attn_rows, attention.cu) and
 * against the CPU's attention (td_backend_cpu: cpu.c's flash_part / eager_head, cpu_ref.c's
 * reference form), on seeded random inputs.
 *
 * Rows (teacher forcing and a prefill chunk, three sequences packed in one K/V store):
 *   seq A  positions 0..299 at kv_off 0 (300 keys: 10 tiles of 32 with a partial last one of
 *          12; blocks of 64 and 128 keys with partial last blocks; two 256-key segments in a
 *          512-key block), seq B positions 0..140 packed after it, seq C positions 200..263 (a
 *          chunk after a cached prefix of 200 keys).
 * Shapes: GQA ratios 1 (2 heads / 2), 2 (4 / 2), 4 (4 / 1: four query heads share a block),
 *   head dims 64, 128, 256 (blocks of 32 rows) and 38 (a tail of HD mod 4).
 * Recipes: no recipe (the fp32 reference), fp32, bf16-train (flash 128), bf16-infer, fp16-train,
 *   sglang-bf16, vllm-bf16 with an e4m3 KV cache (K and V rounded by the CPU's kv_write), a
 *   flash-512 variant (two segments a block), flash in fp32 (no rounding of P hides a bit) and
 *   HF eager in bf16. The tiled kernel is the flash form's: the reference and eager forms run the
 *   simple kernel whatever is asked (checked: the same bits). Under ASan (make check-asan:
 *   SIM_SANITIZED) the variants that change only roundings (bf16-infer, fp16-train, sglang-bf16,
 *   fp16-infer) are left out: every kernel and shape still runs there.
 * Checked, each run under CUDASIM_ORDER=forward and reverse (a missing barrier shows as a
 * difference; the two must be the same bits):
 *   tiled == simple, bit for bit: the tiled kernel does the CPU's products, sums and roundings
 *     in the CPU's order, as the simple one does (the same tdc_expf): only the tiling differs;
 *   against the CPU, test_ops_sim's tolerances: under every flash recipe at most 0.5 % of the
 *     outputs differ in any bit under bf16 / fp16 and 5 % in fp32 (glibc's expf differs from the
 *     device's double exp rounded to float for ~1e-4 of its inputs; not checked when the CPU
 *     build sums q.k in another order, as check-asan's -O1 does), normalised error
 *     max|gpu - cpu| / max|cpu| <= 1e-5 in fp32, two units of D under D; lse within 1e-5 (two
 *     units of D at |lse| under D). Measured figures printed.
 * Split-KV decode: two rows at 4,096 and 1,000 keys under vllm-bf16 (decode_splits 4: each part
 * its own block, grid z) and flash-b512-s2, against the CPU, same tolerances.
 *
 * The tensor-core kernel (attn_mma, attention_mma.cu, TIDAL_CUDA_ATTN=mma; not bit-exact): on the
 * same packed prefill rows under bf16-train, fp16-train, bf16-infer, sglang-bf16, fp16-infer,
 * vllm-bf16 with an e4m3 KV cache and a 512-key block, GQA 1 / 2 / 4 at HD 64 and 128, GQA 3 at
 * HD 32 (datasets/models/add's heads), forward
 * and reverse thread orders (the same bits), against the CPU, the tiled kernel and the fp32
 * reference (limits at test_mma_prefill); over a KV cache of codes (bf16, fp16, e4m3 with
 * kv_scale 1 and 1/16) the bits of attn_mma over the CPU cache's floats; where the recipe's
 * arithmetic does not allow it (fp32, bf16-autocast, e4m3 times 0.1, HD 256) the tiled bits.
 *
 * `test_attention_sim --bench` (a real GPU only: tests/gpu/run.sh attn-bench): 8 sequences of
 * 8,192 tokens at Llama-3-8B's head shapes (32 heads over 8 kv heads of 128), bf16-train and
 * vllm-bf16, the tiled kernel against the simple one and the tensor-core one: time of each
 * (cudaEvent), whether the tiled and simple outputs are the same bits, and attn_mma's share of
 * differing outputs and normalised error against the tiled kernel (test_mma_prefill's limits;
 * exit 1 beyond them). */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/formats.h"
/* attention_mma.cu */
int attention_mma_allowed(int D, int residual_fp32, int HD, int vfmt, float vs);
}

static td_rng RNG;

/* under ASan (SIM_SANITIZED), the cases that reach another kernel or another store: the bf16
 * presets' variants (bf16-infer, fp16-train, sglang-bf16, fp16-infer) differ from bf16-train in
 * their roundings only, which the normal build checks */
static std::vector<sim_rcase> sanitized_subset(const std::vector<sim_rcase> &all)
{
    if (!SIM_SANITIZED) return all;
    std::vector<sim_rcase> v;
    for (const sim_rcase &rc : all)
        if (strcmp(rc.name, "bf16-infer") && strcmp(rc.name, "fp16-train") && strcmp(rc.name, "sglang-bf16") &&
            strcmp(rc.name, "fp16-infer"))
            v.push_back(rc);
    return v;
}

static std::vector<sim_rcase> recipes(void)
{
    std::vector<sim_rcase> v;
    v.push_back({"(none)", sim_preset("fp32"), 1});
    const char *names[] = {"fp32", "bf16-train", "bf16-infer", "fp16-train", "sglang-bf16"};
    for (const char *n : names) v.push_back({n, sim_preset(n), 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    v.push_back({"kv-e4m3", k, 0});
    td_recipe fb = sim_preset("vllm-bf16");
    fb.attn_block = 512;
    fb.decode_splits = 2;
    v.push_back({"flash-b512-s2", fb, 0});
    td_recipe f32f = sim_preset("fp32");
    f32f.attention = TD_ATTN_FLASH;
    f32f.attn_block = 64;
    v.push_back({"flash-fp32", f32f, 0});
    td_recipe e = sim_preset("bf16-train");
    e.attention = TD_ATTN_FULL;
    v.push_back({"eager-bf16", e, 0});
    return sanitized_subset(v);
}

static int is_flash(const sim_rcase &rc) { return !rc.none && rc.r.attention == TD_ATTN_FLASH; }

struct problem {
    int N, NH, NKV, HD, max_keys;
    std::vector<size_t> off;
    std::vector<int> pos;
    std::vector<float> q, k, v;
};

/* prefill rows of seqs A, B, C (header), or decode rows at 4,096 and 1,000 keys */
static problem make_problem(const sim_rcase &rc, int NH, int NKV, int HD, int decode)
{
    problem p;
    p.NH = NH; p.NKV = NKV; p.HD = HD;
    int KVD = NKV * HD, D = sim_D(rc);
    size_t keys;
    if (!decode) {
        for (int i = 0; i < 300; i++) { p.off.push_back(0); p.pos.push_back(i); }
        for (int i = 0; i <= 140; i++) { p.off.push_back((size_t)300 * KVD); p.pos.push_back(i); }
        for (int i = 200; i < 264; i++) { p.off.push_back((size_t)441 * KVD); p.pos.push_back(i); }
        keys = 441 + 264;
        p.max_keys = 300;
    } else {
        p.off = {0, (size_t)4096 * KVD};
        p.pos = {4095, 999};
        keys = 4096 + 1000;
        p.max_keys = 4096;
    }
    p.N = (int)p.pos.size();
    p.k = sim_rounded(sim_normal(&RNG, keys * KVD, 1.0), D);
    p.v = sim_rounded(sim_normal(&RNG, keys * KVD, 1.0), D);
    p.q = sim_rounded(sim_normal(&RNG, (size_t)p.N * NH * HD, 2.0), D);
    if (!rc.none && rc.r.kv_cache != rc.r.activations && rc.r.kv_cache != TD_F32) {
        /* the KV cache's format: rounded as the CPU's kv_write does it */
        td_ops ctx;
        td_ops_init(&ctx, &td_backend_cpu);
        ctx.recipe = &rc.r;
        ctx.cache = 1;
        std::vector<size_t> o(keys, 0);
        std::vector<int> ps(keys);
        for (size_t j = 0; j < keys; j++) ps[j] = (int)j;
        td_backend_cpu.kv_write(&ctx, p.k.data(), p.k.data(), o.data(), ps.data(), (int)keys, KVD);
        td_backend_cpu.kv_write(&ctx, p.v.data(), p.v.data(), o.data(), ps.data(), (int)keys, KVD);
    }
    return p;
}

/* the CPU context of the case, KV cache on (the CUDA ops read only its recipe and flags) */
static td_ops ctx_of(const sim_rcase &rc, int decode)
{
    td_ops c = sim_ctx(rc);
    c.decode = decode;
    c.cache = 1;
    return c;
}

/* out (N NH HD) then lse (N NH) */
static std::vector<float> run_cpu(const sim_rcase &rc, const problem &p, int decode)
{
    td_ops ctx = ctx_of(rc, decode);
    size_t no = (size_t)p.N * p.NH * p.HD;
    std::vector<float> r(no + (size_t)p.N * p.NH);
    std::vector<float> scratch((size_t)ctx.nthreads * ATT_BLOCK * p.max_keys);
    td_backend_cpu.attention_forward(&ctx, r.data(), r.data() + no, p.q.data(), p.k.data(), p.v.data(),
                                     p.off.data(), p.pos.data(), p.N, p.NH, p.NKV, p.HD, scratch.data(),
                                     p.max_keys);
    return r;
}

/* the CUDA attention with kernel choice `kernel` (tdc_attn_kernel) under CUDASIM_ORDER `order` */
static std::vector<float> run_gpu(const sim_rcase &rc, const problem &p, int decode, int kernel, const char *order)
{
    td_ops ctx = ctx_of(rc, decode);
    size_t no = (size_t)p.N * p.NH * p.HD;
    std::vector<float> r(no + (size_t)p.N * p.NH, 0.0f);
    setenv("CUDASIM_ORDER", order, 1);
    tdc_attn_kernel = kernel;
    attention_forward_cuda(&ctx, r.data(), r.data() + no, p.q.data(), p.k.data(), p.v.data(), p.off.data(),
                           p.pos.data(), p.N, p.NH, p.NKV, p.HD, NULL, p.max_keys);
    CUDA_CHECK(cudaDeviceSynchronize());
    tdc_attn_kernel = 0;
    setenv("CUDASIM_ORDER", "forward", 1);
    return r;
}

/* test_ops_sim's tolerances against the CPU (header; simtest.h's sim_attention_figures); prints
 * the figures */
static void against_cpu(const char *what, const sim_rcase &rc, const problem &p, const std::vector<float> &gpu,
                        const std::vector<float> &cpu)
{
    size_t no = (size_t)p.N * p.NH * p.HD, nl = (size_t)p.N * p.NH;
    sim_att_figures f = sim_attention_figures(rc, gpu.data(), cpu.data(), no, nl);
    if (!sim_cpu_dot_like_kernels(&RNG)) f.flim = 1.0;
    printf("  %-14s %-8s NH%d/%d HD%3d: vs CPU out %ld of %zu differ (%.3f%%), normalised %.3g (limit %.3g); "
           "lse %ld differ, max %.3g\n", rc.name, what, p.NH, p.NKV, p.HD, f.out.ndiff, no, 100 * f.frac, f.nerr,
           f.lim, f.lse.ndiff, f.lse.max_abs);
    if (!sim_attention_within(f))
        fail_msg("attention under %s (%s, NH %d/%d, HD %d): beyond the tolerance", rc.name, what, p.NH,
                 p.NKV, p.HD);
}

static void same_bits(const char *what, const sim_rcase &rc, const std::vector<float> &a, const std::vector<float> &b)
{
    if (a.size() != b.size() || memcmp(a.data(), b.data(), a.size() * sizeof(float))) {
        sim_diff d = sim_compare(a.data(), b.data(), a.size());
        fail_msg("%s under %s: %ld of %zu values differ (max %.3g)", what, rc.name, d.ndiff, a.size(), d.max_abs);
    }
}

static void test_prefill(void **state)
{
    (void)state;
    struct { int NH, NKV, HD; } shapes[] = {{2, 2, 64}, {4, 2, 64}, {4, 1, 128}, {2, 1, 256}, {3, 3, 38}};
    for (const sim_rcase &rc : recipes())
        for (auto sh : shapes) {
            problem p = make_problem(rc, sh.NH, sh.NKV, sh.HD, 0);
            std::vector<float> cpu = run_cpu(rc, p, 0);
            std::vector<float> tiled = run_gpu(rc, p, 0, 2, "forward");
            same_bits("tiled asked vs simple kernel", rc, tiled, run_gpu(rc, p, 0, 1, "forward"));
            if (is_flash(rc)) {   /* the others ran the simple kernel, which test_ops_sim covers */
                same_bits("tiled, CUDASIM_ORDER=reverse vs forward", rc, run_gpu(rc, p, 0, 2, "reverse"), tiled);
                if (sh.HD == 64 && sh.NH == 2)
                    same_bits("by shape (auto) vs tiled", rc, run_gpu(rc, p, 0, 0, "forward"), tiled);
            }
            against_cpu(is_flash(rc) ? "tiled" : "simple", rc, p, tiled, cpu);
        }
}

static void test_decode_split(void **state)
{
    (void)state;
    for (const sim_rcase &rc : recipes()) {
        if (!is_flash(rc) || rc.r.decode_splits <= 1) continue;
        problem p = make_problem(rc, 4, 2, 64, 1);
        std::vector<float> cpu = run_cpu(rc, p, 1);
        std::vector<float> gpu = run_gpu(rc, p, 1, 0, "forward");
        same_bits("split-KV decode, CUDASIM_ORDER=reverse vs forward", rc, run_gpu(rc, p, 1, 0, "reverse"), gpu);
        char what[32];
        snprintf(what, sizeof what, "split%d", rc.r.decode_splits);
        against_cpu(what, rc, p, gpu, cpu);
    }
}

/* ---- the KV cache as codes ------------------------------------------------------------------- */

/* A KV cache of codes (ctx->kv_fmt, ops.h td_kv_store_format) against the CPU's float cache: the
 * codes kv_write_cuda writes, decoded (times the fp8 cache's kv_scale), are the CPU kv_write's
 * floats bit for bit, and attention over the codes (tiled prefill; decode, split-KV where the
 * recipe splits) gives the bits of attention over those floats. Store size: td_kv_esize bytes
 * an element. */
static void test_kv_codes(void **state)
{
    (void)state;
    const td_backend *gpu = sim_open_gpu();
    assert_non_null(gpu);
    std::vector<sim_rcase> cases;
    const char *names[] = {"bf16-infer", "fp16-train", "fp32"};
    for (const char *n : names) cases.push_back({n, sim_preset(n), 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    cases.push_back({"kv-e4m3", k, 0});
    k.kv_scale = 0.0625f;
    cases.push_back({"kv-e4m3-s16", k, 0});
    td_recipe au = sim_preset("bf16-autocast");   /* residual_fp32: an unmerged LoRA's fp32 add */
    assert_int_equal(td_kv_store_format(gpu, &au), au.kv_cache == au.activations ? TD_F32 : au.kv_cache);
    const int NH = 4, NKV = 2, HD = 64, KVD = NKV * HD, SLOT = 320, SLOTS = 2;
    for (const sim_rcase &rc : cases) {
        int fmt = td_kv_store_format(gpu, &rc.r);
        size_t es = td_kv_esize(fmt), elems = (size_t)SLOTS * SLOT * KVD;
        printf("  %-14s KV cache: %s elements, %zu bytes each (%zu bytes a token and layer at "
               "NKV %d, HD %d)\n", rc.name, td_format_info((td_format)fmt)->name, es, 2 * KVD * es, NKV, HD);
        assert_int_equal(fmt, rc.r.kv_cache == TD_F32 ? TD_F32 : rc.r.kv_cache);
        assert_int_equal(td_kv_store_format(&td_backend_cpu, &rc.r), TD_F32);   /* the CPU: floats */
        /* a prefill of 300 tokens into slot 0 and 40 into slot 1, then a decode row each */
        std::vector<size_t> off;
        std::vector<int> pos;
        for (int i = 0; i < 300; i++) { off.push_back(0); pos.push_back(i); }
        for (int i = 0; i < 40; i++) { off.push_back((size_t)SLOT * KVD); pos.push_back(i); }
        int NP = (int)pos.size();
        off.push_back(0); pos.push_back(300);
        off.push_back((size_t)SLOT * KVD); pos.push_back(40);
        int N = (int)pos.size();
        std::vector<float> kr = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), rc.r.activations);
        std::vector<float> vr = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), rc.r.activations);
        std::vector<float> q = sim_rounded(sim_normal(&RNG, (size_t)N * NH * HD, 2.0), rc.r.activations);
        td_ops ctx;
        td_ops_init(&ctx, &td_backend_cpu);
        ctx.recipe = &rc.r;
        ctx.cache = 1;
        std::vector<float> kc(elems, 0.0f), vc(elems, 0.0f);   /* the CPU's float cache */
        td_backend_cpu.kv_write(&ctx, kc.data(), kr.data(), off.data(), pos.data(), N, KVD);
        td_backend_cpu.kv_write(&ctx, vc.data(), vr.data(), off.data(), pos.data(), N, KVD);
        td_ops cctx = ctx;
        cctx.kv_fmt = fmt;
        std::vector<unsigned char> kb(elems * es, 0), vb(elems * es, 0);   /* the codes */
        kv_write_cuda(&cctx, (float *)kb.data(), kr.data(), off.data(), pos.data(), N, KVD);
        kv_write_cuda(&cctx, (float *)vb.data(), vr.data(), off.data(), pos.data(), N, KVD);
        CUDA_CHECK(cudaDeviceSynchronize());
        float sc = rc.r.kv_cache != rc.r.activations && rc.r.kv_scale > 0 ? rc.r.kv_scale : 1.0f;
        long bad = 0;
        for (int i = 0; i < N; i++)
            for (int c = 0; c < KVD; c++) {
                size_t e = off[i] + (size_t)pos[i] * KVD + c;
                for (int kv = 0; kv < 2; kv++) {
                    const unsigned char *b = (kv ? vb : kb).data() + e * es;
                    uint32_t code = es == 4 ? 0 : es == 2 ? *(const uint16_t *)b : *b;
                    float x = es == 4 ? *(const float *)b : td_decode((td_format)fmt, code) * sc;
                    float want = (kv ? vc : kc)[e];
                    bad += memcmp(&x, &want, 4) != 0;
                }
            }
        if (bad) fail_msg("%s: %ld cached values decode to other than the CPU's floats", rc.name, bad);
        /* attention: prefill (tiled) and decode over codes vs over the CPU's floats */
        for (int decode = 0; decode < 2; decode++) {
            int r0 = decode ? NP : 0, n = decode ? N - NP : NP;
            size_t no = (size_t)n * NH * HD;
            std::vector<float> a(no + (size_t)n * NH), b(no + (size_t)n * NH);
            ctx.decode = cctx.decode = decode;
            attention_forward_cuda(&ctx, a.data(), a.data() + no, q.data() + (size_t)r0 * NH * HD, kc.data(),
                                   vc.data(), off.data() + r0, pos.data() + r0, n, NH, NKV, HD, NULL, SLOT);
            attention_forward_cuda(&cctx, b.data(), b.data() + no, q.data() + (size_t)r0 * NH * HD,
                                   (const float *)kb.data(), (const float *)vb.data(), off.data() + r0,
                                   pos.data() + r0, n, NH, NKV, HD, NULL, SLOT);
            CUDA_CHECK(cudaDeviceSynchronize());
            same_bits(decode ? "decode over codes vs floats" : "prefill over codes vs floats", rc, b, a);
        }
        printf("  %-14s KV codes: decoded = the CPU's cache (%zu values), attention over codes = over "
               "floats (prefill %d rows, decode 2 rows): same bits\n", rc.name, (size_t)2 * N * KVD, NP);
    }
}

/* ---- the tensor-core kernel (attn_mma, attention_mma.cu; TIDAL_CUDA_ATTN=mma) ---------------- */

/* Not bit-exact (another summation order of q.k, P.V and l; P rounded against maxima that can
 * differ in fp32's last bits): measured against the CPU op of the recipe, the bit-exact tiled
 * kernel and the fp32 reference attention (no recipe, cpu_ref.c) on the same rounded inputs.
 * Limits, each with its reason:
 *   out  normalised error max|mma - cpu| / max|cpu| <= 2 units of D at max|cpu| (the output's own
 *        rounding to D can land on the other neighbour: one unit of D at that output's size, and
 *        a flipped rounding of P moves o by far less); share of outputs differing in any bit
 *        <= MMA_FLIM where the kernel's softmax segments are the CPU's (attn_block 64 or 128:
 *        the running maxima are the same scores, so P is rounded from the same scale; a
 *        difference needs an output or a p within fp32 noise of a rounding boundary of D), else
 *        MMA_FLIM_SEG (the CPU's 256-key segments against the kernel's 128: p = expf(s - m) is
 *        rounded to D from another m, so a share of the P values round differently);
 *   lse  |mma - cpu| <= MMA_LSE_ULP fp32 ulps of max(|lse|, 1): m is the same score up to the
 *        fp32 order of q.k (HD products: a few ulps; the simulator's MMA sums exactly, measured
 *        <= 7 ulps with the CPU's -O1 order; a tensor core's truncating adder may lose about an
 *        ulp of the partial sum per 16-product step, HD / 16 steps: the limit leaves room for
 *        it on a GPU), l the same sum in another fp32 order;
 *   the recipe's character: the RMS distance to the fp32 reference over the CPU recipe's RMS
 *        distance within [1 - MMA_DIST, 1 + MMA_DIST]: the roundings of P and of the output are
 *        the recipe's, so the kernel is as far from fp32 as the CPU emulation is. */
#define MMA_FLIM 0.02       /* the recipe's attn_block 64 or 128: the kernel's segments are the CPU's */
#define MMA_FLIM_SEG 0.10   /* other blocks: the kernel's 128-key segments are not the CPU's */
#define MMA_LSE_ULP 32.0
#define MMA_DIST 0.02

struct mma_figures { sim_diff out; double nerr, lim, frac, flim, lse_ulp, dist_ratio; };

static double rms_diff(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

static mma_figures mma_against(const sim_rcase &rc, const problem &p, const std::vector<float> &mma,
                               const std::vector<float> &cpu, const std::vector<float> &ref)
{
    size_t no = (size_t)p.N * p.NH * p.HD, nl = (size_t)p.N * p.NH;
    int D = sim_D(rc);
    mma_figures f;
    f.out = sim_compare(mma.data(), cpu.data(), no);
    f.nerr = f.out.max_abs / f.out.max_ref;
    f.lim = 2 * sim_ulp(D, f.out.max_ref) / f.out.max_ref;
    f.frac = (double)f.out.ndiff / no;
    f.flim = rc.r.attn_block == 64 || rc.r.attn_block == 128 ? MMA_FLIM : MMA_FLIM_SEG;
    f.lse_ulp = 0;
    for (size_t j = 0; j < nl; j++) {
        double c = cpu[no + j], u = sim_ulp(TD_F32, fabs(c) > 1 ? fabs(c) : 1.0);
        double e = fabs(mma[no + j] - c) / u;
        f.lse_ulp = e > f.lse_ulp ? e : f.lse_ulp;
    }
    f.dist_ratio = rms_diff(mma.data(), ref.data(), no) / rms_diff(cpu.data(), ref.data(), no);
    return f;
}

static void mma_check(const char *what, const sim_rcase &rc, const problem &p, const mma_figures &f, int print)
{
    size_t no = (size_t)p.N * p.NH * p.HD;
    if (print)
        printf("  %-11s NH%d/%d HD%3d %s: out %ld of %zu differ (%.3f%%, limit %.0f%%), normalised %.3g (limit %.3g); "
               "lse max %.1f fp32 ulps (limit %.0f); RMS distance to fp32 mma/cpu %.4f\n", rc.name, p.NH, p.NKV, p.HD,
               what, f.out.ndiff, no, 100 * f.frac, 100 * f.flim, f.nerr, f.lim, f.lse_ulp, MMA_LSE_ULP, f.dist_ratio);
    if (f.nerr > f.lim || f.frac > f.flim || f.lse_ulp > MMA_LSE_ULP || fabs(f.dist_ratio - 1) > MMA_DIST)
        fail_msg("attn_mma under %s (%s, NH %d/%d, HD %d): beyond the tolerance", rc.name, what, p.NH, p.NKV, p.HD);
}

static std::vector<sim_rcase> mma_recipes(void)
{
    std::vector<sim_rcase> v;
    const char *names[] = {"bf16-train", "fp16-train", "bf16-infer", "sglang-bf16", "fp16-infer"};
    for (const char *n : names) v.push_back({n, sim_preset(n), 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    v.push_back({"kv-e4m3", k, 0});
    td_recipe fb = sim_preset("vllm-bf16");   /* the CPU's 256-key segments, the kernel's 128 */
    fb.attn_block = 512;
    v.push_back({"flash-b512", fb, 0});
    return sanitized_subset(v);
}

/* attn_mma on the packed prefill rows (seqs A, B, C) vs the CPU, the tiled kernel and fp32 */
static void test_mma_prefill(void **state)
{
    (void)state;
    struct { int NH, NKV, HD; } shapes[] = {{2, 2, 64}, {4, 2, 64}, {4, 1, 128}, {6, 2, 32}};
    sim_rcase none = {"(none)", sim_preset("fp32"), 1};
    double worst_frac = 0, worst_lse = 0, dmin = 1e9, dmax = 0;
    for (const sim_rcase &rc : mma_recipes())
        for (auto sh : shapes) {
            problem p = make_problem(rc, sh.NH, sh.NKV, sh.HD, 0);
            assert_true(attention_mma_allowed(sim_D(rc), rc.r.residual_fp32, sh.HD,
                                              rc.r.kv_cache != rc.r.activations && rc.r.kv_cache != TD_F32
                                                  ? (int)rc.r.kv_cache : sim_D(rc), 1.0f));
            std::vector<float> cpu = run_cpu(rc, p, 0), ref = run_cpu(none, p, 0);
            std::vector<float> mma = run_gpu(rc, p, 0, 3, "forward");
            same_bits("mma, CUDASIM_ORDER=reverse vs forward", rc, run_gpu(rc, p, 0, 3, "reverse"), mma);
            std::vector<float> tiled = run_gpu(rc, p, 0, 2, "forward");
            mma_figures f = mma_against(rc, p, mma, cpu, ref), ft = mma_against(rc, p, mma, tiled, ref);
            mma_check("vs CPU", rc, p, f, 1);
            mma_check("vs tiled", rc, p, ft, ft.out.ndiff != f.out.ndiff);   /* printed when not the same */
            worst_frac = f.frac > worst_frac ? f.frac : worst_frac;
            worst_lse = f.lse_ulp > worst_lse ? f.lse_ulp : worst_lse;
            dmin = f.dist_ratio < dmin ? f.dist_ratio : dmin;
            dmax = f.dist_ratio > dmax ? f.dist_ratio : dmax;
        }
    printf("  attn_mma vs CPU over every case: at most %.3f%% of outputs differ, lse within %.1f fp32 ulps, "
           "distance to fp32 %.4f..%.4f of the CPU recipe's\n", 100 * worst_frac, worst_lse, dmin, dmax);
}

/* where the recipe's arithmetic does not allow it, TIDAL_CUDA_ATTN=mma runs the bit-exact
 * kernels (the tiled kernel's bits); attention_mma_allowed's rules */
static void test_mma_refused(void **state)
{
    (void)state;
    assert_true(attention_mma_allowed(TD_BF16, 0, 128, TD_BF16, 1.0f));
    assert_true(attention_mma_allowed(TD_F16, 0, 64, TD_F16, 1.0f));
    assert_true(attention_mma_allowed(TD_BF16, 0, 128, TD_E4M3, 0.0625f));
    assert_true(attention_mma_allowed(TD_F16, 0, 128, TD_E4M3, 1.0f));
    assert_true(attention_mma_allowed(TD_BF16, 0, 64, TD_E5M2, 4.0f));
    assert_false(attention_mma_allowed(TD_F32, 0, 128, TD_F32, 1.0f));      /* fp32 recipes never */
    assert_false(attention_mma_allowed(TD_BF16, 1, 128, TD_BF16, 1.0f));    /* residual_fp32 */
    assert_false(attention_mma_allowed(TD_BF16, 0, 256, TD_BF16, 1.0f));    /* HD */
    assert_false(attention_mma_allowed(TD_BF16, 0, 38, TD_BF16, 1.0f));
    assert_false(attention_mma_allowed(TD_BF16, 0, 128, TD_E4M3, 0.1f));    /* not a power of two */
    assert_false(attention_mma_allowed(TD_BF16, 0, 128, TD_F16, 1.0f));     /* fp16 codes in bf16 */
    assert_false(attention_mma_allowed(TD_F16, 0, 128, TD_E4M3, 1024.0f));  /* past fp16's range */
    assert_true(attention_mma_allowed(TD_F16, 0, 128, TD_E5M2, 0.5f));      /* 2^-17: an fp16 subnormal */
    assert_false(attention_mma_allowed(TD_F16, 0, 128, TD_E5M2, 1.0f / 1024)); /* under fp16's range */
    std::vector<sim_rcase> cases;
    td_recipe f32f = sim_preset("fp32");
    f32f.attention = TD_ATTN_FLASH;
    f32f.attn_block = 64;
    cases.push_back({"flash-fp32", f32f, 0});
    cases.push_back({"bf16-autocast", sim_preset("bf16-autocast"), 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    k.kv_scale = 0.1f;
    cases.push_back({"kv-e4m3-s0.1", k, 0});
    for (const sim_rcase &rc : cases) {
        problem p = make_problem(rc, 4, 2, 64, 0);
        same_bits("mma asked where not allowed vs tiled", rc, run_gpu(rc, p, 0, 3, "forward"),
                  run_gpu(rc, p, 0, 2, "forward"));
    }
    problem p = make_problem(mma_recipes()[0], 2, 1, 256, 0);
    same_bits("mma asked at HD 256 vs tiled", mma_recipes()[0], run_gpu(mma_recipes()[0], p, 0, 3, "forward"),
              run_gpu(mma_recipes()[0], p, 0, 2, "forward"));
}

/* attn_mma over a KV cache of codes (bf16, fp16: copied as they are; e4m3 with kv_scale 1 and
 * 1/16: decoded, then converted) = attn_mma over the CPU cache's floats, bit for bit; prefill
 * rows, and decode rows (attn_mma where the recipe decodes without split-KV) */
static void test_mma_kv_codes(void **state)
{
    (void)state;
    const td_backend *gpu = sim_open_gpu();
    std::vector<sim_rcase> cases;
    cases.push_back({"bf16-infer", sim_preset("bf16-infer"), 0});
    cases.push_back({"fp16-train", sim_preset("fp16-train"), 0});
    td_recipe k = sim_preset("vllm-bf16");
    k.kv_cache = TD_E4M3;
    cases.push_back({"kv-e4m3", k, 0});
    k.kv_scale = 0.0625f;
    cases.push_back({"kv-e4m3-s16", k, 0});
    const int NH = 4, NKV = 2, HD = 128, KVD = NKV * HD, SLOT = 320;
    for (const sim_rcase &rc : cases) {
        int fmt = td_kv_store_format(gpu, &rc.r);
        size_t es = td_kv_esize(fmt), elems = (size_t)2 * SLOT * KVD;
        std::vector<size_t> off;
        std::vector<int> pos;
        for (int i = 0; i < 300; i++) { off.push_back(0); pos.push_back(i); }
        for (int i = 0; i < 40; i++) { off.push_back((size_t)SLOT * KVD); pos.push_back(i); }
        int N = (int)pos.size();
        std::vector<float> kr = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), rc.r.activations);
        std::vector<float> vr = sim_rounded(sim_normal(&RNG, (size_t)N * KVD, 1.0), rc.r.activations);
        std::vector<float> q = sim_rounded(sim_normal(&RNG, (size_t)N * NH * HD, 2.0), rc.r.activations);
        td_ops ctx;
        td_ops_init(&ctx, &td_backend_cpu);
        ctx.recipe = &rc.r;
        ctx.cache = 1;
        std::vector<float> kc(elems, 0.0f), vc(elems, 0.0f);
        td_backend_cpu.kv_write(&ctx, kc.data(), kr.data(), off.data(), pos.data(), N, KVD);
        td_backend_cpu.kv_write(&ctx, vc.data(), vr.data(), off.data(), pos.data(), N, KVD);
        td_ops cctx = ctx;
        cctx.kv_fmt = fmt;
        std::vector<unsigned char> kb(elems * es, 0), vb(elems * es, 0);
        kv_write_cuda(&cctx, (float *)kb.data(), kr.data(), off.data(), pos.data(), N, KVD);
        kv_write_cuda(&cctx, (float *)vb.data(), vr.data(), off.data(), pos.data(), N, KVD);
        size_t no = (size_t)N * NH * HD;
        std::vector<float> a(no + (size_t)N * NH), b(no + (size_t)N * NH), t(no + (size_t)N * NH);
        tdc_attn_kernel = 3;
        attention_forward_cuda(&ctx, a.data(), a.data() + no, q.data(), kc.data(), vc.data(), off.data(), pos.data(),
                               N, NH, NKV, HD, NULL, SLOT);
        attention_forward_cuda(&cctx, b.data(), b.data() + no, q.data(), (const float *)kb.data(),
                               (const float *)vb.data(), off.data(), pos.data(), N, NH, NKV, HD, NULL, SLOT);
        tdc_attn_kernel = 2;
        attention_forward_cuda(&ctx, t.data(), t.data() + no, q.data(), kc.data(), vc.data(), off.data(), pos.data(),
                               N, NH, NKV, HD, NULL, SLOT);
        tdc_attn_kernel = 0;
        CUDA_CHECK(cudaDeviceSynchronize());
        same_bits("mma over codes vs over floats", rc, b, a);
        sim_diff d = sim_compare(a.data(), t.data(), no);
        printf("  %-12s KV cache of %s codes: attn_mma over codes = over floats (%d rows); vs tiled %ld of %zu "
               "differ, normalised %.3g\n", rc.name, td_format_info((td_format)fmt)->name, N, d.ndiff, no,
               d.max_abs / d.max_ref);
        assert_true(d.max_abs / d.max_ref <= 2 * sim_ulp(rc.r.activations, d.max_ref) / d.max_ref);
        /* decode rows (one a slot, blocks of one position) where the recipe decodes without
         * split-KV (fp16-train: attn_mma when asked; the others split, attn_rows + attn_merge) */
        const int rows[2] = {299, 339};
        std::vector<size_t> doff = {off[rows[0]], off[rows[1]]};
        std::vector<int> dpos = {pos[rows[0]], pos[rows[1]]};
        std::vector<float> dq((size_t)2 * NH * HD);
        for (int i = 0; i < 2; i++)
            memcpy(dq.data() + (size_t)i * NH * HD, q.data() + (size_t)rows[i] * NH * HD, (size_t)NH * HD * 4);
        size_t dn = (size_t)2 * NH * HD;
        std::vector<float> da(dn + 2 * NH), db(dn + 2 * NH), ds(dn + 2 * NH);
        ctx.decode = cctx.decode = 1;
        tdc_attn_kernel = 3;
        attention_forward_cuda(&ctx, da.data(), da.data() + dn, dq.data(), kc.data(), vc.data(), doff.data(),
                               dpos.data(), 2, NH, NKV, HD, NULL, SLOT);
        attention_forward_cuda(&cctx, db.data(), db.data() + dn, dq.data(), (const float *)kb.data(),
                               (const float *)vb.data(), doff.data(), dpos.data(), 2, NH, NKV, HD, NULL, SLOT);
        tdc_attn_kernel = 1;
        attention_forward_cuda(&ctx, ds.data(), ds.data() + dn, dq.data(), kc.data(), vc.data(), doff.data(),
                               dpos.data(), 2, NH, NKV, HD, NULL, SLOT);
        tdc_attn_kernel = 0;
        CUDA_CHECK(cudaDeviceSynchronize());
        same_bits("decode rows: mma asked, over codes vs over floats", rc, db, da);
        sim_diff dd = sim_compare(da.data(), ds.data(), dn);
        printf("  %-12s decode rows (%s): vs the simple kernel %ld of %zu differ, normalised %.3g\n", rc.name,
               rc.r.decode_splits > 1 ? "split-KV: the simple kernel" : "attn_mma", dd.ndiff, dn,
               dd.max_abs / dd.max_ref);
        assert_true(dd.max_abs / dd.max_ref <= 2 * sim_ulp(rc.r.activations, dd.max_ref) / dd.max_ref);
        if (rc.r.decode_splits > 1) assert_int_equal(dd.ndiff, 0);
    }
}

/* ---- the GPU bench --------------------------------------------------------------------------- */

#ifndef TD_CUDASIM
static int bench(void)
{
    const int SEQ = 8, T = 8192, NH = 32, NKV = 8, HD = 128, N = SEQ * T, KVD = NKV * HD;
    size_t nq = (size_t)N * NH * HD, nkv = (size_t)N * KVD;
    printf("attention bench: %d sequences x %d tokens, %d heads over %d kv heads of %d (Llama-3-8B)\n",
           SEQ, T, NH, NKV, HD);
    std::vector<float> h(nq > nkv ? nq : nkv);
    std::vector<size_t> off(N);
    std::vector<int> pos(N);
    for (int i = 0; i < N; i++) { off[i] = (size_t)(i / T) * T * KVD; pos[i] = i % T; }
    float *q, *k, *v, *out, *lse;
    CUDA_CHECK(cudaMalloc((void **)&q, nq * 4));
    CUDA_CHECK(cudaMalloc((void **)&k, nkv * 4));
    CUDA_CHECK(cudaMalloc((void **)&v, nkv * 4));
    CUDA_CHECK(cudaMalloc((void **)&out, nq * 4));
    CUDA_CHECK(cudaMalloc((void **)&lse, (size_t)N * NH * 4));
    double flops = 0;   /* q.k and p.v: 4 HD flops per (row, head, key) */
    for (int i = 0; i < N; i++) flops += 4.0 * HD * NH * (pos[i] + 1);
    int rc = 0;
    const char *names[] = {"bf16-train", "vllm-bf16"};
    for (float *dst : {q, k, v}) {   /* bf16 values: both recipes' activations */
        size_t n = dst == q ? nq : nkv;
        for (size_t j = 0; j < n; j++) h[j] = td_round(TD_BF16, (float)td_rng_normal(&RNG));
        CUDA_CHECK(cudaMemcpy(dst, h.data(), n * 4, cudaMemcpyHostToDevice));
    }
    for (const char *name : names) {
        td_recipe r = sim_preset(name);
        td_ops ctx;
        td_ops_init(&ctx, &td_backend_cpu);
        ctx.recipe = &r;
        ctx.cache = 1;
        std::vector<float> res[3];
        double ms[3];
        for (int kern = 3; kern >= 1; kern--) {   /* mma, tiled, simple */
            tdc_attn_kernel = kern;
            if (kern >= 2)   /* warm-up: the launch's attribute, the staging of pos / kv_off */
                attention_forward_cuda(&ctx, out, lse, q, k, v, off.data(), pos.data(), N, NH, NKV, HD, NULL, T);
            cudaEvent_t e0, e1;
            CUDA_CHECK(cudaEventCreate(&e0));
            CUDA_CHECK(cudaEventCreate(&e1));
            CUDA_CHECK(cudaEventRecord(e0, tdc_stream()));
            attention_forward_cuda(&ctx, out, lse, q, k, v, off.data(), pos.data(), N, NH, NKV, HD, NULL, T);
            CUDA_CHECK(cudaEventRecord(e1, tdc_stream()));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float t;
            CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
            ms[kern - 1] = t;
            res[kern - 1].resize(nq);
            CUDA_CHECK(cudaMemcpy(res[kern - 1].data(), out, nq * 4, cudaMemcpyDeviceToHost));
            printf("  %-10s %-6s kernel: %9.1f ms (%.2f TFLOP/s)\n", name,
                   kern == 3 ? "mma" : kern == 2 ? "tiled" : "simple", t, flops / (t * 1e-3) / 1e12);
        }
        tdc_attn_kernel = 0;
        long nd = 0;
        for (size_t j = 0; j < nq; j++) nd += memcmp(&res[0][j], &res[1][j], 4) != 0;
        /* the tensor-core kernel against the bit-exact tiled one: test_mma_prefill's limits */
        sim_diff dm = sim_compare(res[2].data(), res[1].data(), nq);
        double mfrac = (double)dm.ndiff / nq, mnerr = dm.max_abs / dm.max_ref;
        int mbad = mfrac > MMA_FLIM || mnerr > 2 * sim_ulp(TD_BF16, dm.max_ref) / dm.max_ref;
        printf("bench: gpu-attn-%s tiled=%.1fms simple=%.1fms speedup=%.2f differ=%ld mma=%.1fms "
               "mma_speedup=%.2f mma_differ=%.5f mma_nerr=%.3g\n", name, ms[1], ms[0], ms[0] / ms[1], nd, ms[2],
               ms[1] / ms[2], mfrac, mnerr);
        if (mbad)
            printf("  %s: attn_mma beyond its tolerance against the tiled kernel (share %.4f, limit %.2f; "
                   "normalised %.3g, limit 2 units of bf16)\n", name, mfrac, MMA_FLIM, mnerr);
        if (nd || mbad) rc = 1;
    }
    cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse);
    return rc;
}
#endif

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261126);
    return 0;
}

int main(int argc, char **argv)
{
    if (!sim_open_gpu()) return 1;
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
#ifdef TD_CUDASIM
        fprintf(stderr, "test_attention_sim: --bench needs a real GPU (build/gpu/test_attention_sim)\n");
        return 77;
#else
        td_rng_seed(&RNG, 20261126);
        return bench();
#endif
    }
    if (argc > 1) { fprintf(stderr, "usage: test_attention_sim [--bench]\n"); return 2; }
    if (getenv("TIDAL_TEST_ONLY")) cmocka_set_test_filter(getenv("TIDAL_TEST_ONLY"));   /* e.g. test_mma* */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_decode_split),
        cmocka_unit_test(test_kv_codes),
        cmocka_unit_test(test_mma_prefill),
        cmocka_unit_test(test_mma_refused),
        cmocka_unit_test(test_mma_kv_codes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
