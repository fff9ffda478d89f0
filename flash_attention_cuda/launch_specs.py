"""How each kernel of the ladder is launched: grid, block, dynamic shared memory and arguments, side by side.

One function per kernel turns a :class:`Problem` (sizes, dtype, softmax_scale, mask window) into a
:class:`LaunchSpec`: the template instantiation NVRTC compiles, the grid and block, the bytes of dynamic
shared memory, the buffers (pointer arguments, named as in the .cu) and the scalar arguments that follow
them, in the kernel's order. The specs are plain data, so the tests check them on any machine against the
``__global__`` declarations parsed from the .cu files.

    forward   naive_fwd, tiled_fwd, mma_fwd, wgmma_fwd, wgmma_ws_fwd   (and seed_nomax_fwd, the seed lab's
              arithmetic)
    backward  bwd_preprocess, bwd_dkdv, bwd_dq                   (backward.cu, fp32)
              mma_bwd_preprocess, mma_bwd_dkdv, mma_bwd_dq       (mma_backward.cu, tensor cores)
              mma_bwd_fused_preprocess, mma_bwd_fused,           (the same file: one kernel, dQ summed into a
              mma_bwd_dq_store                                   zeroed float32 buffer atomically, then stored)
              wgmma_bwd_dkdv, wgmma_bwd_dq                       (wgmma_backward.cu, Hopper; Delta from
                                                                 mma_bwd_preprocess)
              wgmma_bwd_preprocess, wgmma_bwd_fused,             (the same file: Delta and a zeroed float32
              wgmma_bwd_dq_store                                 dQ buffer, one kernel summing dQ into it
                                                                 atomically, then dQ stored)
              wgmma_bwd_ws, wgmma_bwd_kv_sum                     (the one kernel warp-specialised; the sum of
                                                                 its dK, dV parts when it splits query heads)

Every kernel gets the softmax scale as ONE signed ``scale_log2 = softmax_scale * log2(e)`` (``scale_args``)
and the mask as its window ``(window_left, window_right)`` (``mask_args``; causal is (-1, 0), see
``flash_attention_py/masks.py``): nothing else turns them into kernel arguments. The tensor-core kernels
(mma, wgmma and their backwards) then take the other variants (``variant_args``): ``group`` = Hq // Hk query heads
per K/V head (grouped-query attention; 1 without) and dropout as ``(dropout_p, seed_lo, seed_hi)``; a
dropout launch names the template instantiation with ``DROPOUT = true`` (``..., true>``), the others the
default (no dropout code compiled in).

``run_forward`` and ``run_backward`` launch them on inputs the launcher has checked already (the custom ops
of ``library_ops.py`` call them too). Tile configs: ``MMA_CONFIGS``, ``WGMMA_CONFIGS``, ``WGMMA_WS_CONFIGS`` (per
head dim) and
``MMA_BACKWARD_CONFIGS``, ``WGMMA_BACKWARD_CONFIGS`` (per head dim). A sweep passes its own instead, leaving the tables as they are:
``launcher.forward_with_config`` (checked, like ``flash_attn_cuda``) or ``run_backward(..., config=...)``.
"""
from __future__ import annotations

import functools

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from flash_attention_py import masks
from flash_attention_py.validation import dtype_name

from . import launch_plans, runtime
from .capabilities import (BACKWARD_HEAD_DIMS, TENSOR_CORE_BACKWARDS, TENSOR_CORE_HEAD_DIMS, TENSOR_CORE_KERNELS,
                           auto_backward, mma_auto_backward)

__all__ = ["Problem", "LaunchSpec", "MMA_CONFIGS", "MMA_DROPOUT_CONFIGS", "MMA_PERSISTENT_ITEMS_PER_SM", "WGMMA_CONFIGS", "WGMMA_WS_CONFIGS", "WGMMA_WS_DROPOUT_CONFIGS",
           "wgmma_ws_fwd", "WGMMA_WS_PERSISTENT_UNITS_PER_SM", "WGMMA_WS_PAIRS_BALANCE", "WGMMA_WS_SECTION_BYTES", "WGMMA_WS_MAX_WALK", "MMA_BACKWARD_CONFIGS", "MMA_FUSED_BACKWARD_CONFIGS", "WGMMA_BACKWARD_CONFIGS", "dkdv_column_blocks",
           "scale_args", "mask_args", "variant_args", "pad_dim", "naive_fwd", "tiled_fwd", "mma_fwd", "wgmma_fwd",
           "seed_nomax_fwd",
           "forward_spec", "bwd_preprocess", "bwd_dkdv", "bwd_dq", "mma_bwd_preprocess", "mma_bwd_dkdv",
           "mma_bwd_dq", "wgmma_bwd_dkdv", "wgmma_bwd_dq", "mma_bwd_fused_preprocess", "mma_bwd_fused", "mma_bwd_dq_store", "wgmma_bwd_fused", "wgmma_bwd_ws", "wgmma_bwd_preprocess",
           "wgmma_bwd_dq_store",
           "wgmma_bwd_kv_sum", "ws_backward_splits", "ws_backward_tile_major", "kv_part_shape", "dq_accum_shape",
           "padded_head_dim", "run_forward", "run_backward", "BackwardPlan", "backward_plan", "clear_caches",
           "run_seed_nomax"]

# mma: (Bc keys per K/V tile, warps per block, m16 tiles per warp) for each head dim.
# A block holds Br = 16 * tiles * warps query rows.
# Chosen by the config sweep (`python -m benchmarks --preset cuda-ladder --sweep`) on an H100
# (docs/results/cuda/cuda_ladder.json).
# D = 256 (not swept): FlashAttention-2's 64 x 64 tiles of 4 warps; the Q fragments stay in shared memory (the
# accumulator alone takes 128 registers a thread), 160 KiB of shared memory (an A100 has 164).
# D = 64: FlashAttention-2's own forward tile at this head dim (128 keys, 4 warps of 32 query rows), timed alone on
# an H100 at 1.10-1.15x the 64-key tile the sweep had chosen (tools/cuda_forward_kernels.py --kernel mma,
# docs/results/cuda/mma_forward/).
# D = 32 and 96 (not swept): the tiles of D = 64 and 128.
MMA_CONFIGS = {32: (128, 4, 2), 64: (128, 4, 2), 96: (128, 8, 1), 128: (128, 8, 1), 256: (64, 4, 1)}
# ... with dropout: the 64-key tile at D = 64 (with 128 keys the Philox rounds beside S_ij spill 388 bytes a thread)
MMA_DROPOUT_CONFIGS = {32: (64, 4, 2), 64: (64, 4, 2), 96: (128, 8, 1), 128: (128, 8, 1), 256: (64, 4, 1)}
# wgmma: (Bc keys per K/V tile, warpgroups per block); Br = 64 * warpgroups query rows per block.
WGMMA_CONFIGS = {32: (64, 2), 64: (64, 2), 96: (128, 2), 128: (128, 2), 256: (64, 2)}
# wgmma-ws: (Bc keys per K/V tile, consumer warpgroups, K/V stages); Br = 64 * consumer warpgroups query rows per
# block, plus one producer warpgroup. Chosen by tools/cuda_forward_kernels.py on an H100
# (docs/results/cuda/forward_kernels.md): at D = 64 three consumer warpgroups (Br = 192) beat two by 10-15 %.
# D = 128: K/V tiles of 160, 176 (FlashAttention-3's without a mask) and 192 keys were timed too and lose at
# N <= 4096 (docs/results/cuda/forward_tiles/: 176 keys 0.88-0.95x the 128-key tile at N >= 4096, not causal).
# D = 256: 64-key tiles (an accumulator of 64 x 256 is 128 of a consumer's 240 registers; S_ij and P_ij of 128
# keys would not fit beside it); shared memory Q 64 KiB + 2 stages of K and V 32 KiB each = 192 KiB.
# D = 32 and 96 (not swept): the tiles of D = 64 and 128.
WGMMA_WS_CONFIGS = {32: (128, 3, 2), 64: (128, 3, 2), 96: (128, 2, 2), 128: (128, 2, 2), 256: (64, 2, 2)}
# ... with dropout: two consumer warpgroups (240 registers each; with three, 160 registers spill the Philox rounds)
WGMMA_WS_DROPOUT_CONFIGS = {32: (128, 2, 2), 64: (128, 2, 2), 96: (128, 2, 2), 128: (128, 2, 2), 256: (64, 2, 2)}
# mma backward: (warps per block, rows of the tile each kernel loops over) per head dim: 64 x 64 tiles, chosen
# by the config sweep (`python -m benchmarks --preset cuda-backward --sweep`); at D = 256 the looped tiles have
# 32 rows (shared memory 128 KiB instead of 192) and the dK/dV kernel splits dK, dV's 256 columns over
# dkdv_column_blocks(256) = 2 blocks (mma_backward.cu: 128 columns, as many registers as D = 128 takes).
MMA_BACKWARD_CONFIGS = {32: (4, 64), 64: (4, 64), 96: (4, 64), 128: (4, 64), 256: (4, 32)}
# the one-kernel mma backward (mma_bwd_fused, FlashAttention-2's warp layout): (warps, rows of the streamed Q tile)
# per head dim, 8 warps and 128 keys a block (FlashAttention-2's own tiles: 128 queries at D = 64, 64 at D = 128);
# D = 32 and 96 (not swept): the tiles of D = 64 and 128
MMA_FUSED_BACKWARD_CONFIGS = {32: (8, 128), 64: (8, 128), 96: (8, 64), 128: (8, 64)}
# wgmma backward: (warpgroups per block, rows of the tile each kernel streams); each block holds 64 * warpgroups
# keys (dK/dV kernel) or queries (dQ kernel) and streams tiles of the other side.
# D = 256 (the two-kernel backward only): streamed tiles of 32 rows, so that a warpgroup's 128 accumulator registers
# (dK and dV's 128 columns; dQ's 256) leave room for S and dP (16 each; tiles of 64 rows spill 150-700 bytes);
# 192 KiB of shared memory; the dK/dV kernel splits dK, dV's columns over two blocks. Two warpgroups ran 1.6-1.7x
# one (tools/cuda_backward_kernels.py --head-dims 256, H100).
# D = 32 and 96 (not swept): the tiles of D = 64 and 128.
WGMMA_BACKWARD_CONFIGS = {32: (2, 64), 64: (2, 64), 96: (2, 64), 128: (2, 64), 256: (2, 32)}


