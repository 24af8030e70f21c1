/* tidal — the device memory plan (include/tidal/memplan.h): what the CUDA backend will allocate
 * for a run, computed from the configuration and the recipes before anything is allocated.
 *
 * Every figure mirrors one allocation site; keep them in step when a site changes:
 *   weights      src/model/weights_recipe.c prep_wmat (what a recipe copies, what it shares with
 *                the checkpoint's storage), uploaded by tdc_const (backend.cu, once per host
 *                range) when a GEMM reads them; matmul.cu's `widened` fp32 copies (plain fp32
 *                recipes on 16-bit storage, batch-invariant recipes, FP8 emulation); lora_run.c's
 *                rounded A and B (unmerged) and its branch's t, u (acts) and GEMM scratch; norms,
 *                biases, inv_freq (fp32, tiny)
 *   embedding    never resident: embedding.cu gathers the rows on the host (staging only)
 *   kv cache     src/paths/session.c (td_memplan_kv_bytes)
 *   activations  src/model/decoder.c acts_alloc (forward only; a mixture of experts' one layer of
 *                router logits, routing and expert rows, and moe.c's moe_v under a fused recipe:
 *                moe_acts_floats; its routing tables and host mirrors are host memory, never
 *                planned), the paths' logits rows
 *   workspace    tdc_scratch slots (backend.cu: grown to 1.25x the request): GEMM_A, GEMM_SCALES,
 *                GEMM_OUT (matmul.cu), WORKSPACE (lt.cu, 32 MiB), ATTN (attention.cu split-KV),
 *                MISC (fp8_quant.cu); the largest staging of one op call (tdc_in / tdc_out of
 *                host buffers: the embedding rows, a decode step's logits rows)
 * Each bound is the allocation's own size formula at the largest N the path can run, so the
 * plan is an upper bound of the peak, close to it (tests/py/test_memplan.py). */
#include "tidal/memplan.h"
#include "tidal/lora.h"
#include "tidal/formats.h"
#include "tidal/scaling.h"
#include "../model/model_internal.h"   /* param_table */
#include "../model/ops.h"   /* td_kv_store_format: how a session on the CUDA backend stores its cache */

#include <stdlib.h>
#include <string.h>

#define SCRATCH_GROWTH(b) ((b) + (b) / 4)        /* tdc_scratch allocates bytes + bytes / 4   */
#define LT_WORKSPACE ((size_t)32 << 20)          /* lt.cu WORKSPACE_BYTES                      */
#define ATT_BLOCK_ROWS 64                        /* ops.h ATT_BLOCK: the scores scratch rows   */
#define STAGING_SLACK ((size_t)1 << 20)          /* per-call tables: tokens, pos, kv_off, ...  */

static size_t fmt_bytes(td_format f) { return f == TD_F32 ? 4 : f == TD_BF16 || f == TD_F16 ? 2 : 1; }
static int is_fp8(td_format f) { return f == TD_E4M3 || f == TD_E5M2; }
static size_t up(size_t x, size_t m) { return (x + m - 1) / m * m; }
static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

size_t td_memplan_kv_bytes(const td_config *c, const td_recipe *b, int as_allocated)
{
    size_t elems = 2 * (size_t)c->num_kv_heads * c->head_dim;   /* K and V */
    if (as_allocated) {   /* session.c on the CUDA backend (kv_codes): ops.h td_kv_store_format */
        td_backend codes = {.kv_codes = 1};
        return elems * td_kv_esize(td_kv_store_format(&codes, b));
    }
    td_format f = b ? b->kv_cache : TD_F32;
    return elems * fmt_bytes(f);
}

/* ---- weights ------------------------------------------------------------------------------- */

/* What one path does with a (rows, cols) GEMM matrix: uploads the checkpoint's own storage
 * (shared with the other path), widens it to an fp32 device copy (shared too: keyed by the host
 * pointer), and/or holds bytes of its own (a prepared copy, and its widened copy). */
typedef struct { int model_up, model_widen; size_t own; } wuse;

/* Whether matmul.cu's fp8_lt takes an FP8 product of an (O, K) weight stored as pd through
 * cuBLASLt (its conditions); when not, fp8_emulated widens the weight to an fp32 copy. A GPU
 * whose cuBLASLt refuses a mode at run time also falls back (noted on stderr): not planned. */
static int fp8_lt_takes(const td_recipe *r, td_format pd, size_t O, size_t K)
{
    if (!is_fp8(pd) || (pd == TD_E5M2 && r->gemm_inputs == TD_E5M2) || K % 16 || O % 16 || r->split_k > 1)
        return 0;
    td_fp8_scheme ws = r->weight_scaling;
    ws.fmt = pd;
    size_t sr, sc;
    td_fp8_block_shape(&ws, O, K, &sr, &sc);
    int wsingle = sr >= O && sc >= K, wrow = sr == 1 && sc >= K, wblk = sr == 128 && sc == 128;
    int ag = r->act_scaling.gran, g = r->act_scaling.group ? r->act_scaling.group : 128;
    if (wsingle && ag == TD_SCALE_TENSOR) return 1;
    if ((wsingle || wrow) && (ag == TD_SCALE_TENSOR || ag == TD_SCALE_ROW)) return 1;
    return (wsingle || wblk) && ag == TD_SCALE_GROUP && g == 128 && K % 128 == 0;
}

static wuse weight_use(const td_recipe *r, td_format storage, int merged, size_t rows, size_t cols)
{
    wuse u = {0, 0, 0};
    size_t n = rows * cols;
    td_format f = r->weights, pd;
    int model = !merged && (f == TD_F32 || f == storage);   /* prep_wmat: already on the grid */
    if (model) {
        pd = storage;
    } else {
        pd = f == TD_F32 ? TD_F32 : f;
        if (is_fp8(pd)) {
            td_fp8_scheme s = r->weight_scaling;
            s.fmt = pd;
            u.own += n + td_fp8_num_scales(&s, rows, cols) * sizeof(float);
        } else {
            u.own += n * fmt_bytes(pd);
        }
    }
    if (model) u.model_up = 1;
    /* matmul_forward_cuda: which operand the GEMM reads */
    int plain = td_recipe_is_plain_fp32(r), widen;
    if (plain) widen = pd != TD_F32;
    else if (td_recipe_fp8_gemm(r)) widen = r->batch_invariant || !fp8_lt_takes(r, pd, rows, cols);
    else widen = pd != TD_F32 && (pd != r->gemm_inputs || r->batch_invariant);
    if (widen) {
        if (model) u.model_widen = 1;
        else u.own += n * sizeof(float);
    }
    return u;
}

