/* safetensors reading and writing: round trips through tidal's writer and reader, bit for bit;
 * every class of bad file rejected with a message that names the file and the problem;
 * sharded checkpoints through model.safetensors.index.json.
 * Reference for conversions: td_round_row / td_decode_row (formats.h, themselves checked bit for
 * bit against NVIDIA's conversions). Tolerance: none, values compare as bit patterns. */
#include "ckpt_testutil.h"

#include "tidal/checkpoint.h"
#include "tidal/model.h"
#include "tidal/rng.h"

#include <fcntl.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <math.h>
#include <sys/stat.h>

static void expect_open_fails(const char *path, const char *what)
{
    td_error err = {{0}};
    td_checkpoint *ck = td_checkpoint_open(path, &err);
    if (ck) td_checkpoint_close(ck);
    assert_null(ck);
    assert_true(contains_all(err.msg, path, what, NULL));
}

/* ---- writer -> reader round trip, every dtype, odd sizes so alignment is exercised ---- */

static void test_writer_reader_roundtrip(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[512];
    path_join(path, sizeof path, dir, "rt.safetensors");
    /* values that stress every format: ties, subnormals, overflow (e4m3 saturates), NaN, Inf */
    enum { N = 37 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)((i - 18) * 0.37) * powf(2.0f, (float)(i % 7 - 3));
    x[0] = 1e-40f; x[1] = -0.0f; x[2] = 500.0f; x[3] = 1.00390625f; /* bf16 tie */
    int64_t s3[1] = {3}, s37[1] = {N}, s2d[2] = {1, N}, s0[2] = {0, 4};
    td_error err = {{0}};
    td_st_writer *w = td_st_writer_new(path);
    assert_int_equal(td_st_writer_meta(w, "note", "hello", &err), 0);
    /* declared narrowest first: the writer must still lay F32 out first and aligned */
    assert_int_equal(td_st_writer_declare(w, "e4m3", TD_DT_F8_E4M3, 1, s37, &err), 0);
    assert_int_equal(td_st_writer_declare(w, "bf16_odd", TD_DT_BF16, 1, s3, &err), 0);
    assert_int_equal(td_st_writer_declare(w, "f16", TD_DT_F16, 2, s2d, &err), 0);
    assert_int_equal(td_st_writer_declare(w, "f32", TD_DT_F32, 1, s37, &err), 0);
    assert_int_equal(td_st_writer_declare(w, "bf16", TD_DT_BF16, 1, s37, &err), 0);
    assert_int_equal(td_st_writer_declare(w, "empty", TD_DT_F32, 2, s0, &err), 0);
    assert_int_not_equal(td_st_writer_declare(w, "f32", TD_DT_F32, 1, s37, &err), 0);   /* twice */
    assert_int_equal(td_st_writer_begin(w, &err), 0);
    /* tensors in any order, pieces in order */
    assert_int_equal(td_st_writer_write_f32(w, "bf16", x, 10, &err), 0);
    assert_int_equal(td_st_writer_write_f32(w, "f32", x, N, &err), 0);
    assert_int_equal(td_st_writer_write_f32(w, "bf16", x + 10, N - 10, &err), 0);
    assert_int_equal(td_st_writer_write_f32(w, "e4m3", x, N, &err), 0);
    assert_int_equal(td_st_writer_write_f32(w, "f16", x, N, &err), 0);
    assert_int_not_equal(td_st_writer_write_f32(w, "f16", x, 1, &err), 0);   /* past its end */
    assert_true(contains_all(err.msg, "f16", "past", NULL));
    /* unfinished tensor: finish refuses, and the final name does not exist yet */
    assert_int_not_equal(td_st_writer_finish(w, &err), 0);
    assert_true(contains_all(err.msg, "bf16_odd", "0 of its 6 bytes", NULL));
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(td_st_writer_write_f32(w, "bf16_odd", x, 3, &err), 0);
    assert_int_equal(td_st_writer_finish(w, &err), 0);
    td_st_writer_free(w);

    td_checkpoint *ck = td_checkpoint_open(path, &err);
    assert_non_null(ck);
    assert_null(td_checkpoint_config(ck));
    assert_int_equal(td_checkpoint_num_tensors(ck), 6);
    assert_string_equal(td_checkpoint_metadata(ck, "format"), "pt");
    assert_string_equal(td_checkpoint_metadata(ck, "note"), "hello");
    struct { const char *name; td_format f; int ndim; const int64_t *shape; size_t n; } cases[] = {
        {"f32", TD_F32, 1, s37, N}, {"bf16", TD_BF16, 1, s37, N}, {"f16", TD_F16, 2, s2d, N},
        {"e4m3", TD_E4M3, 1, s37, N}, {"bf16_odd", TD_BF16, 1, s3, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float want[N], got[N];
        td_round_row(cases[c].f, x, want, cases[c].n, TD_SATFINITE);
        size_t bad = 99;
        assert_int_equal(td_checkpoint_read_f32(ck, cases[c].name, cases[c].ndim, cases[c].shape, got, &bad, &err), 0);
        assert_int_equal(bad, 0);
        assert_memory_equal(want, got, cases[c].n * sizeof(float));
        const td_tensor *t = td_checkpoint_find(ck, cases[c].name);
        /* every tensor aligned to its element size in the file (data area starts 8-aligned) */
        assert_int_equal((uintptr_t)t->data % td_dtype_size(t->dtype), 0);
    }
    assert_int_equal(td_checkpoint_find(ck, "empty")->numel, 0);
    /* zero-copy F32, and a clear refusal for other dtypes */
    const float *m = td_checkpoint_map_f32(ck, "f32", 1, s37, &err);
    assert_non_null(m);
    assert_memory_equal(m, x, sizeof x);
    assert_null(td_checkpoint_map_f32(ck, "bf16", 1, s37, &err));
    assert_true(contains_all(err.msg, "bf16", "BF16", NULL));
    /* shape checked exactly: the message names file, tensor, actual and expected shapes */
    int64_t wrong[2] = {N, 1};
    float tmp[N];
    assert_int_not_equal(td_checkpoint_read_f32(ck, "f16", 2, wrong, tmp, NULL, &err), 0);
    assert_true(contains_all(err.msg, path, "'f16'", "(1, 37)", "expected (37, 1)", NULL));
    assert_int_not_equal(td_checkpoint_read_f32(ck, "nope", 1, s37, tmp, NULL, &err), 0);
    assert_true(contains_all(err.msg, path, "missing tensor 'nope'", NULL));
    td_checkpoint_close(ck);

    /* an abandoned writer leaves nothing behind */
    char p2[600];
    path_join(p2, sizeof p2, dir, "abandoned.safetensors");
    w = td_st_writer_new(p2);
    assert_int_equal(td_st_writer_declare(w, "a", TD_DT_F32, 1, s3, &err), 0);
    assert_int_equal(td_st_writer_begin(w, &err), 0);
    td_st_writer_free(w);
    assert_int_not_equal(access(p2, F_OK), 0);
    strcat(p2, ".tmp");
    assert_int_not_equal(access(p2, F_OK), 0);
    rm_tree(dir);
}

/* ---- hand-built files: misaligned BF16 (Python writers do not align), non-finite values ---- */

static void test_misaligned_and_nonfinite(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[512];
    path_join(path, sizeof path, dir, "m.safetensors");
    /* "a": 1 byte of F8 at offset 0, so "b" (BF16) starts at the odd offset 1; the header is
     * padded to an even length so the data area starts at an even address and "b" at an odd one */
    uint8_t data[1 + 6];
    data[0] = 0x38;   /* e4m3 1.0 */
    uint16_t b[3] = {0x3F80, 0x7FC0, 0xFF80};   /* 1.0, NaN, -Inf */
    memcpy(data + 1, b, sizeof b);
    const char *hdr = "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[1,7]}}";
    char padded[256];
    snprintf(padded, sizeof padded, "%s%s", hdr, strlen(hdr) % 2 ? " " : "");
    write_safetensors(path, padded, data, sizeof data);
    td_error err = {{0}};
    td_checkpoint *ck = td_checkpoint_open(path, &err);
    assert_non_null(ck);
    assert_int_equal((uintptr_t)td_checkpoint_find(ck, "b")->data % 2, 1);
    float y[3];
    size_t bad = 0;
    int64_t s3[1] = {3}, s1[1] = {1};
    assert_int_equal(td_checkpoint_read_f32(ck, "b", 1, s3, y, &bad, &err), 0);
    assert_true(y[0] == 1.0f && isnan(y[1]) && isinf(y[2]) && y[2] < 0);
    assert_int_equal(bad, 2);
    assert_int_equal(td_checkpoint_read_f32(ck, "a", 1, s1, y, &bad, &err), 0);
    assert_true(y[0] == 1.0f);
    size_t bad_tensors = 0;
    assert_int_equal(td_checkpoint_count_nonfinite(ck, &bad_tensors), 2);   /* a warning, not an error */
    assert_int_equal(bad_tensors, 1);
    td_checkpoint_close(ck);
    rm_tree(dir);
}

/* ---- bad files: each rejected, message names the file and the problem ---- */

static void test_bad_files(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), p[512];
    path_join(p, sizeof p, dir, "bad.safetensors");
    uint8_t data[64] = {0};
    static const struct { const char *header; size_t ndata; const char *what; } cases[] = {
        {"[1, 2]", 0, "not a JSON object"},
        {"{\"a\": ", 0, "invalid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside the data area"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, "outside the data area"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16, "12 bytes but data_offsets span 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 16, "absurd"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,3],\"data_offsets\":[0,8]}}", 16, "absurd"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 16, "shape[0]"},
        {"{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 16, "unsupported dtype \"I64\""},
        {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 16, "dtype"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 16, "dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 16, "dimensions"},
        {"{\"a\":[1]}", 16, "not a JSON object"},
        {"{\"__metadata__\":[1]}", 16, "__metadata__"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_safetensors(p, cases[i].header, data, cases[i].ndata);
        expect_open_fails(p, cases[i].what);
    }
    /* truncated: shorter than the 8-byte length */
    write_bytes(p, "\x10\x00\x00", 3);
    expect_open_fails(p, "truncated");
    write_bytes(p, "", 0);
    expect_open_fails(p, "truncated");
    /* header length past the end of the file (a truncated download) */
    uint8_t hl[16] = {0xE8, 0x03};   /* 1000 */
    memcpy(hl + 8, "{\"a\":{", 6);
    write_bytes(p, hl, sizeof hl);
    expect_open_fails(p, "header length 1000 past end of file");
    /* a huge length field on a file that is not huge: refused before any allocation */
    memset(hl, 0xFF, 8);
    write_bytes(p, hl, sizeof hl);
    expect_open_fails(p, "past end of file");
    /* a header length within the file but over the 100 MB cap (sparse file: no disk cost) */
    uint8_t cap[8] = {0, 0, 0, 0x07};   /* 0x07000000 = 117 MB */
    write_bytes(p, cap, 8);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)8 + 0x07000000 + 16), 0);
    close(fd);
    expect_open_fails(p, "over the");
    /* a missing file, a directory without config.json */
    path_join(p, sizeof p, dir, "nonexistent.safetensors");
    expect_open_fails(p, "no such");
    expect_open_fails(dir, "missing config.json");
    rm_tree(dir);
}

