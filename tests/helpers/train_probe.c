/* train_probe — a test and bench driver of libtidal's training step (include/tidal/train.h),
 * not a user tool (tidal-sft is): runs optimiser steps on one fixed batch and writes what the
 * Python cross-checks (tests/py/test_grad_torch.py) and the training bench
 * (tests/bench/train.sh) read.
 *
 *   train_probe --model DIR --batch FILE.json [--recipe NAME] [--steps K]
 *               [--dump-grads FILE] [--trace DIR] [--save DIR] [--logp FILE]
 *               [--lr X] [--weight-decay X] [--max-grad-norm X] [--lr-scheduler NAME]
 *               [--warmup-ratio X] [--max-steps N] [--beta1 X] [--beta2 X] [--eps X]
 *               [--lora-r R] [--lora-alpha A] [--lora-modules q_proj,v_proj,...]
 *               [--loss-scaling 0|1] [--init-scale X] [--growth-interval N]
 *               [--max-tokens N] [--logits-rows N] [--seed N] [--bench-seconds S]
 *               [--output-router-logits 0|1] [--router-aux-loss-coef X]
 *
 * FILE.json: {"tokens": [[ids...], ...], "mask": [[0/1 per target t = 1..len-1], ...]}
 * (mask optional: all targets). Per step prints
 *   step K loss L grad_norm G lr X loss_scale S skipped 0|1 [aux_loss A]
 * (aux_loss: the unscaled load-balancing loss, with --output-router-logits 1; L excludes it: the
 * loss trained is L + coef * A, coef = --router-aux-loss-coef, default config.json's)
 * --dump-grads FILE: the first step's gradients (td_trainer_dump_grads); --trace DIR: every
 * step's gradients DIR/grads_K.safetensors and masters after it DIR/step_K/ (fp32);
 * --logp FILE: the target log-probs the training path saw at the first step, one per line;
 * --bench-seconds S: repeat steps for at least S seconds and print "tokens_per_s X".
 * Exit 0, 1 on a failure (message on stderr), 2 on bad usage. */
#include "tidal/checkpoint.h"
#include "tidal/train.h"

#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int usage(const char *msg)
{
    fprintf(stderr, "train_probe: %s (see the header of tests/helpers/train_probe.c)\n", msg);
    return 2;
}

