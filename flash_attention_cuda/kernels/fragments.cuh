// fragments.cuh -- warp-level products on mma.sync m16n8k16 fragments, shared by the tensor-core rungs
// (mma.cu forward, mma_backward.cu).
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = threadIdx.x % 32, g = lane / 4
// (row group), t = lane % 4 (thread in the group); every register holds two 16-bit values (lo, hi):
//   A (16 x 16, row-major)    a[0]: row g,     cols 2t, 2t+1       a[2]: row g,     cols 2t+8, 2t+9
//                             a[1]: row g + 8, cols 2t, 2t+1       a[3]: row g + 8, cols 2t+8, 2t+9
//   B (16 x 8, k x n)         b0: k = 2t, 2t+1, n = g              b1: k = 2t+8, 2t+9, n = g
//   C (16 x 8, fp32)          c[0], c[1]: row g,     cols 2t, 2t+1
//                             c[2], c[3]: row g + 8, cols 2t, 2t+1
// An accumulator of 16 x 8NT is float[NT][4], n8 tile n holding columns 8n .. 8n + 7: its element (n, e)
// is row acc_row(e), column acc_col(n, e). Two n8 accumulator tiles (2kk, 2kk + 1) have exactly the layout
// of one A fragment (k-step kk), so a product's output becomes the next product's A operand after
// pack_a (fp32 -> fp16/bf16), without passing through shared memory.
// Shared tiles are the swizzled (rows, D) 16-bit tiles of smem_tiles.cuh; next_tiles is the step of the
// double-buffered cp.async loop over them.
// No host header: compiles under NVRTC and nvcc alike.
#pragma once
#include "common.cuh"
#include "masks.cuh"
#include "philox.cuh"
#include "ptx.cuh"
#include "smem_tiles.cuh"

