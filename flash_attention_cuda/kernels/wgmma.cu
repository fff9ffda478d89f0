// wgmma.cu -- rung 3b of the CUDA ladder: Hopper tensor cores (sm_90a). fp16 or bf16 in, fp32 accumulate.
//
// The same FlashAttention-2 forward as mma.cu, but with the instruction Hopper's tensor cores were built
// for. mma.sync (rung 3) is a warp-wide, synchronous 16x8x16 product whose operands pass through the
// warp's registers; wgmma is issued by a *warpgroup* (4 warps, 128 threads), is asynchronous, and reads its
// shared-memory operands (here Q, K and V) straight from shared memory through matrix descriptors. The
// instructions, the swizzled tiles they read and the two products (issue_abt: S = Q K^T; issue_ab:
// O += P V) are in wgmma_ops.cuh, shared with the backward (wgmma_backward.cu).
//
// Work split: grid = (ceil(Nq / Br), B * Hq), NWG warpgroups per block, Br = 64 * NWG query rows; warpgroup
// w owns rows 64w .. 64w + 63 of the block. K/V tiles of Bc keys are double-buffered with cp.async.
// The loop is software-pipelined so the tensor cores and the softmax overlap inside a warpgroup
// (FlashAttention-3's "intra-warpgroup overlap"): in iteration j
//     issue  S_i,j+1 = Qi K_j+1^T           (async)
//     issue  O      += P_ij Vj               (async, P_ij from registers)
//     wait for S_i,j+1; online softmax on it while P_ij Vj still runs:
//         m_new = max(m_i, rowmax(S) * scale_log2),  P = exp2(S * scale_log2 - m_new),
//         l_i = exp2(m_i - m_new) * l_i + rowsum(P)
//     wait for P_ij Vj; acc *= exp2(m_i - m_new); P_i,j+1 -> fp16/bf16 registers
// and at the end O = acc / l_i, lse = (m_i + log2 l_i) ln 2 (scores in log2 units, as in mma.cu).
// That is the order of this source and its PTX. ptxas, scheduling the SASS, moves the wait for P_ij Vj to the top
// of the basic block that holds the softmax, so without dropout the exp2s run after P_ij Vj, not beside it
// (tools/sass_summary.py --overlap). Ending the block before the wait puts them beside it and was not faster
// (docs/results/cuda/forward_wait_own_block/, tag experiments/forward-wait-own-block); the wait stays as it is.
// The softmax on the accumulator fragments, the negative-scale rule and the epilogue are fragments.cuh's
// (shared with mma.cu); the mask is masks.cuh's. The K/V loop covers only the tiles the block's rows see
// (both ends skipped); with a right bound (causal) blocks run heaviest-first; only the rows whose window
// edge or the Nk tail cuts a tile are masked there element by element (frag::online_softmax).
// Variants, as in mma.cu: the window is the mask's; grouped-query attention reads K/V head h / group
// (frag::forward_block); DROPOUT = true multiplies P_ij by Z_ij / (1 - p) after the softmax (frag::Dropout).
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "wgmma_ops.cuh"

namespace wgmma_detail {

using namespace wgmma_ops;  // load_tile_async, Panels, swizzle, fences, pin, issue_abt, issue_ab

// One K/V tile's online softmax on this warp's 16 rows of the warpgroup's 64 (frag::online_softmax on the flat
// accumulator, whose element i is element i % 4 of n8 tile i / 4), S_ij -> P_ij in place
template <int Bc>
__device__ __forceinline__ void softmax_tile(float (&s)[Bc / 2], float (&m_i)[2], float (&l_i)[2], float (&alpha)[2],
                                             float scale_log2, const frag::RowKeys& rk, int col0) {
    frag::online_softmax(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i, l_i, alpha, scale_log2, rk, col0);
}

}  // namespace wgmma_detail

