"""Compile, cache and launch the CUDA kernels of ``kernels/*.cu`` through CuPy.

* Sources: ``kernels/{naive,tiled,mma,wgmma,backward}.cu`` plus the project headers ``kernels/*.cuh``
  (inlined here, so the compiled-module cache keys on the full text). They include no host header:
  NVRTC compiles them at run time, ``nvcc -cubin`` in the tests.
* wgmma.cu uses Hopper-only instructions, so it is compiled for ``sm_90a`` by NVRTC directly (CuPy's
  RawModule always names the plain ``sm_XX`` target) and loaded from the cubin.
* Templates: each launch names one instantiation (``"mma_fwd<128, 64, 4, false>"``) through
  ``cupy.RawModule(name_expressions=...)``; the compiled kernel is cached per (source, name, device).
* Zero copy: the forward kernels get raw device pointers (``tensor.data_ptr()``), the cheapest way
  through CuPy's launcher; the backward passes torch tensors through DLPack (``cupy.from_dlpack``),
  fp16/bf16 as int16 views (CuPy has no bfloat16), which is the same memory.
* Streams: kernels run on torch's current stream (``cupy.cuda.ExternalStream``), or on CuPy's current
  stream for CuPy inputs.
"""
from __future__ import annotations

import math
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Optional

from flash_attention_py.validation import (array_kind, check_flag, check_qkv, check_same_as, check_scale_range,
                                           device_of, dtype_name, resolve_lazy, resolve_softmax_scale)

__all__ = ["flash_attn_cuda", "flash_attn_cuda_backward", "KERNELS", "RUNGS", "supported_text", "MMA_CONFIGS",
           "WGMMA_CONFIGS"]

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
SOURCES = ("naive.cu", "tiled.cu", "mma.cu", "wgmma.cu", "backward.cu", "mma_backward.cu")
HEADERS = ("common.cuh", "ptx.cuh", "smem_tiles.cuh")
HOPPER_SOURCES = ("wgmma.cu",)  # sm_90a only

FN = "flash_attn_cuda"


@dataclass(frozen=True)
class Rung:
    name: str
    source: str
    dtypes: tuple
    head_dims: Optional[tuple]  # the only D it takes, or None: any D up to max_head_dim
    max_head_dim: int
    description: str

    def supports(self, dtype: str, D: int) -> bool:
        if dtype not in self.dtypes:
            return False
        if self.head_dims is not None:
            return D in self.head_dims
        return 1 <= D <= self.max_head_dim

    def text(self) -> str:
        dims = f"D in {{{', '.join(map(str, self.head_dims))}}}" if self.head_dims else f"D <= {self.max_head_dim}"
        return f"{self.name}: {'/'.join(self.dtypes)}, {dims}"


RUNGS = {
    "naive": Rung("naive", "naive.cu", ("float32",), None, 128,
                  "one thread per query row, K/V tiles in shared memory, online softmax"),
    "tiled": Rung("tiled", "tiled.cu", ("float32",), None, 128,
                  "block-cooperative tiles, warp-shuffle row max/sum, float4 loads (the four device functions)"),
    "mma": Rung("mma", "mma.cu", ("float16", "bfloat16"), (64, 128), 128,
                "tensor cores: mma.sync m16n8k16, ldmatrix, cp.async double buffering, swizzled shared memory"),
    "wgmma": Rung("wgmma", "wgmma.cu", ("float16", "bfloat16"), (64, 128), 128,
                  "Hopper tensor cores (sm_90a only): warpgroup wgmma.mma_async from shared-memory descriptors, "
                  "softmax overlapped with the next product"),
}
KERNELS = tuple(RUNGS)  # ('naive', 'tiled', 'mma', 'wgmma')
# kernel='auto': wgmma on a Hopper GPU (compute capability 9.0), else mma, for fp16/bf16 with D 64 or 128;
# tiled otherwise.
HOPPER_ONLY = {"wgmma": "90"}
BACKWARD_MAX_HEAD_DIM = 128
MAX_GRID_Y = 65535  # gridDim.y limit: the grids are (query or key blocks, B * H)