namespace frag {

using namespace ptx;
using namespace tiles;

// row and column, within the warp's 16 x 8NT accumulator, of element e of n8 tile n
__device__ __forceinline__ int acc_row(int e) { return (threadIdx.x % 32) / 4 + (e < 2 ? 0 : 8); }
__device__ __forceinline__ int acc_col(int n, int e) { return n * 8 + 2 * (threadIdx.x % 4) + (e & 1); }

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// the A fragment (16 x 16) of rows a_row0 .. a_row0 + 15, k-step kk (columns 16kk .. 16kk + 15) of tile sA
template <int D>
__device__ __forceinline__ void load_a(unsigned (&a)[4], unsigned sA, int a_row0, int kk) {
    const int lane = threadIdx.x % 32;
    const SwzPtr<D> pa(sA, a_row0, (lane & 7) + ((lane >> 3) & 1) * 8, 0, lane >> 4);
    ldmatrix_x4(a, pa.at(0, kk * 2));
}

// acc[m] (16 x 8NT) += A_m B^T for MT row tiles m = 0 .. MT - 1 at once, the sum over D: B = rows b_row0 ..
// b_row0 + 8NT - 1 of tile sB (rows, D), through ldmatrix; every B fragment read feeds MT products (MT = 2:
// half the shared-memory reads per product). a_frag(a, m, kk) gives A_m's fragment of k-step kk: from
// registers the caller holds, or load_a from a shared tile.
template <int D, int NT, int MT, bool BF16, class AFrag>
__device__ __forceinline__ void mma_abt_rows(float (&acc)[MT][NT][4], AFrag a_frag, unsigned sB, int b_row0) {
    static_assert(NT % 2 == 0, "two n8 tiles per ldmatrix.x4");
    const int lane = threadIdx.x % 32;
    const SwzPtr<D> pb(sB, b_row0, (lane & 7) + (lane >> 4) * 8, 0, (lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) a_frag(a[m], m, kk);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {  // two n8 tiles per ldmatrix.x4
            unsigned b[4];
            ldmatrix_x4(b, pb.at(np * 16, kk * 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16816<BF16>(acc[m][2 * np], a[m], b[0], b[1]);
                mma_16816<BF16>(acc[m][2 * np + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// acc (16 x 8NT) += A B^T, the sum over D: A = rows a_row0 .. a_row0 + 15 of tile sA, B = rows b_row0 ..
// b_row0 + 8NT - 1 of tile sB, both (rows, D). ldmatrix on both (e.g. S = Q K^T, dP = dO V^T).
template <int D, int NT, bool BF16>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], unsigned sA, int a_row0, unsigned sB, int b_row0) {
    mma_abt_rows<D, NT, 1, BF16>(reinterpret_cast<float (&)[1][NT][4]>(acc),
                                 [&](unsigned (&a)[4], int, int kk) { load_a<D>(a, sA, a_row0, kk); }, sB, b_row0);
}

// acc[m] (16 x DC) += A_m B for MT row tiles at once, the sum over 16 KS: a_frag(a, m, kk) gives A_m's fragment
// of k-step kk (rows 16 x columns 16 kk .. 16 kk + 15: from registers the caller holds, or read from a shared
// tile), B = rows b_row0 .. b_row0 + 16 KS - 1 of tile sB (k = row, n = d), columns col0 .. col0 + DC - 1 (all D
// by default; col0 a multiple of 16), through ldmatrix.trans; every B fragment read feeds MT products.
template <int D, int KS, int MT, bool BF16, int DC, class AFrag>
__device__ __forceinline__ void mma_ab_frags(float (&acc)[MT][DC / 8][4], AFrag a_frag, unsigned sB, int b_row0,
                                             int col0) {
    const int lane = threadIdx.x % 32;
    const SwzPtr<D> pb(sB, b_row0, (lane & 7) + ((lane >> 3) & 1) * 8, col0 / 8, lane >> 4);  // col0 % DC == 0
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) a_frag(a[m], m, kk);
#pragma unroll
        for (int dp = 0; dp < DC / 16; ++dp) {
            unsigned b[4];
            ldmatrix_x4_trans(b, pb.at(kk * 16, dp * 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16816<BF16>(acc[m][2 * dp], a[m], b[0], b[1]);
                mma_16816<BF16>(acc[m][2 * dp + 1], a[m], b[2], b[3]);
            }
        }
    }
}
// ... with every A_m in registers: a[m] = KS A fragments (e.g. P or dS from pack_a). Written out rather than as
// mma_ab_frags with a lambda that copies a[m][kk]: that compiles to the same instructions in another order, and
// mma.cu's forward is timed as it is.
template <int D, int KS, int MT, bool BF16, int DC = D>
__device__ __forceinline__ void mma_ab_rows(float (&acc)[MT][DC / 8][4], const unsigned (&a)[MT][KS][4], unsigned sB,
                                            int b_row0, int col0 = 0) {
    const int lane = threadIdx.x % 32;
    const SwzPtr<D> pb(sB, b_row0, (lane & 7) + ((lane >> 3) & 1) * 8, col0 / 8, lane >> 4);  // col0 % DC == 0
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DC / 16; ++dp) {
            unsigned b[4];
            ldmatrix_x4_trans(b, pb.at(kk * 16, dp * 2));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma_16816<BF16>(acc[m][2 * dp], a[m][kk], b[0], b[1]);
                mma_16816<BF16>(acc[m][2 * dp + 1], a[m][kk], b[2], b[3]);
            }
        }
    }
}

// acc (16 x DC) += A B, the sum over 16 KS: A = 16 x 16 KS in registers (KS A fragments, e.g. P or dS from
// pack_a), B = rows b_row0 .. b_row0 + 16 KS - 1 of tile sB (k = row, n = d), columns col0 .. col0 + DC - 1
// (all D by default), through ldmatrix.trans (e.g. O += P V, dV += P^T dO, dQ += dS K).
template <int D, int KS, bool BF16, int DC = D>
__device__ __forceinline__ void mma_ab(float (&acc)[DC / 8][4], const unsigned (&a)[KS][4], unsigned sB,
                                       int b_row0, int col0 = 0) {
    mma_ab_rows<D, KS, 1, BF16, DC>(reinterpret_cast<float (&)[1][DC / 8][4]>(acc),
                                    reinterpret_cast<const unsigned (&)[1][KS][4]>(a), sB, b_row0, col0);
}

// fp32 accumulator (16 x 8NT) -> NT / 2 A fragments (16 x 16 each) in fp16/bf16, round to nearest even
template <int NT, bool BF16>
__device__ __forceinline__ void pack_a(unsigned (&a)[NT / 2][4], const float (&acc)[NT][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = pack2<BF16>(acc[2 * kk][0], acc[2 * kk][1]);          // row g,     cols 2t, 2t+1
        a[kk][1] = pack2<BF16>(acc[2 * kk][2], acc[2 * kk][3]);          // row g + 8, cols 2t, 2t+1
        a[kk][2] = pack2<BF16>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);  // row g,     cols 2t+8, 2t+9
        a[kk][3] = pack2<BF16>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);  // row g + 8, cols 2t+8, 2t+9
    }
}

