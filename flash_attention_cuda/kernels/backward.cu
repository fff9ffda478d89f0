// backward.cu -- rung 4 of the CUDA ladder: the tiled recompute backward, fp32.
//
// Given q, k, v, o, dO and the forward's lse (natural log), with P = exp(S - lse) recomputed tile by
// tile (never stored whole):
//   Delta_i = rowsum(dO_i * O_i)                          (bwd_preprocess)
//   S_ij    = Qi Kj^T * scale,  P_ij = exp(S_ij - lse_i)
//   dV_j   += P_ij^T dO_i
//   dP_ij   = dO_i Vj^T
//   dS_ij   = P_ij * (dP_ij - Delta_i)
//   dK_j   += dS_ij^T Qi * scale                          (bwd_dkdv: one block per K/V tile, loops over Q)
//   dQ_i   += dS_ij Kj * scale                            (bwd_dq:   one block per Q tile, loops over K/V)
// Two kernels instead of atomics: each output tile is owned by one block, so results are deterministic.
// Masked (i, j) pairs and rows that saw no key (lse = -inf) have P = 0 and dS = 0; a row with a +inf
// score (lse = +inf) has P = NaN, as in the reference.
// Tiles: BT x D_PAD in shared memory, rows padded by one float against bank conflicts; 128 threads.
#include "common.cuh"

namespace bwd {
constexpr int NT = 128;  // threads per block
}

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

// rows [row0, row0 + BT) of a (N, D) matrix into a (BT, D_PAD + 1) tile, zero past N and D
template <int BT, int D_PAD>
__device__ __forceinline__ void bwd_load(float (*tile)[D_PAD + 1], const float* __restrict__ x, int row0, int N,
                                         int D) {
    for (int e = threadIdx.x; e < BT * D_PAD; e += bwd::NT) {
        const int r = e / D_PAD, d = e % D_PAD;
        tile[r][d] = (row0 + r < N && d < D) ? x[(long long)(row0 + r) * D + d] : 0.0f;
    }
}

// P_ij and dS_ij of one (BT queries) x (BT keys) tile pair into shared memory.
template <int BT, int D_PAD>
__device__ __forceinline__ void bwd_p_and_ds(const float (*q_s)[D_PAD + 1], const float (*k_s)[D_PAD + 1],
                                             const float (*v_s)[D_PAD + 1], const float (*do_s)[D_PAD + 1],
                                             const float* lse2_s, const float* delta_s, float (*p_s)[BT + 1],
                                             float (*ds_s)[BT + 1], int i0, int j0, int Nq, int Nk, bool causal,
                                             float scale2) {
    for (int e = threadIdx.x; e < BT * BT; e += bwd::NT) {
        const int r = e / BT, c = e % BT;
        const int i = i0 + r, j = j0 + c;
        float p = 0.0f, ds = 0.0f;
        if (i < Nq && fa::visible(i, j, Nk, Nk - Nq, causal) && lse2_s[r] != FA_NEG_INF) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll 8
            for (int d = 0; d < D_PAD; ++d) {
                s = fmaf(q_s[r][d], k_s[c][d], s);    // S_ij = Qi Kj^T
                dp = fmaf(do_s[r][d], v_s[c][d], dp);  // dP_ij = dO_i Vj^T
            }
            p = exp2f(s * scale2 - lse2_s[r]);  // P_ij = exp(S_ij * scale - lse_i)
            ds = p * (dp - delta_s[r]);         // dS_ij = P_ij * (dP_ij - Delta_i)
        }
        p_s[r][c] = p;
        ds_s[r][c] = ds;
    }
}

template <int D_PAD, int BT>
__global__ void __launch_bounds__(bwd::NT)
    bwd_dkdv(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
             const float* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
             float* __restrict__ dK, float* __restrict__ dV, int Nq, int Nk, int D, float scale, int causal) {
    __shared__ float k_s[BT][D_PAD + 1], v_s[BT][D_PAD + 1], q_s[BT][D_PAD + 1], do_s[BT][D_PAD + 1];
    __shared__ float p_s[BT][BT + 1], ds_s[BT][BT + 1];
    __shared__ float lse2_s[BT], delta_s[BT];
    constexpr int PER = BT * D_PAD / bwd::NT;  // (key, d) elements of dK and dV owned by each thread
    const long long bh = blockIdx.y;
    const int j0 = blockIdx.x * BT;
    const float scale2 = scale * FA_LOG2E;
    const float* q = Q + bh * Nq * D;
    const float* dout = dO + bh * Nq * D;
    bwd_load<BT, D_PAD>(k_s, K + bh * Nk * D, j0, Nk, D);
    bwd_load<BT, D_PAD>(v_s, V + bh * Nk * D, j0, Nk, D);
    float dk[PER], dv[PER];
#pragma unroll
    for (int x = 0; x < PER; ++x) dk[x] = dv[x] = 0.0f;
    // causal: query i sees key j iff i >= j - (Nk - Nq); earlier Q tiles see none of these keys
    int i_start = causal ? j0 - (Nk - Nq) : 0;
    i_start = i_start < 0 ? 0 : (i_start / BT) * BT;
    for (int i0 = i_start; i0 < Nq; i0 += BT) {
        __syncthreads();  // previous tiles are no longer read
        bwd_load<BT, D_PAD>(q_s, q, i0, Nq, D);
        bwd_load<BT, D_PAD>(do_s, dout, i0, Nq, D);
        for (int r = threadIdx.x; r < BT; r += bwd::NT) {
            const bool in = i0 + r < Nq;
            lse2_s[r] = in ? fa::lse2_backward(LSE[bh * Nq + i0 + r]) : FA_NEG_INF;
            delta_s[r] = in ? Delta[bh * Nq + i0 + r] : 0.0f;
        }
        __syncthreads();
        bwd_p_and_ds<BT, D_PAD>(q_s, k_s, v_s, do_s, lse2_s, delta_s, p_s, ds_s, i0, j0, Nq, Nk, causal != 0,
                                scale2);
        __syncthreads();
#pragma unroll
        for (int x = 0; x < PER; ++x) {
            const int e = threadIdx.x + x * bwd::NT, c = e / D_PAD, d = e % D_PAD;
#pragma unroll 4
            for (int r = 0; r < BT; ++r) {
                dv[x] = fmaf(p_s[r][c], do_s[r][d], dv[x]);  // dV_j += P_ij^T dO_i
                dk[x] = fmaf(ds_s[r][c], q_s[r][d], dk[x]);  // dK_j += dS_ij^T Qi
            }
        }
    }
#pragma unroll
    for (int x = 0; x < PER; ++x) {
        const int e = threadIdx.x + x * bwd::NT, c = e / D_PAD, d = e % D_PAD;
        if (j0 + c < Nk && d < D) {
            dK[bh * Nk * D + (long long)(j0 + c) * D + d] = dk[x] * scale;  // dK = scale * dS^T Q
            dV[bh * Nk * D + (long long)(j0 + c) * D + d] = dv[x];
        }
    }
}

