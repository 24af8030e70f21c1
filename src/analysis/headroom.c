/* FP16 headroom (include/tidal/headroom.h): an observing wrapper of the CPU backend's op table
 * counts every op output of the teacher-forced forward against FP16's limits. */
#include "tidal/headroom.h"
#include "tidal/progress.h"
#include "../model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The ops of one layer in decoder.c's order; a matmul with n outputs names each of them. */
enum {
    OP_IN_NORM, OP_Q, OP_K, OP_V, OP_Q_NORM, OP_K_NORM, OP_Q_ROPE, OP_K_ROPE, OP_ATTN, OP_O, OP_RES1,
    OP_POST_NORM, OP_GATE, OP_UP, OP_ACT, OP_DOWN, OP_RES2, OP_PER_LAYER
};
static const char *const OP_NAMES[OP_PER_LAYER] = {
    "input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q (rope)", "k (rope)", "attention",
    "o_proj", "residual (+attn)", "post_attention_layernorm", "gate_proj", "up_proj", "act_fn(gate)*up",
    "down_proj", "residual (+mlp)"};

typedef struct {
    td_backend be;              /* first: ctx->be points here */
    const td_model *m;
    int L;
    int layer;                  /* -1 before the first layer, L after the last */
    int n_norm, n_mm1, n_rope, n_res;   /* ops of each kind seen in this layer */
    int first_norm;             /* the next norm is layer 0's input norm (set by the embedding) */
    td_headroom_row *rows;      /* [0] embedding, [1 + l * OP_PER_LAYER + op], then norm, lm_head */
} observer;

static observer *obs_of(const td_ops *ctx) { return (observer *)(void *)ctx->be; }

static td_headroom_row *row_at(observer *o, int op)
{
    if (o->layer < 0) return &o->rows[0];
    if (o->layer >= o->L) return &o->rows[1 + (size_t)o->L * OP_PER_LAYER + (op == OP_O ? 1 : 0)];
    return &o->rows[1 + (size_t)o->layer * OP_PER_LAYER + op];
}

static void count(td_headroom_row *r, const float *x, size_t n)
{
    uint64_t nf = 0, ov = 0, am = 0, sub = 0, fl = 0;
    double mx = r->max_abs;
    for (size_t i = 0; i < n; i++) {
        double a = fabs((double)x[i]);
        if (!isfinite(a)) { nf++; continue; }
        if (a > mx) mx = a;
        if (a > TD_FP16_MAX) { am++; ov += a >= TD_FP16_OVERFLOW; }
        else if (a < TD_FP16_MIN_NORMAL && a > 0) { sub++; fl += a <= TD_FP16_FLUSH; }
    }
    r->count += n; r->nonfinite += nf; r->overflow += ov; r->above_max += am; r->subnormal += sub; r->flushed += fl;
    r->max_abs = mx;
}

static void ob_embedding(const td_ops *ctx, float *out, const int *tokens, const td_wmat *embed, int N, int C)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.embedding_forward(ctx, out, tokens, embed, N, C);
    o->layer = -1;
    count(row_at(o, 0), out, (size_t)N * C);
    o->layer = 0;
    o->n_norm = o->n_mm1 = o->n_rope = o->n_res = 0;
    o->first_norm = 1;
}

/* decoder.c computes each layer's input norm at the end of the previous layer (the residual add
 * and the next norm are one step, as fused-add kernels do them), before the layer callback moves
 * the observer on. So within layer l the norms come as: (Qwen3: q_norm, k_norm),
 * post_attention_layernorm, then layer l + 1's input_layernorm (the final norm after the last
 * layer); the very first input norm follows the embedding. */
