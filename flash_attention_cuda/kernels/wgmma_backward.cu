// wgmma_backward.cu -- the backward pass on Hopper's warpgroup tensor cores (wgmma, sm_90a). fp16 or bf16 in,
// fp32 accumulate.
//
// The same recompute backward as mma_backward.cu (algorithm.md section 8, FlashAttention-2's Algorithm 2, from
// the forward's lse; softmax_scale = scale_log2 * ln 2), the same two kernels and the same elementwise step
// (backward_common.cuh); only the matrix products change:
//   S_ij  = Q_i K_j^T                    recomputed tile by tile
//   P_ij  = exp(softmax_scale * S_ij - lse_i)
//   dV_j += P_ij^T dO_i
//   dP_ij = dO_i V_j^T
//   dS_ij = P_ij o (dP_ij - Delta_i)     Delta_i = rowsum(dO_i o O_i)   (mma_backward.cu's mma_bwd_preprocess)
//   dK_j += softmax_scale * dS_ij^T Q_i  (wgmma_bwd_dkdv: one block per K/V tile of Bc keys, loop over Q tiles)
//   dQ_i += softmax_scale * dS_ij K_j    (wgmma_bwd_dq:   one block per Q tile of Br queries, loop over K/V tiles)
//
// Why a second backward: on mma.sync every warp reads the whole streamed tile through ldmatrix for each of its
// 16 rows, four times per tile pair, and the profile of mma_backward.cu shows shared memory, not the tensor
// cores, as the limit (docs/performance.md section 8). A wgmma is issued by a warpgroup for 64 rows at once and
// its shared-memory operands go to the tensor cores without passing through registers: each byte of a
// streamed tile read serves 64 rows instead of 16. Every product is one of wgmma_ops.cuh's two:
//   issue_abt (both operands in shared memory):  S^T = K_w Q_i^T, dP^T = V_w dO_i^T   (dK/dV kernel: the
//                                                warpgroup's 64 keys are the rows)
//                                                S = Q_w K_j^T,   dP = dO_w V_j^T     (dQ kernel)
//   issue_ab (A from registers, B from shared):  dV += P^T dO, dK += dS^T Q, dQ += dS K
// The fp32 accumulators of S^T and dP^T are turned into P^T and dS^T in place (bwd::p_and_ds, on the
// warpgroup's accumulator seen as its warp's 16-row fragments) and repacked to 16 bits (frag::pack_a) as the A
// operand of the next product: P and dS never touch shared memory.
// Mask, grouped-query attention and dropout exactly as in mma_backward.cu: each block visits only the tiles
// that hold a visible pair; the dK/dV kernel runs one block per K/V head and loops over its group's query heads
// (summing dK_j, dV_j in registers: no atomics, no copy of K/V); the keep mask is drawn again from the seed.
#include "backward_common.cuh"
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "wgmma_ops.cuh"

