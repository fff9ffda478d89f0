// wgmma.cu -- rung 3b of the CUDA ladder: Hopper tensor cores (sm_90a). fp16 or bf16 in, fp32 accumulate.
//
// The same FlashAttention-2 forward as mma.cu, but with the instruction Hopper's tensor cores were built
// for. mma.sync (rung 3) is a warp-wide, synchronous 16x8x16 product whose operands pass through the
// warp's registers; wgmma is issued by a *warpgroup* (4 warps, 128 threads) and is asynchronous:
//   wgmma.mma_async.m64nNk16   64xN (+)= 64x16 * 16xN, B (and here Q) read by the tensor cores straight
//                              from shared memory through a 64-bit "matrix descriptor"; the warpgroup
//                              goes on issuing other instructions while it runs
//   wgmma.commit_group / wait_group   batch the products issued so far / wait until at most N batches run
//   wgmma.fence                       order register writes (rescaled O, new P) before the next products
//   fence.proxy.async                 make cp.async's writes to shared memory visible to the tensor cores
//
// Shared-memory tiles use the 128-byte swizzle the descriptors understand: a (ROWS, D) tile is stored as
// D/64 column panels of (ROWS, 64); a panel row is 128 bytes, 8 rows make a 1024-byte "swizzle atom", and
// 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the XOR keeps ldmatrix-like 8-row reads and the
// cp.async writes free of bank conflicts). Tiles start 1024-byte aligned.
//
// Work split: grid = (ceil(Nq / Br), B * Hq), NWG warpgroups per block, Br = 64 * NWG query rows; warpgroup
// w owns rows 64w .. 64w + 63 of the block. K/V tiles of Bc keys are double-buffered with cp.async.
// The loop is software-pipelined so the tensor cores and the softmax overlap inside a warpgroup
// (FlashAttention-3's "intra-warpgroup overlap"): in iteration j
//     issue  S_i,j+1 = Qi K_j+1^T           (async)
//     issue  O      += P_ij Vj               (async, P_ij from registers)
//     wait for S_i,j+1; online softmax on it while P_ij Vj still runs:
//         m_new = max(m_i, rowmax(S) * scale_log2),  P = exp2(S * scale_log2 - m_new),
//         l_i = exp2(m_i - m_new) * l_i + rowsum(P)
//     wait for P_ij Vj; acc *= exp2(m_i - m_new); P_i,j+1 -> fp16/bf16 registers
// and at the end O = acc / l_i, lse = (m_i + log2 l_i) ln 2 (scores in log2 units, as in mma.cu).
// The softmax on the accumulator fragments, the negative-scale rule and the epilogue are fragments.cuh's
// (shared with mma.cu); the mask is masks.cuh's. The K/V loop covers only the tiles the block's rows see
// (both ends skipped); with a right bound (causal) blocks run heaviest-first; only the rows whose window
// edge or the Nk tail cuts a tile are masked there element by element (frag::online_softmax).
// Variants, as in mma.cu: the window is the mask's; grouped-query attention reads K/V head h / group
// (frag::forward_block); DROPOUT = true multiplies P_ij by Z_ij / (1 - p) after the softmax (frag::Dropout).
#include "common.cuh"
#include "fragments.cuh"
#include "masks.cuh"
#include "ptx.cuh"

