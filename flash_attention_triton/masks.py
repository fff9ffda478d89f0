"""The mask rule for the Triton kernels: ``flash_attention_py/masks.py`` as ``@triton.jit`` helpers.

Same rule, same names. A mask is a window ``(LEFT, RIGHT)`` aligned to the bottom-right corner
(-1 = unbounded on that side; causal = (-1, 0), full = (-1, -1)). With ``offset = Nk - Nq``, query i
sees key j iff ``0 <= j < Nk``, ``i < Nq`` and

    j <= i + offset + RIGHT     when RIGHT >= 0
    j >= i + offset - LEFT      when LEFT >= 0

LEFT and RIGHT are ``tl.constexpr`` in every helper and kernel: an unbounded side (-1) then compiles
away (the causal kernel has no left-bound compare at all, the full kernel no compare but the bounds),
and each window a model uses is one compiled variant, as each head dim is.

Helpers (q_start/k_start are the first row of a block, BLOCK_M = Br queries, BLOCK_N = Bc keys):

* ``visible(offs_m, offs_n, Nq, Nk, LEFT, RIGHT)``: the boolean tile, bounds included. offs_m and
  offs_n broadcast: ``offs_m[:, None], offs_n[None, :]`` gives the (Br, Bc) tile of S_ij,
  ``offs_m[None, :], offs_n[:, None]`` its transpose (Bc, Br) (the dK/dV kernel's S_ij^T).
* ``kv_range(q_start, q_end, ...)`` -> (lo, hi): the keys any query of [q_start, q_end) sees.
* ``q_range(k_start, k_end, ...)`` -> (lo, hi): the queries that see any key of [k_start, k_end).
* ``kv_full(q_start, q_end, ...)`` -> (lo, hi): the keys every query of the block sees.
* ``q_full(k_start, k_end, ...)`` -> (lo, hi): the queries that see every key of the block.
* ``kv_blocks(q_start, Nq, Nk, LEFT, RIGHT, BLOCK_M, BLOCK_N)`` -> (start, full_start, full_end, end):
  the K/V loop of one query block in three stages, block-aligned: [start, full_start) partial
  (elementwise mask), [full_start, full_end) full (no mask, whole blocks inside [0, Nk)),
  [full_end, end) partial. The blocks outside [start, end) are empty and never visited.
* ``q_blocks(k_start, Nq, Nk, LEFT, RIGHT, BLOCK_M, BLOCK_N)``: the same for the loop over query
  blocks of one K/V block (the backward's dK/dV kernel).
* ``two_spans(lo, hi, lo2, hi2, BLOCK)`` and ``span_start(i, n1, lo, lo2, BLOCK)``: one loop over two block
  ranges, so that both partial stages run as one loop.

Rows past Nq (the overhang of the last query block) never count: a block is full when every real
query sees every real key in it.
"""
import triton
import triton.language as tl


@triton.jit
def offset(Nq, Nk):
    """Shift of the diagonal: query i's own position among the keys is i + offset(Nq, Nk)."""
    return Nk - Nq


