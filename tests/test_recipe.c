/* Precision recipes (src/recipe/recipe.c):
 *  - the presets DESIGN.md requires exist, each passes td_recipe_check, and the FP8 ones have
 *    the shape the literature gives them (block-FP8 weights 128x128, 1x128 activations, fast
 *    accumulation promoted every 128 products);
 *  - td_recipe_to_json -> td_recipe_from_json gives back the identical recipe, field by field,
 *    for every preset and for a recipe with every non-default value set;
 *  - recipe files derive from a base and override fields; every bad file gives an error that
 *    names the file and the field (and line:column for invalid JSON);
 *  - an unknown preset name lists the presets. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/formats.h"
#include "tidal/recipe.h"
#include "../src/model/model_internal.h"

/* ---------------------------------------------------------------- helpers */

static void assert_scheme_equal(const td_fp8_scheme *a, const td_fp8_scheme *b)
{
    assert_int_equal(a->fmt, b->fmt);
    assert_int_equal(a->gran, b->gran);
    assert_int_equal(a->arith, b->arith);
    assert_int_equal(a->pow2, b->pow2);
    assert_int_equal(a->sat, b->sat);
    assert_int_equal(a->group, b->group);
}

/* Every field of td_recipe (the struct has padding, so no memcmp). */
static void assert_recipe_equal(const td_recipe *a, const td_recipe *b)
{
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->description, b->description);
    assert_int_equal(a->weights, b->weights);
    assert_scheme_equal(&a->weight_scaling, &b->weight_scaling);
    assert_int_equal(a->activations, b->activations);
    assert_int_equal(a->gemm_inputs, b->gemm_inputs);
    assert_scheme_equal(&a->act_scaling, &b->act_scaling);
    assert_int_equal(a->accumulate, b->accumulate);
    assert_int_equal(a->promote_every, b->promote_every);
    assert_int_equal(a->acc_fraction_bits, b->acc_fraction_bits);
    assert_int_equal(a->split_k, b->split_k);
    assert_int_equal(a->attention, b->attention);
    assert_int_equal(a->attn_block, b->attn_block);
    assert_int_equal(a->decode_splits, b->decode_splits);
    assert_int_equal(a->kv_cache, b->kv_cache);
    assert_true(a->kv_scale == b->kv_scale);      /* exact: float -> JSON double -> float */
    assert_int_equal(a->lm_head_fp32, b->lm_head_fp32);
    assert_int_equal(a->norm, b->norm);
    assert_int_equal(a->rope, b->rope);
    assert_int_equal(a->batch_invariant, b->batch_invariant);
    assert_int_equal(a->residual_fp32, b->residual_fp32);
    assert_int_equal(a->temp_in_act, b->temp_in_act);
    assert_int_equal(a->logsoftmax_act, b->logsoftmax_act);
    assert_int_equal(a->moe_fused, b->moe_fused);
}

/* to_json -> from_json -> equal struct, and the re-serialised JSON equals the first. */
static void assert_round_trips(const td_recipe *r)
{
    char *js = td_recipe_to_json(r);
    assert_non_null(js);
    td_recipe back;
    td_error err = {{0}};
    if (td_recipe_from_json(js, strlen(js), "round-trip", &back, &err)) {
        print_error("%s: %s\n", r->name, err.msg);
        fail();
    }
    assert_recipe_equal(r, &back);
    char *js2 = td_recipe_to_json(&back);
    assert_string_equal(js, js2);
    free(js);
    free(js2);
}

/* Loads a recipe file with `text` through td_recipe_resolve; expects failure whose message
 * contains the file's path and `field`. */
static void expect_file_error(const char *text, const char *field)
{
    char path[64];
    test_write_temp(path, text, ".json");
    td_recipe r;
    td_error err = {{0}};
    int rc = td_recipe_resolve(path, &r, &err);
    if (rc == 0) { print_error("recipe file %s was accepted\n", text); unlink(path); fail(); }
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, field);
    unlink(path);
}

/* ---------------------------------------------------------------- presets */

