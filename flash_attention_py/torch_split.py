"""The split-based PyTorch v1 loop, as in tiny-flash-attention, made general and differentiable.

``torch.split`` cuts Q, K, V and the HBM buffers O, l, m into blocks of ``block_size``
rows (Br = Bc = block_size; the last block may be shorter). Because ``torch.split`` returns
*views*, the in-place ``mul_``/``add_``/``copy_`` on a block O_i, l_i or m_i writes straight
through to the buffer: that is how the loop "writes back to HBM". The loop order is
FlashAttention-1's: outer over K/V blocks (j), inner over Q blocks (i).

Different math from Algorithm 1: O is kept *unnormalised* in HBM (it is the running ``acc`` of
FlashAttention-2) and divided by l once after the loop, as tiny-flash-attention does. That spares
one division of every O_i per (i, j) step, and the in-place update stays one line per formula.

Which blocks are visited and which keys are hidden come from :mod:`flash_attention_py.masks`: the
loops take a window ``(left, right)`` (``validation.resolve_window`` turns the public ``causal`` and
``window_size`` into it), visit only the Q blocks ``q_range`` names for a K/V block, skip 'empty' blocks
and mask only 'partial' ones.

Grouped-query attention and dropout as in the NumPy rung: q viewed as (B, Hk, G, Nq, D), k and v as
(B, Hk, 1, Nk, D) (no copy of K or V); the keep mask of each S_ij block drawn from the seed on the tensors'
device (``masks.dropout_keep``), in the forward and again in the backward.

The backward is not autograd through this loop (that would store every block's P and
defeat the purpose): :class:`FlashAttnSplitFunction` saves only q, k, v, O and lse, and its
backward is a second tiled loop that recomputes P_ij = exp(S_ij - lse_i) block by block.
"""
from __future__ import annotations

import torch

from . import masks
from .validation import (check_block_size, check_flag, check_qkv, check_scale_range, resolve_lazy,
                         resolve_dropout, resolve_softmax_scale, resolve_window)

