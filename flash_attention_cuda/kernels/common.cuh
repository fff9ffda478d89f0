// common.cuh -- small helpers shared by every kernel of the CUDA ladder.
//
// No #include of any host or library header: the kernels compile unchanged under NVRTC
// (through CuPy, at run time) and under nvcc (the compile test, `nvcc -cubin`).
//
// Layout everywhere: q (B, H, Nq, D), k and v (B, H, Nk, D), o (B, H, Nq, D), all contiguous;
// lse (B, H, Nq) float32, natural log. Causal masking is aligned to the bottom-right corner:
// query i sees key j iff j <= i + Nk - Nq (a row that sees no key gives O = 0, lse = -inf).
#pragma once

#define FA_NEG_INF (__int_as_float(0xff800000))
#define FA_LOG2E 1.4426950408889634f  // log2(e): exp(x) = exp2(x * log2(e))
#define FA_LN2 0.6931471805599453f    // ln(2):   log(x) = log2(x) * ln(2)

namespace fa {

// exp2(x - m), but 0 when m is -inf (a row that has seen no key yet): never NaN.
__device__ __forceinline__ float exp2_minus(float x, float m) {
    return m == FA_NEG_INF ? 0.0f : exp2f(x - m);
}

// Reductions over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float warp_reduce_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}
__device__ __forceinline__ float warp_reduce_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Is key j visible to query i?  Causal: j <= i + (Nk - Nq).  Always: j < Nk.
__device__ __forceinline__ bool visible(int i, int j, int Nk, int causal_offset, bool causal) {
    return j < Nk && (!causal || j <= i + causal_offset);
}

// One past the last key that queries [.., q_end) can see (the K/V loop stops there).
__device__ __forceinline__ int kv_end_for(int q_end, int Nq, int Nk, bool causal) {
    if (!causal) return Nk;
    int e = q_end + (Nk - Nq);
    return e < 0 ? 0 : (e > Nk ? Nk : e);
}

}  // namespace fa