# mma: (BC keys per K/V tile, warps per block, m16 tiles per warp) for each head dim.
# A block holds Br = 16 * tiles * warps query rows.
# Chosen by `benchmarks/cuda_ladder_vs_fa2.py --sweep` on an H100 (docs/results/cuda/cuda_ladder.json).
MMA_CONFIGS = {64: (64, 4, 2), 128: (128, 8, 1)}
# wgmma: (BC keys per K/V tile, warpgroups per block); Br = 64 * warpgroups query rows per block.
WGMMA_CONFIGS = {64: (64, 2), 128: (128, 2)}


def supported_text() -> str:
    return "; ".join(r.text() for r in RUNGS.values())


def _pad_dim(D: int) -> int:
    for p in (32, 64, 128):
        if D <= p:
            return p
    raise AssertionError(D)


# ------------------------------------------------------------------------------------ compilation
_LOCK = threading.Lock()
_KERNEL_CACHE: dict = {}  # (source, name expression, device id) -> cupy.RawKernel


def read_source(source: str) -> str:
    """The .cu text with the project's ``#include "x.cuh"`` inlined, each header once (what NVRTC compiles)."""
    seen = set()

    def expand(fname):
        with open(os.path.join(KERNEL_DIR, fname)) as f:
            text = f.read()
        out = []
        for line in text.splitlines(keepends=True):
            m = re.match(r'\s*#\s*include\s+"([\w.]+\.cuh)"', line)
            if m:
                if m.group(1) not in seen:
                    seen.add(m.group(1))
                    out.append(expand(m.group(1)))
                continue
            out.append(line)
        return "".join(out)

    return expand(source)


def _load_sm90a(code: str, name: str):
    """Compile ``code`` for sm_90a with NVRTC, load the cubin, return the kernel ``name`` (a RawKernel)."""
    import tempfile

    import cupy
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(code, "wgmma.cu", (), ())
    try:
        nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, ("--std=c++17", "-arch=sm_90a", "--device-as-default-execution-space"))
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed to compile {name} for sm_90a:\n{nvrtc.getProgramLog(prog)}") from exc
        lowered = nvrtc.getLoweredName(prog, name)
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "wgmma.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        module = cupy.RawModule(path=path)  # loads the cubin now
        return module.get_function(lowered)


def get_kernel(source: str, name: str, device_id: int):
    """The compiled kernel ``name`` (a template instantiation such as ``tiled_fwd<64, 8>``), cached."""
    import cupy

    key = (source, name, device_id)
    kern = _KERNEL_CACHE.get(key)
    if kern is None:
        with _LOCK:
            kern = _KERNEL_CACHE.get(key)
            if kern is None:
                with cupy.cuda.Device(device_id):
                    if source == "wgmma.cu":
                        kern = _load_sm90a(read_source(source), name)
                    else:
                        module = cupy.RawModule(code=read_source(source), options=("--std=c++17",),
                                                name_expressions=[name])
                        kern = module.get_function(name)
                _KERNEL_CACHE[key] = kern
    return kern


def compute_capability(device_id: int) -> str:
    """'90' for an H100, '80' for an A100 (CuPy's spelling)."""
    import cupy

    return cupy.cuda.Device(device_id).compute_capability


# ------------------------------------------------------------------------------------ array plumbing
_STREAMS: dict = {}  # (torch stream pointer, device) -> cupy.cuda.ExternalStream


