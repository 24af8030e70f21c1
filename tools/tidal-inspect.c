/* tidal-inspect — summary of a Hugging Face checkpoint (or one .safetensors file): config,
 * generation defaults, tensor list (name dtype shape shard), non-finite weight count, and
 * whether the tensors match what the config says they should be.
 *
 *   tidal-inspect DIR|FILE.safetensors [--no-tensors] [--dump NAME]
 * --dump NAME prints that tensor's values as fp32, one per line ("%.9g", exact round trip):
 * the tests use it to compare tidal's decoding with Python's. Exit: 0 ok, 1 bad input or the
 * tensors do not fit the config. Non-finite weights are a warning, not an error. */
#include "tidal/checkpoint.h"
#include "tidal/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *path = NULL, *dump = NULL, *operand[1] = {NULL};
    int list = 1;
    td_opt opts[] = {
        TD_OPT_S("model", 0, &path, "DIR", "the checkpoint (or give it as the operand)"),
        TD_OPT_F("no-tensors", 0, &list, 0, "no tensor list"),
        TD_OPT_S("dump", 0, &dump, "NAME", "print that tensor's values as fp32, one per line (%.9g)"),
        {0}};
    td_cli cli = {"tidal-inspect", "DIR|FILE.safetensors [--no-tensors] [--dump NAME]",
                  "A checkpoint's config, what its generation_config.json sets, tensors (name dtype shape shard),\n"
                  "non-finite weights, and whether the tensors fit the config (exit 1 if not).", NULL, opts, 0, 1};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, operand, &nargs);
    if (rc0 >= 0) return rc0;
    if (operand[0] && path) return td_cli_bad(&cli, "--model", path, "one checkpoint (the operand names %s)", operand[0]);
    if (operand[0]) path = operand[0];
    if (!path) return td_cli_bad(&cli, "arguments", NULL, "expected the checkpoint DIR or FILE.safetensors");
    td_error err;
    td_checkpoint *ck = td_checkpoint_open(path, &err);
    if (!ck) { fprintf(stderr, "tidal-inspect: %s\n", err.msg); return 1; }

    if (dump) {
        const td_tensor *t = td_checkpoint_find(ck, dump);
        if (!t) { fprintf(stderr, "tidal-inspect: %s: missing tensor '%s'\n", path, dump); td_checkpoint_close(ck); return 1; }
        float *x = td_xmalloc(t->numel * sizeof(float));
        td_tensor_to_f32(t, x, NULL);
        for (size_t i = 0; i < t->numel; i++) printf("%.9g\n", x[i]);
        free(x);
        td_checkpoint_close(ck);
        return 0;
    }

    int rc = 0;
    const td_config *c = td_checkpoint_config(ck);
    if (c) {
        printf("%s: %s  V=%d C=%d F=%d L=%d NH=%d NKV=%d HD=%d  rope_theta=%g", path, td_arch_name(c->arch),
               c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads, c->num_kv_heads,
               c->head_dim, c->rope_theta);
        if (c->rope_factor > 0)
            printf(" rope_scaling=llama3(factor=%g low=%g high=%g orig=%d)", c->rope_factor, c->rope_low_freq_factor,
                   c->rope_high_freq_factor, c->rope_original_max_position);
        printf(" eps=%g max_pos=%d %s%s%s bos=%d eos=%d torch_dtype=%s\n", c->rms_norm_eps, c->max_position,
               c->tie_word_embeddings ? "tied" : "untied", c->qkv_bias ? " qkv_bias" : "", c->qk_norm ? " qk_norm" : "",
               c->bos_token_id, c->eos_token_id, c->torch_dtype[0] ? c->torch_dtype : "?");
        td_gen_config_print(stdout, td_checkpoint_generation(ck));
    } else {
        printf("%s: bare safetensors file (no config.json)\n", path);
    }
    const char *cmd = td_checkpoint_metadata(ck, "tidal_command");
    if (cmd) printf("written by: %s\n", cmd);

    size_t n = td_checkpoint_num_tensors(ck), params = 0, bytes = 0;
    int sharded = td_checkpoint_shard_path(ck, 1) != NULL;
    for (size_t i = 0; i < n; i++) {
        const td_tensor *t = td_checkpoint_tensor(ck, i);
        params += t->numel;
        bytes += t->nbytes;
        if (!list) continue;
        printf("  %-56s %-7s (", t->name, td_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
        printf(")");
        if (sharded) {
            const char *sp = td_checkpoint_shard_path(ck, t->shard), *slash = strrchr(sp, '/');
            printf("  %s", slash ? slash + 1 : sp);
        }
        printf("\n");
    }
    printf("%zu tensors, %zu parameters, %zu bytes\n", n, params, bytes);
    size_t bad_tensors = 0, bad = td_checkpoint_count_nonfinite(ck, &bad_tensors);
    if (bad) fprintf(stderr, "warning: %s: %zu non-finite weight values (NaN/Inf) in %zu tensors\n", path, bad, bad_tensors);
    else printf("non-finite weights: none\n");
    if (c && td_checkpoint_validate(ck, &err) != 0) {
        fprintf(stderr, "tidal-inspect: %s\n", err.msg);
        rc = 1;
    } else if (c) {
        printf("tensors match config: yes\n");
    }
    td_checkpoint_close(ck);
    return rc;
}
