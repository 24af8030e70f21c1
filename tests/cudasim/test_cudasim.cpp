/* tidal — cudasim's execution engine against CUDA's documented semantics (CUDA C++ Programming
 * Guide: __syncthreads, warp shuffle functions incl. the `width` segments, warp vote functions,
 * atomic functions; PTX ISA shfl.sync for out-of-segment sources). Each kernel's expected result
 * is computed independently here (closed forms or a host loop), with integer-valued floats so
 * sums are exact in any order. Also: a race caught by running forward vs reverse, deadlocks that
 * abort with a message naming the kernel (checked in a forked child), launch-time refusals. */
#include "cuda_internal.cuh"   /* the contract: TD_LAUNCH, TD_DYN_SMEM */

#include "simtest.h"

#include <signal.h>
#include <stdlib.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

static void set_order(const char *order) { setenv("CUDASIM_ORDER", order, 1); }

/* ---- block reduction through shared memory ------------------------------------------------ */

__global__ void block_sum(const float *in, float *out)
{
    __shared__ float s[256];
    const unsigned t = threadIdx.x;
    s[t] = in[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

static void test_block_sum(void **state)
{
    const int B = 3, T = 256;
    float *in = sim_managed<float>(B * T), *out = sim_managed<float>(B);
    for (int i = 0; i < B * T; i++) in[i] = (float)(i % 7);
    const char *orders[] = {"forward", "reverse", "shuffle:7"};
    for (const char *o : orders) {
        set_order(o);
        TD_LAUNCH(block_sum, B, T, 0, 0, in, out);
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        for (int b = 0; b < B; b++) {
            double expect = 0;   /* the block's 256 values, summed on the host */
            for (int i = b * T; i < (b + 1) * T; i++) expect += i % 7;
            assert_true(out[b] == (float)expect);
        }
    }
    set_order("forward");
    cudaFree(in), cudaFree(out);
}

/* ---- built-in variables: x fastest, then y, then z (linear id = x + y*Dx + z*Dx*Dy) -------- */

__global__ void where(int *out)
{
    int block = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
    int t = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
    int *o = out + 4 * (block * blockDim.x * blockDim.y * blockDim.z + t);
    o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z, o[3] = blockIdx.y;
}

static void test_builtin_variables(void **state)
{
    const dim3 grid(2, 3, 1), block(4, 2, 2);
    const int n = 2 * 3 * 16;
    int *out = sim_managed<int>(4 * n);
    cudasim_launch(where, grid, block, 0, 0, out);
    for (int b = 0; b < 6; b++)
        for (int t = 0; t < 16; t++) {
            const int *o = out + 4 * (b * 16 + t);
            assert_int_equal(o[0], t % 4);
            assert_int_equal(o[1], t / 4 % 2);
            assert_int_equal(o[2], t / 8);
            assert_int_equal(o[3], b / 2);
        }
    cudaFree(out);
}

/* ---- warp shuffles -------------------------------------------------------------------------- */

template <class T> __global__ void warp_sums(T *xor_out, T *down_out, T *seg_out)
{
    const int lane = threadIdx.x % 32;
    const T v = (T)(lane + 1 + 100 * (threadIdx.x / 32));
    T a = v, b = v, c = v;
    for (int off = 16; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
    for (int off = 16; off > 0; off /= 2) b += __shfl_down_sync(0xffffffffu, b, off);
    for (int off = 4; off > 0; off /= 2) c += __shfl_down_sync(0xffffffffu, c, off, 8);
    xor_out[threadIdx.x] = a, down_out[threadIdx.x] = b, seg_out[threadIdx.x] = c;
}

template <class T> static void check_warp_sums(void)
{
    const int N = 64;
    T *x = sim_managed<T>(N), *d = sim_managed<T>(N), *s = sim_managed<T>(N);
    cudasim_launch(warp_sums<T>, 1, N, 0, 0, x, d, s);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int w = 0; w < 2; w++) {
        const T total = (T)(32 * 33 / 2 + 32 * 100 * w);   /* sum of lane+1+100w, lanes 0..31 */
        for (int l = 0; l < 32; l++) assert_true(x[32 * w + l] == total);   /* butterfly: every lane */
        assert_true(d[32 * w] == total);                                     /* tree: lane 0 */
        for (int seg = 0; seg < 4; seg++) {   /* width 8: each segment's lane 0 sums its 8 lanes */
            T expect = 0;
            for (int l = 8 * seg; l < 8 * seg + 8; l++) expect += (T)(l + 1 + 100 * w);
            assert_true(s[32 * w + 8 * seg] == expect);
        }
    }
    cudaFree(x), cudaFree(d), cudaFree(s);
}

static void test_warp_sums(void **state)
{
    check_warp_sums<float>();
    check_warp_sums<double>();
    check_warp_sums<int>();
    check_warp_sums<unsigned>();
    check_warp_sums<long long>();
}

__global__ void broadcast_scan(long long *bcast, long long *seg_bcast, unsigned *scan, float *xor_far)
{
    const int lane = threadIdx.x;
    bcast[lane] = __shfl_sync(0xffffffffu, 1000LL * lane, 5);
    seg_bcast[lane] = __shfl_sync(0xffffffffu, 1000LL * lane, 3, 16);
    unsigned v = lane + 1;                         /* inclusive prefix sum by __shfl_up_sync */
    for (int d = 1; d < 32; d *= 2) {
        unsigned t = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += t;
    }
    scan[lane] = v;
    /* PTX shfl.sync.bfly: source lane^8 with width 8 leaves the segment upward -> own value */
    xor_far[lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 8, 8);
}

static void test_shfl_broadcast_scan(void **state)
{
    long long *b = sim_managed<long long>(32), *sb = sim_managed<long long>(32);
    unsigned *scan = sim_managed<unsigned>(32);
    float *xf = sim_managed<float>(32);
    cudasim_launch(broadcast_scan, 1, 32, 0, 0, b, sb, scan, xf);
    for (int l = 0; l < 32; l++) {
        assert_int_equal(b[l], 5000);
        assert_int_equal(sb[l], l < 16 ? 3000 : 19000);   /* srcLane 3 of each 16-lane segment */
        assert_int_equal(scan[l], (l + 1) * (l + 2) / 2);
        const int src = l ^ 8;                              /* valid when it stays <= segment end */
        assert_true(xf[l] == (float)(src <= (l | 7) ? src : l));
    }
    cudaFree(b), cudaFree(sb), cudaFree(scan), cudaFree(xf);
}

/* ---- lanes under different masks: two half-warp groups, __syncwarp, a source outside the mask */

__global__ void half_warps(float *a, int *b)
{
    TD_DYN_SMEM(int, s);
    const int lane = threadIdx.x;
    if (lane < 16) a[lane] = __shfl_sync(0x0000ffffu, (float)lane, 3);
    else a[lane] = __shfl_sync(0xffff0000u, (float)lane, 20);
    if (lane < 16) a[32 + lane] = __shfl_sync(0x0000ffffu, (float)lane, 20);   /* lane 20 is not in the mask */
    s[lane] = 100 + lane;
    __syncwarp();
    b[lane] = s[31 - lane];
}

static void test_half_warps_and_syncwarp(void **state)
{
    float *a = sim_managed<float>(48);
    int *b = sim_managed<int>(32);
    const char *orders[] = {"forward", "reverse"};
    for (const char *o : orders) {
        set_order(o);
        cudasim_launch(half_warps, 1, 32, 32 * sizeof(int), 0, a, b);
        for (int l = 0; l < 32; l++) {
            assert_true(a[l] == (l < 16 ? 3.0f : 20.0f));
            assert_int_equal(b[l], 100 + 31 - l);
        }
        for (int l = 0; l < 16; l++) assert_true(isnan(a[32 + l]));   /* undefined in CUDA: NaN here */
    }
    set_order("forward");
    cudaFree(a), cudaFree(b);
}

/* ---- returned lanes: a warp intrinsic waits for the non-exited lanes of its mask (PTX
 * shfl.sync / vote.sync / bar.warp.sync); reading a returned lane is undefined: all-ones here */

__global__ void after_exit(int *x, unsigned *votes)
{
    const int lane = threadIdx.x;
    if (lane >= 24) return;
    x[lane] = __shfl_sync(0xffffffffu, 100 + lane, (lane + 4) % 32);
    votes[lane] = __ballot_sync(0xffffffffu, 1);
    __syncwarp();
}

static void test_returned_lanes(void **state)
{
    int *x = sim_managed<int>(32);
    unsigned *votes = sim_managed<unsigned>(32);
    const char *orders[] = {"forward", "reverse"};
    for (const char *o : orders) {
        set_order(o);
        cudasim_launch(after_exit, 1, 32, 0, 0, x, votes);
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        for (int l = 0; l < 24; l++) {
            assert_int_equal(x[l], l + 4 < 24 ? 100 + l + 4 : -1);   /* lanes 24..31 returned */
            assert_int_equal(votes[l], 0x00FFFFFFu);
        }
    }
    set_order("forward");
    cudaFree(x), cudaFree(votes);
}

/* ---- block order follows CUDASIM_ORDER too ----------------------------------------------------- */

__global__ void arrival(int *counter, int *slot)
{
    if (threadIdx.x == 0) slot[blockIdx.x] = atomicAdd(counter, 1);
}

static void test_block_order(void **state)
{
    int *counter = sim_managed<int>(1), *slot = sim_managed<int>(8);
    const char *orders[] = {"forward", "reverse"};
    for (int k = 0; k < 2; k++) {
        set_order(orders[k]);
        *counter = 0;
        cudasim_launch(arrival, 8, 4, 0, 0, counter, slot);
        for (int b = 0; b < 8; b++) assert_int_equal(slot[b], k == 0 ? b : 7 - b);
    }
    set_order("forward");
    cudaFree(counter), cudaFree(slot);
}

/* ---- votes --------------------------------------------------------------------------------- */

__global__ void votes(unsigned *ballot, int *any, int *all, unsigned *partial, int *counts)
{
    const int lane = threadIdx.x % 32;
    if (threadIdx.x < 32) {
        ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
        any[lane] = __any_sync(0xffffffffu, lane == 17);
        all[lane] = __all_sync(0xffffffffu, lane < 31);
    } else {
        partial[lane] = __ballot_sync(0xffffffffu, 1);   /* a warp of 8 lanes (block of 40) */
    }
    int c = __syncthreads_count(threadIdx.x % 2 == 0);
    int a = __syncthreads_and(threadIdx.x < 40), o = __syncthreads_or(threadIdx.x == 39);
    if (threadIdx.x == 0) counts[0] = c, counts[1] = a, counts[2] = o;
}

static void test_votes(void **state)
{
    unsigned *ballot = sim_managed<unsigned>(32), *partial = sim_managed<unsigned>(32);
    int *any = sim_managed<int>(32), *all = sim_managed<int>(32), *counts = sim_managed<int>(3);
    cudasim_launch(votes, 1, 40, 0, 0, ballot, any, all, partial, counts);
    unsigned expect = 0;
    for (int l = 0; l < 32; l += 3) expect |= 1u << l;
    for (int l = 0; l < 32; l++) {
        assert_int_equal(ballot[l], expect);
        assert_int_equal(any[l], 1);
        assert_int_equal(all[l], 0);
    }
    for (int l = 0; l < 8; l++) assert_int_equal(partial[l], 0xFFu);
    assert_int_equal(counts[0], 20);
    assert_int_equal(counts[1], 1);
    assert_int_equal(counts[2], 1);
    cudaFree(ballot), cudaFree(partial), cudaFree(any), cudaFree(all), cudaFree(counts);
}

/* ---- dynamic shared memory ----------------------------------------------------------------- */

__global__ void dyn_smem(int n, int *poisoned, int *aligned, float *first)
{
    TD_DYN_SMEM(float, s);
    if (threadIdx.x == 0) {
        const unsigned char *bytes = (const unsigned char *)s;
        int all_ff = 1;
        for (int i = 0; i < n * 4; i++) all_ff &= bytes[i] == 0xFF;
        poisoned[blockIdx.x] = all_ff;
        aligned[blockIdx.x] = (uintptr_t)s % 16 == 0;
        first[blockIdx.x] = s[0];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 1.0f;   /* the next block must not see it */
}

static void test_dyn_smem(void **state)
{
    int *poisoned = sim_managed<int>(3), *aligned = sim_managed<int>(3);
    float *first = sim_managed<float>(3);
    const int n = 1000;
    cudasim_launch(dyn_smem, 3, 64, n * sizeof(float), 0, n, poisoned, aligned, first);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    for (int b = 0; b < 3; b++) {
        assert_int_equal(poisoned[b], 1);
        assert_int_equal(aligned[b], 1);
        assert_true(isnan(first[b]));
    }
    /* above 48 KiB only after the opt-in, up to 227 KiB (sharedMemPerBlockOptin) */
    const int big = 100 << 10;
    cudasim_launch(dyn_smem, 1, 32, big, 0, 4, poisoned, aligned, first);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaFuncSetAttribute(dyn_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, big), cudaSuccess);
    cudasim_launch(dyn_smem, 1, 32, big, 0, big / 4, poisoned, aligned, first);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(poisoned[0], 1);
    assert_int_equal(cudaFuncSetAttribute(dyn_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10),
                     cudaErrorInvalidValue);
    cudaGetLastError();
    cudaFree(poisoned), cudaFree(aligned), cudaFree(first);
}

/* ---- atomics ------------------------------------------------------------------------------- */

struct Counters {
    int count, max, min;
    unsigned ucount;
    unsigned long long ull;
    float fsum;
    double dsum;
    int cas_count, exch;
};

__global__ void atomics(Counters *c)
{
    const int id = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&c->count, 1);
    atomicAdd(&c->ucount, 2u);
    atomicAdd(&c->ull, 1ull << 33);
    atomicAdd(&c->fsum, 0.5f);
    atomicAdd(&c->dsum, 0.25);
    atomicMax(&c->max, id);
    atomicMin(&c->min, -id);
    int old = c->cas_count, seen;
    while ((seen = atomicCAS(&c->cas_count, old, old + 1)) != old) old = seen;
    __syncthreads();
    atomicExch(&c->exch, id);
}

static void test_atomics(void **state)
{
    Counters *c = sim_managed<Counters>(1);
    memset(c, 0, sizeof *c);
    cudasim_launch(atomics, 4, 256, 0, 0, c);
    assert_int_equal(c->count, 1024);
    assert_int_equal(c->ucount, 2048u);
    assert_true(c->ull == 1024ull << 33);
    assert_true(c->fsum == 512.0f);
    assert_true(c->dsum == 256.0);
    assert_int_equal(c->max, 1023);
    assert_int_equal(c->min, -1023);
    assert_int_equal(c->cas_count, 1024);
    assert_in_range(c->exch, 0, 1023);
    cudaFree(c);
}

/* ---- races: a missing __syncthreads shows as order-dependent results -------------------------- */

template <bool SYNC> __global__ void rotate(int *out)
{
    TD_DYN_SMEM(int, s);
    const int t = threadIdx.x, n = blockDim.x;
    s[t] = t;
    if (SYNC) __syncthreads();
    out[t] = s[(t + 1) % n];
}

static void run_rotate(bool sync, const char *order, int *out)
{
    set_order(order);
    if (sync) cudasim_launch(rotate<true>, 1, 64, 64 * sizeof(int), 0, out);
    else cudasim_launch(rotate<false>, 1, 64, 64 * sizeof(int), 0, out);
    set_order("forward");
}

static void test_race_shows_under_orders(void **state)
{
    int *fwd = sim_managed<int>(64), *rev = sim_managed<int>(64), *shuf = sim_managed<int>(64);
    run_rotate(true, "forward", fwd);
    run_rotate(true, "reverse", rev);
    run_rotate(true, "shuffle:3", shuf);
    for (int t = 0; t < 64; t++) {
        assert_int_equal(fwd[t], (t + 1) % 64);
        assert_int_equal(rev[t], (t + 1) % 64);
        assert_int_equal(shuf[t], (t + 1) % 64);
    }
    run_rotate(false, "forward", fwd);
    run_rotate(false, "reverse", rev);
    assert_int_not_equal(memcmp(fwd, rev, 64 * sizeof(int)), 0);
    assert_int_equal(fwd[0], -1);   /* forward: thread 0 read s[1] before thread 1 wrote it (poison) */
    assert_int_equal(rev[0], 1);    /* reverse: thread 1 had written s[1] already */
    cudaFree(fwd), cudaFree(rev), cudaFree(shuf);
}

/* ---- deadlocks abort with a message naming the kernel ---------------------------------------- */

__global__ void early_return_barrier(int *x)
{
    if (threadIdx.x >= 16) return;
    __syncthreads();
    x[threadIdx.x] = 1;
}

__global__ void split_barrier(int *x)
{
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        x[threadIdx.x] = 2;
        __syncthreads();
    }
}

