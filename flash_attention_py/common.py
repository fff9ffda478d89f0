"""The one FLOP formula every backend and benchmark shares.

(The mask rule, which keys a query sees, lives in :mod:`flash_attention_py.masks`.)
"""
from __future__ import annotations

__all__ = ["attention_flops"]


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
