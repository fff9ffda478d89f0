// backward_common.cuh -- what the two tensor-core backwards (mma_backward.cu on mma.sync, wgmma_backward.cu on
// wgmma) share: the queries' lse and Delta, the elementwise step from S and dP to P and dS on accumulator
// fragments, and the tile ranges the mask leaves to visit.
//
// The fragments are mma.sync's C layout (fragments.cuh): a warp's 16 x 8NT block, element (n, e) at row
// acc_row(e), column acc_col(n, e); a wgmma accumulator of 64 rows is four of them stacked over the warps of the
// warpgroup, so the same code serves both. No host header: compiles under NVRTC and nvcc alike.
#pragma once
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"

namespace bwd {

using frag::acc_col;
using frag::acc_row;
using frag::Dropout;
using frag::DropoutTile;
using ptx::fast_exp2;

// lse (natural log) -> log2 units; a row that saw no key (lse = -inf) gets +inf, so its P = exp2(-inf) = 0;
// a row with a +inf score (lse = +inf) gets NaN, so its P is NaN, as in the reference
__device__ __forceinline__ float lse2_of(float lse) {
    return lse == FA_NEG_INF ? FA_POS_INF : fa::lse2_backward(lse);
}

// lse in log2 units and Delta of query `row`; rows >= Nq get (+inf, 0), so their P and dS are 0
__device__ __forceinline__ void query_row(float& lse2, float& delta_i, const float* lse, const float* delta, int row,
                                          int Nq) {
    const bool in = row < Nq;
    lse2 = in ? lse2_of(lse[row]) : FA_POS_INF;
    delta_i = in ? delta[row] : 0.0f;
}

// Delta_i = rowsum(dO_i o O_i) in fp32 of row r of the 16-bit (rows, D) O and dO, summed over the calling warp
// (every lane gets it), E = D / 32 elements a lane. D = 64, 128, 256: lane l reads the E consecutive elements from
// E l, one load of 2E bytes from each tensor where both bases are 2E-byte aligned (vec; the rows of 2D bytes then
// are too), else E of 2 bytes. D = 32, 96 (E = 1, 3: no load of 2E bytes): lane l reads elements l, l + 32, ..,
// E loads of 2 bytes, each 64 consecutive bytes over the warp (vec is not used).
template <int D, bool BF16>
__device__ __forceinline__ float delta_row(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO,
                                           long long r, bool vec) {
    constexpr int E = D / 32, W = E / 2;  // elements and 32-bit words per lane
    static_assert(E == 1 || E == 2 || E == 3 || E == 4 || E == 8, "D in {32, 64, 96, 128, 256}");
    if constexpr (E % 2 == 1) {
        const long long at = r * D + threadIdx.x % 32;
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc += ptx::to_f32<BF16>(O[at + 32 * e]) * ptx::to_f32<BF16>(dO[at + 32 * e]);
        return fa::warp_reduce_sum(acc);
    } else {
        const long long at = r * D + E * (threadIdx.x % 32);
        unsigned o[W], g[W];  // two 16-bit values a word, the first in the low half
        if (vec) {
            if constexpr (W == 1) {
                o[0] = *reinterpret_cast<const unsigned*>(O + at), g[0] = *reinterpret_cast<const unsigned*>(dO + at);
            } else if constexpr (W == 2) {
                const uint2 a = *reinterpret_cast<const uint2*>(O + at), b = *reinterpret_cast<const uint2*>(dO + at);
                o[0] = a.x, o[1] = a.y, g[0] = b.x, g[1] = b.y;
            } else {
                const uint4 a = *reinterpret_cast<const uint4*>(O + at), b = *reinterpret_cast<const uint4*>(dO + at);
                o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, g[0] = b.x, g[1] = b.y, g[2] = b.z, g[3] = b.w;
            }
        } else {
#pragma unroll
            for (int w = 0; w < W; ++w) {
                o[w] = O[at + 2 * w] | (unsigned)O[at + 2 * w + 1] << 16;
                g[w] = dO[at + 2 * w] | (unsigned)dO[at + 2 * w + 1] << 16;
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            acc += ptx::to_f32<BF16>((unsigned short)(o[w] & 0xffffu)) *
                   ptx::to_f32<BF16>((unsigned short)(g[w] & 0xffffu));
            acc += ptx::to_f32<BF16>((unsigned short)(o[w] >> 16)) * ptx::to_f32<BF16>((unsigned short)(g[w] >> 16));
        }
        return fa::warp_reduce_sum(acc);
    }
}

// whether delta_row may load 2 (D / 32) bytes at once from both O and dO (D = 32, 96: it loads 2 bytes at a time)
template <int D>
__device__ __forceinline__ bool delta_vec(const unsigned short* O, const unsigned short* dO) {
    if constexpr (D % 64 != 0) return false;
    return ((reinterpret_cast<unsigned long long>(O) | reinterpret_cast<unsigned long long>(dO)) % (D / 16)) == 0;
}

// queries [row0, row0 + ROWS): lse in log2 units and Delta into shared memory
template <int ROWS>
__device__ __forceinline__ void load_rows(float* sL, float* sDl, const float* lse, const float* delta, int row0,
                                          int Nq) {
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) query_row(sL[r], sDl[r], lse, delta, row0 + r, Nq);
}

// ... the same without stalling a tile on the load's round trip (a load_rows in a double-buffered loop waits for
// its loads at the store, and the block's barrier for the store), for a loop whose tiles read lse2 and Delta from
// shared memory: thread r < ROWS of the block loads row row0 + r of the *next* tile early in a tile (fetch; rows
// >= Nq: lse -inf, Delta 0) and stores it late in the same tile (put; lse in log2 units, +inf for -inf as
// query_row gives), into the buffer the last tile used, which the loop's barrier then hands to the next. The
// conversion runs once a row, not once for each thread that reads the row (16 in mma_bwd_fused).
template <int ROWS>
struct NextRows {
    float lse = FA_NEG_INF, delta = 0.0f;
    __device__ __forceinline__ void fetch(const float* lse_, const float* delta_, int row0, int Nq) {
        const int row = row0 + threadIdx.x;
        lse = FA_NEG_INF, delta = 0.0f;
        if (threadIdx.x < ROWS && row < Nq) lse = lse_[row], delta = delta_[row];
    }
    __device__ __forceinline__ void put(float* sL, float* sDl) const {
        if (threadIdx.x < ROWS) sL[threadIdx.x] = lse2_of(lse), sDl[threadIdx.x] = delta;
    }
};

// whether the warp's 16 x 8NT block at (row0, col0) must apply the mask pair by pair (masks.cuh's needs_mask)
template <bool KEY_ROWS, int NT>
__device__ __forceinline__ bool tile_needs_mask(const fa::Mask& mask, int row0, int col0) {
    const int q0 = KEY_ROWS ? col0 : row0, k0 = KEY_ROWS ? row0 : col0;
    return mask.needs_mask(q0, q0 + (KEY_ROWS ? 8 * NT : 16), k0, k0 + (KEY_ROWS ? 16 : 8 * NT));
}
// A warp's 16 x 8NT block in place: S_ij -> P_ij, dP_ij -> dS_ij (KEY_ROWS: the transposed block, S_ij^T and
// dP_ij^T, whose rows are keys and columns queries: the dK/dV kernels):
//   P_ij  = exp2(S_ij * scale_log2 - lse2_i)       (= exp(softmax_scale * S_ij - lse_i))
//   dS_ij = P_ij o (dP_ij - Delta_i)
// and P_ij = dS_ij = 0 on the pairs the mask hides (0, not 0 * NaN: a hidden pair gets no gradient from a NaN
// row), checked pair by pair only where the mask does not call the warp's block full, and on the last key and
// query tiles (keys >= Nk and queries >= Nq are zero rows of their tiles: S = 0 there, not -inf, or NaN where the
// other operand holds an infinity). The arithmetic runs on every pair, and a
// block that needs the mask then zeroes its hidden pairs in a second pass (zero_hidden): a per-pair
// `check && !visible` compiles to a branch and a select around every element, which in the backward's profile
// (wgmma_bwd_ws, H100) took more issue slots than the arithmetic.
// lse2 / delta: the queries' values, indexed by the fragment column (KEY_ROWS: shared, one per query of the
// tile) or by h = e / 2 (the thread's two query rows g, g + 8, in registers). row0 / col0: the global index of
// the block's row 0 / column 0.
// DROPOUT: P_ij comes back as P_ij o Z_ij / (1 - p) (what dV needs), and dS_ij = P_ij o (dP_ij o Z_ij / (1 - p)
// - Delta_i), Z_ij drawn from `drop` (whose query head is the tile's).

// The pairs a thread's two rows of a warp's block see, as a range of the block's columns (acc_col): row h
// (acc_row(2h)) sees the columns c with lo[h] <= c < lo[h] + width[h], one unsigned compare a pair,
// (unsigned)(c - lo) < width, instead of visible()'s five. KEY_ROWS (rows are keys j, columns queries): the queries
// mask.queries_of(j); else (rows are queries i, columns keys): the keys mask.keys_of(i). Exactly the pairs
// visible() allows (masks.cuh).
template <bool KEY_ROWS>
__device__ __forceinline__ frag::RowKeys visible_cols(const fa::Mask& mask, int row0, int col0) {
    frag::RowKeys rk;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + acc_row(2 * h);
        const fa::Span run = KEY_ROWS ? mask.queries_of(r) : mask.keys_of(r);
        rk.lo[h] = run.first - col0;
        rk.width[h] = run.end > run.first ? run.end - run.first : 0;
    }
    return rk;
}
__device__ __forceinline__ bool hidden_col(const frag::RowKeys& rk, int n, int e) {
    return (unsigned)(acc_col(n, e) - rk.lo[e >> 1]) >= rk.width[e >> 1];
}