/* ---- directories: single file, shards via the index, and the index's own failure modes ---- */

static void write_tiny_shards(const char *dir, const char *index)
{
    char p[512];
    path_join(p, sizeof p, dir, "config.json");
    write_text(p, tiny_llama_config);
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    path_join(p, sizeof p, dir, "model-00001-of-00002.safetensors");
    write_safetensors(p, "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", a, sizeof a);
    path_join(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    write_safetensors(p, "{\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", b, sizeof b);
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    write_text(p, index);
}

static void test_shards(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), p[512];
    write_tiny_shards(dir, "{\"metadata\":{\"total_size\":24},\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
                           "\"y\":\"model-00002-of-00002.safetensors\"}}");
    td_error err = {{0}};
    td_checkpoint *ck = td_checkpoint_open(dir, &err);
    if (!ck) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(ck);
    assert_int_equal(td_checkpoint_num_tensors(ck), 2);
    float y[2];
    int64_t s2[1] = {2};
    assert_int_equal(td_checkpoint_read_f32(ck, "y", 1, s2, y, NULL, &err), 0);
    assert_true(y[0] == 5 && y[1] == 6);
    const td_tensor *x = td_checkpoint_find(ck, "x");
    assert_non_null(strstr(td_checkpoint_shard_path(ck, x->shard), "model-00001-of-00002"));
    assert_non_null(td_checkpoint_config(ck));
    /* no tokenizer files in this directory, and that is fine; validate says what is missing */
    assert_int_not_equal(td_checkpoint_validate(ck, &err), 0);
    assert_true(contains_all(err.msg, "missing tensor 'model.embed_tokens.weight'", NULL));
    /* no generation_config.json: defaults, stop ids from config.json (a list: all of them) */
    const td_gen_config *g = td_checkpoint_generation(ck);
    assert_true(!g->from_file && g->n_eos == 1 && g->eos_token_ids[0] == 2 && g->bos_token_id == 1);
    td_checkpoint_close(ck);
    path_join(p, sizeof p, dir, "config.json");
    write_text(p, "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":12,"
                  "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"eos_token_id\":[3,5,7]}");
    ck = td_checkpoint_open(dir, &err);
    assert_non_null(ck);
    assert_int_equal(td_checkpoint_config(ck)->eos_token_id, 3);
    g = td_checkpoint_generation(ck);
    assert_true(g->n_eos == 3 && g->eos_token_ids[0] == 3 && g->eos_token_ids[2] == 7 && !(g->present & TD_GEN_EOS));
    td_checkpoint_close(ck);

    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    write_tiny_shards(dir, "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"y\":\"model-00003-of-00002.safetensors\"}}");
    expect_open_fails(dir, "model-00003-of-00002.safetensors");
    write_tiny_shards(dir, "{\"weight_map\":{\"x\":\"model-00002-of-00002.safetensors\",\"y\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(dir, "no such tensor");
    write_tiny_shards(dir, "{\"weight_map\":{\"x\":\"../etc/passwd\"}}");
    expect_open_fails(dir, "not a file name inside");
    write_tiny_shards(dir, "{\"weight_map\":{\"x\":3}}");
    expect_open_fails(dir, "not a file name string");
    write_tiny_shards(dir, "{\"nothing\":{}}");
    expect_open_fails(dir, "weight_map");
    /* the same tensor in two shards */
    path_join(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    float b[2] = {5, 6};
    write_safetensors(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", b, sizeof b);
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    write_text(p, "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(dir, "appears in both");
    /* neither model.safetensors nor an index */
    unlink(p);
    expect_open_fails(dir, "neither model.safetensors nor");
    rm_tree(dir);
}

/* A random-init checkpoint of each architecture opens, validates against its config, and has
 * the statistics tidal-init promises (checked loosely: N(0, 0.02) over >= 10^4 values has a
 * sample std within 5% of 0.02; norm weights are near 1 but not all exactly 1). */
static void test_init_each_arch(void **state)
{
    (void)state;
    for (int a = 0; a < TD_ARCH_COUNT; a++) {
        char *dir = make_tmpdir();
        td_config cfg;
        td_config_defaults(&cfg, (td_arch)a);
        assert_int_equal(td_config_preset("tiny", &cfg), 0);
        assert_int_equal((int)cfg.arch, a);
        cfg.tie_word_embeddings = a % 2;
        td_error err = {{0}};
        assert_int_equal(td_checkpoint_init_random(dir, &cfg, a == 1 ? TD_DT_BF16 : TD_DT_F32, 42, "test", NULL, &err), 0);
        td_checkpoint *ck = td_checkpoint_open(dir, &err);
        assert_non_null(ck);
        assert_int_equal(td_checkpoint_validate(ck, &err), 0);
        const td_config *c = td_checkpoint_config(ck);
        assert_int_equal(c->arch, a);
        assert_int_equal(c->hidden_size, 64);
        assert_int_equal(c->tie_word_embeddings, a % 2);
        assert_int_equal(td_checkpoint_find(ck, "lm_head.weight") != NULL, !(a % 2));
        bool qwen2 = a == TD_ARCH_QWEN2 || a == TD_ARCH_QWEN2_MOE;
        bool qknorm = a == TD_ARCH_QWEN3 || a == TD_ARCH_QWEN3_MOE || a == TD_ARCH_OLMOE;
        bool moe = a == TD_ARCH_QWEN2_MOE || a == TD_ARCH_QWEN3_MOE || a == TD_ARCH_MIXTRAL || a == TD_ARCH_OLMOE;
        assert_int_equal(td_checkpoint_find(ck, "model.layers.1.self_attn.q_proj.bias") != NULL, qwen2);
        const td_tensor *kn = td_checkpoint_find(ck, "model.layers.0.self_attn.k_norm.weight");
        assert_int_equal(kn != NULL, qknorm);
        if (kn)   /* Qwen3: per head (HD 16); OLMoE: the whole k projection (NKV 2 x HD 16) */
            assert_int_equal(kn->shape[0], a == TD_ARCH_OLMOE ? 32 : 16);
        assert_int_equal(c->num_experts, moe ? 8 : 0);   /* tiny on an MoE arch: 8 experts, top-2 */
        assert_int_equal(td_checkpoint_find(ck, "model.layers.1.mlp.gate_proj.weight") != NULL, !moe);
        assert_int_equal(td_checkpoint_find(ck, a == TD_ARCH_MIXTRAL ? "model.layers.1.block_sparse_moe.experts.7.w2.weight"
                                                                     : "model.layers.1.mlp.experts.7.down_proj.weight") != NULL, moe);
        assert_string_equal(td_checkpoint_metadata(ck, "tidal_command"), "test");
        size_t nparams = td_config_params(c, NULL, 0);
        assert_int_equal(td_checkpoint_num_tensors(ck), nparams);
        float *e = malloc(512 * 64 * sizeof(float));
        int64_t se[2] = {512, 64}, sn[1] = {64};
        assert_int_equal(td_checkpoint_read_f32(ck, "model.embed_tokens.weight", 2, se, e, NULL, &err), 0);
        double s1 = 0, s2 = 0;
        for (int i = 0; i < 512 * 64; i++) { s1 += e[i]; s2 += (double)e[i] * e[i]; }
        double mean = s1 / (512 * 64), sd = sqrt(s2 / (512 * 64) - mean * mean);
        assert_true(fabs(mean) < 0.001 && fabs(sd - 0.02) < 0.001);
        assert_int_equal(td_checkpoint_read_f32(ck, "model.norm.weight", 1, sn, e, NULL, &err), 0);
        int ones = 0;
        for (int i = 0; i < 64; i++) { ones += e[i] == 1.0f; assert_true(fabs(e[i] - 1.0) < 0.6); }
        assert_true(ones < 8);
        free(e);
        td_checkpoint_close(ck);
        rm_tree(dir);
    }
}

/* Same seed -> same bytes, whatever the thread count; different seed -> different values.
 * V*C = 2^21 + 64*5 puts the embedding over two 2^20-element chunks, so threads matter. */
static void test_init_deterministic(void **state)
{
    (void)state;
    char *d1 = make_tmpdir(), *d2 = make_tmpdir(), *d3 = make_tmpdir();
    td_config cfg;
    td_config_defaults(&cfg, TD_ARCH_LLAMA);
    assert_int_equal(td_config_preset("tiny", &cfg), 0);
    cfg.vocab_size = 32768 + 5;
    td_error err = {{0}};
    assert_int_equal(td_checkpoint_init_random(d1, &cfg, TD_DT_BF16, 7, "x", NULL, &err), 0);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    assert_int_equal(td_checkpoint_init_random(d2, &cfg, TD_DT_BF16, 7, "x", NULL, &err), 0);
    assert_int_equal(td_checkpoint_init_random(d3, &cfg, TD_DT_BF16, 8, "x", NULL, &err), 0);
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    td_checkpoint *c1 = td_checkpoint_open(d1, &err), *c2 = td_checkpoint_open(d2, &err), *c3 = td_checkpoint_open(d3, &err);
    assert_true(c1 && c2 && c3);
    for (size_t i = 0; i < td_checkpoint_num_tensors(c1); i++) {
        const td_tensor *a = td_checkpoint_tensor(c1, i), *b = td_checkpoint_tensor(c2, i), *c = td_checkpoint_tensor(c3, i);
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
        assert_memory_not_equal(a->data, c->data, a->nbytes);
    }
    td_checkpoint_close(c1); td_checkpoint_close(c2); td_checkpoint_close(c3);
    rm_tree(d1); rm_tree(d2); rm_tree(d3);
}

/* Seeded mutations of a valid file (random bytes overwritten in the length field, header and
 * data): each must either open, with every tensor decodable (ASan checks the reads stay inside
 * the map), or fail with a message naming the file. Never a crash. */
static void test_mutations(void **state)
{
    (void)state;
    char *dir = make_tmpdir(), path[512];
    path_join(path, sizeof path, dir, "mut.safetensors");
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
                      "\"c\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[22,24]}}";
    uint8_t data[24];
    for (int i = 0; i < 24; i++) data[i] = (uint8_t)(i * 37);
    size_t hl = strlen(hdr), n = 8 + hl + sizeof data;
    uint8_t *good = malloc(n), *buf = malloc(n);
    for (int i = 0; i < 8; i++) good[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(good + 8, hdr, hl);
    memcpy(good + 8 + hl, data, sizeof data);
    td_rng r;
    td_rng_seed(&r, 1234);
    static const char alphabet[] = "0123456789[]{},:\"-eE.FBIU_ ";
    int opened = 0, rejected = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, good, n);
        int k = 1 + (int)td_rng_below(&r, 3);
        for (int j = 0; j < k; j++) {
            size_t at = td_rng_below(&r, n);
            buf[at] = td_rng_below(&r, 2) ? (uint8_t)alphabet[td_rng_below(&r, sizeof alphabet - 1)] : (uint8_t)td_rng_next(&r);
        }
        size_t len = td_rng_below(&r, 8) == 0 ? td_rng_below(&r, n + 1) : n;   /* sometimes truncated */
        write_bytes(path, buf, len);
        td_error err = {{0}};
        td_checkpoint *ck = td_checkpoint_open(path, &err);
        if (!ck) {
            assert_non_null(strstr(err.msg, path));
            rejected++;
            continue;
        }
        opened++;
        for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
            const td_tensor *t = td_checkpoint_tensor(ck, i);
            float *y = malloc((t->numel ? t->numel : 1) * sizeof(float));
            td_tensor_to_f32(t, y, NULL);
            free(y);
        }
        td_checkpoint_close(ck);
    }
    assert_true(opened > 0 && rejected > 0);   /* both paths exercised */
    free(good);
    free(buf);
    rm_tree(dir);
}

/* A tiny MoE config of 3 layers with dense layers among them: Qwen2-MoE with layer 1 dense
 * (mlp_only_layers) and its shared expert, Qwen3-MoE sparse on layer 1 only (decoder_sparse_step
 * 2), Mixtral sparse everywhere. */
static td_config moe_tiny(td_arch arch)
{
    td_config cfg;
    td_config_defaults(&cfg, arch);
    assert_int_equal(td_config_preset("tiny", &cfg), 0);
    cfg.num_layers = 3;
    td_moe_opts o = {-1, -1, -1, -1, arch == TD_ARCH_QWEN3_MOE ? 2 : -1, -1, arch == TD_ARCH_QWEN2_MOE ? "1" : NULL};
    td_error err = {{0}};
    if (td_config_set_moe(&cfg, &o, &err)) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(err.msg[0], 0);
    return cfg;
}

/* Sample mean and std of every tensor of a role in a checkpoint. */
static void role_stats(const td_checkpoint *ck, td_param_role role, double *mean, double *sd, size_t *count)
{
    const td_config *c = td_checkpoint_config(ck);
    size_t n = td_config_params(c, NULL, 0);
    td_param_spec *sp = malloc(n * sizeof *sp);
    td_config_params(c, sp, n);
    double s1 = 0, s2 = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].role != role) continue;
        const td_tensor *t = td_checkpoint_find(ck, sp[i].name);
        assert_non_null(t);
        float *x = malloc(t->numel * sizeof *x);
        td_tensor_to_f32(t, x, NULL);
        for (size_t j = 0; j < t->numel; j++) { s1 += x[j]; s2 += (double)x[j] * x[j]; }
        m += t->numel;
        free(x);
    }
    free(sp);
    *count = m;
    *mean = m ? s1 / m : 0;
    *sd = m ? sqrt(s2 / m - *mean * *mean) : 0;
}

