/* tidal — cudasim: a CPU simulator of the CUDA subset tidal's kernels use (C++20, g++ 12).
 *
 * The sources in src/backend/cuda compile with `g++ -x c++ -DTD_CUDASIM -Itests/cudasim` against
 * this header (cuda_internal.cuh includes it instead of cuda_runtime.h), so the kernels' logic
 * runs and is tested on any machine (tests/cudasim/sim.mk builds them). What it models:
 *   - a launch (TD_LAUNCH -> cudasim_launch) runs the grid's blocks one after another, at the
 *     launch, on the calling thread; the threads of a block are fibers that switch only at a
 *     barrier: __syncthreads (block), __syncwarp and the warp intrinsics (__shfl_*_sync,
 *     __ballot_sync, __any_sync, __all_sync, __reduce_*_sync: the lanes of the caller's warp
 *     named in the mask exchange values and wait for each other, as on the GPU);
 *   - __shared__ is `static` (write `__shared__ T x[N]`, not `static __shared__`): the blocks
 *     run one at a time, so a static local is the block's shared memory; dynamic shared memory
 *     (TD_DYN_SMEM) is the launch's smem bytes, 16-byte aligned, filled with 0xFF bytes (NaN
 *     floats, -1 ints) at each block's start;
 *   - CUDA's rules made strict, so that what passes here is defined behaviour on a GPU: a barrier
 *     that cannot complete (__syncthreads in divergent code or after some threads returned, a
 *     warp intrinsic whose mask names a lane that waits elsewhere, lanes of a mask at different
 *     intrinsics) aborts with a message naming the kernel, its launch site, the block and the
 *     threads: it never hangs. A warp intrinsic waits for the lanes of its mask that have not
 *     returned (PTX: "non-exited threads"); a shuffle reading a lane that does not take part
 *     (outside the mask, returned, or past blockDim when it is not a multiple of 32) gets
 *     all-ones bits (NaN, -1): undefined on the GPU. __activemask() is every lane that has not
 *     returned;
 *   - CUDASIM_ORDER=forward|reverse|shuffle[:seed] (default forward; read at each launch) sets
 *     the order in which the runnable threads of a block run between barriers, and the order of
 *     the blocks. A kernel with a missing barrier (a race) gives different results under
 *     forward and reverse; a correct one gives the same (up to the order of float atomics);
 *   - the runtime API subset of cudasim_runtime.h, and the math of cudasim_math.h.
 * Not modelled: concurrency between blocks or streams (blocks are sequential: a kernel that
 * spins waiting for another block, or a thread spinning on a flag another thread of its block
 * sets without a barrier, hangs: fibers switch only at barriers), memory ordering (every write is visible at once),
 * bounds of device memory inside kernels (check-asan: ASan sees every device buffer and the
 * dynamic shared memory), dynamic parallelism, cooperative groups, textures, the fp16/bf16/fp8
 * CUDA types (tidal rounds with its own bit arithmetic, round.cuh; cudasim_wmma.h, included by
 * the kernels that use tensor cores, has bf16/fp16 storage types and WMMA m16n16k16). Static __shared__ arrays
 * keep the previous block's values (only dynamic shared memory is poisoned). Fiber stacks are
 * CUDASIM_STACK bytes (default 64K, 256K under ASan) above a guard page: a kernel that
 * overflows one gets SIGSEGV. One launch runs at a time (a mutex); a kernel may not launch. */
#ifndef TIDAL_CUDASIM_H
#define TIDAL_CUDASIM_H

#ifndef __cplusplus
#error "cudasim.h is C++20: compile CUDA sources with g++ -x c++ -std=c++20 -DTD_CUDASIM"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ---------------------------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ static
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __CUDASIM__ 1

#include "cudasim_math.h"
#include "cudasim_runtime.h"

/* ---- vector types ------------------------------------------------------------------------- */
#define CUDASIM_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; }; \
    static inline N make_##N(T x, T y) { N v = {x, y}; return v; }
#define CUDASIM_VEC3(T, N) struct N { T x, y, z; }; \
    static inline N make_##N(T x, T y, T z) { N v = {x, y, z}; return v; }
