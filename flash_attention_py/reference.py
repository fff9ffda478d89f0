"""The one reference: softmax(Q K^T * scale) V, computed in float64.

Every test in the project compares against :func:`attention_reference`. The same
code, run in the inputs' own dtype, is :func:`attention_naive`: the "standard
attention" that materialises the whole (Nq, Nk) score matrix. The tests use it as
the yardstick for tolerances (a backend may be at most 2x as far from the float64
reference as naive attention in the same dtype), and the benchmark times it.
"""
from __future__ import annotations

import numpy as np

from . import masks
from .validation import (FLOAT_DTYPES, array_kind, check_flag, check_qkv, check_same_as,
                         check_scale_range, dtype_name, resolve_dropout, resolve_lazy, resolve_softmax_scale, resolve_window)

__all__ = ["attention_reference", "attention_reference_grads", "attention_naive"]


def _naive_torch(q, k, v, scale: float, need_lse: bool = True, exact: bool = True, *, window=masks.FULL,
                 dropout=None):
    """softmax(S) v with S = q k^T * scale, in q's dtype (torch tensors); the keys hidden by ``window``
    (a (left, right) window of :mod:`masks`) get S = -inf.

    q (B, Hq, Nq, D); k, v (B, Hk, Nk, D) with Hq % Hk == 0 (grouped-query attention: query head h reads K/V
    head h // (Hq // Hk), by broadcasting, without a copy of K or V; autograd sums dK, dV over each group).
    dropout: None, or (p, seed): P is multiplied by Z / (1 - p), Z the keep mask of ``masks.dropout_keep``
    (the rule of ``philox.keep_mask``), drawn for the whole (Nq, Nk) matrix of each (b, h); lse is the
    softmax's before dropout.

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

    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[-2]
    G = Hq // Hk  # query heads per K/V head
    # (B, Hk, G, Nq, D) @ (B, Hk, 1, D, Nk): the G query heads of a group share their K/V head (a broadcast)
    S = (torch.matmul(q.reshape(B, Hk, G, Nq, D), k.unsqueeze(2).transpose(-2, -1)) * scale).reshape(B, Hq, Nq, Nk)
    hidden = None
    if masks.block_kind(0, Nq, 0, Nk, Nq, Nk, window) != "full":  # some key is hidden from some query
        hidden = ~masks.visible(torch.arange(Nq, device=q.device), torch.arange(Nk, device=q.device), Nq, Nk, window)
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
    if hidden is not None:  # a hidden key has P = 0 exactly, even in a NaN row
        P = P.masked_fill(hidden, 0.0)
    if dropout is not None and dropout[0] > 0:
        p, seed = dropout
        heads = torch.arange(B * Hq, device=q.device).reshape(B, Hq)  # b * Hq + h
        keep = masks.dropout_keep(seed, p, heads, torch.arange(Nq, device=q.device),
                                  torch.arange(Nk, device=q.device), Nq, Nk)
        P = P.masked_fill(~keep, 0.0) * (1.0 / (1.0 - p))  # a dropped weight is 0 exactly, even in a NaN row
    o = torch.matmul(P.reshape(B, Hk, G, Nq, Nk), v.unsqueeze(2)).reshape(B, Hq, Nq, v.shape[-1])
    return (o if exact else o.masked_fill(dead, 0.0)), lse


def _variants(fn, causal, window_size, dropout_p, dropout_seed):
    """The checked (window, dropout) of a call: window (left, right) of :mod:`masks`, dropout (p, seed) or None."""
    return resolve_window(causal, window_size, fn=fn), resolve_dropout(dropout_p, dropout_seed, fn=fn)


@masks.with_mask_diagram
def attention_reference(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, window_size=(-1, -1),
                        dropout_p=0.0, dropout_seed=None):
    """Exact attention in float64: ``O = softmax(q k^T * softmax_scale) v``.

    Arguments
        q: (B, Hq, Nq, D), k: (B, Hk, Nk, D), v: (B, Hk, Nk, D) (Hk = Hq without grouped-query attention);
           NumPy arrays or torch tensors (any float dtype, any device, any strides).
        {MASK_DIAGRAM}

        {VARIANTS}
        softmax_scale: defaults to 1/sqrt(D).
        return_lse: also return lse (B, Hq, Nq) = log(sum_j exp(scaled score)) (natural log).

    Non-finite values (what every backend must reproduce, in O, lse and the gradients):
        a row that sees no key, or whose every visible score is -inf:  O = 0,   lse = -inf
        a row with a NaN score (NaN in q_i, or in a key it sees):      O = NaN, lse = NaN
        a row with a +inf score and no NaN:                            O = NaN, lse = +inf
    A hidden key (causal, window) or a dropped weight has P_ij = 0 exactly, so a NaN or inf in it does not
    reach that query's P. (Under masking, a NaN/inf in a v row a query cannot see, or in a query row that
    cannot see a key, can still reach that query's O or that key's gradient here through 0 * inf in the dense
    matmul, while a tiled backend skips the hidden block: the pattern is specified for pairs that see each other.)

    Returns float64 results of the input's array type: O (B, Hq, Nq, D), and lse if asked.
    """
    fn = "attention_reference"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, gqa=True)
    window, dropout = _variants(fn, causal, window_size, dropout_p, dropout_seed)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    import torch

    was_numpy = array_kind(q) == "numpy"
    if was_numpy:
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)) for x in (q, k, v))
    else:
        q, k, v = (x.detach().to(torch.float64) for x in (q, k, v))
    o, lse = _naive_torch(q, k, v, scale, window=window, dropout=dropout)
    if was_numpy:
        o, lse = o.numpy(), lse.numpy()
    return (o, lse) if return_lse else o


@masks.with_mask_diagram
def attention_naive(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, window_size=(-1, -1),
                    dropout_p=0.0, dropout_seed=None):
    """Standard attention in the inputs' own dtype (torch tensors; NumPy arrays go through torch).

    Materialises S = q k^T (B, Hq, Nq, Nk) and P = softmax(S): O(Nq*Nk) memory. Differentiable
    through autograd. Same shapes and semantics as :func:`attention_reference`:
        {MASK_DIAGRAM}

        {VARIANTS}
    """
    fn = "attention_naive"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, gqa=True)
    window, dropout = _variants(fn, causal, window_size, dropout_p, dropout_seed)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_scale_range(q, k, scale, fn=fn, compute=dtype_name(q))  # it computes in the inputs' own dtype
    check_flag(return_lse, "return_lse", fn=fn)
    if array_kind(q) == "numpy":
        import torch

        native = q.dtype.newbyteorder("=")  # torch takes native byte order only
        o, lse = _naive_torch(*(torch.from_numpy(np.ascontiguousarray(x, dtype=native)) for x in (q, k, v)), scale,
                              return_lse, exact=False, window=window, dropout=dropout)
        o, lse = o.numpy(), (lse.numpy() if return_lse else None)
    else:
        q, k, v = (resolve_lazy(x) for x in (q, k, v))
        o, lse = _naive_torch(q, k, v, scale, return_lse, exact=False, window=window, dropout=dropout)
    return (o, lse) if return_lse else o


@masks.with_mask_diagram
def attention_reference_grads(q, k, v, do, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                              dropout_p=0.0, dropout_seed=None):
    """Exact gradients in float64: (dq, dk, dv) of sum(O * do) with O = attention_reference(q, k, v, ...).

    Same shapes, semantics and array types as :func:`attention_reference`; do is (B, Hq, Nq, D). With
    grouped-query attention dk and dv (B, Hk, Nk, D) are summed over the query heads of each group.
        {MASK_DIAGRAM}

        {VARIANTS}
    Computed by autograd through the float64 standard attention (the same dropout mask as the forward's).
    """
    fn = "attention_reference_grads"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, gqa=True)
    window, dropout = _variants(fn, causal, window_size, dropout_p, dropout_seed)
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
        o, _ = _naive_torch(q, k, v, scale, need_lse=False, window=window, dropout=dropout)
        o.backward(to64(do))
    grads = (q.grad, k.grad, v.grad)
    return tuple(g.numpy() for g in grads) if was_numpy else grads
