/* tidal — cudasim's model of the WMMA API (CUDA C++ Programming Guide, "Warp Matrix Functions";
 * <mma.h>, namespace nvcuda::wmma) for the one shape tidal's kernels use: m16n16k16 with
 * __nv_bfloat16 or __half inputs and a float accumulator (sm_80+).
 *
 * Included by a kernel source under TD_CUDASIM in place of <mma.h> / <cuda_bf16.h> /
 * <cuda_fp16.h> (src/backend/cuda/attention_mma.cu), and by its test
 * (tests/cudasim/test_cudasim_wmma.cpp). What it models:
 *   - __nv_bfloat16 and __half as 16-bit storage types (bits only: tidal rounds with its own bit
 *     arithmetic, round.cuh, and writes codes; a kernel reinterprets a uint16_t array as them);
 *   - fragment<Use, 16, 16, 16, T, Layout>: the element-to-lane mapping of a real fragment is
 *     unspecified, so here every lane holds the whole tile, row-major in x[] (num_elements 256;
 *     on a GPU 8 for the accumulator). A kernel may therefore only do what is correct under any
 *     mapping: uniform element-wise work on x[], or work indexed by a second fragment of the same
 *     type loaded from memory (a fragment of row indices gives each element's row, in the sim as
 *     on a GPU, since both follow the one mapping of that fragment type);
 *   - load_matrix_sync / store_matrix_sync with ldm in elements, row- or column-major; fill_fragment;
 *   - mma_sync(d, a, b, c): d[i][j] = fp32(c[i][j] + sum_k a[i][k] b[k][j]), the products exact
 *     (16-bit significands: 16 (bf16) or 22 (fp16) bits, exact in double), summed in double in k
 *     order starting from c, one rounding to fp32 (nearest even) at the end. The double sum is
 *     exact unless the terms span more than 2^29 in magnitude. A tensor core sums the same exact
 *     products in its own order with its own internal precision (not IEEE; truncation inside the
 *     adder tree on Ampere/Hopper): results may differ from the model's in the last bits of fp32;
 *     kernels on it are tested with tolerances far above that (units of bf16/fp16).
 * Warp-synchronous, as the .sync.aligned instructions are: every wmma call is a collective of
 * all 32 lanes at the same call site. A call with a lane missing (returned, or a block that is
 * not a multiple of 32 threads), lanes at different wmma calls (divergent code) or lanes whose
 * fragments differ (each lane reads memory when it reaches the call, so a tile read before
 * other lanes' writes to it — a missing __syncwarp / __syncthreads — gives lanes different
 * copies) aborts with a message naming the call site. The exchange goes through cudasim's warp
 * reductions, so the fibers switch there as at any warp intrinsic. Pointers must be 32-byte
 * aligned and ldm a multiple of 8 (16-bit types) or 4 (float): CUDA's rules, checked.
 * Not modelled: other shapes, tf32 / int / fp8 / double fragments, the mma.sync PTX forms. */
#ifndef TIDAL_CUDASIM_WMMA_H
#define TIDAL_CUDASIM_WMMA_H

#include "cudasim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <source_location>
#include <type_traits>

struct __align__(2) __nv_bfloat16 { unsigned short __x; };
struct __align__(2) __half { unsigned short __x; };

