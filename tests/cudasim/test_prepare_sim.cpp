/* A recipe's weights prepared on the device from device masters (src/backend/cuda/prepare.cu,
 * the backend's prepare / alias / release entries, src/model/ops.h) against the host preparation
 * (td_round_row, td_encode_row: src/model/weights_recipe.c, lora_run.c), bit for bit:
 *   prepare      65,537 values (a normal draw with zeros, -0, subnormals of fp32, bf16 and fp16,
 *                fp16's overflow edge 65504 / 65520, 1e30, +-Inf and NaN planted), for every
 *                storage / format pair the trainer and the rollout side use: fp32 storage of
 *                fp32 / bf16 / fp16 values, bf16 and fp16 codes; with vLLM's B scale (0.37, 4,
 *                1e-30) in fp32 storage: R(R(x) * s); the device copy read back through tdc_const
 *                of the host key, whose bytes are checked untouched
 *   cache        the prepared copy survives be->forget, a second prepare of the key refills the
 *                same copy, release drops it (tdc_const of the key then uploads the host bytes);
 *                an alias makes tdc_const of every host sub-range resolve into the device buffer
 *   recipes      tiny models (Qwen2: C 32, 2 layers, biases, V 100, untied; Llama, tied) with its masters in
 *                device memory (m->owned_dev, as a trainer sets them): the trainer forward's fp32
 *                copies (bf16-train, fp16-train, f32 view) and a session's 16-bit codes
 *                (bf16-infer, fp16-infer; fp8-rollout and fp8-unified-train, whose FP8 matrices
 *                are quantised on the device by be->prepare_fp8: codes and block scales, or the
 *                fake-quantised fp32 copy; nothing downloaded) read back from the device
 *                equal a host preparation of
 *                the same recipe from the same masters, every tensor (the tied lm_head too); the
 *                embedding, a rounding view of the masters on the device (no copy), gathers the
 *                CPU's rows bit for bit (a token list with repeats, the first and the last row,
 *                the fp16 overflow planted in row 0); an unmerged and a vLLM
 *                (punica) adapter's rounded A and B too
 * Simulator here; the same source on a GPU in tests/gpu/run.sh check. */
#include "cuda_internal.cuh"
#include "simtest.h"

extern "C" {
#include "../../src/model/model_internal.h"
#include "tidal/gemm.h"
#include "tidal/lora.h"
}

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

static td_rng RNG;
static const td_backend *GPU;

static std::vector<float> specials(size_t n)
{
    std::vector<float> v = sim_normal(&RNG, n, 0.05);
    const float s[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e-7f, 6e-8f, 3e-8f, 65504.0f, 65519.0f, 65520.0f, -65536.0f,
                       1e30f, -1e30f, INFINITY, -INFINITY, NAN, 3.3895314e38f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 512};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) v[i * 97 % n] = s[i];
    return v;
}

/* the device copy the ops find for host key (bytes), brought to the host */
static std::vector<unsigned char> device_copy(const void *key, size_t bytes)
{
    std::vector<unsigned char> h(bytes);
    const void *d = tdc_const(key, bytes);
    GPU->sync();
    GPU->download(h.data(), d, bytes);
    return h;
}

static void test_prepare(void **state)
{
    (void)state;
    const size_t n = 65537;
    std::vector<float> x = specials(n);
    float *dx = (float *)GPU->alloc(n * sizeof(float));
    GPU->upload(dx, x.data(), n * sizeof(float));
    struct { int storage, fmt; float scale; } cases[] = {
        {TD_F32, TD_F32, 1.0f}, {TD_F32, TD_BF16, 1.0f}, {TD_F32, TD_F16, 1.0f}, {TD_BF16, TD_BF16, 1.0f},
        {TD_F16, TD_F16, 1.0f}, {TD_F32, TD_BF16, 0.37f}, {TD_F32, TD_F16, 4.0f}, {TD_F32, TD_F16, 1e-30f},
        {TD_F32, TD_F32, 0.37f}};
    for (const auto &c : cases) {
        size_t es = c.storage == TD_F32 ? 4 : 2;
        std::vector<unsigned char> want(n * es), key(n * es, 0xA5);
        std::vector<float> v(n);
        td_round_row((td_format)c.fmt, x.data(), v.data(), n, TD_SATFINITE);
        if (c.scale != 1.0f) {
            for (float &e : v) e = e * c.scale;
            td_round_row((td_format)c.fmt, v.data(), v.data(), n, TD_SATFINITE);
        }
        if (c.storage == TD_F32) memcpy(want.data(), v.data(), n * 4);
        else td_encode_row((td_format)c.fmt, v.data(), want.data(), n, TD_SATFINITE);
        GPU->prepare(key.data(), c.storage, dx, n, c.fmt, c.scale);
        std::vector<unsigned char> got = device_copy(key.data(), n * es);
        size_t bad = 0;
        for (size_t i = 0; i < n * es; i++) bad += got[i] != want[i];
        printf("prepare storage %d format %d scale %g: %zu differing bytes of %zu\n", c.storage, c.fmt, c.scale, bad, n * es);
        assert_int_equal(bad, 0);
        for (size_t i = 0; i < n * es; i++) assert_int_equal(key[i], 0xA5);   /* the host key untouched */
        GPU->release(key.data());
    }
    GPU->free(dx);
}

