"""The mask rule, once for every Python rung: which keys a query sees, and which blocks hold any.

A mask is a window ``(left, right)`` aligned to the bottom-right corner, as in flash-attn. With
``offset = Nk - Nq`` (the queries are the last Nq positions of a sequence of Nk keys), query ``i``
sees key ``j`` iff ``0 <= j < Nk`` and

    j <= i + offset + right     when right >= 0      (right = -1: no bound on the right)
    j >= i + offset - left      when left >= 0       (left = -1: no bound on the left)

``(-1, -1)`` is full attention; causal is ``(-1, 0)``; ``(w, 0)`` is causal local attention with w keys
of look-back; ``(0, 0)`` lets each query see only its own diagonal key.

    full (-1, -1)     causal (-1, 0)     local (2, 0)      Nq = 2, Nk = 5, causal    Nq = 5, Nk = 2, causal
       k0 k1 k2 k3       k0 k1 k2 k3       k0 k1 k2 k3        k0 k1 k2 k3 k4           k0 k1
    q0  1  1  1  1    q0  1  0  0  0    q0  1  0  0  0     q0  1  1  1  1  0        q0  0  0  <- no key:
    q1  1  1  1  1    q1  1  1  0  0    q1  1  1  0  0     q1  1  1  1  1  1        q1  0  0     O = 0,
    q2  1  1  1  1    q2  1  1  1  0    q2  1  1  1  0                              q2  0  0     lse = -inf
    q3  1  1  1  1    q3  1  1  1  1    q3  0  1  1  1                              q3  1  0
                                                                                    q4  1  1

A row that sees no key gives output 0 and lse = -inf in every backend.

Block ranges (what a tiled loop needs): for a block of queries ``[q_start, q_end)`` the keys any of
them sees lie in ``kv_range(...)``; for a block of keys, the queries that see any of them lie in
``q_range(...)``; ``block_kind`` says whether a (query block, key block) pair is 'empty' (skip it),
'full' (no mask needed inside it) or 'partial' (apply ``visible`` elementwise).

Dropout's keep mask is a mask too: ``dropout_keep`` draws it for one block of scores (the rule of
``philox.keep_mask``, for many heads at once), and ``validation.resolve_dropout`` turns the public ``dropout_p`` and
``dropout_seed`` into the ``(p, seed)`` the loops take (None without dropout).

The same rule in the other languages: ``flash_attention_triton/masks.py`` (``@triton.jit`` helpers) and
``flash_attention_cuda/kernels/masks.cuh`` (``fa::Mask``). Nothing else in the project computes the
bottom-right offset.
"""
from __future__ import annotations

import numpy as np

__all__ = ["FULL", "CAUSAL", "window_for", "offset", "visible", "visible_pairs", "kv_range", "q_range",
           "block_kind", "blocks", "dropout_keep", "flex_mask_mod", "MASK_DIAGRAM", "VARIANTS_DOC", "with_mask_diagram"]

FULL = (-1, -1)
CAUSAL = (-1, 0)

# For docstrings of public functions: the rule of ``causal`` and ``window_size`` and its picture.
MASK_DIAGRAM = """\
causal, window_size=(left, right): which keys a query sees, bottom-right aligned (as flash-attn):
        query i sees key j iff  j <= i + Nk - Nq + right   (right >= 0; -1: no bound on the right)
                           and  j >= i + Nk - Nq - left    (left >= 0;  -1: no bound on the left)
    window_size defaults to (-1, -1) (full attention); causal=True sets right = 0 (min(right, 0)).

     causal          causal            causal             window (1, 0)    window (1, 2)
     Nq=Nk=3         Nq=2, Nk=4        Nq=3, Nk=2         Nq=Nk=4          Nq=Nk=4
       k0 k1 k2        k0 k1 k2 k3       k0 k1              k0 k1 k2 k3      k0 k1 k2 k3
   q0   1  0  0    q0   1  1  1  0   q0   0  0  <- (*)  q0   1  0  0  0  q0   1  1  1  0
   q1   1  1  0    q1   1  1  1  1   q1   1  0          q1   1  1  0  0  q1   1  1  1  1
   q2   1  1  1                      q2   1  1          q2   0  1  1  0  q2   0  1  1  1
                                                        q3   0  0  1  1  q3   0  0  1  1
    (*) a row that sees no key gives O = 0 and lse = -inf.
"""


