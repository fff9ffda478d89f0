// tiled.cu -- rung 2 of the CUDA ladder: block-cooperative tiles, warp shuffles, float4 loads. fp32.
//
// The kernel is written as the four device functions of the optimisation guide (seed 000):
//   1. compute_qk_scores_and_max            S_ij = Qi Kj^T * scale, and its row max m_ij
//   2. compute_block_softmax_and_weighted_v P_ij = exp(S_ij - m_ij), its row sum l_ij, and P_ij Vj
//   3. merge_block_stats                    online softmax: fold the tile's (m_ij, l_ij, P_ij Vj) into (m_i, l_i, acc)
//   4. normalize_output                     O = acc / l_i, lse = m_i + log(l_i)
// Each function is self-contained (all it reads and writes is in its signature), so any one of
// them can be replaced by a student's version and tested on its own.
//
// Different math from the other rungs: the merge is FlashAttention-1's (Algorithm 1, lines 10-12), not the
// FlashAttention-2 loop of numpy_flash.py (v2) and the other kernels. Because the tile's statistics are made
// first (functions 1 and 2) and merged after (function 3), the tile's P_ij is exponentiated against the
// tile's own max m_ij, before the running max is updated; the merge then rescales both sides:
//   m_new = max(m_i, m_ij),  a = exp(m_i - m_new),  b = exp(m_ij - m_new)
//   l_i   = a * l_i + b * l_ij,          acc = a * acc + b * P_ij Vj
// (FlashAttention-2 exponentiates against m_new directly and needs only a.) Same result, one more
// exp2 and multiply per row and tile.
//
// Work split
//   grid  = (ceil(Nq / Br), B * H), block = 4 warps, Br = 4 * ROWS query rows per block
//   warp w owns query rows  q0 + w * ROWS ... + ROWS - 1  of the block
//   a K/V tile holds Bc = 32 keys: lane c of a warp computes the scores of key c for the warp's rows,
//   so a row max / row sum over the tile is a warp reduction (__shfl_xor_sync);
//   for P_ij Vj, lane c owns the output columns d = c, c + 32, c + 64, ... (D_PAD / 32 of them), and the
//   warp's P_ij rows go through shared memory (float4 broadcasts) rather than one shuffle per key.
// The K/V loop covers the tiles of [mask.kv_begin(q0), mask.kv_end(q0 + Br)) (masks.cuh): tiles no row of
// the block sees are skipped at both ends, and only tiles that mask.needs_mask() apply the mask elementwise.
// Scores are kept in log2 units (scale_log2 = scale * log2 e), so every exponential is an exp2.
#include "common.cuh"
#include "masks.cuh"

namespace tiled {
constexpr int NWARPS = 4;
constexpr int Bc = 32;   // keys per K/V tile = lanes per warp
constexpr int KPAD = 4;  // k_tile rows padded by 4 floats: lane c reads row c with float4, no bank conflict
}  // namespace tiled

// ---------------------------------------------------------------------------------------------
// 1. S_ij row block and its row max.
//    s_ij[r] = (Q[row0 + r] . K[key]) * scale_log2   for the lane's key; -inf where masked: when the tile
//              needs the mask (`masked`), the pairs mask.visible(row, key) rejects (outside the window,
//              key >= Nk or row >= Nq) get -inf
//    m_ij[r] = max over the 32 lanes (keys) of s_ij[r]  -- a warp reduction
// q_tile: (4 * ROWS, D_PAD) the block's Q rows; k_tile: (32, D_PAD + KPAD) the tile's keys.
template <int D_PAD, int ROWS>
__device__ __forceinline__ void compute_qk_scores_and_max(const float (*q_tile)[D_PAD],
                                                          const float (*k_tile)[D_PAD + tiled::KPAD], int warp,
                                                          int lane, int row0, int key, const fa::Mask& mask,
                                                          bool masked, float scale_log2, float (&s_ij)[ROWS],
                                                          float (&m_ij)[ROWS]) {
    float dot[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) dot[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < D_PAD; d += 4) {
        const float4 kv = *reinterpret_cast<const float4*>(&k_tile[lane][d]);  // 16-byte shared load
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float4 qv = *reinterpret_cast<const float4*>(&q_tile[warp * ROWS + r][d]);  // broadcast
            dot[r] = fmaf(qv.x, kv.x, fmaf(qv.y, kv.y, fmaf(qv.z, kv.z, fmaf(qv.w, kv.w, dot[r]))));
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const bool ok = !masked || mask.visible(row0 + r, key);
        s_ij[r] = ok ? dot[r] * scale_log2 : FA_NEG_INF;  // S_ij = Qi Kj^T * scale (log2 units)
        m_ij[r] = fa::warp_reduce_max(s_ij[r]);           // m_ij = rowmax(S_ij), every lane gets it
    }
}

