/* The whole decoder backward (src/model/decoder_backward.c: every layer in reverse, the final
 * norm, the embedding) with the CUDA backend (td_backend_cuda: every backward op, the GEMMs'
 * matmul_backward_cuda included) on the simulator, against the CPU backend, on
 * datasets/models/add (a Qwen2 trained by tidal-sft, q/k/v biases) and three packed sequences.
 *
 * The forward is the CUDA backend's (activations, rstd and lse in device buffers), the working
 * gradient buffers (td_grad_acts) and every weight gradient are the backend's (be->alloc,
 * zeroed by be->zero), weights, pos and tokens host memory, as a trainer would hand them over.
 * It runs under CUDASIM_DEVICE_GUARD=1: device memory faults when host code touches it, so the
 * whole backward runs on device memory as on a GPU. What is compared, from the same random
 * gradient of the final norm's output: the gradient of the embedding output (ga->dx), every
 * RMSNorm weight's gradient with the embedding table's, and every GEMM weight's and bias's
 * gradient.
 *   fp32: normalised error max|gpu - cpu| / max|cpu| <= 1e-4 (the GEMMs are the cuBLASLt
 *     model's fp32 sums, attention's backward sums in another order than OpenBLAS: ~1e-6
 *     measured);
 *   bf16-train: the GPU run is a run of the recipe: a bf16 rounding that flips in the forward
 *     or in a gradient between ops moves the gradients by bf16 steps, so only agreement to a
 *     cosine >= 0.999 and a normalised error <= 0.05 is asked (the figures are printed).
 * Real-GPU builds (nvcc, $(BUILD)/gpu) run it too: nothing here needs the simulator. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/model.h"
#include "../../model/model_internal.h"
}

#define MODEL "datasets/models/add"
enum { NSEQ = 3, CAP = 64, MAXLEN = 40 };
static const int LENS[NSEQ] = {20, 33, 7};
static const td_backend *GPU;

struct result {
    std::vector<float> dx, gw, gm;   /* ga->dx (N, C); the norm and embedding gradients; the GEMM
                                        weights' and biases' */
};

/* a gradient of n floats carved from the buffer at *at */
static float *carve(float **at, size_t n)
{
    float *p = *at;
    *at += n;
    return p;
}

static result run(int gpu, const char *recipe, int **tok, const std::vector<float> &dxn0)
{
    td_error err;
    td_model *m = td_model_load(MODEL, &err);
    if (!m) fail_msg("%s", err.msg);
    if (gpu) m->backend = GPU;
    td_recipe r;
    if (td_recipe_resolve(recipe, &r, &err)) fail_msg("%s", err.msg);
    td_forward *f = td_forward_create(m, CAP, MAXLEN, 16, &err);
    if (!f) fail_msg("%s", err.msg);
    forward_keep_activations(f, 1);
    if (td_forward_set_recipe(f, &r, &err)) fail_msg("%s", err.msg);
    td_forward_rows rows;
    int N = forward_decoder(f, NSEQ, (const int *const *)tok, LENS, &rows);
    const td_acts *a = forward_acts(f);
    const td_backend *be = rows.ops->be;
    assert_ptr_equal(be, gpu ? GPU : &td_backend_cpu);   /* the ops ran there */
    const td_config *c = &m->cfg;
    size_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    int L = c->num_layers;
    assert_int_equal((size_t)N * C, dxn0.size());
    td_grad_acts ga;
    grad_acts_alloc(&ga, c, rows.ops, N, MAXLEN, 0);
    be->upload(ga.dxn, dxn0.data(), dxn0.size() * sizeof(float));
    /* every gradient in one buffer of the backend's: the norms' and the embedding's first, then
     * per layer the GEMM weights' and q/k/v biases' */
    size_t nnorm = (size_t)(2 * L + 1) * C + V * C;
    size_t nlayer = 2 * QD * C + 2 * KVD * C + 3 * F * C + QD + 2 * KVD;
    size_t ntot = nnorm + (size_t)L * nlayer;
    float *gbuf = (float *)be->alloc(ntot * sizeof(float)), *at = gbuf;
    be->zero(gbuf, ntot * sizeof(float));
    /* calloc, not a std::vector: nvcc 12's front end fails on vector<td_layer_weights> */
    td_layer_weights *gl = (td_layer_weights *)calloc(L, sizeof *gl);
    td_model_weights g;
    memset(&g, 0, sizeof g);
    g.layers = gl;
    for (int l = 0; l < L; l++) {
        gl[l].attn_norm = carve(&at, C);
        gl[l].mlp_norm = carve(&at, C);
    }
    g.final_norm = carve(&at, C);
    g.embed = carve(&at, V * C);
    for (int l = 0; l < L; l++) {
        gl[l].wq = carve(&at, QD * C);
        gl[l].wk = carve(&at, KVD * C);
        gl[l].wv = carve(&at, KVD * C);
        gl[l].wo = carve(&at, C * QD);
        gl[l].w_gate = carve(&at, F * C);
        gl[l].w_up = carve(&at, F * C);
        gl[l].w_down = carve(&at, C * F);
        gl[l].bq = carve(&at, QD);
        gl[l].bk = carve(&at, KVD);
        gl[l].bv = carve(&at, KVD);
    }
    assert_true(at == gbuf + ntot);
    assert_non_null(m->w.layers[0].bq);   /* Qwen2: the bias gradients are computed */
    decoder_backward(rows.ops, m, a, &ga, &g, NULL, rows.tok, rows.pos, N);
    td_ops_sync(rows.ops);
    result res;
    res.dx.resize((size_t)N * C);
    be->download(res.dx.data(), ga.dx, res.dx.size() * sizeof(float));
    res.gw.resize(nnorm);
    be->download(res.gw.data(), gbuf, nnorm * sizeof(float));
    res.gm.resize(ntot - nnorm);
    be->download(res.gm.data(), gbuf + nnorm, (ntot - nnorm) * sizeof(float));
    be->free(gbuf);
    free(gl);
    grad_acts_free(&ga);
    td_forward_free(f);
    td_model_free(m);
    return res;
}

