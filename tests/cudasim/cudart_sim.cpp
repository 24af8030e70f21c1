/* tidal — cudasim's CUDA runtime API (cudasim_runtime.h): devices from the environment, memory
 * from the host heap with a registry of every allocation (so pointer attributes and the device
 * side of copies can be checked), streams and events as validated handles, and the last-error
 * rule of libcudart (every failing call records its error; cudaGetLastError returns and clears
 * it). Error names and strings are libcudart 13's. */
#include "cudasim.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct CUstream_st { unsigned flags; };
struct CUevent_st {
    unsigned flags;
    bool recorded;
    std::chrono::steady_clock::time_point when;
};

namespace {

struct Alloc {
    size_t size;
    cudaMemoryType type;
    bool owned;            /* false: cudaHostRegister'ed user memory */
    size_t mapped;         /* CUDASIM_DEVICE_GUARD: the pages mmap'ed for it (0: malloc'ed) */
};

std::mutex mu;             /* guards everything below */
std::map<uintptr_t, Alloc> allocs;
size_t device_bytes;       /* device + managed bytes in use */
size_t device_peak;        /* the most device_bytes has been (CUDASIM_PEAK=1 prints it at exit) */
std::set<cudaStream_t> streams;
std::set<cudaEvent_t> events;
std::map<const void *, int> max_dyn_smem;   /* cudaFuncAttributeMaxDynamicSharedMemorySize */
int current_device;
thread_local cudaError_t last_error = cudaSuccess;

const size_t SMEM_DEFAULT = 48 << 10, SMEM_OPTIN = 227 << 10;

int device_count(void)
{
    const char *s = getenv("CUDASIM_DEVICES");
    if (!s || !*s) return 1;
    char *end;
    long n = strtol(s, &end, 10);
    if (*end || n < 0 || n > 64) {
        fprintf(stderr, "cudasim: CUDASIM_DEVICES=%s: expected a device count from 0 to 64\n", s);
        exit(2);
    }
    return (int)n;
}

bool no_driver(void)
{
    const char *s = getenv("CUDASIM_NO_DRIVER");
    return s && *s && strcmp(s, "0");
}

/* what every device call returns first: no driver, no device, or fine */
cudaError_t device_status(void)
{
    if (no_driver()) return cudaErrorInsufficientDriver;
    return device_count() > 0 ? cudaSuccess : cudaErrorNoDevice;
}

size_t total_mem(void) { return cudasim_detail::env_bytes("CUDASIM_MEM", (size_t)80 << 30); }

/* the allocation containing p (interior pointers included), or allocs.end(); caller holds mu */
std::map<uintptr_t, Alloc>::iterator find(const void *p)
{
    auto it = allocs.upper_bound((uintptr_t)p);
    if (it == allocs.begin()) return allocs.end();
    --it;
    return (uintptr_t)p - it->first < it->second.size ? it : allocs.end();
}

/* the device side of a copy or memset: count bytes inside one allocation made by the shims */
bool device_range(const void *p, size_t count)
{
    auto it = find(p);
    return it != allocs.end() && count <= it->second.size - ((uintptr_t)p - it->first);
}

/* a host side: anything, but a registered pointer must stay inside its allocation */
bool host_range(const void *p, size_t count)
{
    auto it = find(p);
    return it == allocs.end() || count <= it->second.size - ((uintptr_t)p - it->first);
}

/* ---- CUDASIM_DEVICE_GUARD (cudasim_runtime.h): device memory closed to host code ---------- */
/* Two ways to close it. A memory protection key (pkeys(7)) tags every guarded mapping once, and
 * opening or closing is a write of the thread's PKRU register: no system call, no TLB flush. Where
 * the CPU or the kernel has no keys (or CUDASIM_GUARD_PAGES=1), mprotect over every mapping at
 * each open and close: a system call per run of adjacent mappings and a TLB flush at every launch,
 * which made a guarded tidal-rl run of the tests 7x slower (41 s, 34 of them in the kernel, against
 * 5.9 unguarded; 6.3 s with a key). The rights a key gives are the thread's own, so with keys the
 * nesting is counted per thread; all of the sim's device work runs on the thread that asked for it
 * (kernels on fibers of the launching thread). */
int access_depth;                      /* DeviceAccess nesting, page guard (under mu) */
thread_local int key_depth;            /* DeviceAccess nesting, key guard (this thread's rights) */
int guard_key = -2;                    /* the protection key; -1: page guard; -2: not chosen yet */

bool guard_on(void)
{
    const char *s = getenv("CUDASIM_DEVICE_GUARD");
    return s && !strcmp(s, "1");
}

/* the key guarded mappings carry, or -1 for the page guard; chosen at the first guarded
 * allocation (caller holds mu) */
int guard_pkey(void)
{
    if (guard_key == -2) {
        const char *s = getenv("CUDASIM_GUARD_PAGES");
        guard_key = s && !strcmp(s, "1") ? -1 : pkey_alloc(0, PKEY_DISABLE_ACCESS);
        if (guard_key < 0) guard_key = -1;
    }
    return guard_key;
}

void set_key_rights(bool open)
{
    if (pkey_set(guard_key, open ? 0 : PKEY_DISABLE_ACCESS)) {
        perror("cudasim: pkey_set");
        abort();
    }
}

/* caller holds mu; adjacent mappings (mmap hands them out next to each other) in one call */
void protect_all(int prot)
{
    uintptr_t start = 0, end = 0;
    auto flush = [&]() {
        if (end > start && mprotect((void *)start, end - start, prot)) {
            perror("cudasim: mprotect");
            abort();
        }
    };
    for (auto &a : allocs) {
        if (!a.second.mapped) continue;
        if (a.first != end) {
            flush();
            start = a.first;
        }
        end = a.first + a.second.mapped;
    }
    flush();
}

/* a fault inside guarded device memory: the host touched it; say so, then fault again with the
 * default action (SA_RESETHAND) for the core dump / debugger. Not async-signal-safe in the map
 * walk, which is acceptable on the way down. */
void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)sig; (void)uc;
    uintptr_t at = (uintptr_t)si->si_addr;
    for (auto &a : allocs)
        if (a.second.mapped && at >= a.first && at < a.first + a.second.mapped) {
            char msg[400];
            int n = snprintf(msg, sizeof msg, "cudasim: host code touched device memory at %p (inside "
                             "a %zu-byte cudaMalloc allocation at %p; CUDASIM_DEVICE_GUARD=1): a GPU "
                             "machine segfaults here. Copy it down first (be->download, cudaMemcpy)\n",
                             (void *)at, a.second.size, (void *)a.first);
            if (write(2, msg, (size_t)n) < 0) { /* nothing more to do */ }
            break;
        }
}

