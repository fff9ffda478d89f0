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
// Head dims: the two kernels take D = 32, 64, 96, 128 and 256 (D = 32, 96: tiles in 32-column panels of the 64-byte
// swizzle, wgmma_ops.cuh's Panels); the one-kernel backwards (wgmma_bwd_fused, wgmma_bwd_ws) D = 32, 64, 96 and
// 128 (their dQ product's pieces: DqReduce).
#include "backward_common.cuh"
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "tma.cuh"
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
// C1, C2: (R, D) tiles, or their DC columns from the panel the caller's address points at (acc1, acc2 hold
// DC = 2 x DC2 columns: D, or 128 of D = 256 in the dK/dV kernel). The products are asynchronous and the elementwise work hides behind them: P is computed
// while dP is still running, dS while P C1 runs (with dropout, whose keep mask both need, P and dS are computed
// together once both products are done). Every wgmma reads registers written by ordinary instructions only after
// a wgmma.fence, and every register a wgmma uses is pinned (wgmma_ops::pin) until the wait that ends it.
// DV_BEFORE_DS false (wgmma_bwd_ws's tiles of 128 queries): dS is computed right after P, before dV's product is
// issued, so that P's 16-bit fragments are never live beside the fp32 S, dP and both accumulators (at 64 x 128
// they would not fit in the 240 registers a consumer thread has).
// lse2, delta, mask, row0, col0, drop: as bwd::p_and_ds takes them.
// dq: the third product of the one-kernel backward (DqReduce below; NoDq: none): store_ds(da) writes dS to shared
// memory, issue(s) puts dQ_i += dS_ij K_j in flight (into s, whose P has been packed by then) before dK += dS^T Q
// is issued, and add(s) waits for dQ's product alone and sends its sums out while dK's product still runs.
template <bool KEY_ROWS, bool DROPOUT, int D, int A_ROWS, int R, bool BF16, class Dq, int DC2,
          bool DV_BEFORE_DS = true>
__device__ __forceinline__ void tile_pair(float (&s)[R / 2], float (&dp)[R / 2], unsigned sA_s, unsigned sB_s,
                                          unsigned sA_dp, unsigned sB_dp, float (&acc1)[DC2], unsigned sC1,
                                          float (&acc2)[DC2], unsigned sC2, const float* lse2, const float* delta,
                                          float scale_log2, const fa::Mask& mask, int row0, int col0,
                                          const frag::Dropout& drop, const Dq& dq) {
    unsigned pa[R / 16][4], da[R / 16][4];  // P and dS as 16-bit A fragments
    wgmma_fence();
    issue_abt<D, A_ROWS, R, BF16>(s, sA_s, sB_s);     // S  (S^T)
    issue_abt<D, A_ROWS, R, BF16>(dp, sA_dp, sB_dp);  // dP (dP^T)
    if constexpr (DROPOUT) {  // (the keep decisions drawn as bits while S and dP run, before this wait, ran at
        // 0.96-0.99x: the integer multiplier, not the tensor cores, sets their pace; docs/results/cuda/
        // dropout_bwd_bits_before_wait/)
        wgmma_wait<0>();
        pin(s);
        pin(dp);
        bwd::p_and_ds<KEY_ROWS, true>(frags(s), frags(dp), lse2, delta, scale_log2, mask, row0, col0, drop);
    } else {
        wgmma_wait<1>();  // S is done; dP may still run
        pin(s);
        bwd::p_tile<KEY_ROWS>(frags(s), lse2, scale_log2, mask, row0, col0);
        if constexpr (!DV_BEFORE_DS) {  // dS first: P's fragments are not held beside S, dP and dS
            wgmma_wait<0>();
            pin(dp);
            bwd::ds_tile<KEY_ROWS>(frags(dp), frags(s), delta, mask, row0, col0);
        }
    }
    if constexpr (KEY_ROWS) {  // dV += P^T dO (issued before dS is known when DV_BEFORE_DS)
        frag::pack_a<R / 8, BF16>(pa, frags(s));
        pin(acc1);
        pin(pa);
        wgmma_fence();
        issue_ab<2 * DC2, R, BF16>(acc1, pa, sC1);
    }
    if constexpr (!DROPOUT && DV_BEFORE_DS) {
        wgmma_wait<KEY_ROWS ? 1 : 0>();  // dP is done (P C1 may still run)
        pin(dp);
        bwd::ds_tile<KEY_ROWS>(frags(dp), frags(s), delta, mask, row0, col0);
    }
    frag::pack_a<R / 8, BF16>(da, frags(dp));
    dq.store_ds(da);
    pin(acc2);
    pin(da);
    wgmma_fence();
    dq.issue(s);                                // the one-kernel backward's dQ_i += dS_ij K_j first ...
    issue_ab<2 * DC2, R, BF16>(acc2, da, sC2);  // dK += dS^T Q  (dQ += dS K)
    dq.add(s);                                  // ... so that its sums go out while dK's product runs
    wgmma_wait<0>();
    pin(acc2);
    pin(da);
    if constexpr (KEY_ROWS) {
        pin(acc1);
        pin(pa);
    }
}

// The two-kernel backward: no third product (dQ has its own kernel)
struct NoDq {
    __device__ __forceinline__ void finish() const {}
    template <class A>
    __device__ __forceinline__ void store_ds(const A&) const {}
    template <class S>
    __device__ __forceinline__ void issue(S&) const {}
    template <class S>
    __device__ __forceinline__ void add(S&) const {}
};

