/* tidal — cudasim's WMMA model (tests/cudasim/cudasim_wmma.h) against a plain reference matmul
 * computed here on the host from tidal's own decoders (formats.h td_decode), and its collective
 * rules.
 *
 * Reference: D = C + A B over K = 16 c (c chunks of 16), each chunk one mma_sync: per chunk
 * d = fp32(d + sum over the chunk's 16 k of a b), the products exact and summed in double in k
 * order (the model's stated semantics, cudasim_wmma.h), compared bit for bit. Inputs: bf16 and
 * fp16 codes of N(0, 1) x 2^U(-6, 6) (signs, subnormal-free ranges, cancellations), C N(0, 4);
 * matrix_a / matrix_b row- and column-major with padded ldm, the accumulator loaded and stored
 * row- and column-major. A closed-form case: A = I gives D = fp32(C + B) exactly. The row-index
 * trick attention_mma.cu relies on: an accumulator fragment of row indices loaded from memory
 * indexes a per-row scale of another accumulator (the same mapping, any mapping).
 * Collective rules (in a forked child, which must die of SIGABRT with the message): lanes that
 * skip an mma_sync, lanes at two different mma_sync calls, a tile loaded before the other
 * lanes' writes to it reached shared memory (no __syncwarp), a misaligned pointer. */
#include "cudasim_wmma.h"
#include "simtest.h"

#include <signal.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern "C" {
#include "tidal/formats.h"
#include "tidal/rng.h"
}

using namespace nvcuda;

static td_rng RNG;

/* D (16 x 16, row-major ld 16, or column-major when dcol) = C (ldc, row- or column-major) + A B,
 * A: 16 x K (lda; A_COL: stored transposed), B: K x 16 (ldb; B_COL: stored transposed) */
template <class T, class LA, class LB>
__global__ static void mm(const T *A, int lda, const T *B, int ldb, const float *C, int ldc, int ccol, float *D,
                          int dcol, int K)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, C, ldc, ccol ? wmma::mem_col_major : wmma::mem_row_major);
    for (int k0 = 0; k0 < K; k0 += 16) {
        const T *pa = std::is_same_v<LA, wmma::row_major> ? A + k0 : A + (size_t)k0 * lda;
        const T *pb = std::is_same_v<LB, wmma::row_major> ? B + (size_t)k0 * ldb : B + k0;
        wmma::load_matrix_sync(a, pa, lda);
        wmma::load_matrix_sync(b, pb, ldb);
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(D, acc, 16, dcol ? wmma::mem_col_major : wmma::mem_row_major);
}

static uint16_t code_of(td_format f, double x) { return (uint16_t)td_encode(f, (float)x, TD_SATFINITE); }

