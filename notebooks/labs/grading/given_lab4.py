"""The given loop of lab 4, the grader's own copy: the grader calls the student's preprocess and
backward_block from here, never the loop of the student's file. tests/test_labs.py checks that this
loop is the template's, line for line. The two functions below are placeholders for the student's.
"""
from __future__ import annotations

import math

import numpy as np

from flash_attention_py import masks
from flash_attention_py.validation import check_block_size, check_flag, check_qkv, resolve_softmax_scale


def preprocess(O, dO):  # replaced by the student's function
    raise NotImplementedError("preprocess is not written yet: fill in the TODO(lab4) in preprocess")


def backward_block(Q_i, K_j, V_j, dO_i, lse_i, D_i, dQ_i, dK_j, dV_j, scale, visible):  # replaced
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