// every pair of the block that the mask hides -> 0, in x and (ZERO_Y) y: the second pass of a block that needs
// the mask, after the arithmetic has run on every pair
template <bool KEY_ROWS, bool ZERO_Y, int NT>
__device__ __forceinline__ void zero_hidden(float (&x)[NT][4], float (&y)[NT][4], const fa::Mask& mask, int row0,
                                            int col0) {
    const frag::RowKeys rk = visible_cols<KEY_ROWS>(mask, row0, col0);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (hidden_col(rk, n, e)) {
                x[n][e] = 0.0f;
                if constexpr (ZERO_Y) y[n][e] = 0.0f;
            }
}

// The same step in two halves, for a kernel that overlaps them with its matrix products (no dropout):
// p_tile turns S_ij into P_ij as soon as S is ready; ds_tile turns dP_ij into dS_ij = P_ij o (dP_ij - Delta_i)
// later, from that P_ij. Same arguments, same arithmetic and the same zeros as p_and_ds.
template <bool KEY_ROWS, int NT>
__device__ __forceinline__ void p_tile(float (&P_ij)[NT][4], const float* lse2, float scale_log2,
                                       const fa::Mask& mask, int row0, int col0) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)  // P_ij[n][e] holds S_ij here
            P_ij[n][e] = fast_exp2(fmaf(P_ij[n][e], scale_log2, -lse2[KEY_ROWS ? acc_col(n, e) : e >> 1]));
    if (tile_needs_mask<KEY_ROWS, NT>(mask, row0, col0)) zero_hidden<KEY_ROWS, false>(P_ij, P_ij, mask, row0, col0);
}
template <bool KEY_ROWS, int NT>
__device__ __forceinline__ void ds_tile(float (&dS_ij)[NT][4], const float (&P_ij)[NT][4], const float* delta,
                                        const fa::Mask& mask, int row0, int col0) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)  // dS_ij[n][e] holds dP_ij here
            dS_ij[n][e] = P_ij[n][e] * (dS_ij[n][e] - delta[KEY_ROWS ? acc_col(n, e) : e >> 1]);
    if (tile_needs_mask<KEY_ROWS, NT>(mask, row0, col0)) zero_hidden<KEY_ROWS, false>(dS_ij, dS_ij, mask, row0, col0);
}

