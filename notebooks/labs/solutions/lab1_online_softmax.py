"""Lab 1 solution: the online-softmax merge step of the FlashAttention-2 loop, in NumPy.

This is the reference answer to ``notebooks/labs/lab1_online_softmax.py``; the loop around it is
identical to the template's. It is the same arithmetic as ``flash_attention_py.numpy_flash``'s
``_forward_v2`` (the repository's NumPy rung), split into the two functions the lab asks for.

    python notebooks/labs/grade.py lab1 --solution
"""
from __future__ import annotations

import math

import numpy as np

from flash_attention_py import masks
from flash_attention_py.validation import check_block_size, check_flag, check_qkv, resolve_softmax_scale


def merge_block(m_old, l_old, acc_old, S_ij, V_j):
    """Fold one K/V block into the running statistics of one Q block.

    Shapes (``...`` are the leading (B, H) axes):
        m_old   (..., Br)      running row max of the scores seen so far (-inf: no key seen yet)
        l_old   (..., Br)      running row sum of exp(S - m_old)
        acc_old (..., Br, D)   running unnormalised output: sum over seen keys of exp(S - m_old) V
        S_ij    (..., Br, Bc)  scaled scores of this block, -inf where a key is hidden (causal)
        V_j     (..., Bc, D)   values of this block
    Returns (m_new, l_new, acc_new) with the shapes of (m_old, l_old, acc_old).
    """
    # m_new = max(m_old, rowmax(S_ij))
    m_new = np.maximum(m_old, S_ij.max(axis=-1))
    # a row that has seen no key yet keeps m = -inf; subtract 0 there so exp(-inf - 0) = 0, not NaN
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
    # P_ij = exp(S_ij - m_new)            unnormalised probabilities of this block
    P_ij = np.exp(S_ij - m_safe[..., None])
    # alpha = exp(m_old - m_new)          rescales everything accumulated under the old max
    alpha = np.exp(m_old - m_safe)
    # l_new = alpha * l_old + rowsum(P_ij)
    l_new = alpha * l_old + P_ij.sum(axis=-1)
    # acc_new = alpha * acc_old + P_ij V_j
    acc_new = alpha[..., None] * acc_old + P_ij @ V_j
    return m_new, l_new, acc_new


def finalize(m, l, acc):
    """Turn the final statistics of a Q block into its output rows and log-sum-exp.

    m, l (..., Br); acc (..., Br, D). Returns O (..., Br, D) = acc / l and lse (..., Br) = m + log(l);
    a row that saw no key (l == 0) gets O = 0 and lse = -inf.
    """
    seen = l > 0
    l_div = np.where(seen, l, 1.0)
    # O_i = acc / l
    O = np.where(seen[..., None], acc / l_div[..., None], 0.0)
    # lse_i = m + log(l)
    lse = np.where(seen, m + np.log(l_div), -np.inf)
    return O, lse


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
