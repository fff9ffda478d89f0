// mma_backward.cu -- the backward pass on tensor cores (mma.sync m16n8k16), fp16 or bf16 in, fp32 accumulate.
//
// The recompute backward of algorithm.md section 8 (FlashAttention-2, Algorithm 2), from the forward's lse;
// softmax_scale = scale_log2 * ln 2:
//   S_ij  = Q_i K_j^T                    recomputed tile by tile
//   P_ij  = exp(softmax_scale * S_ij - lse_i)
//   dV_j += P_ij^T dO_i
//   dP_ij = dO_i V_j^T
//   dS_ij = P_ij o (dP_ij - Delta_i)     Delta_i (D_i) = rowsum(dO_i o O_i)   (mma_bwd_preprocess)
//   dK_j += softmax_scale * dS_ij^T Q_i  (mma_bwd_dkdv: one block per K/V tile of Bc keys, loop over Q tiles)
//   dQ_i += softmax_scale * dS_ij K_j    (mma_bwd_dq:   one block per Q tile of Br queries, loop over K/V tiles)
// Two kernels instead of atomic adds into dQ: every output tile belongs to one block, so the gradients are
// deterministic; the price is recomputing S and dP in both (7 matrix products per tile pair instead of 5).
// mma_bwd_fused is FlashAttention-2's own choice, one kernel and 5 products, in FlashAttention-2's warp layout (8
// warps, 128 keys a block, P and dS passed between the products through shared memory; below): each tile's
// dQ_i += dS_ij K_j goes into a float32 buffer with atomic adds (mma_bwd_fused_preprocess zeroes it beside Delta,
// mma_bwd_dq_store turns it into dQ); dQ's sums then come in any order, so it is not bitwise reproducible (dK and
// dV are). The mma rung runs it at D = 64, 96 and 128 (capabilities.mma_auto_backward), the two kernels otherwise.
// The mask (masks.cuh, window (left, right)): each block loops only over the tiles that hold a pair the mask
// shows, and the elementwise mask runs only on the warps' blocks that the mask does not call full.
// Grouped-query attention (Hq = group * Hk query heads read Hk K/V heads; query head bh = b Hq + h reads K/V
// head bh / group = b Hk + h / group): mma_bwd_dq reads K/V head bh / group; mma_bwd_dkdv runs one block per
// (K/V tile, b, K/V head) and loops over the group's query heads inside, summing dK_j and dV_j in registers (no
// atomics, no copy of K/V). Dropout (template flag DROPOUT; Z the keep mask, regenerated from the seed per
// element, frag::Dropout; Delta_i = rowsum(dO_i o O_i) of the dropped-out O, as above):
//   dV_j += (P_ij o Z_ij / (1 - p))^T dO_i,   dS_ij = P_ij o (dP_ij o Z_ij / (1 - p) - Delta_i)
//
// In the two kernels every product is a warp-level mma.sync on the warp's 16 rows, from fragments.cuh (as in mma.cu):
//   mma_abt: acc (16 x 8NT) += A (16 x D, rows of a shared tile) * B^T (rows of another shared tile)
//            -- ldmatrix on both: S^T = K_w Q_i^T, dP^T = V_w dO_i^T, S = Q_w K_j^T, dP = dO_w V_j^T
//   mma_ab:  acc (16 x D) += A (16 x 16KS, fragments in registers) * B (rows of a shared tile)
//            -- ldmatrix.trans on B: dV += P^T dO, dK += dS^T Q, dQ += dS K
// The fp32 accumulators of one product are repacked (pack_a) to 16 bits as the A operand of the next
// (P^T, dS^T, dS), as in the forward. Scores use log2 units: P = exp2(S * scale_log2 - lse * log2 e).
// A negative softmax_scale needs no special case: with no row max to take (lse comes from the forward), the
// signed scale_log2 multiplies the fp32 scores as it is (see frag::score_scale in fragments.cuh).
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"
#include "smem_tiles.cuh"
#include "backward_common.cuh"