// Both halves, with dropout, score by score: Z_ij / (1 - p) from the tile's shared Philox work (SHARED: the
// thread's offsets have one high word, DropoutTile) or from Dropout::scale(i, j), and the mask test pair by pair
// beside it (a second pass made ptxas spill, hundreds of bytes a thread in wgmma_bwd_ws).
template <bool KEY_ROWS, bool SHARED, int NT>
__device__ __forceinline__ void p_and_ds_dropout(float (&P_ij)[NT][4], float (&dS_ij)[NT][4], const float* lse2,
                                                 const float* delta, float scale_log2, const fa::Mask& mask, int row0,
                                                 int col0, const Dropout& drop, const DropoutTile<KEY_ROWS, NT>& tile,
                                                 bool check) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = row0 + acc_row(e), c = col0 + acc_col(n, e), slot = KEY_ROWS ? acc_col(n, e) : e >> 1;
            const float P = fast_exp2(fmaf(P_ij[n][e], scale_log2, -lse2[slot]));  // P_ij[n][e]: S_ij here
            float z;                                                               // Z_ij / (1 - p)
            if constexpr (SHARED) z = drop.scale(tile.high, tile.a_lo(n, e));
            else z = KEY_ROWS ? drop.scale(c, r) : drop.scale(r, c);
            const float dS = P * (dS_ij[n][e] * z - delta[slot]);                // dS_ij[n][e]: dP_ij here
            const bool hidden = check && !(KEY_ROWS ? mask.visible(c, r) : mask.visible(r, c));
            P_ij[n][e] = hidden ? 0.0f : P * z;
            dS_ij[n][e] = hidden ? 0.0f : dS;
        }
}

