"""Input checks shared by every backend.

Every public entry point of every backend calls :func:`check_qkv` first, so a
student gets the same clear ``ValueError``/``TypeError`` from the NumPy loop,
the PyTorch loop, the Triton kernel and the CUDA kernels alike. The message
always names the argument, what it got and what it expected.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

__all__ = [
    "AttentionDims",
    "array_kind",
    "dtype_name",
    "device_of",
    "check_qkv",
    "check_same_as",
    "check_block_size",
    "resolve_softmax_scale",
]


class AttentionDims(NamedTuple):
    """Sizes of one attention call: q is (B, H, Nq, D), k and v are (B, H, Nk, D)."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int


def array_kind(x) -> str:
    """'numpy', 'torch', 'cupy' or 'unknown' (no import of a library that is not loaded)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "numpy":
        return "numpy"
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    return "unknown"


def dtype_name(x) -> str:
    """'float32', 'float16', 'bfloat16', ... for a NumPy/CuPy array or a torch tensor."""
    name = str(x.dtype)
    return name.replace("torch.", "")


def device_of(x) -> str:
    """'cpu', 'cuda:0', ... (NumPy arrays live on 'cpu', CuPy arrays on 'cuda:N')."""
    kind = array_kind(x)
    if kind == "torch":
        return str(x.device)
    if kind == "cupy":
        return f"cuda:{x.device.id}"
    return "cpu"


def _kinds_text(kinds) -> str:
    names = {"numpy": "numpy.ndarray", "torch": "torch.Tensor", "cupy": "cupy.ndarray"}
    return " or ".join(names[k] for k in kinds)


def check_qkv(q, k, v, *, fn: str, kinds=("numpy", "torch"), dtypes=None) -> AttentionDims:
    """Check q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, D) and return the sizes.

    ``fn`` names the public function in messages; ``kinds`` are the accepted
    array types; ``dtypes`` (names such as 'float16') the accepted dtypes,
    or None for any floating dtype.
    """
    arrays = {"q": q, "k": k, "v": v}
    for name, x in arrays.items():
        kind = array_kind(x)
        if kind not in kinds:
            raise TypeError(f"{fn}: {name} must be a {_kinds_text(kinds)}, got {type(x).__name__}")
    first_kind = array_kind(q)
    for name in ("k", "v"):
        if array_kind(arrays[name]) != first_kind:
            raise TypeError(
                f"{fn}: q, k and v must be the same array type, got q {type(q).__name__} "
                f"and {name} {type(arrays[name]).__name__}"
            )
    for name, x in arrays.items():
        if len(x.shape) != 4:
            raise ValueError(
                f"{fn}: {name} must have 4 dimensions (B, H, N, D), got shape {tuple(x.shape)} "
                f"with {len(x.shape)} dimensions"
            )
    B, H, Nq, D = (int(s) for s in q.shape)
    Bk, Hk, Nk, Dk = (int(s) for s in k.shape)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{fn}: v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    for label, a, b in (("B (batch)", B, Bk), ("H (heads)", H, Hk), ("D (head dim)", D, Dk)):
        if a != b:
            raise ValueError(
                f"{fn}: q and k must agree in {label}: q has shape {tuple(q.shape)}, "
                f"k has shape {tuple(k.shape)}"
            )
    for label, value, name in (("B", B, "q"), ("H", H, "q"), ("Nq", Nq, "q"), ("Nk", Nk, "k"), ("D", D, "q")):
        if value < 1:
            raise ValueError(
                f"{fn}: {name} has {label} = 0 (shape {tuple(arrays[name].shape)}); "
                f"expected {label} >= 1: empty attention is not defined here"
            )
    dts = {name: dtype_name(x) for name, x in arrays.items()}
    if len(set(dts.values())) != 1:
        raise TypeError(f"{fn}: q, k and v must share one dtype, got q {dts['q']}, k {dts['k']}, v {dts['v']}")
    dt = dts["q"]
    if dtypes is not None and dt not in dtypes:
        raise TypeError(f"{fn}: dtype {dt} is not supported; expected one of {', '.join(sorted(dtypes))}")
    if dtypes is None and not dt.startswith(("float", "bfloat")):
        raise TypeError(f"{fn}: q, k, v must be floating point, got {dt}")
    devs = {name: device_of(x) for name, x in arrays.items()}
    if len(set(devs.values())) != 1:
        raise ValueError(
            f"{fn}: q, k and v must be on one device, got q on {devs['q']}, k on {devs['k']}, v on {devs['v']}"
        )
    return AttentionDims(B, H, Nq, Nk, D)


def check_same_as(x, name: str, ref, ref_name: str, *, fn: str, shape=None, dtype=None) -> None:
    """Check that ``x`` is the same kind of array as ``ref``, on its device, with ``shape``/``dtype``.

    ``shape`` defaults to ref's shape and ``dtype`` to ref's dtype name.
    """
    if array_kind(x) != array_kind(ref):
        raise TypeError(f"{fn}: {name} must be a {type(ref).__name__} like {ref_name}, got {type(x).__name__}")
    want_shape = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(x.shape) != want_shape:
        raise ValueError(f"{fn}: {name} must have shape {want_shape}, got {tuple(x.shape)}")
    want_dtype = dtype_name(ref) if dtype is None else dtype
    if dtype_name(x) != want_dtype:
        raise TypeError(f"{fn}: {name} must have dtype {want_dtype}, got {dtype_name(x)}")
    if device_of(x) != device_of(ref):
        raise ValueError(f"{fn}: {name} must be on {device_of(ref)} like {ref_name}, got {device_of(x)}")


def check_block_size(value, name: str, *, fn: str) -> int:
    """A block size must be a positive int (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{fn}: {name} must be positive, got {value}")
    return int(value)


def resolve_softmax_scale(softmax_scale, D: int, *, fn: str) -> float:
    """``None`` means 1/sqrt(D); otherwise a finite real number."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"{fn}: softmax_scale must be a real number or None, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: softmax_scale must be finite, got {scale}")
    return scale


def check_flag(value, name: str, *, fn: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return value