// The warp's 16 x DC fp32 accumulator, times `mul`, into rows row0 .. row0 + 15, columns col0 .. col0 + DC - 1
// (all D by default) of a (N, D) 16-bit matrix in global memory (rows >= N are not written); 4-byte stores, two
// columns each.
template <int D, bool BF16, int DC = D>
__device__ __forceinline__ void store_rows(unsigned short* out, const float (&acc)[DC / 8][4], int row0, int N,
                                           float mul, int col0 = 0) {
#pragma unroll
    for (int n = 0; n < DC / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // h = 0: row g (elements 0, 1); h = 1: row g + 8 (elements 2, 3)
            const int row = row0 + acc_row(2 * h);
            if (row < N)
                *reinterpret_cast<unsigned*>(out + (long long)row * D + col0 + acc_col(n, 0)) =
                    pack2<BF16>(acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
        }
}

// The same in float32, unscaled (8-byte stores): a partial sum another kernel adds up (wgmma_bwd_kv_sum).
template <int D>
__device__ __forceinline__ void store_rows_f32(float* out, const float (&acc)[D / 8][4], int row0, int N) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + acc_row(2 * h);
            if (row < N)
                *reinterpret_cast<float2*>(out + (long long)row * D + acc_col(n, 0)) =
                    make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
        }
}

