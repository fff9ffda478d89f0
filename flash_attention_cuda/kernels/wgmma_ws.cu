// wgmma_ws.cu -- rung 3c of the CUDA ladder: the wgmma forward, warp-specialised as in FlashAttention-3
// (Shah et al., 2024). sm_90a only; fp16 or bf16 in, fp32 accumulate.
//
// wgmma.cu already overlaps the softmax with the next product inside a warpgroup, but every thread still
// issues its share of the cp.async copies, and the whole block meets at a __syncthreads on every K/V tile, so
// the warpgroups wait for each other and for the slowest copy. Here the block is split by role:
//
//   warpgroup 0, the PRODUCER   one thread asks the copy engine (TMA, tma.cuh) for Q once and then, tile by
//                                tile, K_j and V_j into a ring of STAGES shared-memory slots. It waits only for
//                                a slot to be empty (mbarrier k_empty / v_empty) and reports nothing itself: the
//                                copy engine completes k_full / v_full when the bytes have landed. It keeps 24
//                                registers (setmaxnreg.dec) and gives the rest to ...
//   warpgroups 1 .. CWG, the CONSUMERS   64 query rows each (Br = 64 CWG), 240 registers (CWG = 2; 160 for 3).
//                                Each runs wgmma.cu's software-pipelined loop, waiting on k_full / v_full
//                                instead of a block barrier, and frees a slot (one arrive per warp) as soon
//                                as the product that reads it has finished.
//
// The consumers also take turns on the tensor cores ("ping-pong"): a warpgroup issues its two products of a
// tile only when the one before it has issued its own, through named barriers 1 .. CWG in a ring, so while
// one warpgroup runs its softmax (exp2 on the multi-function units) the other's products keep the tensor cores
// busy. In iteration j, for one consumer warpgroup (rows i):
//     wait k_full[K_j+1], v_full[V_j]
//     wait for my turn;  issue S_i,j+1 = Qi K_j+1^T;  issue acc += P_ij Vj;  pass the turn on
//     wait for S_i,j+1 -> free K_j+1's slot;  online softmax on it while P_ij Vj runs:
//         m_new = max(m_i, rowmax(S) * scale_log2),  P = exp2(S * scale_log2 - m_new),
//         l_i = exp2(m_i - m_new) * l_i + rowsum(P)
//     wait for P_ij Vj -> free V_j's slot;  acc *= exp2(m_i - m_new);  P_i,j+1 -> fp16/bf16 registers
// and at the end O = acc / l_i, lse = (m_i + log2 l_i) ln 2, as in wgmma.cu (the same fragments.cuh steps,
// the same products from wgmma_ops.cuh, the same masks.cuh rule and tile ranges, GQA and dropout).
//
// The tensor maps (runtime.tensor_map) describe q as (B Hq, Nq, D) and k, v as (B Hk, Nk, D) 16-bit tensors
// with boxes of 64 columns: the copy engine zero-fills rows past Nq or Nk of a head (never the next head's),
// and a K/V head is addressed by its index bh / group (grouped-query attention: no copy).
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "tma.cuh"
#include "wgmma_ops.cuh"