static double sft_logging(void *user, int seq, int n, const float *logp, float *dlogp)
{
    (void)seq;
    FILE *f = user;
    for (int t = 0; t < n; t++) {
        fprintf(f, "%.9g\n", logp[t]);
        dlogp[t] = 0.0f;   /* no gradient */
    }
    return 0.0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *batch = NULL, *recipe = "fp32", *dump = NULL, *trace = NULL;
    const char *save = NULL, *logp_path = NULL, *mods = NULL;
    int steps = 1;
    double bench = 0, aux_coef = NAN;
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.max_steps = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage("option without value");
        i++;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--batch")) batch = v;
        else if (!strcmp(a, "--recipe")) recipe = v;
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--dump-grads")) dump = v;
        else if (!strcmp(a, "--trace")) trace = v;
        else if (!strcmp(a, "--save")) save = v;
        else if (!strcmp(a, "--logp")) logp_path = v;
        else if (!strcmp(a, "--lr")) o.lr = atof(v);
        else if (!strcmp(a, "--weight-decay")) o.weight_decay = atof(v);
        else if (!strcmp(a, "--max-grad-norm")) o.max_grad_norm = atof(v);
        else if (!strcmp(a, "--beta1")) o.beta1 = atof(v);
        else if (!strcmp(a, "--beta2")) o.beta2 = atof(v);
        else if (!strcmp(a, "--eps")) o.eps = atof(v);
        else if (!strcmp(a, "--lr-scheduler")) {
            int s = td_lr_schedule_from_name(v);
            if (s < 0) return usage("unknown --lr-scheduler");
            o.schedule = (td_lr_schedule)s;
        }
        else if (!strcmp(a, "--warmup-ratio")) o.warmup_ratio = atof(v);
        else if (!strcmp(a, "--max-steps")) o.max_steps = atoi(v);
        else if (!strcmp(a, "--lora-r")) o.lora_r = atoi(v);
        else if (!strcmp(a, "--lora-alpha")) o.lora_alpha = atof(v);
        else if (!strcmp(a, "--lora-modules")) mods = v;
        else if (!strcmp(a, "--loss-scaling")) o.loss_scaling = atoi(v);
        else if (!strcmp(a, "--init-scale")) o.init_scale = atof(v);
        else if (!strcmp(a, "--growth-interval")) o.growth_interval = atoi(v);
        else if (!strcmp(a, "--max-tokens")) o.max_tokens = atoi(v);
        else if (!strcmp(a, "--logits-rows")) o.logits_rows = atoi(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--bench-seconds")) bench = atof(v);
        else if (!strcmp(a, "--output-router-logits")) o.output_router_logits = atoi(v);
        else if (!strcmp(a, "--router-aux-loss-coef")) aux_coef = atof(v);
        else return usage("unknown option");
    }
    if (!model || !batch || steps < 1) return usage("--model and --batch are required");
    if (o.max_steps <= 0) o.max_steps = steps;
    if (mods) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", mods);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            int m = td_lora_module_from_name(t);
            if (m < 0) return usage("unknown LoRA module");
            o.lora_modules |= 1u << m;
        }
    }

    td_error err;
    json_error_t je;
    json_t *root = json_load_file(batch, 0, &je);
    if (!root) { fprintf(stderr, "train_probe: %s: %s\n", batch, je.text); return 1; }
    json_t *jt = json_object_get(root, "tokens"), *jm = json_object_get(root, "mask");
    int nseq = (int)json_array_size(jt), maxlen = 0, total = 0;
    int **tok = calloc((size_t)nseq, sizeof *tok), *lens = calloc((size_t)nseq, sizeof *lens);
    float **mask = jm ? calloc((size_t)nseq, sizeof *mask) : NULL;
    for (int s = 0; s < nseq; s++) {
        json_t *row = json_array_get(jt, (size_t)s);
        lens[s] = (int)json_array_size(row);
        tok[s] = malloc((size_t)lens[s] * sizeof(int));
        for (int t = 0; t < lens[s]; t++) tok[s][t] = (int)json_integer_value(json_array_get(row, (size_t)t));
        if (mask) {
            mask[s] = calloc((size_t)lens[s], sizeof(float));
            json_t *mr = json_array_get(jm, (size_t)s);
            for (int t = 0; t + 1 < lens[s]; t++) mask[s][t] = (float)json_number_value(json_array_get(mr, (size_t)t));
        }
        maxlen = lens[s] > maxlen ? lens[s] : maxlen;
        total += lens[s];
    }
    o.max_seq_len = maxlen;
    if (o.max_tokens < maxlen) o.max_tokens = maxlen;
    if (o.max_tokens > total) o.max_tokens = total;

    td_recipe r;
    if (td_recipe_resolve(recipe, &r, &err)) { fprintf(stderr, "train_probe: %s\n", err.msg); return 1; }
    td_model *m = td_model_load(model, &err);
    if (!m) { fprintf(stderr, "train_probe: %s\n", err.msg); return 1; }
    o.router_aux_loss_coef = isnan(aux_coef) ? m->cfg.router_aux_loss_coef : aux_coef;
    td_trainer *tr = td_trainer_create(m, &r, &o, NULL, &err);
    if (!tr) { fprintf(stderr, "train_probe: %s\n", err.msg); return 1; }
    const int *const *tokens = (const int *const *)tok;
    const float *const *weights = (const float *const *)mask;
    if (trace) mkdir(trace, 0755);
    int rc = 0;
    if (logp_path) {   /* the log-probs the training path computes, before any update */
        FILE *f = fopen(logp_path, "w");
        double unused;
        if (!f || td_trainer_accumulate(tr, nseq, tokens, lens, sft_logging, f, &unused, &err)) {
            fprintf(stderr, "train_probe: %s\n", f ? err.msg : logp_path);
            return 1;
        }
        fclose(f);
        /* the logging loss has no derivative; the load-balancing loss's gradient and value go */
        td_trainer_zero_grads(tr);
        td_trainer_aux_loss(tr, 1);
    }
    double t0 = omp_get_wtime(), t1 = t0;
    long tokens_done = 0;
    for (int k = 0; k < steps || (bench > 0 && t1 - t0 < bench); k++) {
        double loss;
        if (td_trainer_accumulate_sft(tr, nseq, tokens, lens, weights, 0, &loss, &err)) { rc = 1; break; }
        if (k == 0 && dump &&
            td_trainer_dump_grads(tr, dump, nseq, tokens, lens, weights, 0, "train_probe", &err)) { rc = 1; break; }
        if (trace) {
            char p[4096];
            snprintf(p, sizeof p, "%s/grads_%d.safetensors", trace, k);
            if (td_trainer_dump_grads(tr, p, nseq, tokens, lens, weights, 0, "train_probe", &err)) { rc = 1; break; }
        }
        td_step_info info;
        if (td_trainer_step(tr, &info, &err)) { rc = 1; break; }
        tokens_done += total;
        t1 = omp_get_wtime();
        if (!bench)
        {
            printf("step %d loss %.9g grad_norm %.9g lr %.17g loss_scale %.17g skipped %d", k, loss,
                   info.grad_norm, info.lr, info.loss_scale, info.skipped);
            if (o.output_router_logits) printf(" aux_loss %.9g", td_trainer_aux_loss(tr, 1));
            printf("\n");
        }
        if (trace) {
            char p[4096];
            snprintf(p, sizeof p, "%s/step_%d", trace, k);
            if (td_trainer_save(tr, p, TD_DT_F32, "train_probe", &err)) { rc = 1; break; }
        }
    }
    if (rc == 0 && bench) printf("tokens_per_s %.3f\n", tokens_done / (t1 - t0));
    if (rc == 0 && save && td_trainer_save(tr, save, TD_DT_F32, "train_probe", &err)) rc = 1;
    if (rc) fprintf(stderr, "train_probe: %s\n", err.msg);
    td_trainer_free(tr);
    td_model_free(m);
    for (int s = 0; s < nseq; s++) { free(tok[s]); if (mask) free(mask[s]); }
    free(tok); free(lens); free(mask);
    json_decref(root);
    return rc;
}
