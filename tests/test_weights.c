/* Weights in their storage dtype (src/model/load.c, weights_recipe.c, src/backend/cpu_wmat.c):
 *   - a bf16 checkpoint's matrices, embedding and lm_head are the checkpoint's mapped bytes, and
 *     bf16 / fp32 recipes share them (no copy: the recipe state's copies are the norms only);
 *   - an FP8 recipe copies the GEMM matrices as 1-byte codes + block scales (bytes counted exactly),
 *     and shares the embedding and lm_head (kept out of FP8, bf16 already);
 *   - an fp16 checkpoint under a bf16 recipe is copied as 2-byte bf16 codes;
 *   - the bits: log-probs (teacher-forced) and decode rows (KV-cache session) of the bf16-stored
 *     model equal, bit for bit, those of the same values held in fp32 (td_model_alloc filled
 *     through td_model_param_f32) with fp32 copies of the recipe's roundings (the trainer's
 *     preparation, forward_keep_activations): widening per GEMM tile changes no result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/checkpoint.h"
#include "tidal/model.h"
#include "tidal/gemm.h"
#include "tidal/scaling.h"
#include "../src/model/model_internal.h"
#include "testutil.h"

static td_config shape(td_arch arch)
{
    td_config c;
    td_config_defaults(&c, arch);
    td_config_preset("tiny", &c);
    c.hidden_size = 128;           /* GEMMs of several 128-row tiles, fp8 blocks partial */
    c.intermediate_size = 384;
    c.vocab_size = 1000;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    return c;
}

static td_model *write_load(const char *name, const td_config *c, td_dtype dt)
{
    char dir[128];
    test_path(dir, sizeof dir, name);
    td_error err;
    if (td_checkpoint_init_random(dir, c, dt, 7, "test_weights", NULL, &err)) fail_msg("%s", err.msg);
    td_model *m = td_model_load(dir, &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static int big(const td_param_spec *p) { return p->kind == TD_PARAM_EMBED || p->kind == TD_PARAM_MATRIX; }

/* The wmat of table entry p in a recipe state (the lm_head of a tied model: ws.lm_head). */
static const td_wmat *state_wmat(const td_recipe_state *rs, const td_param_spec *p)
{
    if (p->role == TD_ROLE_EMBED) return &rs->ws.embed;
    if (p->role == TD_ROLE_LM_HEAD) return &rs->ws.lm_head;
    return wset_mat(&rs->ws, p->layer, param_lora_module(p->role));
}

static size_t small_bytes(const td_param_spec *s, size_t n)
{
    size_t b = 0;
    for (size_t i = 0; i < n; i++) if (!big(&s[i])) b += s[i].numel * sizeof(float);
    return b;
}

static void shares_bf16(td_arch arch)
{
    td_config c = shape(arch);
    td_model *m = write_load(arch == TD_ARCH_QWEN3 ? "q3-bf16" : "q2-bf16", &c, TD_DT_BF16);
    size_t n;
    td_param_spec *s = param_table(&c, &n);
    /* the loader: matrices, embedding, lm_head mapped in bf16; only the small tensors widened */
    size_t small = 0;
    for (size_t i = 0; i < n; i++) {
        const td_tensor *t = td_checkpoint_find(m->ck, s[i].name);
        if (big(&s[i])) {
            assert_int_equal(m->store->t[i].dtype, TD_BF16);
            assert_ptr_equal(m->store->t[i].data, t->data);
            assert_null(*param_slot(&m->w, c.num_layers, &s[i]));
        } else {
            small += s[i].numel;
        }
    }
    assert_int_equal(m->owned_floats, small);
    td_error err;
    td_forward *f = td_forward_create(m, 64, 32, 0, &err);
    td_session *ss = td_session_create(m, 2, 32, 0, &err);
    assert_non_null(f);
    assert_non_null(ss);
    const char *shared[] = {"fp32", "bf16-train", "bf16-infer"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(shared[k]), &err), 0);
        assert_int_equal(td_session_set_recipe(ss, td_recipe_find_preset(shared[k]), &err), 0);
        const td_recipe_state *rs[2] = {forward_recipe_state(f), session_recipe_state(ss)};
        for (int p = 0; p < 2; p++) {
            for (size_t i = 0; i < n; i++)
                if (big(&s[i])) assert_ptr_equal(state_wmat(rs[p], &s[i])->data, m->store->t[i].data);
            if (c.tie_word_embeddings) assert_ptr_equal(rs[p]->ws.lm_head.data, rs[p]->ws.embed.data);
            assert_int_equal(rs[p]->bytes[TD_BF16] + rs[p]->bytes[TD_E4M3] + rs[p]->bytes[TD_F16], 0);
            /* fp32: nothing copied at all; bf16: the norms and biases, rounded, in fp32 */
            assert_int_equal(rs[p]->bytes[TD_F32], k == 0 ? 0 : small_bytes(s, n));
        }
    }
    /* fp8-rollout: every GEMM matrix as codes + 128x128 block scales, 1 byte per weight */
    const td_recipe *fp8 = td_recipe_find_preset("fp8-rollout");
    assert_int_equal(td_session_set_recipe(ss, fp8, &err), 0);
    const td_recipe_state *rs = session_recipe_state(ss);
    td_fp8_scheme sch = fp8->weight_scaling;
    sch.fmt = fp8->weights;
    size_t want = 0;
    for (size_t i = 0; i < n; i++) {
        if (!big(&s[i])) continue;
        const td_wmat *w = state_wmat(rs, &s[i]);
        if (s[i].kind == TD_PARAM_MATRIX && s[i].role != TD_ROLE_LM_HEAD) {
            assert_int_equal(w->dtype, TD_E4M3);
            /* in panels of 8 rows where the CPU backend's panel kernel is the one that runs
             * (test_same_bits_as_fp32 then compares that kernel's log-probs with the fp32 copies') */
            assert_int_equal(w->panels, td_gemm_fp8_panels_preferred(TD_E4M3, w->sr, w->sc, fp8->promote_every));
            size_t rows = (size_t)s[i].shape[0], codes = w->panels ? (rows + 7) / 8 * 8 * (size_t)s[i].shape[1] : s[i].numel;
            want += codes + td_fp8_num_scales(&sch, rows, (size_t)s[i].shape[1]) * sizeof(float);
        } else {   /* embedding, lm_head: bf16, the checkpoint's */
            assert_ptr_equal(w->data, m->store->t[i].data);
        }
    }
    assert_int_equal(rs->bytes[TD_E4M3], want);
    assert_int_equal(rs->bytes[TD_BF16], 0);
    td_forward_free(f);
    td_session_free(ss);
    free(s);
    td_model_free(m);
}

