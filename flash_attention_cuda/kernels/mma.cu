// mma.cu -- rung 3 of the CUDA ladder: tensor cores. fp16 or bf16 in, fp32 accumulate.
//
// FlashAttention-2 forward with warp-level matrix instructions (sm_80+):
//   mma.sync.m16n8k16   16x8 += 16x16 * 16x8 on the tensor cores, fp32 accumulators in registers
//   ldmatrix(.trans)    shared -> registers in exactly the fragment layout mma wants
//   cp.async            global -> shared without passing through registers; K/V tiles are
//                       double-buffered: tile j+1 is in flight while tile j is computed
//   XOR swizzle         16-byte chunk c of shared row r is stored at chunk c ^ (r % 8), so the 8 rows an
//                       ldmatrix reads (or a cp.async writes) fall into 8 different bank groups (D = 32 and
//                       96: the last 64 bytes of a row at c ^ ((r / 2) % 4); smem_tiles.cuh)
// The fragment products, the softmax on fragments and the epilogue are fragments.cuh's (shared with wgmma.cu
// and mma_backward.cu); the mask is masks.cuh's.
//
// Work split: grid = (ceil(Nq / Br), B * Hq); NWARPS warps of MT m16 tiles each, Br = 16 * MT * NWARPS
// query rows per block; warp w owns rows 16 MT w .. 16 MT (w + 1) - 1 of the block for the whole K/V loop.
// (Where one block fills an SM and every row sees every key, a persistent grid of one block per SM walks the
// blocks' work instead, each loading its next rows' Q and first K/V tile under its last tile: AHEAD, below.)
// Per K/V tile of Bc keys, each warp:
//   S_ij = Qi Kj^T              (16 MT x Bc fp32, in registers; -inf where masked)
//   m_new = max(m_i, rowmax(S_ij) * scale_log2),  P_ij = exp2(S_ij * scale_log2 - m_new)
//   l_i = exp2(m_i - m_new) * l_i + rowsum(P_ij)
//   acc = exp2(m_i - m_new) * acc + P_ij Vj   (P_ij converted to fp16/bf16 straight from the S
//                                              accumulators: their layout is mma's A layout)
// and at the end O = acc / l_i, lse = (m_i + log2 l_i) ln 2, staged through shared memory for 16-byte stores.
// The K/V loop covers only the tiles the block's rows see (mask.kv_tile_begin .. kv_tile_end: both ends are
// skipped); with a right bound (causal) blocks run heaviest-first; only the rows whose window edge or the Nk
// tail cuts a tile pay for per-element masking there (frag::online_softmax).
// Variants: the window (window_left, window_right) is the mask's; grouped-query attention reads K/V head
// h / group (frag::forward_block; group = Hq / Hk, 1 without); DROPOUT = true multiplies P_ij by Z_ij / (1 - p)
// after the online softmax (l_i and lse are those of P before dropout), Z_ij drawn from (seed_lo, seed_hi)
// (frag::Dropout). Without DROPOUT the dropout arguments are not read.
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"