static void test_required_presets(void **state)
{
    (void)state;
    const char *required[] = {"fp32", "bf16-train", "bf16-infer", "fp16-train", "fp16-infer",
                              "fp8-rollout", "fp8-unified"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
        const td_recipe *r = td_recipe_find_preset(required[i]);
        if (!r) { print_error("preset %s missing\n", required[i]); fail(); }
        assert_string_equal(r->name, required[i]);
        td_recipe out;
        td_error err = {{0}};
        assert_int_equal(td_recipe_resolve(required[i], &out, &err), 0);
        assert_recipe_equal(r, &out);
    }
    assert_null(td_recipe_find_preset("bf16"));
    assert_null(td_recipe_preset(td_recipe_num_presets()));
}

/* The engine and trainer presets of issue 15: each one's fields as the code it follows
 * (recipe.h cites the sources), the aliases of the JSON names, and a doc for each. */
static void test_engine_presets(void **state)
{
    (void)state;
    const td_recipe *vb = td_recipe_find_preset("vllm-bf16"), *sb = td_recipe_find_preset("sglang-bf16");
    const td_recipe *vh = td_recipe_find_preset("vllm-fp16"), *sh = td_recipe_find_preset("sglang-fp16");
    const td_recipe *inf = td_recipe_find_preset("bf16-infer"), *au = td_recipe_find_preset("bf16-autocast");
    assert_non_null(vb); assert_non_null(sb); assert_non_null(vh); assert_non_null(sh); assert_non_null(au);
    /* vLLM: two roundings in RMSNorm, bf16 cache + fp32 rotation in RoPE; SGLang: FlashInfer */
    assert_int_equal(vb->norm, TD_NORM_UNFUSED);
    assert_int_equal(vb->rope, TD_ROPE_VLLM);
    assert_int_equal(sb->norm, TD_NORM_FUSED_ADD);
    assert_int_equal(sb->rope, TD_ROPE_FUSED);
    assert_int_equal(vh->activations, TD_F16);
    assert_int_equal(sh->activations, TD_F16);
    /* the engines' other kernels as bf16-infer */
    const td_recipe *eng[] = {vb, sb};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(eng[i]->attn_block, inf->attn_block);
        assert_int_equal(eng[i]->decode_splits, inf->decode_splits);
        assert_int_equal(eng[i]->split_k, inf->split_k);
        assert_int_equal(eng[i]->activations, TD_BF16);
    }
    /* autocast trainer: fp32 stream, fp32 RoPE (fp32 cos/sin), bf16 GEMMs */
    assert_true(au->residual_fp32);
    assert_int_equal(au->rope, TD_ROPE_FUSED);
    assert_int_equal(au->weights, TD_BF16);
    assert_false(td_recipe_find_preset("bf16-train")->residual_fp32);
    /* vLLM online FP8: per-tensor weight scales, dynamic per-tensor / per-token activations,
     * fast accumulation without promotion */
    const td_recipe *v8 = td_recipe_find_preset("vllm-fp8"), *v8t = td_recipe_find_preset("vllm-fp8-per-token");
    assert_non_null(v8); assert_non_null(v8t);
    assert_int_equal(v8->weight_scaling.gran, TD_SCALE_TENSOR);
    assert_int_equal(v8->act_scaling.gran, TD_SCALE_TENSOR);
    assert_int_equal(v8t->act_scaling.gran, TD_SCALE_ROW);
    assert_int_equal(v8->accumulate, TD_ACC_FP8_FAST);
    assert_true(v8->promote_every >= 65536);
    /* the fair unified FP8 pair: GEMM flow identical, kernels as bf16-train / bf16-infer */
    const td_recipe *ut = td_recipe_find_preset("fp8-unified-train"), *ui = td_recipe_find_preset("fp8-unified-infer");
    const td_recipe *bt = td_recipe_find_preset("bf16-train");
    assert_non_null(ut); assert_non_null(ui);
    assert_int_equal(ut->weights, ui->weights);
    assert_scheme_equal(&ut->weight_scaling, &ui->weight_scaling);
    assert_scheme_equal(&ut->act_scaling, &ui->act_scaling);
    assert_int_equal(ut->accumulate, ui->accumulate);
    assert_int_equal(ut->attn_block, bt->attn_block);
    assert_int_equal(ut->norm, bt->norm);
    assert_int_equal(ut->rope, bt->rope);
    assert_int_equal(ui->attn_block, inf->attn_block);
    assert_int_equal(ui->decode_splits, inf->decode_splits);
    assert_int_equal(ui->norm, inf->norm);
    assert_int_equal(ui->rope, inf->rope);
    /* every preset has a doc line naming what it follows, but fp32 */
    for (size_t i = 0; i < td_recipe_num_presets(); i++)
        if (strcmp(td_recipe_preset(i)->name, "fp32")) assert_true(strlen(td_recipe_preset_doc(i)) > 5);
    /* JSON aliases: "hf" and "vllm" name HF's two-rounding norm, "hf" the HF rope */
    td_recipe r;
    td_error err = {{0}};
    const char *js = "{\"base\": \"sglang-bf16\", \"norm\": \"vllm\", \"rope\": \"hf\"}";
    assert_int_equal(td_recipe_from_json(js, strlen(js), "alias", &r, &err), 0);
    assert_int_equal(r.norm, TD_NORM_UNFUSED);
    assert_int_equal(r.rope, TD_ROPE_UNFUSED);
}

