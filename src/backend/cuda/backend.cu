/* tidal — the CUDA backend's table (td_backend_cuda) and its memory at the seam.
 *
 *   alloc/free        cudaMalloc: activations, KV caches and logits live on the GPU only (plain
 *                     device memory, never managed: oversubscribed managed memory can hang a
 *                     GPU); the host reads logits rows through be->download, and the row tables
 *                     it fills (tokens, pos, kv_off) are host memory the ops copy in (tdc_in)
 *   tdc_const         host arrays that stay put while a recipe is set (prepared weights in their
 *                     storage dtype, norm weights, biases, inv_freq): uploaded on first use and
 *                     kept, keyed by host address range; be->forget drops them (a recipe is set
 *                     again, a path is freed: the host memory may be reused)
 *   prepare / alias   the device copy of a host key made on the device (prepare.cu: a recipe's
 *                     weights rounded from a trainer's device masters) or aliased to device
 *                     memory (the masters themselves): entries forget keeps, release drops
 *   tdc_in / tdc_out  per-call host tables and host outputs: staged through stream-ordered
 *                     allocations, copied back (and the stream synchronised) by tdc_done
 * Errors in here are fatal with file, line, call and a hint (tdc_check_cuda): the op list has
 * no error returns, and a failed CUDA call leaves the context unusable anyway. Opening the
 * backend (td_cuda_backend_open) is the one place that fails softly: no driver, no GPU, a bad
 * device index come back as a td_error for the tool to print (exit 1). */
#include "cuda_internal.cuh"
#include "matmul.cuh"

#include <omp.h>

#include <unordered_map>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a weight's device copy; kept: made by prepare or alias (the host range is stale or an alias of
 * device memory), so forget keeps it; alias: dev is the caller's memory, never freed here; view:
 * a rounding view (alias with fmt bf16 / fp16: the embedding's gather rounds dev's floats) */
struct centry { const char *host; size_t bytes; char *dev; int kept, alias, view; };
struct stage { void *host; void *dev; size_t bytes; int out; };         /* a staged host buffer */

static struct {
    int open;
    int device;
    char name[256];
    cudaStream_t stream;
    centry *cache;
    size_t ncache, capcache;
    stage *staged;
    size_t nstaged, capstaged;
    void *scratch[8];
    size_t scratch_bytes[8];
} G;

static const char *hint_for(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: lower --batch or --max-num-batched-tokens (tidal-diff prints its "
               "memory plan before the run), or use a GPU with more memory";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable NVIDIA GPU or driver on this machine: run without --device cuda";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel accessed memory outside its buffers (a tidal bug): rerun under "
               "compute-sanitizer and report it";
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidValue:
        return "a launch or copy got an impossible size (a shape this kernel does not support?)";
    default:
        return "rerun with CUDA_LAUNCH_BLOCKING=1 to stop at the failing kernel";
    }
}

void tdc_check_cuda(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "tidal: CUDA error at %s:%d: %s: %s (%s)\n  hint: %s\n", file, line, what,
            cudaGetErrorString(e), cudaGetErrorName(e), hint_for(e));
    exit(1);
}

/* cudaMalloc / cudaMallocAsync that never crashes on out-of-memory: the failure becomes one
 * message with the bytes asked for, what they were for, and the device's free memory, then
 * exit(1) (HDF5 closes open run files at exit: every batch committed so far stays readable and
 * tidal-diff --resume continues it). */
/* What tidal holds on the device: every tdc_malloc'd block by address, their sum and its peak
 * (td_cuda_mem_peak: run files record it beside the memory plan). */
static std::unordered_map<void *, size_t> held;
static size_t held_bytes, held_peak;

