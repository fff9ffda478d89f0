"""Lab 4: the inner step of the FlashAttention-2 backward, in NumPy.

The backward never stores the (Nq, Nk) matrix P. For each pair (Q block i, K/V block j) it recomputes
P_ij from the forward's log-sum-exp and adds that pair's share to three gradients (names as in the
FlashAttention-2 paper, Algorithm 2):

    S_ij  = scale * Q_i K_j^T              (-inf where the causal rule hides a key)
    P_ij  = exp(S_ij - lse_i)              the forward's probabilities, recomputed
    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - D_i)           D_i = rowsum(dO_i * O_i), computed once before the loop
    dQ_i += scale * dS_ij K_j
    dK_j += scale * dS_ij^T Q_i

Your job: write the two functions marked TODO below.

  1. preprocess(O, dO) -> D = rowsum(dO * O)
  2. backward_block(Q_i, K_j, V_j, dO_i, lse_i, D_i, dQ_i, dK_j, dV_j, scale, visible) -> (dQ_i, dK_j, dV_j)
     Careful: a row that sees no key at all (causal with Nq > Nk) has lse = -inf, and every S_ij of it
     is -inf: exp(-inf - (-inf)) is NaN. Its P_ij must be 0.

The loop that calls them (flash_attn_bwd_lab4, below) is given: read it, do not change it (the grader
runs its own copy of it with your two functions). Check your work from the repository root:

    python notebooks/labs/grade.py lab4                   # grades this file
    python notebooks/labs/grade.py lab4 path/to/copy.py   # grades your own copy

The grader compares dQ, dK, dV with the float64 gradients of attention_reference_grads and prints a
hint for the first case that fails. Shapes below: ``...`` are the leading (B, H) axes.
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
    # TODO(lab4): one line: the row sum over the last axis of dO * O.
    raise NotImplementedError("preprocess is not written yet: fill in the TODO(lab4) in preprocess")


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
    # TODO(lab4): write the inner step (about 10 lines), in this order:
    #   S_ij  = scale * Q_i @ K_j^T              np.swapaxes(K_j, -1, -2); np.where(visible, S_ij, -np.inf)
    #   P_ij  = exp(S_ij - lse_i)                lse_i[..., None]; where lse_i = -inf subtract 0 instead
    #   dV_j  = dV_j + P_ij^T @ dO_i
    #   dP_ij = dO_i @ V_j^T
    #   dS_ij = P_ij * (dP_ij - D_i)             D_i[..., None]
    #   dQ_i  = dQ_i + scale * dS_ij @ K_j
    #   dK_j  = dK_j + scale * dS_ij^T @ Q_i
    raise NotImplementedError("backward_block is not written yet: fill in the TODO(lab4) in backward_block")


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
