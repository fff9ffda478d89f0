"""The public entry point, the input checks and the autograd.Function of the Triton backend.

    flash_attn_triton(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                      dropout_p=0.0, dropout_seed=None, return_lse=False)

The launchers (``launch.py``) and the kernels take the mask as a window (left, right)
(``flash_attention_py.masks``: causal = (-1, 0), full = (-1, -1)), which
``validation.resolve_window(causal, window_size)`` gives. k and v may have fewer heads than q
(grouped-query attention); dropout draws its keep mask from ``dropout_seed`` (``flash_attention_py.philox``).
What the backend takes (dtypes per device, head dims, variants) is read from ``capabilities.CAPABILITIES``.
"""
from __future__ import annotations

import torch

from flash_attention_py import masks
from flash_attention_py.custom_ops import call_forward, on_device
from flash_attention_py.validation import (cached_check, check_dropout, check_flag, check_qkv, check_scale_range,
                                           resolve_lazy, resolve_softmax_scale, resolve_window)

from flash_attention_cuda.launch_plans import PUBLIC, run_public

from . import launch_plans  # flash_attn_triton's C++ launch plans (on the CUDA rung's extension)
from . import library_ops  # the custom ops torch.ops.fa_ladder.triton_fwd / triton_bwd (over launch.py)
from .capabilities import BF16_CPU_REASON, CAPABILITIES, interpreter_on
# the launchers, also reachable from here (library_ops, benchmarks and notebook 5 use them by this module's name)
from .launch import FP32_PRECISION, _backward, _call_key, _forward, _hooks_on, _window, best_configs  # noqa: F401

__all__ = ["flash_attn_triton", "FlashAttnTritonFunction", "INTERPRETED", "MAX_HEAD_DIM", "DTYPES"]

CAPABILITY = CAPABILITIES["triton"]
# Was Triton imported with its interpreter on? (decided once, when the kernels were decorated)
INTERPRETED = interpreter_on()
MAX_HEAD_DIM = CAPABILITY.max_head_dim
DTYPES = CAPABILITY.dtypes  # dtype names per device ('cpu' only under the interpreter)


