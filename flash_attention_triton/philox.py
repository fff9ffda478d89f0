"""Dropout's keep rule in the Triton kernels: ``tl.rand(seed, offset)``, bit for bit, with fewer multiplies.

Philox4x32-10 (Salmon et al., SC 2011) as ``tl.rand`` runs it, and as ``flash_attention_py/philox.py`` (NumPy,
torch) and ``flash_attention_cuda/kernels/philox.cuh`` (CUDA) run it too:

    key     (k0, k1)         = the 64-bit seed's low and high 32-bit halves
    counter (c0, c1, c2, c3) = (offset's low 32 bits, its high 32 bits, 0, 0)
    10 rounds of  c0, c1, c2, c3 = hi(B*c2) ^ c1 ^ k0, lo(B*c2), hi(A*c0) ^ c3 ^ k1, lo(A*c0)
                  k0 += 0x9E3779B9, k1 += 0xBB67AE85          (A = 0xD2511F53, B = 0xCD9E8D57, mod 2^32)
    uniform: c0 read as int32 x; x < 0 -> -x - 1; u = x * 4.6566127342e-10 (float32), in [0, 1)

Two things differ from ``tl.rand``, neither in the bits:

* how a product is written. ``tl.rand`` takes each round's hi() and lo() as two multiplies (``umulhi`` and
  ``mul``), which the compiler keeps as two instructions (IMAD.HI and IMAD): 32 per evaluation in the SASS. Here
  each product is one 32 x 32 -> 64-bit multiply of zero-extended words, whose high and low halves are hi() and
  lo(): ptxas issues one IMAD.WIDE.U32 for it. Round 1 multiplies c2 = 0 and c3 = 0, which costs nothing, and
  round 10 needs only c0 (hi(B*c2)): 18. ``tools/sass_summary.py --triton --philox`` counts what the kernels issue.
* how keep is decided. ``dropout_keep`` tests Philox's word against ``keep_threshold(p)``, an integer taken once
  per kernel, instead of mapping every word to a float and comparing: uniform(word) >= p <=> T <= word <= ~T.
"""
import triton
import triton.language as tl

PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)
PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)
PHILOX_KEY_A2 = tl.constexpr((2 * 0x9E3779B9) % 2**32)  # two rounds' key increments, mod 2**32
PHILOX_KEY_B2 = tl.constexpr((2 * 0xBB67AE85) % 2**32)


if triton.knobs.runtime.interpret:  # TRITON_INTERPRET=1, read as the kernels' decorators read it
    @triton.jit
    def _wide(word, M: tl.constexpr):
        """(hi(M * word), lo(M * word)) of the 64-bit product of two uint32 (the interpreter: NumPy's uint64)."""
        prod = word.to(tl.uint64) * M
        return (prod >> 32).to(tl.uint32), prod.to(tl.uint32)
else:
    @triton.jit
    def _wide(word, M: tl.constexpr):
        """(hi(M * word), lo(M * word)) of the 64-bit product of two uint32: one ``mul.wide.u32``.

        Written in PTX because LLVM splits a zero-extended 64-bit product back into ``mul.hi.u32`` and a low
        multiply, which ptxas then mostly keeps as two instructions.
        """
        if M == PHILOX_ROUND_A:
            return tl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xD2511F53; mov.b64 {$1, $0}, t; }",
                                             "=r,=r,r", [word], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)
        else:
            tl.static_assert(M == PHILOX_ROUND_B)
            return tl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xCD9E8D57; mov.b64 {$1, $0}, t; }",
                                             "=r,=r,r", [word], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def _seed_keys(seed):
    """The key (k0, k1): the 64-bit seed's low and high 32-bit halves."""
    seed = seed.to(tl.uint64)
    return (seed & 0xFFFFFFFF).to(tl.uint32), (seed >> 32).to(tl.uint32)


