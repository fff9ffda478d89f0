// mma.cu -- rung 3 of the CUDA ladder: tensor cores. fp16 or bf16 in, fp32 accumulate.
//
// FlashAttention-2 forward with warp-level matrix instructions (sm_80+):
//   mma.sync.m16n8k16   16x8 += 16x16 * 16x8 on the tensor cores, fp32 accumulators in registers
//   ldmatrix(.trans)    shared -> registers in exactly the fragment layout mma wants
//   cp.async            global -> shared without passing through registers; K/V tiles are
//                       double-buffered: tile j+1 is in flight while tile j is computed
//   XOR swizzle         16-byte chunk c of shared row r is stored at chunk c ^ (r % 8), so the 8 rows an
//                       ldmatrix reads (or a cp.async writes) fall into 8 different bank groups
//
// Work split: grid = (ceil(Nq / BR), B * H); NWARPS warps of MT m16 tiles each, BR = 16 * MT * NWARPS
// query rows per block; warp w owns rows 16 MT w .. 16 MT (w + 1) - 1 of the block for the whole K/V loop.
// Per K/V tile of BC keys, each warp:
//   S_ij = Qi Kj^T              (16 MT x BC fp32, in registers)
//   m_new = max(m_old, rowmax(S_ij) * scale2),  P_ij = exp2(S_ij * scale2 - m_new)
//   l  = exp2(m_old - m_new) * l + rowsum(P_ij)
//   acc = exp2(m_old - m_new) * acc + P_ij Vj  (P_ij converted to fp16/bf16 straight from the S
//                                               accumulators: their layout is mma's A layout)
// and at the end O = acc / l, lse = (m + log2 l) ln 2, staged through shared memory for 16-byte stores.
// Causal: blocks run heaviest-first and stop at the last key their rows can see; only the tiles
// that cross the diagonal or the Nk tail pay for per-element masking.
#include "common.cuh"
#include "ptx.cuh"
#include "smem_tiles.cuh"

namespace mma_detail {

using namespace ptx;  // smem_u32, cp_async_*, ldmatrix_*, mma_16816, pack2, fast_exp2 (ptx.cuh)

using namespace tiles;  // swz, load_tile_async (smem_tiles.cuh)

}  // namespace mma_detail