// Where 16-byte chunk c of row r of a 64 x NQ block of dQaccum lies: chunk c ^ 2 (r % 4) of that row. A warp
// stores its accumulator 8 bytes a lane, and the hardware serves 8-byte stores half a warp at a time: 16 lanes,
// 4 rows (r % 4 = 0 .. 3) of 2 chunks each (2n, 2n + 1 for the lanes' columns 8n .. 8n + 7). The rows are NQ
// floats apart (a multiple of the 32 banks), so without a swizzle the 4 rows hit the same banks (4-way); with
// the old swizzle c ^ (r % 8), rows r and r ^ 1 swap chunks 2n and 2n + 1 and still collide (2-way: twice the
// wavefronts: 35.6 million bank conflicts at D = 128 in Nsight Compute). XOR with 2 (r % 4) moves each row's
// pair of chunks to its own 32 bytes of the 128: 8 distinct chunks, every bank once (2.5 million left, 6-8 % less
// time at D = 128: docs/results/cuda/backward_dq_swizzle/).
// It permutes chunks inside aligned groups of 8 (128 bytes), so wgmma_bwd_dq_store's reads stay coalesced.
__device__ __forceinline__ int dq_chunk(int r, int c) { return c ^ ((r & 3) << 1); }
// Pieces of PQ = 16 or 48 floats (D = 32, 96): rows 64 or 192 bytes apart, so the half warp's 4 rows fall on the
// 128 bytes' halves 0, 64, 0, 64 (rows r and r + 2 collide); XOR with r & 2 swaps the two 32-byte halves of each 64
// in rows 2 and 3: every bank once. It permutes chunks inside aligned groups of 4 (64 bytes).
__device__ __forceinline__ int dq_chunk_64(int r, int c) { return c ^ (r & 2); }
template <int PQ>
__device__ __forceinline__ int dq_chunk_of(int r, int c) {
    return PQ % 32 == 0 ? dq_chunk(r, c) : dq_chunk_64(r, c);
}

// The one-kernel backward's third product (FlashAttention-2's Algorithm 2 and FlashAttention-3 compute dQ so):
//   dQ_i += dS_ij K_j    summed over the K/V tiles j in float32 global memory (dQaccum)
// for a block of NWG warpgroups of 64 keys each and a tile of Br = 64 queries. dS_ij^T sits in registers as the
// A fragments of dK's product (rows = keys); dQ needs dS_ij with the queries as rows, so each warpgroup stores
// its 64 keys' columns of dS_ij (one 64-column panel of a swizzled (Br, Bc) tile) with stmatrix .trans, and
// after a barrier of the block's warpgroups, warpgroup w computes dQ columns [w NQ, (w + 1) NQ), NQ = D / NWG,
// of dS_ij (Br x Bc) K_j (Bc x D) with both operands in shared memory (into the registers that held S^T at
// D = 128). The sum over the K/V blocks: the warpgroup writes its 64 x NQ floats to a shared buffer and one
// thread hands the whole buffer to the copy engine, which adds it into dQaccum (tma::bulk_reduce_add) while the
// warpgroup goes on: one instruction instead of 64 NQ atomic adds from the threads. dQaccum is blocked so that
// the buffer lands in one contiguous piece: (B Hq, ceil(Nq / 64), NWG, 64, NQ), each 64 x NQ block row-major
// with its 16-byte chunks swizzled (dq_chunk); wgmma_bwd_dq_store reads it back, times softmax_scale.
// FIRST: the block's first thread of the NWG warpgroups (0; wgmma_bwd_ws: 128, after the producer warpgroup).
// At D = 32 and 96 K_j is stored in 32-column panels: at D = 32 warpgroup w's NQ = 16 columns are half a panel (an
// n16 product from column 16 w); at D = 96 its 48 are two products (SPLIT96); dQaccum's pieces of 16 or 48 floats
// a row are swizzled by dq_chunk_64.
// Br = 128 (wgmma_bwd_ws at D = 32 and 64, NWG = 2): the warpgroups split dQ_i by rows instead, warpgroup w computing
// all D columns of queries [64 w, 64 w + 64) (dS_ij's rows 64 w .. as A; an n64 product, not an n32 one), and
// handing the copy engine the whole 64 x D block of dQaccum those rows fall in (its NWG pieces, in their layout);
// a block past Nq (valid_rows <= 64 w: the last tile of 128 queries may end inside its first 64) is not added.
template <int D, int NWG, int Br, bool BF16, int FIRST = 0>
struct DqReduce {
    static constexpr bool ROW_SPLIT = Br > 64;
    static_assert(NWG == 2 && (D == 32 || D == 64 || D == 96 || D == 128), "2 warpgroups; D in {32, 64, 96, 128}");
    static_assert(Br == 64 || (Br == 64 * NWG && D <= 64), "tiles of 64 queries, or 64 per warpgroup at D <= 64");
    static constexpr int Bc = 64 * NWG, PQ = D / NWG;  // keys per block; columns of a piece of dQaccum's blocks
    static constexpr int NQ = ROW_SPLIT ? D : PQ;       // dQ columns per warpgroup
    static constexpr unsigned BUF_BYTES = 64 * NQ * 4;  // a warpgroup's buffer
    // D = 96: a warpgroup's 48 columns (48 wg ..) would start inside a 32-column panel of K_j and leave it; both
    // warpgroups issue the same two products instead (the branch-free code wgmma needs: a product in a branch is
    // serialised), 32 columns from 64 wg and 16 from 32 + 16 wg, which together are the warpgroup's 48
    static constexpr bool SPLIT96 = !ROW_SPLIT && D == 96;
    // the column of the warpgroup's piece that column c of its accumulator is (SPLIT96: 64 wg + c, c < 32, and
    // 32 + 16 wg + (c - 32) after it, less the piece's first column 48 wg)
    __device__ __forceinline__ static int piece_col(int c, int wg) {
        return !SPLIT96 ? c : c < 32 ? c + 16 * wg : c - 32 * wg;
    }
    unsigned sdS;    // (Br, Bc) 16-bit, swizzled: panel w = warpgroup w's keys
    unsigned sK;     // K_j: (Bc, D)
    unsigned sdQ;    // NWG buffers of 64 x NQ floats
    float* dq_tile;  // dQaccum's block(s) of the tile (Br / 64 blocks of 64 x D floats: NWG pieces of 64 x PQ)
    int valid_rows = Br;  // the tile's queries before Nq
    // dQ_i's accumulator: the registers of S^T when it fills them (NQ = Br: D = 128); else (D = 32, 64, 96)
    // registers of its own: a wgmma writing part of an array that other wgmmas use is serialised by the compiler
    mutable float own[NQ < Br ? NQ / 2 : 1];
    __device__ __forceinline__ auto acc(float (&s)[Br / 2]) const -> float (&)[NQ / 2] {
        if constexpr (NQ == Br)
            return s;
        else
            return own;
    }

