"""The CUDA backend (flash_attention_cuda) beyond the shared harness.

* bad input (runs on the CPU too): tensors not on a CUDA device, unknown kernel name, a
  (kernel, dtype, D) combination a rung does not support (the message lists what it supports);
* launch specs (CPU too): every kernel's grid, block, shared memory and argument list, checked against the
  ``__global__`` declarations parsed from the .cu files, so a signature mismatch shows without a GPU;
* on a GPU: the seed lab kernel's overflow (no running max) against ours, large and negative scales,
  CuPy arrays in and out, zero-copy DLPack views, torch's current stream, odd D (scalar-load path),
  the autograd backward of every rung. Without a GPU these skip with the reason
  (``cupy.cuda.is_available()`` is False).
"""
import functools
import math
import os
import re

import numpy as np
import pytest
import torch

from benchmarks.presets import CONFIG_CANDIDATES
from flash_attention_py import attention_naive, attention_reference, attention_reference_grads, make_inputs
from flash_attention_py.testing import FLOOR, LSE_FLOOR
from flash_attention_py import masks
from flash_attention_py.masks import CAUSAL, FULL

import flash_attention_cuda as fac
from flash_attention_cuda import flash_attn_cuda, flash_attn_cuda_backward, launch_specs, runtime
from flash_attention_cuda.capabilities import (BACKWARD, BACKWARD_HEAD_DIMS, CAPABILITIES, HOPPER_BACKWARD,
                                             TENSOR_CORE_HEAD_DIMS, cuda_unavailable_reason, hopper_probe, is_hopper)

REASON = cuda_unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))
HOPPER_REASON = hopper_probe("cuda")
hopper = pytest.mark.skipif(HOPPER_REASON is not None, reason=f"wgmma: {HOPPER_REASON}")
WGMMA = pytest.param("wgmma", marks=hopper)
WGMMA_WS = pytest.param("wgmma-ws", marks=hopper)


def _inputs(B, H, Nq, Nk, D, dtype="float32", seed=None):
    x = make_inputs(B, H, Nq, Nk, D, dtype=dtype, kind="torch", device="cuda", seed=seed)
    return x["q"], x["k"], x["v"], x["do"]


def _err(a, b):
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------ bad input (CPU or GPU)
def test_cpu_tensors_rejected():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="must be on a CUDA device, got cpu"):
        flash_attn_cuda(q, q, q)


def test_unknown_kernel_name():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match=r"unknown kernel 'wmma'.*naive, tiled, mma"):
        flash_attn_cuda(q, q, q, kernel="wmma")
    with pytest.raises(TypeError, match="kernel must be a str"):
        flash_attn_cuda(q, q, q, kernel=3)


@pytest.mark.parametrize("kernel,dtype,D", [("mma", "float32", 64), ("mma", "float16", 260), ("naive", "float16", 64),
                                            ("tiled", "float32", 256), ("auto", "float64", 64),
                                            ("auto", "float32", 160), ("wgmma", "bfloat16", 257)])
def test_unsupported_combination_lists_what_is_supported(kernel, dtype, D):
    q = torch.randn(1, 1, 4, D).to(getattr(torch, dtype))
    with pytest.raises(ValueError, match=r"D = %d.*mma: float16/bfloat16, D <= 256" % D):
        flash_attn_cuda(q, q, q, kernel=kernel)


def test_numpy_and_shape_errors():
    with pytest.raises(TypeError, match="q must be a torch.Tensor or cupy.ndarray"):
        flash_attn_cuda(np.zeros((1, 1, 4, 64), np.float32), np.zeros((1, 1, 4, 64), np.float32),
                        np.zeros((1, 1, 4, 64), np.float32))
    q = torch.randn(1, 1, 4, 64)
    with pytest.raises(ValueError, match="4 dimensions"):
        flash_attn_cuda(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="causal must be True or False"):
        flash_attn_cuda(q, q, q, causal=1)


def test_rung_table():
    assert fac.KERNELS == ("naive", "tiled", "mma", "wgmma", "wgmma-ws")
    assert fac.RUNGS["wgmma"].supports("float16", 160) and not fac.RUNGS["wgmma"].supports("float16", 257)
    assert BACKWARD["mma"].supports("float16", 256) and not BACKWARD["wgmma-ws"].supports("float16", 160)
    assert fac.RUNGS["mma"].supports("bfloat16", 128) and not fac.RUNGS["mma"].supports("float32", 64)
    assert all(fac.RUNGS[name[len("cuda-"):]] is cap for name, cap in CAPABILITIES.items())  # one table
    assert [n for n, c in CAPABILITIES.items() if c.hopper_only] == ["cuda-wgmma", "cuda-wgmma-ws"]
    assert is_hopper((9, 0)) and is_hopper("90") and not is_hopper((8, 0)) and not is_hopper((10, 0))


def test_auto_forward_on_a_hopper(monkeypatch):
    """kernel='auto' for fp16/bf16: wgmma-ws on a Hopper, at short and long K/V alike; mma elsewhere; fp32: tiled."""
    from flash_attention_cuda import checks
    from flash_attention_py.validation import check_qkv

    monkeypatch.setattr(checks, "device_of", lambda x: "cuda:0")
    for cc, want in (((9, 0), "wgmma-ws"), ((8, 0), "mma")):
        monkeypatch.setattr(runtime, "device_cc", lambda x, cc=cc: cc)
        for D, Nk in ((64, 100), (128, 5000), (40, 17)):
            q, k = torch.randn(1, 2, 33, D, dtype=torch.float16), torch.randn(1, 2, Nk, D, dtype=torch.float16)
            assert checks._resolve_kernel(q, check_qkv(q, k, k, fn="f"), "auto", "f") == want
        q = torch.randn(1, 2, 33, 64)
        assert checks._resolve_kernel(q, check_qkv(q, q, q, fn="f"), "auto", "f") == "tiled"


def test_checked_plans_are_cached_by_what_the_checks_read(monkeypatch, recorded_launches):
    """flash_attn_cuda checks a call once per distinct key and reuses the answer; a different shape, dtype or
    argument is checked again, bad input is refused every time (never cached), and calls whose checks read the
    data (|softmax_scale| > 1) or that hold unhashable arguments are checked every time."""
    from flash_attention_cuda import checks

    monkeypatch.setattr(checks, "device_of", lambda x: "cuda:0")
    monkeypatch.setattr(checks, "_PLANS", {})
    seen = []
    real = checks.check_forward
    monkeypatch.setattr(checks, "check_forward", lambda *a, **kw: seen.append(a[0].shape) or real(*a, **kw))
    q = torch.randn(1, 2, 33, 64, dtype=torch.float16)
    for _ in range(3):
        flash_attn_cuda(q, q, q, causal=True)
    assert len(seen) == 1 and len(recorded_launches) == 3
    flash_attn_cuda(q[:, :, :17], q, q, causal=True)  # another shape
    flash_attn_cuda(q, q, q, causal=False)  # another argument
    assert len(seen) == 3
    with pytest.raises(TypeError, match="causal must be True or False"):  # equal to True, but refused
        flash_attn_cuda(q, q, q, causal=1)
    with pytest.raises(TypeError, match="causal must be True or False"):  # and refused again
        flash_attn_cuda(q, q, q, causal=1)
    for _ in range(2):
        flash_attn_cuda(q, q, q, window_size=[3, 0])  # a list: not hashable, checked each time
        flash_attn_cuda(q, q, q, softmax_scale=2.0)  # |scale| > 1: the range check reads q and k
    assert len(seen) == 3 + 2 + 4


def test_forward_with_config_refuses_bad_configs():
    """The sweeps' entry point checks the config first, then checks as flash_attn_cuda does."""
    q = torch.randn(1, 1, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"forward_with_config: kernel must be one of mma, wgmma.*got 'tiled'"):
        fac.forward_with_config(q, q, q, kernel="tiled", config=(64, 4, 2))
    for bad in ((64, 4), [64, 4, 2], (64, 0, 2), (64.0, 4, 2), (True, 4, 2)):
        with pytest.raises(ValueError, match=r"forward_with_config: config for kernel 'mma' must be a tuple of 3 "
                                             r"positive ints \(Bc, warps, m16 tiles per warp\), got"):
            fac.forward_with_config(q, q, q, kernel="mma", config=bad)
    with pytest.raises(ValueError, match="forward_with_config: q, k and v must be on a CUDA device, got cpu"):
        fac.forward_with_config(q, q, q, kernel="mma", config=(64, 4, 2))


# ------------------------------------------------------------------ launch specs against the .cu files (CPU)
_SCALAR_TYPES = {"int": np.int32, "float": np.float32, "long long": np.int64, "unsigned": np.uint32}


