"""The glue that makes a backend's kernels ``torch.library`` custom ops, written once for Triton and CUDA.

    fwd, bwd = attention_ops("cuda", public="flash_attn_cuda", forward=..., backward=..., extra="str kernel")

registers two ops in the ``fa_ladder`` namespace:

    torch.ops.fa_ladder.<name>_fwd(q, k, v, causal, scale[, extra...][, variants...]) -> (o, lse)
    torch.ops.fa_ladder.<name>_bwd(q, k, v, o, lse, do, causal, scale[, variants...][, backward_extra...])
        -> (dq, dk, dv)

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D); o (B, H, Nq, D) in q's dtype, contiguous; lse (B, H, Nq)
float32 (natural log); dq, dk, dv contiguous, shaped like q, k, v, in q's dtype.

Why custom ops: a kernel launch (Triton's or CuPy's) is opaque to Dynamo, so ``torch.compile`` would break
the graph at every call. A custom op is one node of the graph: its *fake* implementation tells the compiler
the shapes, dtypes and strides of the outputs without running a kernel (tested on the CPU with fake
tensors), and its autograd registration tells AOTAutograd how to differentiate it: the forward op saves
q, k, v, o and lse and its backward calls the backward op. The backward op is not itself differentiable: a
second backward raises a ``RuntimeError`` that says so. The ops take inputs the public function has checked.

Outside ``torch.compile`` the dispatcher is pure cost: a custom op's autograd goes through several layers of
Python (argument defaults, redispatch, a Dynamo guard), about 200 µs of host time per forward and backward,
as long as the kernels themselves at N = 1024. So :func:`call_forward` runs the op only while compiling and
otherwise ``fwd.eager``, a plain ``torch.autograd.Function`` over the same two functions: the same kernels,
the same saved tensors, and the same double-backward error (a backward that must build a graph goes through
the backward op, whose autograd raises it).

torch is imported inside the functions, so importing this module costs nothing.
"""
from __future__ import annotations

import contextlib
from typing import Callable

__all__ = ["NAMESPACE", "attention_ops", "call_forward", "on_device"]

NAMESPACE = "fa_ladder"


