// naive.cu -- rung 1 of the CUDA ladder: one thread per query row, K/V tiles in shared memory.
//
// This is the lab kernel of the seed report (002), generalised: any Nq, Nk (tails are masked),
// any D up to D_PAD (the compile-time padded head dim), the mask window of masks.cuh, the lse output,
// and made numerically safe with the running max m_i of online softmax. fp32 throughout.
//
//   grid  = (ceil(Nq / Br), B * H)      block = Br threads; thread r owns query row i = q0 + r
//   for each K/V tile j of Bc keys in [mask.kv_begin(q0), mask.kv_end(q0 + Br)) (loaded cooperatively):
//       S_ij    = (q_i . k_c) * scale * log2(e)          for the Bc keys c of the tile (-inf where masked)
//       m_new   = max(m_i, max_c S_ij)
//       alpha   = exp2(m_i - m_new)                      (rescales what was summed so far)
//       P_ij    = exp2(S_ij - m_new)
//       l_i     = alpha * l_i + sum_c P_ij
//       acc     = alpha * acc + sum_c P_ij * v_c
//   O = acc / l_i,  lse = (m_i + log2(l_i)) * ln(2)
//
// The seed kernel summed exp(s) directly: exp overflows float32 once s > 88.7. For the test that
// shows this, `seed_nomax_fwd` below keeps that behaviour on purpose (same loops, no max).
#include "common.cuh"
#include "masks.cuh"

template <int D_PAD, int Bc, int Br>
__global__ void __launch_bounds__(Br) naive_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                                                const float* __restrict__ V, float* __restrict__ O,
                                                float* __restrict__ LSE, int Nq, int Nk, int D, float scale_log2,
                                                int window_left, int window_right) {
    __shared__ float k_tile[Bc][D_PAD];
    __shared__ float v_tile[Bc][D_PAD];
    __shared__ float p_tile[Bc][Br];  // column r holds thread r's S_ij row, then its P_ij row
    const int r = threadIdx.x;
    const int q0 = blockIdx.x * Br;
    const int i = q0 + r;  // this thread's query row
    const long long bh = blockIdx.y;
    const float* q = Q + bh * Nq * D;
    const float* k = K + bh * Nk * D;
    const float* v = V + bh * Nk * D;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);

    float q_reg[D_PAD];  // this row of Q, zero past D
    float acc[D_PAD];    // the unnormalised output row
#pragma unroll
    for (int d = 0; d < D_PAD; ++d) {
        q_reg[d] = (i < Nq && d < D) ? q[(long long)i * D + d] : 0.0f;
        acc[d] = 0.0f;
    }
    float m_i = FA_NEG_INF, l_i = 0.0f;  // running max (log2 units) and running sum

    // the keys the block's rows see: tiles outside [kv_begin, kv_end) are skipped (both ends)
    const int j_end = mask.kv_tile_end(q0, q0 + Br, Bc);
    for (int j = mask.kv_tile_begin(q0, Bc); j < j_end; ++j) {
        const int j0 = j * Bc;  // the tile's first key
        __syncthreads();  // nobody still reads the previous tile
        for (int e = r; e < Bc * D_PAD; e += Br) {  // cooperative load, zero-filled tails
            const int c = e / D_PAD, d = e % D_PAD;
            const bool in = (j0 + c < Nk) && d < D;
            k_tile[c][d] = in ? k[(long long)(j0 + c) * D + d] : 0.0f;
            v_tile[c][d] = in ? v[(long long)(j0 + c) * D + d] : 0.0f;
        }
        __syncthreads();
        // S_ij = Qi Kj^T * scale (one row of it per thread); masked keys get -inf (only in tiles that need it)
        const bool masked = mask.needs_mask(q0, q0 + Br, j0, j0 + Bc);
        float m_ij = FA_NEG_INF;  // rowmax(S_ij)
        for (int c = 0; c < Bc; ++c) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) dot = fmaf(q_reg[d], k_tile[c][d], dot);
            const float s_ij = (!masked || mask.visible(i, j0 + c)) ? dot * scale_log2 : FA_NEG_INF;
            p_tile[c][r] = s_ij;
            m_ij = fmaxf(m_ij, s_ij);
        }
        const float m_new = fmaxf(m_i, m_ij);            // m_new = max(m_i, rowmax(S_ij))
        const float alpha = fa::exp2_minus(m_i, m_new);  // exp(m_i - m_new); 0 while m_new = -inf
        float l_ij = 0.0f;
        for (int c = 0; c < Bc; ++c) {
            const float p_ij = fa::exp2_minus(p_tile[c][r], m_new);  // P_ij = exp(S_ij - m_new)
            p_tile[c][r] = p_ij;
            l_ij += p_ij;
        }
        l_i = alpha * l_i + l_ij;  // l_i = alpha * l_i + rowsum(P_ij)
