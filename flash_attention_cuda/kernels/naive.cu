// naive.cu -- rung 1 of the CUDA ladder: one thread per query row, K/V tiles in shared memory.
//
// This is the lab kernel of the seed report (002), generalised: any Nq, Nk (tails are masked),
// any D up to D_PAD (the compile-time padded head dim), causal masking, the lse output, and
// made numerically safe with the running max m of online softmax. fp32 throughout.
//
//   grid  = (ceil(Nq / BR), B * H)      block = BR threads; thread r owns query row q0 + r
//   for each K/V tile j of BC keys (loaded cooperatively into shared memory):
//       s_c     = (q . k_c) * scale * log2(e)           for the BC keys c of the tile
//       m_new   = max(m_old, max_c s_c)
//       alpha   = exp2(m_old - m_new)                   (rescales what was summed so far)
//       p_c     = exp2(s_c - m_new)
//       l       = alpha * l + sum_c p_c
//       acc     = alpha * acc + sum_c p_c * v_c
//   O = acc / l,  lse = (m + log2(l)) * ln(2)
//
// The seed kernel summed exp(s) directly: exp overflows float32 once s > 88.7. For the test that
// shows this, `seed_nomax_fwd` below keeps that behaviour on purpose (same loops, no max).
#include "common.cuh"

template <int D_PAD, int BC, int BR>
__global__ void __launch_bounds__(BR) naive_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                                                const float* __restrict__ V, float* __restrict__ O,
                                                float* __restrict__ LSE, int Nq, int Nk, int D, float scale,
                                                int causal) {
    __shared__ float k_tile[BC][D_PAD];
    __shared__ float v_tile[BC][D_PAD];
    __shared__ float p_tile[BC][BR];  // column r holds thread r's scores, then its P_ij row
    const int r = threadIdx.x;
    const int i = blockIdx.x * BR + r;  // this thread's query row
    const long long bh = blockIdx.y;
    const float* q = Q + bh * Nq * D;
    const float* k = K + bh * Nk * D;
    const float* v = V + bh * Nk * D;
    const float scale2 = scale * FA_LOG2E;  // scores in log2 units: exp(x) = exp2(x * log2 e)
    const int off = Nk - Nq;

    float q_reg[D_PAD];  // this row of Q, zero past D
    float o_reg[D_PAD];  // acc: the unnormalised output row
#pragma unroll
    for (int d = 0; d < D_PAD; ++d) {
        q_reg[d] = (i < Nq && d < D) ? q[(long long)i * D + d] : 0.0f;
        o_reg[d] = 0.0f;
    }
    float m = FA_NEG_INF, l = 0.0f;  // running max (log2 units) and running sum

    // the block's last row decides how far the K/V loop goes (causal block skipping)
    const int row_end = min(Nq, (int)(blockIdx.x + 1) * BR);
    const int kv_end = fa::kv_end_for(row_end, Nq, Nk, causal != 0);
    for (int j0 = 0; j0 < kv_end; j0 += BC) {
        __syncthreads();  // nobody still reads the previous tile
        for (int e = r; e < BC * D_PAD; e += BR) {  // cooperative load, zero-filled tails
            const int c = e / D_PAD, d = e % D_PAD;
            const bool in = (j0 + c < Nk) && d < D;
            k_tile[c][d] = in ? k[(long long)(j0 + c) * D + d] : 0.0f;
            v_tile[c][d] = in ? v[(long long)(j0 + c) * D + d] : 0.0f;
        }
        __syncthreads();
        // S_ij = Qi Kj^T * scale (one row of it per thread); masked keys get -inf
        float m_tile = FA_NEG_INF;
        for (int c = 0; c < BC; ++c) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) dot = fmaf(q_reg[d], k_tile[c][d], dot);
            const float s = fa::visible(i, j0 + c, Nk, off, causal != 0) ? dot * scale2 : FA_NEG_INF;
            p_tile[c][r] = s;
            m_tile = fmaxf(m_tile, s);
        }
        const float m_new = fmaxf(m, m_tile);          // m_new = max(m_old, rowmax(S_ij))
        const float alpha = fa::exp2_minus(m, m_new);  // exp(m_old - m_new); 0 while m_new = -inf
        float l_tile = 0.0f;
        for (int c = 0; c < BC; ++c) {
            const float p = fa::exp2_minus(p_tile[c][r], m_new);  // P_ij = exp(S_ij - m_new)
            p_tile[c][r] = p;
            l_tile += p;
        }
        l = alpha * l + l_tile;  // l_new = alpha * l_old + rowsum(P_ij)
