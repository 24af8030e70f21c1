/* An unmerged LoRA adapter inside a path's forward, as PEFT's LoraLayer.forward computes it
 * when the model runs in dtype D (the recipe's activations dtype):
 *   y = base(x)                       the path's own projection (any recipe, FP8 included)
 *   t = D(A x)                        lora_A: an nn.Linear in D (A rounded to D), fp32 accumulate
 *   u = D(B t)                        lora_B: the same
 *   y = D(y + D(scale * u))           PEFT: result = result + lora_B(lora_A(x)) * scaling
 * In fp32 every D is the identity. The LoRA GEMMs never run in FP8 (engines and trainers keep
 * the low-rank branch in the model dtype), and use split_k 1: they are rank-r reductions.
 *
 * vLLM's native adapter form (lora.h, TD_LORA_PUNICA; the Punica Triton kernels
 * vllm/lora/ops/triton_ops/kernel_utils.py do_shrink_kernel / do_expand_kernel):
 *   B_e = D(D(B) * scale)             LoRALayerWeights.optimize() at activation, scale then 1
 *   t   = D(A x)                      shrink: fp32 accumulate into an fp32 buffer; expand casts
 *                                     the buffer to the lora dtype (CAST_TYPE) before its dot
 *   u   = D(B_e t)                    expand: fp32 accumulate, accumulator.to(lora dtype)
 *   y   = D(y + u)                    ADD_INPUTS: tiled_c += the base output, stored in D
 * which is the form above with B replaced by B_e and scale 1 (D(1 * u) = u).
 *
 * A trainer's adapter on a device (lora->owned_dev, src/train/trainer.c): A, B and B_e are rounded
 * there from it (be->prepare, the same roundings), so an optimiser step re-rounds the adapter
 * without the host (lora_rt_refresh); fp8 activations keep the host form. */
#include "model_internal.h"
#include "tidal/gemm.h"

#include <stdlib.h>
#include <string.h>

static void lora_rt_round(lora_rt *rt, const td_lora *lora)
{
    const td_recipe *lr = &rt->recipe;
    for (int i = 0; i < lora->num_layers * lora->slots; i++) {
        const td_lora_pair *p = &lora->pairs[i];
        if (!p->a) continue;
        float *a = (float *)rt->pairs[i].a, *b = (float *)rt->pairs[i].b;
        size_t na = (size_t)rt->rank * p->in, nb = (size_t)p->out * rt->rank;
        float bscale = rt->punica ? lora->scale : 1.0f;
        if (rt->on_device) {   /* the same roundings from the device copy (lora.h owned_dev) */
            rt->be->prepare(a, TD_F32, lora->owned_dev + (p->a - lora->owned), na, lr->activations, 1.0f);
            rt->be->prepare(b, TD_F32, lora->owned_dev + (p->b - lora->owned), nb, lr->activations, bscale);
            continue;
        }
        td_gemm_prepare_weight(lr, p->a, rt->rank, p->in, a);   /* A, B rounded to D */
        td_gemm_prepare_weight(lr, p->b, p->out, rt->rank, b);
        if (rt->punica) {   /* LoRALayerWeights.optimize(): lora_b *= scaling, in the lora dtype */
            for (size_t j = 0; j < nb; j++) b[j] = b[j] * bscale;
            td_round_row(lr->activations, b, b, nb, TD_SATFINITE);
        }
    }
}

td_recipe lora_branch_recipe(const td_recipe *r)
{
    td_recipe lr = *r;
    lr.weights = lr.gemm_inputs = lr.kv_cache = r->activations;
    lr.accumulate = TD_ACC_FP32;
    lr.split_k = 1;
    lr.attention = TD_ATTN_FULL;
    lr.decode_splits = 1;
    lr.lm_head_fp32 = false;
    return lr;
}