    __device__ __forceinline__ void store_ds(const unsigned (&da)[Br / 16][4]) const {
        // da[kk][m]: keys 16 (warp % 4) + 8 (m % 2) .., queries 16 kk + 8 (m / 2) .. of dS^T (pack_a's order);
        // lane l gives the address of row l % 8 of matrix l / 8 transposed: query 16 kk + 8 (m / 2) + l % 8,
        // the 8 keys from 64 wg + 16 (warp % 4) + 8 (m % 2): chunk 8 wg + 2 (warp % 4) + m % 2 of that row
        const int lane = threadIdx.x % 32, warp = (threadIdx.x - FIRST) / 32, m = lane / 8;
        const int chunk = 8 * (warp / 4) + 2 * (warp % 4) + (m & 1);
#pragma unroll
        for (int kk = 0; kk < Br / 16; ++kk)
            stmatrix_x4_trans(sdS + sw128<Br>(16 * kk + 8 * (m >> 1) + lane % 8, chunk), da[kk]);
        fence_proxy_async();                      // the stores are visible to the tensor cores ...
        tma::named_sync(1, NWG * 128);            // ... and every warpgroup's panel is there
    }
    __device__ __forceinline__ void issue(float (&s)[Br / 2]) const {
        const int wg = (threadIdx.x - FIRST) / 128;
        pin(acc(s));
        wgmma_fence();
        if constexpr (ROW_SPLIT) {  // dQ_i rows 64 wg .. = dS_ij (those rows) K_j: A starts 64 rows into each panel
            issue_ab_ss<D, Br, Bc, NQ, BF16>(acc(s), sdS + wg * 64 * 128, sK, 0);
        } else if constexpr (SPLIT96) {  // columns 64 wg .. 64 wg + 31 (a whole panel), then 32 + 16 wg .. + 15
            ab_ss<D, Br, Bc, 32, BF16>(reinterpret_cast<float(&)[16]>(acc(s)[0]), sdS, sK, 64 * wg);
            ab_ss<D, Br, Bc, 16, BF16>(reinterpret_cast<float(&)[8]>(acc(s)[16]), sdS, sK, 32 + 16 * wg);
            wgmma_commit();
        } else {  // dQ_i columns wg NQ .. = dS_ij K_j (those columns)
            issue_ab_ss<D, Br, Bc, NQ, BF16>(acc(s), sdS, sK, wg * NQ);
        }
    }
    __device__ __forceinline__ void add(float (&s)[Br / 2]) const {
        wgmma_wait<1>();  // dQ_i's product is done (dK's, issued after it, may still run)
        pin(acc(s));
        const float(&d)[NQ / 8][4] = reinterpret_cast<const float(&)[NQ / 8][4]>(acc(s));
        const int wg = (threadIdx.x - FIRST) / 128, r0 = 16 * ((threadIdx.x / 32) % 4);
        if (ROW_SPLIT && 64 * wg >= valid_rows) return;  // rows past Nq: no block of dQaccum to add them to
        const unsigned buf = sdQ + wg * BUF_BYTES;
        if (threadIdx.x % 128 == 0) tma::bulk_wait_read<0>();  // the last tile's sum has left the buffer ...
        tma::named_sync(2 + wg, 128);                          // ... before any thread writes it
#pragma unroll
        for (int n = 0; n < NQ / 8; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // h = 0: row g (elements 0, 1); h = 1: row g + 8 (elements 2, 3)
                // column c of the warpgroup's NQ: piece c / PQ of the block (its own piece without ROW_SPLIT),
                // column c % PQ there; c even: one 16-byte chunk
                const int r = r0 + frag::acc_row(2 * h), c = piece_col(frag::acc_col(n, 0), wg);
                const int piece = c / PQ, cc = c % PQ;
                st_shared_v2(buf + 4 * (piece * 64 * PQ + r * PQ + (dq_chunk_of<PQ>(r, cc >> 2) << 2) + (cc & 3)),
                             d[n][2 * h], d[n][2 * h + 1]);
            }
        fence_proxy_async();  // the buffer is visible to the copy engine ...
        tma::named_sync(2 + wg, 128);  // ... once every thread of the warpgroup has written its part
        if (threadIdx.x % 128 == 0) {
            tma::bulk_reduce_add(dq_tile + wg * 64 * NQ, buf, BUF_BYTES);  // dQaccum += the 64 x NQ block (piece)
            tma::bulk_commit();
        }
    }
    __device__ __forceinline__ void finish() const {
        if (threadIdx.x % 128 == 0) tma::bulk_wait_all();  // the last sums are done before the block exits
    }
};

// the third product of dkdv_block: DqReduce with DQ, else none
template <bool DQ, int D, int NWG, int Br, bool BF16>
__device__ __forceinline__ auto dq_of(unsigned sdS, unsigned sK, unsigned sdQ, float* dq_tile) {
    if constexpr (DQ)
        return DqReduce<D, NWG, Br, BF16>{sdS, sK, sdQ, dq_tile};
    else
        return NoDq{};
}