__global__ void syncwarp_vs_shfl(int *x)
{
    if (threadIdx.x == 0) __syncwarp();
    else x[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
}

__global__ void shfl_vs_barrier(int *x)
{
    if (threadIdx.x < 32) x[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
    else if (threadIdx.x == 32) x[32] = __shfl_sync(0x3u, 1, 0);   /* lane 1 of warp 1 never comes */
    __syncthreads();
}

/* runs launch() in a child; returns its stderr after checking that it died of SIGABRT */
static std::string child_abort(void (*launch)(int *))
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        int *x = sim_managed<int>(64);
        launch(x);
        _exit(0);   /* the launch came back: no deadlock detected */
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
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    return err;
}

static void expect_in(const std::string &err, const char *needle)
{
    if (err.find(needle) == std::string::npos) fprintf(stderr, "missing \"%s\" in: %s\n", needle, err.c_str());
    assert_true(err.find(needle) != std::string::npos);
}

static void test_deadlocks_abort(void **state)
{
    std::string e = child_abort([](int *x) { cudasim_launch(early_return_barrier, 2, 32, 0, 0, x); });
    expect_in(e, "deadlock");
    expect_in(e, "in kernel early_return_barrier<<<(2,1,1), (32,1,1), 0>>>");
    expect_in(e, "test_cudasim.cpp");
    expect_in(e, "__syncthreads");
    e = child_abort([](int *x) { cudasim_launch(split_barrier, 1, 64, 0, 0, x); });
    expect_in(e, "__syncthreads in divergent code");
    expect_in(e, "split_barrier");
    e = child_abort([](int *x) { cudasim_launch(syncwarp_vs_shfl, 1, 32, 0, 0, x); });
    expect_in(e, "lanes of warp 0 disagree");
    expect_in(e, "__syncwarp");
    expect_in(e, "__shfl_sync");
    e = child_abort([](int *x) { cudasim_launch(shfl_vs_barrier, 1, 64, 0, 0, x); });
    expect_in(e, "deadlock: no thread can run");
    expect_in(e, "shfl_vs_barrier");
}

/* ---- a host pointer handed to a kernel: the GPU faults on it, the sim stops at the launch ----- */

__global__ void add_one(int n, int *x)
{
    if (threadIdx.x < (unsigned)n) x[threadIdx.x] += 1;
}

static void test_host_pointer_argument(void **state)
{
    std::string e = child_abort([](int *) {
        static int host[4];
        cudasim_launch(add_one, 1, 4, 0, 0, 4, host);
    });
    expect_in(e, "kernel add_one launched at");
    expect_in(e, "argument 2 is");
    expect_in(e, "host memory");
    int *dev = sim_managed<int>(4), host[4] = {0, 0, 0, 0};
    memset(dev, 0, 4 * sizeof(int));
    cudasim_launch(add_one, 1, 4, 0, 0, 0, dev + 4);   /* one past the end: a valid pointer */
    cudasim_launch(add_one, 1, 4, 0, 0, 0, (int *)nullptr);
    setenv("CUDASIM_HOST_POINTERS", "1", 1);         /* let through (the kernel reads it here) */
    cudasim_launch(add_one, 1, 4, 0, 0, 4, host);
    unsetenv("CUDASIM_HOST_POINTERS");
    assert_int_equal(host[3], 1);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    cudaFree(dev);
}

/* ---- launch configuration ------------------------------------------------------------------ */

__global__ void mark(int *flag, long long big, double x) { *flag = (int)big + (int)x; }

static void test_launch_refusals(void **state)
{
    int *flag = sim_managed<int>(1);
    *flag = 0;
    cudasim_launch(mark, 1, dim3(32, 32, 2), 0, 0, flag, 5, 2.0f);   /* 2048 threads */
    assert_int_equal(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess);                 /* cleared by the read */
    assert_int_equal(*flag, 0);
    cudasim_launch(mark, 1, dim3(1, 1, 65), 0, 0, flag, 5, 2.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudasim_launch(mark, 0, 32, 0, 0, flag, 5, 2.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
    cudasim_launch(mark, 1, 1, 0, s, flag, 5, 2.0f);                  /* arguments convert */
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    assert_int_equal(*flag, 7);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    cudasim_launch(mark, 1, 1, 0, s, flag, 5, 2.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidResourceHandle);
    cudaFree(flag);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sum),
        cmocka_unit_test(test_builtin_variables),
        cmocka_unit_test(test_warp_sums),
        cmocka_unit_test(test_shfl_broadcast_scan),
        cmocka_unit_test(test_half_warps_and_syncwarp),
        cmocka_unit_test(test_returned_lanes),
        cmocka_unit_test(test_block_order),
        cmocka_unit_test(test_votes),
        cmocka_unit_test(test_dyn_smem),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_race_shows_under_orders),
        cmocka_unit_test(test_deadlocks_abort),
        cmocka_unit_test(test_host_pointer_argument),
        cmocka_unit_test(test_launch_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