@functools.lru_cache(maxsize=None)
def _kernel_params(source: str) -> dict:
    """kernel name -> [(name, 'ptr' | numpy scalar type)] from the ``__global__`` definitions in kernels/<source>."""
    with open(os.path.join(runtime.KERNEL_DIR, source)) as f:
        text = re.sub(r"//[^\n]*", "", f.read())
    kernels = {}
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(([^)]*)\)\s*\{", text):
        params = []
        for p in m.group(2).split(","):
            words = p.replace("*", " * ").split()
            name, kind = words[-1], " ".join(w for w in words[:-1] if w not in ("const", "__restrict__",
                                                                                 "__grid_constant__"))
            params.append((name, "ptr" if "*" in kind else "tmap" if kind == "tma::TmaMap" else _SCALAR_TYPES[kind]))
        kernels[m.group(1)] = params
    return kernels


def _all_specs():
    """(spec, what it is for) for every kernel, dtype and head-dim family the launcher uses."""
    out = []
    for D, window in ((40, FULL), (64, CAUSAL), (128, (3, 0)), (7, (-1, 2))):
        p = launch_specs.Problem(2, 3, 77, 130, D, "float32", -0.3, window)
        out += [(launch_specs.naive_fwd(p), p), (launch_specs.tiled_fwd(p, vec4=D % 4 == 0), p),
                (launch_specs.seed_nomax_fwd(p), p), (launch_specs.bwd_preprocess(p), p), (launch_specs.bwd_dkdv(p), p),
                (launch_specs.bwd_dq(p), p)]
    for D in (32, 64, 96, 128):
        for dtype in ("float16", "bfloat16"):
            # the tensor-core kernels: plain causal, and with every variant (window, 6 query heads on 3 K/V
            # heads, dropout with a seed past 2**32)
            for p in (launch_specs.Problem(2, 3, 77, 130, D, dtype, 0.125, CAUSAL),
                      launch_specs.Problem(2, 6, 77, 130, D, dtype, 0.125, (5, 2), 3, 0.25, 2**40 + 7)):
                out += [(launch_specs.mma_fwd(p), p), (launch_specs.wgmma_fwd(p), p), (launch_specs.wgmma_ws_fwd(p), p),
                        (launch_specs.mma_bwd_preprocess(p), p), (launch_specs.mma_bwd_dkdv(p), p),
                        (launch_specs.mma_bwd_dq(p), p), (launch_specs.wgmma_bwd_dkdv(p), p),
                        (launch_specs.wgmma_bwd_dq(p), p), (launch_specs.wgmma_bwd_fused(p), p),
                        (launch_specs.wgmma_bwd_ws(p), p), (launch_specs.wgmma_bwd_preprocess(p), p),
                        (launch_specs.wgmma_bwd_dq_store(p), p),
                        (launch_specs.wgmma_bwd_kv_sum(p), p)]
    return out


def test_launch_specs_match_the_kernel_signatures():
    """Each spec's buffers and scalars are the kernel's parameter list (names, order, types), as the .cu declares it."""
    params = {source: _kernel_params(source) for source in runtime.SOURCES}
    for spec, p in _all_specs():
        kernel = spec.name.split("<")[0]
        assert kernel in params[spec.source], f"{spec.source} declares no __global__ {kernel}"
        want = params[spec.source][kernel]
        got = ([(m, "tmap") for m, _, _ in spec.maps] + [(b, "ptr") for b in spec.buffers]
               + [(n, type(v)) for n, v in spec.scalars])
        assert len(got) == len(want), f"{kernel}: launch passes {len(got)} arguments, the kernel takes {len(want)}"
        for (gname, gtype), (wname, wtype) in zip(got, want):
            assert gname.lower() == wname.lower() and gtype is wtype, \
                f"{kernel}: passes {gname} {gtype}, takes {wname} {wtype}"
        values = dict(spec.scalars)
        if "scale_log2" in values:  # one signed scale in log2 units, the window as (left, right)
            assert values["scale_log2"] == np.float32(p.scale * math.log2(math.e))
        if "window_left" in values:
            assert (values["window_left"], values["window_right"]) == p.window
        if "group" in values:  # query heads per K/V head; dropout p in float32, the seed as two 32-bit words
            assert values["group"] == p.H // (p.Hk or p.H)
            assert values["dropout_p"] == np.float32(p.dropout_p)
            seed = p.dropout_seed if p.dropout_p > 0 else 0
            assert (int(values["seed_lo"]), int(values["seed_hi"])) == (seed % 2**32, seed >> 32)
            # the flags DROPOUT (and GQA, mma_bwd_dkdv), given only when set: template arguments after the default
            # (wgmma_ws_fwd spells out all seven: ..., BF16, DROPOUT, OWN_O)
            args = [a.strip() for a in spec.name.split("<")[1].rstrip(">").split(",")]
            if kernel == "wgmma_ws_fwd":
                assert len(args) == 7 and args[5] == ("true" if p.dropout_p > 0 else "false"), spec.name
                continue
            gqa = kernel.endswith(("mma_bwd_dkdv", "wgmma_bwd_fused")) and p.H != (p.Hk or p.H)
            n_base = {"mma_fwd": 5, "wgmma_fwd": 4, "wgmma_bwd_ws": 4}.get(kernel, 4)
            assert len(args) == n_base + (2 if gqa else p.dropout_p > 0), spec.name


def test_launch_specs_grid_block_smem():
    """The launch geometry of each rung: blocks of Br query rows (Bc keys in the backward) by B * H."""
    p = launch_specs.Problem(2, 3, 300, 130, 40, "float32", 0.5, CAUSAL)
    n = launch_specs.naive_fwd(p)
    assert (n.name, n.grid, n.block, n.smem) == ("naive_fwd<64, 32, 64>", (5, 6), (64,), 0)
    t = launch_specs.tiled_fwd(p._replace(D=128), vec4=True)
    assert (t.name, t.grid, t.block, t.smem, dict(t.scalars)["vec4"]) == ("tiled_fwd<128, 4>", (19, 6), (128,), 0, 1)
    h = p._replace(dtype="float16", D=128)
    m = launch_specs.mma_fwd(h)  # (Bc, warps, tiles) = (128, 8, 1): Br = 128; Q + 2 x (K + V) tiles of 16-bit
    assert (m.name, m.grid, m.block, m.smem) == ("mma_fwd<128, 128, 8, 1, false>", (3, 6), (256,),
                                                 (128 + 4 * 128) * 128 * 2)
    w = launch_specs.wgmma_fwd(h._replace(dtype="bfloat16", D=64))  # (64, 2): Br = 128, plus 1024 B of alignment
    assert (w.name, w.grid, w.block, w.smem) == ("wgmma_fwd<64, 64, 2, true>", (3, 6), (256,),
                                                 (128 + 4 * 64) * 64 * 2 + 1024)
    assert launch_specs.mma_fwd(h, config=(64, 4, 2)).name == "mma_fwd<128, 64, 4, 2, false>"
    assert m.scalars[-1] == ("BH", 6)
    # mma's persistent grid (ctas blocks): only where the block keeps Q in registers and its K/V tile is as tall as
    # its rows (128, 8, 1 at D 96 and 128), the mask has no bound, and there are more items than blocks but at
    # most MMA_PERSISTENT_ITEMS_PER_SM per block (3 x 6 = 18 items here)
    full, per_sm = h._replace(window=(-1, -1)), launch_specs.MMA_PERSISTENT_ITEMS_PER_SM
    assert launch_specs.mma_fwd(full, ctas=4).grid == (4,)
    assert launch_specs.mma_fwd(full._replace(D=96), ctas=4).grid == (4,)
    assert launch_specs.mma_fwd(full, ctas=18).grid == (3, 6)  # a block per item already
    assert launch_specs.mma_fwd(h, ctas=4).grid == (3, 6)  # causal: items of different lengths
    assert launch_specs.mma_fwd(full._replace(window=(40, -1)), ctas=4).grid == (3, 6)
    assert launch_specs.mma_fwd(full, config=(64, 4, 2), ctas=4).grid == (3, 6)  # Q read from shared memory
    assert launch_specs.mma_fwd(full._replace(D=64), ctas=4).grid == (3, 6)  # (128, 4, 2)
    assert launch_specs.mma_fwd(full._replace(D=256), ctas=4).grid == (5, 6)  # Br = 64; Q in shared memory
    assert launch_specs.mma_fwd(full._replace(B=per_sm), ctas=9).grid == (9,)  # 9 per_sm items: per_sm a block
    assert launch_specs.mma_fwd(full._replace(B=per_sm + 1), ctas=9).grid == (3, 3 * per_sm + 3)
    # wgmma-ws (128, 2, 2): 2 consumer warpgroups (Br = 128) and a producer; Q + 2 stages of K and V, O's own
    # staging tile, the mbarriers and 1024 B of alignment; q, k, v as tensor maps read in boxes of Br or Bc rows;
    # one block per work item (3 rows blocks per head x 6 heads), or a persistent grid of ctas blocks that walk
    # them; each block's walk in shared memory (walk_len + 1 entries of 16 bytes). With a right bound (causal) a
    # persistent grid walks pairs of rows blocks (2 per head, heads_per_section 0) where every block gets as many,
    # else the items longest first in sections of heads (all 6 fit in one here)
    ws = launch_specs.wgmma_ws_fwd(h)
    assert (ws.name, ws.grid, ws.block, ws.smem) == ("wgmma_ws_fwd<128, 128, 2, 2, false, false, true>", (18,), (384,),
                                                     (2 * 128 + 4 * 128) * 128 * 2 + 8 * 10 + 16 * 2 + 1024)
    assert ws.maps == (("tmQ", "Q", 128), ("tmK", "K", 128), ("tmV", "V", 128)) and ws.buffers == ("O", "LSE")
    assert ws.scalars[-3:] == (("BH", 6), ("heads_per_section", 6), ("walk_len", 1))
    walks = {ctas: launch_specs.wgmma_ws_fwd(h, ctas=ctas) for ctas in (4, 5, 132)}
    # 12 pairs on 4 blocks: 3 each (6 items); on 5: 2.4 (balance 0.8 < 0.9), so 18 items longest first, 4 at most
    assert walks[4].grid == (4,) and walks[4].scalars[-2:] == (("heads_per_section", 0), ("walk_len", 6))
    assert walks[4].smem == ws.smem + 16 * 5
    assert walks[5].grid == (5,) and walks[5].scalars[-2:] == (("heads_per_section", 6), ("walk_len", 4))
    assert walks[132].grid == (12,) and walks[132].scalars[-2:] == (("heads_per_section", 0), ("walk_len", 2))
    for window, units in (((-1, -1), 18), ((40, -1), 18), ((-1, 3), 12), ((40, 0), 12)):
        assert launch_specs.wgmma_ws_fwd(h._replace(window=window), ctas=132).grid == (units,), window
    # The walks assume equal or (with a right bound) non-decreasing keys per rows block. A window bounded on both
    # sides with room to run sees fewer keys at both ends of the sequence, a left bound alone fewer at the end: where
    # the items' K/V tiles are neither and the heaviest is above WGMMA_WS_WALK_SPREAD times their mean
    # (launch_specs._walk_fits), a block per item. N = 4096: 32 rows blocks of 128 per head, 64 items
    long = h._replace(B=1, H=2, Nq=4096, Nk=4096)
    for window, grid in (((2048, 2048), 64), ((2048, -1), 64), ((128, 128), 4), ((2048, 0), 4), ((-1, 0), 4),
                         ((-1, -1), 4)):
        assert launch_specs.wgmma_ws_fwd(long._replace(window=window), ctas=4).grid == (grid,), window
    assert not launch_specs._walk_fits(long._replace(window=(2048, 2048)), 128, 128)
    assert launch_specs._walk_fits(long._replace(window=(2048, 0)), 128, 128)  # non-decreasing: the walks' order
    sections, max_walk = launch_specs.WGMMA_WS_SECTION_BYTES, launch_specs.WGMMA_WS_MAX_WALK
    try:
        launch_specs.WGMMA_WS_SECTION_BYTES = 2 * 4 * 130 * 128  # K and V of 2 heads: sections of 2
        launch_specs.WGMMA_WS_MAX_WALK = 4  # a walk of at most 4 items: 12 pairs take 6 blocks, not 1
        launch_specs.clear_caches()
        assert launch_specs.wgmma_ws_fwd(h, ctas=5).scalars[-2:] == (("heads_per_section", 2), ("walk_len", 4))
        one = launch_specs.wgmma_ws_fwd(h, ctas=1)
        assert one.grid == (6,) and one.scalars[-2:] == (("heads_per_section", 0), ("walk_len", 4))
    finally:
        launch_specs.WGMMA_WS_SECTION_BYTES, launch_specs.WGMMA_WS_MAX_WALK = sections, max_walk
        launch_specs.clear_caches()
    # persistent up to WGMMA_WS_PERSISTENT_UNITS_PER_SM units per block; beyond, a block per item (9 B items
    # here; with causal, 6 B pairs where they balance)
    per_sm, full = launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM, (-1, -1)
    assert launch_specs.wgmma_ws_fwd(h._replace(B=per_sm, window=full), ctas=9).grid == (9,)
    assert launch_specs.wgmma_ws_fwd(h._replace(B=per_sm + 1, window=full), ctas=9).grid == (9 * (per_sm + 1),)
    assert launch_specs.wgmma_ws_fwd(h._replace(B=per_sm + 1), ctas=9).grid == (9,)  # 150 pairs: 16.7 a block
    assert launch_specs.wgmma_ws_fwd(h._replace(B=2 * per_sm), ctas=3).grid == (9 * 2 * per_sm,)
    assert launch_specs.wgmma_ws_fwd(h._replace(D=64), config=(128, 3, 2)).block == (512,)
    # D = 256: O's tile does not fit beside Q (64 KiB) and the ring (128 KiB); it is staged in Q's rows
    big = launch_specs.wgmma_ws_fwd(h._replace(D=256))
    assert big.name.endswith(", false>") and big.smem == (128 + 4 * 64) * 256 * 2 + 8 * 10 + 16 * 2 + 1024 <= launch_specs.SM90_SMEM
    kv, dq = launch_specs.mma_bwd_dkdv(h._replace(D=64)), launch_specs.mma_bwd_dq(h._replace(D=64))
    assert (kv.grid, kv.block, kv.smem) == ((3, 6), (128,), (2 * 64 + 4 * 64) * 64 * 2 + 4 * 64 * 4)
    assert (dq.grid, dq.block, dq.smem) == ((5, 6), (128,), (2 * 64 + 4 * 64) * 64 * 2)
    # wgmma backward (2 warpgroups, tiles of 64): 128 keys (dK/dV) or queries (dQ) per block of 256 threads
    kv, dq = launch_specs.wgmma_bwd_dkdv(h), launch_specs.wgmma_bwd_dq(h)
    assert (kv.name, kv.grid, kv.block, kv.smem) == ("wgmma_bwd_dkdv<128, 2, 64, false>", (2, 6), (256,),
                                                     (2 * 128 + 4 * 64) * 128 * 2 + 4 * 64 * 4 + 1024)
    assert (dq.name, dq.grid, dq.block, dq.smem) == ("wgmma_bwd_dq<128, 2, 64, false>", (3, 6), (256,),
                                                     (2 * 128 + 4 * 64) * 128 * 2 + 1024)
    pre = launch_specs.bwd_preprocess(p)
    assert (pre.grid, pre.block, dict(pre.scalars)["rows"]) == ((450,), (128,), 2 * 3 * 300)
    assert (launch_specs.bwd_dkdv(p).grid, launch_specs.bwd_dq(p).grid) == ((5, 6), (10, 6))


def _check_call(call, arrays):
    """One recorded launch passes what its kernel declares, the named arrays' addresses first (Delta, dQaccum and
    dKVpart, which the backward allocates itself, are not among them)."""
    kern, grid, block, args, smem = call
    want = _kernel_params(kern.source)[kern.name.split("<")[0]]
    assert len(args) == len(want), kern.name
    for (name, kind), arg in zip(want, args):
        if kind == "tmap":  # the recording runtime's map: (address, dims, byte strides, box) of q, k or v
            x = arrays[name[2:].lower()]
            B, H, N, D = x.shape
            assert arg[0] == x.data_ptr() and arg[1:3] == ((D, N, B * H), (2 * D, 2 * D * N)), (kern.name, name)
            assert arg[3][0] == 64 and arg[3][2] == 1, (kern.name, name)
        elif kind == "ptr":
            assert name.lower() in ("delta", "dqaccum", "dkvpart") or arg == arrays[name.lower()].data_ptr(), \
                (kern.name, name)
        else:
            assert type(arg) is kind, (kern.name, name)
    assert smem <= kern.max_dynamic_shared_size_bytes  # opted in where above 48 KiB


def test_ws_rows_blocks_end_at_the_last_query_with_a_right_bound():
    """wgmma-ws's rows blocks of Br = 192 queries (D = 64): with a right bound (causal) they end at the last query
    row, so a ragged Nq's padding rows (4096 = 21 x 192 + 64: 128 of them) sit at the top, where the mask leaves
    the fewest keys. Causal, N = 4096: the first block (rows -128 .. 63) visits 1 K/V tile of 128 keys, the last
    (rows 3904 .. 4095) all 32, and the head's blocks 363 tiles; aligned to row 0 the last block (rows 4032 ..
    4223, 64 of them real) would visit 32 and the head 384 (the real rows' work is 341.3). The pairs of rows blocks
    (p, 21 - p) all visit 33 tiles. Without a right bound nothing moves."""
    causal = launch_specs.Problem(4, 32, 4096, 4096, 64, "float16", 0.125, CAUSAL)
    assert launch_specs.rows_pad_top(causal, 192) == 128
    tiles = launch_specs.ws_rows_blocks(causal, 192, 128)
    assert len(tiles) == 22 and (tiles[0], tiles[-1], sum(tiles)) == (1, 32, 363)
    assert {tiles[p] + tiles[21 - p] for p in range(11)} == {33}
    top = [len(masks.blocks(*masks.kv_range(m * 192, (m + 1) * 192, 4096, 4096, CAUSAL), 128)) for m in range(22)]
    assert sum(top) == 384
    for window, pad in (((-1, -1), 0), ((64, -1), 0), ((64, 0), 128), ((-1, 5), 128)):
        assert launch_specs.rows_pad_top(causal._replace(window=window), 192) == pad, window
    assert launch_specs.rows_pad_top(causal._replace(Nq=4032, Nk=4032), 192) == 0  # 21 x 192: no padding
    assert launch_specs.rows_pad_top(causal._replace(Nq=1), 192) == 191  # one row: the block's last


def test_launch_plumbing_without_a_gpu(recorded_launches):
    """run_forward / run_backward hand each kernel the right buffers, on a recording runtime (the custom ops on
    it: tests/test_torch_compile.py)."""
    B, H, Nq, Nk = 1, 2, 33, 70
    for kernel, dtype, D in (("naive", "float32", 40), ("tiled", "float32", 64), ("mma", "float16", 64),
                             ("wgmma", "bfloat16", 128), ("wgmma-ws", "float16", 128)):
        x = make_inputs(B, H, Nq, Nk, D, dtype=dtype, kind="torch")
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        recorded_launches.clear()
        o, lse = launch_specs.run_forward(q, k, v, CAUSAL, 0.3, kernel)
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (B, H, Nq), torch.float32)
        (call,) = recorded_launches
        _check_call(call, dict(q=q, k=k, v=v, o=o, lse=lse))
        recorded_launches.clear()
        # 'auto' on the recording runtime's Hopper: the one-kernel wgmma backward, warp-specialised, for
        # fp16/bf16, the fp32 kernels for float32
        assert HOPPER_BACKWARD == "wgmma-ws"
        auto = (["bwd_preprocess", "bwd_dkdv", "bwd_dq"] if dtype == "float32" else
                ["wgmma_bwd_preprocess", "wgmma_bwd_ws", "wgmma_bwd_dq_store"])
        for bwd_kernel, names in (("auto", auto),
                                  ("wgmma", ["mma_bwd_preprocess", "wgmma_bwd_dkdv", "wgmma_bwd_dq"]),
                                  ("mma", ["mma_bwd_preprocess", "mma_bwd_dkdv", "mma_bwd_dq"]),
                                  ("mma-fused", ["mma_bwd_fused_preprocess", "mma_bwd_fused", "mma_bwd_dq_store"]),
                                  ("wgmma-fused", ["wgmma_bwd_preprocess", "wgmma_bwd_fused", "wgmma_bwd_dq_store"]),
                                  ("wgmma-ws", ["wgmma_bwd_preprocess", "wgmma_bwd_ws", "wgmma_bwd_dq_store"])):
            if bwd_kernel != "auto" and dtype == "float32":
                continue
            recorded_launches.clear()
            grads = launch_specs.run_backward(q, k, v, o, lse, do, CAUSAL, 0.3, bwd_kernel)
            assert [c[0].name.split("<")[0] for c in recorded_launches] == names
            assert [(g.shape, g.dtype) for g in grads] == [(x.shape, q.dtype) for x in (q, k, v)]
            for c in recorded_launches:
                _check_call(c, dict(q=q, k=k, v=v, o=o, lse=lse, do=do, dq=grads[0], dk=grads[1], dv=grads[2]))