template <int D, int Bc, int CWG, int STAGES, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__((CWG + 1) * 128, 1)
    wgmma_ws_fwd(const __grid_constant__ tma::TmaMap tmQ, const __grid_constant__ tma::TmaMap tmK,
                 const __grid_constant__ tma::TmaMap tmV, unsigned short* __restrict__ O, float* __restrict__ LSE,
                 int Nq, int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
                 unsigned seed_lo, unsigned seed_hi) {
    using namespace wgmma_ops;
    static_assert((D == 64 || D == 128 || D == 256) && (Bc == 64 || Bc == 128 || Bc == 192),
                  "D in {64, 128, 256}, Bc in {64, 128, 192}");
    static_assert((CWG == 2 || CWG == 3) && STAGES >= 2, "2 or 3 consumer warpgroups, at least 2 stages");
    constexpr int Br = 64 * CWG;        // query rows per block
    constexpr int NT = (CWG + 1) * 128;  // threads
    constexpr int CT = CWG * 128;        // consumer threads
    // registers per thread after the split: 65536 / NT at entry, the producer keeps 24, the consumers share
    // the rest (a multiple of 8): 240 for 2 consumer warpgroups, 160 for 3
    constexpr int CONSUMER_REGS = CWG == 2 ? 240 : 160;
    constexpr unsigned Q_BYTES = Br * D * 2, KV_BYTES = Bc * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const unsigned raw = smem_u32(smem_raw);
    const unsigned pad = (1024u - (raw & 1023u)) & 1023u;  // tiles start 1024-byte aligned (the swizzle)
    unsigned char* smem = smem_raw + pad;
    const unsigned sQ = raw + pad;                // (Br, D)
    const unsigned sK = sQ + Q_BYTES;             // STAGES x (Bc, D)
    const unsigned sV = sK + STAGES * KV_BYTES;   // STAGES x (Bc, D)
    const unsigned bars = sV + STAGES * KV_BYTES;  // the mbarriers, 8 bytes each:
    const unsigned q_full = bars;                  //   Q landed
    auto k_full = [&](int j) { return bars + 8 * (1 + j % STAGES); };               // K_j landed in its slot
    auto v_full = [&](int j) { return bars + 8 * (1 + STAGES + j % STAGES); };      // V_j landed
    auto k_empty = [&](int j) { return bars + 8 * (1 + 2 * STAGES + j % STAGES); }; // K_j's slot read by all
    auto v_empty = [&](int j) { return bars + 8 * (1 + 3 * STAGES + j % STAGES); }; // V_j's slot read by all
    auto k_tile = [&](int j) { return sK + (j % STAGES) * KV_BYTES; };
    auto v_tile = [&](int j) { return sV + (j % STAGES) * KV_BYTES; };
    auto use = [&](int j) { return (unsigned)(j / STAGES); };  // how often tile j's slot was filled before

    const int tid = threadIdx.x, wg = tid / 128;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const frag::ForwardBlock blk = frag::forward_tiles<Br, Bc>(mask);  // head, query rows, K/V tiles
    const int q0 = blk.q0, n_tiles = blk.n_tiles;
    const long long bh = blk.bh;
    unsigned short* o = O + bh * Nq * D;

    if (n_tiles == 0) {  // no row of the block sees a key: O = 0, lse = -inf
        for (int e = tid; e < Br * D; e += NT)
            if (q0 + e / D < Nq) o[(long long)q0 * D + e] = 0;
        for (int r = tid; r < Br; r += NT)
            if (q0 + r < Nq) LSE[bh * Nq + q0 + r] = FA_NEG_INF;
        return;
    }
    if (tid == 0) {
        tma::mbar_init(q_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(k_full(s), 1);  // the producer's arrive_expect_tx, then the copy engine's bytes
            tma::mbar_init(v_full(s), 1);
            tma::mbar_init(k_empty(s), CT / 32);  // one arrive per consumer warp
            tma::mbar_init(v_empty(s), CT / 32);
        }
        tma::fence_barrier_init();
    }
    __syncthreads();  // the last block-wide barrier: from here on the roles meet only on mbarriers

    if (wg == 0) {
        // ------------------------------------------------------------------ producer
        tma::regs_dec<24>();
        if (tid == 0) {
            tma::prefetch_map(tmQ), tma::prefetch_map(tmK), tma::prefetch_map(tmV);
            const int kv_head = (int)(bh / group);  // the K/V head this query head reads
            tma::mbar_arrive_expect_tx(q_full, Q_BYTES);
            tma::load_tile<Br, D>(sQ, tmQ, q0, (int)bh, q_full);
            for (int j = 0; j < n_tiles; ++j) {
                const int row = blk.kv0 + j * Bc;
                if (j >= STAGES) tma::mbar_wait(k_empty(j), (use(j) - 1) & 1);  // K_j-STAGES read by every warp
                tma::mbar_arrive_expect_tx(k_full(j), KV_BYTES);
                tma::load_tile<Bc, D>(k_tile(j), tmK, row, kv_head, k_full(j));
                if (j >= STAGES) tma::mbar_wait(v_empty(j), (use(j) - 1) & 1);
                tma::mbar_arrive_expect_tx(v_full(j), KV_BYTES);
                tma::load_tile<Bc, D>(v_tile(j), tmV, row, kv_head, v_full(j));
            }
        }
    } else {
        // ------------------------------------------------------------------ consumers
        tma::regs_inc<CONSUMER_REGS>();
        const int cwg = wg - 1;                        // consumer warpgroup: rows 64 cwg .. 64 cwg + 63
        const int warp = tid / 32 - 4;                 // consumer warp
        const bool lane0 = tid % 32 == 0;              // frees slots for its warp
        const int my_turn = 1 + cwg, next_turn = 1 + (cwg + 1) % CWG;  // named barriers of the ping-pong
        const int wrow = 64 * cwg + 16 * (warp % 4);  // the warp's first row in the block
        const int row0 = q0 + wrow;                   // ... and in the head
        const unsigned sQ_wg = sQ + 64 * cwg * 128;   // this warpgroup's 64 rows of each Q panel
        const frag::ScoreScale sc = frag::score_scale(scale_log2);  // scale_log2 < 0: -Q, |scale_log2|
        const frag::RowKeys rk = frag::row_keys(mask, row0, blk.kv0);
        const frag::Dropout dp = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // if DROPOUT

        float acc[D / 2];         // O accumulator, 64 x D per warpgroup
        float s[Bc / 2];          // S_ij, then P_ij in fp32
        unsigned pf[Bc / 16][4];  // P_ij as fp16/bf16 A fragments
        float m_i[2] = {FA_NEG_INF, FA_NEG_INF}, l_i[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < Bc / 2; ++i) s[i] = 0.0f;

        tma::mbar_wait(q_full, 0);
        if (sc.q_sign != 0) {  // scale < 0: flip the sign of the warpgroup's own rows of Q (fragments.cuh)
            for (int e = tid % 128; e < 64 * (D / 8); e += 128)
                frag::apply_sign(*reinterpret_cast<uint4*>(smem + sw128<Br>(64 * cwg + e / (D / 8), e % (D / 8))),
                                 sc.q_sign);
            fence_proxy_async();                   // visible to the tensor cores ...
            tma::named_sync(1 + CWG + cwg, 128);   // ... and done by the whole warpgroup
        }
        if (cwg == CWG - 1) tma::named_arrive(1, 256);  // the first turn goes to consumer warpgroup 0

        // S_i0 and its softmax
        tma::mbar_wait(k_full(0), 0);
        tma::named_sync(my_turn, 256);
        wgmma_fence();
        issue_abt<D, Br, Bc, BF16>(s, sQ_wg, k_tile(0));  // S_i0 = Qi K_0^T
        tma::named_arrive(next_turn, 256);
        wgmma_wait<0>();
        pin(s);
        if (lane0) tma::mbar_arrive(k_empty(0));
        frag::online_softmax(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i, l_i, alpha, sc.scale_log2, rk, 0);
        if constexpr (DROPOUT) frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0);
        frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));

        for (int j = 0; j + 1 < n_tiles; ++j) {
            tma::mbar_wait(k_full(j + 1), use(j + 1) & 1);  // K_j+1 and V_j have landed
            tma::mbar_wait(v_full(j), use(j) & 1);
            tma::named_sync(my_turn, 256);  // the tensor cores are ours
            pin(acc);       // acc (rescaled) and pf (packed) were written by ordinary instructions:
            pin(pf);        // those writes come before ...
            wgmma_fence();  // ... this fence, which orders them before the products below
            issue_abt<D, Br, Bc, BF16>(s, sQ_wg, k_tile(j + 1));  // S_i,j+1 = Qi K_j+1^T
            issue_ab<D, Bc, BF16>(acc, pf, v_tile(j));            // acc += P_ij Vj
            tma::named_arrive(next_turn, 256);                    // the next warpgroup's turn
            wgmma_wait<1>();  // S_i,j+1 is done (P_ij Vj may still run): its softmax overlaps P_ij Vj
            pin(s);
            if (lane0) tma::mbar_arrive(k_empty(j + 1));
            frag::online_softmax(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i, l_i, alpha, sc.scale_log2, rk,
                                 (j + 1) * Bc);
            if constexpr (DROPOUT)
                frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0 + (j + 1) * Bc);
            wgmma_wait<0>();  // P_ij Vj is done: acc and pf are ours again, V_j's slot is free
            pin(acc);
            pin(pf);
            if (lane0) tma::mbar_arrive(v_empty(j));
            frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);  // acc = exp2(m_i - m_new) * acc
            frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));
        }
        // the last tile: acc += P_i,n-1 V_n-1
        tma::mbar_wait(v_full(n_tiles - 1), use(n_tiles - 1) & 1);
        tma::named_sync(my_turn, 256);
        pin(acc);
        pin(pf);
        wgmma_fence();
        issue_ab<D, Bc, BF16>(acc, pf, v_tile(n_tiles - 1));
        // every turn taken is passed on, except the last warpgroup's last one (the ring's first arrive was its)
        if (cwg != CWG - 1) tma::named_arrive(next_turn, 256);
        wgmma_wait<0>();
        pin(acc);

        // ---- epilogue: O = acc / l_i, lse = (m_i + log2 l_i) ln 2; O staged in the warp's own rows of Q
        float inv_l[2];
        frag::finish_rows(inv_l, l_i, m_i, LSE + bh * Nq, row0, Nq);
        frag::stage_rows<D, BF16>(reinterpret_cast<float (&)[D / 8][4]>(acc), inv_l,
                                  [&](int r, int c) { return smem + sw128<Br>(wrow + r, c); });
        __syncwarp();
        frag::store_staged<16, D>(o, row0, Nq, [&](int r, int c) { return smem + sw128<Br>(wrow + r, c); });
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_WGMMA_WS_PARAMS                                                                                    \
    (const __grid_constant__ tma::TmaMap, const __grid_constant__ tma::TmaMap,                                \
     const __grid_constant__ tma::TmaMap, unsigned short*, float*, int, int, float, int, int, int, float, unsigned, \
     unsigned);
