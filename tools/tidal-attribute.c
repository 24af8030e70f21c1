/* tidal-attribute — which setting to change? For each field in which a recipe pair differs, the
 * mismatch with only that field switched, with only that field reverted, and its Shapley share.
 *
 *   tidal-diff --model DIR --prompts P -o run.h5 --recipe-a bf16-train --recipe-b bf16-infer
 *   tidal-attribute run.h5 [--plot attr.png] [--markdown|--json]
 *   tidal-attribute run.h5 --to-a fp16-train --to-b fp16-infer   (moving the pair: which side matters?)
 *   tidal-attribute --model DIR --prompts P --recipe-a A --recipe-b B   (runs the diff job first)
 * See include/tidal/attribute.h for the game and the replay (what is held fixed). */
#include "tidal/attribute.h"
#include "tidal/diff.h"
#include "tidal/opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *msg)
{
    fprintf(stderr, "tidal-attribute: %s\n", msg);
    return 1;
}

int main(int argc, char **argv)
{
    const char *run = NULL, *model = NULL, *prompts = NULL, *ra = NULL, *rb = NULL, *to_a = NULL, *to_b = NULL;
    const char *groups = NULL, *plot = NULL, *save_run = NULL;
    int by_side = 0, metric = 0, md = 0, json = 0, max_new = 64, batch = 8;
    unsigned long long seed = 0;
    td_attr_opts ao = {5, 64, 0};
    td_opt opts[] = {
        TD_OPT_S("model", 0, &model, "DIR", "checkpoint (with a run file: default its model_path)"),
        TD_OPT_S("prompts", 0, &prompts, "FILE", "no run file: run the diff job on these prompts first\n"
                 "(default sampling; make the run with tidal-diff for others)"),
        TD_OPT_S("recipe-a", 0, &ra, "NAME|FILE", "no run file: training path recipe (default bf16-train)"),
        TD_OPT_S("recipe-b", 0, &rb, "NAME|FILE", "no run file: inference path recipe (default bf16-infer)"),
        TD_OPT_I("max-new-tokens", 0, &max_new, "N", 1, 1 << 20, "no run file: tokens generated per prompt (default 64)"),
        TD_OPT_I("batch", 0, &batch, "B", 1, 4096, "no run file: prompts decoded together (default 8)"),
        TD_OPT_U("seed", 0, &seed, "S", "no run file: sampling seed (default 0)"),
        TD_OPT_S("save-run", 0, &save_run, "OUT.h5", "no run file: keep the diff job's run file here"),
        TD_OPT_S("to-a", 0, &to_a, "NAME|FILE", "transition: move the training path to this recipe"),
        TD_OPT_S("to-b", 0, &to_b, "NAME|FILE", "transition: move the inference path to this recipe"),
        TD_OPT_S("group", 0, &groups, "K1+K2,...", "recipe fields that move together as one player"),
        TD_OPT_F("by-side", 0, &by_side, 1, "two players: the training side and the inference side"),
        TD_OPT_C("metric", 0, &metric, "abs|kl", "what the table and plot show: mean |dlogp| (default)\nor mean KL(B||A)"),
        TD_OPT_I("exact-max", 0, &ao.exact_max, "N", 0, TD_ATTR_MAX_PLAYERS, "exact Shapley over every subset up to N players\n(default 5)"),
        TD_OPT_I("permutations", 0, &ao.permutations, "M", 1, 100000, "else M sampled orders (default 64)"),
        TD_OPT_U("shapley-seed", 0, (unsigned long long *)&ao.seed, "S", "seed of the sampled orders (default 0)"),
        TD_OPT_S("plot", 0, &plot, "FILE.png", "bar chart of the effects"),
        TD_OPT_F("markdown", 0, &md, 1, "Markdown table"),
        TD_OPT_F("json", 0, &json, 1, "the result as JSON on stdout"),
        {0}};
    td_cli cli = {"tidal-attribute", "RUN.h5 [options]\n--model DIR --prompts FILE [--recipe-a A --recipe-b B] [options]",
                  "Which setting to change? For each recipe field in which the training recipe A and the inference\n"
                  "recipe B differ: the mismatch with only that field switched (from A on both paths: the start\n"
                  "is the structure-only mismatch), with only that field reverted (from the pair), and its Shapley\n"
                  "share. With --to-a/--to-b: the same for moving the pair to another pair (e.g. bf16 to fp16:\n"
                  "what if only the inference side moves?). The tokens of the run (generated once by recipe B)\n"
                  "are held fixed and rescored under every configuration.",
                  "Needs a tidal-diff run in generate mode (RUN.h5, or --model/--prompts to make one).",
                  opts, 0, 1};
    const char *operands[1];
    int nargs, rc = td_cli_parse(&cli, argc, argv, operands, &nargs);
    if (rc >= 0) return rc;
    if (nargs) run = operands[0];
    if (!run && !(model && prompts)) return td_cli_bad(&cli, "RUN.h5", NULL, "give a tidal-diff run file, or --model and --prompts");
    if (run && (prompts || ra || rb || save_run))
        return td_cli_bad(&cli, prompts ? "--prompts" : ra ? "--recipe-a" : rb ? "--recipe-b" : "--save-run", NULL,
                          "applies without a run file (the run file has its prompts and recipes)");
    if (md && json) return td_cli_bad(&cli, "--json", NULL, "--json and --markdown exclude each other");
    td_error err;
    td_recipe a1, b1;
    if ((to_a && td_recipe_resolve(to_a, &a1, &err)) || (to_b && td_recipe_resolve(to_b, &b1, &err))) {
        fprintf(stderr, "tidal-attribute: %s\n", err.msg);
        return 2;
    }
    char *cmd = td_command_line(argc, argv);
    /* the temporary run goes under $TMPDIR as mkdtemp(1) would put it, /tmp without one */
    const char *tmpdir_env = getenv("TMPDIR");
    char tmp[4096], tmp_run[4120] = "";
    snprintf(tmp, sizeof tmp, "%s/tidal-attribute-XXXXXX", tmpdir_env && tmpdir_env[0] ? tmpdir_env : "/tmp");
    if (!run) {
        /* the diff job once: B generates, A scores; its run file is what gets replayed */
        td_diff_opts o = {.model_dir = model, .prompts_path = prompts, .recipe_a_arg = ra ? ra : "bf16-train",
                          .recipe_b_arg = rb ? rb : "bf16-infer", .max_new_tokens = max_new, .seed = seed, .batch = batch,
                          .shard_n = 1, .stop_at_eos = 1, .sampling = td_sampling_default(), .force = 1, .command_line = cmd};
        if (td_recipe_resolve(o.recipe_a_arg, &o.recipe_a, &err) || td_recipe_resolve(o.recipe_b_arg, &o.recipe_b, &err)) {
            fprintf(stderr, "tidal-attribute: %s\n", err.msg);
            free(cmd);
            return 2;
        }
        if (save_run) {
            if (td_make_parent_dirs(save_run, &err)) { free(cmd); return fail(err.msg); }
            o.out_path = save_run;
        } else {
            if (!mkdtemp(tmp)) { free(cmd); return fail("cannot create a temporary directory (set TMPDIR to a writable directory)"); }
            snprintf(tmp_run, sizeof tmp_run, "%s/run.h5", tmp);
            o.out_path = tmp_run;
        }
        td_diff_summary s;
        if (td_diff_run(&o, &s, &err)) {
            if (tmp_run[0]) { remove(tmp_run); rmdir(tmp); }
            free(cmd);
            return fail(err.msg);
        }
        run = o.out_path;
    }
    td_recipe a, b;
    td_rescorer *r = td_rescorer_open(run, run == tmp_run || save_run ? NULL : model, &a, &b, &err);
    rc = 1;
    td_attr_game g;
    unsigned *masks = NULL;
    size_t nm = 0;
    double *v_abs = NULL, *v_kl = NULL;
    td_recipe *pa = NULL, *pb = NULL;
    td_rescore_stat *st = NULL;
    json_t *res = NULL;
    if (!r) { fail(err.msg); goto out; }
    int transition = to_a || to_b;
    if (td_attr_game_init(&g, transition ? &a : &a, transition ? &b : &a, to_a ? &a1 : &a, to_b ? &b1 : &b, groups, by_side, &err)) {
        fail(err.msg);
        goto out;
    }
    td_attr_plan(&g, &ao, &masks, &nm);
    pa = td_xmalloc(nm * sizeof *pa);
    pb = td_xmalloc(nm * sizeof *pb);
    st = td_xcalloc(nm, sizeof *st);
    for (size_t i = 0; i < nm; i++)
        if (td_attr_pair(&g, masks[i], &pa[i], &pb[i], &err)) { fail(err.msg); goto out; }
    fprintf(stderr, "tidal-attribute: %d players, %zu configurations over %lld response tokens (the run's tokens, "
            "rescored; one A recipe scored once per configuration set)\n", g.n, nm, (long long)td_rescorer_tokens(r));
    if (td_rescorer_eval(r, (int)nm, pa, pb, st, stderr, &err)) { fail(err.msg); goto out; }
    size_t nv = (size_t)1 << g.n;
    v_abs = td_xmalloc(nv * sizeof(double));
    v_kl = td_xmalloc(nv * sizeof(double));
    for (size_t i = 0; i < nv; i++) v_abs[i] = v_kl[i] = NAN;
    for (size_t i = 0; i < nm; i++) { v_abs[masks[i]] = st[i].abs_dlogp; v_kl[masks[i]] = st[i].kl_ba; }
    res = td_attr_json(&g, &ao, v_abs, v_kl, td_rescorer_tokens(r));
    json_object_set_new(res, "run", json_string(save_run || run != tmp_run ? run : "(temporary)"));
    json_object_set_new(res, "command_line", json_string(cmd));
    if (plot) {
        if (td_make_parent_dirs(plot, &err) || td_attr_plot(res, metric, plot, cmd, &err)) { fail(err.msg); goto out; }
    }
    if (json) {
        json_dumpf(res, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
        fputc('\n', stdout);
    } else {
        if (md) printf("Made by `%s`.\n\n", cmd);
        td_attr_print(stdout, res, md, metric);
    }
    rc = fflush(stdout) ? 1 : 0;
out:
    td_rescorer_free(r);
    if (tmp_run[0]) { remove(tmp_run); rmdir(tmp); }
    free(masks); free(pa); free(pb); free(st); free(v_abs); free(v_kl); free(cmd);
    json_decref(res);
    return rc;
}