void tdc_malloc(void **p, size_t bytes, int async, const char *what, const char *file, int line)
{
    if (!bytes) bytes = 1;
    if (tdc_prof_on) tdc_prof_begin();   /* profile.cu */
    cudaError_t e = async ? cudaMallocAsync(p, bytes, G.stream) : cudaMalloc(p, bytes);
    if (tdc_prof_on) {
        if (e != cudaSuccess) (void)cudaGetLastError();   /* (e is reported below, not by the sync) */
        tdc_prof_end(async ? "cudaMallocAsync" : "cudaMalloc", NULL, 0);
    }
    if (e == cudaSuccess) {
        held[*p] = bytes;
        held_bytes += bytes;
        if (held_bytes > held_peak) held_peak = held_bytes;
        return;
    }
    if (e != cudaErrorMemoryAllocation) tdc_check_cuda(e, async ? "cudaMallocAsync" : "cudaMalloc", file, line);
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { (void)cudaGetLastError(); fr = tot = 0; }
    fprintf(stderr, "tidal: the GPU ran out of memory: %.1f MiB for %s could not be allocated (%s:%d; %.1f MiB "
            "free of %.1f MiB)\n  hint: %s; a run file keeps every batch completed so far (tidal-diff --resume "
            "continues it)\n", (double)bytes / (1 << 20), what, file, line, (double)fr / (1 << 20),
            (double)tot / (1 << 20), hint_for(cudaErrorMemoryAllocation));
    exit(1);
}

void tdc_free(void *p, int async)
{
    if (!p) return;
    auto it = held.find(p);
    if (it != held.end()) {
        held_bytes -= it->second;
        held.erase(it);
    }
    TDC_TIMED(async ? "cudaFreeAsync" : "cudaFree", 0, CUDA_CHECK(async ? cudaFreeAsync(p, G.stream) : cudaFree(p)));
}

extern "C" size_t td_cuda_mem_peak(void) { return held_peak; }
/* Bytes copied device -> host (be->download, the ops' staged outputs, reductions): what a decode
 * step or a batch brings down, for tests and the run's stderr line (td_device_d2h_bytes). */
static size_t d2h_bytes;
extern "C" void tdc_d2h_count(size_t bytes) { d2h_bytes += bytes; }
extern "C" size_t td_cuda_d2h_bytes(void) { return d2h_bytes; }

extern "C" int td_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    if (cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess) return 0;
    (void)cudaGetLastError();
    return -1;
}

cudaStream_t tdc_stream(void) { return G.stream; }

/* Whether p is host memory a kernel cannot read (malloc, mmap): the runtime reports it as
 * unregistered. Device, managed and pinned host memory are all reachable from kernels. */
static int is_host(const void *p)
{
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* older runtimes: cudaErrorInvalidValue for host memory */
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered;
}

static void cache_add(centry e)
{
    if (G.ncache == G.capcache) {
        G.capcache = G.capcache ? 2 * G.capcache : 256;
        G.cache = (centry *)realloc(G.cache, G.capcache * sizeof *G.cache);
        if (!G.cache) { fprintf(stderr, "tidal: out of host memory\n"); exit(1); }
    }
    G.cache[G.ncache++] = e;
}

/* entry i out of the cache (order is not kept: lookups are by range) */
static void cache_drop(size_t i)
{
    if (!G.cache[i].alias) tdc_free(G.cache[i].dev, 0);
    G.cache[i] = G.cache[--G.ncache];
}

const void *tdc_const(const void *p, size_t bytes)
{
    if (!p) return p;
    /* the cache first: it holds host ranges only, and a hit (every weight after its first use)
     * then costs no cudaPointerGetAttributes call */
    const char *h = (const char *)p;
    for (size_t i = 0; i < G.ncache; i++) {
        centry *c = &G.cache[i];
        if (h >= c->host && h + bytes <= c->host + c->bytes) {
            if (c->view) {
                fprintf(stderr, "tidal: tdc_const: %zu bytes of an embedding table held as a rounding view of "
                        "the device masters (only embedding_forward_cuda reads it): a tidal bug\n", bytes);
                abort();
            }
            return c->dev + (h - c->host);
        }
    }
    if (!is_host(p)) return p;
    char *d = NULL;
    TDC_MALLOC((void **)&d, bytes, "a weight's device copy");
    TDC_TIMED("weight upload (tdc_const)", bytes, CUDA_CHECK(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, G.stream)));
    cache_add(centry{h, bytes, d, 0, 0, 0});
    return d;
}

