/* tidal — the engines' roundings (issue 15), each recipe field value checked element by element
 * against a direct scalar transcription of the kernel it names (recipe.h cites the sources):
 *
 *   norm "unfused"  vLLM rms_norm_kernel:      out = (scalar_t)((scalar_t)(x * s_variance) * weight)
 *   norm "fused"    FlashInfer RMSNormKernel:  out = (T)(float(x) * rms_rcp * float(w))
 *   norm "fused-add" FlashInfer FusedAddRMSNormKernel: x = float(in) + float(res); res = (T)x;
 *                   out = (T)(x * rms_rcp * w), rms_rcp from the fp32 x (checked on a model's
 *                   final norm, where the decoder hands the kernel the last residual add)
 *   residual "fp32" torch autocast over an fp32 RMSNorm: (x * rs) * w in fp32, no rounding
 *   rope "unfused"  HF apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, every op in dtype
 *   rope "vllm"     vLLM apply_token_rotary_embedding: x_f * cos_f - y_f * sin_f over a dtype cache
 *   rope "fused"    FlashInfer: the same over an fp32 cache
 *   logits_temperature / logsoftmax   TRL selective_log_softmax(logits / T) on bf16 logits vs
 *                   vLLM's fp32 logits.div_(T)
 *   kv_scale 0      vLLM's default k_scale = 1.0
 *   td_gemm_fixed   the fixed order of gemm.h, transcribed here with fmaf, against every kernel
 *                   (portable, AVX2, AVX-512) on random shapes, strides and tails; independent
 *                   of M, N and the column offset
 *   thread count    whole forwards under fp32, bf16-train and fp8-rollout give the same bits
 *                   with 1, 2 and 3 threads
 * bf16 rounding is transcribed here too (round to nearest even on the bit pattern, as
 * __float2bfloat16_rn does for finite values).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/gemm.h"
#include "tidal/rng.h"
#include "../src/model/model_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static float bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void fill(float *x, size_t n, uint64_t seed, float scale, int round_bf16)
{
    td_rng r;
    td_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        x[i] = scale * (float)td_rng_normal(&r);
        if (round_bf16) x[i] = bf16(x[i]);
    }
}

static td_ops ctx_for(const td_recipe *r)
{
    td_ops ctx;
    td_ops_init(&ctx, &td_backend_cpu);
    ctx.nthreads = 1;
    ctx.recipe = r;
    ctx.head = r;
    return ctx;
}

static td_recipe preset(const char *name)
{
    const td_recipe *p = td_recipe_find_preset(name);
    assert_non_null(p);
    return *p;
}

/* ---------------------------------------------------------------- RMSNorm */

enum { NR = 5, C = 96 };

static void test_norm_forms(void **st)
{
    (void)st;
    float x[NR * C], w[C], y[NR * C], rstd[NR];
    fill(x, NR * C, 1, 2.0f, 1);
    fill(w, C, 2, 0.5f, 1);
    for (int c = 0; c < C; c++) w[c] += 1.0f, w[c] = bf16(w[c]);
    const char *names[] = {"vllm-bf16", "bf16-infer", "bf16-autocast", "vllm-fp16", "fp16-infer"};
    for (int p = 0; p < 5; p++) {
        td_recipe r = preset(names[p]);
        td_ops ctx = ctx_for(&r);
        rmsnorm_forward(&ctx, y, rstd, x, w, NR, C, 1e-6f);
        for (int i = 0; i < NR; i++) {
            double ss = 0;
            for (int c = 0; c < C; c++) ss += (double)x[i * C + c] * x[i * C + c];
            assert_true(fabs(rstd[i] * sqrt(ss / C + 1e-6) - 1.0) < 2e-7);
            float s = rstd[i];   /* the kernel's s_variance / rms_rcp */
            for (int c = 0; c < C; c++) {
                float xv = x[i * C + c], want;
                if (r.residual_fp32) want = (xv * s) * w[c];
                else if (r.activations == TD_BF16)
                    want = r.norm == TD_NORM_UNFUSED ? bf16(bf16(xv * s) * w[c]) : bf16(xv * s * w[c]);
                else
                    want = r.norm == TD_NORM_UNFUSED ? td_round(TD_F16, td_round(TD_F16, xv * s) * w[c])
                                                     : td_round(TD_F16, xv * s * w[c]);
                if (y[i * C + c] != want) {
                    print_error("%s row %d col %d: %.9g, kernel transcription %.9g\n", names[p], i, c,
                                y[i * C + c], want);
                    fail();
                }
            }
        }
    }
}

