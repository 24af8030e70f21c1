/* tidal — what tidal-sft writes (include/tidal/sft.h): a Hugging Face model directory of the
 * trainer's weights with the tokenizer and generation config beside them, and for checkpoints
 * the resumable state (optimizer.safetensors, trainer_state.json). Every file goes through a
 * temporary name and a rename. */
#include "sft_internal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* the tokenizer file(s) tidal-sft copies beside the model */
static const char *const TOK_FILES[] = {"tokenizer.json", "tokenizer_config.json"};
/* A failed rename of a finished temporary: say why, and remove the temporary. */
static int rename_failed(const char *tmp, const char *path, td_error *err)
{
    int e = errno;
    remove(tmp);
    return td_fail(err, "%s: cannot rename %s to it: %s", path, tmp, strerror(e));
}

/* everything tidal-sft may write in a checkpoint directory */
static const char *const CKPT_FILES[] = {
    "model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "trainer_state.json"};

static int copy_file(const char *from, const char *to, td_error *err)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", to);
    FILE *in = fopen(from, "rb");
    if (!in) return td_fail(err, "%s: cannot read: %s", from, strerror(errno));
    FILE *out = fopen(tmp, "wb");
    if (!out) { fclose(in); return td_fail(err, "%s: cannot write: %s", tmp, strerror(errno)); }
    char buf[65536];
    size_t k;
    int bad = 0;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) bad |= fwrite(buf, 1, k, out) != k;
    bad |= ferror(in);
    fclose(in);
    bad |= fclose(out) != 0;
    if (bad || rename(tmp, to) != 0) {
        remove(tmp);
        return td_fail(err, "%s: cannot write: %s", to, strerror(errno));
    }
    return 0;
}

/* The folder of the tokenizer (tokenizer_path: a folder or a tokenizer.json). */
static void tokenizer_dir(const td_sft_opts *o, char *buf, size_t cap)
{
    const char *p = o->tokenizer_path ? o->tokenizer_path : o->model_path;
    struct stat st;
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) { snprintf(buf, cap, "%s", p); return; }
    const char *slash = strrchr(p, '/');
    if (!slash) snprintf(buf, cap, ".");
    else snprintf(buf, cap, "%.*s", (int)(slash - p), p);
}

static int write_json(const char *path, json_t *j, td_error *err)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    errno = 0;
    int rc = json_dump_file(j, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (rc != 0 || rename(tmp, path) != 0) {
        int e = errno;   /* json_dump_file's failed write or close, or the rename's */
        remove(tmp);
        return td_fail(err, "%s: cannot write: %s", path, e ? strerror(e) : "write failed");
    }
    return 0;
}

int sft_save_dir(const td_trainer *tr, const td_sft_opts *o, const td_tokenizer *tok, const char *dir,
                 int with_state, const sft_progress *p, td_error *err)
{
    char path[4300], tmp[4300], src[4300];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));
    if (td_trainer_save(tr, dir, o->save_dtype, o->command, err)) return -1;
    if (!td_trainer_lora(tr)) {   /* config.json with the tokenizer's bos/eos; generation_config.json */
        td_config c = td_trainer_model(tr)->cfg;
        c.bos_token_id = td_tokenizer_bos_id(tok);
        c.eos_token_id = td_tokenizer_eos_id(tok);
        c.eos_token_ids[0] = c.eos_token_id;
        c.n_eos = c.eos_token_id >= 0;
        snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s", o->save_dtype == TD_DT_BF16 ? "bfloat16" : "float32");
        snprintf(path, sizeof path, "%s/config.json", dir);
        snprintf(tmp, sizeof tmp, "%s/config.json.tmp", dir);
        if (td_config_write(tmp, &c, err)) { remove(tmp); return -1; }
        if (rename(tmp, path) != 0) return rename_failed(tmp, path, err);
        td_gen_config g;
        td_gen_config_defaults(&g);
        g.bos_token_id = c.bos_token_id;
        g.eos_token_ids[0] = c.eos_token_id;
        g.n_eos = c.n_eos;
        g.do_sample = true;
        g.temperature = 1.0;
        g.top_p = 1.0;
        g.top_k = 0;
        g.present = TD_GEN_DO_SAMPLE | TD_GEN_TEMPERATURE | TD_GEN_TOP_P | TD_GEN_TOP_K | TD_GEN_BOS | TD_GEN_EOS;
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        snprintf(tmp, sizeof tmp, "%s/generation_config.json.tmp", dir);
        if (td_gen_config_write(tmp, &g, err)) { remove(tmp); return -1; }
        if (rename(tmp, path) != 0) return rename_failed(tmp, path, err);
    }
    char tdir[4096];
    tokenizer_dir(o, tdir, sizeof tdir);
    for (size_t i = 0; i < sizeof TOK_FILES / sizeof *TOK_FILES; i++) {
        snprintf(src, sizeof src, "%s/%s", tdir, TOK_FILES[i]);
        snprintf(path, sizeof path, "%s/%s", dir, TOK_FILES[i]);
        if (access(src, R_OK) == 0 && copy_file(src, path, err)) return -1;
    }
    if (!with_state) return 0;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (with_state > 1 && td_trainer_save_state(tr, path, err)) return -1;
    json_t *j = json_pack("{s:i, s:I, s:f, s:s, s:s, s:s}", "global_step", p->global_step, "skipped_steps",
                          (json_int_t)p->skipped, "epoch", p->epoch, "seed", "", "command",
                          o->command ? o->command : "", "tidal_version", TD_VERSION);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);   /* a string: JSON integers stop at 2^53 */
    json_object_set_new(j, "seed", json_string(seed));
    json_t *set = p->settings[0] ? json_loads(p->settings, 0, NULL) : NULL;
    if (set) json_object_set_new(j, "tidal_settings", set);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    int rc = write_json(path, j, err);
    json_decref(j);
    return rc;
}

