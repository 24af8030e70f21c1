/* tidal — the device memory plan (include/tidal/memplan.h): what the CUDA backend will allocate
 * for a run, computed from the configuration and the recipes before anything is allocated.
 *
 * Every figure mirrors one allocation site; keep them in step when a site changes:
 *   weights      src/model/weights_recipe.c prep_wmat (what a recipe copies, what it shares with
 *                the checkpoint's storage), uploaded by tdc_const (backend.cu, once per host
 *                range) when a GEMM reads them; matmul.cu's `widened` fp32 copies (plain fp32
 *                recipes on 16-bit storage, batch-invariant recipes, FP8 emulation); lora_run.c's
 *                rounded A and B (unmerged); norms, biases, inv_freq (fp32, tiny)
 *   embedding    never resident: embedding.cu gathers the rows on the host (staging only)
 *   kv cache     src/paths/session.c (td_memplan_kv_bytes)
 *   activations  src/model/decoder.c acts_alloc (forward only), the paths' logits rows
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

static size_t lora_pair_bytes(const td_lora *lora, int m)
{
    size_t s = 0;
    for (int l = 0; l < lora->num_layers; l++) {
        const td_lora_pair *p = &lora->pairs[(size_t)l * TD_LORA_NMOD + m];
        if (p->a) s += ((size_t)p->in + p->out) * lora->rank * sizeof(float);
    }
    return s;
}

static int lora_adapted(const td_lora *lora, int m)
{
    int k = 0;
    for (int l = 0; l < lora->num_layers; l++) k += lora->pairs[(size_t)l * TD_LORA_NMOD + m].a != NULL;
    return k;
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
        size_t k = lora ? (size_t)lora_adapted(lora, m) : 0;
        int ma = lora && in->lora_mode_a == TD_LORA_MERGED, mb = lora && in->lora_mode_b == TD_LORA_MERGED;
        weights_add(&w, in->a, 0, in->b, 0, in->storage, (size_t)out, (size_t)inw, L - k);
        weights_add(&w, in->a, ma, in->b, mb, in->storage, (size_t)out, (size_t)inw, k);
        if (lora) {   /* unmerged: each path's rounded A and B, fp32 (lora_run.c) */
            size_t pb = lora_pair_bytes(lora, m);
            if (in->a && !ma) w.a += pb;
            if (in->b && !mb) w.b += pb;
        }
    }
    td_recipe ha, hb;
    if (in->a) ha = td_recipe_for_head(in->a);
    if (in->b) hb = td_recipe_for_head(in->b);
    weights_add(&w, in->a ? &ha : NULL, 0, in->b ? &hb : NULL, 0, in->storage, (size_t)c->vocab_size,
                (size_t)c->hidden_size, 1);
    /* norms and biases: the model's fp32 under the plain fp32 recipe, else a rounded copy each */
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t small = ((2 * L + 1) * c->hidden_size + (c->qk_norm ? 2 * L * c->head_dim : 0) +
                    (c->qkv_bias ? L * (QD + 2 * KVD) : 0)) * sizeof(float);
    int plain_a = in->a && td_recipe_is_plain_fp32(in->a), plain_b = in->b && td_recipe_is_plain_fp32(in->b);
    if (plain_a || plain_b) w.shared += small;
    if (in->a && !plain_a) w.a += small;
    if (in->b && !plain_b) w.b += small;
    w.shared += (size_t)c->head_dim / 2 * sizeof(float);   /* inv_freq */
    return w;
}

/* ---- activations and scratch --------------------------------------------------------------- */

/* acts_alloc (decoder.c, save 0): x, xn, q, k, v, att, proj, gate, up of cap rows, and the
 * attention scores scratch (nthreads, ATT_BLOCK, max_keys). */
static size_t acts_bytes(const td_config *c, int cap, int max_keys, int nthreads)
{
    size_t C = c->hidden_size, F = c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    size_t per_row = 3 * C + 2 * QD + 2 * KVD + 2 * F;
    return ((size_t)cap * per_row + (size_t)nthreads * ATT_BLOCK_ROWS * (size_t)max_keys) * sizeof(float);
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
static void path_scratch(size_t req[S_N], const td_config *c, const td_recipe *r, size_t N, size_t H,
                         td_format storage)
{
    size_t C = c->hidden_size, F = c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    td_format pd = prepared(r, storage);
    gemm_scratch(req, r, pd, N, C, maxz(QD, KVD));   /* q, k, v */
    gemm_scratch(req, r, pd, N, QD, C);              /* o_proj */
    gemm_scratch(req, r, pd, N, C, F);               /* gate, up */
    gemm_scratch(req, r, pd, N, F, C);               /* down */
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
        p->acts_a = acts_bytes(c, in->fwd_tokens, in->fwd_seq_len, nt) + (size_t)rows * V * sizeof(float);
        path_scratch(req, c, in->a, (size_t)in->fwd_tokens, (size_t)rows, in->storage);
        staging = maxz(staging, (size_t)in->fwd_tokens * C * embed_bytes(in->a, in->storage));
    }
    if (in->b && in->slots > 0) {
        int chunk = in->chunk > 0 ? in->chunk : 128;
        if (chunk > in->max_len) chunk = in->max_len;
        int cap = chunk > in->slots ? chunk : in->slots;
        int rows = chunk < 64 ? chunk : 64;
        p->acts_b = acts_bytes(c, cap, in->max_len, nt) + (size_t)rows * V * sizeof(float);
        p->kv_cache = (size_t)c->num_layers * in->slots * (size_t)in->max_len * td_memplan_kv_bytes(c, in->b, 1);
        p->kv_cache_recipe = (size_t)c->num_layers * in->slots * (size_t)in->max_len * td_memplan_kv_bytes(c, in->b, 0);
        path_scratch(req, c, in->b, (size_t)cap, (size_t)(in->slots > rows ? in->slots : rows), in->storage);
        /* split-KV decode partials (attention.cu): (slots, NH, splits, HD + 2) */
        if (in->b->attention == TD_ATTN_FLASH && in->b->decode_splits > 1)
            req[S_ATTN] = (size_t)in->slots * c->num_heads * in->b->decode_splits * (c->head_dim + 2) * sizeof(float);
        staging = maxz(staging, (size_t)cap * C * embed_bytes(in->b, in->storage));
        staging = maxz(staging, (size_t)in->slots * V * sizeof(float));   /* a decode step's rows */
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