// Both halves at once. Without dropout the arithmetic runs on every pair, P_ij first and dS_ij from it, and a
// block that needs the mask then zeroes the hidden pairs of both in one pass (a hidden P_ij is not zeroed before
// dS_ij is formed from it: the pass overwrites both, and every visible pair reads the same P_ij either way).
// block_may_mask: false when the caller knows that its whole tile needs no mask (masks.cuh's needs_mask over the
// block's tile, the same for every warp), so that the warp's own test is not evaluated at all.
template <bool KEY_ROWS, bool DROPOUT, int NT>
__device__ __forceinline__ void p_and_ds(float (&P_ij)[NT][4], float (&dS_ij)[NT][4], const float* lse2,
                                         const float* delta, float scale_log2, const fa::Mask& mask, int row0,
                                         int col0, const Dropout& drop, bool block_may_mask = true) {
    const bool check = block_may_mask && tile_needs_mask<KEY_ROWS, NT>(mask, row0, col0);
    if constexpr (!DROPOUT) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int slot = KEY_ROWS ? acc_col(n, e) : e >> 1;
                // P_ij = exp2(S_ij scale_log2 - lse2_i); P_ij[n][e] holds S_ij here
                P_ij[n][e] = fast_exp2(fmaf(P_ij[n][e], scale_log2, -lse2[slot]));
                // dS_ij = P_ij o (dP_ij - Delta_i); dS_ij[n][e] holds dP_ij here
                dS_ij[n][e] = P_ij[n][e] * (dS_ij[n][e] - delta[slot]);
            }
        if (check) zero_hidden<KEY_ROWS, true>(P_ij, dS_ij, mask, row0, col0);
    } else {
        const DropoutTile<KEY_ROWS, NT> tile(drop, row0, col0);
        if (tile.shared)
            p_and_ds_dropout<KEY_ROWS, true>(P_ij, dS_ij, lse2, delta, scale_log2, mask, row0, col0, drop, tile, check);
        else
            p_and_ds_dropout<KEY_ROWS, false>(P_ij, dS_ij, lse2, delta, scale_log2, mask, row0, col0, drop, tile, check);
    }
}

// The tiles to visit: `count` tiles from tile `first` on
struct TileSpan {
    int first, count;
};
// the K/V tiles of Bc keys that hold every key a query of [q0, q1) sees (masks.cuh)
__device__ __forceinline__ TileSpan kv_tiles(const fa::Mask& mask, int q0, int q1, int Bc) {
    const int first = mask.kv_tile_begin(q0, Bc);
    return TileSpan{first, mask.kv_tile_end(q0, q1, Bc) - first};
}
// the Q tiles of Br queries that hold every query seeing a key of [k0, k1)
__device__ __forceinline__ TileSpan q_tiles(const fa::Mask& mask, int k0, int k1, int Br) {
    const int begin = mask.q_begin(k0), end = mask.q_end(k1);
    return end > begin ? TileSpan{begin / Br, (end + Br - 1) / Br - begin / Br} : TileSpan{0, 0};
}

}  // namespace bwd
