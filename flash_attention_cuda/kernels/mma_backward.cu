// mma_backward.cu -- the backward pass on tensor cores (mma.sync m16n8k16), fp16 or bf16 in, fp32 accumulate.
//
// The recompute backward of algorithm.md section 8 (FlashAttention-2, Algorithm 2), from the forward's lse:
//   P_ij  = exp(S_ij - lse_i)            S_ij = scale * Qi Kj^T, recomputed tile by tile
//   dV_j += P_ij^T dO_i
//   dP_ij = dO_i Vj^T
//   dS_ij = P_ij o (dP_ij - Delta_i)     Delta_i = rowsum(dO_i o O_i)   (mma_bwd_preprocess)
//   dK_j += scale * dS_ij^T Qi           (mma_bwd_dkdv: one block per K/V tile, loop over the Q tiles)
//   dQ_i += scale * dS_ij Kj             (mma_bwd_dq:   one block per Q tile, loop over the K/V tiles)
// Two kernels instead of atomic adds into dQ: every output tile belongs to one block, so the gradients are
// deterministic; the price is recomputing S and dP in both (7 matrix products per tile pair instead of 5).
//
// Every product is a warp-level mma.sync on 16 rows of the warp (the same fragments as mma.cu):
//   mma_abt: acc (16 x 8NT) += A (16 x D, rows of a shared tile) * B^T (rows of another shared tile)
//            -- ldmatrix on both, e.g. S^T = K_w Q_i^T, dP^T = V_w dO_i^T, S = Q_w K_j^T, dP = dO_w V_j^T
//   mma_pb:  acc (16 x D) += P (16 x 16KS, A fragments in registers) * B (rows of a shared tile)
//            -- ldmatrix.trans on B, e.g. dV += P^T dO, dK += dS^T Q, dQ += dS K
// The fp32 accumulators of one product are repacked to 16 bits as the A operand of the next (P^T, dS^T),
// as in the forward. Scores use log2 units: P = exp2(S * scale * log2 e - lse * log2 e).
#include "common.cuh"
#include "ptx.cuh"
#include "smem_tiles.cuh"

namespace mma_bwd_detail {

using namespace ptx;
using namespace tiles;

// acc (16 x 8 NT) += A (rows a_row0 .. a_row0 + 15 of tile sA) * B^T (rows b_row0 .. b_row0 + 8 NT - 1 of sB);
// both tiles (rows, D) 16-bit, swizzled; the sum runs over D.
template <int D, int NT, bool BF16>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], unsigned sA, int a_row0, unsigned sB, int b_row0) {
    const int lane = threadIdx.x % 32;
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[4];
        ldmatrix_x4(a, sA + swz<D>(a_row0 + a_row, kk * 2 + a_chunk));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {  // two n8 tiles per ldmatrix.x4
            unsigned b[4];
            ldmatrix_x4(b, sB + swz<D>(b_row0 + np * 16 + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
            mma_16816<BF16>(acc[2 * np], a, b[0], b[1]);
            mma_16816<BF16>(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 x D) += P (16 x 16 KS, A fragments) * B (rows b_row0 .. b_row0 + 16 KS - 1 of tile sB: k = row, n = d)
template <int D, int KS, bool BF16>
__device__ __forceinline__ void mma_pb(float (&acc)[D / 8][4], const unsigned (&pf)[KS][4], unsigned sB,
                                       int b_row0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            unsigned b[4];
            ldmatrix_x4_trans(b, sB + swz<D>(b_row0 + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 2 + (lane >> 4)));
            mma_16816<BF16>(acc[2 * dp], pf[kk], b[0], b[1]);
            mma_16816<BF16>(acc[2 * dp + 1], pf[kk], b[2], b[3]);
        }
    }
}

// fp32 accumulators (16 x 8 NT) -> A fragments (16 x 16 per k-step) in fp16/bf16
template <int NT, bool BF16>
__device__ __forceinline__ void pack_frags(unsigned (&pf)[NT / 2][4], const float (&x)[NT][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        pf[kk][0] = pack2<BF16>(x[2 * kk][0], x[2 * kk][1]);          // row g,     cols 2t, 2t+1
        pf[kk][1] = pack2<BF16>(x[2 * kk][2], x[2 * kk][3]);          // row g + 8, cols 2t, 2t+1
        pf[kk][2] = pack2<BF16>(x[2 * kk + 1][0], x[2 * kk + 1][1]);  // row g,     cols 2t+8, 2t+9
        pf[kk][3] = pack2<BF16>(x[2 * kk + 1][2], x[2 * kk + 1][3]);  // row g + 8, cols 2t+8, 2t+9
    }
}

template <int N>
__device__ __forceinline__ void zero(float (&x)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
}

// lse (natural log) -> log2 units; a row that saw no key (lse = -inf) gets +inf, so its P = exp2(-inf) = 0;
// a row with a +inf score (lse = +inf) gets NaN, so its P is NaN, as in the reference
__device__ __forceinline__ float lse2_of(float lse) {
    return lse == FA_NEG_INF ? -FA_NEG_INF : fa::lse2_backward(lse);
}

// rows [row0, row0 + ROWS) of lse and Delta into shared memory (rows >= N: lse2 = +inf, Delta = 0)
template <int ROWS>
__device__ __forceinline__ void load_rows(float* sL, float* sDl, const float* lse, const float* delta, int row0,
                                          int N) {
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) {
        const bool in = row0 + r < N;
        sL[r] = in ? lse2_of(lse[row0 + r]) : -FA_NEG_INF;
        sDl[r] = in ? delta[row0 + r] : 0.0f;
    }
}

// a warp's 16 x D fp32 accumulator -> rows row0 + g (+ 8) of a (N, D) 16-bit matrix, times `mul`
template <int D, bool BF16>
__device__ __forceinline__ void store_rows(unsigned short* out, const float (&acc)[D / 8][4], int row0, int N,
                                           float mul) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        if (row0 + g < N)
            *reinterpret_cast<unsigned*>(out + (long long)(row0 + g) * D + n * 8 + 2 * t) =
                pack2<BF16>(acc[n][0] * mul, acc[n][1] * mul);
        if (row0 + g + 8 < N)
            *reinterpret_cast<unsigned*>(out + (long long)(row0 + g + 8) * D + n * 8 + 2 * t) =
                pack2<BF16>(acc[n][2] * mul, acc[n][3] * mul);
    }
}

}  // namespace mma_bwd_detail