static void test_cache(void **state)
{
    (void)state;
    const size_t n = 1000;
    std::vector<float> a = sim_normal(&RNG, n, 1.0), b = sim_normal(&RNG, n, 1.0), key(n, 7.0f);
    float *da = (float *)GPU->alloc(n * 4), *db = (float *)GPU->alloc(n * 4);
    GPU->upload(da, a.data(), n * 4);
    GPU->upload(db, b.data(), n * 4);
    GPU->prepare(key.data(), TD_F32, da, n, TD_F32, 1.0f);
    const void *d1 = tdc_const(key.data(), n * 4);
    GPU->forget();   /* kept: its host bytes are stale */
    assert_memory_equal(device_copy(key.data(), n * 4).data(), a.data(), n * 4);
    GPU->prepare(key.data(), TD_F32, db, n, TD_F32, 1.0f);   /* refilled in place */
    assert_ptr_equal(tdc_const(key.data(), n * 4), d1);
    assert_memory_equal(device_copy(key.data(), n * 4).data(), b.data(), n * 4);
    GPU->release(key.data());   /* gone: the next lookup uploads the host's 7s */
    assert_memory_equal(device_copy(key.data(), n * 4).data(), key.data(), n * 4);
    GPU->forget();
    /* an alias: sub-ranges of the host block resolve into the device buffer, through forget */
    GPU->alias(key.data(), da, n * 4, TD_F32);
    GPU->forget();
    assert_ptr_equal(tdc_const(key.data() + 10, 40), da + 10);
    assert_memory_equal(device_copy(key.data() + 500, 400).data(), a.data() + 500, 400);
    GPU->release(key.data());
    assert_memory_equal(device_copy(key.data(), n * 4).data(), key.data(), n * 4);
    GPU->forget();
    GPU->free(da);
    GPU->free(db);
}

/* ---- whole recipes ---------------------------------------------------------------------------- */

/* tiny models: Qwen2 (q/k/v biases, untied lm_head) or Llama with a tied one */
static td_model *tiny_model(int tied)
{
    td_config c;
    memset(&c, 0, sizeof c);
    c.arch = tied ? TD_ARCH_LLAMA : TD_ARCH_QWEN2;   /* "tiny" keeps the arch it is given */
    assert_int_equal(td_config_preset("tiny", &c), 0);
    c.arch = tied ? TD_ARCH_LLAMA : TD_ARCH_QWEN2;
    c.qkv_bias = !tied;
    c.tie_word_embeddings = tied;
    c.hidden_size = 32;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 16;
    c.intermediate_size = 64;
    c.vocab_size = 100;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    for (size_t i = 0; i < m->owned_floats; i++) m->owned[i] = (float)(0.05 * td_rng_normal(&RNG));
    m->owned[3] = 1e30f;   /* fp16 overflow (SATFINITE) and an fp32 subnormal */
    m->owned[4] = 3e-41f;
    return m;
}

static size_t wmat_bytes(const td_wmat *w, size_t n) { return n * (w->dtype == TD_F32 ? 4 : w->dtype == TD_E4M3 || w->dtype == TD_E5M2 ? 1 : 2); }