// ---------------------------------------------------------------------------------------------
// 2. The tile's own softmax numerator and its weighted sum of V.
//    p        = exp2(s_ij[r] - m_ij[r])          P_ij (0 for masked keys; 0 if the row saw no key here)
//    l_ij     = sum over the 32 keys of p        rowsum(P_ij) -- a warp reduction
//    pv[r][i] = sum_c p_c * V[c][lane + 32 i]    P_ij Vj -- lane c's p goes through the warp's p_warp rows
//                                                   in shared memory, read back 4 keys at a time (float4)
// v_tile: (32, D_PAD) the tile's values (rows past Nk are zero); p_warp: (ROWS, 32) this warp's scratch.
template <int D_PAD, int ROWS>
__device__ __forceinline__ void compute_block_softmax_and_weighted_v(const float (*v_tile)[D_PAD],
                                                                     float (*p_warp)[tiled::Bc], int lane,
                                                                     const float (&s_ij)[ROWS],
                                                                     const float (&m_ij)[ROWS],
                                                                     float (&l_ij)[ROWS],
                                                                     float (&pv)[ROWS][D_PAD / 32]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float p = fa::exp2_minus(s_ij[r], m_ij[r]);  // P_ij = exp(S_ij - m_ij)
        l_ij[r] = fa::warp_reduce_sum(p);                   // l_ij = rowsum(P_ij)
        p_warp[r][lane] = p;
#pragma unroll
        for (int i = 0; i < D_PAD / 32; ++i) pv[r][i] = 0.0f;
    }
    __syncwarp();  // the warp's P_ij rows are in shared memory
#pragma unroll 2
    for (int c = 0; c < tiled::Bc; c += 4) {
        float vc[4][D_PAD / 32];  // V[c .. c+3][lane + 32 i]: consecutive lanes, no bank conflict
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int i = 0; i < D_PAD / 32; ++i) vc[u][i] = v_tile[c + u][lane + 32 * i];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float4 p4 = *reinterpret_cast<const float4*>(&p_warp[r][c]);  // broadcast to the warp
#pragma unroll
            for (int i = 0; i < D_PAD / 32; ++i)  // P_ij Vj
                pv[r][i] = fmaf(p4.x, vc[0][i], fmaf(p4.y, vc[1][i], fmaf(p4.z, vc[2][i], fmaf(p4.w, vc[3][i], pv[r][i]))));
        }
    }
    __syncwarp();  // p_warp may be overwritten by the next tile
}

// ---------------------------------------------------------------------------------------------
// 3. Online softmax (FlashAttention-1's merge): fold the tile's (m_ij, l_ij, pv) into the running (m_i, l_i, acc).
//    m_new = max(m_i, m_ij)
//    a     = exp2(m_i - m_new)      rescales what was accumulated so far
//    b     = exp2(m_ij - m_new)     rescales the tile (its P_ij were taken against m_ij)
//    l_i   = a * l_i + b * l_ij
//    acc   = a * acc + b * pv
template <int D_PAD, int ROWS>
__device__ __forceinline__ void merge_block_stats(float (&m_i)[ROWS], float (&l_i)[ROWS],
                                                  float (&acc)[ROWS][D_PAD / 32], const float (&m_ij)[ROWS],
                                                  const float (&l_ij)[ROWS], const float (&pv)[ROWS][D_PAD / 32]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float m_new = fmaxf(m_i[r], m_ij[r]);      // m_new = max(m_i, m_ij)
        const float a = fa::exp2_minus(m_i[r], m_new);   // exp(m_i - m_new)   (0 while m_new = -inf)
        const float b = fa::exp2_minus(m_ij[r], m_new);  // exp(m_ij - m_new)
        l_i[r] = a * l_i[r] + b * l_ij[r];               // l_i = a * l_i + b * l_ij
#pragma unroll
        for (int i = 0; i < D_PAD / 32; ++i) acc[r][i] = fmaf(a, acc[r][i], b * pv[r][i]);  // acc = a acc + b P V
        m_i[r] = m_new;
    }
}

// ---------------------------------------------------------------------------------------------
// 4. O = acc / l_i and lse = (m_i + log2 l_i) * ln 2, written to global memory (rows < Nq, columns < D).
//    A row that saw no key (l_i = 0) gets O = 0 and lse = -inf; NaN in gives NaN out (common.cuh).
//    o: this head's (Nq, D) output; lse: this head's (Nq,) log-sum-exp.
template <int D_PAD, int ROWS>
__device__ __forceinline__ void normalize_output(float* __restrict__ o, float* __restrict__ lse, int lane, int row0,
                                                 int Nq, int D, const float (&m_i)[ROWS], const float (&l_i)[ROWS],
                                                 const float (&acc)[ROWS][D_PAD / 32]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r;
        if (row >= Nq) continue;
        const float inv_l = fa::inv_row_sum(l_i[r]);  // 0 for l_i = 0; NaN stays NaN
#pragma unroll
        for (int i = 0; i < D_PAD / 32; ++i) {
            const int d = lane + 32 * i;
            if (d < D) o[(long long)row * D + d] = acc[r][i] * inv_l;  // coalesced: 32 consecutive floats
        }
        if (lane == 0) lse[row] = fa::row_lse(m_i[r], l_i[r]);
    }
}