#define FA_WGMMA_WS_INST(D, Bc, CWG, ST, BF) template __global__ void wgmma_ws_fwd<D, Bc, CWG, ST, BF> FA_WGMMA_WS_PARAMS
#define FA_WGMMA_WS_DROPOUT_INST(D, Bc, CWG, ST, BF) \
    template __global__ void wgmma_ws_fwd<D, Bc, CWG, ST, BF, true> FA_WGMMA_WS_PARAMS
FA_WGMMA_WS_INST(64, 128, 3, 2, false)
FA_WGMMA_WS_INST(64, 128, 3, 2, true)
FA_WGMMA_WS_INST(128, 128, 2, 2, false)
FA_WGMMA_WS_INST(128, 128, 2, 2, true)
FA_WGMMA_WS_INST(64, 128, 2, 2, false)
FA_WGMMA_WS_INST(128, 192, 2, 2, false)
FA_WGMMA_WS_INST(256, 64, 2, 2, false)
FA_WGMMA_WS_INST(256, 64, 2, 2, true)
FA_WGMMA_WS_DROPOUT_INST(64, 128, 2, 2, false)
FA_WGMMA_WS_DROPOUT_INST(64, 128, 2, 2, true)
FA_WGMMA_WS_DROPOUT_INST(128, 128, 2, 2, false)
FA_WGMMA_WS_DROPOUT_INST(128, 128, 2, 2, true)
FA_WGMMA_WS_DROPOUT_INST(256, 64, 2, 2, false)
FA_WGMMA_WS_DROPOUT_INST(256, 64, 2, 2, true)
#endif
