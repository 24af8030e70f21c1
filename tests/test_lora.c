/* tidal — tests of LoRA adapters (src/model/lora*.c, include/tidal/lora.h).
 *
 * 1. Loading: an adapter written by td_lora_init_random loads with the right rank, scale
 *    (alpha/r; alpha/sqrt(r) with use_rslora) and values (re-drawn from the same seeded stream,
 *    exact: the file is F32); target_modules as a list, a regex string, "all-linear";
 *    layers_to_transform.
 * 2. Bad adapters: wrong shape, missing tensor, tensor of a module the config does not target,
 *    unknown target module, unknown tensor name, and each unsupported option (fan_in_fan_out,
 *    use_dora, bias, modules_to_save, peft_type) give an error naming the file and the tensor
 *    or key.
 * 3. Merge and unmerged agree in fp32: log-probs of the teacher-forced path with the adapter
 *    merged and unmerged agree within 1e-5 (the same maths, summation order only), and differ
 *    from the base model by far more (the adapter does something); survival is 1 within 1e-3
 *    in fp32 (the only loss is fp32 rounding of W + dW). On a bf16 checkpoint merged in bf16, an
 *    update of std 1e-6 (four orders below half an ulp of weights ~0.02) survives < 5%; one
 *    of std 0.05 survives within 2% of 1.
 * 4. vLLM's native adapter form (TD_LORA_PUNICA) against a scalar transcription of the Punica
 *    Triton kernels (vllm/lora/ops/triton_ops/kernel_utils.py: do_shrink_kernel, do_expand_kernel,
 *    after LoRALayerWeights.optimize() folded the scaling into lora_b), bf16-infer, rank 2:
 *      A_e = bf16(A), B_e = bf16(bf16(B) * scale)
 *      buf = fp32 sum_k x_k A_e[r][k]          (tl.dot, fp32 accumulator, fp32 buffer, scale 1)
 *      acc = fp32 sum_r bf16(buf_r) B_e[o][r]  (CAST_TYPE: buffer to the lora dtype; tl.dot)
 *      y   = bf16(y + bf16(acc))               (accumulator.to(lora dtype); ADD_INPUTS)
 *    x and A are multiples of 2^-6 below 1 with 3 significant bits, so every product and partial
 *    sum of the shrink is exact in fp32 and the kernel's unspecified summation order cannot
 *    matter: the result must be bit for bit the transcription's, for scale 2 (where it also
 *    equals PEFT's unmerged form) and scale 1.5 (alpha 3, r 2: the folded B rounds differently
 *    from PEFT's bf16(scale * u), and at least one output differs from that form).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/checkpoint.h"
#include "tidal/io.h"
#include "tidal/lora.h"
#include "tidal/model.h"
#include "tidal/rng.h"
#include "ckpt_testutil.h"
#include "../src/model/model_internal.h"

#include <math.h>

static td_config tiny_cfg(void)
{
    td_config c;
    td_config_defaults(&c, TD_ARCH_LLAMA);
    assert_int_equal(td_config_preset("tiny", &c), 0);
    return c;
}

/* Replaces (or with value NULL removes) one key of DIR/adapter_config.json. */
static void edit_config(const char *dir, const char *key, json_t *value)
{
    char path[512];
    path_join(path, sizeof path, dir, "adapter_config.json");
    td_error err;
    json_t *o = td_json_load_file(path, &err);
    assert_non_null(o);
    if (value) json_object_set_new(o, key, value);
    else json_object_del(o, key);
    assert_int_equal(json_dump_file(o, path, JSON_INDENT(2)), 0);
    json_decref(o);
}

static unsigned all_modules(void) { return (1u << TD_LORA_NMOD) - 1; }

