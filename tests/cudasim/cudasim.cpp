/* tidal — cudasim's execution engine: a launch's blocks run one after another; a block's threads
 * are fibers that run until they reach a barrier or return. The scheduler (on the
 * launching thread's own stack) runs the runnable fibers in the order CUDASIM_ORDER names; the
 * last thread to arrive at a barrier releases the others, and the scheduler starts a new pass in
 * that order, so "forward" means: after each barrier, threads resume in increasing index.
 *
 * Barrier semantics (CUDA's, made strict so that a kernel correct here is correct on a GPU):
 *   __syncthreads   every thread of the block, at the same call site; a thread that returned
 *                   while another waits (or waits while another returned) is a deadlock.
 *   warp intrinsics every lane named in the mask that has not returned (PTX: "all non-exited
 *                   threads in membermask"; lanes past blockDim leave the mask too), at the same
 *                   intrinsic with the same mask; the calling lane must be in its mask. Shuffles
 *                   follow PTX shfl.sync: the source lane is computed within the lane's `width`
 *                   segment; an out-of-segment source gives the lane's own value; a source that
 *                   is not taking part (outside the mask, returned, absent) gives all-ones bits
 *                   (undefined in CUDA); votes count the lanes taking part.
 * Anything else that cannot complete aborts with the kernel's name, launch site and block.
 * Under AddressSanitizer every switch is announced (__sanitizer_start/finish_switch_fiber).
 *
 * A switch is ~20 instructions on x86-64 (below); elsewhere, or with -DCUDASIM_UCONTEXT, it is
 * ucontext's swapcontext, which also saves the signal mask: a system call per switch, ~30x
 * slower (a launch of 2^20 one-line threads: 0.9 s with swapcontext). */
#include "cudasim.h"

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <vector>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_ASAN 1
#else
#define CUDASIM_ASAN 0
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

/* ---- contexts: a saved stack pointer (x86-64) or a ucontext ------------------------------- */
#if defined(__x86_64__) && !defined(CUDASIM_UCONTEXT)
/* cudasim_switch(&from_sp, to_sp): pushes the callee-saved registers of the System V ABI (rbx,
 * rbp, r12-r15) and the MXCSR / x87 control words on the current stack, saves the stack pointer,
 * and pops the same from the other stack. A new stack is laid out as if it had switched away
 * just before entering its entry function. */