lora_rt *lora_rt_create(const td_lora *lora, const td_recipe *r, int cap, int punica,
                        const td_backend *be)
{
    lora_rt *rt = td_xcalloc(1, sizeof *rt);
    int L = lora->num_layers, rank = lora->rank, S = lora->slots;
    rt->rank = rank;
    rt->scale = punica ? 1.0f : lora->scale;
    rt->recipe = lora_branch_recipe(r);
    size_t total = 0;
    int max_in = rank, max_out = 1;
    for (int i = 0; i < L * S; i++) {
        const td_lora_pair *p = &lora->pairs[i];
        if (!p->a) continue;
        total += ((size_t)p->in + p->out) * rank;
        if (p->in > max_in) max_in = p->in;
        if (p->out > max_out) max_out = p->out;
    }
    rt->pairs = td_xcalloc((size_t)L * S, sizeof *rt->pairs);
    rt->slots = S;
    rt->owned = td_xmalloc((total ? total : 1) * sizeof(float));
    rt->punica = punica;
    rt->on_device = lora->owned_dev && be->prepare && (rt->recipe.activations == TD_F32 || rt->recipe.activations == TD_BF16 ||
                                                        rt->recipe.activations == TD_F16);
    float *q = rt->owned;
    for (int i = 0; i < L * S; i++) {
        const td_lora_pair *p = &lora->pairs[i];
        if (!p->a) continue;
        td_lora_pair *d = &rt->pairs[i];
        *d = *p;
        d->a = q;
        q += (size_t)rank * p->in;
        d->b = q;
        q += (size_t)p->out * rank;
    }
    rt->be = be;
    rt->npairs = L * S;
    lora_rt_round(rt, lora);
    /* the branch's activations: written and read by ops only, so in the backend's memory (a
     * device's ops would otherwise stage host buffers at every call) */
    rt->t = be->alloc((size_t)cap * rank * sizeof(float));
    rt->u = be->alloc((size_t)cap * max_out * sizeof(float));
    rt->qin = td_xmalloc((size_t)cap * max_in * sizeof(float));
    return rt;
}

void lora_rt_refresh(lora_rt *rt, const td_lora *lora)
{
    lora_rt_round(rt, lora);
    if (!rt->on_device) td_backend_forget(rt->be);   /* device copies of the old values */
}

void lora_rt_free(lora_rt *rt)
{
    if (!rt) return;
    for (int i = 0; rt->on_device && i < rt->npairs; i++)
        if (rt->pairs[i].a) {
            rt->be->release(rt->pairs[i].a);
            rt->be->release(rt->pairs[i].b);
        }
    free(rt->pairs);
    free(rt->owned);
    rt->be->free(rt->t);
    rt->be->free(rt->u);
    free(rt->qin);
    free(rt);
}

void lora_forward(const td_ops *ops, int layer, int module, float *y, const float *x, int N)
{
    const lora_rt *rt = ops->lora;
    if (!rt) return;
    if (module < 0) return;
    const td_lora_pair *p = &rt->pairs[(size_t)layer * rt->slots + module];
    if (!p->a) return;
    td_ops lo = td_ops_gemm(ops, &rt->recipe, rt->qin, NULL);   /* the LoRA GEMMs' recipe */
    int r = rt->rank;
    td_wmat a = td_wmat_f32(p->a), b = td_wmat_f32(p->b);
    matmul_forward(&lo, rt->t, x, &a, NULL, N, p->in, r);
    matmul_forward(&lo, rt->u, rt->t, &b, NULL, N, r, p->out);
    size_t n = (size_t)N * p->out;
    scale_forward(ops, rt->u, rt->scale, n);    /* D(scale * u)          */
    residual_forward(ops, y, y, rt->u, n);      /* y = D(y + D(scale u)) */
}

void lora_backward(const td_ops *ops, int layer, int module, float *dx, const float *dy,
                   const float *x, int N, const lora_grad *lg, float *scratch)
{
    const lora_rt *rt = ops->lora;
    if (!rt) return;
    if (module < 0) return;
    const td_lora_pair *p = &rt->pairs[(size_t)layer * rt->slots + module];
    if (!p->a) return;
    const lora_grad *g = &lg[(size_t)layer * rt->slots + module];
    td_ops lo = td_ops_gemm(ops, &rt->recipe, rt->qin, NULL);
    int r = rt->rank;
    size_t nr = (size_t)N * r, nout = (size_t)N * p->out;
    float *t = scratch, *dt = scratch + nr, *du = scratch + 2 * nr;
    td_wmat a = td_wmat_f32(p->a);
    matmul_forward(&lo, t, x, &a, NULL, N, p->in, r);            /* t = D(A x), as the forward */
    /* du = D(scale dy): a copy of dy in the backend's memory (be->upload copies between two
     * of its buffers too: memcpy on the CPU, cudaMemcpyDefault on CUDA), scaled in place */
    ops->be->upload(du, dy, nout * sizeof(float));
    scale_forward(ops, du, rt->scale, nout);
    ops->be->zero(dt, nr * sizeof(float));
    matmul_backward(&lo, dt, g->db, NULL, du, t, p->b, N, r, p->out);
    matmul_backward(&lo, dx, g->da, NULL, dt, x, p->a, N, p->in, r);
}