static void test_presets_check_and_unique(void **state)
{
    (void)state;
    size_t n = td_recipe_num_presets();
    assert_true(n >= 7);
    for (size_t i = 0; i < n; i++) {
        const td_recipe *r = td_recipe_preset(i);
        assert_non_null(r);
        td_error err = {{0}};
        if (td_recipe_check(r, r->name, &err)) { print_error("%s\n", err.msg); fail(); }
        assert_true(r->description[0] != 0);
        for (size_t j = 0; j < i; j++) assert_true(strcmp(r->name, td_recipe_preset(j)->name) != 0);
        assert_ptr_equal(td_recipe_find_preset(r->name), r);
    }
}

static void test_preset_semantics(void **state)
{
    (void)state;
    const td_recipe *f32 = td_recipe_find_preset("fp32");
    assert_int_equal(f32->weights, TD_F32);
    assert_int_equal(f32->activations, TD_F32);
    assert_int_equal(f32->gemm_inputs, TD_F32);
    assert_int_equal(f32->kv_cache, TD_F32);
    assert_int_equal(f32->attention, TD_ATTN_FULL);
    assert_false(td_recipe_fp8_gemm(f32));
    /* 16-bit presets: every field in the one dtype, trainer and engine differ in structure */
    const char *p16[][3] = {{"bf16-train", "bf16-infer", "bf16"}, {"fp16-train", "fp16-infer", "fp16"}};
    for (int i = 0; i < 2; i++) {
        const td_recipe *tr = td_recipe_find_preset(p16[i][0]), *in = td_recipe_find_preset(p16[i][1]);
        td_format dt = (td_format)td_format_from_name(p16[i][2]);
        const td_recipe *both[2] = {tr, in};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(both[k]->weights, dt);
            assert_int_equal(both[k]->activations, dt);
            assert_int_equal(both[k]->gemm_inputs, dt);
            assert_int_equal(both[k]->kv_cache, dt);
            assert_int_equal(both[k]->accumulate, TD_ACC_FP32);
        }
        assert_int_equal(tr->norm, TD_NORM_UNFUSED);
        assert_int_equal(in->norm, TD_NORM_FUSED);
        assert_true(in->decode_splits > 1);
    }
    /* FP8: DeepSeek-V3 block scaling (weights 128x128, activations 1x128, e4m3), Hopper fast
     * accumulation promoted every 128 products; the same GEMM flow in rollout and unified */
    const td_recipe *ro = td_recipe_find_preset("fp8-rollout"), *un = td_recipe_find_preset("fp8-unified");
    const td_recipe *fp8[2] = {ro, un};
    for (int k = 0; k < 2; k++) {
        const td_recipe *r = fp8[k];
        assert_true(td_recipe_fp8_gemm(r));
        assert_int_equal(r->weights, TD_E4M3);
        assert_int_equal(r->gemm_inputs, TD_E4M3);
        assert_int_equal(r->activations, TD_BF16);
        assert_int_equal(r->weight_scaling.fmt, TD_E4M3);
        assert_int_equal(r->weight_scaling.gran, TD_SCALE_BLOCK);
        assert_int_equal(r->weight_scaling.group, 128);
        assert_int_equal(r->act_scaling.gran, TD_SCALE_GROUP);
        assert_int_equal(r->act_scaling.group, 128);
        assert_int_equal(r->accumulate, TD_ACC_FP8_FAST);
        assert_int_equal(r->promote_every, 128);
    }
    assert_scheme_equal(&ro->weight_scaling, &un->weight_scaling);
    assert_scheme_equal(&ro->act_scaling, &un->act_scaling);
    assert_true(td_recipe_find_preset("bf16-infer-fp32head")->lm_head_fp32);
}

