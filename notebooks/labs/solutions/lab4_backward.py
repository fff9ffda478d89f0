"""Lab 4 solution: the inner step of the FlashAttention-2 backward, in NumPy.

This is the reference answer to ``notebooks/labs/lab4_backward.py``; the loop around it is identical
to the template's. The same arithmetic as the backward of ``flash_attention_py.numpy_flash``, split
into the two functions the lab asks for.

    python notebooks/labs/grade.py lab4 --solution
"""
from __future__ import annotations

import math

import numpy as np

from flash_attention_py import masks
from flash_attention_py.validation import check_block_size, check_flag, check_qkv, resolve_softmax_scale


def preprocess(O, dO):
    """D = rowsum(dO * O): one number per query row, the term that the softmax's gradient subtracts.

    O, dO (B, H, Nq, D). Returns D (B, H, Nq).
    """
    # D_i = rowsum(dO_i * O_i)  (= rowsum(P_ij * dP_ij) over all keys, without forming P)
    return (dO * O).sum(axis=-1)


def backward_block(Q_i, K_j, V_j, dO_i, lse_i, D_i, dQ_i, dK_j, dV_j, scale, visible):
    """Add the contribution of one (Q block i, K/V block j) pair to dQ_i, dK_j and dV_j.

    Shapes (``...`` are the leading (B, H) axes):
        Q_i, dO_i, dQ_i   (..., Br, D)   queries, output gradient, running dQ of this Q block
        K_j, V_j          (..., Bc, D)   keys and values of this K/V block
        dK_j, dV_j        (..., Bc, D)   running dK, dV of this K/V block
        lse_i, D_i        (..., Br)      forward log-sum-exp (-inf for a row that sees no key), rowsum(dO * O)
        scale             float          the softmax scale (1/sqrt(D) by default)
        visible           (Br, Bc) bool, or None for all True: may query row r see key c (causal)
    Returns (dQ_i, dK_j, dV_j) updated, with the shapes they came in with.
    """
    # S_ij = scale * Q_i K_j^T, -inf where the key is hidden
    S_ij = scale * (Q_i @ np.swapaxes(K_j, -1, -2))
    if visible is not None:
        S_ij = np.where(visible, S_ij, -np.inf)
    # P_ij = exp(S_ij - lse_i): recomputed from lse, never stored by the forward. A row that sees no key
    # has lse = -inf; subtract 0 there so exp(-inf - 0) = 0, not exp(-inf - (-inf)) = NaN
    lse_safe = np.where(np.isneginf(lse_i), 0.0, lse_i)
    P_ij = np.exp(S_ij - lse_safe[..., None])
    # dV_j += P_ij^T dO_i
    dV_j = dV_j + np.swapaxes(P_ij, -1, -2) @ dO_i
    # dP_ij = dO_i V_j^T
    dP_ij = dO_i @ np.swapaxes(V_j, -1, -2)
    # dS_ij = P_ij * (dP_ij - D_i)
    dS_ij = P_ij * (dP_ij - D_i[..., None])
    # dQ_i += scale * dS_ij K_j ;  dK_j += scale * dS_ij^T Q_i
    dQ_i = dQ_i + scale * (dS_ij @ K_j)
    dK_j = dK_j + scale * (np.swapaxes(dS_ij, -1, -2) @ Q_i)
    return dQ_i, dK_j, dV_j


def flash_attn_bwd_lab4(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, block_m=16, block_n=32):
    """FlashAttention-2 backward in NumPy (outer loop over K/V blocks, inner loop over Q blocks). GIVEN.

    q, o, do (B, H, Nq, D); k, v (B, H, Nk, D); lse (B, H, Nq): float32 or float64 NumPy arrays, o and
    lse from the forward (lse = -inf for a row that sees no key). causal is bottom-right aligned (query
    i sees key j iff j <= i + Nk - Nq). Returns (dq, dk, dv) in q's dtype, shaped like q, k, v.
    """
    fn = "flash_attn_bwd_lab4"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=("float32", "float64"))
    check_flag(causal, "causal", fn=fn)
    for name, x, shape in (("o", o, (B, H, Nq, D)), ("do", do, (B, H, Nq, D)), ("lse", lse, (B, H, Nq))):
        if not isinstance(x, np.ndarray) or x.shape != shape:
            raise ValueError(f"{fn}: {name} must be a NumPy array of shape {shape}, got "
                             f"{type(x).__name__} {getattr(x, 'shape', '')}")
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    Br = check_block_size(block_m, "block_m", fn=fn)
    Bc = check_block_size(block_n, "block_n", fn=fn)
    D_all = preprocess(o, do)  # (B, H, Nq)
    dq = np.zeros((B, H, Nq, D), q.dtype)
    dk = np.zeros((B, H, Nk, D), q.dtype)
    dv = np.zeros((B, H, Nk, D), q.dtype)
    for j in range(math.ceil(Nk / Bc)):  # outer loop: one K/V block, its dK_j, dV_j stay "on chip"
        c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
        K_j, V_j = k[:, :, c0:c1], v[:, :, c0:c1]
        dK_j = np.zeros((B, H, c1 - c0, D), q.dtype)
        dV_j = np.zeros((B, H, c1 - c0, D), q.dtype)
        for i in range(math.ceil(Nq / Br)):  # inner loop over Q blocks
            r0, r1 = i * Br, min(Nq, (i + 1) * Br)
            visible = masks.visible(np.arange(r0, r1), np.arange(c0, c1), Nq, Nk, masks.CAUSAL) if causal else None
            if visible is not None and not visible.any():
                continue  # every key of this block is hidden from every row of this Q block
            dQ_i = dq[:, :, r0:r1]
            dQ_i, dK_j, dV_j = backward_block(q[:, :, r0:r1], K_j, V_j, do[:, :, r0:r1], lse[:, :, r0:r1],
                                              D_all[:, :, r0:r1], dQ_i, dK_j, dV_j, scale, visible)
            dq[:, :, r0:r1] = dQ_i  # dQ_i goes back to HBM after every K/V block
        dk[:, :, c0:c1], dv[:, :, c0:c1] = dK_j, dV_j
    return dq, dk, dv