typedef struct { size_t a, b, shared; } wsum;

/* count matrices of (rows, cols): path A under ra (merged: ma), path B under rb (mb) */
static void weights_add(wsum *w, const td_recipe *ra, int ma, const td_recipe *rb, int mb, td_format storage,
                        size_t rows, size_t cols, size_t count)
{
    if (!count) return;
    wuse ua = {0, 0, 0}, ub = {0, 0, 0};
    if (ra) ua = weight_use(ra, storage, ma, rows, cols);
    if (rb) ub = weight_use(rb, storage, mb, rows, cols);
    size_t n = rows * cols;
    w->shared += count * (((ua.model_up || ub.model_up) ? n * fmt_bytes(storage) : 0) +
                          ((ua.model_widen || ub.model_widen) ? n * sizeof(float) : 0));
    w->a += count * ua.own;
    w->b += count * ub.own;
}

/* the q-norm and k-norm weights of one layer: 2 HD (Qwen3), (NH + NKV) HD (OLMoE) */
static size_t qk_norm_width(const td_config *c)
{
    return c->qk_norm_full ? (size_t)(c->num_heads + c->num_kv_heads) * c->head_dim : 2 * (size_t)c->head_dim;
}

/* layers with a dense MLP (a mixture of experts' MoE layers have none) */
static size_t dense_mlp_layers(const td_config *c)
{
    return (size_t)c->num_layers - (c->num_experts > 0 ? (size_t)td_config_num_moe_layers(c) : 0);
}

/* bytes of the adapter's pairs of kind m (td_lora_module: every expert's gate counts as a gate) */
static size_t lora_pair_bytes(const td_lora *lora, int m)
{
    size_t s = 0;
    for (size_t i = 0; i < (size_t)lora->num_layers * lora->slots; i++) {
        const td_lora_pair *p = &lora->pairs[i];
        if (p->a && td_lora_slot_module((int)(i % lora->slots)) == m) s += ((size_t)p->in + p->out) * lora->rank * sizeof(float);
    }
    return s;
}

/* layers whose dense projection m is adapted (expert pairs are counted with the MoE's matrices) */
static int lora_adapted(const td_config *c, const td_lora *lora, int m)
{
    int k = 0;
    for (int l = 0; l < lora->num_layers; l++)
        k += lora->pairs[(size_t)l * lora->slots + m].a != NULL && (m <= TD_LORA_O || !td_config_layer_moe(c, l));
    return k;
}

/* the widest input (at least r) and output (at least 1) of the adapter's pairs (lora_rt_create) */
static void lora_widest(const td_lora *lora, size_t *max_in, size_t *max_out)
{
    *max_in = (size_t)lora->rank;
    *max_out = 1;
    for (size_t i = 0; i < (size_t)lora->num_layers * lora->slots; i++)
        if (lora->pairs[i].a) {
            *max_in = maxz(*max_in, (size_t)lora->pairs[i].in);
            *max_out = maxz(*max_out, (size_t)lora->pairs[i].out);
        }
}

/* lora_run.c lora_rt_create: an unmerged (or punica) adapter's branch activations on the device,
 * t (cap, r) and u (cap, the widest adapted output: an expert's gate or up is FE wide) */
static size_t lora_branch_bytes(const td_lora *lora, size_t cap)
{
    size_t max_in, max_out;
    lora_widest(lora, &max_in, &max_out);
    return cap * ((size_t)lora->rank + max_out) * sizeof(float);
}

static wsum plan_weights(const td_memplan_in *in)
{
    const td_config *c = in->cfg;
    wsum w = {0, 0, 0};
    size_t L = (size_t)c->num_layers;
    const td_lora *lora = in->lora;
    for (int m = 0; m < TD_LORA_NMOD; m++) {
        int out, inw;
        td_lora_module_shape(c, m, &out, &inw);
        size_t k = lora ? (size_t)lora_adapted(c, lora, m) : 0;
        int ma = lora && in->lora_mode_a == TD_LORA_MERGED, mb = lora && in->lora_mode_b == TD_LORA_MERGED;
        /* a mixture of experts' MoE layers have no dense MLP (their matrices are counted below) */
        size_t Ld = m >= TD_LORA_GATE ? dense_mlp_layers(c) : L;
        weights_add(&w, in->a, 0, in->b, 0, in->storage, (size_t)out, (size_t)inw, Ld - k);
        weights_add(&w, in->a, ma, in->b, mb, in->storage, (size_t)out, (size_t)inw, k);
        if (lora) {   /* unmerged: each path's rounded A and B, fp32 (lora_run.c) */
            size_t pb = lora_pair_bytes(lora, m);
            if (in->a && !ma) w.a += pb;
            if (in->b && !mb) w.b += pb;
        }
    }
    if (c->num_experts > 0) {   /* per MoE layer: the router, E experts' gate, up, down, a shared expert and its gate */
        size_t Lm = (size_t)td_config_num_moe_layers(c), E = c->num_experts, C = c->hidden_size;
        size_t FE = c->moe_intermediate_size, FS = c->shared_expert_intermediate_size;
        weights_add(&w, in->a, 0, in->b, 0, in->storage, E, C, Lm);
        weights_add(&w, in->a, 0, in->b, 0, in->storage, FE, C, 2 * Lm * E);
        weights_add(&w, in->a, 0, in->b, 0, in->storage, C, FE, Lm * E);
        if (FS) {
            weights_add(&w, in->a, 0, in->b, 0, in->storage, FS, C, 2 * Lm);
            weights_add(&w, in->a, 0, in->b, 0, in->storage, C, FS, Lm);
            weights_add(&w, in->a, 0, in->b, 0, in->storage, 1, C, Lm);
        }
    }
    td_recipe ha, hb;
    if (in->a) ha = td_recipe_for_head(in->a);
    if (in->b) hb = td_recipe_for_head(in->b);
    weights_add(&w, in->a ? &ha : NULL, 0, in->b ? &hb : NULL, 0, in->storage, (size_t)c->vocab_size,
                (size_t)c->hidden_size, 1);
    /* norms and biases: the model's fp32 under the plain fp32 recipe, else a rounded copy each */
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t small = ((2 * L + 1) * c->hidden_size + (c->qk_norm ? L * qk_norm_width(c) : 0) +
                    (c->qkv_bias ? L * (QD + 2 * KVD) : 0)) * sizeof(float);
    int plain_a = in->a && td_recipe_is_plain_fp32(in->a), plain_b = in->b && td_recipe_is_plain_fp32(in->b);
    if (plain_a || plain_b) w.shared += small;
    if (in->a && !plain_a) w.a += small;
    if (in->b && !plain_b) w.b += small;
    w.shared += (size_t)c->head_dim / 2 * sizeof(float);   /* inv_freq */
    return w;
}