template <class T, class LA, class LB>
static void run_case(td_format f, int K, int ccol, int dcol)
{
    const int lda = std::is_same_v<LA, wmma::row_major> ? K + 8 : 24, ldb = std::is_same_v<LB, wmma::row_major> ? 24 : K + 8;
    const int ldc = 20;
    uint16_t *A = sim_managed<uint16_t>((size_t)(K + 8) * 24), *B = sim_managed<uint16_t>((size_t)(K + 8) * 24);
    float *C = sim_managed<float>(16 * ldc), *D = sim_managed<float>(256);
    std::vector<double> a(16 * K), b(K * 16);
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < K; k++) {
            uint16_t c = code_of(f, td_rng_normal(&RNG) * ldexp(1.0, (int)(td_rng_next(&RNG) % 13) - 6));
            a[r * K + k] = td_decode(f, c);
            A[std::is_same_v<LA, wmma::row_major> ? (size_t)r * lda + k : (size_t)k * lda + r] = c;
        }
    for (int k = 0; k < K; k++)
        for (int c = 0; c < 16; c++) {
            uint16_t x = code_of(f, td_rng_normal(&RNG) * ldexp(1.0, (int)(td_rng_next(&RNG) % 13) - 6));
            if (k % 7 == 3 && c % 5 == 1) x = code_of(f, -1.0);   /* some exact -1 */
            b[k * 16 + c] = td_decode(f, x);
            B[std::is_same_v<LB, wmma::row_major> ? (size_t)k * ldb + c : (size_t)c * ldb + k] = x;
        }
    float cref[256];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            cref[r * 16 + c] = (float)(2 * td_rng_normal(&RNG));
            C[ccol ? c * ldc + r : r * ldc + c] = cref[r * 16 + c];
        }
    cudasim_launch((mm<T, LA, LB>), 1, 32, 0, 0, (const T *)A, lda, (const T *)B, ldb, (const float *)C, ldc, ccol,
                   D, dcol, K);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    long bad = 0;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            float d = cref[r * 16 + c];
            for (int k0 = 0; k0 < K; k0 += 16) {
                double s = d;
                for (int k = k0; k < k0 + 16; k++) s += a[r * K + k] * b[k * 16 + c];
                d = (float)s;
            }
            float got = D[dcol ? c * 16 + r : r * 16 + c];
            bad += memcmp(&got, &d, 4) != 0;
        }
    printf("  %s K %3d a %s b %s c %s d %s: %ld of 256 differ from the reference\n", td_format_info(f)->name, K,
           std::is_same_v<LA, wmma::row_major> ? "row" : "col", std::is_same_v<LB, wmma::row_major> ? "row" : "col",
           ccol ? "col" : "row", dcol ? "col" : "row", bad);
    assert_int_equal(bad, 0);
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(D);
}

static void test_against_reference(void **state)
{
    (void)state;
    for (int K : {16, 48}) {
        run_case<__nv_bfloat16, wmma::row_major, wmma::col_major>(TD_BF16, K, 0, 0);
        run_case<__nv_bfloat16, wmma::row_major, wmma::row_major>(TD_BF16, K, 1, 0);
        run_case<__nv_bfloat16, wmma::col_major, wmma::col_major>(TD_BF16, K, 0, 1);
        run_case<__half, wmma::row_major, wmma::col_major>(TD_F16, K, 0, 0);
        run_case<__half, wmma::col_major, wmma::row_major>(TD_F16, K, 1, 1);
    }
}

/* A = I: D = fp32(C + B), each element one exact sum rounded once */
__global__ static void identity(const __nv_bfloat16 *I, const __nv_bfloat16 *B, const float *C, float *D)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a, I, 16);
    wmma::load_matrix_sync(b, B, 16);
    wmma::load_matrix_sync(c, C, 16, wmma::mem_row_major);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

static void test_identity(void **state)
{
    (void)state;
    uint16_t *I = sim_managed<uint16_t>(256), *B = sim_managed<uint16_t>(256);
    float *C = sim_managed<float>(256), *D = sim_managed<float>(256);
    for (int i = 0; i < 256; i++) {
        I[i] = i / 16 == i % 16 ? 0x3F80 : 0;
        B[i] = code_of(TD_BF16, td_rng_normal(&RNG));
        C[i] = (float)td_rng_normal(&RNG) * 1e-3f;
    }
    cudasim_launch(identity, 1, 32, 0, 0, (const __nv_bfloat16 *)I, (const __nv_bfloat16 *)B, (const float *)C, D);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < 256; i++) assert_true(D[i] == (float)((double)C[i] + td_decode(TD_BF16, B[i])));
    cudaFree(I); cudaFree(B); cudaFree(C); cudaFree(D);
}

/* rows of X scaled by s[row] through a fragment of row indices, two warps */
__global__ static void row_scale(const float *X, const float *s, float *Y)
{
    __shared__ __align__(32) float idx[256];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) idx[e] = (float)(e / 16);
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> x, row;
    int w = threadIdx.x / 32;
    wmma::load_matrix_sync(row, idx, 16, wmma::mem_row_major);
    wmma::load_matrix_sync(x, X + 256 * w, 16, wmma::mem_row_major);
    for (int i = 0; i < x.num_elements; i++) x.x[i] *= s[16 * w + (int)row.x[i]];
    wmma::store_matrix_sync(Y + 256 * w, x, 16, wmma::mem_col_major);
}