// dK_j, dV_j for one tile of Bc = 64 NWG keys (warpgroup w: keys 64w .. 64w + 63) of K/V head blockIdx.y
// (= b Hk + hk; grid (ceil(Nk / Bc) * NCOL, B * Hk)), looping over the group's query heads bh = blockIdx.y * group + g
// and for each over the tiles of Br queries that see any of the keys. K_j and V_j stay in shared memory; Q_i,
// dO_i (and their lse, Delta) stream through two buffers. DQ: also dQ_i += dS_ij K_j into dQaccum (DqReduce).
// D = 256: 64 keys' dK_j and dV_j would be 256 fp32 registers a thread, so a block holds DC = 128 of their
// columns (NCOL = 2 blocks per K/V tile, blockIdx.x = tile * NCOL + column block) and computes S^T and dP^T,
// over all of D, once per half (as mma_backward.cu does).
template <int D, int NWG, int Br, bool BF16, bool DROPOUT, bool GQA, bool DQ>
__device__ __forceinline__ void dkdv_block(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                                           const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                                           const float* __restrict__ LSE, const float* __restrict__ Delta,
                                           unsigned short* __restrict__ dK, unsigned short* __restrict__ dV,
                                           float* __restrict__ dQaccum, int Nq, int Nk, float scale_log2,
                                           int window_left, int window_right, int group, float dropout_p,
                                           unsigned seed_lo, unsigned seed_hi) {
    static_assert((D == 32 || D == 64 || D == 96 || D == 128 || D == 256) && (Br == 32 || Br == 64 || Br == 128),
                  "D in {32, 64, 96, 128, 256}, Br in {32, 64, 128}");
    static_assert(!DQ || (Br == 64 && NWG == 2 && D <= 128),
                  "the one-kernel backward: tiles of 64 queries, 2 warpgroups, D <= 128");
    constexpr int Bc = 64 * NWG, NTHREADS = NWG * 128;
    constexpr int DC = D > 128 ? 128 : D, NCOL = D / DC;  // columns of dK_j, dV_j per block; blocks per K/V tile
    constexpr unsigned KV_BYTES = Bc * D * 2, Q_BYTES = Br * D * 2, DS_BYTES = DQ ? Br * Bc * 2 + 64 * D * 4 : 0;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* smem;
    const unsigned sK = aligned_smem(smem_raw, smem);  // (Bc, D): stays
    const unsigned sV = sK + KV_BYTES;                   // (Bc, D): stays
    const unsigned sQ = sV + KV_BYTES;                   // 2 x (Br, D): streamed
    const unsigned sdO = sQ + 2 * Q_BYTES;               // 2 x (Br, D): streamed
    const unsigned sdS = sdO + 2 * Q_BYTES;              // (Br, Bc): dS_ij (DQ only)
    const unsigned sdQ = sdS + Br * Bc * 2;               // (64, D) floats: dQ_i's sums on their way (DQ only)
    float* sL = reinterpret_cast<float*>(smem + 2 * KV_BYTES + 4 * Q_BYTES + DS_BYTES);  // 2 x Br: lse, log2 units
    float* sDl = sL + 2 * Br;                                                            // 2 x Br: Delta

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const int warp = threadIdx.x / 32, wg = warp / 4;
    const int k0 = (blockIdx.x / NCOL) * Bc, wkey = 64 * wg + 16 * (warp % 4);  // block's first key, warp's first row
    const int col0 = (blockIdx.x % NCOL) * DC;  // the block's first column of dK_j, dV_j (a 64-column panel's)
    constexpr int PB = Panels<D>::ROW_BYTES;  // a panel row: 128 bytes (64 columns), 64 at D = 32 and 96
    const unsigned sK_wg = sK + 64 * wg * PB, sV_wg = sV + 64 * wg * PB;  // the warpgroup's 64 keys
    const long long bkv = blockIdx.y;  // the K/V head: b * Hk + hk
    long long bh = GQA ? bkv * group : bkv;  // the group's first query head: b * Hq + hk * group
    const unsigned short *q = Q + bh * Nq * D, *dout = dO + bh * Nq * D;
    const float *lse = LSE + bh * Nq, *delta = Delta + bh * Nq;
    const int q_blocks = (Nq + 63) / 64;  // dQaccum's blocks of 64 rows per query head
    float* dq_head = DQ ? dQaccum + bh * q_blocks * 64 * D : nullptr;
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

    float dk[DC / 2], dv[DC / 2];  // the warpgroup's 64 rows of dK_j and dV_j (DC columns), summed over the group
    float s[Br / 2], dp[Br / 2];  // S_ij^T -> P_ij^T, dP_ij^T -> dS_ij^T: 64 keys x Br queries (DQ: then dQ_i)
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
            __syncthreads();      // ... and every thread's; every warpgroup is done with tile t - 1's buffers
            if (t + 1 < tiles.count) stream(t + 1, buf ^ 1);  // tile t + 1 loads while tile t is computed
            cp_async_commit();
            const unsigned qb = sQ + buf * Q_BYTES, db = sdO + buf * Q_BYTES;
            const unsigned panel = (col0 / Panels<D>::COLS) * Br * PB;  // the block's columns of Q_i and dO_i
            const auto dq = dq_of<DQ, D, NWG, Br, BF16>(sdS, sK, sdQ, dq_head + (long long)i0 * D);
            tile_pair<true, DROPOUT, D, Bc, Br, BF16>(s, dp, sK_wg, qb, sV_wg, db,  // S^T = K_w Q_i^T, dP^T = V_w dO_i^T
                                                     dv, db + panel,  // dV_j += P_ij^T dO_i  (DROPOUT: (P_ij o Z / (1 - p))^T dO_i)
                                                     dk, qb + panel,  // dK_j += dS_ij^T Q_i  (times softmax_scale at the end)
                                                     sL + buf * Br, sDl + buf * Br, scale_log2, mask, k0 + wkey, i0,
                                                     drop, dq);  // DQ: dQ_i += dS_ij K_j (atomic adds)
        }
        if (!GQA || ++g == group) break;  // (GQA false: compiled without the loop)
        ++bh;  // the next query head of the group
        q += Nq * D, dout += Nq * D, lse += Nq, delta += Nq;
        if constexpr (DQ) dq_head += q_blocks * 64 * D;
        __syncthreads();  // every warpgroup is done with the last tile's buffer before buffer 0 is refilled
        if (tiles.count > 0) stream(0, 0);
        cp_async_commit();
    }
    dq_of<DQ, D, NWG, Br, BF16>(sdS, sK, sdQ, dq_head).finish();
    const float softmax_scale = scale_log2 * FA_LN2;
    frag::store_rows<D, BF16, DC>(dK + bkv * Nk * D, frags(dk), k0 + wkey, Nk, softmax_scale, col0);  // dK_j = scale dS^T Q
    frag::store_rows<D, BF16, DC>(dV + bkv * Nk * D, frags(dv), k0 + wkey, Nk, 1.0f, col0);
}

}  // namespace wgmma_bwd_detail