/* A tidal-init MoE checkpoint holds every tensor of the parameter table (routers, each expert's
 * three matrices, Qwen2-MoE's shared expert and its gate; dense layers their MLP), passes
 * td_checkpoint_validate and loads (td_model_load). Statistics, loosely (a sample std of n
 * normals is within 5/sqrt(2n) of the true one but for 1 in 10^6): expert matrices N(0, 0.02^2),
 * routers N(0, (2/sqrt(C))^2) = N(0, 0.25^2) at C = 64 (init.c: router logits of std ~2). */
static void test_init_moe(void **state)
{
    (void)state;
    const td_arch archs[] = {TD_ARCH_QWEN2_MOE, TD_ARCH_QWEN3_MOE, TD_ARCH_MIXTRAL};
    const int moe_layers[] = {2, 1, 3};
    for (int k = 0; k < 3; k++) {
        char *dir = make_tmpdir();
        td_config cfg = moe_tiny(archs[k]);
        assert_int_equal(td_config_num_moe_layers(&cfg), moe_layers[k]);
        td_error err = {{0}};
        td_init_opts o = {0.02, 0.02, 0, 1.0, TD_OUTLIER_NORM, 0};
        assert_int_equal(td_checkpoint_init_random_opts(dir, &cfg, k == 1 ? TD_DT_BF16 : TD_DT_F32, 11, &o, "test", NULL,
                                                        &err), 0);
        td_checkpoint *ck = td_checkpoint_open(dir, &err);
        assert_non_null(ck);
        if (td_checkpoint_validate(ck, &err)) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(td_checkpoint_validate(ck, &err), 0);
        const td_config *c = td_checkpoint_config(ck);
        assert_memory_equal(c->mlp_only_layers, cfg.mlp_only_layers, sizeof cfg.mlp_only_layers);
        assert_true(c->num_experts == 8 && c->num_experts_per_tok == 2 && c->decoder_sparse_step == cfg.decoder_sparse_step);
        assert_int_equal(c->shared_expert_intermediate_size, archs[k] == TD_ARCH_QWEN2_MOE ? 64 : 0);
        assert_int_equal(td_checkpoint_num_tensors(ck), td_config_params(c, NULL, 0));
        /* every layer: a router and 8 experts if sparse, else the dense MLP */
        for (int l = 0; l < 3; l++) {
            char name[128];
            bool sparse = td_config_layer_moe(c, l);
            const char *blk = archs[k] == TD_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
            snprintf(name, sizeof name, "model.layers.%d.%s.gate.weight", l, blk);
            assert_int_equal(td_checkpoint_find(ck, name) != NULL, sparse);
            snprintf(name, sizeof name, archs[k] == TD_ARCH_MIXTRAL ? "model.layers.%d.block_sparse_moe.experts.7.w3.weight"
                                                                    : "model.layers.%d.mlp.experts.7.up_proj.weight", l);
            assert_int_equal(td_checkpoint_find(ck, name) != NULL, sparse);
            snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            assert_int_equal(td_checkpoint_find(ck, name) != NULL, sparse && archs[k] == TD_ARCH_QWEN2_MOE);
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
            assert_int_equal(td_checkpoint_find(ck, name) != NULL, !sparse);
        }
        double mean, sd;
        size_t count;
        role_stats(ck, TD_ROLE_ROUTER, &mean, &sd, &count);
        assert_int_equal(count, (size_t)moe_layers[k] * 8 * 64);
        assert_true(fabs(sd - 0.25) < 5 * 0.25 / sqrt(2.0 * count) && fabs(mean) < 5 * 0.25 / sqrt((double)count));
        role_stats(ck, TD_ROLE_E_GATE, &mean, &sd, &count);
        assert_int_equal(count, (size_t)moe_layers[k] * 8 * cfg.moe_intermediate_size * 64);
        assert_true(fabs(sd - 0.02) < 0.02 * 5 / sqrt(2.0 * count) + (k == 1 ? 0.02 * 0x1p-8 : 0));   /* bf16: 2^-9 rel */
        role_stats(ck, TD_ROLE_E_DOWN, &mean, &sd, &count);
        assert_true(fabs(sd - 0.02) < 0.02 * 5 / sqrt(2.0 * count) + (k == 1 ? 0.02 * 0x1p-8 : 0));
        if (archs[k] == TD_ARCH_QWEN2_MOE) {
            role_stats(ck, TD_ROLE_SH_ROUTE, &mean, &sd, &count);
            assert_int_equal(count, 2 * 64);
        }
        td_checkpoint_close(ck);
        /* the model loads, and a router std given explicitly is used */
        td_model *m = td_model_load(dir, &err);
        if (!m) fprintf(stderr, "%s\n", err.msg);
        assert_non_null(m);
        td_model_free(m);
        o.router_std = 0.5;
        assert_int_equal(td_checkpoint_init_random_opts(dir, &cfg, TD_DT_F32, 11, &o, "test", NULL, &err), 0);
        ck = td_checkpoint_open(dir, &err);
        role_stats(ck, TD_ROLE_ROUTER, &mean, &sd, &count);
        assert_true(fabs(sd - 0.5) < 5 * 0.5 / sqrt(2.0 * count));
        td_checkpoint_close(ck);
        rm_tree(dir);
    }
}

