/* The diff job's device memory (include/tidal/memplan.h): the plan printed before the run,
 * the batch and the training path's micro-batch lowered to what the GPU's free memory holds,
 * and a refusal with the numbers when one sequence does not fit. */
#include "job.h"
#include "tidal/memplan.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* bytes as GiB, or MiB below one GiB */
static const char *human(char *buf, size_t n, size_t b)
{
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
    else snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    return buf;
}

/* The component that weighs most, for the refusal's message. */
static const char *largest(const td_memplan *p)
{
    size_t acts = p->acts_a + p->acts_b;
    if (p->weights >= p->kv_cache && p->weights >= acts && p->weights >= p->workspace) return "weights";
    if (p->kv_cache >= acts && p->kv_cache >= p->workspace) return "KV cache";
    if (acts >= p->workspace) return "activations";
    return "workspace";
}

int diff_metrics_on_host(void)
{
    const char *host_rows = getenv("TIDAL_METRICS_ON_HOST");   /* diagnostic: the download path */
    return host_rows && *host_rows && strcmp(host_rows, "0");
}

int diff_memory_plan(job *J, td_diff_opts *o, const td_config *cfg, td_format storage, int *fwd_tokens,
                     int *chunk, int *slots, td_error *err)
{
    int gen = !J->prompts.has_rollouts;
    /* a batch never holds more sequences than the shard has: no slot or row is made for more */
    int most = o->batch < (int64_t)J->n_mine ? o->batch : J->n_mine > 0 ? (int)J->n_mine : 1;
    int tokens = o->max_batched_tokens ? o->max_batched_tokens : J->max_len * (most < 4 ? most : 4);
    if (tokens < J->max_len)
        return td_fail(err, "--max-num-batched-tokens %d is below the longest sequence (%d tokens: prompt + "
                       "--max-new-tokens): the training path scores each sequence whole", tokens, J->max_len);
    int on_gpu = o->device && strncmp(o->device, "cuda", 4) == 0;
    td_memplan_in in = {.cfg = cfg, .storage = storage, .a = &o->recipe_a, .b = gen ? &o->recipe_b : NULL,
                        .lora = J->lora, .lora_mode_a = o->lora_merge_a, .lora_mode_b = o->lora_merge_b,
                        .fwd_tokens = tokens, .fwd_seq_len = J->max_len, .fwd_logits_rows = 0,
                        .slots = gen ? most : 0, .max_len = J->max_len, .chunk = 128,
                        .nthreads = omp_get_max_threads()};
    if (in.chunk > tokens) in.chunk = tokens;
    /* B's rows of a batch wait on the device for A (the metrics computed there): every scored
     * position of a slot, the prompt's too with --score-prompt */
    J->keep_rows = 0;
    if (gen && on_gpu && !diff_metrics_on_host())
        in.keep_rows = o->score_prompt ? J->max_len - 1 : o->max_new_tokens;
    *fwd_tokens = tokens;
    *chunk = in.chunk;
    *slots = most;
    if (!on_gpu && !o->plan_only) return 0;   /* host memory: the CPU's own business */
    td_memplan p = {0};
    if (on_gpu && td_device_mem_info(o->device, &p.free, &p.device_total, err)) {
        if (!o->plan_only) return -1;
        fprintf(stderr, "tidal-diff: note: %s: the plan without the free memory\n", err->msg);
        on_gpu = 0;   /* --plan-only on a machine without the GPU: the plan alone */
    }
    int batch0 = in.slots, tokens0 = in.fwd_tokens, fits = 1;
    if (on_gpu && !o->ignore_memory_plan) {
        td_memplan_in in0 = in;
        fits = td_memplan_fit(&in, &p) == 0;
        if (in0.keep_rows && (!fits || in.slots != batch0 || in.fwd_tokens != tokens0)) {
            /* keeping B's rows would cost batch or micro-batch: they come to the host instead */
            char h[32];
            fprintf(stderr, "tidal-diff: note: B's rows for the per-token metrics (%s at --batch %d) do not fit "
                    "the GPU beside the rest: they are downloaded per decode step and the metrics computed "
                    "on the host\n", human(h, sizeof h, (size_t)in0.slots * in0.keep_rows * cfg->vocab_size * 4),
                    in0.slots);
            in = in0;
            in.keep_rows = 0;
            fits = td_memplan_fit(&in, &p) == 0;
        }
    } else {
        td_memplan_compute(&in, &p);
    }
    J->keep_rows = on_gpu ? in.keep_rows : 0;
    td_memplan_print(stderr, "tidal-diff", &p, &in);
    if (!fits) {
        size_t need = p.total, have = p.free - td_memplan_reserve(p.free);
        char h[8][32];
        return td_fail(err, "does not fit the GPU: one sequence of %d tokens (batch 1, micro-batch %d tokens) needs "
                       "%s (weights %s, KV cache %s, activations %s, workspace %s; largest: %s), "
                       "%s has %s free less %s kept back: short by %s. What helps: shorter "
                       "prompts or a lower --max-new-tokens (the KV cache and the activations grow with the "
                       "sequence), a recipe pair that shares the checkpoint's weights (e.g. bf16 recipes on a bf16 "
                       "checkpoint), or a GPU with more memory (--ignore-memory-plan runs anyway)",
                       J->max_len, in.fwd_tokens, human(h[0], 32, need), human(h[1], 32, p.weights),
                       human(h[2], 32, p.kv_cache), human(h[3], 32, p.acts_a + p.acts_b), human(h[4], 32, p.workspace),
                       largest(&p), o->device, human(h[5], 32, p.free), human(h[6], 32, td_memplan_reserve(p.free)),
                       human(h[7], 32, need - have));
    }
    if (in.fwd_tokens != tokens0)
        fprintf(stderr, "tidal-diff: note: the training path's micro-batch is lowered from %d to %d tokens to fit "
                "the GPU (as --max-num-batched-tokens %d; sequences are packed differently, the log-probs of a "
                "batch-invariant recipe A do not change)\n", tokens0, in.fwd_tokens, in.fwd_tokens);
    if (gen && in.slots != batch0)
        fprintf(stderr, "tidal-diff: note: --batch %d does not fit the GPU: lowered to --batch %d (%s)\n", o->batch,
                in.slots, o->recipe_b.batch_invariant
                ? "recipe B is batch-invariant: the same tokens and log-probs as --batch of any size"
                : "recipe B is not batch-invariant: its decode GEMMs see another batch shape, so rollouts may "
                  "differ from a run with a larger batch; the run file records the batch used");
    if (gen && in.slots != batch0) o->batch = in.slots;
    *slots = gen ? in.slots : most;
    *fwd_tokens = in.fwd_tokens;
    *chunk = in.chunk;
    free(J->memory_plan);
    J->memory_plan = td_memplan_json(&p, &in);
    J->mem_free0 = J->mem_free_min = p.free;
    return 0;
}

void diff_memory_sample(job *J)
{
    size_t fr, tot;
    td_error e;
    if (!J->mem_free0 || td_device_mem_info(J->o->device, &fr, &tot, &e)) return;
    if (fr < J->mem_free_min) J->mem_free_min = fr;
}

int diff_memory_record(job *J, td_error *err)
{
    if (!J->mem_free0 || !J->rf) return 0;
    size_t peak = td_device_mem_peak(), used = J->mem_free0 - J->mem_free_min;
    fprintf(stderr, "tidal-diff: GPU memory: tidal held at most %.3f GiB; cudaMemGetInfo: %.3f GiB more in use "
            "after a batch than at the start\n", (double)peak / (1ull << 30), (double)used / (1ull << 30));
    return td_runfile_set_i64(J->rf, "memory_peak", (int64_t)peak, err) ||
           td_runfile_set_i64(J->rf, "memory_used_max", (int64_t)used, err);
}