extern "C" void cudasim_switch(void **from_sp, void *to_sp);
asm(R"(
    .text
    .p2align 4
    .globl cudasim_switch
    .hidden cudasim_switch
    .type cudasim_switch, @function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch, .-cudasim_switch
)");
struct Context { void *sp = nullptr; };
inline void ctx_switch(Context *from, Context *to) { cudasim_switch(&from->sp, to->sp); }
void ctx_make(Context *c, char *stack, size_t size, void (*entry)(void))
{
    uint64_t *p = (uint64_t *)(((uintptr_t)stack + size) & ~(uintptr_t)15);
    *--p = 0;                        /* entry's return address (it never returns): rsp = 8 mod 16 */
    *--p = (uint64_t)entry;          /* where cudasim_switch's ret goes */
    for (int i = 0; i < 6; i++) *--p = 0;
    uint32_t mxcsr;
    uint16_t fcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
    *--p = (uint64_t)mxcsr | (uint64_t)fcw << 32;
    c->sp = p;
}
void ctx_init(Context *) {}
#else
#include <ucontext.h>
struct Context { ucontext_t uc; };
inline void ctx_switch(Context *from, Context *to) { swapcontext(&from->uc, &to->uc); }
void ctx_make(Context *c, char *stack, size_t size, void (*entry)(void))
{
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
void ctx_init(Context *c) { getcontext(&c->uc); }
#endif

enum { F_RUN, F_BLOCK, F_WARP, F_DONE };

struct Fiber {
    Context ctx;
    char *stack = nullptr;           /* usable stack (a PROT_NONE guard page lies below) */
    void *fake_stack = nullptr;      /* ASan's fake stack of this fiber while it is switched out */
    char *dirty = nullptr;           /* ASan: [dirty, top) may hold poisoned frames (null: none) */
    int state = F_DONE;
    int lin = 0;                     /* linear thread index in the block */
    uint3 tid = {0, 0, 0};
    /* the barrier it waits at */
    int kind = 0, arg = 0, width = 32;
    unsigned mask = 0;
    unsigned long long value = 0, result = 0;
    const char *what = "", *file = "";
    int line = 0;
};

struct Launch {
    std::string name;                /* the kernel expression, outer parentheses removed */
    const char *file = "";
    int line = 0;
    dim3 grid, block;
    size_t smem = 0;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    int nthreads = 0;
    unsigned char *dyn = nullptr;
};

enum { ORDER_FORWARD, ORDER_REVERSE, ORDER_SHUFFLE };

std::mutex launch_mutex;
Launch L;
/* pool[i] runs linear thread i; grows, stacks reused, never freed (a plain array: no exit-time
 * destructor hides the fibers from LeakSanitizer) */
Fiber *pool[1024];
int pool_n;
size_t stack_bytes;
thread_local Fiber *cur;             /* the running fiber, null on the scheduler */
Context sched_ctx;
void *sched_fake;
const void *sched_bottom;
size_t sched_size;
int n_done, n_block_wait;
/* per warp of the block: lanes that returned, lanes waiting at a warp intrinsic (kept with the
 * states, so a warp op tests its lanes with a mask instead of a loop) */
unsigned done_bits[1024 / 32], warp_bits[1024 / 32];
/* the runnable threads by their place in the pass's order (pos_of[lin]): a pass visits the set
 * bits in increasing place, as a walk over the order that skips the others would, without the
 * walk (a block of 256 threads doing warp shuffles restarts its pass at every exchange) */
uint64_t run_bits[1024 / 64];
int pos_of[1024];

void set_state(Fiber *f, int st)
{
    f->state = st;
    const int at = pos_of[f->lin];
    if (st == F_RUN) run_bits[at >> 6] |= 1ull << (at & 63);
    else run_bits[at >> 6] &= ~(1ull << (at & 63));
}

/* the first runnable place at or after `from` among n, or -1 */
int next_run(int from, int n)
{
    for (int w = from >> 6; w * 64 < n; w++) {
        uint64_t m = run_bits[w];
        if (w == from >> 6) m &= ~0ull << (from & 63);
        if (m) {
            int at = w * 64 + __builtin_ctzll(m);
            return at < n ? at : -1;
        }
    }
    return -1;
}
bool restart;
int order_mode;
unsigned long long rng;

std::string thread_name(const Fiber *f)
{
    char b[96];
    snprintf(b, sizeof b, "thread (%u,%u,%u) [warp %d lane %d]", f->tid.x, f->tid.y, f->tid.z,
             f->lin / 32, f->lin % 32);
    return b;
}

std::string site(const Fiber *f)
{
    char b[512];
    snprintf(b, sizeof b, "%s (%s:%d)", f->what, f->file, f->line);
    return b;
}

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudasim: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  in kernel %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>> launched at %s:%d, block (%u,%u,%u)\n",
            L.name.c_str(), L.grid.x, L.grid.y, L.grid.z, L.block.x, L.block.y, L.block.z, L.smem,
            L.file, L.line, blockIdx.x, blockIdx.y, blockIdx.z);
    fflush(stderr);
    abort();
}

Fiber *need_fiber(const char *what)
{
    if (!cur) {
        fprintf(stderr, "cudasim: %s called outside a kernel\n", what);
        abort();
    }
    return cur;
}

/* ---- switching ---------------------------------------------------------------------------- */

inline void switch_start(void **fake, const void *bottom, size_t size)
{
#if CUDASIM_ASAN
    __sanitizer_start_switch_fiber(fake, bottom, size);
#else
    (void)fake, (void)bottom, (void)size;
#endif
}

inline void switch_finish(void *fake, const void **bottom, size_t *size)
{
#if CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
    (void)fake, (void)bottom, (void)size;
#endif
}

