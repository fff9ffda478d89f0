// wgmma_ws.cu -- rung 3c of the CUDA ladder: the wgmma forward, warp-specialised as in FlashAttention-3
// (Shah et al., 2024). sm_90a only; fp16 or bf16 in, fp32 accumulate.
//
// wgmma.cu issues its products so that the softmax can overlap the next product inside a warpgroup (in its SASS
// it waits for the product first: wgmma.cu's header), but every thread still
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
// (at D = 128, acc *= exp2(m_i - m_new) waits for the next turn instead, and runs between the issue of S_i,j+2 and
// that of P_i,j+1 Vj+1, on the tensor cores' time: FlashAttention-3's order, RESCALE_IN_TURN; and, without dropout,
// only on a tile where a row of the warp grew its max by more than 2^8: FlashAttention-4's lazy rescale, LAZY_RESCALE)
// and at the end O = acc / l_i, lse = (m_i + log2 l_i) ln 2, as in wgmma.cu (the same fragments.cuh steps,
// the same products from wgmma_ops.cuh, the same masks.cuh rule and tile ranges, GQA and dropout).
//
// The tensor maps (runtime.tensor_map) describe q as (B Hq, Nq, D) and k, v as (B Hk, Nk, D) 16-bit tensors
// with boxes of 64 columns (32 at D = 32 and 96): the copy engine zero-fills rows past Nq or Nk of a head, and
// rows before its row 0 (never another head's), and a K/V head is addressed by its index bh / group
// (grouped-query attention: no copy). With a right bound (causal) the rows blocks are aligned to the LAST query row
// (pad_top below): where Nq is not a multiple of Br, the first block starts above row 0, and its padding rows, which
// would see all keys at the bottom, see almost none at the top.
//
// The block is PERSISTENT: the grid has one block per SM (or fewer), and each block walks its share of the
// work items (64 CWG query rows of one head; with causal, pairs of them that together see as many keys as any
// other pair, or the items longest first: the walk below, kept in shared memory). The producer runs ahead
// across items: it loads the next item's Q as soon as every consumer has issued its last product with this
// one's Q (mbarrier q_empty), and its K/V tiles as the ring frees slots, so the next item's loads overlap this
// item's last product and its epilogue instead of waiting for a new block. The epilogue stages O in its own
// shared tile (OWN_O; at D = 256, where shared memory is short, in Q's rows, and the next Q waits for it). The
// ring's slots and phases run on across items (g counts the K/V tiles through it).
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "tma.cuh"
#include "wgmma_ops.cuh"

