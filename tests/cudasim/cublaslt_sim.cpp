/* tidal tests — a functional MODEL of the cuBLASLt subset src/backend/cuda/matmul.cu uses, for
 * the CPU simulator (tests/cudasim). It is not NVIDIA's library and not derived from its code:
 * it implements what the cuBLAS documentation says cublasLtMatmul computes, for the arguments
 * matmul.cu passes, and refuses the rest the way the documentation says the library does.
 *
 *   D = alpha * scale(op(A) op(B)) + beta * C       column-major, element (r, c) at c * ld + r
 *   op(X) = X (CUBLAS_OP_N) or X^T (CUBLAS_OP_T); A is (M x K) after op, B (K x N), C = D (M x N)
 *   types: fp32 x fp32, bf16 x bf16, fp16 x fp16, and FP8 (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3)
 *   with the FP8 rules: TN layout only (op(A) = A^T, op(B) = B), K, lda, ldb multiples of 16;
 *   compute type CUBLAS_COMPUTE_32F, scale type fp32; D (= C) fp32, or bf16 / fp16: the fp32
 *   result rounded to nearest even (what matmul.cu asks for)
 *   scales (FP8 only; a scale pointer on another type is CUBLAS_STATUS_INVALID_VALUE):
 *     SCALAR_32F     one fp32 each for A and B (NULL = 1): D = alpha sA sB sum_k a b
 *     OUTER_VEC_32F  on both: sA[i] for row i of op(A), sB[j] for column j of op(B)
 *     VEC128_32F     one scale per 128 elements of the inner (K) dimension: for the stored
 *                    (K x cols) matrix, scale (k / 128, c) at [(k / 128) * cols + c]
 *     BLK128x128_32F one per 128 x 128 block: scale (k / 128, c / 128) at
 *                    [(c / 128) * ldk + k / 128], ldk = ceil(K / 128) rounded up to 4
 *     the block modes as PyTorch's scaled_gemm uses them (A block 128x128 or 1x128, B 1x128),
 *     K % 128 == 0, and no FAST_ACCUM (refused there, as PyTorch records); each K block's sum
 *     is scaled and added into the fp32 result (the promotion these kernels do)
 *   split-K (CUBLASLT_ALGO_CONFIG_SPLITK_NUM = p > 1, reduction COMPUTE_TYPE or OUTPUT_TYPE):
 *     K cut into p slices of ceil(K / p), each summed in fp32, the slices' sums added in order.
 * Arithmetic: every sum runs over k in increasing order in fp32 (products of the decoded
 * operands, an fmaf each). Fast accumulation (FAST_ACCUM = 1) is accepted but not modelled: what
 * the tensor cores keep of the partial sums is hardware behaviour NVIDIA does not document; the
 * CPU emulation's fp8-fast model (gemm.h) is what tests compare against, with its bound.
 * Alignment preferences and the workspace are accepted and ignored; execution is synchronous. */
#include "cublasLt_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/formats.h"
}

int cublaslt_sim_refuse_splitk;
int cublaslt_sim_refuse_scale_modes;
int cublaslt_sim_refuse_fp8_f32_out;
long cublaslt_sim_calls_fp8[6];
long cublaslt_sim_calls_splitk;
long cublaslt_sim_calls_fast;
long cublaslt_sim_calls_heuristic;

struct cublasLtContext { int alive; };
struct cublaslt_sim_desc {
    int transa, transb, amode, bmode, fast;
    const float *ascale, *bscale;
};
struct cublaslt_sim_layout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; };
struct cublaslt_sim_pref { size_t workspace; };

enum { ALGO_ID = 1, F_ID = 0, F_SPLITK = 1, F_SCHEME = 2 };