#pragma unroll
        for (int d = 0; d < D_PAD; ++d) o_reg[d] *= alpha;  // acc = alpha * acc ...
        for (int c = 0; c < BC; ++c) {
            const float p = p_tile[c][r];
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) o_reg[d] = fmaf(p, v_tile[c][d], o_reg[d]);  // ... + P_ij V_j
        }
        m = m_new;
    }
    if (i < Nq) {
        const float inv_l = fa::inv_row_sum(l);  // a row that saw no key: O = 0 (NaN stays NaN)
#pragma unroll
        for (int d = 0; d < D_PAD; ++d)
            if (d < D) O[bh * Nq * D + (long long)i * D + d] = o_reg[d] * inv_l;
        LSE[bh * Nq + i] = fa::row_lse(m, l);  // lse = m + log(l); -inf for no key
    }
}

// The seed kernel's arithmetic, kept only to demonstrate its overflow: it sums exp(s) with no
// running max, so exp(s) = inf once a score passes ~88.7 and O becomes inf/inf = NaN.
// Same launch shape and bounds checks as naive_fwd; non-causal, no lse.
template <int D_PAD, int BC, int BR>
__global__ void __launch_bounds__(BR) seed_nomax_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                                                     const float* __restrict__ V, float* __restrict__ O, int Nq,
                                                     int Nk, int D, float scale) {
    __shared__ float k_tile[BC][D_PAD];
    __shared__ float v_tile[BC][D_PAD];
    __shared__ float p_tile[BC][BR];
    const int r = threadIdx.x;
    const int i = blockIdx.x * BR + r;
    const long long bh = blockIdx.y;
    float q_reg[D_PAD], o_reg[D_PAD];
#pragma unroll
    for (int d = 0; d < D_PAD; ++d) {
        q_reg[d] = (i < Nq && d < D) ? Q[bh * Nq * D + (long long)i * D + d] : 0.0f;
        o_reg[d] = 0.0f;
    }
    float s_sum = 0.0f;
    for (int j0 = 0; j0 < Nk; j0 += BC) {
        __syncthreads();
        for (int e = r; e < BC * D_PAD; e += BR) {
            const int c = e / D_PAD, d = e % D_PAD;
            const bool in = (j0 + c < Nk) && d < D;
            k_tile[c][d] = in ? K[bh * Nk * D + (long long)(j0 + c) * D + d] : 0.0f;
            v_tile[c][d] = in ? V[bh * Nk * D + (long long)(j0 + c) * D + d] : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < BC; ++c) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) dot = fmaf(q_reg[d], k_tile[c][d], dot);
            const float p = (j0 + c < Nk) ? expf(dot * scale) : 0.0f;  // exp(s) with no max: overflows
            p_tile[c][r] = p;
            s_sum += p;
        }
        for (int c = 0; c < BC; ++c) {
            const float p = p_tile[c][r];
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) o_reg[d] = fmaf(p, v_tile[c][d], o_reg[d]);
        }
    }
    if (i < Nq) {
#pragma unroll
        for (int d = 0; d < D_PAD; ++d)
            if (d < D) O[bh * Nq * D + (long long)i * D + d] = o_reg[d] / s_sum;
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_NAIVE_INST(DP)                                                                                 \
    template __global__ void naive_fwd<DP, 32, 64>(const float*, const float*, const float*, float*, float*, int, \
                                                   int, int, float, int);                                     \
    template __global__ void seed_nomax_fwd<DP, 32, 64>(const float*, const float*, const float*, float*, int,   \
                                                        int, int, float);
FA_NAIVE_INST(32)
FA_NAIVE_INST(64)
FA_NAIVE_INST(128)
#endif
