"""Dropout's random numbers: Triton's ``tl.rand``, bit for bit, in NumPy and in torch.

Every backend that applies dropout to the attention probabilities P_ij makes the same keep decision
for the score (b, h, i, j) (batch b, query head h, query row i, key column j):

    offset = ((b * Hq + h) * Nq + i) * Nk + j          (int64; Hq = number of query heads)
    keep   = tl.rand(seed, offset) >= dropout_p         (dropout_p rounded to float32, as a kernel's float)

and a kept probability is scaled by 1 / (1 - dropout_p). The same (seed, offset) gives the same bit in every
language: Triton (``tl.rand``), the CUDA kernels (``flash_attention_cuda/kernels/philox.cuh``) and this
module, which the NumPy and torch rungs and the tests use.

``tl.rand(seed, offset)`` is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC 2011) followed by a map of the first output word to [0, 1):

* key    (k0, k1) = (seed & 0xFFFFFFFF, seed >> 32): the seed is taken as a uint64 and split into its
  two 32-bit halves. Seeds >= 2**32 therefore do matter: their high half is the second key word, so
  seed and seed + 2**32 give different streams. A seed must lie in [0, 2**64) (a kernel would take a
  negative one modulo 2**64; here it is an error).
* counter (c0, c1, c2, c3) = (offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF, 0, 0): the int64
  offset's two halves (two's complement bits).
* 10 rounds, each (with A = 0xD2511F53, B = 0xCD9E8D57, all arithmetic modulo 2**32)::

      c0, c1, c2, c3 = hi(B * c2) ^ c1 ^ k0,  lo(B * c2),  hi(A * c0) ^ c3 ^ k1,  lo(A * c0)
      k0, k1 = k0 + 0x9E3779B9, k1 + 0xBB67AE85

  where hi/lo are the upper/lower 32 bits of the 64-bit product.
* uniform: the first word c0, read as an int32 x, becomes x' = x if x >= 0 else -x - 1 (= ~x), in
  [0, 2**31); then u = float32(x') * float32(4.6566127342e-10), rounded to nearest in float32. The
  scale (bits 0x2FFFFFFF, 0x1.fffffep-32) is the largest float32 with float32(2**31 - 1) * scale < 1
  after rounding, so u lies in [0, 1 - 2**-24]; near 1 its values are 2**-24 apart.

Constants and layout are those of ``triton/language/random.py`` (``philox_impl``, ``randint4x``,
``uint_to_uniform_float``).

For a tiled loop: ``keep_mask(seed, dropout_p, b, h, i_idx, j_idx, Hq, Nq, Nk)`` gives the keep mask of one
S_ij / P_ij block (rows i_idx, columns j_idx), ``dropout_offsets`` its offsets.
"""
from __future__ import annotations

import numbers
import struct
import sys

import numpy as np

__all__ = ["PHILOX_KEY_A", "PHILOX_KEY_B", "PHILOX_ROUND_A", "PHILOX_ROUND_B", "N_ROUNDS", "UNIFORM_SCALE",
           "check_seed", "check_dropout_p", "uint32_to_uniform", "philox_uniform", "dropout_offsets", "keep_mask"]