class _Ctx:
    """Device, stream and DLPack conversion for one call (torch or CuPy arrays)."""

    def __init__(self, x):
        import cupy

        self.kind = array_kind(x)
        if self.kind == "torch":
            import torch

            self.device_id = x.device.index if x.device.index is not None else torch.cuda.current_device()
            ptr = torch.cuda.current_stream(x.device).cuda_stream
            self.stream = _STREAMS.get((ptr, self.device_id))
            if self.stream is None:
                with warnings.catch_warnings():  # CuPy 14 marks ExternalStream deprecated; it still works
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.stream = cupy.cuda.ExternalStream(ptr, self.device_id)
                _STREAMS[(ptr, self.device_id)] = self.stream
        else:
            self.device_id = x.device.id
            self.stream = None

    def run(self, kern, grid, block, args, shared_mem=0):
        import cupy

        with cupy.cuda.Device(self.device_id):
            if self.stream is not None:
                with self.stream:
                    kern(grid, block, args, shared_mem=shared_mem)
            else:
                kern(grid, block, args, shared_mem=shared_mem)


def _as_cupy(x):
    """Zero-copy CuPy view of a contiguous torch tensor or CuPy array (16-bit floats as int16)."""
    import cupy

    if array_kind(x) == "torch":
        import torch

        x = x.detach()  # same memory; DLPack refuses tensors that require grad
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.view(torch.int16)
        return cupy.from_dlpack(x)
    if x.dtype == cupy.float16:
        return x.view(cupy.int16)
    return x


def _contig(x):
    if array_kind(x) == "torch":
        return x.contiguous()
    import cupy

    return cupy.ascontiguousarray(x)


def _empty(like, shape, dtype_name_: str):
    if array_kind(like) == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype_name_), device=like.device)
    import cupy

    return cupy.empty(shape, dtype=dtype_name_)


def _i32(v):
    import numpy as np

    return np.int32(v)


def _f32(v):
    import numpy as np

    return np.float32(v)


# ------------------------------------------------------------------------------------ checks
def _check_inputs(q, k, v, kernel, fn=FN):
    """check_qkv, then the kernel name, then the (kernel, dtype, D) combination, then the device."""
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"))
    if not isinstance(kernel, str):
        raise TypeError(f"{fn}: kernel must be a str, got {type(kernel).__name__} {kernel!r}")
    if kernel != "auto" and kernel not in RUNGS:
        raise ValueError(f"{fn}: unknown kernel {kernel!r}; expected 'auto' or one of {', '.join(KERNELS)}")
    dt = dtype_name(q)
    dev = device_of(q)
    if kernel == "auto":
        kernel = "mma" if (dt in ("float16", "bfloat16") and dims.D in RUNGS["mma"].head_dims) else "tiled"
        if kernel == "mma" and dev.startswith("cuda") and _device_cc(q) == HOPPER_ONLY["wgmma"]:
            kernel = "wgmma"
        if not RUNGS[kernel].supports(dt, dims.D):
            raise ValueError(f"{fn}: no kernel takes dtype {dt} with head dim D = {dims.D}; "
                             f"supported: {supported_text()}")
    if not RUNGS[kernel].supports(dt, dims.D):
        raise ValueError(
            f"{fn}: kernel {kernel!r} does not support dtype {dt} with head dim D = {dims.D}; "
            f"it supports {RUNGS[kernel].text()} (all kernels: {supported_text()})"
        )
    if dims.B * dims.H > MAX_GRID_Y:
        raise ValueError(f"{fn}: q has B * H = {dims.B} * {dims.H} = {dims.B * dims.H} (shape {tuple(q.shape)}); the "
                         f"kernels launch one grid row per (batch, head) and a CUDA grid has at most {MAX_GRID_Y} rows: "
                         f"expected B * H <= {MAX_GRID_Y} (split the batch)")
    if not dev.startswith("cuda"):
        raise ValueError(f"{fn}: q, k and v must be on a CUDA device, got {dev}; move them with .cuda()")
    if kernel in HOPPER_ONLY and _device_cc(q) != HOPPER_ONLY[kernel]:
        raise ValueError(f"{fn}: kernel {kernel!r} runs only on compute capability {HOPPER_ONLY[kernel]} "
                         f"(Hopper: H100/H200, sm_90a); this GPU has {_device_cc(q)}. Use kernel='mma'")
    return dims, kernel