/* ---- activations and scratch --------------------------------------------------------------- */

/* A mixture of experts' scratch width FW: the wider of an expert's MLP and the shared expert's
 * (acts_alloc, grad_acts_alloc); 0 for a dense model. */
static size_t moe_width(const td_config *c)
{
    if (c->num_experts <= 0) return 0;
    return maxz((size_t)c->moe_intermediate_size, (size_t)c->shared_expert_intermediate_size);
}

/* moe.c moe_fused: whether a path's MoE layers run as vLLM's fused_moe (its moe_v buffer) */
static int moe_fused(const td_recipe *r)
{
    return r && r->moe_fused && !r->residual_fp32 && r->activations != TD_F32 && !td_recipe_is_plain_fp32(r);
}

/* acts_alloc's MoE buffers (decoder.c) of cap rows on a device backend, in floats: the router
 * logits moe_logits (cap, E), the layer's routing on the device moe_rows_b and moe_weights_b
 * (cap, K) each, an expert's input and output rows moe_in, moe_y (cap, C) and its gate and up
 * moe_gate, moe_up (cap, FW); under a fused recipe r, moe.c's moe_v (cap * K, C), which the first
 * fused layer allocates. Whatever save is, these are one layer's: the saved routing slices
 * (moe_probs_s, moe_experts_s, moe_weights_s) are host memory, as are the routing tables
 * moe_probs, moe_experts, moe_weights, moe_rows, moe_start and the logits' mirror moe_logits_h:
 * not in the device plan, as no host buffer is (kv_off, x_host, the staging's host side). */
static size_t moe_acts_floats(const td_config *c, size_t cap, const td_recipe *r)
{
    if (c->num_experts <= 0) return 0;
    size_t C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    size_t f = cap * (E + 2 * K + 2 * C + 2 * moe_width(c));
    if (moe_fused(r)) f += cap * K * C;
    return f;
}

/* acts_alloc (decoder.c, save 0) under recipe r: x, xn, q, k, v, att, proj, gate, up of cap rows,
 * the attention scores scratch (nthreads, ATT_BLOCK, max_keys), a mixture of experts' buffers. */
static size_t acts_bytes(const td_config *c, const td_recipe *r, int cap, int max_keys, int nthreads)
{
    size_t C = c->hidden_size, F = (size_t)td_config_dense_mlp_width(c);
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t per_row = 3 * C + 2 * QD + 2 * KVD + 2 * F;
    return ((size_t)cap * per_row + (size_t)nthreads * ATT_BLOCK_ROWS * (size_t)max_keys +
            moe_acts_floats(c, (size_t)cap, r)) * sizeof(float);
}

enum { S_A, S_SCALES, S_OUT, S_WS, S_ATTN, S_MISC, S_N };

/* The scratch requests of one GEMM call (matmul_forward_cuda) of N rows, K inputs, widest
 * output O, weights prepared as pd (the widest case of the call's matrices). */
static void gemm_scratch(size_t req[S_N], const td_recipe *r, td_format pd, size_t N, size_t K, size_t O)
{
    if (!N) return;
    if (td_recipe_is_plain_fp32(r)) {
        req[S_WS] = maxz(req[S_WS], LT_WORKSPACE);
        return;
    }
    if (td_recipe_fp8_gemm(r)) {
        size_t Np = up(N, 16);
        td_fp8_scheme as = r->act_scaling;
        as.fmt = r->gemm_inputs;
        size_t nas = td_fp8_num_scales(&as, N, K), nkb = (K + 127) / 128;
        size_t nalt = Np * (nkb > 1 ? nkb : 1);
        size_t nwlt = maxz(O, ((O + 127) / 128) * up(nkb, 4));
        req[S_A] = maxz(req[S_A], Np * K);
        req[S_SCALES] = maxz(req[S_SCALES], (up(nas, 64) + up(nalt, 64) + nwlt) * sizeof(float));
        req[S_OUT] = maxz(req[S_OUT], (up(N * K, 64) + Np * O) * sizeof(float));
        size_t br, bc;   /* fp8_quantize_cuda's chunk maxima and block scales */
        td_fp8_block_shape(&as, N, K, &br, &bc);
        size_t ch = bc < K ? bc : K > 128 ? 128 : K, nch = (K + ch - 1) / ch;
        size_t nb = ((N + br - 1) / br) * ((K + bc - 1) / bc);
        req[S_MISC] = maxz(req[S_MISC], (N * nch + 2 * nb) * sizeof(float));
        if (!r->batch_invariant) req[S_WS] = maxz(req[S_WS], LT_WORKSPACE);
        return;
    }
    if (r->gemm_inputs == TD_BF16 || r->gemm_inputs == TD_F16) {
        req[S_A] = maxz(req[S_A], N * K * 2);
        if (pd != r->gemm_inputs || r->batch_invariant) req[S_OUT] = maxz(req[S_OUT], N * K * sizeof(float));
    }
    if (!r->batch_invariant) req[S_WS] = maxz(req[S_WS], LT_WORKSPACE);
}

/* The storage a recipe's prepared GEMM matrix has (prep_wmat), for the scratch's widening case. */
static td_format prepared(const td_recipe *r, td_format storage)
{
    return r->weights == TD_F32 ? storage : r->weights;
}

