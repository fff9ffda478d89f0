"""The one FLOP formula every backend and benchmark shares.

(The mask rule, which keys a query sees, lives in :mod:`flash_attention_py.masks`.)
"""
from __future__ import annotations

__all__ = ["attention_flops"]


def attention_flops(B: int, H: int, Nq: int, Nk: int, D: int, *, causal: bool = False, mode: str = "fwd",
                    window_size=None) -> float:
    """FLOPs of one attention call: 4·B·H·Nq·Nk·D (two matmuls), x0.5 causal, x2.5 for backward.

    ``mode`` is 'fwd', 'bwd' or 'fwd+bwd' (= 3.5x the forward). With a sliding window
    (``window_size=(left, right)``, not (-1, -1)) the Nq·Nk scores become the visible ones,
    :func:`flash_attention_py.masks.visible_pairs` (causal then sets right = 0, as in the kernels):
    the work a kernel that skips hidden blocks does, up to the partial blocks on the window's edges.
    """
    if window_size is not None and tuple(window_size) != (-1, -1):
        from .masks import visible_pairs, window_for

        flops = 4.0 * B * H * D * visible_pairs(Nq, Nk, window_for(causal, tuple(window_size)))
    else:
        flops = 4.0 * B * H * Nq * Nk * D
        if causal:
            flops *= 0.5
    factor = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
    if mode not in factor:
        raise ValueError(f"attention_flops: mode must be one of {sorted(factor)}, got {mode!r}")
    return flops * factor[mode]
