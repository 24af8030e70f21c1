/* tidal — cudasim's runtime API against libcudart's documented behaviour (CUDA Runtime API
 * reference, CUDA 13): device count from CUDASIM_DEVICES (0 -> cudaErrorNoDevice, the runtime's
 * answer on a machine with a driver and no GPU), no driver -> cudaErrorInsufficientDriver and
 * driver version 0 (what libcudart 13 returns on this GPU-less machine), pointer attributes by
 * containment, copies checked on their device side, the last-error rule, error names and
 * strings as libcudart 13 prints them (cudaGetErrorString / cudaGetErrorName); with
 * CUDASIM_DEVICE_GUARD=1 cudaMalloc'ed memory faults when host code touches it, copies and
 * memsets still reach it. */
#include "cudasim.h"
#include "simtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_device_count_from_environment(void **state)
{
    int n = -1;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 1);

    setenv("CUDASIM_DEVICES", "0", 1);
    assert_int_equal(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    assert_int_equal(n, 0);
    assert_int_equal(cudaGetLastError(), cudaErrorNoDevice);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    void *p = (void *)1;
    assert_int_equal(cudaMalloc(&p, 16), cudaErrorNoDevice);
    assert_null(p);
    cudaDeviceProp prop;
    assert_int_equal(cudaGetDeviceProperties(&prop, 0), cudaErrorNoDevice);

    setenv("CUDASIM_DEVICES", "2", 1);
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(n, 2);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    int d = -1;
    assert_int_equal(cudaGetDevice(&d), cudaSuccess);
    assert_int_equal(d, 1);
    assert_int_equal(cudaSetDevice(2), cudaErrorInvalidDevice);
    assert_int_equal(cudaSetDevice(0), cudaSuccess);
    unsetenv("CUDASIM_DEVICES");

    setenv("CUDASIM_NO_DRIVER", "1", 1);
    assert_int_equal(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
    int v = -1;
    assert_int_equal(cudaDriverGetVersion(&v), cudaSuccess);
    assert_int_equal(v, 0);
    unsetenv("CUDASIM_NO_DRIVER");
    cudaGetLastError();
    assert_int_equal(cudaDriverGetVersion(&v), cudaSuccess);
    assert_int_equal(v, CUDART_VERSION);
}

static void test_device_properties(void **state)
{
    cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    assert_string_equal(p.name, "cudasim");
    assert_int_equal(p.major, 9);
    assert_int_equal(p.minor, 0);
    assert_int_equal(p.warpSize, 32);
    assert_int_equal(p.maxThreadsPerBlock, 1024);
    assert_int_equal(p.sharedMemPerBlock, 48 << 10);
    assert_int_equal(p.sharedMemPerBlockOptin, 227 << 10);   /* H100: 232448 bytes */
    assert_true(p.totalGlobalMem == (size_t)80 << 30);
    int v = 0;
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
    assert_int_equal(v, 227 << 10);
    assert_int_equal(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    assert_int_equal(v, p.multiProcessorCount);
    assert_int_equal(cudaGetDeviceProperties(&p, 1), cudaErrorInvalidDevice);
    cudaGetLastError();
    /* residency per SM: 64 warps, 32 blocks, 228 KiB of shared memory with 1 KiB reserved per block */
    int blocks = 0;
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)&p, 256, 0), cudaSuccess);
    assert_int_equal(blocks, 8);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)&p, 32, 0), cudaSuccess);
    assert_int_equal(blocks, 32);
    assert_int_equal(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)&p, 128, 100 << 10), cudaSuccess);
    assert_int_equal(blocks, 2);
}