// One step of a double-buffered loop over tiles: put the next iteration's tiles in flight (`prefetch` issues
// their cp.async, called only when has_next) and wait for this iteration's; then sync, so every warp may read them.
template <class Prefetch>
__device__ __forceinline__ void next_tiles(bool has_next, const Prefetch& prefetch) {
    if (has_next) {
        prefetch();
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// The double-buffered loop over `count` streamed tiles. The caller has issued tile 0 into buffer 0 (stream(0, 0),
// then cp_async_commit); for each tile t (buffer t & 1): tile t + 1 goes into the other buffer (stream(t + 1, b)),
// tile t is waited for, body(t, t & 1) runs, and the block syncs before the buffer is refilled. At the end no
// copy is still in flight.
template <class Stream, class Body>
__device__ __forceinline__ void stream_loop(int count, const Stream& stream, const Body& body) {
    for (int t = 0; t < count; ++t) {
        const int buf = t & 1;
        next_tiles(t + 1 < count, [&] { stream(t + 1, buf ^ 1); });
        body(t, buf);
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
    cp_async_wait<0>();
}

}  // namespace frag

// ---------------------------------------------------------------------------------------------------------
// What one block of a tensor-core forward kernel (mma.cu, wgmma.cu; grid = (ceil(Nq / Br), B * Hq)) computes:
// query head bh = b * Hq + h, query rows q0 .. q0 + Br - 1, and the n_tiles K/V tiles of Bc keys its rows see,
// from key kv0 on (masks.cuh: the tiles no row sees are skipped at both ends). k and v point at key kv0 of the
// K/V head the query head reads: with grouped-query attention (Hq = group * Hk query heads, Hk K/V heads)
// query head h of batch b reads K/V head h / group, whose grid row is b * Hk + h / group = bh / group (the
// same K/V memory for the whole group: no copy). Tile j is rows j Bc .. j Bc + Bc - 1 of nk. With a right
// bound (causal) the blocks run last-first, so the longest K/V loops start first.
namespace frag {

struct ForwardBlock {
    long long bh;
    int q0, kv0, n_tiles, nk;
    const unsigned short *k, *v;
};
// Work item m (0 .. n_m - 1, n_m = ceil(Nq / Br)) of query head bh: its rows and K/V tiles, without the pointers
// (wgmma_ws.cu addresses K/V through tensor maps and walks these items itself, several per block).
// pad_top (0 <= pad_top < Br) moves every rows block up by that many rows: the first block starts at row -pad_top
// and the last ends at Nq exactly (wgmma_ws.cu with a right bound: the padding rows go where the mask leaves the
// fewest keys). Rows below 0, like rows past Nq, are computed on zero-filled Q and never stored.
template <int Br, int Bc>
__device__ __forceinline__ ForwardBlock forward_item(const fa::Mask& mask, int m, int n_m, long long bh,
                                                     int pad_top = 0) {
    ForwardBlock b;
    b.bh = bh;
    b.q0 = (mask.heavy_last() ? n_m - 1 - m : m) * Br - pad_top;
    const int first = b.q0 > 0 ? b.q0 : 0;  // the block's first real row: its K/V range is that of its real rows
    b.kv0 = mask.kv_tile_begin(first, Bc) * Bc;
    b.n_tiles = mask.kv_tile_end(first, b.q0 + Br, Bc) - b.kv0 / Bc;
    b.nk = mask.Nk - b.kv0;
    b.k = b.v = nullptr;
    return b;
}
// ... the block's own item: m = blockIdx.x, bh = blockIdx.y
template <int Br, int Bc>
__device__ __forceinline__ ForwardBlock forward_tiles(const fa::Mask& mask) {
    return forward_item<Br, Bc>(mask, (int)blockIdx.x, (int)gridDim.x, blockIdx.y);
}
// ... with the pointers to its K/V head's first tile (group: query heads per K/V head)
template <int Br, int Bc, int D>
__device__ __forceinline__ ForwardBlock with_kv(ForwardBlock b, int Nk, const unsigned short* K,
                                                const unsigned short* V, int group) {
    const long long bkv = b.bh / group;  // the K/V head's grid row (group 1: bh itself)
    b.k = K + (bkv * Nk + b.kv0) * D;
    b.v = V + (bkv * Nk + b.kv0) * D;
    return b;
}
template <int Br, int Bc, int D>
__device__ __forceinline__ ForwardBlock forward_block(const fa::Mask& mask, const unsigned short* K,
                                                      const unsigned short* V, int group) {
    return with_kv<Br, Bc, D>(forward_tiles<Br, Bc>(mask), mask.Nk, K, V, group);
}
template <int Br, int Bc, int D>
__device__ __forceinline__ ForwardBlock forward_block(const fa::Mask& mask, const unsigned short* K,
                                                      const unsigned short* V, int group, int m, int n_m,
                                                      long long bh) {
    return with_kv<Br, Bc, D>(forward_item<Br, Bc>(mask, m, n_m, bh), mask.Nk, K, V, group);
}

}  // namespace frag

// ---------------------------------------------------------------------------------------------------------
// The forward's online softmax on fragments, shared by mma.cu and wgmma.cu (a wgmma accumulator of 64 rows is
// these 16-row fragments stacked over the 4 warps of a warpgroup: element i of the flat array is element
// i % 4 of n8 tile i / 4). A thread holds two rows of its warp's 16: h = 0 is row g (elements 0, 1 of every
// n8 tile), h = 1 is row g + 8 (elements 2, 3); each row is spread over the 4 threads t = 0 .. 3 of group g.
namespace frag {

// A negative softmax_scale, handled once for the tensor-core kernels. The forward takes the row max of the raw
// scores Qi Kj^T and folds the scale into the exponent, P_ij = exp2(S_ij * scale_log2 - m_i) with
// m_i = rowmax(S_ij) * scale_log2, which needs scale_log2 >= 0. For scale_log2 < 0 it computes with -Q and
// |scale_log2|: (-Qi) Kj^T |scale_log2| = Qi Kj^T scale_log2 exactly, and negating fp16/bf16 is flipping sign
// bits (exact; NaN stays NaN). The backward takes no row max (P_ij = exp2(S_ij * scale_log2 - lse_i)), so it
// multiplies by the signed scale_log2 as it is.
struct ScoreScale {
    float scale_log2;  // |scale_log2|: the factor of the raw scores in the exponent
    unsigned q_sign;   // XOR it onto every 32-bit word (two halves) of Q: 0x80008000 negates Q, 0 leaves it
};
__device__ __forceinline__ ScoreScale score_scale(float scale_log2) {
    // at least 1e-30: a zero (or float32-underflowed) scale would make a masked score's -inf * 0 = NaN; scores
    // times 1e-30 are ~0 in the exponent, so the weights are uniform, as softmax(0 * S) is
    return ScoreScale{fmaxf(fabsf(scale_log2), 1e-30f), scale_log2 < 0.0f ? 0x80008000u : 0u};
}
template <int N>
__device__ __forceinline__ void apply_sign(unsigned (&x)[N], unsigned q_sign) {  // Q fragments in registers
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] ^= q_sign;
}
__device__ __forceinline__ void apply_sign(uint4& x, unsigned q_sign) {  // a 16-byte chunk of Q in shared memory
    x.x ^= q_sign, x.y ^= q_sign, x.z ^= q_sign, x.w ^= q_sign;
}

// The keys this thread's two rows see: row i (< Nq) sees exactly [mask.kv_begin(i), mask.kv_end(i + 1)) (masks.cuh),
// kept as lo[h] (counted from key key0, the first key of the kernel's first K/V tile) and width[h], the range's
// length. (Rows >= Nq get a range too: they are computed, never stored.)
struct RowKeys {
    int lo[2];
    unsigned width[2];
};
__device__ __forceinline__ RowKeys row_keys(const fa::Mask& mask, int row0, int key0) {  // row0: the warp's first row
    RowKeys rk;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row0 + acc_row(2 * h), lo = mask.kv_begin(i), hi = mask.kv_end(i + 1);
        rk.lo[h] = lo - key0;
        rk.width[h] = hi > lo ? hi - lo : 0;
    }
    return rk;
}

// One K/V tile's online softmax for the warp's 16 rows, in place: S_ij (raw Qi Kj^T, 16 x 8NT, keys key0 + col0 ..
// key0 + col0 + 8NT - 1, key0 as in row_keys) -> P_ij in fp32; then alpha rescales acc (rescale_rows).
//   S_ij  = -inf where the row does not see the key  (only rows whose window edge or the Nk tail cuts the tile)
//   m_new = max(m_i, rowmax(S_ij) * scale_log2)      (scale_log2 >= 0: ScoreScale)
//   alpha = exp2(m_i - m_new)
//   P_ij  = exp2(S_ij * scale_log2 - m_new)
//   l_i   = alpha * l_i + rowsum(P_ij)              (this thread's columns; finish_rows adds the row's 4 parts)
// A row that has seen no key yet (m_new = -inf) takes 0 for m_new in the exponents: P_ij = exp2(-inf) = 0.
// Returns whether acc must be rescaled by alpha: always, unless LAZY.
//
// LAZY: lazy rescaling (FlashAttention-4's rule). m_i is only the reference the exponents are taken from, and
// any reference gives the same O = acc / l_i and lse = m_i + log2 l_i, as long as P_ij = exp2(S_ij * scale_log2 -
// m_i) stays in range. So where every row of the warp grows its max by at most RESCALE_SLACK (log2 units), the
// rows keep their old m_i: alpha = exp2(0) = 1, P_ij <= 2^8 = 256 (exact in fp32 and in the fp16/bf16 P
// fragments, far below their largest values; not with dropout's 1 / (1 - p) on top, which could pass fp16's
// 65504), and the function returns false: the caller skips acc's rescale,
// D / 2 multiplies a thread. After the first tiles a row's max rarely grows by a factor of 256, so most tiles skip
// it. It pays where the rescale sits on the tensor cores' path (wgmma_ws.cu's turn at D = 128); where the
// multiplies hide behind the exp2s anyway (mma.cu, wgmma.cu), the branch costs more than it saves
// (docs/results/cuda/forward_lazy_rescale/).
constexpr float RESCALE_SLACK = 8.0f;
template <int NT, bool LAZY = false>
__device__ __forceinline__ bool online_softmax(float (&s)[NT][4], float (&m_i)[2], float (&l_i)[2], float (&alpha)[2],
                                               float scale_log2, const RowKeys& rk, int col0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int lo = rk.lo[h] - col0;  // in the tile's columns: column c is visible iff 0 <= c - lo < width
        if (lo > 0 || (unsigned)(8 * NT - lo) > rk.width[h]) {  // the tile is not inside the row's keys
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if ((unsigned)(acc_col(n, e) - lo) >= rk.width[h]) s[n][2 * h + e] = FA_NEG_INF;
        }
    }
    float m_ij[2] = {FA_NEG_INF, FA_NEG_INF};  // rowmax(S_ij), raw: this thread's columns, then the row's
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        m_ij[0] = fmaxf(m_ij[0], fmaxf(s[n][0], s[n][1]));
        m_ij[1] = fmaxf(m_ij[1], fmaxf(s[n][2], s[n][3]));
    }
    // Eager (not LAZY): alpha and the new m_i in the same loop as the row max, as the kernels before the lazy rule
    // had it (their instructions stay as they were); LAZY: after the warp's vote, in a loop of its own.
    float m_new[2], m_use[2];
    bool keep = true;  // LAZY: every row of this thread may keep its reference m_i
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the 4 threads of a group hold one row: reduce over them
        m_ij[h] = fmaxf(m_ij[h], __shfl_xor_sync(0xffffffffu, m_ij[h], 1));
        m_ij[h] = fmaxf(m_ij[h], __shfl_xor_sync(0xffffffffu, m_ij[h], 2));
        m_new[h] = fmaxf(m_i[h], m_ij[h] * scale_log2);  // m_new = max(m_i, rowmax(S_ij) * scale_log2)
        if constexpr (LAZY) keep = keep && m_new[h] - m_i[h] <= RESCALE_SLACK;  // false while m_i = -inf
        if constexpr (!LAZY) {
            m_use[h] = m_new[h] == FA_NEG_INF ? 0.0f : m_new[h];  // no key yet: exp2(-inf - 0) = 0
            alpha[h] = fast_exp2(m_i[h] - m_use[h]);              // alpha = exp2(m_i - m_new)
            m_i[h] = m_new[h];
            l_i[h] *= alpha[h];
        }
    }
    const bool rescale = !LAZY || !__all_sync(0xffffffffu, keep);  // LAZY: one decision for the warp's 16 rows
    if constexpr (LAZY) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float m_ref = rescale ? m_new[h] : m_i[h];  // the reference: m_new, or the old m_i (alpha = 1)
            m_use[h] = m_ref == FA_NEG_INF ? 0.0f : m_ref;
            alpha[h] = fast_exp2(m_i[h] - m_use[h]);
            m_i[h] = m_ref;
            l_i[h] *= alpha[h];
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {  // P_ij = exp2(S_ij * scale_log2 - m_new);  l_i += rowsum(P_ij)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = fast_exp2(fmaf(s[n][e], scale_log2, -m_use[e >> 1]));
        l_i[0] += s[n][0] + s[n][1];
        l_i[1] += s[n][2] + s[n][3];
    }
    return rescale;
}

