/* The GPU peers of tidal's GPU benchmarks (tests/bench/gpu.sh), measured in the same run on the
 * same device:
 *   peer gemm M N K [REPS]   cuBLASLt BF16 GEMM (fp32 compute, bf16 out) of out (M, N) =
 *                            in (M, K) . W (N, K)^T, the layout of the model's projections;
 *                            prints "gemm M N K tflops X" (best heuristic algorithm, mean of REPS)
 *   peer bandwidth           a streaming read of 4 GiB (float4 loads, one sum per thread) and a
 *                            device-to-device copy of 2 GiB; prints "bandwidth_gbs X" (the
 *                            faster, in bytes moved per second)
 * Exits 1 with a message where there is no GPU. Built by `make gpu-tests` (nvcc only). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "peer: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "peer: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasLtGetStatusString(s_)); exit(1); } } while (0)

__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        p[i] = __float2bfloat16(((h >> 8) & 0xFFFF) / 65536.0f - 0.5f);
    }
}

static double gemm(int M, int N, int K, int reps)
{
    __nv_bfloat16 *a, *w, *d;
    CK(cudaMalloc(&a, (size_t)M * K * 2));
    CK(cudaMalloc(&w, (size_t)N * K * 2));
    CK(cudaMalloc(&d, (size_t)M * N * 2));
    fill<<<1024, 256>>>(a, (size_t)M * K, 1);
    fill<<<1024, 256>>>(w, (size_t)N * K, 2);
    size_t ws_bytes = 32 << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t op;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t T = CUBLAS_OP_T, Nn = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof T));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &Nn, sizeof Nn));
    /* column-major: D^T (N, M) = W (K, N)^T . in^T (K, M) */
    cublasLtMatrixLayout_t la, lb, ld;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    CB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t h[8];
    int nh = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 8, h, &nh));
    if (!nh) { fprintf(stderr, "peer: no cuBLASLt algorithm for %d %d %d\n", M, N, K); exit(1); }
    float alpha = 1, beta = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double best = 0;
    for (int i = 0; i < nh; i++) {   /* the best of the heuristic's candidates: cuBLAS's peak */
        CB(cublasLtMatmul(lt, op, &alpha, w, la, a, lb, &beta, d, ld, d, ld, &h[i].algo, ws, ws_bytes, 0));
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++)
            CB(cublasLtMatmul(lt, op, &alpha, w, la, a, lb, &beta, d, ld, d, ld, &h[i].algo, ws, ws_bytes, 0));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double tflops = 2.0 * M * N * K * reps / (ms * 1e-3) / 1e12;
        if (tflops > best) best = tflops;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    cudaFree(a); cudaFree(w); cudaFree(d); cudaFree(ws);
    return best;
}

__global__ void read_sum(const float4 *p, size_t n, float *out)
{
    float s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.678f) *out = s;   /* never true: keeps the loads */
}

static double bandwidth(void)
{
    size_t bytes = (size_t)4 << 30;
    float4 *p;
    float *out;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMalloc(&out, sizeof(float)));
    CK(cudaMemset(p, 0, bytes));
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        CK(cudaEventRecord(e0));
        read_sum<<<sms * 8, 512>>>(p, bytes / sizeof(float4), out);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double gbs = bytes / (ms * 1e-3) / 1e9;
        if (gbs > best) best = gbs;
        CK(cudaEventRecord(e0));   /* copy: reads and writes half the buffer each */
        CK(cudaMemcpyAsync(p, (char *)p + bytes / 2, bytes / 2, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        gbs = bytes / (ms * 1e-3) / 1e9;
        if (gbs > best) best = gbs;
    }
    cudaFree(p);
    cudaFree(out);
    return best;
}

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "peer: no CUDA device\n");
        return 1;
    }
    if (argc >= 5 && !strcmp(argv[1], "gemm")) {
        int M = atoi(argv[2]), N = atoi(argv[3]), K = atoi(argv[4]), reps = argc > 5 ? atoi(argv[5]) : 20;
        if (M < 1 || N < 1 || K < 1 || reps < 1) { fprintf(stderr, "peer: bad sizes\n"); return 2; }
        printf("gemm %d %d %d tflops %.3f\n", M, N, K, gemm(M, N, K, reps));
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "bandwidth")) {
        printf("bandwidth_gbs %.1f\n", bandwidth());
        return 0;
    }
    fprintf(stderr, "usage: peer gemm M N K [REPS] | peer bandwidth\n");
    return 2;
}