/* ---------------------------------------------------------------- JSON round trip */

static void test_round_trip_presets(void **state)
{
    (void)state;
    for (size_t i = 0; i < td_recipe_num_presets(); i++) assert_round_trips(td_recipe_preset(i));
}

static void test_round_trip_nondefault(void **state)
{
    (void)state;
    /* every field away from the preset values, including the ones no preset sets */
    td_recipe r = *td_recipe_find_preset("fp8-rollout");
    snprintf(r.name, sizeof r.name, "custom \"quoted\" name");
    snprintf(r.description, sizeof r.description, "unicode \xc3\xa9 and a\nnewline");
    r.weight_scaling = (td_fp8_scheme){.fmt = TD_E5M2, .gran = TD_SCALE_ROW, .arith = TD_ARITH_MUL,
                                       .pow2 = true, .sat = TD_NOSAT, .group = 64};
    r.act_scaling = (td_fp8_scheme){.fmt = TD_E4M3, .gran = TD_SCALE_MX, .arith = TD_ARITH_DIV,
                                    .pow2 = true, .sat = TD_SATFINITE, .group = 32};
    r.gemm_inputs = TD_E5M2;
    r.promote_every = 64;
    r.acc_fraction_bits = 14;
    r.split_k = 3;
    r.attention = TD_ATTN_FULL;
    r.attn_block = 17;
    r.decode_splits = 7;
    r.kv_cache = TD_E4M3;
    r.kv_scale = 0.1f;              /* not exact in binary: the JSON must carry all of it */
    r.lm_head_fp32 = true;
    r.norm = TD_NORM_FUSED_ADD;
    r.rope = TD_ROPE_VLLM;
    r.batch_invariant = true;
    r.residual_fp32 = true;
    r.temp_in_act = true;
    r.logsoftmax_act = true;
    r.moe_fused = true;
    td_error err = {{0}};
    assert_int_equal(td_recipe_check(&r, "custom", &err), 0);
    assert_round_trips(&r);
    r.activations = TD_F16;
    r.kv_cache = TD_F16;
    r.weights = TD_F32;
    r.gemm_inputs = TD_F16;
    r.accumulate = TD_ACC_FP32;
    r.kv_scale = 3.0e-5f;
    assert_round_trips(&r);
}

/* ---------------------------------------------------------------- recipe files */