/* The scratch requests of one path: its decoder GEMMs at N rows, its lm_head at H rows. */
static void path_scratch(size_t req[S_N], const td_config *c, const td_recipe *r, const td_lora *lora, size_t N,
                         size_t H, td_format storage)
{
    size_t C = c->hidden_size, F = c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    td_format pd = prepared(r, storage);
    gemm_scratch(req, r, pd, N, C, maxz(QD, KVD));   /* q, k, v */
    gemm_scratch(req, r, pd, N, QD, C);              /* o_proj */
    if (dense_mlp_layers(c)) {
        gemm_scratch(req, r, pd, N, C, F);           /* gate, up */
        gemm_scratch(req, r, pd, N, F, C);           /* down */
    }
    if (c->num_experts > 0) {   /* moe.c: the router, and an expert's or the shared expert's MLP on up to N rows */
        size_t FW = moe_width(c);
        gemm_scratch(req, r, pd, N, C, (size_t)c->num_experts);
        gemm_scratch(req, r, pd, N, C, FW);
        gemm_scratch(req, r, pd, N, FW, C);
    }
    if (lora) {   /* an unmerged adapter's branch (lora_forward): t = x A^T, u = t B^T, A and B fp32 */
        td_recipe lr = lora_branch_recipe(r);
        size_t max_in, max_out;
        lora_widest(lora, &max_in, &max_out);
        gemm_scratch(req, &lr, TD_F32, N, max_in, (size_t)lora->rank);
        gemm_scratch(req, &lr, TD_F32, N, (size_t)lora->rank, max_out);
    }
    td_recipe h = td_recipe_for_head(r);
    gemm_scratch(req, &h, prepared(&h, storage), H, C, (size_t)c->vocab_size);
}

/* The embedding's storage bytes per element as the path gathers its rows (weights_prepare). */
static size_t embed_bytes(const td_recipe *r, td_format storage)
{
    td_format f = td_recipe_is_plain_fp32(r) || r->residual_fp32 ? TD_F32 : r->activations;
    return fmt_bytes(f == TD_F32 || f == storage ? storage : f);
}

void td_memplan_compute(const td_memplan_in *in, td_memplan *p)
{
    const td_config *c = in->cfg;
    size_t free_b = p->free, total_b = p->device_total;
    memset(p, 0, sizeof *p);
    p->free = free_b;
    p->device_total = total_b;
    int nt = in->nthreads > 0 ? in->nthreads : 1;
    size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size;
    wsum w = plan_weights(in);
    p->weights_a = w.a;
    p->weights_b = w.b;
    p->weights = w.a + w.b + w.shared;

    size_t req[S_N] = {0}, staging = 0;
    if (in->a && in->fwd_tokens > 0) {
        int rows = in->fwd_logits_rows > 0 ? in->fwd_logits_rows : 256;
        if (rows > in->fwd_tokens) rows = in->fwd_tokens;
        p->acts_a = acts_bytes(c, in->a, in->fwd_tokens, in->fwd_seq_len, nt) + (size_t)rows * V * sizeof(float);
        if (in->lora && in->lora_mode_a != TD_LORA_MERGED)
            p->acts_a += lora_branch_bytes(in->lora, (size_t)in->fwd_tokens);
        path_scratch(req, c, in->a, in->lora_mode_a != TD_LORA_MERGED ? in->lora : NULL, (size_t)in->fwd_tokens,
                     (size_t)rows, in->storage);
        staging = maxz(staging, (size_t)in->fwd_tokens * C * embed_bytes(in->a, in->storage));
    }
    if (in->b && in->slots > 0) {
        int chunk = in->chunk > 0 ? in->chunk : 128;
        if (chunk > in->max_len) chunk = in->max_len;
        int cap = chunk > in->slots ? chunk : in->slots;
        int rows = chunk < 64 ? chunk : 64;
        p->acts_b = acts_bytes(c, in->b, cap, in->max_len, nt) + (size_t)rows * V * sizeof(float);
        if (in->lora && in->lora_mode_b != TD_LORA_MERGED) p->acts_b += lora_branch_bytes(in->lora, (size_t)cap);
        p->kv_cache = (size_t)c->num_layers * in->slots * (size_t)in->max_len * td_memplan_kv_bytes(c, in->b, 1);
        p->kv_cache_recipe = (size_t)c->num_layers * in->slots * (size_t)in->max_len * td_memplan_kv_bytes(c, in->b, 0);
        path_scratch(req, c, in->b, in->lora_mode_b != TD_LORA_MERGED ? in->lora : NULL, (size_t)cap,
                     (size_t)(in->slots > rows ? in->slots : rows), in->storage);
        /* split-KV decode partials (attention.cu): (slots, NH, splits, HD + 2) */
        if (in->b->attention == TD_ATTN_FLASH && in->b->decode_splits > 1)
            req[S_ATTN] = (size_t)in->slots * c->num_heads * in->b->decode_splits * (c->head_dim + 2) * sizeof(float);
        staging = maxz(staging, (size_t)cap * C * embed_bytes(in->b, in->storage));
        staging = maxz(staging, (size_t)in->slots * V * sizeof(float));   /* a decode step's rows */
    }
    if (in->b && in->slots > 0) {   /* the device sampler's scratch (sampling.cu, its own slot 6) */
        size_t smp = (size_t)in->slots * V * sizeof(float) + (size_t)in->slots * ((V + 31) / 32) * sizeof(unsigned);
        p->workspace += SCRATCH_GROWTH(smp);
    }
    if (in->b && in->slots > 0 && in->keep_rows > 0)   /* td_rows_dev_create (tidal-diff) */
        p->rows_b = (size_t)in->slots * (size_t)in->keep_rows * V * sizeof(float);
    for (int s = 0; s < S_N; s++) p->workspace += req[s] ? SCRATCH_GROWTH(req[s]) : 0;
    p->workspace += staging + STAGING_SLACK;
    p->total = p->weights + p->kv_cache + p->acts_a + p->acts_b + p->rows_b + p->workspace;
}

size_t td_memplan_reserve(size_t free_bytes) { return free_bytes / 64; }

int td_memplan_fits(const td_memplan *p)
{
    return p->total <= p->free - td_memplan_reserve(p->free);
}

int td_memplan_fit(td_memplan_in *in, td_memplan *p)
{
    td_memplan_compute(in, p);
    if (td_memplan_fits(p)) return 0;
    /* first the training path's micro-batch, down to one sequence (halving) */
    while (in->a && in->fwd_tokens > in->fwd_seq_len) {
        int t = in->fwd_tokens / 2;
        in->fwd_tokens = t > in->fwd_seq_len ? t : in->fwd_seq_len;
        if (in->chunk > in->fwd_tokens) in->chunk = in->fwd_tokens;
        td_memplan_compute(in, p);
        if (td_memplan_fits(p)) return 0;
    }
    /* then the decode slots: the largest count that fits (the plan grows with it) */
    if (in->b && in->slots > 1) {
        int lo = 1, hi = in->slots - 1;
        in->slots = 1;
        td_memplan_compute(in, p);
        if (!td_memplan_fits(p)) return -1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            in->slots = mid;
            td_memplan_compute(in, p);
            if (td_memplan_fits(p)) lo = mid;
            else hi = mid - 1;
        }
        in->slots = lo;
        td_memplan_compute(in, p);
        return 0;
    }
    return -1;
}

