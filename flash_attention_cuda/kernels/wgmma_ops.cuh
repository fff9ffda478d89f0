// wgmma_ops.cuh -- Hopper's warpgroup matrix products (wgmma, sm_90a), shared by the forward (wgmma.cu) and the
// backward (wgmma_backward.cu).
//
//   wgmma.mma_async.m64nNk16   64xN (+)= 64x16 * 16xN, issued by a warpgroup (4 warps, 128 threads); B (and,
//                              for the SS form, A) read by the tensor cores straight from shared memory through
//                              a 64-bit "matrix descriptor"; the warpgroup goes on issuing other instructions
//   wgmma.commit_group / wait_group   batch the products issued so far / wait until at most N batches run
//   wgmma.fence                       order register writes (rescaled accumulators, new A fragments) first
//   fence.proxy.async                 make cp.async's writes to shared memory visible to the tensor cores
//
// Shared-memory tiles use a swizzle the descriptors understand: a (ROWS, D) tile is stored as column panels of
// (ROWS, Panels<D>::COLS). Where D is a multiple of 64 (64, 128, 256) a panel has 64 columns: a panel row is 128
// bytes, 8 rows make a 1024-byte "swizzle atom", and 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the
// 128-byte swizzle; the XOR keeps ldmatrix-like 8-row reads and the cp.async writes free of bank conflicts). At
// D = 32 and 96 a panel has 32 columns: rows of 64 bytes, atoms of 512, chunk c of row r at c ^ ((r / 2) % 4)
// (the 64-byte swizzle). Tiles start 1024-byte aligned.
//
// The two products every FlashAttention kernel is made of, for one warpgroup's 64 rows (named as
// fragments.cuh names the mma.sync ones):
//   issue_abt:  d (64 x R) = A B^T, A = 64 rows of a (A_ROWS, D) tile, B = a (R, D) tile    (S = Q K^T, dP = dO V^T,
//               and in the backward's key-major form S^T = K Q^T, dP^T = V dO^T)
//   issue_ab:   d (64 x D) += A B, A = 64 x R fp16/bf16 fragments in registers, B = a (R, D) tile
//               (O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K)
// An accumulator of 64 x N is N / 2 fp32 registers per thread, laid out as mma.sync's C fragments stacked over
// the 4 warps (warp w of the group holds rows 16w .. 16w + 15): frag::pack_a turns it into issue_ab's A.
// No host header: compiles under NVRTC and nvcc alike (sm_90a only).
#pragma once
#include "ptx.cuh"

namespace wgmma_ops {

using namespace ptx;  // smem_u32, cp_async_*, pack2, fast_exp2

// The column panels of a (ROWS, D) tile: 64 columns (the 128-byte swizzle) where D is a multiple of 64, else 32
// (the 64-byte swizzle: D = 32, 96)
template <int D>
struct Panels {
    static_assert(D % 32 == 0, "D a multiple of 32");
    static constexpr int COLS = D % 64 == 0 ? 64 : 32;  // columns of a panel
    static constexpr int ROW_BYTES = 2 * COLS;          // a panel row: the swizzle's span, 128 or 64 bytes
    static constexpr int ATOM = 8 * ROW_BYTES;          // 8 rows: the step between 8-row groups (descriptor SBO)
    static constexpr int KSTEPS = COLS / 16;            // k16 steps in a panel
    static constexpr unsigned long long MODE = D % 64 == 0 ? 1 : 2;  // descriptor bits 62-63: 128 B, 64 B
};

// byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1) of row `row` in a 128-byte-swizzled (ROWS, D) tile
template <int ROWS>
__device__ __forceinline__ unsigned sw128(int row, int chunk) {
    return (chunk >> 3) * (ROWS * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}
// ... in a (ROWS, D) tile of Panels<D>: sw128 where D is a multiple of 64, else the 64-byte swizzle's
// (32-column panels; chunk c of row r at c ^ ((r / 2) % 4))
template <int ROWS, int D>
__device__ __forceinline__ unsigned swizzle(int row, int chunk) {
    if constexpr (D % 64 == 0) {
        return sw128<ROWS>(row, chunk);
    } else {
        return (chunk >> 2) * (ROWS * 64) + row * 64 + (((chunk & 3) ^ ((row >> 1) & 3)) << 4);
    }
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
            cp_async_16(tile + swizzle<ROWS, D>(r, c), in ? x + (long long)(row0 + r) * D + c * 8 : x, in ? 16 : 0);
        }
    }
}