static void test_load_good(void **state)
{
    (void)state;
    td_config c = tiny_cfg();
    char *dir = make_tmpdir();
    td_error err;
    assert_int_equal(td_lora_init_random(dir, &c, 4, 8.0, all_modules(), 0.02, 9, "base", "test", &err), 0);
    td_lora *lo = td_lora_load(dir, &c, &err);
    if (!lo) fail_msg("%s", err.msg);
    assert_int_equal(lo->rank, 4);
    assert_true(lo->scale == 2.0f);
    assert_int_equal(lo->n_adapted, c.num_layers * TD_LORA_NMOD);
    /* tensor 0 is layer 0 q_proj lora_A (r, C): the stream of seed 9, index 0 */
    const td_lora_pair *q = &lo->pairs[0];
    assert_int_equal(q->in, c.hidden_size);
    assert_int_equal(q->out, c.num_heads * c.head_dim);
    td_rng r;
    td_rng_stream(&r, 9, 0);
    for (int i = 0; i < 4 * c.hidden_size; i++) assert_true(q->a[i] == (float)(0.02 * td_rng_normal(&r)));
    /* down_proj B is (C, r) */
    const td_lora_pair *d = &lo->pairs[TD_LORA_DOWN];
    assert_int_equal(d->out, c.hidden_size);
    assert_int_equal(d->in, c.intermediate_size);
    td_lora_free(lo);

    edit_config(dir, "use_rslora", json_true());   /* alpha / sqrt(r) = 8 / 2 */
    lo = td_lora_load(dir, &c, &err);
    assert_non_null(lo);
    assert_true(lo->scale == 4.0f);
    td_lora_free(lo);

    edit_config(dir, "target_modules", json_string("all-linear"));
    lo = td_lora_load(dir, &c, &err);
    assert_non_null(lo);
    assert_int_equal(lo->modules, all_modules());
    td_lora_free(lo);
    rm_tree(dir);

    /* only q and v, selected by a regex string (PEFT: re.fullmatch on the module name) and a
     * list with a dotted suffix; layers_to_transform keeps layer 1 only */
    dir = make_tmpdir();
    unsigned qv = 1u << TD_LORA_Q | 1u << TD_LORA_V;
    assert_int_equal(td_lora_init_random(dir, &c, 2, 4.0, qv, 0.02, 1, NULL, "test", &err), 0);
    edit_config(dir, "target_modules", json_string(".*\\.(q_proj|v_proj)"));
    lo = td_lora_load(dir, &c, &err);
    if (!lo) fail_msg("%s", err.msg);
    assert_int_equal(lo->modules, qv);
    assert_null(lo->pairs[TD_LORA_K].a);
    td_lora_free(lo);
    edit_config(dir, "target_modules", json_pack("[ss]", "self_attn.q_proj", "v_proj"));
    lo = td_lora_load(dir, &c, &err);
    assert_non_null(lo);
    td_lora_free(lo);
    edit_config(dir, "layers_to_transform", json_integer(1));
    lo = td_lora_load(dir, &c, &err);   /* the file still holds layer 0's tensors */
    assert_null(lo);
    assert_true(contains_all(err.msg, "adapter_model.safetensors", "layers.0.self_attn.q_proj.lora_A.weight",
                             "do not select", NULL));
    rm_tree(dir);
}

/* An adapter for the tiny config with one given error; returns its directory. */
static char *adapter(const td_config *c, unsigned modules)
{
    char *dir = make_tmpdir();
    td_error err;
    assert_int_equal(td_lora_init_random(dir, c, 4, 8.0, modules, 0.02, 3, NULL, "test", &err), 0);
    return dir;
}

static void expect_error(const char *dir, const td_config *c, const char *a, const char *b)
{
    td_error err;
    td_lora *lo = td_lora_load(dir, c, &err);
    if (lo) fail_msg("adapter in %s loaded; expected an error with \"%s\"", dir, a);
    printf("  error: %s\n", err.msg);
    assert_true(contains_all(err.msg, a, b, NULL));
}

