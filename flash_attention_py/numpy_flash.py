"""FlashAttention in pure NumPy: tiling and the online softmax with nothing hidden.

Names follow the FlashAttention papers: Q is cut into Tr blocks Q_i of Br rows
(``block_m``), K and V into Tc blocks K_j, V_j of Bc rows (``block_n``). For each
query row we keep the running max ``m`` and the running sum ``l`` of exp(S - m).
Arrays named ``*_hbm`` stand for GPU main memory; everything else is a tile that
would live in on-chip SRAM. All blocks are processed for every (b, h) at once
(NumPy broadcasts over the leading B, H axes), so the loops below are only the
block loops of the algorithm.

Two loop orders:

* ``loop_order="v1"`` (FlashAttention-1, Algorithm 1): outer loop over K/V blocks,
  inner loop over Q blocks. O, l and m live in HBM and are read, updated and
  written back for every (i, j) pair.
* ``loop_order="v2"`` (FlashAttention-2): outer loop over Q blocks, inner loop over
  K/V blocks. O_i, l_i, m_i stay in SRAM for the whole inner loop; O is normalised
  once at the end; causal blocks above the diagonal are never visited.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .common import causal_kv_end, causal_offset, causal_visible
from .validation import (check_block_size, check_flag, check_qkv, check_same_as, check_scale_range,
                         resolve_softmax_scale)

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


def _block_is_masked(r0, r1, c0, Nq, Nk):
    """Causal: True when no query of rows [r0, r1) sees any key from column c0 on."""
    return c0 > (r1 - 1) + causal_offset(Nq, Nk)


def _block_needs_mask(r0, c1, Nq, Nk):
    """Causal: True when some key of columns [.., c1) is hidden from some query of rows [r0, ..)."""
    return c1 - 1 > r0 + causal_offset(Nq, Nk)


def _masked_scores(Qi, Kj, scale, causal, r0, r1, c0, c1, Nq, Nk, *, return_visible=False):
    """S_ij = scale * Q_i K_j^T, with -inf where the causal rule hides a key (and the mask, or None)."""
    S_ij = scale * (Qi @ np.swapaxes(Kj, -1, -2))  # (B, H, Br, Bc)
    visible = None
    if causal and _block_needs_mask(r0, c1, Nq, Nk):
        visible = causal_visible(np.arange(r0, r1), np.arange(c0, c1), Nq, Nk)
        S_ij = np.where(visible, S_ij, -np.inf)
    return (S_ij, visible) if return_visible else S_ij


def _safe(m):
    """A row that has seen no key yet has m = -inf; use 0 there so exp(S - m) stays exp(-inf) = 0."""
    return np.where(np.isneginf(m), 0.0, m)


def _finish(acc, l, m):
    """O = acc / l and lse = m + log(l) for rows with the non-finite semantics of the reference.

    l = 0 (the row saw no key, or only -inf scores): O = 0, lse = -inf.
    l = NaN (a NaN score, or a +inf score: exp(inf - inf)): O = NaN; lse = +inf if m = +inf, else NaN.
    (``seen = l > 0`` would be False for l = NaN and silently turn NaN into 0.)
    """
    none = l == 0
    l_div = np.where(none, 1.0, l)
    O = np.where(none[..., None], 0.0, acc / l_div[..., None])
    with np.errstate(invalid="ignore"):
        lse = np.where(none, -np.inf, np.where(np.isposinf(m), np.inf, m + np.log(l_div)))
    return O, lse


def flash_attn_numpy(
    q, k, v, *, causal=False, softmax_scale=None, block_m=64, block_n=64, loop_order="v2", return_lse=False,
    hbm_stats=None,
):
    """Tiled attention with the online softmax, in NumPy.

    Arguments
        q: (B, H, Nq, D); k, v: (B, H, Nk, D). float16, float32 or float64 NumPy arrays
           (float16 is computed in float32). Any N, any D, any strides.
        causal: bottom-right aligned mask: query i sees key j iff j <= i + Nk - Nq.

                Nq=Nk=3      Nq=2, Nk=4       Nq=3, Nk=2
                  k0 k1 k2     k0 k1 k2 k3      k0 k1
              q0  1  0  0   q0 1  1  1  0   q0  0  0   <- no key: O = 0, lse = -inf
              q1  1  1  0   q1 1  1  1  1   q1  1  0
              q2  1  1  1                   q2  1  1

        softmax_scale: defaults to 1/sqrt(D); a real number, or a 0-d array/tensor holding one. A scale
            whose scores could overflow the compute dtype (float32 for float16/float32 inputs) is refused
            with a ValueError (see ``validation.check_scale_range``).
        block_m (Br), block_n (Bc): rows of a Q block and of a K/V block (any positive ints).
        loop_order: "v1" (outer K/V, inner Q, O/l/m in HBM) or "v2" (outer Q, inner K/V).
        return_lse: also return lse (B, H, Nq) = m + log(l), float32 (float64 for float64 inputs).
        hbm_stats: optional dict; if given, filled with the number of elements each loop order
            reads from and writes to "HBM" (keys 'read_q', 'read_k', 'read_v', 'read_o', 'read_lm',
            'write_o', 'write_lm', summed over B and H).

    Big-endian float arrays are computed on as native ones. NaN and inf in q, k, v give what the float64
    reference gives (NaN in, NaN out; see ``attention_reference``).

    Returns O (B, H, Nq, D) in q's dtype (native byte order), and lse if asked.
    """
    fn = "flash_attn_numpy"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=_DTYPES)
    q, k, v = (_native(x) for x in (q, k, v))  # big-endian floats are computed on as native ones
    check_flag(causal, "causal", fn=fn)
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
        O, lse = loop(q, k, v, causal, scale, Br, Bc, hbm_stats)
    O = O.astype(q.dtype, copy=False)
    return (O, lse) if return_lse else O


def _forward_v2(q, k, v, causal, scale, Br, Bc, stats):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    acc_t = _acc_dtype(q.dtype)
    O_hbm = np.empty((B, H, Nq, D), acc_t)
    lse_hbm = np.empty((B, H, Nq), acc_t if acc_t == np.float64 else np.float32)
    BH = B * H
    Tr = math.ceil(Nq / Br)
    for i in range(Tr):  # outer loop: one Q block, its O_i, l_i, m_i stay in SRAM
        r0, r1 = i * Br, min(Nq, (i + 1) * Br)
        Qi = q[:, :, r0:r1].astype(acc_t)  # load Q_i: (B, H, Br, D)
        _count(stats, "read_q", BH * (r1 - r0) * D)
        m_i = np.full((B, H, r1 - r0), -np.inf, acc_t)  # running row max
        l_i = np.zeros((B, H, r1 - r0), acc_t)  # running row sum of exp(S - m)
        acc = np.zeros((B, H, r1 - r0, D), acc_t)  # unnormalised O_i
        kv_end = causal_kv_end(r1, Nq, Nk) if causal else Nk  # causal: skip blocks above the diagonal
        for j in range(math.ceil(kv_end / Bc)):  # inner loop over K/V blocks
            c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
            Kj = k[:, :, c0:c1].astype(acc_t)  # load K_j, V_j: (B, H, Bc, D)
            Vj = v[:, :, c0:c1].astype(acc_t)
            _count(stats, "read_k", BH * (c1 - c0) * D)
            _count(stats, "read_v", BH * (c1 - c0) * D)
            S_ij = _masked_scores(Qi, Kj, scale, causal, r0, r1, c0, c1, Nq, Nk)
            # m_new = max(m_old, rowmax(S_ij))
            m_new = np.maximum(m_i, S_ij.max(axis=-1))
            # P_ij = exp(S_ij - m_new)          (unnormalised probabilities of this block)
            P_ij = np.exp(S_ij - _safe(m_new)[..., None])
            # alpha = exp(m_old - m_new)        (rescales everything summed so far)
            alpha = np.exp(m_i - _safe(m_new))
            # l_new = alpha * l_old + rowsum(P_ij)
            l_i = alpha * l_i + P_ij.sum(axis=-1)
            # O_i = alpha * O_i + P_ij V_j      (still unnormalised)
            acc = alpha[..., None] * acc + P_ij @ Vj
            m_i = m_new
        # O_i = O_i / l_i ; lse_i = m_i + log(l_i) ; a row that saw no key (l = 0) gets O = 0 and lse = -inf
        O_hbm[:, :, r0:r1], lse_hbm[:, :, r0:r1] = _finish(acc, l_i, m_i)
        _count(stats, "write_o", BH * (r1 - r0) * D)
        _count(stats, "write_lm", BH * (r1 - r0))
    return O_hbm, lse_hbm


def _forward_v1(q, k, v, causal, scale, Br, Bc, stats):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    acc_t = _acc_dtype(q.dtype)
    # O, l, m live in HBM for the whole computation (Algorithm 1, line 2)
    O_hbm = np.zeros((B, H, Nq, D), acc_t)
    l_hbm = np.zeros((B, H, Nq), acc_t)
    m_hbm = np.full((B, H, Nq), -np.inf, acc_t)
    BH = B * H
    Tr, Tc = math.ceil(Nq / Br), math.ceil(Nk / Bc)
    for j in range(Tc):  # outer loop over K/V blocks
        c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
        Kj = k[:, :, c0:c1].astype(acc_t)  # load K_j, V_j once
        Vj = v[:, :, c0:c1].astype(acc_t)
        _count(stats, "read_k", BH * (c1 - c0) * D)
        _count(stats, "read_v", BH * (c1 - c0) * D)
        for i in range(Tr):  # inner loop over Q blocks
            r0, r1 = i * Br, min(Nq, (i + 1) * Br)
            if causal and _block_is_masked(r0, r1, c0, Nq, Nk):
                continue  # every key of this block is hidden from every query of this block
            # load Q_i, O_i, l_i, m_i from HBM
            Qi = q[:, :, r0:r1].astype(acc_t)
            Oi, l_i, m_i = O_hbm[:, :, r0:r1], l_hbm[:, :, r0:r1], m_hbm[:, :, r0:r1]
            _count(stats, "read_q", BH * (r1 - r0) * D)
            _count(stats, "read_o", BH * (r1 - r0) * D)
            _count(stats, "read_lm", 2 * BH * (r1 - r0))
            S_ij = _masked_scores(Qi, Kj, scale, causal, r0, r1, c0, c1, Nq, Nk)
            # statistics of this block alone:
            # m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
            m_ij = S_ij.max(axis=-1)
            P_ij = np.exp(S_ij - _safe(m_ij)[..., None])
            l_ij = P_ij.sum(axis=-1)
            # merge with the statistics so far:
            # m_new = max(m_i, m~_ij)
            # l_new = exp(m_i - m_new) * l_i + exp(m~_ij - m_new) * l~_ij
            m_new = np.maximum(m_i, m_ij)
            alpha = np.exp(m_i - _safe(m_new))  # rescales the old rows
            beta = np.exp(m_ij - _safe(m_new))  # rescales this block
            l_new = alpha * l_i + beta * l_ij
            # O_i = diag(l_new)^-1 (diag(l_i) alpha O_i + beta P~_ij V_j)    (O stays normalised)
            l_div = np.where(l_new == 0, 1.0, l_new)  # (not l_new > 0: a NaN must stay NaN)
            O_new = ((l_i * alpha)[..., None] * Oi + beta[..., None] * (P_ij @ Vj)) / l_div[..., None]
            # write O_i, l_i, m_i back to HBM
            O_hbm[:, :, r0:r1] = O_new
            l_hbm[:, :, r0:r1] = l_new
            m_hbm[:, :, r0:r1] = m_new
            _count(stats, "write_o", BH * (r1 - r0) * D)
            _count(stats, "write_lm", 2 * BH * (r1 - r0))
    # lse = m + log(l); a row that saw no key keeps O = 0 and gets lse = -inf
    _, lse = _finish(O_hbm, l_hbm, m_hbm)
    return O_hbm, lse.astype(acc_t if acc_t == np.float64 else np.float32)


def flash_attn_numpy_backward(
    q, k, v, o, lse, do, *, causal=False, softmax_scale=None, block_m=64, block_n=64
):
    """Tiled FlashAttention backward: gradients of :func:`flash_attn_numpy` without storing P.

    Arguments
        q (B, H, Nq, D), k and v (B, H, Nk, D): the forward's inputs.
        o (B, H, Nq, D): the forward's output; lse (B, H, Nq): its log-sum-exp (return_lse=True).
        do (B, H, Nq, D): gradient of the loss with respect to o.
        causal, softmax_scale, block_m (Br), block_n (Bc): as in the forward.

    Algorithm (FlashAttention-2 backward): D_i = rowsum(dO_i * O_i) once; then for each K/V
    block j (outer) and each Q block i (inner) recompute P_ij = exp(S_ij - lse_i) and
        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T
        dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += scale * dS_ij K_j
        dK_j += scale * dS_ij^T Q_i

    Returns (dq, dk, dv) in q's dtype with the shapes of q, k, v.
    """
    fn = "flash_attn_numpy_backward"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=_DTYPES)
    check_same_as(o, "o", q, "q", fn=fn)
    check_same_as(do, "do", q, "q", fn=fn)
    if not isinstance(lse, np.ndarray):
        raise TypeError(f"{fn}: lse must be a numpy.ndarray, got {type(lse).__name__}")
    q, k, v, o, do, lse = (_native(x) for x in (q, k, v, o, do, lse))
    if lse.shape != (B, H, Nq):
        raise ValueError(f"{fn}: lse must have shape {(B, H, Nq)}, got {lse.shape}")
    if lse.dtype not in (np.float32, np.float64):
        raise TypeError(f"{fn}: lse must be float32 or float64, got {lse.dtype}")
    check_flag(causal, "causal", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    Br = check_block_size(block_m, "block_m", fn=fn)
    Bc = check_block_size(block_n, "block_n", fn=fn)

    acc_t = _acc_dtype(q.dtype)
    # D_i = rowsum(dO_i * O_i)  (B, H, Nq): the only extra quantity the backward needs
    Delta = (do.astype(acc_t) * o.astype(acc_t)).sum(axis=-1)
    # rows that saw no key (lse = -inf) have P = 0; a row with a +inf score (lse = +inf) has P = NaN,
    # as in the reference (softmax of a row holding +inf is NaN everywhere)
    lse_safe = np.where(np.isneginf(lse), 0.0, np.where(np.isposinf(lse), np.nan, lse)).astype(acc_t)
    with np.errstate(invalid="ignore"):  # NaN in, NaN out
        dQ_hbm, dK_hbm, dV_hbm = _backward_loop(q, k, v, do, lse, lse_safe, Delta, causal, scale, Br, Bc, acc_t)
    return tuple(x.astype(q.dtype, copy=False) for x in (dQ_hbm, dK_hbm, dV_hbm))


def _backward_loop(q, k, v, do, lse, lse_safe, Delta, causal, scale, Br, Bc, acc_t):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    dQ_hbm = np.zeros((B, H, Nq, D), acc_t)
    dK_hbm = np.empty((B, H, Nk, D), acc_t)
    dV_hbm = np.empty((B, H, Nk, D), acc_t)
    Tr, Tc = math.ceil(Nq / Br), math.ceil(Nk / Bc)
    for j in range(Tc):  # outer loop over K/V blocks: dK_j, dV_j stay in SRAM
        c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
        Kj, Vj = k[:, :, c0:c1].astype(acc_t), v[:, :, c0:c1].astype(acc_t)
        dKj = np.zeros_like(Kj)
        dVj = np.zeros_like(Vj)
        for i in range(Tr):  # inner loop over Q blocks
            r0, r1 = i * Br, min(Nq, (i + 1) * Br)
            if causal and _block_is_masked(r0, r1, c0, Nq, Nk):
                continue
            Qi, dOi = q[:, :, r0:r1].astype(acc_t), do[:, :, r0:r1].astype(acc_t)
            S_ij, visible = _masked_scores(Qi, Kj, scale, causal, r0, r1, c0, c1, Nq, Nk, return_visible=True)
            # P_ij = exp(S_ij - lse_i): the forward's probabilities, recomputed
            P_ij = np.exp(S_ij - lse_safe[:, :, r0:r1, None])
            P_ij = np.where(np.isneginf(lse[:, :, r0:r1, None]), 0.0, P_ij)
            if visible is not None:  # a hidden key has P_ij = 0 exactly, even in a NaN row
                P_ij = np.where(visible, P_ij, 0.0)
            # dV_j += P_ij^T dO_i
            dVj += np.swapaxes(P_ij, -1, -2) @ dOi
            # dP_ij = dO_i V_j^T ;  dS_ij = P_ij * (dP_ij - D_i)
            dP_ij = dOi @ np.swapaxes(Vj, -1, -2)
            dS_ij = P_ij * (dP_ij - Delta[:, :, r0:r1, None])
            if visible is not None:  # (0 * NaN is NaN: a hidden key gets no gradient from a NaN row)
                dS_ij = np.where(visible, dS_ij, 0.0)
            # dQ_i += scale * dS_ij K_j   (read-modify-write in HBM)
            dQ_hbm[:, :, r0:r1] += scale * (dS_ij @ Kj)
            # dK_j += scale * dS_ij^T Q_i
            dKj += scale * (np.swapaxes(dS_ij, -1, -2) @ Qi)
        dK_hbm[:, :, c0:c1] = dKj
        dV_hbm[:, :, c0:c1] = dVj
    return dQ_hbm, dK_hbm, dV_hbm