// acc = alpha * acc, row by row (alpha from online_softmax; the callers skip it where that returned false)
template <int NT>
__device__ __forceinline__ void rescale_rows(float (&acc)[NT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
    }
}

// The end of the forward on this thread's two rows: l_i summed over the 4 threads of each row, lse = (m_i +
// log2 l_i) ln 2 written to lse[row] for the rows row0 + g, row0 + g + 8 below Nq (lse: the head's (Nq,)
// row; row0: the warp's first row), and inv_l = 1 / l_i for O = acc * inv_l: 0 for a row that saw no key
// (O = 0, lse = -inf), NaN stays NaN (common.cuh's inv_row_sum and row_lse).
__device__ __forceinline__ void finish_rows(float (&inv_l)[2], float (&l_i)[2], const float (&m_i)[2],
                                            float* __restrict__ lse, int row0, int Nq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 1);  // the whole row's sum
        l_i[h] += __shfl_xor_sync(0xffffffffu, l_i[h], 2);
        inv_l[h] = fa::inv_row_sum(l_i[h]);
        const int row = row0 + acc_row(2 * h);
        if (threadIdx.x % 4 == 0 && (unsigned)row < (unsigned)Nq) lse[row] = fa::row_lse(m_i[h], l_i[h]);  // 0 <= row < Nq
    }
}