#define CUDASIM_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { N v = {x, y, z, w}; return v; }
CUDASIM_VEC2(float, float2, 8)
CUDASIM_VEC3(float, float3)
CUDASIM_VEC4(float, float4, 16)
CUDASIM_VEC2(double, double2, 16)
CUDASIM_VEC2(int, int2, 8)
CUDASIM_VEC3(int, int3)
CUDASIM_VEC4(int, int4, 16)
CUDASIM_VEC2(unsigned int, uint2, 8)
CUDASIM_VEC4(unsigned int, uint4, 16)
CUDASIM_VEC2(unsigned short, ushort2, 4)
CUDASIM_VEC4(unsigned short, ushort4, 8)
CUDASIM_VEC2(unsigned char, uchar2, 2)
CUDASIM_VEC4(unsigned char, uchar4, 4)
CUDASIM_VEC4(signed char, char4, 4)
#undef CUDASIM_VEC2
#undef CUDASIM_VEC3
#undef CUDASIM_VEC4
struct uint3 { unsigned int x, y, z; };
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 v = {x, y, z}; return v; }
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* ---- built-in variables: the running fiber's, set by the scheduler at each switch --------- */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;

/* ---- barriers and warp intrinsics (cudasim.cpp) -------------------------------------------- */
enum cudasim_block_kind { CUDASIM_SYNC, CUDASIM_SYNC_COUNT, CUDASIM_SYNC_AND, CUDASIM_SYNC_OR };
enum cudasim_warp_kind {
    CUDASIM_SHFL_IDX, CUDASIM_SHFL_UP, CUDASIM_SHFL_DOWN, CUDASIM_SHFL_XOR, CUDASIM_BALLOT,
    CUDASIM_ANY, CUDASIM_ALL, CUDASIM_SYNCWARP, CUDASIM_REDUCE_ADD, CUDASIM_REDUCE_MIN,
    CUDASIM_REDUCE_MAX, CUDASIM_REDUCE_UMIN, CUDASIM_REDUCE_UMAX
};
int cudasim_block_op(int kind, int pred, const char *file, int line);
/* One warp-wide exchange: this lane gives `value` (up to 64 bits) and `arg` (the source lane,
 * delta or xor mask), waits for every lane of `mask`, and gets its result. Lanes that do not
 * exist (a partial last warp) or have returned leave the mask; reading one gives all-ones bits
 * (NaN, -1). */
unsigned long long cudasim_warp_op(int kind, unsigned mask, unsigned long long value, int arg,
                                   int width, const char *what, const char *file, int line);
void *cudasim_dyn_smem(void);
[[noreturn]] void cudasim_trap(const char *file, int line);
unsigned cudasim_activemask(void);

#define CUDASIM_HERE const std::source_location &loc_ = std::source_location::current()
#define CUDASIM_AT loc_.file_name(), (int)loc_.line()

static inline void __syncthreads(CUDASIM_HERE) { cudasim_block_op(CUDASIM_SYNC, 0, CUDASIM_AT); }
static inline int __syncthreads_count(int p, CUDASIM_HERE) { return cudasim_block_op(CUDASIM_SYNC_COUNT, p != 0, CUDASIM_AT); }
static inline int __syncthreads_and(int p, CUDASIM_HERE) { return cudasim_block_op(CUDASIM_SYNC_AND, p != 0, CUDASIM_AT); }
static inline int __syncthreads_or(int p, CUDASIM_HERE) { return cudasim_block_op(CUDASIM_SYNC_OR, p != 0, CUDASIM_AT); }
static inline void __syncwarp(unsigned mask = 0xffffffffu, CUDASIM_HERE)
{ cudasim_warp_op(CUDASIM_SYNCWARP, mask, 0, 0, 32, "__syncwarp", CUDASIM_AT); }
static inline unsigned __ballot_sync(unsigned mask, int p, CUDASIM_HERE)
{ return (unsigned)cudasim_warp_op(CUDASIM_BALLOT, mask, p != 0, 0, 32, "__ballot_sync", CUDASIM_AT); }
static inline int __any_sync(unsigned mask, int p, CUDASIM_HERE)
{ return (int)cudasim_warp_op(CUDASIM_ANY, mask, p != 0, 0, 32, "__any_sync", CUDASIM_AT); }
static inline int __all_sync(unsigned mask, int p, CUDASIM_HERE)
{ return (int)cudasim_warp_op(CUDASIM_ALL, mask, p != 0, 0, 32, "__all_sync", CUDASIM_AT); }
static inline unsigned __activemask(void) { return cudasim_activemask(); }
#define __trap() cudasim_trap(__FILE__, __LINE__)