namespace mma_bwd_detail {

using namespace frag;  // zero, mma_abt, mma_ab, pack_a, store_rows, acc_row, acc_col, stream_loop (fragments.cuh)
using namespace bwd;   // query_row, load_rows, TileSpan, kv_tiles, q_tiles (backward_common.cuh)

// The warp's 16 x 8NT blocks of P_ij and dS_ij, recomputed (KEY_ROWS: of P_ij^T and dS_ij^T, whose rows are
// keys and columns queries: the dK/dV kernel):
//   S  = A B^T, A = rows w_row .. w_row + 15 of tile s_a, B = tile s_b   (S_ij = Q_w K_j^T, or S_ij^T = K_w Q_i^T)
//   dP = A B^T, A = the same rows of tile dp_a, B = tile dp_b          (dP_ij = dO_w V_j^T, or dP_ij^T = V_w dO_i^T)
// then P_ij and dS_ij from them (bwd::p_and_ds: the arguments after dp_b are its own).
template <bool KEY_ROWS, bool DROPOUT, int D, int NT, bool BF16>
__device__ __forceinline__ void p_and_ds(float (&P_ij)[NT][4], float (&dS_ij)[NT][4], unsigned s_a, unsigned s_b,
                                         unsigned dp_a, unsigned dp_b, int w_row, const float* lse2,
                                         const float* delta, float scale_log2, const fa::Mask& mask, int row0,
                                         int col0, const Dropout& drop) {
    zero(P_ij);
    zero(dS_ij);
    mma_abt<D, NT, BF16>(P_ij, s_a, w_row, s_b, 0);    // S_ij first
    mma_abt<D, NT, BF16>(dS_ij, dp_a, w_row, dp_b, 0);  // dP_ij first
    bwd::p_and_ds<KEY_ROWS, DROPOUT>(P_ij, dS_ij, lse2, delta, scale_log2, mask, row0, col0, drop);
}

// ... the same with both A operands in registers: a_s and a_dp hold the warp's 16 rows of s_a and dp_a as D / 16 A
// fragments each (load_a_rows), loaded once where those rows stay for the whole loop (K_w and V_w in the dK/dV
// kernel). Each tile then reads only its B operands from shared memory: at D = 64 and Br = 64, 64 ldmatrix.x4 a
// warp instead of 72 (with dV's and dK's products).
template <bool KEY_ROWS, bool DROPOUT, int D, int NT, bool BF16>
__device__ __forceinline__ void p_and_ds_regs(float (&P_ij)[NT][4], float (&dS_ij)[NT][4],
                                              const unsigned (&a_s)[D / 16][4], unsigned s_b,
                                              const unsigned (&a_dp)[D / 16][4], unsigned dp_b, const float* lse2,
                                              const float* delta, float scale_log2, const fa::Mask& mask, int row0,
                                              int col0, const Dropout& drop) {
    zero(P_ij);
    zero(dS_ij);
    const auto from = [](const unsigned (&frags)[D / 16][4]) {  // mma_abt_rows' a_frag: k-step kk from registers
        return [&frags](unsigned (&a)[4], int, int kk) {
#pragma unroll
            for (int x = 0; x < 4; ++x) a[x] = frags[kk][x];
        };
    };
    mma_abt_rows<D, NT, 1, BF16>(reinterpret_cast<float (&)[1][NT][4]>(P_ij), from(a_s), s_b, 0);     // S_ij first
    mma_abt_rows<D, NT, 1, BF16>(reinterpret_cast<float (&)[1][NT][4]>(dS_ij), from(a_dp), dp_b, 0);  // dP_ij first
    bwd::p_and_ds<KEY_ROWS, DROPOUT>(P_ij, dS_ij, lse2, delta, scale_log2, mask, row0, col0, drop);
}
// rows row0 .. row0 + 15 of tile sA (rows, D) as D / 16 A fragments
template <int D>
__device__ __forceinline__ void load_a_rows(unsigned (&a)[D / 16][4], unsigned sA, int row0) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_a<D>(a[kk], sA, row0, kk);
}

// Shared memory of both kernels: (rows, D) 16-bit swizzled tiles (smem_tiles.cuh; D = 32, 64, 96, 128, 256), two
// that stay for the whole loop (STAY rows each), then two streamed through two buffers each (STREAM rows each,
// buffer b at + b * STREAM_BYTES).
template <int D, int STAY, int STREAM>
struct Smem {
    static constexpr unsigned STREAM_BYTES = STREAM * D * 2, BYTES = 2 * STAY * D * 2 + 4 * STREAM_BYTES;
    unsigned stay0, stay1, stream0, stream1;  // shared-window addresses
};
template <int D, int STAY, int STREAM>
__device__ __forceinline__ Smem<D, STAY, STREAM> smem_layout(unsigned char* smem) {
    const unsigned base = smem_u32(smem), stream0 = base + 2 * STAY * D * 2;
    return {base, base + STAY * D * 2, stream0, stream0 + 2 * Smem<D, STAY, STREAM>::STREAM_BYTES};
}

// p[0] += a, p[1] += b, atomically, where `on`: two columns of dQaccum per instruction (red.global.add.v2.f32 on
// sm_90, predicated in the instruction itself, so that neither a branch nor the address's arithmetic sits around it)
__device__ __forceinline__ void red_add2(bool on, float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred on;\nsetp.ne.b32 on, %3, 0;\n@on red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(p),
        "f"(a), "f"(b), "r"((int)on)
        : "memory");
#else
    if (on) {
        atomicAdd(p, a);
        atomicAdd(p + 1, b);
    }
#endif
}
}  // namespace mma_bwd_detail

// Delta_i = rowsum(dO_i o O_i) in fp32, one warp per row (O and dO 16-bit, (rows, D); bwd::delta_row).
template <int D, bool BF16>
__global__ void mma_bwd_preprocess(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO,
                                   float* __restrict__ Delta, long long rows) {
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const float delta = bwd::delta_row<D, BF16>(O, dO, r, bwd::delta_vec<D>(O, dO));
    if (threadIdx.x % 32 == 0) Delta[r] = delta;
}

// The one-kernel backward's first step: Delta as mma_bwd_preprocess, and row r of dQaccum (rows, D) zeroed by
// the same warp (D / 2 float2 stores over its lanes: at D = 32 and 96 lanes 16 .. 31 store one fewer).
template <int D, bool BF16>
__global__ void mma_bwd_fused_preprocess(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO,
                                         float* __restrict__ Delta, float* __restrict__ dQaccum, long long rows) {
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const float delta = bwd::delta_row<D, BF16>(O, dO, r, bwd::delta_vec<D>(O, dO));
    if (threadIdx.x % 32 == 0) Delta[r] = delta;
    float2* row = reinterpret_cast<float2*>(dQaccum + r * D);
#pragma unroll
    for (int c = threadIdx.x % 32; c < D / 2; c += 32) row[c] = make_float2(0.0f, 0.0f);
}