_CC: dict = {}  # device index -> compute capability


def _device_cc(x) -> str:
    if array_kind(x) == "torch":
        import torch

        idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if idx not in _CC:
            # torch's query, not CuPy's: torch.compile folds it to a constant, where CuPy would break the graph
            props = torch.cuda.get_device_properties(idx)
            _CC[idx] = f"{props.major}{props.minor}"
        return _CC[idx]
    idx = x.device.id
    if idx not in _CC:
        _CC[idx] = compute_capability(idx)
    return _CC[idx]


# ------------------------------------------------------------------------------------ forward
def _ptr(x) -> int:
    """Device address of a torch tensor or CuPy array: kernels take raw pointers (a Python int is passed as
    8 bytes), which skips building CuPy views of torch tensors on every call."""
    return x.data_ptr() if array_kind(x) == "torch" else int(x.data.ptr)


_SMEM_SET: set = set()  # kernels whose dynamic shared-memory limit was raised already


def _launch_tensor_core(ctx, kern, grid, block, args, smem):
    if smem > 48 * 1024 and id(kern) not in _SMEM_SET:
        if kern.max_dynamic_shared_size_bytes < smem:
            kern.max_dynamic_shared_size_bytes = smem
        _SMEM_SET.add(id(kern))
    ctx.run(kern, grid, block, args, shared_mem=smem)