// Delta_i = rowsum(dO_i o O_i) in fp32, one warp per row (O and dO 16-bit, (rows, D)).
template <int D, bool BF16>
__global__ void mma_bwd_preprocess(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO,
                                   float* __restrict__ Delta, long long rows) {
    using namespace ptx;
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    float acc = 0.0f;
#pragma unroll
    for (int e = threadIdx.x % 32; e < D; e += 32) acc += to_f32<BF16>(O[r * D + e]) * to_f32<BF16>(dO[r * D + e]);
    acc = fa::warp_reduce_sum(acc);
    if (threadIdx.x % 32 == 0) Delta[r] = acc;
}

// dK, dV for one tile of BC = 16 NWARPS keys (warp w: keys 16w .. 16w + 15), looping over tiles of BR queries.
template <int D, int NWARPS, int BR, bool BF16>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_bwd_dkdv(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
                 const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
                 const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dK,
                 unsigned short* __restrict__ dV, int Nq, int Nk, float scale, int causal) {
    using namespace mma_bwd_detail;
    constexpr int BC = 16 * NWARPS, NT = NWARPS * 32;
    constexpr unsigned Q_BYTES = BR * D * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sK = smem_u32(smem);      // (BC, D)
    const unsigned sV = sK + BC * D * 2;     // (BC, D)
    const unsigned sQ = sV + BC * D * 2;     // 2 x (BR, D)
    const unsigned sdO = sQ + 2 * Q_BYTES;   // 2 x (BR, D)
    float* sL = reinterpret_cast<float*>(smem + (2 * BC + 4 * BR) * D * 2);  // 2 x BR: lse in log2 units
    float* sDl = sL + 2 * BR;                                                  // 2 x BR: Delta

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const bool is_causal = causal != 0;
    const int k0 = blockIdx.x * BC, wkey = warp * 16;  // block's first key, warp's first row in the tile
    const long long bh = blockIdx.y;
    const unsigned short *q = Q + bh * Nq * D, *k = K + bh * Nk * D, *v = V + bh * Nk * D, *dout = dO + bh * Nq * D;
    const float *lse = LSE + bh * Nq, *delta = Delta + bh * Nq;
    const int off = Nk - Nq;
    // the first query that sees key k0 is k0 - off (causal): earlier Q tiles contribute nothing
    const int t_begin = is_causal ? max(0, k0 - off) / BR : 0;
    const int n_t = max(0, (Nq + BR - 1) / BR - t_begin);
    const float scale2 = scale * FA_LOG2E;

    load_tile_async<BC, D, NT>(sK, k, k0, Nk);
    load_tile_async<BC, D, NT>(sV, v, k0, Nk);
    if (n_t > 0) {
        load_tile_async<BR, D, NT>(sQ, q, t_begin * BR, Nq);
        load_tile_async<BR, D, NT>(sdO, dout, t_begin * BR, Nq);
        load_rows<BR>(sL, sDl, lse, delta, t_begin * BR, Nq);
    }
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
    zero(dk);
    zero(dv);
    for (int it = 0; it < n_t; ++it) {
        const int i0 = (t_begin + it) * BR, buf = it & 1;
        if (it + 1 < n_t) {  // prefetch the next Q tile, then wait for this one
            const int nb = buf ^ 1;
            load_tile_async<BR, D, NT>(sQ + nb * Q_BYTES, q, i0 + BR, Nq);
            load_tile_async<BR, D, NT>(sdO + nb * Q_BYTES, dout, i0 + BR, Nq);
            load_rows<BR>(sL + nb * BR, sDl + nb * BR, lse, delta, i0 + BR, Nq);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const unsigned qb = sQ + buf * Q_BYTES, db = sdO + buf * Q_BYTES;
        const float *L = sL + buf * BR, *Dl = sDl + buf * BR;

        // S^T = K_w Q_i^T (16 keys x BR queries); P^T = exp2(S^T * scale2 - lse2[query])
        float p[BR / 8][4];
        zero(p);
        mma_abt<D, BR / 8, BF16>(p, sK, wkey, qb, 0);
        const bool mask = is_causal && k0 + BC - 1 > i0 + off;  // some key of the block is above the diagonal
#pragma unroll
        for (int n = 0; n < BR / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n * 8 + 2 * t + (e & 1), key = k0 + wkey + g + (e < 2 ? 0 : 8);
                p[n][e] = fast_exp2(fmaf(p[n][e], scale2, -L[col]));
                if (mask && key > i0 + col + off) p[n][e] = 0.0f;
            }
        unsigned pf[BR / 16][4];
        pack_frags<BR / 8, BF16>(pf, p);
        mma_pb<D, BR / 16, BF16>(dv, pf, db, 0);  // dV_j += P^T dO_i

        // dP^T = V_w dO_i^T;  dS^T = P^T o (dP^T - Delta[query])
        float dp[BR / 8][4];
        zero(dp);
        mma_abt<D, BR / 8, BF16>(dp, sV, wkey, db, 0);
#pragma unroll
        for (int n = 0; n < BR / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n * 8 + 2 * t + (e & 1), key = k0 + wkey + g + (e < 2 ? 0 : 8);
                dp[n][e] = p[n][e] * (dp[n][e] - Dl[col]);
                if (mask && key > i0 + col + off) dp[n][e] = 0.0f;  // 0 * NaN: a hidden pair gets no gradient
            }
        pack_frags<BR / 8, BF16>(pf, dp);
        mma_pb<D, BR / 16, BF16>(dk, pf, qb, 0);  // dK_j += dS^T Q_i  (times scale at the end)
        __syncthreads();  // every warp is done with buffer `buf` before it is refilled
    }
    cp_async_wait<0>();
    store_rows<D, BF16>(dK + bh * Nk * D, dk, k0 + wkey, Nk, scale);
    store_rows<D, BF16>(dV + bh * Nk * D, dv, k0 + wkey, Nk, 1.0f);
}

// dQ for one tile of BR = 16 NWARPS queries (warp w: queries 16w .. 16w + 15), looping over tiles of BC keys.
template <int D, int NWARPS, int BC, bool BF16>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_bwd_dq(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
               const unsigned short* __restrict__ V, const unsigned short* __restrict__ dO,
               const float* __restrict__ LSE, const float* __restrict__ Delta, unsigned short* __restrict__ dQ, int Nq,
               int Nk, float scale, int causal) {
    using namespace mma_bwd_detail;
    constexpr int BR = 16 * NWARPS, NT = NWARPS * 32;
    constexpr unsigned KV_BYTES = BC * D * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sQ = smem_u32(smem);      // (BR, D)
    const unsigned sdO = sQ + BR * D * 2;    // (BR, D)
    const unsigned sK = sdO + BR * D * 2;    // 2 x (BC, D)
    const unsigned sV = sK + 2 * KV_BYTES;   // 2 x (BC, D)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const bool is_causal = causal != 0;
    const int q_block = is_causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;  // heaviest first
    const int q0 = q_block * BR, wrow = warp * 16;
    const long long bh = blockIdx.y;
    const unsigned short *q = Q + bh * Nq * D, *k = K + bh * Nk * D, *v = V + bh * Nk * D, *dout = dO + bh * Nq * D;
    const int off = Nk - Nq;
    const int kv_end = fa::kv_end_for(min(Nq, q0 + BR), Nq, Nk, is_causal);
    const int n_tiles = (kv_end + BC - 1) / BC;
    const float scale2 = scale * FA_LOG2E;

    load_tile_async<BR, D, NT>(sQ, q, q0, Nq);
    load_tile_async<BR, D, NT>(sdO, dout, q0, Nq);
    if (n_tiles > 0) {
        load_tile_async<BC, D, NT>(sK, k, 0, Nk);
        load_tile_async<BC, D, NT>(sV, v, 0, Nk);
    }
    cp_async_commit();
    float L[2], Dl[2];  // this thread's two rows: lse in log2 units, Delta
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = q0 + wrow + g + 8 * h;
        L[h] = row < Nq ? mma_bwd_detail::lse2_of(LSE[bh * Nq + row]) : -FA_NEG_INF;
        Dl[h] = row < Nq ? Delta[bh * Nq + row] : 0.0f;
    }

    float dq[D / 8][4];
    zero(dq);
    for (int j = 0; j < n_tiles; ++j) {
        const int j0 = j * BC, buf = j & 1;
        if (j + 1 < n_tiles) {
            load_tile_async<BC, D, NT>(sK + (buf ^ 1) * KV_BYTES, k, j0 + BC, Nk);
            load_tile_async<BC, D, NT>(sV + (buf ^ 1) * KV_BYTES, v, j0 + BC, Nk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const unsigned kb = sK + buf * KV_BYTES, vb = sV + buf * KV_BYTES;

        // S = Q_w K_j^T; P = exp2(S * scale2 - lse2[row]), 0 where the key is not visible
        float p[BC / 8][4];
        zero(p);
        mma_abt<D, BC / 8, BF16>(p, sQ, wrow, kb, 0);
        const bool mask = j0 + BC > Nk || (is_causal && j0 + BC - 1 > q0 + off);
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[n][e] = fast_exp2(fmaf(p[n][e], scale2, -L[e >> 1]));
                if (mask && !fa::visible(q0 + wrow + g + (e < 2 ? 0 : 8), j0 + n * 8 + 2 * t + (e & 1), Nk, off,
                                         is_causal))
                    p[n][e] = 0.0f;
            }
        // dP = dO_w V_j^T;  dS = P o (dP - Delta[row])
        float dp[BC / 8][4];
        zero(dp);
        mma_abt<D, BC / 8, BF16>(dp, sdO, wrow, vb, 0);
#pragma unroll
        for (int n = 0; n < BC / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                dp[n][e] = p[n][e] * (dp[n][e] - Dl[e >> 1]);
                if (mask && !fa::visible(q0 + wrow + g + (e < 2 ? 0 : 8), j0 + n * 8 + 2 * t + (e & 1), Nk, off,
                                         is_causal))
                    dp[n][e] = 0.0f;  // 0 * NaN: a hidden pair gets no gradient from a NaN row
            }
        unsigned pf[BC / 16][4];
        pack_frags<BC / 8, BF16>(pf, dp);
        mma_pb<D, BC / 16, BF16>(dq, pf, kb, 0);  // dQ_i += dS K_j  (times scale at the end)
        __syncthreads();
    }
    cp_async_wait<0>();
    store_rows<D, BF16>(dQ + bh * Nq * D, dq, q0 + wrow, Nq, scale);
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_MMA_BWD_INST(D, BF)                                                                                   \
    template __global__ void mma_bwd_preprocess<D, BF>(const unsigned short*, const unsigned short*, float*,     \
                                                       long long);                                               \
    template __global__ void mma_bwd_dkdv<D, 4, 64, BF>(const unsigned short*, const unsigned short*,            \
                                                        const unsigned short*, const unsigned short*,            \
                                                        const float*, const float*, unsigned short*,             \
                                                        unsigned short*, int, int, float, int);                  \
    template __global__ void mma_bwd_dq<D, 4, 64, BF>(const unsigned short*, const unsigned short*,              \
                                                      const unsigned short*, const unsigned short*, const float*, \
                                                      const float*, unsigned short*, int, int, float, int);
FA_MMA_BWD_INST(64, false)
FA_MMA_BWD_INST(64, true)
FA_MMA_BWD_INST(128, false)
FA_MMA_BWD_INST(128, true)
#endif
