/* tidal — where each entry of the parameter table (td_config_params, checkpoint.h) lives in
 * the model: the td_model_weights field its role names, and the LoRA module it is. */
#include "model_internal.h"

#include <stddef.h>

static const size_t LAYER_FIELD[TD_ROLE_COUNT] = {
    [TD_ROLE_ATTN_NORM] = offsetof(td_layer_weights, attn_norm),
    [TD_ROLE_WQ] = offsetof(td_layer_weights, wq),
    [TD_ROLE_WK] = offsetof(td_layer_weights, wk),
    [TD_ROLE_WV] = offsetof(td_layer_weights, wv),
    [TD_ROLE_BQ] = offsetof(td_layer_weights, bq),
    [TD_ROLE_BK] = offsetof(td_layer_weights, bk),
    [TD_ROLE_BV] = offsetof(td_layer_weights, bv),
    [TD_ROLE_WO] = offsetof(td_layer_weights, wo),
    [TD_ROLE_Q_NORM] = offsetof(td_layer_weights, q_norm),
    [TD_ROLE_K_NORM] = offsetof(td_layer_weights, k_norm),
    [TD_ROLE_MLP_NORM] = offsetof(td_layer_weights, mlp_norm),
    [TD_ROLE_W_GATE] = offsetof(td_layer_weights, w_gate),
    [TD_ROLE_W_UP] = offsetof(td_layer_weights, w_up),
    [TD_ROLE_W_DOWN] = offsetof(td_layer_weights, w_down),
    [TD_ROLE_ROUTER] = offsetof(td_layer_weights, w_router),
    [TD_ROLE_SH_GATE] = offsetof(td_layer_weights, ws_gate),
    [TD_ROLE_SH_UP] = offsetof(td_layer_weights, ws_up),
    [TD_ROLE_SH_DOWN] = offsetof(td_layer_weights, ws_down),
    [TD_ROLE_SH_ROUTE] = offsetof(td_layer_weights, ws_route),
};

const float **param_slot(td_model_weights *w, int num_layers, const td_param_spec *p)
{
    switch (p->role) {
    case TD_ROLE_EMBED: return &w->embed;
    case TD_ROLE_FINAL_NORM: return &w->final_norm;
    case TD_ROLE_LM_HEAD: return &w->lm_head;
    default: break;
    }
    if ((unsigned)p->role >= TD_ROLE_COUNT || p->layer < 0 || p->layer >= num_layers) return NULL;
    if (p->role == TD_ROLE_E_GATE || p->role == TD_ROLE_E_UP || p->role == TD_ROLE_E_DOWN) {
        const float **ex = w->layers[p->layer].w_experts;
        return ex && p->expert >= 0 ? &ex[3 * p->expert + (p->role - TD_ROLE_E_GATE)] : NULL;
    }
    return (const float **)((char *)&w->layers[p->layer] + LAYER_FIELD[p->role]);
}

int param_lora_module(td_param_role role)
{
    switch (role) {
    case TD_ROLE_WQ: return TD_LORA_Q;
    case TD_ROLE_WK: return TD_LORA_K;
    case TD_ROLE_WV: return TD_LORA_V;
    case TD_ROLE_WO: return TD_LORA_O;
    case TD_ROLE_W_GATE: return TD_LORA_GATE;
    case TD_ROLE_W_UP: return TD_LORA_UP;
    case TD_ROLE_W_DOWN: return TD_LORA_DOWN;
    default: return -1;
    }
}

int param_moe_slot(const td_param_spec *p)
{
    switch (p->role) {
    case TD_ROLE_ROUTER: return TD_MOE_ROUTER;
    case TD_ROLE_SH_GATE: return TD_MOE_SH_GATE;
    case TD_ROLE_SH_UP: return TD_MOE_SH_UP;
    case TD_ROLE_SH_DOWN: return TD_MOE_SH_DOWN;
    case TD_ROLE_SH_ROUTE: return TD_MOE_SH_ROUTE;
    case TD_ROLE_E_GATE: case TD_ROLE_E_UP: case TD_ROLE_E_DOWN:
        return TD_MOE_EXPERTS + 3 * p->expert + (p->role - TD_ROLE_E_GATE);
    default: return -1;
    }
}

int param_lora_slot(const td_param_spec *p)
{
    int mo = param_lora_module(p->role);
    if (mo >= 0) return mo;
    switch (p->role) {
    case TD_ROLE_SH_GATE: case TD_ROLE_SH_UP: case TD_ROLE_SH_DOWN: return TD_LORA_GATE + (p->role - TD_ROLE_SH_GATE);
    case TD_ROLE_E_GATE: case TD_ROLE_E_UP: case TD_ROLE_E_DOWN:
        return TD_LORA_NMOD + 3 * p->expert + (p->role - TD_ROLE_E_GATE);
    default: return -1;
    }
}

td_param_spec *param_table(const td_config *c, size_t *n)
{
    *n = td_config_params(c, NULL, 0);
    td_param_spec *specs = td_xcalloc(*n, sizeof *specs);
    td_config_params(c, specs, *n);
    return specs;
}