def test_ws_backward_splits_the_query_heads_of_few_kv_heads(recorded_launches):
    """wgmma_bwd_ws gives a (K/V head, tile of keys) several blocks only with grouped-query heads and too few
    blocks, none empty; then wgmma_bwd_kv_sum adds the float32 parts up."""
    P = launch_specs.Problem
    mqa = P(4, 32, 4096, 4096, 128, "float16", 0.1, CAUSAL, 1)  # 32 x 4 = 128 blocks of keys: 4 splits of 8 heads
    assert launch_specs.ws_backward_splits(mqa) == 4 and launch_specs.wgmma_bwd_ws(mqa).grid == (32, 4, 4)
    assert launch_specs.ws_backward_splits(mqa._replace(Hk=8)) == 1  # 1024 blocks
    assert launch_specs.ws_backward_splits(mqa._replace(H=8, Hk=8)) == 1  # no group
    assert launch_specs.ws_backward_splits(P(1, 6, 70, 70, 64, "float16", 0.1, CAUSAL, 2)) == 3  # one head each
    assert launch_specs.ws_backward_splits(P(2, 12, 700, 700, 64, "float16", 0.1, CAUSAL, 1)) == 12
    assert launch_specs.kv_part_shape(mqa) == (2, 4, 4, 4096, 128)
    # long sequences split further, toward 2048 blocks, while a block keeps 32768 query rows: 16 splits of 2 heads
    long_mqa = P(1, 32, 16384, 16384, 128, "float16", 0.1, CAUSAL, 1)
    assert launch_specs.ws_backward_splits(long_mqa) == 16
    assert launch_specs.ws_backward_splits(long_mqa._replace(Hk=8)) == 2  # 1024 blocks of keys: 2 heads a block
    assert launch_specs.ws_backward_splits(long_mqa._replace(Nq=4096, Nk=4096, B=2, Hk=8)) == 1  # 4096 rows: no
    # the order: tile-major where a block loops over several query heads, the mask is bounded on one side and the
    # grid is under 1024 blocks; else grid order
    assert launch_specs.ws_backward_tile_major(mqa)  # 512 blocks of 8 heads each, causal
    assert not launch_specs.ws_backward_tile_major(mqa._replace(window=(-1, -1)))  # not causal
    assert not launch_specs.ws_backward_tile_major(mqa._replace(window=(64, 64)))  # bounded on both sides
    assert launch_specs.ws_backward_tile_major(mqa._replace(window=(64, -1)))  # a left bound alone
    assert not launch_specs.ws_backward_tile_major(long_mqa)  # 2048 blocks
    assert not launch_specs.ws_backward_tile_major(mqa._replace(H=8, Hk=8))  # one query head a block
    assert launch_specs.wgmma_bwd_ws(mqa).scalars[-1] == ("tile_major", 1)
    x = make_inputs(1, 4, 33, 70, 64, dtype="bfloat16", kind="torch")
    q, do = x["q"], x["do"]
    k, v = x["k"][:, :1].contiguous(), x["v"][:, :1].contiguous()  # MQA: one K/V head
    o, lse = launch_specs.run_forward(q, k, v, CAUSAL, 0.3, "wgmma-ws")
    recorded_launches.clear()
    grads = launch_specs.run_backward(q, k, v, o, lse, do, CAUSAL, 0.3, "wgmma-ws")
    assert [c[0].name.split("<")[0] for c in recorded_launches] == [
        "wgmma_bwd_preprocess", "wgmma_bwd_ws", "wgmma_bwd_dq_store", "wgmma_bwd_kv_sum"]
    assert recorded_launches[1][1] == (1, 1, 4)  # the grid: 4 blocks, one query head each
    for c in recorded_launches:
        _check_call(c, dict(q=q, k=k, v=v, o=o, lse=lse, do=do, dq=grads[0], dk=grads[1], dv=grads[2]))