void run_fiber(Fiber *f)
{
    cur = f;
    threadIdx = f->tid;
    switch_start(&sched_fake, f->stack, stack_bytes);
    ctx_switch(&sched_ctx, &f->ctx);
    switch_finish(sched_fake, nullptr, nullptr);
    cur = nullptr;
}

/* back to the scheduler; returns when the scheduler runs this fiber again */
void to_scheduler(bool finished)
{
    Fiber *f = cur;
#if CUDASIM_ASAN
    /* A finished thread leaves only the frames still live now (fiber_main, thread_exit, this one)
     * poisoned: every deeper frame returned and unpoisoned itself. So the next block clears this
     * top of the stack, not the whole stack (256 KB a thread a block was most of the time of the
     * sim tests under ASan); 4 KB below this frame covers the switch and ASan's own calls. */
    if (finished) {
        char *low = (char *)__builtin_frame_address(0) - 4096;
        f->dirty = low > f->stack ? low : f->stack;
    }
#endif
    switch_start(finished ? nullptr : &f->fake_stack, sched_bottom, sched_size);
    ctx_switch(&f->ctx, &sched_ctx);
    switch_finish(f->fake_stack, &sched_bottom, &sched_size);
}

void try_complete_warp(Fiber *f, int w0);

void thread_exit(void)
{
    Fiber *f = cur;
    set_state(f, F_DONE);
    done_bits[f->lin >> 5] |= 1u << (f->lin & 31);
    n_done++;
    if (n_block_wait > 0)
        for (int i = 0; i < L.nthreads; i++)
            if (pool[i]->state == F_BLOCK)
                die("deadlock: %s returned while %s waits at %s: the barrier can never complete "
                    "(__syncthreads after an early return, or in divergent code)",
                    thread_name(f).c_str(), thread_name(pool[i]).c_str(), site(pool[i]).c_str());
    /* lanes waiting for this one at a warp intrinsic now wait for one lane fewer */
    int w0 = f->lin & ~31, lane = f->lin & 31;
    for (int i = w0; i < w0 + 32 && i < L.nthreads; i++)
        if (pool[i]->state == F_WARP && (pool[i]->mask >> lane & 1u)) try_complete_warp(pool[i], w0);
    to_scheduler(true);
    abort(); /* a finished fiber is never resumed */
}

void fiber_main(void)
{
    switch_finish(nullptr, &sched_bottom, &sched_size);
    L.body(L.ctx);
    thread_exit();
}

/* ---- order ------------------------------------------------------------------------------- */

