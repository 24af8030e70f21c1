/* tidal — the CUDA backend's shared pieces (internal header of the .cu files of src/backend/cuda).
 *
 * The CUDA backend is the op list of src/model/ops.h run on an NVIDIA GPU: one `op.cu` per op
 * family (its backward ops in `op_backward.cu`), each op carrying the CPU op's name and argument order with the suffix `_cuda`
 * (rmsnorm_forward_cuda <-> rmsnorm_cpu / rmsnorm_forward_ref), and the same rounding points
 * as src/backend/cpu.c under the same recipe. GEMMs run on cuBLASLt (matmul.cu), everything
 * else on tidal's own kernels. Activations are fp32 buffers holding the rounded values, as on
 * the CPU, so the model code, the recipes and the tools do not know which device runs them.
 *
 * Every source here compiles two ways:
 *   nvcc                     the real backend (libtidal when nvcc is found; `--device cuda`)
 *   g++ -DTD_CUDASIM         against tests/cudasim/cudasim.h, a CPU simulator of the CUDA
 *                            subset these kernels use (threads as fibers, __syncthreads, warp
 *                            shuffles, shared memory): the kernels' logic is tested against
 *                            the CPU ops on every machine, GPU or not (tests/test_cuda_sim_*.c).
 * Hence three rules for kernel code: launch with TD_LAUNCH (no <<< >>>), declare dynamic shared
 * memory with TD_DYN_SMEM, and use only what cudasim.h provides (cuda_bf16.h / cuda_fp8.h
 * intrinsics are not used: the roundings are tidal's own bit arithmetic below, bit-identical
 * to formats.h, which tests/nv checks against NVIDIA's host functions).
 */
#ifndef TIDAL_CUDA_INTERNAL_CUH
#define TIDAL_CUDA_INTERNAL_CUH

#ifdef TD_CUDASIM
#include "cudasim.h"          /* tests/cudasim: the CPU simulator */
#else
#include <cuda_runtime.h>
#endif

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../../model/ops.h"
#include "tidal/scaling.h"
}

/* ---- launching ---------------------------------------------------------------------------- */

/* The backend's profiler (profile.cu; TIDAL_CUDA_PROFILE=1 or =FILE, off by default). When
 * tdc_prof_on, an event is tdc_prof_begin() (the device synchronised, the time noted), the work,
 * tdc_prof_end(name, file, bytes) (synchronised again; the wall time, a call and the bytes added
 * to "name (file's basename)"; file NULL: name alone). It returns the event's seconds, which
 * tdc_prof_detail adds to a breakdown line (lt.cu: "cublasLtMatmul MxNxK"). Off, a launch costs
 * one test of tdc_prof_on. tdc_prof_setup reads the variable again (it is read when the library
 * loads and when the backend opens); tdc_prof_report writes the table now (at exit otherwise). */
extern int tdc_prof_on;
void tdc_prof_setup(void);
void tdc_prof_begin(void);
double tdc_prof_end(const char *name, const char *file, size_t bytes);
void tdc_prof_detail(const char *label, double seconds);
void tdc_prof_report(void);
/* a statement timed under name alone (a copy, an allocation: no file) with its bytes, when
 * profiling (the statement last: it may hold commas) */
#define TDC_TIMED(name, bytes, ...) do { \
        if (tdc_prof_on) tdc_prof_begin(); \
        __VA_ARGS__; \
        if (tdc_prof_on) (void)tdc_prof_end((name), NULL, (bytes)); \
    } while (0)
/* an expression (void) that times `work` under `name` when profiling (work in parentheses
 * where it has commas outside any: a <<< >>> launch) */
#define TD_PROFILED(work, name) \
    (__builtin_expect(tdc_prof_on, 0) ? (tdc_prof_begin(), (work), (void)tdc_prof_end((name), __FILE__, 0)) \
                                      : (void)(work))