namespace wgmma_detail {

using namespace ptx;  // smem_u32, cp_async_*, pack2, fast_exp2

// byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` in a 128-byte-swizzled (ROWS, D) tile
template <int ROWS>
__device__ __forceinline__ unsigned sw128(int row, int chunk) {
    return (chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// async copy of rows [row0, row0 + ROWS) of a (N, D) 16-bit matrix into a swizzled tile; rows >= N -> 0.
// Consecutive threads take consecutive 16-byte chunks of a row: coalesced global reads.
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_async(unsigned tile, const unsigned short* __restrict__ x, int row0,
                                                int N) {
    constexpr int CHUNKS = D / 8, TOTAL = ROWS * CHUNKS;  // 16-byte chunks per row, per tile
#pragma unroll
    for (int i = 0; i < (TOTAL + NTHREADS - 1) / NTHREADS; ++i) {
        const int e = threadIdx.x + i * NTHREADS, r = e / CHUNKS, c = e % CHUNKS;
        if (TOTAL % NTHREADS == 0 || e < TOTAL) {
            const bool in = row0 + r < N;
            cp_async_16(tile + sw128<ROWS>(r, c), in ? x + (long long)(row0 + r) * D + c * 8 : x, in ? 16 : 0);
        }
    }
}

// wgmma matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 62-63 swizzle (1 = 128 B).
//   K-major operand (Q, K: rows of D contiguous halves): SBO = 1024, the step between 8-row atoms; LBO unused.
//   MN-major operand (V read as B[k = key][n = d]): SBO = 1024, the step between groups of 8 keys;
//   LBO = the step between 64-column panels along d.
__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Registers that an asynchronous wgmma reads or writes must not be touched by the compiler while it runs:
// an empty volatile asm that "uses and redefines" them pins every access after the wait that precedes it.
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(unsigned (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
}

// --- the wgmma instructions used here. d: the accumulator, N/2 fp32 registers per thread, laid out as
// mma.sync's C fragments stacked over the 4 warps (warp w of the group holds rows 16w .. 16w + 15).
#define FA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define FA_D32 FA_D8(0), FA_D8(8), FA_D8(16), FA_D8(24)
#define FA_D64 FA_D32, FA_D8(32), FA_D8(40), FA_D8(48), FA_D8(56)
#define FA_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// SS: d (+)= A * B, A (64x16, K-major) and B (16xN, K-major) in shared memory. accumulate = 0: d = A * B.
// DA, DB, ACC: operand numbers.
#define FA_WGMMA_SS(N, AB, REGS, OPS, DA, DB, ACC)                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" AB " " REGS ", %" #DA ", %" #DB       \
                 ", p, 1, 1, 0, 0;\n}\n"                                                          \
                 : OPS                                                                                   \
                 : "l"(da), "l"(db), "r"(accumulate))
// RS: d += A * B, A (64x16) in registers (4 x 2 halves per thread, mma.sync's A layout), B (16xN) in
// shared memory, MN-major (imm-trans-b = 1: V is stored key-major, d contiguous).
#define FA_WGMMA_RS(N, AB, REGS, OPS, A0, A1, A2, A3, DB, ACC)                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" AB " " REGS ", {%" #A0 ", %" #A1     \
                 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, 1;\n}\n"                                    \
                 : OPS                                                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1))

template <int N, bool BF16>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                                         int accumulate) {
    static_assert(N == 64 || N == 128, "n64 or n128");
    if constexpr (N == 64 && !BF16) FA_WGMMA_SS(64, ".f16.f16", FA_R32, FA_D32, 32, 33, 34);
    if constexpr (N == 64 && BF16) FA_WGMMA_SS(64, ".bf16.bf16", FA_R32, FA_D32, 32, 33, 34);
    if constexpr (N == 128 && !BF16) FA_WGMMA_SS(128, ".f16.f16", FA_R64, FA_D64, 64, 65, 66);
    if constexpr (N == 128 && BF16) FA_WGMMA_SS(128, ".bf16.bf16", FA_R64, FA_D64, 64, 65, 66);
}
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db) {
    static_assert(N == 64 || N == 128, "n64 or n128");
    if constexpr (N == 64 && !BF16) FA_WGMMA_RS(64, ".f16.f16", FA_R32, FA_D32, 32, 33, 34, 35, 36, 37);
    if constexpr (N == 64 && BF16) FA_WGMMA_RS(64, ".bf16.bf16", FA_R32, FA_D32, 32, 33, 34, 35, 36, 37);
    if constexpr (N == 128 && !BF16) FA_WGMMA_RS(128, ".f16.f16", FA_R64, FA_D64, 64, 65, 66, 67, 68, 69);
    if constexpr (N == 128 && BF16) FA_WGMMA_RS(128, ".bf16.bf16", FA_R64, FA_D64, 64, 65, 66, 67, 68, 69);
}
#undef FA_WGMMA_SS
#undef FA_WGMMA_RS