namespace cudasim_wmma {

/* exact values of the 16-bit codes (independent of tidal's round.cuh) */
static inline double decode(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline double decode(__half h)
{
    int s = h.__x >> 15, e = (h.__x >> 10) & 31, m = h.__x & 1023;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(1024 + m), e - 25);
    return s ? -v : v;
}
static inline double decode(float f) { return f; }

static inline unsigned fnv(const void *p, size_t n, unsigned h = 2166136261u)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

/* a fragment's bits (a multiple of 8 bytes), 8 bytes a step */
static inline unsigned frag_hash(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return (unsigned)(h ^ (h >> 32));
}

[[noreturn]] static inline void fail(const char *op, const std::source_location &loc, const char *why)
{
    fprintf(stderr, "cudasim: wmma::%s at %s:%d by thread (%u,%u,%u) of block (%u,%u,%u): %s\n", op,
            loc.file_name(), (int)loc.line(), threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y,
            blockIdx.z, why);
    fflush(stderr);
    abort();
}

/* the collective: every lane of the warp at the same call, holding the same fragment */
static inline void sync_point(const char *op, const void *frag, size_t bytes, const std::source_location &loc)
{
    if (__activemask() != 0xffffffffu)
        fail(op, loc, "not every lane of the warp takes part (a lane returned, or the block is not a "
                      "multiple of 32 threads): wmma calls are .sync.aligned, for all 32 lanes");
    unsigned site = fnv(loc.file_name(), strlen(loc.file_name()), (unsigned)loc.line() * 2654435761u);
    site = fnv(op, strlen(op), site);
    if (__reduce_max_sync(0xffffffffu, site) != site)
        fail(op, loc, "lanes of the warp are at different wmma calls (divergent code)");
    if (__activemask() != 0xffffffffu)   /* lanes that returned while the others waited here */
        fail(op, loc, "not every lane of the warp takes part (lanes returned instead of reaching "
                      "the call): wmma calls are .sync.aligned, for all 32 lanes");
    unsigned h = frag_hash(frag, bytes);
    unsigned lo = __reduce_min_sync(0xffffffffu, h), hi = __reduce_max_sync(0xffffffffu, h);
    if (lo != hi)
        fail(op, loc, "the lanes' fragments differ: memory was read before other lanes' writes to it "
                      "(a missing __syncwarp / __syncthreads?)");
}

static inline void check_ptr(const char *op, const void *p, unsigned ldm, unsigned mult,
                             const std::source_location &loc)
{
    if ((uintptr_t)p % 32) fail(op, loc, "the pointer is not 32-byte (256-bit) aligned");
    if (ldm % mult || ldm < 16) fail(op, loc, "ldm is not a multiple of 16 bytes or is under 16 elements");
}

} // namespace cudasim_wmma

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int m, int n, int k, class T, class Layout = void>
class fragment {
    static_assert(m == 16 && n == 16 && k == 16, "cudasim models wmma's m16n16k16 only");
    static_assert(std::is_same_v<Use, accumulator>
                      ? std::is_same_v<T, float> && std::is_void_v<Layout>
                      : (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) &&
                            (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                  "cudasim models bf16 / fp16 matrix_a, matrix_b (row_major or col_major) and float accumulators");
public:
    enum { num_elements = 256 };   /* the whole tile in every lane, row-major (a GPU: 8 a lane) */
    T x[256];
};

template <class Use, class T, class L>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, const T &v,
                                 CUDASIM_HERE)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
    cudasim_wmma::sync_point("fill_fragment", f.x, sizeof f.x, loc_);
}

/* matrix_a is (row, k), matrix_b (k, col); element (r, c) of the tile at p[r ldm + c]
 * (row_major) or p[c ldm + r] (col_major) */
template <class Use, class T, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm,
                                    CUDASIM_HERE)
{
    static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load takes a layout_t");
    cudasim_wmma::check_ptr("load_matrix_sync", p, ldm, 8, loc_);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = std::is_same_v<L, row_major> ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    cudasim_wmma::sync_point("load_matrix_sync", f.x, sizeof f.x, loc_);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout, CUDASIM_HERE)
{
    cudasim_wmma::check_ptr("load_matrix_sync", p, ldm, 4, loc_);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    cudasim_wmma::sync_point("load_matrix_sync", f.x, sizeof f.x, loc_);
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t layout, CUDASIM_HERE)
{
    cudasim_wmma::check_ptr("store_matrix_sync", p, ldm, 4, loc_);
    cudasim_wmma::sync_point("store_matrix_sync", f.x, sizeof f.x, loc_);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[r * 16 + c];
}

namespace detail {
/* The last product of each warp, kept so that the 31 other lanes copy it rather than redo it
 * (the same operands: sync_point checks the lanes agree). Keyed by the operands' bits. */
struct memo { int valid; unsigned tag; unsigned char a[512], b[512]; float c[256], d[256]; };
static inline memo &memo_of_warp(void)
{
    static memo m[32];
    unsigned lin = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return m[(lin / 32) % 32];
}
}

template <class T, class La, class Lb>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, La> &a,
                            const fragment<matrix_b, 16, 16, 16, T, Lb> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c, CUDASIM_HERE)
{
    static_assert(sizeof a.x == 512 && sizeof b.x == 512, "16-bit fragments");
    detail::memo &mo = detail::memo_of_warp();
    const unsigned tag = std::is_same_v<T, __half> ? 2u : 1u;
    if (!(mo.valid && mo.tag == tag && !memcmp(mo.a, a.x, 512) && !memcmp(mo.b, b.x, 512) &&
          !memcmp(mo.c, c.x, sizeof mo.c))) {
        memcpy(mo.a, a.x, 512);
        memcpy(mo.b, b.x, 512);
        memcpy(mo.c, c.x, sizeof mo.c);
        mo.tag = tag;
        double av[256], bv[256];
        for (int i = 0; i < 256; i++) av[i] = cudasim_wmma::decode(a.x[i]), bv[i] = cudasim_wmma::decode(b.x[i]);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                double s = c.x[i * 16 + j];
                for (int k = 0; k < 16; k++) s += av[i * 16 + k] * bv[k * 16 + j];
                mo.d[i * 16 + j] = (float)s;
            }
        mo.valid = 1;
    }
    memcpy(d.x, mo.d, sizeof d.x);   /* after reading c: d may be c */
    cudasim_wmma::sync_point("mma_sync", d.x, sizeof d.x, loc_);
}

} // namespace wmma
} // namespace nvcuda

#endif