template <int D, int Bc, int NWARPS, int MT, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_fwd(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
            const unsigned short* __restrict__ V, unsigned short* __restrict__ O, float* __restrict__ LSE, int Nq,
            int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
            unsigned seed_lo, unsigned seed_hi, int BH) {
    using namespace frag;  // mma_abt_rows, mma_ab_rows, online_softmax, ... (fragments.cuh), ptx, tiles
    static_assert(D % 32 == 0 && Bc % 16 == 0, "D must be a multiple of 32 and Bc of 16");
    constexpr int WR = 16 * MT;          // query rows per warp (MT m16 tiles)
    constexpr int Br = WR * NWARPS;      // query rows per block
    constexpr int NTHREADS = NWARPS * 32;
    constexpr int KSTEPS = D / 16;       // k-steps of S = Q K^T
    constexpr int NTILES_S = Bc / 8;     // n8 tiles of S
    constexpr int NTILES_O = D / 8;      // n8 tiles of O
    // One m16 tile per warp: its Q fragments stay in registers. Two: they are re-read from shared
    // memory each k-step (registers go to the doubled accumulators), but every K/V fragment read by
    // ldmatrix then feeds two mma instead of one: half the shared-memory traffic per FLOP. At D = 256 the
    // accumulator alone is 128 registers: Q is re-read from shared memory there too.
    constexpr bool Q_IN_REGS = (MT == 1 && D <= 128);
    // With Q in registers, sQ is free after the first K/V tile: a block with a next work item loads that item's
    // Q and first K/V tile under its last K/V tile, and stages O in the last K tile's buffer instead of Q's rows
    // (which needs Br <= Bc). Not with dropout, whose Philox rounds leave no registers for the walk.
    constexpr bool AHEAD = Q_IN_REGS && Br <= Bc && !DROPOUT;
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sQ = smem_u32(smem);       // (Br, D)
    const unsigned sK = sQ + Br * D * 2;      // 2 x (Bc, D)
    const unsigned sV = sK + 2 * Bc * D * 2;  // 2 x (Bc, D)
    constexpr unsigned KV_BYTES = Bc * D * 2;

    const int warp = threadIdx.x / 32;
    const int wrow = warp * WR;  // the warp's first row in the block
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const ScoreScale sc = score_scale(scale_log2);  // scale_log2 < 0: -Q, |scale_log2|
    // Work items: Br query rows (rows block m) of query head bh. A grid of (n_m, B Hq) blocks takes one each,
    // (blockIdx.x, blockIdx.y); a persistent grid of (G, 1) blocks (launch_specs.mma_fwd, AHEAD configs only) walks
    // the items b, b + G, b + 2G, ... (item u: rows block u % n_m of head u / n_m). 32-bit arithmetic on
    // block-uniform values, which stay in the uniform datapath.
    const int n_m = (Nq + Br - 1) / Br;
    const bool walk = AHEAD && gridDim.y == 1;
    int m = blockIdx.x;
    long long bh = blockIdx.y;
    if (walk) bh = m / n_m, m %= n_m;
    int g = 0;           // K/V tiles through the two buffers so far, over all of the block's items
    bool ahead = false;  // this item's Q and first K/V tile were loaded under the last item's last tile
    for (;;) {  // one item, or (walk) every item of the block's walk
        if (walk && bh >= BH) break;
        const ForwardBlock blk = walk ? forward_block<Br, Bc, D>(mask, K, V, group, m, n_m, bh)
                                      : forward_block<Br, Bc, D>(mask, K, V, group);  // the block's own item
        int m_next = 0;  // the block's next item (walk): rows block m_next of head bh_next (none: bh_next = BH)
        long long bh_next = BH;
        if (walk) m_next = m + (int)gridDim.x, bh_next = bh + m_next / n_m, m_next %= n_m;
        const int q0 = blk.q0, n_tiles = blk.n_tiles;
        const Dropout dp = make_dropout(dropout_p, seed_lo, seed_hi, blk.bh, Nq, Nk);  // read only if DROPOUT

        // prologue: Q and the first K/V tile in flight (unless they already are)
        if (!ahead) {
            load_tile_async<Br, D, NTHREADS>(sQ, Q + blk.bh * Nq * D, q0, Nq);
            if (n_tiles > 0) {
                load_tile_async<Bc, D, NTHREADS>(sK + (g & 1) * KV_BYTES, blk.k, 0, blk.nk);
                load_tile_async<Bc, D, NTHREADS>(sV + (g & 1) * KV_BYTES, blk.v, 0, blk.nk);
            }
            cp_async_commit();
        }
        ahead = false;

        unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];  // A fragments of the warp's 16 Q rows (MT == 1)
        float acc[MT][NTILES_O][4];              // O accumulator (WR x D)
        float m_i[MT][2], l_i[MT][2];            // running max (log2 units) and this thread's part of the sums
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            m_i[mt][0] = m_i[mt][1] = FA_NEG_INF;
            l_i[mt][0] = l_i[mt][1] = 0.0f;
            zero(acc[mt]);
        }
        RowKeys rk[MT];  // the keys this thread's rows see
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) rk[mt] = row_keys(mask, q0 + wrow + mt * 16, blk.kv0);

        for (int j = 0; j < n_tiles; ++j) {
            const int j0 = j * Bc;  // the tile's first key, counted from blk.kv0
            const unsigned kb = sK + ((g + j) & 1) * KV_BYTES, vb = sV + ((g + j) & 1) * KV_BYTES;
            const unsigned kn = sK + ((g + j + 1) & 1) * KV_BYTES, vn = sV + ((g + j + 1) & 1) * KV_BYTES;
            if (j + 1 < n_tiles) {  // prefetch tile j + 1 into the other buffer, then wait for tile j
                load_tile_async<Bc, D, NTHREADS>(kn, blk.k, j0 + Bc, blk.nk);
                load_tile_async<Bc, D, NTHREADS>(vn, blk.v, j0 + Bc, blk.nk);
                cp_async_commit();
                cp_async_wait<1>();
            } else if (AHEAD && j > 0 && bh_next < BH) {  // the last tile: the next item's Q and first tile
                // (j > 0: every warp has its Q fragments)
                const ForwardBlock nxt = forward_block<Br, Bc, D>(mask, K, V, group, m_next, n_m, bh_next);
                load_tile_async<Br, D, NTHREADS>(sQ, Q + nxt.bh * Nq * D, nxt.q0, Nq);
                if (nxt.n_tiles > 0) {
                    load_tile_async<Bc, D, NTHREADS>(kn, nxt.k, 0, nxt.nk);
                    load_tile_async<Bc, D, NTHREADS>(vn, nxt.v, 0, nxt.nk);
                }
                cp_async_commit();
                cp_async_wait<1>();
                ahead = true;
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            if (Q_IN_REGS && j == 0) {
#pragma unroll
                for (int kk = 0; kk < (Q_IN_REGS ? KSTEPS : 1); ++kk) {
                    load_a<D>(qf[kk], sQ, wrow, kk);
                    apply_sign(qf[kk], sc.q_sign);
                }
            }

            // ---- S_ij = Qi Kj^T  (WR x Bc per warp)
            float s[MT][NTILES_S][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) zero(s[mt]);
            mma_abt_rows<D, NTILES_S, MT, BF16>(s, [&](unsigned (&a)[4], int mt, int kk) {
                if constexpr (Q_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[x] = qf[Q_IN_REGS ? kk : 0][x];
                } else {
                    load_a<D>(a, sQ, wrow + mt * 16, kk);
                    apply_sign(a, sc.q_sign);
                }
            }, kb, 0);

            // ---- online softmax on each m16 tile (masked only in rows the tile's edge cuts); acc = alpha * acc;
            //      P_ij as the A fragments of P_ij Vj
            unsigned pf[MT][Bc / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float alpha[2];
                online_softmax(s[mt], m_i[mt], l_i[mt], alpha, sc.scale_log2, rk[mt], j0);
                rescale_rows(acc[mt], alpha);
                if constexpr (DROPOUT) dropout_rows(s[mt], dp, q0 + wrow + mt * 16, blk.kv0 + j0);
                pack_a<NTILES_S, BF16>(pf[mt], s[mt]);
            }

            // ---- acc += P_ij Vj   (Vj through ldmatrix.trans: B[k = key][n = d])
            mma_ab_rows<D, Bc / 16, MT, BF16>(acc, pf, vb, 0);
            __syncthreads();  // every warp is done with buffer j & 1 before it is refilled
        }
        if (!ahead) cp_async_wait<0>();  // (n_tiles == 0: the Q load) nothing of this item may still be in flight
        __syncthreads();

        // ---- epilogue: O = acc / l_i, lse = (m_i + log2 l_i) ln 2; O staged in the warp's own rows of sQ (AHEAD:
        //      of the last K tile's buffer, while the next item's Q lands in sQ)
        // (the last tile's buffer is (g + n_tiles - 1) & 1, written + 1 to stay non-negative when n_tiles = 0)
        unsigned char* sO = AHEAD ? smem + (sK - sQ) + ((g + n_tiles + 1) & 1) * KV_BYTES : smem;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float inv_l[2];
            finish_rows(inv_l, l_i[mt], m_i[mt], LSE + blk.bh * Nq, q0 + wrow + mt * 16, Nq);
            stage_rows<D, BF16>(acc[mt], inv_l, [&](int r, int c) { return sO + swz<D>(wrow + mt * 16 + r, c); });
        }
        __syncwarp();
        store_staged<WR, D>(O + blk.bh * Nq * D, q0 + wrow, Nq,
                            [&](int r, int c) { return sO + swz<D>(wrow + r, c); });
        if (!walk) break;  // one item per block
        g += n_tiles;
        m = m_next, bh = bh_next;
        if (bh < BH) __syncthreads();  // every warp has read its rows of sO before the next item's loads
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_MMA_INST(D, Bc, NW, MT, BF)                                                                       \
    template __global__ void mma_fwd<D, Bc, NW, MT, BF>(const unsigned short*, const unsigned short*,       \
                                                        const unsigned short*, unsigned short*, float*, int, \
                                                        int, float, int, int, int, float, unsigned, unsigned, int);
