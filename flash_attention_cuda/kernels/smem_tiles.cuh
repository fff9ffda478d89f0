// smem_tiles.cuh -- XOR-swizzled shared-memory tiles of 16-bit matrices, filled by cp.async.
// Used by the mma.sync rungs (mma.cu forward, mma_backward.cu).
#pragma once
#include "ptx.cuh"

namespace tiles {

using namespace ptx;

// byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows hold D halves
template <int D>
__device__ __forceinline__ unsigned swz(int row, int chunk) {
    return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// async copy of rows [row0, row0 + ROWS) of a (N, D) half matrix into a swizzled tile; rows >= N -> 0.
// Thread tid always moves chunk c = tid % CHUNKS of rows r0 + i * STEP (r0 = tid / CHUNKS). When STEP is a
// multiple of 8 the swizzle term (r & 7) is the same for all of them and the addresses are simple; otherwise
// (D = 256 with 128 threads: STEP = 4) each row's address is swizzled on its own.
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_async(unsigned tile, const unsigned short* __restrict__ x, int row0,
                                                int N) {
    constexpr int CHUNKS = D / 8;             // 16-byte chunks per row
    constexpr int STEP = NTHREADS / CHUNKS;   // rows covered by one pass of the block
    static_assert(NTHREADS % CHUNKS == 0 && ROWS % STEP == 0, "tile shape");
    const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
    const unsigned short* src = x + (long long)(row0 + r0) * D + c * 8;
#pragma unroll
    for (int i = 0; i < ROWS / STEP; ++i) {
        const bool in = row0 + r0 + i * STEP < N;
        const unsigned dst = STEP % 8 == 0 ? tile + swz<D>(r0, c) + i * STEP * D * 2 : tile + swz<D>(r0 + i * STEP, c);
        cp_async_16(dst, in ? src + (long long)i * STEP * D : x, in ? 16 : 0);
    }
}

}  // namespace tiles