// wgmma matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 62-63 swizzle (mode 1 =
// 128 B, 2 = 64 B). With an atom of 8 rows (1024 bytes at 128 B, 512 at 64 B):
//   K-major operand (Q, K: rows of D contiguous halves): SBO = the atom, the step between 8-row atoms; LBO unused.
//   MN-major operand (V read as B[k = key][n = d]): SBO = the atom, the step between groups of 8 keys;
//   LBO = the step between column panels along d.
__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                        unsigned long long mode = 1) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (mode << 62);
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
#define FA_D16 FA_D8(0), FA_D8(8)
#define FA_D32 FA_D16, FA_D8(16), FA_D8(24)
#define FA_D64 FA_D32, FA_D8(32), FA_D8(40), FA_D8(48), FA_D8(56)
#define FA_R8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define FA_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_D48 FA_D32, FA_D8(32), FA_D8(40)
#define FA_R48 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}"
#define FA_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA_D80 FA_D64, FA_D8(64), FA_D8(72)
#define FA_R80 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"
#define FA_D88 FA_D80, FA_D8(80)
#define FA_R88 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
               "%80, %81, %82, %83, %84, %85, %86, %87}"
#define FA_D96 FA_D88, FA_D8(88)
#define FA_R96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "  \
               "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
               "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