// dQ = softmax_scale * dQaccum in 16 bits, 4 elements per thread (n = B Hq Nq D, a multiple of 4).
template <bool BF16>
__global__ void mma_bwd_dq_store(const float* __restrict__ dQaccum, unsigned short* __restrict__ dQ, long long n,
                                 float softmax_scale) {
    const long long e = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= n) return;
    const float4 a = *reinterpret_cast<const float4*>(dQaccum + e);
    *reinterpret_cast<uint2*>(dQ + e) = make_uint2(ptx::pack2<BF16>(a.x * softmax_scale, a.y * softmax_scale),
                                                   ptx::pack2<BF16>(a.z * softmax_scale, a.w * softmax_scale));
}

// dK_j, dV_j for one tile of Bc = 16 NWARPS keys (warp w: keys 16w .. 16w + 15) of K/V head blockIdx.y
// (= b Hk + hk; grid (ceil(Nk / Bc) * NCOL, B * Hk)), looping over the group's query heads bh = blockIdx.y * group + g,
// g = 0 .. group - 1, and for each over the tiles of Br queries that see any of the keys: queries
// [mask.q_begin(k0), mask.q_end(k0 + Bc)). GQA = false (group must be 1) compiles the one-head kernel: the loop
// over the group keeps ~10 more registers live, which at D = 64 costs a block per SM.
// D = 256: a warp's 16 rows of dK_j and dV_j would be 256 fp32 registers per thread, more than a thread has. The
// block then owns DC = 128 of their columns (NCOL = D / DC blocks per K/V tile, blockIdx.x = tile * NCOL + column
// block): it still computes S^T and dP^T over all of D, so those two products run twice, once per half.
namespace mma_bwd_detail {
template <int D, int NWARPS, int Br, bool BF16, bool DROPOUT, bool GQA>
__device__ __forceinline__ void dkdv_block(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                                           const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                                           const float* __restrict__ LSE, const float* __restrict__ Delta,
                                           unsigned short* __restrict__ dK, unsigned short* __restrict__ dV, int Nq,
                                           int Nk, float scale_log2,
                                           int window_left, int window_right, int group, float dropout_p,
                                           unsigned seed_lo, unsigned seed_hi) {
    constexpr int Bc = 16 * NWARPS, NTHREADS = NWARPS * 32;
    constexpr int DC = D > 128 ? 128 : D, NCOL = D / DC;  // columns of dK_j, dV_j per block; blocks per tile
    extern __shared__ __align__(128) unsigned char smem[];
    using Layout = Smem<D, Bc, Br>;  // K_j and V_j stay, Q_i and dO_i stream
    constexpr unsigned Q_BYTES = Layout::STREAM_BYTES;
    const Layout sm = smem_layout<D, Bc, Br>(smem);
    const unsigned sK = sm.stay0, sV = sm.stay1, sQ = sm.stream0, sdO = sm.stream1;
    float* sL = reinterpret_cast<float*>(smem + Layout::BYTES);  // 2 x Br: lse in log2 units
    float* sDl = sL + 2 * Br;                                     // 2 x Br: Delta

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const int warp = threadIdx.x / 32;
    const int k0 = (blockIdx.x / NCOL) * Bc, wkey = warp * 16;  // block's first key, warp's first row in the tile
    const int col0 = (blockIdx.x % NCOL) * DC;                      // the block's first column of dK_j, dV_j
    const long long bkv = blockIdx.y;  // the K/V head: b * Hk + hk
    const unsigned short *k = K + bkv * Nk * D, *v = V + bkv * Nk * D;
    long long bh = GQA ? bkv * group : bkv;  // the group's first query head: b * Hq + hk * group
    const unsigned short *q = Q + bh * Nq * D, *dout = dO + bh * Nq * D;
    const float *lse = LSE + bh * Nq, *delta = Delta + bh * Nq;
    // the Q tiles that hold every query seeing a key of this block (the others would add 0); the same for
    // every query head
    const TileSpan tiles = q_tiles(mask, k0, k0 + Bc, Br);

    const auto stream = [&](int it, int b) {  // Q_i, dO_i, lse2 and Delta of Q tile `it` of head bh into buffer b
        const int i0 = (tiles.first + it) * Br;
        load_tile_async<Br, D, NTHREADS>(sQ + b * Q_BYTES, q, i0, Nq);
        load_tile_async<Br, D, NTHREADS>(sdO + b * Q_BYTES, dout, i0, Nq);
        load_rows<Br>(sL + b * Br, sDl + b * Br, lse, delta, i0, Nq);
    };
    load_tile_async<Bc, D, NTHREADS>(sK, k, k0, Nk);  // K_j and V_j stay for every query head of the group
    load_tile_async<Bc, D, NTHREADS>(sV, v, k0, Nk);
    if (tiles.count > 0) stream(0, 0);
    cp_async_commit();

    float dk[DC / 8][4], dv[DC / 8][4];  // the warp's 16 rows of dK_j and dV_j (DC columns), summed over the group
    zero(dk);
    zero(dv);
    // D = 32 and 64 (no dropout): the warp's K_w and V_w in registers for the whole loop, D / 2 of them a thread
    constexpr bool A_REGS = D <= 64 && !DROPOUT;
    unsigned kA[A_REGS ? D / 16 : 1][4], vA[A_REGS ? D / 16 : 1][4];
    for (int g = 0;;) {  // the group's query heads (GQA false: group 1, one pass)
        const Dropout drop = make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read only if DROPOUT
        stream_loop(tiles.count, stream, [&](int it, int buf) {
            const int i0 = (tiles.first + it) * Br;
            const unsigned qb = sQ + buf * Q_BYTES, db = sdO + buf * Q_BYTES;
            // P_ij^T and dS_ij^T: the warp's 16 keys x Br queries, from S^T = K_w Q_i^T and dP^T = V_w dO_i^T
            float P_ij[Br / 8][4], dS_ij[Br / 8][4];  // transposed: P_ij^T, dS_ij^T
            if constexpr (A_REGS) {
                if (it == 0) load_a_rows<D>(kA, sK, wkey), load_a_rows<D>(vA, sV, wkey);  // K_j, V_j have landed
                p_and_ds_regs<true, DROPOUT, D, Br / 8, BF16>(P_ij, dS_ij, kA, qb, vA, db, sL + buf * Br,
                                                              sDl + buf * Br, scale_log2, mask, k0 + wkey, i0, drop);
            } else {
                p_and_ds<true, DROPOUT, D, Br / 8, BF16>(P_ij, dS_ij, sK, qb, sV, db, wkey, sL + buf * Br,
                                                         sDl + buf * Br, scale_log2, mask, k0 + wkey, i0, drop);
            }
            unsigned a[Br / 16][4];
            pack_a<Br / 8, BF16>(a, P_ij);
            mma_ab<D, Br / 16, BF16, DC>(dv, a, db, 0, col0);  // dV_j += P_ij^T dO_i  (DROPOUT: (P_ij o Z / (1 - p))^T dO_i)
            pack_a<Br / 8, BF16>(a, dS_ij);
            mma_ab<D, Br / 16, BF16, DC>(dk, a, qb, 0, col0);  // dK_j += dS_ij^T Q_i  (times softmax_scale at the end)
        });
        if (!GQA || ++g == group) break;  // (GQA false: compiled without the loop)
        // the next query head (stream_loop has waited for its copies and synced after its last tile: the
        // buffers are free)
        ++bh;
        q += Nq * D, dout += Nq * D, lse += Nq, delta += Nq;
        if (tiles.count > 0) stream(0, 0);
        cp_async_commit();
    }
    const float softmax_scale = scale_log2 * FA_LN2;
    store_rows<D, BF16, DC>(dK + bkv * Nk * D, dk, k0 + wkey, Nk, softmax_scale, col0);  // dK_j = softmax_scale * dS^T Q
    store_rows<D, BF16, DC>(dV + bkv * Nk * D, dv, k0 + wkey, Nk, 1.0f, col0);
}
}  // namespace mma_bwd_detail

