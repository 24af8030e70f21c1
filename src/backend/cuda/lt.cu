/* tidal — the CUDA backend's cuBLASLt layer: the checked calls, the one handle, and plans.
 *
 * A plan is the descriptors and the algorithm of one problem: everything the heuristic looks at
 * is its key (shapes, types, scale modes, fast accumulation, split-K, the operands' alignments,
 * which the preferences pass on so no algorithm assumes more than the pointers have); pointers
 * (operands, D, scales) are set per call. A refusal is kept too, so a fallback does not query the
 * heuristic at every call: a decode step makes hundreds of GEMM calls. Split-K (a recipe's
 * split_k): the heuristic's algorithms that support it, with CUBLASLT_ALGO_CONFIG_SPLITK_NUM and
 * an fp32 reduction scheme (COMPUTE_TYPE, else OUTPUT_TYPE: D is fp32), checked by
 * cublasLtMatmulAlgoCheck. The workspace is tdc_scratch's WORKSPACE slot, 32 MiB. */
#include "lt.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(TD_CUDASIM) || CUBLAS_VERSION >= 120900
#define HAVE_SCALE_MODES 1     /* CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE and their modes */
#else
#define HAVE_SCALE_MODES 0
#endif

#define WORKSPACE_BYTES ((size_t)32 << 20)

/* ---- checking ------------------------------------------------------------------------------ */

static const char *cublas_hint(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLASLt could not start: is the NVIDIA driver loaded and a GPU visible?";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the GPU is out of memory: lower --max-num-batched-tokens / --max-num-seqs";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "this GPU lacks the feature (FP8 needs sm_89+, block-scaled FP8 Hopper)";
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_INVALID_VALUE:
        return "no cuBLASLt kernel for this shape, type, alignment or scaling here (a tidal bug "
               "for bf16/fp16/fp32 GEMMs: report the shape)";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GEMM kernel failed: rerun under compute-sanitizer and report it";
    default:
        return "rerun with CUBLASLT_LOG_LEVEL=5 to see cuBLASLt's own account";
    }
}

static void check_cublas(cublasStatus_t s, const char *what, const char *file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "tidal: cuBLASLt error at %s:%d: %s: %s\n  hint: %s\n", file, line, what,
            cublasLtGetStatusString(s), cublas_hint(s));
    exit(1);
}
#define CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

static cublasLtHandle_t lt_handle(void)
{
    static cublasLtHandle_t h = [] {   /* a function-local static: made once, thread-safe */
        cublasLtHandle_t x = NULL;
        CUBLAS_CHECK(cublasLtCreate(&x));
        return x;
    }();
    return h;
}

/* s = call; on failure, record it in lt_failed_call / lt_failed_line (in scope) and leave */
#define LT_TRY(call) do { if ((s = (call)) != CUBLAS_STATUS_SUCCESS) { \
        lt_failed_call = #call; lt_failed_line = __LINE__; goto done; } } while (0)

uint32_t lt_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