@triton.jit
def visible(offs_m, offs_n, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """True where query offs_m sees key offs_n; broadcasts offs_m against offs_n (see the module doc)."""
    diag = offs_m + offset(Nq, Nk)  # query i's own position among the keys
    seen = (offs_n < Nk) & (offs_m < Nq)
    if RIGHT >= 0:
        seen = seen & (offs_n <= diag + RIGHT)
    if LEFT >= 0:
        seen = seen & (offs_n >= diag - LEFT)
    return seen


@triton.jit
def _clip(x, n):
    return tl.minimum(tl.maximum(x, 0), n)


@triton.jit
def _span(first, last, shift, N, BEFORE: tl.constexpr, AFTER: tl.constexpr):
    """[first + shift - BEFORE, last + shift + AFTER + 1) clipped to [0, N]; an unbounded side (-1) is 0 or N.

    Row r of one axis sees [r + shift - BEFORE, r + shift + AFTER] of the other. Passing a block's first and
    last row gives the union of its rows' spans (``*_range``); passing them swapped, the intersection (``*_full``).
    """
    lo = first * 0
    hi = first * 0 + N
    if BEFORE >= 0:
        lo = _clip(first + shift - BEFORE, N)
    if AFTER >= 0:
        hi = _clip(last + shift + AFTER + 1, N)
    return lo, hi


@triton.jit
def kv_range(q_start, q_end, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """(lo, hi): the keys any query of [q_start, q_end) sees lie in [lo, hi); lo == hi when none."""
    lo, hi = _span(q_start, tl.minimum(q_end, Nq) - 1, offset(Nq, Nk), Nk, LEFT, RIGHT)
    return lo, tl.maximum(lo, hi)


@triton.jit
def q_range(k_start, k_end, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """(lo, hi): the queries that see any key of [k_start, k_end) lie in [lo, hi); lo == hi when none."""
    lo, hi = _span(k_start, tl.minimum(k_end, Nk) - 1, -offset(Nq, Nk), Nq, RIGHT, LEFT)
    return lo, tl.maximum(lo, hi)


@triton.jit
def kv_full(q_start, q_end, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """(lo, hi): the keys that every query of [q_start, q_end) sees (rows < Nq only); lo >= hi when none."""
    return _span(tl.minimum(q_end, Nq) - 1, q_start, offset(Nq, Nk), Nk, LEFT, RIGHT)


@triton.jit
def q_full(k_start, k_end, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """(lo, hi): the queries that see every key of [k_start, k_end) (keys < Nk only); lo >= hi when none."""
    return _span(tl.minimum(k_end, Nk) - 1, k_start, -offset(Nq, Nk), Nq, RIGHT, LEFT)


@triton.jit
def _stages(any_range, full_range, BLOCK: tl.constexpr):
    """Block-aligned (start, full_start, full_end, end) of a loop over the rows any_range = (lo, hi), of
    which full_range = (full_lo, full_hi) need no mask: the full stage holds only whole blocks inside it."""
    lo, hi = any_range
    start = (lo // BLOCK) * BLOCK
    end = tl.where(hi > lo, hi, start)  # an empty range visits nothing
    end_blocks = tl.cdiv(end, BLOCK) * BLOCK
    full_start = tl.minimum(tl.maximum(tl.cdiv(full_range[0], BLOCK) * BLOCK, start), end_blocks)
    full_end = tl.minimum(tl.maximum((full_range[1] // BLOCK) * BLOCK, full_start), end_blocks)
    return start, full_start, full_end, end


@triton.jit
def kv_blocks(q_start, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The K/V loop of the query block [q_start, q_start + BLOCK_M): (start, full_start, full_end, end)."""
    q_end = q_start + BLOCK_M
    return _stages(kv_range(q_start, q_end, Nq, Nk, LEFT, RIGHT), kv_full(q_start, q_end, Nq, Nk, LEFT, RIGHT), BLOCK_N)


@triton.jit
def q_blocks(k_start, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The Q loop of the key block [k_start, k_start + BLOCK_N): (start, full_start, full_end, end)."""
    k_end = k_start + BLOCK_N
    return _stages(q_range(k_start, k_end, Nq, Nk, LEFT, RIGHT), q_full(k_start, k_end, Nq, Nk, LEFT, RIGHT), BLOCK_M)


@triton.jit
def two_spans(lo, hi, lo2, hi2, BLOCK: tl.constexpr):
    """One loop over [lo, hi) then [lo2, hi2), each walked in steps of BLOCK: (n1, n), the blocks of the first
    span and of both; ``span_start(i, n1, lo, lo2, BLOCK)`` is block i's first row.

    The two partial stages of a loop (``kv_blocks``/``q_blocks``: the blocks the window's edges cut, before and
    after the full ones) then run as one software-pipelined loop instead of two short ones, each of which would
    fill and drain the pipeline of loads on its own (the forward and backward kernels).
    """
    n1 = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK)
    return n1, n1 + tl.cdiv(tl.maximum(hi2 - lo2, 0), BLOCK)


@triton.jit
def span_start(i, n1, lo, lo2, BLOCK: tl.constexpr):
    """The first row of block i of ``two_spans``' loop: lo + i*BLOCK in the first span, then lo2 + (i - n1)*BLOCK."""
    return tl.where(i < n1, lo + i * BLOCK, lo2 + (i - n1) * BLOCK)