static void test_shares_bf16_qwen2(void **state) { (void)state; shares_bf16(TD_ARCH_QWEN2); }
static void test_shares_bf16_qwen3_tied(void **state) { (void)state; shares_bf16(TD_ARCH_QWEN3); }

static void test_f16_under_bf16_copies_2_bytes(void **state)
{
    (void)state;
    td_config c = shape(TD_ARCH_LLAMA);
    td_model *m = write_load("llama-f16", &c, TD_DT_F16);
    size_t n, want = 0;
    td_param_spec *s = param_table(&c, &n);
    for (size_t i = 0; i < n; i++) if (big(&s[i])) want += 2 * s[i].numel;
    td_error err;
    td_forward *f = td_forward_create(m, 64, 32, 0, &err);
    assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset("bf16-train"), &err), 0);
    const td_recipe_state *rs = forward_recipe_state(f);
    assert_int_equal(rs->bytes[TD_BF16], want);
    for (size_t i = 0; i < n; i++) if (big(&s[i])) assert_int_equal(state_wmat(rs, &s[i])->dtype, TD_BF16);
    /* fp16 recipes share the fp16 checkpoint */
    assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset("fp16-train"), &err), 0);
    assert_int_equal(rs->bytes[TD_BF16] + rs->bytes[TD_F16] + rs->bytes[TD_E4M3], 0);
    td_forward_free(f);
    free(s);
    td_model_free(m);
}

/* The same values in fp32 (as the loader kept them before: every tensor widened). */
static td_model *widened(const td_model *m)
{
    td_error err;
    td_model *w = td_model_alloc(&m->cfg, &err);
    size_t n;
    td_param_spec *s = param_table(&m->cfg, &n);
    for (size_t i = 0; i < n; i++) td_model_param_f32(m, i, w->owned + s[i].offset);
    free(s);
    return w;
}

enum { NSEQ = 3, T = 20, STEPS = 4 };

static void logprobs(const td_model *m, const char *recipe, int f32_copies, float out[NSEQ][T])
{
    td_error err;
    td_forward *f = td_forward_create(m, NSEQ * T, T, 0, &err);
    if (f32_copies) forward_keep_activations(f, 1);
    assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(recipe), &err), 0);
    int tok[NSEQ][T], lens[NSEQ] = {T, T - 7, T - 3};
    const int *tp[NSEQ];
    float *lp[NSEQ];
    for (int q = 0; q < NSEQ; q++) {
        for (int t = 0; t < T; t++) tok[q][t] = (q * 131 + t * 37 + 5) % m->cfg.vocab_size;
        tp[q] = tok[q];
        lp[q] = out[q];
        memset(out[q], 0, sizeof out[q]);
    }
    assert_int_equal(td_forward_logprobs(f, NSEQ, tp, lens, lp, NULL, NULL, &err), 0);
    td_forward_free(f);
}

