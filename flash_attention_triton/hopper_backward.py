"""The one-kernel backward on a Hopper GPU (sm_90), in Gluon: FlashAttention-3's structure, written in Triton. The
Triton rung's backward for every call ``takes`` accepts (``launch.HOPPER_BACKWARD``; ``FA_TRITON_HOPPER_BACKWARD=0``
turns it off); the others run ``backward_kernels.py``.

``backward_kernels.py`` is FlashAttention-2's backward in two kernels: the dQ kernel computes S_ij and dP_ij again,
so a tile pair costs 7 matrix products instead of 5. This kernel computes each tile pair's S_ij and dP_ij once, as
``wgmma_backward.cu``'s ``wgmma_bwd_ws`` and FlashAttention-3 do, and sums dQ_i over the K/V blocks in float32
global memory (``dQaccum``):

    copy warp (1 warp)          K_j, V_j (Bc = 128 keys) once; then Q_i, dO_i, lse2_i, Delta_i into slot u % STAGES
                                by TMA, for every Q tile (of every query head of the group) that sees the block
    consumer 0 (4 warps)        keys [0, 64) of the block, columns [0, D / 2) of dQ_i
    consumer 1 (4 warps)        keys [64, 128) of the block, columns [D / 2, D) of dQ_i

  per Q tile (Br = 64 queries), for the consumer's 64 keys (K_j, V_j its rows of the block), in this order:
    S_ij^T  = K_j Q_i^T                 (issued with dP^T, waited for alone)
    dP_ij^T = V_j dO_i^T
    P_ij^T  = exp2(S_ij^T * scale_log2 - lse2_i)      the forward's probabilities, recomputed (lse2_i and Delta_i
                                                      loaded from the slot straight into S's column layout)
    dV_j   += P_ij^T dO_i               (A from registers; runs on while dS is computed)
    dS_ij^T = P_ij^T * (dP_ij^T - Delta_i)
    dS_ij^T -> shared memory; both consumers' halves make dS_ij (Br x 128), read back transposed
    dQ_i   += dS_ij K_j                 (the consumer's D / 2 columns: registers -> shared memory -> the copy
                                         engine adds them to dQaccum, a TMA reduce-add)
    dK_j   += dS_ij^T Q_i               (runs on through the store of dQ's sums)

  mbarriers: kv_bar (K_j, V_j arrived), q_full[s] (the slot's four copies arrived), q_empty[s] (one arrive from
  each consumer once its products that read the slot are done), ds_full[b] (both consumers' dS rows are in buffer
  b; two buffers, as ``wgmma_bwd_ws``).

The sums of dQ set its pace (``docs/results/triton/hopper_backward/``). Each consumer stores its 64 x D / 2 block of
sums to shared memory and hands it to the copy engine (``_tma_reduce_add``), as FlashAttention-3 and
``wgmma_bwd_ws`` do; Gluon's ``tma`` module has no reduce-add, so ``_tma_reduce_add`` calls its op builder's. The
block goes in the order of the accumulator's registers (``DQ_FRAGMENTS``, ``dq_fragment_layout``: conflict-free
stores, one unswizzled reduce-add of 64 x 64), so dQaccum holds each block permuted and
``attn_bwd_dq_fragments_cast_kernel`` puts dQ back in order; in dQ's own order under a 128-byte swizzle
(``DQ_FRAGMENTS=0``, two reduce-adds of 64 x 32) the stores meet 2-way bank conflicts. On an H200 the kernel runs at
0.96-1.07x cuDNN's backward (0.93-1.00x in dQ's own order, the two kernels of ``backward_kernels.py`` 0.69-0.75x).
The same sums as atomic adds from each thread's registers (the kernel before, in the repository's history) ran at
0.58-0.68x, and with no sums at all (dQ then wrong) a development form ran at 1.25-1.37x. The copy engine adds in no
fixed order, so dQ is not bitwise reproducible; dK and dV are.

Under a causal mask the programs go in groups of heads, each group's heaviest K/V blocks first (``head_group``).

Two small Triton kernels frame it: ``attn_bwd_prep_kernel`` (Delta_i = rowsum(dO_i * O_i) and lse2_i = lse_i *
log2(e), padded to whole Q tiles for the copy engine, and dQaccum = 0) and ``attn_bwd_dq_fragments_cast_kernel``
(``attn_bwd_dq_cast_kernel`` with ``DQ_FRAGMENTS=0``: dQ = softmax_scale * dQaccum in the inputs' dtype). Masks, GQA
and splits as in ``backward_kernels.py``: ``masks.q_blocks`` gives the Q tiles that see the block and which of them
need the elementwise mask; a program loops over its share of the group's query heads, summing dK_j, dV_j in
registers; with ``splits`` > 1 (few K/V heads) it writes float32 partial sums that the launcher adds up. What it
takes (``takes``): sm_90, fp16 or bf16, D = 128, any window, GQA, no dropout; q, k, v, dO with TMA's alignment; at
least MIN_FLOPS of work.
"""
import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)
from triton._C.libtriton import ir