def test_backward_plan_is_built_once_and_packs_the_scratch_buffers(recorded_launches):
    """run_backward works out what to launch once per distinct call (launch_specs.backward_plan): the kernel 'auto'
    resolves to, the head dim it pads to, the specs, and the float32 buffers no caller sees (Delta, dQaccum,
    dKVpart) at 256-byte aligned offsets into one allocation, none overlapping; clear_caches forgets it."""
    plan_of = launch_specs.backward_plan
    args = ("float16", (2, 6, 300, 64), (2, 2, 420, 64), (9, 0), CAUSAL, 0.125, (0.0, None), None)
    plan = plan_of("auto", *args)
    assert plan is plan_of("auto", *args) and plan.kernel == "wgmma-ws" and plan.pad_to is None
    assert [s.name.split("<")[0] for s in plan.specs] == ["wgmma_bwd_preprocess", "wgmma_bwd_ws", "wgmma_bwd_dq_store",
                                                          "wgmma_bwd_kv_sum"]  # 2 x 2 x 4 blocks: the group split
    sizes = {"dQaccum": math.prod(launch_specs.dq_accum_shape(plan.p)), "Delta": 2 * 6 * 300,
             "dKVpart": math.prod(launch_specs.kv_part_shape(plan.p))}
    spans = sorted((offset, offset + sizes[name]) for name, offset in plan.scratch)
    assert {name for name, _ in plan.scratch} == set(sizes) and spans[-1][1] <= plan.scratch_size
    assert all(a % 64 == 0 and b <= c for (a, b), (c, _) in zip(spans, spans[1:] + [(plan.scratch_size, 0)]))
    whole = plan_of("wgmma-ws", "bfloat16", (2, 8, 4096, 128), (2, 8, 4096, 128), (9, 0), CAUSAL, 0.1)
    assert len(whole.specs) == 3 and dict(whole.scratch)["dKVpart"] == dict(whole.scratch)["dQaccum"]  # untouched
    assert plan_of("mma", *args).scratch == (("Delta", 0),)
    assert plan_of("wgmma-ws", "float16", (1, 2, 50, 96), (1, 2, 50, 96), (9, 0), CAUSAL, 0.1).pad_to is None
    assert plan_of("wgmma-ws", "float16", (1, 2, 50, 80), (1, 2, 50, 80), (9, 0), CAUSAL, 0.1).pad_to == 96
    tiled = plan_of("auto", "float32", (1, 2, 50, 64), (1, 2, 50, 64), (9, 0), CAUSAL, 0.1)
    assert (tiled.kernel, tiled.p.dtype, tiled.scratch, tiled.out_dtype) == ("tiled", "float32", (), "float32")
    assert plan_of("auto", "float16", (1, 2, 50, 64), (1, 2, 50, 64), (8, 0), CAUSAL, 0.1).kernel == "mma"
    with pytest.raises(ValueError, match="run_backward: kernel must be .* got 'wgmma-wz'"):
        plan_of("wgmma-wz", *args)
    fused = plan_of("mma-fused", *args)  # Delta and the float32 dQaccum (B Hq, Nq, D), in one allocation
    assert [s.name.split("<")[0] for s in fused.specs] == ["mma_bwd_fused_preprocess", "mma_bwd_fused",
                                                           "mma_bwd_dq_store"]
    assert dict(fused.scratch)["Delta"] >= 2 * 6 * 300 * 64 and fused.scratch_size >= 2 * 6 * 300 * 65
    with pytest.raises(ValueError, match="run_backward: config applies to kernel 'wgmma', 'wgmma-ws', 'mma' or "
                                         "'mma-fused'"):
        plan_of("wgmma-fused", *args[:-1], (64, 2))
    launch_specs.clear_caches()
    assert plan_of("auto", *args) is not plan and plan_of("auto", *args) == plan
    # a call hands each kernel its buffer's address inside the one scratch allocation
    x = make_inputs(2, 6, 300, 420, 64, dtype="float16", kind="torch")
    q, do = x["q"], x["do"]
    k, v = x["k"][:, :2].contiguous(), x["v"][:, :2].contiguous()
    o, lse = launch_specs.run_forward(q, k, v, CAUSAL, 0.125, "wgmma-ws")
    recorded_launches.clear()
    launch_specs.run_backward(q, k, v, o, lse, do, CAUSAL, 0.125, "auto")
    pre, ws = recorded_launches[0][3], recorded_launches[1][3]
    delta, dq_accum = pre[2], pre[3]  # wgmma_bwd_preprocess(O, dO, Delta, dQaccum, ...)
    assert delta - dq_accum == 4 * dict(plan.scratch)["Delta"]
    assert ws[4:9] == (lse.data_ptr(), delta) + ws[6:8] + (dq_accum,)  # after the 4 maps: LSE, Delta, dK, dV, dQaccum


@pytest.mark.parametrize("D,padded", [(16, 32), (32, 32), (40, 64), (64, 64), (80, 96), (96, 96), (111, 128),
                                      (160, 256), (256, 256)])
def test_tensor_core_head_dims_pad_to_the_compiled_ones(D, padded):
    """The forward tensor-core kernels and the two-kernel backwards (mma, wgmma) are compiled for D = 32, 64, 96, 128
    and 256; the one-kernel backwards (whose dK, dV and dQ tiles share a block) for the same up to 128."""
    assert launch_specs.padded_head_dim(D) == padded
    for kernel in ("mma", "wgmma"):
        assert launch_specs.padded_head_dim(D, BACKWARD_HEAD_DIMS[kernel]) == padded
    for kernel in ("mma-fused", "wgmma-fused", "wgmma-ws"):
        if D <= 128:
            assert launch_specs.padded_head_dim(D, BACKWARD_HEAD_DIMS[kernel]) == padded
    with pytest.raises(ValueError, match="padded_head_dim: the kernel takes D <= 256, got 257"):
        launch_specs.padded_head_dim(257)
    with pytest.raises(ValueError, match="padded_head_dim: the kernel takes D <= 128, got 160"):
        launch_specs.padded_head_dim(160, BACKWARD_HEAD_DIMS["wgmma-ws"])


