/* tidal tests — the CUDA GEMMs (src/backend/cuda/matmul.cu) run in the CPU simulator, with
 * cuBLASLt replaced by its model (cublaslt_sim.cpp), against the CPU backend's matmul under the
 * same recipe (td_backend_cpu: cpu.c / gemm.c), the reference the CUDA backend must reproduce.
 *
 *   FP8 activation quantisation (fp8_quantize_cuda) against td_fp8_quantize: codes and scales
 *   bit for bit, every granularity and arithmetic the presets and recipe files can name.
 *   matmul_forward_cuda against the CPU: the fp32 reference, bf16/fp16 recipes (16-bit operands,
 *   and fp32 operands when the weights are stored otherwise), split_k 2 (cuBLASLt's split-K and
 *   the K-slice fallback), the fp8 presets (128x128 weights + 1x128 activations; per-tensor;
 *   per-token; fast accumulation; the emulated fallback), lm_heads (td_recipe_for_head), biases,
 *   N = 1, K not a multiple of 128, and the n > 1 form. The model's call counters show which
 *   cuBLASLt mode ran, so a silent fallback fails the test.
 * Tolerance, per element, from the operands (a = the quantised activations, w = the weight values
 * the GEMM multiplies, S = sum_k |a_k w_k| + |bias|, u = 2^-24, K products):
 *   (2K + 16) u S          two fp32 sums of the same exact products in different orders (OpenBLAS
 *                          vs the model's sequential sum) each err by at most K u S; FP8 applies
 *                          the scales after the sum instead of to each operand: a few u S more
 *   + 2 ceil(K/32) 2^-b S  fp8-fast: the CPU truncates each 32-product step's partial sum to b
 *                          fraction bits (gemm.h), the model sums exactly (or truncates in
 *                          another order, in the emulated fallback)
 *   + 1 ulp of the result's activations dtype: two values that close may round apart once.
 * The measured maximum of |gpu - cpu| / S is printed per case. */
#include "../../src/backend/cuda/matmul.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TD_CUDASIM
#include "cublasLt_sim.h"   /* the model's knobs and counters */
#define ON_GPU 0
#else
#include <cublasLt.h>
#define ON_GPU 1
#endif

extern "C" {
#include "tidal/gemm.h"
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float urand(void)   /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* rows of different magnitudes and an outlier per 128-column group: scales that differ by block */
static void fill(float *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++) {
            float v = urand() * ldexpf(1.0f, i % 5 - 2);
            if (c % 128 == 7) v *= 9.0f;
            x[(size_t)i * cols + c] = v;
        }
}

static int setup(void **state)
{
    (void)state;
    td_error err;
    return td_cuda_backend_open(0, NULL, 0, &err) ? 0 : -1;
}

/* ---- quantisation ------------------------------------------------------------------------ */