from flash_attention_py.masks import CAUSAL

from .backward_kernels import lse_base2
from .hopper_forward import MIN_FLOPS, _aligned, _sm90, _sync_warps, _visible_pairs, shared_layout
from .masks import q_blocks, visible
from .tiles import LOG2E

__all__ = ["takes", "backward", "HEAD_DIMS", "CONFIG"]


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """The copy engine adds the tile in shared memory ``src`` to global memory at ``coord`` of ``tensor_desc``
    (``cp.reduce.async.bulk.tensor ... .add``; out-of-bounds rows are dropped). Gluon's ``tma`` module (Triton 3.6,
    3.7) offers loads and stores only; its op builder has the reduce, which this calls. Wait for it with
    ``tma.store_wait`` before ``src`` is written again."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


BLOCK_M = 64  # Br: queries of one streamed Q tile
HALF_N = 64  # keys of one consumer warpgroup; Bc = 2 * HALF_N
HEAD_DIMS = (128, )
# STAGES: slots of Q_i, dO_i (and lse2_i, Delta_i); COPY_REGS, CONSUMER_REGS: the registers of the worker partitions
# (setmaxnreg); HEAD_GROUP: the order of the programs, None for ``head_group``'s choice (0: a head's K/V blocks in
# turn; G > 0: the heads in groups of G, and within a group every head's block 0, then every head's block 1, ...);
# DQ_FRAGMENTS: 1 keeps dQaccum in the order of the consumers' accumulator registers (``dq_fragment_layout``), 0 in
# dQ's own order under a 128-byte swizzle
CONFIG = dict(STAGES=2, COPY_REGS=24, CONSUMER_REGS=240, HEAD_GROUP=None, DQ_FRAGMENTS=1)
CAUSAL_HEAD_GROUP = 4


def head_group(window, head_bytes: int = 0, l2_bytes: int = 50 << 20) -> int:
    """HEAD_GROUP for a call: CONFIG's, or else CAUSAL_HEAD_GROUP under a causal mask without a left bound, where
    that many programs' Q_i and dO_i (``head_bytes`` each: its share of query heads) fit in the L2 cache together,
    and 0 otherwise. Causal: block 0 sees every Q tile and the last block one or two, so with a head's blocks in
    turn the last heads' heaviest blocks start near the end of the grid; in groups, every group's heaviest blocks
    start first. Otherwise the blocks running at once read one head's Q_i and dO_i from L2, which a group of heads
    too large for L2 would lose (docs/results/triton/hopper_backward/README.md, *Development runs*)."""
    if CONFIG["HEAD_GROUP"] is not None:
        return CONFIG["HEAD_GROUP"]
    return CAUSAL_HEAD_GROUP if tuple(window) == CAUSAL and CAUSAL_HEAD_GROUP * head_bytes <= l2_bytes else 0


@triton.jit
def attn_bwd_prep_kernel(O, DO, LSE, LSE2, DELTA, DQA, stride_dob, stride_doh, stride_don, H, Nq, Nq_pad, DQ_ROWS,
                         HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """For BLOCK rows of one (batch, head): Delta_i = rowsum(dO_i * O_i) and lse2_i = lse_i * log2(e) into DELTA,
    LSE2 (B * H, Nq_pad) float32 (0 past Nq), and dQaccum rows = 0. O (B, H, Nq, HEAD_DIM) and LSE (B, H, Nq)
    contiguous; DQA (B, H, DQ_ROWS, HEAD_DIM) float32, DQ_ROWS Nq or Nq_pad. Grid: (Nq_pad // BLOCK, B * H)."""
    pid_bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM)
    ok = rows < Nq
    o = tl.load(O + (pid_bh * Nq + rows[:, None]) * HEAD_DIM + d[None, :], mask=ok[:, None], other=0.0)
    do_ptrs = DO + (pid_bh // H) * stride_dob + (pid_bh % H) * stride_doh + rows[:, None] * stride_don + d[None, :]
    do = tl.load(do_ptrs, mask=ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    lse2 = lse_base2(tl.load(LSE + pid_bh * Nq + rows, mask=ok, other=0.0))
    tl.store(DELTA + pid_bh * Nq_pad + rows, tl.where(ok, delta, 0.0))
    tl.store(LSE2 + pid_bh * Nq_pad + rows, tl.where(ok, lse2, 0.0))
    tl.store(DQA + (pid_bh * DQ_ROWS + rows[:, None]) * HEAD_DIM + d[None, :], tl.zeros([BLOCK, HEAD_DIM], tl.float32),
             mask=rows[:, None] < DQ_ROWS)


@triton.jit
def attn_bwd_dq_cast_kernel(DQA, DQ, n, softmax_scale, BLOCK: tl.constexpr):
    """dQ = softmax_scale * dQaccum, in DQ's dtype (n elements, both contiguous)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(DQA + offs, mask=offs < n)
    tl.store(DQ + offs, (x * softmax_scale).to(DQ.dtype.element_ty), mask=offs < n)


@triton.jit
def attn_bwd_dq_fragments_cast_kernel(DQA, DQ, n, Nq, Nq_pad, softmax_scale, HEAD_DIM: tl.constexpr,
                                      BLOCK: tl.constexpr):
    """dQ = softmax_scale * dQaccum in DQ's dtype, dQaccum (B, H, Nq_pad, HEAD_DIM) float32 in the consumers' register
    order (``dq_fragment_layout``: each 64 x 64 block of a Q tile's rows and a consumer's columns permuted within
    itself), DQ (B, H, Nq, HEAD_DIM) contiguous, n = DQ.numel()."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    d = offs % HEAD_DIM
    row = (offs // HEAD_DIM) % Nq
    bh = offs // (HEAD_DIM * Nq)
    r = row % 64  # within the block: r = 16 w + 8 rh + r8 (warp, half, row of 8), k = 8 cb + 2 c4 + p (column)
    k = d % 64
    prow = (r // 16) * 16 + (k // 8) * 2 + (r % 16) // 8  # 16 w + 2 cb + rh
    pcol = (r % 8) * 8 + ((k % 8) // 2) * 2 + k % 2  # 8 r8 + 2 c4 + p
    src = (bh * Nq_pad + row - r + prow) * HEAD_DIM + (d - k) + pcol
    x = tl.load(DQA + src, mask=offs < n)
    tl.store(DQ + offs, (x * softmax_scale).to(DQ.dtype.element_ty), mask=offs < n)


@gluon.jit
def _copy_warp(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse_smem,
               delta_smem, kv_bar, q_full, q_empty, off_b, off_hk, first_h, share, H, k_start, start, n_tiles,
               STAGES: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr):
    """The producer: K_j, V_j (both consumers' halves) once, then for each query head of the share and each Q tile
    that sees the block, Q_i, dO_i, lse2_i and Delta_i into slot u % STAGES."""
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [off_b, off_hk, k_start, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [off_b, off_hk, k_start, 0], kv_bar, v_smem)
    tile_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
    for g in range(share):
        off_h = first_h + g
        bh = off_b * H + off_h
        for t in range(n_tiles):
            u = g * n_tiles + t
            s = u % STAGES
            i0 = start + t * BLOCK_M
            # a fresh mbarrier counts the phase before its first as complete: the first STAGES waits return at once
            mbarrier.wait(q_empty.index(s), ((u // STAGES) & 1) ^ 1)
            mbarrier.expect(q_full.index(s), tile_bytes)
            tma.async_copy_global_to_shared(q_desc, [off_b, off_h, i0, 0], q_full.index(s), q_smem.index(s))
            tma.async_copy_global_to_shared(do_desc, [off_b, off_h, i0, 0], q_full.index(s), do_smem.index(s))
            tma.async_copy_global_to_shared(lse_desc, [bh, i0], q_full.index(s), lse_smem.index(s))
            tma.async_copy_global_to_shared(delta_desc, [bh, i0], q_full.index(s), delta_smem.index(s))


@gluon.jit
def _probs(S_ijT, lse2, keys, rows, Nq, Nk, scale_log2, MASKED: gl.constexpr, WINDOW_LEFT: gl.constexpr,
           WINDOW_RIGHT: gl.constexpr):
    """P_ij^T = exp2(S_ij^T * scale_log2 - lse2_i), the forward's probabilities recomputed; MASKED: a partial tile,
    0 where ``masks.visible`` says query i does not see key j."""
    P_ijT = gl.exp2(S_ijT * scale_log2 - lse2[None, :])
    if MASKED:
        P_ijT = gl.where(visible(rows[None, :], keys[:, None], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT), P_ijT, 0.0)
    return P_ijT


@gluon.jit
def _dscores(P_ijT, dP_ijT, delta, keys, rows, Nq, Nk, MASKED: gl.constexpr, WINDOW_LEFT: gl.constexpr,
             WINDOW_RIGHT: gl.constexpr):
    """dS_ij^T = P_ij^T * (dP_ij^T - Delta_i); MASKED: 0 where query i does not see key j (0 * NaN is NaN: a hidden
    pair gets no gradient from a NaN row)."""
    dS_ijT = P_ijT * (dP_ijT - delta[None, :])
    if MASKED:
        dS_ijT = gl.where(visible(rows[None, :], keys[:, None], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT), dS_ijT, 0.0)
    return dS_ijT


@gluon.jit
def _consumer(c: gl.constexpr, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, kv_bar, q_full,
              q_empty, ds_full, dq_desc, dq_smem, DK, DV, off_b, first_h, share, H, k_start, start, full_start, full_end,
              n_tiles, pid_out, Nq, Nk, scale_log2, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, HALF_N: gl.constexpr,
              STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
              DQ_FRAGMENTS: gl.constexpr):
    """Consumer warpgroup c: dK_j, dV_j of keys [k_start + c * HALF_N, + HALF_N), and columns
    [c * HEAD_D / 2, + HEAD_D / 2) of every dQ_i."""
    DQ_COLS: gl.constexpr = HEAD_D // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, DQ_COLS, 16])
    # P_ij^T, dS_ij^T as the A operand of dV's and dK's products, from registers
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    # lse2_i, Delta_i: a row of BLOCK_M floats in shared memory (the copy engine's, unswizzled), read as 1-d rows
    # straight into the layout of S_ij^T's columns (each thread loads the queries of its own columns)
    rows_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    cols_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_smem.dtype
    keys = k_start + c * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
    cols = gl.arange(0, BLOCK_M, layout=cols_layout)
    k_all = k_smem.reshape([2 * HALF_N, HEAD_D])
    k = k_all.slice(c * HALF_N, HALF_N, dim=0)  # this warpgroup's keys
    v = v_smem.reshape([2 * HALF_N, HEAD_D]).slice(c * HALF_N, HALF_N, dim=0)
    k_cols = k_all.slice(c * DQ_COLS, DQ_COLS, dim=1)  # every key, this warpgroup's columns of dQ
    # this warpgroup's sums of dQ_i, handed to the copy engine as DQ_COLS / DQ_BOX boxes of DQ_BOX columns (a box
    # of a 128-byte swizzle spans 128 bytes; the wider tile is those boxes one after another)
    DQ_BOX: gl.constexpr = dq_desc.block_type.shape[3]
    N_BOX: gl.constexpr = DQ_COLS // DQ_BOX
    dq_tile = dq_smem.index(c)
    dq_boxes = dq_tile._reinterpret(gl.float32, [N_BOX, 1, 1, BLOCK_M, DQ_BOX], dq_desc.layout)
    # DQ_FRAGMENTS: the same bytes as a 64 x 64 tile whose memory rows are the accumulator's fragments
    # (dq_fragment_layout: a warp's 32 threads store 256 contiguous bytes, no bank conflict); its one box, unswizzled,
    # lands in dQaccum in that order
    gl.static_assert(not DQ_FRAGMENTS or (BLOCK_M == 64 and DQ_COLS == 64 and N_BOX == 1))
    dq_frag = dq_tile._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], dq_fragment_layout())
    S_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout)
    dQ_zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, q_layout)
    dk = gl.zeros([HALF_N, HEAD_D], gl.float32, g_layout)
    dv = gl.zeros([HALF_N, HEAD_D], gl.float32, g_layout)

    mbarrier.wait(kv_bar, 0)
    for g in range(share):
        for t in range(n_tiles):
            u = g * n_tiles + t
            s = u % STAGES
            i0 = start + t * BLOCK_M
            mbarrier.wait(q_full.index(s), (u // STAGES) & 1)
            q = q_smem.index(s).reshape([BLOCK_M, HEAD_D])
            do = do_smem.index(s).reshape([BLOCK_M, HEAD_D])
            # S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T, both in flight
            S_ijT = warpgroup_mma(k, q.permute((1, 0)), S_zero, use_acc=False, is_async=True)
            dP_ijT = warpgroup_mma(v, do.permute((1, 0)), S_zero, use_acc=False, is_async=True)
            partial = (i0 < full_start) | (i0 >= full_end)
            S_ijT = warpgroup_mma_wait(1, deps=(S_ijT, ))  # S alone: dP runs on through P's exponentials
            lse2 = lse_smem.index(s)._reinterpret(gl.float32, [BLOCK_M], rows_layout).load(cols_layout)
            if partial:
                P_ijT = _probs(S_ijT, lse2, keys, i0 + cols, Nq, Nk, scale_log2, True, WINDOW_LEFT, WINDOW_RIGHT)
            else:
                P_ijT = _probs(S_ijT, lse2, keys, i0 + cols, Nq, Nk, scale_log2, False, WINDOW_LEFT, WINDOW_RIGHT)
            # dV_j += P_ij^T dO_i
            dv = warpgroup_mma(gl.convert_layout(P_ijT.to(dtype), a_layout), do, dv, is_async=True)
            dP_ijT = warpgroup_mma_wait(1, deps=(dP_ijT, ))  # dV's product runs on through dS
            delta = delta_smem.index(s)._reinterpret(gl.float32, [BLOCK_M], rows_layout).load(cols_layout)
            if partial:
                dS_ijT = _dscores(P_ijT, dP_ijT, delta, keys, i0 + cols, Nq, Nk, True, WINDOW_LEFT, WINDOW_RIGHT)
            else:
                dS_ijT = _dscores(P_ijT, dP_ijT, delta, keys, i0 + cols, Nq, Nk, False, WINDOW_LEFT, WINDOW_RIGHT)
            dS16 = dS_ijT.to(dtype)
            # dS_ij^T of this warpgroup's keys into rows [c * HALF_N, + HALF_N) of buffer u % 2; once both
            # warpgroups' rows are there (ds_full), dS_ij is read back transposed as the A operand of dQ's product.
            # Buffer u % 2 is written again at tile u + 2, after the other warpgroup's arrive of tile u + 1, which
            # it makes only once its product of tile u is done
            ds = ds_smem.index(u % 2)
            ds.slice(c * HALF_N, HALF_N, dim=0).store(dS16)
            fence_async_shared()
            _sync_warps()  # every thread of this warpgroup has stored its part
            mbarrier.arrive(ds_full.index(u % 2), count=1)
            mbarrier.wait(ds_full.index(u % 2), (u // 2) & 1)
            # dQ_i (its columns) += dS_ij K_j, then dK_j += dS_ij^T Q_i
            dq = warpgroup_mma(ds.permute((1, 0)), k_cols, dQ_zero, use_acc=False, is_async=True)
            dk = warpgroup_mma(gl.convert_layout(dS16, a_layout), q, dk, is_async=True)
            dv, dq = warpgroup_mma_wait(1, deps=(dv, dq))  # dK's product runs on through the adds
            # dQaccum[rows of Q_i, its columns] += dq, by the copy engine (rows past Nq are dropped); the adds of
            # tile u - 1 have read dq_tile long since, but are waited for before it is written again
            tma.store_wait(0)
            _sync_warps()
            if DQ_FRAGMENTS:
                dq_frag.store(dq)
            else:
                dq_tile.store(dq)
            fence_async_shared()
            _sync_warps()
            for b in gl.static_range(N_BOX):
                _tma_reduce_add(dq_desc, [off_b, first_h + g, i0, c * DQ_COLS + b * DQ_BOX], dq_boxes.index(b))
            dk = warpgroup_mma_wait(0, deps=(dk, ))
            mbarrier.arrive(q_empty.index(s), count=1)
    tma.store_wait(0)  # the last adds have read dq_tile

    # dK_j = softmax_scale * sum dS_ij^T Q_i, dV_j = sum P_ij^T dO_i (over the share's query heads): rows < Nk
    keys_g = k_start + c * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, g_layout))
    d_g = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, g_layout))
    out = pid_out.to(gl.int64) * Nk * HEAD_D + keys_g[:, None] * HEAD_D + d_g[None, :]
    gl.store(DK + out, (dk * (scale_log2 * 0.6931471805599453)).to(DK.dtype.element_ty), mask=keys_g[:, None] < Nk)
    gl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys_g[:, None] < Nk)


@gluon.jit(do_not_specialize=["H", "group", "splits", "Nq", "Nk"])
def attn_bwd_hopper_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, DK, DV, H, group, splits, Nq,
                           Nk, scale_log2, HEAD_D: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                           WINDOW_RIGHT: gl.constexpr, STAGES: gl.constexpr, COPY_REGS: gl.constexpr,
                           CONSUMER_REGS: gl.constexpr, HEAD_GROUP: gl.constexpr, DQ_FRAGMENTS: gl.constexpr):
    """dK_j, dV_j of one K/V block (Bc = 2 * HALF_N keys) of one (batch, K/V head, split) a program, and its part of
    dQaccum.

    q_desc, do_desc: TMA descriptors of Q, dO (B, H, Nq, HEAD_D), blocks (1, 1, BLOCK_M, HEAD_D); k_desc, v_desc: of
    K, V (B, H // group, Nk, HEAD_D), blocks (1, 1, HALF_N, HEAD_D); lse_desc, delta_desc: of LSE2, DELTA (B * H,
    Nq_pad) float32, blocks (1, BLOCK_M); dq_desc: of dQaccum (B, H, Nq_pad with DQ_FRAGMENTS else Nq, HEAD_D)
    float32, zeroed, blocks (1, 1, BLOCK_M, dq_box()); DK, DV (B, Hk * splits, Nk, HEAD_D) contiguous (splits > 1: float32 partial sums of split s at head hk * splits + s). Grid, n = B * Hk *
    splits: (cdiv(Nk, Bc), n) with HEAD_GROUP = 0 (a head's blocks in turn), else (G, n / G * cdiv(Nk, Bc)), G
    dividing n (G heads' block 0, then their block 1, ...).
    """
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    HALF_N: gl.constexpr = k_desc.block_type.shape[2] // 2
    Hk = H // group
    if HEAD_GROUP == 0:  # grid (blocks, heads): a head's blocks in turn
        pid_out = gl.program_id(1)
        pid_kv = gl.program_id(0)
    else:  # grid (G, heads / G * blocks): G heads' block 0, then their block 1, ...
        n_blocks = gl.cdiv(Nk, 2 * HALF_N)
        pid_out = (gl.program_id(1) // n_blocks) * gl.num_programs(0) + gl.program_id(0)
        pid_kv = gl.program_id(1) % n_blocks
    off_b = pid_out // (Hk * splits)
    off_hs = pid_out % (Hk * splits)
    off_hk = off_hs // splits
    share = group // splits
    first_h = off_hk * group + (off_hs % splits) * share  # this program's first query head
    k_start = pid_kv * 2 * HALF_N
    # the Q tiles that see this K/V block: [start, end), of which [full_start, full_end) need no elementwise mask
    start, full_start, full_end, end = q_blocks(k_start, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M, 2 * HALF_N)
    n_tiles = (end - start + BLOCK_M - 1) // BLOCK_M

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [1, 1, 2 * HALF_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [1, 1, 2 * HALF_N, HEAD_D], v_desc.layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * HALF_N, BLOCK_M], q_desc.dtype)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * HALF_N, BLOCK_M], ds_layout)  # dS_ij^T, 2 buffers
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_D // 2], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_D // 2], dq_tile_layout)  # one per consumer
    mbarrier.init(kv_bar, count=1)
    for b in gl.static_range(2):
        mbarrier.init(ds_full.index(b), count=2)  # one arrive from each consumer
    for s in gl.static_range(STAGES):
        mbarrier.init(q_full.index(s), count=1)  # the copy warp's expect, then the copy engine's bytes
        mbarrier.init(q_empty.index(s), count=2)  # one arrive from each consumer

    gl.warp_specialize([
        (_consumer, (0, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, kv_bar, q_full, q_empty, ds_full, dq_desc,
                     dq_smem, DK, DV, off_b, first_h, share, H, k_start, start, full_start, full_end, n_tiles, pid_out, Nq, Nk,
                     scale_log2, HEAD_D, BLOCK_M, HALF_N, STAGES, WINDOW_LEFT, WINDOW_RIGHT, DQ_FRAGMENTS)),
        (_consumer, (1, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ds_smem, kv_bar, q_full, q_empty, ds_full, dq_desc,
                     dq_smem, DK, DV, off_b, first_h, share, H, k_start, start, full_start, full_end, n_tiles, pid_out, Nq, Nk,
                     scale_log2, HEAD_D, BLOCK_M, HALF_N, STAGES, WINDOW_LEFT, WINDOW_RIGHT, DQ_FRAGMENTS)),
        (_copy_warp, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_smem, do_smem, k_smem, v_smem, lse_smem,
                      delta_smem, kv_bar, q_full, q_empty, off_b, off_hk, first_h, share, H, k_start, start, n_tiles,
                      STAGES, BLOCK_M, HALF_N)),
    ], [4, 1], [CONSUMER_REGS, COPY_REGS])