struct cmp { double nerr, cosine; };

static cmp compare(const std::vector<float> &g, const std::vector<float> &c)
{
    double mx = 0, mref = 0, gg = 0, cc = 0, gc = 0;
    for (size_t i = 0; i < g.size(); i++) {
        if (!isfinite(g[i]) || !isfinite(c[i])) fail_msg("value %zu: gpu %g cpu %g", i, g[i], c[i]);
        double d = fabs((double)g[i] - c[i]);
        mx = d > mx ? d : mx;
        mref = fabs(c[i]) > mref ? fabs(c[i]) : mref;
        gg += (double)g[i] * g[i];
        cc += (double)c[i] * c[i];
        gc += (double)g[i] * c[i];
    }
    if (!(mref > 0)) fail_msg("the CPU's gradient is all zero");
    return {mx / mref, gc / sqrt(gg * cc)};
}

static void check(const char *recipe, double nlim, double clim)
{
    td_rng rng;
    td_rng_seed(&rng, 11);
    int *tok[NSEQ];
    int N = 0;
    for (int s = 0; s < NSEQ; s++) {
        tok[s] = (int *)malloc(LENS[s] * sizeof(int));
        for (int t = 0; t < LENS[s]; t++) tok[s][t] = 3 + (int)td_rng_below(&rng, 90);
        N += LENS[s];
    }
    tok[2][3] = tok[0][5];   /* a token repeated across sequences */
    int C;
    {
        td_error err;
        td_model *m = td_model_load(MODEL, &err);
        if (!m) fail_msg("%s", err.msg);
        C = m->cfg.hidden_size;
        td_model_free(m);
    }
    std::vector<float> dxn0((size_t)N * C);
    for (float &x : dxn0) x = (float)(0.01 * td_rng_normal(&rng));
    result cpu = run(0, recipe, tok, dxn0), gpu = run(1, recipe, tok, dxn0);
    cmp dx = compare(gpu.dx, cpu.dx), gw = compare(gpu.gw, cpu.gw), gm = compare(gpu.gm, cpu.gm);
    printf("  %-11s d(embedding output): normalised %.3g, cosine %.9f\n"
           "  %-11s norm + embedding weights' gradients: normalised %.3g, cosine %.9f\n"
           "  %-11s GEMM weights' and biases' gradients: normalised %.3g, cosine %.9f "
           "(limits %.3g, %.7f)\n", recipe, dx.nerr, dx.cosine, "", gw.nerr, gw.cosine, "",
           gm.nerr, gm.cosine, nlim, clim);
    if (dx.nerr > nlim || gw.nerr > nlim || gm.nerr > nlim || dx.cosine < clim || gw.cosine < clim ||
        gm.cosine < clim)
        fail_msg("decoder backward under %s: the GPU's gradients are beyond the tolerance", recipe);
    for (int s = 0; s < NSEQ; s++) free(tok[s]);
}

static void test_fp32(void **state) { (void)state; check("fp32", 1e-4, 0.9999999); }
static void test_bf16(void **state) { (void)state; check("bf16-train", 0.05, 0.999); }

static int setup(void **state)
{
    (void)state;
    GPU = sim_open_gpu();
    return GPU ? 0 : -1;
}

int main(void)
{
    /* host code touching device memory faults (the simulator; no effect on a GPU build) */
    setenv("CUDASIM_DEVICE_GUARD", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
