/* tidal — the optimiser side of a training step, each piece written from the PyTorch / HF
 * code it reproduces:
 *   AdamW          torch.optim.AdamW (_single_tensor_adamw, torch 1.13): the same fp32
 *                  operations in the same order, scalars formed in double and used as fp32
 *   clipping       torch.nn.utils.clip_grad_norm_ (norm_type 2): total = ||g||_2 over every
 *                  gradient, coef = max_norm / (total + 1e-6), applied only when < 1
 *   schedules      transformers.optimization.get_scheduler's lambdas
 *   loss scaling   torch.cuda.amp.GradScaler.update (_amp_update_scale_)
 */
#include "train_internal.h"

#include <math.h>
#include <string.h>
#include <strings.h>

static const char *const SCHED_NAMES[TD_SCHED_COUNT] = {
    "constant", "constant_with_warmup", "linear", "cosine"};

int td_lr_schedule_from_name(const char *name)
{
    for (int i = 0; i < TD_SCHED_COUNT; i++)
        if (!strcasecmp(name, SCHED_NAMES[i])) return i;
    return -1;
}

const char *td_lr_schedule_name(td_lr_schedule s)
{
    return (unsigned)s < TD_SCHED_COUNT ? SCHED_NAMES[s] : "?";
}

int train_warmup_steps(const td_train_opts *o)
{
    if (o->warmup_steps > 0) return o->warmup_steps;
    return (int)ceil(o->warmup_ratio * o->max_steps);   /* TrainingArguments.get_warmup_steps */
}

double td_lr_lambda(const td_train_opts *o, int k)
{
    int warm = train_warmup_steps(o), total = o->max_steps;
    if (o->schedule == TD_SCHED_CONSTANT) return 1.0;
    if (k < warm) return (double)k / (warm > 1 ? warm : 1);
    switch (o->schedule) {
    case TD_SCHED_LINEAR: {
        double v = (double)(total - k) / (total - warm > 1 ? total - warm : 1);
        return v > 0.0 ? v : 0.0;
    }
    case TD_SCHED_COSINE: {   /* num_cycles 0.5 */
        double progress = (double)(k - warm) / (total - warm > 1 ? total - warm : 1);
        double v = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
        return v > 0.0 ? v : 0.0;
    }
    default:
        return 1.0;
    }
}

td_adamw_k adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int step)
{
    /* torch: param.mul_(1 - lr*wd); exp_avg.mul_(b1).add_(g, alpha=1-b1);
     * exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2); denom = (exp_avg_sq.sqrt() /
     * sqrt(bc2)).add_(eps); param.addcdiv_(exp_avg, denom, value=-lr/bc1). The element-wise
     * loop is the backend's optim_adamw (src/model/ops.h; CPU: src/backend/cpu_optim.c). */
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    td_adamw_k k = {
        .decay = (float)(1.0 - lr * weight_decay),
        .b1 = (float)beta1, .b2 = (float)beta2, .a1 = (float)(1.0 - beta1), .a2 = (float)(1.0 - beta2),
        .bc2_sqrt = (float)sqrt(bc2), .eps = (float)eps, .step_size = (float)(-(lr / bc1)),
        .decay_on = weight_decay != 0.0};
    return k;
}

float clip_coef(double total_norm, double max_norm)
{
    /* clip_coef = max_norm / (total_norm + 1e-6), clamped to 1.0 (multiplied in fp32) */
    float coef = (float)max_norm / ((float)total_norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

void scaler_update(train_scaler *s, int found_inf)
{
    if (found_inf) {
        s->scale *= s->backoff;
        s->growth_tracker = 0;
        return;
    }
    if (++s->growth_tracker == s->interval) {
        s->scale *= s->growth;
        s->growth_tracker = 0;
    }
}