unsigned long long next_random(void)
{
    unsigned long long z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void read_order(void)
{
    const char *s = getenv("CUDASIM_ORDER");
    order_mode = ORDER_FORWARD;
    rng = 1;
    if (!s || !*s || !strcmp(s, "forward")) return;
    if (!strcmp(s, "reverse")) { order_mode = ORDER_REVERSE; return; }
    if (!strncmp(s, "shuffle", 7) && (s[7] == 0 || s[7] == ':')) {
        order_mode = ORDER_SHUFFLE;
        char *end = nullptr;
        if (s[7] == ':') rng = strtoull(s + 8, &end, 10);
        if (s[7] == 0 || (end != s + 8 && *end == 0)) return;
    }
    fprintf(stderr, "cudasim: CUDASIM_ORDER=%s: expected forward, reverse, shuffle or shuffle:SEED\n", s);
    exit(2);
}

/* perm = 0..n-1 in the order's sense (a fresh permutation each call when shuffling) */
void make_order(std::vector<int> &perm, int n)
{
    perm.resize(n);
    for (int i = 0; i < n; i++) perm[i] = order_mode == ORDER_REVERSE ? n - 1 - i : i;
    if (order_mode == ORDER_SHUFFLE)
        for (int i = n - 1; i > 0; i--) std::swap(perm[i], perm[next_random() % (unsigned)(i + 1)]);
}

/* ---- fibers ------------------------------------------------------------------------------ */

void grow_pool(int n)
{
    if (!stack_bytes) {
        stack_bytes = cudasim_detail::env_bytes("CUDASIM_STACK", CUDASIM_ASAN ? 256 << 10 : 64 << 10);
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        stack_bytes = (stack_bytes + page - 1) / page * page;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    while (pool_n < n) {
        void *m = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED || mprotect(m, page, PROT_NONE)) {
            perror("cudasim: fiber stack");
            abort();
        }
        Fiber *f = new Fiber;
        f->stack = (char *)m + page;
        ctx_init(&f->ctx);
        pool[pool_n++] = f;
    }
}

void run_block(uint3 bid, std::vector<int> &perm)
{
    blockIdx = bid;
    if (L.smem) memset(L.dyn, 0xFF, L.smem);
    const dim3 b = L.block;
    for (int i = 0; i < L.nthreads; i++) {
        Fiber *f = pool[i];
        f->state = F_RUN;
        f->lin = i;
        f->tid = uint3{i % b.x, i / b.x % b.y, i / (b.x * b.y)};
        f->fake_stack = nullptr;
#if CUDASIM_ASAN
        if (f->dirty) ASAN_UNPOISON_MEMORY_REGION(f->dirty, (size_t)(f->stack + stack_bytes - f->dirty));
        f->dirty = nullptr;
#endif
        ctx_make(&f->ctx, f->stack, stack_bytes, fiber_main);
    }
    n_done = n_block_wait = 0;
    memset(done_bits, 0, sizeof done_bits);
    memset(warp_bits, 0, sizeof warp_bits);
    bool fresh = true;
    while (n_done < L.nthreads) {
        if (order_mode == ORDER_SHUFFLE || (int)perm.size() != L.nthreads) make_order(perm, L.nthreads), fresh = true;
        if (fresh) {   /* the places of a new order: the runnable set again */
            memset(run_bits, 0, sizeof run_bits);
            for (int at = 0; at < L.nthreads; at++) pos_of[perm[at]] = at;
            for (int i = 0; i < L.nthreads; i++) set_state(pool[i], pool[i]->state);
            fresh = false;
        }
        restart = false;
        bool ran = false;
        for (int at = next_run(0, L.nthreads); at >= 0; at = next_run(at + 1, L.nthreads)) {
            run_fiber(pool[perm[at]]);
            ran = true;
            if (restart) break;
        }
        if (!ran) {
            std::string msg;
            int shown = 0;
            for (int i = 0; i < L.nthreads && shown < 4; i++)
                if (pool[i]->state == F_BLOCK || pool[i]->state == F_WARP)
                    msg += "\n  " + thread_name(pool[i]) + " waits at " + site(pool[i]), shown++;
            die("deadlock: no thread can run (%d of %d returned, %d at __syncthreads); for example:%s",
                n_done, L.nthreads, n_block_wait, msg.c_str());
        }
    }
}

} // namespace

/* ---- barriers ----------------------------------------------------------------------------- */

int cudasim_block_op(int kind, int pred, const char *file, int line)
{
    static const char *names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
    Fiber *f = need_fiber(names[kind]);
    f->kind = kind, f->value = (unsigned)pred, f->what = names[kind], f->file = file, f->line = line;
    set_state(f, F_BLOCK);
    n_block_wait++;
    if (n_done > 0)
        for (int i = 0; i < L.nthreads; i++)
            if (pool[i]->state == F_DONE)
                die("deadlock: %s waits at %s but %s has returned: the barrier can never complete "
                    "(__syncthreads after an early return, or in divergent code)",
                    thread_name(f).c_str(), site(f).c_str(), thread_name(pool[i]).c_str());
    if (n_block_wait == L.nthreads) {
        int count = 0;
        for (int i = 0; i < L.nthreads; i++) {
            Fiber *g = pool[i];
            if (g->kind != kind || g->line != line || strcmp(g->file, file))
                die("__syncthreads in divergent code: %s waits at %s, %s at %s", thread_name(f).c_str(),
                    site(f).c_str(), thread_name(g).c_str(), site(g).c_str());
            count += (int)g->value;
        }
        int r = kind == CUDASIM_SYNC_COUNT ? count : kind == CUDASIM_SYNC_AND ? count == L.nthreads
              : kind == CUDASIM_SYNC_OR ? count > 0 : 0;
        for (int i = 0; i < L.nthreads; i++) pool[i]->result = (unsigned)r, set_state(pool[i], F_RUN);
        n_block_wait = 0;
        restart = true;
    }
    to_scheduler(false);
    return (int)cur->result;
}