def row_layout():
    """The shared layout of a (1, BLOCK_M) float32 tile of lse2 or Delta (TMA's destination, unswizzled)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def dq_box() -> int:
    """Columns of one reduce-add's box of float32 dQ sums: with DQ_FRAGMENTS a consumer's whole 64 (256 bytes,
    unswizzled), else 32 (128 bytes, the swizzle's span)."""
    return 64 if CONFIG["DQ_FRAGMENTS"] else 32


def dq_layout():
    """The shared layout of a (1, 1, BLOCK_M, dq_box()) float32 box of dQ sums (a reduce-add's source)."""
    if CONFIG["DQ_FRAGMENTS"]:
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=4)
    return shared_layout([1, 1, BLOCK_M, dq_box()], gl.float32)


@gluon.constexpr_function
def dq_fragment_layout():
    """A consumer's 64 x 64 float32 block of dQ sums in shared memory (and so in dQaccum), in the order of its
    accumulator registers. In the wgmma accumulator layout, row r = 16 w + 8 rh + r8 and column k = 8 cb + 2 c4 + p
    sit in warp w, lane 4 r8 + c4, register pair (cb, rh), element p; the block is stored at offset
    64 (16 w + 2 cb + rh) + 8 r8 + 2 c4 + p, so one store instruction of a warp (fixed w, cb, rh) writes 256
    contiguous bytes. Under the 128-byte swizzle of dQ's own order, rows r and r ^ 1 of those stores fall on the
    same banks (two wavefronts where one would do); FlashAttention-3 keeps its dQaccum in register order for the
    same reason. ``attn_bwd_dq_fragments_cast_kernel`` puts dQ back in order."""
    return gl.SharedLinearLayout(offset_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0], [8, 0], [0, 8],
                                               [0, 16], [0, 32], [16, 0], [32, 0]])


