"""Dropout's keep rule in the Triton kernels: ``tl.rand(seed, offset)``, bit for bit, with fewer multiplies.

Philox4x32-10 (Salmon et al., SC 2011) as ``tl.rand`` runs it, and as ``flash_attention_py/philox.py`` (NumPy,
torch) and ``flash_attention_cuda/kernels/philox.cuh`` (CUDA) run it too:

    key     (k0, k1)         = the 64-bit seed's low and high 32-bit halves
    counter (c0, c1, c2, c3) = (offset's low 32 bits, its high 32 bits, 0, 0)
    10 rounds of  c0, c1, c2, c3 = hi(B*c2) ^ c1 ^ k0, lo(B*c2), hi(A*c0) ^ c3 ^ k1, lo(A*c0)
                  k0 += 0x9E3779B9, k1 += 0xBB67AE85          (A = 0xD2511F53, B = 0xCD9E8D57, mod 2^32)
    uniform: c0 read as int32 x; x < 0 -> -x - 1; u = x * 4.6566127342e-10 (float32), in [0, 1)

The only difference from ``tl.rand`` is how a product is written. ``tl.rand`` takes each round's hi() and lo()
as two multiplies (``umulhi`` and ``mul``), which the compiler keeps as two instructions (IMAD.HI and IMAD):
32 per evaluation in the SASS. Here each product is one 32 x 32 -> 64-bit multiply of zero-extended words,
whose high and low halves are hi() and lo(): ptxas issues one IMAD.WIDE.U32 for it. Round 1 multiplies
c2 = 0 and c3 = 0, which costs nothing, and round 10 needs only c0 (hi(B*c2)). ``tools/sass_summary.py
--triton --philox`` counts what the kernels issue.
"""
import triton
import triton.language as tl

PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)
PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)


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
def philox_uniform(seed, offset):
    """tl.rand(seed, offset), bit for bit: float32 in [0, 1), offset an int64 block, seed an int scalar."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    # the counter: (offset's low word, its high word, 0, 0)
    c0 = offset.to(tl.uint32)
    c1 = (offset >> 32).to(tl.uint32)
    # round 1: hi(B*0) = lo(B*0) = 0, so c0 = c1 ^ k0, c1 = 0, c2 = hi(A*c0) ^ k1, c3 = lo(A*c0)
    hi_a, lo_a = _wide(c0, PHILOX_ROUND_A)
    c0 = c1 ^ k0
    c1 = tl.zeros_like(lo_a)
    c2 = hi_a ^ k1
    c3 = lo_a
    k0 += PHILOX_KEY_A
    k1 += PHILOX_KEY_B
    # rounds 2 to 9
    for _ in tl.static_range(8):
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
    x = (hi_b ^ c1 ^ k0).to(tl.int32, bitcast=True)
    # tl.rand's uint32 -> [0, 1): fold the sign, then scale
    x = tl.where(x < 0, -x - 1, x)
    return x * 4.6566127342e-10


@triton.jit
def dropout_keep(seed, offset, dropout_p):
    """Z = tl.rand(seed, offset) >= dropout_p: True where the score at ``offset`` survives dropout."""
    return philox_uniform(seed, offset) >= dropout_p