namespace wgmma_bwd_detail {

using namespace wgmma_ops;  // load_tile_async, fences, pin, issue_abt, issue_ab

// a warpgroup's fp32 accumulator (M registers per thread) seen as its warp's 16-row fragment block (M / 4 n8 tiles)
template <int M>
__device__ __forceinline__ auto frags(float (&x)[M]) -> float (&)[M / 4][4] {
    return reinterpret_cast<float (&)[M / 4][4]>(x);
}

template <int M>
__device__ __forceinline__ void zero(float (&x)[M]) {
#pragma unroll
    for (int i = 0; i < M; ++i) x[i] = 0.0f;
}

// the dynamic shared memory from its first 1024-byte boundary (the 128-byte swizzle is a function of the address)
__device__ __forceinline__ unsigned aligned_smem(unsigned char* raw, unsigned char*& aligned) {
    const unsigned addr = smem_u32(raw), pad = (1024u - (addr & 1023u)) & 1023u;
    aligned = raw + pad;
    return addr + pad;
}

// One tile pair for a warpgroup: the two recomputed products, the elementwise step, and the one or two products
// that accumulate gradients (KEY_ROWS: the dK/dV kernel, whose accumulator rows are keys):
//   s  = A_s B_s^T,  dp = A_dp B_dp^T   (64 x R each: S^T and dP^T, or S and dP)
//   s -> P (or P^T), dp -> dS (or dS^T) in place      (backward_common.cuh)
//   acc1 += P C1                         (KEY_ROWS only: dV += P^T dO)
//   acc2 += dS C2                        (dK += dS^T Q, or dQ += dS K)
// C1, C2: (R, D) tiles. The products are asynchronous and the elementwise work hides behind them: P is computed
// while dP is still running, dS while P C1 runs (with dropout, whose keep mask both need, P and dS are computed
// together once both products are done). Every wgmma reads registers written by ordinary instructions only after
// a wgmma.fence, and every register a wgmma uses is pinned (wgmma_ops::pin) until the wait that ends it.
// lse2, delta, mask, row0, col0, drop: as bwd::p_and_ds takes them.
template <bool KEY_ROWS, bool DROPOUT, int D, int A_ROWS, int R, bool BF16>
__device__ __forceinline__ void tile_pair(float (&s)[R / 2], float (&dp)[R / 2], unsigned sA_s, unsigned sB_s,
                                          unsigned sA_dp, unsigned sB_dp, float (&acc1)[D / 2], unsigned sC1,
                                          float (&acc2)[D / 2], unsigned sC2, const float* lse2, const float* delta,
                                          float scale_log2, const fa::Mask& mask, int row0, int col0,
                                          const frag::Dropout& drop) {
    unsigned pa[R / 16][4], da[R / 16][4];  // P and dS as 16-bit A fragments
    wgmma_fence();
    issue_abt<D, A_ROWS, R, BF16>(s, sA_s, sB_s);     // S  (S^T)
    issue_abt<D, A_ROWS, R, BF16>(dp, sA_dp, sB_dp);  // dP (dP^T)
    if constexpr (DROPOUT) {
        wgmma_wait<0>();
        pin(s);
        pin(dp);
        bwd::p_and_ds<KEY_ROWS, true>(frags(s), frags(dp), lse2, delta, scale_log2, mask, row0, col0, drop);
    } else {
        wgmma_wait<1>();  // S is done; dP may still run
        pin(s);
        bwd::p_tile<KEY_ROWS>(frags(s), lse2, scale_log2, mask, row0, col0);
    }
    if constexpr (KEY_ROWS) {  // dV += P^T dO, issued before dS is known
        frag::pack_a<R / 8, BF16>(pa, frags(s));
        pin(acc1);
        pin(pa);
        wgmma_fence();
        issue_ab<D, R, BF16>(acc1, pa, sC1);
    }
    if constexpr (!DROPOUT) {
        wgmma_wait<KEY_ROWS ? 1 : 0>();  // dP is done (P C1 may still run)
        pin(dp);
        bwd::ds_tile<KEY_ROWS>(frags(dp), frags(s), delta, mask, row0, col0);
    }
    frag::pack_a<R / 8, BF16>(da, frags(dp));
    pin(acc2);
    pin(da);
    wgmma_fence();
    issue_ab<D, R, BF16>(acc2, da, sC2);  // dK += dS^T Q  (dQ += dS K)
    wgmma_wait<0>();
    pin(acc2);
    pin(da);
    if constexpr (KEY_ROWS) {
        pin(acc1);
        pin(pa);
    }
}

}  // namespace wgmma_bwd_detail

