"""The forward on a Hopper GPU (sm_90), in Gluon: FlashAttention-3's structure, written in Triton's own lower dialect.

``forward_kernel.py`` is FlashAttention-2 as Triton's compiler schedules it. On a Hopper the compiler makes every
warp of a program load, meets both warpgroups at each stage's barrier, and waits for each tensor-core product right
after issuing it (``tools/sass_summary.py --overlap --triton``): the two warpgroups of a program then take turns at
the tensor cores in lockstep, and the kernel stays near 0.7-0.8x cuDNN. Gluon (``triton.experimental.gluon``, part of
upstream Triton) is Triton with those choices left to the kernel: layouts, shared memory, mbarriers, TMA copies,
``warpgroup_mma`` and its waits, and warp specialisation. This kernel makes them as ``wgmma_ws.cu`` does:

    copy warp (1 warp)          for each work item (Q_i, a block of 128 query rows of one head): Q_i, once both
                                consumers are done with the last item's; then K_j, V_j into slot j % STAGES by
                                TMA, once both consumers freed it
    consumer 0 (4 warps)        rows [0, 64) of Q_i: S_ij, the online softmax, acc += P_ij V_j; O_i
    consumer 1 (4 warps)        rows [64, 128) of Q_i: the same, on its own clock

  mbarriers: q_bar (Q_i arrived), q_empty (one arrive from each consumer after its last S_ij: Q_i's buffer may take
  the next item's), k_full/v_full[s] (the copy engine's bytes arrived), k_empty/v_empty[s] (one arrive from each
  consumer: the slot may be filled again). The consumers never meet at a barrier, so one runs its softmax while the
  other's products are on the tensor cores.

The programs are persistent (``CONFIG["PERSISTENT"]``, FlashAttention-3's scheduler for a causal mask): one per SM,
each taking the next work item from a counter in global memory as it frees up (``_next_item``), so that the copy
warp loads the next item's Q_i and first K/V tiles while the consumers finish the last item's P V and write its O_i.
The copy warp hands each item to the consumers through shared memory between two named barriers (``_publish``,
``_read_item``: ``barrier.arrive``/``barrier.sync`` on ITEM_FULL and ITEM_EMPTY), as FlashAttention-3's scheduler does.
The items go out in the order a grid's blocks would, a head's heaviest query blocks first under a causal mask.

In each consumer, S_i,j+1 = Q_i K_j+1^T is issued before P_ij V_j, acc is rescaled between the two (its multiplies
run while S_i,j+1 is on the tensor cores), and only S is waited for before the next softmax
(``warpgroup_mma_wait(1)``): FlashAttention-3's order; ptxas may still move the wait for P_ij V_j up
(``docs/performance.md`` §8 measures where it lands). On a tile without a mask the softmax takes the row max from
the unscaled scores (the max, or for a negative scale the min, times scale_log2) and computes P_ij as exp2 of one
fma a score (``_softmax_step``; 1.4-3.5 % faster on most rows, ``docs/performance.md`` §9). Names as everywhere:
Br = 2 * HALF_M query rows an item, Bc = BLOCK_N keys a tile, m_i, l_i, acc, S_ij, P_ij; the mask is ``masks.py``'s
(window (LEFT, RIGHT), bottom right; its ``kv_blocks`` gives the tiles a query block visits and which of them need
the elementwise mask).

What it takes (``takes``): a CUDA device of compute capability 9.0, fp16 or bf16, D = 128, any window,
grouped-query heads, no dropout; q, k, v with unit last stride and 16-byte aligned base and strides (TMA's rule);
at least MIN_FLOPS of work. Anything else runs ``forward_kernel.py``. Ragged Nq, Nk: the copy engine fills rows past the end of a head with 0
(its descriptors are 4-d, (B, H, N, D), so a tile never reads the next head), and the mask hides them.
"""
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from flash_attention_py import masks

from .masks import kv_blocks, visible
from .tiles import LOG2E

