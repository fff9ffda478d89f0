// backward.cu -- rung 4 of the CUDA ladder: the tiled recompute backward, fp32.
//
// Given q, k, v, o, dO and the forward's lse (natural log), with P recomputed tile by tile (never stored whole);
// softmax_scale = scale_log2 * ln 2:
//   Delta_i = rowsum(dO_i o O_i)              (D_i; bwd_preprocess)
//   S_ij    = Q_i K_j^T,  P_ij = exp(softmax_scale * S_ij - lse_i)
//   dV_j   += P_ij^T dO_i
//   dP_ij   = dO_i V_j^T
//   dS_ij   = P_ij o (dP_ij - Delta_i)
//   dK_j   += softmax_scale * dS_ij^T Q_i     (bwd_dkdv: one block per K/V tile, loops over the Q tiles)
//   dQ_i   += softmax_scale * dS_ij K_j       (bwd_dq:   one block per Q tile, loops over the K/V tiles)
// Two kernels instead of atomics: each output tile is owned by one block, so results are deterministic.
// The mask (masks.cuh, window (left, right)): each block loops only over the tiles that hold a pair the mask
// shows, and checks pairs one by one only in tile pairs the mask does not call full. Hidden pairs and rows that
// saw no key (lse = -inf) have P = 0 and dS = 0; a row with a +inf score (lse = +inf) has P = NaN, as in the
// reference. A negative softmax_scale needs nothing special: the signed scale_log2 multiplies fp32 values.
// Tiles: BT x D_PAD in shared memory (BT = Br = Bc, square), rows padded by one float against bank conflicts;
// 128 threads.
#include "common.cuh"
#include "masks.cuh"

namespace bwd {

constexpr int NTHREADS = 128;  // threads per block

// A block's shared memory: one tile pair (BT queries) x (BT keys) and what the backward derives from it
template <int BT, int D_PAD>
struct Tiles {
    float q[BT][D_PAD + 1], dout[BT][D_PAD + 1];  // Q_i, dO_i
    float k[BT][D_PAD + 1], v[BT][D_PAD + 1];     // K_j, V_j
    float P_ij[BT][BT + 1], dS_ij[BT][BT + 1];
    float lse2[BT], delta[BT];                    // per query: lse in log2 units, Delta_i
};

// rows [row0, row0 + BT) of a (N, D) matrix into a (BT, D_PAD + 1) tile, zero past N and D
template <int BT, int D_PAD>
__device__ __forceinline__ void load(float (*tile)[D_PAD + 1], const float* __restrict__ x, int row0, int N, int D) {
    for (int e = threadIdx.x; e < BT * D_PAD; e += NTHREADS) {
        const int r = e / D_PAD, d = e % D_PAD;
        tile[r][d] = (row0 + r < N && d < D) ? x[(long long)(row0 + r) * D + d] : 0.0f;
    }
}

// the Q-side tiles of queries [i0, i0 + BT) of the block's head (blockIdx.y): Q_i, dO_i, lse in log2 units and
// Delta_i (rows >= Nq: Q = dO = 0, lse2 = -inf, so P = dS = 0 there)
template <int BT, int D_PAD>
__device__ __forceinline__ void load_queries(Tiles<BT, D_PAD>& sm, const float* __restrict__ Q,
                                             const float* __restrict__ dO, const float* __restrict__ LSE,
                                             const float* __restrict__ Delta, int i0, int Nq, int D) {
    const long long bh_q = (long long)blockIdx.y * Nq;  // the head's first row in the (B, H, Nq, ...) arrays
    load<BT, D_PAD>(sm.q, Q + bh_q * D, i0, Nq, D);
    load<BT, D_PAD>(sm.dout, dO + bh_q * D, i0, Nq, D);
    for (int r = threadIdx.x; r < BT; r += NTHREADS) {
        const bool in = i0 + r < Nq;
        sm.lse2[r] = in ? fa::lse2_backward(LSE[bh_q + i0 + r]) : FA_NEG_INF;
        sm.delta[r] = in ? Delta[bh_q + i0 + r] : 0.0f;
    }
}

// P_ij and dS_ij of the tile pair (queries i0 .. i0 + BT - 1) x (keys j0 .. j0 + BT - 1), into sm.P_ij, sm.dS_ij.
// Syncs the block before (the tiles are loaded) and after (P_ij and dS_ij are complete).
template <int BT, int D_PAD>
__device__ __forceinline__ void p_and_ds(Tiles<BT, D_PAD>& sm, int i0, int j0, const fa::Mask& mask,
                                         float scale_log2) {
    __syncthreads();
    const bool check = mask.needs_mask(i0, i0 + BT, j0, j0 + BT);  // else every pair with i < Nq is shown
    for (int e = threadIdx.x; e < BT * BT; e += NTHREADS) {
        const int r = e / BT, c = e % BT;
        const int i = i0 + r, j = j0 + c;
        const bool shown = check ? mask.visible(i, j) : i < mask.Nq;
        float P_ij = 0.0f, dS_ij = 0.0f;
        if (shown && sm.lse2[r] != FA_NEG_INF) {
            float S_ij = 0.0f, dP_ij = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D_PAD; ++d) {
                S_ij = fmaf(sm.q[r][d], sm.k[c][d], S_ij);        // S_ij = Q_i K_j^T
                dP_ij = fmaf(sm.dout[r][d], sm.v[c][d], dP_ij);  // dP_ij = dO_i V_j^T
            }
            P_ij = exp2f(S_ij * scale_log2 - sm.lse2[r]);  // P_ij = exp(softmax_scale * S_ij - lse_i)
            dS_ij = P_ij * (dP_ij - sm.delta[r]);          // dS_ij = P_ij o (dP_ij - Delta_i)
        }
        sm.P_ij[r][c] = P_ij;
        sm.dS_ij[r][c] = dS_ij;
    }
    __syncthreads();
}