static void ob_rmsnorm(const td_ops *ctx, float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                       float eps)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.rmsnorm_forward(ctx, out, rstd, inp, weight, N, C, eps);
    td_headroom_row *row;
    if (o->first_norm) {
        row = row_at(o, OP_IN_NORM);
        o->first_norm = 0;
    } else {
        static const int qk[3] = {OP_Q_NORM, OP_K_NORM, OP_POST_NORM};
        int n_in_layer = o->m->cfg.qk_norm ? 3 : 1;
        if (o->n_norm < n_in_layer) {
            row = row_at(o, o->m->cfg.qk_norm ? qk[o->n_norm] : OP_POST_NORM);
        } else {            /* the next layer's input norm, or the final norm */
            int next = o->layer + 1;
            row = next < o->L ? &o->rows[1 + (size_t)next * OP_PER_LAYER + OP_IN_NORM]
                              : &o->rows[1 + (size_t)o->L * OP_PER_LAYER];
        }
        o->n_norm++;
    }
    count(row, out, (size_t)N * C);
}

static void ob_matmul(const td_ops *ctx, int n, float *const *out, const float *inp, const td_wmat *weight,
                      const float *const *bias, int N, int IN, const int *OUT)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.matmul_forward(ctx, n, out, inp, weight, bias, N, IN, OUT);
    for (int j = 0; j < n; j++) {
        int op = n == 3 ? OP_Q + j : n == 2 ? OP_GATE + j : (o->n_mm1 == 0 ? OP_O : OP_DOWN);
        if (o->layer >= o->L) op = OP_O;   /* the lm_head (row after the final norm) */
        count(row_at(o, op), out[j], (size_t)N * OUT[j]);
    }
    if (n == 1) o->n_mm1++;
}

static void ob_rope(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N, int nheads, int HD)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.rope_forward(ctx, x, pos, inv_freq, N, nheads, HD);
    count(row_at(o, o->n_rope == 0 ? OP_Q_ROPE : OP_K_ROPE), x, (size_t)N * nheads * HD);
    o->n_rope++;
}

static void ob_attention(const td_ops *ctx, float *out, float *lse, const float *q, const float *k, const float *v,
                         const size_t *kv_off, const int *pos, int N, int NH, int NKV, int HD, float *scratch,
                         int max_keys)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.attention_forward(ctx, out, lse, q, k, v, kv_off, pos, N, NH, NKV, HD, scratch, max_keys);
    count(row_at(o, OP_ATTN), out, (size_t)N * NH * HD);
}

static void ob_swiglu(const td_ops *ctx, float *out, const float *gate, const float *up, int N, int F)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.swiglu_forward(ctx, out, gate, up, N, F);
    count(row_at(o, OP_ACT), out, (size_t)N * F);
}

static void ob_residual(const td_ops *ctx, float *out, const float *a, const float *b, size_t n)
{
    observer *o = obs_of(ctx);
    td_backend_cpu.residual_forward(ctx, out, a, b, n);
    count(row_at(o, o->n_res == 0 ? OP_RES1 : OP_RES2), out, n);
    o->n_res++;
}

/* After layer l: the next ops belong to layer l + 1 (or to the final norm and lm_head). */
static void on_layer(void *user, int l, int N, const int *seq, const int *pos, const float *x)
{
    observer *o = user;
    o->layer = l + 1;
    o->n_norm = o->n_mm1 = o->n_rope = o->n_res = 0;
}

static void weights_rows(const td_model *m, td_headroom_row *rows, size_t *n)
{
    size_t np;
    td_param_spec *specs = param_table(&m->cfg, &np);
    size_t k0 = *n, chunk = 1u << 20;
    float *buf = td_xmalloc(chunk * sizeof(float));
    for (size_t i = 0; i < np; i++) {
        /* one row per tensor kind: "model.layers.3.self_attn.q_proj.weight" -> "self_attn.q_proj.weight" */
        const char *nm = specs[i].name, *p = strstr(nm, "layers.");
        if (p) { p = strchr(p + 7, '.'); nm = p ? p + 1 : nm; }
        else if (!strncmp(nm, "model.", 6)) nm += 6;
        size_t k;
        for (k = k0; k < *n; k++) if (!strcmp(rows[k].name, nm)) break;
        if (k == *n) {
            memset(&rows[k], 0, sizeof rows[k]);
            rows[k].layer = -2;
            snprintf(rows[k].name, sizeof rows[k].name, "%s", nm);
            (*n)++;
        }
        /* the tensor as stored, widened by rows in chunks of about 2^20 values */
        size_t cols = specs[i].ndim == 2 ? (size_t)specs[i].shape[1] : specs[i].numel;
        size_t nrows = specs[i].numel / cols, step = cols < chunk ? chunk / cols : 1;
        float *big = step == 1 && cols > chunk ? td_xmalloc(cols * sizeof(float)) : NULL;
        for (size_t r0 = 0; r0 < nrows; r0 += step) {
            size_t nr = nrows - r0 < step ? nrows - r0 : step;
            model_param_rows_f32(m, i, &specs[i], r0, nr, big ? big : buf);
            count(&rows[k], big ? big : buf, nr * cols);
        }
        free(big);
    }
    free(buf);
    free(specs);
}