// SS: d (+)= A * B, A (64x16, K-major) and B (16xN) in shared memory. accumulate = 0: d = A * B.
// DA, DB, ACC: operand numbers; TB: imm-trans-b, 0 = B K-major (K, Q: S = Q K^T), 1 = B MN-major (a K or V tile
// read with its rows as the k index, as issue_ab reads its B: dQ = dS K).
#define FA_WGMMA_SS(N, AB, REGS, OPS, DA, DB, ACC, TB)                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #ACC ", 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32" AB " " REGS ", %" #DA ", %" #DB       \
                 ", p, 1, 1, 0, " #TB ";\n}\n"                                                   \
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
    static_assert(N == 32 || N == 64 || N == 128 || N == 160 || N == 176 || N == 192,
                  "n32, n64, n128, n160, n176 or n192");
    if constexpr (N == 32 && !BF16) FA_WGMMA_SS(32, ".f16.f16", FA_R16, FA_D16, 16, 17, 18, 0);
    if constexpr (N == 32 && BF16) FA_WGMMA_SS(32, ".bf16.bf16", FA_R16, FA_D16, 16, 17, 18, 0);
    if constexpr (N == 64 && !BF16) FA_WGMMA_SS(64, ".f16.f16", FA_R32, FA_D32, 32, 33, 34, 0);
    if constexpr (N == 64 && BF16) FA_WGMMA_SS(64, ".bf16.bf16", FA_R32, FA_D32, 32, 33, 34, 0);
    if constexpr (N == 128 && !BF16) FA_WGMMA_SS(128, ".f16.f16", FA_R64, FA_D64, 64, 65, 66, 0);
    if constexpr (N == 128 && BF16) FA_WGMMA_SS(128, ".bf16.bf16", FA_R64, FA_D64, 64, 65, 66, 0);
    if constexpr (N == 160 && !BF16) FA_WGMMA_SS(160, ".f16.f16", FA_R80, FA_D80, 80, 81, 82, 0);
    if constexpr (N == 160 && BF16) FA_WGMMA_SS(160, ".bf16.bf16", FA_R80, FA_D80, 80, 81, 82, 0);
    if constexpr (N == 176 && !BF16) FA_WGMMA_SS(176, ".f16.f16", FA_R88, FA_D88, 88, 89, 90, 0);
    if constexpr (N == 176 && BF16) FA_WGMMA_SS(176, ".bf16.bf16", FA_R88, FA_D88, 88, 89, 90, 0);
    if constexpr (N == 192 && !BF16) FA_WGMMA_SS(192, ".f16.f16", FA_R96, FA_D96, 96, 97, 98, 0);
    if constexpr (N == 192 && BF16) FA_WGMMA_SS(192, ".bf16.bf16", FA_R96, FA_D96, 96, 97, 98, 0);
}
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_ss_tb(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                                            int accumulate) {
    static_assert(N == 16 || N == 32 || N == 64, "n16, n32 or n64");
    if constexpr (N == 16 && !BF16) FA_WGMMA_SS(16, ".f16.f16", FA_R8, FA_D8(0), 8, 9, 10, 1);
    if constexpr (N == 16 && BF16) FA_WGMMA_SS(16, ".bf16.bf16", FA_R8, FA_D8(0), 8, 9, 10, 1);
    if constexpr (N == 32 && !BF16) FA_WGMMA_SS(32, ".f16.f16", FA_R16, FA_D16, 16, 17, 18, 1);
    if constexpr (N == 32 && BF16) FA_WGMMA_SS(32, ".bf16.bf16", FA_R16, FA_D16, 16, 17, 18, 1);
    if constexpr (N == 64 && !BF16) FA_WGMMA_SS(64, ".f16.f16", FA_R32, FA_D32, 32, 33, 34, 1);
    if constexpr (N == 64 && BF16) FA_WGMMA_SS(64, ".bf16.bf16", FA_R32, FA_D32, 32, 33, 34, 1);
}
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db) {
    static_assert(N == 32 || N == 64 || N == 96 || N == 128, "n32, n64, n96 or n128");
    if constexpr (N == 32 && !BF16) FA_WGMMA_RS(32, ".f16.f16", FA_R16, FA_D16, 16, 17, 18, 19, 20, 21);
    if constexpr (N == 32 && BF16) FA_WGMMA_RS(32, ".bf16.bf16", FA_R16, FA_D16, 16, 17, 18, 19, 20, 21);
    if constexpr (N == 96 && !BF16) FA_WGMMA_RS(96, ".f16.f16", FA_R48, FA_D48, 48, 49, 50, 51, 52, 53);
    if constexpr (N == 96 && BF16) FA_WGMMA_RS(96, ".bf16.bf16", FA_R48, FA_D48, 48, 49, 50, 51, 52, 53);
    if constexpr (N == 64 && !BF16) FA_WGMMA_RS(64, ".f16.f16", FA_R32, FA_D32, 32, 33, 34, 35, 36, 37);
    if constexpr (N == 64 && BF16) FA_WGMMA_RS(64, ".bf16.bf16", FA_R32, FA_D32, 32, 33, 34, 35, 36, 37);
    if constexpr (N == 128 && !BF16) FA_WGMMA_RS(128, ".f16.f16", FA_R64, FA_D64, 64, 65, 66, 67, 68, 69);
    if constexpr (N == 128 && BF16) FA_WGMMA_RS(128, ".bf16.bf16", FA_R64, FA_D64, 64, 65, 66, 67, 68, 69);
}
#undef FA_WGMMA_SS
#undef FA_WGMMA_RS

// d (64 x R) = A B^T for a warpgroup: D / 16 k-steps of m64n(R)k16, both operands K-major in shared memory.
// sA_wg: row 0 of the warpgroup's 64 rows in a (A_ROWS, D) tile; sB: a (R, D) tile. k-step kk reads columns
// 16kk .. 16kk + 15: panel kk / KS, byte 32 * (kk % KS) of its rows (KS = 4 k-steps in a 64-column panel's 128-byte
// rows, 2 in a 32-column panel's 64). Committed as one group.
template <int D, int A_ROWS, int R, bool BF16>
__device__ __forceinline__ void issue_abt(float (&d)[R / 2], unsigned sA_wg, unsigned sB) {
    using P = Panels<D>;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int panel = kk / P::KSTEPS, at = (kk % P::KSTEPS) * 32;
        const unsigned long long da = make_desc(sA_wg + panel * A_ROWS * P::ROW_BYTES + at, 16, P::ATOM, P::MODE);
        const unsigned long long db = make_desc(sB + panel * R * P::ROW_BYTES + at, 16, P::ATOM, P::MODE);
        wgmma_ss<R, BF16>(d, da, db, kk > 0);
    }
    wgmma_commit();
}

