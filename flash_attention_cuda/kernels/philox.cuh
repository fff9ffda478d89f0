// philox.cuh -- dropout's random numbers: Triton's tl.rand(seed, offset), bit for bit, in CUDA.
// The same generator as flash_attention_py/philox.py (NumPy, torch) and tl.rand in the Triton kernels.
//
// Keep rule for the score (b, h, i, j) (batch, query head, query row, key column), in every backend:
//     offset = ((b * Hq + h) * Nq + i) * Nk + j            (64-bit; Hq = number of query heads)
//     keep   = philox_uniform(seed_lo, seed_hi, offset) >= p      (p as float32); kept P_ij scale by 1/(1-p)
//
// philox_uniform is Philox4x32-10 (Salmon et al., SC 2011) as tl.rand runs it:
//   key     (k0, k1)         = the 64-bit seed's low and high 32-bit halves (seed_lo, seed_hi)
//   counter (c0, c1, c2, c3) = (offset's low 32 bits, its high 32 bits, 0, 0)
//   10 rounds of  c0, c1, c2, c3 = hi(B*c2) ^ c1 ^ k0, lo(B*c2), hi(A*c0) ^ c3 ^ k1, lo(A*c0)
//                 k0 += 0x9E3779B9, k1 += 0xBB67AE85          (A = 0xD2511F53, B = 0xCD9E8D57, mod 2^32)
//   uniform: c0 read as int32 x; x < 0 -> ~x (= -x - 1); u = float(x) * 0x1.fffffep-32f, in [0, 1)
//
// No #include: compiles under NVRTC and nvcc alike; on the host (tests) with __device__ and
// __forceinline__ defined away and __umulhi given as a plain function.
#pragma once

namespace fa {

// tl.rand's uint32 -> [0, 1) map: fold the sign of the int32 reading, then scale by 0x1.fffffep-32
// (the largest float32 with (2^31 - 1) * scale < 1). Rounding: int -> float and the product to nearest.
__device__ __forceinline__ float uint32_to_uniform(unsigned word) {
    const unsigned folded = word >= 0x80000000u ? ~word : word;  // < 2^31
    return static_cast<float>(static_cast<int>(folded)) * 0x1.fffffep-32f;
}

// tl.rand(seed, offset): seed = (seed_hi << 32) | seed_lo, offset a 64-bit (two's complement) counter.
__device__ __forceinline__ float philox_uniform(unsigned seed_lo, unsigned seed_hi, long long offset) {
    constexpr unsigned KEY_A = 0x9E3779B9u, KEY_B = 0xBB67AE85u;      // key increments per round
    constexpr unsigned ROUND_A = 0xD2511F53u, ROUND_B = 0xCD9E8D57u;  // round multipliers
    const unsigned long long bits = static_cast<unsigned long long>(offset);
    unsigned c0 = static_cast<unsigned>(bits), c1 = static_cast<unsigned>(bits >> 32), c2 = 0u, c3 = 0u;
    unsigned k0 = seed_lo, k1 = seed_hi;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        // one 32 x 32 -> 64-bit product each (mul.wide.u32: one IMAD.WIDE.U32), not a high and a low multiply
        const unsigned long long prod_b = static_cast<unsigned long long>(ROUND_B) * c2;
        const unsigned long long prod_a = static_cast<unsigned long long>(ROUND_A) * c0;
        const unsigned hi_b = static_cast<unsigned>(prod_b >> 32), lo_b = static_cast<unsigned>(prod_b);
        const unsigned hi_a = static_cast<unsigned>(prod_a >> 32), lo_a = static_cast<unsigned>(prod_a);
        c0 = hi_b ^ c1 ^ k0;
        c1 = lo_b;
        c2 = hi_a ^ c3 ^ k1;
        c3 = lo_a;
        k0 += KEY_A;
        k1 += KEY_B;
    }
    return uint32_to_uniform(c0);
}

// The dropout offset of score (b, h, i, j); 64-bit so that B*Hq*Nq*Nk may exceed 2^31.
__device__ __forceinline__ long long dropout_offset(int b, int h, int i, int j, int Hq, int Nq, int Nk) {
    return ((static_cast<long long>(b) * Hq + h) * Nq + i) * static_cast<long long>(Nk) + j;
}

// The same offset from bh = b * Hq + h (the kernels' grid row of a query head): (bh * Nq + i) * Nk + j.
__device__ __forceinline__ long long dropout_offset(long long bh, int i, int j, int Nq, int Nk) {
    return (bh * Nq + i) * static_cast<long long>(Nk) + j;
}

// Does P[b, h, i, j] (offset from dropout_offset) survive dropout with probability p of dropping?
__device__ __forceinline__ bool dropout_keep(unsigned seed_lo, unsigned seed_hi, long long offset, float p) {
    return philox_uniform(seed_lo, seed_hi, offset) >= p;
}

}  // namespace fa