static void test_bad_adapters(void **state)
{
    (void)state;
    td_config c = tiny_cfg();
    unsigned qv = 1u << TD_LORA_Q | 1u << TD_LORA_V;
    char *dir;

    dir = adapter(&c, qv);   /* r in the config != r of the tensors */
    edit_config(dir, "r", json_integer(8));
    expect_error(dir, &c, "adapter_model.safetensors", "layers.0.self_attn.q_proj.lora_A.weight");
    rm_tree(dir);

    dir = adapter(&c, qv);   /* a model of another width */
    td_config wide = c;
    wide.hidden_size = 128;
    wide.head_dim = 32;
    expect_error(dir, &wide, "adapter_model.safetensors", "lora_A.weight");
    rm_tree(dir);

    dir = adapter(&c, qv);   /* config targets k_proj too: its tensors are missing */
    edit_config(dir, "target_modules", json_pack("[sss]", "q_proj", "k_proj", "v_proj"));
    expect_error(dir, &c, "layers.0.self_attn.k_proj.lora_A.weight", "is missing");
    rm_tree(dir);

    dir = adapter(&c, qv);   /* config targets q only: v's tensors are unexpected */
    edit_config(dir, "target_modules", json_pack("[s]", "q_proj"));
    expect_error(dir, &c, "v_proj", "do not select");
    rm_tree(dir);

    dir = adapter(&c, qv);   /* a target tidal cannot adapt */
    edit_config(dir, "target_modules", json_pack("[ss]", "q_proj", "lm_head"));
    expect_error(dir, &c, "adapter_config.json", "\"lm_head\"");
    rm_tree(dir);

    dir = adapter(&c, qv);   /* a regex that matches nothing */
    edit_config(dir, "target_modules", json_string("q_proj"));
    expect_error(dir, &c, "adapter_config.json", "matches no projection");
    rm_tree(dir);

    struct { const char *key; json_t *(*value)(void); const char *msg; } opts[] = {
        {"fan_in_fan_out", json_true, "fan_in_fan_out"},
        {"use_dora", json_true, "use_dora"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        dir = adapter(&c, qv);
        edit_config(dir, opts[i].key, opts[i].value());
        expect_error(dir, &c, "adapter_config.json", opts[i].msg);
        rm_tree(dir);
    }
    dir = adapter(&c, qv);
    edit_config(dir, "bias", json_string("lora_only"));
    expect_error(dir, &c, "adapter_config.json", "\"bias\" is lora_only");
    rm_tree(dir);
    dir = adapter(&c, qv);
    edit_config(dir, "modules_to_save", json_pack("[s]", "lm_head"));
    expect_error(dir, &c, "adapter_config.json", "modules_to_save");
    rm_tree(dir);
    dir = adapter(&c, qv);
    edit_config(dir, "peft_type", json_string("PREFIX_TUNING"));
    expect_error(dir, &c, "adapter_config.json", "PREFIX_TUNING");
    rm_tree(dir);
    dir = adapter(&c, qv);
    edit_config(dir, "r", json_string("8"));
    expect_error(dir, &c, "adapter_config.json", "\"r\"");
    rm_tree(dir);

    /* a tensor of an unknown module (hand-built file: lm_head's A and B) */
    dir = make_tmpdir();
    char path[512];
    path_join(path, sizeof path, dir, "adapter_config.json");
    write_text(path, "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 1, \"target_modules\": [\"q_proj\"]}");
    path_join(path, sizeof path, dir, "adapter_model.safetensors");
    float zeros[2] = {0, 0};
    write_safetensors(path, "{\"base_model.model.lm_head.lora_A.weight\": {\"dtype\": \"F32\", \"shape\": [1, 2], "
                            "\"data_offsets\": [0, 8]}}", zeros, sizeof zeros);
    expect_error(dir, &c, "adapter_model.safetensors", "\"base_model.model.lm_head.lora_A.weight\"");
    rm_tree(dir);

    /* no such directory */
    expect_error("/nonexistent/adapter", &c, "/nonexistent/adapter/adapter_config.json", "");
}

/* Log-probs of 2 fixed sequences under the teacher-forced path. */
static void logprobs(const td_model *m, const td_recipe *r, const td_lora *lo, int merged, float out[2][15],
                     td_lora_merge_stats *st)
{
    td_error err;
    td_forward *f = td_forward_create(m, 64, 16, 0, &err);
    assert_non_null(f);
    if (td_forward_set_recipe_lora(f, r, lo, merged, &err)) fail_msg("%s", err.msg);
    int s0[16], s1[12];
    for (int i = 0; i < 16; i++) s0[i] = (i * 37 + 5) % m->cfg.vocab_size;
    for (int i = 0; i < 12; i++) s1[i] = (i * 91 + 11) % m->cfg.vocab_size;
    const int *toks[2] = {s0, s1};
    int lens[2] = {16, 12};
    float *lp[2] = {out[0], out[1]};
    assert_int_equal(td_forward_logprobs(f, 2, toks, lens, lp, NULL, NULL, &err), 0);
    if (st) *st = td_forward_lora_stats(f);
    td_forward_free(f);
}

static void test_merge_vs_unmerged(void **state)
{
    (void)state;
    td_config c = tiny_cfg();
    td_error err;
    char *mdir = make_tmpdir(), *adir = make_tmpdir();
    assert_int_equal(td_checkpoint_init_random(mdir, &c, TD_DT_F32, 5, "test", NULL, &err), 0);
    assert_int_equal(td_lora_init_random(adir, &c, 8, 16.0, all_modules(), 0.05, 2, NULL, "test", &err), 0);
    td_model *m = td_model_load(mdir, &err);
    assert_non_null(m);
    td_lora *lo = td_lora_load(adir, &c, &err);
    assert_non_null(lo);
    const td_recipe *fp32 = td_recipe_find_preset("fp32");
    float base[2][15], un[2][15], mg[2][15];
    td_lora_merge_stats st, st0;
    logprobs(m, fp32, NULL, 0, base, &st0);
    logprobs(m, fp32, lo, 0, un, NULL);
    logprobs(m, fp32, lo, 1, mg, &st);
    assert_int_equal(st0.merged, 0);
    assert_int_equal(st.merged, 1);
    double dmax = 0, moved = 0;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < (s ? 11 : 15); t++) {
            dmax = fmax(dmax, fabs(un[s][t] - mg[s][t]));
            moved = fmax(moved, fabs(un[s][t] - base[s][t]));
        }
    printf("fp32: merged vs unmerged max |dlogp| %.2e, adapter moves log-probs by up to %.3f, survival %.6f\n",
           dmax, moved, st.survival);
    assert_true(dmax <= 1e-5);
    assert_true(moved > 1e-2);
    assert_true(fabs(st.survival - 1) < 1e-3 && st.changed_frac > 0.99);

    /* bf16 unmerged runs (LoRA branch in bf16) and stays near the fp32 unmerged result */
    float bf[2][15];
    logprobs(m, td_recipe_find_preset("bf16-train"), lo, 0, bf, NULL);
    double dbf = 0;
    for (int t = 0; t < 15; t++) dbf = fmax(dbf, fabs(bf[0][t] - un[0][t]));
    assert_true(dbf < 0.1 && dbf > 0);
    td_lora_free(lo);
    td_model_free(m);
    rm_tree(mdir);
    rm_tree(adir);
}