template <int D, int NWARPS, int Br, bool BF16, bool DROPOUT = false, bool GQA = false>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_bwd_dkdv(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                 const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                 const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                 unsigned short* __restrict__ dV, int Nq, int Nk, float scale_log2, int window_left,
                 int window_right, int group, float dropout_p, unsigned seed_lo, unsigned seed_hi) {
    mma_bwd_detail::dkdv_block<D, NWARPS, Br, BF16, DROPOUT, GQA>(Q, K, V, dO, LSE, Delta, dK, dV, Nq, Nk, scale_log2,
                                                                  window_left, window_right, group, dropout_p,
                                                                  seed_lo, seed_hi);
}

// The one-kernel backward, FlashAttention-2's Algorithm 2 with FlashAttention-2's warp layout: one block of 8 warps
// per tile of Bc = 128 keys of K/V head blockIdx.y (= b Hk + hk; grid (ceil(Nk / Bc), B * Hk)), looping over the
// group's query heads and, for each, over the Q tiles of Br queries that see any of the keys. For every tile pair
// the block computes 5 products, each split over the 8 warps in its own way, so that a warp reads from shared
// memory only the rows and columns its part needs:
//   S_ij  = Q_i K_j^T, dP_ij = dO_i V_j^T    (Br x Bc)  warp (wm, wn) = (w / 4, w % 4): queries wm Br/2 .. + Br/2,
//                                                        keys 32 wn .. + 31
//   P_ij, dS_ij (bwd::p_and_ds) -> 16-bit tiles sP, sdS in shared memory (Br x Bc, queries as rows); sync
//   dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i (Bc x D)    warp (wk, wd) = (w / 2, w % 2): keys 32 wk .. + 31,
//                                                        columns wd D/2 .. + D/2 (A = P^T, dS^T: ldmatrix.trans)
//   dQ_i += dS_ij K_j                         (Br x D)   warp (wq, wc) = (w / WC, w % WC), WC = 8 / (Br / 32):
//                                                        queries 32 wq .. + 31, columns wc D/WC .. + D/WC (D = 96:
//                                                        16 queries, WC = 8 / (Br / 16)), added
//                                                        into dQaccum (float32 (B Hq, Nq, D), zeroed by
//                                                        mma_bwd_fused_preprocess) with atomic adds
// A warp of the two-kernel backward owns 16 rows and reads the whole streamed tile for each of its products; here
// every product's operands are shared between warps in both directions: per tile pair, at D = 128 and Br = 64,
// about 55 KB of shared-memory reads per MFLOP of the 5 products, against 98 for the two kernels' 7.
// dQ's sums come in any order: dQ is not bitwise reproducible (dK and dV are). D = 32, 64, 96 and 128 (D = 256's
// dK and dV would not fit in the warps' registers).
namespace mma_bwd_detail {
// mma_ab_frags' a_frag for A = the transpose of a (rows, 128) 16-bit swizzled tile (P^T of sP, dS^T of sdS):
// A_m's fragment of k-step kk = the tile's columns row0 + 16 m .. + 15 (A's rows) x its rows 16 kk .. + 15
// (SPLIT: through SwzPtr, smem_tiles.cuh; otherwise swz on every read)
template <bool SPLIT>
__device__ __forceinline__ auto trans_a(unsigned sT, int row0) {
    if constexpr (SPLIT) {
        // matrix lane / 8: tile rows + 8 (lane / 16), tile columns + 8 ((lane / 8) % 2); row0 a multiple of 32
        const int lane = threadIdx.x % 32;
        const SwzPtr<128> pt(sT, 0, (lane & 7) + ((lane >> 4) & 1) * 8, row0 / 8, (lane >> 3) & 1);
        return [pt](unsigned (&a)[4], int m, int kk) {  // tile rows 16 kk + .., columns row0 + 16 m + ..
            ldmatrix_x4_trans(a, pt.at(16 * kk, 2 * m));
        };
    } else {
        return [sT, row0](unsigned (&a)[4], int m, int kk) {
            const int lane = threadIdx.x % 32;
            const int r = 16 * kk + (lane & 7) + ((lane >> 4) & 1) * 8, c = row0 + 16 * m + ((lane >> 3) & 1) * 8;
            ldmatrix_x4_trans(a, sT + swz<128>(r, c / 8));
        };
    }
}
// The warp's 16 x 32 fp32 block at rows dr + .. of the warp's place in a 16-bit (rows, 128) swizzled tile, packed
// in pairs. `at` is the thread's address of its first pair there, row row0 + g, columns col0 + 2t (pair_at, once
// a kernel). Element (n, 2h) sits at row row0 + dr + g + 8h, columns col0 + 8n + 2t: dr + 8h is a multiple of 8,
// so the row keeps the swizzle term g, and chunk col0 / 8 + n (col0 a multiple of 32, n < 4) swizzles to that of
// chunk col0 / 8 with bits 0..1 flipped by n. Its address is `at` with address bits 4..5 XOR'd by n plus an
// offset the instruction carries (the tile starts 128-byte aligned; smem_tiles.cuh, SwzPtr).
__device__ __forceinline__ unsigned pair_at(unsigned sT, int row0, int col0) {
    return sT + swz<128>(row0 + acc_row(0), col0 / 8) + 4 * (threadIdx.x % 4);
}
template <bool BF16>
__device__ __forceinline__ void store_block(unsigned at, const float (&acc)[4][4], int dr) {
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g and g + 8
            const unsigned addr = (at ^ (n << 4)) + (dr + 8 * h) * 256;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pack2<BF16>(acc[n][2 * h], acc[n][2 * h + 1]))
                         : "memory");
        }
}
}  // namespace mma_bwd_detail

