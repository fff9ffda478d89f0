"""The split-based PyTorch v1 loop, as in tiny-flash-attention, made general and differentiable.

``torch.split`` cuts Q, K, V and the HBM buffers O, l, m into blocks of ``block_size``
rows (the last block may be shorter). Because ``torch.split`` returns *views*, the
in-place ``mul_``/``add_``/``copy_`` on a block of O, l or m writes straight through to
the buffer: that is how the loop "writes back to HBM". The loop order is FlashAttention-1's:
outer over K/V blocks (j), inner over Q blocks (i).

The backward is not autograd through this loop (that would store every block's P and
defeat the purpose): :class:`FlashAttnSplitFunction` saves only q, k, v, O and lse, and its
backward is a second tiled loop that recomputes P_ij = exp(S_ij - lse_i) block by block.
"""
from __future__ import annotations

import torch

from .common import causal_offset
from .validation import (check_block_size, check_flag, check_qkv, check_scale_range, resolve_lazy,
                         resolve_softmax_scale)

__all__ = ["flash_attn_torch", "FlashAttnSplitFunction"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")
_NEG_INF = float("-inf")


def _acc_dtype(dtype):
    """fp64 stays fp64; fp32, fp16 and bf16 accumulate in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scores(Qi, Kj, scale, causal, r0, c0, Nq, Nk, return_hidden=False):
    """S_ij = scale * Q_i K_j^T (fp32 or fp64), -inf where the causal rule hides a key (and that mask, or None)."""
    S_ij = torch.matmul(Qi, Kj.transpose(-2, -1)).mul_(scale)
    Br, Bc = S_ij.shape[-2:]
    hidden = None
    if causal and c0 + Bc - 1 > r0 + causal_offset(Nq, Nk):  # block touches the diagonal
        rows = torch.arange(r0, r0 + Br, device=S_ij.device)[:, None]
        cols = torch.arange(c0, c0 + Bc, device=S_ij.device)[None, :]
        hidden = cols > rows + causal_offset(Nq, Nk)
        S_ij.masked_fill_(hidden, _NEG_INF)
    return (S_ij, hidden) if return_hidden else S_ij


def _fully_masked(r0, Br, c0, Nq, Nk):
    """Causal: no query of rows [r0, r0+Br) sees any key from column c0 on."""
    return c0 > r0 + Br - 1 + causal_offset(Nq, Nk)


def _forward(q, k, v, causal, scale, block_size):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    acc = _acc_dtype(q.dtype)
    # HBM buffers: O (unnormalised until the end), l = running row sum, m = running row max
    O = torch.zeros((B, H, Nq, D), dtype=acc, device=q.device)
    l = torch.zeros((B, H, Nq, 1), dtype=acc, device=q.device)
    m = torch.full((B, H, Nq, 1), _NEG_INF, dtype=acc, device=q.device)

    Q_BLOCKS = torch.split(q, block_size, dim=-2)
    K_BLOCKS = torch.split(k, block_size, dim=-2)
    V_BLOCKS = torch.split(v, block_size, dim=-2)
    O_BLOCKS = torch.split(O, block_size, dim=-2)  # views: in-place updates land in O
    L_BLOCKS = torch.split(l, block_size, dim=-2)
    M_BLOCKS = torch.split(m, block_size, dim=-2)

    for j, (Kj, Vj) in enumerate(zip(K_BLOCKS, V_BLOCKS)):  # outer loop over K/V blocks
        c0 = j * block_size
        Kj, Vj = Kj.to(acc), Vj.to(acc)
        for i, Qi in enumerate(Q_BLOCKS):  # inner loop over Q blocks
            r0 = i * block_size
            if causal and _fully_masked(r0, Qi.shape[-2], c0, Nq, Nk):
                continue
            Oi, li, mi = O_BLOCKS[i], L_BLOCKS[i], M_BLOCKS[i]
            S_ij = _scores(Qi.to(acc), Kj, scale, causal, r0, c0, Nq, Nk)
            # m_new = max(m_old, rowmax(S_ij))
            m_new = torch.maximum(mi, S_ij.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)  # row with no visible key yet
            # P_ij = exp(S_ij - m_new)      (in place: S_ij becomes P_ij)
            P_ij = S_ij.sub_(m_safe).exp_()
            # alpha = exp(m_old - m_new)
            alpha = torch.exp(mi - m_safe)
            # l_i = alpha * l_i + rowsum(P_ij)   (in place, written through to l)
            li.mul_(alpha).add_(P_ij.sum(dim=-1, keepdim=True))
            # O_i = alpha * O_i + P_ij V_j       (in place, written through to O)
            Oi.mul_(alpha).add_(torch.matmul(P_ij, Vj))
            mi.copy_(m_new)
    # O = O / l ; lse = m + log(l) ; rows that saw no key (l = 0): O = 0, lse = -inf.
    # l = NaN (a NaN score, or a +inf one: exp(inf - inf)) gives O = NaN and lse = NaN, or +inf where m = +inf,
    # as the reference does (``seen = l > 0`` would be False for NaN and silently give 0).
    none = l == 0
    l_div = torch.where(none, torch.ones_like(l), l)
    O = torch.where(none, torch.zeros_like(O), O / l_div)
    lse = torch.where(none, torch.full_like(m, _NEG_INF),
                      torch.where(m == float("inf"), m, m + torch.log(l_div)))
    return O.to(q.dtype), lse.squeeze(-1)


def _backward(q, k, v, O, lse, dO, causal, scale, block_size):
    acc = _acc_dtype(q.dtype)
    Nq, Nk = q.shape[2], k.shape[2]
    # D_i = rowsum(dO_i * O_i)
    Delta = (dO.to(acc) * O.to(acc)).sum(dim=-1, keepdim=True)
    lse = lse.unsqueeze(-1).to(acc)
    no_key = lse == _NEG_INF
    # rows that saw no key have P = 0; a row with a +inf score (lse = +inf) has P = NaN, as in the reference
    lse_safe = lse.masked_fill(no_key, 0.0).masked_fill(lse == float("inf"), float("nan"))
    Q_BLOCKS, dO_BLOCKS = torch.split(q, block_size, dim=-2), torch.split(dO, block_size, dim=-2)
    LSE_BLOCKS, NOKEY_BLOCKS = torch.split(lse_safe, block_size, dim=-2), torch.split(no_key, block_size, dim=-2)
    DELTA_BLOCKS = torch.split(Delta, block_size, dim=-2)
    K_BLOCKS, V_BLOCKS = torch.split(k, block_size, dim=-2), torch.split(v, block_size, dim=-2)
    # the gradient blocks are tensors of their own, joined at the end (the forward's in-place updates of
    # split views are its lesson; the backward keeps to fresh tensors, which torch.compile handles everywhere)
    dQ_BLOCKS = [torch.zeros(Qi.shape, dtype=acc, device=q.device) for Qi in Q_BLOCKS]
    dK_BLOCKS = [torch.zeros(Kj.shape, dtype=acc, device=q.device) for Kj in K_BLOCKS]
    dV_BLOCKS = [torch.zeros(Vj.shape, dtype=acc, device=q.device) for Vj in V_BLOCKS]
    for j, (Kj, Vj) in enumerate(zip(K_BLOCKS, V_BLOCKS)):  # outer loop over K/V blocks
        c0 = j * block_size
        Kj, Vj = Kj.to(acc), Vj.to(acc)
        dKj, dVj = dK_BLOCKS[j], dV_BLOCKS[j]
        for i, Qi in enumerate(Q_BLOCKS):  # inner loop over Q blocks
            r0 = i * block_size
            if causal and _fully_masked(r0, Qi.shape[-2], c0, Nq, Nk):
                continue
            Qi, dOi = Qi.to(acc), dO_BLOCKS[i].to(acc)
            S_ij, hidden = _scores(Qi, Kj, scale, causal, r0, c0, Nq, Nk, return_hidden=True)
            # P_ij = exp(S_ij - lse_i)   (recomputed, never stored)
            P_ij = S_ij.sub_(LSE_BLOCKS[i]).exp_().masked_fill_(NOKEY_BLOCKS[i], 0.0)
            if hidden is not None:  # a hidden key has P_ij = 0 exactly, even in a NaN row
                P_ij.masked_fill_(hidden, 0.0)
            # dV_j += P_ij^T dO_i
            dVj.add_(torch.matmul(P_ij.transpose(-2, -1), dOi))
            # dS_ij = P_ij * (dO_i V_j^T - D_i)
            dS_ij = P_ij.mul_(torch.matmul(dOi, Vj.transpose(-2, -1)).sub_(DELTA_BLOCKS[i]))
            if hidden is not None:  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
                dS_ij.masked_fill_(hidden, 0.0)
            # dQ_i += scale * dS_ij K_j ;  dK_j += scale * dS_ij^T Q_i
            dQ_BLOCKS[i].add_(torch.matmul(dS_ij, Kj), alpha=scale)
            dKj.add_(torch.matmul(dS_ij.transpose(-2, -1), Qi), alpha=scale)
    dQ, dK, dV = (torch.cat(blocks, dim=-2) for blocks in (dQ_BLOCKS, dK_BLOCKS, dV_BLOCKS))
    return dQ.to(q.dtype), dK.to(k.dtype), dV.to(v.dtype)


class FlashAttnSplitFunction(torch.autograd.Function):
    """autograd.Function: forward = the split v1 loop, backward = the tiled recompute loop."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_size):
        O, lse = _forward(q, k, v, causal, scale, block_size)
        ctx.save_for_backward(q, k, v, O, lse)
        ctx.causal, ctx.scale, ctx.block_size = causal, scale, block_size
        ctx.mark_non_differentiable(lse)
        return O, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dO, _dlse):
        # once_differentiable: the backward loop is not itself differentiable, so a double backward
        # (create_graph=True, then a gradient penalty) raises a clear RuntimeError instead of
        # silently dropping the second-order term
        q, k, v, O, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, O, lse, dO, ctx.causal, ctx.scale, ctx.block_size)
        return dq, dk, dv, None, None, None


