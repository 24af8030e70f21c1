/* tidal-bench-model — throughput of the forward on a checkpoint (tests/bench/model.sh; on a GPU
 * tests/bench/gpu.sh): fp32 on the CPU by default, any recipe (--recipe) and device (--device).
 *
 *   tidal-bench-model --model DIR [--tf-batch 2] [--tf-len 512] [--prompt 32] [--steps 32]
 *                     [--decode-batch 16] [--seed 1] [--recipe fp32] [--device cpu]
 *
 * Cases (random tokens from --seed; one untimed warm-up pass each, which also faults the
 * mapped weights in):
 *   tf         teacher-forced log-probs of tf-batch sequences of tf-len tokens
 *   decode1    1 slot: prefill `prompt` tokens, then `steps` decode steps (full log-softmax rows,
 *              in host memory on the CPU, in the device's on --device cuda)
 *   decodeB    decode-batch slots the same way, one batched step per token of every slot
 * Prints "case NAME tokens_per_s X seconds S" per case and "peak_rss_mb X" (getrusage).
 * --bandwidth also measures this machine's memory bandwidth in the same run (a streaming read of
 * a 2 GiB buffer by every OpenMP thread at the widest vectors, best of 5 passes) and prints "bandwidth_gbs X" and
 * "decode_bytes_per_step X": the weight bytes one decode step reads (every tensor in its stored
 * dtype but the embedding, of which a step gathers a row per slot). With it come the compute
 * side of the same bound: "peak_gflops X", this machine's fp32 multiply-add peak measured in the
 * run (every thread running independent fused multiply-adds on the widest vectors the CPU has:
 * AVX-512, else AVX2, else scalar), and "decode_flops_per_token X" (2 per weight of every matrix
 * a step multiplies: all 2-D tensors but the embedding). And the bound of the instruction mix the
 * decode step's GEMMs run (issue 38: a bound must be one the kernel can reach): "kernel_gflops X"
 * and "kernel NAME", the fixed-order decode kernel that a step of decode-batch rows takes on the
 * fp32 recipe (td_gemm_fixed_w16 over the checkpoint's 16-bit weights, widened in registers and
 * multiplied with fp32 fused multiply-adds; td_gemm_fixed over fp32 ones) on weights that stay in
 * cache (64 columns x the hidden size per thread), every thread, best of 3 passes of 0.2 s.
 */
#include "tidal/checkpoint.h"
#include "tidal/gemm.h"
#include "tidal/isa.h"
#include "tidal/model.h"
#include "tidal/opts.h"
#include "tidal/rng.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double now(void) { return omp_get_wtime(); }

/* one pass of the streaming read: every thread sums its share as 64-bit integers (a vectorised
 * reduction with no dependency chain to wait on), at the CPU's widest vectors (TD_CLONES: the
 * tools are built for x86-64-v2, whose 16-byte loads read below the peak the decode kernel's
 * 64-byte loads reach) */
TD_CLONES static uint64_t stream_sum(const uint64_t *x, size_t n)
{
    uint64_t sum = 0;
    #pragma omp parallel for simd reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += x[i];
    return sum;
}

/* GB/s of a streaming read of a 2 GiB buffer, best of 5 passes: a bound the decode beat (ratio
 * 1.005 on a Xeon VM, 2026-11-30, with 16-byte loads and 3 passes) was no bound. */
static double bandwidth_gbs(void)
{
    size_t n = (size_t)1 << 28;   /* 64-bit words: 2 GiB */
    uint64_t *x = malloc(n * sizeof *x);
    if (!x) return 0;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = i & 7;
    double best = 0;
    uint64_t sink = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now();
        sink += stream_sum(x, n);
        double dt = now() - t0, gbs = n * sizeof *x / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(x);
    return sink > 0 ? best : 0;
}

/* fp32 FLOP/s of one thread's chains of fused multiply-adds: 12 independent accumulators (more
 * than an FMA unit's latency x throughput), `reps` rounds; returns the flops done. */