class Problem(NamedTuple):
    """One attention call as the kernels see it: q (B, H, Nq, D), k and v (B, H, Nk, D) of ``dtype``."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    dtype: str
    scale: float  # softmax_scale, natural units
    window: tuple  # (left, right), -1 = unbounded; causal = (-1, 0)
    Hk: Optional[int] = None  # K/V heads (grouped-query attention: H % Hk == 0); None: H
    dropout_p: float = 0.0  # probability of dropping a weight, in [0, 1)
    dropout_seed: Optional[int] = None  # int in [0, 2**64), given when dropout_p > 0

    @property
    def kv_heads(self) -> int:
        return self.H if self.Hk is None else self.Hk

    @property
    def group(self) -> int:
        """Query heads per K/V head: query head h reads K/V head h // group."""
        return self.H // self.kv_heads

    @property
    def dropout(self) -> bool:
        return self.dropout_p > 0.0


# A launch plan depends only on the problem's sizes, dtype, scale, window and variants (and the config): it is
# built once per distinct problem and reused, so a call in a training loop pays no Python to rebuild it.
_CACHES: list = []  # every cached builder here, for clear_caches


def _cached(fn):
    cached = functools.lru_cache(maxsize=1024)(fn)
    _CACHES.append(cached)
    return cached


def clear_caches() -> None:
    """Forget every cached launch spec and backward plan, and every C++ launch plan's key (launch_plans.py): for
    code that changes a module-level setting they read (``WGMMA_WS_BACKWARD_MIN_BLOCKS``, a config table) and must
    see the change at the next call."""
    for cached in _CACHES:
        cached.cache_clear()
    launch_plans.clear()


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch: ``kernels/<source>``'s instantiation ``name`` with ``grid`` x ``block`` threads.

    smem: bytes of dynamic shared memory (0: the kernel's shared memory is static).
    buffers: the pointer arguments, named as in the kernel's parameter list, in its order.
    scalars: ((name, NumPy scalar), ...): the arguments after the pointers, in the kernel's order.
    maps: ((parameter, buffer, box rows), ...): tensor maps (TMA descriptors) of buffers, passed by value before
        the pointers (wgmma_ws.cu; runtime.tensor_map encodes them at launch: they hold the address).
    """

    source: str
    name: str
    grid: tuple
    block: tuple
    smem: int
    buffers: tuple
    scalars: tuple
    maps: tuple = ()

    @functools.cached_property
    def scalar_values(self) -> tuple:
        return tuple(value for _, value in self.scalars)


def scale_args(scale: float) -> tuple:
    """The kernels' scale argument: (np.float32(softmax_scale * log2(e)),), signed (scores in log2 units)."""
    return (np.float32(scale * math.log2(math.e)),)


def mask_args(window) -> tuple:
    """The kernels' mask arguments: (np.int32(window_left), np.int32(window_right)); causal is (-1, 0)."""
    left, right = window
    return (np.int32(left), np.int32(right))


def variant_args(p: Problem) -> tuple:
    """The tensor-core kernels' arguments after the window: (("group", int32), ("dropout_p", float32),
    ("seed_lo", uint32), ("seed_hi", uint32)); the seed's 32-bit halves are Philox's key words (philox.cuh)."""
    seed = (p.dropout_seed or 0) if p.dropout else 0
    return (("group", np.int32(p.group)), ("dropout_p", np.float32(p.dropout_p if p.dropout else 0.0)),
            ("seed_lo", np.uint32(seed & 0xFFFFFFFF)), ("seed_hi", np.uint32(seed >> 32)))


def _tc_args(p: Problem) -> tuple:
    """The scalars of a tensor-core kernel: (Nq, Nk, scale_log2, window_left, window_right, group, dropout_p,
    seed_lo, seed_hi)."""
    return _common(p, with_d=False) + variant_args(p)


def _flag(x: bool) -> str:
    """A bool template argument."""
    return "true" if x else "false"


def _dropout_flag(p: Problem) -> str:
    """The DROPOUT template argument: appended only when set (the default instantiation has none)."""
    return ", true" if p.dropout else ""


def pad_dim(D: int) -> int:
    """The fp32 kernels' D_PAD template argument: D rounded up to 32, 64 or 128."""
    for p in (32, 64, 128):
        if D <= p:
            return p
    raise ValueError(f"pad_dim: D must be <= 128, got {D}")


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _common(p: Problem, with_d: bool) -> tuple:
    """(Nq, Nk[, D], scale_log2, window_left, window_right) as (name, value) pairs."""
    sizes = (("Nq", np.int32(p.Nq)), ("Nk", np.int32(p.Nk))) + ((("D", np.int32(p.D)),) if with_d else ())
    return sizes + (("scale_log2", *scale_args(p.scale)),) + tuple(zip(("window_left", "window_right"),
                                                                       mask_args(p.window)))


def _bf16(p: Problem) -> str:
    return "true" if p.dtype == "bfloat16" else "false"


_FWD_BUFFERS = ("Q", "K", "V", "O", "LSE")


# ------------------------------------------------------------------------------------ forward
@_cached
def naive_fwd(p: Problem) -> LaunchSpec:
    """naive.cu: one thread per query row, Br = 64 rows per block, Bc = 32 keys per K/V tile (static smem)."""
    dp, Bc, Br = pad_dim(p.D), 32, 64
    return LaunchSpec("naive.cu", f"naive_fwd<{dp}, {Bc}, {Br}>", (_cdiv(p.Nq, Br), p.B * p.H), (Br,), 0,
                      _FWD_BUFFERS, _common(p, with_d=True))


@_cached
def tiled_fwd(p: Problem, vec4: bool) -> LaunchSpec:
    """tiled.cu: 4 warps of ROWS query rows each (Br = 4 * ROWS), static smem; vec4: float4 loads are aligned."""
    dp = pad_dim(p.D)
    rows = 4 if dp == 128 else 8
    Br = 4 * rows
    return LaunchSpec("tiled.cu", f"tiled_fwd<{dp}, {rows}>", (_cdiv(p.Nq, Br), p.B * p.H), (128,), 0,
                      _FWD_BUFFERS, _common(p, with_d=True) + (("vec4", np.int32(int(vec4))),))


# mma_fwd's persistent grid: where a block keeps its Q fragments in registers and its K/V tile is as tall as its
# rows, without dropout (mma.cu's AHEAD: (128, 8, 1) at D = 96 and 128, one block per SM), and the mask has no bound
# (every item sees every key, so a static walk is balanced), ctas blocks walk the items when there are at most this
# many per block; each loads its next item's Q and first K/V tile under its last tile.
MMA_PERSISTENT_ITEMS_PER_SM = 24


@_cached
def mma_fwd(p: Problem, config: Optional[tuple] = None, ctas: Optional[int] = None) -> LaunchSpec:
    """mma.cu: (Bc, warps, m16 tiles per warp) = config or MMA_CONFIGS[D] (MMA_DROPOUT_CONFIGS[D] with dropout);
    Br = 16 * tiles * warps. One block per work item (Br query rows of one head), grid (ceil(Nq / Br), B * H); or,
    with ctas (the GPU's SM count) where MMA_PERSISTENT_ITEMS_PER_SM says, a persistent grid (ctas,)."""
    Bc, nw, mt = config or (MMA_DROPOUT_CONFIGS if p.dropout else MMA_CONFIGS)[p.D]
    Br = 16 * mt * nw
    # mma.cu, mma_fwd's `extern __shared__` carve-up: sQ (Br, D), sK 2 x (Bc, D), sV 2 x (Bc, D), 16-bit
    smem = (Br + 4 * Bc) * p.D * 2
    items = _cdiv(p.Nq, Br) * p.B * p.H
    ahead = mt == 1 and p.D <= 128 and Br <= Bc and not p.dropout  # mma.cu's AHEAD
    persistent = (ctas and ahead and p.window == (-1, -1) and ctas < items
                  and items <= MMA_PERSISTENT_ITEMS_PER_SM * ctas)
    grid = (ctas,) if persistent else (_cdiv(p.Nq, Br), p.B * p.H)
    return LaunchSpec("mma.cu", f"mma_fwd<{p.D}, {Bc}, {nw}, {mt}, {_bf16(p)}{_dropout_flag(p)}>",
                      grid, (32 * nw,), smem, _FWD_BUFFERS, _tc_args(p) + (("BH", np.int32(p.B * p.H)),))


@_cached
def wgmma_fwd(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """wgmma.cu: (Bc, warpgroups) = config or WGMMA_CONFIGS[D]; Br = 64 * warpgroups (sm_90a only)."""
    Bc, nwg = config or WGMMA_CONFIGS[p.D]
    Br = 64 * nwg
    # wgmma.cu, wgmma_fwd's `extern __shared__ ... smem_raw` carve-up: sQ (Br, D), sK and sV 2 x (Bc, D) each,
    # 16-bit, plus up to 1024 bytes of `pad` that aligns the tiles to 1024 bytes (the 128-byte swizzle)
    smem = (Br + 4 * Bc) * p.D * 2 + 1024
    return LaunchSpec("wgmma.cu", f"wgmma_fwd<{p.D}, {Bc}, {nwg}, {_bf16(p)}{_dropout_flag(p)}>",
                      (_cdiv(p.Nq, Br), p.B * p.H), (128 * nwg,), smem, _FWD_BUFFERS, _tc_args(p))


# the most dynamic shared memory one block may ask for on sm_90 (227 KiB)
SM90_SMEM = 227 * 1024
# wgmma-ws's persistent grid (one block per SM walking the work units) pays where each SM has few units: the next
# unit's loads hide under this one's last product and epilogue (N = 1024: 3-12 % faster than a block per unit,
# N = 4096: 0-3 %). With many (N = 16384: 24-85 units per SM) the two were within the spread of repeated timings,
# either way round, and a static walk cannot even out blocks that run at different speeds: a block per unit
# there, as before. Measured with tools/cuda_forward_kernels.py on H100s
# (docs/results/cuda/forward_persistent/forward_kernels.md).
WGMMA_WS_PERSISTENT_UNITS_PER_SM = 24


# With a right bound (causal) wgmma-ws walks its work items in one of two ways (wgmma_ws.cu). Pairs of rows blocks
# (p and n_m - 1 - p of a head) see about as many keys as any other pair, so a persistent grid that hands each block
# the same number of pairs is balanced, but in coarse units: where ceil(pairs / blocks) is more than
# pairs / blocks by a share above 1 - WGMMA_WS_PAIRS_BALANCE, too many blocks sit idle in the last round, and the
# items are walked longest first instead, numbered in sections of heads whose K and V fit together in
# WGMMA_WS_SECTION_BYTES (a part of an H100's 50 MB L2). B4 H16 on an H100: pairs 0.97 at D128 N = 1024 and 4096
# (kept); 0.73 at D64 N = 1024 and 0.89 at N = 4096, where longest first ran 1.24x and 1.06x faster than pairs
# (docs/results/cuda/forward_persistent/walk_ab.md; tools/cuda_forward_kernels.py --walks times both walks).
WGMMA_WS_PAIRS_BALANCE = 0.9
WGMMA_WS_SECTION_BYTES = 16 << 20
# A wgmma-ws block keeps its walk (its work items) in shared memory, 16 bytes an item: at most this many, so a
# persistent grid has at least ceil(items / WGMMA_WS_MAX_WALK) blocks
WGMMA_WS_MAX_WALK = 64
# The walks assume the rows blocks of a head see equally many keys (no right bound) or more and more of them (a right
# bound: causal, local causal (w, 0)). A window bounded on both sides with room to run, (w, w) with w a sizeable part
# of N, sees fewer keys at both ends of the sequence, and a left bound alone fewer at the end: a static walk then gives
# some blocks the heavy middle items and leaves the others idle at the end. Where the items' K/V tiles are neither
# equal nor non-decreasing and the heaviest is above WGMMA_WS_WALK_SPREAD times their mean, the grid is a block per
# item and the hardware hands them out. H100, B1 H16 N16384 D128 fp16, windows (w, w), the forward alone: a block per
# item took 2.94 ms at w = 8192, 1.75 at 4096 and 0.97 at 2048 against 3.50, 2.21 and 0.99 for the persistent walk;
# at w = 512 and 1024 (within the spread: persistent, kept) the two were within 1 %
# (docs/results/cuda/forward_persistent/ws_window_walk.txt, tools/ws_window_walk.py).
WGMMA_WS_WALK_SPREAD = 1.05


def rows_pad_top(p: Problem, Br: int) -> int:
    """How far above row 0 wgmma-ws's first rows block of Br queries starts (wgmma_ws.cu's pad_top): with a right
    bound (causal) the blocks end at the last query row, so a ragged Nq's padding rows are at the top, where the mask
    leaves the fewest keys, instead of at the bottom, where they would see them all; else 0. Causal, Nq = Nk = 4096,
    Br = 192: the heads' 22 rows blocks visit 363 K/V tiles of 128 keys instead of 384 (the last block, rows 4032 ..
    4223, visited all 32 for 64 real rows; the first, rows -128 .. 63, visits 1)."""
    return _cdiv(p.Nq, Br) * Br - p.Nq if p.window[1] >= 0 else 0


def ws_rows_blocks(p: Problem, Br: int, Bc: int) -> list:
    """The K/V tiles of Bc keys each of wgmma-ws's rows blocks of Br queries visits (masks.kv_range of its real
    rows), first rows block first, as wgmma_ws.cu lays them out (rows_pad_top)."""
    pad = rows_pad_top(p, Br)
    return [len(masks.blocks(*masks.kv_range(max(0, m * Br - pad), (m + 1) * Br - pad, p.Nq, p.Nk, p.window), Bc))
            for m in range(_cdiv(p.Nq, Br))]


def _walk_fits(p: Problem, Br: int, Bc: int) -> bool:
    """Whether wgmma-ws's persistent walks suit this mask: the K/V tiles of each rows block of Br queries
    (ws_rows_blocks) are equal within WGMMA_WS_WALK_SPREAD of their mean, or, with a right bound, non-decreasing
    from the first rows block to the last (the order the walks take them in)."""
    tiles = ws_rows_blocks(p, Br, Bc)
    if not tiles or (p.window[1] >= 0 and all(a <= b for a, b in zip(tiles, tiles[1:]))):
        return True
    mean = sum(tiles) / len(tiles)
    return mean == 0 or max(tiles) <= WGMMA_WS_WALK_SPREAD * mean


@_cached
def wgmma_ws_fwd(p: Problem, config: Optional[tuple] = None, ctas: Optional[int] = None) -> LaunchSpec:
    """wgmma_ws.cu: (Bc, consumer warpgroups, stages) = config or WGMMA_WS_CONFIGS[D] (WGMMA_WS_DROPOUT_CONFIGS[D]
    with dropout); Br = 64 * consumer warpgroups query rows per work item, one more warpgroup for the copies
    (sm_90a only). q, k, v reach the kernel as tensor maps. The kernel is persistent: ctas blocks (the GPU's SM
    count, runtime.device_sms) walk the ceil(Nq / Br) * B * H work items where there are at most
    WGMMA_WS_PERSISTENT_UNITS_PER_SM per block; with more, or ctas None, one block per item. With a right bound
    (causal) a persistent grid walks pairs of rows blocks where they balance (WGMMA_WS_PAIRS_BALANCE;
    heads_per_section 0), else the items longest first in sections of heads_per_section heads whose K and V fit
    in WGMMA_WS_SECTION_BYTES; each block's walk (walk_len items at most) is kept in shared memory. Where the
    mask's rows blocks see keys in a way the walks do not assume (``_walk_fits``), one block per item."""
    Bc, cwg, stages = config or (WGMMA_WS_DROPOUT_CONFIGS if p.dropout else WGMMA_WS_CONFIGS)[p.D]
    Br = 64 * cwg
    n_m, cap = _cdiv(p.Nq, Br), WGMMA_WS_PERSISTENT_UNITS_PER_SM * (ctas or 0)
    units, paired = n_m * p.B * p.H, False  # work items (Br query rows of one head)
    if p.window[1] >= 0 and ctas:  # a right bound (fa::Mask::heavy_last): pairs, if they balance
        pairs = _cdiv(n_m, 2) * p.B * p.H
        if pairs <= cap:
            per_block = pairs / min(pairs, ctas)
            paired = per_block / math.ceil(per_block) >= WGMMA_WS_PAIRS_BALANCE
            units = pairs if paired else units
    persistent = ctas and units <= cap and _walk_fits(p, Br, Bc)
    if paired and not persistent:  # a block per item: no pairs
        paired, units = False, n_m * p.B * p.H
    per_unit = 2 if paired else 1  # items
    grid = max(min(units, ctas), _cdiv(units * per_unit, WGMMA_WS_MAX_WALK)) if persistent else units
    walk_len = per_unit * _cdiv(units, grid)
    # wgmma_ws.cu, wgmma_ws_fwd's `extern __shared__ ... smem_raw` carve-up: sQ (Br, D), sK and sV STAGES x (Bc, D)
    # each, 16-bit; O's staging tile (Br, D) where it fits (OWN_O; else O is staged in Q's rows); the 8-byte
    # mbarriers (q_full, q_empty, then k_full, v_full, k_empty, v_empty per stage); the walk (walk_len + 1 entries
    # of 16 bytes); plus up to 1024 bytes of `pad` that aligns the tiles to 1024 bytes (the 128-byte swizzle)
    tiles, o_tile, bars = (Br + 2 * stages * Bc) * p.D * 2, Br * p.D * 2, 8 * (2 + 4 * stages) + 16 * (walk_len + 1)
    own_o = tiles + o_tile + bars + 1024 <= SM90_SMEM
    smem = tiles + (o_tile if own_o else 0) + bars + 1024
    if smem > SM90_SMEM:
        raise ValueError(f"wgmma_ws_fwd: config {(Bc, cwg, stages)} at D = {p.D} needs {smem} bytes of shared memory "
                         f"(walk of {walk_len} items), more than the {SM90_SMEM} a block may have")
    head_kv_bytes = max(1, 4 * p.Nk * p.D // p.group)  # K and V of a query head, fp16/bf16 (a group shares them)
    heads_per_section = 0 if paired else max(1, min(p.B * p.H, WGMMA_WS_SECTION_BYTES // head_kv_bytes))
    name = f"wgmma_ws_fwd<{p.D}, {Bc}, {cwg}, {stages}, {_bf16(p)}, {_flag(p.dropout)}, {_flag(own_o)}>"
    return LaunchSpec("wgmma_ws.cu", name, (grid,), (128 * (cwg + 1),), smem, ("O", "LSE"),
                      _tc_args(p) + (("BH", np.int32(p.B * p.H)), ("heads_per_section", np.int32(heads_per_section)),
                                     ("walk_len", np.int32(walk_len))),
                      maps=(("tmQ", "Q", Br), ("tmK", "K", Bc), ("tmV", "V", Bc)))


@_cached
def seed_nomax_fwd(p: Problem) -> LaunchSpec:
    """naive.cu's seed_nomax_fwd: the seed lab's sum of exp(S_ij) without a running max, full attention."""
    dp, Bc, Br = pad_dim(p.D), 32, 64
    sizes = (("Nq", np.int32(p.Nq)), ("Nk", np.int32(p.Nk)), ("D", np.int32(p.D)))
    return LaunchSpec("naive.cu", f"seed_nomax_fwd<{dp}, {Bc}, {Br}>", (_cdiv(p.Nq, Br), p.B * p.H), (Br,), 0,
                      ("Q", "K", "V", "O"), sizes + (("scale_log2", *scale_args(p.scale)),))


@_cached
def forward_spec(kernel: str, p: Problem, *, vec4: bool = False, config: Optional[tuple] = None,
                 ctas: Optional[int] = None) -> LaunchSpec:
    """The forward launch of rung ``kernel`` ('naive', 'tiled', 'mma', 'wgmma', 'wgmma-ws'); config: the tensor-core
    rungs only; ctas: the persistent grids' size (the GPU's SM count: wgmma-ws, and mma where it applies)."""
    if kernel == "naive":
        return naive_fwd(p)
    if kernel == "tiled":
        return tiled_fwd(p, vec4)
    if kernel == "mma":
        return mma_fwd(p, config, ctas)
    if kernel == "wgmma":
        return wgmma_fwd(p, config)
    if kernel == "wgmma-ws":
        return wgmma_ws_fwd(p, config, ctas)
    raise ValueError(f"forward_spec: unknown kernel {kernel!r}; expected naive, tiled, mma, wgmma or wgmma-ws")


# ------------------------------------------------------------------------------------ backward
@_cached
def bwd_preprocess(p: Problem) -> LaunchSpec:
    """backward.cu: D_i = rowsum(dO_i * O_i), one warp per row, 4 rows per block of 128 threads."""
    rows = p.B * p.H * p.Nq
    return LaunchSpec("backward.cu", "bwd_preprocess", (_cdiv(rows, 4),), (128,), 0, ("O", "dO", "Delta"),
                      (("rows", np.int64(rows)), ("D", np.int32(p.D))))


def _bwd_tile(p: Problem) -> tuple:
    dp = pad_dim(p.D)
    return dp, (16 if dp == 128 else 32)  # (D_PAD, BT): BT x BT tiles of S_ij (static smem)


_BWD_IN = ("Q", "K", "V", "dO", "LSE", "Delta")


@_cached
def bwd_dkdv(p: Problem) -> LaunchSpec:
    """backward.cu: one block per BT keys, looping over the query blocks that see them (fp32)."""
    dp, bt = _bwd_tile(p)
    return LaunchSpec("backward.cu", f"bwd_dkdv<{dp}, {bt}>", (_cdiv(p.Nk, bt), p.B * p.H), (128,), 0,
                      _BWD_IN + ("dK", "dV"), _common(p, with_d=True))


@_cached
def bwd_dq(p: Problem) -> LaunchSpec:
    """backward.cu: one block per BT queries, looping over the key blocks they see (fp32)."""
    dp, bt = _bwd_tile(p)
    return LaunchSpec("backward.cu", f"bwd_dq<{dp}, {bt}>", (_cdiv(p.Nq, bt), p.B * p.H), (128,), 0,
                      _BWD_IN + ("dQ",), _common(p, with_d=True))


@_cached
def mma_bwd_preprocess(p: Problem) -> LaunchSpec:
    """mma_backward.cu: D_i = rowsum(dO_i * O_i) from 16-bit O and dO, 4 rows per block of 128 threads."""
    rows = p.B * p.H * p.Nq
    return LaunchSpec("mma_backward.cu", f"mma_bwd_preprocess<{p.D}, {_bf16(p)}>", (_cdiv(rows, 4),), (128,), 0,
                      ("O", "dO", "Delta"), (("rows", np.int64(rows)),))


def dkdv_column_blocks(D: int) -> int:
    """Blocks per K/V tile of the two-kernel backwards' dK/dV kernel (mma_bwd_dkdv, wgmma_bwd_dkdv): each holds
    DC = min(D, 128) columns of dK and dV (a tile's 256 would take more registers than a thread has)."""
    return D // 128 if D > 128 else 1


@_cached
def mma_bwd_dkdv(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """mma_backward.cu: (warps, tile) = config or MMA_BACKWARD_CONFIGS[D]; 16 * warps keys per block, one block
    row per K/V head (B * Hk: each block sums dK, dV over its group's query heads); D > 128: each K/V tile's
    dK, dV columns split over dkdv_column_blocks(D) blocks."""
    nw, tile = config or MMA_BACKWARD_CONFIGS[p.D]
    Bc = 16 * nw
    # mma_backward.cu, mma_bwd_dkdv's carve-up: sK, sV (Bc, D); sQ, sdO 2 x (tile, D), 16-bit; then
    # sL and sDl 2 x tile floats each (lse and Delta)
    smem = (2 * Bc + 4 * tile) * p.D * 2 + 4 * tile * 4
    # template flags DROPOUT, GQA (the loop over a K/V head's query heads), each given only when needed
    flags = f", {str(p.dropout).lower()}, true" if p.group > 1 else _dropout_flag(p)
    return LaunchSpec("mma_backward.cu", f"mma_bwd_dkdv<{p.D}, {nw}, {tile}, {_bf16(p)}{flags}>",
                      (_cdiv(p.Nk, Bc) * dkdv_column_blocks(p.D), p.B * p.kv_heads), (32 * nw,), smem,
                      _BWD_IN + ("dK", "dV"), _tc_args(p))


@_cached
def mma_bwd_fused_preprocess(p: Problem) -> LaunchSpec:
    """mma_backward.cu: Delta as mma_bwd_preprocess, and the float32 dQaccum (B * Hq, Nq, D) zeroed row by row."""
    rows = p.B * p.H * p.Nq
    return LaunchSpec("mma_backward.cu", f"mma_bwd_fused_preprocess<{p.D}, {_bf16(p)}>", (_cdiv(rows, 4),), (128,),
                      0, ("O", "dO", "Delta", "dQaccum"), (("rows", np.int64(rows)),))


@_cached
def mma_bwd_fused(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """mma_backward.cu: FlashAttention-2's one kernel, (warps, tile) = config or MMA_FUSED_BACKWARD_CONFIGS[D]
    (8 warps, Bc = 128 keys a block, Q tiles of 64 or 128 rows): dK, dV, and every tile's dQ_i += dS_ij K_j added
    into the float32 dQaccum (B * Hq, Nq, D) atomically; one block row per K/V head, as mma_bwd_dkdv."""
    nw, tile = config or MMA_FUSED_BACKWARD_CONFIGS[p.D]
    if nw != 8 or tile not in (64, 128) or p.D not in MMA_FUSED_BACKWARD_CONFIGS:
        raise ValueError(f"mma_bwd_fused: config must be (8, 64) or (8, 128) at D = 32, 64, 96 or 128, got "
                         f"{(nw, tile)} at D = {p.D}")
    Bc = 16 * nw
    # mma_bwd_fused's carve-up: sK, sV (Bc, D); sQ, sdO 2 x (tile, D); sP, sdS (tile, Bc), all 16-bit; then sL
    # and sDl 2 x tile floats each (lse and Delta)
    smem = (2 * Bc + 4 * tile) * p.D * 2 + 2 * tile * Bc * 2 + 4 * tile * 4
    flags = f", {str(p.dropout).lower()}, true" if p.group > 1 else _dropout_flag(p)
    return LaunchSpec("mma_backward.cu", f"mma_bwd_fused<{p.D}, {nw}, {tile}, {_bf16(p)}{flags}>",
                      (_cdiv(p.Nk, Bc), p.B * p.kv_heads), (32 * nw,), smem,
                      _BWD_IN + ("dK", "dV", "dQaccum"), _tc_args(p))


@_cached
def mma_bwd_dq_store(p: Problem) -> LaunchSpec:
    """mma_backward.cu: dQ = softmax_scale * dQaccum in 16 bits, 4 elements per thread, 256 threads a block."""
    n = p.B * p.H * p.Nq * p.D
    return LaunchSpec("mma_backward.cu", f"mma_bwd_dq_store<{_bf16(p)}>", (_cdiv(n, 4 * 256),), (256,), 0,
                      ("dQaccum", "dQ"), (("n", np.int64(n)), ("softmax_scale", np.float32(p.scale))))


@_cached
def mma_bwd_dq(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """mma_backward.cu: (warps, tile) = config or MMA_BACKWARD_CONFIGS[D]; 16 * warps queries per block."""
    nw, tile = config or MMA_BACKWARD_CONFIGS[p.D]
    Br = 16 * nw
    # mma_backward.cu, mma_bwd_dq's carve-up: sQ, sdO (Br, D); sK, sV 2 x (tile, D), 16-bit
    smem = (2 * Br + 4 * tile) * p.D * 2
    return LaunchSpec("mma_backward.cu", f"mma_bwd_dq<{p.D}, {nw}, {tile}, {_bf16(p)}{_dropout_flag(p)}>",
                      (_cdiv(p.Nq, Br), p.B * p.H), (32 * nw,), smem, _BWD_IN + ("dQ",), _tc_args(p))


@_cached
def wgmma_bwd_dkdv(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """wgmma_backward.cu: (warpgroups, tile) = config or WGMMA_BACKWARD_CONFIGS[D]; 64 * warpgroups keys per
    block, one block row per K/V head (B * Hk: each block sums dK, dV over its group's query heads); D > 128: each
    K/V tile's dK, dV columns split over dkdv_column_blocks(D) blocks."""
    nwg, tile = config or WGMMA_BACKWARD_CONFIGS[p.D]
    Bc = 64 * nwg
    # wgmma_backward.cu, wgmma_bwd_dkdv's carve-up: sK, sV (Bc, D); sQ, sdO 2 x (tile, D), 16-bit; sL and sDl
    # 2 x tile floats each; plus up to 1024 bytes that align the tiles to 1024 bytes (the 128-byte swizzle)
    smem = (2 * Bc + 4 * tile) * p.D * 2 + 4 * tile * 4 + 1024
    flags = f", {str(p.dropout).lower()}, true" if p.group > 1 else _dropout_flag(p)
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_dkdv<{p.D}, {nwg}, {tile}, {_bf16(p)}{flags}>",
                      (_cdiv(p.Nk, Bc) * dkdv_column_blocks(p.D), p.B * p.kv_heads), (128 * nwg,), smem,
                      _BWD_IN + ("dK", "dV"), _tc_args(p))


@_cached
def wgmma_bwd_dq(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """wgmma_backward.cu: (warpgroups, tile) = config or WGMMA_BACKWARD_CONFIGS[D]; 64 * warpgroups queries
    per block."""
    nwg, tile = config or WGMMA_BACKWARD_CONFIGS[p.D]
    Br = 64 * nwg
    # wgmma_backward.cu, wgmma_bwd_dq's carve-up: sQ, sdO (Br, D); sK, sV 2 x (tile, D), 16-bit; + alignment
    smem = (2 * Br + 4 * tile) * p.D * 2 + 1024
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_dq<{p.D}, {nwg}, {tile}, {_bf16(p)}{_dropout_flag(p)}>",
                      (_cdiv(p.Nq, Br), p.B * p.H), (128 * nwg,), smem, _BWD_IN + ("dQ",), _tc_args(p))


@_cached
def wgmma_bwd_fused(p: Problem) -> LaunchSpec:
    """wgmma_backward.cu: the one-kernel backward, 2 warpgroups of 64 keys per block (Bc = 128), tiles of 64
    queries; dQ summed into the float32 dQaccum (``dq_accum_shape``, zeroed by ``wgmma_bwd_preprocess``) by the copy
    engine."""
    Bc, Br = 128, 64
    # wgmma_bwd_detail::dkdv_block's carve-up with DQ: sK, sV (Bc, D); sQ, sdO 2 x (Br, D); sdS (Br, Bc), 16-bit;
    # sdQ (64, D) floats; sL and sDl 2 x Br floats each; + alignment
    smem = (2 * Bc + 4 * Br) * p.D * 2 + Br * Bc * 2 + 64 * p.D * 4 + 4 * Br * 4 + 1024
    flags = f", {str(p.dropout).lower()}, true" if p.group > 1 else _dropout_flag(p)
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_fused<{p.D}, 2, {Br}, {_bf16(p)}{flags}>",
                      (_cdiv(p.Nk, Bc), p.B * p.kv_heads), (256,), smem, _BWD_IN + ("dK", "dV", "dQaccum"),
                      _tc_args(p))


# wgmma_bwd_ws: (Br queries per streamed tile, slots of the ring that streams Q_i, dO_i with lse and Delta), per
# head dim. At D = 64 a tile of 64 queries is too little work between the block's per-tile waits and barriers:
# tiles of 128 (FlashAttention-3's kBlockM at this head dim), with dQ split by rows between the warpgroups; so too
# at D = 32. At D = 96, 64 x 96 fp32 dK and dV leave no registers for S^T and dP^T of 128 queries: tiles of 64.
WGMMA_WS_BACKWARD_CONFIGS = {32: (128, 2), 64: (128, 2), 96: (64, 2), 128: (64, 2)}
# wgmma_bwd_ws splits a K/V head's group of query heads over blocks when the blocks of keys alone are fewer than
# this (about 4 per SM of an H100's 132): MQA and few K/V heads would otherwise leave SMs idle
WGMMA_WS_BACKWARD_MIN_BLOCKS = 512
# ... and further, toward this many blocks, where every block still streams at least WGMMA_WS_BACKWARD_MIN_ROWS
# query rows (its query heads times Nq): each split adds a float32 partial dK, dV (2 B Hk Nk D floats written
# and read again by wgmma_bwd_kv_sum), a cost that only a long block's work hides. On an H200, causal:
# B1 Hq32 Hk1 N16384 D128: 512 blocks (4 splits) 11.69 ms, 2048 blocks (16 splits) 10.89;
# B2 Hq32 Hk8 N4096 D128: 512 blocks 1.61 ms, 2048 blocks (one query head a block) 1.82
# (tools/ws_block_order.py, docs/results/cuda/ws_block_order/h200_rules_before/).
WGMMA_WS_BACKWARD_MORE_BLOCKS = 2048
WGMMA_WS_BACKWARD_MIN_ROWS = 32768
# wgmma_bwd_ws starts its blocks tile-major (every head's heaviest tile of keys in the first wave) where a block
# loops over several query heads, the mask is bounded on one side (causal) and the grid has fewer blocks than
# this (about 8 per SM): with a few waves, grid order would start the last heads' heaviest blocks in the last
# wave, to run on alone (B2 Hq32 Hk8 N4096 D128 causal, 512 blocks, tile-major against grid order on an
# H200: 1.61 ms against 1.74); with many, the last wave is short whatever the order, and grid order keeps a few
# heads' Q_i, dO_i in L2 instead of every head's (B1 Hq32 Hk8 N16384 D128 causal,
# 1024 blocks: grid 10.97 ms, tile-major 11.32).
WGMMA_WS_TILE_MAJOR_MAX_BLOCKS = 1024
# None: ws_backward_tile_major's rule; "grid" or "tile-major" forces that order (tools/ws_block_order.py)
WGMMA_WS_BACKWARD_ORDER = None


def _ws_key_blocks(p: Problem) -> int:
    """wgmma_bwd_ws's blocks before any split: one per tile of 128 keys of each K/V head (grid x times y)."""
    return _cdiv(p.Nk, 128) * p.B * p.kv_heads


@_cached
def ws_backward_splits(p: Problem) -> int:
    """How many blocks wgmma_bwd_ws gives each (K/V head, tile of keys): 1 without grouped-query heads; with them,
    enough to reach ``WGMMA_WS_BACKWARD_MIN_BLOCKS`` blocks (at most one per query head of the group; no split is
    left empty), or more, toward ``WGMMA_WS_BACKWARD_MORE_BLOCKS``, while each block keeps query heads enough to
    stream ``WGMMA_WS_BACKWARD_MIN_ROWS`` query rows."""
    blocks = _ws_key_blocks(p)
    if p.group == 1:
        return 1

    def splits_toward(target: int, min_per: int = 1) -> int:
        per = max(min_per, _cdiv(p.group, min(p.group, _cdiv(target, blocks))))
        return _cdiv(p.group, min(per, p.group))

    splits = splits_toward(WGMMA_WS_BACKWARD_MIN_BLOCKS) if blocks < WGMMA_WS_BACKWARD_MIN_BLOCKS else 1
    if blocks < WGMMA_WS_BACKWARD_MORE_BLOCKS:
        splits = max(splits, splits_toward(WGMMA_WS_BACKWARD_MORE_BLOCKS, _cdiv(WGMMA_WS_BACKWARD_MIN_ROWS, p.Nq)))
    return splits


@_cached
def ws_backward_tile_major(p: Problem) -> bool:
    """Whether wgmma_bwd_ws starts its blocks tile-major (``WGMMA_WS_TILE_MAJOR_MAX_BLOCKS``): each block loops over
    several query heads, the mask is bounded on one side, and the grid is small; else grid order.
    ``WGMMA_WS_BACKWARD_ORDER`` forces one."""
    if WGMMA_WS_BACKWARD_ORDER is not None:
        if WGMMA_WS_BACKWARD_ORDER not in ("grid", "tile-major"):
            raise ValueError(f"ws_backward_tile_major: WGMMA_WS_BACKWARD_ORDER must be None, 'grid' or 'tile-major', "
                             f"got {WGMMA_WS_BACKWARD_ORDER!r}")
        return WGMMA_WS_BACKWARD_ORDER == "tile-major"
    splits = ws_backward_splits(p)
    blocks = _ws_key_blocks(p) * splits
    one_sided = (p.window[0] >= 0) != (p.window[1] >= 0)
    return _cdiv(p.group, splits) > 1 and one_sided and blocks < WGMMA_WS_TILE_MAJOR_MAX_BLOCKS


@_cached
def wgmma_bwd_ws(p: Problem, config: Optional[tuple] = None) -> LaunchSpec:
    """wgmma_backward.cu: the one-kernel backward warp-specialised, a producer warpgroup and 2 consumer
    warpgroups of 64 keys (Bc = 128); (Br queries per tile, stages) = config or WGMMA_WS_BACKWARD_CONFIGS[D]
    (Br 64, or 128 at D = 32 and 64); q, k, v, dO reach it as tensor maps; dQ summed into the float32 dQaccum
    (``dq_accum_shape``, zeroed by ``wgmma_bwd_preprocess``) as in wgmma_bwd_fused. Grid z: ``ws_backward_splits`` (> 1: the partial dK, dV go to the
    float32 dKVpart, ``kv_part_shape``, and ``wgmma_bwd_kv_sum`` adds them up); the order its blocks start in:
    ``ws_backward_tile_major``."""
    Bc = 128
    Br, stages = config or WGMMA_WS_BACKWARD_CONFIGS[p.D]
    # wgmma_bwd_ws's carve-up: sK, sV (Bc, D); sQ, sdO STAGES x (Br, D); sdS 2 x (Br, Bc), 16-bit; sdQ 2 buffers
    # of 64 x D / 2 floats (Br = 128: of 64 x D); sL and sDl STAGES x Br floats each; the mbarriers (kv_full,
    # q_full and q_empty per stage); + alignment
    smem = (2 * Bc + 2 * stages * Br) * p.D * 2 + 2 * Br * Bc * 2 + (Br // 64) * 64 * p.D * 4 \
        + 2 * stages * Br * 4 + 8 * (1 + 2 * stages) + 1024
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_ws<{p.D}, {Br}, {stages}, {_bf16(p)}{_dropout_flag(p)}>",
                      (_cdiv(p.Nk, Bc), p.B * p.kv_heads, ws_backward_splits(p)), (384,), smem,
                      ("LSE", "Delta", "dK", "dV", "dQaccum", "dKVpart"),
                      _tc_args(p) + (("tile_major", np.int32(ws_backward_tile_major(p))),),
                      maps=(("tmQ", "Q", Br), ("tmK", "K", Bc), ("tmV", "V", Bc), ("tmdO", "dO", Br)))


def kv_part_shape(p: Problem) -> tuple:
    """wgmma_bwd_ws's float32 dKVpart when it splits the query heads: (2 (dK, dV), splits, B * Hk, Nk, D)."""
    return (2, ws_backward_splits(p), p.B * p.kv_heads, p.Nk, p.D)


@_cached
def wgmma_bwd_kv_sum(p: Problem) -> LaunchSpec:
    """wgmma_backward.cu: dK, dV in 16 bits from wgmma_bwd_ws's parts, 4 elements per thread, 256 threads a block."""
    n = p.B * p.kv_heads * p.Nk * p.D
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_kv_sum<{_bf16(p)}>", (_cdiv(n, 4 * 256),), (256,), 0,
                      ("dKVpart", "dK", "dV"), (("splits", np.int32(ws_backward_splits(p))), ("n", np.int64(n)),
                                                ("softmax_scale", np.float32(p.scale))))


@_cached
def wgmma_bwd_preprocess(p: Problem) -> LaunchSpec:
    """wgmma_backward.cu: the one-kernel backwards' first step, Delta_i = rowsum(dO_i * O_i) as mma_bwd_preprocess
    (4 rows per block of 128 threads) and dQaccum (``dq_accum_shape``) zeroed in the same pass."""
    rows = p.B * p.H * p.Nq
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_preprocess<{p.D}, {_bf16(p)}>", (_cdiv(rows, 4),), (128,), 0,
                      ("O", "dO", "Delta", "dQaccum"), (("rows", np.int64(rows)),
                                                        ("zeros", np.int64(math.prod(dq_accum_shape(p))))))


@_cached
def wgmma_bwd_dq_store(p: Problem) -> LaunchSpec:
    """wgmma_backward.cu: dQ = softmax_scale * dQaccum in 16 bits, 4 elements per thread, 256 threads a block."""
    n = p.B * p.H * p.Nq * p.D
    return LaunchSpec("wgmma_backward.cu", f"wgmma_bwd_dq_store<{p.D}, 2, {_bf16(p)}>", (_cdiv(n, 4 * 256),), (256,),
                      0, ("dQaccum", "dQ"), (("Nq", np.int32(p.Nq)), ("n", np.int64(n)),
                                             ("softmax_scale", np.float32(p.scale))))


def dq_accum_shape(p: Problem) -> tuple:
    """wgmma_bwd_fused's float32 dQaccum: (B * Hq, ceil(Nq / 64), 64, D), blocks of 64 query rows (each block laid
    out as wgmma_backward.cu's DqReduce says)."""
    return (p.B * p.H, _cdiv(p.Nq, 64), 64, p.D)


# ------------------------------------------------------------------------------------ launching (checked inputs)
def _problem(q, k, scale, window, dtype=None, dropout=(0.0, None)) -> Problem:
    return _problem_of(tuple(q.shape), tuple(k.shape), dtype or dtype_name(q), scale, window, dropout)


def _problem_of(q_shape: tuple, k_shape: tuple, dtype: str, scale, window, dropout=(0.0, None)) -> Problem:
    """The Problem of q (B, H, Nq, D) and k (B, Hk, Nk, D) of ``dtype``."""
    B, H, Nq, D = q_shape
    Nk = k_shape[2]
    p_drop, seed = dropout
    # a bound past Nq + Nk hides nothing (left >= Nk and right >= Nq already do not): clamp it there, so the
    # kernels' int32 index arithmetic (the diagonal i + offset + right) cannot overflow whatever int the caller passed
    window = tuple(min(int(w), Nq + Nk) for w in window)
    return Problem(B, H, Nq, Nk, D, dtype, float(scale), window, int(k_shape[1]), float(p_drop),
                   None if seed is None else int(seed))


def _check_variants(kernel: str, p: Problem, fn: str) -> None:
    """The fp32 kernels (naive, tiled, backward.cu) take the causal mask only: the other variants are refused
    here too, so no launch can ignore them (the public functions refuse them first, with the same table)."""
    if kernel in TENSOR_CORE_KERNELS + TENSOR_CORE_BACKWARDS:  # forward and backward rungs alike
        return
    used = [name for name, on in (("window_size", tuple(p.window) not in ((-1, -1), (-1, 0))),
                                  ("grouped-query K/V heads", p.kv_heads != p.H), ("dropout_p", p.dropout)) if on]
    if used:
        raise ValueError(f"{fn}: kernel {kernel!r} does not take {', '.join(used)}; the variants need the "
                         f"tensor-core kernels (mma, wgmma, wgmma-ws; backward: wgmma, mma)")


def padded_head_dim(D: int, head_dims: tuple = TENSOR_CORE_HEAD_DIMS) -> int:
    """The head dim a tensor-core kernel runs a problem of head dim D at: the smallest of ``head_dims`` (the
    kernel's compiled head dims: ``capabilities.TENSOR_CORE_HEAD_DIMS``, or a backward's ``BACKWARD_HEAD_DIMS``)
    that is >= D (D itself when it is one of them)."""
    for size in head_dims:
        if D <= size:
            return size
    raise ValueError(f"padded_head_dim: the kernel takes D <= {head_dims[-1]}, got {D}")


def run_forward(q, k, v, window, scale: float, kernel: str, config: Optional[tuple] = None, dropout=(0.0, None)):
    """Launch rung ``kernel``'s forward on checked q, k, v (made contiguous) -> (o in q's dtype, lse float32).

    q (B, Hq, Nq, D); k, v (B, Hk, Nk, D) with Hq % Hk == 0 (mma, wgmma; the others Hk == Hq); dropout:
    (dropout_p, dropout_seed), checked (tensor-core kernels only). These run a D they are not compiled for on
    copies zero-padded to ``padded_head_dim(D)`` (``scale`` is the caller's, so the scores are those of D).
    The tensor-core kernels read 16-byte vectors (cp.async; wgmma-ws tensor maps), which need 16-byte aligned
    addresses: a misaligned input (a view at an odd offset into its storage) is copied.
    A call whose key ran before on contiguous, aligned torch tensors runs that call's C++ launch plan
    (launch_plans.py): the same launch, without the Python between allocation and launch."""
    plan_key = launch_plans.checked_key(q, k, window, scale, kernel, config, dropout)
    if plan_key is not None:
        plan = launch_plans.FORWARD.get(plan_key)
        if plan is not None:
            out = launch_plans.run(plan, [q, k, v])
            if out is not None:
                return out
    D = q.shape[-1]
    if kernel in TENSOR_CORE_KERNELS and padded_head_dim(D) != D:
        Dp = padded_head_dim(D)
        o, lse = run_forward(*(runtime.pad_last(x, Dp) for x in (q, k, v)), window, scale, kernel, config, dropout)
        return runtime.cut_last(o, D), lse
    given = (q, k, v)
    q, k, v = (runtime.contig(x) for x in (q, k, v))
    if kernel in TENSOR_CORE_KERNELS:  # 16-byte loads and tensor maps need 16-byte aligned addresses
        q, k, v = (x if runtime.ptr(x) % 16 == 0 else runtime.copy(x) for x in (q, k, v))
    p = _problem(q, k, scale, window, dropout=dropout)
    _check_variants(kernel, p, "run_forward")
    stream = runtime.Stream(q)
    o = runtime.empty_as(q)  # (B, H, Nq, D) in q's dtype: q is contiguous here
    lse = runtime.empty(q, (p.B, p.H, p.Nq), "float32")
    aligned = all(runtime.ptr(x) % 16 == 0 for x in (q, k, v))
    vec4 = p.D % 4 == 0 and aligned
    ctas = runtime.device_sms(q) if kernel in ("wgmma-ws", "mma") else None
    spec = forward_spec(kernel, p, vec4=vec4, config=config, ctas=ctas)
    runtime.launch(stream, spec, dict(Q=q, K=k, V=v, O=o, LSE=lse))
    if plan_key is not None and aligned and stream.handle is not None and kernel in TENSOR_CORE_KERNELS \
            and all(a is b for a, b in zip(given, (q, k, v))):  # this call, as a plan for the next of its key
        launch_plans.remember(launch_plans.FORWARD, plan_key, (spec,), dict(Q=q, K=k, V=v),
                              (("O", o), ("LSE", lse)), {}, ("O", "LSE"))
    return o, lse


def run_seed_nomax(q, k, v, scale: float):
    """The seed lab kernel on checked float32 q, k, v (full attention) -> o."""
    q, k, v = (runtime.contig(x) for x in (q, k, v))
    p = _problem(q, k, scale, (-1, -1))
    o = runtime.empty(q, (p.B, p.H, p.Nq, p.D), "float32")
    runtime.launch(runtime.Stream(q), seed_nomax_fwd(p), dict(Q=q, K=k, V=v, O=o), as_arg=runtime.as_cupy)
    return o


class BackwardPlan(NamedTuple):
    """What ``run_backward`` does for one (kernel, dtype, shapes, GPU, window, scale, dropout, config), worked out
    once by :func:`backward_plan`: a call then only allocates its outputs and launches.

    kernel: the backward kernel ('auto' resolved). pad_to: the head dim the kernel runs at when it is not D (the
    inputs are zero-padded to it and the call runs that plan), else None. p: the problem as the kernels see it.
    specs: the launches, in order. scratch: ((buffer, offset), ...): the float32 buffers no caller sees (Delta,
    dQaccum, dKVpart), at offsets (in elements) into ONE allocation of ``scratch_size`` elements (tensor-core
    kernels; the fp32 kernels take CuPy arrays and get Delta alone). out_dtype: the gradients' dtype."""

    kernel: str
    pad_to: Optional[int]
    p: Optional[Problem]
    specs: tuple
    scratch: tuple
    scratch_size: int
    out_dtype: str


_SCRATCH_ALIGN = 64  # float32 elements (256 bytes) between the scratch buffers' starts


@_cached
def backward_plan(kernel: str, dtype: str, q_shape: tuple, k_shape: tuple, cc: tuple, window: tuple, scale: float,
                  dropout: tuple = (0.0, None), config: Optional[tuple] = None) -> BackwardPlan:
    """The :class:`BackwardPlan` of a backward call on checked inputs (q of ``q_shape``, k and v of ``k_shape``,
    ``dtype``, on a GPU of compute capability ``cc``), cached: a training loop builds it once."""
    if kernel == "auto":
        kernel = auto_backward(dtype, q_shape[-1], cc)
    elif kernel == "mma-auto":  # the mma rung's own backward (capabilities.BACKWARD_OF)
        kernel = mma_auto_backward(q_shape[-1], cc)
    if kernel not in TENSOR_CORE_BACKWARDS + ("tiled",):
        raise ValueError(f"run_backward: kernel must be 'wgmma', 'wgmma-fused', 'wgmma-ws', 'mma', 'mma-fused', "
                         f"'tiled' or 'auto', got {kernel!r}")
    if config is not None and kernel not in ("wgmma", "mma", "mma-fused", "wgmma-ws"):
        raise ValueError(f"run_backward: config applies to kernel 'wgmma', 'wgmma-ws', 'mma' or 'mma-fused', got "
                         f"kernel {kernel!r}")
    D = q_shape[-1]
    tensor_cores = kernel in TENSOR_CORE_BACKWARDS
    Dp = padded_head_dim(D, BACKWARD_HEAD_DIMS[kernel]) if tensor_cores else D
    if Dp != D:  # zero columns: dO V^T, Delta and dS are unchanged
        return BackwardPlan(kernel, Dp, None, (), (), 0, dtype)
    p = _problem_of(q_shape, k_shape, dtype if tensor_cores else "float32", scale, window, dropout)
    B, H, Nq = p.B, p.H, p.Nq
    _check_variants(kernel, p, "run_backward")
    if kernel in ("wgmma-fused", "wgmma-ws"):  # Delta and dQaccum = 0, one kernel for dK, dV and (float32,
        # atomically) dQ, then dQ
        one = wgmma_bwd_ws(p, config) if kernel == "wgmma-ws" else wgmma_bwd_fused(p)
        specs = (wgmma_bwd_preprocess(p), one, wgmma_bwd_dq_store(p))
        sizes = [("dQaccum", math.prod(dq_accum_shape(p))), ("Delta", B * H * Nq)]
        if kernel == "wgmma-ws" and ws_backward_splits(p) > 1:  # split query heads: partial dK, dV, then their sum
            specs += (wgmma_bwd_kv_sum(p),)
            sizes.append(("dKVpart", math.prod(kv_part_shape(p))))
    elif kernel == "mma-fused":  # Delta and dQaccum = 0, one kernel for dK, dV and (float32, atomically) dQ, then dQ
        specs = (mma_bwd_fused_preprocess(p), mma_bwd_fused(p, config), mma_bwd_dq_store(p))
        sizes = [("dQaccum", B * H * Nq * p.D), ("Delta", B * H * Nq)]
    elif tensor_cores:  # Delta from mma_bwd_preprocess, then the rung's dK/dV and dQ kernels
        dkdv, dq = (wgmma_bwd_dkdv, wgmma_bwd_dq) if kernel == "wgmma" else (mma_bwd_dkdv, mma_bwd_dq)
        specs, sizes = (mma_bwd_preprocess(p), dkdv(p, config), dq(p, config)), [("Delta", B * H * Nq)]
    else:  # D_i first, then dK/dV and dQ (both read D_i)
        specs, sizes = (bwd_preprocess(p), bwd_dkdv(p), bwd_dq(p)), []
    scratch, size = [], 0
    for name, n in sizes:
        scratch.append((name, size))
        size += _cdiv(n, _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    if kernel == "wgmma-ws" and len(sizes) == 2:  # no split: wgmma_bwd_ws does not touch dKVpart
        scratch.append(("dKVpart", 0))
    return BackwardPlan(kernel, None, p, specs, tuple(scratch), size, dtype)


def run_backward(q, k, v, o, lse, do, window, scale: float, kernel: str = "auto", config: Optional[tuple] = None,
                 dropout=(0.0, None)):
    """dQ, dK, dV in q's dtype from checked inputs; kernel 'wgmma-fused' or 'wgmma-ws' (Hopper, D <= 128: D other
    than 64 and 128 zero-padded to the next, as in run_forward), 'wgmma' (Hopper) or 'mma' (fp16/bf16, D <= 256:
    padded to 64, 128 or 256; capabilities.BACKWARD_HEAD_DIMS), 'tiled' (fp32 kernels: other
    dtypes are converted to float32 and the gradients back) or 'auto' (capabilities.auto_backward). config: the
    tile config of 'wgmma', 'wgmma-ws' or 'mma' (default: their tables).

    q, o, do (B, Hq, Nq, D); k, v (B, Hk, Nk, D), Hq % Hk == 0 (wgmma, mma): dK, dV (B, Hk, Nk, D) are summed
    over each K/V head's group of query heads. dropout: the forward's (dropout_p, dropout_seed) (wgmma, mma).
    What to launch is :func:`backward_plan`'s, once per distinct call; a call allocates dQ, dK, dV and one float32
    scratch buffer, and launches."""
    plan_key = launch_plans.checked_key(q, k, window, scale, kernel, config, dropout)
    launch_plans.LAST.backward = None
    if plan_key is not None:
        hit = launch_plans.BACKWARD.get(plan_key)
        if hit is not None:
            out = launch_plans.run(hit, [q, k, v, o, lse, do])
            if out is not None:
                launch_plans.LAST.backward = hit
                return out
    plan = backward_plan(kernel, dtype_name(q), tuple(q.shape), tuple(k.shape), runtime.device_cc(q),
                         tuple(window), float(scale), tuple(dropout), config)
    if plan.pad_to is not None:
        D = q.shape[-1]
        q, k, v, o, do = (runtime.pad_last(x, plan.pad_to) for x in (q, k, v, o, do))
        grads = run_backward(q, k, v, o, lse, do, window, scale, plan.kernel, config, dropout)
        launch_plans.LAST.backward = None  # the padded call's plan is not this call's
        return tuple(runtime.cut_last(g, D) for g in grads)
    p = plan.p
    given = (q, k, v, o, lse, do)
    if plan.scratch:  # the tensor-core kernels take raw addresses
        q, k, v, o, do, lse = (runtime.contig(x) for x in (q, k, v, o, do, lse))
        # 16-byte loads and tensor maps need 16-byte aligned addresses: misaligned views are copied
        q, k, v, o, do, lse = (x if runtime.ptr(x) % 16 == 0 else runtime.copy(x) for x in (q, k, v, o, do, lse))
        as_arg = runtime.ptr
    else:
        q, k, v, o, do, lse = (runtime.convert(x, "float32") for x in (q, k, v, o, do, lse))
        as_arg = runtime.as_cupy
    stream = runtime.Stream(q)
    dq, dk, dv = (runtime.empty_as(x) for x in (q, k, v))  # contiguous, in the kernels' dtype (p.dtype)
    arrays = dict(Q=q, K=k, V=v, O=o, dO=do, LSE=lse, dQ=dq, dK=dk, dV=dv)
    if plan.scratch:  # one allocation; each buffer by its address (alive until this returns: the launches are
        # ordered on the stream before any later use of the memory)
        scratch = runtime.empty(q, (plan.scratch_size,), "float32")
        base = runtime.ptr(scratch)
        for name, offset in plan.scratch:
            arrays[name] = base + 4 * offset
    else:
        arrays["Delta"] = runtime.empty(q, (p.B, p.H, p.Nq), "float32")
    for spec in plan.specs:
        runtime.launch(stream, spec, arrays, as_arg=as_arg)
    if plan.out_dtype != p.dtype:
        dq, dk, dv = (runtime.convert(g, plan.out_dtype) for g in (dq, dk, dv))
    elif plan_key is not None and plan.scratch and stream.handle is not None \
            and all(a is b and runtime.ptr(a) % 16 == 0 for a, b in zip(given, (q, k, v, o, lse, do))):
        launch_plans.LAST.backward = launch_plans.remember(
            launch_plans.BACKWARD, plan_key, plan.specs, dict(Q=q, K=k, V=v, O=o, LSE=lse, dO=do),
            (("dQ", dq), ("dK", dk), ("dV", dv), ("scratch", scratch)),
            {name: ("scratch", 4 * offset) for name, offset in plan.scratch}, ("dQ", "dK", "dV"))
    return dq, dk, dv
