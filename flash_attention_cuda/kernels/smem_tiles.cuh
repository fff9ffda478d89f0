// smem_tiles.cuh -- XOR-swizzled shared-memory tiles of 16-bit matrices, filled by cp.async.
// Used by the mma.sync rungs (mma.cu forward, mma_backward.cu).
#pragma once
#include "ptx.cuh"

namespace tiles {

using namespace ptx;

// byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows hold D halves.
// D a multiple of 64: chunk c of each 128-byte group of 8 chunks sits at c ^ (r % 8), so the 8 rows an ldmatrix
// reads (rows r .. r + 7, one chunk each) fall into 8 different 16-byte bank groups.
// D = 32 or 96 (rows of 64 or 192 bytes): the last 64 bytes of a row (4 chunks) cannot take an XOR with r % 8
// (it would leave the row); they take the 64-byte swizzle, chunk c at c ^ ((r / 2) % 4): two rows then share a
// 128-byte line, (r % 2, (r / 2) % 4) tells 8 rows apart, and 8 rows again hit 8 bank groups.
template <int D>
__device__ __forceinline__ unsigned swz(int row, int chunk) {
    static_assert(D % 32 == 0, "rows of a multiple of 64 bytes");
    if constexpr (D % 64 == 0) {
        return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
    } else {
        constexpr int WHOLE = D / 64 * 8;  // chunks in whole 128-byte groups
        const int c = chunk < WHOLE ? chunk ^ (row & 7) : chunk ^ ((row >> 1) & 3);
        return row * (D * 2) + (c << 4);
    }
}

// The address of (row, chunk) = (row_base + dr + row_lane, chunk_base + dc + chunk_lane) in a swizzled tile, for a
// thread that reads many (dr, dc) from one place: the bases come from the warp's place and the lane parts from the
// thread's lane (both known only at run time), dr and dc from an unrolled loop (known at compile time).
// SwzPtr<D>(tile, row_base, row_lane, chunk_base, chunk_lane) works out the thread's part once; at(dr, dc) adds the
// loop's. Where D % 64 == 0 and
//   - the tile starts 128-byte aligned (row * 2D and the tile's start then leave address bits 4..6 zero),
//   - dr is a multiple of 8 (row & 7, the swizzle's term, stays the thread's own), and
//   - dc's low three bits and those of chunk_base + chunk_lane have no bit in common (so that
//     (chunk_base + chunk_lane + dc) ^ x = ((chunk_base + chunk_lane) ^ x) ^ dc),
// the swizzle's XOR by dc's low bits is a XOR of address bits 4..6 and the rest an offset the instruction carries:
// (base ^ ((dc & 7) << 4)) + dr * 2D + (dc & ~7) * 16, one LOP3 at most and none when dc % 8 == 0, where swz
// recomputes row & 7, the XOR, the multiply and the add on every read (CuTe's swizzled layouts do the same).
// SPLIT chooses it, by default where D % 128 == 0: at D = 128 it lifted the one-kernel mma backward by 1-2 % on an
// H200 and the D = 256 forward by 2-3 %; at D = 64 ptxas kept a XOR'd base per k-step in registers and spilled, and
// forward and backward ran 1-3 % slower (docs/results/cuda/mma_backward/swizzle_addresses/). Otherwise at()
// computes swz as the sum it always was, so those kernels compile as before.
template <int D, bool SPLIT = D % 128 == 0>
struct SwzPtr {
    static_assert(!SPLIT || D % 64 == 0, "the split needs rows of whole 128-byte groups");
    unsigned tile;
    int row_base, row_lane, chunk_base, chunk_lane;
    __device__ __forceinline__ SwzPtr(unsigned tile_, int row_base_, int row_lane_, int chunk_base_, int chunk_lane_)
        : tile(tile_), row_base(row_base_), row_lane(row_lane_), chunk_base(chunk_base_), chunk_lane(chunk_lane_) {}
    __device__ __forceinline__ unsigned at(int dr, int dc) const {
        if constexpr (SPLIT) {
            const unsigned base = tile + swz<D>(row_base + row_lane, chunk_base + chunk_lane);  // the thread's part
            return (base ^ ((dc & 7) << 4)) + dr * (D * 2) + ((dc & ~7) << 4);
        } else {
            return tile + swz<D>(row_base + dr + row_lane, chunk_base + dc + chunk_lane);
        }
    }
};

// async copy of rows [row0, row0 + ROWS) of a (N, D) half matrix into a swizzled tile; rows >= N -> 0.
// Where a row's CHUNKS = D / 8 chunks divide the block, thread tid always moves chunk c = tid % CHUNKS of rows
// r0 + i * STEP (r0 = tid / CHUNKS). When STEP is a multiple of 8 the swizzle term (r & 7) is the same for all of
// them and the addresses are simple; otherwise (D = 256 with 128 threads: STEP = 4) each row's address is swizzled
// on its own. A tile whose rows are all below N (every tile but a head's last, when N % ROWS != 0) copies without
// the per-row test and its selects of source and size (6 instructions a copy before, 2 after: a 64-bit add).
// D = 96 (12 chunks a row, which do not divide the block): the first 8 chunks of each row as above, then the last
// 4 (STEP and TSTEP multiples of 8, so the swizzle term again stays the same over a thread's rows).
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_async(unsigned tile, const unsigned short* __restrict__ x, int row0,
                                                int N) {
    constexpr int CHUNKS = D / 8;             // 16-byte chunks per row
    if constexpr (NTHREADS % CHUNKS == 0) {
        constexpr int STEP = NTHREADS / CHUNKS;   // rows covered by one pass of the block
        static_assert(ROWS % STEP == 0, "tile shape");
        const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
        const unsigned short* src = x + (long long)(row0 + r0) * D + c * 8;
        const auto dst = [&](int i) {
            return STEP % 8 == 0 ? tile + swz<D>(r0, c) + i * STEP * D * 2 : tile + swz<D>(r0 + i * STEP, c);
        };
        if (row0 + ROWS <= N) {  // every row of the tile is in range (the same for the whole block): no test
#pragma unroll
            for (int i = 0; i < ROWS / STEP; ++i) cp_async_16(dst(i), src + (long long)i * STEP * D, 16);
        } else {
#pragma unroll
            for (int i = 0; i < ROWS / STEP; ++i) {
                const bool in = row0 + r0 + i * STEP < N;
                cp_async_16(dst(i), in ? src + (long long)i * STEP * D : x, in ? 16 : 0);
            }
        }
    } else {  // D = 96: the 128-byte groups of every row, then the 64-byte tails, each with simple addresses
        constexpr int WHOLE = D / 64 * 8, STEP = NTHREADS / WHOLE, TSTEP = NTHREADS / 4;
        static_assert(WHOLE > 0 && ROWS % STEP == 0 && ROWS % TSTEP == 0, "tile shape");
        {
            const int r0 = threadIdx.x / WHOLE, c = threadIdx.x % WHOLE;
            const unsigned short* src = x + (long long)(row0 + r0) * D + c * 8;
#pragma unroll
            for (int i = 0; i < ROWS / STEP; ++i) {
                const bool in = row0 + r0 + i * STEP < N;
                cp_async_16(tile + swz<D>(r0, c) + i * STEP * D * 2, in ? src + (long long)i * STEP * D : x,
                            in ? 16 : 0);
            }
        }
        const int r0 = threadIdx.x / 4, c = WHOLE + threadIdx.x % 4;
        const unsigned short* src = x + (long long)(row0 + r0) * D + c * 8;
#pragma unroll
        for (int i = 0; i < ROWS / TSTEP; ++i) {
            const bool in = row0 + r0 + i * TSTEP < N;
            cp_async_16(tile + swz<D>(r0, c) + i * TSTEP * D * 2, in ? src + (long long)i * TSTEP * D : x,
                        in ? 16 : 0);
        }
    }
}

}  // namespace tiles