const void *tdc_const_find(const void *p, int *view_fmt)
{
    const char *h = (const char *)p;
    *view_fmt = TD_F32;
    for (size_t i = 0; i < G.ncache; i++) {
        const centry *c = &G.cache[i];
        if (c->view && h == c->host) {
            *view_fmt = c->view;
            return c->dev;
        }
        if (c->kept && !c->view && h >= c->host && h < c->host + c->bytes) return c->dev + (h - c->host);
    }
    return NULL;
}

/* The device copy of host key [key, key + bytes) that prepare fills: the one kept since an
 * earlier prepare of the same key, else a new kept entry (its content left to the caller);
 * copies of overlapping host ranges (memory since freed and reused) are dropped first. */
void *tdc_const_slot(const void *key, size_t bytes)
{
    const char *h = (const char *)key;
    for (size_t i = 0; i < G.ncache; i++) {
        centry *c = &G.cache[i];
        if (c->host == h && c->bytes == bytes && !c->alias) {   /* (never a view: an alias) */
            c->kept = 1;
            return c->dev;
        }
    }
    for (size_t i = 0; i < G.ncache;)
        if (G.cache[i].host < h + bytes && h < G.cache[i].host + G.cache[i].bytes) {
            CUDA_CHECK(cudaStreamSynchronize(G.stream));
            cache_drop(i);
        } else {
            i++;
        }
    char *d = NULL;
    TDC_MALLOC((void **)&d, bytes, "a prepared weight's device copy");
    cache_add(centry{h, bytes, d, 1, 0, 0});
    return d;
}

static void cuda_alias(const void *host, const void *dev, size_t bytes, int fmt)
{
    const char *h = (const char *)host;
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    for (size_t i = 0; i < G.ncache;)
        if (G.cache[i].host < h + bytes && h < G.cache[i].host + G.cache[i].bytes) cache_drop(i);
        else i++;
    cache_add(centry{h, bytes, (char *)dev, 1, 1, fmt == TD_F32 ? 0 : fmt});
}

static void cuda_release(const void *key)
{
    for (size_t i = 0; i < G.ncache; i++)
        if (G.cache[i].host == (const char *)key) {
            CUDA_CHECK(cudaStreamSynchronize(G.stream));
            cache_drop(i);
            return;
        }
}

static void *stage_buf(void *host, size_t bytes, int copy_in, int out)
{
    if (G.nstaged == G.capstaged) {
        G.capstaged = G.capstaged ? 2 * G.capstaged : 32;
        G.staged = (stage *)realloc(G.staged, G.capstaged * sizeof *G.staged);
        if (!G.staged) { fprintf(stderr, "tidal: out of host memory\n"); exit(1); }
    }
    void *d = NULL;
    tdc_malloc(&d, bytes, 1, "an op's staging buffer", __FILE__, __LINE__);
    if (copy_in)
        TDC_TIMED("stage in (tdc_in, tdc_out)", bytes,
                  CUDA_CHECK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, G.stream)));
    G.staged[G.nstaged++] = stage{host, d, bytes, out};
    return d;
}

const void *tdc_in(const void *p, size_t bytes)
{
    if (!p || !is_host(p)) return p;
    return stage_buf((void *)p, bytes, 1, 0);
}

void *tdc_out(void *p, size_t bytes, int copy_in)
{
    if (!p || !is_host(p)) return p;
    return stage_buf(p, bytes, copy_in, 1);
}

void tdc_done(void)
{
    if (!G.nstaged) return;
    int any_out = 0;
    size_t out_bytes = 0;
    if (tdc_prof_on) tdc_prof_begin();   /* profile.cu: the copies and the wait (the frees apart) */
    for (size_t i = 0; i < G.nstaged; i++) {
        stage *s = &G.staged[i];
        if (s->out) {
            CUDA_CHECK(cudaMemcpyAsync(s->host, s->dev, s->bytes, cudaMemcpyDeviceToHost, G.stream));
            d2h_bytes += s->bytes;
            out_bytes += s->bytes;
            any_out = 1;
        }
        tdc_free(s->dev, 1);
    }
    G.nstaged = 0;
    if (any_out) CUDA_CHECK(cudaStreamSynchronize(G.stream));
    if (tdc_prof_on) tdc_prof_end("stage out (tdc_done)", NULL, out_bytes);
}