// ---------------------------------------------------------------------------------------------
// Load rows [row0, row0 + ROWS_T) of a (N, D) matrix into a (ROWS_T, ld) shared tile, zero-filling
// rows >= N and columns >= D. With vec4 (D % 4 == 0 and 16-byte aligned rows) it moves float4s.
template <int ROWS_T, int D_PAD, int LD>
__device__ __forceinline__ void load_tile(float (*tile)[LD], const float* __restrict__ x, int row0, int N, int D,
                                          bool vec4) {
    if (vec4) {
        for (int e = threadIdx.x; e < ROWS_T * (D_PAD / 4); e += blockDim.x) {
            const int r = e / (D_PAD / 4), d = (e % (D_PAD / 4)) * 4;
            float4 val = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row0 + r < N && d < D) val = *reinterpret_cast<const float4*>(&x[(long long)(row0 + r) * D + d]);
            *reinterpret_cast<float4*>(&tile[r][d]) = val;
        }
    } else {
        for (int e = threadIdx.x; e < ROWS_T * D_PAD; e += blockDim.x) {
            const int r = e / D_PAD, d = e % D_PAD;
            tile[r][d] = (row0 + r < N && d < D) ? x[(long long)(row0 + r) * D + d] : 0.0f;
        }
    }
}

template <int D_PAD, int ROWS>
__global__ void __launch_bounds__(tiled::NWARPS * 32)
    tiled_fwd(const float* __restrict__ Q, const float* __restrict__ K, const float* __restrict__ V,
              float* __restrict__ O, float* __restrict__ LSE, int Nq, int Nk, int D, float scale_log2,
              int window_left, int window_right, int vec4) {
    constexpr int Br = tiled::NWARPS * ROWS;
    constexpr int Bc = tiled::Bc;
    __shared__ __align__(16) float q_tile[Br][D_PAD];
    __shared__ __align__(16) float k_tile[Bc][D_PAD + tiled::KPAD];
    __shared__ __align__(16) float v_tile[Bc][D_PAD];
    __shared__ __align__(16) float p_tile[Br][Bc];  // P_ij, ROWS rows per warp
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long bh = blockIdx.y;
    const int q0 = blockIdx.x * Br;
    const int row0 = q0 + warp * ROWS;  // the warp's first query row
    const float* q = Q + bh * Nq * D;
    const float* k = K + bh * Nk * D;
    const float* v = V + bh * Nk * D;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);

    load_tile<Br, D_PAD, D_PAD>(q_tile, q, q0, Nq, D, vec4 != 0);

    float m_i[ROWS], l_i[ROWS], acc[ROWS][D_PAD / 32];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m_i[r] = FA_NEG_INF;
        l_i[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < D_PAD / 32; ++i) acc[r][i] = 0.0f;
    }
    // the K/V tiles the block's rows see (both ends: tiles outside the window are skipped)
    const int j_end = mask.kv_tile_end(q0, q0 + Br, Bc);
    for (int j = mask.kv_tile_begin(q0, Bc); j < j_end; ++j) {
        const int j0 = j * Bc;  // the tile's first key
        __syncthreads();  // everyone is done with the previous K/V tile
        load_tile<Bc, D_PAD, D_PAD + tiled::KPAD>(k_tile, k, j0, Nk, D, vec4 != 0);
        load_tile<Bc, D_PAD, D_PAD>(v_tile, v, j0, Nk, D, vec4 != 0);
        __syncthreads();
        const bool masked = mask.needs_mask(q0, q0 + Br, j0, j0 + Bc);  // a uniform branch: the fast path skips it
        float s_ij[ROWS], m_ij[ROWS], l_ij[ROWS], pv[ROWS][D_PAD / 32];
        compute_qk_scores_and_max<D_PAD, ROWS>(q_tile, k_tile, warp, lane, row0, j0 + lane, mask, masked,
                                               scale_log2, s_ij, m_ij);
        compute_block_softmax_and_weighted_v<D_PAD, ROWS>(v_tile, &p_tile[warp * ROWS], lane, s_ij, m_ij, l_ij, pv);
        merge_block_stats<D_PAD, ROWS>(m_i, l_i, acc, m_ij, l_ij, pv);
    }
    normalize_output<D_PAD, ROWS>(O + bh * Nq * D, LSE + bh * Nq, lane, row0, Nq, D, m_i, l_i, acc);
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_TILED_INST(DP, R)                                                                              \
    template __global__ void tiled_fwd<DP, R>(const float*, const float*, const float*, float*, float*, int, \
                                              int, int, float, int, int, int);
FA_TILED_INST(32, 8)
FA_TILED_INST(64, 8)
FA_TILED_INST(128, 4)
#endif