static void test_file_derives_from_base(void **state)
{
    (void)state;
    char path[64];
    test_write_temp(path, "{\"base\": \"bf16-infer\", \"lm_head\": \"fp32\", \"split_k\": 4,\n"
                     " \"weight_scaling\": {\"granularity\": \"row\", \"arith\": \"mul\"},\n"
                     " \"kv_scale\": 0.5, \"batch_invariant\": true}\n", ".json");
    td_recipe r;
    td_error err = {{0}};
    if (td_recipe_resolve(path, &r, &err)) { print_error("%s\n", err.msg); fail(); }
    /* expected: bf16-infer with exactly those fields changed; no "name" key -> the path */
    td_recipe want = *td_recipe_find_preset("bf16-infer");
    snprintf(want.name, sizeof want.name, "%s", path);
    want.description[0] = 0;
    want.lm_head_fp32 = true;
    want.split_k = 4;
    want.weight_scaling.gran = TD_SCALE_ROW;
    want.weight_scaling.arith = TD_ARITH_MUL;
    want.kv_scale = 0.5f;
    want.batch_invariant = true;
    assert_recipe_equal(&r, &want);
    unlink(path);

    /* name / description given; no base -> fp32 */
    test_write_temp(path, "{\"name\": \"mine\", \"description\": \"d\", \"attention\": \"flash\", \"attn_block\": 32}", ".json");
    assert_int_equal(td_recipe_resolve(path, &r, &err), 0);
    want = *td_recipe_find_preset("fp32");
    snprintf(want.name, sizeof want.name, "mine");
    snprintf(want.description, sizeof want.description, "d");
    want.attention = TD_ATTN_FLASH;
    want.attn_block = 32;
    assert_recipe_equal(&r, &want);
    unlink(path);

    /* changing activations carries gemm_inputs and kv_cache along unless they are given */
    test_write_temp(path, "{\"base\": \"bf16-train\", \"activations\": \"fp16\", \"weights\": \"fp16\"}", ".json");
    assert_int_equal(td_recipe_resolve(path, &r, &err), 0);
    assert_int_equal(r.activations, TD_F16);
    assert_int_equal(r.gemm_inputs, TD_F16);
    assert_int_equal(r.kv_cache, TD_F16);
    unlink(path);
    /* ... but an fp8 GEMM input stays fp8 */
    test_write_temp(path, "{\"base\": \"fp8-rollout\", \"activations\": \"fp16\"}", ".json");
    assert_int_equal(td_recipe_resolve(path, &r, &err), 0);
    assert_int_equal(r.activations, TD_F16);
    assert_int_equal(r.gemm_inputs, TD_E4M3);
    assert_int_equal(r.kv_cache, TD_F16);
    unlink(path);

    /* a file written by td_recipe_to_json loads back as the same recipe */
    char *js = td_recipe_to_json(td_recipe_find_preset("fp8-unified"));
    test_write_temp(path, js, ".json");
    free(js);
    assert_int_equal(td_recipe_resolve(path, &r, &err), 0);
    assert_recipe_equal(&r, td_recipe_find_preset("fp8-unified"));
    unlink(path);
}

