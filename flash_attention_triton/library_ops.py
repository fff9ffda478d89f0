"""The Triton kernels as ``torch.library`` custom ops, so ``torch.compile`` can trace through them.

    torch.ops.fa_ladder.triton_fwd(q, k, v, causal, scale, window_left=-1, window_right=-1,
                                   dropout_p=0.0, dropout_seed=0) -> (o, lse)
    torch.ops.fa_ladder.triton_bwd(q, k, v, o, lse, do, causal, scale, window_left=-1, window_right=-1,
                                   dropout_p=0.0, dropout_seed=0) -> (dq, dk, dv)

Shapes: q (B, H, Nq, D), k and v (B, Hk, Nk, D) with H % Hk == 0 (grouped-query attention); o (B, H, Nq, D)
in q's dtype, contiguous; lse (B, H, Nq) float32 (natural log, of the softmax before dropout); dq, dk, dv
contiguous, shaped and typed like q, k, v. The mask is ``masks.window_for(causal, (window_left, window_right))``.
dropout_seed is an int64 in the schema: a seed in [2**63, 2**64) travels as its two's complement (seed - 2**64)
and the launcher takes it back modulo 2**64.

Why custom ops: a Triton launch is opaque to Dynamo (under the interpreter it is plain Python that Dynamo
cannot trace through, on a GPU a launcher it cannot see into), so ``torch.compile`` would break the graph at
every call. The fake implementations, the autograd registration (which hands the forward's window and dropout
arguments to the backward op) and the double-backward error are the shared ones of
:mod:`flash_attention_py.custom_ops`. ``torch.compile(fullgraph=True)`` of a module that calls
:func:`flash_attention_triton.flash_attn_triton` then compiles with no graph break. The ops take inputs
``flash_attn_triton`` has checked.
"""
from __future__ import annotations

from flash_attention_py.custom_ops import NAMESPACE, attention_ops, on_device
from flash_attention_py.masks import window_for

from . import launch  # the launchers (launch._forward, launch._backward), looked up at call time

__all__ = ["triton_fwd", "triton_bwd", "on_device", "NAMESPACE", "seed_arg"]

_VARIANTS = "int window_left=-1, int window_right=-1, float dropout_p=0.0, int dropout_seed=0"


def seed_arg(dropout_seed) -> int:
    """A seed in [0, 2**64) (or None: 0) as the schema's int64: seeds >= 2**63 become seed - 2**64."""
    s = 0 if dropout_seed is None else int(dropout_seed)
    return s - 2**64 if s >= 2**63 else s


def _fwd(q, k, v, causal, scale, window_left=-1, window_right=-1, dropout_p=0.0, dropout_seed=0):
    with on_device(q):
        return launch._forward(q, k, v, window_for(causal, (window_left, window_right)), scale,
                               dropout_p=dropout_p, dropout_seed=dropout_seed)


def _bwd(q, k, v, o, lse, do, causal, scale, window_left=-1, window_right=-1, dropout_p=0.0, dropout_seed=0):
    with on_device(q):
        return launch._backward(q, k, v, o, lse, do, window_for(causal, (window_left, window_right)), scale,
                                dropout_p=dropout_p, dropout_seed=dropout_seed)


triton_fwd, triton_bwd = attention_ops("triton", public="flash_attn_triton", forward=_fwd, backward=_bwd,
                                       variants=_VARIANTS)