template <int D, int BC, int NWARPS, int MT, bool BF16>
__global__ void __launch_bounds__(NWARPS * 32)
    mma_fwd(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
            const unsigned short* __restrict__ V, unsigned short* __restrict__ O, float* __restrict__ LSE, int Nq,
            int Nk, float scale2, int causal, int negate_q) {
    using namespace mma_detail;
    static_assert(D % 64 == 0 && BC % 16 == 0, "D must be a multiple of 64 and BC of 16");
    constexpr int WR = 16 * MT;       // query rows per warp (MT m16 tiles)
    constexpr int BR = WR * NWARPS;   // query rows per block
    constexpr int NT = NWARPS * 32;
    constexpr int KSTEPS = D / 16;    // k-steps of S = Q K^T
    constexpr int NTILES_S = BC / 8;  // n8 tiles of S
    constexpr int NTILES_O = D / 8;   // n8 tiles of O
    // One m16 tile per warp: its Q fragments stay in registers. Two: they are re-read from shared
    // memory each k-step (registers go to the doubled accumulators), but every K/V fragment read by
    // ldmatrix then feeds two mma instead of one: half the shared-memory traffic per FLOP.
    constexpr bool Q_IN_REGS = (MT == 1);
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned sQ = smem_u32(smem);       // (BR, D)
    const unsigned sK = sQ + BR * D * 2;      // 2 x (BC, D)
    const unsigned sV = sK + 2 * BC * D * 2;  // 2 x (BC, D)
    constexpr unsigned KV_BYTES = BC * D * 2;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates: row group, thread in group
    const bool is_causal = causal != 0;
    const int q_block = is_causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;  // heaviest first
    const int q0 = q_block * BR;
    const long long bh = blockIdx.y;
    const unsigned short* q = Q + bh * Nq * D;
    const unsigned short* k = K + bh * Nk * D;
    const unsigned short* v = V + bh * Nk * D;
    const int off = Nk - Nq;
    const int kv_end = fa::kv_end_for(min(Nq, q0 + BR), Nq, Nk, is_causal);
    const int n_tiles = (kv_end + BC - 1) / BC;
    const unsigned qflip = negate_q ? 0x80008000u : 0u;  // scale < 0: use -q and |scale|

    // prologue: Q and the first K/V tile in flight
    load_tile_async<BR, D, NT>(sQ, q, q0, Nq);
    if (n_tiles > 0) {
        load_tile_async<BC, D, NT>(sK, k, 0, Nk);
        load_tile_async<BC, D, NT>(sV, v, 0, Nk);
    }
    cp_async_commit();

    unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];  // A fragments of the warp's 16 Q rows (MT == 1)
    float acc[MT][NTILES_O][4];              // O accumulator (WR x D)
    float m[MT][2], l[MT][2];                // running max (log2 units) and this thread's part of the sums
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m[mt][0] = m[mt][1] = FA_NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < NTILES_O; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
    }
    const int wrow = warp * WR;  // the warp's first row in the block
    // ldmatrix.x4 row/chunk of this lane for an A operand (rows 0-7 / 8-15 x cols 0-7 / 8-15)
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_chunk = lane >> 4;

    for (int j = 0; j < n_tiles; ++j) {
        const int j0 = j * BC;
        const unsigned kb = sK + (j & 1) * KV_BYTES, vb = sV + (j & 1) * KV_BYTES;
        if (j + 1 < n_tiles) {  // prefetch tile j + 1 into the other buffer, then wait for tile j
            load_tile_async<BC, D, NT>(sK + ((j + 1) & 1) * KV_BYTES, k, j0 + BC, Nk);
            load_tile_async<BC, D, NT>(sV + ((j + 1) & 1) * KV_BYTES, v, j0 + BC, Nk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (Q_IN_REGS && j == 0) {
#pragma unroll
            for (int kk = 0; kk < (Q_IN_REGS ? KSTEPS : 1); ++kk) {
                ldmatrix_x4(qf[kk], sQ + swz<D>(wrow + a_row, kk * 2 + a_chunk));
#pragma unroll
                for (int x = 0; x < 4; ++x) qf[kk][x] ^= qflip;
            }
        }

        // ---- S_ij = Qi Kj^T  (WR x BC per warp)
        float s[MT][NTILES_S][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NTILES_S; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (Q_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[mt][x] = qf[Q_IN_REGS ? kk : 0][x];
                } else {
                    ldmatrix_x4(a[mt], sQ + swz<D>(wrow + mt * 16 + a_row, kk * 2 + a_chunk));
#pragma unroll
                    for (int x = 0; x < 4; ++x) a[mt][x] ^= qflip;
                }
            }
#pragma unroll
            for (int np = 0; np < NTILES_S / 2; ++np) {  // two n8 tiles (16 keys) per ldmatrix.x4
                unsigned b[4];
                const int key = np * 16 + (lane & 7) + (lane >> 4) * 8;
                ldmatrix_x4(b, kb + swz<D>(key, kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<BF16>(s[mt][2 * np], a[mt], b[0], b[1]);
                    mma_16816<BF16>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }

        // ---- mask the tiles that cross the causal diagonal or the Nk tail
        if (j0 + BC > Nk || (is_causal && j0 + BC - 1 > q0 + off)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NTILES_S; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = j0 + n * 8 + 2 * t + (e & 1);
                        const int row = q0 + wrow + mt * 16 + g + (e < 2 ? 0 : 8);
                        if (!fa::visible(row, col, Nk, off, is_causal)) s[mt][n][e] = FA_NEG_INF;
                    }
        }

        // ---- online softmax on rows g (e = 0, 1) and g + 8 (e = 2, 3) of each m16 tile
        unsigned pf[MT][BC / 16][4];  // P_ij as the A fragments of P_ij Vj
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float mx[2] = {FA_NEG_INF, FA_NEG_INF};
#pragma unroll
            for (int n = 0; n < NTILES_S; ++n) {
                mx[0] = fmaxf(mx[0], fmaxf(s[mt][n][0], s[mt][n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[mt][n][2], s[mt][n][3]));
            }
            float alpha[2], m_use[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // the 4 threads of a group hold one row: reduce over them
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float m_new = fmaxf(m[mt][h], mx[h] * scale2);  // m_new = max(m_old, rowmax(S_ij) * scale2)
                m_use[h] = m_new == FA_NEG_INF ? 0.0f : m_new;         // no key yet: exp2(-inf - 0) = 0
                alpha[h] = fast_exp2(m[mt][h] - m_use[h]);             // exp(m_old - m_new)
                m[mt][h] = m_new;
                l[mt][h] *= alpha[h];
            }
#pragma unroll
            for (int n = 0; n < NTILES_O; ++n) {  // acc = alpha * acc
                acc[mt][n][0] *= alpha[0];
                acc[mt][n][1] *= alpha[0];
                acc[mt][n][2] *= alpha[1];
                acc[mt][n][3] *= alpha[1];
            }
#pragma unroll
            for (int n = 0; n < NTILES_S; ++n) {  // P_ij = exp2(S_ij * scale2 - m_new)
                const float p0 = fast_exp2(fmaf(s[mt][n][0], scale2, -m_use[0]));
                const float p1 = fast_exp2(fmaf(s[mt][n][1], scale2, -m_use[0]));
                const float p2 = fast_exp2(fmaf(s[mt][n][2], scale2, -m_use[1]));
                const float p3 = fast_exp2(fmaf(s[mt][n][3], scale2, -m_use[1]));
                l[mt][0] += p0 + p1;  // l += rowsum(P_ij), this thread's columns
                l[mt][1] += p2 + p3;
                pf[mt][n / 2][(n & 1) * 2 + 0] = pack2<BF16>(p0, p1);  // a0/a2: row g,     keys 2t, 2t+1 (+8)
                pf[mt][n / 2][(n & 1) * 2 + 1] = pack2<BF16>(p2, p3);  // a1/a3: row g + 8, keys 2t, 2t+1 (+8)
            }
        }

        // ---- acc += P_ij Vj   (Vj through ldmatrix.trans: B[k = key][n = d])
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                unsigned b[4];
                const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                ldmatrix_x4_trans(b, vb + swz<D>(key, dp * 2 + (lane >> 4)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<BF16>(acc[mt][2 * dp], pf[mt][kk], b[0], b[1]);
                    mma_16816<BF16>(acc[mt][2 * dp + 1], pf[mt][kk], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with buffer j & 1 before it is refilled
    }
    cp_async_wait<0>();  // (n_tiles == 0: the Q load) nothing may still be writing shared memory
    __syncthreads();

    // ---- epilogue: O = acc / l, lse = (m + log2 l) ln 2; O staged in the warp's own rows of sQ
    unsigned char* sO = smem;  // reuse the Q tile
    unsigned short* o = O + bh * Nq * D;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        float inv_l[2];
        const int ra = wrow + mt * 16 + g, rb = ra + 8;  // rows in the block
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);  // the whole row's sum
            l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
            inv_l[h] = fa::inv_row_sum(l[mt][h]);  // a row that saw no key: O = 0 (NaN stays NaN)
            const int row = q0 + (h == 0 ? ra : rb);
            if (t == 0 && row < Nq)
                LSE[bh * Nq + row] = fa::row_lse(m[mt][h], l[mt][h]);
        }
#pragma unroll
        for (int n = 0; n < NTILES_O; ++n) {
            *reinterpret_cast<unsigned*>(sO + swz<D>(ra, n) + t * 4) =
                pack2<BF16>(acc[mt][n][0] * inv_l[0], acc[mt][n][1] * inv_l[0]);
            *reinterpret_cast<unsigned*>(sO + swz<D>(rb, n) + t * 4) =
                pack2<BF16>(acc[mt][n][2] * inv_l[1], acc[mt][n][3] * inv_l[1]);
        }
    }
    __syncwarp();
#pragma unroll
    for (int e = lane; e < WR * (D / 8); e += 32) {  // 16-byte stores, one row = D / 8 chunks
        const int r = e / (D / 8), c = e % (D / 8);
        const int row = q0 + wrow + r;
        if (row < Nq)
            *reinterpret_cast<uint4*>(o + (long long)row * D + c * 8) =
                *reinterpret_cast<const uint4*>(sO + swz<D>(wrow + r, c));
    }
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_MMA_INST(D, BC, NW, MT, BF)                                                                       \
    template __global__ void mma_fwd<D, BC, NW, MT, BF>(const unsigned short*, const unsigned short*,       \
                                                        const unsigned short*, unsigned short*, float*, int, \
                                                        int, float, int, int);
FA_MMA_INST(64, 64, 4, 2, false)
FA_MMA_INST(64, 64, 4, 2, true)
FA_MMA_INST(128, 128, 8, 1, false)
FA_MMA_INST(128, 128, 8, 1, true)
FA_MMA_INST(128, 32, 4, 2, false)
FA_MMA_INST(128, 32, 4, 2, true)
FA_MMA_INST(64, 64, 8, 2, false)
FA_MMA_INST(64, 64, 8, 2, true)
FA_MMA_INST(128, 64, 8, 1, false)
FA_MMA_INST(128, 64, 8, 1, true)
#endif