__all__ = ["flash_attn_torch", "FlashAttnSplitFunction"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")
_NEG_INF = float("-inf")


def _acc_dtype(dtype):
    """fp64 stays fp64; fp32, fp16 and bf16 accumulate in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _q_blocks(j, K_BLOCKS, Q_BLOCKS, block_size, Nq, Nk, window):
    """The inner loop's walk for K/V block j: (i, kind) for each Q block i that sees any key of it.

    Only the Q blocks of ``masks.q_range`` are visited; kind is ``masks.block_kind`` of the pair,
    'full' or 'partial' ('empty' pairs are skipped).
    """
    c0 = j * block_size
    c1 = c0 + K_BLOCKS[j].shape[-2]
    q_start, q_end = masks.q_range(c0, c1, Nq, Nk, window)
    for i in masks.blocks(q_start, q_end, block_size):
        r0 = i * block_size
        kind = masks.block_kind(r0, r0 + Q_BLOCKS[i].shape[-2], c0, c1, Nq, Nk, window)
        if kind != "empty":
            yield i, kind


def _scores(Q_i, K_j, scale, window, kind, r0, c0, Nq, Nk, return_hidden=False):
    """S_ij = scale * Q_i K_j^T (fp32 or fp64) with -inf where the window hides a key (and that mask, or None).

    ``kind`` is ``masks.block_kind`` of the block; ``hidden`` is the (Br, Bc) mask of a 'partial' block,
    None for a 'full' one.
    """
    S_ij = torch.matmul(Q_i, K_j.transpose(-2, -1)).mul_(scale)
    hidden = None
    if kind == "partial":
        Br, Bc = S_ij.shape[-2:]
        rows = torch.arange(r0, r0 + Br, device=S_ij.device)
        cols = torch.arange(c0, c0 + Bc, device=S_ij.device)
        hidden = ~masks.visible(rows, cols, Nq, Nk, window)
        S_ij.masked_fill_(hidden, _NEG_INF)
    return (S_ij, hidden) if return_hidden else S_ij


def _grouped(q, k, v):
    """Views for grouped-query attention (no copy): q (B, Hq, N, D) -> (B, Hk, G, N, D) with G = Hq // Hk, and
    k, v (B, Hk, Nk, D) -> (B, Hk, 1, Nk, D): a K/V block broadcasts over the G query heads that read it
    (query head h = hk * G + g reads K/V head hk)."""
    Hk = k.shape[1]
    return q.unflatten(1, (Hk, q.shape[1] // Hk)), k.unsqueeze(2), v.unsqueeze(2)


def _keep(dropout, heads, i, j, block_size, Br, Bc, Nq, Nk):
    """Dropout's keep mask of block S_ij (rows i * block_size + [0, Br), keys j * block_size + [0, Bc)) for every
    head: ``masks.dropout_keep`` (the rule of ``philox.keep_mask``) on heads' device; None without dropout."""
    if dropout is None:
        return None
    p, seed = dropout
    r0, c0 = i * block_size, j * block_size
    rows = torch.arange(r0, r0 + Br, device=heads.device)
    cols = torch.arange(c0, c0 + Bc, device=heads.device)
    return masks.dropout_keep(seed, p, heads, rows, cols, Nq, Nk)


def _heads(B, Hq, Hk, device):
    """Flat query-head indices b * Hq + h in the grouped layout (B, Hk, G): dropout's offsets start from them."""
    return torch.arange(B * Hq, device=device).reshape(B, Hk, Hq // Hk)


def _forward(q, k, v, window, scale, block_size, dropout=None):
    """The split v1 loop. q (B, Hq, Nq, D), k and v (B, Hk, Nk, D); window: (left, right) of :mod:`masks`;
    dropout: None or (p, seed). Returns O (B, Hq, Nq, D) in q's dtype and lse (B, Hq, Nq)."""
    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    q, k, v = _grouped(q, k, v)  # (B, Hk, G, Nq, D), (B, Hk, 1, Nk, D): every block below has these axes
    lead = q.shape[:3]
    heads = _heads(B, Hq, Hk, q.device) if dropout is not None else None
    acc_t = _acc_dtype(q.dtype)
    # HBM buffers: O (unnormalised, the running acc, until the end), l = running row sum, m = running row max
    O = torch.zeros((*lead, Nq, D), dtype=acc_t, device=q.device)
    l = torch.zeros((*lead, Nq, 1), dtype=acc_t, device=q.device)
    m = torch.full((*lead, Nq, 1), _NEG_INF, dtype=acc_t, device=q.device)

    Q_BLOCKS = torch.split(q, block_size, dim=-2)
    K_BLOCKS = torch.split(k, block_size, dim=-2)
    V_BLOCKS = torch.split(v, block_size, dim=-2)
    O_BLOCKS = torch.split(O, block_size, dim=-2)  # views: in-place updates land in O
    L_BLOCKS = torch.split(l, block_size, dim=-2)
    M_BLOCKS = torch.split(m, block_size, dim=-2)

    for j, (K_j, V_j) in enumerate(zip(K_BLOCKS, V_BLOCKS)):  # outer loop over K/V blocks
        K_j, V_j = K_j.to(acc_t), V_j.to(acc_t)  # (B, Hk, 1, Bc, D): shared by the G query heads of a group
        for i, kind in _q_blocks(j, K_BLOCKS, Q_BLOCKS, block_size, Nq, Nk, window):  # inner: Q blocks seeing K_j
            O_i, l_i, m_i = O_BLOCKS[i], L_BLOCKS[i], M_BLOCKS[i]
            S_ij = _scores(Q_BLOCKS[i].to(acc_t), K_j, scale, window, kind, i * block_size, j * block_size, Nq, Nk)
            # m_new = max(m_i, rowmax(S_ij))
            m_new = torch.maximum(m_i, S_ij.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)  # row with no visible key yet
            # P_ij = exp(S_ij - m_new)      (in place: S_ij becomes P_ij)
            P_ij = S_ij.sub_(m_safe).exp_()
            # alpha = exp(m_i - m_new)
            alpha = torch.exp(m_i - m_safe)
            # l_i = alpha * l_i + rowsum(P_ij)   (in place, written through to l; before dropout: lse is the
            # softmax's own)
            l_i.mul_(alpha).add_(P_ij.sum(dim=-1, keepdim=True))
            Z_ij = _keep(dropout, heads, i, j, block_size, P_ij.shape[-2], P_ij.shape[-1], Nq, Nk)
            if Z_ij is not None:  # dropout: P_ij * Z_ij / (1 - p) (a dropped weight is 0 exactly)
                P_ij.masked_fill_(~Z_ij, 0.0).mul_(1.0 / (1.0 - dropout[0]))
            # O_i = alpha * O_i + P_ij V_j       (in place, written through to O)
            O_i.mul_(alpha).add_(torch.matmul(P_ij, V_j))
            m_i.copy_(m_new)
    # O = O / l ; lse = m + log(l) ; rows that saw no key (l = 0): O = 0, lse = -inf.
    # l = NaN (a NaN score, or a +inf one: exp(inf - inf)) gives O = NaN and lse = NaN, or +inf where m = +inf,
    # as the reference does (``seen = l > 0`` would be False for NaN and silently give 0).
    none = l == 0
    l_div = torch.where(none, torch.ones_like(l), l)
    O = torch.where(none, torch.zeros_like(O), O / l_div)
    lse = torch.where(none, torch.full_like(m, _NEG_INF),
                      torch.where(m == float("inf"), m, m + torch.log(l_div)))
    return O.to(q.dtype).reshape(B, Hq, Nq, D), lse.reshape(B, Hq, Nq)


def _backward(q, k, v, O, lse, dO, window, scale, block_size, dropout=None):
    """The tiled backward, K/V blocks outer. q, O, dO (B, Hq, Nq, D), lse (B, Hq, Nq), k and v (B, Hk, Nk, D);
    window: (left, right) of :mod:`masks`; dropout: None or (p, seed) (the forward's mask, drawn again block by
    block). Returns (dQ, dK, dV) shaped like q, k, v (dK, dV summed over each group of query heads)."""
    acc_t = _acc_dtype(q.dtype)
    B, Hq, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    k_dtype, v_dtype = k.dtype, v.dtype
    q, k, v = _grouped(q, k, v)  # (B, Hk, G, Nq, D), (B, Hk, 1, Nk, D)
    dO, O = dO.unflatten(1, q.shape[1:3]), O.unflatten(1, q.shape[1:3])
    lse = lse.unflatten(1, q.shape[1:3])
    heads = _heads(B, Hq, Hk, q.device) if dropout is not None else None
    inv_keep = 1.0 / (1.0 - dropout[0]) if dropout is not None else 1.0
    # D_i = rowsum(dO_i * O_i)   (O after dropout: also rowsum(P_ij * dP_ij) with dP_ij the dropped weights' gradient)
    Delta = (dO.to(acc_t) * O.to(acc_t)).sum(dim=-1, keepdim=True)
    lse = lse.unsqueeze(-1).to(acc_t)
    no_key = lse == _NEG_INF
    # rows that saw no key have P = 0; a row with a +inf score (lse = +inf) has P = NaN, as in the reference
    lse_safe = lse.masked_fill(no_key, 0.0).masked_fill(lse == float("inf"), float("nan"))
    Q_BLOCKS, dO_BLOCKS = torch.split(q, block_size, dim=-2), torch.split(dO, block_size, dim=-2)
    LSE_BLOCKS, NOKEY_BLOCKS = torch.split(lse_safe, block_size, dim=-2), torch.split(no_key, block_size, dim=-2)
    DELTA_BLOCKS = torch.split(Delta, block_size, dim=-2)
    K_BLOCKS, V_BLOCKS = torch.split(k, block_size, dim=-2), torch.split(v, block_size, dim=-2)
    # the gradient blocks are tensors of their own, joined at the end (the forward's in-place updates of
    # split views are its lesson; the backward keeps to fresh tensors, which torch.compile handles everywhere)
    dQ_BLOCKS = [torch.zeros(Q_i.shape, dtype=acc_t, device=q.device) for Q_i in Q_BLOCKS]
    dK_BLOCKS = [torch.zeros(K_j.shape, dtype=acc_t, device=q.device) for K_j in K_BLOCKS]  # (B, Hk, 1, Bc, D)
    dV_BLOCKS = [torch.zeros(V_j.shape, dtype=acc_t, device=q.device) for V_j in V_BLOCKS]
    for j, (K_j, V_j) in enumerate(zip(K_BLOCKS, V_BLOCKS)):  # outer loop over K/V blocks
        K_j, V_j = K_j.to(acc_t), V_j.to(acc_t)
        dK_j, dV_j = dK_BLOCKS[j], dV_BLOCKS[j]
        for i, kind in _q_blocks(j, K_BLOCKS, Q_BLOCKS, block_size, Nq, Nk, window):  # inner: Q blocks seeing K_j
            Q_i, dO_i = Q_BLOCKS[i].to(acc_t), dO_BLOCKS[i].to(acc_t)
            S_ij, hidden = _scores(Q_i, K_j, scale, window, kind, i * block_size, j * block_size, Nq, Nk,
                                   return_hidden=True)
            # P_ij = exp(S_ij - lse_i)   (recomputed, never stored)
            P_ij = S_ij.sub_(LSE_BLOCKS[i]).exp_().masked_fill_(NOKEY_BLOCKS[i], 0.0)
            if hidden is not None:  # a hidden key has P_ij = 0 exactly, even in a NaN row
                P_ij.masked_fill_(hidden, 0.0)
            # dP_ij = dO_i V_j^T   (the gradient of the weights that multiplied V_j)
            dP_ij = torch.matmul(dO_i, V_j.transpose(-2, -1))
            Z_ij = _keep(dropout, heads, i, j, block_size, P_ij.shape[-2], P_ij.shape[-1], Nq, Nk)
            if Z_ij is None:
                Pd_ij = P_ij
            else:  # dropout: the weights were P_ij * Z_ij / (1 - p); dP_ij flows back through the same factor
                Pd_ij = P_ij.masked_fill(~Z_ij, 0.0).mul_(inv_keep)
                dP_ij.masked_fill_(~Z_ij, 0.0).mul_(inv_keep)
            # dV_j += Pd_ij^T dO_i      (summed over the G query heads that share V_j)
            dV_j.add_(torch.matmul(Pd_ij.transpose(-2, -1), dO_i).sum(dim=2, keepdim=True))
            # dS_ij = P_ij * (dP_ij - D_i)
            dS_ij = P_ij.mul_(dP_ij.sub_(DELTA_BLOCKS[i]))
            if hidden is not None:  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
                dS_ij.masked_fill_(hidden, 0.0)
            # dQ_i += scale * dS_ij K_j ;  dK_j += scale * dS_ij^T Q_i   (dK_j summed over the group)
            dQ_BLOCKS[i].add_(torch.matmul(dS_ij, K_j), alpha=scale)
            dK_j.add_(torch.matmul(dS_ij.transpose(-2, -1), Q_i).sum(dim=2, keepdim=True), alpha=scale)
    dQ, dK, dV = (torch.cat(blocks, dim=-2) for blocks in (dQ_BLOCKS, dK_BLOCKS, dV_BLOCKS))
    return (dQ.to(q.dtype).reshape(B, Hq, Nq, D), dK.to(k_dtype).reshape(B, Hk, Nk, D),
            dV.to(v_dtype).reshape(B, Hk, Nk, D))


class FlashAttnSplitFunction(torch.autograd.Function):
    """autograd.Function: forward = the split v1 loop, backward = the tiled recompute loop."""

    @staticmethod
    def forward(ctx, q, k, v, window, scale, block_size, dropout=None):
        O, lse = _forward(q, k, v, window, scale, block_size, dropout)
        ctx.save_for_backward(q, k, v, O, lse)
        ctx.window, ctx.scale, ctx.block_size, ctx.dropout = window, scale, block_size, dropout
        ctx.mark_non_differentiable(lse)
        return O, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO, _dlse):
        # once_differentiable: the backward loop is not itself differentiable, so a double backward
        # (create_graph=True, then a gradient penalty) raises a clear RuntimeError instead of
        # silently dropping the second-order term
        q, k, v, O, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, O, lse, dO, ctx.window, ctx.scale, ctx.block_size, ctx.dropout)
        return dq, dk, dv, None, None, None, None