#if defined(__x86_64__) || defined(__i386__)
#define FMA_CHAINS(VEC, SET1, FMA, LANES)                                                          \
    VEC acc[12], x = SET1(0.999f), y = SET1(1e-3f);                                                \
    for (int j = 0; j < 12; j++) acc[j] = SET1((float)j);                                          \
    for (long r = 0; r < reps; r++) {                                                              \
        _Pragma("GCC unroll 12")   /* in registers: a loop over acc[] in memory measures latency */ \
        for (int j = 0; j < 12; j++) acc[j] = FMA(acc[j], x, y);                                   \
    }                                                                                              \
    float keep = 0;                                                                                \
    for (int j = 0; j < 12; j++) { float t[LANES]; memcpy(t, &acc[j], sizeof t); keep += t[0]; }  \
    *sink += keep;                                                                                 \
    return 2.0 * LANES * 12 * reps;
__attribute__((target("avx512f"))) static double fma_512(long reps, float *sink)
{ FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, 16) }
__attribute__((target("avx2,fma"))) static double fma_256(long reps, float *sink)
{ FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, 8) }
#endif
static double fma_scalar(long reps, float *sink)
{
    float acc[12];
    for (int j = 0; j < 12; j++) acc[j] = (float)j;
    for (long r = 0; r < reps; r++)
        for (int j = 0; j < 12; j++) acc[j] = acc[j] * 0.999f + 1e-3f;
    for (int j = 0; j < 12; j++) *sink += acc[j];
    return 2.0 * 12 * reps;
}

static volatile float fma_sink;