template <int D, int NWARPS, int Br, bool BF16, bool DROPOUT = false, bool GQA = false>
__global__ void __launch_bounds__(NWARPS * 32, 1)
    mma_bwd_fused(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                  const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                  const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                  unsigned short* __restrict__ dV, float* __restrict__ dQaccum, int Nq, int Nk, float scale_log2,
                  int window_left, int window_right, int group, float dropout_p, unsigned seed_lo,
                  unsigned seed_hi) {
    using namespace mma_bwd_detail;
    static_assert(NWARPS == 8 && D % 32 == 0 && D <= 128 && (Br == 64 || Br == 128), "8 warps, D 32 .. 128");
    constexpr int Bc = 16 * NWARPS, NTHREADS = NWARPS * 32;
    constexpr int MS = Br / 32;  // S, dP: m16 tiles a warp (Br / 2 queries), 4 n8 tiles (32 keys)
    // dQ: MQ m16 tiles (16 MQ queries) a warp, WC warps across D, DQC columns each (a multiple of 16: 2 m16 tiles a
    // warp, or 1 where that would leave D / WC = 24 columns, at D = 96)
    constexpr int MQ = (D / (8 / (Br / 32))) % 16 == 0 ? 2 : 1, WC = 8 / (Br / (16 * MQ)), DQC = D / WC;
    static_assert(DQC % 16 == 0, "dQ columns a warp");
    constexpr bool SPLIT = D % 128 == 0;  // sP and sdS addressed as the head-dim tiles are (smem_tiles.cuh, SwzPtr)
    extern __shared__ __align__(128) unsigned char smem[];
    using Layout = Smem<D, Bc, Br>;  // K_j and V_j stay, Q_i and dO_i stream
    constexpr unsigned Q_BYTES = Layout::STREAM_BYTES;
    const Layout sm = smem_layout<D, Bc, Br>(smem);
    const unsigned sK = sm.stay0, sV = sm.stay1, sQ = sm.stream0, sdO = sm.stream1;
    const unsigned sP = smem_u32(smem) + Layout::BYTES, sdS = sP + Br * Bc * 2;  // (Br, Bc) 16-bit, swz<128>
    float* sL = reinterpret_cast<float*>(smem + Layout::BYTES + 2 * Br * Bc * 2);  // 2 x Br: lse2 (NextRows)
    float* sDl = sL + 2 * Br;                                                     // 2 x Br: Delta

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const int warp = threadIdx.x / 32;
    const int k0 = blockIdx.x * Bc;
    const int s_row = (warp / 4) * (Br / 2), s_col = (warp % 4) * 32;  // the warp's block of S_ij, dP_ij
    const int kv_row = (warp / 2) * 32, kv_col = (warp % 2) * (D / 2);  // ... of dK_j, dV_j
    const int q_row = (warp / WC) * 16 * MQ, q_col = (warp % WC) * DQC;  // ... of dQ_i
    const long long bkv = blockIdx.y;  // the K/V head: b * Hk + hk
    const unsigned short *k = K + bkv * Nk * D, *v = V + bkv * Nk * D;
    long long bh = GQA ? bkv * group : bkv;  // the group's first query head: b * Hq + hk * group
    const unsigned short *q = Q + bh * Nq * D, *dout = dO + bh * Nq * D;
    const float *lse = LSE + bh * Nq, *delta = Delta + bh * Nq;
    float* dq_rows = dQaccum + bh * Nq * D;
    const TileSpan tiles = q_tiles(mask, k0, k0 + Bc, Br);  // the same for every query head
    const unsigned p_at = pair_at(sP, s_row, s_col);          // the thread's first pair of P_ij in sP (dS_ij: sdS)

    const auto stream = [&](int it, int b) {  // Q_i and dO_i of Q tile `it` of head bh into buffer b
        const int i0 = (tiles.first + it) * Br;
        load_tile_async<Br, D, NTHREADS>(sQ + b * Q_BYTES, q, i0, Nq);
        load_tile_async<Br, D, NTHREADS>(sdO + b * Q_BYTES, dout, i0, Nq);
    };
    NextRows<Br> rows;  // lse2 and Delta of the next Q tile, through registers (backward_common.cuh)
    const auto first_tile = [&] {  // Q tile 0 of head bh into buffer 0, its rows at once (the loop's barrier waits)
        if (tiles.count > 0) {
            stream(0, 0);
            rows.fetch(lse, delta, tiles.first * Br, Nq);
            rows.put(sL, sDl);
        }
        cp_async_commit();
    };
    load_tile_async<Bc, D, NTHREADS>(sK, k, k0, Nk);  // K_j and V_j stay for every query head of the group
    load_tile_async<Bc, D, NTHREADS>(sV, v, k0, Nk);
    first_tile();

    float dk[2][D / 16][4], dv[2][D / 16][4];  // the warp's 32 keys x D/2 columns of dK_j and dV_j
#pragma unroll
    for (int m = 0; m < 2; ++m) zero(dk[m]), zero(dv[m]);
    for (int g = 0;;) {  // the group's query heads (GQA false: group 1, one pass)
        const Dropout drop = make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read only if DROPOUT
        stream_loop(tiles.count, stream, [&](int it, int buf) {
            const int i0 = (tiles.first + it) * Br;
            const unsigned qb = sQ + buf * Q_BYTES, db = sdO + buf * Q_BYTES;
            // the same for every warp: whether any pair of this (Br, Bc) tile is hidden or out of range; where none
            // is, no warp tests its own block
            const bool tile_may_mask = mask.needs_mask(i0, i0 + Br, k0, k0 + Bc);
            {
                // S_ij = Q_i K_j^T, dP_ij = dO_i V_j^T: the warp's Br/2 queries x 32 keys
                float P_ij[MS][4][4], dS_ij[MS][4][4];  // hold S_ij and dP_ij first
#pragma unroll
                for (int m = 0; m < MS; ++m) zero(P_ij[m]), zero(dS_ij[m]);
                mma_abt_rows<D, 4, MS, BF16>(
                    P_ij, [&](unsigned (&a)[4], int m, int kk) { load_a<D>(a, qb, s_row + 16 * m, kk); }, sK, s_col);
                mma_abt_rows<D, 4, MS, BF16>(
                    dS_ij, [&](unsigned (&a)[4], int m, int kk) { load_a<D>(a, db, s_row + 16 * m, kk); }, sV, s_col);
#pragma unroll
                for (int m = 0; m < MS; ++m) {
                    const int r = s_row + 16 * m;
                    float lse2[2], delta_i[2];  // this thread's two query rows g, g + 8
#pragma unroll
                    for (int h = 0; h < 2; ++h)  // as NextRows stored them
                        lse2[h] = sL[buf * Br + r + acc_row(2 * h)], delta_i[h] = sDl[buf * Br + r + acc_row(2 * h)];
                    // P_ij = exp2(S_ij scale_log2 - lse2_i), dS_ij = P_ij o (dP_ij - Delta_i)  (DROPOUT: bwd::p_and_ds)
                    bwd::p_and_ds<false, DROPOUT>(P_ij[m], dS_ij[m], lse2, delta_i, scale_log2, mask, i0 + r,
                                                  k0 + s_col, drop, tile_may_mask);
                    store_block<BF16>(p_at, P_ij[m], 16 * m);
                    store_block<BF16>(p_at + (sdS - sP), dS_ij[m], 16 * m);
                }
            }
            __syncthreads();  // sP and sdS hold the whole (Br, Bc) tile
            const bool has_next = it + 1 < tiles.count;
            if (has_next) rows.fetch(lse, delta, i0 + Br, Nq);  // stored at the end of this tile
            // dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i  (dK times softmax_scale at the end)
            mma_ab_frags<D, Br / 16, 2, BF16, D / 2>(dv, trans_a<SPLIT>(sP, kv_row), db, 0, kv_col);
            mma_ab_frags<D, Br / 16, 2, BF16, D / 2>(dk, trans_a<SPLIT>(sdS, kv_row), qb, 0, kv_col);
            // dQ_i += dS_ij K_j, atomically into dQaccum (stream_loop syncs before sP, sdS are written again)
            float dq[MQ][DQC / 8][4];
#pragma unroll
            for (int m = 0; m < MQ; ++m) zero(dq[m]);
            mma_ab_frags<D, Bc / 16, MQ, BF16, DQC>(
                dq, [&](unsigned (&a)[4], int m, int kk) { load_a<Bc>(a, sdS, q_row + 16 * m, kk); }, sK, 0, q_col);
            // the thread's first pair, row i0 + q_row + g, columns q_col + 2t; the others at offsets the
            // instruction carries. Rows >= Nq are skipped, tested only on a tile that reaches past Nq (the same
            // for every warp)
            float* dq_at = dq_rows + (long long)(i0 + q_row + acc_row(0)) * D + q_col + acc_col(0, 0);
            const int rows_left = i0 + Br <= Nq ? Br : Nq - (i0 + q_row + acc_row(0));
            const auto add_dq = [&](bool whole) {
#pragma unroll
                for (int m = 0; m < MQ; ++m)
#pragma unroll
                    for (int n = 0; n < DQC / 8; ++n)
#pragma unroll
                        for (int h = 0; h < 2; ++h)  // rows g and g + 8
                            red_add2(whole || 16 * m + 8 * h < rows_left, dq_at + (16 * m + 8 * h) * D + 8 * n,
                                     dq[m][n][2 * h], dq[m][n][2 * h + 1]);
            };
            if (i0 + Br <= Nq)
                add_dq(true);
            else
                add_dq(false);
            // the next tile's rows into the buffer the last tile read (stream_loop's barrier hands it on)
            if (has_next) rows.put(sL + (buf ^ 1) * Br, sDl + (buf ^ 1) * Br);
        });
        if (!GQA || ++g == group) break;  // (GQA false: compiled without the loop)
        // the next query head (stream_loop has waited for its copies and synced after its last tile)
        ++bh;
        q += Nq * D, dout += Nq * D, lse += Nq, delta += Nq, dq_rows += Nq * D;
        first_tile();
    }
    const float softmax_scale = scale_log2 * FA_LN2;
#pragma unroll
    for (int m = 0; m < 2; ++m) {  // dK_j = softmax_scale * dS^T Q
        store_rows<D, BF16, D / 2>(dK + bkv * Nk * D, dk[m], k0 + kv_row + 16 * m, Nk, softmax_scale, kv_col);
        store_rows<D, BF16, D / 2>(dV + bkv * Nk * D, dv[m], k0 + kv_row + 16 * m, Nk, 1.0f, kv_col);
    }
}