// dK_j, dV_j for one tile of Bc = 64 NWG keys (warpgroup w: keys 64w .. 64w + 63) of K/V head blockIdx.y
// (= b Hk + hk; grid (ceil(Nk / Bc), B * Hk)), looping over the group's query heads bh = blockIdx.y * group + g
// and for each over the tiles of Br queries that see any of the keys. K_j and V_j stay in shared memory; Q_i,
// dO_i (and their lse, Delta) stream through two buffers.
template <int D, int NWG, int Br, bool BF16, bool DROPOUT = false, bool GQA = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_bwd_dkdv(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                   const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                   const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                   unsigned short* __restrict__ dV, int Nq, int Nk, float scale_log2, int window_left,
                   int window_right, int group, float dropout_p, unsigned seed_lo, unsigned seed_hi) {
    using namespace wgmma_bwd_detail;
    static_assert((D == 64 || D == 128) && (Br == 64 || Br == 128), "D and Br in {64, 128}");
    constexpr int Bc = 64 * NWG, NTHREADS = NWG * 128;
    constexpr unsigned KV_BYTES = Bc * D * 2, Q_BYTES = Br * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* smem;
    const unsigned sK = aligned_smem(smem_raw, smem);  // (Bc, D): stays
    const unsigned sV = sK + KV_BYTES;                   // (Bc, D): stays
    const unsigned sQ = sV + KV_BYTES;                   // 2 x (Br, D): streamed
    const unsigned sdO = sQ + 2 * Q_BYTES;               // 2 x (Br, D): streamed
    float* sL = reinterpret_cast<float*>(smem + 2 * KV_BYTES + 4 * Q_BYTES);  // 2 x Br: lse in log2 units
    float* sDl = sL + 2 * Br;                                                 // 2 x Br: Delta

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const int warp = threadIdx.x / 32, wg = warp / 4;
    const int k0 = blockIdx.x * Bc, wkey = 64 * wg + 16 * (warp % 4);  // block's first key, warp's first row
    const unsigned sK_wg = sK + 64 * wg * 128, sV_wg = sV + 64 * wg * 128;  // the warpgroup's 64 keys
    const long long bkv = blockIdx.y;  // the K/V head: b * Hk + hk
    long long bh = GQA ? bkv * group : bkv;  // the group's first query head: b * Hq + hk * group
    const unsigned short *q = Q + bh * Nq * D, *dout = dO + bh * Nq * D;
    const float *lse = LSE + bh * Nq, *delta = Delta + bh * Nq;
    // the Q tiles that hold every query seeing a key of this block; the same for every query head
    const bwd::TileSpan tiles = bwd::q_tiles(mask, k0, k0 + Bc, Br);

    const auto stream = [&](int it, int b) {  // Q_i, dO_i, lse2 and Delta of Q tile `it` of head bh into buffer b
        const int i0 = (tiles.first + it) * Br;
        load_tile_async<Br, D, NTHREADS>(sQ + b * Q_BYTES, q, i0, Nq);
        load_tile_async<Br, D, NTHREADS>(sdO + b * Q_BYTES, dout, i0, Nq);
        bwd::load_rows<Br>(sL + b * Br, sDl + b * Br, lse, delta, i0, Nq);
    };
    load_tile_async<Bc, D, NTHREADS>(sK, K + bkv * Nk * D, k0, Nk);
    load_tile_async<Bc, D, NTHREADS>(sV, V + bkv * Nk * D, k0, Nk);
    if (tiles.count > 0) stream(0, 0);
    cp_async_commit();

    float dk[D / 2], dv[D / 2];  // the warpgroup's 64 rows of dK_j and dV_j, summed over the group
    float s[Br / 2], dp[Br / 2];  // S_ij^T -> P_ij^T, dP_ij^T -> dS_ij^T: 64 keys x Br queries
    zero(dk);
    zero(dv);
    zero(s);
    zero(dp);
    for (int g = 0;;) {  // the group's query heads (GQA false: group 1, one pass)
        const frag::Dropout drop = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read if DROPOUT
        for (int t = 0; t < tiles.count; ++t) {
            const int buf = t & 1, i0 = (tiles.first + t) * Br;
            cp_async_wait<0>();   // tile t has landed (this thread's copies) ...
            fence_proxy_async();  // ... is visible to the tensor cores ...
            __syncthreads();      // ... and every thread's; every warpgroup is done with tile t - 1's buffer
            if (t + 1 < tiles.count) stream(t + 1, buf ^ 1);  // tile t + 1 loads while tile t is computed
            cp_async_commit();
            const unsigned qb = sQ + buf * Q_BYTES, db = sdO + buf * Q_BYTES;
            tile_pair<true, DROPOUT, D, Bc, Br, BF16>(s, dp, sK_wg, qb, sV_wg, db,  // S^T = K_w Q_i^T, dP^T = V_w dO_i^T
                                                     dv, db,   // dV_j += P_ij^T dO_i  (DROPOUT: (P_ij o Z / (1 - p))^T dO_i)
                                                     dk, qb,   // dK_j += dS_ij^T Q_i  (times softmax_scale at the end)
                                                     sL + buf * Br, sDl + buf * Br, scale_log2, mask, k0 + wkey, i0,
                                                     drop);
        }
        if (!GQA || ++g == group) break;  // (GQA false: compiled without the loop)
        ++bh;  // the next query head of the group
        q += Nq * D, dout += Nq * D, lse += Nq, delta += Nq;
        __syncthreads();  // every warpgroup is done with the last tile's buffer before buffer 0 is refilled
        if (tiles.count > 0) stream(0, 0);
        cp_async_commit();
    }
    const float softmax_scale = scale_log2 * FA_LN2;
    frag::store_rows<D, BF16>(dK + bkv * Nk * D, frags(dk), k0 + wkey, Nk, softmax_scale);  // dK_j = scale dS^T Q
    frag::store_rows<D, BF16>(dV + bkv * Nk * D, frags(dv), k0 + wkey, Nk, 1.0f);
}