/* every prepared tensor of st (device) against the same of ref (host), bit for bit */
static void compare_states(const td_recipe_state *st, const td_recipe_state *ref, const td_model *m)
{
    size_t np;
    td_param_spec *specs = param_table(&m->cfg, &np);
    int L = m->cfg.num_layers;
    size_t checked = 0;
    for (size_t i = 0; i < np; i++) {
        const td_param_spec *p = &specs[i];
        const td_wmat *wd = NULL, *wh = NULL;
        if (p->role == TD_ROLE_EMBED) {   /* a rounding view on the device: checked through the gather */
            assert_int_equal(st->ws.embed.dtype, ref->ws.embed.dtype);
            continue;
        }
        else if (p->role == TD_ROLE_LM_HEAD) { wd = &st->ws.lm_head; wh = &ref->ws.lm_head; }
        else if (param_lora_module(p->role) >= 0) {
            wd = wset_mat(&st->ws, p->layer, param_lora_module(p->role));
            wh = wset_mat(&ref->ws, p->layer, param_lora_module(p->role));
        }
        const void *dk, *hk;
        size_t bytes;
        if (wd) {
            assert_int_equal(wd->dtype, wh->dtype);
            dk = wd->data; hk = wh->data; bytes = wmat_bytes(wd, p->numel);
            if (wd->dtype == TD_E4M3 || wd->dtype == TD_E5M2) {   /* the block scales too */
                assert_true(wd->sr == wh->sr && wd->sc == wh->sc && wd->nbc == wh->nbc);
                size_t sb = (size_t)((p->shape[0] + wh->sr - 1) / wh->sr) * wh->nbc * sizeof(float);
                if (memcmp(device_copy(wd->scale, sb).data(), wh->scale, sb))
                    fail_msg("%s: the device's FP8 scales differ from the host's", p->name);
                checked += sb;
            }
        } else {
            dk = *param_slot((td_model_weights *)&st->w, L, p);
            hk = *param_slot((td_model_weights *)&ref->w, L, p);
            bytes = p->numel * 4;
        }
        std::vector<unsigned char> got = device_copy(dk, bytes);
        if (wd && wh->panels) {   /* the CPU backend's fp8 codes in panels of 8 rows; the device's row-major */
            assert_int_equal(wd->panels, 0);
            size_t rows = (size_t)p->shape[0], cols = (size_t)p->shape[1];
            std::vector<unsigned char> pn((rows + 7) / 8 * 8 * cols);
            td_fp8_codes_to_panels(got.data(), rows, cols, pn.data());
            got = pn;
            bytes = pn.size();
        }
        if (memcmp(got.data(), hk, bytes)) fail_msg("%s: the device's preparation differs from the host's", p->name);
        checked += bytes;
    }
    free(specs);
    printf("  %zu bytes of prepared weights bit-identical\n", checked);
}