static void test_file_errors(void **state)
{
    (void)state;
    expect_file_error("{\"base\": \"fp32\", \"splitk\": 2}", "\"splitk\"");                 /* unknown key */
    expect_file_error("{\"weight_scaling\": {\"gran\": \"row\"}}", "weight_scaling.gran");   /* unknown sub-key */
    expect_file_error("{\"weights\": \"bf17\"}", "\"weights\"");                             /* bad format name */
    expect_file_error("{\"kv_cache\": \"e8m0\"}", "\"kv_cache\"");                           /* not a value format */
    expect_file_error("{\"split_k\": 0}", "\"split_k\"");                                    /* out of range */
    expect_file_error("{\"decode_splits\": -1}", "\"decode_splits\"");
    expect_file_error("{\"acc_fraction_bits\": 24}", "\"acc_fraction_bits\"");
    expect_file_error("{\"split_k\": \"2\"}", "\"split_k\"");                                /* wrong types */
    expect_file_error("{\"split_k\": 2.5}", "\"split_k\"");
    expect_file_error("{\"split_k\": 99999999999}", "\"split_k\"");
    expect_file_error("{\"lm_head\": true}", "\"lm_head\"");
    expect_file_error("{\"norm\": \"fast\"}", "\"norm\"");
    expect_file_error("{\"rope\": \"flashinfer\"}", "\"rope\"");
    expect_file_error("{\"rope\": true}", "\"rope\"");
    expect_file_error("{\"residual\": \"bf16\"}", "\"residual\"");
    expect_file_error("{\"logsoftmax\": \"fp16\"}", "\"logsoftmax\"");
    expect_file_error("{\"logits_temperature\": 1}", "\"logits_temperature\"");
    expect_file_error("{\"batch_invariant\": \"yes\"}", "\"batch_invariant\"");
    expect_file_error("{\"kv_scale\": \"1\"}", "\"kv_scale\"");
    expect_file_error("{\"kv_scale\": -1}", "\"kv_scale\"");
    expect_file_error("{\"name\": 3}", "\"name\"");
    expect_file_error("{\"weight_scaling\": \"block\"}", "\"weight_scaling\"");
    expect_file_error("{\"act_scaling\": {\"group\": 1.5}}", "act_scaling.group");
    expect_file_error("{\"act_scaling\": {\"granularity\": \"diagonal\"}}", "act_scaling.granularity");
    expect_file_error("{\"act_scaling\": {\"format\": \"bf16\"}}", "act_scaling.format");
    expect_file_error("{\"base\": \"bf16-training\"}", "\"base\"");                          /* unknown base */
    expect_file_error("{\"base\": 1}", "\"base\"");
    expect_file_error("{\"base\": \"bf16-train\", \"gemm_inputs\": \"fp16\"}", "\"gemm_inputs\"");
    expect_file_error("{\"activations\": \"e4m3\"}", "\"activations\"");
    expect_file_error("[1, 2]", "one JSON object");                                          /* not an object */
    expect_file_error("{\"split_k\": 2, \"split_k\": 3}", "split_k");                         /* duplicate key */
    /* invalid JSON: the trailing comma on line 2 makes jansson stop at line 3, column 1 */
    char path[64], want[80];
    test_write_temp(path, "{\"base\": \"fp32\",\n  \"split_k\": 2,\n}\n", ".json");
    td_recipe r;
    td_error err = {{0}};
    assert_int_equal(td_recipe_resolve(path, &r, &err), -1);
    snprintf(want, sizeof want, "%s:3:1:", path);
    assert_msg_has(err.msg, want);
    unlink(path);
    /* a missing file names the path */
    assert_int_equal(td_recipe_resolve("/nonexistent/dir/r.json", &r, &err), -1);
    assert_msg_has(err.msg, "/nonexistent/dir/r.json");
}

static void test_unknown_preset_lists_presets(void **state)
{
    (void)state;
    td_recipe r;
    td_error err = {{0}};
    assert_int_equal(td_recipe_resolve("bf16-training", &r, &err), -1);
    assert_msg_has(err.msg, "bf16-training");
    for (size_t i = 0; i < td_recipe_num_presets(); i++) assert_msg_has(err.msg, td_recipe_preset(i)->name);
}

static void test_check_rejects(void **state)
{
    (void)state;
    const td_recipe *base = td_recipe_find_preset("bf16-train");
    struct { const char *field; td_recipe r; } cases[8];
    for (int i = 0; i < 8; i++) cases[i].r = *base;
    cases[0].field = "\"weights\"";           cases[0].r.weights = TD_E5M2;
    cases[1].field = "\"activations\"";       cases[1].r.activations = TD_E4M3;
    cases[2].field = "\"gemm_inputs\"";       cases[2].r.gemm_inputs = TD_F16;
    cases[3].field = "\"kv_cache\"";          cases[3].r.kv_cache = TD_E5M2;
    cases[4].field = "\"kv_scale\"";          cases[4].r.kv_scale = NAN;
    cases[5].field = "\"promote_every\"";     cases[5].r.promote_every = 0;
    cases[6].field = "\"attn_block\"";        cases[6].r.attn_block = 0;
    cases[7].field = "\"weight_scaling.format\""; cases[7].r.weight_scaling.fmt = TD_BF16;
    for (int i = 0; i < 8; i++) {
        td_error err = {{0}};
        assert_int_equal(td_recipe_check(&cases[i].r, "case", &err), -1);
        assert_msg_has(err.msg, "case:");
        assert_msg_has(err.msg, cases[i].field);
    }
}

