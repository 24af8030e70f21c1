/* tidal — the front door: lists the tools, as `git` with no arguments does, and runs one.
 *
 *   tidal                    the tools, grouped by job, and where the guides are
 *   tidal help [TOOL]        the same; with a tool, that tool's --help
 *   tidal TOOL [ARGS...]     runs tidal-TOOL ARGS... (`tidal diff --model ...`)
 *   tidal --version
 *
 * A tool is looked up beside this executable first (build/bin/, or PREFIX/bin after make
 * install), then on PATH, so an installed tidal runs its own tools. Every tool is a program of
 * its own (tools/tidal-*.c); this one only execs them. tests/py/test_docs.py checks that the
 * table below names every tools/tidal-*.c. */
#include "tidal/common.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;   /* without "tidal-" */
    const char *what;
} tool;

typedef struct {
    const char *job;
    tool tools[8];
} group;

static const group GROUPS[] = {
    {"diff precisions on a checkpoint (docs/diff.md)",
     {{"diff", "training vs inference path of a checkpoint under two recipes, per token, into HDF5"},
      {"report", "statistics of run files side by side, IS simulation (terminal, Markdown, JSON)"},
      {"heatmap", "PNG pictures of run files (positions, layers, densities, MoE routing)"},
      {"attribute", "which recipe field causes the mismatch (switch one, revert one, Shapley shares)"},
      {"headroom", "is FP16 safe: largest values per layer and op against 65504"},
      {"export", "a run file's rows as CSV (--group tokens|seqs|steps|...)"},
      {"merge", "joins the run files of tidal-diff --shard K/N jobs"},
      {NULL, NULL}}},
    {"collapse experiments (docs/collapse.md)",
     {{"rl", "GRPO with rollouts on the inference path, gradients on the training path"},
      {"sweep", "a grid of tidal-rl runs with N workers or a Slurm/Condor array, and its report"},
      {"sft", "supervised fine-tuning in TRL's dataset shapes, full or LoRA"},
      {"task", "verifiable tasks (add, sort, countdown): generate splits, score completions"},
      {"postmortem", "why a run collapsed: its folder's curves and checkpoints (HF/TRL, verl, tidal-rl)"},
      {NULL, NULL}}},
    {"checkpoints, tokens and numbers (docs/checkpoints.md)",
     {{"init", "a seeded random-init HF checkpoint of any Llama-family or MoE shape"},
      {"inspect", "a checkpoint's config, generation defaults, tensors, non-finite weights"},
      {"tokenize", "encode / decode with a HF tokenizer.json"},
      {"logprobs", "per-position log-probs of one token sequence, either path, any recipe"},
      {"cast", "a number in BF16, FP16, FP8 E4M3/E5M2 or E8M0, as NVIDIA rounds it"},
      {"bench-model", "throughput of the forward on a checkpoint (tokens/s, peak memory)"},
      {NULL, NULL}}},
};

static void list(FILE *f)
{
    fprintf(f, "usage: tidal TOOL [ARGS...]     (runs tidal-TOOL ARGS...)\n"
               "       tidal help [TOOL]\n"
               "\n"
               "tidal (Training-Inference Divergence Analysis Lab) measures how far an LLM's inference\n"
               "path drifts numerically from its training path on the same weights and tokens, in BF16,\n"
               "FP16 and FP8, and links that drift to RL training collapse. Each job is one tool:\n");
    for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0]; g++) {
        fprintf(f, "\n%s\n", GROUPS[g].job);
        for (const tool *t = GROUPS[g].tools; t->name; t++) fprintf(f, "   %-12s %s\n", t->name, t->what);
    }
    fprintf(f, "\n'tidal help TOOL' or 'tidal-TOOL --help' prints a tool's options; the guides are in the\n"
               "source tree's docs/ (docs/README.md), the reference of every option in docs/cli/.\n");
}

static const tool *find(const char *name)
{
    if (!strncmp(name, "tidal-", 6)) name += 6;
    for (size_t g = 0; g < sizeof GROUPS / sizeof GROUPS[0]; g++)
        for (const tool *t = GROUPS[g].tools; t->name; t++)
            if (!strcmp(t->name, name)) return t;
    return NULL;
}

/* Runs tidal-NAME with argv[0] set to it: the executable beside this one, else PATH's. */
static int run(const char *name, char **args)
{
    char prog[64], self[PATH_MAX], path[PATH_MAX + 64];
    snprintf(prog, sizeof prog, "tidal-%s", name);
    args[0] = prog;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/%s", self, prog);
            if (access(path, X_OK) == 0) execv(path, args);
        }
    }
    execvp(prog, args);
    fprintf(stderr, "tidal: cannot run %s: %s (built with the others by make; installed by make install)\n", prog,
            strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) { list(stdout); return 0; }
    const char *a = argv[1];
    if (!strcmp(a, "--version")) { printf("tidal (tidal) %s\n", TD_VERSION); return 0; }
    if (!strcmp(a, "help") || !strcmp(a, "--help") || !strcmp(a, "-h")) {
        if (argc < 3) { list(stdout); return 0; }
        const tool *t = find(argv[2]);
        if (!t) { fprintf(stderr, "tidal: '%s' is not a tidal tool ('tidal help' lists them)\n", argv[2]); return 2; }
        char *args[] = {NULL, "--help", NULL};
        return run(t->name, args);
    }
    const tool *t = find(a);
    if (!t) {
        fprintf(stderr, "tidal: '%s' is not a tidal tool; the tools are:\n\n", a);
        list(stderr);
        return 2;
    }
    return run(t->name, argv + 1);
}
