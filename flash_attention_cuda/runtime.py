"""Compile, cache and launch the kernels of ``kernels/*.cu`` through CuPy: everything about the GPU runtime.

* Sources: ``kernels/*.cu`` plus the project headers ``kernels/*.cuh``, inlined here (``read_source``) so the
  compiled-module cache keys on the full text. They include no host header: NVRTC compiles them at run
  time, ``nvcc -cubin`` in the tests.
* wgmma.cu and wgmma_backward.cu use Hopper-only instructions, so they are compiled for ``sm_90a`` by NVRTC directly (CuPy's
  RawModule always names the plain ``sm_XX`` target) and loaded from the cubin (``_load_sm90a``).
* Templates: each launch names one instantiation (``"mma_fwd<128, 64, 4, 2, false>"``) through
  ``cupy.RawModule(name_expressions=...)``; the compiled kernel is cached per (source, name, device).
* Arguments: device pointers are passed as Python ints (``ptr``: ``tensor.data_ptr()``), the cheapest way
  through CuPy's launcher; ``as_cupy`` gives a zero-copy DLPack view instead (fp16/bf16 as int16: CuPy has
  no bfloat16), which is the same memory.
* Streams: kernels run on torch's current stream (``cupy.cuda.ExternalStream``), or on CuPy's current
  stream for CuPy inputs (``Stream``).
* Launches: CuPy's kernel call costs 25-40 us of Python per launch (device and stream context managers, every
  argument converted by its type on every call, a tensor map read through NumPy's array interface). For torch
  tensors on the current device, ``launch`` calls the driver's ``cuLaunchKernel`` through ctypes instead, with
  the parameters of each launch plan packed once (``Packed``): a call writes only the buffers' addresses and
  the tensor maps' into their slots. Anything else (CuPy arrays, ``as_cupy`` arguments, another device) goes
  through CuPy, as does a launch the driver refuses (so that CuPy raises its error).
* Shared memory above 48 KiB needs an opt-in per kernel (``launch`` sets it once).
* Tensor maps: wgmma_ws.cu's copy engine (TMA) reads q, k, v through 128-byte descriptors the driver encodes
  (``tensor_map``: cuTensorMapEncodeTiled through ctypes, cached per address and shape), passed by value as
  NumPy structured scalars, which CuPy hands to the kernel as raw bytes.

Nothing here checks inputs: the launcher does, before any of this runs. torch and cupy are imported lazily.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
import threading
import warnings

import numpy as np

from flash_attention_py.validation import array_kind

__all__ = ["KERNEL_DIR", "SOURCES", "HEADERS", "HOPPER_SOURCES", "read_source", "get_kernel", "compute_capability",
           "device_sms", "device_cc", "Stream", "launch", "ptr", "as_cupy", "contig", "empty", "convert", "copy", "tensor_map",
           "tensor_map_layout", "tma_box_columns", "encode_tensor_map", "Packed"]

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
SOURCES = ("naive.cu", "tiled.cu", "mma.cu", "wgmma.cu", "wgmma_ws.cu", "backward.cu", "mma_backward.cu",
           "wgmma_backward.cu")
HEADERS = tuple(sorted(os.path.basename(p) for p in glob.glob(os.path.join(KERNEL_DIR, "*.cuh"))))
HOPPER_SOURCES = ("wgmma.cu", "wgmma_ws.cu", "wgmma_backward.cu")  # sm_90a only

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


def _load_sm90a(code: str, name: str, source: str):
    """Compile ``code`` (the text of ``source``) for sm_90a with NVRTC, load the cubin, return the kernel ``name`` (a RawKernel)."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(code, source, (), ())
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
        path = os.path.join(tmp, source.replace(".cu", ".cubin"))
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
                    if source in HOPPER_SOURCES:
                        kern = _load_sm90a(read_source(source), name, source)
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


_CC: dict = {}  # device index -> (major, minor)