void install_fault_handler(void)
{
    static bool done;
    if (done) return;
    done = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
}

cudaError_t allocate(void **p, size_t size, cudaMemoryType type)
{
    if (!p) return cudaErrorInvalidValue;
    *p = nullptr;
    cudaError_t e = device_status();
    if (e != cudaSuccess) return e;
    if (size == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mu);
    if (type != cudaMemoryTypeHost && size > total_mem() - std::min(device_bytes, total_mem()))
        return cudaErrorMemoryAllocation;
    void *m = nullptr;
    size_t mapped = 0;
    if (type == cudaMemoryTypeDevice && guard_on()) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        mapped = (size + page - 1) / page * page;
        m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
        install_fault_handler();
    } else if (posix_memalign(&m, 256, size)) {
        return cudaErrorMemoryAllocation;
    }
    memset(m, 0xFF, size);          /* uninitialised device memory reads as NaN */
    if (mapped && guard_pkey() >= 0) {
        /* the mapping keeps read and write; each thread's rights for the key decide (already set:
         * pkey_alloc closed the key, DeviceAccess opens and closes it) */
        if (pkey_mprotect(m, mapped, PROT_READ | PROT_WRITE, guard_key)) {
            perror("cudasim: pkey_mprotect");
            abort();
        }
    } else if (mapped && access_depth == 0 && mprotect(m, mapped, PROT_NONE)) {
        perror("cudasim: mprotect");
        abort();
    }
    allocs[(uintptr_t)m] = Alloc{size, type, true, mapped};
    if (type != cudaMemoryTypeHost) {
        device_bytes += size;
        if (device_bytes > device_peak) device_peak = device_bytes;
        static bool reported;
        if (!reported) {   /* the peak on stderr at exit: tests compare the memory plan with it */
            reported = true;
            const char *e = getenv("CUDASIM_PEAK");
            if (e && !strcmp(e, "1")) atexit([] { fprintf(stderr, "cudasim: peak device memory %zu bytes\n", device_peak); });
        }
    }
    *p = m;
    return cudaSuccess;
}