// The (BT, D_PAD) output tile of a block is spread over its threads: element x (0 <= x < PER) of a thread is
// row (threadIdx.x + x * NTHREADS) / D_PAD, column d = (threadIdx.x + x * NTHREADS) % D_PAD.
template <int D_PAD>
__device__ __forceinline__ int own_row(int x) { return (threadIdx.x + x * NTHREADS) / D_PAD; }
template <int D_PAD>
__device__ __forceinline__ int own_col(int x) { return (threadIdx.x + x * NTHREADS) % D_PAD; }

// acc += A^T B (TRANSPOSE_A: A (BT, BT) indexed [k][row]) or A B (A indexed [row][k]), B (BT, D_PAD), on this
// thread's elements of the output tile
template <bool TRANSPOSE_A, int BT, int D_PAD, int PER>
__device__ __forceinline__ void tile_gemm(float (&acc)[PER], const float (*A)[BT + 1], const float (*B)[D_PAD + 1]) {
#pragma unroll
    for (int x = 0; x < PER; ++x) {
        const int row = own_row<D_PAD>(x), d = own_col<D_PAD>(x);
#pragma unroll 4
        for (int k = 0; k < BT; ++k) acc[x] = fmaf(TRANSPOSE_A ? A[k][row] : A[row][k], B[k][d], acc[x]);
    }
}

// this thread's elements of the output tile, times `mul`, into rows [row0, row0 + BT) of a (N, D) matrix
template <int D_PAD, int PER>
__device__ __forceinline__ void store(float* __restrict__ out, const float (&acc)[PER], int row0, int N, int D,
                                      float mul) {
#pragma unroll
    for (int x = 0; x < PER; ++x) {
        const int row = row0 + own_row<D_PAD>(x), d = own_col<D_PAD>(x);
        if (row < N && d < D) out[(long long)row * D + d] = acc[x] * mul;
    }
}

}  // namespace bwd

// Delta_i = sum_d dO[i, d] * O[i, d]: one warp per row.
__global__ void bwd_preprocess(const float* __restrict__ O, const float* __restrict__ dO, float* __restrict__ delta,
                               long long rows, int D) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc = fmaf(O[row * D + d], dO[row * D + d], acc);
    acc = fa::warp_reduce_sum(acc);
    if (lane == 0) delta[row] = acc;
}

