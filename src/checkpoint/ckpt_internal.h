/* Internal to src/checkpoint: one mapped safetensors file and the checkpoint that owns them. */
#ifndef TIDAL_CKPT_INTERNAL_H
#define TIDAL_CKPT_INTERNAL_H

#include "tidal/checkpoint.h"
#include "tidal/io.h"

/* The header may not be longer than this even when the file is (a bad length field must not
 * make tidal parse gigabytes of "JSON"); real headers are well under 10 MB. */
#define TD_ST_MAX_HEADER ((size_t)100 << 20)

typedef struct {
    char *path;
    td_mmap map;
    json_t *meta;            /* "__metadata__" object or NULL */
} td_shard;

struct td_checkpoint {
    char *path;
    bool has_config;
    td_config cfg;
    td_gen_config gen;
    td_shard *shards;
    int n_shards;
    td_tensor *tensors;      /* sorted by name */
    size_t n_tensors, cap_tensors;
};

/* Maps `path` as shard number `shard_index` of ck and appends its tensors (not yet sorted). */
int td_st_load_shard(td_checkpoint *ck, const char *path, td_error *err);

#endif