#define FA_MMA_DROPOUT_INST(D, Bc, NW, MT, BF)                                                               \
    template __global__ void mma_fwd<D, Bc, NW, MT, BF, true>(const unsigned short*, const unsigned short*, \
                                                              const unsigned short*, unsigned short*, float*, \
                                                              int, int, float, int, int, int, float, unsigned, \
                                                              unsigned, int);
FA_MMA_INST(32, 128, 4, 2, false)
FA_MMA_INST(32, 128, 4, 2, true)
FA_MMA_INST(96, 128, 8, 1, false)
FA_MMA_INST(96, 128, 8, 1, true)
FA_MMA_INST(64, 128, 4, 2, false)
FA_MMA_INST(64, 128, 4, 2, true)
FA_MMA_INST(64, 64, 4, 2, false)
FA_MMA_INST(64, 64, 4, 2, true)
FA_MMA_INST(128, 128, 8, 1, false)
FA_MMA_INST(128, 128, 8, 1, true)
FA_MMA_INST(128, 32, 4, 2, false)
FA_MMA_INST(128, 32, 4, 2, true)
FA_MMA_INST(64, 64, 8, 2, false)
FA_MMA_INST(64, 64, 8, 2, true)
FA_MMA_INST(128, 64, 8, 1, false)
FA_MMA_INST(128, 64, 8, 1, true)
FA_MMA_INST(256, 64, 4, 1, false)
FA_MMA_INST(256, 64, 4, 1, true)
FA_MMA_DROPOUT_INST(32, 64, 4, 2, false)
FA_MMA_DROPOUT_INST(32, 64, 4, 2, true)
FA_MMA_DROPOUT_INST(96, 128, 8, 1, false)
FA_MMA_DROPOUT_INST(96, 128, 8, 1, true)
FA_MMA_DROPOUT_INST(64, 64, 4, 2, false)
FA_MMA_DROPOUT_INST(64, 64, 4, 2, true)
FA_MMA_DROPOUT_INST(128, 128, 8, 1, false)
FA_MMA_DROPOUT_INST(128, 128, 8, 1, true)
FA_MMA_DROPOUT_INST(256, 64, 4, 1, false)
FA_MMA_DROPOUT_INST(256, 64, 4, 1, true)
#endif