void *tdc_scratch(int slot, size_t bytes)
{
    if (slot < 0 || slot >= 8) { fprintf(stderr, "tidal: tdc_scratch: bad slot %d\n", slot); abort(); }
    if (bytes > G.scratch_bytes[slot]) {
        if (G.scratch[slot]) {
            CUDA_CHECK(cudaStreamSynchronize(G.stream));
            tdc_free(G.scratch[slot], 0);
        }
        size_t grow = bytes + bytes / 4;
        TDC_MALLOC(&G.scratch[slot], grow, "scratch (GEMM operands, cuBLASLt workspace, attention)");
        G.scratch_bytes[slot] = grow;
    }
    return G.scratch[slot];
}

/* ---- the table's memory entries ---------------------------------------------------------- */

static void cuda_init(td_ops *ctx)
{
    /* host-side loops beside the GPU (metrics, sampling) keep OpenMP's thread count */
    ctx->nthreads = omp_get_max_threads();
    if (ctx->nthreads < 1) ctx->nthreads = 1;
}

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    TDC_MALLOC(&p, bytes, "activations / KV cache / logits");
    return p;
}

static void cuda_free(void *p)
{
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    tdc_free(p, 0);
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (dst == src || !bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, G.stream));
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
}
static void cuda_download(void *dst, const void *src, size_t bytes)
{
    if (dst != src && is_host(dst)) d2h_bytes += bytes;
    TDC_TIMED("download", dst != src ? bytes : 0, cuda_copy(dst, src, bytes));   /* profile.cu */
}
static void cuda_upload(void *dst, const void *src, size_t bytes)
{
    TDC_TIMED("upload", dst != src ? bytes : 0, cuda_copy(dst, src, bytes));
}

/* on the backend's stream: ordered after the ops before it, no host wait */
static void cuda_zero(void *p, size_t bytes)
{
    if (bytes) TDC_TIMED("zero (cudaMemsetAsync)", bytes, CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, G.stream)));
}

static void cuda_sync(void) { CUDA_CHECK(cudaStreamSynchronize(G.stream)); }

static void cuda_forget(void)
{
    matmul_forget_cuda();   /* matmul.cu's fp32 copies of non-fp32 weights, keyed by host address too */
    CUDA_CHECK(cudaStreamSynchronize(G.stream));
    for (size_t i = 0; i < G.ncache;)   /* prepared and aliased copies stay: their host is stale */
        if (!G.cache[i].kept) cache_drop(i);
        else i++;
}