// The two-kernel backward's dK/dV kernel (dQ: wgmma_bwd_dq); wgmma_bwd_detail::dkdv_block says what a block does.
template <int D, int NWG, int Br, bool BF16, bool DROPOUT = false, bool GQA = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_bwd_dkdv(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                   const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                   const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                   unsigned short* __restrict__ dV, int Nq, int Nk, float scale_log2, int window_left,
                   int window_right, int group, float dropout_p, unsigned seed_lo, unsigned seed_hi) {
    wgmma_bwd_detail::dkdv_block<D, NWG, Br, BF16, DROPOUT, GQA, false>(Q, K, V, dO, LSE, Delta, dK, dV, nullptr, Nq,
                                                                         Nk, scale_log2, window_left, window_right,
                                                                         group, dropout_p, seed_lo, seed_hi);
}

// The one-kernel backward: dK_j, dV_j as wgmma_bwd_dkdv, and every tile's dQ_i += dS_ij K_j added atomically
// into dQaccum (float32 (B Hq, Nq, D), zeroed by wgmma_bwd_preprocess); wgmma_bwd_dq_store then writes dQ. 5 matrix
// products per tile pair against the two kernels' 7 (S and dP are computed once), at the price of the atomic
// adds, whose order varies from run to run: dQ is not bitwise reproducible (dK and dV are).
template <int D, int NWG, int Br, bool BF16, bool DROPOUT = false, bool GQA = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_bwd_fused(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                    const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                    const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                    unsigned short* __restrict__ dV, float* __restrict__ dQaccum, int Nq, int Nk, float scale_log2,
                    int window_left, int window_right, int group, float dropout_p, unsigned seed_lo,
                    unsigned seed_hi) {
    wgmma_bwd_detail::dkdv_block<D, NWG, Br, BF16, DROPOUT, GQA, true>(Q, K, V, dO, LSE, Delta, dK, dV, dQaccum, Nq,
                                                                        Nk, scale_log2, window_left, window_right,
                                                                        group, dropout_p, seed_lo, seed_hi);
}