__all__ = ["takes", "forward", "HEAD_DIMS", "CONFIG"]

# a barrier of the calling partition's warps (gl.thread_barrier in Triton 3.6, gl.barrier from 3.7)
_sync_warps = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

HALF_M = 64  # query rows of one consumer warpgroup; Br = 2 * HALF_M
BLOCK_N = 128  # Bc: keys of one K/V tile
HEAD_DIMS = (128, )  # D = 64 ran no faster than forward_kernel.py (0.99-1.01x at N = 4096, 0.8x at 1024)
# STAGES: slots of K and V each (2: 160 KiB of shared memory at D = 128); COPY_REGS, CONSUMER_REGS: the registers of
# the worker partitions (setmaxnreg: the copy warp gives its registers to the consumers); PERSISTENT: 1 launches one
# program per SM, each taking work items until none is left (``_next_item``), so that the copy warp loads the next
# item's Q_i and first K/V tiles while the consumers finish the last one; 0 launches one program an item;
# RESCALE_EARLY: 1 rescales acc by alpha_i,j-1 after issuing S_ij (FlashAttention-3's place: the multiplies run while
# S_ij is on the tensor cores), 0 at the end of the step, before S_i,j+1 is issued (docs/performance.md §9)
CONFIG = dict(STAGES=2, COPY_REGS=24, CONSUMER_REGS=240, PERSISTENT=1, RESCALE_EARLY=1)


@gluon.jit
def _work_item(w, Nq, Nk, H, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr, HALF_M: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """Work item w: query block w % n_blocks of (batch, head) pid_bh = w // n_blocks -> (q_start, pid_bh, off_b,
    off_h, and ``kv_blocks``' tiles: start, full_start, full_end, n_tiles). With a right bound (causal) a head's
    blocks go in reverse, the heaviest (the last rows see the most keys) first."""
    n_blocks = gl.cdiv(Nq, 2 * HALF_M)
    block = w % n_blocks
    if WINDOW_RIGHT >= 0:
        block = n_blocks - 1 - block
    pid_bh = w // n_blocks
    q_start = block * 2 * HALF_M
    # the K/V tiles of this query block: [start, end), of which [full_start, full_end) need no elementwise mask
    start, full_start, full_end, end = kv_blocks(q_start, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, 2 * HALF_M, BLOCK_N)
    n_tiles = (end - start + BLOCK_N - 1) // BLOCK_N
    return q_start, pid_bh, pid_bh // H, pid_bh % H, start, full_start, full_end, n_tiles


@gluon.jit
def _first_item():
    """This program's first work item: its place in the grid, (P, 1) or (query blocks, B * H)."""
    return gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)


@gluon.jit
def _next_item(COUNTER, n_items, PERSISTENT: gl.constexpr):
    """The next work item of this program: item P + (the items taken so far after the first P), P = num_programs,
    from a counter in global memory (zero at launch) that every program adds 1 to; n_items (none) when one program
    takes one item (PERSISTENT = 0). The items go out in order as programs free up, a head's heaviest blocks first
    under a causal mask, as the hardware hands out a grid's blocks."""
    if PERSISTENT:
        return gl.num_programs(0) + gl.atomic_add(COUNTER, 1)
    else:
        return n_items


# Named barriers for the hand-over of a work item between the copy warp and both consumers (32 + 2 * 128 threads),
# as FlashAttention-3's tile scheduler hands its tiles over: 14, ITEM_FULL (the item is in shared memory) and 15,
# ITEM_EMPTY (both consumers have read it); Triton's partitions use the ids 0-2 here. ``barrier.sync``: wait until all
# 288 threads have reached the barrier; ``barrier.arrive``: count this thread and go on. Either orders the thread's
# earlier shared-memory accesses before those of the threads that the barrier's completion releases. These are the
# forms without ``.aligned`` (``bar.sync`` is ``barrier.sync.aligned``): the aligned forms require every thread of a
# warp to execute the same instruction together, and compute-sanitizer's synccheck found the consumers' threads
# divergent there.
ITEM_FULL_SYNC = gl.constexpr("barrier.sync 14, 288; mov.u32 $0, 0;")
ITEM_FULL_ARRIVE = gl.constexpr("barrier.arrive 14, 288; mov.u32 $0, 0;")
ITEM_EMPTY_SYNC = gl.constexpr("barrier.sync 15, 288; mov.u32 $0, 0;")
ITEM_EMPTY_ARRIVE = gl.constexpr("barrier.arrive 15, 288; mov.u32 $0, 0;")