extern "C" const td_backend td_backend_cuda = {
    .name = "cuda",
    .init = cuda_init,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .zero = cuda_zero,
    .kv_codes = 1,   /* KV caches in the recipe's kv_cache format (ops.h td_kv_store_format) */
    .embedding_forward = embedding_forward_cuda,
    .rmsnorm_forward = rmsnorm_forward_cuda,
    .matmul_forward = matmul_forward_cuda,
    .rope_forward = rope_forward_cuda,
    .kv_write = kv_write_cuda,
    .attention_forward = attention_forward_cuda,
    .swiglu_forward = swiglu_forward_cuda,
    .residual_forward = residual_forward_cuda,
    .scale_forward = scale_forward_cuda,
    .logsoftmax_forward = logsoftmax_forward_cuda,
    .logprob_gather = logprob_gather_cuda,
    /* the backward (op_backward.cu files; the GEMMs' in matmul_backward.cu) */
    .embedding_backward = embedding_backward_cuda,
    .rmsnorm_backward = rmsnorm_backward_cuda,
    .matmul_backward = matmul_backward_cuda,
    .rope_backward = rope_backward_cuda,
    .attention_backward = attention_backward_cuda,
    .swiglu_backward = swiglu_backward_cuda,
    .logsoftmax_backward = logsoftmax_backward_cuda,
    .moe_gather = moe_gather_cuda,   /* mixtures of experts (moe.cu, moe_backward.cu) */
    .moe_combine = moe_combine_cuda,
    .moe_scatter = moe_scatter_cuda,
    .moe_sum = moe_sum_cuda,
    .moe_shared_combine = moe_shared_combine_cuda,
    .moe_combine_backward = moe_combine_backward_cuda,
    .moe_scatter_add = moe_scatter_add_cuda,
    .moe_shared_combine_backward = moe_shared_combine_backward_cuda,
    .optim_adamw = optim_adamw_cuda,
    .optim_sumsq = optim_sumsq_cuda,
    .optim_scale = optim_scale_cuda,
    .sync = cuda_sync,
    .forget = cuda_forget,
    .prepare = prepare_cuda,
    .alias = cuda_alias,
    .release = cuda_release,
    .lora_fold = lora_fold_cuda,
    .lora_peft_sync = lora_peft_sync_cuda,
    .lora_drift = lora_drift_cuda,
    .prepare_fp8 = prepare_fp8_cuda,
    .sample = sample_cuda,
    .row_logsoftmax = row_logsoftmax_cuda,
    .token_metrics = token_metrics_cuda,
};

extern "C" int tdc_lt_load(char *why, size_t why_len);   /* lt_dl.cu */

/* Opens device `index` (once per process; a second open must name the same device). */
extern "C" const td_backend *td_cuda_backend_open(int index, char *desc, size_t desc_len, td_error *err)
{
    if (G.open) {
        if (index != G.device) {
            td_fail(err, "--device cuda:%d: this process already runs on cuda:%d", index, G.device);
            return NULL;
        }
    } else {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0) {
            (void)cudaGetLastError();
            td_fail(err, "--device cuda: no CUDA device can be used here (%s%s%s): run on the CPU "
                    "(--device cpu) or on a machine with an NVIDIA GPU and driver",
                    e != cudaSuccess ? "cudaGetDeviceCount: " : "",
                    e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", "");
            return NULL;
        }
        if (index < 0 || index >= n) {
            td_fail(err, "--device cuda:%d: this machine has %d CUDA device%s (cuda:0..cuda:%d)", index,
                    n, n == 1 ? "" : "s", n - 1);
            return NULL;
        }
        cudaDeviceProp prop;
        if ((e = cudaSetDevice(index)) != cudaSuccess ||
            (e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess ||
            (e = cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking)) != cudaSuccess) {
            (void)cudaGetLastError();
            td_fail(err, "--device cuda:%d: %s", index, cudaGetErrorString(e));
            return NULL;
        }
        if (prop.major < 8) {
            td_fail(err, "--device cuda:%d: %s is compute capability %d.%d; tidal's CUDA backend needs "
                    "8.0 or newer (bf16 tensor cores; FP8 recipes need 8.9)", index, prop.name,
                    prop.major, prop.minor);
            return NULL;
        }
#ifndef TD_CUDASIM
        char why[600];
        if (tdc_lt_load(why, sizeof why)) {   /* lt_dl.cu: cuBLASLt is loaded now, not at start */
            td_fail(err, "--device cuda: %s: install the CUDA Toolkit's cuBLAS, or put its lib64 on "
                    "LD_LIBRARY_PATH", why);
            return NULL;
        }
#endif
        snprintf(G.name, sizeof G.name, "cuda:%d (%.200s, sm_%d%d, %.0f GiB)", index, prop.name,
                 prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
        G.device = index;
        G.open = 1;
        tdc_prof_setup();   /* TIDAL_CUDA_PROFILE (profile.cu), read again: a test may have set it */
    }
    if (desc) snprintf(desc, desc_len, "%s", G.name);
    return &td_backend_cuda;
}

extern "C" const char *td_cuda_backend_desc(void) { return G.open ? G.name : "cuda"; }