template <int D_PAD, int BT>
__global__ void __launch_bounds__(bwd::NT)
    bwd_dq(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
           const float* __restrict__ dO, const float* __restrict__ LSE, const float* __restrict__ Delta,
           float* __restrict__ dQ, int Nq, int Nk, int D, float scale, int causal) {
    __shared__ float k_s[BT][D_PAD + 1], v_s[BT][D_PAD + 1], q_s[BT][D_PAD + 1], do_s[BT][D_PAD + 1];
    __shared__ float p_s[BT][BT + 1], ds_s[BT][BT + 1];
    __shared__ float lse2_s[BT], delta_s[BT];
    constexpr int PER = BT * D_PAD / bwd::NT;  // (query, d) elements of dQ owned by each thread
    const long long bh = blockIdx.y;
    const int i0 = blockIdx.x * BT;
    const float scale2 = scale * FA_LOG2E;
    const float* k = K + bh * Nk * D;
    const float* v = V + bh * Nk * D;
    bwd_load<BT, D_PAD>(q_s, Q + bh * Nq * D, i0, Nq, D);
    bwd_load<BT, D_PAD>(do_s, dO + bh * Nq * D, i0, Nq, D);
    for (int r = threadIdx.x; r < BT; r += bwd::NT) {
        const bool in = i0 + r < Nq;
        lse2_s[r] = in ? fa::lse2_backward(LSE[bh * Nq + i0 + r]) : FA_NEG_INF;
        delta_s[r] = in ? Delta[bh * Nq + i0 + r] : 0.0f;
    }
    float dq[PER];
#pragma unroll
    for (int x = 0; x < PER; ++x) dq[x] = 0.0f;
    const int kv_end = fa::kv_end_for(min(Nq, i0 + BT), Nq, Nk, causal != 0);
    for (int j0 = 0; j0 < kv_end; j0 += BT) {
        __syncthreads();
        bwd_load<BT, D_PAD>(k_s, k, j0, Nk, D);
        bwd_load<BT, D_PAD>(v_s, v, j0, Nk, D);
        __syncthreads();
        bwd_p_and_ds<BT, D_PAD>(q_s, k_s, v_s, do_s, lse2_s, delta_s, p_s, ds_s, i0, j0, Nq, Nk, causal != 0,
                                scale2);
        __syncthreads();
#pragma unroll
        for (int x = 0; x < PER; ++x) {
            const int e = threadIdx.x + x * bwd::NT, r = e / D_PAD, d = e % D_PAD;
#pragma unroll 4
            for (int c = 0; c < BT; ++c) dq[x] = fmaf(ds_s[r][c], k_s[c][d], dq[x]);  // dQ_i += dS_ij Kj
        }
    }
#pragma unroll
    for (int x = 0; x < PER; ++x) {
        const int e = threadIdx.x + x * bwd::NT, r = e / D_PAD, d = e % D_PAD;
        if (i0 + r < Nq && d < D) dQ[bh * Nq * D + (long long)(i0 + r) * D + d] = dq[x] * scale;  // dQ = scale dS K
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_BWD_INST(DP, BT)                                                                                    \
    template __global__ void bwd_dkdv<DP, BT>(const float*, const float*, const float*, const float*,           \
                                              const float*, const float*, float*, float*, int, int, int, float, \
                                              int);                                                            \
    template __global__ void bwd_dq<DP, BT>(const float*, const float*, const float*, const float*, const float*, \
                                            const float*, float*, int, int, int, float, int);
FA_BWD_INST(32, 32)
FA_BWD_INST(64, 32)
FA_BWD_INST(128, 16)
#endif
