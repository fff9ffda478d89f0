// tma.cuh -- Hopper's bulk tensor copies (TMA), mbarriers, named barriers and register reallocation (sm_90a),
// for the warp-specialised forward (wgmma_ws.cu); the bulk reduce-add for the one-kernel backward's dQ
// (wgmma_backward.cu).
//
//   TMA      cp.async.bulk.tensor: one thread asks the copy engine for a whole box of a tensor (here 64 columns x
//            ROWS rows of one head; 32 columns at D = 32 and 96), described by a 128-byte "tensor map" the host
//            encodes once per tensor (cuTensorMapEncodeTiled, runtime.tensor_map). The engine writes the box into shared memory already
//            in the swizzle the wgmma descriptors read (wgmma_ops.cuh: Panels, swizzle), fills rows past the
//            tensor's end with zeros, and reports the bytes it wrote on an mbarrier.
//   mbarrier a 64-bit barrier in shared memory with a phase bit: it completes a phase when `count` threads have
//            arrived AND the bytes announced by arrive_expect_tx have landed. Waiting names the phase's parity,
//            so a ring of S stages needs no reset: use u of a stage waits for parity u & 1.
//   named barriers  bar.sync / bar.arrive id, n: a barrier among n threads (not the whole block); arrive does
//            not wait. The two consumer warpgroups take turns on the tensor cores with a pair of them.
//   setmaxnreg  a warpgroup gives registers back (.dec) or takes them (.inc): the producer needs few, the
//            consumers hold the accumulators.
// A tensor map is a kernel parameter passed by value (`const __grid_constant__ TmaMap`), so the copy engine
// reads it from the parameter space; no host header is included: NVRTC and nvcc compile this alike.
#pragma once
#include "wgmma_ops.cuh"

namespace tma {

struct alignas(64) TmaMap {  // CUtensorMap: 128 opaque bytes, encoded on the host
    unsigned long long words[16];
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// make the initialised barriers visible to the copy engine (the async proxy) before any copy names them
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// this thread arrives, announcing `bytes` that copies will report on the barrier in the current phase
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// wait until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra MBAR_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// the box at (c0 = column, c1 = row, c2 = head) of tensor map `map` -> shared memory at dst; completes on bar
__device__ __forceinline__ void load_box(unsigned dst, const TmaMap& map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void prefetch_map(const TmaMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}

// rows [row0, row0 + ROWS) of head `head` of a (heads, N, D) tensor as swizzled column panels of (ROWS, COLS) at
// tile (wgmma_ops.cuh's layout: COLS = 64 columns, 128-byte swizzle, where D is a multiple of 64; else 32 columns,
// 64-byte swizzle: the box and swizzle the host encodes in the map, runtime.tensor_map_layout), all reported on bar
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(unsigned tile, const TmaMap& map, int row0, int head, unsigned bar) {
    using P = wgmma_ops::Panels<D>;
#pragma unroll
    for (int p = 0; p < D / P::COLS; ++p) load_box(tile + p * ROWS * P::ROW_BYTES, map, P::COLS * p, row0, head, bar);
}

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bulk reduce: the copy engine adds `bytes` (a multiple of 16) of float32 from shared memory at src to global
// memory at dst, element by element, atomically (cp.reduce.async.bulk .add.f32; both 16-byte aligned), tracked
// in this thread's bulk groups: commit closes a group, wait_read<N> waits until at most N groups still read
// their shared memory (the buffer may be written again), wait_all until every group is done
__device__ __forceinline__ void bulk_reduce_add(float* dst, unsigned src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

template <int REGS>
__device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

}  // namespace tma