namespace {

bool is_shuffle(int kind) { return kind <= CUDASIM_SHFL_XOR; }

/* the source lane of lane l, as PTX defines shfl.sync (cuda's headers pass c = (32 - width) << 8,
 * | 0x1f except for .up): b[4:0] is used, the segment is [l & ~(width-1), + width - 1], and a
 * source past the segment's end (.down .bfly .idx) or before its start (.up) is l itself */
int shuffle_source(int kind, int l, int arg, int width)
{
    const int b = arg & 31, seg = l & ~(width - 1), last = seg + width - 1;
    int j;
    switch (kind) {
    case CUDASIM_SHFL_IDX: return seg | (b & (width - 1));
    case CUDASIM_SHFL_UP: j = l - b; return j >= seg ? j : l;
    case CUDASIM_SHFL_DOWN: j = l + b; return j <= last ? j : l;
    default: j = l ^ b; return j <= last ? j : l;
    }
}

/* the lanes of the warp at w0 that exist and have not returned */
unsigned live_lanes(int w0)
{
    const int n = std::min(32, L.nthreads - w0);
    return (n == 32 ? ~0u : (1u << n) - 1u) & ~done_bits[w0 >> 5];
}

void complete_warp(Fiber *f, int w0, unsigned mask, unsigned live)
{
    unsigned long long bits = 0, sum = 0;
    int imin = INT_MAX, imax = INT_MIN;
    unsigned umin = UINT_MAX, umax = 0;
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1u)) continue;
        Fiber *g = pool[w0 + l];
        if (g->kind != f->kind || (g->mask & live) != mask)
            die("lanes of warp %d disagree: %s is at %s with mask 0x%08x, %s at %s with mask 0x%08x",
                w0 / 32, thread_name(f).c_str(), site(f).c_str(), f->mask, thread_name(g).c_str(),
                site(g).c_str(), g->mask);
        unsigned v = (unsigned)g->value;
        bits |= (unsigned long long)(g->value != 0) << l;
        sum += v;
        imin = std::min(imin, (int)v), imax = std::max(imax, (int)v);
        umin = std::min(umin, v), umax = std::max(umax, v);
    }
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1u)) continue;
        Fiber *g = pool[w0 + l];
        unsigned long long r = 0;
        switch (g->kind) {
        case CUDASIM_BALLOT: r = bits; break;
        case CUDASIM_ANY: r = bits != 0; break;
        case CUDASIM_ALL: r = bits == mask; break;
        case CUDASIM_REDUCE_ADD: r = (unsigned)sum; break;
        case CUDASIM_REDUCE_MIN: r = (unsigned)imin; break;
        case CUDASIM_REDUCE_MAX: r = (unsigned)imax; break;
        case CUDASIM_REDUCE_UMIN: r = umin; break;
        case CUDASIM_REDUCE_UMAX: r = umax; break;
        case CUDASIM_SYNCWARP: break;
        default: {
            int j = shuffle_source(g->kind, l, g->arg, g->width);
            r = j == l ? g->value : (mask >> j & 1u) ? pool[w0 + j]->value : ~0ull;
        }
        }
        g->result = r;
        set_state(g, F_RUN);
    }
    warp_bits[w0 >> 5] &= ~mask;
    restart = true;
}

/* completes f's exchange when every live lane of its mask is waiting at a warp intrinsic */
void try_complete_warp(Fiber *f, int w0)
{
    const unsigned live = live_lanes(w0), mask = f->mask & live;
    if (mask & ~warp_bits[w0 >> 5]) return;
    complete_warp(f, w0, mask, live);
}

} // namespace