/* The two forms differ somewhere (else the test above could not tell them apart). */
static void test_norm_forms_differ(void **st)
{
    (void)st;
    float x[NR * C], w[C], a[NR * C], b[NR * C];
    fill(x, NR * C, 3, 2.0f, 1);
    fill(w, C, 4, 1.0f, 1);
    td_recipe ru = preset("vllm-bf16"), rf = preset("bf16-infer");
    td_ops cu = ctx_for(&ru), cf = ctx_for(&rf);
    rmsnorm_forward(&cu, a, NULL, x, w, NR, C, 1e-6f);
    rmsnorm_forward(&cf, b, NULL, x, w, NR, C, 1e-6f);
    int diff = 0;
    for (int i = 0; i < NR * C; i++) diff += a[i] != b[i];
    assert_true(diff > 10);
}

/* fused-add on a one-layer model's final norm: the stream keeps bf16(x_mid + down), the norm
 * reads the fp32 sum. vllm-bf16 (unfused) normalises the rounded stream instead. */
static void test_fused_add_norm(void **st)
{
    (void)st;
    td_config c = {0};
    c.arch = TD_ARCH_QWEN2;
    c.vocab_size = 61; c.hidden_size = 64; c.intermediate_size = 96; c.num_layers = 1;
    c.num_heads = 4; c.num_kv_heads = 2; c.head_dim = 16; c.max_position = 64;
    c.rms_norm_eps = 1e-6; c.rope_theta = 10000.0;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    fill(m->owned, m->owned_floats, 9, 0.4f, 0);
    td_forward *f = td_forward_create(m, 32, 32, 0, &err);
    assert_non_null(f);
    int toks[12];
    for (int t = 0; t < 12; t++) toks[t] = (5 * t + 2) % 61;
    const int *tokens[1] = {toks};
    int len = 12;
    const char *names[] = {"sglang-bf16", "vllm-bf16"};
    for (int p = 0; p < 2; p++) {
        assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(names[p]), &err), 0);
        forward_keep_activations(f, 1);
        assert_int_equal(td_forward_logprobs(f, 1, tokens, &len, NULL, NULL, NULL, &err), 0);
        const td_acts *a = forward_acts(f);
        td_layer_acts la = acts_layer(a, &m->cfg, 0);
        int mism = 0;
        for (int i = 0; i < len; i++) {
            float sum[64];
            double ss = 0;
            for (int k = 0; k < 64; k++) {
                sum[k] = la.x_mid[i * 64 + k] + a->proj[i * 64 + k];   /* fp32, as smem_x */
                assert_true(la.x_out[i * 64 + k] == bf16(sum[k]));     /* residual = (T)x */
                float in = p == 0 ? sum[k] : la.x_out[i * 64 + k];
                ss += (double)in * in;
            }
            assert_true(fabs(a->rstd_f[i] * sqrt(ss / 64 + 1e-6) - 1.0) < 2e-7);
            float rs = a->rstd_f[i];
            for (int k = 0; k < 64; k++) {
                float w = bf16(m->w.final_norm[k]);
                float want = p == 0 ? bf16(sum[k] * rs * w) : bf16(bf16(la.x_out[i * 64 + k] * rs) * w);
                mism += a->xn[i * 64 + k] != want;
            }
        }
        if (mism) { print_error("%s: %d final-norm values differ from the kernel's\n", names[p], mism); fail(); }
    }
    td_forward_free(f);
    td_model_free(m);
}

/* ---------------------------------------------------------------- RoPE */