template <class T> static inline T cudasim_shfl(int kind, const char *what, unsigned mask, T var,
                                                int arg, int width, const char *file, int line)
{
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                  "warp shuffles move 32- or 64-bit values");
    unsigned long long v = 0;
    memcpy(&v, &var, sizeof var);
    v = cudasim_warp_op(kind, mask, v, arg, width, what, file, line);
    T r;
    memcpy(&r, &v, sizeof r);
    return r;
}
template <class T> static inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32, CUDASIM_HERE)
{ return cudasim_shfl(CUDASIM_SHFL_IDX, "__shfl_sync", mask, var, srcLane, width, CUDASIM_AT); }
template <class T> static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, CUDASIM_HERE)
{ return cudasim_shfl(CUDASIM_SHFL_UP, "__shfl_up_sync", mask, var, (int)delta, width, CUDASIM_AT); }
template <class T> static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, CUDASIM_HERE)
{ return cudasim_shfl(CUDASIM_SHFL_DOWN, "__shfl_down_sync", mask, var, (int)delta, width, CUDASIM_AT); }
template <class T> static inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32, CUDASIM_HERE)
{ return cudasim_shfl(CUDASIM_SHFL_XOR, "__shfl_xor_sync", mask, var, laneMask, width, CUDASIM_AT); }

/* sm_80 warp reductions over int / unsigned */
static inline int __reduce_add_sync(unsigned mask, int v, CUDASIM_HERE)
{ return (int)cudasim_warp_op(CUDASIM_REDUCE_ADD, mask, (unsigned)v, 0, 32, "__reduce_add_sync", CUDASIM_AT); }
static inline unsigned __reduce_add_sync(unsigned mask, unsigned v, CUDASIM_HERE)
{ return (unsigned)cudasim_warp_op(CUDASIM_REDUCE_ADD, mask, v, 0, 32, "__reduce_add_sync", CUDASIM_AT); }
static inline int __reduce_min_sync(unsigned mask, int v, CUDASIM_HERE)
{ return (int)cudasim_warp_op(CUDASIM_REDUCE_MIN, mask, (unsigned)v, 0, 32, "__reduce_min_sync", CUDASIM_AT); }
static inline unsigned __reduce_min_sync(unsigned mask, unsigned v, CUDASIM_HERE)
{ return (unsigned)cudasim_warp_op(CUDASIM_REDUCE_UMIN, mask, v, 0, 32, "__reduce_min_sync", CUDASIM_AT); }
static inline int __reduce_max_sync(unsigned mask, int v, CUDASIM_HERE)
{ return (int)cudasim_warp_op(CUDASIM_REDUCE_MAX, mask, (unsigned)v, 0, 32, "__reduce_max_sync", CUDASIM_AT); }
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v, CUDASIM_HERE)
{ return (unsigned)cudasim_warp_op(CUDASIM_REDUCE_UMAX, mask, v, 0, 32, "__reduce_max_sync", CUDASIM_AT); }

/* ---- memory: atomics (fibers switch only at barriers, so a read-modify-write is atomic) ---- */
#define CUDASIM_ATOMIC(NAME, T, EXPR) \
    static inline T NAME(T *a, T v) { T old = *a; *a = (EXPR); return old; }
