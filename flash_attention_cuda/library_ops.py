"""The CUDA kernels as ``torch.library`` custom ops, so ``torch.compile`` can trace through them.

    torch.ops.fa_ladder.cuda_fwd(q, k, v, causal, scale, kernel) -> (o, lse)
    torch.ops.fa_ladder.cuda_bwd(q, k, v, o, lse, do, causal, scale) -> (dq, dk, dv)

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D) torch CUDA tensors; o (B, H, Nq, D) in q's dtype, contiguous;
lse (B, H, Nq) float32 (natural log); dq, dk, dv contiguous (B, H, N, D) in q's dtype. ``kernel`` is a rung
name already resolved by :func:`flash_attention_cuda.flash_attn_cuda` ('naive', 'tiled', 'mma' or 'wgmma').

A CuPy launch is opaque to Dynamo, so without these ops ``torch.compile`` breaks the graph at every call.
The fake implementations give the compiler the outputs' shapes, dtypes and strides without a GPU (they are
tested on the CPU with fake tensors); the autograd registration differentiates ``cuda_fwd`` through
``cuda_bwd`` (the recompute kernels, :func:`flash_attention_cuda.flash_attn_cuda_backward`). ``cuda_bwd`` is
not differentiable: a second backward raises a ``RuntimeError`` that says so.

The ops take inputs already checked by ``flash_attn_cuda``; CuPy arrays do not go through them.
"""
from __future__ import annotations

import torch

__all__ = ["cuda_fwd", "cuda_bwd", "NAMESPACE"]

NAMESPACE = "fa_ladder"


@torch.library.custom_op(f"{NAMESPACE}::cuda_fwd", mutates_args=())
def cuda_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward kernel of the ladder: (o (B, H, Nq, D) in q's dtype, lse (B, H, Nq) float32)."""
    from .launcher import _forward

    B, H, Nq, D = q.shape
    dims = (B, H, Nq, k.shape[2], D)
    return _forward(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, kernel, dims)


@cuda_fwd.register_fake
def _cuda_fwd_fake(q, k, v, causal, scale, kernel):
    B, H, Nq, D = q.shape
    return q.new_empty((B, H, Nq, D)), q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op(f"{NAMESPACE}::cuda_bwd", mutates_args=())
def cuda_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
             do: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recompute backward (tensor cores for fp16/bf16 with D 64/128, else fp32 tiled): (dq, dk, dv)."""
    from .launcher import flash_attn_cuda_backward

    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    dq, dk, dv = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=causal, softmax_scale=scale)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@cuda_bwd.register_fake
def _cuda_bwd_fake(q, k, v, o, lse, do, causal, scale):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=q.dtype, device=q.device),
            torch.empty(v.shape, dtype=q.dtype, device=q.device))


# ----------------------------------------------------------------------------- autograd
def _fwd_setup_context(ctx, inputs, output):
    q, k, v, causal, scale, kernel = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    if do is None:  # o was not used by the loss
        do = torch.zeros_like(o)
    dq, dk, dv = cuda_bwd(q, k, v, o, lse, do, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None


cuda_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


def _bwd_setup_context(ctx, inputs, output):
    pass


def _bwd_backward(ctx, *grads):
    raise RuntimeError(
        "flash_attn_cuda: double backward is not supported: the backward kernels (fa_ladder::cuda_bwd) are not "
        "differentiable; differentiate once, or use attention_naive for higher-order gradients")


cuda_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup_context)