// dQ_i for one tile of Br = 64 NWG queries (warpgroup w: queries 64w .. 64w + 63) of query head blockIdx.y,
// looping over the tiles of Bc keys that any of them sees; query head bh reads K/V head bh / group.
// Grid (ceil(Nq / Br), B * Hq). Q_i and dO_i stay in shared memory; K_j and V_j stream through two buffers.
template <int D, int NWG, int Bc, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_bwd_dq(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                 const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                 const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dQ,
                 int Nq, int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
                 unsigned seed_lo, unsigned seed_hi) {
    using namespace wgmma_bwd_detail;
    static_assert((D == 64 || D == 128) && (Bc == 64 || Bc == 128), "D and Bc in {64, 128}");
    constexpr int Br = 64 * NWG, NTHREADS = NWG * 128;
    constexpr unsigned Q_BYTES = Br * D * 2, KV_BYTES = Bc * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* smem;
    const unsigned sQ = aligned_smem(smem_raw, smem);  // (Br, D): stays
    const unsigned sdO = sQ + Q_BYTES;                  // (Br, D): stays
    const unsigned sK = sdO + Q_BYTES;                  // 2 x (Bc, D): streamed
    const unsigned sV = sK + 2 * KV_BYTES;              // 2 x (Bc, D): streamed

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    // later Q tiles see more keys with a right bound (causal): they run first
    const int q_block = mask.heavy_last() ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int warp = threadIdx.x / 32, wg = warp / 4;
    const int q0 = q_block * Br, wrow = 64 * wg + 16 * (warp % 4);  // block's first query, warp's first row
    const unsigned sQ_wg = sQ + 64 * wg * 128, sdO_wg = sdO + 64 * wg * 128;  // the warpgroup's 64 queries
    const long long bh = blockIdx.y, bkv = bh / group;  // query head b * Hq + h, its K/V head b * Hk + h / group
    const unsigned short *k = K + bkv * Nk * D, *v = V + bkv * Nk * D;
    const frag::Dropout drop = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read if DROPOUT
    const bwd::TileSpan tiles = bwd::kv_tiles(mask, q0, q0 + Br, Bc);  // every key a query of the block sees

    const auto stream = [&](int jt, int b) {  // K_j and V_j of K/V tile `jt` into buffer b
        const int j0 = (tiles.first + jt) * Bc;
        load_tile_async<Bc, D, NTHREADS>(sK + b * KV_BYTES, k, j0, Nk);
        load_tile_async<Bc, D, NTHREADS>(sV + b * KV_BYTES, v, j0, Nk);
    };
    load_tile_async<Br, D, NTHREADS>(sQ, Q + bh * Nq * D, q0, Nq);
    load_tile_async<Br, D, NTHREADS>(sdO, dO + bh * Nq * D, q0, Nq);
    if (tiles.count > 0) stream(0, 0);
    cp_async_commit();
    float lse2[2], delta_i[2];  // this thread's two query rows g, g + 8: lse in log2 units, Delta
#pragma unroll
    for (int h = 0; h < 2; ++h)
        bwd::query_row(lse2[h], delta_i[h], LSE + bh * Nq, Delta + bh * Nq, q0 + wrow + frag::acc_row(2 * h), Nq);

    float dq[D / 2];              // the warpgroup's 64 rows of dQ_i
    float s[Bc / 2], dp[Bc / 2];  // S_ij -> P_ij, dP_ij -> dS_ij: 64 queries x Bc keys
    zero(dq);
    zero(s);
    zero(dp);
    for (int t = 0; t < tiles.count; ++t) {
        const int buf = t & 1, j0 = (tiles.first + t) * Bc;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        if (t + 1 < tiles.count) stream(t + 1, buf ^ 1);
        cp_async_commit();
        const unsigned kb = sK + buf * KV_BYTES, vb = sV + buf * KV_BYTES;
        tile_pair<false, DROPOUT, D, Br, Bc, BF16>(s, dp, sQ_wg, kb, sdO_wg, vb,  // S = Q_w K_j^T, dP = dO_w V_j^T
                                                  dq, 0u,  // (no first product)
                                                  dq, kb,  // dQ_i += dS_ij K_j  (times softmax_scale at the end)
                                                  lse2, delta_i, scale_log2, mask, q0 + wrow, j0, drop);
    }
    frag::store_rows<D, BF16>(dQ + bh * Nq * D, frags(dq), q0 + wrow, Nq, scale_log2 * FA_LN2);  // dQ = scale dS K
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_WGMMA_BWD_INST(D, NWG, T, BF)                                                                         \
    template __global__ void wgmma_bwd_dkdv<D, NWG, T, BF>(const unsigned short*, const unsigned short*,        \
                                                           const unsigned short*, const unsigned short*,        \
                                                           const float*, const float*, unsigned short*,         \
                                                           unsigned short*, int, int, float, int, int, int,     \
                                                           float, unsigned, unsigned);                          \
    template __global__ void wgmma_bwd_dq<D, NWG, T, BF>(const unsigned short*, const unsigned short*,          \
                                                         const unsigned short*, const unsigned short*,          \
                                                         const float*, const float*, unsigned short*, int, int, \
                                                         float, int, int, int, float, unsigned, unsigned);      \
    template __global__ void wgmma_bwd_dkdv<D, NWG, T, BF, true>(const unsigned short*, const unsigned short*,  \
                                                                 const unsigned short*, const unsigned short*,  \
                                                                 const float*, const float*, unsigned short*,   \
                                                                 unsigned short*, int, int, float, int, int,    \
                                                                 int, float, unsigned, unsigned);               \
    template __global__ void wgmma_bwd_dq<D, NWG, T, BF, true>(const unsigned short*, const unsigned short*,    \
                                                               const unsigned short*, const unsigned short*,    \
                                                               const float*, const float*, unsigned short*,     \
                                                               int, int, float, int, int, int, float, unsigned, \
                                                               unsigned);                                       \
    template __global__ void wgmma_bwd_dkdv<D, NWG, T, BF, false, true>(                                        \
        const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*,             \
        const float*, const float*, unsigned short*, unsigned short*, int, int, float, int, int, int, float,    \
        unsigned, unsigned);                                                                                    \
    template __global__ void wgmma_bwd_dkdv<D, NWG, T, BF, true, true>(                                         \
        const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*,             \
        const float*, const float*, unsigned short*, unsigned short*, int, int, float, int, int, int, float,    \
        unsigned, unsigned);
FA_WGMMA_BWD_INST(64, 2, 64, false)
FA_WGMMA_BWD_INST(64, 2, 64, true)
FA_WGMMA_BWD_INST(128, 2, 64, false)
FA_WGMMA_BWD_INST(128, 2, 64, true)
#endif
