"""The Triton kernels as ``torch.library`` custom ops, so ``torch.compile`` can trace through them.

    torch.ops.fa_ladder.triton_fwd(q, k, v, causal, scale) -> (o, lse)
    torch.ops.fa_ladder.triton_bwd(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv)

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D); o (B, H, Nq, D) in q's dtype, contiguous; lse (B, H, Nq)
float32 (natural log); dq, dk, dv contiguous, shaped and typed like q, k, v.

Why custom ops: a Triton launch is opaque to Dynamo (under the interpreter it is plain Python that Dynamo
cannot trace through, on a GPU a launcher it cannot see into), so ``torch.compile`` would break the graph at
every call. A custom op is one node of the graph: its *fake* implementation tells the compiler the shapes,
dtypes and strides of the outputs without running a kernel, and its autograd registration tells AOTAutograd
how to differentiate it (the backward op). ``torch.compile(fullgraph=True)`` of a module that calls
:func:`flash_attention_triton.flash_attn_triton` then compiles with no graph break.

The ops take already-checked inputs: :func:`flash_attn_triton` checks them (shapes, dtypes, devices,
``softmax_scale``) before it calls ``triton_fwd``. The backward op is not itself differentiable: a second
backward (``create_graph=True``, then differentiating the gradients) raises a ``RuntimeError`` that says so.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["triton_fwd", "triton_bwd", "on_device", "NAMESPACE"]

NAMESPACE = "fa_ladder"


def on_device(x):
    """Run on x's CUDA device when it is not the current one (a no-op for CPU tensors)."""
    if x.device.type == "cuda" and x.device.index is not None and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


@torch.library.custom_op(f"{NAMESPACE}::triton_fwd", mutates_args=())
def triton_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel: (o (B, H, Nq, D) in q's dtype, lse (B, H, Nq) float32)."""
    from .attention import _forward

    with on_device(q):
        return _forward(q, k, v, causal, scale)


@triton_fwd.register_fake
def _triton_fwd_fake(q, k, v, causal, scale):
    B, H, Nq, D = q.shape
    return q.new_empty((B, H, Nq, D)), q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::triton_bwd", mutates_args=())
def triton_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
               do: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three backward kernels (Delta, dK/dV, dQ): (dq, dk, dv), contiguous, in q's dtype."""
    from .attention import _backward

    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    with on_device(q):
        return _backward(q, k, v, o, lse, do, causal, scale)


@triton_bwd.register_fake
def _triton_bwd_fake(q, k, v, o, lse, do, causal, scale):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


# ----------------------------------------------------------------------------- autograd
def _fwd_setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:  # o was not used by the loss
        do = torch.zeros_like(o)
    dq, dk, dv = triton_bwd(q, k, v, o, lse, do, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


triton_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


def _bwd_setup_context(ctx, inputs, output):
    pass


def _bwd_backward(ctx, *grads):
    raise RuntimeError(
        "flash_attn_triton: double backward is not supported: the backward kernels (fa_ladder::triton_bwd) are "
        "not differentiable; differentiate once, or use attention_naive for higher-order gradients")


triton_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup_context)