@functools.lru_cache(maxsize=None)
def _layouts(D: int, dtype: torch.dtype) -> tuple:
    """The shared layouts of the Q/dO tiles and the K/V tiles."""
    gdt = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return shared_layout([1, 1, BLOCK_M, D], gdt), shared_layout([1, 1, 2 * HALF_N, D], gdt)


def takes(q, k, v, do, dropout: bool, window) -> bool:
    """Whether this kernel runs the call (the module docstring); else ``backward_kernels.py`` does."""
    B, H, Nq, D = q.shape
    return (not dropout and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and D in HEAD_DIMS
            and do.dtype == q.dtype
            and _sm90(q.device.index if q.device.index is not None else torch.cuda.current_device())
            and all(_aligned(x) for x in (q, k, v, do))
            and 4.0 * B * H * D * _visible_pairs(Nq, k.shape[2], tuple(window)) >= MIN_FLOPS)


_COMPILED: dict = {}  # (dtype, D, window, device) -> the compiled Gluon kernel (as hopper_forward.py's)


def splits(q, k) -> int:
    """The split count of a call (how many programs share a K/V block's group of query heads): ``launch.dkdv_splits``
    with a program's share of the group held to the L2 cache, 2 Nq D elements (Q_i and dO_i) a query head. Under a
    causal mask a program's K/V blocks see ever fewer Q tiles, so the programs running at once drift apart over
    their shares' heads and read all of them at once. On an H200, B1 Hq32 Hk1 N16384 causal: 4 splits (a share of 8
    heads, 64 MiB) 0.95x cuDNN, 8 splits 1.01x; not causal 0.99x both (docs/results/triton/hopper_backward/README.md,
    *Development runs*)."""
    from .launch import dkdv_splits

    B, H, Nq, D = q.shape
    Hk = k.shape[1]
    return dkdv_splits(B, Hk, H // Hk, k.shape[2], q.device, 2 * Nq * D * q.element_size())


def backward(q, k, v, o, lse, do, window, scale: float, splits: int):
    """(dq, dk, dv) for inputs ``takes`` accepted; dk, dv (B, Hk, Nk, D) summed over each group; o, lse contiguous
    (the forward's); window = (left, right); splits as ``splits`` chose."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .launch import device_sizes

    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    group = H // Hk
    Nq_pad = -(-Nq // BLOCK_M) * BLOCK_M
    dev = q.device
    lse2 = torch.empty((B * H, Nq_pad), dtype=torch.float32, device=dev)
    delta = torch.empty((B * H, Nq_pad), dtype=torch.float32, device=dev)
    fragments = bool(CONFIG["DQ_FRAGMENTS"])
    dq_rows = Nq_pad if fragments else Nq  # (in register order a block holds rows past Nq too)
    dqa = torch.empty((B, H, dq_rows, D), dtype=torch.float32, device=dev)
    attn_bwd_prep_kernel[(Nq_pad // BLOCK_M, B * H)](o, do, lse, lse2, delta, dqa, do.stride(0), do.stride(1),
                                                     do.stride(2), H, Nq, Nq_pad, dq_rows, HEAD_DIM=D, BLOCK=BLOCK_M)
    q_layout, kv_layout = _layouts(D, q.dtype)
    descs = (TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, BLOCK_M, D], q_layout),
             TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, 2 * HALF_N, D], kv_layout),
             TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, 2 * HALF_N, D], kv_layout),
             TensorDescriptor(do, list(do.shape), list(do.stride()), [1, 1, BLOCK_M, D], q_layout),
             TensorDescriptor(lse2, list(lse2.shape), list(lse2.stride()), [1, BLOCK_M], row_layout()),
             TensorDescriptor(delta, list(delta.shape), list(delta.stride()), [1, BLOCK_M], row_layout()),
             TensorDescriptor(dqa, list(dqa.shape), list(dqa.stride()), [1, 1, BLOCK_M, dq_box()], dq_layout()))
    dk, dv = torch.empty(k.shape, dtype=k.dtype, device=dev), torch.empty(v.shape, dtype=v.dtype, device=dev)
    dk_out, dv_out = (dk, dv) if splits == 1 else (
        torch.empty((B, Hk * splits, Nk, D), dtype=torch.float32, device=dev) for _ in range(2))
    grid = (-(-Nk // (2 * HALF_N)), B * Hk * splits)
    share_bytes = 2 * (group // splits) * Nq * D * q.element_size()  # Q_i and dO_i of a program's share of heads
    group_of = head_group(window, share_bytes, device_sizes(dev)[1])
    if group_of and grid[0] * grid[1] <= 65535:  # (else: a head's blocks in turn, on the first axis)
        G = max(g for g in range(1, group_of + 1) if grid[1] % g == 0)  # groups of G heads, G dividing the heads
        grid = (G, grid[1] // G * grid[0])
    else:
        group_of = 0
    args = (*descs, dk_out, dv_out, H, group, splits, Nq, Nk, scale * LOG2E)
    config = {**CONFIG, "HEAD_GROUP": group_of}
    consts = (D, window[0], window[1], *config.values())
    key = (q.dtype, D, window, dev, splits == 1, *config.values())
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = attn_bwd_hopper_kernel[grid](*args, *consts, num_warps=4)
    else:
        stream = triton.runtime.driver.active.get_current_stream(dev.index)
        compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *consts)
    dq = torch.empty(q.shape, dtype=q.dtype, device=dev)
    n = dq.numel()
    if fragments:
        attn_bwd_dq_fragments_cast_kernel[(-(-n // 4096), )](dqa, dq, n, Nq, Nq_pad, scale, HEAD_DIM=D, BLOCK=4096)
    else:
        attn_bwd_dq_cast_kernel[(-(-n // 4096), )](dqa, dq, n, scale, BLOCK=4096)
    if splits > 1:
        from .launch import _sum_splits

        _sum_splits(dk, dv, dk_out, dv_out, splits)
    return dq, dk, dv