// S_ij = Qi Kj^T for this warpgroup's 64 rows: D / 16 k-steps of m64n(Bc)k16, both operands in shared memory.
// k-step kk reads columns 16kk .. 16kk + 15: panel kk / 4, byte 32 * (kk % 4) of its 128-byte rows.
template <int D, int Br, int Bc, bool BF16>
__device__ __forceinline__ void issue_qk(float (&s)[Bc / 2], unsigned sQ_wg, unsigned sK) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned long long da = make_desc(sQ_wg + (kk / 4) * Br * 128 + (kk % 4) * 32, 16, 1024);
        const unsigned long long db = make_desc(sK + (kk / 4) * Bc * 128 + (kk % 4) * 32, 16, 1024);
        wgmma_ss<Bc, BF16>(s, da, db, kk > 0);
    }
    wgmma_commit();
}

// O += P_ij Vj: Bc / 16 k-steps of m64n(D)k16; k-step kk takes keys 16kk .. 16kk + 15 = two 8-key atoms.
template <int D, int Bc, bool BF16>
__device__ __forceinline__ void issue_pv(float (&acc)[D / 2], const unsigned (&pf)[Bc / 16][4], unsigned sV) {
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) wgmma_rs<D, BF16>(acc, pf[kk], make_desc(sV + kk * 2048, Bc * 128, 1024));
    wgmma_commit();
}

// One K/V tile's online softmax on this warp's 16 rows of the warpgroup's 64 (frag::online_softmax on the flat
// accumulator, whose element i is element i % 4 of n8 tile i / 4), S_ij -> P_ij in place
template <int Bc>
__device__ __forceinline__ void softmax_tile(float (&s)[Bc / 2], float (&m_i)[2], float (&l_i)[2], float (&alpha)[2],
                                             float scale_log2, const frag::RowKeys& rk, int col0) {
    frag::online_softmax(reinterpret_cast<float (&)[Bc / 8][4]>(s), m_i, l_i, alpha, scale_log2, rk, col0);
}

}  // namespace wgmma_detail