static double gib(size_t b) { return (double)b / (double)(1ull << 30); }

/* bytes with a unit that keeps 3-4 significant digits */
static const char *human(char *buf, size_t n, size_t b)
{
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", gib(b));
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024);
    return buf;
}

void td_memplan_print(FILE *f, const char *tool, const td_memplan *p, const td_memplan_in *in)
{
    char b1[32], b2[32], b3[32];
    fprintf(f, "%s: memory plan (GPU): %zu bytes\n", tool, p->total);
    fprintf(f, "%s:   weights     %12s  (A own %s, B own %s, shared the rest)\n", tool, human(b1, sizeof b1, p->weights),
            human(b2, sizeof b2, p->weights_a), human(b3, sizeof b3, p->weights_b));
    if (in->b && in->slots > 0)
        fprintf(f, "%s:   KV cache    %12s  (%d slots x %d positions, %s as stored; %s in %s)\n", tool,
                human(b1, sizeof b1, p->kv_cache), in->slots, in->max_len,
                p->kv_cache == p->kv_cache_recipe ? td_format_info(in->b->kv_cache)->name : "fp32",
                human(b2, sizeof b2, p->kv_cache_recipe), td_format_info(in->b->kv_cache)->name);
    fprintf(f, "%s:   activations %12s  (A: %d tokens per micro-batch %s; B: %s)\n", tool,
            human(b1, sizeof b1, p->acts_a + p->acts_b), in->a ? in->fwd_tokens : 0, human(b2, sizeof b2, p->acts_a),
            human(b3, sizeof b3, p->acts_b));
    if (p->rows_b)
        fprintf(f, "%s:   B's rows    %12s  (%d slots x %d scored positions x V: the metrics on the device)\n", tool,
                human(b1, sizeof b1, p->rows_b), in->slots, in->keep_rows);
    fprintf(f, "%s:   workspace   %12s  (GEMM scratch, cuBLASLt, attention, staging)\n", tool, human(b1, sizeof b1, p->workspace));
    if (p->free)
        fprintf(f, "%s:   total       %12s  of %s free (%s total, %s kept back)%s\n", tool, human(b1, sizeof b1, p->total),
                human(b2, sizeof b2, p->free), human(b3, sizeof b3, p->device_total),
                human((char[32]){0}, 32, td_memplan_reserve(p->free)), td_memplan_fits(p) ? "" : "  DOES NOT FIT");
    else
        fprintf(f, "%s:   total       %12s  (free memory unknown: no device opened)\n", tool, human(b1, sizeof b1, p->total));
}

char *td_memplan_json(const td_memplan *p, const td_memplan_in *in)
{
    char *s = td_xmalloc(768);
    snprintf(s, 768,
             "{\"weights\": %zu, \"weights_a_own\": %zu, \"weights_b_own\": %zu, \"kv_cache\": %zu, "
             "\"kv_cache_recipe_format\": %zu, \"activations_a\": %zu, \"activations_b\": %zu, \"workspace\": %zu, "
             "\"rows_b\": %zu, \"total\": %zu, \"free\": %zu, \"device_total\": %zu, \"slots\": %d, \"max_len\": %d, "
             "\"max_num_batched_tokens\": %d}",
             p->weights, p->weights_a, p->weights_b, p->kv_cache, p->kv_cache_recipe, p->acts_a, p->acts_b,
             p->workspace, p->rows_b, p->total, p->free, p->device_total, in->slots, in->max_len, in->fwd_tokens);
    return s;
}

/* ---- the trainers --------------------------------------------------------------------------- */

/* acts_alloc (decoder.c) for save = TD_ACTS_ALL (1) or TD_ACTS_CHECKPOINT (2) under recipe r: the
 * per-layer buffers hold L slices under ALL, one under CHECKPOINT; the stream x L + 1 slices either
 * way. A mixture of experts' device buffers are one layer's either way (moe_acts_floats): the
 * per-layer routing it keeps for the backward is on the host. */
static size_t acts_train_bytes(const td_config *c, const td_recipe *r, size_t n, size_t max_keys, int save,
                               int nthreads)
{
    size_t C = c->hidden_size, F = (size_t)td_config_dense_mlp_width(c), L = c->num_layers;
    size_t NH = c->num_heads, NKV = c->num_kv_heads;
    size_t QD = NH * c->head_dim, KVD = NKV * c->head_dim, per = save == 1 ? L : 1;
    size_t f = (L + 1) * n * C + n * C /* xn */ + per * n * (2 * QD + 2 * KVD + 2 * F) /* q k v att gate up */ +
               n * C /* proj */ + (size_t)nthreads * ATT_BLOCK_ROWS * max_keys /* scores */ +
               per * n * 3 * C /* x_mid xn1 xn2 */ + per * n * 2 + n /* rstd */ + per * n * NH /* lse */ +
               per * n * F /* act */;
    if (c->qk_norm) f += per * n * (QD + KVD + NH + NKV);
    f += moe_acts_floats(c, n, r);
    return f * sizeof(float);
}

/* grad_acts_alloc (decoder_backward.c): a mixture of experts' moe_act, moe_dact, moe_dgate, moe_dup
 * (n, FW), moe_dy, moe_dx (n, C), moe_dlogits (n, E), moe_dw (n, K) on the device (their host
 * mirrors moe_dw_h, moe_dlogits_h and the trainer's moe_aux_dp are host memory); the LoRA branch's
 * scratch as wide as the widest adapted input or output, the experts' included. */
static size_t grad_acts_bytes(const td_config *c, size_t n, size_t max_keys, int lora_rank, int nthreads)
{
    size_t C = c->hidden_size, F = (size_t)td_config_dense_mlp_width(c), FW = moe_width(c);
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t f = n * (2 * C + 3 * QD + 3 * KVD + 3 * F) + (size_t)nthreads * 2 * ATT_BLOCK_ROWS * max_keys;
    if (c->num_experts > 0) f += n * (4 * FW + 2 * C + (size_t)c->num_experts + (size_t)c->num_experts_per_tok);
    if (lora_rank > 0) f += n * (2 * (size_t)lora_rank + maxz(maxz(maxz(C, F), QD), FW));
    return f * sizeof(float);
}