CUDASIM_ATOMIC(atomicAdd, float, old + v)
CUDASIM_ATOMIC(atomicAdd, double, old + v)
CUDASIM_ATOMIC(atomicAdd, int, (int)((unsigned)old + (unsigned)v))
CUDASIM_ATOMIC(atomicAdd, unsigned int, old + v)
CUDASIM_ATOMIC(atomicAdd, unsigned long long, old + v)
CUDASIM_ATOMIC(atomicSub, int, (int)((unsigned)old - (unsigned)v))
CUDASIM_ATOMIC(atomicSub, unsigned int, old - v)
CUDASIM_ATOMIC(atomicMax, int, old > v ? old : v)
CUDASIM_ATOMIC(atomicMax, unsigned int, old > v ? old : v)
CUDASIM_ATOMIC(atomicMax, long long, old > v ? old : v)
CUDASIM_ATOMIC(atomicMax, unsigned long long, old > v ? old : v)
CUDASIM_ATOMIC(atomicMin, int, old < v ? old : v)
CUDASIM_ATOMIC(atomicMin, unsigned int, old < v ? old : v)
CUDASIM_ATOMIC(atomicMin, long long, old < v ? old : v)
CUDASIM_ATOMIC(atomicMin, unsigned long long, old < v ? old : v)
CUDASIM_ATOMIC(atomicExch, int, v)
CUDASIM_ATOMIC(atomicExch, unsigned int, v)
CUDASIM_ATOMIC(atomicExch, unsigned long long, v)
CUDASIM_ATOMIC(atomicExch, float, v)
CUDASIM_ATOMIC(atomicAnd, int, old & v)
CUDASIM_ATOMIC(atomicAnd, unsigned int, old & v)
CUDASIM_ATOMIC(atomicOr, int, old | v)
CUDASIM_ATOMIC(atomicOr, unsigned int, old | v)
CUDASIM_ATOMIC(atomicXor, int, old ^ v)
CUDASIM_ATOMIC(atomicXor, unsigned int, old ^ v)
CUDASIM_ATOMIC(atomicInc, unsigned int, old >= v ? 0u : old + 1u)
CUDASIM_ATOMIC(atomicDec, unsigned int, (old == 0u || old > v) ? v : old - 1u)
#undef CUDASIM_ATOMIC
#define CUDASIM_CAS(T) static inline T atomicCAS(T *a, T cmp, T v) { T old = *a; if (old == cmp) *a = v; return old; }
CUDASIM_CAS(int)
CUDASIM_CAS(unsigned int)
CUDASIM_CAS(unsigned long long)
CUDASIM_CAS(unsigned short)
#undef CUDASIM_CAS
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }

/* ---- launching ---------------------------------------------------------------------------- */
namespace cudasim_detail {
struct PtrArg { int index; const void *p; };   /* a pointer argument of a launch (1-based) */
/* checks the configuration (cudaGetLastError reports a refusal) and the pointer arguments (a
 * pointer to host memory no allocation of the runtime covers aborts, naming the kernel and the
 * argument: the GPU faults on it; CUDASIM_HOST_POINTERS=1 lets such pointers through), then
 * runs every block */
void launch(const char *name, const char *file, int line, const void *func, dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream, const PtrArg *ptrs, int nptrs, void (*body)(void *),
            void *ctx);
template <class F> void call_body(void *f) { (*(F *)f)(); }
template <class T> void add_pointer(PtrArg *ptrs, int &n, int index, const T &v)
{
    if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>)
        ptrs[n++] = PtrArg{index, (const void *)v};
}
}

/* cudasim_launch(kernel, grid, block, smem, stream, args...): the macro records the kernel's
 * name and the launch site for the sim's messages. Arguments convert to the kernel's parameter
 * types once, as <<< >>> does; each thread receives its own copy. */
template <class... P, class... A>
void cudasim_launch_at(const char *name, const char *file, int line, void (*kernel)(P...),
                       dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    cudasim_detail::PtrArg ptrs[sizeof...(P) + 1] = {};
    int nptrs = 0;
    [&]<size_t... I>(std::index_sequence<I...>) {
        (cudasim_detail::add_pointer(ptrs, nptrs, (int)I + 1, std::get<I>(params)), ...);
    }(std::index_sequence_for<P...>{});
    auto body = [&]() { std::apply(kernel, params); };
    cudasim_detail::launch(name, file, line, (const void *)kernel, grid, block, smem, stream, ptrs,
                           nptrs, &cudasim_detail::call_body<decltype(body)>, &body);
}
#define cudasim_launch(kernel, ...) cudasim_launch_at(#kernel, __FILE__, __LINE__, kernel, __VA_ARGS__)

#endif
