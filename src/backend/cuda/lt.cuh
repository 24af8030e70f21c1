/* tidal — the CUDA backend's cuBLASLt layer (internal header): one GEMM description (lt_gemm),
 * run through a cached plan (lt.cu). matmul.cu builds the descriptions from a recipe. */
#ifndef TIDAL_CUDA_LT_CUH
#define TIDAL_CUDA_LT_CUH

#include "cuda_internal.cuh"

#ifdef TD_CUDASIM
#include "cublasLt_sim.h"      /* tests/cudasim: a CPU model of the cuBLASLt subset used here */
#else
#include <cublasLt.h>
#endif

/* cuBLASLt scale modes (cublasLtMatmulMatrixScale_t); MODE_NONE: no scale pointer (not FP8) */
enum { MODE_NONE = -1, MODE_SCALAR = 0, MODE_OUTER = 3, MODE_VEC128 = 4, MODE_BLK128 = 5 };

typedef struct {
    int M, Nc, K;                  /* D is (M x Nc); K products per element                     */
    const void *A; cudaDataType_t ta; int lda;   /* the weight, op T (stored K x M)           */
    const void *B; cudaDataType_t tb; int ldb;   /* the activations, op N (stored K x Nc)     */
    int a_n, b_t;                  /* the backward's other layouts (matmul_backward.cu): A op N
                                      (stored M x K), B op T (stored Nc x K); 0 = the TN above */
    void *D; int ldd;              /* C = D                                                      */
    cudaDataType_t td;             /* D's type: fp32 (0 = CUDA_R_32F), or bf16/fp16 (matmul.cu fp8_lt) */
    float beta;
    int amode, bmode;              /* cublasLtMatmulMatrixScale_t, MODE_NONE: no scale pointer  */
    const float *ascale, *bscale;
    int fast;                      /* CUBLASLT_MATMUL_DESC_FAST_ACCUM                           */
    int split_k;                   /* > 1: CUBLASLT_ALGO_CONFIG_SPLITK_NUM                      */
} lt_gemm;

/* D = op(A) op(B) (+ D when beta = 1). CUBLAS_STATUS_SUCCESS, or why cuBLASLt refused (the
 * heuristic finding no algorithm is CUBLAS_STATUS_NOT_SUPPORTED; lt_last_failure names the call):
 * the caller falls back. lt_matmul_or_die: a refusal is fatal (file, line, call, a hint). */
cublasStatus_t lt_matmul(const lt_gemm *g);
void lt_matmul_or_die(const lt_gemm *g);
const char *lt_last_failure(void);
/* g with the recipe's split_k (> 1): cuBLASLt's split-K with an fp32 reduction, else K slices of
 * ceil(K / split) added onto D in order (beta = 1), as the CPU cuts them. Fatal if refused.
 * The TN layout only (the forward's: K is the contiguous dimension of both operands). */
void lt_gemm_split(lt_gemm g, int split);
/* drops the cached plans (be->forget, through matmul_forget_cuda) */
void lt_forget(void);
/* the largest power of two (<= 256) dividing p's address */
uint32_t lt_align(const void *p);

#endif