#ifdef TD_CUDASIM
#define TD_LAUNCH(kernel, grid, block, smem, stream, ...) \
    TD_PROFILED(cudasim_launch((kernel), dim3(grid), dim3(block), (size_t)(smem), (stream), __VA_ARGS__), #kernel)
#define TD_DYN_SMEM(type, name) type *name = (type *)cudasim_dyn_smem()
#else
#define TD_LAUNCH(kernel, grid, block, smem, stream, ...) \
    TD_PROFILED(((kernel)<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)), #kernel)
#define TD_DYN_SMEM(type, name) extern __shared__ __align__(16) unsigned char name##_raw_[]; \
    type *name = (type *)name##_raw_
#endif

/* ---- checking ------------------------------------------------------------------------------ */

/* A failed CUDA / cuBLAS call inside an op is fatal (the ops return nothing): the message names
 * the file, the line, the call, the library's own error string and a hint, then exit(1). */
#define CUDA_CHECK(call) tdc_check_cuda((call), #call, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH() tdc_check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
void tdc_check_cuda(cudaError_t e, const char *what, const char *file, int line);
/* Device allocations: out of memory is a clear message (bytes, purpose, free memory) and exit 1. */
void tdc_malloc(void **p, size_t bytes, int async, const char *what, const char *file, int line);
void tdc_free(void *p, int async);   /* a tdc_malloc'd block (cudaFree / cudaFreeAsync) */
#define TDC_MALLOC(pp, bytes, what) tdc_malloc((void **)(pp), (bytes), 0, (what), __FILE__, __LINE__)

/* ---- memory: host or device pointers at the seam (backend.cu) -------------------------------
 * The model code hands the ops pointers from be->alloc (device memory, cudaMalloc) and pointers
 * into host memory: the prepared weights (td_wmat data and scales, norm weights, biases,
 * inv_freq), per-call tables (tokens, pos, kv_off) and a few host outputs (a caller's logits
 * rows). An op turns each into a device pointer with these:
 *   tdc_const  a host array that stays as it is while the recipe is set (weights): uploaded once
 *              and kept (a cache keyed by host address, dropped by be->forget); a device
 *              pointer is returned as it is
 *   tdc_in     a per-call host input: copied to a staging buffer of this op call
 *   tdc_out    an output (or in-place) host buffer: a staging buffer, copied in first when
 *              copy_in, and back to the host by tdc_done; device pointers pass through
 *   tdc_done   ends an op call: copies staged outputs back, frees the staging buffers
 * All on the backend's one stream (tdc_stream); be->sync waits for it. */
const void *tdc_const(const void *p, size_t bytes);
/* The device copy of host key (bytes) that be->prepare fills on the device (prepare.cu): kept
 * through be->forget until be->release(key); created (content undefined) when absent. */
void *tdc_const_slot(const void *key, size_t bytes);
/* The device copy of the host address p when prepare or alias made one (the host bytes are then
 * stale: an op that reads a host array without knowing its size, the embedding's gather, asks
 * here first); NULL otherwise. *view_fmt: TD_F32, or for a rounding view (be->alias with a
 * 16-bit fmt, p its start) that format: the floats returned are rounded to it as they are read. */
const void *tdc_const_find(const void *p, int *view_fmt);
const void *tdc_in(const void *p, size_t bytes);
void *tdc_out(void *p, size_t bytes, int copy_in);
void tdc_done(void);
cudaStream_t tdc_stream(void);
/* Grow-only device scratch, one buffer per slot (slots 0..7; the op files number theirs in
 * their header comment). Valid until the next call with the same slot. */
void *tdc_scratch(int slot, size_t bytes);
enum { TDC_SLOT_GEMM_A = 0, TDC_SLOT_GEMM_SCALES = 1, TDC_SLOT_GEMM_OUT = 2, TDC_SLOT_WORKSPACE = 3,
       TDC_SLOT_ATTN = 4, TDC_SLOT_MISC = 5, TDC_SLOT_GEMM_T = 6 };

/* ---- roundings: formats.h, on the device ------------------------------------------------- */

/* td_round(f, x): x rounded to format f and back (SATFINITE), bit for bit the CPU's.
 * Implemented in round.cuh (__host__ __device__). */
#include "round.cuh"

/* Recipe fields the kernels need, flattened (a td_recipe is host data). */
typedef struct {
    int act;            /* td_format of activations (TD_F32 = no rounding) */
    int norm;           /* 0 D(D(x rs) w), 1 D(x rs w), 2 (x rs) w fp32 (residual fp32) */
    int rope;           /* td_rope_form */
    int residual_fp32;
} tdc_recipe;

static inline tdc_recipe tdc_recipe_of(const td_ops *ctx)
{
    tdc_recipe k = {TD_F32, 0, TD_ROPE_UNFUSED, 0};
    const td_recipe *r = ctx->recipe;
    if (!r) return k;
    k.act = r->activations;
    k.norm = r->residual_fp32 ? 2 : r->norm == TD_NORM_UNFUSED ? 0 : 1;
    k.rope = r->rope;
    k.residual_fp32 = r->residual_fp32;
    return k;
}

/* ---- the ops (one .cu per family), names and arguments of ops.h + _cuda -------------------- */
extern "C" {
void embedding_forward_cuda(const td_ops *ctx, float *out, const int *tokens, const td_wmat *embed,
                            int N, int C);
void rmsnorm_forward_cuda(const td_ops *ctx, float *out, float *rstd, const float *inp,
                          const float *weight, int N, int C, float eps);
void matmul_forward_cuda(const td_ops *ctx, int n, float *const *out, const float *inp,
                         const td_wmat *weight, const float *const *bias, int N, int IN,
                         const int *OUT);
void rope_forward_cuda(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                       int nheads, int HD);
void kv_write_cuda(const td_ops *ctx, float *store, const float *rows, const size_t *kv_off,
                   const int *pos, int N, int KVD);
void attention_forward_cuda(const td_ops *ctx, float *out, float *lse, const float *q,
                            const float *k, const float *v, const size_t *kv_off, const int *pos,
                            int N, int NH, int NKV, int HD, float *scratch, int max_keys);
void swiglu_forward_cuda(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                         int F);
/* attention_forward_cuda's kernels: tdc_attn_kernel picks one for the flash form (0: by shape,
 * 1: the simple attn_rows, 2: the tiled attn_tile, 3: the tensor-core attn_mma where the
 * recipe's arithmetic allows it (attention_mma.cu; not bit-exact), else by shape; tests and
 * benches set it, TIDAL_CUDA_ATTN=simple|tiled|mma its default). The tiled and mma kernels
 * take runs of at most attention_tiled_rows positions. */
extern int tdc_attn_kernel;
int attention_tiled_rows(int HD, int NH, int NKV);
void attention_tiled_launch(float *out, float *lse, const float *q, const void *k, const void *v,
                            int kfmt, float ks, const size_t *kv_off, const int *pos,
                            const int *gstart, int ng, int NH, int NKV, int HD, int D, int block);
void residual_forward_cuda(const td_ops *ctx, float *out, const float *inp1, const float *inp2,
                           size_t n);
void scale_forward_cuda(const td_ops *ctx, float *x, float s, size_t n);
void logsoftmax_forward_cuda(const td_ops *ctx, float *x, int N, int V);
void optim_adamw_cuda(float *param, const float *grad, float *m1, float *m2, size_t n,
                      const td_adamw_k *k);
double optim_sumsq_cuda(const float *g, size_t n);
void optim_scale_cuda(float *g, size_t n, float k);
void logprob_gather_cuda(const td_ops *ctx, float *tlogp, int *top1, const float *logp,
                         const int *target, int N, int V);
/* the diff's per-token metrics (token_metrics.cu; ops.h row_logsoftmax, token_metrics) */
void row_logsoftmax_cuda(const td_ops *ctx, float *dst, const size_t *dst_row, const float *src, int n,
                         int V, float T);
void token_metrics_cuda(const td_ops *ctx, td_token_metrics *m, const float *la, const size_t *ia,
                        const float *lb, const size_t *ib, const int *y, int n, int V);
extern int row_logsoftmax_cuda_force_exact;   /* tests: every row summed in td_log_sum_exp's order */
/* bytes copied device -> host by the backend so far: downloads, staged outputs of the ops,
 * reductions brought back (tdc_d2h counts them; td_device_d2h_bytes, memplan.h) */
size_t td_cuda_d2h_bytes(void);
void tdc_d2h_count(size_t bytes);
/* be->prepare (prepare.cu; ops.h says what it computes) */
void prepare_cuda(const void *key, int storage, const float *src, size_t n, int fmt, float scale);
/* be->lora_fold (prepare.cu): an adapter merged into a prepared weight, with the merge's sums */
void lora_fold_cuda(const void *key, int storage, const float *w, const float *a, const float *b, int N, int K,
                    int r, float scale, int fmt, double *stats);
/* be->lora_peft_sync / lora_drift (lora_sync.cu): --lora-sync merge-unmerge on the device */
void lora_peft_sync_cuda(float *w, float *m, const float *a, const float *b, int N, int K, int r, float scale,
                         int dtype, int efmt, double *stats);
void lora_drift_cuda(const float *w, const float *w0, int N, int K, double *stats);
/* be->prepare_fp8 (prepare.cu): an FP8 weight quantised on the device (fp8_quantize_cuda) */
void prepare_fp8_cuda(const void *codes_key, const void *scales_key, const void *f32_key, const td_fp8_scheme *s,
                      const float *src, int rows, int cols);

/* the backward ops (one `op_backward.cu` per family) */
void embedding_backward_cuda(const td_ops *ctx, float *dembed, const float *dout,
                             const int *tokens, int N, int C);
void matmul_backward_cuda(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int N, int IN,
                          int OUT);
void rmsnorm_backward_cuda(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                           const float *inp, const float *weight, const float *rstd, int N, int C);
void rope_backward_cuda(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq, int N,
                        int nheads, int HD);
void attention_backward_cuda(const td_ops *ctx, float *dq, float *dk, float *dv, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const int *pos, int N, int NH, int NKV, int HD,
                             float *scratch, int max_keys);
void swiglu_backward_cuda(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, int N, int F);
void logsoftmax_backward_cuda(const td_ops *ctx, float *dx, const float *logp, const int *target,
                              const float *dlogp, int N, int V);

/* a mixture of experts' row ops (moe.cu, moe_backward.cu; ops.h moe_*) */
void moe_gather_cuda(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n, int K, int C);
void moe_combine_cuda(const td_ops *ctx, float *out, const float *y, const int *rows, const float *w, int N, int n,
                      int K, int C);
void moe_scatter_cuda(const td_ops *ctx, float *v, const float *y, const int *rows, const float *w, int N, int n,
                      int K, int C);
void moe_sum_cuda(const td_ops *ctx, float *out, const float *v, int N, int K, int C);
void moe_shared_combine_cuda(const td_ops *ctx, float *out, const float *y, const float *z, int N, int C);
void moe_combine_backward_cuda(const td_ops *ctx, float *dw, float *dy, const float *dout, const float *y,
                               const int *rows, const float *w, int N, int n, int K, int C);
void moe_scatter_add_cuda(const td_ops *ctx, float *dx, const float *dxe, const int *rows, int N, int n, int K,
                          int C, int rounded);
void moe_shared_combine_backward_cuda(const td_ops *ctx, float *dz, float *dy, const float *dout, const float *y,
                                      const float *z, int N, int C);

} /* extern "C" */
#include "tidal/sampling.h"
extern "C" {
/* td_sample on the device (sampling.cu): n rows of logits (V wide, device or host memory), the
 * tokens seen by each row (host arrays, for the repetition penalty), each row's stream rng
 * (advanced as td_sample advances it). Writes tok (n), logp (n, the processed log-prob of each
 * token; may be NULL) and proc (n, V processed log-prob rows; NULL = none), host or device
 * memory. The tokens are td_sample's; returns how many rows were sampled on the host (td_sample
 * itself, when a top-p sum could not be certified on the device). */
int sample_cuda(const td_ops *ctx, const td_sampling *s, const float *logits, int n, int V,
                const int *const *seen, const int *n_seen, td_rng *rng, int *tok, float *logp,
                float *proc);
/* tests: 1 = take no certified decision (every sequential / host fallback runs) */
extern int sample_cuda_force_exact;
}

#endif