def on_device(x):
    """Run on x's CUDA device when it is not the current one (a no-op for CPU tensors)."""
    import torch

    if x.device.type == "cuda" and x.device.index is not None and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def attention_ops(name: str, *, public: str, forward: Callable, backward: Callable, extra: str = "",
                  variants: str = "", backward_extra: str = "", backward_extra_of: Callable = None):
    """Register ``fa_ladder::{name}_fwd`` and ``fa_ladder::{name}_bwd``; return the two ops.

    forward(q, k, v, causal, scale, *extra_args, *variant_args) -> (o, lse) and backward(q, k, v, o, lse, do,
    causal, scale, *variant_args) -> (dq, dk, dv) run the kernels (do already in q's dtype). extra: schema text
    of the forward's own arguments after scale, e.g. "str kernel". variants: schema text of the arguments both
    ops take last, with defaults (e.g. "int window_left=-1, int window_right=-1"): the forward's autograd hands
    the forward's values to the backward. backward_extra: schema text of the backward op's own arguments after
    the variants, with defaults (e.g. "str bwd_kernel='auto'"); backward_extra_of(*forward_extra_args) gives their
    values from the forward's own (e.g. the backward kernel of a forward rung). public: the public function,
    named in the double-backward error.
    """
    import torch

    extra_args = [a for a in extra.split(",") if a.strip()]
    variant_args = [a for a in variants.split(",") if a.strip()]
    bwd_own_args = [a for a in backward_extra.split(",") if a.strip()]
    n_fixed = 5 + len(extra_args)  # q, k, v, causal, scale, extra...
    fwd_schema = ", ".join(["Tensor q", "Tensor k", "Tensor v", "bool causal", "float scale"] + extra_args
                           + variant_args)
    bwd_schema = ", ".join(["Tensor q", "Tensor k", "Tensor v", "Tensor o", "Tensor lse", "Tensor do", "bool causal",
                            "float scale"] + variant_args + bwd_own_args)

    def fwd_impl(q, k, v, causal, scale, *rest):
        return forward(q, k, v, causal, scale, *rest)

    def bwd_impl(q, k, v, o, lse, do, causal, scale, *rest):
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        return tuple(g.contiguous() for g in backward(q, k, v, o, lse, do, causal, scale, *rest))

    fwd = torch.library.custom_op(f"{NAMESPACE}::{name}_fwd", fwd_impl, mutates_args=(),
                                  schema=f"({fwd_schema}) -> (Tensor, Tensor)")
    bwd = torch.library.custom_op(f"{NAMESPACE}::{name}_bwd", bwd_impl, mutates_args=(),
                                  schema=f"({bwd_schema}) -> (Tensor, Tensor, Tensor)")

    @fwd.register_fake
    def _fwd_fake(q, k, v, causal, scale, *rest):
        B, H, Nq, D = q.shape
        return q.new_empty((B, H, Nq, D)), q.new_empty((B, H, Nq), dtype=torch.float32)

    @bwd.register_fake
    def _bwd_fake(q, k, v, o, lse, do, causal, scale, *rest):
        return tuple(torch.empty(x.shape, dtype=q.dtype, device=q.device) for x in (q, k, v))

    def fwd_setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs[:5]
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.variant_args = tuple(inputs[n_fixed:])
        ctx.bwd_own_args = tuple(backward_extra_of(*inputs[5:n_fixed])) if backward_extra_of else ()
        ctx.mark_non_differentiable(lse)

    def fwd_backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:  # o was not used by the loss
            do = torch.zeros_like(o)
        dq, dk, dv = bwd(q, k, v, o, lse, do, ctx.causal, ctx.scale, *ctx.variant_args, *ctx.bwd_own_args)
        return (dq, dk, dv, None, None) + (None,) * (len(extra_args) + len(variant_args))

    def bwd_backward(ctx, *grads):
        raise RuntimeError(
            f"{public}: double backward is not supported: the backward kernels ({NAMESPACE}::{name}_bwd) are not "
            "differentiable; differentiate once, or use attention_naive for higher-order gradients")

    fwd.register_autograd(fwd_backward, setup_context=fwd_setup_context)
    bwd.register_autograd(bwd_backward, setup_context=lambda ctx, inputs, output: None)

    class Eager(torch.autograd.Function):
        """The forward op's eager twin (see the module docstring): no dispatcher between autograd and the kernels."""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, *rest):
            o, lse = fwd_impl(q, k, v, causal, scale, *rest)
            fwd_setup_context(ctx, (q, k, v, causal, scale) + rest, (o, lse))
            ctx.set_materialize_grads(False)  # lse's gradient stays None: no zero tensor filled per backward
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            if torch.is_grad_enabled():  # create_graph=True: the backward op, whose own backward raises
                return fwd_backward(ctx, do, dlse)
            q, k, v, o, lse = ctx.saved_tensors
            if do is None:  # o was not used by the loss
                do = torch.zeros_like(o)
            dq, dk, dv = bwd_impl(q, k, v, o, lse, do, ctx.causal, ctx.scale, *ctx.variant_args, *ctx.bwd_own_args)
            return (dq, dk, dv, None, None) + (None,) * (len(extra_args) + len(variant_args))

    fwd.eager = Eager.apply
    return fwd, bwd


def call_forward(fwd, *args):
    """``fwd(*args)`` (a forward op of :func:`attention_ops`) while ``torch.compile`` traces, else its eager
    twin ``fwd.eager(*args)``: the same (o, lse) and gradients with a fraction of the host time."""
    import torch

    return fwd(*args) if torch.compiler.is_compiling() else fwd.eager(*args)