int td_headroom_run(const char *model_dir, const td_seqset *s, const td_recipe *r, td_headroom *out, FILE *progress,
                    td_error *err)
{
    memset(out, 0, sizeof *out);
    td_model *m = td_model_load(model_dir, err);
    if (!m) return -1;
    int L = m->cfg.num_layers, rc = -1;
    size_t n_ops = 1 + (size_t)L * OP_PER_LAYER + 2;
    observer o = {.be = td_backend_cpu, .m = m, .L = L};
    o.be.name = "cpu+fp16-headroom";
    o.be.embedding_forward = ob_embedding;
    o.be.rmsnorm_forward = ob_rmsnorm;
    o.be.matmul_forward = ob_matmul;
    o.be.rope_forward = ob_rope;
    o.be.attention_forward = ob_attention;
    o.be.swiglu_forward = ob_swiglu;
    o.be.residual_forward = ob_residual;
    o.rows = td_xcalloc(n_ops + TD_ROLE_COUNT + 8, sizeof(td_headroom_row));
    int max_len = s->max_len > 1 ? s->max_len : 2;
    td_forward *f = td_forward_create(m, max_len * 4, max_len, 0, err);
    if (!f) goto done;
    if (r && td_forward_set_recipe(f, r, err)) goto done;
    forward_set_backend(f, &o.be);
    td_forward_set_layer_fn(f, on_layer, &o);
    td_progress pr;
    td_progress_start(&pr, progress, "tidal-headroom");
    for (int i0 = 0; i0 < s->n; i0 += 8) {
        int n = s->n - i0 < 8 ? s->n - i0 : 8;
        if (td_forward_logprobs(f, n, (const int *const *)(s->tok + i0), s->len + i0, NULL, NULL, NULL, err)) goto done;
        for (int i = 0; i < n; i++) out->tokens += s->len[i0 + i];
        td_progress_update(&pr, i0 + n, s->n, "sequences");
    }
    td_progress_end(&pr);
    /* names of the op rows; rows of ops this architecture does not have (q/k norm) are dropped */
    size_t k = 0;
    for (size_t i = 0; i < n_ops; i++) {
        td_headroom_row *row = &o.rows[i];
        if (i == 0) { row->layer = -1; snprintf(row->name, sizeof row->name, "embed_tokens"); }
        else if (i > (size_t)L * OP_PER_LAYER) {
            row->layer = L;
            snprintf(row->name, sizeof row->name, "%s", i == n_ops - 2 ? "norm" : "lm_head (logits)");
        } else {
            row->layer = (int)((i - 1) / OP_PER_LAYER);
            snprintf(row->name, sizeof row->name, "%s", OP_NAMES[(i - 1) % OP_PER_LAYER]);
        }
        if (row->count) o.rows[k++] = *row;
    }
    out->n_ops = k;
    weights_rows(m, o.rows, &k);
    out->rows = o.rows;
    out->n = k;
    o.rows = NULL;
    rc = 0;
done:
    free(o.rows);
    td_forward_free(f);
    td_model_free(m);
    return rc;
}

void td_headroom_free(td_headroom *h)
{
    free(h->rows);
    memset(h, 0, sizeof *h);
}