def device_cc(x) -> tuple:
    """(major, minor) compute capability of the GPU that holds x (a torch CUDA tensor or a CuPy array), cached."""
    if array_kind(x) == "torch":
        import torch

        idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if idx not in _CC:
            # torch's query, not CuPy's: torch.compile folds it to a constant, where CuPy would break the graph
            props = torch.cuda.get_device_properties(idx)
            _CC[idx] = (props.major, props.minor)
        return _CC[idx]
    idx = x.device.id
    if idx not in _CC:
        cc = compute_capability(idx)
        _CC[idx] = (int(cc[:-1]), int(cc[-1]))
    return _CC[idx]


_SMS: dict = {}  # device index -> multiprocessor count


def device_sms(x) -> int:
    """The number of SMs of the GPU that holds x (a torch CUDA tensor or a CuPy array), cached: the grid of a
    persistent kernel (wgmma_ws_fwd)."""
    if array_kind(x) == "torch":
        import torch

        idx = x.device.index if x.device.index is not None else torch.cuda.current_device()
        if idx not in _SMS:
            _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        return _SMS[idx]
    idx = x.device.id
    if idx not in _SMS:
        import cupy

        _SMS[idx] = cupy.cuda.Device(idx).attributes["MultiProcessorCount"]
    return _SMS[idx]


# ------------------------------------------------------------------------------------ streams and launches
_STREAMS: dict = {}  # (torch stream pointer, device) -> cupy.cuda.ExternalStream
_SMEM_SET: dict = {}  # id(kernel) -> the dynamic shared-memory limit it was raised to