template <int D, int Bc, int NWG, bool BF16, bool DROPOUT = false>
__global__ void __launch_bounds__(NWG * 128, 1)
    wgmma_fwd(const unsigned short* __restrict__ Q, const unsigned short* __restrict__ K,
              const unsigned short* __restrict__ V, unsigned short* __restrict__ O, float* __restrict__ LSE, int Nq,
              int Nk, float scale_log2, int window_left, int window_right, int group, float dropout_p,
              unsigned seed_lo, unsigned seed_hi) {
    using namespace wgmma_detail;
    static_assert((D == 64 || D == 128) && (Bc == 64 || Bc == 128), "D and Bc in {64, 128}");
    constexpr int Br = 64 * NWG;  // query rows per block
    constexpr int NT = NWG * 128;
    constexpr unsigned KV_BYTES = Bc * D * 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    // the swizzle pattern is a function of the address bits, so tiles must start 1024-byte aligned
    const unsigned raw = smem_u32(smem_raw);
    const unsigned pad = (1024u - (raw & 1023u)) & 1023u;
    unsigned char* smem = smem_raw + pad;
    const unsigned sQ = raw + pad;            // (Br, D)
    const unsigned sK = sQ + Br * D * 2;      // 2 x (Bc, D)
    const unsigned sV = sK + 2 * KV_BYTES;    // 2 x (Bc, D)

    const int tid = threadIdx.x, warp = tid / 32;
    const int wg = warp / 4;
    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);
    const frag::ForwardBlock blk = frag::forward_block<Br, Bc, D>(mask, K, V, group);  // head, query rows, K/V tiles
    const int q0 = blk.q0, n_tiles = blk.n_tiles;
    const long long bh = blk.bh;
    unsigned short* o = O + bh * Nq * D;
    const frag::ScoreScale sc = frag::score_scale(scale_log2);  // scale_log2 < 0: -Q, |scale_log2|
    const int wrow = 64 * wg + 16 * (warp % 4);  // the warp's first row in the block
    const int row0 = q0 + wrow;                   // ... and in the head
    const unsigned sQ_wg = sQ + 64 * wg * 128;    // this warpgroup's 64 rows of each Q panel
    const frag::RowKeys rk = frag::row_keys(mask, row0, blk.kv0);  // the keys this thread's rows see
    const frag::Dropout dp = frag::make_dropout(dropout_p, seed_lo, seed_hi, bh, Nq, Nk);  // read only if DROPOUT

    if (n_tiles == 0) {  // no row of the block sees a key: O = 0, lse = -inf
        for (int e = tid; e < Br * D; e += NT)
            if (q0 + e / D < Nq) o[(long long)q0 * D + e] = 0;
        for (int r = tid; r < Br; r += NT)
            if (q0 + r < Nq) LSE[bh * Nq + q0 + r] = FA_NEG_INF;
        return;
    }

    // prologue: group 1 = Q, K_0;  group 2 = V_0, K_1
    load_tile_async<Br, D, NT>(sQ, Q + bh * Nq * D, q0, Nq);
    load_tile_async<Bc, D, NT>(sK, blk.k, 0, blk.nk);
    cp_async_commit();
    load_tile_async<Bc, D, NT>(sV, blk.v, 0, blk.nk);
    if (n_tiles > 1) load_tile_async<Bc, D, NT>(sK + KV_BYTES, blk.k, Bc, blk.nk);
    cp_async_commit();

    float acc[D / 2];  // O accumulator, 64 x D per warpgroup
    float s[Bc / 2];   // S_ij, then P_ij in fp32
    unsigned pf[Bc / 16][4];  // P_ij as fp16/bf16 A fragments
    float m_i[2] = {FA_NEG_INF, FA_NEG_INF}, l_i[2] = {0.0f, 0.0f}, alpha[2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < Bc / 2; ++i) s[i] = 0.0f;

    // S_i0 and its softmax
    cp_async_wait<1>();  // Q and K_0 (this thread's copies)
    if (sc.q_sign != 0) {  // scale < 0: flip the sign of this thread's own chunks of Q (fragments.cuh)
        for (int e = tid; e < Br * (D / 8); e += NT)
            frag::apply_sign(*reinterpret_cast<uint4*>(smem + sw128<Br>(e / (D / 8), e % (D / 8))), sc.q_sign);
    }
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
    issue_qk<D, Br, Bc, BF16>(s, sQ_wg, sK);
    wgmma_wait<0>();
    pin(s);
    softmax_tile<Bc>(s, m_i, l_i, alpha, sc.scale_log2, rk, 0);
    if constexpr (DROPOUT) frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0);
    frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));

    for (int j = 0; j + 1 < n_tiles; ++j) {
        cp_async_wait<0>();   // K_j+1 and V_j have landed (this thread's copies) ...
        fence_proxy_async();  // ... are visible to the tensor cores ...
        __syncthreads();      // ... and every thread's; all warpgroups are done with S_ij and P_i,j-1 V_j-1
        if (j + 2 < n_tiles) load_tile_async<Bc, D, NT>(sK + (j & 1) * KV_BYTES, blk.k, (j + 2) * Bc, blk.nk);
        load_tile_async<Bc, D, NT>(sV + ((j + 1) & 1) * KV_BYTES, blk.v, (j + 1) * Bc, blk.nk);
        cp_async_commit();

        pin(acc);       // acc (rescaled) and pf (packed) were written by ordinary instructions:
        pin(pf);        // those writes come before ...
        wgmma_fence();  // ... this fence, which orders them before the products below
        issue_qk<D, Br, Bc, BF16>(s, sQ_wg, sK + ((j + 1) & 1) * KV_BYTES);  // S_i,j+1 = Qi K_j+1^T
        issue_pv<D, Bc, BF16>(acc, pf, sV + (j & 1) * KV_BYTES);            // acc += P_ij Vj
        wgmma_wait<1>();  // S_i,j+1 is done (P_ij Vj may still run): its softmax overlaps P_ij Vj
        pin(s);
        softmax_tile<Bc>(s, m_i, l_i, alpha, sc.scale_log2, rk, (j + 1) * Bc);
        if constexpr (DROPOUT)
            frag::dropout_rows(reinterpret_cast<float (&)[Bc / 8][4]>(s), dp, row0, blk.kv0 + (j + 1) * Bc);
        wgmma_wait<0>();  // P_ij Vj is done: acc and pf are ours again
        pin(acc);
        pin(pf);
        frag::rescale_rows(reinterpret_cast<float (&)[D / 8][4]>(acc), alpha);  // acc = exp2(m_i - m_new) * acc
        frag::pack_a<Bc / 8, BF16>(pf, reinterpret_cast<float (&)[Bc / 8][4]>(s));
    }
    // the last tile: acc += P_i,n-1 V_n-1
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    pin(acc);
    pin(pf);
    wgmma_fence();
    issue_pv<D, Bc, BF16>(acc, pf, sV + ((n_tiles - 1) & 1) * KV_BYTES);
    wgmma_wait<0>();
    pin(acc);

    // ---- epilogue: O = acc / l_i, lse = (m_i + log2 l_i) ln 2; O staged in the warp's own rows of the Q tile
    float inv_l[2];
    frag::finish_rows(inv_l, l_i, m_i, LSE + bh * Nq, row0, Nq);
    frag::stage_rows<D, BF16>(reinterpret_cast<float (&)[D / 8][4]>(acc), inv_l,
                              [&](int r, int c) { return smem + sw128<Br>(wrow + r, c); });
    __syncwarp();
    frag::store_staged<16, D>(o, row0, Nq, [&](int r, int c) { return smem + sw128<Br>(wrow + r, c); });
}