int sft_latest_checkpoint(const char *output_dir, char *buf, size_t cap)
{
    DIR *d = opendir(output_dir);
    if (!d) return 0;
    int best = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int k, n = 0;
        if (sscanf(e->d_name, "checkpoint-%d%n", &k, &n) == 1 && e->d_name[n] == 0 && k > best) best = k;
    }
    closedir(d);
    if (best) snprintf(buf, cap, "%s/checkpoint-%d", output_dir, best);
    return best;
}

int sft_read_progress(const char *dir, sft_progress *p, td_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return td_fail(err, "%s: %s", path, je.text);
    json_t *gs = json_object_get(j, "global_step"), *sk = json_object_get(j, "skipped_steps"),
           *ep = json_object_get(j, "epoch"), *sd = json_object_get(j, "seed");
    int rc = 0;
    if (!json_is_integer(gs) || !json_is_integer(sk) || !json_is_number(ep) || !json_is_string(sd))
        rc = td_fail(err, "%s: expected global_step, skipped_steps, epoch and seed", path);
    else {
        p->global_step = (int)json_integer_value(gs);
        p->skipped = (long)json_integer_value(sk);
        p->epoch = json_number_value(ep);
        p->seed = strtoull(json_string_value(sd), NULL, 10);
        json_t *set = json_object_get(j, "tidal_settings");
        char *t = json_is_object(set) ? json_dumps(set, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        snprintf(p->settings, sizeof p->settings, "%s", t ? t : "");
        free(t);
    }
    json_decref(j);
    return rc;
}

void sft_remove_dir(const char *dir)
{
    char path[4300];
    for (size_t i = 0; i < sizeof CKPT_FILES / sizeof *CKPT_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, CKPT_FILES[i]);
        remove(path);
        snprintf(path, sizeof path, "%s/%s.tmp", dir, CKPT_FILES[i]);
        remove(path);
    }
    rmdir(dir);
}

int sft_publish(const char *tmpdir, const char *dir, td_error *err)
{
    char from[4300], to[4300];
    for (size_t i = 0; i < sizeof CKPT_FILES / sizeof *CKPT_FILES; i++) {
        snprintf(from, sizeof from, "%s/%s", tmpdir, CKPT_FILES[i]);
        snprintf(to, sizeof to, "%s/%s", dir, CKPT_FILES[i]);
        if (access(from, F_OK) != 0) continue;
        if (rename(from, to) != 0) return td_fail(err, "%s: cannot rename to %s: %s", from, to, strerror(errno));
    }
    return rmdir(tmpdir) == 0 ? 0 : td_fail(err, "%s: cannot remove: %s", tmpdir, strerror(errno));
}