/* The training path's GEMM matrices (weights_recipe.c with f32 set: a trainer's recipe keeps its
 * rounded weights as fp32 copies, which the forward and the backward both read): every matrix is
 * one fp32 upload, the model's own (shared with a session that uploads it too) when the recipe
 * leaves it as it is, a rounded copy when it rounds. identity gets whether all were the model's. */
static size_t train_path_bytes(const td_config *c, const td_recipe *r, int *identity)
{
    size_t s = 0, L = (size_t)c->num_layers, Lm = L - dense_mlp_layers(c);
    for (int m = 0; m < TD_LORA_NMOD; m++) {   /* an MoE layer has no dense MLP */
        int out, inw;
        td_lora_module_shape(c, m, &out, &inw);
        s += (m >= TD_LORA_GATE ? L - Lm : L) * (size_t)out * inw * sizeof(float);
    }
    if (Lm) {   /* per MoE layer: the router, E experts' gate, up and down, a shared expert and its gate */
        size_t C = c->hidden_size, E = c->num_experts, FE = c->moe_intermediate_size;
        size_t FS = c->shared_expert_intermediate_size;
        s += Lm * (E * C + 3 * E * FE * C + 3 * FS * C + (FS ? C : 0)) * sizeof(float);
    }
    td_recipe h = td_recipe_for_head(r);
    s += (size_t)c->vocab_size * c->hidden_size * sizeof(float);
    *identity = r->weights == TD_F32 && h.weights == TD_F32;
    return s;
}

/* The scratch requests of matmul_backward_cuda for N rows of (IN -> OUT) under r. */
static void gemm_backward_scratch(size_t req[S_N + 1], const td_recipe *r, size_t N, size_t IN, size_t OUT)
{
    if (!N || td_recipe_is_plain_fp32(r)) {
        req[S_WS] = maxz(req[S_WS], LT_WORKSPACE);
        return;
    }
    size_t nY = N * OUT, nX = N * IN, nW = OUT * IN;
    int G = r->gemm_inputs, fp8 = td_recipe_fp8_gemm(r);
    int w16 = !fp8 && (G == TD_BF16 || G == TD_F16) && (int)r->weights == G;
    if (G != TD_F32) req[S_A] = maxz(req[S_A], nY * sizeof(float));
    if (fp8) {
        size_t big = maxz(nY, nX);
        req[S_N] = maxz(req[S_N], 3 * up(big, 64) * sizeof(float));   /* TDC_SLOT_GEMM_T */
        td_fp8_scheme s = r->act_scaling;
        s.fmt = r->gemm_inputs;
        size_t n = maxz(big, nY);
        req[S_SCALES] = maxz(req[S_SCALES], up(n, 64) + td_fp8_num_scales(&s, maxz(N, maxz(IN, OUT)), maxz(N, maxz(IN, OUT))) * sizeof(float));
    } else if (w16) {
        req[S_OUT] = maxz(req[S_OUT], maxz(nW, nX) * sizeof(uint16_t));
    } else if (G != TD_F32) {
        req[S_OUT] = maxz(req[S_OUT], nX * sizeof(float));
    }
    req[S_WS] = maxz(req[S_WS], LT_WORKSPACE);
}

static size_t trained_params(const td_config *c, int rank, unsigned mods)
{
    size_t n = 0, total = 0;
    if (rank > 0) {
        td_lora *lo = td_lora_new(c, rank, 16.0, mods ? mods : (1u << TD_LORA_Q) | (1u << TD_LORA_V));
        for (int m = 0; m < TD_LORA_NMOD; m++) total += lora_pair_bytes(lo, m) / sizeof(float);
        td_lora_free(lo);
        return total;
    }
    td_param_spec *specs = param_table(c, &n);
    for (size_t i = 0; i < n; i++) total += specs[i].numel;
    free(specs);
    return total;
}

/* td_session_create(slots, max_len, chunk 0: 128) on the CUDA backend: its KV cache, activations
 * and logits rows, its GEMMs' scratch, the device sampler's, the staging of a chunk's rows. */
static void session_plan(const td_config *c, const td_recipe *r, const td_lora *lora, int slots, int max_len,
                         int sampler, int nt, size_t req[S_N + 1], size_t *staging, size_t *kv, size_t *acts)
{
    size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size;
    int chunk = max_len < 128 ? max_len : 128;
    int cap = chunk > slots ? chunk : slots;
    int srows = chunk < 64 ? chunk : 64;
    *acts += acts_bytes(c, r, cap, max_len, nt) + (size_t)srows * V * sizeof(float);
    if (lora) *acts += lora_branch_bytes(lora, (size_t)cap);   /* an unmerged adapter's branch */
    *kv += (size_t)c->num_layers * slots * (size_t)max_len * td_memplan_kv_bytes(c, r, 1);
    size_t sreq[S_N] = {0};
    path_scratch(sreq, c, r, lora, (size_t)cap, (size_t)(slots > srows ? slots : srows), TD_F32);
    for (int s = 0; s < S_N; s++) req[s] = maxz(req[s], sreq[s]);
    if (r->attention == TD_ATTN_FLASH && r->decode_splits > 1)
        req[S_ATTN] = maxz(req[S_ATTN], (size_t)slots * c->num_heads * r->decode_splits * (c->head_dim + 2) * sizeof(float));
    if (sampler)   /* sampling.cu: slot 6, shared with the FP8 backward's transposes */
        req[S_N] = maxz(req[S_N], (size_t)slots * V * sizeof(float) + (size_t)slots * ((V + 31) / 32) * sizeof(unsigned));
    *staging = maxz(*staging, (size_t)cap * C * sizeof(float));
    *staging = maxz(*staging, (size_t)slots * V * sizeof(float));
}