/* Picks an algorithm whose split-K takes g->split_k parts with an fp32 reduction. */
static cublasStatus_t pick_splitk(const lt_gemm *g, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t ad,
                                  cublasLtMatrixLayout_t bd, cublasLtMatrixLayout_t dd,
                                  const cublasLtMatmulHeuristicResult_t *res, int nres,
                                  cublasLtMatmulAlgo_t *algo)
{
    for (int i = 0; i < nres; i++) {
        int32_t splitk_ok = 0;
        uint32_t schemes = 0;
        size_t w;
        if (cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok,
                                              sizeof splitk_ok, &w) != CUBLAS_STATUS_SUCCESS || !splitk_ok)
            continue;
        if (cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                              sizeof schemes, &w) != CUBLAS_STATUS_SUCCESS)
            continue;
        const uint32_t want[2] = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
        for (int k = 0; k < 2; k++) {
            if (!(schemes & want[k])) continue;
            cublasLtMatmulAlgo_t a = res[i].algo;
            int32_t parts = g->split_k;
            uint32_t scheme = want[k];
            cublasLtMatmulHeuristicResult_t chk;
            if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts, sizeof parts) ||
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ||
                cublasLtMatmulAlgoCheck(lt_handle(), op, ad, bd, dd, dd, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
                chk.workspaceSize > WORKSPACE_BYTES)
                continue;
            *algo = a;
            return CUBLAS_STATUS_SUCCESS;
        }
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* a plan (see the top): its key, and what the heuristic said */
typedef struct {
    int M, Nc, K, lda, ldb, ldd, ta, tb, td, amode, bmode, fast, split_k, a_n, b_t;
    uint32_t al[3];
} plan_key;
typedef struct {
    plan_key key;
    cublasStatus_t status;         /* CUBLAS_STATUS_SUCCESS or why the plan cannot run        */
    const char *failed;            /* the call that refused, and its line                     */
    int line;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t ad, bd, dd;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

enum { MAX_PLANS = 1024 };
static lt_plan *PLANS;
static int NPLANS;

static void plan_free(lt_plan *p)
{
    if (p->dd) cublasLtMatrixLayoutDestroy(p->dd);
    if (p->bd) cublasLtMatrixLayoutDestroy(p->bd);
    if (p->ad) cublasLtMatrixLayoutDestroy(p->ad);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
}

/* Builds the plan of key k (descriptors, heuristic, split-K algorithm) into p. */
static void plan_make(const lt_gemm *g, lt_plan *p)
{
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[8];
    int nres = 0;
    const cublasOperation_t ta = g->a_n ? CUBLAS_OP_N : CUBLAS_OP_T, tb = g->b_t ? CUBLAS_OP_T : CUBLAS_OP_N;
    const size_t ws_bytes = WORKSPACE_BYTES;
    const char *lt_failed_call = "";
    int lt_failed_line = 0;

    LT_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g->amode != MODE_NONE) {
#if HAVE_SCALE_MODES
        int32_t am = g->amode, bm = g->bmode;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
#else
        if (g->amode != MODE_SCALAR || g->bmode != MODE_SCALAR) {
            s = CUBLAS_STATUS_NOT_SUPPORTED;
            lt_failed_call = "scale modes (cuBLAS < 12.9 at build time)";
            goto done;
        }
#endif
        /* the heuristic sees scale pointers set (their values are the call's) */
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->ascale, sizeof g->ascale));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->bscale, sizeof g->bscale));
        int8_t fast = (int8_t)g->fast;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    }
    /* the stored shapes: op(A) is (M x K), op(B) (K x Nc) */
    if (g->a_n) LT_TRY(cublasLtMatrixLayoutCreate(&p->ad, g->ta, (uint64_t)g->M, (uint64_t)g->K, g->lda));
    else LT_TRY(cublasLtMatrixLayoutCreate(&p->ad, g->ta, (uint64_t)g->K, (uint64_t)g->M, g->lda));
    if (g->b_t) LT_TRY(cublasLtMatrixLayoutCreate(&p->bd, g->tb, (uint64_t)g->Nc, (uint64_t)g->K, g->ldb));
    else LT_TRY(cublasLtMatrixLayoutCreate(&p->bd, g->tb, (uint64_t)g->K, (uint64_t)g->Nc, g->ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->dd, g->td, (uint64_t)g->M, (uint64_t)g->Nc, g->ldd));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->key.al[0], sizeof(uint32_t)));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->key.al[1], sizeof(uint32_t)));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->key.al[2], sizeof(uint32_t)));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->key.al[2], sizeof(uint32_t)));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt_handle(), p->op, p->ad, p->bd, p->dd, p->dd, pref, 8, res, &nres));
    if (nres == 0) {
        s = CUBLAS_STATUS_NOT_SUPPORTED;
        lt_failed_call = "cublasLtMatmulAlgoGetHeuristic (no algorithm)";
        lt_failed_line = __LINE__;
        goto done;
    }
    p->algo = res[0].algo;
    if (g->split_k > 1) LT_TRY(pick_splitk(g, p->op, p->ad, p->bd, p->dd, res, nres, &p->algo));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    p->status = s;
    p->failed = lt_failed_call;
    p->line = lt_failed_line;
}

