/* tidal — cudasim: the CUDA runtime API subset the backend uses, with CUDA's own names, types,
 * enum values and error strings (checked against CUDA 13's driver_types.h / libcudart), run on
 * the host. Implemented in cudart_sim.cpp. Included by cudasim.h; see there for the whole sim.
 *
 * Memory: every allocation made through these shims is registered (base, size, type), so
 * cudaPointerGetAttributes resolves interior pointers by containment and reports
 * cudaMemoryTypeUnregistered for anything else, and cudaMemcpy / cudaMemset check that the
 * device side of a copy lies inside one device or managed allocation (cudaErrorInvalidValue
 * otherwise, as the real runtime does for a bad device pointer). Device and managed memory comes
 * filled with 0xFF bytes (NaN floats), so a read of never-written device memory shows.
 * Everything is synchronous: a stream is a handle, a kernel runs to completion at its launch.
 *
 * Environment: CUDASIM_DEVICES=N (default 1; 0 = a driver but no GPU: cudaGetDeviceCount and
 * every device call return cudaErrorNoDevice), CUDASIM_NO_DRIVER=1 (no driver: calls return
 * cudaErrorInsufficientDriver, cudaDriverGetVersion gives 0, as libcudart does without one),
 * CUDASIM_MEM=bytes[K|M|G] (the device's totalGlobalMem; default 80G; cudaMalloc beyond it
 * returns cudaErrorMemoryAllocation; cudaMemGetInfo reports it less what is allocated),
 * CUDASIM_PEAK=1 (at exit, "cudasim: peak device memory N bytes" on stderr: the most device and
 * managed memory allocated at once; cudasim_peak_bytes() gives it to a test). */
#ifndef TIDAL_CUDASIM_RUNTIME_H
#define TIDAL_CUDASIM_RUNTIME_H

#include <stddef.h>

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorMissingConfiguration = 52,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidKernelImage = 200,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorAssert = 710,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4
};
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMaxBlockDimX = 2, cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4, cudaDevAttrMaxGridDimX = 5, cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7, cudaDevAttrMaxSharedMemoryPerBlock = 8, cudaDevAttrWarpSize = 10,
    cudaDevAttrMaxRegistersPerBlock = 12, cudaDevAttrClockRate = 13,
    cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMemoryClockRate = 36,
    cudaDevAttrGlobalMemoryBusWidth = 37, cudaDevAttrL2CacheSize = 38,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39, cudaDevAttrUnifiedAddressing = 41,
    cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81, cudaDevAttrManagedMemory = 83,
    cudaDevAttrPageableMemoryAccess = 88, cudaDevAttrConcurrentManagedAccess = 89,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02
#define cudaMemAttachSingle 0x04
#define cudaCpuDeviceId ((int)-1)
#define cudaInvalidDeviceId ((int)-2)

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

/* The fields of CUDA 13's cudaDeviceProp that a backend reads (same names and types; CUDA 13
 * dropped clockRate and memoryClockRate from the struct: ask cudaDeviceGetAttribute for them). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    size_t sharedMemPerBlockOptin;
    int maxBlocksPerMultiProcessor;
    size_t reservedSharedMemPerBlock;
    int memoryPoolsSupported;
};

#define CUDART_VERSION 13000

/* errors */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* devices */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
size_t cudasim_peak_bytes(void);   /* the most device + managed bytes allocated at once */

/* memory */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags = cudaMemAttachGlobal);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream = 0);

/* typed forms, as cuda_runtime.h has them (cudaMalloc(&float_ptr, n) without a cast) */
template <class T> cudaError_t cudaMalloc(T **p, size_t size) { return cudaMalloc((void **)p, size); }
template <class T> cudaError_t cudaMallocManaged(T **p, size_t size, unsigned int flags = cudaMemAttachGlobal)
{ return cudaMallocManaged((void **)p, size, flags); }
template <class T> cudaError_t cudaMallocHost(T **p, size_t size) { return cudaMallocHost((void **)p, size); }
template <class T> cudaError_t cudaHostAlloc(T **p, size_t size, unsigned int flags)
{ return cudaHostAlloc((void **)p, size, flags); }
template <class T> cudaError_t cudaMallocAsync(T **p, size_t size, cudaStream_t s)
{ return cudaMallocAsync((void **)p, size, s); }

/* streams and events (a stream is a validated handle; work on it has finished when issued) */
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* kernels: the opt-in for dynamic shared memory above 48 KiB is recorded per kernel and
 * enforced at launch (cudaErrorInvalidValue without it, as on the GPU) */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);
template <class T> cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value)
{ return cudaFuncSetAttribute((const void *)entry, attr, value); }
/* an H100's residency limits: 2048 threads, 32 blocks, 228 KiB shared memory (1 KiB reserved
 * per block) per multiprocessor */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
                                                          int blockSize, size_t dynamicSMemSize);
template <class T> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, T *func,
                                                                            int blockSize, size_t smem)
{ return cudaOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, (const void *)func, blockSize, smem); }
/* __constant__ / __device__ variables are plain globals in the sim */
template <class T> cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count,
                                                  size_t offset = 0,
                                                  enum cudaMemcpyKind kind = cudaMemcpyHostToDevice)
{
    if (offset + count > sizeof(T)) return cudaErrorInvalidValue;
    return cudaMemcpy((char *)&symbol + offset, src, count, cudaMemcpyHostToHost);
}

/* ---- sim internals shared by cudasim.cpp and cudart_sim.cpp (not CUDA API) ---------------- */
namespace cudasim_detail {
/* records e as the last error (when not cudaSuccess) and returns it, as every runtime call does */
cudaError_t set_error(cudaError_t e);
/* cudaSuccess, or why a launch with this configuration fails before it runs */
cudaError_t check_launch(const void *func, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, size_t smem, cudaStream_t stream);
/* a size from the environment: digits with an optional K, M or G; exits 2 on anything else */
size_t env_bytes(const char *name, size_t dflt);
/* p is null, or inside (or one past the end of) an allocation of the runtime's: the GPU can
 * address it */
bool device_addressable(const void *p);
/* CUDASIM_DEVICE_GUARD=1: device memory (cudaMalloc, cudaMallocAsync) is closed while host code
 * runs (a protection key's rights taken away, or PROT_NONE: guard_mode below), so a host read or write of it faults at once (with a message naming the
 * allocation) as it would on a GPU machine, instead of passing because the sim's "device" is
 * host memory. What runs as the device (kernels, copies, memsets, the cuBLASLt model) holds a
 * DeviceAccess for its duration (nested: the outermost one opens and closes). Managed and
 * pinned host memory stay accessible, as on the GPU. */
struct DeviceAccess {
    DeviceAccess();
    ~DeviceAccess();
    DeviceAccess(const DeviceAccess &) = delete;
    DeviceAccess &operator=(const DeviceAccess &) = delete;
};
/* how CUDASIM_DEVICE_GUARD closes device memory: "key" (a memory protection key, pkeys(7)) or
 * "pages" (mprotect; where there are no keys, or CUDASIM_GUARD_PAGES=1), chosen once a process */
const char *guard_mode(void);
}

#endif