def _forward(q, k, v, causal: bool, scale: float, kernel: str, dims):
    """Launch one forward kernel; q, k, v contiguous. Returns (o in q's dtype, lse float32)."""
    B, H, Nq, Nk, D = dims
    ctx = _Ctx(q)
    o = _empty(q, (B, H, Nq, D), dtype_name(q))
    lse = _empty(q, (B, H, Nq), "float32")
    pq, pk, pv, po, plse = (_ptr(x) for x in (q, k, v, o, lse))
    if kernel == "naive":
        dp, bc, br = _pad_dim(D), 32, 64
        kern = get_kernel("naive.cu", f"naive_fwd<{dp}, {bc}, {br}>", ctx.device_id)
        ctx.run(kern, ((Nq + br - 1) // br, B * H), (br,),
                (pq, pk, pv, po, plse, _i32(Nq), _i32(Nk), _i32(D), _f32(scale), _i32(int(causal))))
    elif kernel == "tiled":
        dp = _pad_dim(D)
        rows = 4 if dp == 128 else 8
        br = 4 * rows
        vec4 = D % 4 == 0 and all(p % 16 == 0 for p in (pq, pk, pv))
        kern = get_kernel("tiled.cu", f"tiled_fwd<{dp}, {rows}>", ctx.device_id)
        ctx.run(kern, ((Nq + br - 1) // br, B * H), (128,),
                (pq, pk, pv, po, plse, _i32(Nq), _i32(Nk), _i32(D), _f32(scale), _i32(int(causal)),
                 _i32(int(vec4))))
    elif kernel in ("mma", "wgmma"):
        bf16 = "true" if dtype_name(q) == "bfloat16" else "false"
        if kernel == "mma":
            bc, nw, mt = MMA_CONFIGS[D]
            br, threads = 16 * mt * nw, 32 * nw
            kern = get_kernel("mma.cu", f"mma_fwd<{D}, {bc}, {nw}, {mt}, {bf16}>", ctx.device_id)
            smem = (br + 4 * bc) * D * 2  # Q tile + 2 x (K tile + V tile), 16-bit elements
        else:
            bc, nwg = WGMMA_CONFIGS[D]
            br, threads = 64 * nwg, 128 * nwg
            kern = get_kernel("wgmma.cu", f"wgmma_fwd<{D}, {bc}, {nwg}, {bf16}>", ctx.device_id)
            smem = (br + 4 * bc) * D * 2 + 1024  # the same, plus room to align the tiles to 1024 bytes
        # scores are taken in log2 units; a negative scale is applied as |scale| on -q
        scale2 = max(abs(scale) * math.log2(math.e), 1e-30)
        _launch_tensor_core(ctx, kern, ((Nq + br - 1) // br, B * H), (threads,),
                            (pq, pk, pv, po, plse, _i32(Nq), _i32(Nk), _f32(scale2), _i32(int(causal)),
                             _i32(int(scale < 0))), smem)
    else:  # pragma: no cover - checked before
        raise AssertionError(kernel)
    return o, lse


def seed_nomax_forward(q, k, v, *, softmax_scale=None):
    """The seed lab kernel's arithmetic (sum of exp(s), no running max), non-causal, fp32.

    For the test that shows why the running max matters: with scores past ~88.7 it gives inf/NaN.
    """
    fn = "seed_nomax_forward"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), dtypes=("float32",))
    if D > 128:
        raise ValueError(f"{fn}: D must be <= 128, got {D}")
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    q, k, v = (_contig(x) for x in (q, k, v))
    ctx = _Ctx(q)
    o = _empty(q, (B, H, Nq, D), "float32")
    dp = _pad_dim(D)
    kern = get_kernel("naive.cu", f"seed_nomax_fwd<{dp}, 32, 64>", ctx.device_id)
    ctx.run(kern, ((Nq + 63) // 64, B * H), (64,),
            tuple(_as_cupy(x) for x in (q, k, v, o)) + (_i32(Nq), _i32(Nk), _i32(D), _f32(scale)))
    return o


# ------------------------------------------------------------------------------------ backward
def _backward_mma(q, k, v, o, lse, do, causal, scale, dims):
    """Tensor-core backward (kernels/mma_backward.cu): 16-bit in and out, fp32 accumulation."""
    B, H, Nq, Nk, D = dims
    q, k, v, o, do, lse = (_contig(x) for x in (q, k, v, o, do, lse))
    ctx = _Ctx(q)
    dt = dtype_name(q)
    bf16 = "true" if dt == "bfloat16" else "false"
    dq, dk, dv = _empty(q, (B, H, Nq, D), dt), _empty(q, (B, H, Nk, D), dt), _empty(q, (B, H, Nk, D), dt)
    delta = _empty(q, (B, H, Nq), "float32")
    pq, pk, pv, po, pdo, plse, pdq, pdk, pdv, pdelta = (_ptr(x) for x in (q, k, v, o, do, lse, dq, dk, dv, delta))
    rows = B * H * Nq
    pre = get_kernel("mma_backward.cu", f"mma_bwd_preprocess<{D}, {bf16}>", ctx.device_id)
    ctx.run(pre, ((rows + 3) // 4,), (128,), (po, pdo, pdelta, __import__("numpy").int64(rows)))
    nw, tile = MMA_BACKWARD_CONFIG
    blk = 16 * nw
    smem = (2 * blk + 4 * tile) * D * 2 + 4 * tile * 4  # dkdv: K, V, 2 x (Q, dO), 2 x (lse, Delta)
    kern = get_kernel("mma_backward.cu", f"mma_bwd_dkdv<{D}, {nw}, {tile}, {bf16}>", ctx.device_id)
    _launch_tensor_core(ctx, kern, ((Nk + blk - 1) // blk, B * H), (32 * nw,),
                        (pq, pk, pv, pdo, plse, pdelta, pdk, pdv, _i32(Nq), _i32(Nk), _f32(scale),
                         _i32(int(causal))), smem)
    smem = (2 * blk + 4 * tile) * D * 2  # dq: Q, dO, 2 x (K, V)
    kern = get_kernel("mma_backward.cu", f"mma_bwd_dq<{D}, {nw}, {tile}, {bf16}>", ctx.device_id)
    _launch_tensor_core(ctx, kern, ((Nq + blk - 1) // blk, B * H), (32 * nw,),
                        (pq, pk, pv, pdo, plse, pdelta, pdq, _i32(Nq), _i32(Nk), _f32(scale), _i32(int(causal))),
                        smem)
    return dq, dk, dv


BACKWARD_KERNELS = ("auto", "mma", "tiled")
MMA_BACKWARD_CONFIG = (4, 64)  # (warps per block, rows of the tile each kernel loops over): 64 x 64 tiles


def flash_attn_cuda_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, kernel="auto"):
    """dQ, dK, dV of ``O = softmax(q k^T * scale) v`` by recompute kernels, from the forward's lse.

    q (B, H, Nq, D), k and v (B, H, Nk, D), o and do (B, H, Nq, D), lse (B, H, Nq) float32 natural log
    (the forward's). The gradients come back in q's dtype.

    kernel: 'mma' (fp16/bf16, D in {64, 128}, compute capability >= 8.0: tensor cores, fp32 accumulation,
    kernels/mma_backward.cu) | 'tiled' (any float dtype, D <= 128: fp16/bf16 are upcast and the fp32
    kernels of kernels/backward.cu run) | 'auto' (mma where it applies, else tiled).
    """
    fn = "flash_attn_cuda_backward"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"))
    q, k, v, o, do = (resolve_lazy(x) for x in (q, k, v, o, do))  # conj/neg views: the kernels read raw memory
    check_flag(causal, "causal", fn=fn)
    for name, x in (("o", o), ("do", do)):
        check_same_as(x, name, q, "q", fn=fn)
    check_same_as(lse, "lse", q, "q", fn=fn, shape=(B, H, Nq), dtype="float32")
    if not isinstance(kernel, str) or kernel not in BACKWARD_KERNELS:
        raise ValueError(f"{fn}: kernel must be one of {', '.join(BACKWARD_KERNELS)}, got {kernel!r}")
    if D > BACKWARD_MAX_HEAD_DIM:
        raise ValueError(f"{fn}: the backward kernels take D <= {BACKWARD_MAX_HEAD_DIM}, got D = {D}")
    if B * H > MAX_GRID_Y:
        raise ValueError(f"{fn}: q has B * H = {B * H}; a CUDA grid has at most {MAX_GRID_Y} rows: "
                         f"expected B * H <= {MAX_GRID_Y} (split the batch)")
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    out_dtype = dtype_name(q)
    dev = device_of(q)
    if not dev.startswith("cuda"):
        raise ValueError(f"{fn}: q, k and v must be on a CUDA device, got {dev}; move them with .cuda()")
    mma_ok = out_dtype in ("float16", "bfloat16") and D in (64, 128) and int(_device_cc(q)) >= 80
    if kernel == "mma" and not mma_ok:
        raise ValueError(f"{fn}: kernel 'mma' takes float16/bfloat16 with D in {{64, 128}} on compute capability "
                         f">= 8.0; got {out_dtype}, D = {D}, compute capability {_device_cc(q)}. Use kernel='tiled'")
    if kernel != "tiled" and mma_ok:
        return _backward_mma(q, k, v, o, lse, do, causal, scale, (B, H, Nq, Nk, D))

    def f32(x):
        if array_kind(x) == "torch":
            import torch

            return x.to(torch.float32).contiguous()
        import cupy

        return cupy.ascontiguousarray(x, dtype=cupy.float32)

    q, k, v, o, do, lse = (f32(x) for x in (q, k, v, o, do, lse))
    ctx = _Ctx(q)
    dq = _empty(q, (B, H, Nq, D), "float32")
    dk = _empty(q, (B, H, Nk, D), "float32")
    dv = _empty(q, (B, H, Nk, D), "float32")
    delta = _empty(q, (B, H, Nq), "float32")
    cq, ck, cv, co, cdo, clse, cdq, cdk, cdv, cdelta = (_as_cupy(x) for x in (q, k, v, o, do, lse, dq, dk, dv, delta))
    rows = B * H * Nq
    pre = get_kernel("backward.cu", "bwd_preprocess", ctx.device_id)
    ctx.run(pre, ((rows + 3) // 4,), (128,), (co, cdo, cdelta, __import__("numpy").int64(rows), _i32(D)))
    dp = _pad_dim(D)
    bt = 16 if dp == 128 else 32
    kdkdv = get_kernel("backward.cu", f"bwd_dkdv<{dp}, {bt}>", ctx.device_id)
    ctx.run(kdkdv, ((Nk + bt - 1) // bt, B * H), (128,),
            (cq, ck, cv, cdo, clse, cdelta, cdk, cdv, _i32(Nq), _i32(Nk), _i32(D), _f32(scale), _i32(int(causal))))
    kdq = get_kernel("backward.cu", f"bwd_dq<{dp}, {bt}>", ctx.device_id)
    ctx.run(kdq, ((Nq + bt - 1) // bt, B * H), (128,),
            (cq, ck, cv, cdo, clse, cdelta, cdq, _i32(Nq), _i32(Nk), _i32(D), _f32(scale), _i32(int(causal))))
    if out_dtype != "float32":
        if array_kind(dq) == "torch":
            import torch

            t = getattr(torch, out_dtype)
            dq, dk, dv = dq.to(t), dk.to(t), dv.to(t)
        else:
            dq, dk, dv = dq.astype(out_dtype), dk.astype(out_dtype), dv.astype(out_dtype)
    return dq, dk, dv


def flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False):
    """FlashAttention forward by a raw CUDA kernel launched through CuPy.

    Arguments
        q: (B, H, Nq, D), k and v: (B, H, Nk, D): torch CUDA tensors (any strides; made contiguous) or
           CuPy arrays, one dtype.
        causal: bottom-right aligned mask, query i sees key j iff j <= i + Nk - Nq.
        softmax_scale: defaults to 1/sqrt(D).
        kernel: 'naive' | 'tiled' (fp32, D <= 128) | 'mma' (fp16/bf16, D in {64, 128}) |
                'wgmma' (fp16/bf16, D in {64, 128}, Hopper only) | 'auto' (for fp16/bf16 with D 64 or 128:
                wgmma on a Hopper GPU, else mma; otherwise tiled).
        return_lse: also return lse (B, H, Nq) float32 = log(sum_j exp(scaled score)).

    Returns O (B, H, Nq, D) in q's dtype (and lse). A row that sees no key gives O = 0, lse = -inf.
    Differentiable for torch tensors: the backward recomputes from the saved lse, on tensor cores for
    fp16/bf16 with D 64 or 128 (``kernels/mma_backward.cu``), else with the fp32 tiled kernels (fp16/bf16
    upcast). D <= 128 for the backward. For torch tensors that need gradients, and under ``torch.compile``,
    the kernels run as the custom ops ``torch.ops.fa_ladder.cuda_fwd`` / ``cuda_bwd`` (``library_ops.py``), so
    ``torch.compile(fullgraph=True)`` compiles a model that calls this with no graph break.
    """
    check_flag(causal, "causal", fn=FN)
    check_flag(return_lse, "return_lse", fn=FN)
    dims, kernel = _check_inputs(q, k, v, kernel)
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: the kernels read raw memory
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=FN)
    check_scale_range(q, k, scale, fn=FN)  # the kernels compute the scores in float32
    if array_kind(q) == "torch":
        import torch

        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
            # the torch.library custom op (library_ops.py): one graph node for torch.compile, differentiable
            # through its registered backward op. Eager calls that need no gradient skip its dispatch (~30 us).
            from .library_ops import cuda_fwd

            o, lse = cuda_fwd(q, k, v, causal, scale, kernel)
        else:
            o, lse = _forward(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, kernel, dims)
    else:
        o, lse = _forward(_contig(q), _contig(k), _contig(v), causal, scale, kernel, dims)
    return (o, lse) if return_lse else o