cudaError_t release(void *p, bool host)
{
    if (!p) return cudaSuccess;
    cudaError_t e = device_status();
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || !it->second.owned || (it->second.type == cudaMemoryTypeHost) != host)
        return cudaErrorInvalidValue;
    if (!host) device_bytes -= it->second.size;
    if (it->second.mapped) munmap(p, it->second.mapped);
    else free(p);
    allocs.erase(it);
    return cudaSuccess;
}

bool valid_stream(cudaStream_t s)
{
    std::lock_guard<std::mutex> lock(mu);
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || streams.count(s);
}

struct ErrorText { cudaError_t code; const char *name, *text; };
const ErrorText error_texts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration", "__global__ function call is not configured"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText *error_text(cudaError_t e)
{
    for (const ErrorText &t : error_texts)
        if (t.code == e) return &t;
    return nullptr;
}

} // namespace

using cudasim_detail::set_error;

/* ---- sim internals ------------------------------------------------------------------------ */

cudaError_t cudasim_detail::set_error(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
    return e;
}

size_t cudasim_detail::env_bytes(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (end == s || (shift && end[1]) || (!shift && *end) || v == 0) {
        fprintf(stderr, "cudasim: %s=%s: expected a positive size in bytes, optionally with K, M or G\n",
                name, s);
        exit(2);
    }
    return (size_t)v << shift;
}

const char *cudasim_detail::guard_mode(void)
{
    std::lock_guard<std::mutex> lock(mu);
    return guard_pkey() >= 0 ? "key" : "pages";
}