static void decode_rows(const td_model *m, const char *recipe, float *rows)
{
    td_error err;
    int V = m->cfg.vocab_size;
    td_session *s = td_session_create(m, 2, 32, 0, &err);
    assert_int_equal(td_session_set_recipe(s, td_recipe_find_preset(recipe), &err), 0);
    int prompt[2][5] = {{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}}, slots[2] = {0, 1};
    for (int b = 0; b < 2; b++) assert_int_equal(td_session_prefill(s, b, prompt[b], 5, rows, NULL, NULL, &err), 0);
    for (int k = 0; k < STEPS; k++) {
        int next[2] = {(k * 17 + 3) % V, (k * 29 + 11) % V};
        assert_int_equal(td_session_decode(s, 2, slots, next, rows + (size_t)k * 2 * V, &err), 0);
    }
    td_session_free(s);
}

static void test_same_bits_as_fp32(void **state)
{
    (void)state;
    td_config c = shape(TD_ARCH_QWEN2);
    td_model *m = write_load("bits-bf16", &c, TD_DT_BF16), *w = widened(m);
    const char *recipes[] = {"fp32", "bf16-train", "bf16-infer", "fp16-train", "fp8-rollout", "fp8-unified"};
    size_t V = (size_t)c.vocab_size;
    float *ra = malloc(STEPS * 2 * V * sizeof(float)), *rb = malloc(STEPS * 2 * V * sizeof(float));
    for (size_t k = 0; k < sizeof recipes / sizeof *recipes; k++) {
        static float a[NSEQ][T], b[NSEQ][T];
        logprobs(m, recipes[k], 0, a);
        logprobs(w, recipes[k], 1, b);   /* fp32 copies of the roundings, no widening */
        if (memcmp(a, b, sizeof a)) fail_msg("%s: teacher-forced log-probs differ", recipes[k]);
        decode_rows(m, recipes[k], ra);
        decode_rows(w, recipes[k], rb);
        if (memcmp(ra, rb, STEPS * 2 * V * sizeof(float))) fail_msg("%s: decode rows differ", recipes[k]);
    }
    free(ra);
    free(rb);
    td_model_free(w);
    td_model_free(m);
}

/* wmat_rows over fp8 codes in panels of 8 rows (the backend's fallback where the panel kernel
 * declines) gives the row-major codes' widened rows bit for bit: rows from inside a panel, a last
 * partial panel, rows of 4,200 codes (past the 4,096-code gather chunk), scale blocks of 16 x 128 */
static void test_panel_rows_widen_as_rows(void **state)
{
    (void)state;
    const int rows = 21, cols = 4200, sr = 16, sc = 128, nbc = (cols + sc - 1) / sc, nbr = (rows + sr - 1) / sr;
    uint8_t *codes = malloc((size_t)rows * cols), *pn = malloc((size_t)(rows + 7) / 8 * 8 * cols);
    float *scale = malloc((size_t)nbr * nbc * sizeof(float)), *a = malloc((size_t)16 * cols * sizeof(float)),
          *b = malloc((size_t)16 * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) codes[i] = (uint8_t)((i * 2654435761u) >> 13) & 0xBF;   /* no NaN */
    for (int i = 0; i < nbr * nbc; i++) scale[i] = 0x1p-8f * (float)(1 + i % 7);
    td_fp8_codes_to_panels(codes, (size_t)rows, (size_t)cols, pn);
    td_wmat wr = {.data = codes, .dtype = TD_E4M3, .scale = scale, .sr = sr, .sc = sc, .nbc = nbc};
    td_wmat wp = wr;
    wp.data = pn;
    wp.panels = 1;
    const float *ra = wmat_rows(&wr, 5, 16, cols, a), *rb = wmat_rows(&wp, 5, 16, cols, b);
    assert_memory_equal(ra, rb, (size_t)16 * cols * sizeof(float));
    free(codes); free(pn); free(scale); free(a); free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shares_bf16_qwen2),
        cmocka_unit_test(test_shares_bf16_qwen3_tied),
        cmocka_unit_test(test_f16_under_bf16_copies_2_bytes),
        cmocka_unit_test(test_same_bits_as_fp32),
        cmocka_unit_test(test_panel_rows_widen_as_rows),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