def test_tma_boxes_are_the_kernels_panels():
    """The TMA boxes the host encodes are wgmma_ops.cuh's column panels (Panels<D>::COLS, read from the source): 64
    columns in the 128-byte swizzle where D is a multiple of 64, 32 in the 64-byte swizzle at D = 32 and 96
    (cuda.h: CU_TENSOR_MAP_SWIZZLE_64B = 2, _128B = 3); a head's rows are the box's second dimension."""
    src = open(os.path.join(runtime.KERNEL_DIR, "wgmma_ops.cuh")).read()
    rule = re.search(r"static constexpr int COLS = D % 64 == 0 \? (\d+) : (\d+);", src)
    for D in TENSOR_CORE_HEAD_DIMS:
        cols = int(rule.group(1)) if D % 64 == 0 else int(rule.group(2))
        dims, strides, box = runtime.tensor_map_layout((2, 3, 100, D), 128)
        assert runtime.tma_box_columns(D) == cols and box == (cols, 128, 1), D
        assert dims == (D, 100, 6) and strides == (2 * D, 2 * D * 100)
        assert runtime._TMA_SWIZZLE[cols] == {64: 3, 32: 2}[cols] and D % cols == 0


@pytest.mark.parametrize("make", ["wgmma_ws_fwd", "wgmma_bwd_ws", "mma_bwd_dkdv"])
def test_driver_launch_packs_each_plan_once(make, monkeypatch):
    """runtime.Packed, cuLaunchKernel's parameter array of a launch plan: one slot per kernel parameter in the
    kernel's order (tensor maps, buffers, scalars). The scalars hold C values of the kernel's types, written once;
    a call writes its buffers' addresses and points the map slots at its encoded maps."""
    import ctypes

    p = launch_specs.Problem(B=2, H=4, Nq=100, Nk=70, D=64, dtype="bfloat16", scale=-0.3, window=(5, 0), Hk=2,
                             dropout_p=0.17, dropout_seed=2**40 + 3)
    spec = getattr(launch_specs, make)(p)
    maps = {}
    monkeypatch.setattr(runtime, "_map_entry",
                        lambda x, rows: maps.setdefault((id(x), rows), (object(), 0x1000 + 128 * len(maps))))

    class Tensor:
        def __init__(self, address):
            self.address = address

        def data_ptr(self):
            return self.address

    names = list(spec.buffers) + [name for _, name, _ in spec.maps]
    arrays = {name: Tensor(0x7F0000000000 + 4096 * i) for i, name in enumerate(dict.fromkeys(names))}
    packed = runtime.Packed(spec)
    packed.fill(spec, arrays)
    n_maps, n_bufs = len(spec.maps), len(spec.buffers)
    assert len(packed.params) == n_maps + n_bufs + len(spec.scalars)
    for i, (_, name, rows) in enumerate(spec.maps):
        assert packed.params[i] == maps[(id(arrays[name]), rows)][1]
    for i, name in enumerate(spec.buffers):
        assert ctypes.c_uint64.from_address(packed.params[n_maps + i]).value == arrays[name].address
    for j, value in enumerate(spec.scalar_values):
        ctype = getattr(ctypes, runtime._CTYPE_OF[np.asarray(value).dtype.name])
        assert ctype.from_address(packed.params[n_maps + n_bufs + j]).value == value.item()
    grid, block = tuple(spec.grid) + (1,) * (3 - len(spec.grid)), tuple(spec.block) + (1,) * (3 - len(spec.block))
    assert packed.dims == grid + block


@gpu
def test_torch_tensors_launch_through_the_driver(monkeypatch):
    """Every launch of a forward and backward on torch tensors goes through cuLaunchKernel (runtime.Packed), not
    CuPy's kernel call; with runtime.DRIVER_LAUNCH off, the same calls go through CuPy and give the same bits."""
    q, k, v, do = _inputs(2, 4, 100, 130, 64, "float16")
    kernels = ["mma", "wgmma", "wgmma-ws"] if HOPPER_REASON is None else ["mma"]
    direct = {}
    real_run = runtime.Stream.run

    def no_cupy(self, *a, **kw):
        raise AssertionError("a launch went through CuPy")

    monkeypatch.setattr(runtime.Stream, "run", no_cupy)
    for kernel in kernels:
        o, lse = flash_attn_cuda(q, k, v, causal=True, kernel=kernel, return_lse=True)
        direct[kernel] = (o, lse) + flash_attn_cuda_backward(q, k, v, o, lse, do, causal=True,
                                                             kernel="wgmma-ws" if kernel != "mma" else "mma")
    monkeypatch.setattr(runtime.Stream, "run", real_run)
    monkeypatch.setattr(runtime, "DRIVER_LAUNCH", False)
    for kernel in kernels:  # the forwards are deterministic: the same bits both ways
        o, lse = flash_attn_cuda(q, k, v, causal=True, kernel=kernel, return_lse=True)
        assert torch.equal(o, direct[kernel][0]) and torch.equal(lse, direct[kernel][1]), kernel
    o, lse = direct["mma"][:2]  # and so is the mma backward (two kernels, no atomics)
    grads = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=True, kernel="mma")
    assert all(torch.equal(a, b) for a, b in zip(grads, direct["mma"][2:]))


def test_auto_backward_above_128_runs_a_two_kernel_backward():
    """The one-kernel wgmma backwards stop at D = 128 (dK and dV of a 64-key tile would need 256 registers a
    thread); above it kernel='auto' runs the two-kernel wgmma backward on a Hopper, the mma one elsewhere, whose
    dK/dV kernels split the columns over two blocks."""
    from flash_attention_cuda.capabilities import auto_backward
    assert auto_backward("float16", 128, (9, 0)) == "wgmma-ws" and auto_backward("bfloat16", 129, (9, 0)) == "wgmma"
    assert auto_backward("float16", 256, (8, 0)) == "mma" and auto_backward("float32", 256, (9, 0)) == "tiled"
    p = launch_specs.Problem(B=1, H=2, Nq=100, Nk=70, D=256, dtype="float16", scale=0.1, window=(-1, -1))
    kv, dq = launch_specs.wgmma_bwd_dkdv(p), launch_specs.wgmma_bwd_dq(p)
    assert kv.name == "wgmma_bwd_dkdv<256, 2, 32, false>" and kv.grid == (1 * 2, 2) and kv.block == (256,)
    assert dq.name == "wgmma_bwd_dq<256, 2, 32, false>" and dq.grid == (1, 2)
    assert kv.smem == (2 * 128 + 4 * 32) * 256 * 2 + 4 * 32 * 4 + 1024 <= 227 * 1024
    p = launch_specs.Problem(B=1, H=2, Nq=100, Nk=70, D=256, dtype="float16", scale=0.1, window=(-1, -1))
    kv, dq = launch_specs.mma_bwd_dkdv(p), launch_specs.mma_bwd_dq(p)
    assert kv.name == "mma_bwd_dkdv<256, 4, 32, false>" and kv.grid == (2 * 2, 2)  # 2 key tiles x 2 column halves
    assert dq.name == "mma_bwd_dq<256, 4, 32, false>" and dq.grid == (2, 2)
    assert kv.smem == (2 * 64 + 4 * 32) * 256 * 2 + 4 * 32 * 4 and dq.smem == (2 * 64 + 4 * 32) * 256 * 2


def test_the_mma_rung_runs_the_one_kernel_backward_where_it_was_faster():
    """The mma rung's autograd ('mma-auto', capabilities.mma_auto_backward) runs the one-kernel mma backward
    (FlashAttention-2's warp layout) at D = 64, 96 and 128 on compute capability 8.0 and 9.0, whose blocks hold its
    shared memory, and the two kernels at D = 32 (where they were faster), D = 256 and on other GPUs; the launch
    plan resolves the name, and the one kernel's shared memory fits a block of both."""
    from flash_attention_cuda.capabilities import BACKWARD_OF, mma_auto_backward
    assert BACKWARD_OF["mma"] == "mma-auto"
    for cc in ((8, 0), (9, 0)):
        assert [mma_auto_backward(D, cc) for D in (32, 40, 64, 96, 128, 256)] == [
            "mma", "mma", "mma-fused", "mma-fused", "mma-fused", "mma"]
    assert mma_auto_backward(128, (8, 6)) == mma_auto_backward(64, (8, 9)) == "mma"
    for D, tile in ((32, 128), (64, 128), (96, 64), (128, 64)):
        p = launch_specs.Problem(B=2, H=6, Nq=300, Nk=420, D=D, dtype="float16", scale=0.1, window=(-1, -1), Hk=2)
        spec = launch_specs.mma_bwd_fused(p)
        assert spec.name == f"mma_bwd_fused<{D}, 8, {tile}, false, false, true>" and spec.block == (256,)
        assert spec.grid == (4, 2 * 2) and spec.smem <= 163 * 1024  # 128 keys a block, one block row per K/V head
    plan = launch_specs.backward_plan("mma-auto", "float16", (2, 6, 300, 64), (2, 6, 420, 64), (9, 0), (-1, 0), 0.1)
    assert [s.name.split("<")[0] for s in plan.specs] == ["mma_bwd_fused_preprocess", "mma_bwd_fused",
                                                          "mma_bwd_dq_store"]
    with pytest.raises(ValueError, match=r"mma_bwd_fused: config must be \(8, 64\) or \(8, 128\)"):
        launch_specs.mma_bwd_fused(p, (4, 64))