const char *cublasLtGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "an error (cuBLASLt model)";
    }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t st)
{
    if (compute != CUBLAS_COMPUTE_32F || st != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new cublaslt_sim_desc{CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                               CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, 0, NULL, NULL};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }

template <typename T> static cublasStatus_t get(const void *buf, size_t size, T *out)
{
    if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    int32_t i32;
    int8_t i8;
    cublasStatus_t s;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if ((s = get(buf, size, &i32))) return s;
        if (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return get(buf, size, &d->ascale);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return get(buf, size, &d->bscale);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
        if ((s = get(buf, size, &i8))) return s;
        d->fast = i8 != 0;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
        if ((s = get(buf, size, &i32))) return s;
        if (i32 != 0 && (i32 < 3 || i32 > 5)) return CUBLAS_STATUS_NOT_SUPPORTED;  /* VEC16/VEC32: Blackwell */
        (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? d->amode : d->bmode) = i32;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (t != CUDA_R_32F && t != CUDA_R_16F && t != CUDA_R_16BF && t != CUDA_R_8F_E4M3 && t != CUDA_R_8F_E5M2)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)rows || ld < 1) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new cublaslt_sim_layout{t, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new cublaslt_sim_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    uint32_t u32;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return get(buf, size, &p->workspace);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return get(buf, size, &u32);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

static int is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static int is_block(int mode) { return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F; }

/* The shape of the problem, or a refusal: what the documentation allows for these arguments. */
struct problem { uint64_t M, N, K; };
static cublasStatus_t validate(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, problem *p)
{
    if (!op || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t M = op->transa == CUBLAS_OP_N ? a->rows : a->cols, K = op->transa == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t Kb = op->transb == CUBLAS_OP_N ? b->rows : b->cols, N = op->transb == CUBLAS_OP_N ? b->cols : b->rows;
    if (K != Kb || d->rows != M || d->cols != N || c->rows != M || c->cols != N) return CUBLAS_STATUS_INVALID_VALUE;
    if (c->type != d->type || (d->type != CUDA_R_32F && d->type != CUDA_R_16BF && d->type != CUDA_R_16F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int fp8 = is_fp8(a->type) || is_fp8(b->type);
    if (fp8 && d->type == CUDA_R_32F && cublaslt_sim_refuse_fp8_f32_out) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (fp8) {
        if (!is_fp8(a->type) || !is_fp8(b->type) || (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        if (op->transa != CUBLAS_OP_T || op->transb != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (K % 16 || a->ld % 16 || b->ld % 16) return CUBLAS_STATUS_NOT_SUPPORTED;
        int am = op->amode, bm = op->bmode;
        int outer = am == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F || bm == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (outer && am != bm) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (is_block(am) != is_block(bm)) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (is_block(am) && (K % 128 || op->fast || bm != CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F))
            return CUBLAS_STATUS_NOT_SUPPORTED;
        if (cublaslt_sim_refuse_scale_modes && (am || bm)) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else {
        if (a->type != b->type) return CUBLAS_STATUS_NOT_SUPPORTED;
        if (op->ascale || op->bscale || op->amode || op->bmode || op->fast) return CUBLAS_STATUS_INVALID_VALUE;
    }
    *p = problem{M, N, K};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    problem p;
    cublaslt_sim_calls_heuristic++;
    if (!h || !pref || requested < 1 || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = validate(op, a, b, c, d, &p);
    *returned = 0;
    if (s) return s;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[F_ID] = ALGO_ID;
    results[0].algo.data[F_SPLITK] = 1;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoCapAttributes_t attr,
                                                 void *buf, size_t size, size_t *written)
{
    if (!algo || algo->data[F_ID] != ALGO_ID) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) {
        int32_t v = 1;
        if (size != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(buf, &v, sizeof v);
    } else if (attr == CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK) {
        uint32_t v = CUBLASLT_REDUCTION_SCHEME_MASK;
        if (size != sizeof v) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(buf, &v, sizeof v);
    } else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t size)
{
    cublasStatus_t s;
    if (!algo) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_ALGO_CONFIG_SPLITK_NUM) {
        int32_t v;
        if ((s = get(buf, size, &v))) return s;
        if (v < 1) return CUBLAS_STATUS_INVALID_VALUE;
        algo->data[F_SPLITK] = (uint64_t)v;
    } else if (attr == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) {
        uint32_t v;
        if ((s = get(buf, size, &v))) return s;
        if (v & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK) return CUBLAS_STATUS_INVALID_VALUE;
        algo->data[F_SCHEME] = v;
    } else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *result)
{
    problem p;
    if (!h || !algo || algo->data[F_ID] != ALGO_ID) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = validate(op, a, b, c, d, &p);
    if (s) return s;
    if (algo->data[F_SPLITK] > 1 && (cublaslt_sim_refuse_splitk || algo->data[F_SCHEME] == CUBLASLT_REDUCTION_SCHEME_NONE))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (result) {
        memset(result, 0, sizeof *result);
        result->algo = *algo;
        result->state = CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* element (r, c) of a stored matrix, decoded to fp32 */
static float load(const void *p, cudaDataType_t t, int64_t ld, uint64_t r, uint64_t c)
{
    size_t i = (size_t)c * ld + r;
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return td_decode(TD_BF16, ((const uint16_t *)p)[i]);
    case CUDA_R_16F: return td_decode(TD_F16, ((const uint16_t *)p)[i]);
    case CUDA_R_8F_E4M3: return td_decode(TD_E4M3, ((const uint8_t *)p)[i]);
    default: return td_decode(TD_E5M2, ((const uint8_t *)p)[i]);
    }
}

/* the scale of element (k, c) of a (K x cols) stored matrix, K inner, in a block mode */
static float block_scale(const float *s, int mode, uint64_t K, uint64_t cols, uint64_t k, uint64_t c)
{
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return s[(k / 128) * cols + c];
    uint64_t ldk = ((K + 127) / 128 + 3) / 4 * 4;
    return s[(c / 128) * ldk + k / 128];
}

/* sum_k a[k] b[k] as one fmaf chain in increasing k (the model's fp32 sum), over the model's own
 * decoded copies (so ASan need not check each read: av / bv below are sized to the loops). fmaf is
 * the FMA instruction where the building CPU has one (sim.mk's SIM_FMA): the same bits. */
__attribute__((no_sanitize_address))
static float fma_chain(const float *a, const float *b, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t k = 0; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream)
{
    problem p;
    if (!h || !alpha || !beta || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = validate(op, ad, bd, cd, dd, &p);
    if (s) return s;
    uint64_t parts = 1;
    if (algo) {
        if (algo->data[F_ID] != ALGO_ID) return CUBLAS_STATUS_INVALID_VALUE;
        parts = algo->data[F_SPLITK] ? algo->data[F_SPLITK] : 1;
        if (parts > 1 && (cublaslt_sim_refuse_splitk || algo->data[F_SCHEME] == CUBLASLT_REDUCTION_SCHEME_NONE))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* the matrices and scales are read by the GPU: host memory there faults, as at a launch */
    const void *dev[] = {A, B, C, D, op->ascale, op->bscale};
    static const char *const what[] = {"A", "B", "C", "D", "A_SCALE_POINTER", "B_SCALE_POINTER"};
    const char *lax = getenv("CUDASIM_HOST_POINTERS");
    for (int i = 0; i < 6 && !(lax && !strcmp(lax, "1")); i++)
        if (!cudasim_detail::device_addressable(dev[i])) {
            fprintf(stderr, "cudasim: cublasLtMatmul: %s is %p, host memory that no cudaMalloc / "
                    "cudaMallocManaged / cudaMallocHost / cudaHostRegister covers: a GPU faults on it "
                    "(cudaErrorIllegalAddress). Pass device memory (tdc_in / tdc_out / tdc_const)\n",
                    what[i], dev[i]);
            abort();
        }
    cudasim_detail::DeviceAccess access;   /* this model reads and writes them on the host */
    int fp8 = is_fp8(ad->type), am = op->amode, bm = op->bmode, blk = fp8 && is_block(am);
    if (fp8) cublaslt_sim_calls_fp8[am]++;
    if (fp8 && op->fast) cublaslt_sim_calls_fast++;
    if (parts > 1) cublaslt_sim_calls_splitk++;
    if (parts > p.K) parts = p.K ? p.K : 1;
    float al, be;
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    const float *sa = fp8 ? op->ascale : NULL, *sb = fp8 ? op->bscale : NULL;
    uint64_t per = (p.K + parts - 1) / parts;
    /* the operands decoded once: row i of op(A) at a[i K], column j of op(B) at b[j K] (the
     * sums below are the same fmaf chains as element-wise loads; decoding once keeps the model
     * from dominating the simulator's time, under ASan above all) */
    std::vector<float> av((size_t)p.M * p.K), bv((size_t)p.N * p.K);
    for (uint64_t i = 0; i < p.M; i++)
        for (uint64_t k = 0; k < p.K; k++)
            av[(size_t)i * p.K + k] = op->transa == CUBLAS_OP_N ? load(A, ad->type, ad->ld, i, k) : load(A, ad->type, ad->ld, k, i);
    for (uint64_t j = 0; j < p.N; j++)
        for (uint64_t k = 0; k < p.K; k++)
            bv[(size_t)j * p.K + k] = op->transb == CUBLAS_OP_N ? load(B, bd->type, bd->ld, k, j) : load(B, bd->type, bd->ld, j, k);
    std::vector<float> out((size_t)p.M * p.N);
    for (uint64_t j = 0; j < p.N; j++)
        for (uint64_t i = 0; i < p.M; i++) {
            const float *ar = av.data() + (size_t)i * p.K, *bc = bv.data() + (size_t)j * p.K;
            float total = 0.0f;
            for (uint64_t k0 = 0; k0 < p.K; k0 += per) {       /* split-K slices, in order */
                uint64_t k1 = k0 + per < p.K ? k0 + per : p.K;
                if (!blk) {
                    total += fma_chain(ar + k0, bc + k0, k1 - k0);
                    continue;
                }
                float part = 0.0f, blocksum = 0.0f;
                for (uint64_t k = k0; k < k1; k++) {
                    float a = ar[k], b = bc[k];
                    blocksum = fmaf(a, b, blocksum);
                    if (k % 128 == 127 || k + 1 == k1) {         /* promotion with the block's scales */
                        part += block_scale(sa, am, p.K, p.M, k, i) * block_scale(sb, bm, p.K, p.N, k, j) * blocksum;
                        blocksum = 0.0f;
                    }
                }
                total += part;
            }
            if (fp8 && !blk) {
                if (am == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) total *= sa[i] * sb[j];
                else total *= (sa ? sa[0] : 1.0f) * (sb ? sb[0] : 1.0f);
            }
            float c = be != 0.0f ? load(C, cd->type, cd->ld, i, j) : 0.0f;
            out[(size_t)j * p.M + i] = al * total + be * c;
        }
    for (uint64_t j = 0; j < p.N; j++)
        for (uint64_t i = 0; i < p.M; i++) {
            float v = out[(size_t)j * p.M + i];
            size_t at = (size_t)j * dd->ld + i;
            if (dd->type == CUDA_R_32F) ((float *)D)[at] = v;         /* else rounded to nearest even */
            else ((uint16_t *)D)[at] = (uint16_t)td_encode(dd->type == CUDA_R_16BF ? TD_BF16 : TD_F16, v, TD_SATFINITE);
        }
    return CUBLAS_STATUS_SUCCESS;
}
