// ============================================================================================
// Lab 5, part 2: one tensor-core tile S_ij = Q_i K_j^T (16 x 8) with ldmatrix and mma.sync.m16n8k16.
//
// Part 1 (lab5_tensor_cores.py) wrote down which lane holds which element of each fragment. Here one
// warp does it for real, the way flash_attention_cuda/kernels/mma.cu computes every S_ij:
//
//   A = Q_i   16 query rows x 16 head dims, fp16, row-major in shared memory (a_s)
//   B = K_j^T 16 head dims  x  8 keys;  in shared memory as K_j: 8 keys x 16 dims, row-major (b_s)
//   S = A B   16 x 8, fp32:  S[row][key] = sum_d Q_i[row][d] K_j[key][d]
//
// Write the four TODO(lab5) steps below, then delete the static_assert line (it stops the compiler
// until you have):
//   1. ldmatrix.x4 the A fragment into a[0..3]: lane 8 i + r passes the shared address of row r of
//      8x8 matrix i; register i of every lane receives matrix i (your ldmatrix_a_address of part 1).
//   2. ldmatrix.x2 the B fragment into b[0..1] from b_s (your ldmatrix_b_address): lanes 0..15 pass the
//      addresses; lanes 16..31 must still pass a valid shared address (it is not used).
//   3. mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: c = a b + c.
//   4. Store c[0..3] to S (16 x 8, row-major) by the C/D layout (your c_fragment of part 1).
// Tools: kernels/ptx.cuh (on the include path): ptx::smem_u32(pointer) gives the 32-bit shared address
// that ldmatrix takes, ptx::ldmatrix_x4(regs, addr), ptx::mma_16816<false>(c, a, b0, b1); for .x2 write
// the inline PTX yourself:
//   asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
// Everything outside the TODO block is given. The grader checks that your PTX uses ldmatrix and
// mma.sync.m16n8k16, then compares S with Q_i K_j^T on random fp16 tiles (on a GPU, compute
// capability 8.0 or newer). Without a GPU it only compiles the kernel (nvcc) and says so: never a pass.
//     python notebooks/labs/grade.py lab5
// ============================================================================================
#include "ptx.cuh"

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
    const int group = lane >> 2, tig = lane % 4;  // groupID and threadID_in_group of the PTX ISA
    // TODO(lab5) 1-4: the A and B fragment loads, the mma, the store of S; then delete the next line.
    static_assert(sizeof(a) < 0, "lab5 TODO: the fragment loads, the mma.sync and the store are not written yet");
}
