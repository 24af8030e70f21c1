/* Fuzz target: model.safetensors.index.json of a sharded checkpoint. The directory holds a
 * valid tiny config.json and two small valid shards made once with tidal's own writer; the
 * input is the index, which names tensors and shard files (relative paths: "../x", "/etc"...
 * must be refused). Then the checkpoint is validated against its config. */
#include "fuzz_util.h"
#include "tidal/checkpoint.h"

#include <sys/stat.h>

static char ckdir[600];

static void write_shard(const char *file, const char *t1, const char *t2)
{
    char path[800];
    snprintf(path, sizeof path, "%s/%s", ckdir, file);
    td_error err;
    td_st_writer *w = td_st_writer_new(path);
    int64_t s1[2] = {2, 3}, s2[1] = {4};
    float x[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    if (td_st_writer_declare(w, t1, TD_DT_F32, 2, s1, &err) ||
        td_st_writer_declare(w, t2, TD_DT_BF16, 1, s2, &err) || td_st_writer_begin(w, &err) ||
        td_st_writer_write_f32(w, t1, x, 6, &err) || td_st_writer_write_f32(w, t2, x, 4, &err) ||
        td_st_writer_finish(w, &err)) {
        fprintf(stderr, "fuzz_shard_index setup: %s\n", err.msg);
        abort();
    }
    td_st_writer_free(w);
}

static void setup(void)
{
    snprintf(ckdir, sizeof ckdir, "%s/ck", fz_tmpdir());
    mkdir(ckdir, 0755);
    td_config cfg = {0};
    cfg.arch = TD_ARCH_LLAMA;
    td_error err;
    char path[800];
    snprintf(path, sizeof path, "%s/config.json", ckdir);
    if (td_config_preset("tiny", &cfg) || td_config_write(path, &cfg, &err)) abort();
    write_shard("model-00001-of-00002.safetensors", "model.embed_tokens.weight", "model.norm.weight");
    write_shard("model-00002-of-00002.safetensors", "lm_head.weight", "model.layers.0.input_layernorm.weight");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ckdir[0]) setup();
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", ckdir);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
    td_error err;
    td_checkpoint *ck = td_checkpoint_open(ckdir, &err);
    if (!ck) return 0;
    for (size_t i = 0; i < td_checkpoint_num_tensors(ck); i++) {
        const td_tensor *t = td_checkpoint_tensor(ck, i);
        if (td_checkpoint_shard_path(ck, t->shard) == NULL) abort();
    }
    td_checkpoint_validate(ck, &err);
    td_checkpoint_close(ck);
    return 0;
}
