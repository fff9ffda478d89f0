"""FlashAttention in pure NumPy: tiling and the online softmax with nothing hidden.

Names follow the FlashAttention papers: Q is cut into Tr blocks Q_i of Br rows
(``block_m``), K and V into Tc blocks K_j, V_j of Bc rows (``block_n``). For each
query row we keep the running max ``m_i`` and the running sum ``l_i`` of exp(S_ij - m_i).
Arrays named ``*_hbm`` stand for GPU main memory; everything else is a tile that
would live in on-chip SRAM. All blocks are processed for every (b, h) at once
(NumPy broadcasts over the leading B, H axes), so the loops below are only the
block loops of the algorithm.

Two loop orders:

* ``loop_order="v1"`` (FlashAttention-1, Algorithm 1): outer loop over K/V blocks,
  inner loop over Q blocks. O, l and m live in HBM (``O_hbm``, ``l_hbm``, ``m_hbm``)
  and their rows O_i, l_i, m_i are read, updated and written back for every (i, j) pair.
* ``loop_order="v2"`` (FlashAttention-2): outer loop over Q blocks, inner loop over
  K/V blocks. acc (the unnormalised O_i), l_i, m_i stay in SRAM for the whole inner
  loop; O_i = acc / l_i once at the end; causal blocks above the diagonal are never visited.

Which keys a query sees, and which blocks to visit, come from :mod:`flash_attention_py.masks`: the
loops take a window ``(left, right)`` (``validation.resolve_window`` turns the public ``causal`` and
``window_size`` into it), visit only the blocks that ``kv_range`` / ``q_range`` name, skip the ones
``block_kind`` calls 'empty', and apply the elementwise mask only to the 'partial' ones.

Grouped-query attention: q (B, Hq, Nq, D) is viewed as (B, Hk, G, Nq, D) and k, v (B, Hk, Nk, D) as
(B, Hk, 1, Nk, D) (views, no copy), so a K/V block broadcasts over the G = Hq // Hk query heads that read it,
and the backward sums dK_j, dV_j over them. Dropout: the keep mask Z_ij of each S_ij block is drawn from the
seed (``masks.dropout_keep``, the rule of ``philox.keep_mask``), in the forward and again in the backward.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import masks
from .validation import (check_block_size, check_flag, check_qkv, check_same_as, check_scale_range,
                         resolve_dropout, resolve_softmax_scale, resolve_window)

__all__ = ["flash_attn_numpy", "flash_attn_numpy_backward"]

_DTYPES = ("float16", "float32", "float64")


def _acc_dtype(dtype) -> np.dtype:
    """float64 stays float64; float32 and float16 accumulate in float32."""
    return np.float64 if dtype == np.float64 else np.float32


def _native(x):
    """x in native byte order (a big-endian '>f4' array becomes a native float32 copy); others unchanged."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


def _count(stats, key, n):
    if stats is not None:
        stats[key] = stats.get(key, 0) + int(n)


def _masked_scores(Q_i, K_j, scale, window, kind, r0, r1, c0, c1, Nq, Nk):
    """(S_ij, visible): S_ij = scale * Q_i K_j^T with -inf where the window hides a key.

    ``kind`` is ``masks.block_kind`` of the block (the caller skips 'empty' ones); ``visible`` is the
    (Br, Bc) boolean mask of a 'partial' block, None for a 'full' one (no mask needed).
    """
    S_ij = scale * (Q_i @ np.swapaxes(K_j, -1, -2))  # (B, H, Br, Bc)
    visible = None
    if kind == "partial":
        visible = masks.visible(np.arange(r0, r1), np.arange(c0, c1), Nq, Nk, window)
        S_ij = np.where(visible, S_ij, -np.inf)
    return S_ij, visible


def _safe(m):
    """A row that has seen no key yet has m = -inf; use 0 there so exp(S - m) stays exp(-inf) = 0."""
    return np.where(np.isneginf(m), 0.0, m)