// d (64 x D) += A B for a warpgroup: R / 16 k-steps of m64n(D)k16, A (64 x R) as fp16/bf16 fragments in
// registers, B = a (R, D) tile read MN-major (its rows are the k index); k-step kk takes rows 16kk .. 16kk + 15
// = two 8-row atoms (16 panel rows: 2048 bytes at 128 B a row, 1024 at 64), LBO = R * (panel row) steps between
// the column panels along D (D = 96: one m64n96k16 over three 32-column panels).
// D = 256 is two m64n128k16 per k-step, on columns 0 .. 127 (panels 0, 1; d[0 .. 63]) and 128 .. 255 (panels 2,
// 3; d[64 .. 127]): an accumulator's flat index runs along the columns, 4 per n8 tile. Committed as one group.
template <int D, int R, bool BF16>
__device__ __forceinline__ void issue_ab(float (&d)[D / 2], const unsigned (&a)[R / 16][4], unsigned sB) {
    using P = Panels<D>;
    constexpr int N = D <= 128 ? D : 128;  // columns per instruction
#pragma unroll
    for (int kk = 0; kk < R / 16; ++kk)
#pragma unroll
        for (int h = 0; h < D / N; ++h)
            wgmma_rs<N, BF16>(reinterpret_cast<float (&)[N / 2]>(d[h * (N / 2)]), a[kk],
                              make_desc(sB + h * (N / P::COLS) * R * P::ROW_BYTES + kk * 16 * P::ROW_BYTES,
                                        R * P::ROW_BYTES, P::ATOM, P::MODE));
    wgmma_commit();
}

// d (64 x N) = A B for a warpgroup, both operands in shared memory: R / 16 k-steps of m64n(N)k16.
// A: the warpgroup's 64 rows of a (A_ROWS, R) tile of 64-column panels (128-byte swizzle; K-major: its columns are
// the k index), read as issue_abt reads its A; B: columns [c0, c0 + N) of a (R, D) tile of Panels<D>, read
// MN-major as issue_ab reads its B. The descriptor may start inside a panel row (the swizzle is a function of the
// address: c0 = 32 at D = 64 starts 64 bytes into the 128-byte rows), but its N = 16, 32 or 64 columns must stay
// inside the panel. Used for dQ += dS K with dS from shared memory. ab_ss issues, issue_ab_ss also commits.
template <int D, int A_ROWS, int R, int N, bool BF16>
__device__ __forceinline__ void ab_ss(float (&d)[N / 2], unsigned sA_wg, unsigned sB, int c0) {
    using P = Panels<D>;
    const unsigned sB_col = sB + (c0 / P::COLS) * R * P::ROW_BYTES + (c0 % P::COLS) * 2;
#pragma unroll
    for (int kk = 0; kk < R / 16; ++kk) {
        const unsigned long long da = make_desc(sA_wg + (kk / 4) * A_ROWS * 128 + (kk % 4) * 32, 16, 1024);
        const unsigned long long db = make_desc(sB_col + kk * 16 * P::ROW_BYTES, R * P::ROW_BYTES, P::ATOM, P::MODE);
        wgmma_ss_tb<N, BF16>(d, da, db, kk > 0);
    }
}
template <int D, int A_ROWS, int R, int N, bool BF16>
__device__ __forceinline__ void issue_ab_ss(float (&d)[N / 2], unsigned sA_wg, unsigned sB, int c0) {
    ab_ss<D, A_ROWS, R, N, BF16>(d, sA_wg, sB, c0);
    wgmma_commit();
}

// stmatrix .trans: the warp's four 8x8 16-bit matrices r[0..3] (mma.sync fragments: lane l holds row l / 4,
// columns 2 (l % 4), +1 of each), each stored transposed: row j of matrix m in shared memory is column j of
// r[m], 16 bytes at the address lane 8m + j passes (PTX ISA, "stmatrix"; sm_90)
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

}  // namespace wgmma_ops