// O = acc * inv_l of the warp's 16 rows, as fp16/bf16, into a shared staging tile; chunk(r, c) is the address
// of 16-byte chunk c (columns 8c .. 8c + 7) of staged row r = 0 .. 15 (the caller's swizzle).
template <int D, bool BF16, class Chunk>
__device__ __forceinline__ void stage_rows(const float (&acc)[D / 8][4], const float (&inv_l)[2], Chunk chunk) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<unsigned*>(chunk(acc_row(2 * h), n) + t * 4) =
                pack2<BF16>(acc[n][2 * h] * inv_l[h], acc[n][2 * h + 1] * inv_l[h]);
}

// Rows row0 .. row0 + ROWS - 1 (those in 0 .. N - 1) of a (N, D) 16-bit matrix in global memory, from the staging
// tile (chunk(r, c) as in stage_rows): the warp's lanes move 16-byte chunks, consecutive lanes along a row.
template <int ROWS, int D, class Chunk>
__device__ __forceinline__ void store_staged(unsigned short* __restrict__ out, int row0, int N, Chunk chunk) {
#pragma unroll
    for (int e = threadIdx.x % 32; e < ROWS * (D / 8); e += 32) {
        const int r = e / (D / 8), c = e % (D / 8);
        if ((unsigned)(row0 + r) < (unsigned)N)  // 0 <= row < N
            *reinterpret_cast<uint4*>(out + (long long)(row0 + r) * D + c * 8) = *reinterpret_cast<const uint4*>(chunk(r, c));
    }
}

}  // namespace frag

