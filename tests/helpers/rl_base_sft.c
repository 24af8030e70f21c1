/* rl_base_sft — makes the base model of the RL experiment (reports/rl/) by supervised
 * fine-tuning a tidal-init checkpoint on a task dataset with libtidal's trainer: a driver, not
 * a user tool (tidal-sft is). The loss is the completion-only token cross-entropy (TRL's
 * SFTTrainer with completion_only_loss: prompt tokens masked), the response ends with EOS.
 *
 *   rl_base_sft --model DIR --dataset-path FILE.jsonl --output-dir DIR
 *               [--skip N] [--max-steps N] [--batch B] [--lr X] [--recipe NAME] [--seed S]
 *               [--save-every N] [--stop-after N]
 *
 * Records are taken in a seeded shuffled order, --skip N first lines left out (so the RL
 * prompts, the file's first lines, are not trained on). The tokenizer.json next to --model is
 * copied into the output (with tokenizer_config.json). Prints "step K loss L" every 25 steps.
 * --save-every N: also saves DIR/step-K every N steps (an under-trained base for RL).
 * --stop-after N: ends after step N (the schedule still spans --max-steps). */
#include "tidal/checkpoint.h"
#include "tidal/rng.h"
#include "tidal/tasks.h"
#include "tidal/tokenizer.h"
#include "tidal/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int usage(const char *m)
{
    fprintf(stderr, "rl_base_sft: %s (see tests/helpers/rl_base_sft.c)\n", m);
    return 2;
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    if (!a || !b) { if (a) fclose(a); return -1; }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    return fclose(b);
}

static int save(td_trainer *tr, const char *model, const char *dir, td_error *err)
{
    mkdir(dir, 0755);
    if (td_trainer_save(tr, dir, TD_DT_F32, "rl_base_sft", err)) return -1;
    const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/%s", model, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *out = NULL, *recipe = "fp32";
    int skip = 0, steps = 1000, batch = 32, save_every = 0, stop_after = 0;
    double lr = 1e-3;
    unsigned long long seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--dataset-path")) data = v;
        else if (!strcmp(a, "--output-dir")) out = v;
        else if (!strcmp(a, "--recipe")) recipe = v;
        else if (!strcmp(a, "--skip")) skip = atoi(v);
        else if (!strcmp(a, "--max-steps")) steps = atoi(v);
        else if (!strcmp(a, "--batch")) batch = atoi(v);
        else if (!strcmp(a, "--save-every")) save_every = atoi(v);
        else if (!strcmp(a, "--stop-after")) stop_after = atoi(v);
        else if (!strcmp(a, "--lr")) lr = atof(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else return usage("unknown option");
    }
    if (!model || !data || !out) return usage("--model, --dataset-path and --output-dir are required");
    td_error err;
    char tp[4200];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
    td_tokenizer *tok = td_tokenizer_load(tp, &err);
    if (!tok) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    int eos = td_tokenizer_eos_id(tok);
    td_task_item *items;
    size_t n;
    if (td_task_read_jsonl(data, &items, &n, &err)) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    if ((size_t)skip >= n) return usage("--skip leaves no record");
    size_t m = n - (size_t)skip;
    int **seqs = calloc(m, sizeof *seqs), *lens = calloc(m, sizeof *lens);
    float **w = calloc(m, sizeof *w);
    int maxlen = 0;
    for (size_t i = 0; i < m; i++) {
        const td_task_item *it = &items[skip + i];
        int32_t *p, *c;
        size_t np, nc;
        if (td_tokenizer_encode(tok, it->prompt, strlen(it->prompt), false, true, &p, &np, &err) ||
            td_tokenizer_encode(tok, it->completion, strlen(it->completion), false, false, &c, &nc, &err)) {
            fprintf(stderr, "rl_base_sft: %s\n", err.msg);
            return 1;
        }
        lens[i] = (int)(np + nc + 1);
        seqs[i] = malloc((size_t)lens[i] * sizeof(int));
        w[i] = calloc((size_t)lens[i], sizeof(float));
        for (size_t t = 0; t < np; t++) seqs[i][t] = p[t];
        for (size_t t = 0; t < nc; t++) seqs[i][np + t] = c[t];
        seqs[i][np + nc] = eos;
        for (int t = (int)np - 1; t + 1 < lens[i]; t++) w[i][t] = 1.0f;   /* targets np .. end */
        if (lens[i] > maxlen) maxlen = lens[i];
        free(p);
        free(c);
    }
    td_recipe r;
    if (td_recipe_resolve(recipe, &r, &err)) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    td_model *mod = td_model_load(model, &err);
    if (!mod) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.lr = lr;
    o.schedule = TD_SCHED_COSINE;
    o.warmup_ratio = 0.05;
    o.max_steps = steps;
    o.weight_decay = 0.01;
    o.max_seq_len = maxlen;
    o.max_tokens = maxlen * batch;
    td_trainer *tr = td_trainer_create(mod, &r, &o, NULL, &err);
    if (!tr) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    size_t *order = malloc(m * sizeof *order);
    for (size_t i = 0; i < m; i++) order[i] = i;
    td_rng rng;
    td_rng_stream(&rng, seed, 0);
    size_t cursor = m;
    const int **bt = malloc((size_t)batch * sizeof *bt);
    const float **bw = malloc((size_t)batch * sizeof *bw);
    int *bl = malloc((size_t)batch * sizeof *bl);
    double avg = 0;
    for (int k = 0; k < steps; k++) {
        for (int b = 0; b < batch; b++) {
            if (cursor == m) {   /* a new epoch: Fisher-Yates */
                for (size_t i = m - 1; i > 0; i--) {
                    size_t j = (size_t)(td_rng_uniform(&rng) * (double)(i + 1));
                    if (j > i) j = i;
                    size_t t = order[i]; order[i] = order[j]; order[j] = t;
                }
                cursor = 0;
            }
            size_t i = order[cursor++];
            bt[b] = seqs[i]; bw[b] = w[i]; bl[b] = lens[i];
        }
        double loss;
        td_step_info info;
        if (td_trainer_accumulate_sft(tr, batch, bt, bl, bw, 0, &loss, &err) ||
            td_trainer_step(tr, &info, &err)) {
            fprintf(stderr, "rl_base_sft: %s\n", err.msg);
            return 1;
        }
        avg += loss;
        if ((k + 1) % 25 == 0) {
            printf("step %d loss %.4f grad_norm %.3f lr %.3g\n", k + 1, avg / 25, info.grad_norm, info.lr);
            fflush(stdout);
            avg = 0;
        }
        if (save_every > 0 && (k + 1) % save_every == 0 && k + 1 < steps) {
            char d[4200];
            snprintf(d, sizeof d, "%s/step-%d", out, k + 1);
            if (save(tr, model, d, &err)) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
        }
        if (stop_after > 0 && k + 1 >= stop_after) return 0;
    }
    if (save(tr, model, out, &err)) { fprintf(stderr, "rl_base_sft: %s\n", err.msg); return 1; }
    td_trainer_free(tr);
    td_model_free(mod);
    td_task_items_free(items, n);
    td_tokenizer_free(tok);
    return 0;
}