PHILOX_KEY_A = 0x9E3779B9  # added to k0 each round (golden ratio)
PHILOX_KEY_B = 0xBB67AE85  # added to k1 each round (sqrt(3) - 1)
PHILOX_ROUND_A = 0xD2511F53  # multiplies c0
PHILOX_ROUND_B = 0xCD9E8D57  # multiplies c2
N_ROUNDS = 10
UNIFORM_SCALE = np.float32(4.6566127342e-10)  # == 0x1.fffffep-32: largest scale with (2**31 - 1) * scale < 1
_M32 = 0xFFFFFFFF


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_seed(seed, fn: str = "philox_uniform", name: str = "seed") -> tuple:
    """(seed_lo, seed_hi): the two 32-bit key words of ``seed``, an int in [0, 2**64)."""
    if not _is_int(seed):
        raise TypeError(f"{fn}: {name} must be an int in [0, 2**64), got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"{fn}: {name} must be in [0, 2**64) (tl.rand takes it as a uint64), got {seed}")
    return seed & _M32, seed >> 32


def check_dropout_p(p, fn: str = "keep_mask") -> float:
    """``p`` as the float32 a kernel compares against; a real number in [0, 1)."""
    if not isinstance(p, numbers.Real) or isinstance(p, (bool, np.bool_)):
        raise TypeError(f"{fn}: dropout_p must be a float in [0, 1), got {type(p).__name__} {p!r}")
    if not 0.0 <= float(p) < 1.0:  # also rejects NaN
        raise ValueError(f"{fn}: dropout_p must be in [0, 1), got {p!r}")
    p32 = _to_float32(float(p))
    if p32 >= 1.0:  # a p just below 1 that rounds up to 1.0 in float32 would drop everything
        raise ValueError(f"{fn}: dropout_p must be in [0, 1) after rounding to float32, got {p!r} -> {p32!r}")
    return p32


def _to_float32(x: float) -> float:
    """x rounded to the nearest float32 (pure Python, so torch.compile traces it as a constant)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _is_torch(x) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    return torch is not None and isinstance(x, torch.Tensor)


def _rounds(c0, c1, k0: int, k1: int, mulhilo):
    """Philox4x32's 10 rounds on the counter (c0, c1, 0, 0); returns the first output word.

    ``mulhilo(a, x)`` -> (hi, lo) 32-bit halves of the product of the constant ``a`` and the word array ``x``.
    """
    c2 = c0 ^ c0  # zeros of c0's kind, dtype and device
    c3 = c2
    for _ in range(N_ROUNDS):
        hi_b, lo_b = mulhilo(PHILOX_ROUND_B, c2)
        hi_a, lo_a = mulhilo(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + PHILOX_KEY_A) & _M32, (k1 + PHILOX_KEY_B) & _M32
    return c0


def _mulhilo_numpy(a: int, x):
    prod = x.astype(np.uint64) * np.uint64(a)  # < 2**64: exact
    return (prod >> np.uint64(32)).astype(np.uint32), (prod & np.uint64(_M32)).astype(np.uint32)


def _mulhilo_torch(a: int, x):
    # x holds uint32 values in int64; a * x can reach 2**64, so multiply by x's 16-bit halves (< 2**48 each):
    # a * x = 2**16 * t + lo16(a * x_lo) with t = a * x_hi + (a * x_lo >> 16)
    low = a * (x & 0xFFFF)
    t = a * (x >> 16) + (low >> 16)
    return t >> 16, ((t & 0xFFFF) << 16) | (low & 0xFFFF)


def _int_array(x, fn: str, name: str):
    """``x`` as an int64 torch tensor or integer NumPy array; TypeError for anything else."""
    if _is_torch(x):
        import torch

        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError(f"{fn}: {name} must be an integer tensor (int64), got dtype {x.dtype}")
        return x.to(torch.int64)
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{fn}: {name} must be an integer array (int64), got dtype {arr.dtype}")
    return arr


def _word_to_uniform(words):
    """uint32 words (a uint32 NumPy array, or an int64 tensor holding them) -> float32 in [0, 1)."""
    if _is_torch(words):
        import torch

        x = torch.where(words >= 2**31, words ^ _M32, words)  # as int32: x < 0 -> -x - 1
        scale = torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=x.device)
        return x.to(torch.float32) * scale
    x = words.view(np.int32)
    x = x ^ (x >> 31)  # x < 0 -> -x - 1
    return x.astype(np.float32) * UNIFORM_SCALE


def _low_words(x):
    """The low 32 bits of integers ``x`` as uint32 words (NumPy) or int64 values in [0, 2**32) (torch)."""
    return x & _M32 if _is_torch(x) else (x.astype(np.uint64) & np.uint64(_M32)).astype(np.uint32)


def uint32_to_uniform(words):
    """tl.rand's map of random 32-bit words to float32 in [0, 1) (the module docstring's last step).

    words: integer NumPy array or torch tensor of any shape, taken modulo 2**32 (uint32 words, or the
    int32 reading of them). Returns float32 of the same shape and kind (and device).
    """
    return _word_to_uniform(_low_words(_int_array(words, "uint32_to_uniform", "words")))


def philox_uniform(seed: int, offsets):
    """``tl.rand(seed, offsets)``: float32 uniforms in [0, 1), the same bits as Triton's.

    seed: int in [0, 2**64) (both 32-bit halves are key words). offsets: integer array of any shape
    (NumPy array, or a torch tensor on any device; int64 offsets, taken as their two's complement bits).
    Returns float32 of the same shape and kind (and device) as ``offsets``. Vectorised: no Python loop
    over elements.
    """
    seed_lo, seed_hi = check_seed(seed, "philox_uniform")
    off = _int_array(offsets, "philox_uniform", "offsets")
    if _is_torch(off):
        c0, c1, mulhilo = off & _M32, (off >> 32) & _M32, _mulhilo_torch  # uint32 words held in int64
    else:
        bits = off.astype(np.uint64)  # two's complement bits of an int64 offset
        c0, c1, mulhilo = _low_words(bits), (bits >> np.uint64(32)).astype(np.uint32), _mulhilo_numpy
    return _word_to_uniform(_rounds(c0, c1, seed_lo, seed_hi, mulhilo))


def _check_index(name: str, value, lo: int, hi=None, fn: str = "dropout_offsets") -> int:
    if not _is_int(value):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < lo or (hi is not None and value >= hi):
        want = f"in [{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"{fn}: {name} must be {want}, got {value}")
    return int(value)


def dropout_offsets(b: int, h: int, i_idx, j_idx, Hq: int, Nq: int, Nk: int, fn: str = "dropout_offsets"):
    """int64 offsets of the scores (b, h, i, j) for i in i_idx (rows), j in j_idx (columns).

    ``((b * Hq + h) * Nq + i) * Nk + j``, shape (len(i_idx), len(j_idx)); i_idx/j_idx are 1-D NumPy
    arrays or torch tensors (the result is of the same kind and device). Rows >= Nq or columns >= Nk
    (the overhang of a last block) get offsets no real score has; mask them out with ``masks.visible``.
    """
    Hq, Nq, Nk = (_check_index(n, v, 1, fn=fn) for n, v in (("Hq", Hq), ("Nq", Nq), ("Nk", Nk)))
    b = _check_index("b", b, 0, fn=fn)
    h = _check_index("h", h, 0, Hq, fn=fn)
    i, j = _int_array(i_idx, fn, "i_idx"), _int_array(j_idx, fn, "j_idx")
    if i.ndim != 1 or j.ndim != 1:
        raise ValueError(f"{fn}: i_idx and j_idx must be 1-D index arrays, got shapes {tuple(i.shape)} and "
                         f"{tuple(j.shape)}")
    if not _is_torch(i):
        i, j = i.astype(np.int64), j.astype(np.int64)
    return ((b * Hq + h) * Nq + i[:, None]) * Nk + j[None, :]


def keep_mask(seed: int, dropout_p: float, b: int, h: int, i_idx, j_idx, Hq: int, Nq: int, Nk: int):
    """Boolean keep mask of one block of scores: True where P[b, h, i, j] survives dropout.

    Shape (len(i_idx), len(j_idx)), the kind (NumPy or torch, and device) of i_idx. The rule, the same in
    every backend: ``tl.rand(seed, ((b * Hq + h) * Nq + i) * Nk + j) >= float32(dropout_p)``; a tiled loop
    calls it with the row and column indices of its S_ij block and scales the kept P_ij by 1 / (1 - dropout_p).
    seed: int in [0, 2**64); dropout_p: probability of dropping, in [0, 1) (0 keeps everything).
    b, h: batch and query head; Hq, Nq, Nk: query heads, query rows, key columns of the whole problem.
    """
    check_seed(seed, "keep_mask")
    p32 = check_dropout_p(dropout_p, "keep_mask")
    u = philox_uniform(seed, dropout_offsets(b, h, i_idx, j_idx, Hq, Nq, Nk, fn="keep_mask"))
    return u >= float(p32)  # float(p32) is exact: the comparison is against the float32 value