template <int D, int Bc, int CWG, int STAGES, bool BF16, bool DROPOUT, bool OWN_O>
__global__ void __launch_bounds__((CWG + 1) * 128, 1)
    wgmma_ws_fwd(const __grid_constant__ tma::TmaMap tmQ, const __grid_constant__ tma::TmaMap tmK,
                 const __grid_constant__ tma::TmaMap tmV, unsigned short* __restrict__ O, float* __restrict__ LSE,
                 int Nq, int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
                 unsigned seed_lo, unsigned seed_hi, int BH, int heads_per_section, int walk_len) {
    using namespace wgmma_ops;
    static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "D in {32, 64, 96, 128, 256}");
    static_assert(Bc == 64 || Bc == 128 || Bc == 160 || Bc == 176 || Bc == 192, "Bc in {64, 128, 160, 176, 192}");
    static_assert((CWG == 2 || CWG == 3) && STAGES >= 2, "2 or 3 consumer warpgroups, at least 2 stages");
    constexpr int Br = 64 * CWG;        // query rows per work item
    constexpr int CT = CWG * 128;        // consumer threads
    // registers per thread after the split: 65536 / NT at entry, the producer keeps 24, the consumers share
    // the rest (a multiple of 8): 240 for 2 consumer warpgroups, 160 for 3
    constexpr int CONSUMER_REGS = CWG == 2 ? 240 : 160;
    // Where acc's rescale runs in the loop: at D = 128 (two consumer warpgroups) inside the turn, after S_i,j+1 is
    // issued and beside it (FlashAttention-3's order); at D = 64 (three, whose turns are shorter) after P_ij Vj,
    // outside the turn. Each was the faster of the two there (docs/results/cuda/forward_rescale_order/); at D = 256
    // the turn's order made ptxas spill more, and it keeps the rescale after P_ij Vj.
    constexpr bool RESCALE_IN_TURN = D == 128 && CWG == 2;
    // Inside the turn the rescale delays P_ij Vj and the next warpgroup's turn: there it is lazy, skipped on a tile
    // where no row of the warp grew its max by more than 2^8 (frag::online_softmax, LAZY; most tiles after the
    // first few). After P_ij Vj it hides behind the exp2s, and the branch would cost more than it saves. Not with
    // dropout: P_ij / (1 - p) goes into the fp16 P fragments, and with P_ij up to 2^8 it would pass fp16's 65504
    // once p > 0.996 (with m_new as the reference, P_ij <= 1 and 1 / (1 - p) stays in range).
    constexpr bool LAZY_RESCALE = RESCALE_IN_TURN && !DROPOUT;
    constexpr unsigned Q_BYTES = Br * D * 2, KV_BYTES = Bc * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const unsigned raw = smem_u32(smem_raw);
    const unsigned pad = (1024u - (raw & 1023u)) & 1023u;  // tiles start 1024-byte aligned (the swizzle)
    unsigned char* smem = smem_raw + pad;
    const unsigned sQ = raw + pad;                 // (Br, D)
    const unsigned sK = sQ + Q_BYTES;              // STAGES x (Bc, D)
    const unsigned sV = sK + STAGES * KV_BYTES;    // STAGES x (Bc, D)
    const unsigned o_off = OWN_O ? Q_BYTES + 2 * STAGES * KV_BYTES : 0;  // O's staging tile (Br, D): own, or Q's
    unsigned char* sO = smem + o_off;
    const unsigned bars = sQ + (OWN_O ? 2 : 1) * Q_BYTES + 2 * STAGES * KV_BYTES;  // the mbarriers, 8 bytes each:
    const unsigned q_full = bars;                  //   Q landed
    const unsigned q_empty = bars + 8;             //   Q read by every consumer warp (and O staged, if in Q)
    // g: the running count of K/V tiles through the ring, over all the block's work items
    auto k_full = [&](int g) { return bars + 8 * (2 + g % STAGES); };               // K_g landed in its slot
    auto v_full = [&](int g) { return bars + 8 * (2 + STAGES + g % STAGES); };      // V_g landed
    auto k_empty = [&](int g) { return bars + 8 * (2 + 2 * STAGES + g % STAGES); }; // K_g's slot read by all
    auto v_empty = [&](int g) { return bars + 8 * (2 + 3 * STAGES + g % STAGES); }; // V_g's slot read by all
    auto k_tile = [&](int g) { return sK + (g % STAGES) * KV_BYTES; };
    auto v_tile = [&](int g) { return sV + (g % STAGES) * KV_BYTES; };
    auto use = [&](int g) { return (unsigned)(g / STAGES); };  // how often tile g's slot was filled before

    const int tid = threadIdx.x, wg = tid / 128;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    // The block's walk: its k-th work item (k = 0, 1, ...), an item being Br query rows of one head. Without a
    // right bound every item sees as many keys, and block b takes items u = b, b + G, b + 2G, ... (G = gridDim.x):
    // rows block u % n_m of query head u / n_m. With a right bound (causal) a later rows block sees more keys;
    // launch_specs picks one of two walks (heads_per_section):
    //   pairs (0)   a unit is a PAIR of rows blocks, p and n_m - 1 - p of one head, whose keys add up to about the
    //               same for every pair, and block b takes units b, b + G, ..., both items of each in turn: every
    //               block gets the same work, in coarse units (the middle rows block of an odd n_m is alone);
    //   longest first (> 0)   the items are numbered in sections of heads_per_section heads whose K/V fit in L2,
    //               in each the rows blocks outer, heaviest first, and the heads inner, and the blocks take them
    //               in a snake, b in even rounds and G - 1 - b in odd ones (round k: items kG .. kG + G - 1): the
    //               block with the heaviest item of a round gets the lightest of the next, and all end with short
    //               items. Finer than pairs where a block has few.
    // The walk is worked out once, an item per thread, into shared memory: entry k is (query head, first row, first
    // K/V row, K/V tiles); K/V tiles -2: no item (the middle rows block's pair), -1: past the walk. Both roles then
    // keep only k (no item arithmetic in their loops, and no registers for it). A block has at most walk_len items
    // (launch_specs sizes the shared memory for walk_len + 1 entries).
    const unsigned walk = bars + 8 * (2 + 4 * STAGES);  // 16-byte aligned
    auto entry = [&](int k) { return ptx::ld_shared_v4(walk + 16 * k); };  // (bh, q0, kv0, n_tiles)
    for (int k = tid; k <= walk_len; k += (CWG + 1) * 128) {
        const int n_m = (Nq + Br - 1) / Br, G = (int)gridDim.x, b = (int)blockIdx.x;
        // With a right bound the rows blocks end at the last query row, and the padding of a ragged Nq (Br = 192
        // at D = 64: 4096 = 21 x 192 + 64) is at the top, where the mask leaves its rows the fewest keys: the
        // block of rows -128 .. 63 visits 1 K/V tile where rows 4032 .. 4223 visited all 32 (launch_specs.rows_pad_top)
        const int pad_top = mask.heavy_last() ? n_m * Br - Nq : 0;
        const bool paired = mask.heavy_last() && heads_per_section == 0;
        const bool lpt = mask.heavy_last() && heads_per_section > 0;
        const int per_head = paired ? (n_m + 1) / 2 : n_m, n_units = per_head * BH;  // < 2^31 (launch_specs)
        const int u = paired ? b + (k >> 1) * G : k * G + (lpt && (k & 1) ? G - 1 - b : b);
        int4 e = make_int4(0, 0, 0, -1);  // past the walk
        if (k < walk_len && u < n_units) {
            frag::ForwardBlock blk;
            if (lpt) {
                const int per_section = heads_per_section * n_m, section = u / per_section;
                const int w = u - section * per_section;
                const int heads = min(heads_per_section, BH - section * heads_per_section);  // in this section
                const long long head = (long long)section * heads_per_section + w % heads;
                blk = frag::forward_item<Br, Bc>(mask, w / heads, n_m, head, pad_top);
            } else {
                const int p = u % per_head, second = paired && (k & 1), m = second ? n_m - 1 - p : p;
                blk = frag::forward_item<Br, Bc>(mask, m, n_m, u / per_head, pad_top);
                if (second && m == p) blk.n_tiles = -2;
            }
            e = make_int4((int)blk.bh, blk.q0, blk.kv0, blk.n_tiles);
        }
        ptx::st_shared_v4(walk + 16 * k, e.x, e.y, e.z, e.w);
    }

    if (tid == 0) {
        tma::mbar_init(q_full, 1);
        tma::mbar_init(q_empty, CT / 32);  // one arrive per consumer warp
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
            int g = 0, qi = 0;  // K/V tiles and Q tiles loaded so far
            for (int k = 0;; ++k) {
                const int4 it = entry(k);  // (bh, q0, kv0, n_tiles)
                if (it.w == -1) break;     // past the walk
                if (it.w <= 0) continue;   // no item, or rows that see no key (the consumers write them)
                const int kv_head = it.x / group;  // the K/V head this query head reads
                if (qi > 0) tma::mbar_wait(q_empty, (qi - 1) & 1);  // the last item's Q read by every warp
                tma::mbar_arrive_expect_tx(q_full, Q_BYTES);
                tma::load_tile<Br, D>(sQ, tmQ, it.y, it.x, q_full);
                for (int j = 0; j < it.w; ++j, ++g) {
                    const int row = it.z + j * Bc;
                    if (g >= STAGES) tma::mbar_wait(k_empty(g), (use(g) - 1) & 1);  // K_g-STAGES read by every warp
                    tma::mbar_arrive_expect_tx(k_full(g), KV_BYTES);
                    tma::load_tile<Bc, D>(k_tile(g), tmK, row, kv_head, k_full(g));
                    if (g >= STAGES) tma::mbar_wait(v_empty(g), (use(g) - 1) & 1);
                    tma::mbar_arrive_expect_tx(v_full(g), KV_BYTES);
                    tma::load_tile<Bc, D>(v_tile(g), tmV, row, kv_head, v_full(g));
                }
                ++qi;
            }
        }
    } else {
        // ------------------------------------------------------------------ consumers
        tma::regs_inc<CONSUMER_REGS>();
        const int cwg = wg - 1;                        // consumer warpgroup: rows 64 cwg .. 64 cwg + 63
        const int warp = tid / 32 - 4;                 // consumer warp
        const bool lane0 = tid % 32 == 0;              // frees slots for its warp
        const int my_turn = 1 + cwg, next_turn = 1 + (cwg + 1) % CWG;  // named barriers of the ping-pong
        const int wrow = 64 * cwg + 16 * (warp % 4);  // the warp's first row in the item
        const unsigned sQ_wg = sQ + 64 * cwg * Panels<D>::ROW_BYTES;  // this warpgroup's 64 rows of each Q panel
        const frag::ScoreScale sc = frag::score_scale(scale_log2);  // scale_log2 < 0: -Q, |scale_log2|
        auto staged = [&](int r, int c) { return sO + swizzle<Br, D>(wrow + r, c); };  // the warp's rows of O

        // items whose rows see no key: O = 0, lse = -inf
        for (int k = 0;; ++k) {
            const int4 it = entry(k);  // (bh, q0, kv0, n_tiles)
            if (it.w == -1) break;
            if (it.w != 0) continue;
            const long long bh = it.x;
            for (int e = tid - 128; e < Br * D; e += CT)  // rows 0 <= it.y + e / D < Nq (it.y < 0: pad_top)
                if ((unsigned)(it.y + e / D) < (unsigned)Nq) O[(bh * Nq + it.y) * D + e] = 0;
            for (int r = tid - 128; r < Br; r += CT)
                if ((unsigned)(it.y + r) < (unsigned)Nq) LSE[bh * Nq + it.y + r] = FA_NEG_INF;
        }

        float acc[D / 2];         // O accumulator, 64 x D per warpgroup
        float s[Bc / 2];          // S_ij, then P_ij in fp32
        unsigned pf[Bc / 16][4];  // P_ij as fp16/bf16 A fragments
        int g = 0, qi = 0;        // as the producer counts them
        if (cwg == CWG - 1) tma::named_arrive(1, 256);  // the first turn goes to warpgroup 0
        for (int k = 0;; ++k) {
            const int4 it = entry(k);  // (bh, q0, kv0, n_tiles)
            if (it.w == -1) break;     // past the walk
            if (it.w <= 0) continue;   // no item, or written above
            const int n_tiles = it.w, kv0 = it.z;
            const long long bh = it.x;
            const int row0 = it.y + wrow;              // the warp's first row in the head
            const frag::RowKeys rk = frag::row_keys(mask, row0, kv0);
            const frag::Dropout dp = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // if DROPOUT
            float m_i[2] = {FA_NEG_INF, FA_NEG_INF}, l_i[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
            for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < Bc / 2; ++i) s[i] = 0.0f;

            tma::mbar_wait(q_full, qi & 1);
            if (sc.q_sign != 0) {  // scale < 0: flip the sign of the warpgroup's own rows of Q (fragments.cuh)
                for (int e = tid % 128; e < 64 * (D / 8); e += 128)
                    frag::apply_sign(
                        *reinterpret_cast<uint4*>(smem + swizzle<Br, D>(64 * cwg + e / (D / 8), e % (D / 8))),
                        sc.q_sign);
                fence_proxy_async();                   // visible to the tensor cores ...
                tma::named_sync(1 + CWG + cwg, 128);   // ... and done by the whole warpgroup
            }

            // S_i0 and its softmax
            tma::mbar_wait(k_full(g), use(g) & 1);
            tma::named_sync(my_turn, 256);
            wgmma_fence();
            issue_abt<D, Br, Bc, BF16>(s, sQ_wg, k_tile(g));  // S_i0 = Qi K_0^T
            tma::named_arrive(next_turn, 256);
            wgmma_wait<0>();
            pin(s);
            if (lane0) tma::mbar_arrive(k_empty(g));
            // rescale: acc must be rescaled by alpha (LAZY_RESCALE: false where the warp's rows kept their max)
            bool rescale =
                frag::online_softmax<Bc / 8, LAZY_RESCALE>(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i, l_i, alpha,
                                                           sc.scale_log2, rk, 0);
            if constexpr (DROPOUT) frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, kv0);
            frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));

            for (int j = 0; j + 1 < n_tiles; ++j, ++g) {  // K_g+1 = K_j+1, V_g = V_j
                tma::mbar_wait(k_full(g + 1), use(g + 1) & 1);  // K_j+1 and V_j have landed
                tma::mbar_wait(v_full(g), use(g) & 1);
                tma::named_sync(my_turn, 256);  // the tensor cores are ours
                pin(acc);       // acc (rescaled) and pf (packed) were written by ordinary instructions:
                pin(pf);        // those writes come before ...
                wgmma_fence();  // ... this fence, which orders them before the products below
                issue_abt<D, Br, Bc, BF16>(s, sQ_wg, k_tile(g + 1));  // S_i,j+1 = Qi K_j+1^T
                if constexpr (RESCALE_IN_TURN) {  // acc = exp2(m_i - m_new) * acc while S_i,j+1 runs
                    if (rescale) frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);
                    pin(acc);
                    wgmma_fence();
                }
                issue_ab<D, Bc, BF16>(acc, pf, v_tile(g));            // acc += P_ij Vj
                tma::named_arrive(next_turn, 256);                    // the next warpgroup's turn
                wgmma_wait<1>();  // S_i,j+1 is done (P_ij Vj may still run): its softmax overlaps P_ij Vj
                pin(s);
                if (lane0) tma::mbar_arrive(k_empty(g + 1));
                rescale = frag::online_softmax<Bc / 8, LAZY_RESCALE>(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i,
                                                                     l_i, alpha, sc.scale_log2, rk, (j + 1) * Bc);
                // (the keep decisions depend only on where the scores are; drawn as bits before wgmma_wait<1>, while
                // S_i,j+1 is computed, the forward ran at 0.93-0.97x: docs/results/cuda/dropout_bits_before_wait/)
                if constexpr (DROPOUT)
                    frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, kv0 + (j + 1) * Bc);
                wgmma_wait<0>();  // P_ij Vj is done: acc and pf are ours again, V_j's slot is free
                pin(acc);
                pin(pf);
                if (lane0) tma::mbar_arrive(v_empty(g));
                if (!RESCALE_IN_TURN && rescale)  // acc = exp2(m_i - m_new) * acc
                    frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);
                frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));
            }
            // every product that reads Q has finished: the producer may load the next item's Q
            if (OWN_O && lane0) tma::mbar_arrive(q_empty);
            // the last tile: acc += P_i,n-1 V_n-1
            tma::mbar_wait(v_full(g), use(g) & 1);
            if (RESCALE_IN_TURN && rescale)  // (the first tile's alpha is 0, on acc = 0)
                frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);
            tma::named_sync(my_turn, 256);
            pin(acc);
            pin(pf);
            wgmma_fence();
            issue_ab<D, Bc, BF16>(acc, pf, v_tile(g));
            tma::named_arrive(next_turn, 256);  // at once: the next warpgroup's turn waits for nothing of ours
            wgmma_wait<0>();
            pin(acc);
            if (lane0) tma::mbar_arrive(v_empty(g));
            ++g;

            // ---- epilogue: O = acc / l_i, lse = (m_i + log2 l_i) ln 2; O staged in the warp's own rows of sO
            float inv_l[2];
            frag::finish_rows(inv_l, l_i, m_i, LSE + bh * Nq, row0, Nq);
            frag::stage_rows<D, BF16>(reinterpret_cast<float (&)[D / 8][4]>(acc), inv_l, staged);
            __syncwarp();
            frag::store_staged<16, D>(O + bh * Nq * D, row0, Nq, staged);
            __syncwarp();  // the warp's lanes have read its rows back before any lane stages the next item's
            if (!OWN_O && lane0) {  // O was staged in Q's rows: now the producer may load the next Q over them
                fence_proxy_async();
                tma::mbar_arrive(q_empty);
            }
            ++qi;
        }
        // every turn taken was passed on: warpgroup 0 takes back the last one (the ring's first arrive)
        if (cwg == 0) tma::named_sync(1, 256);
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
// OWN_O as launch_specs.wgmma_ws_fwd decides it: whether O's staging tile fits beside Q and the K/V ring.
#define FA_WGMMA_WS_PARAMS                                                                                    \
    (const __grid_constant__ tma::TmaMap, const __grid_constant__ tma::TmaMap,                                \
     const __grid_constant__ tma::TmaMap, unsigned short*, float*, int, int, float, int, int, int, float, unsigned, \
     unsigned, int, int, int);