def _raw_stream(device_id: int) -> int:
    """torch's current stream on the device, as the cudaStream_t address: torch's internal one-call query where it
    has one (a few microseconds less a call than ``torch.cuda.current_stream(...).cuda_stream``)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_id) if raw is not None else torch.cuda.current_stream(device_id).cuda_stream


class Stream:
    """The device and stream of one call: torch's current stream for torch tensors, CuPy's for CuPy arrays."""

    def __init__(self, x):
        import cupy

        if array_kind(x) == "torch":
            import torch

            self.device_id = x.device.index if x.device.index is not None else torch.cuda.current_device()
            handle = _raw_stream(self.device_id)
            # the driver launch needs the device's context current: torch's current device
            self.handle = handle if self.device_id == torch.cuda.current_device() else None
            self.stream = _STREAMS.get((handle, self.device_id))
            if self.stream is None:
                with warnings.catch_warnings():  # CuPy 14 marks ExternalStream deprecated; it still works
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.stream = cupy.cuda.ExternalStream(handle, self.device_id)
                _STREAMS[(handle, self.device_id)] = self.stream
        else:
            self.device_id = x.device.id
            self.stream = self.handle = None

    def run(self, kern, grid, block, args, shared_mem=0):
        import cupy

        with cupy.cuda.Device(self.device_id):
            if self.stream is not None:
                with self.stream:
                    kern(grid, block, args, shared_mem=shared_mem)
            else:
                kern(grid, block, args, shared_mem=shared_mem)


def launch(stream: Stream, spec, arrays: dict, as_arg=None) -> None:
    """Compile (once) and launch the kernel of a ``launch_specs.LaunchSpec`` on ``stream``.

    arrays: buffer name -> array (or a raw device address, an int: as_arg must then be ``ptr``), for the names in
    ``spec.buffers``; as_arg turns each into a kernel argument
    (default ``ptr``: a raw device address). Opts the kernel into more than 48 KiB of dynamic shared memory
    when a launch needs more than it was given before.
    """
    kern = get_kernel(spec.source, spec.name, stream.device_id)
    if spec.smem > _SMEM_SET.get(id(kern), 48 * 1024):  # (wgmma-ws's shared memory grows with its walk)
        if kern.max_dynamic_shared_size_bytes < spec.smem:
            kern.max_dynamic_shared_size_bytes = spec.smem
        _SMEM_SET[id(kern)] = spec.smem
    if DRIVER_LAUNCH and stream.handle is not None and as_arg in (None, ptr) and _driver_launch(kern, stream.handle,
                                                                                                  spec, arrays):
        return
    to_arg = as_arg or ptr
    maps = tuple(tensor_map(arrays[name], rows) for _, name, rows in spec.maps)
    args = maps + tuple(to_arg(arrays[name]) for name in spec.buffers) + spec.scalar_values
    stream.run(kern, spec.grid, spec.block, args, shared_mem=spec.smem)


# ------------------------------------------------------------------------------------ the driver's launch
_CTYPE_OF = {"int32": "c_int32", "uint32": "c_uint32", "int64": "c_int64", "float32": "c_float"}
DRIVER_LAUNCH = True  # False: every launch through CuPy (tools/host_profile.py times both)
_LAUNCH_FN = None  # cuLaunchKernel through ctypes (False: not available here)
_FUNCTIONS: dict = {}  # id(kernel) -> (kernel, its CUfunction handle)
_PACKED = threading.local()  # per thread: id(spec) -> (spec, Packed); each thread writes its own slots
_PACKED_MAX = 1024


class Packed:
    """cuLaunchKernel's ``kernelParams`` for one ``LaunchSpec``: an array of addresses, one per kernel parameter
    in the kernel's order (tensor maps, then buffers, then scalars). The scalars' C values are written once,
    here; ``fill`` writes a call's buffer addresses into their 8-byte slots and points the map parameters at
    the call's encoded maps. The driver copies the values at launch, so the slots may be rewritten right after."""

    def __init__(self, spec):
        import ctypes

        self.n_maps, self.n_bufs = len(spec.maps), len(spec.buffers)
        self.ptrs = (ctypes.c_uint64 * max(self.n_bufs, 1))()
        self.scalars = [getattr(ctypes, _CTYPE_OF[np.asarray(v).dtype.name])(v.item()) for v in spec.scalar_values]
        self.params = (ctypes.c_void_p * (self.n_maps + self.n_bufs + len(self.scalars)))()
        base = ctypes.addressof(self.ptrs)
        for i in range(self.n_bufs):
            self.params[self.n_maps + i] = base + 8 * i
        for j, s in enumerate(self.scalars):
            self.params[self.n_maps + self.n_bufs + j] = ctypes.addressof(s)
        grid, block = tuple(spec.grid) + (1,) * (3 - len(spec.grid)), tuple(spec.block) + (1,) * (3 - len(spec.block))
        self.dims = tuple(int(d) for d in grid + block)

    def fill(self, spec, arrays) -> None:
        # the call's maps stay referenced here until the next fill: a later map's encoding may evict them from
        # the cache before the launch reads them
        self.maps = [_map_entry(arrays[name], rows) for _, name, rows in spec.maps]
        for i, (_, address) in enumerate(self.maps):
            self.params[i] = address
        for i, name in enumerate(spec.buffers):  # a tensor, or a raw address (a buffer inside a larger one)
            x = arrays[name]
            self.ptrs[i] = x if type(x) is int else x.data_ptr()


def _packed(spec) -> Packed:
    cache = getattr(_PACKED, "specs", None)
    if cache is None:
        cache = _PACKED.specs = {}
    hit = cache.get(id(spec))
    if hit is None:
        if len(cache) >= _PACKED_MAX:
            cache.pop(next(iter(cache)))
        hit = cache[id(spec)] = (spec, Packed(spec))  # the entry keeps spec alive: its id is not reused
    return hit[1]


def _launch_fn():
    global _LAUNCH_FN
    if _LAUNCH_FN is None:
        import ctypes

        try:
            fn = _libcuda().cuLaunchKernel
        except (OSError, AttributeError):
            _LAUNCH_FN = False
            return _LAUNCH_FN
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int
        _LAUNCH_FN = fn
    return _LAUNCH_FN