// The one-kernel backward, warp-specialised as the forward of wgmma_ws.cu (and FlashAttention-3's backward):
// wgmma_bwd_fused's work per block (dK_j, dV_j of Bc = 128 keys, dQ_i += dS_ij K_j summed by the copy engine),
// with the block split by role so that the compute warps never issue a copy nor meet at a block-wide barrier:
//
//   warpgroup 0, the PRODUCER   one warp asks the copy engine (TMA) for K_j and V_j once, then for Q_i and dO_i
//                                of every Q tile (every query head of the group with GQA) into a ring of STAGES
//                                slots; its 32 lanes put the tile's lse (log2 units) and Delta beside them. It
//                                waits only for a slot to be empty (q_empty) and completes q_full with its 32
//                                arrivals and the copy engine's bytes. 24 registers (setmaxnreg.dec).
//   warpgroups 1, 2, the CONSUMERS   64 keys each, 240 registers; per tile: wait q_full, tile_pair (the five
//                                products, DqReduce's stores of dS and the bulk sum of dQ), then every thread
//                                arrives on q_empty (the producer's lanes write lse and Delta with ordinary
//                                stores, so each thread that read them releases its own reads).
//
// The two consumer warpgroups still meet once per tile, at DqReduce's barrier before dQ_i's product (each needs
// the other's 64 columns of dS_ij), and nowhere else: dS_ij alternates between two buffers, so a warpgroup
// writing tile u + 2's dS cannot overwrite what the other's dQ product of tile u + 1 is still reading (it has
// passed tile u + 2's barrier, which the other reaches only when it is done with tile u + 1).
// Br: queries per streamed tile, 64, or 128 at D = 32 and 64 (launch_specs.WGMMA_WS_BACKWARD_CONFIGS: there a tile of
// 64 queries is too little work between a tile's waits and barriers); with 128 the consumers split dQ_i by rows
// (DqReduce) and compute dS before issuing dV's product (tile_pair's DV_BEFORE_DS), for registers.
// Tensor maps (runtime.tensor_map): q and dO as (B Hq, Nq, D) with boxes of Br rows, k and v as (B Hk, Nk, D)
// with boxes of 128 rows; rows past Nq or Nk come in as zeros.
// Grid (ceil(Nk / Bc), B Hk, splits). With few K/V heads (MQA: one) there are too few blocks of keys for the
// SMs, so the group's query heads may be split over gridDim.z = splits blocks, each taking ceil(group / splits)
// of them; each block then writes its partial dK_j, dV_j in float32 to dKVpart (2, splits, B Hk, Nk, D) and
// wgmma_bwd_kv_sum adds the parts up (in a fixed order: dK and dV stay bitwise reproducible). splits = 1: dK,
// dV are written directly and dKVpart is not touched.
// The loop over the group's query heads is compiled in always (group = 1 without GQA): without it, ptxas spills
// at D = 128 under the consumers' 240 registers, and the kernel is 8 % slower (H100). STAGES = 3 measured the
// same as 2 (H100, D 64 and 128), and so did handing the dQ sums to a second producer warp (as FlashAttention-3
// does), and, at D = 64, each warpgroup computing all of dQ_i over its own 64 keys (no barrier between the
// warpgroups, twice the sums): the consumers' own bulk reduce-add of half of dQ_i each stays.
// With a causal mask a block's first tile of 64 queries sees none of consumer warpgroup 1's keys, which still issues
// its five products; branching that warpgroup to dQ_i's product alone moved the time by under 2 % either way and put
// the two warpgroups at DqReduce's barrier from two places (docs/results/cuda/ws_bwd_dq_alone/): one path for all.
template <int D, int Br, int STAGES, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(384, 1)
    wgmma_bwd_ws(const __grid_constant__ tma::TmaMap tmQ, const __grid_constant__ tma::TmaMap tmK,
                 const __grid_constant__ tma::TmaMap tmV, const __grid_constant__ tma::TmaMap tmdO,
                 const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                 unsigned short* __restrict__ dV, float* __restrict__ dQaccum, float* __restrict__ dKVpart, int Nq,
                 int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
                 unsigned seed_lo, unsigned seed_hi, int tile_major) {
    using namespace wgmma_bwd_detail;
    static_assert((D == 32 || D == 64 || D == 96 || D == 128) && (Br == 64 || (Br == 128 && D <= 64)),
                  "D in {32, 64, 96, 128}; Br 64 (or 128 at D = 32, 64)");
    constexpr int NWG = 2, Bc = 128;  // consumer warpgroups, keys per block
    using Dq = DqReduce<D, NWG, Br, BF16, 128>;
    constexpr unsigned KV_BYTES = Bc * D * 2, Q_BYTES = Br * D * 2, DS_BYTES = Br * Bc * 2;
    constexpr unsigned DQ_BYTES = NWG * Dq::BUF_BYTES;  // the consumers' buffers of dQ sums
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* smem;
    const unsigned sK = aligned_smem(smem_raw, smem);  // (Bc, D): stays
    const unsigned sV = sK + KV_BYTES;                   // (Bc, D): stays
    const unsigned sQ = sV + KV_BYTES;                   // STAGES x (Br, D): streamed
    const unsigned sdO = sQ + STAGES * Q_BYTES;          // STAGES x (Br, D): streamed
    const unsigned sdS = sdO + STAGES * Q_BYTES;         // 2 x (Br, Bc): dS_ij
    const unsigned sdQ = sdS + 2 * DS_BYTES;             // NWG buffers of dQ_i's sums on their way
    constexpr unsigned ROWS_OFF = 2 * KV_BYTES + 2 * STAGES * Q_BYTES + 2 * DS_BYTES + DQ_BYTES;
    float* sL = reinterpret_cast<float*>(smem + ROWS_OFF);  // STAGES x Br: lse, log2 units
    float* sDl = sL + STAGES * Br;                          // STAGES x Br: Delta
    const unsigned bars = sK + ROWS_OFF + 2 * STAGES * Br * 4;  // the mbarriers, 8 bytes each:
    const unsigned kv_full = bars;                                                   //   K_j, V_j landed
    auto q_full = [&](int u) { return bars + 8 * (1 + u % STAGES); };               //   Q tile u's slot filled
    auto q_empty = [&](int u) { return bars + 8 * (1 + STAGES + u % STAGES); };     //   ... and read by all

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const int tid = threadIdx.x, wg = tid / 128;
    // The block's (tile of keys, K/V head, split). In grid order (x, the tile, fastest) a head's tiles run
    // together and share the Q_i, dO_i they stream in L2. Where the tiles' work differs (a mask bounded on one
    // side: causal), a block loops over several query heads (GQA) and the grid is a few waves, a late head's
    // heaviest tiles would start in the last wave and run on alone: tile_major (launch_specs.ws_backward_tile_major
    // decides) starts the blocks tile-major instead (L, the launch order, with the tile slowest), every head's
    // heaviest tile first and the lightest last (tools/ws_block_order.py, docs/results/cuda/ws_block_order/).
    const int per = (group + gridDim.z - 1) / gridDim.z;  // query heads per block of the split
    const unsigned HZ = gridDim.y * gridDim.z, L = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned hz = tile_major ? L % HZ : blockIdx.y + gridDim.y * blockIdx.z;  // (head, split), y fastest
    const int kt = !tile_major ? (int)blockIdx.x
                               : (mask.keys_heavy_last() ? (int)(gridDim.x - 1 - L / HZ) : (int)(L / HZ));
    const int k0 = kt * Bc, bz = (int)(hz / gridDim.y);  // the block's first key, its split of the group
    const long long bkv = hz % gridDim.y;                  // the K/V head: b * Hk + hk
    const int g0 = bz * per, g1 = min(group, g0 + per);  // this block's: bkv * group + [g0, g1)
    const long long bh0 = bkv * group;             // the group's first query head (group 1: bkv)
    const bwd::TileSpan tiles = bwd::q_tiles(mask, k0, k0 + Bc, Br);  // the same for every query head

    if (tid == 0) {
        tma::mbar_init(kv_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(q_full(s), 32);      // the producer warp's lanes (lane 0 with the bytes)
            tma::mbar_init(q_empty(s), NWG * 128);  // every consumer thread (each releases its own reads)
        }
        tma::fence_barrier_init();
    }
    __syncthreads();  // the last block-wide barrier

    if (wg == 0) {
        // ------------------------------------------------------------------ producer
        // the block holds 384 x 168 registers; the producer's 128 x (168 - 24) are what the consumers' 256 x
        // (240 - 168) take (setmaxnreg.inc waits until the registers it asks for are free)
        tma::regs_dec<24>();
        if (tid >= 32 || tiles.count == 0) return;  // one warp works
        const int lane = tid;
        if (lane == 0) {
            tma::prefetch_map(tmQ), tma::prefetch_map(tmK), tma::prefetch_map(tmV), tma::prefetch_map(tmdO);
            tma::mbar_arrive_expect_tx(kv_full, 2 * KV_BYTES);
            tma::load_tile<Bc, D>(sK, tmK, k0, (int)bkv, kv_full);
            tma::load_tile<Bc, D>(sV, tmV, k0, (int)bkv, kv_full);
        }
        for (int g = g0, u = 0; g < g1; ++g)
            for (int t = 0; t < tiles.count; ++t, ++u) {
                const int slot = u % STAGES, i0 = (tiles.first + t) * Br;
                const long long bh = bh0 + g;
                if (u >= STAGES) tma::mbar_wait(q_empty(u), (u / STAGES - 1) & 1);  // read by every warp
                for (int r = lane; r < Br; r += 32)
                    bwd::query_row(sL[slot * Br + r], sDl[slot * Br + r], LSE + bh * Nq, Delta + bh * Nq, i0 + r, Nq);
                if (lane == 0) {
                    tma::mbar_arrive_expect_tx(q_full(u), 2 * Q_BYTES);
                    tma::load_tile<Br, D>(sQ + slot * Q_BYTES, tmQ, i0, (int)bh, q_full(u));
                    tma::load_tile<Br, D>(sdO + slot * Q_BYTES, tmdO, i0, (int)bh, q_full(u));
                } else {
                    tma::mbar_arrive(q_full(u));
                }
            }
        return;
    }
    // ---------------------------------------------------------------------- consumers
    tma::regs_inc<240>();
    const int cwg = wg - 1, warp = tid / 32 - 4;  // consumer warpgroup (keys 64 cwg ..), consumer warp
    const int wkey = 64 * cwg + 16 * (warp % 4);   // the warp's first key in the block
    constexpr int PB = Panels<D>::ROW_BYTES;        // a panel row: 128 bytes (64 columns), 64 at D = 32 and 96
    const unsigned sK_wg = sK + 64 * cwg * PB, sV_wg = sV + 64 * cwg * PB;  // the warpgroup's 64 keys
    const int q_blocks = (Nq + 63) / 64;           // dQaccum's blocks of 64 rows per query head
    float dk[D / 2], dv[D / 2];   // the warpgroup's 64 rows of dK_j and dV_j, summed over the group
    float s[Br / 2], dp[Br / 2];  // S_ij^T -> P_ij^T, dP_ij^T -> dS_ij^T (then dQ_i at D = 128)
    zero(dk);
    zero(dv);
    zero(s);
    zero(dp);
    if (tiles.count > 0) tma::mbar_wait(kv_full, 0);
    for (int g = g0, u = 0; g < g1; ++g) {
        const long long bh = bh0 + g;
        const frag::Dropout drop = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read if DROPOUT
        float* dq_head = dQaccum + bh * q_blocks * 64 * D;
        for (int t = 0; t < tiles.count; ++t, ++u) {
            const int slot = u % STAGES, i0 = (tiles.first + t) * Br;
            const unsigned qb = sQ + slot * Q_BYTES, db = sdO + slot * Q_BYTES;
            tma::mbar_wait(q_full(u), (u / STAGES) & 1);  // Q_i, dO_i, lse, Delta have landed
            const Dq dq{sdS + (u & 1) * DS_BYTES, sK, sdQ, dq_head + (long long)i0 * D, Nq - i0};
            // S^T = K_w Q_i^T, dP^T = V_w dO_i^T
            tile_pair<true, DROPOUT, D, Bc, Br, BF16, Dq, D / 2, Br == 64>(s, dp, sK_wg, qb, sV_wg, db,
                                                     dv, db,  // dV_j += P_ij^T dO_i
                                                     dk, qb,  // dK_j += dS_ij^T Q_i
                                                     sL + slot * Br, sDl + slot * Br, scale_log2, mask, k0 + wkey,
                                                     i0, drop, dq);  // dQ_i += dS_ij K_j (the copy engine's sums)
            tma::mbar_arrive(q_empty(u));  // this thread is done with the slot (its reads of lse and Delta too)
        }
    }
    Dq{sdS, sK, sdQ, dQaccum}.finish();
    if (gridDim.z == 1) {
        const float softmax_scale = scale_log2 * FA_LN2;
        frag::store_rows<D, BF16>(dK + bkv * Nk * D, frags(dk), k0 + wkey, Nk, softmax_scale);  // dK_j = scale dS^T Q
        frag::store_rows<D, BF16>(dV + bkv * Nk * D, frags(dv), k0 + wkey, Nk, 1.0f);
    } else {  // this block's part of the sums over the group (softmax_scale applied by wgmma_bwd_kv_sum)
        const long long part = (long long)gridDim.y * Nk * D;
        frag::store_rows_f32<D>(dKVpart + bz * part + bkv * Nk * D, frags(dk), k0 + wkey, Nk);
        frag::store_rows_f32<D>(dKVpart + (gridDim.z + bz) * part + bkv * Nk * D, frags(dv), k0 + wkey, Nk);
    }
}