static void test_pointer_attributes(void **state)
{
    char *dev = nullptr, *man = nullptr, *host = nullptr;
    assert_int_equal(cudaMalloc(&dev, 1000), cudaSuccess);
    assert_int_equal(cudaMallocManaged(&man, 1000), cudaSuccess);
    assert_int_equal(cudaMallocHost(&host, 1000), cudaSuccess);
    char *plain = (char *)malloc(1000);
    int on_stack = 0;
    struct { const void *p; cudaMemoryType type; } cases[] = {
        {dev, cudaMemoryTypeDevice}, {dev + 999, cudaMemoryTypeDevice},
        {dev + 1000, cudaMemoryTypeUnregistered},          /* one past the end is not inside */
        {man, cudaMemoryTypeManaged}, {man + 500, cudaMemoryTypeManaged},
        {host, cudaMemoryTypeHost}, {host + 1, cudaMemoryTypeHost},
        {plain, cudaMemoryTypeUnregistered}, {&on_stack, cudaMemoryTypeUnregistered},
        {nullptr, cudaMemoryTypeUnregistered},
    };
    for (auto &c : cases) {
        cudaPointerAttributes a;
        assert_int_equal(cudaPointerGetAttributes(&a, c.p), cudaSuccess);
        assert_int_equal(a.type, c.type);
        assert_true(a.devicePointer == (c.type == cudaMemoryTypeUnregistered ? nullptr : c.p));
    }
    /* cudaHostRegister'ed memory is host memory until unregistered */
    assert_int_equal(cudaHostRegister(plain, 1000, cudaHostRegisterDefault), cudaSuccess);
    cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, plain + 10), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeHost);
    assert_int_equal(cudaHostRegister(plain + 10, 10, 0), cudaErrorHostMemoryAlreadyRegistered);
    void *mapped = nullptr;
    assert_int_equal(cudaHostGetDevicePointer(&mapped, plain + 10, 0), cudaSuccess);
    assert_ptr_equal(mapped, plain + 10);
    assert_int_equal(cudaHostGetDevicePointer(&mapped, man, 0), cudaErrorInvalidValue);
    assert_int_equal(cudaHostUnregister(plain), cudaSuccess);
    assert_int_equal(cudaHostUnregister(plain), cudaErrorHostMemoryNotRegistered);
    /* freed memory is unregistered; frees must match their allocator */
    assert_int_equal(cudaFreeHost(dev), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(host), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(dev + 1), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(dev), cudaSuccess);
    assert_int_equal(cudaFree(dev), cudaErrorInvalidValue);
    assert_int_equal(cudaPointerGetAttributes(&a, dev), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeUnregistered);
    cudaGetLastError();
    cudaFree(man), cudaFreeHost(host), free(plain);
}