static void recipes(int tied)
{
    td_model *m = tiny_model(tied);
    float *dm = (float *)GPU->alloc(m->owned_floats * 4);
    GPU->upload(dm, m->owned, m->owned_floats * 4);
    td_ops cpu, gpu;
    td_ops_init(&cpu, &td_backend_cpu);
    td_ops_init(&gpu, GPU);
    /* fp8-rollout / fp8-unified-train: FP8 matrices quantised on the device (be->prepare_fp8) */
    const char *names[] = {"bf16-train", "fp16-train", "bf16-infer", "fp16-infer", "fp32", "fp8-rollout",
                           "fp8-unified-train"};
    for (const char *name : names)
        for (int f32 = 0; f32 < 2; f32++) {
            const td_recipe *r = td_recipe_find_preset(name);
            assert_non_null(r);
            td_recipe_state ref, st;
            memset(&ref, 0, sizeof ref);
            memset(&st, 0, sizeof st);
            td_error err;
            assert_int_equal(recipe_state_set(&ref, &cpu, m, r, NULL, 0, 8, f32, &err), 0);
            m->owned_dev = dm;
            GPU->alias(m->owned, dm, m->owned_floats * 4, TD_F32);
            size_t d2h0 = td_cuda_d2h_bytes();
            assert_int_equal(recipe_state_set(&st, &gpu, m, r, NULL, 0, 8, f32, &err), 0);
            assert_ptr_equal(st.dev_be, GPU);
            assert_int_equal(td_cuda_d2h_bytes() - d2h0, 0);   /* nothing came down (FP8 included) */
            printf("%s, %s copies:\n", name, f32 ? "fp32" : "storage-dtype");
            compare_states(&st, &ref, m);
            /* the embedding's gather reads the device copy (its host bytes are stale) */
            const int tok[] = {0, 3, 99, 3, 57, 1, 98, 0};
            const int N = 8, C = m->cfg.hidden_size;
            std::vector<float> e_cpu((size_t)N * C), e_gpu((size_t)N * C);
            embedding_forward(&cpu, e_cpu.data(), tok, &ref.ws.embed, N, C);
            embedding_forward(&gpu, e_gpu.data(), tok, &st.ws.embed, N, C);
            assert_memory_equal(e_gpu.data(), e_cpu.data(), e_cpu.size() * sizeof(float));
            if (m->cfg.tie_word_embeddings) {   /* the tied lm_head: no entry of its own in the table */
                size_t b = wmat_bytes(&st.ws.lm_head, (size_t)m->cfg.vocab_size * C);
                assert_int_equal(st.ws.lm_head.dtype, ref.ws.lm_head.dtype);
                assert_memory_equal(device_copy(st.ws.lm_head.data, b).data(), ref.ws.lm_head.data, b);
            }
            recipe_state_free(&st);
            GPU->release(m->owned);
            m->owned_dev = NULL;
            recipe_state_free(&ref);
        }
    /* an adapter's rounded A and B (PEFT's form and vLLM's) */
    td_lora *lo = td_lora_new(&m->cfg, 4, 8.0, (1u << TD_LORA_Q) | (1u << TD_LORA_DOWN));
    size_t na = 0;
    for (int i = 0; i < m->cfg.num_layers * TD_LORA_NMOD; i++)
        if (lo->pairs[i].a) na += (size_t)(lo->pairs[i].in + lo->pairs[i].out) * lo->rank;
    for (size_t i = 0; i < na; i++) lo->owned[i] = (float)(0.3 * td_rng_normal(&RNG));
    float *dl = (float *)GPU->alloc(na * 4);
    GPU->upload(dl, lo->owned, na * 4);
    for (const char *name : {"bf16-train", "fp16-infer", "fp32"})
        for (int punica = 0; punica < 2; punica++) {
            const td_recipe *r = td_recipe_find_preset(name);
            lo->owned_dev = NULL;
            lora_rt *h = lora_rt_create(lo, r, 8, punica, &td_backend_cpu);
            lo->owned_dev = dl;
            lora_rt *d = lora_rt_create(lo, r, 8, punica, GPU);
            assert_true(d->on_device);
            for (int i = 0; i < m->cfg.num_layers * TD_LORA_NMOD; i++) {
                const td_lora_pair *p = &lo->pairs[i];
                if (!p->a) continue;
                size_t a = (size_t)lo->rank * p->in * 4, b = (size_t)p->out * lo->rank * 4;
                if (memcmp(device_copy(d->pairs[i].a, a).data(), h->pairs[i].a, a) ||
                    memcmp(device_copy(d->pairs[i].b, b).data(), h->pairs[i].b, b))
                    fail_msg("%s adapter (punica %d) pair %d: the device's A / B differ from the host's", name, punica, i);
            }
            printf("%s adapter (%s): A and B bit-identical\n", name, punica ? "vLLM's B scaled" : "PEFT");
            lora_rt_free(d);
            lora_rt_free(h);
        }
    lo->owned_dev = NULL;
    td_lora_free(lo);
    GPU->free(dl);
    GPU->free(dm);
    td_model_free(m);
}

static void test_recipes(void **state)
{
    (void)state;
    recipes(0);
    recipes(1);
}

/* A merged adapter folded on the device (be->lora_fold, prepare.cu) against the host's merge_sum
 * (weights_recipe.c): a session's / trainer's preparation with the adapter merged (TD_LORA_MERGED)
 * from device masters and a device adapter, every prepared tensor and the merge's statistics
 * (survival, aligned, changed: sums in double) bit for bit; bases rounded to bf16 and to fp16 (the
 * trainer's --model-dtype), ranks 1 and 4, all seven modules adapted, storage-dtype codes and fp32
 * copies; A and B ~ N(0, 0.005^2), so dW (~5e-5) is a fraction of a bf16 ulp of the base (~0.05):
 * some merged elements change, others round back; -0 planted in A. The fold brings down its four
 * sums per adapted matrix, nothing else. */