// dK = softmax_scale * (sum of the splits' parts), dV = (sum of theirs) in 16 bits, from wgmma_bwd_ws's dKVpart
// (2, splits, B Hk, Nk, D), 4 elements per thread (n = B Hk Nk D), the parts added in order z = 0, 1, ..
template <bool BF16>
__global__ void wgmma_bwd_kv_sum(const float* __restrict__ dKVpart, unsigned short* __restrict__ dK,
                                 unsigned short* __restrict__ dV, int splits, long long n, float softmax_scale) {
    const long long e = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= n) return;
    float4 k = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v = k;
    for (int z = 0; z < splits; ++z) {
        const float4 a = *reinterpret_cast<const float4*>(dKVpart + z * n + e);
        const float4 b = *reinterpret_cast<const float4*>(dKVpart + (splits + z) * n + e);
        k.x += a.x, k.y += a.y, k.z += a.z, k.w += a.w;
        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
    }
    *reinterpret_cast<uint2*>(dK + e) = make_uint2(ptx::pack2<BF16>(k.x * softmax_scale, k.y * softmax_scale),
                                                   ptx::pack2<BF16>(k.z * softmax_scale, k.w * softmax_scale));
    *reinterpret_cast<uint2*>(dV + e) = make_uint2(ptx::pack2<BF16>(v.x, v.y), ptx::pack2<BF16>(v.z, v.w));
}

// The one-kernel backwards' first step: Delta_i = rowsum(dO_i o O_i), one warp per row (as mma_bwd_preprocess,
// bwd::delta_row), and dQaccum = 0, its `zeros` floats (a multiple of 4) 16 bytes per thread over the grid: one
// pass, not a fill of its own before it.
template <int D, bool BF16>
__global__ void wgmma_bwd_preprocess(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO,
                                     float* __restrict__ Delta, float* __restrict__ dQaccum, long long rows,
                                     long long zeros) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < zeros / 4; e += stride)
        reinterpret_cast<float4*>(dQaccum)[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const float delta = bwd::delta_row<D, BF16>(O, dO, r, bwd::delta_vec<D>(O, dO));
    if (threadIdx.x % 32 == 0) Delta[r] = delta;
}

