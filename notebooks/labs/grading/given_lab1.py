"""The given loop of lab 1, the grader's own copy: the grader calls the student's merge_block and
finalize from here, never the loop of the student's file (a file that replaces the loop with a
library call gains nothing). tests/test_labs.py checks that this loop is the template's, line for line.

``merge_block`` and ``finalize`` below are placeholders: the grader sets them to the student's functions.
"""
from __future__ import annotations

import math

import numpy as np

from flash_attention_py import masks
from flash_attention_py.validation import check_block_size, check_flag, check_qkv, resolve_softmax_scale


def merge_block(m_old, l_old, acc_old, S_ij, V_j):  # replaced by the student's function
    raise NotImplementedError("merge_block is not written yet: fill in the TODO(lab1) in merge_block")


def finalize(m, l, acc):  # replaced by the student's function
    raise NotImplementedError("finalize is not written yet: fill in the TODO(lab1) in finalize")


def flash_attn_lab1(q, k, v, *, causal=False, softmax_scale=None, block_m=32, block_n=16, return_lse=False):
    """FlashAttention-2 forward in NumPy (outer loop over Q blocks, inner loop over K/V blocks). GIVEN.

    q (B, H, Nq, D), k and v (B, H, Nk, D): float32 or float64 NumPy arrays. causal is bottom-right
    aligned (query i sees key j iff j <= i + Nk - Nq). Returns O (B, H, Nq, D) in q's dtype, and
    lse (B, H, Nq) if return_lse.
    """
    fn = "flash_attn_lab1"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("numpy",), dtypes=("float32", "float64"))
    check_flag(causal, "causal", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    Br = check_block_size(block_m, "block_m", fn=fn)
    Bc = check_block_size(block_n, "block_n", fn=fn)
    O_hbm = np.empty((B, H, Nq, D), q.dtype)
    lse_hbm = np.empty((B, H, Nq), q.dtype)
    for i in range(math.ceil(Nq / Br)):  # outer loop: one Q block
        r0, r1 = i * Br, min(Nq, (i + 1) * Br)
        Qi = q[:, :, r0:r1]
        m_i = np.full((B, H, r1 - r0), -np.inf, q.dtype)  # running row max
        l_i = np.zeros((B, H, r1 - r0), q.dtype)  # running row sum
        acc = np.zeros((B, H, r1 - r0, D), q.dtype)  # unnormalised O_i
        kv_end = masks.kv_range(r0, r1, Nq, Nk, masks.window_for(causal))[1]
        for j in range(math.ceil(kv_end / Bc)):  # inner loop over K/V blocks
            c0, c1 = j * Bc, min(Nk, (j + 1) * Bc)
            Kj, Vj = k[:, :, c0:c1], v[:, :, c0:c1]
            # S_ij = scale * Q_i K_j^T, -inf where the causal rule hides a key
            S_ij = scale * (Qi @ np.swapaxes(Kj, -1, -2))
            if causal:
                S_ij = np.where(masks.visible(np.arange(r0, r1), np.arange(c0, c1), Nq, Nk, masks.CAUSAL), S_ij, -np.inf)
            m_i, l_i, acc = merge_block(m_i, l_i, acc, S_ij, Vj)
        O_hbm[:, :, r0:r1], lse_hbm[:, :, r0:r1] = finalize(m_i, l_i, acc)
    return (O_hbm, lse_hbm) if return_lse else O_hbm
