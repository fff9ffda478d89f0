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
// The kernels draw the same bits with less work (fragments.cuh, DropoutTile):
//   * philox_high + philox_finish split the rounds at what the offset's high word alone decides: round 2's
//     A-product, A * (hi ^ k0). Scores whose offsets share a high word (a thread's scores in a tile, but for
//     the rare tile that straddles a multiple of 2^32) share that product, and round 1's A * lo is a 64-bit
//     add to the product at the first offset: 16 multiplies a score instead of 18.
//   * KeepTest decides keep on the final word with integers: uniform(word) >= p  <=>  T <= word <= ~T.
//
// No #include: compiles under NVRTC and nvcc alike; on the host (tests) with __device__ and
// __forceinline__ defined away and __umulhi given as a plain function.
#pragma once

namespace fa {

constexpr unsigned PHILOX_KEY_A = 0x9E3779B9u, PHILOX_KEY_B = 0xBB67AE85u;      // key increments per round
constexpr unsigned PHILOX_ROUND_A = 0xD2511F53u, PHILOX_ROUND_B = 0xCD9E8D57u;  // round multipliers

// tl.rand's uint32 -> [0, 1) map: fold the sign of the int32 reading, then scale by 0x1.fffffep-32
// (the largest float32 with (2^31 - 1) * scale < 1). Rounding: int -> float and the product to nearest.
__device__ __forceinline__ float uint32_to_uniform(unsigned word) {
    const unsigned folded = word >= 0x80000000u ? ~word : word;  // < 2^31
    return static_cast<float>(static_cast<int>(folded)) * 0x1.fffffep-32f;
}

// What rounds 1 and 2 take from the counter's high word alone. Round 1 multiplies only c0 = lo (B * c2 = 0)
// and leaves c0 = hi ^ k0, c1 = 0; round 2's A-product is then A * (hi ^ k0), the same for every offset with
// this high word.
struct PhiloxHigh {
    unsigned c2_xor;  // hi(A (hi ^ k0)) ^ (k1 + KEY_B): round 2's c2, before ^ c3
    unsigned c3;      // lo(A (hi ^ k0)): round 2's c3
};
__device__ __forceinline__ PhiloxHigh philox_high(unsigned seed_lo, unsigned seed_hi, unsigned hi_word) {
    const unsigned long long prod_a = static_cast<unsigned long long>(PHILOX_ROUND_A) * (hi_word ^ seed_lo);
    return PhiloxHigh{static_cast<unsigned>(prod_a >> 32) ^ (seed_hi + PHILOX_KEY_B), static_cast<unsigned>(prod_a)};
}

// The first word of Philox4x32-10 (what tl.rand maps to [0, 1)) from the high word's share (philox_high) and
// round 1's product a_lo = A * lo, lo the offset's low word (64-bit).
__device__ __forceinline__ unsigned philox_finish(unsigned seed_lo, unsigned seed_hi, PhiloxHigh high,
                                                  unsigned long long a_lo) {
    // round 1 (k0, k1): c0 = hi ^ k0 (in `high`), c1 = 0, c2 = hi(A lo) ^ k1, c3 = lo(A lo)
    const unsigned c2_1 = static_cast<unsigned>(a_lo >> 32) ^ seed_hi, c3_1 = static_cast<unsigned>(a_lo);
    // round 2 (k0 + KEY_A, k1 + KEY_B): c0 = hi(B c2) ^ c1 ^ k0 with c1 = 0, c1 = lo(B c2),
    //                                   c2 = hi(A c0) ^ c3 ^ k1, c3 = lo(A c0) (A c0 from `high`)
    const unsigned long long prod_b2 = static_cast<unsigned long long>(PHILOX_ROUND_B) * c2_1;
    unsigned c0 = static_cast<unsigned>(prod_b2 >> 32) ^ (seed_lo + PHILOX_KEY_A), c1 = static_cast<unsigned>(prod_b2);
    unsigned c2 = high.c2_xor ^ c3_1, c3 = high.c3;
    unsigned k0 = seed_lo + 2 * PHILOX_KEY_A, k1 = seed_hi + 2 * PHILOX_KEY_B;
#pragma unroll
    for (int round = 2; round < 10; ++round) {
        // one 32 x 32 -> 64-bit product each (mul.wide.u32: one IMAD.WIDE.U32), not a high and a low multiply
        const unsigned long long prod_b = static_cast<unsigned long long>(PHILOX_ROUND_B) * c2;
        const unsigned long long prod_a = static_cast<unsigned long long>(PHILOX_ROUND_A) * c0;
        const unsigned hi_b = static_cast<unsigned>(prod_b >> 32), lo_b = static_cast<unsigned>(prod_b);
        const unsigned hi_a = static_cast<unsigned>(prod_a >> 32), lo_a = static_cast<unsigned>(prod_a);
        c0 = hi_b ^ c1 ^ k0;
        c1 = lo_b;
        c2 = hi_a ^ c3 ^ k1;
        c3 = lo_a;
        k0 += PHILOX_KEY_A;
        k1 += PHILOX_KEY_B;
    }
    return c0;  // round 10 needs only hi(B c2): the compiler drops its A-product
}

// The first word of Philox4x32-10 at one 64-bit (two's complement) offset, seed = (seed_hi << 32) | seed_lo.
__device__ __forceinline__ unsigned philox_word(unsigned seed_lo, unsigned seed_hi, long long offset) {
    const unsigned long long bits = static_cast<unsigned long long>(offset);
    return philox_finish(seed_lo, seed_hi, philox_high(seed_lo, seed_hi, static_cast<unsigned>(bits >> 32)),
                         static_cast<unsigned long long>(PHILOX_ROUND_A) * static_cast<unsigned>(bits));
}

// tl.rand(seed, offset)
__device__ __forceinline__ float philox_uniform(unsigned seed_lo, unsigned seed_hi, long long offset) {
    return uint32_to_uniform(philox_word(seed_lo, seed_hi, offset));
}

// The keep test on the word, in integers. uniform(word) >= p depends on word's fold f = min(word, ~word)
// alone and never decreases as f grows (both roundings are monotone). With T the smallest f in [0, 2^31) that
// passes, keep <=> f >= T <=> T <= word <= ~T (unsigned; T < 2^31 <= ~T) <=> word - T <= ~T - T (mod 2^32).
// Every float32 p < 1 has such a T: the largest fold, 2^31 - 1, maps to 1 - 2^-24.
struct KeepTest {
    unsigned T, span;  // span = ~T - T
    __device__ __forceinline__ bool keeps(unsigned word) const { return word - T <= span; }
};
__device__ __forceinline__ KeepTest keep_test(float p) {
    unsigned lo = 0u, hi = 0x7FFFFFFFu;  // T in [lo, hi]: a binary search, 31 steps
    while (lo < hi) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (uint32_to_uniform(mid) >= p) hi = mid; else lo = mid + 1;
    }
    return KeepTest{lo, ~lo - lo};
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
// (The rule as written, in floats; the kernels take KeepTest's integer form of it.)
__device__ __forceinline__ bool dropout_keep(unsigned seed_lo, unsigned seed_hi, long long offset, float p) {
    return philox_uniform(seed_lo, seed_hi, offset) >= p;
}

}  // namespace fa