#define FA_WGMMA_WS_INST(D, Bc, CWG, ST, BF, DROP, OWN) \
    template __global__ void wgmma_ws_fwd<D, Bc, CWG, ST, BF, DROP, OWN> FA_WGMMA_WS_PARAMS
FA_WGMMA_WS_INST(32, 128, 3, 2, false, false, true)
FA_WGMMA_WS_INST(32, 128, 3, 2, true, false, true)
FA_WGMMA_WS_INST(96, 128, 2, 2, false, false, true)
FA_WGMMA_WS_INST(96, 128, 2, 2, true, false, true)
FA_WGMMA_WS_INST(32, 128, 2, 2, false, true, true)
FA_WGMMA_WS_INST(32, 128, 2, 2, true, true, true)
FA_WGMMA_WS_INST(96, 128, 2, 2, false, true, true)
FA_WGMMA_WS_INST(96, 128, 2, 2, true, true, true)
FA_WGMMA_WS_INST(64, 128, 3, 2, false, false, true)
FA_WGMMA_WS_INST(64, 128, 3, 2, true, false, true)
FA_WGMMA_WS_INST(128, 128, 2, 2, false, false, true)
FA_WGMMA_WS_INST(128, 128, 2, 2, true, false, true)
FA_WGMMA_WS_INST(64, 128, 2, 2, false, false, true)
FA_WGMMA_WS_INST(128, 160, 2, 2, false, false, true)
FA_WGMMA_WS_INST(128, 176, 2, 2, false, false, false)
FA_WGMMA_WS_INST(128, 176, 2, 2, true, false, false)
FA_WGMMA_WS_INST(128, 192, 2, 2, false, false, false)
FA_WGMMA_WS_INST(256, 64, 2, 2, false, false, false)
FA_WGMMA_WS_INST(256, 64, 2, 2, true, false, false)
FA_WGMMA_WS_INST(64, 128, 2, 2, false, true, true)
FA_WGMMA_WS_INST(64, 128, 2, 2, true, true, true)
FA_WGMMA_WS_INST(128, 128, 2, 2, false, true, true)
FA_WGMMA_WS_INST(128, 128, 2, 2, true, true, true)
FA_WGMMA_WS_INST(256, 64, 2, 2, false, true, false)
FA_WGMMA_WS_INST(256, 64, 2, 2, true, true, false)
#endif
