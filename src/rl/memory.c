/* tidal-rl's device memory (include/tidal/memplan.h): the trainer, the pi_old forward (and the
 * reference's), and the rollout session of all num-generations x prompts completions of a step,
 * planned before anything is allocated; printed, recorded in rl.h5 (memory_plan), and refused
 * with the numbers when the GPU's free memory does not hold it. */
#include "rl_internal.h"
#include "tidal/checkpoint.h"
#include "tidal/memplan.h"
#include "tidal/sft.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Whether rl/sync.c will run the LoRA sync on the device (its conditions there and in
 * td_trainer_base_to_device): merged, or merge-unmerge into a 16/32-bit engine from a 16/32-bit
 * base, the weights prepared on the device (not TIDAL_PREPARE_ON_HOST=1) */
static int sync_on_device(const td_rl_opts *o, const td_recipe *roll)
{
    const char *on_host = getenv("TIDAL_PREPARE_ON_HOST");
    if (o->lora_r <= 0 || !o->device || strncmp(o->device, "cuda", 4) != 0 || (on_host && *on_host && strcmp(on_host, "0")))
        return 0;
    if (o->lora_sync == TD_RL_SYNC_MERGED) return 1;
    td_format E = roll->weights, D = (td_format)o->model_dtype;
    return o->lora_sync == TD_RL_SYNC_MERGE_UNMERGE && E != TD_E4M3 && E != TD_E5M2 &&
           (D == TD_F32 || D == TD_BF16 || D == TD_F16);
}

static void plan_in(const td_rl_opts *o, const td_config *c, const td_recipe *train, const td_recipe *roll,
                    int max_len, int eval_len, td_memplan_train_in *in)
{
    int B = o->loss.micro_batch * o->loss.grad_accum;   /* a step's completions, decoded together */
    *in = (td_memplan_train_in){
        .cfg = c, .train = train, .infer = roll, .lora_rank = o->lora_r, .lora_modules = o->lora_modules,
        .lora_merged = o->lora_r > 0 && o->lora_sync == TD_RL_SYNC_MERGED,
        .engine_copy = o->lora_r > 0 && o->lora_sync == TD_RL_SYNC_MERGE_UNMERGE,
        .lora_sync_device = sync_on_device(o, roll),
        .gradient_checkpointing = o->gradient_checkpointing,
        .max_tokens = o->loss.micro_batch * max_len, .max_seq_len = max_len,
        .scoring_forwards = !rl_old_in_update(o) + (o->loss.beta > 0),   /* pi_old's own; the reference */
        .rollouts = 1,
        .reference_model = o->loss.beta > 0 && o->lora_r == 0,   /* rl/run.c: fref on R->model */
        .slots = B, .max_len = max_len, .sampler = 1, .nthreads = omp_get_max_threads(),
        /* --eval-steps: td_greedy_complete's session (B slots, the training recipe) beside the rollouts' */
        .eval = o->eval_steps > 0 && eval_len > 0 ? train : NULL, .eval_slots = B, .eval_len = eval_len};
}

/* device: NULL or not cuda -> the plan alone; refused when it does not fit. A LoRA sync planned
 * on the device whose copies do not fit runs on the host instead when that fits (*sync_host 1). */
static int plan(const td_rl_opts *o, td_memplan_train_in *in, int plan_only, char **json, int *sync_host,
                td_error *err)
{
    int on_gpu = o->device && strncmp(o->device, "cuda", 4) == 0;
    td_memplan_train p = {0};
    if (on_gpu && td_device_mem_info(o->device, &p.free, &p.device_total, err)) {
        if (!plan_only) return -1;
        fprintf(stderr, "tidal-rl: note: %s: the plan without the free memory\n", err->msg);
        on_gpu = 0;
    }
    td_memplan_train_compute(in, &p);
    if (on_gpu && in->lora_sync_device && !td_memplan_train_fits(&p)) {
        td_memplan_train_in h = *in;
        td_memplan_train q = {.free = p.free, .device_total = p.device_total};
        h.lora_sync_device = 0;
        td_memplan_train_compute(&h, &q);
        if (td_memplan_train_fits(&q)) {
            fprintf(stderr, "tidal-rl: note: the LoRA sync's device copies (%.1f MiB: the base in fp32%s) do not "
                    "fit: the sync runs on the host (the base prepared and uploaded at each sync)\n",
                    (double)(p.weights - q.weights) / (double)(1ull << 20),
                    in->engine_copy ? ", the engine's copy, W_0" : "");
            *in = h;
            p = q;
            if (sync_host) *sync_host = 1;
        }
    }
    td_memplan_train_print(stderr, "tidal-rl", &p, in);
    if (on_gpu && !o->ignore_memory_plan && !td_memplan_train_fits(&p))
        return td_memplan_train_refuse("tidal-rl", o->device, &p, in, err);
    if (on_gpu && json) *json = td_memplan_train_json(&p, in);
    return 0;
}

int rl_memory_plan(rl_run *R, td_error *err)
{
    const td_rl_opts *o = R->o;
    if (!o->device || strncmp(o->device, "cuda", 4) != 0) return 0;
    /* the evaluation's longest sequence: its longest prompt + --max-completion-length (step.c) */
    int eval_len = 0;
    if (o->eval_steps > 0 && R->n_eval > 0) {
        int longest = 0;
        for (size_t i = 0; i < R->n_eval; i++) {
            int n = 0;
            if (R->eval_len) {
                n = R->eval_len[i];
            } else {
                int *ids = NULL;
                td_error why;
                if (td_sft_encode_prompt(R->tkz, R->ev.items[i].prompt, R->V, &ids, &n, &why) == 0) free(ids);
            }
            if (n > longest) longest = n;
        }
        eval_len = longest + o->max_completion_length;
    }
    td_memplan_train_in in;
    plan_in(o, &R->model->cfg, &R->rtrain, &R->rroll, R->max_len, eval_len, &in);
    return plan(o, &in, 0, &R->memory_plan, &R->sync_host, err);
}

int rl_plan_only(const td_rl_opts *o, td_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", o->model_path);
    td_config c;
    td_recipe train, roll;
    if (td_config_parse(path, &c, err) || td_config_check_len(&c, o->max_seq_length, err) ||
        td_recipe_resolve(o->train_recipe, &train, err) ||
        td_recipe_resolve(o->exact_match ? o->train_recipe : o->rollout_recipe, &roll, err))
        return -1;
    fprintf(stderr, "tidal-rl: the plan for sequences of --max-seq-length %d tokens (prompt + completion at most), "
            "%d completions per step (%d per micro-batch)\n", o->max_seq_length,
            o->loss.micro_batch * o->loss.grad_accum, o->loss.micro_batch);
    td_memplan_train_in in;   /* the evaluation's prompts unknown too: --max-seq-length */
    plan_in(o, &c, &train, &roll, o->max_seq_length, o->max_seq_length, &in);
    return plan(o, &in, 1, NULL, NULL, err);
}