@masks.with_mask_diagram
def flash_attn_torch(q, k, v, *, causal=False, softmax_scale=None, block_size=64, return_lse=False,
                     window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """FlashAttention-1 loop with ``torch.split`` blocks, on CPU or CUDA tensors; differentiable.

    Arguments
        q: (B, Hq, Nq, D); k, v: (B, Hk, Nk, D) (Hk = Hq, or a divisor of it). torch tensors,
           float16/bfloat16/float32/float64, on one device, any strides. fp16/bf16/fp32 accumulate in fp32,
           fp64 in fp64.
        {MASK_DIAGRAM}

        {VARIANTS}
            Only the Q blocks that see a K/V block are visited; the keep mask is drawn per S_ij block, on the
            tensors' device, in the forward and again in the backward.

        softmax_scale: defaults to 1/sqrt(D).
        block_size: rows per block for Q and K/V (Br = Bc); the last block may be shorter; a block_size
            longer than the sequences is one block.
        return_lse: also return lse (B, Hq, Nq), float32 (float64 for float64 inputs), not differentiable.

    conj/neg views (``is_conj()``/``is_neg()``) are resolved first. NaN and inf in q, k, v give what the
    float64 reference gives; a softmax_scale whose scores could overflow the compute dtype is refused.
    The backward is once-differentiable: a double backward raises a RuntimeError.

    Returns O (B, Hq, Nq, D) in q's dtype, and lse if asked.
    """
    fn = "flash_attn_torch"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("torch",), dtypes=_DTYPES, gqa=True)
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: compute on their values, not their memory
    window = resolve_window(causal, window_size, fn=fn)
    dropout = resolve_dropout(dropout_p, dropout_seed, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_scale_range(q, k, scale, fn=fn, compute="float64" if q.dtype == torch.float64 else "float32")
    # a block longer than the sequence is one block (torch.split would overflow on block_size = 2**64)
    block_size = min(check_block_size(block_size, "block_size", fn=fn), max(Nq, Nk))
    O, lse = FlashAttnSplitFunction.apply(q, k, v, window, scale, block_size, dropout)
    if q.dtype != torch.float64:
        lse = lse.float()
    return (O, lse) if return_lse else O