static void test_survival_bf16(void **state)
{
    (void)state;
    td_config c = tiny_cfg();
    td_error err;
    char *mdir = make_tmpdir();
    /* a bf16 checkpoint: the weights are on the bf16 grid, as a rollout engine holds them */
    assert_int_equal(td_checkpoint_init_random(mdir, &c, TD_DT_BF16, 5, "test", NULL, &err), 0);
    td_model *m = td_model_load(mdir, &err);
    assert_non_null(m);
    const td_recipe *bf16 = td_recipe_find_preset("bf16-infer");
    double stds[2] = {1e-6, 0.05};
    double surv[2];
    for (int i = 0; i < 2; i++) {
        char *adir = make_tmpdir();
        assert_int_equal(td_lora_init_random(adir, &c, 8, 16.0, all_modules(), stds[i], 2, NULL, "test", &err), 0);
        td_lora *lo = td_lora_load(adir, &c, &err);
        assert_non_null(lo);
        float lp[2][15];
        td_lora_merge_stats st;
        logprobs(m, bf16, lo, 1, lp, &st);
        printf("bf16 merge, lora std %g: survival %.4f, changed %.4f, aligned %.4f\n", stds[i], st.survival,
               st.changed_frac, st.aligned);
        surv[i] = st.survival;
        td_lora_free(lo);
        rm_tree(adir);
    }
    assert_true(surv[0] < 0.05);
    assert_true(fabs(surv[1] - 1) < 0.02);
    td_model_free(m);
    rm_tree(mdir);
}

/* a multiple of 2^-6 in (-1, 1) with at most 3 significant bits */
static float dyadic(td_rng *r)
{
    int m = (int)td_rng_below(r, 8), e = (int)td_rng_below(r, 4);   /* m * 2^(e-6), m < 8 */
    float v = (float)m * ldexpf(1.0f, e - 6);
    return td_rng_below(r, 2) ? -v : v;
}