def flash_attn_torch(q, k, v, *, causal=False, softmax_scale=None, block_size=64, return_lse=False):
    """FlashAttention-1 loop with ``torch.split`` blocks, on CPU or CUDA tensors; differentiable.

    Arguments
        q: (B, H, Nq, D); k, v: (B, H, Nk, D). torch tensors, float16/bfloat16/float32/float64,
           on one device, any strides. fp16/bf16/fp32 accumulate in fp32, fp64 in fp64.
        causal: bottom-right aligned mask: query i sees key j iff j <= i + Nk - Nq.

                Nq=Nk=3      Nq=2, Nk=4       Nq=3, Nk=2
                  k0 k1 k2     k0 k1 k2 k3      k0 k1
              q0  1  0  0   q0 1  1  1  0   q0  0  0   <- no key: O = 0, lse = -inf
              q1  1  1  0   q1 1  1  1  1   q1  1  0
              q2  1  1  1                   q2  1  1

        softmax_scale: defaults to 1/sqrt(D).
        block_size: rows per block for Q and K/V (Br = Bc); the last block may be shorter; a block_size
            longer than the sequences is one block.
        return_lse: also return lse (B, H, Nq), float32 (float64 for float64 inputs), not differentiable.

    conj/neg views (``is_conj()``/``is_neg()``) are resolved first. NaN and inf in q, k, v give what the
    float64 reference gives; a softmax_scale whose scores could overflow the compute dtype is refused.
    The backward is once-differentiable: a double backward raises a RuntimeError.

    Returns O (B, H, Nq, D) in q's dtype, and lse if asked.
    """
    fn = "flash_attn_torch"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("torch",), dtypes=_DTYPES)
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: compute on their values, not their memory
    check_flag(causal, "causal", fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_scale_range(q, k, scale, fn=fn, compute="float64" if q.dtype == torch.float64 else "float32")
    # a block longer than the sequence is one block (torch.split would overflow on block_size = 2**64)
    block_size = min(check_block_size(block_size, "block_size", fn=fn), max(Nq, Nk))
    O, lse = FlashAttnSplitFunction.apply(q, k, v, causal, scale, block_size)
    if q.dtype != torch.float64:
        lse = lse.float()
    return (O, lse) if return_lse else O
