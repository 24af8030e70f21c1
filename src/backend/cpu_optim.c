/* tidal — the optimiser's element-wise steps on the CPU (td_backend_cpu's optim_* entries,
 * src/model/ops.h): the arithmetic src/train/optim.c documents, in the order that file states.
 * Host memory. */
#include "cpu.h"

#include <math.h>
#include <omp.h>

/* One thread's slice, at the CPU's width (TD_CLONES), the weight decay's branch outside the
 * loop (decay_on a constant in each call of the inline body). The loop used to sit in the omp
 * parallel for simd itself with the branch inside and sqrtf's errno path: scalar, 6.8 % of a
 * bf16 training step (train_probe). Every operation per element as before, each correctly
 * rounded at any width (no contraction: -std=c11): the same bits. The Makefile builds this file
 * with -fno-math-errno (sqrtf without its errno path: tidal never reads errno here; a
 * #pragma GCC optimize does not reach target_clones bodies). */
static inline __attribute__((always_inline)) void adamw_body(float *param, const float *grad, float *m1,
                                                            float *m2, size_t n, const td_adamw_k *k,
                                                            int decay_on)
{
    float decay = k->decay, b1 = k->b1, b2 = k->b2, a1 = k->a1, a2 = k->a2;
    float bc2_sqrt = k->bc2_sqrt, e = k->eps, step_size = k->step_size;
    #pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float p = decay_on ? param[i] * decay : param[i];
        float g = grad[i];
        float m = m1[i] * b1;
        m = m + a1 * g;
        float v = m2[i] * b2;
        v = v + a2 * (g * g);
        float denom = sqrtf(v) / bc2_sqrt + e;
        param[i] = p + step_size * (m / denom);
        m1[i] = m;
        m2[i] = v;
    }
}

TD_CLONES static void adamw_span(float *param, const float *grad, float *m1, float *m2, size_t n,
                                 const td_adamw_k *k)
{
    if (k->decay_on) adamw_body(param, grad, m1, m2, n, k, 1);
    else adamw_body(param, grad, m1, m2, n, k, 0);
}

void optim_adamw_cpu(float *param, const float *grad, float *m1, float *m2, size_t n, const td_adamw_k *k)
{
    #pragma omp parallel if (n >= 65536)
    {
        size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t a = n * t / nt, b = n * (t + 1) / nt;
        adamw_span(param + a, grad + a, m1 + a, m2 + a, b - a, k);
    }
}

double optim_sumsq_cpu(const float *g, size_t n)
{
    /* a fixed summation order (the build's vector width), whatever the thread count */
    double s = 0.0;
    #pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

void optim_scale_cpu(float *g, size_t n, float k)
{
    #pragma omp parallel for simd if (n >= 65536)
    for (size_t i = 0; i < n; i++) g[i] *= k;
}