void td_memplan_train_compute(const td_memplan_train_in *in, td_memplan_train *p)
{
    const td_config *c = in->cfg;
    size_t free_b = p->free, total_b = p->device_total;
    memset(p, 0, sizeof *p);
    p->free = free_b;
    p->device_total = total_b;
    int nt = in->nthreads > 0 ? in->nthreads : 1;
    size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size, F = (size_t)c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t N = (size_t)in->max_tokens;

    /* weights: the training path (A) and the session (B) on the trainer's fp32 model */
    td_lora *lora = NULL;
    if (in->lora_rank > 0)
        lora = td_lora_new(c, in->lora_rank, 16.0, in->lora_modules ? in->lora_modules : (1u << TD_LORA_Q) | (1u << TD_LORA_V));
    int identity;
    p->weights = train_path_bytes(c, in->train, &identity);
    td_memplan_in wa = {.cfg = c, .storage = TD_F32, .a = in->train, .lora = lora, .lora_mode_a = TD_LORA_UNMERGED};
    wsum sa = plan_weights(&wa);   /* its norms and biases, the adapter's rounded A and B, inv_freq */
    size_t QDs = (size_t)c->num_heads * c->head_dim, KVDs = (size_t)c->num_kv_heads * c->head_dim, Ls = c->num_layers;
    size_t small = ((2 * Ls + 1) * c->hidden_size + (c->qk_norm ? Ls * qk_norm_width(c) : 0) +
                    (c->qkv_bias ? Ls * (QDs + 2 * KVDs) : 0)) * sizeof(float);
    size_t lora_a = 0;
    if (lora)
        for (int m = 0; m < TD_LORA_NMOD; m++) lora_a += lora_pair_bytes(lora, m);
    p->weights += small + lora_a + (size_t)c->head_dim / 2 * sizeof(float);
    /* each scoring forward (pi_old, the reference) prepares the recipe again without the fp32
     * copies: the recipe's own codes (plan_weights' share of path A) */
    p->weights += (size_t)in->scoring_forwards * sa.a;
    if (in->reference_model) {
        int dummy;
        p->weights += train_path_bytes(c, in->train, &dummy);
    }
    if (in->infer) {   /* the session: on the trainer's model, or on the engine's own fp32 copy */
        td_memplan_in wb = {.cfg = c, .storage = TD_F32, .b = in->infer, .lora = in->engine_copy ? NULL : lora,
                            .lora_mode_b = in->lora_merged ? TD_LORA_MERGED : TD_LORA_UNMERGED};
        wsum sb = plan_weights(&wb);
        p->weights += sb.b + (identity && !in->engine_copy ? 0 : sb.shared);
    }
    if (lora && in->lora_sync_device && (in->lora_merged || in->engine_copy)) {
        size_t model = trained_params(c, 0, 0) * sizeof(float), w0 = 0;
        for (int i = 0; i < lora->num_layers * lora->slots; i++)
            if (lora->pairs[i].a) w0 += (size_t)lora->pairs[i].out * lora->pairs[i].in * sizeof(float);
        p->weights += model + (in->engine_copy ? model + w0 : 0);
    }

    p->nparams = trained_params(c, in->lora_rank, in->lora_modules);
    p->state = 4 * p->nparams * sizeof(float);   /* masters, gradients, m, v (trainer.c) */

    int save = in->gradient_checkpointing ? 2 : 1;
    size_t rows = N * V <= (1u << 25) ? N : 256;   /* td_trainer_create's logits_rows */
    if (rows > N) rows = N;
    p->acts = acts_train_bytes(c, in->train, N, (size_t)in->max_seq_len, save, nt);
    if (lora) p->acts += lora_branch_bytes(lora, N);   /* the training forward's unmerged adapter */
    p->grad_acts = grad_acts_bytes(c, N, (size_t)in->max_seq_len, in->lora_rank, nt);
    p->logits = 2 * rows * V * sizeof(float);   /* the forward's rows and the trainer's dlogits */

    size_t req[S_N + 1] = {0}, staging = N * C * sizeof(float);   /* the embedding rows */
    path_scratch(req, c, in->train, lora, N, rows, TD_F32);   /* the training forward, pi_old's */
    gemm_backward_scratch(req, in->train, N, C, maxz(QD, KVD));
    gemm_backward_scratch(req, in->train, N, QD, C);
    if (dense_mlp_layers(c)) {
        gemm_backward_scratch(req, in->train, N, C, F);
        gemm_backward_scratch(req, in->train, N, F, C);
    }
    if (c->num_experts > 0) {   /* moe_backward: the router, an expert's or the shared expert's MLP */
        size_t FW = moe_width(c);
        gemm_backward_scratch(req, in->train, N, C, (size_t)c->num_experts);
        gemm_backward_scratch(req, in->train, N, C, FW);
        gemm_backward_scratch(req, in->train, N, FW, C);
    }
    if (lora) {   /* lora_backward: dt = du B, dx += dt A, through the branch's recipe */
        td_recipe lr = lora_branch_recipe(in->train);
        size_t max_in, max_out;
        lora_widest(lora, &max_in, &max_out);
        gemm_backward_scratch(req, &lr, N, (size_t)lora->rank, max_out);
        gemm_backward_scratch(req, &lr, N, max_in, (size_t)lora->rank);
    }
    td_recipe h = td_recipe_for_head(in->train);
    gemm_backward_scratch(req, &h, rows, C, V);
    req[S_ATTN] = maxz(req[S_ATTN], N * c->num_heads * sizeof(float));   /* attention_backward.cu */
    req[S_MISC] = maxz(req[S_MISC], (size_t)4096 * sizeof(double));     /* optim.cu's partial sums */
    staging = maxz(staging, rows * V * sizeof(float));

    if (in->scoring_forwards > 0) {   /* td_forward_create(max_tokens, 0 logits rows: 256) */
        size_t r2 = N < 256 ? N : 256;
        p->rollout_acts += (size_t)in->scoring_forwards * (acts_bytes(c, in->train, (int)N, in->max_seq_len, nt) + r2 * V * sizeof(float));
        if (lora) p->rollout_acts += lora_branch_bytes(lora, N);   /* pi_old runs the adapter (the reference does not) */
    }
    if (in->infer && in->slots > 0)
        session_plan(c, in->infer, in->lora_merged || in->engine_copy ? NULL : lora, in->slots, in->max_len, in->sampler,
                     nt, req, &staging, &p->rollout_kv, &p->rollout_acts);
    if (in->eval && in->eval_slots > 0) {   /* a second session beside the first, under the training recipe */
        session_plan(c, in->eval, lora, in->eval_slots, in->eval_len, in->sampler, nt, req, &staging, &p->rollout_kv,
                     &p->rollout_acts);
        p->weights += sa.a;   /* its own prepared codes, as a scoring forward's */
    }
    for (int s = 0; s <= S_N; s++) p->workspace += req[s] ? SCRATCH_GROWTH(req[s]) : 0;
    p->workspace += staging + STAGING_SLACK;
    td_lora_free(lora);
    p->total = p->weights + p->state + p->acts + p->grad_acts + p->logits + p->rollout_kv + p->rollout_acts + p->workspace;
}