template <int D, int Bc, int NWG, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_fwd(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
              const unsigned short* __restrict__ V, unsigned short* __restrict__ O, float* __restrict__ LSE, int Nq,
              int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
              unsigned seed_lo, unsigned seed_hi) {
    using namespace wgmma_detail;
    static_assert((D == 32 || D == 64 || D == 96 || D == 128 || D == 256) && (Bc == 64 || Bc == 128),
                  "D in {32, 64, 96, 128, 256}, Bc in {64, 128}");
    constexpr int Br = 64 * NWG;  // query rows per block
    constexpr int NT = NWG * 128;
    constexpr unsigned KV_BYTES = Bc * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // the swizzle pattern is a function of the address bits, so tiles must start 1024-byte aligned
    const unsigned raw = smem_u32(smem_raw);
    const unsigned pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char* smem = smem_raw + pad;
    const unsigned sQ = raw + pad;            // (Br, D)
    const unsigned sK = sQ + Br * D * 2;      // 2 x (Bc, D)
    const unsigned sV = sK + 2 * KV_BYTES;    // 2 x (Bc, D)

    const int tid = threadIdx.x, warp = tid / 32;
    const int wg = warp / 4;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const frag::ForwardBlock blk = frag::forward_block<Br, Bc, D>(mask, K, V, group);  // head, query rows, K/V tiles
    const int q0 = blk.q0, n_tiles = blk.n_tiles;
    const long long bh = blk.bh;
    unsigned short* o = O + bh * Nq * D;
    const frag::ScoreScale sc = frag::score_scale(scale_log2);  // scale_log2 < 0: -Q, |scale_log2|
    const int wrow = 64 * wg + 16 * (warp % 4);  // the warp's first row in the block
    const int row0 = q0 + wrow;                   // ... and in the head
    const unsigned sQ_wg = sQ + 64 * wg * Panels<D>::ROW_BYTES;  // this warpgroup's 64 rows of each Q panel
    const frag::RowKeys rk = frag::row_keys(mask, row0, blk.kv0);  // the keys this thread's rows see
    const frag::Dropout dp = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read only if DROPOUT

    if (n_tiles == 0) {  // no row of the block sees a key: O = 0, lse = -inf
        for (int e = tid; e < Br * D; e += NT)
            if (q0 + e / D < Nq) o[(long long)q0 * D + e] = 0;
        for (int r = tid; r < Br; r += NT)
            if (q0 + r < Nq) LSE[bh * Nq + q0 + r] = FA_NEG_INF;
        return;
    }

    // prologue: group 1 = Q, K_0;  group 2 = V_0, K_1
    load_tile_async<Br, D, NT>(sQ, Q + bh * Nq * D, q0, Nq);
    load_tile_async<Bc, D, NT>(sK, blk.k, 0, blk.nk);
    cp_async_commit();
    load_tile_async<Bc, D, NT>(sV, blk.v, 0, blk.nk);
    if (n_tiles > 1) load_tile_async<Bc, D, NT>(sK + KV_BYTES, blk.k, Bc, blk.nk);
    cp_async_commit();

    float acc[D / 2];  // O accumulator, 64 x D per warpgroup
    float s[Bc / 2];   // S_ij, then P_ij in fp32
    unsigned pf[Bc / 16][4];  // P_ij as fp16/bf16 A fragments
    float m_i[2] = {FA_NEG_INF, FA_NEG_INF}, l_i[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < Bc / 2; ++i) s[i] = 0.0f;

    // S_i0 and its softmax
    cp_async_wait<1>();  // Q and K_0 (this thread's copies)
    if (sc.q_sign != 0) {  // scale < 0: flip the sign of this thread's own chunks of Q (fragments.cuh)
        for (int e = tid; e < Br * (D / 8); e += NT)
            frag::apply_sign(*reinterpret_cast<uint4*>(smem + swizzle<Br, D>(e / (D / 8), e % (D / 8))), sc.q_sign);
    }
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
    issue_abt<D, Br, Bc, BF16>(s, sQ_wg, sK);  // S_i0 = Qi K_0^T
    wgmma_wait<0>();
    pin(s);
    softmax_tile<Bc>(s, m_i, l_i, alpha, sc.scale_log2, rk, 0);
    if constexpr (DROPOUT) frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0);
    frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));

    for (int j = 0; j + 1 < n_tiles; ++j) {
        cp_async_wait<0>();   // K_j+1 and V_j have landed (this thread's copies) ...
        fence_proxy_async();  // ... are visible to the tensor cores ...
        __syncthreads();      // ... and every thread's; all warpgroups are done with S_ij and P_i,j-1 V_j-1
        if (j + 2 < n_tiles) load_tile_async<Bc, D, NT>(sK + (j & 1) * KV_BYTES, blk.k, (j + 2) * Bc, blk.nk);
        load_tile_async<Bc, D, NT>(sV + ((j + 1) & 1) * KV_BYTES, blk.v, (j + 1) * Bc, blk.nk);
        cp_async_commit();

        pin(acc);       // acc (rescaled) and pf (packed) were written by ordinary instructions:
        pin(pf);        // those writes come before ...
        wgmma_fence();  // ... this fence, which orders them before the products below
        issue_abt<D, Br, Bc, BF16>(s, sQ_wg, sK + ((j + 1) & 1) * KV_BYTES);  // S_i,j+1 = Qi K_j+1^T
        issue_ab<D, Bc, BF16>(acc, pf, sV + (j & 1) * KV_BYTES);              // acc += P_ij Vj
        wgmma_wait<1>();  // S_i,j+1 is done (P_ij Vj may still run): its softmax overlaps P_ij Vj
        pin(s);
        softmax_tile<Bc>(s, m_i, l_i, alpha, sc.scale_log2, rk, (j + 1) * Bc);
        if constexpr (DROPOUT)
            frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0 + (j + 1) * Bc);
        wgmma_wait<0>();  // P_ij Vj is done: acc and pf are ours again
        pin(acc);
        pin(pf);
        frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);  // acc = exp2(m_i - m_new) * acc
        frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));
    }
    // the last tile: acc += P_i,n-1 V_n-1
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    pin(acc);
    pin(pf);
    wgmma_fence();
    issue_ab<D, Bc, BF16>(acc, pf, sV + ((n_tiles - 1) & 1) * KV_BYTES);
    wgmma_wait<0>();
    pin(acc);

    // ---- epilogue: O = acc / l_i, lse = (m_i + log2 l_i) ln 2; O staged in the warp's own rows of the Q tile
    float inv_l[2];
    frag::finish_rows(inv_l, l_i, m_i, LSE + bh * Nq, row0, Nq);
    frag::stage_rows<D, BF16>(reinterpret_cast<float (&)[D / 8][4]>(acc), inv_l,
                              [&](int r, int c) { return smem + swizzle<Br, D>(wrow + r, c); });
    __syncwarp();
    frag::store_staged<16, D>(o, row0, Nq, [&](int r, int c) { return smem + swizzle<Br, D>(wrow + r, c); });
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_WGMMA_INST(D, Bc, NWG, BF)                                                                          \
    template __global__ void wgmma_fwd<D, Bc, NWG, BF>(const unsigned short*, const unsigned short*,           \
                                                       const unsigned short*, unsigned short*, float*, int, int, \
                                                       float, int, int, int, float, unsigned, unsigned);