// ---------------------------------------------------------------------------------------------------------
// Dropout on fragments, shared by the forward kernels (mma.cu, wgmma.cu) and the backward (mma_backward.cu).
// The keep decision of score (b, h, i, j) is philox.cuh's: philox_uniform(seed, ((b Hq + h) Nq + i) Nk + j) >= p,
// drawn again wherever it is needed (the backward regenerates it; no N x N mask is ever stored). A kernel that
// takes dropout has a template flag DROPOUT: without it none of this is compiled in.
namespace frag {

struct Dropout {
    fa::KeepTest keep;  // keep <=> uniform >= p, decided on the Philox word in integers (philox.cuh)
    float inv_keep;     // 1 / (1 - p)
    unsigned seed_lo, seed_hi;
    long long bh;       // b * Hq + h: the query head's grid row
    int Nq, Nk;
    // Z_ij / (1 - p) of score (i, j) of this head: 1 / (1 - p) if kept, else 0
    __device__ __forceinline__ float scale(int i, int j) const {
        return keep.keeps(fa::philox_word(seed_lo, seed_hi, fa::dropout_offset(bh, i, j, Nq, Nk))) ? inv_keep : 0.0f;
    }
    // the same from round 1's product A * lo and the high word's share (DropoutTile)
    __device__ __forceinline__ float scale(fa::PhiloxHigh high, unsigned long long a_lo) const {
        return keep.keeps(fa::philox_finish(seed_lo, seed_hi, high, a_lo)) ? inv_keep : 0.0f;
    }
};
__device__ __forceinline__ Dropout make_dropout(float p, unsigned seed_lo, unsigned seed_hi, long long bh, int Nq,
                                                int Nk) {
    return Dropout{fa::keep_test(p), 1.0f / (1.0f - p), seed_lo, seed_hi, bh, Nq, Nk};
}

// One thread's Philox work on a 16 x 8NT accumulator tile (rows row0 + acc_row(e), columns col0 + acc_col(n, e)),
// shared between its scores. The tile's rows are queries and its columns keys, or with KEY_ROWS the other way
// round (the backward's S_ij^T). When all of the thread's offsets have one high word (`shared`: every tile but
// the few that straddle a multiple of 2^32), philox_high runs once for all of them, and round 1's A * lo is the
// product at the thread's first offset plus A times the distance to it, a 64-bit add:
//     offset - first = (e >> 1) 8 Nk + 8n + (e & 1)           (rows are queries)
//                    = (8n + (e & 1)) Nk + (e >> 1) 8          (KEY_ROWS)
// Without `shared` a tile takes Dropout::scale(i, j), score by score.
template <bool KEY_ROWS, int NT>
struct DropoutTile {
    bool shared;
    fa::PhiloxHigh high;
    unsigned long long a_first;  // A * lo of the thread's first offset (rows acc_row(0), column acc_col(0, 0))
    unsigned long long a_nk;     // A * Nk (mod 2^64: the sums are exact, as A * lo < 2^64)