# For docstrings of public functions: the arguments of the other two variants (grouped-query attention and
# dropout) and window_size, written once (the ``{VARIANTS}`` line of a docstring).
VARIANTS_DOC = """\
window_size: (left, right), default (-1, -1): the window of the rule above.
        Grouped-query / multi-query attention: k and v may have fewer heads than q: q (B, Hq, Nq, D),
            k and v (B, Hk, Nk, D) with Hq % Hk == 0; query head h reads K/V head h // (Hq // Hk) (no copy
            of K or V is made); dk and dv are summed over the Hq // Hk query heads of each K/V head.
        dropout_p: probability in [0, 1) of dropping each attention weight P_ij (default 0.0: no dropout).
        dropout_seed: an int in [0, 2**64), required when dropout_p > 0. Score (b, h, i, j) is kept iff
            philox_uniform(dropout_seed, ((b*Hq + h)*Nq + i)*Nk + j) >= float32(dropout_p)
            (the bits of Triton's tl.rand; see flash_attention_py.philox); with Z the keep mask,
            O = (P * Z / (1 - dropout_p)) V, and lse is the softmax's before dropout. The backward draws
            the same Z again from the seed (no N x N mask is stored)."""


def with_mask_diagram(fn):
    """Decorator: the line ``{MASK_DIAGRAM}`` of fn's docstring becomes :data:`MASK_DIAGRAM` (the rule and picture
    of the ``causal`` and ``window_size`` arguments) and the line ``{VARIANTS}`` becomes :data:`VARIANTS_DOC`
    (window_size, grouped-query attention and dropout): written once for every public function that takes them."""
    if fn.__doc__:  # None under python -OO
        fn.__doc__ = fn.__doc__.replace("{MASK_DIAGRAM}", MASK_DIAGRAM.rstrip("\n")).replace("{VARIANTS}", VARIANTS_DOC)
    return fn


def window_for(causal: bool, window=FULL) -> tuple:
    """The (left, right) window of a call: ``causal=True`` bounds the right side at 0 (as flash-attn does)."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return (int(left), int(right))


def offset(Nq: int, Nk: int) -> int:
    """Shift of the diagonal: query i's own position among the keys is i + offset(Nq, Nk)."""
    return Nk - Nq


def visible(q_idx, k_idx, Nq: int, Nk: int, window=FULL):
    """Boolean mask of shape (len(q_idx), len(k_idx)): True where query q_idx[r] sees key k_idx[c].

    Index arrays may be NumPy arrays or torch tensors (the result is of the same kind); keys outside
    [0, Nk) and queries >= Nq (the overhang of a last block) are never visible.
    """
    left, right = window
    if hasattr(q_idx, "unsqueeze"):  # torch tensors
        i, j = q_idx.unsqueeze(-1), k_idx.unsqueeze(0)
    else:
        i, j = np.asarray(q_idx)[:, None], np.asarray(k_idx)[None, :]
    diag = i + offset(Nq, Nk)
    seen = (j >= 0) & (j < Nk) & (i < Nq)
    if right >= 0:
        seen = seen & (j <= diag + right)
    if left >= 0:
        seen = seen & (j >= diag - left)
    return seen


def visible_pairs(Nq: int, Nk: int, window=FULL) -> int:
    """How many (query, key) pairs are visible: the scores a kernel that skips every hidden one computes.

    Each row sees one contiguous run of keys, so the count is a sum of clipped run lengths (no Nq x Nk
    matrix). Full attention gives Nq * Nk; causal with Nq = Nk gives Nq (Nq + 1) / 2.
    """
    left, right = window
    diag = np.arange(Nq, dtype=np.int64) + offset(Nq, Nk)
    lo = np.zeros(Nq, np.int64) if left < 0 else np.clip(diag - left, 0, Nk)
    hi = np.full(Nq, Nk, np.int64) if right < 0 else np.clip(diag + right + 1, 0, Nk)
    return int(np.maximum(hi - lo, 0).sum())


def kv_range(q_start: int, q_end: int, Nq: int, Nk: int, window=FULL) -> tuple:
    """(kv_start, kv_end): the keys any query in [q_start, q_end) sees lie in [kv_start, kv_end).

    Empty (kv_start == kv_end) when none of them sees a key. A K/V loop runs over just this range.
    """
    left, right = window
    q_end = min(q_end, Nq)
    if q_start >= q_end:  # no real query in the block
        return (0, 0)
    lo = 0 if left < 0 else q_start + offset(Nq, Nk) - left
    hi = Nk if right < 0 else (q_end - 1) + offset(Nq, Nk) + right + 1
    lo, hi = max(0, min(lo, Nk)), max(0, min(hi, Nk))
    return (lo, max(lo, hi))