@triton.jit
def _philox_finish(k0, k1, c2_xor, c3_high, hi_a, lo_a):
    """The first word of Philox4x32-10 from the high word's share (``_philox_high``) and round 1's product
    A * lo = (hi_a, lo_a), lo the offset's low word."""
    # round 1 (k0, k1): c0 = hi ^ k0 (in the share), c1 = 0, c2 = hi(A lo) ^ k1, c3 = lo(A lo)
    c2 = hi_a ^ k1
    c3 = lo_a
    # round 2: c0 = hi(B c2) ^ c1 ^ k0 with c1 = 0, c1 = lo(B c2), c2 = hi(A c0) ^ c3 ^ k1, c3 = lo(A c0)
    hi_b, lo_b = _wide(c2, PHILOX_ROUND_B)
    c0 = hi_b ^ (k0 + PHILOX_KEY_A)
    c1 = lo_b
    c2 = c2_xor ^ c3
    c3 = tl.zeros_like(lo_b) + c3_high
    k0 += PHILOX_KEY_A2
    k1 += PHILOX_KEY_B2
    # rounds 3 to 9
    for _ in tl.static_range(7):
        hi_b, lo_b = _wide(c2, PHILOX_ROUND_B)
        hi_a, lo_a = _wide(c0, PHILOX_ROUND_A)
        c0 = hi_b ^ c1 ^ k0
        c1 = lo_b
        c2 = hi_a ^ c3 ^ k1
        c3 = lo_a
        k0 += PHILOX_KEY_A
        k1 += PHILOX_KEY_B
    # round 10: only the first word is used
    hi_b, lo_b = _wide(c2, PHILOX_ROUND_B)
    return hi_b ^ c1 ^ k0


@triton.jit
def _philox_word(k0, k1, offset):
    """The first word of Philox4x32-10 at each int64 offset, every product its own."""
    hi_a, lo_a = _wide(offset.to(tl.uint32), PHILOX_ROUND_A)
    c0 = (offset >> 32).to(tl.uint32) ^ k0  # round 1's c0; round 2 multiplies it
    hi_2, lo_2 = _wide(c0, PHILOX_ROUND_A)
    return _philox_finish(k0, k1, hi_2 ^ (k1 + PHILOX_KEY_B), lo_2, hi_a, lo_a)


@triton.jit
def _word_to_uniform(word):
    """tl.rand's uint32 -> [0, 1): fold the sign of the int32 reading, then scale."""
    x = word.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, -x - 1, x)
    return x * 4.6566127342e-10


@triton.jit
def philox_uniform(seed, offset):
    """tl.rand(seed, offset), bit for bit: float32 in [0, 1), offset an int64 block, seed an int scalar."""
    k0, k1 = _seed_keys(seed)
    return _word_to_uniform(_philox_word(k0, k1, offset))


@triton.jit
def keep_threshold(dropout_p):
    """T, the smallest fold f = min(word, ~word) in [0, 2**31) with tl.rand's uniform of f >= dropout_p (a scalar;
    a binary search of 31 steps). The uniform never decreases as f grows, so uniform(word) >= p <=> f >= T <=>
    T <= word <= ~T (unsigned; T < 2**31 <= ~T) <=> word - T <= ~T - T (mod 2**32): ``dropout_keep`` tests the
    word that way, in integers. Every float32 p < 1 has such a T: the largest fold maps to 1 - 2**-24."""
    lo = tl.zeros([], dtype=tl.uint32)
    hi = lo + 0x7FFFFFFF
    for _ in tl.static_range(31):
        mid = lo + (hi - lo) // 2
        passes = _word_to_uniform(mid) >= dropout_p
        hi = tl.where(passes, mid, hi)
        lo = tl.where(passes, lo, mid + 1)
    return lo


@triton.jit
def dropout_keep(seed, offset, threshold):
    """Z = tl.rand(seed, offset) >= p, bit for bit, offset an int64 block: True where the score survives dropout.
    threshold = ``keep_threshold(p)``, taken once before the kernel's loop; the test is on Philox's word, in
    integers."""
    k0, k1 = _seed_keys(seed)
    word = _philox_word(k0, k1, offset)
    return word - threshold <= (0xFFFFFFFF - threshold) - threshold  # T <= word <= ~T