class FlashAttnTritonFunction(torch.autograd.Function):
    """autograd.Function: forward kernel; backward = dQ kernel (with Delta) + dK/dV kernel.

        FlashAttnTritonFunction.apply(q, k, v, causal, scale, window_size=(-1, -1), dropout_p=0.0,
                                      dropout_seed=None) -> (o, lse)

    Inputs already checked (``flash_attn_triton`` checks them). Saves q, k, v, O and lse (B, H, Nq) only:
    P is recomputed block by block in the backward, and the dropout mask is drawn again from the seed.
    lse is returned as a non-differentiable output.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, window_size=masks.FULL, dropout_p=0.0, dropout_seed=None):
        window = masks.window_for(causal, window_size)
        o, lse = _forward(q, k, v, window, scale, dropout_p=dropout_p, dropout_seed=dropout_seed)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.scale, ctx.dropout = window, scale, (dropout_p, dropout_seed)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # a double backward raises, never drops the 2nd-order term
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.window, ctx.scale, dropout_p=ctx.dropout[0],
                               dropout_seed=ctx.dropout[1])
        return dq, dk, dv, None, None, None, None, None


def check_inputs(q, k, v, *, fn: str = "flash_attn_triton"):
    """The project's checks plus the Triton backend's own: returns (B, H, Nq, Nk, D) (H: q's heads; k and v
    may have Hk heads with H % Hk == 0, grouped-query attention)."""
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch",), gqa=True)
    dev = q.device.type
    dt = str(q.dtype).replace("torch.", "")
    if dev not in DTYPES:
        raise ValueError(f"{fn}: q, k, v must be CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
                         f"got device {q.device}")
    if dev == "cpu" and not INTERPRETED:
        raise ValueError(
            f"{fn}: q, k, v are CPU tensors but Triton was imported without its interpreter; expected CUDA "
            "tensors, or set TRITON_INTERPRET=1 before importing triton to run the kernels on the CPU (slow)")
    if dev == "cpu" and dt == "bfloat16":
        raise TypeError(f"{fn}: q, k, v have dtype {BF16_CPU_REASON}")
    if dt not in DTYPES[dev]:
        raise TypeError(f"{fn}: dtype {dt} is not supported on {dev}; expected one of {', '.join(DTYPES[dev])}")
    if dev == "cuda" and dims.B * dims.H > 65535:
        raise ValueError(f"{fn}: q has B * H = {dims.B * dims.H} (shape {tuple(q.shape)}); the kernels launch one grid "
                         "row per (batch, head) and a CUDA grid has at most 65535: expected B * H <= 65535")
    if not CAPABILITY.supports_head_dim(dims.D):
        raise ValueError(f"{fn}: q has head dim D = {dims.D} (shape {tuple(q.shape)}); expected "
                         f"{CAPABILITY.head_dim_text()}")
    return dims


def _dropout(dropout_p, dropout_seed, *, fn: str) -> tuple:
    """(p, seed) of ``validation.check_dropout``; the default (no dropout) is taken as it is, without the check's
    NumPy float32 rounding, which ``torch.compile`` would trace as data-dependent branching (a graph break)."""
    if type(dropout_p) in (int, float) and dropout_p == 0 and dropout_seed is None:
        return 0.0, None
    return check_dropout(dropout_p, dropout_seed, fn=fn)


def _check_call(q, k, v, *, fn: str, causal, softmax_scale, window_size, dropout_p, dropout_seed, return_lse):
    """Every check of a flash_attn_triton call -> (q, k, v without lazy views, window, dropout_p, dropout_seed,
    softmax_scale)."""
    B, H, Nq, Nk, D = check_inputs(q, k, v, fn=fn)
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: the kernels read raw memory
    window = resolve_window(causal, window_size, fn=fn)  # checks causal too
    p, seed = _dropout(dropout_p, dropout_seed, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_scale_range(q, k, scale, fn=fn)  # the kernels compute the scores in float32
    return q, k, v, window, p, seed, scale


_CHECKED: dict = {}  # the answers of _check_call, per distinct call (validation.cached_check)


@masks.with_mask_diagram
def flash_attn_triton(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), dropout_p=0.0,
                      dropout_seed=None, return_lse=False):
    """FlashAttention-2 in Triton: ``O = softmax(q k^T * softmax_scale) v``, differentiable.

    Arguments
        q: (B, H, Nq, D); k, v: (B, Hk, Nk, D) with H % Hk == 0: grouped-query attention (Hk = 1:
           multi-query), query head h reads K/V head h // (H // Hk) (no copy of K/V); dk and dv sum the
           gradients of each group. torch tensors, any strides, on one CUDA device
           (float16, bfloat16 or float32), or on the CPU under ``TRITON_INTERPRET=1`` (float16 or
           float32). D <= 256 (other D than 16/32/64/128/256 are padded to a power of two with
           masked loads). float32 matmuls run on the tensor cores as 3xTF32 on the GPU
           (``FP32_PRECISION``, float32-level accuracy), exactly under the interpreter.
           Accumulation is float32; P is rounded to the input dtype before P V, as in FA2.
        {MASK_DIAGRAM}

        window_size: (left, right), default (-1, -1); see the diagram above. ``causal=True`` sets right = 0.
        dropout_p: probability in [0, 1) of dropping each attention weight P_ij (default 0.0: no dropout).
            Kept weights are scaled by 1 / (1 - dropout_p): O = (P * Z / (1 - dropout_p)) v, where
            Z_ij = philox_uniform(dropout_seed, ((b*H + h)*Nq + i)*Nk + j) >= float32(dropout_p)
            (Triton's ``tl.rand``; ``flash_attention_py.philox.keep_mask`` draws the same mask). The backward
            draws Z again from the seed (no N x N mask is stored). lse is that of the softmax before dropout.
        dropout_seed: int in [0, 2**64), required when dropout_p > 0; the same seed gives the same mask.
        softmax_scale: defaults to 1/sqrt(D); any finite real (0 and negative included) whose scores fit
            float32 (else a ValueError: the kernels compute the scores in float32).
        return_lse: also return lse (B, H, Nq) float32 = ln(sum_j exp(scale * S_ij)), not differentiable.

    Returns O (B, H, Nq, D) in q's dtype (contiguous), and lse if asked. Gradients are contiguous.
    With gradients, and under ``torch.compile``, the kernels run as the custom ops
    ``torch.ops.fa_ladder.triton_fwd`` / ``triton_bwd`` (``library_ops.py``), so ``torch.compile(fullgraph=True)``
    compiles a model that calls this with no graph break.
    """
    # a call whose key ran before: its C++ launch plan, or with a gradient the C++ autograd function on its plans;
    # the checks are in the key (launch_plans.py)
    public = None if INTERPRETED or _hooks_on() else launch_plans.public_key(
        q, k, v, causal, softmax_scale, return_lse, window_size, dropout_p, dropout_seed)
    if public is not None:
        hit = PUBLIC.get(public)
        if hit is not None:
            out = run_public(hit, q, k, v)
            if out is not None:
                return out if return_lse else out[0]
    q, k, v, window, p, seed, scale = cached_check(  # the checks, once per distinct call
        _check_call, _CHECKED, q, k, v, fn="flash_attn_triton", causal=causal, softmax_scale=softmax_scale,
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed, return_lse=return_lse)
    # through the torch.library custom op (library_ops.py): one graph node for torch.compile, differentiable
    # through its registered backward op. Eager calls that need no gradient skip its dispatch (~30 us).
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        o, lse = call_forward(library_ops.triton_fwd, q, k, v, False, scale, window[0], window[1], p,
                              library_ops.seed_arg(seed))
    else:
        with on_device(q):
            o, lse = _forward(q, k, v, window, scale, dropout_p=p, dropout_seed=seed)
    if public is not None and public not in PUBLIC:  # the forward's plan, if _forward made one: the next such
        # call skips the checks too
        forward_key = launch_plans.planned_key("triton-fwd", _call_key("fwd", (q, k, v), _window(window), (0.0, 0)),
                                               scale, (0.0, 0))
        launch_plans.remember_public(public, forward_key, public[-1], lambda: python_backward(window, scale))
    return (o, lse) if return_lse else o


def python_backward(window: tuple, scale: float):
    """(q, k, v, o, lse, dO) -> (dQ, dK, dV): the backward of a call without dropout on the Python path, for the C++
    autograd function until its backward has a plan of its own (launch_plans.cpp, ``add_slot``). Under
    create_graph=True it is the backward op, whose own backward raises, as the eager path's does."""

    def backward(q, k, v, o, lse, do):
        if torch.is_grad_enabled():
            return library_ops.triton_bwd(q, k, v, o, lse, do, False, scale, window[0], window[1], 0.0, 0)
        with on_device(q):
            return _backward(q, k, v, o, lse, do, window, scale)

    return backward


def flops(B, H, Nq, Nk, D, causal=False, mode="fwd") -> float:  # convenience for the benchmark
    from flash_attention_py.common import attention_flops

    return attention_flops(B, H, Nq, Nk, D, causal=causal, mode=mode)