int td_memplan_train_fits(const td_memplan_train *p) { return p->total <= p->free - td_memplan_reserve(p->free); }

void td_memplan_train_print(FILE *f, const char *tool, const td_memplan_train *p, const td_memplan_train_in *in)
{
    char b1[32], b2[32], b3[32];
    fprintf(f, "%s: memory plan (GPU): %zu bytes\n", tool, p->total);
    fprintf(f, "%s:   weights        %12s  (training path fp32 copies, scoring and session copies)\n", tool,
            human(b1, sizeof b1, p->weights));
    fprintf(f, "%s:   optimizer      %12s  (%zu trained parameters%s: fp32 masters, gradients, AdamW m and v)\n", tool,
            human(b1, sizeof b1, p->state), p->nparams, in->lora_rank > 0 ? ", the LoRA adapter" : "");
    fprintf(f, "%s:   activations    %12s  (%d tokens per micro-batch, %s; their gradients %s)\n", tool,
            human(b1, sizeof b1, p->acts + p->grad_acts), in->max_tokens,
            in->gradient_checkpointing ? "gradient checkpointing: each layer's input + one layer recomputed"
                                       : "every layer's saved tensors", human(b2, sizeof b2, p->grad_acts));
    fprintf(f, "%s:   logits         %12s  (rows x V fp32 and their gradient)\n", tool, human(b1, sizeof b1, p->logits));
    if (in->infer && in->slots > 0)
        fprintf(f, "%s:   %-14s %12s  (KV cache %s: %d sequences x %d positions%s; activations %s%s)\n", tool,
                in->rollouts ? "rollout" : "evaluation", human(b1, sizeof b1, p->rollout_kv + p->rollout_acts),
                human(b2, sizeof b2, p->rollout_kv), in->slots, in->max_len,
                in->eval && in->eval_slots > 0 ? ", and the evaluation's beside it" : "", human(b3, sizeof b3, p->rollout_acts),
                in->scoring_forwards ? ", the scoring forwards' included" : "");
    fprintf(f, "%s:   workspace      %12s  (GEMM scratch, cuBLASLt, attention, sampler, staging)\n", tool,
            human(b1, sizeof b1, p->workspace));
    if (p->free)
        fprintf(f, "%s:   total          %12s  of %s free (%s total, %s kept back)%s\n", tool, human(b1, sizeof b1, p->total),
                human(b2, sizeof b2, p->free), human(b3, sizeof b3, p->device_total),
                human((char[32]){0}, 32, td_memplan_reserve(p->free)), td_memplan_train_fits(p) ? "" : "  DOES NOT FIT");
    else
        fprintf(f, "%s:   total          %12s  (free memory unknown: no device opened)\n", tool, human(b1, sizeof b1, p->total));
}

int td_memplan_train_refuse(const char *tool, const char *device, const td_memplan_train *p,
                            const td_memplan_train_in *in, td_error *err)
{
    typedef struct { const char *name; size_t b; } item;
    item it[] = {
        {"weights", p->weights}, {"optimizer state", p->state}, {"activations", p->acts + p->grad_acts},
        {"logits", p->logits}, {"KV cache", p->rollout_kv}, {"rollout activations", p->rollout_acts},
        {"workspace", p->workspace}};
    int n = (int)(sizeof it / sizeof it[0]);
    for (int i = 0; i < n; i++)   /* largest first */
        for (int j = i + 1; j < n; j++)
            if (it[j].b > it[i].b) { item t = it[i]; it[i] = it[j]; it[j] = t; }
    char h[8][32];
    size_t have = p->free - td_memplan_reserve(p->free);
    int rl = strcmp(tool, "tidal-rl") == 0;
    return td_fail(err, "does not fit the GPU: the plan needs %s, %s has %s free less %s kept back: short by %s; "
                   "largest: %s %s, %s %s, %s %s. What helps: %s--per-device-batch-size lower (%d tokens per "
                   "micro-batch now)%s%s, or a GPU with more memory (--ignore-memory-plan runs anyway)",
                   human(h[0], 32, p->total), device, human(h[1], 32, p->free), human(h[2], 32, td_memplan_reserve(p->free)),
                   human(h[3], 32, p->total > have ? p->total - have : 0), it[0].name, human(h[4], 32, it[0].b), it[1].name,
                   human(h[5], 32, it[1].b), it[2].name, human(h[6], 32, it[2].b),
                   in->gradient_checkpointing ? "" : "--gradient-checkpointing (activations ~L x smaller), ",
                   in->max_tokens,
                   rl ? ", --max-completion-length lower (the KV cache and the activations grow with it), fewer "
                        "completions per step (--per-device-batch-size x --gradient-accumulation-steps: the rollout "
                        "KV cache holds them all)" : "",
                   in->lora_rank > 0 ? "" : ", --lora-r R (trains an adapter: no full optimizer state)");
}

char *td_memplan_train_json(const td_memplan_train *p, const td_memplan_train_in *in)
{
    char *s = td_xmalloc(1024);
    snprintf(s, 1024,
             "{\"weights\": %zu, \"optimizer_state\": %zu, \"trained_parameters\": %zu, \"activations\": %zu, "
             "\"activation_gradients\": %zu, \"logits\": %zu, \"kv_cache\": %zu, \"rollout_activations\": %zu, "
             "\"workspace\": %zu, \"total\": %zu, \"free\": %zu, \"device_total\": %zu, \"micro_batch_tokens\": %d, "
             "\"max_seq_len\": %d, \"slots\": %d, \"max_len\": %d, \"gradient_checkpointing\": %s, \"lora_r\": %d}",
             p->weights, p->state, p->nparams, p->acts, p->grad_acts, p->logits, p->rollout_kv, p->rollout_acts,
             p->workspace, p->total, p->free, p->device_total, in->max_tokens, in->max_seq_len, in->slots, in->max_len,
             in->gradient_checkpointing ? "true" : "false", in->lora_rank);
    return s;
}