// dK_j, dV_j for keys j0 .. j0 + BT - 1, looping over the Q tiles that hold queries [mask.q_begin(j0),
// mask.q_end(j0 + BT)): the queries that see any of these keys.
template <int D_PAD, int BT>
__global__ void __launch_bounds__(bwd::NTHREADS)
    bwd_dkdv(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
             const float* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
             float* __restrict__ dK, float* __restrict__ dV, int Nq, int Nk, int D, float scale_log2,
             int window_left, int window_right) {
    __shared__ bwd::Tiles<BT, D_PAD> sm;
    constexpr int PER = BT * D_PAD / bwd::NTHREADS;  // (key, d) elements of dK and dV owned by each thread
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const long long bh = blockIdx.y;
    const int j0 = blockIdx.x * BT;
    bwd::load<BT, D_PAD>(sm.k, K + bh * Nk * D, j0, Nk, D);
    bwd::load<BT, D_PAD>(sm.v, V + bh * Nk * D, j0, Nk, D);
    float dk[PER], dv[PER];
#pragma unroll
    for (int x = 0; x < PER; ++x) dk[x] = dv[x] = 0.0f;
    // Q tiles t_begin .. t_begin + n_t - 1 hold every query that sees one of these keys (none: no tile)
    const int q_begin = mask.q_begin(j0), q_end = mask.q_end(j0 + BT);
    const int t_begin = q_begin / BT, n_t = q_begin < q_end ? (q_end + BT - 1) / BT - t_begin : 0;
    for (int it = 0; it < n_t; ++it) {
        const int i0 = (t_begin + it) * BT;
        __syncthreads();  // previous tiles are no longer read
        bwd::load_queries<BT, D_PAD>(sm, Q, dO, LSE, Delta, i0, Nq, D);
        bwd::p_and_ds<BT, D_PAD>(sm, i0, j0, mask, scale_log2);
        bwd::tile_gemm<true, BT, D_PAD>(dv, sm.P_ij, sm.dout);  // dV_j += P_ij^T dO_i
        bwd::tile_gemm<true, BT, D_PAD>(dk, sm.dS_ij, sm.q);    // dK_j += dS_ij^T Q_i
    }
    bwd::store<D_PAD>(dK + bh * Nk * D, dk, j0, Nk, D, scale_log2 * FA_LN2);  // dK_j = softmax_scale * dS^T Q
    bwd::store<D_PAD>(dV + bh * Nk * D, dv, j0, Nk, D, 1.0f);
}

// dQ_i for queries i0 .. i0 + BT - 1, looping over the K/V tiles that hold keys [mask.kv_begin(i0),
// mask.kv_end(i0 + BT)): the keys any of these queries sees.
template <int D_PAD, int BT>
__global__ void __launch_bounds__(bwd::NTHREADS)
    bwd_dq(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
           const float* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
           float* __restrict__ dQ, int Nq, int Nk, int D, float scale_log2, int window_left, int window_right) {
    __shared__ bwd::Tiles<BT, D_PAD> sm;
    constexpr int PER = BT * D_PAD / bwd::NTHREADS;  // (query, d) elements of dQ owned by each thread
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const long long bh = blockIdx.y;
    const int i0 = blockIdx.x * BT;
    bwd::load_queries<BT, D_PAD>(sm, Q, dO, LSE, Delta, i0, Nq, D);
    float dq[PER];
#pragma unroll
    for (int x = 0; x < PER; ++x) dq[x] = 0.0f;
    // the K/V tiles that hold every key these queries see
    const int j_begin = mask.kv_tile_begin(i0, BT), j_end = mask.kv_tile_end(i0, i0 + BT, BT);
    for (int jt = j_begin; jt < j_end; ++jt) {
        const int j0 = jt * BT;
        __syncthreads();  // previous tiles are no longer read
        bwd::load<BT, D_PAD>(sm.k, K + bh * Nk * D, j0, Nk, D);
        bwd::load<BT, D_PAD>(sm.v, V + bh * Nk * D, j0, Nk, D);
        bwd::p_and_ds<BT, D_PAD>(sm, i0, j0, mask, scale_log2);
        bwd::tile_gemm<false, BT, D_PAD>(dq, sm.dS_ij, sm.k);  // dQ_i += dS_ij K_j
    }
    bwd::store<D_PAD>(dQ + bh * Nq * D, dq, i0, Nq, D, scale_log2 * FA_LN2);  // dQ_i = softmax_scale * dS K
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_BWD_INST(DP, BT)                                                                                    \
    template __global__ void bwd_dkdv<DP, BT>(const float*, const float*, const float*, const float*,           \
                                              const float*, const float*, float*, float*, int, int, int, float, \
                                              int, int);                                                       \
    template __global__ void bwd_dq<DP, BT>(const float*, const float*, const float*, const float*, const float*, \
                                            const float*, float*, int, int, int, float, int, int);
FA_BWD_INST(32, 32)
FA_BWD_INST(64, 32)
FA_BWD_INST(128, 16)
#endif