def _driver_launch(kern, stream_handle: int, spec, arrays: dict) -> bool:
    """Launch ``kern`` with cuLaunchKernel on the stream ``stream_handle`` (torch tensors in ``arrays``); False
    where that is not possible here or the driver refuses, and the caller goes through CuPy instead."""
    fn = _launch_fn()
    if not fn:
        return False
    func = _FUNCTIONS.get(id(kern))
    if func is None:
        func = _FUNCTIONS[id(kern)] = (kern, kern.kernel.ptr)  # kern is cached for good (get_kernel)
    packed = _packed(spec)
    packed.fill(spec, arrays)
    return fn(func[1], *packed.dims, spec.smem, stream_handle, packed.params, None) == 0


# ------------------------------------------------------------------------------------ tensor maps (TMA)
# cuda.h's CUtensorMap: 128 opaque bytes (CU_TENSOR_MAP_NUM_QWORDS = 16), as a NumPy dtype CuPy passes by value
TMA_MAP_DTYPE = np.dtype({"names": ["words"], "formats": [("<u8", (16,))]})
# cuda.h's enums: CU_TENSOR_MAP_DATA_TYPE_UINT16 (the kernels move raw 16-bit values: zero-filled out of bounds
# whatever the float format), CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B and _128B (wgmma_ops.cuh's
# swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE (zeros)
_TMA_UINT16, _TMA_INTERLEAVE_NONE, _TMA_L2_256B, _TMA_OOB_ZERO = 1, 0, 3, 0
# a box's columns -> the swizzle of its rows: 64 16-bit columns = one 128-byte swizzle row, 32 = one 64-byte row
_TMA_SWIZZLE = {64: 3, 32: 2}


def tma_box_columns(D: int) -> int:
    """The columns of a TMA box, one swizzled panel of wgmma_ops.cuh's tiles (Panels<D>): 64 where D is a multiple
    of 64, else 32 (D = 32, 96: the 64-byte swizzle). A (rows, D) tile is D / tma_box_columns(D) boxes."""
    return 64 if D % 64 == 0 else 32


_MAPS: dict = {}  # (address, shape, box rows) -> (encoded map, its host address)
_MAPS_MAX = 256
_ENCODE = None


def tensor_map_layout(shape, rows: int) -> tuple:
    """(dims, byte strides, box) of the tensor map of a contiguous 16-bit (B, H, N, D) tensor, seen as a 3-d
    tensor (D, N, B H) (innermost first, cuTensorMapEncodeTiled's order), read in boxes of tma_box_columns(D)
    columns x ``rows`` rows of one head: a head's rows past N are out of bounds (zero-filled), never the next
    head's."""
    B, H, N, D = (int(d) for d in shape)
    return (D, N, B * H), (2 * D, 2 * D * N), (tma_box_columns(D), rows, 1)


def _libcuda():
    """The CUDA driver library (ctypes), for the two driver calls made here: cuTensorMapEncodeTiled, cuLaunchKernel."""
    import ctypes
    import sys

    return ctypes.WinDLL("nvcuda.dll") if sys.platform == "win32" else ctypes.CDLL("libcuda.so.1")


def _driver_encode():
    import ctypes

    fn = _libcuda().cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_tensor_map(address: int, dims, strides, box):
    """The driver's CUtensorMap (cuTensorMapEncodeTiled) of 16-bit data at ``address``, in boxes swizzled over
    their rows (box[0] columns: 64 -> the 128-byte swizzle, 32 -> the 64-byte one), as a NumPy array of one
    TMA_MAP_DTYPE element (what CuPy passes to a ``const __grid_constant__`` parameter)."""
    import ctypes

    global _ENCODE
    if _ENCODE is None:
        _ENCODE = _driver_encode()
    rank = len(dims)
    raw = np.zeros(256, dtype=np.uint8)  # the driver wants the map 64-byte aligned
    start = (-raw.ctypes.data) % 64
    err = _ENCODE(raw.ctypes.data + start, _TMA_UINT16, rank, address, (ctypes.c_uint64 * rank)(*dims),
                  (ctypes.c_uint64 * (rank - 1))(*strides), (ctypes.c_uint32 * rank)(*box),
                  (ctypes.c_uint32 * rank)(*([1] * rank)), _TMA_INTERLEAVE_NONE, _TMA_SWIZZLE[box[0]], _TMA_L2_256B,
                  _TMA_OOB_ZERO)
    if err != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {err} (dims {dims}, byte strides "
                           f"{strides}, box {box}, address {address:#x})")
    return raw[start:start + 128].copy().view(TMA_MAP_DTYPE)