static void quant_case(td_fp8_scheme s, int rows, int cols)
{
    size_t n = (size_t)rows * cols, ns = td_fp8_num_scales(&s, rows, cols);
    float *x = (float *)malloc(n * sizeof(float)), *sc = (float *)malloc(ns * sizeof(float));
    float *gsc = (float *)malloc(ns * sizeof(float));
    uint8_t *codes = (uint8_t *)malloc(n), *gcodes = (uint8_t *)malloc(n);
    fill(x, rows, cols);
    if (rows > 2) {
        memset(x + (size_t)cols, 0, cols * sizeof(float));           /* a zero row: amax 0 */
        x[(size_t)(rows - 1) * cols] = NAN;                            /* ignored by the amax */
        x[(size_t)(rows - 1) * cols + 1] = 3e38f;                      /* MUL: k near FLT_MIN */
        x[(size_t)(rows - 1) * cols + 2] = 1e-41f;                     /* a subnormal */
    }
    td_fp8_quantize(&s, x, rows, cols, codes, sc);
    float *dx, *dsc;
    uint8_t *dcodes;
    assert_int_equal(cudaMalloc((void **)&dx, n * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dsc, ns * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dcodes, n), cudaSuccess);
    assert_int_equal(cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    fp8_quantize_cuda(&s, dx, rows, cols, dcodes, dsc);
    assert_int_equal(cudaStreamSynchronize(tdc_stream()), cudaSuccess);
    assert_int_equal(cudaMemcpy(gcodes, dcodes, n, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(gsc, dsc, ns * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t bad_codes = 0, bad_scales = 0;
    for (size_t i = 0; i < n; i++) bad_codes += codes[i] != gcodes[i];
    for (size_t i = 0; i < ns; i++) bad_scales += memcmp(&sc[i], &gsc[i], 4) != 0;
    if (bad_codes || bad_scales)
        print_error("fp8 %s/%s%s fmt %d (%d x %d): %zu codes and %zu scales differ\n",
                    td_scale_granularity_name(s.gran), s.arith == TD_ARITH_MUL ? "mul" : "div",
                    s.pow2 ? "/pow2" : "", (int)s.fmt, rows, cols, bad_codes, bad_scales);
    assert_int_equal(bad_codes, 0);
    assert_int_equal(bad_scales, 0);
    cudaFree(dx);
    cudaFree(dsc);
    cudaFree(dcodes);
    free(x); free(sc); free(gsc); free(codes); free(gcodes);
}

static void test_fp8_quantize_bitexact(void **state)
{
    (void)state;
    const td_scale_granularity grans[] = {TD_SCALE_TENSOR, TD_SCALE_ROW, TD_SCALE_GROUP, TD_SCALE_BLOCK, TD_SCALE_MX};
    const int shapes[][2] = {{5, 300}, {130, 256}, {1, 4096}, {3, 40}};
    for (int fmt = TD_E4M3; fmt <= TD_E5M2; fmt++)
        for (int g = 0; g < 5; g++)
            for (int arith = 0; arith < 2; arith++)
                for (int pow2 = 0; pow2 < 2; pow2++)
                    for (int sh = 0; sh < 4; sh++) {
                        if (grans[g] == TD_SCALE_MX && (arith || pow2)) continue;   /* MX ignores both */
                        td_fp8_scheme s = {(td_format)fmt, grans[g], (td_scale_arith)arith, pow2 != 0, TD_SATFINITE, 0};
                        quant_case(s, shapes[sh][0], shapes[sh][1]);
                    }
    td_fp8_scheme g64 = {TD_E4M3, TD_SCALE_GROUP, TD_ARITH_DIV, false, TD_NOSAT, 64};   /* other G, no saturation */
    quant_case(g64, 9, 200);
    td_fp8_scheme b256 = {TD_E4M3, TD_SCALE_BLOCK, TD_ARITH_MUL, false, TD_SATFINITE, 256};
    quant_case(b256, 300, 520);
}

/* ---- GEMMs --------------------------------------------------------------------------------- */

typedef struct {
    const char *recipe;    /* preset, NULL = the fp32 reference (no recipe)                     */
    int head;              /* run td_recipe_for_head(recipe) (an lm_head)                       */
    int N, IN, n, OUT[3];
    int bias;              /* bias on product 0                                                 */
    int store;             /* -1: the recipe's weight storage; else this td_format (no fp8)     */
    int refuse_splitk;
    int refuse;            /* model knobs: 1 no FP8 scale modes, 2 no fp32 D for FP8             */
    int mode;              /* the FP8 A scale mode cuBLASLt must run (-1: no FP8 cuBLASLt call)  */
    int splitk;            /* cuBLASLt split-K must run                                         */
    int exact;             /* bit for bit (batch-invariant recipes: td_gemm_fixed's order)      */
} mcase;

typedef struct {
    td_wmat w;
    void *data;
    float *scale;
} pw;

/* W (rows, cols) as recipe r keeps it (weights_recipe.c's prep_wmat): fp32, 16-bit codes, fp8 */
static pw prepare(const td_recipe *r, const float *W, int rows, int cols, int store)
{
    pw p = {};
    size_t n = (size_t)rows * cols;
    td_format f = r ? r->weights : TD_F32;
    if (store >= 0 && f == TD_F32) f = (td_format)store;             /* fp32 recipe, bf16 checkpoint */
    if (f == TD_E4M3 || f == TD_E5M2) {
        td_fp8_scheme s = r->weight_scaling;
        s.fmt = f;
        size_t br, bc;
        td_fp8_block_shape(&s, rows, cols, &br, &bc);
        p.data = malloc(n);
        p.scale = (float *)malloc(td_fp8_num_scales(&s, rows, cols) * sizeof(float));
        td_fp8_quantize(&s, W, rows, cols, (uint8_t *)p.data, p.scale);
        p.w = td_wmat{p.data, f, p.scale, (int)br, (int)bc, (int)((cols + bc - 1) / bc)};
    } else if (f == TD_BF16 || f == TD_F16) {
        if (store == TD_F32) {                                        /* rounded values kept as fp32 */
            p.data = malloc(n * sizeof(float));
            td_gemm_prepare_weight(r, W, rows, cols, (float *)p.data);
            p.w = td_wmat_f32((const float *)p.data);
        } else {
            p.data = malloc(n * 2);
            td_encode_row(f, W, p.data, n, TD_SATFINITE);
            p.w = td_wmat{p.data, f, NULL, 0, 0, 0};
        }
    } else {
        p.data = malloc(n * sizeof(float));
        memcpy(p.data, W, n * sizeof(float));
        p.w = td_wmat_f32((const float *)p.data);
    }
    return p;
}

static double ulp_of(int fmt, double x)
{
    int e;
    frexp(fabs(x), &e);
    if (fmt == TD_BF16) return x == 0 ? ldexp(1, -133) : ldexp(1, (e - 1 < -126 ? -126 : e - 1) - 7);
    if (fmt == TD_F16) return x == 0 ? ldexp(1, -24) : ldexp(1, (e - 1 < -14 ? -14 : e - 1) - 10);
    return 0.0;
}

static void run_case(const mcase *c)
{
    if (ON_GPU && (c->refuse_splitk || c->refuse)) return;   /* model knobs: the simulator only */
    td_recipe head, parsed;
    const td_recipe *r = NULL;
    if (c->recipe && c->recipe[0] == '{') {   /* a recipe file's JSON */
        td_error err;
        if (td_recipe_from_json(c->recipe, strlen(c->recipe), c->recipe, &parsed, &err)) fail_msg("%s", err.msg);
        r = &parsed;
    } else if (c->recipe) {
        r = td_recipe_find_preset(c->recipe);
        assert_non_null(r);
    }
    const char *label = r ? r->name : "fp32 reference";
    if (c->head) { head = td_recipe_for_head(r); r = &head; }
    int N = c->N, IN = c->IN, n = c->n;
    float *inp = (float *)malloc((size_t)N * IN * sizeof(float));
    fill(inp, N, IN);
    pw p[3] = {};
    float *cpu[3], *gpu[3], *bias[3] = {NULL, NULL, NULL};
    for (int j = 0; j < n; j++) {
        int O = c->OUT[j];
        float *W = (float *)malloc((size_t)O * IN * sizeof(float));
        fill(W, O, IN);
        p[j] = prepare(r, W, O, IN, c->store);
        free(W);
        cpu[j] = (float *)calloc((size_t)N * O, sizeof(float));
        gpu[j] = (float *)calloc((size_t)N * O, sizeof(float));
        if (c->bias && j == 0) {
            bias[j] = (float *)malloc(O * sizeof(float));
            for (int o = 0; o < O; o++) bias[j][o] = td_round(r ? r->activations : TD_F32, urand());
        }
    }
    td_wmat w[3] = {p[0].w, n > 1 ? p[1].w : p[0].w, n > 2 ? p[2].w : p[0].w};

    /* the CPU backend, as weights_recipe.c sets up a context */
    td_ops cc;
    td_ops_init(&cc, &td_backend_cpu);
    cc.recipe = r;
    cc.qin = (float *)malloc((size_t)N * IN * sizeof(float));
    cc.wtile_per_thread = (size_t)TD_GEMM_TILE * IN;
    cc.wtile = (float *)malloc(cc.nthreads * cc.wtile_per_thread * sizeof(float));
    cc.gscratch_per_thread = 2 * (size_t)N * TD_GEMM_TILE;
    cc.gscratch = (float *)malloc(cc.nthreads * cc.gscratch_per_thread * sizeof(float));
    cc.be->matmul_forward(&cc, n, cpu, inp, w, bias, N, IN, c->OUT);

    /* the CUDA backend: in the simulator, with the model's knobs and counters; on a GPU, the
     * real cuBLASLt decides (cases that need a knob are skipped there) */
    td_ops gc = cc;
    gc.be = &td_backend_cuda;
#ifdef TD_CUDASIM
    long before[6], split_before = cublaslt_sim_calls_splitk, fast_before = cublaslt_sim_calls_fast;
    memcpy(before, cublaslt_sim_calls_fp8, sizeof before);
    cublaslt_sim_refuse_splitk = c->refuse_splitk;
    cublaslt_sim_refuse_scale_modes = c->refuse & 1;
    cublaslt_sim_refuse_fp8_f32_out = (c->refuse & 2) != 0;
    matmul_forward_cuda(&gc, n, gpu, inp, w, bias, N, IN, c->OUT);
    cublaslt_sim_refuse_splitk = cublaslt_sim_refuse_scale_modes = cublaslt_sim_refuse_fp8_f32_out = 0;
    if (c->mode >= 0) assert_true(cublaslt_sim_calls_fp8[c->mode] >= before[c->mode] + n);
    else for (int m = 0; m < 6; m++) assert_int_equal(cublaslt_sim_calls_fp8[m], before[m]);
    if (c->splitk) assert_true(cublaslt_sim_calls_splitk > split_before);
    /* FAST_ACCUM exactly when the recipe accumulates fp8-fast, except in the block modes */
    int want_fast = c->mode >= 0 && c->mode != CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
                    r->accumulate == TD_ACC_FP8_FAST;
    assert_int_equal(cublaslt_sim_calls_fast - fast_before, want_fast ? n : 0);
#else
    matmul_forward_cuda(&gc, n, gpu, inp, w, bias, N, IN, c->OUT);
#endif

    /* element by element within the stated bound */
    const td_recipe *rr = r && !td_recipe_is_plain_fp32(r) ? r : NULL;
    int act = rr ? rr->activations : TD_F32;
    int fast = rr && td_recipe_fp8_gemm(rr) && rr->accumulate == TD_ACC_FP8_FAST;
    float *q = (float *)malloc((size_t)N * IN * sizeof(float));
    if (rr) td_gemm_quant_input(rr, inp, N, IN, q);
    else memcpy(q, inp, (size_t)N * IN * sizeof(float));
    double worst = 0.0, worst_ulps = 0.0, u = ldexp(1, -24);
    long differ = 0, total = 0;
    for (int j = 0; j < n; j++) {
        int O = c->OUT[j];
        float *wv = (float *)malloc((size_t)O * IN * sizeof(float));
        const float *wr = wmat_rows(&w[j], 0, O, IN, wv);
        double nz = 0.0;
        for (int i = 0; i < N; i++)
            for (int o = 0; o < O; o++) {
                double S = bias[j] ? fabs(bias[j][o]) : 0.0;
                for (int k = 0; k < IN; k++) S += fabs((double)q[(size_t)i * IN + k] * wr[(size_t)o * IN + k]);
                double g = gpu[j][(size_t)i * O + o], e = cpu[j][(size_t)i * O + o], d = fabs(g - e);
                double bound = (2.0 * IN + 16) * u * S + ulp_of(act, fmax(fabs(g), fabs(e)));
                if (fast) bound += 2.0 * ((IN + 31) / 32) * ldexp(1, -rr->acc_fraction_bits) * S;
                if (c->exact) bound = 0.0;
                if (!(d <= bound))
                    fail_msg("%s%s N=%d IN=%d out %d (%d, %d): gpu %.9g cpu %.9g |d| %.3g > bound %.3g",
                             label, c->head ? " (head)" : "", N, IN, j, i, o, g, e,
                             d, bound);
                if (S > 0 && d / S > worst) worst = d / S;
                if (act != TD_F32 && d / ulp_of(act, fmax(fabs(g), fabs(e))) > worst_ulps)
                    worst_ulps = d / ulp_of(act, fmax(fabs(g), fabs(e)));
                differ += d > 0;
                total++;
                nz += fabs(e);
            }
        assert_true(nz > 0.0);   /* not a vacuous comparison */
        free(wv);
    }
    char ulps[48] = "";
    if (act != TD_F32) snprintf(ulps, sizeof ulps, " (at most %.3g ulp)", worst_ulps);
    printf("  matmul %-20s%s N=%-3d IN=%-4d OUT=%-3d%s%s: max |gpu - cpu| / S = %.3g, %ld of %ld differ%s\n",
           label, c->head ? " (head)" : "", N, IN, c->OUT[0], n > 1 ? " (+n)" : "",
           c->refuse_splitk || c->refuse ? " [refused]" : "", worst, differ, total, ulps);
    for (int j = 0; j < n; j++) {
        free(p[j].data); free(p[j].scale); free(cpu[j]); free(gpu[j]); free(bias[j]);
    }
    free(inp); free(q); free(cc.qin); free(cc.wtile); free(cc.gscratch);
    /* the host weights are freed: drop their device copies, widened ones included (be->forget) */
    td_backend_cuda.forget();
}

enum { NOM = -1, SCAL = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, OUTV = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
       BLK = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F };

static void test_matmul_fp32(void **state)
{
    (void)state;
    const mcase cs[] = {
        {NULL, 0, 1, 64, 1, {48}, 0, -1, 0, 0, NOM, 0},
        {NULL, 0, 7, 300, 1, {130}, 1, -1, 0, 0, NOM, 0},
        {NULL, 0, 33, 256, 3, {256, 64, 64}, 1, -1, 0, 0, NOM, 0},
        {NULL, 0, 5, 200, 1, {96}, 0, TD_BF16, 0, 0, NOM, 0},        /* bf16 checkpoint, widened once */
        {"fp32", 0, 4, 96, 1, {32}, 1, -1, 0, 0, NOM, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
}

static void test_matmul_16bit(void **state)
{
    (void)state;
    const mcase cs[] = {
        {"bf16-train", 0, 1, 128, 1, {64}, 1, -1, 0, 0, NOM, 0},
        {"bf16-train", 0, 7, 300, 1, {130}, 0, -1, 0, 0, NOM, 0},
        {"bf16-train", 0, 33, 256, 3, {128, 64, 64}, 1, -1, 0, 0, NOM, 0},
        {"fp16-train", 0, 9, 320, 1, {64}, 1, -1, 0, 0, NOM, 0},
        {"bf16-autocast", 0, 4, 200, 1, {48}, 0, TD_F32, 0, 0, NOM, 0},  /* rounded weights kept fp32 */
        {"bf16-infer", 0, 6, 384, 1, {80}, 1, -1, 0, 0, NOM, 1},         /* split_k 2 on cuBLASLt */
        {"bf16-infer", 0, 1, 257, 1, {40}, 0, -1, 1, 0, NOM, 0},         /* refused: K slices */
        {"fp16-infer", 0, 3, 130, 2, {64, 32}, 1, -1, 0, 0, NOM, 1},
        {"bf16-train", 0, 16, 2048, 1, {256}, 0, -1, 0, 0, NOM, 0},      /* a model-sized K */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
}

static void test_matmul_fp8(void **state)
{
    (void)state;
    const mcase cs[] = {
        {"fp8-rollout", 0, 1, 256, 1, {128}, 0, -1, 0, 0, BLK, 0},       /* decode step */
        {"fp8-rollout", 0, 5, 512, 1, {208}, 1, -1, 0, 0, BLK, 0},       /* a partial 128-row weight block */
        {"fp8-rollout", 0, 19, 384, 3, {256, 128, 128}, 1, -1, 0, 0, BLK, 0},
        {"fp8-rollout", 0, 3, 320, 1, {64}, 0, -1, 0, 0, NOM, 0},        /* K % 128: emulated */
        {"fp8-rollout", 0, 4, 256, 1, {64}, 1, -1, 0, 1, NOM, 0},        /* no block modes: emulated */
        {"fp8-unified-train", 0, 2, 256, 1, {96}, 0, -1, 0, 0, BLK, 0},
        {"vllm-fp8", 0, 4, 256, 1, {96}, 1, -1, 0, 0, SCAL, 0},          /* per-tensor, fast accumulation */
        {"vllm-fp8", 0, 1, 192, 2, {64, 32}, 0, -1, 0, 0, SCAL, 0},
        {"vllm-fp8-per-token", 0, 5, 192, 1, {64}, 1, -1, 0, 0, OUTV, 0},
        {"vllm-fp8-per-token", 0, 3, 100, 1, {64}, 0, -1, 0, 0, NOM, 0}, /* K % 16: emulated */
        {"vllm-fp8-per-token", 0, 3, 128, 1, {64}, 0, -1, 0, 1, NOM, 0}, /* no outer vectors: emulated */
        {"fp8-rollout", 0, 5, 256, 2, {64, 32}, 0, -1, 0, 2, BLK, 0},    /* no fp32 D: bf16 D, no bias */
        {"vllm-fp8", 0, 3, 128, 1, {48}, 0, -1, 0, 2, SCAL, 0},
        {"fp8-rollout", 0, 2, 256, 1, {64}, 1, -1, 0, 2, NOM, 0},        /* ... with a bias: emulated */
        {"fp8-rollout", 0, 16, 2048, 1, {256}, 0, -1, 0, 0, BLK, 0},     /* a model-sized K */
        {"vllm-fp8", 0, 16, 2048, 1, {256}, 0, -1, 0, 0, SCAL, 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
}

/* batch-invariant recipes: the CPU's td_gemm_fixed order on the GPU too, so the same bits */
static void test_matmul_invariant(void **state)
{
    (void)state;
    const mcase cs[] = {
        {"{\"base\": \"bf16-infer\", \"batch_invariant\": true}", 0, 5, 300, 2, {70, 32}, 1, -1, 0, 0, NOM, 0, 1},
        {"{\"base\": \"fp32\", \"batch_invariant\": true}", 0, 1, 200, 1, {48}, 1, -1, 0, 0, NOM, 0, 1},
        {"{\"base\": \"fp8-rollout\", \"batch_invariant\": true}", 0, 3, 256, 1, {64}, 0, -1, 0, 0, NOM, 0, 1},
        {"{\"base\": \"vllm-fp8-per-token\", \"batch_invariant\": true}", 0, 4, 192, 1, {32}, 1, -1, 0, 0, NOM, 0, 1},
        {"{\"base\": \"fp16-train\", \"batch_invariant\": true, \"split_k\": 3}", 0, 2, 100, 1, {40}, 0, -1, 0, 0, NOM, 0, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
}

static void test_matmul_heads(void **state)
{
    (void)state;
    const mcase cs[] = {
        {"bf16-infer-fp32head", 1, 3, 128, 1, {500}, 0, -1, 0, 0, NOM, 1},   /* fp32 lm_head, split_k 2 */
        {"bf16-train-fp32head", 1, 1, 96, 1, {300}, 0, -1, 0, 0, NOM, 0},
        {"fp8-rollout", 1, 4, 256, 1, {200}, 0, -1, 0, 0, NOM, 0},          /* fp8 recipe's head: bf16 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i]);
}

#ifdef TD_CUDASIM
/* the same product twice: the second call reuses the cuBLASLt plans (no heuristic query) and
 * gives the same bits; after be->forget the plans are found again */
static void test_matmul_plans(void **state)
{
    (void)state;
    const td_recipe *r = td_recipe_find_preset("bf16-infer");   /* split_k 2: a split-K plan */
    const int N = 4, IN = 128, OUT = 64;
    float *inp = (float *)malloc(N * IN * sizeof(float)), *W = (float *)malloc(OUT * IN * sizeof(float));
    float *o1 = (float *)malloc(N * OUT * sizeof(float)), *o2 = (float *)malloc(N * OUT * sizeof(float));
    fill(inp, N, IN);
    fill(W, OUT, IN);
    pw p = prepare(r, W, OUT, IN, -1);
    td_ops gc;
    memset(&gc, 0, sizeof gc);
    gc.be = &td_backend_cuda;
    gc.recipe = r;
    long h0 = cublaslt_sim_calls_heuristic;
    matmul_forward_cuda(&gc, 1, &o1, inp, &p.w, NULL, N, IN, &OUT);
    long h1 = cublaslt_sim_calls_heuristic;
    matmul_forward_cuda(&gc, 1, &o2, inp, &p.w, NULL, N, IN, &OUT);
    assert_true(h1 > h0);
    assert_int_equal(cublaslt_sim_calls_heuristic, h1);
    assert_memory_equal(o1, o2, N * OUT * sizeof(float));
    td_backend_cuda.forget();
    matmul_forward_cuda(&gc, 1, &o2, inp, &p.w, NULL, N, IN, &OUT);
    assert_true(cublaslt_sim_calls_heuristic > h1);
    td_backend_cuda.forget();
    free(inp); free(W); free(o1); free(o2); free(p.data);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_quantize_bitexact),
        cmocka_unit_test(test_matmul_fp32),
        cmocka_unit_test(test_matmul_16bit),
        cmocka_unit_test(test_matmul_fp8),
        cmocka_unit_test(test_matmul_invariant),
        cmocka_unit_test(test_matmul_heads),
#ifdef TD_CUDASIM
        cmocka_unit_test(test_matmul_plans),
#endif
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
