"""The few formulas every backend shares: the causal rule and the FLOP count.

Causal masking is aligned to the bottom-right corner, as in FlashAttention 2.1+:
query row ``i`` may see key column ``j`` iff ``j <= i + Nk - Nq``.

    Nq = Nk = 4 (the usual lower triangle)   Nq = 2, Nk = 5 (queries are the last 2 positions)
        k0 k1 k2 k3                              k0 k1 k2 k3 k4
    q0   1  0  0  0                          q0   1  1  1  1  0
    q1   1  1  0  0                          q1   1  1  1  1  1
    q2   1  1  1  0
    q3   1  1  1  1                          Nq = 5, Nk = 2 (more queries than keys)
                                                 k0 k1
                                             q0   0  0   <- sees no key: output 0, lse = -inf
                                             q1   0  0   <- sees no key
                                             q2   0  0   <- sees no key
                                             q3   1  0
                                             q4   1  1
"""
from __future__ import annotations

import numpy as np

__all__ = ["causal_offset", "causal_visible", "causal_kv_end", "attention_flops"]


def causal_offset(Nq: int, Nk: int) -> int:
    """Shift of the diagonal: query i sees keys j <= i + causal_offset(Nq, Nk)."""
    return Nk - Nq


def causal_visible(q_idx, k_idx, Nq: int, Nk: int):
    """Boolean mask (len(q_idx), len(k_idx)): True where query q_idx[r] may see key k_idx[c]."""
    q_idx = np.asarray(q_idx)[:, None]
    k_idx = np.asarray(k_idx)[None, :]
    return k_idx <= q_idx + causal_offset(Nq, Nk)


def causal_kv_end(q_end: int, Nq: int, Nk: int) -> int:
    """One past the last key any of the queries [.., q_end) can see: the K/V loop stops there."""
    return max(0, min(Nk, q_end + causal_offset(Nq, Nk)))


def attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, *, causal: bool = False, mode: str = "fwd") -> float:
    """FLOPs of one attention call: 4·B·H·Nq·Nk·D (two matmuls), x0.5 causal, x2.5 for backward.

    ``mode`` is 'fwd', 'bwd' or 'fwd+bwd' (= 3.5x the forward).
    """
    flops = 4.0 * B * H * Nq * Nk * D
    if causal:
        flops *= 0.5
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
    if mode not in factor:
        raise ValueError(f"attention_flops: mode must be one of {sorted(factor)}, got {mode!r}")
    return flops * factor[mode]
