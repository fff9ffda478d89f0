"""The CUDA kernels as ``torch.library`` custom ops, so ``torch.compile`` can trace through them.

    torch.ops.fa_ladder.cuda_fwd(q, k, v, causal, scale, kernel, window_left=-1, window_right=-1,
                                 dropout_p=0.0, seed_lo=0, seed_hi=0) -> (o, lse)
    torch.ops.fa_ladder.cuda_bwd(q, k, v, o, lse, do, causal, scale, window_left=-1, window_right=-1,
                                 dropout_p=0.0, seed_lo=0, seed_hi=0, bwd_kernel='auto') -> (dq, dk, dv)

Shapes: q (B, Hq, Nq, D), k and v (B, Hk, Nk, D) torch CUDA tensors (Hq % Hk == 0); o (B, Hq, Nq, D) in q's
dtype, contiguous; lse (B, Hq, Nq) float32 (natural log); dq, dk, dv contiguous, shaped like q, k, v, in q's
dtype. ``kernel`` is a rung name already resolved by :func:`flash_attention_cuda.flash_attn_cuda` ('naive',
'tiled', 'mma' or 'wgmma'). The mask is ``masks.window_for(causal, (window_left, window_right))`` (causal
bounds the right side at 0, as in the public functions); dropout is (dropout_p, the seed's low and high 32-bit
halves), as the forward call drew it: the backward op draws the same mask again. ``cuda_bwd`` runs the
recompute kernels of its ``bwd_kernel`` (the forward rung's backward, ``capabilities.BACKWARD_OF``: 'mma' for the mma
rung, else 'auto': wgmma on a Hopper, mma.sync elsewhere for fp16/bf16, the fp32 kernels for float32, which
take no variant beyond causal).

The fake implementations, the autograd registration and the double-backward error are the shared ones of
:mod:`flash_attention_py.custom_ops`, whose ``variants=`` arguments the forward's autograd hands to the
backward. The ops take inputs already checked by ``flash_attn_cuda`` (which calls :func:`forward_op` when it
needs the op); CuPy arrays do not go through them.
"""
from __future__ import annotations

from flash_attention_py.custom_ops import NAMESPACE, attention_ops, call_forward
from flash_attention_py.masks import window_for

from .capabilities import BACKWARD_OF
from .launch_specs import run_backward, run_forward

__all__ = ["cuda_fwd", "cuda_bwd", "forward_op", "NAMESPACE"]

# the arguments both ops take after their own, with defaults: the window, then dropout
_VARIANTS = "int window_left=-1, int window_right=-1, float dropout_p=0.0, int seed_lo=0, int seed_hi=0"


def _seed(dropout_p, seed_lo, seed_hi):
    return (float(dropout_p), int(seed_lo) | (int(seed_hi) << 32) if dropout_p > 0 else None)


def _fwd(q, k, v, causal, scale, kernel, window_left=-1, window_right=-1, dropout_p=0.0, seed_lo=0, seed_hi=0):
    window = window_for(causal, (window_left, window_right))  # causal bounds the right side at 0
    return run_forward(q, k, v, window, scale, kernel, dropout=_seed(dropout_p, seed_lo, seed_hi))


def _bwd(q, k, v, o, lse, do, causal, scale, window_left=-1, window_right=-1, dropout_p=0.0, seed_lo=0, seed_hi=0,
         bwd_kernel="auto"):
    window = window_for(causal, (window_left, window_right))  # causal bounds the right side at 0
    return run_backward(q, k, v, o, lse, do, window, scale, bwd_kernel, dropout=_seed(dropout_p, seed_lo, seed_hi))


cuda_fwd, cuda_bwd = attention_ops("cuda", public="flash_attn_cuda", forward=_fwd, backward=_bwd,
                                   extra="str kernel", variants=_VARIANTS,
                                   # not named `kernel`: inductor's fallback passes a default-valued argument by
                                   # name, beside its own parameter of that name
                                   backward_extra="str bwd_kernel='auto'",
                                   backward_extra_of=lambda kernel: (BACKWARD_OF[kernel],))


def python_backward(causal: bool, scale: float, kernel: str, window: tuple):
    """(q, k, v, o, lse, dO) -> (dQ, dK, dV): the backward of forward_op(q, k, v, causal, scale, kernel, window,
    no dropout) on the Python path, for a C++ launch plan's autograd function until its backward has a plan of its
    own (launch_plans.add_slot). Under create_graph=True it is the backward op, whose own backward raises, as the
    eager path's is."""
    import torch

    bwd_kernel = BACKWARD_OF[kernel]

    def backward(q, k, v, o, lse, do):
        if torch.is_grad_enabled():
            return cuda_bwd(q, k, v, o, lse, do, causal, scale, window[0], window[1], 0.0, 0, 0, bwd_kernel)
        return _bwd(q, k, v, o, lse, do, causal, scale, window[0], window[1], bwd_kernel=bwd_kernel)

    return backward


def forward_op(q, k, v, causal: bool, scale: float, kernel: str, window: tuple, dropout: tuple, *, fn: str):
    """cuda_fwd on checked inputs (window resolved, dropout = (p, seed or None)) -> (o, lse).

    Grouped-query K/V heads need nothing here (the shapes carry them)."""
    p, seed = dropout
    seed = seed or 0
    return call_forward(cuda_fwd, q, k, v, causal, scale, kernel, window[0], window[1], p, seed & 0xFFFFFFFF,
                        seed >> 32)