#define FA_WGMMA_DROPOUT_INST(D, Bc, NWG, BF)                                                                  \
    template __global__ void wgmma_fwd<D, Bc, NWG, BF, true>(const unsigned short*, const unsigned short*,     \
                                                             const unsigned short*, unsigned short*, float*,    \
                                                             int, int, float, int, int, int, float, unsigned,   \
                                                             unsigned);
FA_WGMMA_INST(32, 64, 2, false)
FA_WGMMA_INST(32, 64, 2, true)
FA_WGMMA_INST(96, 128, 2, false)
FA_WGMMA_INST(96, 128, 2, true)
FA_WGMMA_INST(64, 128, 2, false)
FA_WGMMA_INST(64, 128, 2, true)
FA_WGMMA_INST(128, 128, 2, false)
FA_WGMMA_INST(128, 128, 2, true)
FA_WGMMA_INST(64, 64, 2, false)
FA_WGMMA_INST(64, 64, 2, true)
FA_WGMMA_INST(64, 128, 3, false)
FA_WGMMA_INST(128, 64, 2, false)
FA_WGMMA_INST(128, 64, 3, false)
FA_WGMMA_INST(256, 64, 2, false)
FA_WGMMA_INST(256, 64, 2, true)
FA_WGMMA_DROPOUT_INST(32, 64, 2, false)
FA_WGMMA_DROPOUT_INST(32, 64, 2, true)
FA_WGMMA_DROPOUT_INST(96, 128, 2, false)
FA_WGMMA_DROPOUT_INST(96, 128, 2, true)
FA_WGMMA_DROPOUT_INST(64, 64, 2, false)
FA_WGMMA_DROPOUT_INST(64, 64, 2, true)
FA_WGMMA_DROPOUT_INST(128, 128, 2, false)
FA_WGMMA_DROPOUT_INST(128, 128, 2, true)
FA_WGMMA_DROPOUT_INST(256, 64, 2, false)
FA_WGMMA_DROPOUT_INST(256, 64, 2, true)
#endif