/* Rewrites DIR/model.safetensors without tensor `drop` (raw bytes, same dtypes and shapes). */
static void drop_tensor(const char *dir, const char *drop)
{
    td_error err = {{0}};
    td_checkpoint *ck = td_checkpoint_open(dir, &err);
    assert_non_null(ck);
    assert_non_null(td_checkpoint_find(ck, drop));
    char path[512];
    path_join(path, sizeof path, dir, "model.safetensors");
    td_st_writer *w = td_st_writer_new(path);
    for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
        const td_tensor *t = td_checkpoint_tensor(ck, i);
        if (strcmp(t->name, drop) != 0) assert_int_equal(td_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape, &err), 0);
    }
    assert_int_equal(td_st_writer_begin(w, &err), 0);
    for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
        const td_tensor *t = td_checkpoint_tensor(ck, i);
        if (strcmp(t->name, drop) != 0) assert_int_equal(td_st_writer_write_raw(w, t->name, t->data, t->nbytes, &err), 0);
    }
    assert_int_equal(td_st_writer_finish(w, &err), 0);   /* renames over the mapped file: the map keeps the old one */
    td_st_writer_free(w);
    td_checkpoint_close(ck);
}

/* A per-expert tensor (or the shared expert's gate) missing: the checkpoint opens, and
 * td_checkpoint_validate and td_model_load fail naming the tensor and the checkpoint. */