cudasim_detail::DeviceAccess::DeviceAccess()
{
    if (!guard_on()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (guard_pkey() >= 0) {
        if (key_depth++ == 0) set_key_rights(true);
    } else if (access_depth++ == 0) {
        protect_all(PROT_READ | PROT_WRITE);
    }
}

cudasim_detail::DeviceAccess::~DeviceAccess()
{
    if (!guard_on()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (guard_pkey() >= 0) {
        if (--key_depth == 0) set_key_rights(false);
    } else if (--access_depth == 0) {
        protect_all(PROT_NONE);
    }
}

bool cudasim_detail::device_addressable(const void *p)
{
    if (!p) return true;
    std::lock_guard<std::mutex> lock(mu);
    return find(p) != allocs.end() || find((const char *)p - 1) != allocs.end();
}

cudaError_t cudasim_detail::check_launch(const void *func, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, size_t smem,
                                         cudaStream_t stream)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return e;
    if (!bx || !by || !bz || bx > 1024 || by > 1024 || bz > 64 || (size_t)bx * by * bz > 1024)
        return cudaErrorInvalidConfiguration;
    if (!gx || !gy || !gz || gx > 2147483647u || gy > 65535 || gz > 65535)
        return cudaErrorInvalidConfiguration;
    size_t limit = SMEM_DEFAULT;
    {
        std::lock_guard<std::mutex> lock(mu);
        auto it = max_dyn_smem.find(func);
        if (it != max_dyn_smem.end()) limit = std::max(limit, (size_t)it->second);
    }
    if (smem > limit) return cudaErrorInvalidValue;
    if (!valid_stream(stream)) return cudaErrorInvalidResourceHandle;
    return cudaSuccess;
}

/* ---- errors ------------------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char *cudaGetErrorString(cudaError_t e)
{
    const ErrorText *t = error_text(e);
    return t ? t->text : "unrecognized error code";
}
const char *cudaGetErrorName(cudaError_t e)
{
    const ErrorText *t = error_text(e);
    return t ? t->name : "unrecognized error code";
}

/* ---- devices ------------------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    *count = e == cudaSuccess ? device_count() : 0;
    return set_error(e);
}

cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    *device = current_device;
    return cudaSuccess;
}

/* an H100 SXM's figures, named "cudasim" */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudasim");
    p->totalGlobalMem = total_mem();
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = device;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->maxBlocksPerMultiProcessor = 32;
    p->reservedSharedMemPerBlock = 1024;
    p->memoryPoolsSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    struct cudaDeviceProp p;
    if (!value) return set_error(cudaErrorInvalidValue);
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: case cudaDevAttrMaxBlockDimZ:
        *value = p.maxThreadsDim[attr - cudaDevAttrMaxBlockDimX]; break;
    case cudaDevAttrMaxGridDimX: case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ:
        *value = p.maxGridSize[attr - cudaDevAttrMaxGridDimX]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrClockRate: *value = 1980000; break;            /* kHz */
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;      /* kHz (HBM3) */
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrManagedMemory: *value = 1; break;
    case cudaDevAttrPageableMemoryAccess: *value = 0; break;
    case cudaDevAttrConcurrentManagedAccess: *value = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return set_error(device_status()); }

cudaError_t cudaDeviceReset(void)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = allocs.begin(); it != allocs.end();) {
        if (it->second.owned) free((void *)it->first);
        it = allocs.erase(it);
    }
    device_bytes = 0;
    for (cudaStream_t s : streams) delete s;
    for (cudaEvent_t v : events) delete v;
    streams.clear(), events.clear(), max_dyn_smem.clear();
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = no_driver() ? 0 : CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