static void test_fold(void **state)
{
    (void)state;
    for (td_format base : {TD_BF16, TD_F16})
        for (int rank : {1, 4}) {
            td_model *m = tiny_model(0);
            td_round_row(base, m->owned, m->owned, m->owned_floats, TD_SATFINITE);
            td_lora *lo = td_lora_new(&m->cfg, rank, 2.0 * rank, (1u << TD_LORA_NMOD) - 1);
            size_t na = 0;
            for (int i = 0; i < m->cfg.num_layers * TD_LORA_NMOD; i++)
                if (lo->pairs[i].a) na += (size_t)(lo->pairs[i].in + lo->pairs[i].out) * rank;
            for (size_t i = 0; i < na; i++) lo->owned[i] = (float)(0.005 * td_rng_normal(&RNG));
            lo->owned[1] = -0.0f;
            float *dm = (float *)GPU->alloc(m->owned_floats * 4), *dl = (float *)GPU->alloc(na * 4);
            GPU->upload(dm, m->owned, m->owned_floats * 4);
            GPU->upload(dl, lo->owned, na * 4);
            td_ops cpu, gpu;
            td_ops_init(&cpu, &td_backend_cpu);
            td_ops_init(&gpu, GPU);
            const char *names[] = {"bf16-infer", "fp16-infer", "bf16-train", "fp32"};
            for (const char *name : names)
                for (int f32 = 0; f32 < 2; f32++) {
                    const td_recipe *r = td_recipe_find_preset(name);
                    td_recipe_state ref, st;
                    memset(&ref, 0, sizeof ref);
                    memset(&st, 0, sizeof st);
                    td_error err;
                    assert_int_equal(recipe_state_set(&ref, &cpu, m, r, lo, TD_LORA_MERGED, 8, f32, &err), 0);
                    m->owned_dev = dm;
                    m->owned_host_current = 1;
                    lo->owned_dev = dl;
                    GPU->alias(m->owned, dm, m->owned_floats * 4, TD_F32);
                    size_t d2h0 = td_cuda_d2h_bytes();
                    assert_int_equal(recipe_state_set(&st, &gpu, m, r, lo, TD_LORA_MERGED, 8, f32, &err), 0);
                    size_t d2h = td_cuda_d2h_bytes() - d2h0;
                    printf("fold: %s base, rank %d, %s, %s copies: survival %.6g aligned %.6g changed %lld of %lld, "
                           "%zu bytes device -> host\n", td_format_info(base)->name, rank, name,
                           f32 ? "fp32" : "storage-dtype", ref.merge.survival, ref.merge.aligned,
                           (long long)ref.merge.changed, (long long)ref.merge.elements, d2h);
                    compare_states(&st, &ref, m);
                    assert_true(st.merge.merged && ref.merge.merged);
                    assert_memory_equal(&st.merge.survival, &ref.merge.survival, sizeof(double));
                    assert_memory_equal(&st.merge.aligned, &ref.merge.aligned, sizeof(double));
                    assert_int_equal(st.merge.changed, ref.merge.changed);
                    assert_int_equal(st.merge.elements, ref.merge.elements);
                    assert_true(d2h == (size_t)m->cfg.num_layers * TD_LORA_NMOD * 4 * sizeof(double));
                    /* not a comparison of unchanged weights: part of the update survives */
                    assert_true(ref.merge.changed > 0 && ref.merge.survival > 0);
                    recipe_state_free(&st);
                    GPU->release(m->owned);
                    m->owned_dev = NULL;
                    m->owned_host_current = 0;
                    lo->owned_dev = NULL;
                    recipe_state_free(&ref);
                }
            td_lora_free(lo);
            GPU->free(dl);
            GPU->free(dm);
            td_model_free(m);
        }
}

/* tidal-rl's --lora-sync merge-unmerge on the device (be->lora_peft_sync / lora_drift,
 * lora_sync.cu) against PEFT's host arithmetic (td_lora_peft_delta / merge / unmerge, lora_peft.c)
 * and sync.c's sums in their order (each row in double, the rows in order: written out here), bit
 * for bit over 3 cycles: the drifted base, the engine's matrix, the four merge sums and the three
 * drift statistics; bases bf16 and fp16 (D), the rollout's E bf16 / fp16 / fp32, ranks 1 and 4, a
 * 37 x 53 matrix with -0 and fp16's largest value (65504) planted, a large delta in row 0. */