def _finish(acc, l_i, m_i):
    """O_i = acc / l_i and lse = m_i + log(l_i) for rows with the non-finite semantics of the reference.

    l_i = 0 (the row saw no key, or only -inf scores): O_i = 0, lse = -inf.
    l_i = NaN (a NaN score, or a +inf score: exp(inf - inf)): O_i = NaN; lse = +inf if m_i = +inf, else NaN.
    (``seen = l_i > 0`` would be False for l_i = NaN and silently turn NaN into 0.)
    """
    none = l_i == 0
    l_div = np.where(none, 1.0, l_i)
    O_i = np.where(none[..., None], 0.0, acc / l_div[..., None])
    with np.errstate(invalid="ignore"):
        lse = np.where(none, -np.inf, np.where(np.isposinf(m_i), np.inf, m_i + np.log(l_div)))
    return O_i, lse


@masks.with_mask_diagram
def flash_attn_numpy(
    q, k, v, *, causal=False, softmax_scale=None, block_m=64, block_n=64, loop_order="v2", return_lse=False,
    hbm_stats=None, window_size=(-1, -1), dropout_p=0.0, dropout_seed=None,
):
    """Tiled attention with the online softmax, in NumPy.

    Arguments
        q: (B, Hq, Nq, D); k, v: (B, Hk, Nk, D) (Hk = Hq, or a divisor of it). float16, float32 or float64
           NumPy arrays (float16 is computed in float32). Any N, any D, any strides.
        {MASK_DIAGRAM}

        {VARIANTS}
            Only the K/V blocks a Q block sees are visited; the keep mask is drawn per S_ij block.

        softmax_scale: defaults to 1/sqrt(D); a real number, or a 0-d array/tensor holding one. A scale
            whose scores could overflow the compute dtype (float32 for float16/float32 inputs) is refused
            with a ValueError (see ``validation.check_scale_range``).
        block_m (Br), block_n (Bc): rows of a Q block and of a K/V block (any positive ints).
        loop_order: "v1" (outer K/V, inner Q, O/l/m in HBM) or "v2" (outer Q, inner K/V).
        return_lse: also return lse (B, H, Nq) = m_i + log(l_i), float32 (float64 for float64 inputs).
        hbm_stats: optional dict; if given, filled with the number of elements each loop order
            reads from and writes to "HBM" (keys 'read_q', 'read_k', 'read_v', 'read_o', 'read_lm',
            'write_o', 'write_lm', summed over B and the heads: Hq for q, o, l, m; Hk for k, v).

    Big-endian float arrays are computed on as native ones. NaN and inf in q, k, v give what the float64
    reference gives (NaN in, NaN out; see ``attention_reference``).

    Returns O (B, Hq, Nq, D) in q's dtype (native byte order), and lse (B, Hq, Nq) if asked.
    """
    fn = "flash_attn_numpy"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=_DTYPES, gqa=True)
    q, k, v = (_native(x) for x in (q, k, v))  # big-endian floats are computed on as native ones
    window = resolve_window(causal, window_size, fn=fn)
    dropout = resolve_dropout(dropout_p, dropout_seed, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    Br = check_block_size(block_m, "block_m", fn=fn)
    Bc = check_block_size(block_n, "block_n", fn=fn)
    if loop_order not in ("v1", "v2"):
        raise ValueError(f"{fn}: loop_order must be 'v1' or 'v2', got {loop_order!r}")
    if hbm_stats is not None and not isinstance(hbm_stats, dict):
        raise TypeError(f"{fn}: hbm_stats must be a dict or None, got {type(hbm_stats).__name__}")
    for key, val in (hbm_stats or {}).items():
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise TypeError(f"{fn}: hbm_stats must map counter names to ints (it is added to), "
                            f"got {key!r}: {type(val).__name__} {val!r}")
    check_scale_range(q, k, scale, fn=fn, compute="float64" if q.dtype == np.float64 else "float32")
    loop = _forward_v1 if loop_order == "v1" else _forward_v2
    with np.errstate(invalid="ignore"):  # inf - inf and NaN inputs give NaN on purpose (NaN in, NaN out)
        O, lse = loop(q, k, v, window, scale, Br, Bc, hbm_stats, dropout)
    O = O.astype(q.dtype, copy=False)
    return (O, lse) if return_lse else O


def _grouped(q, k, v):
    """Views for grouped-query attention (no copy): q (B, Hq, Nq, D) -> (B, Hk, G, Nq, D) with G = Hq // Hk, and
    k, v (B, Hk, Nk, D) -> (B, Hk, 1, Nk, D). A block of q (B, Hk, G, Br, D) times a block of k (B, Hk, 1, Bc, D)
    broadcasts each K/V head over the G query heads that read it (query head h = hk * G + g reads K/V head hk)."""
    B, Hq, Nq, D = q.shape
    Hk = k.shape[1]
    return q.reshape(B, Hk, Hq // Hk, Nq, D), k[:, :, None], v[:, :, None]


def _keep(dropout, heads, r0, r1, c0, c1, Nq, Nk):
    """Dropout's keep mask of the S_ij block rows [r0, r1) x keys [c0, c1) for every head (``masks.dropout_keep``,
    the rule of ``philox.keep_mask``), shape heads.shape + (Br, Bc); None without dropout."""
    if dropout is None:
        return None
    p, seed = dropout
    return masks.dropout_keep(seed, p, heads, np.arange(r0, r1), np.arange(c0, c1), Nq, Nk)


def _heads(B, Hq, Hk):
    """Flat query-head indices b * Hq + h in the grouped layout (B, Hk, G): dropout's offsets start from them."""
    return np.arange(B * Hq, dtype=np.int64).reshape(B, Hk, Hq // Hk)


def _forward_v2(q, k, v, window, scale, Br, Bc, stats, dropout=None):
    """FlashAttention-2 order: for each Q block (outer), stream the K/V blocks it sees (inner).

    q (B, Hq, Nq, D), k and v (B, Hk, Nk, D) with Hq % Hk == 0. window: (left, right) of :mod:`masks`.
    dropout: None or (p, seed). Returns O (B, Hq, Nq, D) and lse (B, Hq, Nq) in the accumulator dtype.
    """
    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    q, k, v = _grouped(q, k, v)  # (B, Hk, G, Nq, D) and (B, Hk, 1, Nk, D): every tile below has these axes
    lead = q.shape[:3]  # (B, Hk, G)
    heads = _heads(B, Hq, Hk)
    acc_t = _acc_dtype(q.dtype)
    O_hbm = np.empty((*lead, Nq, D), acc_t)
    lse_hbm = np.empty((*lead, Nq), acc_t if acc_t == np.float64 else np.float32)
    BHq, BHk = B * Hq, B * Hk  # query heads and K/V heads: GQA reads each K/V block once per K/V head
    Tr = math.ceil(Nq / Br)
    for i in range(Tr):  # outer loop: one Q block, its acc, l_i, m_i stay in SRAM
        r0, r1 = i * Br, min(Nq, (i + 1) * Br)
        Q_i = q[..., r0:r1, :].astype(acc_t)  # load Q_i: (B, Hk, G, Br, D)
        _count(stats, "read_q", BHq * (r1 - r0) * D)
        m_i = np.full((*lead, r1 - r0), -np.inf, acc_t)  # running row max
        l_i = np.zeros((*lead, r1 - r0), acc_t)  # running row sum of exp(S_ij - m_i)
        acc = np.zeros((*lead, r1 - r0, D), acc_t)  # unnormalised O_i
        kv_start, kv_end = masks.kv_range(r0, r1, Nq, Nk, window)  # the keys these queries see: skip the rest
        for j in masks.blocks(kv_start, kv_end, Bc):  # inner loop over K/V blocks
            c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
            kind = masks.block_kind(r0, r1, c0, c1, Nq, Nk, window)
            if kind == "empty":
                continue
            K_j = k[..., c0:c1, :].astype(acc_t)  # load K_j, V_j: (B, Hk, 1, Bc, D), shared by the group
            V_j = v[..., c0:c1, :].astype(acc_t)
            _count(stats, "read_k", BHk * (c1 - c0) * D)
            _count(stats, "read_v", BHk * (c1 - c0) * D)
            S_ij, _ = _masked_scores(Q_i, K_j, scale, window, kind, r0, r1, c0, c1, Nq, Nk)
            # m_new = max(m_i, rowmax(S_ij))
            m_new = np.maximum(m_i, S_ij.max(axis=-1))
            # P_ij = exp(S_ij - m_new)          (unnormalised probabilities of this block)
            P_ij = np.exp(S_ij - _safe(m_new)[..., None])
            # alpha = exp(m_i - m_new)          (rescales everything summed so far)
            alpha = np.exp(m_i - _safe(m_new))
            # l_i = alpha * l_i + rowsum(P_ij)  (before dropout: lse is the softmax's own)
            l_i = alpha * l_i + P_ij.sum(axis=-1)
            Z_ij = _keep(dropout, heads, r0, r1, c0, c1, Nq, Nk)
            if Z_ij is not None:  # dropout: P_ij * Z_ij / (1 - p) (a dropped weight is 0 exactly)
                P_ij = np.where(Z_ij, P_ij * (1.0 / (1.0 - dropout[0])), 0.0)
            # acc = alpha * acc + P_ij V_j      (O_i, still unnormalised)
            acc = alpha[..., None] * acc + P_ij @ V_j
            m_i = m_new
        # O_i = acc / l_i ; lse_i = m_i + log(l_i) ; a row that saw no key (l_i = 0) gets O_i = 0 and lse = -inf
        O_hbm[..., r0:r1, :], lse_hbm[..., r0:r1] = _finish(acc, l_i, m_i)
        _count(stats, "write_o", BHq * (r1 - r0) * D)
        _count(stats, "write_lm", BHq * (r1 - r0))
    return O_hbm.reshape(B, Hq, Nq, D), lse_hbm.reshape(B, Hq, Nq)


def _forward_v1(q, k, v, window, scale, Br, Bc, stats, dropout=None):
    """FlashAttention-1 order (Algorithm 1): for each K/V block (outer), visit the Q blocks that see it (inner).

    O, l, m live in HBM (``O_hbm``, ``l_hbm``, ``m_hbm``; O is kept normalised, as in the paper) and are read,
    updated and written back for every visited (i, j) pair. q (B, Hq, Nq, D), k and v (B, Hk, Nk, D);
    window: (left, right) of :mod:`masks`; dropout: None or (p, seed).
    Returns O (B, Hq, Nq, D) and lse (B, Hq, Nq) in the accumulator dtype.
    """
    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    q, k, v = _grouped(q, k, v)  # (B, Hk, G, Nq, D) and (B, Hk, 1, Nk, D)
    lead = q.shape[:3]
    heads = _heads(B, Hq, Hk)
    acc_t = _acc_dtype(q.dtype)
    # O, l, m live in HBM for the whole computation (Algorithm 1, line 2)
    O_hbm = np.zeros((*lead, Nq, D), acc_t)
    l_hbm = np.zeros((*lead, Nq), acc_t)
    m_hbm = np.full((*lead, Nq), -np.inf, acc_t)
    BHq, BHk = B * Hq, B * Hk
    Tc = math.ceil(Nk / Bc)
    for j in range(Tc):  # outer loop over K/V blocks
        c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
        q_start, q_end = masks.q_range(c0, c1, Nq, Nk, window)  # the queries that see any of these keys
        if q_start == q_end:
            continue  # no query sees this K/V block: it is not even loaded
        K_j = k[..., c0:c1, :].astype(acc_t)  # load K_j, V_j once: (B, Hk, 1, Bc, D)
        V_j = v[..., c0:c1, :].astype(acc_t)
        _count(stats, "read_k", BHk * (c1 - c0) * D)
        _count(stats, "read_v", BHk * (c1 - c0) * D)
        for i in masks.blocks(q_start, q_end, Br):  # inner loop over Q blocks
            r0, r1 = i * Br, min(Nq, (i + 1) * Br)
            kind = masks.block_kind(r0, r1, c0, c1, Nq, Nk, window)
            if kind == "empty":
                continue  # every key of this block is hidden from every query of this block
            # load Q_i, O_i, l_i, m_i from HBM
            Q_i = q[..., r0:r1, :].astype(acc_t)
            O_i, l_i, m_i = O_hbm[..., r0:r1, :], l_hbm[..., r0:r1], m_hbm[..., r0:r1]
            _count(stats, "read_q", BHq * (r1 - r0) * D)
            _count(stats, "read_o", BHq * (r1 - r0) * D)
            _count(stats, "read_lm", 2 * BHq * (r1 - r0))
            S_ij, _ = _masked_scores(Q_i, K_j, scale, window, kind, r0, r1, c0, c1, Nq, Nk)
            # statistics of this block alone:
            # m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
            m_ij = S_ij.max(axis=-1)
            P_ij = np.exp(S_ij - _safe(m_ij)[..., None])
            l_ij = P_ij.sum(axis=-1)  # (before dropout: lse is the softmax's own)
            Z_ij = _keep(dropout, heads, r0, r1, c0, c1, Nq, Nk)
            if Z_ij is not None:  # dropout: P~_ij * Z_ij / (1 - p) goes into O (a dropped weight is 0 exactly)
                P_ij = np.where(Z_ij, P_ij * (1.0 / (1.0 - dropout[0])), 0.0)
            # merge with the statistics so far:
            # m_new = max(m_i, m~_ij)
            # l_new = exp(m_i - m_new) * l_i + exp(m~_ij - m_new) * l~_ij
            m_new = np.maximum(m_i, m_ij)
            alpha = np.exp(m_i - _safe(m_new))  # rescales the old rows
            beta = np.exp(m_ij - _safe(m_new))  # rescales this block
            l_new = alpha * l_i + beta * l_ij
            # O_i = diag(l_new)^-1 (diag(l_i) alpha O_i + beta P~_ij V_j)    (O stays normalised)
            l_div = np.where(l_new == 0, 1.0, l_new)  # (not l_new > 0: a NaN must stay NaN)
            O_new = ((l_i * alpha)[..., None] * O_i + beta[..., None] * (P_ij @ V_j)) / l_div[..., None]
            # write O_i, l_i, m_i back to HBM
            O_hbm[..., r0:r1, :] = O_new
            l_hbm[..., r0:r1] = l_new
            m_hbm[..., r0:r1] = m_new
            _count(stats, "write_o", BHq * (r1 - r0) * D)
            _count(stats, "write_lm", 2 * BHq * (r1 - r0))
    # lse = m + log(l); a row that saw no key keeps O = 0 and gets lse = -inf
    _, lse = _finish(O_hbm, l_hbm, m_hbm)
    lse = lse.astype(acc_t if acc_t == np.float64 else np.float32)
    return O_hbm.reshape(B, Hq, Nq, D), lse.reshape(B, Hq, Nq)


@masks.with_mask_diagram
def flash_attn_numpy_backward(
    q, k, v, o, lse, do, *, causal=False, softmax_scale=None, block_m=64, block_n=64, window_size=(-1, -1),
    dropout_p=0.0, dropout_seed=None,
):
    """Tiled FlashAttention backward: gradients of :func:`flash_attn_numpy` without storing P.

    Arguments
        q (B, Hq, Nq, D), k and v (B, Hk, Nk, D): the forward's inputs.
        o (B, Hq, Nq, D): the forward's output; lse (B, Hq, Nq): its log-sum-exp (return_lse=True).
        do (B, Hq, Nq, D): gradient of the loss with respect to o.
        causal, softmax_scale, window_size, dropout_p, dropout_seed, block_m (Br), block_n (Bc): as in the
            forward (the same window and the same dropout seed, or the gradients are of another function):
        {MASK_DIAGRAM}

        {VARIANTS}

    Algorithm (FlashAttention-2 backward): D_i = rowsum(dO_i * O_i) once; then for each K/V
    block j (outer) and each Q block i (inner) recompute P_ij = exp(S_ij - lse_i) (and, with dropout,
    the keep mask Z_ij from the seed, with Pd_ij = P_ij * Z_ij / (1 - p); without, Pd_ij = P_ij) and
        dV_j += Pd_ij^T dO_i
        dP_ij = (dO_i V_j^T) * Z_ij / (1 - p)        (dO_i V_j^T without dropout)
        dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += scale * dS_ij K_j
        dK_j += scale * dS_ij^T Q_i
    With grouped-query attention dK_j and dV_j are summed over the query heads that share K/V head j's.

    Returns (dq, dk, dv) in q's dtype with the shapes of q, k, v.
    """
    fn = "flash_attn_numpy_backward"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=_DTYPES, gqa=True)
    check_same_as(o, "o", q, "q", fn=fn)
    check_same_as(do, "do", q, "q", fn=fn)
    if not isinstance(lse, np.ndarray):
        raise TypeError(f"{fn}: lse must be a numpy.ndarray, got {type(lse).__name__}")
    q, k, v, o, do, lse = (_native(x) for x in (q, k, v, o, do, lse))
    if lse.shape != (B, H, Nq):
        raise ValueError(f"{fn}: lse must have shape {(B, H, Nq)}, got {lse.shape}")
    if lse.dtype not in (np.float32, np.float64):
        raise TypeError(f"{fn}: lse must be float32 or float64, got {lse.dtype}")
    window = resolve_window(causal, window_size, fn=fn)
    dropout = resolve_dropout(dropout_p, dropout_seed, fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    Br = check_block_size(block_m, "block_m", fn=fn)
    Bc = check_block_size(block_n, "block_n", fn=fn)
    return _backward(q, k, v, o, lse, do, window, scale, Br, Bc, dropout)


def _backward(q, k, v, o, lse, do, window, scale, Br, Bc, dropout=None):
    """The backward of a window (left, right) of :mod:`masks` and dropout (None or (p, seed)): Delta and the tiled
    loop; (dq, dk, dv) in q's dtype. q, o, do (B, Hq, Nq, D), lse (B, Hq, Nq), k and v (B, Hk, Nk, D)."""
    acc_t = _acc_dtype(q.dtype)
    # D_i = rowsum(dO_i * O_i)  (B, Hq, Nq): the only extra quantity the backward needs (O is the output after
    # dropout, so this is also rowsum(P_ij * dP_ij) with dP_ij the gradient of the dropped weights)
    Delta = (do.astype(acc_t) * o.astype(acc_t)).sum(axis=-1)
    # rows that saw no key (lse = -inf) have P = 0; a row with a +inf score (lse = +inf) has P = NaN,
    # as in the reference (softmax of a row holding +inf is NaN everywhere)
    lse_safe = np.where(np.isneginf(lse), 0.0, np.where(np.isposinf(lse), np.nan, lse)).astype(acc_t)
    with np.errstate(invalid="ignore"):  # NaN in, NaN out
        dQ_hbm, dK_hbm, dV_hbm = _backward_loop(q, k, v, do, lse, lse_safe, Delta, window, scale, Br, Bc, acc_t,
                                                dropout)
    return tuple(x.astype(q.dtype, copy=False) for x in (dQ_hbm, dK_hbm, dV_hbm))


def _backward_loop(q, k, v, do, lse, lse_safe, Delta, window, scale, Br, Bc, acc_t, dropout=None):
    """FlashAttention-2 backward loop: for each K/V block (outer), the Q blocks that see it (inner).

    window: (left, right) of :mod:`masks`; Delta (B, Hq, Nq) = rowsum(dO * O); lse_safe: lse with -inf
    replaced by 0 and +inf by NaN; dropout: None or (p, seed), the forward's mask drawn again block by block.
    Returns dQ (B, Hq, Nq, D), dK, dV (B, Hk, Nk, D) in ``acc_t`` (dK, dV summed over each group of query heads).
    """
    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    G = Hq // Hk
    q, k, v = _grouped(q, k, v)  # (B, Hk, G, Nq, D) and (B, Hk, 1, Nk, D)
    do = do.reshape(q.shape)
    lse, lse_safe, Delta = (x.reshape(B, Hk, G, Nq) for x in (lse, lse_safe, Delta))
    heads = _heads(B, Hq, Hk)
    inv_keep = 1.0 / (1.0 - dropout[0]) if dropout is not None else 1.0
    dQ_hbm = np.zeros(q.shape, acc_t)
    dK_hbm = np.zeros(k.shape, acc_t)  # (B, Hk, 1, Nk, D)
    dV_hbm = np.zeros(v.shape, acc_t)
    Tc = math.ceil(Nk / Bc)
    for j in range(Tc):  # outer loop over K/V blocks: dK_j, dV_j stay in SRAM
        c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
        q_start, q_end = masks.q_range(c0, c1, Nq, Nk, window)  # the queries that see any of these keys
        if q_start == q_end:
            continue  # no query sees these keys: dK_j = dV_j = 0
        K_j, V_j = k[..., c0:c1, :].astype(acc_t), v[..., c0:c1, :].astype(acc_t)  # (B, Hk, 1, Bc, D)
        dK_j = np.zeros_like(K_j)
        dV_j = np.zeros_like(V_j)
        for i in masks.blocks(q_start, q_end, Br):  # inner loop over Q blocks
            r0, r1 = i * Br, min(Nq, (i + 1) * Br)
            kind = masks.block_kind(r0, r1, c0, c1, Nq, Nk, window)
            if kind == "empty":
                continue
            Q_i, dO_i = q[..., r0:r1, :].astype(acc_t), do[..., r0:r1, :].astype(acc_t)  # (B, Hk, G, Br, D)
            S_ij, visible = _masked_scores(Q_i, K_j, scale, window, kind, r0, r1, c0, c1, Nq, Nk)
            # P_ij = exp(S_ij - lse_i): the forward's probabilities, recomputed
            P_ij = np.exp(S_ij - lse_safe[..., r0:r1, None])
            P_ij = np.where(np.isneginf(lse[..., r0:r1, None]), 0.0, P_ij)
            if visible is not None:  # a hidden key has P_ij = 0 exactly, even in a NaN row
                P_ij = np.where(visible, P_ij, 0.0)
            # dP_ij = dO_i V_j^T   (the gradient of the weights that multiplied V_j)
            dP_ij = dO_i @ np.swapaxes(V_j, -1, -2)
            Z_ij = _keep(dropout, heads, r0, r1, c0, c1, Nq, Nk)  # the forward's keep mask, drawn again
            if Z_ij is None:
                Pd_ij = P_ij
            else:  # dropout: the weights were P_ij * Z_ij / (1 - p); dP_ij flows back through the same factor
                Pd_ij = np.where(Z_ij, P_ij * inv_keep, 0.0)
                dP_ij = np.where(Z_ij, dP_ij * inv_keep, 0.0)
            # dV_j += Pd_ij^T dO_i      (summed over the G query heads that share V_j)
            dV_j += (np.swapaxes(Pd_ij, -1, -2) @ dO_i).sum(axis=2, keepdims=True)
            # dS_ij = P_ij * (dP_ij - D_i)
            dS_ij = P_ij * (dP_ij - Delta[..., r0:r1, None])
            if visible is not None:  # (0 * NaN is NaN: a hidden key gets no gradient from a NaN row)
                dS_ij = np.where(visible, dS_ij, 0.0)
            # dQ_i += scale * dS_ij K_j   (read-modify-write in HBM)
            dQ_hbm[..., r0:r1, :] += scale * (dS_ij @ K_j)
            # dK_j += scale * dS_ij^T Q_i  (summed over the G query heads that share K_j)
            dK_j += scale * (np.swapaxes(dS_ij, -1, -2) @ Q_i).sum(axis=2, keepdims=True)
        dK_hbm[..., c0:c1, :] = dK_j
        dV_hbm[..., c0:c1, :] = dV_j
    return dQ_hbm.reshape(B, Hq, Nq, D), dK_hbm.reshape(B, Hk, Nk, D), dV_hbm.reshape(B, Hk, Nk, D)