static void test_init_moe_missing_tensor(void **state)
{
    (void)state;
    struct { td_arch arch; const char *drop; } cases[] = {
        {TD_ARCH_QWEN2_MOE, "model.layers.2.mlp.experts.5.up_proj.weight"},
        {TD_ARCH_QWEN2_MOE, "model.layers.0.mlp.shared_expert_gate.weight"},
        {TD_ARCH_QWEN3_MOE, "model.layers.1.mlp.gate.weight"},
        {TD_ARCH_MIXTRAL, "model.layers.1.block_sparse_moe.experts.7.w2.weight"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *dir = make_tmpdir();
        td_config cfg = moe_tiny(cases[k].arch);
        td_error err = {{0}};
        assert_int_equal(td_checkpoint_init_random(dir, &cfg, TD_DT_F32, 5, "test", NULL, &err), 0);
        drop_tensor(dir, cases[k].drop);
        char want[256];
        snprintf(want, sizeof want, "missing tensor '%s'", cases[k].drop);
        td_checkpoint *ck = td_checkpoint_open(dir, &err);
        assert_non_null(ck);
        assert_null(td_checkpoint_find(ck, cases[k].drop));
        assert_int_not_equal(td_checkpoint_validate(ck, &err), 0);
        assert_true(contains_all(err.msg, dir, want, NULL));
        td_checkpoint_close(ck);
        memset(&err, 0, sizeof err);
        td_model *m = td_model_load(dir, &err);
        if (m) td_model_free(m);
        assert_null(m);
        assert_true(contains_all(err.msg, cases[k].drop, NULL));
        rm_tree(dir);
    }
}

/* Planted outlier channels in an MoE model keep the function exact: the post-attention norm's
 * channels are multiplied by S and every GEMM that reads the normed input has those input
 * columns divided by S: the router, each expert's gate/up, the shared expert's gate/up and its
 * sigmoid gate; the down projections and everything else unchanged. S = 8 (a power of two) so
 * the division is exact: compared bit for bit with the same seed unplanted. */
static void test_init_moe_outliers(void **state)
{
    (void)state;
    char *d0 = make_tmpdir(), *d1 = make_tmpdir();
    td_config cfg = moe_tiny(TD_ARCH_QWEN2_MOE);
    td_error err = {{0}};
    td_init_opts o0 = {0.02, 0.02, 0, 1.0, TD_OUTLIER_NORM, 0}, o1 = {0.02, 0.02, 3, 8.0, TD_OUTLIER_NORM, 0};
    assert_int_equal(td_checkpoint_init_random_opts(d0, &cfg, TD_DT_F32, 9, &o0, "a", NULL, &err), 0);
    assert_int_equal(td_checkpoint_init_random_opts(d1, &cfg, TD_DT_F32, 9, &o1, "b", NULL, &err), 0);
    int ch[3];
    td_init_outlier_channels(9, 64, 3, ch);
    td_checkpoint *c0 = td_checkpoint_open(d0, &err), *c1 = td_checkpoint_open(d1, &err);
    assert_true(c0 && c1);
    size_t n = td_config_params(&cfg, NULL, 0);
    td_param_spec *sp = malloc(n * sizeof *sp);
    td_config_params(&cfg, sp, n);
    int divided = 0;
    for (size_t i = 0; i < n; i++) {
        float f = 1.0f;
        switch (sp[i].role) {
        case TD_ROLE_ATTN_NORM: case TD_ROLE_MLP_NORM: f = 8.0f; break;
        case TD_ROLE_WQ: case TD_ROLE_WK: case TD_ROLE_WV: case TD_ROLE_W_GATE: case TD_ROLE_W_UP: case TD_ROLE_ROUTER:
        case TD_ROLE_E_GATE: case TD_ROLE_E_UP: case TD_ROLE_SH_GATE: case TD_ROLE_SH_UP: case TD_ROLE_SH_ROUTE:
            f = 0.125f; divided++; break;
        default: break;
        }
        const float *a = td_checkpoint_map_f32(c0, sp[i].name, sp[i].ndim, sp[i].shape, &err);
        const float *b = td_checkpoint_map_f32(c1, sp[i].name, sp[i].ndim, sp[i].shape, &err);
        assert_true(a && b);
        for (size_t j = 0; j < sp[i].numel; j++) {
            int col = (int)(j % 64), planted = col == ch[0] || col == ch[1] || col == ch[2];
            float want = planted ? a[j] * f : a[j];
            if (memcmp(&want, &b[j], sizeof want) != 0)
                fprintf(stderr, "%s[%zu]: %g, want %g\n", sp[i].name, j, (double)b[j], (double)want);
            assert_memory_equal(&want, &b[j], sizeof want);
        }
    }
    /* per MoE layer (0 and 2): q/k/v, router, 8 x (gate, up), shared gate/up/gate; layer 1: q/k/v, gate/up */
    assert_int_equal(divided, 2 * (3 + 1 + 16 + 3) + (3 + 2));
    free(sp);
    td_checkpoint_close(c0);
    td_checkpoint_close(c1);
    rm_tree(d0);
    rm_tree(d1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_reader_roundtrip),
        cmocka_unit_test(test_misaligned_and_nonfinite),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_init_each_arch),
        cmocka_unit_test(test_init_deterministic),
        cmocka_unit_test(test_init_moe),
        cmocka_unit_test(test_init_moe_missing_tensor),
        cmocka_unit_test(test_init_moe_outliers),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