@pytest.mark.parametrize("kernel", ["mma", "wgmma", "wgmma-ws"])
def test_padded_head_dim_plumbing(kernel, recorded_launches, monkeypatch):
    """D = 40 and 80 run the D = 64 and 96 kernels on zero-padded copies, and hand back D columns: a stand-in
    kernel (float64 attention of the arrays it is given, written into O/LSE and dQ/dK/dV) shows that the
    padding and the cutting back give the answer of the unpadded problem, forward and backward."""
    seen = []

    def fake_launch(stream, spec, arrays, as_arg=None):
        seen.append((spec.name, arrays["Q"].shape[-1]))
        Q, K, V = arrays["Q"], arrays["K"], arrays["V"]
        if "O" in arrays and "dO" not in arrays:  # a forward
            o, lse = attention_reference(Q, K, V, causal=True, softmax_scale=0.3, return_lse=True)
            arrays["O"].copy_(o.to(arrays["O"].dtype))
            arrays["LSE"].copy_(lse.float())
        elif "preprocess" in spec.name:  # the backward's first launch: all three gradients at once
            for name, g in zip(("dQ", "dK", "dV"),
                               attention_reference_grads(Q, K, V, arrays["dO"], causal=True, softmax_scale=0.3)):
                arrays[name].copy_(g.to(arrays[name].dtype))

    monkeypatch.setattr(runtime, "launch", fake_launch)
    for D in (40, 80):
        x = make_inputs(1, 2, 33, 70, D, dtype="float32", kind="torch")
        q, k, v, do = (t.half() for t in (x["q"], x["k"], x["v"], x["do"]))
        o, lse = launch_specs.run_forward(q, k, v, CAUSAL, 0.3, kernel)
        assert o.shape == q.shape and o.is_contiguous() and o.dtype == q.dtype
        assert seen[-1][1] == launch_specs.padded_head_dim(D)  # the kernel saw the padded head dim
        ref_o, ref_lse = attention_reference(q, k, v, causal=True, softmax_scale=0.3, return_lse=True)
        assert (o.double() - ref_o).abs().max() < 2e-3 and (lse.double() - ref_lse).abs().max() < 1e-5
        bwd = "wgmma" if kernel == "wgmma-ws" else kernel  # the forward rungs' own backward kernels
        grads = launch_specs.run_backward(q, k, v, o, lse, do, CAUSAL, 0.3, bwd)  # mma / wgmma backward
        assert seen[-1][1] == launch_specs.padded_head_dim(D, BACKWARD_HEAD_DIMS[bwd])
        assert seen[-1][0].startswith(f"{bwd}_bwd_dq")
        for g, r, t in zip(grads, attention_reference_grads(q, k, v, do, causal=True, softmax_scale=0.3), (q, k, v)):
            assert g.shape == t.shape and g.is_contiguous()
            assert (g.double() - r).abs().max() < 2e-2 * max(1.0, r.abs().max().item())


# ------------------------------------------------------------------ GPU
@gpu
def test_seed_kernel_overflows_and_ours_does_not():
    """Scores of ~200: exp(200) = inf in float32, so the seed's no-max sum gives inf/inf = NaN."""
    B, H, N, D = 1, 2, 100, 64
    q, k, v, _ = _inputs(B, H, N, N, D)
    q = q * 4.0  # |s| up to ~ (4 * 8)^2 / 8 = 128 > 88.7 ...
    k = k * 4.0
    scale = 1.0  # ... and no 1/sqrt(D): scores in the hundreds
    seed_o = fac.seed_nomax_forward(q, k, v, softmax_scale=scale)
    assert not torch.isfinite(seed_o).all(), "expected the seed kernel (no running max) to overflow"
    ref = attention_reference(q, k, v, softmax_scale=scale)
    for kernel in ("naive", "tiled"):
        o, lse = flash_attn_cuda(q, k, v, softmax_scale=scale, kernel=kernel, return_lse=True)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all(), kernel
        assert _err(o, ref) < 1e-3, kernel
    oh = flash_attn_cuda(q.half(), k.half(), v.half(), softmax_scale=scale, kernel="mma")
    assert torch.isfinite(oh).all()
    # at ordinary scales the seed arithmetic is right: it is the missing max, not the loop, that fails
    q2, k2, v2, _ = _inputs(B, H, N, N, D)
    assert _err(fac.seed_nomax_forward(q2, k2, v2), attention_reference(q2, k2, v2)) < 1e-4


@gpu
@pytest.mark.parametrize("kernel", ["naive", "tiled"])
@pytest.mark.parametrize("D", [1, 3, 33, 127])
def test_odd_head_dims_fp32(kernel, D):
    q, k, v, _ = _inputs(1, 3, 45, 70, D)
    for causal in (False, True):
        o = flash_attn_cuda(q, k, v, causal=causal, kernel=kernel)
        assert _err(o, attention_reference(q, k, v, causal=causal)) < 1e-4


@gpu
def test_tiled_unaligned_rows_use_scalar_loads():
    """A contiguous view that starts 4 bytes into its buffer: float4 loads would be misaligned."""
    buf = torch.randn(1 + 3 * 2 * 50 * 64, device="cuda")
    q, k, v = buf[1:].view(3, 1, 2, 50, 64).unbind(0)
    o = flash_attn_cuda(q, k, v, kernel="tiled")
    assert _err(o, attention_reference(q, k, v)) < 1e-4


@gpu
def test_cupy_arrays_in_and_out():
    import cupy

    q, k, v, _ = _inputs(2, 2, 50, 61, 64, "float16")
    cq, ck, cv = (cupy.from_dlpack(x) for x in (q, k, v))
    o, lse = flash_attn_cuda(cq, ck, cv, causal=True, return_lse=True)
    assert isinstance(o, cupy.ndarray) and o.dtype == cupy.float16 and lse.dtype == cupy.float32
    o_ref = attention_reference(q, k, v, causal=True)
    assert _err(torch.from_dlpack(o), o_ref) < 2e-2
    o32 = flash_attn_cuda(*(x.astype(cupy.float32) for x in (cq, ck, cv)), kernel="naive")
    assert _err(torch.from_dlpack(o32), attention_reference(q, k, v)) < 5e-3


@gpu
def test_dlpack_views_are_zero_copy():
    import cupy

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.randn(2, 3, 4, 8, device="cuda").to(dtype)
        assert runtime.as_cupy(t).data.ptr == t.data_ptr()
    assert isinstance(runtime.as_cupy(t), cupy.ndarray)


@gpu
def test_runs_on_torch_current_stream():
    q, k, v, _ = _inputs(2, 4, 300, 300, 64, "float16")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # keep the stream busy: a kernel on another stream would run first
        o = flash_attn_cuda(q, k, v)
        o2 = o * 1.0
    s.synchronize()
    assert _err(o2, attention_reference(q, k, v)) < 2e-2


@gpu
@pytest.mark.parametrize("kernel,dtype,D", [("naive", "float32", 40), ("tiled", "float32", 128),
                                            ("mma", "float16", 64), ("mma", "bfloat16", 128),
                                            pytest.param("wgmma", "float16", 128, marks=hopper)])
def test_autograd_backward(kernel, dtype, D):
    q, k, v, do = _inputs(2, 2, 97, 131, D, dtype)
    for causal in (False, True):
        qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
        o = flash_attn_cuda(qq, kk, vv, causal=causal, kernel=kernel)
        o.backward(do)
        ref = attention_reference_grads(q, k, v, do, causal=causal)
        tol = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 2e-1}[dtype]
        for g, r in zip((qq.grad, kk.grad, vv.grad), ref):
            assert g.dtype == q.dtype and torch.isfinite(g).all()
            assert _err(g, r) < tol


@gpu
def test_rows_that_see_no_key():
    q, k, v, _ = _inputs(1, 2, 40, 9, 64, "float16")
    kernels = [("naive", torch.float32), ("tiled", torch.float32), ("mma", torch.float16)]
    kernels += [("wgmma", torch.float16), ("wgmma-ws", torch.bfloat16)] if HOPPER_REASON is None else []
    for kernel, dt in kernels:
        o, lse = flash_attn_cuda(q.to(dt), k.to(dt), v.to(dt), causal=True, kernel=kernel, return_lse=True)
        assert torch.isneginf(lse[:, :, :31]).all() and (o[:, :, :31] == 0).all(), kernel
        assert torch.isfinite(lse[:, :, 31:]).all(), kernel


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA, WGMMA_WS])
def test_long_sequence_matches_reference(kernel):
    q, k, v, _ = _inputs(1, 2, 1500, 2100, 128, "float16")
    for causal in (False, True):
        o = flash_attn_cuda(q, k, v, causal=causal, kernel=kernel)
        assert _err(o, attention_reference(q, k, v, causal=causal)) < 5e-3


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA, WGMMA_WS])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128])
def test_lazy_rescale_with_growing_scores(kernel, dtype, D):
    """The warp-specialised forward at D = 128 keeps a row's old max as the softmax's reference while the warp's rows
    grow theirs by at most 2^8 (frag::online_softmax's lazy rescale; the other forwards rescale every tile, and take
    the same check). Here each row's scores climb along the keys at a slope of its own,
    from -1 to 3 over the rows: the warps of the steepest rows outgrow their reference by up to 2^17 a tile of
    128 keys (a rescale every tile), the gentlest by less than 2^8 (no rescale after the first tile), falling
    rows keep their first tile's max, and one warp straddles the two. O and lse are within the harness's
    tolerance: twice naive attention's error in the same dtype, plus its floor."""
    B, H, Nq, Nk = 1, 2, 200, 1100
    q, k, v, _ = _inputs(B, H, Nq, Nk, D, "float32", seed=3)
    slope = torch.linspace(-1.0, 3.0, Nq, device="cuda")
    q[..., 0] = 4.0 * slope                                  # score_ij = q_i0 k_j0 / sqrt(D) + noise climbs by
    k[..., 0] = torch.linspace(0.0, 25.0 * math.sqrt(D) / 3.0, Nk, device="cuda")  # 100 slope / 3 over the keys
    q, k, v = (x.to(getattr(torch, dtype)).contiguous() for x in (q, k, v))
    for causal in (False, True):
        o, lse = flash_attn_cuda(q, k, v, causal=causal, kernel=kernel, return_lse=True)
        o_ref, lse_ref = attention_reference(q, k, v, causal=causal, return_lse=True)
        o_naive, lse_naive = attention_naive(q, k, v, causal=causal, return_lse=True)
        for name, out, ref, naive, floor in (("o", o, o_ref, o_naive, FLOOR[dtype]),
                                             ("lse", lse, lse_ref, lse_naive, LSE_FLOOR[dtype])):
            err, bound = _err(out, ref), 2.0 * _err(naive, ref) + floor
            assert err <= bound, (name, causal, err, bound)


