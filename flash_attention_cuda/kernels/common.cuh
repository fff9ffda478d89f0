// common.cuh -- small helpers shared by every kernel of the CUDA ladder.
//
// No #include of any host or library header: the kernels compile unchanged under NVRTC
// (through CuPy, at run time) and under nvcc (the compile test, `nvcc -cubin`).
//
// Layout everywhere: q (B, H, Nq, D), k and v (B, H, Nk, D), o (B, H, Nq, D), all contiguous;
// lse (B, H, Nq) float32, natural log. Which keys a query sees is masks.cuh's rule (fa::Mask); a row that
// sees no key gives O = 0, lse = -inf.
#pragma once

#define FA_NEG_INF (__int_as_float(0xff800000))
#define FA_LOG2E 1.4426950408889634f  // log2(e): exp(x) = exp2(x * log2(e))
#define FA_LN2 0.6931471805599453f    // ln(2):   log(x) = log2(x) * ln(2)

namespace fa {

#define FA_POS_INF (__int_as_float(0x7f800000))
#define FA_NAN (__int_as_float(0x7fc00000))

// exp2(x - m), but 0 when m is -inf (a row that has seen no key yet, or only -inf scores) instead of
// exp2(-inf + inf) = NaN. A NaN score stays NaN even then: fmaxf drops NaN, so m can be -inf next to a NaN x.
__device__ __forceinline__ float exp2_minus(float x, float m) {
    return m == FA_NEG_INF ? (x != x ? x : 0.0f) : exp2f(x - m);
}

// The epilogue of every forward kernel, with the reference's non-finite semantics:
//   l = 0   (no key seen, or only -inf scores):       O = 0,   lse = -inf
//   l = NaN (a NaN score, or exp2(inf - inf)):        O = NaN, lse = +inf if m = +inf (a +inf score), else NaN
// (`l > 0 ? ... : 0` would be false for NaN and silently turn a NaN row into 0 / -inf.)
__device__ __forceinline__ float inv_row_sum(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }
__device__ __forceinline__ float row_lse(float m2, float l) {  // m2: the row max in log2 units; natural log out
    return l == 0.0f ? FA_NEG_INF : (m2 == FA_POS_INF ? FA_POS_INF : (m2 + log2f(l)) * FA_LN2);
}

// The backward's lse in log2 units for P = exp2(S * scale_log2 - lse2): a row with a +inf score (lse = +inf) has
// P = NaN everywhere, as in the reference (softmax of a row holding +inf is NaN), so lse2 = NaN there.
__device__ __forceinline__ float lse2_backward(float lse) {
    return lse == FA_POS_INF ? FA_NAN : lse * FA_LOG2E;
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

}  // namespace fa