// dQ (B Hq, Nq, D) = softmax_scale * dQaccum in 16 bits, 4 elements per thread (n = B Hq Nq D). dQaccum is
// wgmma_bwd_fused's blocked layout: (B Hq, ceil(Nq / 64), NWG, 64, NQ), NQ = D / NWG, chunks at dq_chunk.
template <int D, int NWG, bool BF16>
__global__ void wgmma_bwd_dq_store(const float* __restrict__ dQaccum, unsigned short* __restrict__ dQ, int Nq,
                                   long long n, float softmax_scale) {
    constexpr int NQ = D / NWG;
    const long long e = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);  // dQ's element (bh, i, d)
    if (e >= n) return;
    const int d = (int)(e % D);
    const long long row = e / D, bh = row / Nq;
    const int i = (int)(row % Nq), r = i % 64, w = d / NQ, c = d % NQ;
    const long long block = (bh * ((Nq + 63) / 64) + i / 64) * NWG + w;
    const int chunk = wgmma_bwd_detail::dq_chunk_of<NQ>(r, c >> 2);
    const float4 a = *reinterpret_cast<const float4*>(dQaccum + block * 64 * NQ + r * NQ + (chunk << 2));
    *reinterpret_cast<uint2*>(dQ + e) = make_uint2(ptx::pack2<BF16>(a.x * softmax_scale, a.y * softmax_scale),
                                                   ptx::pack2<BF16>(a.z * softmax_scale, a.w * softmax_scale));
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
    static_assert((D == 32 || D == 64 || D == 96 || D == 128 || D == 256) && (Bc == 32 || Bc == 64 || Bc == 128),
                  "D in {32, 64, 96, 128, 256}, Bc in {32, 64, 128}");
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
    constexpr int PB = Panels<D>::ROW_BYTES;  // a panel row: 128 bytes (64 columns), 64 at D = 32 and 96
    const unsigned sQ_wg = sQ + 64 * wg * PB, sdO_wg = sdO + 64 * wg * PB;  // the warpgroup's 64 queries
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
                                                  lse2, delta_i, scale_log2, mask, q0 + wrow, j0, drop, NoDq{});
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
#define FA_WGMMA_FUSED_PARAMS                                                                                  \
    (const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*, const float*, \
     const float*, unsigned short*, unsigned short*, float*, int, int, float, int, int, int, float, unsigned,    \
     unsigned)
#define FA_WGMMA_FUSED_INST(D, BF)                                                              \
    template __global__ void wgmma_bwd_fused<D, 2, 64, BF> FA_WGMMA_FUSED_PARAMS;               \
    template __global__ void wgmma_bwd_fused<D, 2, 64, BF, true> FA_WGMMA_FUSED_PARAMS;         \
    template __global__ void wgmma_bwd_fused<D, 2, 64, BF, false, true> FA_WGMMA_FUSED_PARAMS;  \
    template __global__ void wgmma_bwd_fused<D, 2, 64, BF, true, true> FA_WGMMA_FUSED_PARAMS;
#define FA_WGMMA_WS_BWD_PARAMS                                                                               \
    (const __grid_constant__ tma::TmaMap, const __grid_constant__ tma::TmaMap, const __grid_constant__ tma::TmaMap, \
     const __grid_constant__ tma::TmaMap, const float*, const float*, unsigned short*, unsigned short*, float*,   \
     float*, int, int, float, int, int, int, float, unsigned, unsigned, int)
#define FA_WGMMA_WS_BWD_INST(D, BR, ST, BF)                                      \
    template __global__ void wgmma_bwd_ws<D, BR, ST, BF> FA_WGMMA_WS_BWD_PARAMS; \
    template __global__ void wgmma_bwd_ws<D, BR, ST, BF, true> FA_WGMMA_WS_BWD_PARAMS;
#define FA_WGMMA_KV_SUM_INST(BF)                                                                              \
    template __global__ void wgmma_bwd_kv_sum<BF>(const float*, unsigned short*, unsigned short*, int, long long, \
                                                  float);
#define FA_WGMMA_DQ_STORE_INST(D, BF)                                                                          \
    template __global__ void wgmma_bwd_dq_store<D, 2, BF>(const float*, unsigned short*, int, long long, float); \
    template __global__ void wgmma_bwd_preprocess<D, BF>(const unsigned short*, const unsigned short*, float*,   \
                                                         float*, long long, long long);
FA_WGMMA_FUSED_INST(32, false)
FA_WGMMA_FUSED_INST(32, true)
FA_WGMMA_FUSED_INST(96, false)
FA_WGMMA_FUSED_INST(96, true)
FA_WGMMA_FUSED_INST(64, false)
FA_WGMMA_FUSED_INST(64, true)
FA_WGMMA_FUSED_INST(128, false)
FA_WGMMA_FUSED_INST(128, true)
FA_WGMMA_WS_BWD_INST(32, 128, 2, false)
FA_WGMMA_WS_BWD_INST(32, 128, 2, true)
FA_WGMMA_WS_BWD_INST(32, 64, 2, false)
FA_WGMMA_WS_BWD_INST(32, 64, 2, true)
FA_WGMMA_WS_BWD_INST(96, 64, 2, false)
FA_WGMMA_WS_BWD_INST(96, 64, 2, true)
FA_WGMMA_WS_BWD_INST(64, 128, 2, false)
FA_WGMMA_WS_BWD_INST(64, 128, 2, true)
FA_WGMMA_WS_BWD_INST(64, 64, 2, false)
FA_WGMMA_WS_BWD_INST(64, 64, 2, true)
FA_WGMMA_WS_BWD_INST(128, 64, 2, false)
FA_WGMMA_WS_BWD_INST(128, 64, 2, true)
FA_WGMMA_KV_SUM_INST(false)
FA_WGMMA_KV_SUM_INST(true)
FA_WGMMA_DQ_STORE_INST(32, false)
FA_WGMMA_DQ_STORE_INST(32, true)
FA_WGMMA_DQ_STORE_INST(96, false)
FA_WGMMA_DQ_STORE_INST(96, true)
FA_WGMMA_DQ_STORE_INST(64, false)
FA_WGMMA_DQ_STORE_INST(64, true)
FA_WGMMA_DQ_STORE_INST(128, false)
FA_WGMMA_DQ_STORE_INST(128, true)
FA_WGMMA_BWD_INST(32, 2, 64, false)
FA_WGMMA_BWD_INST(32, 2, 64, true)
FA_WGMMA_BWD_INST(96, 2, 64, false)
FA_WGMMA_BWD_INST(96, 2, 64, true)
FA_WGMMA_BWD_INST(64, 2, 64, false)
FA_WGMMA_BWD_INST(64, 2, 64, true)
FA_WGMMA_BWD_INST(128, 2, 64, false)
FA_WGMMA_BWD_INST(128, 2, 64, true)
FA_WGMMA_BWD_INST(256, 2, 32, false)
FA_WGMMA_BWD_INST(256, 2, 32, true)
#endif