// dQ_i for one tile of Br = 16 NWARPS queries (warp w: queries 16w .. 16w + 15), looping over the tiles of Bc
// keys that any of them sees: keys [mask.kv_begin(q0), mask.kv_end(q0 + Br)).
// Grid (ceil(Nq / Br), B * Hq); query head bh = blockIdx.y reads K/V head bh / group.
template <int D, int NWARPS, int Bc, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_bwd_dq(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
               const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
               const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dQ, int Nq,
               int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
               unsigned seed_lo, unsigned seed_hi) {
    using namespace mma_bwd_detail;
    constexpr int Br = 16 * NWARPS, NTHREADS = NWARPS * 32;
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr unsigned KV_BYTES = Smem<D, Br, Bc>::STREAM_BYTES;
    const Smem<D, Br, Bc> sm = smem_layout<D, Br, Bc>(smem);  // Q_i and dO_i stay, K_j and V_j stream
    const unsigned sQ = sm.stay0, sdO = sm.stay1, sK = sm.stream0, sV = sm.stream1;

    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    // later Q tiles see more keys with a right bound (causal): they run first
    const int q_block = mask.heavy_last() ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int warp = threadIdx.x / 32;
    const int q0 = q_block * Br, wrow = warp * 16;  // block's first query, warp's first row in the tile
    const long long bh = blockIdx.y, bkv = bh / group;  // query head b * Hq + h, its K/V head b * Hk + h / group
    const unsigned short *q = Q + bh * Nq * D, *k = K + bkv * Nk * D, *v = V + bkv * Nk * D, *dout = dO + bh * Nq * D;
    const Dropout drop = make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read only if DROPOUT
    // the K/V tiles that hold every key a query of this block sees
    const TileSpan tiles = kv_tiles(mask, q0, q0 + Br, Bc);

    const auto stream = [&](int jt, int b) {  // K_j and V_j of K/V tile `jt` into buffer b
        const int j0 = (tiles.first + jt) * Bc;
        load_tile_async<Bc, D, NTHREADS>(sK + b * KV_BYTES, k, j0, Nk);
        load_tile_async<Bc, D, NTHREADS>(sV + b * KV_BYTES, v, j0, Nk);
    };
    load_tile_async<Br, D, NTHREADS>(sQ, q, q0, Nq);
    load_tile_async<Br, D, NTHREADS>(sdO, dout, q0, Nq);
    if (tiles.count > 0) stream(0, 0);
    cp_async_commit();
    float lse2[2], delta_i[2];  // this thread's two query rows g, g + 8: lse in log2 units, Delta
#pragma unroll
    for (int h = 0; h < 2; ++h)
        query_row(lse2[h], delta_i[h], LSE + bh * Nq, Delta + bh * Nq, q0 + wrow + acc_row(2 * h), Nq);

    float dq[D / 8][4];  // the warp's 16 rows of dQ_i
    zero(dq);
    // (Q_w and dO_w stay for the whole loop too, but 32 more registers for their fragments would cost this kernel
    // its third block per SM at D = 64: 183 registers a thread against 168)
    stream_loop(tiles.count, stream, [&](int jt, int buf) {
        const unsigned kb = sK + buf * KV_BYTES, vb = sV + buf * KV_BYTES;
        // P_ij and dS_ij: the warp's 16 queries x Bc keys, from S = Q_w K_j^T and dP = dO_w V_j^T
        float P_ij[Bc / 8][4], dS_ij[Bc / 8][4];
        p_and_ds<false, DROPOUT, D, Bc / 8, BF16>(P_ij, dS_ij, sQ, kb, sdO, vb, wrow, lse2, delta_i, scale_log2,
                                                  mask, q0 + wrow, (tiles.first + jt) * Bc, drop);
        unsigned a[Bc / 16][4];
        pack_a<Bc / 8, BF16>(a, dS_ij);
        mma_ab<D, Bc / 16, BF16>(dq, a, kb, 0);  // dQ_i += dS_ij K_j  (times softmax_scale at the end)
    });
    store_rows<D, BF16>(dQ + bh * Nq * D, dq, q0 + wrow, Nq, scale_log2 * FA_LN2);  // dQ_i = softmax_scale * dS K
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_MMA_BWD_INST(D, T, BF)                                                                                   \
    template __global__ void mma_bwd_preprocess<D, BF>(const unsigned short*, const unsigned short*, float*,     \
                                                       long long);                                               \
    template __global__ void mma_bwd_dkdv<D, 4, T, BF>(const unsigned short*, const unsigned short*,            \
                                                        const unsigned short*, const unsigned short*,            \
                                                        const float*, const float*, unsigned short*,             \
                                                        unsigned short*, int, int, float, int, int, int, float,  \
                                                        unsigned, unsigned);                                     \
    template __global__ void mma_bwd_dq<D, 4, T, BF>(const unsigned short*, const unsigned short*,              \
                                                      const unsigned short*, const unsigned short*, const float*, \
                                                      const float*, unsigned short*, int, int, float, int, int,   \
                                                      int, float, unsigned, unsigned);                            \
    template __global__ void mma_bwd_dkdv<D, 4, T, BF, true>(const unsigned short*, const unsigned short*,      \
                                                              const unsigned short*, const unsigned short*,      \
                                                              const float*, const float*, unsigned short*,       \
                                                              unsigned short*, int, int, float, int, int, int,   \
                                                              float, unsigned, unsigned);                        \
    template __global__ void mma_bwd_dq<D, 4, T, BF, true>(const unsigned short*, const unsigned short*,        \
                                                            const unsigned short*, const unsigned short*,        \
                                                            const float*, const float*, unsigned short*, int,    \
                                                            int, float, int, int, int, float, unsigned, unsigned);  \
    template __global__ void mma_bwd_dkdv<D, 4, T, BF, false, true>(const unsigned short*, const unsigned short*, \
                                                                     const unsigned short*, const unsigned short*, \
                                                                     const float*, const float*, unsigned short*,  \
                                                                     unsigned short*, int, int, float, int, int,   \
                                                                     int, float, unsigned, unsigned);
#define FA_MMA_BWD_GQA_DROPOUT_INST(D, T, BF)                                                                     \
    template __global__ void mma_bwd_dkdv<D, 4, T, BF, true, true>(const unsigned short*, const unsigned short*, \
                                                                    const unsigned short*, const unsigned short*, \
                                                                    const float*, const float*, unsigned short*,  \
                                                                    unsigned short*, int, int, float, int, int,   \
                                                                    int, float, unsigned, unsigned);
#define FA_MMA_FUSED_PARAMS                                                                                    \
    (const unsigned short*, const unsigned short*, const unsigned short*, const unsigned short*, const float*,     \
     const float*, unsigned short*, unsigned short*, float*, int, int, float, int, int, int, float, unsigned, unsigned)
#define FA_MMA_FUSED_INST(D, T, BF)                                                                                 \
    template __global__ void mma_bwd_fused_preprocess<D, BF>(const unsigned short*, const unsigned short*, float*, \
                                                             float*, long long);                                    \
    template __global__ void mma_bwd_fused<D, 8, T, BF> FA_MMA_FUSED_PARAMS;                                        \
    template __global__ void mma_bwd_fused<D, 8, T, BF, true> FA_MMA_FUSED_PARAMS;                                  \
    template __global__ void mma_bwd_fused<D, 8, T, BF, false, true> FA_MMA_FUSED_PARAMS;                           \
    template __global__ void mma_bwd_fused<D, 8, T, BF, true, true> FA_MMA_FUSED_PARAMS;
template __global__ void mma_bwd_dq_store<false>(const float*, unsigned short*, long long, float);
template __global__ void mma_bwd_dq_store<true>(const float*, unsigned short*, long long, float);
FA_MMA_FUSED_INST(32, 128, false)
FA_MMA_FUSED_INST(32, 128, true)
FA_MMA_FUSED_INST(64, 128, false)
FA_MMA_FUSED_INST(64, 128, true)
FA_MMA_FUSED_INST(96, 64, false)
FA_MMA_FUSED_INST(96, 64, true)
FA_MMA_FUSED_INST(128, 64, false)
FA_MMA_FUSED_INST(128, 64, true)
FA_MMA_BWD_INST(32, 64, false)
FA_MMA_BWD_INST(32, 64, true)
FA_MMA_BWD_INST(64, 64, false)
FA_MMA_BWD_INST(64, 64, true)
FA_MMA_BWD_INST(96, 64, false)
FA_MMA_BWD_INST(96, 64, true)
FA_MMA_BWD_INST(128, 64, false)
FA_MMA_BWD_INST(128, 64, true)
FA_MMA_BWD_GQA_DROPOUT_INST(32, 64, false)
FA_MMA_BWD_GQA_DROPOUT_INST(64, 64, false)
FA_MMA_BWD_GQA_DROPOUT_INST(96, 64, true)
FA_MMA_BWD_GQA_DROPOUT_INST(128, 64, true)
FA_MMA_BWD_INST(256, 32, false)
FA_MMA_BWD_INST(256, 32, true)
FA_MMA_BWD_GQA_DROPOUT_INST(256, 32, false)
#endif
