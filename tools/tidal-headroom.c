/* tidal-headroom — is FP16 safe for this checkpoint? Per layer and op, the largest |value|
 * against 65504, overflows and values below FP16's normal range, on the user's prompts.
 *
 *   tidal-headroom --model DIR --prompts FILE [--recipe fp32] [--all] [--markdown|--json]
 *   tidal-headroom --run RUN.h5            (the prompts + generated responses of a tidal-diff run)
 */
#include "tidal/checkpoint.h"
#include "tidal/headroom.h"
#include "tidal/opts.h"
#include "tidal/runfile.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    const char *model = NULL, *prompts = NULL, *run = NULL, *recipe = "fp32";
    int all = 0, md = 0, json = 0;
    td_opt opts[] = {
        TD_OPT_S("model", 0, &model, "DIR", "checkpoint directory (with --run: default the run's model_path)"),
        TD_OPT_S("prompts", 0, &prompts, "FILE", "prompts JSONL (text, tokens, or rollouts with their responses)"),
        TD_OPT_S("run", 0, &run, "RUN.h5", "use a tidal-diff run file's prompt + response tokens instead"),
        TD_OPT_S("recipe", 0, &recipe, "NAME|FILE", "recipe the forward runs under (default fp32: the magnitudes\n"
                 "FP16 would have to hold)"),
        TD_OPT_F("all", 0, &all, 1, "every layer and op (default: those near the limit, or the\n10 largest)"),
        TD_OPT_F("markdown", 0, &md, 1, "Markdown tables"),
        TD_OPT_F("json", 0, &json, 1, "everything as JSON on stdout"),
        {0}};
    td_cli cli = {"tidal-headroom", "--model DIR --prompts FILE [options]\n--run RUN.h5 [options]",
                  "Is FP16 safe for this checkpoint? Runs the teacher-forced forward over the prompts and reports,\n"
                  "per layer and op output, the largest |value| against FP16's 65504, how many values would\n"
                  "overflow to inf (|x| >= 65520) and how many fall below FP16's normal range (2^-14, 6.1e-5) or\n"
                  "flush to zero (2^-25); and the same for the weights.",
                  "Op outputs are what kernels write in the activation dtype; fp32 accumulators inside kernels\n"
                  "(GEMM sums, softmax, norm statistics) are not counted. Exit status 0 whether or not it is safe\n"
                  "(the verdict is in the output and in --json's fp16_safe).",
                  opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    if (!!prompts + !!run != 1) return td_cli_bad(&cli, "--prompts", NULL, "give --prompts FILE or --run RUN.h5 (one of them)");
    if (md && json) return td_cli_bad(&cli, "--json", NULL, "--json and --markdown exclude each other");
    td_error err;
    td_recipe r;
    if (td_recipe_resolve(recipe, &r, &err)) { fprintf(stderr, "tidal-headroom: %s\n", err.msg); return 2; }
    char *model_path = NULL;
    if (!model && run) {
        td_runfile *rf = td_runfile_open(run, 0, &err);
        if (!rf || !(model_path = td_runfile_get_str(rf, "model_path", &err))) {
            if (rf) td_runfile_close(rf, NULL);
            fprintf(stderr, "tidal-headroom: %s\n", err.msg);
            return 1;
        }
        td_runfile_close(rf, NULL);
        model = model_path;
    }
    if (!model) return td_cli_bad(&cli, "--model", NULL, "required (DIR)");
    td_seqset s;
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    td_config cfg;
    if (td_config_parse(cfg_path, &cfg, &err) ||
        (run ? td_seqset_from_run(&s, run, &err)
             : td_seqset_from_prompts(&s, model, prompts, cfg.vocab_size, cfg.max_position > 0 ? cfg.max_position : 1 << 20, &err))) {
        fprintf(stderr, "tidal-headroom: %s\n", err.msg);
        free(model_path);
        return 1;
    }
    td_headroom h;
    rc = td_headroom_run(model, &s, &r, &h, stderr, &err);
    td_seqset_free(&s);
    if (rc) { fprintf(stderr, "tidal-headroom: %s\n", err.msg); free(model_path); return 1; }
    char *cmd = td_command_line(argc, argv);
    if (json) {
        json_t *j = td_headroom_json(&h);
        json_object_set_new(j, "command_line", json_string(cmd));
        json_object_set_new(j, "model", json_string(model));
        json_object_set_new(j, "recipe", json_string(r.name));
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
        fputc('\n', stdout);
        json_decref(j);
    } else {
        if (md) printf("# FP16 headroom: %s\n\nRecipe %s. Made by `%s`.\n\n", model, r.name, cmd);
        td_headroom_print(stdout, &h, md, all);
    }
    free(cmd);
    free(model_path);
    td_headroom_free(&h);
    return fflush(stdout) ? 1 : 0;
}
