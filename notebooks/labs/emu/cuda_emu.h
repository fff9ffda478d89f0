// cuda_emu.h -- run a CUDA kernel's device code on the CPU, for the labs' numeric feedback without a GPU.
//
// The kernel source is compiled as host C++ (g++ -std=c++17) after this header. It provides what the
// lab kernels use: threadIdx / blockIdx / blockDim / gridDim, __device__ / __global__ / __shared__ /
// __forceinline__, float4, the math intrinsics, __syncthreads, __syncwarp and the warp shuffles
// (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync), __ballot_sync, __any_sync, __all_sync.
//
// How it runs: emu::launch(grid, block, body) runs the blocks one after another. Inside a block,
// every CUDA thread is a cooperative fiber (ucontext) with its own stack, all on one OS thread. A fiber
// runs until it reaches a synchronising call, then parks there. When every fiber is parked:
//   * a warp collective (shuffle, __syncwarp, vote) completes once every lane named in its mask is
//     parked at the same kind of collective with the same mask; then each lane gets its result, exactly
//     as CUDA defines it (e.g. __shfl_xor_sync: lane i reads lane i ^ laneMask's value);
//   * __syncthreads completes once every thread of the block that has not exited is parked there.
// If nothing can complete, the threads diverged (a shuffle that not every lane of its mask reaches, or
// a __syncthreads that some threads skip): on a GPU that hangs or is undefined; here launch() stops and
// describes where each lane of the first stuck warp is. `__shared__` variables are function statics,
// which is what shared memory is while one block runs at a time.
//
// Between two synchronising calls a lane runs alone, so code that reads another lane's shared-memory
// writes without a barrier (__syncwarp / __syncthreads) sees stale values here, as it may on a GPU.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <string>
#include <vector>

// ------------------------------------------------------------------------------ keywords
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __constant__ static