#ifndef __CUDACC_RTC__
// nvcc (the compile test) builds these; at run time NVRTC instantiates them through name_expressions.
#define FA_WGMMA_INST(D, Bc, NWG, BF)                                                                          \
    template __global__ void wgmma_fwd<D, Bc, NWG, BF>(const unsigned short*, const unsigned short*,           \
                                                       const unsigned short*, unsigned short*, float*, int, int, \
                                                       float, int, int, int, float, unsigned, unsigned);
#define FA_WGMMA_DROPOUT_INST(D, Bc, NWG, BF)                                                                  \
    template __global__ void wgmma_fwd<D, Bc, NWG, BF, true>(const unsigned short*, const unsigned short*,     \
                                                             const unsigned short*, unsigned short*, float*,    \
                                                             int, int, float, int, int, int, float, unsigned,   \
                                                             unsigned);
FA_WGMMA_INST(64, 128, 2, false)
FA_WGMMA_INST(64, 128, 2, true)
FA_WGMMA_INST(128, 128, 2, false)
FA_WGMMA_INST(128, 128, 2, true)
FA_WGMMA_INST(64, 64, 2, false)
FA_WGMMA_INST(64, 64, 2, true)
FA_WGMMA_INST(64, 128, 3, false)
FA_WGMMA_INST(128, 64, 2, false)
FA_WGMMA_INST(128, 64, 3, false)
FA_WGMMA_DROPOUT_INST(64, 64, 2, false)
FA_WGMMA_DROPOUT_INST(64, 64, 2, true)
FA_WGMMA_DROPOUT_INST(128, 128, 2, false)
FA_WGMMA_DROPOUT_INST(128, 128, 2, true)
#endif
