/* tidal — the optimiser's element-wise steps on the CPU (td_backend_cpu's optim_* entries,
 * src/model/ops.h): the arithmetic src/train/optim.c documents, in the order that file states.
 * Host memory. */
#include "cpu.h"

#include <math.h>

/* sqrtf without errno handling, so the AdamW loop vectorises (tidal never reads errno here) */
#pragma GCC optimize("no-math-errno")

void optim_adamw_cpu(float *param, const float *grad, float *m1, float *m2, size_t n, const td_adamw_k *k)
{
    float decay = k->decay, b1 = k->b1, b2 = k->b2, a1 = k->a1, a2 = k->a2;
    float bc2_sqrt = k->bc2_sqrt, e = k->eps, step_size = k->step_size;
    int decay_on = k->decay_on;
    #pragma omp parallel for simd if (n >= 65536)
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