/* the machine's fp32 FMA peak, GFLOP/s over every OpenMP thread, best of 3 passes */
static double peak_gflops(void)
{
    double (*fn)(long, float *) = fma_scalar;
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx512f")) fn = fma_512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) fn = fma_256;
#endif
    double best = 0;
    float sink = 0;
    for (int pass = 0; pass < 3; pass++) {
        double flops = 0, t0 = now();
        #pragma omp parallel reduction(+ : flops)
        {
            float s = 0;
            flops += fn(20000000, &s);
            #pragma omp atomic
            sink += s;
        }
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    fma_sink = sink;   /* the chains' results are used: the loops cannot be dropped */
    return best;
}

/* The decode kernel's own compute ceiling: td_gemm_fixed_w16 (or td_gemm_fixed for fp32 weights)
 * on B rows against a cache-resident slice of K-wide weights per thread. */
static double kernel_gflops(int B, int K, td_format wdt, char *name, size_t cap)
{
    const int N = 64;
    int w16 = wdt == TD_BF16 || wdt == TD_F16;
    const char *isa = td_isa_level() >= TD_ISA_AVX512 ? "AVX-512" : td_isa_level() >= TD_ISA_AVX2 ? "AVX2" : "portable";
    if (w16) {
        int kk = td_gemm_w16_kernel();
        isa = kk == 2 ? "AVX-512" : kk == 1 ? "AVX2" : "portable";
    }
    snprintf(name, cap, "%s/%s(fp32-FMA%s)", w16 ? "td_gemm_fixed_w16" : "td_gemm_fixed", isa,
             w16 ? (wdt == TD_BF16 ? ",bf16-widen" : ",fp16-widen") : "");
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double flops = 0, t0 = now();
        #pragma omp parallel reduction(+ : flops)
        {
            float *a = calloc((size_t)B * K, sizeof(float)), *c = malloc((size_t)B * N * sizeof(float));
            uint16_t *w = malloc((size_t)N * K * sizeof(uint16_t));
            float *wf = w16 ? NULL : malloc((size_t)N * K * sizeof(float));
            if (a && c && w && (w16 || wf)) {
                for (size_t i = 0; i < (size_t)B * K; i++) a[i] = (float)(i % 7) * 0.125f;
                for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (uint16_t)(0x3C00 + i % 64);
                if (wf) for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = (float)(i % 5) * 0.25f;
                double t1 = now();
                while (now() - t1 < 0.2) {
                    if (w16) td_gemm_fixed_w16(a, K, w, K, wdt, c, N, B, N, K, 0);
                    else     td_gemm_fixed(a, K, wf, K, c, N, B, N, K, 0);
                    flops += 2.0 * B * N * K;
                }
            }
            free(a); free(c); free(w); free(wf);
        }
        double g = flops / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

/* Prefill every slot with `prompt` random tokens, then `steps` batched decode steps feeding
 * random tokens; returns the seconds of the decode steps. */
static double run_decode(const td_model *m, const td_recipe *rc, int B, int prompt, int steps,
                         td_rng *r, td_error *err, int *ok)
{
    int V = m->cfg.vocab_size;
    td_session *s = td_session_create(m, B, prompt + steps, 64, err);
    if (s && td_session_set_recipe(s, rc, err)) {
        td_session_free(s);
        s = NULL;
    }
    /* on a device the rows stay in its memory, as tidal-diff's rollouts keep them (the H200 of
     * 2026-11-29 measured host rows: B x V floats over PCIe a step); on the CPU host memory */
    td_rows_dev *rd = td_rows_dev_create(m, (size_t)B);
    float *rows = rd ? td_rows_dev_data(rd) : malloc((size_t)B * V * sizeof(float));
    int *toks = malloc((size_t)(prompt > B ? prompt : B) * sizeof(int));
    int *slots = malloc((size_t)B * sizeof(int));
    *ok = s != NULL;
    double t0 = 0, t1 = 0;
    if (s) {
        for (int b = 0; b < B && *ok; b++) {
            for (int i = 0; i < prompt; i++) toks[i] = (int)td_rng_below(r, V);
            *ok = !td_session_prefill(s, b, toks, prompt, rows + (size_t)b * V, NULL, NULL, err);
            slots[b] = b;
        }
        t0 = now();
        for (int k = 0; k < steps && *ok; k++) {
            for (int b = 0; b < B; b++) toks[b] = (int)td_rng_below(r, V);
            *ok = !td_session_decode(s, B, slots, toks, rows, err);
        }
        t1 = now();
    }
    td_session_free(s);
    if (rd) td_rows_dev_free(rd);
    else free(rows);
    free(toks); free(slots);
    return t1 - t0;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *recipe_arg = "fp32", *device = "cpu";
    int tfB = 2, tfT = 512, prompt = 32, steps = 32, decB = 16, only = -1, bw = 0;
    unsigned long long seed = 1;
    td_opt opts[] = {
        TD_OPT_S("model", 0, &dir, "DIR", "checkpoint directory"),
        TD_OPT_I("tf-batch", 0, &tfB, "N", 1, 4096, "teacher-forced sequences (default 2)"),
        TD_OPT_I("tf-len", 0, &tfT, "T", 2, 1 << 20, "their length (default 512)"),
        TD_OPT_I("prompt", 0, &prompt, "P", 1, 1 << 20, "prompt tokens prefilled per decode slot (default 32)"),
        TD_OPT_I("steps", 0, &steps, "S", 1, 1 << 20, "decode steps (default 32)"),
        TD_OPT_I("decode-batch", 0, &decB, "B", 1, 4096, "slots of the batched decode case (default 16)"),
        TD_OPT_U("seed", 0, &seed, "N", "seed of the random tokens (default 1)"),
        TD_OPT_C("only", 0, &only, "tf|decode1|decodeB", "run one case"),
        TD_OPT_F("bandwidth", 0, &bw, 1, "also measure the memory bandwidth (2 GiB streaming read)"),
        TD_OPT_S("recipe", 0, &recipe_arg, "NAME|FILE", "precision recipe of every case (default fp32)"),
        TD_OPT_DEVICE(&device),
        {0}};
    td_opt_get(opts, "model")->required = 1;
    td_cli cli = {"tidal-bench-model", "--model DIR [--tf-batch N] [--tf-len T] [--prompt P] [--steps S] "
                  "[--decode-batch B] [--seed N] [--only CASE]",
                  "Throughput of the forward (default fp32 on the CPU): prints \"case NAME tokens_per_s X seconds S\" per case\n"
                  "and \"peak_rss_mb X\".", NULL, opts, 0, 0};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc0 >= 0) return rc0;
    td_error err;
    td_recipe recipe;
    if (td_recipe_resolve(recipe_arg, &recipe, &err)) { fprintf(stderr, "tidal-bench-model: %s\n", err.msg); return 2; }
    td_model *m = td_model_load_progress(dir, stderr, &err);
    if (!m || td_model_set_device(m, device, &err)) {
        fprintf(stderr, "tidal-bench-model: %s\n", err.msg);
        td_model_free(m);
        return 1;
    }
    printf("device %s recipe %s\n", td_model_device(m), recipe.name);
    int V = m->cfg.vocab_size;
    td_rng r;
    td_rng_seed(&r, seed);
    int ok = 1;

    if (only < 0 || only == 0) {
        td_forward *f = td_forward_create(m, tfB * tfT, tfT, 0, &err);
        if (f && td_forward_set_recipe(f, &recipe, &err)) {
            td_forward_free(f);
            f = NULL;
        }
        int **tok = calloc(tfB, sizeof *tok), *lens = calloc(tfB, sizeof(int));
        float **lp = calloc(tfB, sizeof *lp);
        for (int b = 0; b < tfB; b++) {
            lens[b] = tfT;
            tok[b] = malloc((size_t)tfT * sizeof(int));
            lp[b] = malloc((size_t)tfT * sizeof(float));
            for (int t = 0; t < tfT; t++) tok[b][t] = (int)td_rng_below(&r, V);
        }
        int warm_len = 16;
        ok = f && !td_forward_logprobs(f, 1, (const int *const *)tok, &warm_len, lp, NULL, NULL,
                                       &err);
        double t0 = now();
        ok = ok && !td_forward_logprobs(f, tfB, (const int *const *)tok, lens, lp, NULL, NULL,
                                        &err);
        double dt = now() - t0;
        if (ok) printf("case tf tokens_per_s %.3f seconds %.3f\n", tfB * tfT / dt, dt);
        for (int b = 0; b < tfB; b++) { free(tok[b]); free(lp[b]); }
        free(tok); free(lens); free(lp);
        td_forward_free(f);
    }
    if (ok && (only < 0 || only == 1)) {
        run_decode(m, &recipe, 1, 4, 2, &r, &err, &ok);  /* warm-up */
        double dt = ok ? run_decode(m, &recipe, 1, prompt, steps, &r, &err, &ok) : 0;
        if (ok) printf("case decode1 tokens_per_s %.3f seconds %.3f\n", steps / dt, dt);
    }
    if (ok && (only < 0 || only == 2)) {
        double dt = run_decode(m, &recipe, decB, prompt, steps, &r, &err, &ok);
        if (ok) printf("case decode%d tokens_per_s %.3f seconds %.3f\n", decB,
                       (double)decB * steps / dt, dt);
    }
    if (!ok) { fprintf(stderr, "tidal-bench-model: %s\n", err.msg); td_model_free(m); return 1; }
    if (bw) {
        size_t bytes = 0;
        for (size_t i = 0; i < td_checkpoint_num_tensors(m->ck); i++) {
            const td_tensor *t = td_checkpoint_tensor(m->ck, i);
            if (strcmp(t->name, "model.embed_tokens.weight") || m->cfg.tie_word_embeddings) bytes += t->nbytes;
        }
        double flops = 0;
        for (size_t i = 0; i < td_checkpoint_num_tensors(m->ck); i++) {
            const td_tensor *t = td_checkpoint_tensor(m->ck, i);
            if (t->ndim == 2 && (strcmp(t->name, "model.embed_tokens.weight") || m->cfg.tie_word_embeddings))
                flops += 2.0 * (double)t->shape[0] * (double)t->shape[1];
        }
        printf("decode_bytes_per_step %zu\n", bytes);
        printf("decode_flops_per_token %.0f\n", flops);
        printf("bandwidth_gbs %.3f\n", bandwidth_gbs());
        printf("peak_gflops %.3f\n", peak_gflops());
        td_format wdt = TD_F32;
        for (size_t i = 0; i < td_checkpoint_num_tensors(m->ck); i++) {
            const td_tensor *t = td_checkpoint_tensor(m->ck, i);
            if (t->ndim == 2 && strstr(t->name, "mlp")) { wdt = td_dtype_format(t->dtype); break; }
        }
        char kname[96];
        double kg = kernel_gflops(decB <= TD_GEMM_FIXED_ROWS ? decB : TD_GEMM_FIXED_ROWS, m->cfg.hidden_size, wdt, kname, sizeof kname);
        printf("kernel_gflops %.3f\n", kg);
        printf("kernel %s\n", kname);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak_rss_mb %.1f\n", ru.ru_maxrss / 1024.0);
    td_model_free(m);
    return 0;
}