def tensor_map(x, rows: int):
    """The tensor map of x, a contiguous 16-bit (B, H, N, D) tensor at a 16-byte aligned address, read in boxes of
    (rows, tma_box_columns(D)) (tensor_map_layout); cached per (address, shape, rows), so a training loop encodes
    each once."""
    return _map_entry(x, rows)[0]


def _map_entry(x, rows: int) -> tuple:
    """(x's tensor map, the host address of its 128 bytes), encoded once per (address, shape, rows)."""
    key = (ptr(x), tuple(x.shape), rows)
    entry = _MAPS.get(key)
    if entry is None:
        if len(_MAPS) >= _MAPS_MAX:
            _MAPS.pop(next(iter(_MAPS)))
        m = encode_tensor_map(key[0], *tensor_map_layout(x.shape, rows))
        entry = _MAPS[key] = (m, m.__array_interface__["data"][0] if isinstance(m, np.ndarray) else None)
    return entry


# ------------------------------------------------------------------------------------ array plumbing
def ptr(x) -> int:
    """Device address of a torch tensor or CuPy array: kernels take raw pointers (a Python int is passed as
    8 bytes), which skips building CuPy views of torch tensors on every call. An int is an address already
    (a buffer at an offset into a larger allocation) and comes back as it is."""
    if type(x) is int:
        return x
    return x.data_ptr() if array_kind(x) == "torch" else int(x.data.ptr)


def as_cupy(x):
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


def pad_last(x, size: int):
    """x with its last dimension zero-padded to ``size`` (a new contiguous array; torch tensor or CuPy array)."""
    extra = size - x.shape[-1]
    if array_kind(x) == "torch":
        import torch

        return torch.nn.functional.pad(x, (0, extra)).contiguous()
    import cupy

    return cupy.ascontiguousarray(cupy.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)]))


def cut_last(x, size: int):
    """The first ``size`` entries of x's last dimension, as a contiguous array (undoes pad_last)."""
    return contig(x[..., :size])


def contig(x):
    """x itself if C-contiguous, else a contiguous copy (torch tensor or CuPy array)."""
    if array_kind(x) == "torch":
        return x.contiguous()
    import cupy

    return cupy.ascontiguousarray(x)


def copy(x):
    """A new contiguous copy of x (torch tensor or CuPy array): fresh memory, aligned by the allocator."""
    if array_kind(x) == "torch":
        import torch

        return x.clone(memory_format=torch.contiguous_format)
    import cupy

    return cupy.array(x, copy=True, order="C")


def convert(x, dtype: str):
    """A contiguous copy of x in ``dtype`` ('float32', 'bfloat16', ...), or x when it already is one."""
    if array_kind(x) == "torch":
        import torch

        return x.to(getattr(torch, dtype)).contiguous()
    import cupy

    return cupy.ascontiguousarray(x, dtype=dtype)


def empty_as(x):
    """An uninitialised contiguous array with x's shape, dtype and device, of x's kind (torch's empty_like: a few
    microseconds less a call than ``empty``)."""
    if array_kind(x) == "torch":
        import torch

        return torch.empty_like(x, memory_format=torch.contiguous_format)
    import cupy

    return cupy.empty(x.shape, dtype=x.dtype)


def empty(like, shape, dtype: str):
    """An uninitialised array of ``shape`` and ``dtype`` on like's device, of like's kind (torch or CuPy)."""
    if array_kind(like) == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    import cupy

    return cupy.empty(shape, dtype=dtype)
