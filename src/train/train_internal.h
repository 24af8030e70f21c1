/* tidal — pieces of the training step shared by src/train/ (internal header). */
#ifndef TIDAL_TRAIN_INTERNAL_H
#define TIDAL_TRAIN_INTERNAL_H

#include "tidal/checkpoint.h"
#include "tidal/train.h"
#include "../model/model_internal.h"

/* GradScaler state (torch.cuda.amp.GradScaler) */
typedef struct {
    int on;
    double scale, growth, backoff;
    int interval, growth_tracker;
} train_scaler;

/* One trained tensor: its place in params/grads/moments, shape, name, and whether AdamW's
 * weight decay applies (HF Trainer: not to biases and norm weights). */
typedef struct {
    char name[160];
    size_t offset, numel;
    int ndim;
    int64_t shape[2];
    int decay;
} train_tensor;

struct td_trainer {
    td_train_opts o;
    td_moe_replay_fn moe_replay;  /* routing replay in the update (td_trainer_set_moe_replay)     */
    void *moe_replay_user;
    td_row_fn row_fn;             /* the update forward's full log-prob rows (td_trainer_set_observers) */
    td_moe_fn route_fn;           /* and its routing, each with the caller's sequence numbering */
    void *obs_user;
    float *rows_host;             /* (logits_rows, V) row_fn's host copy on a device backend    */
    int mb_s0;                    /* the first sequence of the micro-batch running               */
    int *mb_seq;                  /* (max_tokens) the rows' sequence indices in the caller's numbering */
    td_recipe recipe;
    td_model *m;                  /* fp32 master weights, carved by the parameter table        */
    td_param_spec *specs;         /* the table                                                  */
    size_t nspecs;
    td_lora *lora;                /* the adapter trained (its owned block is the parameters)   */
    float *params;                /* trained parameters: m->owned, or lora->owned (host)        */
    size_t nparams;
    const td_backend *be;         /* who runs the forward and backward (the model's backend)   */
    float *grads;                 /* (nparams) carved like params, in be's memory: what the
                                     backward ops accumulate into                              */
    float *grads_host;            /* (nparams) their host copy (td_trainer_grads, --dump-grads):
                                     grads itself on the CPU, downloaded when asked on a device */
    float *m1, *m2;               /* (nparams) AdamW moments, host: the state file's copy       */
    float *params_dev, *m1_dev, *m2_dev; /* (nparams) the masters and moments the optimiser
                                     updates, in be's memory: params, m1, m2 themselves on the
                                     CPU; on a device params is downloaded after each step
                                     (the recipe's weights are prepared from it), m1/m2 only for
                                     a state file (train_state_to_host)                       */
    train_tensor *tensors;        /* the trained tensors, in table (or layer, module) order     */
    size_t ntensors;
    td_model_weights gw;          /* gradient views of the model (NULL entries under LoRA)     */
    lora_grad *lg;                /* (L, slots) gradient views of A and B                       */
    td_forward *f;                /* the training path, activations kept                        */
    td_grad_acts ga;
    int logits_rows;
    float *logits;                /* (logits_rows, V) in be's memory                            */
    float *tlogp, *dlogp;         /* (max_tokens) target log-prob / dL/dlogp per row, host: the
                                     only per-row values that cross to and from a device      */
    int *target;                  /* (max_tokens) the token each row predicts (0: none), host   */
    int step;                     /* optimiser steps taken                                      */
    long skipped;
    train_scaler scaler;
    int *top1;                    /* (max_tokens) each row's most probable token, host          */
    long acc_correct, acc_total;  /* targets in the loss whose row's top token is the target    */
    int loss_overflow;            /* loss scaling: a micro-batch's loss was not finite          */
    float *base_dev;              /* LoRA: a device copy of the frozen base (m->owned), made by
                                     td_trainer_base_to_device for a merged adapter's fold;
                                     NULL: the base is on the host only                        */
    int prep_dev;                 /* the recipe's weights are prepared on the device from
                                     params_dev after each step (trainer.c's header); 0 on the
                                     CPU and under TIDAL_PREPARE_ON_HOST=1                    */
    int log_d2h;                  /* TIDAL_STEP_D2H=1: each step's device -> host bytes on stderr */
    /* the load-balancing loss (aux_loss.c; NULL / 0 when off) */
    double *aux_cnt, *aux_psum;   /* (E) this forward's top-k selections and summed probabilities */
    long aux_cells;               /* rows x MoE layers seen by this forward                      */
    int *aux_sel;                 /* (K) one row's own top-k                                     */
    float *aux_dp;                /* (E) d(loss)/dp of every row and layer (ga.moe_aux_dp)       */
    long aux_rows_step;           /* td_trainer_set_aux_rows; 0: the call's rows                 */
    long aux_rows_call;           /* the rows of the td_trainer_accumulate call running          */
    double aux_value;             /* weighted aux since td_trainer_aux_loss's last reset         */
};

/* aux_loss.c: set up (at creation: buffers when opts ask for the loss), observe a micro-batch's
 * forward (begin: counters zeroed and the routing observer on; end: observer off, the value
 * accumulated and ga.moe_aux_dp set for the backward, `scale` the loss scale), free. */
void train_aux_init(td_trainer *tr);
void train_aux_begin(td_trainer *tr);
void train_aux_observe(void *user, const td_moe_route *r);   /* the aux loss's routing observer */
void train_aux_end(td_trainer *tr, int N, double scale);
void train_aux_free(td_trainer *tr);

/* The accumulated gradients on the host (downloaded from a device first), and zeroing them
 * (device and host copy) (trainer.c). */
float *train_grads_host(const td_trainer *tr);
void train_zero_grads(td_trainer *tr);
/* A device's masters and moments: copied to the host arrays (before a state file is written),
 * and back (after the host arrays were written: a state loaded, params changed). No-ops on the
 * CPU, whose arrays are the same. */
void train_state_to_host(const td_trainer *tr);
void train_state_to_device(td_trainer *tr);
/* The masters on the host (downloaded from a device, where after an optimiser step they are the
 * only current copy when the weights are prepared there: prep_dev) before a host reader. */
void train_masters_to_host(const td_trainer *tr);

/* optim.c */
int train_warmup_steps(const td_train_opts *o);
td_adamw_k adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int step);
float clip_coef(double total_norm, double max_norm);
void scaler_update(train_scaler *s, int found_inf);

#endif
