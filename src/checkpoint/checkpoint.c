/* Checkpoint directories: config, generation config, one file or an index of shards; tensor
 * lookup, shape-checked fp32 reads, zero-copy F32 maps. */
#include "ckpt_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const td_tensor *)a)->name, ((const td_tensor *)b)->name);
}

/* Sorts the tensor table by name (for bsearch) and rejects a name held by two shards. */
static int sort_tensors(td_checkpoint *ck, td_error *err)
{
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, cmp_tensor_name);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (strcmp(ck->tensors[i].name, ck->tensors[i - 1].name) == 0)
            return td_fail(err, "%s: tensor '%s' appears in both %s and %s", ck->path, ck->tensors[i].name,
                           ck->shards[ck->tensors[i - 1].shard].path, ck->shards[ck->tensors[i].shard].path);
    return 0;
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {name: "shard file"}}.
 * Each distinct shard is loaded once; then every weight_map entry must be found in the shard it
 * names (an index that points at the wrong shard is a broken checkpoint). */
static int load_index(td_checkpoint *ck, const char *dir, const char *index_path, td_error *err)
{
    json_t *idx = td_json_load_file(index_path, err);
    if (!idx) return -1;
    int rc = -1;
    json_t *wm = json_is_object(idx) ? json_object_get(idx, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        td_fail(err, "%s: missing \"weight_map\" object", index_path);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            td_fail(err, "%s: weight_map[\"%s\"] is not a file name string", index_path, name);
            goto done;
        }
        const char *file = json_string_value(v);
        if (file[0] == 0 || file[0] == '/' || strstr(file, "..")) {
            td_fail(err, "%s: weight_map[\"%s\"] = \"%s\" is not a file name inside the checkpoint",
                    index_path, name, file);
            goto done;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        bool loaded = false;
        for (int s = 0; s < ck->n_shards && !loaded; s++) loaded = strcmp(ck->shards[s].path, path) == 0;
        if (loaded) continue;
        if (!file_exists(path)) {
            td_fail(err, "%s: shard \"%s\" (holding '%s') does not exist: %s", index_path, file, name,
                    strerror(errno));
            goto done;
        }
        if (td_st_load_shard(ck, path, err) != 0) goto done;
    }
    if (ck->n_shards == 0) {
        td_fail(err, "%s: weight_map is empty", index_path);
        goto done;
    }
    if (sort_tensors(ck, err) != 0) goto done;
    json_object_foreach(wm, name, v) {
        const td_tensor *t = td_checkpoint_find(ck, name);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
        if (!t || strcmp(ck->shards[t->shard].path, path) != 0) {
            td_fail(err, "%s: weight_map says '%s' is in \"%s\" but that shard has no such tensor",
                    index_path, name, json_string_value(v));
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(idx);
    return rc;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

static void add_view(td_checkpoint *ck, const td_tensor *t, const char *name, size_t offset_elems, int64_t rows,
                     int64_t cols)
{
    if (ck->n_tensors == ck->cap_tensors) {
        ck->cap_tensors = ck->cap_tensors ? 2 * ck->cap_tensors : 64;
        ck->tensors = td_xrealloc(ck->tensors, ck->cap_tensors * sizeof *ck->tensors);
    }
    td_tensor *v = &ck->tensors[ck->n_tensors++];
    *v = *t;
    v->name = strdup(name);
    v->ndim = 2;
    v->shape[0] = rows;
    v->shape[1] = cols;
    v->numel = (size_t)rows * (size_t)cols;
    v->nbytes = v->numel * td_dtype_size(t->dtype);
    v->data = t->data + offset_elems * td_dtype_size(t->dtype);
}

/* transformers 5's fused experts, per MoE layer: PREFIX.gate_up_proj [E, 2 FE, C] (expert e's gate
 * rows, then its up rows) and PREFIX.down_proj [E, C, FE], PREFIX = model.layers.L.mlp.experts
 * (Mixtral too: transformers 5 names its block `mlp`, and its router mlp.gate). Each becomes the
 * per-expert tensors of the parameter table, as views into the same mapped bytes; a fused tensor of
 * another shape is an error naming both shapes. */
static int fused_expert_views(td_checkpoint *ck, td_error *err)
{
    const td_config *c = &ck->cfg;
    const int64_t E = c->num_experts, FE = c->moe_intermediate_size, C = c->hidden_size;
    int mixtral = c->arch == TD_ARCH_MIXTRAL, added = 0;
    size_t n0 = ck->n_tensors;   /* the sorted table; views are appended after it, sorted at the end */
    char name[160], view[160];
    for (int l = 0; l < c->num_layers; l++) {
        if (!td_config_layer_moe(c, l)) continue;
        static const char *part[2] = {"gate_up_proj", "down_proj"};
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, part[k]);
            td_tensor key = {.name = name};
            const td_tensor *t = bsearch(&key, ck->tensors, n0, sizeof key, cmp_tensor_name);
            if (!t) continue;
            int64_t want[3] = {E, k == 0 ? 2 * FE : C, k == 0 ? C : FE};
            if (t->ndim != 3 || t->shape[0] != want[0] || t->shape[1] != want[1] || t->shape[2] != want[2]) {
                char got[128], exp[128];
                shape_str(got, sizeof got, t->ndim, t->shape);
                shape_str(exp, sizeof exp, 3, want);
                return td_fail(err, "%s: tensor '%s' has shape %s, expected %s (transformers 5's fused experts: "
                               "num_experts x %s)", ck->shards[t->shard].path, name, got, exp,
                               k == 0 ? "2 moe_intermediate_size (gate rows, then up rows) x hidden_size"
                                      : "hidden_size x moe_intermediate_size");
            }
            td_tensor fused = *t;   /* the table grows under t */
            for (int e = 0; e < E; e++) {
                static const char *mx[3] = {"w1", "w3", "w2"}, *qw[3] = {"gate_proj", "up_proj", "down_proj"};
                const char *blk = mixtral ? "block_sparse_moe" : "mlp";
                if (k == 0) {
                    for (int h = 0; h < 2; h++) {
                        snprintf(view, sizeof view, "model.layers.%d.%s.experts.%d.%s.weight", l, blk, e,
                                 mixtral ? mx[h] : qw[h]);
                        add_view(ck, &fused, view, ((size_t)e * 2 * FE + (size_t)h * FE) * C, FE, C);
                    }
                } else {
                    snprintf(view, sizeof view, "model.layers.%d.%s.experts.%d.%s.weight", l, blk, e,
                             mixtral ? mx[2] : qw[2]);
                    add_view(ck, &fused, view, (size_t)e * C * FE, C, FE);
                }
                added++;
            }
        }
        if (mixtral) {   /* transformers 5's Mixtral router: mlp.gate */
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
            td_tensor key = {.name = name};
            const td_tensor *t = bsearch(&key, ck->tensors, n0, sizeof key, cmp_tensor_name);
            snprintf(view, sizeof view, "model.layers.%d.block_sparse_moe.gate.weight", l);
            if (t) {
                td_tensor r = *t;
                add_view(ck, &r, view, 0, r.ndim == 2 ? r.shape[0] : 0, r.ndim == 2 ? r.shape[1] : 0);
                added++;
            }
        }
    }
    return added ? sort_tensors(ck, err) : 0;
}

td_checkpoint *td_checkpoint_open(const char *path, td_error *err)
{
    td_checkpoint *ck = td_xcalloc(1, sizeof *ck);
    ck->path = strdup(path);
    td_gen_config_defaults(&ck->gen);
    char p[4096];
    if (!is_dir(path)) {
        if (!file_exists(path)) {
            td_fail(err, "%s: no such checkpoint directory or safetensors file", path);
            goto fail;
        }
        if (td_st_load_shard(ck, path, err) != 0) goto fail;
    } else {
        snprintf(p, sizeof p, "%s/config.json", path);
        if (!file_exists(p)) {
            td_fail(err, "%s: missing config.json (a Hugging Face checkpoint directory has one)", path);
            goto fail;
        }
        if (td_config_parse(p, &ck->cfg, err) != 0) goto fail;
        ck->has_config = true;
        snprintf(p, sizeof p, "%s/generation_config.json", path);
        if (file_exists(p)) {
            if (td_gen_config_parse(p, &ck->cfg, &ck->gen, err) != 0) goto fail;
        } else {
            td_gen_config_parse(NULL, &ck->cfg, &ck->gen, NULL);
        }
        char single[4096];
        snprintf(single, sizeof single, "%s/model.safetensors", path);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (file_exists(single)) {
            if (td_st_load_shard(ck, single, err) != 0) goto fail;
        } else if (file_exists(p)) {
            if (load_index(ck, path, p, err) != 0) goto fail;
        } else {
            td_fail(err, "%s: neither model.safetensors nor model.safetensors.index.json found", path);
            goto fail;
        }
    }
    if (sort_tensors(ck, err) != 0) goto fail;
    if (ck->has_config && ck->cfg.num_experts > 0 && fused_expert_views(ck, err) != 0) goto fail;
    return ck;
fail:
    td_checkpoint_close(ck);
    return NULL;
}

void td_checkpoint_close(td_checkpoint *ck)
{
    if (!ck) return;
    for (size_t i = 0; i < ck->n_tensors; i++) free(ck->tensors[i].name);
    free(ck->tensors);
    for (int s = 0; s < ck->n_shards; s++) {
        td_mmap_close(&ck->shards[s].map);
        if (ck->shards[s].meta) json_decref(ck->shards[s].meta);
        free(ck->shards[s].path);
    }
    free(ck->shards);
    free(ck->path);
    free(ck);
}

const td_config *td_checkpoint_config(const td_checkpoint *ck) { return ck->has_config ? &ck->cfg : NULL; }
const td_gen_config *td_checkpoint_generation(const td_checkpoint *ck) { return &ck->gen; }
const char *td_checkpoint_path(const td_checkpoint *ck) { return ck->path; }
size_t td_checkpoint_num_tensors(const td_checkpoint *ck) { return ck->n_tensors; }

const td_tensor *td_checkpoint_tensor(const td_checkpoint *ck, size_t i)
{
    return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

const char *td_checkpoint_shard_path(const td_checkpoint *ck, int shard)
{
    return shard >= 0 && shard < ck->n_shards ? ck->shards[shard].path : NULL;
}

const td_tensor *td_checkpoint_find(const td_checkpoint *ck, const char *name)
{
    td_tensor key = {.name = (char *)name};
    return bsearch(&key, ck->tensors, ck->n_tensors, sizeof key, cmp_tensor_name);
}

const char *td_checkpoint_metadata(const td_checkpoint *ck, const char *key)
{
    for (int s = 0; s < ck->n_shards; s++) {
        json_t *v = ck->shards[s].meta ? json_object_get(ck->shards[s].meta, key) : NULL;
        if (json_is_string(v)) return json_string_value(v);
    }
    return NULL;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, ndim == 1 ? ",)" : ")");
}

/* Finds `name` and checks its shape; error names the file, tensor and both shapes. */
static const td_tensor *find_checked(const td_checkpoint *ck, const char *name, int ndim,
                                     const int64_t *shape, td_error *err)
{
    const td_tensor *t = td_checkpoint_find(ck, name);
    if (!t) {
        td_fail(err, "%s: missing tensor '%s'", ck->path, name);
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        td_fail(err, "%s: tensor '%s' has shape %s, expected %s", ck->shards[t->shard].path, name, got, want);
        return NULL;
    }
    return t;
}

void td_tensor_to_f32(const td_tensor *t, float *dst, size_t *nonfinite)
{
    size_t es = td_dtype_size(t->dtype);
    td_format f = td_dtype_format(t->dtype);
    if ((uintptr_t)t->data % es == 0) {
        td_decode_row(f, t->data, dst, t->numel);
    } else {
        /* safetensors offsets need not be aligned to the element size: decode through an
         * aligned bounce buffer rather than read misaligned uint16s */
        enum { CH = 4096 };
        uint64_t buf[CH * 4 / sizeof(uint64_t)];
        for (size_t i = 0; i < t->numel; i += CH) {
            size_t m = t->numel - i < CH ? t->numel - i : CH;
            memcpy(buf, t->data + i * es, m * es);
            td_decode_row(f, buf, dst + i, m);
        }
    }
    if (nonfinite) {
        size_t bad = 0;
        for (size_t i = 0; i < t->numel; i++) bad += !isfinite(dst[i]);
        *nonfinite = bad;
    }
}

int td_checkpoint_read_f32(const td_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                           float *dst, size_t *nonfinite, td_error *err)
{
    const td_tensor *t = find_checked(ck, name, ndim, shape, err);
    if (!t) return -1;
    td_tensor_to_f32(t, dst, nonfinite);
    return 0;
}

const float *td_checkpoint_map_f32(const td_checkpoint *ck, const char *name, int ndim,
                                   const int64_t *shape, td_error *err)
{
    const td_tensor *t = find_checked(ck, name, ndim, shape, err);
    if (!t) return NULL;
    if (t->dtype != TD_DT_F32) {
        td_fail(err, "%s: tensor '%s' is %s, only F32 can be mapped as float", ck->shards[t->shard].path,
                name, td_dtype_name(t->dtype));
        return NULL;
    }
    if ((uintptr_t)t->data % _Alignof(float) != 0) {
        td_fail(err, "%s: tensor '%s' is not 4-byte aligned in the file", ck->shards[t->shard].path, name);
        return NULL;
    }
    return (const float *)t->data;
}

size_t td_checkpoint_count_nonfinite(const td_checkpoint *ck, size_t *n_tensors_bad)
{
    size_t total = 0, bad_tensors = 0;
    enum { CH = 1 << 16 };
    float *buf = td_xmalloc(CH * sizeof(float));
    for (size_t k = 0; k < ck->n_tensors; k++) {
        const td_tensor *t = &ck->tensors[k];
        size_t es = td_dtype_size(t->dtype), bad = 0;
        for (size_t i = 0; i < t->numel; i += CH) {
            td_tensor piece = *t;
            piece.numel = t->numel - i < CH ? t->numel - i : CH;
            piece.data = t->data + i * es;
            size_t b;
            td_tensor_to_f32(&piece, buf, &b);
            bad += b;
        }
        total += bad;
        bad_tensors += bad > 0;
    }
    free(buf);
    if (n_tensors_bad) *n_tensors_bad = bad_tensors;
    return total;
}

int td_checkpoint_validate(const td_checkpoint *ck, td_error *err)
{
    if (!ck->has_config) return td_fail(err, "%s: no config.json, cannot check tensors against it", ck->path);
    size_t n = td_config_params(&ck->cfg, NULL, 0);
    td_param_spec *specs = td_xmalloc(n * sizeof *specs);
    td_config_params(&ck->cfg, specs, n);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (!find_checked(ck, specs[i].name, specs[i].ndim, specs[i].shape, err)) rc = -1;
    free(specs);
    return rc;
}

size_t td_config_params(const td_config *c, td_param_spec *out, size_t cap)
{
    size_t n = 0, offset = 0;
    int expert_ = -1;
    const int64_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size;
    const int64_t QD = (int64_t)c->num_heads * c->head_dim, KD = (int64_t)c->num_kv_heads * c->head_dim;
#define ADD(kind_, role_, layer_, nd, d0, d1, ...)                                    \
    do {                                                                              \
        size_t numel_ = (size_t)(d0) * (size_t)((nd) == 2 ? (d1) : 1);                \
        if (n < cap) {                                                                \
            td_param_spec *s = &out[n];                                               \
            snprintf(s->name, sizeof s->name, __VA_ARGS__);                           \
            s->kind = kind_; s->role = role_; s->layer = layer_; s->ndim = nd;        \
            s->expert = expert_;                                                      \
            s->shape[0] = d0; s->shape[1] = d1;                                       \
            s->numel = numel_; s->offset = offset; s->dtype = TD_F32;                 \
        }                                                                             \
        offset += numel_;                                                             \
        n++;                                                                          \
    } while (0)
    ADD(TD_PARAM_EMBED, TD_ROLE_EMBED, -1, 2, V, C, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_layers; l++) {
        ADD(TD_PARAM_NORM, TD_ROLE_ATTN_NORM, l, 1, C, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(TD_PARAM_MATRIX, TD_ROLE_WQ, l, 2, QD, C, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(TD_PARAM_MATRIX, TD_ROLE_WK, l, 2, KD, C, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(TD_PARAM_MATRIX, TD_ROLE_WV, l, 2, KD, C, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->qkv_bias) {
            ADD(TD_PARAM_BIAS, TD_ROLE_BQ, l, 1, QD, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(TD_PARAM_BIAS, TD_ROLE_BK, l, 1, KD, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(TD_PARAM_BIAS, TD_ROLE_BV, l, 1, KD, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        ADD(TD_PARAM_MATRIX, TD_ROLE_WO, l, 2, C, QD, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->qk_norm) {
            /* Qwen3: per head (HD); OLMoE: over the whole projection (NH*HD, NKV*HD) */
            int64_t qn = c->qk_norm_full ? (int64_t)c->num_heads * c->head_dim : c->head_dim;
            int64_t kn = c->qk_norm_full ? (int64_t)c->num_kv_heads * c->head_dim : c->head_dim;
            ADD(TD_PARAM_NORM, TD_ROLE_Q_NORM, l, 1, qn, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(TD_PARAM_NORM, TD_ROLE_K_NORM, l, 1, kn, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(TD_PARAM_NORM, TD_ROLE_MLP_NORM, l, 1, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (!td_config_layer_moe(c, l)) {
            ADD(TD_PARAM_MATRIX, TD_ROLE_W_GATE, l, 2, F, C, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(TD_PARAM_MATRIX, TD_ROLE_W_UP, l, 2, F, C, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(TD_PARAM_MATRIX, TD_ROLE_W_DOWN, l, 2, C, F, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        const int64_t E = c->num_experts, FE = c->moe_intermediate_size, FS = c->shared_expert_intermediate_size;
        const char *blk = c->arch == TD_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
        ADD(TD_PARAM_MATRIX, TD_ROLE_ROUTER, l, 2, E, C, "model.layers.%d.%s.gate.weight", l, blk);
        for (int e = 0; e < E; e++) {
            expert_ = e;
            if (c->arch == TD_ARCH_MIXTRAL) {   /* w1 = gate, w3 = up, w2 = down */
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_GATE, l, 2, FE, C, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_UP, l, 2, FE, C, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_DOWN, l, 2, C, FE, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
            } else {
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_GATE, l, 2, FE, C, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_UP, l, 2, FE, C, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(TD_PARAM_MATRIX, TD_ROLE_E_DOWN, l, 2, C, FE, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        }
        expert_ = -1;
        if (FS > 0) {
            ADD(TD_PARAM_MATRIX, TD_ROLE_SH_GATE, l, 2, FS, C, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
            ADD(TD_PARAM_MATRIX, TD_ROLE_SH_UP, l, 2, FS, C, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
            ADD(TD_PARAM_MATRIX, TD_ROLE_SH_DOWN, l, 2, C, FS, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
            ADD(TD_PARAM_MATRIX, TD_ROLE_SH_ROUTE, l, 2, 1, C, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        }
    }
    ADD(TD_PARAM_NORM, TD_ROLE_FINAL_NORM, -1, 1, C, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) ADD(TD_PARAM_EMBED, TD_ROLE_LM_HEAD, -1, 2, V, C, "lm_head.weight");
#undef ADD
    return n;
}

size_t td_config_param_elems(const td_config *c)
{
    size_t n = td_config_params(c, NULL, 0);
    td_param_spec *specs = td_xmalloc(n * sizeof *specs);
    td_config_params(c, specs, n);
    size_t total = specs[n - 1].offset + specs[n - 1].numel;
    free(specs);
    return total;
}
