// Lab 5, part 2: one tensor-core tile S_ij = Q_i K_j^T (16 x 8) with ldmatrix and mma.sync.m16n8k16.
// Solution. See notebooks/labs/lab5_mma_tile.cu for the exercise text.
#include "ptx.cuh"

// ldmatrix.x2: two 8 x 8 matrices of halves; lanes 0..15 give the row addresses (ptx.cuh has only .x4)
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

extern "C" __global__ void lab5_mma_tile(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                         float* __restrict__ S) {
    __shared__ __align__(16) unsigned short a_s[16][16];  // Q_i: 16 rows x 16 dims, row-major
    __shared__ __align__(16) unsigned short b_s[8][16];   // K_j: 8 keys x 16 dims, row-major
    const int lane = threadIdx.x;                         // one warp
    for (int e = lane; e < 16 * 16; e += 32) a_s[e / 16][e % 16] = A[e];
    for (int e = lane; e < 8 * 16; e += 32) b_s[e / 16][e % 16] = B[e];
    __syncwarp();

    unsigned a[4], b[2];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int group = lane >> 2, tig = lane % 4;

    // 1. A fragment: lane 8 i + r points at row r of matrix i = the 8x8 block (rows 8 (i & 1).., cols 8 (i >> 1)..)
    const int mat = lane / 8, r = lane % 8;
    ptx::ldmatrix_x4(a, ptx::smem_u32(&a_s[r + 8 * (mat & 1)][8 * (mat >> 1)]));
    // 2. B fragment (B = K_j^T): register j is K[0:8, 8 j : 8 j + 8]; lanes 0..15 give its rows
    //    (lanes 16..31 are ignored by .x2 but must still hold a valid shared address)
    const int lb = lane % 16;
    ldmatrix_x2(b, ptx::smem_u32(&b_s[lb % 8][8 * (lb / 8)]));
    // 3. c += a b on the tensor core
    ptx::mma_16816<false>(c, a, b[0], b[1]);
    // 4. D fragment: c0, c1 at (groupID, 2 tig + 0/1), c2, c3 eight rows further down
    S[group * 8 + 2 * tig] = c[0];
    S[group * 8 + 2 * tig + 1] = c[1];
    S[(group + 8) * 8 + 2 * tig] = c[2];
    S[(group + 8) * 8 + 2 * tig + 1] = c[3];
}