// ------------------------------------------------------------------------------ vector types
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// ------------------------------------------------------------------------------ math
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return expf(x); }
inline float __exp2f(float x) { return exp2f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline void __trap() { abort(); }
#define warpSize 32

// ------------------------------------------------------------------------------ the fiber scheduler
// Switching fibers: on x86-64 Linux a 14-instruction switch of the callee-saved registers (ucontext's
// swapcontext also saves the signal mask, a system call per switch, several times slower); elsewhere,
// or with -DEMU_USE_UCONTEXT, POSIX ucontext.
#if defined(__x86_64__) && defined(__linux__) && !defined(EMU_USE_UCONTEXT)
#define EMU_FAST_SWITCH 1
// emu_fast_switch(save, to): push the callee-saved registers, store rsp in *save, load `to`, pop, return there
asm(R"(
    .text
    .p2align 4
    .type emu_fast_switch, @function
emu_fast_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fast_switch, .-emu_fast_switch
)");
extern "C" void emu_fast_switch(void** save, void* to) __attribute__((visibility("hidden")));
#else
#define EMU_FAST_SWITCH 0
#endif

namespace emu {

enum State { READY, AT_WARP, AT_BLOCK, DONE };
enum Op { OP_SHFL, OP_XOR, OP_DOWN, OP_UP, OP_SYNCWARP, OP_BALLOT, OP_ANY, OP_ALL };
inline const char* op_name(int op) {
    static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
                                  "__syncwarp", "__ballot_sync", "__any_sync", "__all_sync"};
    return names[op];
}

struct Thread {
    ucontext_t ctx;   // ucontext path
    void* sp = nullptr;  // fast path: the saved stack pointer
    uint3 tid;
    int state = READY;
    int op = 0, arg = 0, width = 32;
    unsigned mask = 0;
    uint64_t val = 0, result = 0;
    char* stack = nullptr;  // STACK_BYTES, from the pool below (not zeroed: cheap to set up)
};

inline Thread* g_cur = nullptr;
inline ucontext_t g_sched;
inline void* g_sched_sp = nullptr;
inline uint3 g_block_idx;
inline dim3 g_block_dim, g_grid_dim;
inline void (*g_body)(void*) = nullptr;
inline void* g_body_arg = nullptr;
constexpr size_t STACK_BYTES = 256 * 1024;

inline void fiber_main() {
    g_body(g_body_arg);
    g_cur->state = DONE;  // ucontext: returning resumes uc_link, the scheduler
#if EMU_FAST_SWITCH
    emu_fast_switch(&g_cur->sp, g_sched_sp);  // never resumed
    abort();
#endif
}

inline void park() {
#if EMU_FAST_SWITCH
    emu_fast_switch(&g_cur->sp, g_sched_sp);
#else
    swapcontext(&g_cur->ctx, &g_sched);
#endif
}

// Make t start at fiber_main on its own stack.
inline void start_fiber(Thread& t) {
#if EMU_FAST_SWITCH
    uintptr_t top = (reinterpret_cast<uintptr_t>(t.stack) + STACK_BYTES) & ~uintptr_t(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                                     // fiber_main's return address: it never returns
    *--sp = reinterpret_cast<void*>(&fiber_main);        // where emu_fast_switch's `ret` goes
    for (int r = 0; r < 6; ++r) *--sp = nullptr;         // rbp, rbx, r12..r15
    t.sp = sp;                                           // at fiber_main's entry rsp = top - 8, as after a call
#else
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack;
    t.ctx.uc_stack.ss_size = STACK_BYTES;
    t.ctx.uc_link = &g_sched;
    makecontext(&t.ctx, fiber_main, 0);
#endif
}

inline void resume(Thread& t) {
    g_cur = &t;
#if EMU_FAST_SWITCH
    emu_fast_switch(&g_sched_sp, t.sp);
#else
    swapcontext(&g_sched, &t.ctx);
#endif
}

// A warp collective: park until every lane of `mask` is here, then return this lane's result.
inline uint64_t warp_collective(int op, unsigned mask, uint64_t val, int arg, int width) {
    Thread* t = g_cur;
    t->state = AT_WARP;
    t->op = op;
    t->mask = mask;
    t->val = val;
    t->arg = arg;
    t->width = width;
    park();
    return t->result;
}

inline void block_barrier() {
    g_cur->state = AT_BLOCK;
    park();
}

// Where the lanes of one warp are, for the error message: "lanes 0-3 at __shfl_xor_sync (mask 0xffffffff)".
inline std::string describe_warp(std::vector<Thread>& th, int w) {
    std::string out;
    int n = (int)th.size();
    auto where = [&](int i) -> std::string {
        const Thread& t = th[i];
        char buf[96];
        if (t.state == AT_WARP)
            snprintf(buf, sizeof buf, "at %s (mask 0x%08x)", op_name(t.op), t.mask);
        else if (t.state == AT_BLOCK)
            snprintf(buf, sizeof buf, "at __syncthreads");
        else if (t.state == DONE)
            snprintf(buf, sizeof buf, "exited");
        else
            snprintf(buf, sizeof buf, "running");
        return buf;
    };
    int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
    for (int i = lo; i < hi;) {
        std::string s = where(i);
        int j = i + 1;
        while (j < hi && where(j) == s) ++j;
        char buf[48];
        if (j - i == 1)
            snprintf(buf, sizeof buf, "lane %d ", i - lo);
        else
            snprintf(buf, sizeof buf, "lanes %d-%d ", i - lo, j - 1 - lo);
        if (!out.empty()) out += "; ";
        out += buf + s;
        i = j;
    }
    return out;
}

// Try to complete the collectives of warp w; returns true if any lane was released.
inline bool resolve_warp(std::vector<Thread>& th, int w) {
    int n = (int)th.size();
    int lo = w * 32;
    bool progress = false;
    for (int i = lo; i < lo + 32 && i < n; ++i) {
        Thread& t = th[i];
        if (t.state != AT_WARP) continue;
        unsigned mask = t.mask;
        int op = t.op;
        bool ready = ((mask >> (i - lo)) & 1u) != 0;  // a lane must name itself in the mask
        for (int b = 0; b < 32 && ready; ++b) {
            if (!((mask >> b) & 1u)) continue;
            int j = lo + b;
            ready = j < n && th[j].state == AT_WARP && th[j].mask == mask &&
                    (th[j].op == op || ((op == OP_SHFL || op == OP_XOR || op == OP_DOWN || op == OP_UP) &&
                                        (th[j].op == OP_SHFL || th[j].op == OP_XOR || th[j].op == OP_DOWN ||
                                         th[j].op == OP_UP)));
        }
        if (!ready) continue;
        unsigned ballot = 0;
        for (int b = 0; b < 32; ++b)
            if (((mask >> b) & 1u) && th[lo + b].val != 0) ballot |= 1u << b;
        for (int b = 0; b < 32; ++b) {
            if (!((mask >> b) & 1u)) continue;
            Thread& u = th[lo + b];
            int width = u.width, seg = (b / width) * width, src = b;
            switch (u.op) {
                case OP_SHFL: src = seg + (((u.arg % width) + width) % width); break;
                case OP_XOR: src = b ^ u.arg; if (src >= seg + width) src = b; break;  // later segments: own value
                case OP_DOWN: src = (b - seg) + u.arg < width ? b + u.arg : b; break;
                case OP_UP: src = (b - seg) - u.arg >= 0 ? b - u.arg : b; break;
                default: break;
            }
            if (src < 0 || src > 31) src = b;
            switch (u.op) {
                case OP_BALLOT: u.result = ballot; break;
                case OP_ANY: u.result = ballot != 0; break;
                case OP_ALL: u.result = ballot == mask; break;
                case OP_SYNCWARP: u.result = 0; break;
                default:  // a source lane outside the mask: undefined in CUDA; here it reads its own value
                    u.result = ((mask >> src) & 1u) ? th[lo + src].val : u.val;
            }
        }
        for (int b = 0; b < 32; ++b)
            if ((mask >> b) & 1u) th[lo + b].state = READY;
        progress = true;
    }
    return progress;
}

// Run body(arg) as every thread of every block. Returns 0, or 1 with a message in err.
inline int launch(dim3 grid, dim3 block, void (*body)(void*), void* arg, char* err, int errlen) {
    const int n = (int)(block.x * block.y * block.z);
    std::vector<Thread> th(n);
    static std::vector<char*> pool;  // the fiber stacks, kept across launches
    while ((int)pool.size() < n) pool.push_back(static_cast<char*>(malloc(STACK_BYTES)));
    for (int i = 0; i < n; ++i) th[i].stack = pool[i];
    g_body = body;
    g_body_arg = arg;
    g_grid_dim = grid;
    g_block_dim = block;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                g_block_idx = uint3{bx, by, bz};
                for (int i = 0; i < n; ++i) {
                    Thread& t = th[i];
                    t.tid = uint3{(unsigned)(i % block.x), (unsigned)((i / block.x) % block.y),
                                  (unsigned)(i / (block.x * block.y))};
                    t.state = READY;
                    start_fiber(t);
                }
                for (;;) {
                    bool ran = false;
                    for (int i = 0; i < n; ++i) {
                        if (th[i].state != READY) continue;
                        resume(th[i]);
                        ran = true;
                    }
                    g_cur = nullptr;
                    int done = 0, at_block = 0;
                    for (auto& t : th) done += t.state == DONE, at_block += t.state == AT_BLOCK;
                    if (done == n) break;
                    bool progress = false;
                    for (int w = 0; w * 32 < n; ++w) progress |= resolve_warp(th, w);
                    if (!progress && at_block + done == n) {  // __syncthreads: every live thread is there
                        for (auto& t : th)
                            if (t.state == AT_BLOCK) t.state = READY;
                        progress = true;
                    }
                    if (!progress && !ran) {
                        int w = 0;
                        for (int i = 0; i < n; ++i)
                            if (th[i].state == AT_WARP) { w = i / 32; break; }
                        snprintf(err, errlen,
                                 "the threads of block (%u, %u) never meet: warp %d has %s. A warp shuffle or "
                                 "__syncwarp must be reached by every lane of its mask, and __syncthreads by "
                                 "every thread (on a GPU this hangs or is undefined)",
                                 bx, by, w, describe_warp(th, w).c_str());
                        return 1;
                    }
                }
            }
    return 0;
}

template <class T>
inline uint64_t to_bits(T x) {
    static_assert(sizeof(T) <= 8, "shuffle of a type larger than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &x, sizeof(T));
    return b;
}
template <class T>
inline T from_bits(uint64_t b) {
    T x;
    memcpy(&x, &b, sizeof(T));
    return x;
}

}  // namespace emu

#define threadIdx (::emu::g_cur->tid)
#define blockIdx (::emu::g_block_idx)
#define blockDim (::emu::g_block_dim)
#define gridDim (::emu::g_grid_dim)

inline void __syncthreads() { ::emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::emu::warp_collective(::emu::OP_SYNCWARP, mask, 0, 0, 32); }
template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::OP_SHFL, mask, ::emu::to_bits(var), src_lane, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::OP_XOR, mask, ::emu::to_bits(var), lane_mask, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::OP_DOWN, mask, ::emu::to_bits(var), (int)delta, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::emu::from_bits<T>(::emu::warp_collective(::emu::OP_UP, mask, ::emu::to_bits(var), (int)delta, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)::emu::warp_collective(::emu::OP_BALLOT, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) { return (int)::emu::warp_collective(::emu::OP_ANY, mask, pred != 0, 0, 32); }
inline int __all_sync(unsigned mask, int pred) { return (int)::emu::warp_collective(::emu::OP_ALL, mask, pred != 0, 0, 32); }
inline unsigned __activemask() { return 0xffffffffu; }