unsigned long long cudasim_warp_op(int kind, unsigned mask, unsigned long long value, int arg,
                                   int width, const char *what, const char *file, int line)
{
    Fiber *f = need_fiber(what);
    const int lane = f->lin & 31, w0 = f->lin & ~31;
    f->what = what, f->file = file, f->line = line;
    if (!(mask >> lane & 1u))
        die("%s at %s calls with mask 0x%08x, which does not name its own lane %d",
            thread_name(f).c_str(), site(f).c_str(), mask, lane);
    if (is_shuffle(kind) && (width < 1 || width > 32 || (width & (width - 1))))
        die("%s at %s: width %d is not a power of 2 from 1 to 32", thread_name(f).c_str(),
            site(f).c_str(), width);
    const int n = std::min(32, L.nthreads - w0);
    mask &= n == 32 ? ~0u : (1u << n) - 1u;
    f->kind = kind, f->mask = mask, f->value = value, f->arg = arg, f->width = width;
    set_state(f, F_WARP);
    warp_bits[w0 >> 5] |= 1u << lane;
    try_complete_warp(f, w0);
    to_scheduler(false);
    return cur->result;
}

unsigned cudasim_activemask(void)
{
    return live_lanes(need_fiber("__activemask")->lin & ~31);
}

void *cudasim_dyn_smem(void)
{
    need_fiber("dynamic shared memory (TD_DYN_SMEM)");
    return L.dyn;
}

void cudasim_trap(const char *file, int line)
{
    Fiber *f = need_fiber("__trap");
    die("__trap() at %s:%d by %s", file, line, thread_name(f).c_str());
}

/* ---- launch ------------------------------------------------------------------------------- */

void cudasim_detail::launch(const char *name, const char *file, int line, const void *func,
                            dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            const PtrArg *ptrs, int nptrs, void (*body)(void *), void *ctx)
{
    if (cur) die("kernel %s launched from inside a kernel (dynamic parallelism is not simulated)", name);
    cudaError_t e = check_launch(func, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, stream);
    if (e != cudaSuccess) {
        set_error(e);
        return;
    }
    const char *lax = getenv("CUDASIM_HOST_POINTERS");
    for (int i = 0; i < nptrs && !(lax && !strcmp(lax, "1")); i++)
        if (!device_addressable(ptrs[i].p)) {
            fprintf(stderr, "cudasim: kernel %s launched at %s:%d: argument %d is %p, host memory that no "
                    "cudaMalloc / cudaMallocManaged / cudaMallocHost / cudaHostRegister covers: a GPU "
                    "faults on it (cudaErrorIllegalAddress). Pass device memory (tdc_in / tdc_out / "
                    "tdc_const stage host arrays), or set CUDASIM_HOST_POINTERS=1 if the kernel never "
                    "reads it\n", name, file, line, ptrs[i].index, ptrs[i].p);
            abort();
        }
    std::lock_guard<std::mutex> lock(launch_mutex);
    std::string n = name;
    while (n.size() >= 2 && n.front() == '(' && n.back() == ')') n = n.substr(1, n.size() - 2);
    L.name = n, L.file = file, L.line = line, L.grid = grid, L.block = block, L.smem = smem;
    L.body = body, L.ctx = ctx;
    L.nthreads = (int)(block.x * block.y * block.z);
    void *dyn = nullptr;
    if (posix_memalign(&dyn, 16, smem)) {
        perror("cudasim: dynamic shared memory");
        abort();
    }
    L.dyn = (unsigned char *)dyn;
    read_order();
    grow_pool(L.nthreads);
    gridDim = grid, blockDim = block;
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    std::vector<int> perm, bperm;
    /* block order: forward, reverse, or one permutation of the linear block index (a shuffled
     * grid of more than 2^24 blocks runs forward rather than holding a permutation that long) */
    const bool shuffle = order_mode == ORDER_SHUFFLE && nblocks <= (1u << 24);
    DeviceAccess access;   /* the kernel runs as the device: device memory open (CUDASIM_DEVICE_GUARD) */
    if (shuffle) make_order(bperm, (int)nblocks);
    for (unsigned long long k = 0; k < nblocks; k++) {
        unsigned long long b = shuffle ? (unsigned long long)bperm[k]
                             : order_mode == ORDER_REVERSE ? nblocks - 1 - k : k;
        run_block(uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                        (unsigned)(b / ((unsigned long long)grid.x * grid.y))}, perm);
    }
    free(L.dyn);
    L.dyn = nullptr;
}