static void test_rope_forms(void **st)
{
    (void)st;
    enum { N = 3, H = 2, HD = 16, HALF = 8 };
    float x0[N * H * HD], x[N * H * HD], inv[HALF];
    int pos[N] = {0, 7, 45};
    fill(x0, N * H * HD, 5, 1.5f, 1);
    for (int k = 0; k < HALF; k++) inv[k] = (float)pow(10000.0, -2.0 * k / HD);
    const char *names[] = {"bf16-train", "vllm-bf16", "sglang-bf16"};
    for (int p = 0; p < 3; p++) {
        td_recipe r = preset(names[p]);
        td_ops ctx = ctx_for(&r);
        memcpy(x, x0, sizeof x);
        rope_forward(&ctx, x, pos, inv, N, H, HD);
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int k = 0; k < HALF; k++) {
                    float ang = (float)pos[i] * inv[k];
                    float cf = (float)cos((double)ang), sf = (float)sin((double)ang);
                    const float *xh = x0 + (i * H + h) * HD;
                    float a = xh[k], b = xh[k + HALF], want0, want1;
                    if (r.rope == TD_ROPE_UNFUSED) {          /* HF: cos.to(dtype), bf16 ops */
                        float c = bf16(cf), s = bf16(sf);
                        want0 = bf16(bf16(a * c) + bf16(-b * s));
                        want1 = bf16(bf16(b * c) + bf16(a * s));
                    } else if (r.rope == TD_ROPE_VLLM) {      /* dtype cache, fp32 rotation */
                        float c = bf16(cf), s = bf16(sf);
                        want0 = bf16(a * c - b * s);
                        want1 = bf16(b * c + a * s);
                    } else {                                  /* fp32 cache, fp32 rotation */
                        want0 = bf16(a * cf - b * sf);
                        want1 = bf16(b * cf + a * sf);
                    }
                    const float *got = x + (i * H + h) * HD;
                    if (got[k] != want0 || got[k + HALF] != want1) {
                        print_error("%s row %d head %d k %d: (%.9g, %.9g) vs kernel (%.9g, %.9g)\n",
                                    names[p], i, h, k, got[k], got[k + HALF], want0, want1);
                        fail();
                    }
                }
    }
}

/* ---------------------------------------------------------------- log-softmax */

static void test_logsoftmax_forms(void **st)
{
    (void)st;
    enum { N = 2, V = 3000 };
    static float l[N * V], got[N * V], want[N * V];
    fill(l, N * V, 7, 3.0f, 1);   /* bf16 logits, as a bf16 lm_head writes them */
    const float T = 0.7f;
    td_ops ref;
    td_ops_init(&ref, &td_backend_cpu);
    ref.nthreads = 1;
    for (int mode = 0; mode < 4; mode++) {
        td_recipe r = preset("bf16-train");
        r.temp_in_act = mode & 1;      /* TRL / verl: logits / T in bf16 */
        r.logsoftmax_act = mode >> 1;  /* TRL: F.log_softmax on bf16 logits -> bf16 */
        td_ops ctx = ctx_for(&r);
        ctx.temperature = T;
        memcpy(got, l, sizeof got);
        logsoftmax_forward(&ctx, got, N, V);
        for (int i = 0; i < N * V; i++) want[i] = r.temp_in_act ? bf16(l[i] / T) : l[i] / T;
        logsoftmax_forward(&ref, want, N, V);   /* the fp32 log-softmax, no recipe */
        for (int i = 0; i < N * V; i++) {
            float w = r.logsoftmax_act ? bf16(want[i]) : want[i];
            if (got[i] != w) {
                print_error("mode %d element %d: %.9g vs %.9g\n", mode, i, got[i], w);
                fail();
            }
        }
    }
    /* T = 1 and fp32 log-softmax: the reference itself */
    td_recipe r = preset("bf16-train");
    td_ops ctx = ctx_for(&r);
    memcpy(got, l, sizeof got);
    memcpy(want, l, sizeof want);
    logsoftmax_forward(&ctx, got, N, V);
    logsoftmax_forward(&ref, want, N, V);
    assert_memory_equal(got, want, sizeof got);
}

/* ---------------------------------------------------------------- KV cache scale */

static void test_kv_scale_zero_is_one(void **st)
{
    (void)st;
    enum { KVD = 32 };
    float rows[KVD], store[KVD];
    fill(rows, KVD, 11, 40.0f, 1);
    td_recipe r = preset("bf16-infer");
    r.kv_cache = TD_E4M3;
    r.kv_scale = 0.0f;
    td_ops ctx = ctx_for(&r);
    ctx.cache = 1;
    size_t off = 0;
    int pos = 0;
    kv_write(&ctx, store, rows, &off, &pos, 1, KVD);
    int clipped = 0;
    for (int c = 0; c < KVD; c++) {
        assert_true(store[c] == td_round(TD_E4M3, rows[c]));   /* x / 1.0, e4m3, * 1.0 */
        clipped += fabsf(rows[c]) > 448.0f;
    }
    (void)clipped;
}

/* ---------------------------------------------------------------- the batch-invariant GEMM */