def q_range(k_start: int, k_end: int, Nq: int, Nk: int, window=FULL) -> tuple:
    """(q_start, q_end): the queries that see any key in [k_start, k_end) lie in [q_start, q_end).

    The backward's loop over query blocks, for one K/V block, runs over just this range.
    """
    left, right = window
    k_end = min(k_end, Nk)
    if k_start >= k_end:  # no real key in the block
        return (0, 0)
    lo = 0 if right < 0 else k_start - offset(Nq, Nk) - right
    hi = Nq if left < 0 else (k_end - 1) - offset(Nq, Nk) + left + 1
    lo, hi = max(0, min(lo, Nq)), max(0, min(hi, Nq))
    return (lo, max(lo, hi))


def block_kind(q_start: int, q_end: int, k_start: int, k_end: int, Nq: int, Nk: int, window=FULL) -> str:
    """'empty', 'full' or 'partial' for the block of queries [q_start, q_end) by keys [k_start, k_end).

    Only rows < Nq and keys < Nk count: a block that overhangs the end is 'full' when every real
    (query, key) pair in it is visible (the bounds are a separate check in a kernel).
    """
    q_end, k_end = min(q_end, Nq), min(k_end, Nk)
    lo, hi = kv_range(q_start, q_end, Nq, Nk, window)
    if q_start >= q_end or k_start >= k_end or hi <= k_start or lo >= k_end:
        return "empty"
    left, right = window
    first_key_of_last_row = -1 if left < 0 else (q_end - 1) + offset(Nq, Nk) - left
    last_key_of_first_row = Nk if right < 0 else q_start + offset(Nq, Nk) + right
    if k_start >= first_key_of_last_row and k_end - 1 <= last_key_of_first_row:
        return "full"
    return "partial"


def blocks(start: int, end: int, block: int) -> range:
    """Indices of the blocks of ``block`` rows that overlap rows [start, end): a loop over the K/V blocks of
    ``kv_range`` (block = Bc) or the Q blocks of ``q_range`` (block = Br). Empty when start >= end."""
    return range(start // block, -(-end // block)) if start < end else range(0)


def dropout_keep(seed: int, dropout_p: float, heads, rows, cols, Nq: int, Nk: int):
    """Dropout's keep mask of one block of scores, for many (b, h) at once: ``heads.shape + (len(rows), len(cols))``.

    heads: integer array (NumPy or torch) of the flat head indices ``b * Hq + h`` (Hq = query heads), any shape;
    rows, cols: 1-D index arrays of the same kind (the block's query rows i and key columns j, all real:
    i < Nq, j < Nk). The rule is :func:`flash_attention_py.philox.keep_mask`'s, for every head in ``heads``:
    keep score (b, h, i, j) iff ``philox_uniform(seed, ((b * Hq + h) * Nq + i) * Nk + j) >= float32(dropout_p)``.
    A tiled loop calls it once per S_ij block (never for the whole Nq x Nk matrix).
    """
    from . import philox

    p32 = philox.check_dropout_p(dropout_p, "dropout_keep")
    if hasattr(rows, "unsqueeze") and rows.device.type != "cpu":  # torch tensors on a GPU: computed there
        offsets = (heads[..., None, None] * Nq + rows[:, None]) * Nk + cols[None, :]
        return philox.philox_uniform(seed, offsets) >= float(p32)
    # NumPy, and torch tensors on the CPU (where NumPy's uint32 arithmetic is several times faster than
    # torch's int64 emulation of it; the bits are the same)
    as_torch = hasattr(rows, "unsqueeze")
    heads, rows, cols = (np.asarray(x.cpu() if as_torch else x, dtype=np.int64) for x in (heads, rows, cols))
    offsets = (heads[..., None, None] * Nq + rows[:, None]) * Nk + cols[None, :]
    keep = philox.philox_uniform(seed, offsets) >= float(p32)
    if as_torch:
        import torch

        return torch.from_numpy(keep)
    return keep


def flex_mask_mod(Nq: int, Nk: int, window=FULL):
    """The rule as PyTorch FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (for
    ``torch.nn.attention.flex_attention.create_block_mask``), so that FlexAttention, timed beside the
    kernels, computes exactly the scores they do. Keys and queries are never out of range there."""
    left, right = window
    shift = offset(Nq, Nk)

    def mask_mod(b, h, q_idx, kv_idx):
        diag = q_idx + shift
        seen = (kv_idx >= 0) & (q_idx >= 0)
        if right >= 0:
            seen = seen & (kv_idx <= diag + right)
        if left >= 0:
            seen = seen & (kv_idx >= diag - left)
        return seen

    return mask_mod
