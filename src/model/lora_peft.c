/* PEFT's merge_adapter() / unmerge_adapter() arithmetic on a base weight held in dtype D
 * (include/tidal/lora.h has the formulas and where PEFT does each step). tidal-rl's
 * --lora-sync merge-unmerge runs it on the trainer's base before every rollout, so the base
 * drifts as it does under TRL's GRPOTrainer; tests/py/test_lora_peft.py runs PEFT itself for
 * k cycles on the same weights and requires the same bits. Roundings: td_round (nearest even;
 * bf16 and fp16 overflow to Inf, as torch's casts). */
#include "tidal/lora.h"
#include "tidal/formats.h"

#include <math.h>

void td_lora_peft_delta(const td_lora *lo, const td_lora_pair *p, float *delta)
{
    size_t n = (size_t)p->out * p->in;
    /* weight_B @ weight_A: one fp32 sgemm (torch's CPU matmul calls OpenBLAS), in its kernel's
     * order made explicit, so that a device sync (the backend's lora_peft_sync) gives its bits ... */
    td_lora_fold_delta(p, lo->rank, 1.0f, delta);
    /* ... then * self.scaling[adapter]: a Python float against an fp32 tensor multiplies in fp32 */
    for (size_t i = 0; i < n; i++) delta[i] = delta[i] * lo->scale;
}

void td_lora_peft_merge(td_format D, float *w, const float *delta, size_t n)
{
    for (size_t i = 0; i < n; i++) w[i] = td_round(D, w[i] + delta[i]);   /* fp32 sum, cast back to W's dtype */
}

void td_lora_peft_unmerge(td_format D, td_peft_unmerge form, float *w, const float *delta, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float d = form == TD_PEFT_UNMERGE_ROUNDED ? td_round(D, delta[i]) : delta[i];   /* .to(orig_dtype) */
        w[i] = td_round(D, w[i] - d);
    }
}

void td_lora_fold_delta(const td_lora_pair *p, int rank, float alpha, float *dw)
{
    int N = p->out, K = p->in;
    for (int i = 0; i < N; i++) {
        const float *b = p->b + (size_t)i * rank;
        float *row = dw + (size_t)i * K;
        for (int j = 0; j < K; j++) {
            float acc = 0.0f;
            for (int k = 0; k < rank; k++) acc = fmaf(b[k], p->a[(size_t)k * K + j], acc);
            row[j] = alpha * acc;
        }
    }
}