# every config the benchmark's tile-config sweep tries (benchmarks/presets.py)
MMA_SWEEP = [(D, c) for D, cands in CONFIG_CANDIDATES["mma"].items() for c in cands]
WGMMA_SWEEP = [(D, c) for D, cands in CONFIG_CANDIDATES["wgmma"].items() for c in cands]
WS_SWEEP = [(D, c) for D, cands in CONFIG_CANDIDATES["wgmma-ws"].items() for c in cands]


@gpu
@pytest.mark.parametrize("kernel,D,config", [("mma", D, c) for D, c in MMA_SWEEP]
                         + [pytest.param("wgmma", D, c, marks=hopper) for D, c in WGMMA_SWEEP]
                         + [pytest.param("wgmma-ws", D, c, marks=hopper) for D, c in WS_SWEEP])
def test_every_benchmarked_config(kernel, D, config):
    """Every config the benchmark sweep or tools/cuda_forward_kernels.py tries (mma: Bc, warps, m16 tiles per
    warp; wgmma: Bc, warpgroups; wgmma-ws: Bc, consumer warpgroups, stages) is right at odd shapes too, with one
    and several K/V tiles; the default tables stay as they were."""
    defaults = (dict(fac.MMA_CONFIGS), dict(fac.WGMMA_CONFIGS), dict(launch_specs.WGMMA_WS_CONFIGS))
    for Nq, Nk in ((100, 100), (37, 300), (300, 37), (1, 517), (450, 450)):
        q, k, v, _ = _inputs(2, 2, Nq, Nk, D, "float16")
        for causal in (False, True):
            o, lse = fac.forward_with_config(q, k, v, kernel=kernel, config=config, causal=causal, return_lse=True)
            o_ref, lse_ref = attention_reference(q, k, v, causal=causal, return_lse=True)
            assert _err(o, o_ref) < 5e-3, (Nq, Nk, causal)
            fin = torch.isfinite(lse_ref)
            assert torch.equal(torch.isfinite(lse).cpu(), fin.cpu())
            assert (lse[fin].double() - lse_ref[fin]).abs().max().item() < 1e-3
    assert (fac.MMA_CONFIGS, fac.WGMMA_CONFIGS, launch_specs.WGMMA_WS_CONFIGS) == defaults


@hopper
def test_auto_picks_wgmma_ws_on_hopper(monkeypatch):
    """kernel='auto' on a Hopper runs the warp-specialised forward (capabilities.HOPPER_FORWARD)."""
    calls = []
    real = launch_specs.run_forward
    monkeypatch.setattr(launch_specs, "run_forward", lambda *a, **kw: calls.append(a[5]) or real(*a, **kw))
    q, k, v, _ = _inputs(1, 2, 64, 64, 64, "float16")
    flash_attn_cuda(q, k, v)
    assert calls == ["wgmma-ws"]


@gpu
def test_wgmma_refused_off_hopper(monkeypatch):
    """On any GPU but compute capability 9.0 the sm_90a kernel cannot load: a clear error, not a crash."""
    monkeypatch.setattr(runtime, "device_cc", lambda x: (8, 0))
    q, k, v, _ = _inputs(1, 2, 16, 16, 64, "float16")
    with pytest.raises(ValueError, match=r"kernel 'wgmma' runs only on compute capability 9\.0.*has 8\.0"):
        flash_attn_cuda(q, k, v, kernel="wgmma")
    calls = []
    real = launch_specs.run_forward
    monkeypatch.setattr(launch_specs, "run_forward", lambda *a, **kw: calls.append(a[5]) or real(*a, **kw))
    flash_attn_cuda(q, k, v)  # auto falls back to mma
    assert calls == ["mma"]


# ------------------------------------------------------------------ the tensor-core backwards (mma_backward.cu,
# wgmma_backward.cu)
@gpu
@pytest.mark.parametrize("kernel", ["mma", "mma-fused", pytest.param("wgmma", marks=hopper),
                                    pytest.param("wgmma-fused", marks=hopper), pytest.param("wgmma-ws", marks=hopper)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 128, 40, 32, 96])
def test_tensor_core_backward_matches_reference(kernel, dtype, D):
    """kernel='mma', 'mma-fused', 'wgmma', 'wgmma-fused' and 'wgmma-ws' against the float64 gradients and against the fp32 tiled kernels, odd sizes,
    Nq != Nk both ways (Nq > Nk causal: rows that see no key get dQ = 0), several tiles, negative scale; D = 40
    runs the D = 64 kernels on zero-padded copies, D = 32 and 96 their own."""
    tol = {"float16": 4e-3, "bfloat16": 3e-2}[dtype]
    for (Nq, Nk), scale in (((100, 100), None), ((37, 300), None), ((300, 37), -0.2), ((1, 517), None),
                            ((450, 450), 0.5)):
        q, k, v, do = _inputs(2, 2, Nq, Nk, D, dtype)
        for causal in (False, True):
            o, lse = flash_attn_cuda(q, k, v, causal=causal, softmax_scale=scale, kernel="mma", return_lse=True)
            grads = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=causal, softmax_scale=scale, kernel=kernel)
            ref = attention_reference_grads(q, k, v, do, causal=causal, softmax_scale=scale)
            tiled = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=causal, softmax_scale=scale, kernel="tiled")
            for name, g, r, t in zip(("dq", "dk", "dv"), grads, ref, tiled):
                assert g.dtype == q.dtype and g.shape == r.shape and torch.isfinite(g).all(), name
                assert _err(g, r) < tol * max(1.0, r.abs().max().item()), (name, Nq, Nk, causal, _err(g, r))
                assert _err(g, t) < 2 * tol * max(1.0, r.abs().max().item()), (name, Nq, Nk, causal)


@gpu
@pytest.mark.parametrize("kernel", ["mma", "mma-fused", pytest.param("wgmma", marks=hopper),
                                    pytest.param("wgmma-fused", marks=hopper), pytest.param("wgmma-ws", marks=hopper)])
@pytest.mark.parametrize("causal", [False, True])
def test_tensor_core_backward_infinite_key_past_nq(kernel, causal):
    """A key with an infinite entry that every real query scores -inf: P = 0 on its column, so its dK and dV are
    those of the finite rest (dK_0 = 0), dQ is NaN (0 * inf, as in the reference). The rows of the last Q tile past
    Nq are zero rows: unmasked, their score with that key is 0 * inf = NaN, which put NaN into dK_0 and dV_0 (a
    tile past Nq now takes the elementwise mask: masks.cuh, needs_mask). Nq = 2 and 37, D = 1 and 64."""
    for Nq, Nk, D in ((2, 17, 1), (37, 100, 64)):
        q, k, v, do = _inputs(1, 2, Nq, Nk, D, "float16", seed=31)
        q[..., 0] = -q[..., 0].abs() - 0.25  # every query's first column negative: q . k_0 = -inf
        k[0, 0, 0, 0] = float("inf")
        o, lse = flash_attn_cuda(q, k, v, causal=causal, kernel="mma", return_lse=True)
        grads = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=causal, kernel=kernel)
        ref = attention_reference_grads(q, k, v, do, causal=causal)
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
            g, r = g.double().cpu(), r.double().cpu()
            assert torch.equal(torch.isnan(g), torch.isnan(r)), (name, Nq, int(torch.isnan(g).sum()),
                                                                  int(torch.isnan(r).sum()))
            fin = torch.isfinite(r)
            assert torch.isfinite(g[fin]).all(), name
            assert (g[fin] - r[fin]).abs().max().item() < 4e-3 * max(1.0, r[fin].abs().max().item()), (name, Nq)
        assert ref[1][0, 0, 0].abs().max().item() == 0.0  # the infinite key's dK: 0 in the reference


@gpu
@hopper
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [32, 64])
def test_ws_backward_tiles_of_64_and_128_queries(dtype, D):
    """wgmma_bwd_ws at D = 32 and 64 streams tiles of 128 queries (dQ split by rows between the warpgroups); tiles of
    64 (its config at D = 96 and 128, dQ split by columns) stay selectable. Both against the float64 gradients, with Nq
    ending inside the first or the second half of its last 128-query tile (130, 200), one query, Nq < Nk and a
    window, and against each other (dK, dV: the same sums in another order of tiles; dQ: summed by the copy
    engine)."""
    assert launch_specs.WGMMA_WS_BACKWARD_CONFIGS[D][0] == 128
    tol = {"float16": 4e-3, "bfloat16": 3e-2}[dtype]
    for (Nq, Nk), window in (((130, 130), FULL), ((200, 333), CAUSAL), ((1, 257), FULL), ((450, 450), (37, 5))):
        q, k, v, do = _inputs(2, 3, Nq, Nk, D, dtype)
        o, lse = launch_specs.run_forward(q, k, v, window, 0.125, "mma")
        ref = attention_reference_grads(q, k, v, do, softmax_scale=0.125, window_size=window)
        by_tile = {br: launch_specs.run_backward(q, k, v, o, lse, do, window, 0.125, "wgmma-ws", (br, 2))
                   for br in (64, 128)}
        for name, g64, g128, r in zip(("dq", "dk", "dv"), by_tile[64], by_tile[128], ref):
            scale = max(1.0, r.abs().max().item())
            assert _err(g128, r) < tol * scale and _err(g64, r) < tol * scale, (name, Nq, Nk, window)
            assert _err(g128, g64) < tol * scale, (name, Nq, Nk, window)


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [32, 64, 96, 128, 256])
def test_backward_preprocess_delta_and_zeroed_dq_buffer(D, dtype):
    """The backwards' first step, Delta_i = rowsum(dO_i o O_i): one wide load per lane where O and dO are aligned,
    element by element where they start 2 bytes into their buffer (and at D = 32, 96, whose lanes read 1 or 3
    elements). wgmma_bwd_preprocess (the one-kernel
    backwards, D <= 128) also zeroes every float of the dQ buffer, filled with NaN first, the rows past Nq of its
    last block of 64 included."""
    B, H, Nq = 2, 3, 77
    p = launch_specs.Problem(B, H, Nq, Nq, D, dtype, 0.125, FULL)
    specs = [launch_specs.mma_bwd_preprocess(p)] + \
        ([launch_specs.wgmma_bwd_preprocess(p)] if D in BACKWARD_HEAD_DIMS["wgmma-ws"] else [])
    for offset in (0, 1):
        buf = torch.randn(2 * B * H * Nq * D + offset, device="cuda").to(getattr(torch, dtype))
        o, do = buf[offset:].view(2, B, H, Nq, D).unbind(0)
        assert (o.data_ptr() % 16 == 0) == (offset == 0)
        want = (o.double() * do.double()).sum(-1)
        for spec in specs:
            delta = torch.full((B, H, Nq), math.nan, device="cuda")
            acc = torch.full(launch_specs.dq_accum_shape(p), math.nan, device="cuda")
            runtime.launch(runtime.Stream(o), spec, dict(O=o, dO=do, Delta=delta, dQaccum=acc))
            torch.cuda.synchronize()
            assert _err(delta, want) < 1e-5 * (1 + want.abs().max().item()), (spec.name, offset)
            if "dQaccum" in spec.buffers:
                assert torch.count_nonzero(acc.nan_to_num(1.0)).item() == 0, (spec.name, offset)