static float dot_transcribed(const float *a, const float *w, int K)
{
    float s[8] = {0};
    for (int k0 = 0; k0 < K; k0 += 8)
        for (int l = 0; l < 8; l++)
            s[l] = k0 + l < K ? fmaf(a[k0 + l], w[k0 + l], s[l]) : fmaf(0.0f, 0.0f, s[l]);
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static void test_gemm_fixed_order(void **st)
{
    (void)st;
    enum { M = 13, N = 37 };
    const int Ks[] = {1, 7, 8, 203, 896};
    for (int ki = 0; ki < 5; ki++) {
        int K = Ks[ki];
        float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
        float c1[M * N], c2[M * N], c3[M * N];
        fill(a, (size_t)M * K, 20 + ki, 1.0f, 1);
        fill(w, (size_t)N * K, 30 + ki, 0.1f, 1);
        td_gemm_fixed(a, K, w, K, c1, N, M, N, K, 0);
        td_gemm_fixed_max_kernel = TD_GEMM_FIXED_PORTABLE;
        td_gemm_fixed(a, K, w, K, c2, N, M, N, K, 0);
        td_gemm_fixed_max_kernel = TD_GEMM_FIXED_AVX512;
        assert_memory_equal(c1, c2, sizeof c1);   /* the CPU's widest kernel == portable fmaf */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                assert_true(c1[i * N + j] == dot_transcribed(a + (size_t)i * K, w + (size_t)j * K, K));
        /* each row alone, each column alone, odd column windows: the same bits */
        for (int i = 0; i < M; i++) td_gemm_fixed(a + (size_t)i * K, K, w, K, c3 + i * N, N, 1, N, K, 0);
        assert_memory_equal(c1, c3, sizeof c1);
        for (int j0 = 0; j0 < N; j0 += 5) {
            int nj = j0 + 5 <= N ? 5 : N - j0;
            td_gemm_fixed(a + 2 * (size_t)K, K, w + (size_t)j0 * K, K, c3 + 2 * N + j0, N, 3, nj, K, 0);
        }
        for (int i = 2; i < 5; i++) assert_memory_equal(c1 + i * N, c3 + i * N, sizeof(float) * N);
        /* add mode: c += a.w^T */
        for (int i = 0; i < M * N; i++) c2[i] = 1.0f;
        td_gemm_fixed(a, K, w, K, c2, N, M, N, K, 1);
        for (int i = 0; i < M * N; i++) assert_true(c2[i] == 1.0f + c1[i]);
        free(a); free(w);
    }
}

/* Every kernel td_gemm_fixed has (capped by td_gemm_fixed_max_kernel; a cap above the CPU
 * falls back to what it has), on random shapes against the transcribed order, bit for bit:
 * K % 8 != 0, K over one span of the packed driver (1,024 values) and over several, M below
 * the packing threshold (a third of the trials: w read in place) and above (20 rows over three
 * spans: in place on AVX2, packed on AVX-512), N odd and over
 * several packed column blocks, strides lda/ldw/ldc wider than the rows, add = 1; one product
 * of 391 rows over two spans (the driver parks lane sums for 384 rows at a time). The padding
 * of a and w holds NaN, so reading past a row's K (a tail not masked, a pack not zero-filled)
 * shows; c's padding must stay as it was (masked stores). */
static void test_gemm_fixed_kernels(void **st)
{
    (void)st;
#if defined(__x86_64__) || defined(__i386__)
    fprintf(stderr, "td_gemm_fixed kernels on this CPU: portable%s%s\n",
            __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? ", AVX2" : "",
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? ", AVX-512" : "");
#endif
    static const int fixed_K[] = {1, 8, 9, 1023, 1024, 1031, 2053};
    td_rng rng;
    td_rng_seed(&rng, 77);
    for (int trial = 0; trial < 25; trial++) {
        int K = trial < 7 ? fixed_K[trial] : 1 + (int)td_rng_below(&rng, 2200);
        int M = 1 + (int)td_rng_below(&rng, trial % 3 ? 15 : 7), N = 1 + (int)td_rng_below(&rng, 70);
        if (trial == 23) {   /* rows a packed driver takes, over three spans: w in place without AVX-512 */
            M = 20;
            K = 2053;
        }
        if (trial == 24) {   /* over the driver's row groups (384 rows), two spans, two column blocks */
            M = 391;
            N = 75;
            K = 1100;
        }
        int lda = K + (int)td_rng_below(&rng, 9), ldw = K + (int)td_rng_below(&rng, 9);
        int ldc = N + (int)td_rng_below(&rng, 5), add = trial % 2;
        float *a = malloc(sizeof(float) * M * lda), *w = malloc(sizeof(float) * N * ldw);
        float *c0 = malloc(sizeof(float) * M * ldc), *c = malloc(sizeof(float) * M * ldc);
        fill(a, (size_t)M * lda, 100 + trial, 1.0f, 0);
        fill(w, (size_t)N * ldw, 200 + trial, 0.1f, 0);
        fill(c0, (size_t)M * ldc, 300 + trial, 1.0f, 0);
        for (int i = 0; i < M; i++)
            for (int k = K; k < lda; k++) a[(size_t)i * lda + k] = NAN;
        for (int j = 0; j < N; j++)
            for (int k = K; k < ldw; k++) w[(size_t)j * ldw + k] = NAN;
        for (int cap = TD_GEMM_FIXED_PORTABLE; cap <= TD_GEMM_FIXED_AVX512; cap++) {
            memcpy(c, c0, sizeof(float) * M * ldc);
            td_gemm_fixed_max_kernel = (td_gemm_fixed_kernel)cap;
            td_gemm_fixed(a, lda, w, ldw, c, ldc, M, N, K, add);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ldc; j++) {
                    size_t o = (size_t)i * ldc + j;
                    float want = j >= N ? c0[o]
                                 : (add ? c0[o] : 0.0f) + dot_transcribed(a + (size_t)i * lda, w + (size_t)j * ldw, K);
                    if (memcmp(&c[o], &want, sizeof want))
                        fail_msg("kernel cap %d, M=%d N=%d K=%d lda=%d ldw=%d ldc=%d add=%d: c[%d][%d] = %a, "
                                 "the order gives %a", cap, M, N, K, lda, ldw, ldc, add, i, j, c[o], want);
                }
        }
        td_gemm_fixed_max_kernel = TD_GEMM_FIXED_AVX512;
        free(a); free(w); free(c0); free(c);
    }
}