#pragma unroll
        for (int d = 0; d < D_PAD; ++d) acc[d] *= alpha;  // acc = alpha * acc ...
        for (int c = 0; c < Bc; ++c) {
            const float p_ij = p_tile[c][r];
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) acc[d] = fmaf(p_ij, v_tile[c][d], acc[d]);  // ... + P_ij V_j
        }
        m_i = m_new;
    }
    if (i < Nq) {
        const float inv_l = fa::inv_row_sum(l_i);  // a row that saw no key: O = 0 (NaN stays NaN)
#pragma unroll
        for (int d = 0; d < D_PAD; ++d)
            if (d < D) O[bh * Nq * D + (long long)i * D + d] = acc[d] * inv_l;
        LSE[bh * Nq + i] = fa::row_lse(m_i, l_i);  // lse = m_i + log(l_i); -inf for no key
    }
}

// The seed kernel's arithmetic, kept only to demonstrate its overflow: it sums exp(s) with no
// running max, so exp(s) = inf once a score passes ~88.7 and O becomes inf/inf = NaN.
// Same launch shape and bounds checks as naive_fwd; non-causal, no lse.
template <int D_PAD, int Bc, int Br>
__global__ void __launch_bounds__(Br) seed_nomax_fwd(const float* __restrict__ Q, const float* __restrict__ K,
                                                     const float* __restrict__ V, float* __restrict__ O, int Nq,
                                                     int Nk, int D, float scale_log2) {
    __shared__ float k_tile[Bc][D_PAD];
    __shared__ float v_tile[Bc][D_PAD];
    __shared__ float p_tile[Bc][Br];
    const int r = threadIdx.x;
    const int i = blockIdx.x * Br + r;
    const long long bh = blockIdx.y;
    float q_reg[D_PAD], acc[D_PAD];
#pragma unroll
    for (int d = 0; d < D_PAD; ++d) {
        q_reg[d] = (i < Nq && d < D) ? Q[bh * Nq * D + (long long)i * D + d] : 0.0f;
        acc[d] = 0.0f;
    }
    float l_i = 0.0f;  // sum of exp(S_ij), with no max subtracted
    for (int j0 = 0; j0 < Nk; j0 += Bc) {
        __syncthreads();
        for (int e = r; e < Bc * D_PAD; e += Br) {
            const int c = e / D_PAD, d = e % D_PAD;
            const bool in = (j0 + c < Nk) && d < D;
            k_tile[c][d] = in ? K[bh * Nk * D + (long long)(j0 + c) * D + d] : 0.0f;
            v_tile[c][d] = in ? V[bh * Nk * D + (long long)(j0 + c) * D + d] : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < Bc; ++c) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) dot = fmaf(q_reg[d], k_tile[c][d], dot);
            // P_ij = exp(S_ij) = exp2(q . k * scale * log2 e) with no max: overflows
            const float p_ij = (j0 + c < Nk) ? exp2f(dot * scale_log2) : 0.0f;
            p_tile[c][r] = p_ij;
            l_i += p_ij;
        }
        for (int c = 0; c < Bc; ++c) {
            const float p_ij = p_tile[c][r];
#pragma unroll
            for (int d = 0; d < D_PAD; ++d) acc[d] = fmaf(p_ij, v_tile[c][d], acc[d]);
        }
    }
    if (i < Nq) {
#pragma unroll
        for (int d = 0; d < D_PAD; ++d)
            if (d < D) O[bh * Nq * D + (long long)i * D + d] = acc[d] / l_i;
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_NAIVE_INST(DP)                                                                                 \
    template __global__ void naive_fwd<DP, 32, 64>(const float*, const float*, const float*, float*, float*, int, \
                                                   int, int, float, int, int);                                \
    template __global__ void seed_nomax_fwd<DP, 32, 64>(const float*, const float*, const float*, float*, int,   \
                                                        int, int, float);
FA_NAIVE_INST(32)
FA_NAIVE_INST(64)
FA_NAIVE_INST(128)
#endif
