"""The one reference: softmax(Q K^T * scale) V, computed in float64.

Every test in the project compares against :func:`attention_reference`. The same
code, run in the inputs' own dtype, is :func:`attention_naive`: the "standard
attention" that materialises the whole (Nq, Nk) score matrix. The tests use it as
the yardstick for tolerances (a backend may be at most 2x as far from the float64
reference as naive attention in the same dtype), and the benchmark times it.
"""
from __future__ import annotations

import numpy as np

from .validation import (FLOAT_DTYPES, array_kind, check_flag, check_qkv, check_same_as, check_scale_range,
                         dtype_name, resolve_lazy, resolve_softmax_scale)

__all__ = ["attention_reference", "attention_reference_grads", "attention_naive"]


def _naive_torch(q, k, v, causal: bool, scale: float, need_lse: bool = True, exact: bool = True):
    """softmax(q k^T * scale) v in q's dtype (torch tensors).

    Non-finite semantics (every backend must give the same): a row whose scores are all -inf (no key
    visible, or every visible score -inf) gives O = 0 and lse = -inf; a row with a NaN score gives
    O = NaN and lse = NaN; a row with a +inf score (and no NaN) gives O = NaN and lse = +inf.

    ``exact`` (the float64 reference): the semantics hold for the gradients too (a row of only -inf scores gets
    zero gradients, a hidden key gets P = 0 even in a NaN row), at the cost of two more passes over S.
    Otherwise (attention_naive, which the benchmark times) the forward only: O is zeroed on rows of only -inf
    scores after P V, which costs a pass over O, not over S (their gradients are NaN).

    Returns (O, lse); lse is None unless ``need_lse`` (it costs another pass over S, in fp32 for fp16/bf16).
    """
    import torch

    Nq, Nk = q.shape[-2], k.shape[-2]
    S = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    hidden = None
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        hidden = j > i + (Nk - Nq)
        S = S.masked_fill(hidden, float("-inf"))
    # lse = log(sum_j exp(S_ij)), computed stably; -inf for a row that sees no key
    lse = None
    if need_lse:
        lse = torch.logsumexp(S.float() if S.dtype in (torch.float16, torch.bfloat16) else S, dim=-1)
    # a row whose scores are all -inf attends to nothing: softmax would give 0/0 = NaN there, so it gets
    # O = 0 (NaN scores elsewhere stay NaN: NaN in, NaN out)
    if lse is not None:
        dead = (lse == float("-inf")).unsqueeze(-1)
    else:
        dead = S.amax(dim=-1, keepdim=True) == float("-inf")
    if exact:  # softmax on zeros in those rows, then zeroed: finite (zero) gradients there
        P = torch.softmax(S.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    else:
        P = torch.softmax(S, dim=-1)
    if hidden is not None:  # a hidden key has P_ij = 0 exactly, even in a NaN row
        P = P.masked_fill(hidden, 0.0)
    o = torch.matmul(P, v)
    return (o if exact else o.masked_fill(dead, 0.0)), lse


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

    Non-finite values (what every backend must reproduce, in O, lse and the gradients):
        a row that sees no key, or whose every visible score is -inf:  O = 0,   lse = -inf
        a row with a NaN score (NaN in q_i, or in a key it sees):      O = NaN, lse = NaN
        a row with a +inf score and no NaN:                            O = NaN, lse = +inf
    A hidden key (causal) has P_ij = 0 exactly, so a NaN or inf in it does not reach that query's P.
    (Under causal masking, a NaN/inf in a v row a query cannot see, or in a query row that cannot see a
    key, can still reach that query's O or that key's gradient here through 0 * inf in the dense matmul,
    while a tiled backend skips the hidden block: the pattern is specified for pairs that see each other.)

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
    check_scale_range(q, k, scale, fn=fn, compute=dtype_name(q))  # it computes in the inputs' own dtype
    check_flag(return_lse, "return_lse", fn=fn)
    if array_kind(q) == "numpy":
        import torch

        native = q.dtype.newbyteorder("=")  # torch takes native byte order only
        o, lse = _naive_torch(*(torch.from_numpy(np.ascontiguousarray(x, dtype=native)) for x in (q, k, v)), causal,
                              scale, return_lse, exact=False)
        o, lse = o.numpy(), (lse.numpy() if return_lse else None)
    else:
        q, k, v = (resolve_lazy(x) for x in (q, k, v))
        o, lse = _naive_torch(q, k, v, causal, scale, return_lse, exact=False)
    return (o, lse) if return_lse else o


def attention_reference_grads(q, k, v, do, *, causal=False, softmax_scale=None):
    """Exact gradients in float64: (dq, dk, dv) of sum(O * do) with O = attention_reference(q, k, v).

    Same shapes, semantics and array types as :func:`attention_reference`; do is (B, H, Nq, D).
    Computed by autograd through the float64 standard attention.
    """
    fn = "attention_reference_grads"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn)
    check_flag(causal, "causal", fn=fn)
    check_same_as(do, "do", q, "q", fn=fn, dtype=dtype_name(do) if hasattr(do, "dtype") else None)
    if dtype_name(do) not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: do must be floating point ({', '.join(FLOAT_DTYPES)}), got {dtype_name(do)}")
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