@gpu
def test_backward_bad_input():
    q, k, v, do = _inputs(1, 2, 16, 16, 64, "float16")
    o, lse = flash_attn_cuda(q, k, v, return_lse=True, kernel="mma")
    with pytest.raises(ValueError, match=r"kernel 'mma' takes float16/bfloat16 with D <= 256"):
        flash_attn_cuda_backward(q.float(), k.float(), v.float(), o.float(), lse, do.float(), kernel="mma")
    with pytest.raises(ValueError, match="kernel must be one of auto, wgmma, wgmma-fused, wgmma-ws, mma, mma-fused, tiled"):
        flash_attn_cuda_backward(q, k, v, o, lse, do, kernel="fast")
    wide = [torch.nn.functional.pad(x, (0, 96)) for x in (q, k, v, o, do)]  # D = 160: the wgmma backwards stop at 128
    with pytest.raises(ValueError, match=r"kernel 'wgmma-ws' takes float16/bfloat16 with D <= 128 .* got float16, D = 160"):
        flash_attn_cuda_backward(*wide[:4], lse, wide[4], kernel="wgmma-ws")
    with pytest.raises(ValueError, match=r"kernel 'wgmma' takes float16/bfloat16 with D <= 256 on compute "
                                         r"capability 9\.0"):
        flash_attn_cuda_backward(q.float(), k.float(), v.float(), o.float(), lse, do.float(), kernel="wgmma")
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 16\)"):
        flash_attn_cuda_backward(q, k, v, o, lse[:, :, :8], do)
    with pytest.raises(TypeError, match="do must have dtype float16"):
        flash_attn_cuda_backward(q, k, v, o, lse, do.float())


@gpu
def test_wgmma_backward_refused_off_hopper(monkeypatch):
    """Off a Hopper kernel='wgmma' is a clear error, and 'auto' falls back to the mma.sync backward."""
    monkeypatch.setattr(runtime, "device_cc", lambda x: (8, 0))
    q, k, v, do = _inputs(1, 2, 16, 16, 64, "float16")
    o, lse = flash_attn_cuda(q, k, v, return_lse=True, kernel="mma")
    with pytest.raises(ValueError, match=r"kernel 'wgmma' takes .* compute capability 9\.0 .*got float16, D = 64, "
                                         r"compute capability 8\.0"):
        flash_attn_cuda_backward(q, k, v, o, lse, do, kernel="wgmma")
    calls = []
    real = launch_specs.run_backward
    monkeypatch.setattr(launch_specs, "run_backward", lambda *a, **kw: calls.append(a[8]) or real(*a, **kw))
    flash_attn_cuda_backward(q, k, v, o, lse, do)
    assert calls == ["mma"]


@gpu
@pytest.mark.parametrize("config", CONFIG_CANDIDATES["mma-backward"][None])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_backward_every_benchmarked_config(config, D, dtype):
    """Every (warps, looped tile rows) the benchmark's backward sweep tries is right too (passed in as config), with
    a full, a causal and a two-sided window mask."""
    tol = {"float16": 4e-3, "bfloat16": 3e-2}[dtype]
    for Nq, Nk in ((300, 37), (37, 300), (257, 513)):
        q, k, v, do = _inputs(1, 2, Nq, Nk, D, dtype)
        for window in (FULL, CAUSAL, (40, 9)):
            o, lse = flash_attn_cuda(q, k, v, window_size=window, kernel="mma", return_lse=True)
            grads = launch_specs.run_backward(q, k, v, o, lse, do, window, D ** -0.5, "mma", config)
            ref = attention_reference_grads(q, k, v, do, window_size=window)
            for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
                assert _err(g, r) < tol * max(1.0, r.abs().max().item()), (name, config, Nq, Nk, window)


# ------------------------------------------------------------------ reliability (adversarial inputs), on a GPU
def _same_pattern(out, ref, tol, what):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), f"{what}: NaN pattern differs from the reference"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf) and torch.equal(out[inf], ref[inf]), f"{what}: inf pattern differs"
    fin = torch.isfinite(ref)
    err = (out[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= tol, f"{what}: max-abs error {err:.3e} > {tol:.1e}"


NONFINITE_KERNELS = [("naive", "float32", 40), ("tiled", "float32", 64), ("mma", "float16", 64),
                     ("mma", "bfloat16", 128), pytest.param("wgmma", "float16", 64, marks=hopper),
                     pytest.param("wgmma-ws", "bfloat16", 128, marks=hopper)]


@gpu
@pytest.mark.parametrize("kernel,dtype,D", NONFINITE_KERNELS)
@pytest.mark.parametrize("where,value", [("q", math.nan), ("k", math.nan), ("k", math.inf), ("q", -math.inf),
                                         ("v", math.inf)])
def test_nonfinite_inputs_match_the_reference(kernel, dtype, D, where, value):
    """NaN in, NaN out (o, lse and the gradients), +inf scores give lse = +inf, -inf scores give 0: as the reference.

    The epilogues used ``l > 0``, False for NaN, which turned a NaN row into O = 0, lse = -inf.
    """
    q, k, v, do = _inputs(1, 2, 70, 90, D, dtype)
    x = {"q": q, "k": k, "v": v}[where]
    x[0, 1, 69 if where == "q" else 0, 5] = value  # the last query sees every key; every query sees key 0
    tol = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 2e-1}[dtype]
    for causal in (False, True):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o, lse = flash_attn_cuda(qq, kk, vv, causal=causal, kernel=kernel, return_lse=True)
        o.backward(do)
        o_ref, lse_ref = attention_reference(q, k, v, causal=causal, return_lse=True)
        _same_pattern(o, o_ref, tol, f"{kernel} o")
        _same_pattern(lse, lse_ref, tol, f"{kernel} lse")
        for name, g, r in zip(("dq", "dk", "dv"), (qq.grad, kk.grad, vv.grad),
                              attention_reference_grads(q, k, v, do, causal=causal)):
            _same_pattern(g, r, 4 * tol, f"{kernel} {name}")


@gpu
@pytest.mark.parametrize("kernel", ["naive", "tiled"])
def test_neg_views_are_resolved(kernel):
    """torch.complex(a, b).conj().imag reads as -b: the launcher must not hand its raw memory (b) to a kernel."""
    q, k, v, _ = _inputs(1, 1, 64, 64, 64, "float32")

    def neg_view(x):  # values x, memory -x, is_neg() True
        return torch.complex(torch.zeros_like(x), -x).conj().imag

    assert neg_view(q).is_neg() and torch.equal(neg_view(q), q)
    o = flash_attn_cuda(neg_view(q), k, neg_view(v), kernel=kernel)
    assert _err(o, attention_reference(q, k, v)) < 1e-4


@gpu
def test_double_backward_is_a_clear_error_or_correct():
    q, k, v, _ = _inputs(1, 1, 32, 32, 64, "float32")
    q.requires_grad_(True)
    o = flash_attn_cuda(q, k, v, kernel="tiled")
    (gq,) = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="(?i)double backward|differentiate twice|not differentiable"):
        gq.pow(2).sum().backward()


@gpu
def test_scale_that_overflows_float32_is_refused():
    q, k, v, _ = _inputs(1, 1, 32, 32, 64, "float16")
    with pytest.raises(ValueError, match="flash_attn_cuda: softmax_scale .*overflow float32"):
        flash_attn_cuda(q, k, v, softmax_scale=1e38, kernel="mma")


@gpu
@pytest.mark.slow
def test_strided_view_with_offsets_past_int32():
    """The issue's int32-offset reproducer on the CUDA launcher: a view into a 4.4 GB buffer (made contiguous)."""
    store = torch.zeros(64, 34_200_000, dtype=torch.float16, device="cuda")
    try:
        q = store[:, :64].view(1, 1, 64, 64)
        q.copy_(torch.randn(1, 1, 64, 64, device="cuda").half())
        k, v = (torch.randn(1, 1, 64, 64, device="cuda").half() for _ in range(2))
        assert _err(flash_attn_cuda(q, k, v, kernel="mma"), attention_reference(q, k, v)) < 1e-2
    finally:
        del store
        torch.cuda.empty_cache()


def test_batch_times_heads_past_the_grid_limit_is_refused():
    """B * H > 65535 would fail to launch (gridDim.y); a clear error instead (checked before the device)."""
    q = torch.randn(65536, 1, 1, 64)
    with pytest.raises(ValueError, match=r"flash_attn_cuda: q has B \* H = .*65536.*at most 65535"):
        flash_attn_cuda(q, q, q, kernel="tiled")