static void test_peft_sync(void **state)
{
    (void)state;
    const int N = 37, K = 53;
    for (td_format D : {TD_BF16, TD_F16})
        for (td_format E : {TD_BF16, TD_F16, TD_F32})
            for (int rank : {1, 4}) {
                td_lora_pair p;
                memset(&p, 0, sizeof p);
                p.out = N;
                p.in = K;
                std::vector<float> a = sim_normal(&RNG, (size_t)rank * K, 0.01), b = sim_normal(&RNG, (size_t)N * rank, 0.01);
                std::vector<float> w = sim_normal(&RNG, (size_t)N * K, 0.05), w0, m((size_t)N * K, 0.0f);
                w[5] = -0.0f;
                w[6] = 65504.0f;
                b[0] = 3.0f;   /* a large delta in row 0 */
                td_round_row(D, w.data(), w.data(), w.size(), TD_SATFINITE);
                w0 = w;
                p.a = a.data();
                p.b = b.data();
                td_lora lo;
                memset(&lo, 0, sizeof lo);
                lo.rank = rank;
                lo.scale = 2.0f;
                float *dw = (float *)GPU->alloc(w.size() * 4), *dm = (float *)GPU->alloc(w.size() * 4);
                float *dw0 = (float *)GPU->alloc(w.size() * 4), *da = (float *)GPU->alloc(a.size() * 4);
                float *db = (float *)GPU->alloc(b.size() * 4);
                GPU->upload(dw, w.data(), w.size() * 4);
                GPU->upload(dw0, w.data(), w.size() * 4);
                GPU->upload(da, a.data(), a.size() * 4);
                GPU->upload(db, b.data(), b.size() * 4);
                size_t n = w.size();
                for (int cycle = 0; cycle < 3; cycle++) {
                    std::vector<float> delta(n), pm(n), pw(n);
                    td_lora_peft_delta(&lo, &p, delta.data());
                    m = w;
                    td_lora_peft_merge(D, m.data(), delta.data(), n);
                    td_round_row(E, m.data(), pm.data(), n, TD_SATFINITE);
                    td_round_row(E, w.data(), pw.data(), n, TD_SATFINITE);
                    double want[4] = {0, 0, 0, 0}, got[4];
                    for (int r = 0; r < N; r++) {
                        double k2 = 0, d2 = 0, dot = 0;
                        for (int j = r * K; j < (r + 1) * K; j++) {
                            double d = (double)pm[j] - pw[j];
                            k2 += d * d;
                            d2 += (double)delta[j] * delta[j];
                            dot += d * delta[j];
                            want[3] += pm[j] != pw[j];
                        }
                        want[0] += k2;
                        want[1] += d2;
                        want[2] += dot;
                    }
                    w = m;
                    td_lora_peft_unmerge(D, TD_PEFT_UNMERGE_ROUNDED, w.data(), delta.data(), n);
                    GPU->lora_peft_sync(dw, dm, da, db, N, K, rank, lo.scale, D, E, got);
                    std::vector<float> gw(n), gm(n);
                    GPU->sync();
                    GPU->download(gw.data(), dw, n * 4);
                    GPU->download(gm.data(), dm, n * 4);
                    assert_memory_equal(gm.data(), m.data(), n * 4);
                    assert_memory_equal(gw.data(), w.data(), n * 4);
                    assert_memory_equal(got, want, sizeof want);
                    /* the drift against W_0 */
                    double dwant[3] = {0, 0, 0}, dgot[3];
                    for (int r = 0; r < N; r++) {
                        double row = 0;
                        for (int j = r * K; j < (r + 1) * K; j++) {
                            double d = fabs((double)w[j] - w0[j]);
                            dwant[0] = fmax(dwant[0], d);
                            row += d;
                            dwant[2] += w[j] != w0[j];
                        }
                        dwant[1] += row;
                    }
                    GPU->lora_drift(dw, dw0, N, K, dgot);
                    assert_memory_equal(dgot, dwant, sizeof dwant);
                    if (cycle == 2)
                        printf("merge-unmerge D %s E %s rank %d, 3 cycles: engine, base, sums bit-identical; changed %g "
                               "of %zu, drift max %.3g mean %.3g changed %g\n", td_format_info(D)->name,
                               td_format_info(E)->name, rank, want[3], n, dwant[0], dwant[1] / n, dwant[2]);
                    assert_true(want[3] > 0 && dwant[2] > 0);
                }
                GPU->free(dw); GPU->free(dm); GPU->free(dw0); GPU->free(da); GPU->free(db);
            }
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261126);
    GPU = sim_open_gpu();
    return GPU ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_recipes),
        cmocka_unit_test(test_fold),
        cmocka_unit_test(test_peft_sync),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