size_t cudasim_peak_bytes(void)
{
    std::lock_guard<std::mutex> lock(mu);
    return device_peak;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    *total = total_mem();
    *free_bytes = *total - std::min(device_bytes, *total);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if (!func) return set_error(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > SMEM_OPTIN) return set_error(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> lock(mu);
        max_dyn_smem[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return set_error(value >= -1 && value <= 100 ? cudaSuccess : cudaErrorInvalidValue);
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
                                                          int blockSize, size_t dynamicSMemSize)
{
    if (!numBlocks || !func || blockSize <= 0 || blockSize > 1024) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    const int warps = (blockSize + 31) / 32;
    size_t by_smem = (size_t)(228 << 10) / (dynamicSMemSize + 1024);
    *numBlocks = (int)std::min(std::min((size_t)32, (size_t)(64 / warps)), by_smem);
    return cudaSuccess;
}

/* ---- memory -------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **p, size_t size) { return set_error(allocate(p, size, cudaMemoryTypeDevice)); }
cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags)
{
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) return set_error(cudaErrorInvalidValue);
    return set_error(allocate(p, size, cudaMemoryTypeManaged));
}
cudaError_t cudaMallocHost(void **p, size_t size) { return set_error(allocate(p, size, cudaMemoryTypeHost)); }
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags)
{
    if (flags & ~0x7u) return set_error(cudaErrorInvalidValue);
    return set_error(allocate(p, size, cudaMemoryTypeHost));
}
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s)
{
    if (!valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
    return set_error(allocate(p, size, cudaMemoryTypeDevice));
}
cudaError_t cudaFree(void *p) { return set_error(release(p, false)); }
cudaError_t cudaFreeHost(void *p) { return set_error(release(p, true)); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    if (!valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
    return set_error(release(p, false));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if (!ptr || !size || (flags & ~0xFu)) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.lower_bound((uintptr_t)ptr);
    if (find(ptr) != allocs.end() || (it != allocs.end() && it->first < (uintptr_t)ptr + size))
        return set_error(cudaErrorHostMemoryAlreadyRegistered);
    allocs[(uintptr_t)ptr] = Alloc{size, cudaMemoryTypeHost, false};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    auto it = allocs.find((uintptr_t)ptr);
    if (it == allocs.end() || it->second.owned) return set_error(cudaErrorHostMemoryNotRegistered);
    allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    if (!a) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    auto it = find(ptr);
    a->type = it == allocs.end() ? cudaMemoryTypeUnregistered : it->second.type;
    a->device = it == allocs.end() ? cudaInvalidDeviceId : current_device;
    a->devicePointer = it == allocs.end() ? nullptr : (void *)ptr;
    a->hostPointer = (a->type == cudaMemoryTypeHost || a->type == cudaMemoryTypeManaged) ? (void *)ptr : nullptr;
    return cudaSuccess;
}

/* mapped host memory has the same address on the device (unified addressing) */
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (!pDevice || flags) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    auto it = find(pHost);
    if (it == allocs.end() || it->second.type != cudaMemoryTypeHost) return set_error(cudaErrorInvalidValue);
    *pDevice = pHost;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if ((unsigned)kind > cudaMemcpyDefault) return set_error(cudaErrorInvalidMemcpyDirection);
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return set_error(cudaErrorInvalidValue);
    {
        std::lock_guard<std::mutex> lock(mu);
        bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (!(dst_dev ? device_range(dst, count) : host_range(dst, count)) ||
            !(src_dev ? device_range(src, count) : host_range(src, count)))
            return set_error(cudaErrorInvalidValue);
    }
    cudasim_detail::DeviceAccess access;
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemset(void *p, int value, size_t count)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    if (count == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!device_range(p, count)) return set_error(cudaErrorInvalidValue);
    }
    cudasim_detail::DeviceAccess access;
    memset(p, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
    return cudaMemset(p, value, count);
}

/* ---- streams and events ------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    if (!s || flags > cudaStreamNonBlocking) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    *s = new CUstream_st{flags};
    streams.insert(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::mutex> lock(mu);
    if (!streams.erase(s)) return set_error(cudaErrorInvalidResourceHandle);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    return set_error(valid_stream(s) ? cudaSuccess : cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

static bool valid_event(cudaEvent_t v)
{
    std::lock_guard<std::mutex> lock(mu);
    return events.count(v) != 0;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t v, unsigned int flags)
{
    if (!valid_stream(s) || !valid_event(v)) return set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *v, unsigned int flags)
{
    if (!v || flags > 0xF) return set_error(cudaErrorInvalidValue);
    cudaError_t e = device_status();
    if (e != cudaSuccess) return set_error(e);
    std::lock_guard<std::mutex> lock(mu);
    *v = new CUevent_st{flags, false, {}};
    events.insert(*v);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *v) { return cudaEventCreateWithFlags(v, cudaEventDefault); }

cudaError_t cudaEventRecord(cudaEvent_t v, cudaStream_t s)
{
    if (!valid_event(v) || !valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
    v->recorded = true;
    v->when = std::chrono::steady_clock::now();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t v)
{
    return set_error(valid_event(v) ? cudaSuccess : cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t v) { return cudaEventSynchronize(v); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!ms) return set_error(cudaErrorInvalidValue);
    if (!valid_event(start) || !valid_event(end) || !start->recorded || !end->recorded ||
        ((start->flags | end->flags) & cudaEventDisableTiming))
        return set_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t v)
{
    std::lock_guard<std::mutex> lock(mu);
    if (!events.erase(v)) return set_error(cudaErrorInvalidResourceHandle);
    delete v;
    return cudaSuccess;
}