    __device__ __forceinline__ DropoutTile(const Dropout& dp, int row0, int col0) {
        const int r = row0 + acc_row(0), c = col0 + acc_col(0, 0);  // the first score; the last is 8 rows and
        const int r_last = r + 8, c_last = c + 8 * (NT - 1) + 1;     // 8 (NT - 1) + 1 columns further
        const long long first = KEY_ROWS ? fa::dropout_offset(dp.bh, c, r, dp.Nq, dp.Nk)
                                         : fa::dropout_offset(dp.bh, r, c, dp.Nq, dp.Nk);
        const long long last = KEY_ROWS ? fa::dropout_offset(dp.bh, c_last, r_last, dp.Nq, dp.Nk)
                                        : fa::dropout_offset(dp.bh, r_last, c_last, dp.Nq, dp.Nk);
        const unsigned hi_word = static_cast<unsigned>(static_cast<unsigned long long>(first) >> 32);
        shared = hi_word == static_cast<unsigned>(static_cast<unsigned long long>(last) >> 32);
        high = fa::philox_high(dp.seed_lo, dp.seed_hi, hi_word);
        a_first = static_cast<unsigned long long>(fa::PHILOX_ROUND_A) * static_cast<unsigned>(first);
        a_nk = static_cast<unsigned long long>(fa::PHILOX_ROUND_A) * static_cast<unsigned>(dp.Nk);
        // opaque to the compiler from here: a sum of the two would otherwise be folded back into A * (lo + k Nk),
        // a multiply a score
        asm("" : "+l"(a_first));
        asm("" : "+l"(a_nk));
    }
    // A * lo of element (n, e), when `shared`
    __device__ __forceinline__ unsigned long long a_lo(int n, int e) const {
        constexpr unsigned long long A = fa::PHILOX_ROUND_A;
        if constexpr (KEY_ROWS)
            return a_first + static_cast<unsigned long long>(8 * n + (e & 1)) * a_nk + (e >> 1) * 8 * A;
        else
            return a_first + ((e >> 1) ? 8 * a_nk : 0ull) + static_cast<unsigned long long>(8 * n + (e & 1)) * A;
    }
};

// P_ij *= Z_ij / (1 - p) on the warp's 16 x 8NT accumulator of rows row0 .. row0 + 15, keys col0 .. col0 + 8NT - 1
// (after the online softmax: l_i and lse are those of P before dropout). The compiler interleaves all 4 NT of a
// thread's evaluations here, and the wgmma forwards spill for it (220-412 bytes a thread in wgmma-ws at D = 64-128).
// Drawing four accumulator tiles at a time into a bit mask, in a loop kept rolled, removes most of the spills and was
// still slower, 0.92-1.03x (docs/results/cuda/dropout_grouped_mask/): the chains side by side hide each other's
// latency, and that is worth more than the spills cost.
template <int NT>
__device__ __forceinline__ void dropout_rows(float (&P)[NT][4], const Dropout& dp, int row0, int col0) {
    const DropoutTile<false, NT> tile(dp, row0, col0);
    if (tile.shared) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) P[n][e] *= dp.scale(tile.high, tile.a_lo(n, e));
    } else {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) P[n][e] *= dp.scale(row0 + acc_row(e), col0 + acc_col(n, e));
    }
}

}  // namespace frag