static void test_row_index_fragment(void **state)
{
    (void)state;
    float *X = sim_managed<float>(512), *s = sim_managed<float>(32), *Y = sim_managed<float>(512);
    for (int i = 0; i < 512; i++) X[i] = (float)(i % 97);
    for (int i = 0; i < 32; i++) s[i] = (float)(i + 1);
    for (const char *o : {"forward", "reverse"}) {
        setenv("CUDASIM_ORDER", o, 1);
        cudasim_launch(row_scale, 1, 64, 0, 0, (const float *)X, (const float *)s, Y);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        for (int w = 0; w < 2; w++)
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++)
                    assert_true(Y[256 * w + c * 16 + r] == X[256 * w + r * 16 + c] * s[16 * w + r]);
    }
    setenv("CUDASIM_ORDER", "forward", 1);
    cudaFree(X); cudaFree(s); cudaFree(Y);
}

/* ---- the collective's rules: each kernel must abort ------------------------------------------ */

__global__ static void skip_mma(float *D)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    __nv_bfloat16 z = {0};
    wmma::fill_fragment(a, z);
    wmma::fill_fragment(b, z);
    wmma::fill_fragment(c, 0.0f);
    if (threadIdx.x < 16) wmma::mma_sync(c, a, b, c);   /* lanes 16..31 skip it and return */
    else return;
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

__global__ static void two_sites(float *D)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    __nv_bfloat16 z = {0};
    wmma::fill_fragment(a, z);
    wmma::fill_fragment(b, z);
    wmma::fill_fragment(c, 0.0f);
    if (threadIdx.x < 16) wmma::mma_sync(c, a, b, c);
    else wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

__global__ static void no_syncwarp(float *D)
{
    __shared__ __align__(32) float t[256];
    for (int e = threadIdx.x; e < 256; e += 32) t[e] = (float)(e + 1000 * (int)blockIdx.x + 1);
    /* missing: __syncwarp() */
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(c, t, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

__global__ static void misaligned(float *D)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 1.0f);
    wmma::store_matrix_sync(D + 4, c, 16, wmma::mem_row_major);
}

__global__ static void fill_only(float *D)
{
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 1.0f);
    if (threadIdx.x < 32) wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

static std::string child_abort(void (*launch)(float *))
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        float *d = sim_managed<float>(512);
        launch(d);
        _exit(0);
    }
    close(fd[1]);
    std::string err;
    char buf[512];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)k);
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT) fprintf(stderr, "child said: %s\n", err.c_str());
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    return err;
}

static void expect_in(const std::string &err, const char *needle)
{
    if (err.find(needle) == std::string::npos) fprintf(stderr, "missing \"%s\" in: %s\n", needle, err.c_str());
    assert_true(err.find(needle) != std::string::npos);
}

static void test_collective_rules(void **state)
{
    (void)state;
    for (const char *o : {"forward", "reverse"}) {
        setenv("CUDASIM_ORDER", o, 1);
        std::string e = child_abort([](float *d) { cudasim_launch(skip_mma, 1, 32, 0, 0, d); });
        expect_in(e, "wmma::mma_sync");
        expect_in(e, "not every lane");
        e = child_abort([](float *d) { cudasim_launch(two_sites, 1, 32, 0, 0, d); });
        expect_in(e, "different wmma calls");
        e = child_abort([](float *d) { cudasim_launch(no_syncwarp, 1, 32, 0, 0, d); });
        expect_in(e, "fragments differ");
        e = child_abort([](float *d) { cudasim_launch(misaligned, 1, 32, 0, 0, d); });
        expect_in(e, "32-byte");
        e = child_abort([](float *d) { cudasim_launch(fill_only, 1, 48, 0, 0, d); });   /* a partial warp */
        expect_in(e, "not every lane");
    }
    setenv("CUDASIM_ORDER", "forward", 1);
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261126);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_row_index_fragment),
        cmocka_unit_test(test_collective_rules),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
