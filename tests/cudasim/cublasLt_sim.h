/* tidal tests — the cuBLASLt declarations src/backend/cuda/matmul.cu uses, for the CPU simulator
 * (TD_CUDASIM). tests/cudasim/cublaslt_sim.cpp implements them as a MODEL of cuBLASLt written
 * from NVIDIA's documented semantics, not as NVIDIA's library: it checks the arguments matmul.cu
 * passes and computes what the documentation says the call computes, on the CPU in fp32.
 * Names, types and enum values are those of cublasLt.h / cublas_api.h / library_types.h (CUDA
 * 13.0, cuBLAS 13.1), so matmul.cu compiles unchanged against either. Only the subset matmul.cu
 * needs is here; an attribute the model does not know is CUBLAS_STATUS_NOT_SUPPORTED. */
#ifndef TIDAL_CUBLASLT_SIM_H
#define TIDAL_CUBLASLT_SIM_H

#include "cudasim.h"

#include <stddef.h>
#include <stdint.h>

#define CUBLAS_VERSION 130100   /* the cuBLAS whose documented behaviour this models */

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
    CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3,
    CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4,
    CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5,
} cublasLtMatmulMatrixScale_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef enum {
    CUBLASLT_ALGO_CAP_SPLITK_SUPPORT = 0,
    CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK = 1,
} cublasLtMatmulAlgoCapAttributes_t;

typedef enum {
    CUBLASLT_ALGO_CONFIG_ID = 0,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,
} cublasLtMatmulAlgoConfigAttributes_t;

typedef enum {
    CUBLASLT_REDUCTION_SCHEME_NONE = 0,
    CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
    CUBLASLT_REDUCTION_SCHEME_MASK = 0x7,
} cublasLtReductionScheme_t;

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublaslt_sim_desc *cublasLtMatmulDesc_t;
typedef struct cublaslt_sim_layout *cublasLtMatrixLayout_t;
typedef struct cublaslt_sim_pref *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

const char *cublasLtGetStatusString(cublasStatus_t status);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned);
cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                 cublasLtMatmulAlgoCapAttributes_t attr, void *buf,
                                                 size_t size, size_t *written);
cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t adesc, const void *B,
                              cublasLtMatrixLayout_t bdesc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t cdesc, void *D, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream);

/* Model knobs for the tests: make the model refuse what an older cuBLAS or another GPU refuses,
 * so matmul.cu's fallbacks run. refuse_splitk: no algorithm takes CUBLASLT_ALGO_CONFIG_SPLITK_NUM
 * > 1 (cublasLtMatmulAlgoCheck says NOT_SUPPORTED); refuse_scale_modes: the heuristic finds no
 * algorithm for FP8 scale modes other than SCALAR_32F (cuBLAS < 12.9, or not Hopper);
 * refuse_fp8_f32_out: no FP8 algorithm writes an fp32 D (bf16 / fp16 D only).
 * The counters: FP8 matmuls run per A scale mode, those with FAST_ACCUM set, split-K runs and
 * heuristic queries, so tests see which path ran and that plans are reused. */
extern int cublaslt_sim_refuse_splitk;
extern int cublaslt_sim_refuse_scale_modes;
extern int cublaslt_sim_refuse_fp8_f32_out;
extern long cublaslt_sim_calls_fp8[6];
extern long cublaslt_sim_calls_splitk;
extern long cublaslt_sim_calls_fast;
extern long cublaslt_sim_calls_heuristic;

#endif