/* ---------------------------------------------------------------- thread counts */

static void logprobs_with_threads(const td_model *m, const char *recipe, int threads, float *out)
{
    omp_set_num_threads(threads);
    td_error err;
    td_forward *f = td_forward_create(m, 64, 40, 0, &err);
    assert_non_null(f);
    static const int lens[3] = {40, 9, 13};
    int toks[3][40];
    const int *tokens[3];
    float *lp[3];
    for (int s = 0; s < 3; s++) {
        for (int t = 0; t < 40; t++) toks[s][t] = (11 * s + 7 * t + 1) % 300;
        tokens[s] = toks[s];
        lp[s] = out + s * 40;
    }
    assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(recipe), &err), 0);
    assert_int_equal(td_forward_logprobs(f, 3, tokens, lens, lp, NULL, NULL, &err), 0);
    td_forward_free(f);
}

static void test_thread_count_independent(void **st)
{
    (void)st;
    td_config c = {0};
    c.arch = TD_ARCH_QWEN2;   /* columns of several 128-tiles: C 384, F 1024, V 3000 */
    c.vocab_size = 3000; c.hidden_size = 384; c.intermediate_size = 1024; c.num_layers = 2;
    c.num_heads = 6; c.num_kv_heads = 2; c.head_dim = 64; c.max_position = 64;
    c.rms_norm_eps = 1e-6; c.rope_theta = 10000.0; c.qkv_bias = true;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    fill(m->owned, m->owned_floats, 13, 0.05f, 0);
    const char *recipes[] = {"fp32", "bf16-train", "fp8-rollout"};
    int saved = omp_get_max_threads();
    for (int r = 0; r < 3; r++) {
        static float one[120], more[120];
        logprobs_with_threads(m, recipes[r], 1, one);
        for (int t = 2; t <= 3; t++) {
            logprobs_with_threads(m, recipes[r], t, more);
            if (memcmp(one, more, sizeof one)) {
                print_error("%s: log-probs with %d threads differ from 1 thread\n", recipes[r], t);
                fail();
            }
        }
    }
    omp_set_num_threads(saved);
    td_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm_forms),
        cmocka_unit_test(test_norm_forms_differ),
        cmocka_unit_test(test_fused_add_norm),
        cmocka_unit_test(test_rope_forms),
        cmocka_unit_test(test_logsoftmax_forms),
        cmocka_unit_test(test_kv_scale_zero_is_one),
        cmocka_unit_test(test_gemm_fixed_order),
        cmocka_unit_test(test_gemm_fixed_kernels),
        cmocka_unit_test(test_thread_count_independent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