/* y (N, out) of layer 0's o_proj LoRA branch added to y_base, as lora_forward runs it */
static void run_branch(const td_lora *lo, const td_recipe *rec, int mode, const float *x, const float *y0, int N,
                       float *y)
{
    const td_lora_pair *p = &lo->pairs[TD_LORA_O];
    td_ops ops;
    td_ops_init(&ops, &td_backend_cpu);
    ops.recipe = rec;
    ops.qin = td_xmalloc((size_t)N * (p->in > lo->rank ? p->in : lo->rank) * sizeof(float));
    lora_rt *rt = lora_rt_create(lo, rec, N, mode == TD_LORA_PUNICA, &td_backend_cpu);
    ops.lora = rt;
    memcpy(y, y0, (size_t)N * p->out * sizeof(float));
    lora_forward(&ops, 0, TD_LORA_O, y, x, N);
    lora_rt_free(rt);
    free(ops.qin);
}

static void test_punica_kernel(void **state)
{
    (void)state;
    td_config c = tiny_cfg();
    const td_recipe *rec = td_recipe_find_preset("bf16-infer");
    const int N = 5, R = 2;
    double alphas[2] = {4.0, 3.0};   /* scale 2 and 1.5 */
    for (int ai = 0; ai < 2; ai++) {
        td_lora *lo = td_lora_new(&c, R, alphas[ai], 1u << TD_LORA_O);
        td_lora_pair *p = &lo->pairs[TD_LORA_O];
        int in = p->in, out = p->out;
        td_rng rng;
        td_rng_stream(&rng, 11, (uint64_t)ai);
        float *a = (float *)p->a, *b = (float *)p->b;
        for (int i = 0; i < R * in; i++) a[i] = dyadic(&rng);
        for (int i = 0; i < out * R; i++) b[i] = (float)(td_rng_normal(&rng) * 0.3);   /* full fp32 mantissas */
        float *x = td_xmalloc((size_t)N * in * sizeof(float)), *y0 = td_xmalloc((size_t)N * out * sizeof(float));
        for (int i = 0; i < N * in; i++) x[i] = dyadic(&rng);
        for (int i = 0; i < N * out; i++) y0[i] = td_round(TD_BF16, (float)td_rng_normal(&rng));
        float *yk = td_xmalloc((size_t)N * out * sizeof(float)), *yp = td_xmalloc((size_t)N * out * sizeof(float));
        float *ref = td_xmalloc((size_t)N * out * sizeof(float));
        run_branch(lo, rec, TD_LORA_PUNICA, x, y0, N, yk);
        run_branch(lo, rec, TD_LORA_UNMERGED, x, y0, N, yp);
        /* the transcription */
        for (int n = 0; n < N; n++) {
            float t[2];
            for (int r = 0; r < R; r++) {
                float buf = 0.0f;
                for (int k = 0; k < in; k++) buf += x[(size_t)n * in + k] * td_round(TD_BF16, a[(size_t)r * in + k]);
                t[r] = td_round(TD_BF16, buf * 1.0f);
            }
            for (int o = 0; o < out; o++) {
                float acc = 0.0f;
                for (int r = 0; r < R; r++)
                    acc += t[r] * td_round(TD_BF16, td_round(TD_BF16, b[(size_t)o * R + r]) * lo->scale);
                ref[(size_t)n * out + o] = td_round(TD_BF16, y0[(size_t)n * out + o] + td_round(TD_BF16, acc));
            }
        }
        int same = 0, peft_differs = 0, moved = 0;
        for (int i = 0; i < N * out; i++) {
            same += !memcmp(&yk[i], &ref[i], sizeof(float));
            peft_differs += yp[i] != yk[i];
            moved += yk[i] != y0[i];
        }
        printf("punica form, scale %.2f: %d/%d outputs bit-identical to the kernel transcription, %d differ from "
               "PEFT's unmerged form, %d moved by the branch\n", lo->scale, same, N * out, peft_differs, moved);
        assert_int_equal(same, N * out);
        assert_true(moved > N * out / 2);
        if (ai == 0) assert_int_equal(peft_differs, 0);
        else assert_true(peft_differs > 0);
        free(x); free(y0); free(yk); free(yp); free(ref);
        td_lora_free(lo);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_good),
        cmocka_unit_test(test_bad_adapters),
        cmocka_unit_test(test_merge_vs_unmerged),
        cmocka_unit_test(test_survival_bf16),
        cmocka_unit_test(test_punica_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