static void test_copies_and_memset(void **state)
{
    float *dev = nullptr, host[64], back[64];
    assert_int_equal(cudaMalloc(&dev, sizeof host), cudaSuccess);
    unsigned first;   /* fresh device memory is poisoned: 0xFF bytes */
    assert_int_equal(cudaMemcpy(&first, dev, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(first, 0xFFFFFFFFu);
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    assert_int_equal(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(back, dev, sizeof back, cudaMemcpyDefault, 0), cudaSuccess);
    assert_memory_equal(back, host, sizeof host);
    /* the device side must be one allocation of the shims, whole */
    assert_int_equal(cudaMemcpy(back, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(dev + 1, host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(back, host, sizeof host, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    assert_int_equal(cudaMemset(dev + 32, 0, 32 * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMemset(dev + 32, 0, 33 * sizeof(float)), cudaErrorInvalidValue);
    assert_int_equal(cudaMemset(host, 0, 4), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(back[31] == 31.0f && back[32] == 0.0f && back[63] == 0.0f);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);   /* the last failure */
    size_t free_b = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    assert_true(total - free_b >= sizeof host);
    void *huge = nullptr;
    assert_int_equal(cudaMalloc(&huge, total + 1), cudaErrorMemoryAllocation);
    cudaGetLastError();
    cudaFree(dev);
}

/* CUDASIM_MEM sets the device's memory: cudaMalloc past it fails, cudaMemGetInfo reports it less
 * what is allocated; cudasim_peak_bytes is the most allocated at once (the memory plan's test) */
static void test_memory_size_and_peak(void **state)
{
    (void)state;
    setenv("CUDASIM_MEM", "8M", 1);
    size_t free_b = 0, total = 0, base = cudasim_peak_bytes();
    assert_int_equal(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    assert_int_equal(total, (size_t)8 << 20);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    assert_int_equal(cudaMalloc(&a, (size_t)3 << 20), cudaSuccess);
    assert_int_equal(cudaMalloc(&b, (size_t)4 << 20), cudaSuccess);
    size_t free2 = 0;
    assert_int_equal(cudaMemGetInfo(&free2, &total), cudaSuccess);
    assert_int_equal(free_b - free2, (size_t)7 << 20);
    assert_int_equal(cudaMalloc(&c, (size_t)2 << 20), cudaErrorMemoryAllocation);   /* 9M > 8M */
    cudaGetLastError();
    assert_int_equal(cudaFree(b), cudaSuccess);
    assert_int_equal(cudaMallocAsync(&c, (size_t)2 << 20, nullptr), cudaSuccess);   /* 5M now */
    size_t peak = cudasim_peak_bytes();
    assert_true(peak >= ((size_t)7 << 20) && peak >= base);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaFreeAsync(c, nullptr), cudaSuccess);
    assert_int_equal(cudasim_peak_bytes(), peak);   /* a peak stays */
    unsetenv("CUDASIM_MEM");
}

static void test_streams_events(void **state)
{
    cudaStream_t s;
    cudaEvent_t a, b;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreate(&a), cudaSuccess);
    assert_int_equal(cudaEventCreate(&b), cudaSuccess);
    float ms = -1;
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);   /* not recorded */
    assert_int_equal(cudaEventRecord(a, s), cudaSuccess);
    assert_int_equal(cudaEventRecord(b, s), cudaSuccess);
    assert_int_equal(cudaEventSynchronize(b), cudaSuccess);
    assert_int_equal(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    assert_true(ms >= 0.0f);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    assert_int_equal(cudaEventDestroy(a), cudaSuccess);
    assert_int_equal(cudaEventDestroy(b), cudaSuccess);
    assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    cudaGetLastError();
}

static void guard_checks(void)
{
    float h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = (float)i;
    float *d = NULL, *m = NULL;
    assert_int_equal(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    assert_int_equal(cudaMallocManaged((void **)&m, sizeof h, cudaMemAttachGlobal), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, 16), cudaSuccess);
    assert_int_equal(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(back[0] == 0.0f && back[3] == 0.0f && back[4] == 4.0f && back[63] == 63.0f);
    m[5] = 1.0f;   /* managed memory: the host may touch it */
    /* a host read of device memory: the child faults (SIGSEGV) and says where */
    char path[] = "/tmp/cudasim_guard_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        volatile float x = d[7];
        (void)x;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char msg[1000] = "";
    ssize_t n = pread(fd, msg, sizeof msg - 1, 0);
    msg[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    assert_non_null(strstr(msg, "host code touched device memory"));
    assert_non_null(strstr(msg, "256-byte cudaMalloc allocation"));
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaFree(m), cudaSuccess);
}

/* both guards: the key where the machine has one, and the page guard (chosen once a process, so
 * in a process of its own: this binary run as "guard-pages" with CUDASIM_GUARD_PAGES=1) */
static void test_device_guard(void **state)
{
    setenv("CUDASIM_DEVICE_GUARD", "1", 1);
    guard_checks();
    const char *mode = cudasim_detail::guard_mode();
    const char *pages = getenv("CUDASIM_GUARD_PAGES");
    printf("device guard: %s\n", mode);
    if (pages && !strcmp(pages, "1")) {
        assert_string_equal(mode, "pages");
    } else if (!strcmp(mode, "key")) {
        pid_t pid = fork();
        if (pid == 0) {
            setenv("CUDASIM_GUARD_PAGES", "1", 1);
            execl("/proc/self/exe", "test_cudasim_runtime", "guard-pages", (char *)NULL);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    unsetenv("CUDASIM_DEVICE_GUARD");
}

static void test_error_texts(void **state)
{
    assert_string_equal(cudaGetErrorString(cudaSuccess), "no error");
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
    assert_string_equal(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected");
    assert_string_equal(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
    assert_string_equal(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
    assert_string_equal(cudaGetErrorName((cudaError_t)12345), "unrecognized error code");
    assert_int_equal(cudaErrorNoDevice, 100);
    assert_int_equal(cudaErrorInsufficientDriver, 35);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "guard-pages")) {
        const struct CMUnitTest guard[] = {cmocka_unit_test(test_device_guard)};
        return cmocka_run_group_tests_name("page guard", guard, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_count_from_environment),
        cmocka_unit_test(test_device_properties),
        cmocka_unit_test(test_pointer_attributes),
        cmocka_unit_test(test_copies_and_memset),
        cmocka_unit_test(test_memory_size_and_peak),
        cmocka_unit_test(test_streams_events),
        cmocka_unit_test(test_error_texts),
        cmocka_unit_test(test_device_guard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