/* the plan of g: found, or made (the cache is emptied when full) */
static lt_plan *plan_of(const lt_gemm *g)
{
    plan_key k;
    memset(&k, 0, sizeof k);   /* keys are compared as bytes */
    k.M = g->M; k.Nc = g->Nc; k.K = g->K; k.lda = g->lda; k.ldb = g->ldb; k.ldd = g->ldd;
    k.ta = g->ta; k.tb = g->tb; k.td = g->td; k.amode = g->amode; k.bmode = g->bmode;
    k.fast = g->fast; k.split_k = g->split_k; k.a_n = g->a_n; k.b_t = g->b_t;
    k.al[0] = lt_align(g->A); k.al[1] = lt_align(g->B); k.al[2] = lt_align(g->D);
    for (int i = NPLANS - 1; i >= 0; i--)
        if (!memcmp(&PLANS[i].key, &k, sizeof k)) return &PLANS[i];
    if (!PLANS) {
        PLANS = (lt_plan *)calloc(MAX_PLANS, sizeof *PLANS);
        if (!PLANS) { fprintf(stderr, "tidal: out of host memory\n"); exit(1); }
    }
    if (NPLANS == MAX_PLANS) {
        for (int i = 0; i < NPLANS; i++) plan_free(&PLANS[i]);
        memset(PLANS, 0, MAX_PLANS * sizeof *PLANS);
        NPLANS = 0;
    }
    lt_plan *p = &PLANS[NPLANS++];
    p->key = k;
    TDC_TIMED("cublasLt plan (heuristic)", 0, plan_make(g, p));   /* profile.cu: once per shape */
    return p;
}

/* where an lt_matmul failed, for the messages */
static const char *lt_failed_call = "";
static int lt_failed_line;

/* D = op(A) op(B) (+ D when beta = 1) on cuBLASLt. Returns the first failing status (the
 * heuristic finding no algorithm is CUBLAS_STATUS_NOT_SUPPORTED); the caller falls back or dies. */
cublasStatus_t lt_matmul(const lt_gemm *g)
{
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    const float alpha = 1.0f;
    void *ws = tdc_scratch(TDC_SLOT_WORKSPACE, WORKSPACE_BYTES);
    lt_plan *p = plan_of(g);
    if ((s = p->status) != CUBLAS_STATUS_SUCCESS) {
        lt_failed_call = p->failed;
        lt_failed_line = p->line;
        return s;
    }
    if (g->amode != MODE_NONE) {
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->ascale, sizeof g->ascale));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->bscale, sizeof g->bscale));
    }
    if (tdc_prof_on) tdc_prof_begin();   /* profile.cu: the GEMM alone, and by shape */
    s = cublasLtMatmul(lt_handle(), p->op, &alpha, g->A, p->ad, g->B, p->bd, &g->beta, g->D, p->dd, g->D, p->dd,
                       &p->algo, ws, WORKSPACE_BYTES, tdc_stream());
    if (tdc_prof_on) {
        char shape[64];
        snprintf(shape, sizeof shape, "cublasLtMatmul %dx%dx%d", g->M, g->Nc, g->K);
        tdc_prof_detail(shape, tdc_prof_end("cublasLtMatmul", NULL, 0));
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        lt_failed_call = "cublasLtMatmul";
        lt_failed_line = __LINE__;
    }
done:
    return s;
}

void lt_matmul_or_die(const lt_gemm *g)
{
    cublasStatus_t s = lt_matmul(g);
    if (s != CUBLAS_STATUS_SUCCESS) check_cublas(s, lt_failed_call, __FILE__, lt_failed_line);
}

static size_t type_size(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 1;
}

void lt_gemm_split(lt_gemm g, int split)
{
    if (split >= g.K) split = 1;   /* the CPU's rule: parts = split_k < K ? split_k : 1 */
    if (split <= 1) { lt_matmul_or_die(&g); return; }
    g.split_k = split;
    if (lt_matmul(&g) == CUBLAS_STATUS_SUCCESS) return;
    int K = g.K, per = (K + split - 1) / split;
    g.split_k = 1;
    for (int p = 0, k0 = 0; p < split && k0 < K; p++, k0 += per) {
        lt_gemm s = g;
        s.K = k0 + per <= K ? per : K - k0;
        s.A = (const char *)g.A + (size_t)k0 * type_size(g.ta);
        s.B = (const char *)g.B + (size_t)k0 * type_size(g.tb);
        s.beta = p ? 1.0f : 0.0f;
        lt_matmul_or_die(&s);
    }
}

const char *lt_last_failure(void) { return lt_failed_call; }

void lt_forget(void)
{
    for (int i = 0; i < NPLANS; i++) plan_free(&PLANS[i]);
    if (PLANS) memset(PLANS, 0, MAX_PLANS * sizeof *PLANS);
    NPLANS = 0;
}
