"""The one reference: softmax(Q K^T * scale) V, computed in float64.

Every test in the project compares against :func:`attention_reference`. The same
code, run in the inputs' own dtype, is :func:`attention_naive`: the "standard
attention" that materialises the whole (Nq, Nk) score matrix. The tests use it as
the yardstick for tolerances (a backend may be at most 2x as far from the float64
reference as naive attention in the same dtype), and the benchmark times it.
"""
from __future__ import annotations

import numpy as np

from .validation import array_kind, check_flag, check_qkv, resolve_softmax_scale

__all__ = ["attention_reference", "attention_reference_grads", "attention_naive"]


def _naive_torch(q, k, v, causal: bool, scale: float, need_lse: bool = True):
    """softmax(q k^T * scale) v in q's dtype (torch tensors), rows that see no key give 0 / -inf.

    Returns (O, lse); lse is None unless ``need_lse`` (it costs another pass over S, in fp32 for fp16/bf16).
    """
    import torch

    Nq, Nk = q.shape[-2], k.shape[-2]
    S = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        S = S.masked_fill(j > i + (Nk - Nq), float("-inf"))
    # lse = log(sum_j exp(S_ij)), computed stably; -inf for a row that sees no key
    lse = None
    if need_lse:
        lse = torch.logsumexp(S.float() if S.dtype in (torch.float16, torch.bfloat16) else S, dim=-1)
    P = torch.softmax(S, dim=-1)
    if causal and Nq > Nk:  # rows i < Nq - Nk see no key: softmax of an all -inf row is NaN; it attends to nothing
        P = torch.nan_to_num(P, nan=0.0)
    return torch.matmul(P, v), lse


def attention_reference(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    """Exact attention in float64: ``O = softmax(q k^T * softmax_scale) v``.

    Arguments
        q: (B, H, Nq, D), k: (B, H, Nk, D), v: (B, H, Nk, D); NumPy arrays or torch tensors
           (any float dtype, any device, any strides).
        causal: mask aligned to the bottom-right: query i sees key j iff j <= i + Nk - Nq.

                Nq=Nk=3      Nq=2, Nk=4       Nq=3, Nk=2
                  k0 k1 k2     k0 k1 k2 k3      k0 k1
              q0  1  0  0   q0 1  1  1  0   q0  0  0   <- no key: O = 0, lse = -inf
              q1  1  1  0   q1 1  1  1  1   q1  1  0
              q2  1  1  1                   q2  1  1

        softmax_scale: defaults to 1/sqrt(D).
        return_lse: also return lse (B, H, Nq) = log(sum_j exp(scaled score)) (natural log).

    Returns float64 results of the input's array type: O (B, H, Nq, D), and lse if asked.
    """
    fn = "attention_reference"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn)
    check_flag(causal, "causal", fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    import torch

    was_numpy = array_kind(q) == "numpy"
    if was_numpy:
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)) for x in (q, k, v))
    else:
        q, k, v = (x.detach().to(torch.float64) for x in (q, k, v))
    o, lse = _naive_torch(q, k, v, causal, scale)
    if was_numpy:
        o, lse = o.numpy(), lse.numpy()
    return (o, lse) if return_lse else o


def attention_naive(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    """Standard attention in the inputs' own dtype (torch tensors; NumPy arrays go through torch).

    Materialises S = q k^T (B, H, Nq, Nk) and P = softmax(S): O(Nq*Nk) memory. Differentiable
    through autograd. Same shapes and semantics as :func:`attention_reference`.
    """
    fn = "attention_naive"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn)
    check_flag(causal, "causal", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    if array_kind(q) == "numpy":
        import torch

        o, lse = _naive_torch(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)), causal, scale,
                              return_lse)
        o, lse = o.numpy(), (lse.numpy() if return_lse else None)
    else:
        o, lse = _naive_torch(q, k, v, causal, scale, return_lse)
    return (o, lse) if return_lse else o


def attention_reference_grads(q, k, v, do, *, causal=False, softmax_scale=None):
    """Exact gradients in float64: (dq, dk, dv) of sum(O * do) with O = attention_reference(q, k, v).

    Same shapes, semantics and array types as :func:`attention_reference`; do is (B, H, Nq, D).
    Computed by autograd through the float64 standard attention.
    """
    fn = "attention_reference_grads"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    import torch

    was_numpy = array_kind(q) == "numpy"
    to64 = (lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))) if was_numpy else (
        lambda x: x.detach().to(torch.float64))
    q, k, v = (to64(x).requires_grad_(True) for x in (q, k, v))
    with torch.enable_grad():
        o, _ = _naive_torch(q, k, v, causal, scale, need_lse=False)
        o.backward(to64(do))
    grads = (q.grad, k.grad, v.grad)
    return tuple(g.numpy() for g in grads) if was_numpy else grads
