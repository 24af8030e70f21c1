/* The diff job's device memory (include/tidal/memplan.h): the plan printed before the run,
 * the batch and the training path's micro-batch lowered to what the GPU's free memory holds,
 * and a refusal with the numbers when one sequence does not fit. */
#include "job.h"
#include "tidal/memplan.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

/* The component that weighs most, for the refusal's message. */
static const char *largest(const td_memplan *p)
{
    size_t acts = p->acts_a + p->acts_b;
    if (p->weights >= p->kv_cache && p->weights >= acts && p->weights >= p->workspace) return "the weights";
    if (p->kv_cache >= acts && p->kv_cache >= p->workspace) return "the KV cache";
    if (acts >= p->workspace) return "the activations";
    return "the workspace";
}

int diff_memory_plan(job *J, td_diff_opts *o, const td_config *cfg, td_format storage, int *fwd_tokens,
                     int *chunk, td_error *err)
{
    int gen = !J->prompts.has_rollouts;
    int tokens = o->max_batched_tokens ? o->max_batched_tokens : J->max_len * (o->batch < 4 ? o->batch : 4);
    if (tokens < J->max_len)
        return td_fail(err, "--max-num-batched-tokens %d is below the longest sequence (%d tokens: prompt + "
                       "--max-new-tokens): the training path scores each sequence whole", tokens, J->max_len);
    int on_gpu = o->device && strncmp(o->device, "cuda", 4) == 0;
    td_memplan_in in = {.cfg = cfg, .storage = storage, .a = &o->recipe_a, .b = gen ? &o->recipe_b : NULL,
                        .lora = J->lora, .lora_mode_a = o->lora_merge_a, .lora_mode_b = o->lora_merge_b,
                        .fwd_tokens = tokens, .fwd_seq_len = J->max_len, .fwd_logits_rows = 0,
                        .slots = gen ? o->batch : 0, .max_len = J->max_len, .chunk = 128,
                        .nthreads = omp_get_max_threads()};
    if (in.chunk > tokens) in.chunk = tokens;
    *fwd_tokens = tokens;
    *chunk = in.chunk;
    if (!on_gpu && !o->plan_only) return 0;   /* host memory: the CPU's own business */
    td_memplan p = {0};
    if (on_gpu && td_device_mem_info(o->device, &p.free, &p.device_total, err)) return -1;
    int batch0 = in.slots, tokens0 = in.fwd_tokens, fits = 1;
    if (on_gpu && !o->ignore_memory_plan) fits = td_memplan_fit(&in, &p) == 0;
    else td_memplan_compute(&in, &p);
    td_memplan_print(stderr, "tidal-diff", &p, &in);
    if (!fits) {
        size_t need = p.total, have = p.free - td_memplan_reserve(p.free);
        return td_fail(err, "does not fit the GPU: one sequence of %d tokens (batch 1, micro-batch %d tokens) needs "
                       "%.2f GiB (weights %.2f, KV cache %.2f, activations %.2f, workspace %.2f GiB; %s weigh most), "
                       "%s has %.2f GiB free less %.2f GiB kept back: short by %.2f GiB. What helps: shorter "
                       "prompts or a lower --max-new-tokens (the KV cache and the activations grow with the "
                       "sequence), a recipe pair that shares the checkpoint's weights (e.g. bf16 recipes on a bf16 "
                       "checkpoint), or a GPU with more memory (--ignore-memory-plan runs anyway)",
                       J->max_len, in.fwd_tokens, gib(need), gib(p.weights), gib(p.kv_cache),
                       gib(p.acts_a + p.acts_b), gib(p.workspace), largest(&p), o->device, gib(p.free),
                       gib(td_memplan_reserve(p.free)), gib(need - have));
    }
    if (in.fwd_tokens != tokens0)
        fprintf(stderr, "tidal-diff: note: the training path's micro-batch is lowered from %d to %d tokens to fit "
                "the GPU (as --max-num-batched-tokens %d; sequences are packed differently, the log-probs of a "
                "batch-invariant recipe A do not change)\n", tokens0, in.fwd_tokens, in.fwd_tokens);
    if (gen && in.slots != batch0)
        fprintf(stderr, "tidal-diff: note: --batch %d does not fit the GPU: lowered to --batch %d (%s)\n", batch0,
                in.slots, o->recipe_b.batch_invariant
                ? "recipe B is batch-invariant: the same tokens and log-probs as --batch of any size"
                : "recipe B is not batch-invariant: its decode GEMMs see another batch shape, so rollouts may "
                  "differ from a run with a larger batch; the run file records the batch used");
    if (gen) o->batch = in.slots;
    *fwd_tokens = in.fwd_tokens;
    *chunk = in.chunk;
    free(J->memory_plan);
    J->memory_plan = td_memplan_json(&p, &in);
    return 0;
}
