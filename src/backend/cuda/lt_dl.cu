/* tidal — cuBLASLt loaded when the CUDA backend opens, not when a tool starts.
 *
 * Linking libcublasLt.so makes every tool map and relocate it at start (~350k relocations: ~70
 * MB of resident memory on a CPU-only run, and a tool that cannot start where the library is
 * missing). Instead the functions lt.cu calls are defined here with cuBLASLt's own names and
 * signatures, each forwarding to the library dlopen'ed by tdc_lt_load (td_cuda_backend_open
 * calls it: no library is a soft error naming it, exit 1 in the tool). Library search: the
 * dynamic loader's (LD_LIBRARY_PATH, the executable's RUNPATH: the Makefile's CUDA lib64), then
 * TD_CUDA_LIBDIR (the build's CUDA_HOME/lib64). Not compiled into the simulator, whose
 * cuBLASLt is tests/cudasim/cublaslt_sim.cpp. */
#ifndef TD_CUDASIM
#include "lt.cuh"

#include <dlfcn.h>
#include <stdio.h>

#ifndef TD_CUDA_LIBDIR
#define TD_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif
#define STR_(x) #x
#define STR(x) STR_(x)

/* name, return type, (parameters), (arguments) */
#define LT_FUNCTIONS(X) \
    X(cublasLtCreate, cublasStatus_t, (cublasLtHandle_t *h), (h)) \
    X(cublasLtDestroy, cublasStatus_t, (cublasLtHandle_t h), (h)) \
    X(cublasLtGetStatusString, const char *, (cublasStatus_t s), (s)) \
    X(cublasLtMatmul, cublasStatus_t, \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A, cublasLtMatrixLayout_t Ad, \
       const void *B, cublasLtMatrixLayout_t Bd, const void *beta, const void *C, cublasLtMatrixLayout_t Cd, void *D, \
       cublasLtMatrixLayout_t Dd, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb, cudaStream_t st), \
      (h, op, alpha, A, Ad, B, Bd, beta, C, Cd, D, Dd, algo, ws, wsb, st)) \
    X(cublasLtMatmulAlgoCapGetAttribute, cublasStatus_t, \
      (const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoCapAttributes_t a, void *buf, size_t n, size_t *w), \
      (algo, a, buf, n, w)) \
    X(cublasLtMatmulAlgoCheck, cublasStatus_t, \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t Ad, cublasLtMatrixLayout_t Bd, \
       cublasLtMatrixLayout_t Cd, cublasLtMatrixLayout_t Dd, const cublasLtMatmulAlgo_t *algo, \
       cublasLtMatmulHeuristicResult_t *r), \
      (h, op, Ad, Bd, Cd, Dd, algo, r)) \
    X(cublasLtMatmulAlgoConfigSetAttribute, cublasStatus_t, \
      (cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t a, const void *buf, size_t n), \
      (algo, a, buf, n)) \
    X(cublasLtMatmulAlgoGetHeuristic, cublasStatus_t, \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t Ad, cublasLtMatrixLayout_t Bd, \
       cublasLtMatrixLayout_t Cd, cublasLtMatrixLayout_t Dd, cublasLtMatmulPreference_t p, int want, \
       cublasLtMatmulHeuristicResult_t r[], int *got), \
      (h, op, Ad, Bd, Cd, Dd, p, want, r, got)) \
    X(cublasLtMatmulDescCreate, cublasStatus_t, \
      (cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t s), (d, c, s)) \
    X(cublasLtMatmulDescDestroy, cublasStatus_t, (cublasLtMatmulDesc_t d), (d)) \
    X(cublasLtMatmulDescSetAttribute, cublasStatus_t, \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n), (d, a, buf, n)) \
    X(cublasLtMatmulPreferenceCreate, cublasStatus_t, (cublasLtMatmulPreference_t *p), (p)) \
    X(cublasLtMatmulPreferenceDestroy, cublasStatus_t, (cublasLtMatmulPreference_t p), (p)) \
    X(cublasLtMatmulPreferenceSetAttribute, cublasStatus_t, \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n), \
      (p, a, buf, n)) \
    X(cublasLtMatrixLayoutCreate, cublasStatus_t, \
      (cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld), (l, t, rows, cols, ld)) \
    X(cublasLtMatrixLayoutDestroy, cublasStatus_t, (cublasLtMatrixLayout_t l), (l))

#define POINTER(name, ret, params, args) static ret(*p_##name) params;
LT_FUNCTIONS(POINTER)

/* 0, or -1 with why (the loader's message) */
extern "C" int tdc_lt_load(char *why, size_t why_len)
{
    static int state;   /* 0 not tried, 1 loaded, -1 failed */
    static char msg[512];
    if (!state) {
        const char *name = "libcublasLt.so." STR(CUBLAS_VER_MAJOR);
        void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", TD_CUDA_LIBDIR, name);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        state = h ? 1 : -1;
        if (!h) snprintf(msg, sizeof msg, "%s cannot be loaded (%s)", name, dlerror());
#define LOOKUP(name, ret, params, args) \
        if (state == 1 && !(p_##name = (ret(*) params)dlsym(h, #name))) { \
            snprintf(msg, sizeof msg, "%s lacks %s (an older cuBLAS than this build's %d.%d?)", name_, #name, \
                     CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR); \
            state = -1; \
        }
        const char *name_ = name;
        LT_FUNCTIONS(LOOKUP)
    }
    if (state < 0 && why) snprintf(why, why_len, "%s", msg);
    return state > 0 ? 0 : -1;
}

#define FORWARD(name, ret, params, args) \
    extern "C" ret CUBLASWINAPI name params { \
        if (!p_##name && tdc_lt_load(NULL, 0)) { \
            fprintf(stderr, "tidal: %s called without cuBLASLt loaded\n", #name); \
            exit(1); \
        } \
        return p_##name args; \
    }
LT_FUNCTIONS(FORWARD)
#endif