@gluon.jit
def _bar(asm: gl.constexpr):
    """One of the named-barrier instructions above, in every thread of the partition."""
    gl.inline_asm_elementwise(asm, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _publish(item_smem, w, first: gl.constexpr):
    """The copy warp's item w into shared memory, once both consumers have read the last one (not before the
    ``first``), then ITEM_FULL's arrive."""
    if not first:
        _bar(ITEM_EMPTY_SYNC)
    item_smem.store(gl.full([1], w, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
    _bar(ITEM_FULL_ARRIVE)


@gluon.jit
def _read_item(item_smem):
    """The work item the copy warp published (in a consumer warpgroup), then ITEM_EMPTY's arrive."""
    _bar(ITEM_FULL_SYNC)
    w = gl.max(item_smem.load(gl.BlockedLayout([1], [32], [4], [0])), axis=0)
    _bar(ITEM_EMPTY_ARRIVE)
    return w


@gluon.jit
def _copy_warp(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, item_smem, q_bar, q_empty, k_full, v_full, k_empty,
               v_empty, COUNTER, H, group, Nq, Nk, n_items, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
               HALF_M: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
               PERSISTENT: gl.constexpr):
    """The producer, for each work item w of this program: w itself (``_publish``), Q_i (both halves) once both
    consumers are done with the last item's Q_i, then K_j and V_j (j = start, start + Bc, ...); the program's K/V
    tile number it goes into slot it % STAGES. The last item it publishes is w >= n_items: the consumers stop."""
    it = 0  # K/V tiles loaded so far, over all of this program's items
    k = 0  # items so far
    w = _first_item()
    _publish(item_smem, w, True)
    while w < n_items:
        q_start, pid_bh, off_b, off_h, start, full_start, full_end, n_tiles = _work_item(
            w, Nq, Nk, H, WINDOW_LEFT, WINDOW_RIGHT, HALF_M, BLOCK_N)
        # a fresh mbarrier counts the phase before its first as complete: the first wait of each returns at once
        mbarrier.wait(q_empty, (k & 1) ^ 1)
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [off_b, off_h, q_start, 0], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(q_desc, [off_b, off_h, q_start + HALF_M, 0], q_bar, q_smem.index(1))
        off_hk = off_h // group
        for t in range(n_tiles):
            s = it % STAGES
            phase = (it // STAGES) & 1
            row = start + t * BLOCK_N
            mbarrier.wait(k_empty.index(s), phase ^ 1)
            mbarrier.expect(k_full.index(s), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [off_b, off_hk, row, 0], k_full.index(s), k_smem.index(s))
            mbarrier.wait(v_empty.index(s), phase ^ 1)
            mbarrier.expect(v_full.index(s), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [off_b, off_hk, row, 0], v_full.index(s), v_smem.index(s))
            it += 1
        k += 1
        w = _next_item(COUNTER, n_items, PERSISTENT)
        _publish(item_smem, w, False)
    _bar(ITEM_EMPTY_SYNC)  # the consumers' arrives after reading the end: every barrier completes before the exit


@gluon.jit
def _softmax_step(S_ij, m_i, l_i, rows, cols, Nq, Nk, scale_log2, MASKED: gl.constexpr, WINDOW_LEFT: gl.constexpr,
                  WINDOW_RIGHT: gl.constexpr):
    """One online-softmax step on S_ij (fp32, unscaled): (P_ij, m_new, l_new, alpha), m in base 2 (scaled by
    scale_log2, signed). MASKED: a partial tile (the window's edge or the ragged end): -inf where ``masks.visible``
    says query i does not see key j."""
    if MASKED:
        S_ij = S_ij * scale_log2  # in base 2, the signed scale folded in
        S_ij = gl.where(visible(rows[:, None], cols[None, :], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT), S_ij, float("-inf"))
        m_tile = gl.max(S_ij, axis=1)
        scale = 1.0
    else:  # rowmax(S_ij * scale_log2) from the unscaled scores: the max, or for a negative scale the min, times it
        if scale_log2 >= 0:
            m_tile = gl.max(S_ij, axis=1) * scale_log2
        else:
            m_tile = gl.min(S_ij, axis=1) * scale_log2
        scale = scale_log2
    # m_new = max(m_i, rowmax(S_ij)); a row that has seen no key keeps -inf and subtracts 0 (exp2(-inf) = 0, not NaN)
    m_new = gl.maximum(m_i, m_tile)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    # P_ij = exp2(S_ij - m_new) (unmasked: one fma a score, S_ij * scale_log2 - m_new); alpha = exp2(m_i - m_new);
    # l_i = alpha * l_i + rowsum(P_ij)
    P_ij = gl.exp2(gl.fma(S_ij, scale, -m_sub[:, None]))
    alpha = gl.exp2(m_i - m_sub)
    l_i = l_i * alpha + gl.sum(P_ij, axis=1)
    return P_ij, m_new, l_i, alpha


@gluon.jit
def _step(S_ij, m_i, l_i, rows, cols, Nq, Nk, scale_log2, partial, WINDOW_LEFT: gl.constexpr,
          WINDOW_RIGHT: gl.constexpr):
    """_softmax_step with the elementwise mask on a partial tile only (``partial``: a run-time flag)."""
    if partial:
        P_ij, m_i, l_i, alpha = _softmax_step(S_ij, m_i, l_i, rows, cols, Nq, Nk, scale_log2, True, WINDOW_LEFT,
                                              WINDOW_RIGHT)
    else:
        P_ij, m_i, l_i, alpha = _softmax_step(S_ij, m_i, l_i, rows, cols, Nq, Nk, scale_log2, False, WINDOW_LEFT,
                                              WINDOW_RIGHT)
    return P_ij, m_i, l_i, alpha


@gluon.jit
def _query_block(c: gl.constexpr, q_smem, k_smem, v_smem, q_empty, k_full, v_full, k_empty, v_empty, O, LSE,
                 pid_bh, q_start, start, full_start, full_end, n_tiles, it, Nq, Nk, scale_log2,
                 HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, HALF_M: gl.constexpr, STAGES: gl.constexpr,
                 WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr, RESCALE_EARLY: gl.constexpr):
    """Consumer warpgroup c on one work item: rows [q_start + c * HALF_M, + HALF_M) of Q_i against every K/V tile
    of the block, once its Q_i has arrived; its tile t is the program's tile it + t (slot (it + t) % STAGES)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    # P_ij as the A operand of P_ij V_j, from registers: S_ij's accumulator layout is already that operand's
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    rows = q_start + c * HALF_M + gl.arange(0, HALF_M, layout=row_s)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    q = q_smem.index(c).reshape([HALF_M, HEAD_D])
    S_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([HALF_M, HEAD_D], gl.float32, o_layout)  # unnormalised O_i
    m_i = gl.full([HALF_M], float("-inf"), gl.float32, row_s)  # running row max (base 2)
    l_i = gl.zeros([HALF_M], gl.float32, row_s)  # running row sum of exp2(S2 - m)

    if n_tiles > 0:  # (none: every row of the block lies outside the window)
        # tile 0 alone: S_i0 = Q_i K_0^T, its softmax
        s0 = it % STAGES
        mbarrier.wait(k_full.index(s0), (it // STAGES) & 1)
        S_ij = warpgroup_mma(q, k_smem.index(s0).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), S_zero, use_acc=False,
                             is_async=True)
        S_ij = warpgroup_mma_wait(0, deps=(S_ij, ))
        mbarrier.arrive(k_empty.index(s0), count=1)
        P_ij, m_i, l_i, alpha = _step(S_ij, m_i, l_i, rows, start + cols, Nq, Nk, scale_log2,
                                      (start < full_start) | (start >= full_end), WINDOW_LEFT, WINDOW_RIGHT)
        for t in range(1, n_tiles):
            s = (it + t) % STAGES
            sp = (it + t - 1) % STAGES
            k0 = start + t * BLOCK_N
            # issue S_ij = Q_i K_j^T, then acc += P_i,j-1 V_j-1 in m_i,j-1's scale
            mbarrier.wait(k_full.index(s), ((it + t) // STAGES) & 1)
            S_ij = warpgroup_mma(q, k_smem.index(s).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), S_zero,
                                 use_acc=False, is_async=True)
            mbarrier.wait(v_full.index(sp), ((it + t - 1) // STAGES) & 1)
            if RESCALE_EARLY:  # acc = alpha_i,j-1 * acc: into m_i,j-1's scale, while S_ij is on the tensor cores
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            acc = warpgroup_mma(gl.convert_layout(P_ij.to(dtype), p_layout),
                                v_smem.index(sp).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
            # wait for S_ij alone: P V stays on the tensor cores through the softmax
            S_ij = warpgroup_mma_wait(1, deps=(S_ij, ))
            mbarrier.arrive(k_empty.index(s), count=1)
            P_ij, m_i, l_i, alpha = _step(S_ij, m_i, l_i, rows, k0 + cols, Nq, Nk, scale_log2,
                                          (k0 < full_start) | (k0 >= full_end), WINDOW_LEFT, WINDOW_RIGHT)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(sp), count=1)
            if not RESCALE_EARLY:  # acc = alpha_ij * acc: into m_ij's scale, before S_i,j+1 is issued
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        # every S_ij is done: Q_i's buffer may take the next item's
        mbarrier.arrive(q_empty, count=1)
        # the last tile's P V
        sl = (it + n_tiles - 1) % STAGES
        mbarrier.wait(v_full.index(sl), ((it + n_tiles - 1) // STAGES) & 1)
        if RESCALE_EARLY:
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(P_ij.to(dtype), p_layout), v_smem.index(sl).reshape([BLOCK_N, HEAD_D]),
                            acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(sl), count=1)
    else:
        mbarrier.arrive(q_empty, count=1)

    # O_i = acc / l_i; a row that saw no key (l = 0) gets O = 0 and lse = -inf; l = NaN stays NaN (forward_kernel.py)
    none = l_i == 0.0
    l_safe = gl.where(none, 1.0, l_i)
    o = acc / gl.convert_layout(l_safe, row_o)[:, None]
    o = gl.where(gl.convert_layout(none, row_o)[:, None], 0.0, o)
    # lse_i = (m2_i + log2(l_i)) * ln(2)
    lse = (m_i + gl.log2(l_safe)) * 0.6931471805599453
    lse = gl.where(m_i == float("inf"), float("inf"), lse)
    lse = gl.where(none, float("-inf"), lse)
    gl.store(LSE + pid_bh.to(gl.int64) * Nq + rows, lse, mask=rows < Nq)
    rows_o = q_start + c * HALF_M + gl.arange(0, HALF_M, layout=row_o)
    d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
    ptrs = O + (pid_bh.to(gl.int64) * Nq + rows_o[:, None]) * HEAD_D + d[None, :]
    gl.store(ptrs, o.to(dtype), mask=rows_o[:, None] < Nq)


@gluon.jit
def _consumer(c: gl.constexpr, q_smem, k_smem, v_smem, item_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty,
              O, LSE, H, Nq, Nk, n_items, scale_log2, HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr,
              HALF_M: gl.constexpr, STAGES: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
              RESCALE_EARLY: gl.constexpr):
    """Consumer warpgroup c: ``_query_block`` for each work item the copy warp publishes, until it publishes none."""
    it = 0  # K/V tiles consumed so far, over all of this program's items
    k = 0  # items so far
    w = _read_item(item_smem)
    while w < n_items:
        q_start, pid_bh, _, _, start, full_start, full_end, n_tiles = _work_item(w, Nq, Nk, H, WINDOW_LEFT,
                                                                                  WINDOW_RIGHT, HALF_M, BLOCK_N)
        mbarrier.wait(q_bar, k & 1)
        _query_block(c, q_smem, k_smem, v_smem, q_empty, k_full, v_full, k_empty, v_empty, O, LSE, pid_bh, q_start,
                     start, full_start, full_end, n_tiles, it, Nq, Nk, scale_log2, HEAD_D, BLOCK_N, HALF_M, STAGES,
                     WINDOW_LEFT, WINDOW_RIGHT, RESCALE_EARLY)
        it += n_tiles
        k += 1
        w = _read_item(item_smem)


@gluon.jit(do_not_specialize=["H", "group", "Nq", "Nk", "n_items"])
def attn_fwd_hopper_kernel(q_desc, k_desc, v_desc, O, LSE, COUNTER, H, group, Nq, Nk, n_items, scale_log2,
                           HEAD_D: gl.constexpr, WINDOW_LEFT: gl.constexpr, WINDOW_RIGHT: gl.constexpr,
                           STAGES: gl.constexpr, COPY_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                           PERSISTENT: gl.constexpr, RESCALE_EARLY: gl.constexpr):
    """O (B, H, Nq, HEAD_D) contiguous in Q's dtype and LSE (B, H, Nq) float32 (natural log), one query block of
    Br = 2 * HALF_M rows of one (batch, head) a work item, n_items = cdiv(Nq, Br) * B * H of them.

    q_desc: TMA descriptor of Q (B, H, Nq, HEAD_D), blocks (1, 1, HALF_M, HEAD_D); k_desc, v_desc: of K, V (B, H //
    group, Nk, HEAD_D), blocks (1, 1, BLOCK_N, HEAD_D). scale_log2 = softmax_scale * log2(e), signed. Grid: (P, );
    program p takes item p, then (PERSISTENT) the next item not yet taken (``_next_item``: COUNTER, one int32, 0 at
    launch) until none is left. Items in order: a head's query blocks in turn, with a right bound (causal) the
    heaviest first (``_work_item``). PERSISTENT: P = the number of SMs; else the grid is (query blocks, B * H), one
    item a program.
    """
    HALF_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 1, 1, HALF_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_D], v_desc.layout)
    item_smem = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)  # the copy warp's expect, then Q_i's bytes
    mbarrier.init(q_empty, count=2)  # one arrive from each consumer, after its item's last S_ij
    for s in gl.static_range(STAGES):
        mbarrier.init(k_full.index(s), count=1)  # the copy warp's expect, then the copy engine's bytes
        mbarrier.init(v_full.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=2)  # one arrive from each consumer
        mbarrier.init(v_empty.index(s), count=2)

    gl.warp_specialize([
        (_consumer, (0, q_smem, k_smem, v_smem, item_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, O, LSE,
                     H, Nq, Nk, n_items, scale_log2, HEAD_D, BLOCK_N, HALF_M, STAGES, WINDOW_LEFT, WINDOW_RIGHT,
                     RESCALE_EARLY)),
        (_consumer, (1, q_smem, k_smem, v_smem, item_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, O, LSE,
                     H, Nq, Nk, n_items, scale_log2, HEAD_D, BLOCK_N, HALF_M, STAGES, WINDOW_LEFT, WINDOW_RIGHT,
                     RESCALE_EARLY)),
        (_copy_warp, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, item_smem, q_bar, q_empty, k_full, v_full,
                      k_empty, v_empty, COUNTER, H, group, Nq, Nk, n_items, STAGES, BLOCK_N, HALF_M, WINDOW_LEFT,
                      WINDOW_RIGHT, PERSISTENT)),
    ], [4, 1], [CONSUMER_REGS, COPY_REGS])


def _aligned(x: torch.Tensor) -> bool:
    """TMA's rule: unit last stride, 16-byte aligned base and other strides."""
    es = x.element_size()
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in x.stride()[:-1])


@functools.lru_cache(maxsize=None)
def _sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# The kernel launches from Python: through flash_attn_triton a call costs 147-170 us of host time on the H200's
# host, against 14-23 us for forward_kernel.py's C++ launch plan (docs/results/triton/hopper_forward/
# host_overhead.txt). It takes the calls whose visible scores cost at least MIN_FLOPS (4 B H D a score; about
# 100 us of products at 500 TFLOP/s), where the products outlast the launch; smaller ones run forward_kernel.py.
MIN_FLOPS = 5e10


@functools.lru_cache(maxsize=4096)
def _visible_pairs(Nq: int, Nk: int, window: tuple) -> int:
    return masks.visible_pairs(Nq, Nk, window)


def takes(q, k, v, dropout: bool, window) -> bool:
    """Whether this kernel runs the call (the module docstring and MIN_FLOPS); else ``forward_kernel.py`` does."""
    B, H, Nq, D = q.shape
    return (not dropout and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and D in HEAD_DIMS
            and _sm90(q.device.index if q.device.index is not None else torch.cuda.current_device())
            and all(_aligned(x) for x in (q, k, v))
            and 4.0 * B * H * D * _visible_pairs(Nq, k.shape[2], tuple(window)) >= MIN_FLOPS)


def shared_layout(block, dtype):
    """The NVMMA (wgmma/TMA swizzled) shared layout of a (1, 1, rows, D) tile."""
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


@functools.lru_cache(maxsize=None)
def _layouts(D: int, dtype: torch.dtype) -> tuple:
    """The shared layouts of Q's and K/V's tiles."""
    gdt = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return shared_layout([1, 1, HALF_M, D], gdt), shared_layout([1, 1, BLOCK_N, D], gdt)


# (dtype, D, window, device) -> the compiled kernel: after the first call of a variant the launch skips Triton's
# JIT dispatch (its arguments' specialisation and cache lookup) and runs the compiled kernel directly; the host time
# that remains (MIN_FLOPS) is mostly flash_attn_triton's own Python path, which forward_kernel.py's C++ plan skips. The ints are not specialised (do_not_specialize), O and LSE are new allocations (aligned), so
# the variant is the whole key.
_COMPILED: dict = {}


def forward(q, k, v, window, scale: float):
    """o (B, H, Nq, D) contiguous in q's dtype, lse (B, H, Nq) float32, for inputs ``takes`` accepted; window =
    (left, right)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    B, H, Nq, D = q.shape
    Nk, group = k.shape[2], H // k.shape[1]
    q_layout, kv_layout = _layouts(D, q.dtype)
    descs = (TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, HALF_M, D], q_layout),
             TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, BLOCK_N, D], kv_layout),
             TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, BLOCK_N, D], kv_layout))
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    n_blocks = (Nq + 2 * HALF_M - 1) // (2 * HALF_M)
    n_items = n_blocks * B * H
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    grid = (min(n_items, _sm_count(dev)), 1) if CONFIG["PERSISTENT"] else (n_blocks, B * H)
    # the programs' item counter (_next_item), 0 at launch
    counter = (torch.zeros if CONFIG["PERSISTENT"] else torch.empty)(1, dtype=torch.int32, device=q.device)
    args = (*descs, o, lse, counter, H, group, Nq, Nk, n_items, scale * LOG2E)
    consts = (D, window[0], window[1], *CONFIG.values())
    key = (q.dtype, D, window, q.device, *CONFIG.values())
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = attn_fwd_hopper_kernel[grid](*args, *consts, num_warps=4)
    else:
        stream = triton.runtime.driver.active.get_current_stream(q.device.index)
        compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *consts)
    return o, lse