/* the MoE combine of the engine presets (recipe.h "moe"): vLLM's fused_moe and SGLang's follow it,
 * the trainers and the generic engine keep HF's; "fused" is printed, "hf" (the default) is not, so
 * every other recipe's JSON (recorded in run files) is unchanged; moe_sum sums a row's k outputs in
 * top-k order in the activations dtype, each add rounded, as vLLM's moe_sum_kernel does with its
 * scalar_t accumulator */
static void test_moe_combine(void **state)
{
    (void)state;
    const char *fused[] = {"vllm-bf16", "vllm-fp16", "sglang-bf16", "sglang-fp16", "vllm-fp8", "vllm-fp8-per-token"};
    const char *hf[] = {"fp32", "bf16-train", "bf16-autocast", "bf16-infer", "fp16-train", "fp16-infer", "fp8-rollout"};
    for (size_t i = 0; i < sizeof fused / sizeof *fused; i++) {
        const td_recipe *r = td_recipe_find_preset(fused[i]);
        assert_true(r && r->moe_fused);
        char *j = td_recipe_to_json(r);
        assert_non_null(strstr(j, "\"moe\":\"fused\""));
        free(j);
    }
    for (size_t i = 0; i < sizeof hf / sizeof *hf; i++) {
        const td_recipe *r = td_recipe_find_preset(hf[i]);
        assert_true(r && !r->moe_fused);
        char *j = td_recipe_to_json(r);
        assert_null(strstr(j, "\"moe\""));
        free(j);
    }
    td_recipe r;
    td_error err = {{0}};
    const char *js = "{\"base\": \"vllm-bf16\", \"moe\": \"hf\"}";
    assert_int_equal(td_recipe_from_json(js, strlen(js), "x.json", &r, &err), 0);
    assert_false(r.moe_fused);
    js = "{\"base\": \"vllm-bf16\", \"moe\": \"vllm\"}";
    assert_int_equal(td_recipe_from_json(js, strlen(js), "x.json", &r, &err), -1);
    assert_non_null(strstr(err.msg, "moe"));
    /* bf16: 1 + 2^-8 is a tie, kept at 1 (even); in top-k order (1, 2^-8, 2^-8) each add rounds back
     * to 1, where expert order (2^-8, 2^-8, 1) would give 1 + 2^-7 */
    float v[2 * 3 * 2] = {1.0f, 3.0f, 0x1p-8f, 0x1p-7f, 0x1p-8f, 0x1p-7f,
                          /* row 2, K = 3, C = 2; fp16-sized values tested below */ 0, 0, 0, 0, 0, 0};
    float out[4];
    moe_sum_topk(TD_BF16, 1, 3, 2, v, out);
    assert_true(out[0] == 1.0f);
    assert_true(out[1] == 3.0f);   /* 3 + 2^-7 rounds to 3 (bf16 spacing 2^-6 there), twice */
    /* fp16: spacing 2 at 2048; 2048 + 1 is a tie, kept at 2048 (even), twice */
    float h[3] = {2048.0f, 1.0f, 1.0f};
    moe_sum_topk(TD_F16, 1, 3, 1, h, out);
    assert_true(out[0] == 2048.0f);
    float h2[3] = {1.0f, 1.0f, 2048.0f};   /* the same values in another top-k order: 2 + 2048 exact */
    moe_sum_topk(TD_F16, 1, 3, 1, h2, out);
    assert_true(out[0] == 2050.0f);
    /* K = 2: one rounding of the exact sum */
    float k2[2] = {1.0f, 0x1p-9f + 0x1p-8f};
    moe_sum_topk(TD_BF16, 1, 2, 1, k2, out);
    assert_true(out[0] == td_round(TD_BF16, 1.0f + 0x1p-9f + 0x1p-8f));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_required_presets),
        cmocka_unit_test(test_presets_check_and_unique),
        cmocka_unit_test(test_engine_presets),
        cmocka_unit_test(test_preset_semantics),
        cmocka_unit_test(test_round_trip_presets),
        cmocka_unit_test(test_round_trip_nondefault),
        cmocka_unit_test(test_moe_combine),
        cmocka_unit_test(test_file_derives_from_base),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_unknown_preset_lists_presets),
        cmocka_unit_test(test_check_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
