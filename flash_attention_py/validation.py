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
    "resolve_lazy",
    "check_scale_range",
    "cached_check",
    "FLOAT_DTYPES",
]

# the floating dtypes any function of the project may be handed (each backend narrows this down)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class AttentionDims(NamedTuple):
    """Sizes of one attention call: q is (B, H, Nq, D), k and v are (B, H, Nk, D)."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int


_KINDS = {bool: "unknown", int: "unknown", float: "unknown", complex: "unknown", str: "unknown"}  # type -> kind


def array_kind(x) -> str:
    """'numpy', 'torch', 'cupy' or 'unknown' (no import of a library that is not loaded). Answered per type once
    (it runs several times in every call; plain scalars are answered up front, which also keeps torch.compile
    from tracing string operations)."""
    kind = _KINDS.get(type(x))
    if kind is None:
        mod = type(x).__module__.split(".")[0]
        kind = _KINDS[type(x)] = mod if mod in ("numpy", "torch", "cupy") else "unknown"
    return kind


def dtype_name(x) -> str:
    """'float32', 'float16', 'bfloat16', ... for a NumPy/CuPy array or a torch tensor.

    Byte order is not part of the name: a big-endian NumPy float32 array ('>f4') is 'float32'
    (NumPy computes on it as on a native one).
    """
    name = getattr(x.dtype, "name", None)
    if isinstance(name, str) and array_kind(x) != "torch":
        return name
    return str(x.dtype).replace("torch.", "")


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


def check_qkv(q, k, v, *, fn: str, kinds=("numpy", "torch"), dtypes=None, gqa: bool = False) -> AttentionDims:
    """Check q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, D) and return the sizes.

    ``fn`` names the public function in messages; ``kinds`` are the accepted
    array types; ``dtypes`` (names such as 'float16') the accepted dtypes,
    or None for any floating dtype. ``gqa=True``: k and v may have Hk heads with H % Hk == 0
    (grouped-query attention; ``gqa_group`` gives H // Hk); the returned H is q's.
    """
    arrays = {"q": q, "k": k, "v": v}
    for name, x in arrays.items():
        kind = array_kind(x)
        if kind not in kinds:
            raise TypeError(f"{fn}: {name} must be a {_kinds_text(kinds)}, got {type(x).__name__}")
        if kind == "numpy" and type(x).__name__ == "MaskedArray":
            raise TypeError(
                f"{fn}: {name} is a numpy.ma.MaskedArray; masked entries have no meaning in attention. "
                f"Expected a plain numpy.ndarray: pass {name}.filled(value) or numpy.asarray({name})"
            )
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
    if gqa and Hk >= 1 and H % Hk != 0:
        raise ValueError(f"{fn}: grouped-query attention needs q's heads to be a multiple of k's: q has H = {H} "
                         f"(shape {tuple(q.shape)}), k has Hk = {Hk} (shape {tuple(k.shape)}); expected H % Hk == 0")
    for label, a, b in (("B (batch)", B, Bk), ("H (heads)", H, H if gqa and Hk >= 1 else Hk), ("D (head dim)", D, Dk)):
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
    if dtypes is None and dt not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: q, k, v must be floating point ({', '.join(FLOAT_DTYPES)}), got {dt}")
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


def _scalar_of_0d(x):
    """The Python number held by a 0-d NumPy array or torch tensor (real dtypes only), else None."""
    kind = array_kind(x)
    if kind not in ("numpy", "torch", "cupy") or tuple(getattr(x, "shape", (None,))) != ():
        return None
    name = dtype_name(x)
    if name == "bool" or name.startswith("complex") or not (name.startswith(("float", "bfloat", "int", "uint"))):
        return None
    return x.item()


def resolve_softmax_scale(softmax_scale, D: int, *, fn: str) -> float:
    """``None`` means 1/sqrt(D); otherwise a finite real number (a 0-d array or tensor holding one is accepted)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    if not isinstance(softmax_scale, numbers.Real):  # (plain numbers first: no array checks under torch.compile)
        held = _scalar_of_0d(softmax_scale)
        if held is not None:
            softmax_scale = held
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        got = type(softmax_scale).__name__
        if hasattr(softmax_scale, "shape"):
            got += f" of shape {tuple(softmax_scale.shape)} and dtype {dtype_name(softmax_scale)}"
        raise TypeError(f"{fn}: softmax_scale must be a real number (or a 0-d real array/tensor) or None, got {got}")
    try:
        scale = float(softmax_scale)
    except OverflowError:
        raise ValueError(f"{fn}: softmax_scale must be finite, got {type(softmax_scale).__name__} "
                         f"{str(softmax_scale)[:20]}... that overflows a float64") from None
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: softmax_scale must be finite, got {scale}")
    return scale


def resolve_lazy(x):
    """A torch tensor with its lazy conjugate/negative bit applied (a plain tensor); anything else unchanged.

    ``torch.complex(a, b).conj().imag`` is a view whose values are -b but whose memory holds b, with
    ``is_neg()`` True: a kernel that reads the raw memory (Triton, CUDA) would see b. Every torch
    backend passes its inputs through here first. Differentiable: gradients flow back to ``x``.
    """
    if array_kind(x) != "torch":
        return x
    import torch

    if torch.compiler.is_compiling():  # no bool queries while tracing (a graph break); both are no-ops then
        return x.resolve_conj().resolve_neg()
    if x.is_neg() or x.is_conj():
        return x.resolve_conj().resolve_neg()
    return x


_PRECISION_LIMIT = {"float32": 2.0 ** 20, "float64": 2.0 ** 49}  # 2^(mantissa bits - 3)


def check_scale_range(q, k, scale: float, *, fn: str, compute: str = "float32") -> None:
    """Refuse a ``softmax_scale`` whose scaled scores could overflow the ``compute`` dtype.

    Every scaled score obeys |scale * q_i . k_j| <= |scale| * max_i |q_i| * max_j |k_j| (Cauchy-Schwarz,
    over the finite entries: inf/NaN entries give inf/NaN scores on purpose, as in the reference).
    When that bound times log2(e) (the kernels work in base 2) passes a quarter of the dtype's largest
    value, the call is refused with a ValueError naming softmax_scale. Checked only for |scale| > 1
    (the usual 1/sqrt(D) never needs it), so ordinary calls pay nothing; while ``torch.compile`` traces,
    only |scale| itself is checked (reading the data would break the graph).
    """
    if abs(scale) <= 1.0:
        return
    limit = _MAX[compute] / 4
    if not abs(scale) * 1.4426950408889634 <= limit:
        raise ValueError(f"{fn}: softmax_scale = {scale:g} would overflow {compute}, the dtype the scores are "
                         f"computed in: |softmax_scale| x log2(e) exceeds {limit:.3g}; expected a smaller |softmax_scale|")
    if array_kind(q) == "torch":
        import torch

        if torch.compiler.is_compiling():  # a data-dependent check would break the graph: static check only
            return

        def max_norm(x):
            x = torch.nan_to_num(x.detach(), nan=0.0, posinf=0.0, neginf=0.0)
            return float(torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64).max())
    else:
        import numpy as np

        def max_norm(x):
            if array_kind(x) == "cupy":
                import cupy

                x = cupy.asnumpy(x)
            x = np.asarray(x, dtype=np.float64)
            return float(np.sqrt(np.max(np.sum(np.where(np.isfinite(x), x, 0.0) ** 2, axis=-1))))

    with _ignore_overflow():
        bound = abs(scale) * max_norm(q) * max_norm(k) * 1.4426950408889634
    if not bound <= limit:
        raise ValueError(
            f"{fn}: softmax_scale = {scale:g} would overflow {compute}, the dtype the scores are computed in: "
            f"|softmax_scale| x max|q_i| x max|k_j| x log2(e) = {bound:.3g} exceeds {limit:.3g}; "
            f"expected a smaller |softmax_scale| (or q and k of smaller norm)"
        )
    # Precision: the backward recomputes P_ij = exp2(S_ij - lse_i) from lse. When a score is so large that one
    # unit in its last place is a sizeable fraction of 1 (in log2 units), the recomputed exponent can differ
    # from the forward's by more than 1 and exp2 blows up (inf * 0 = NaN in dS_ij). Below 2^(mantissa - 3)
    # one ulp of a score is at most 1/8.
    if compute in _PRECISION_LIMIT and not bound <= _PRECISION_LIMIT[compute]:
        raise ValueError(
            f"{fn}: softmax_scale = {scale:g} makes the scores too large to hold precisely in {compute}: "
            f"|softmax_scale| x max|q_i| x max|k_j| x log2(e) = {bound:.3g} exceeds {_PRECISION_LIMIT[compute]:.3g} "
            f"(2^{int(math.log2(_PRECISION_LIMIT[compute]))}), where one unit in the last place of a score is more "
            f"than 1/8 and the softmax's recomputation in the backward is meaningless; expected a smaller "
            f"|softmax_scale| (or q and k of smaller norm)"
        )


_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
        "float64": 1.7976931348623157e308}


class _ignore_overflow:
    def __enter__(self):
        import numpy as np

        self._old = np.seterr(over="ignore")

    def __exit__(self, *exc):
        import numpy as np

        np.seterr(**self._old)


def check_flag(value, name: str, *, fn: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def gqa_group(q, k) -> int:
    """Query heads per K/V head (1 without grouped-query attention): query head h reads K/V head h // group."""
    return int(q.shape[1]) // int(k.shape[1])


def check_window(window_size, *, fn: str) -> tuple:
    """``window_size=(left, right)``: two ints >= -1 (-1: unbounded on that side) -> (left, right)."""
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__"):
        raise TypeError(f"{fn}: window_size must be a tuple (left, right) of two ints >= -1, "
                        f"got {type(window_size).__name__} {window_size!r}")
    if len(window_size) != 2:
        raise ValueError(f"{fn}: window_size must have 2 entries (left, right), got {len(window_size)}: {window_size!r}")
    out = []
    for side, x in zip(("left", "right"), window_size):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{fn}: window_size {side} must be an int >= -1, got {type(x).__name__} {x!r}")
        if x < -1:
            raise ValueError(f"{fn}: window_size {side} must be >= -1 (-1 = unbounded), got {int(x)}")
        out.append(int(x))
    return tuple(out)


def resolve_window(causal, window_size, *, fn: str) -> tuple:
    """The (left, right) window of a call: ``window_size`` checked, and ``causal=True`` bounds the right at 0."""
    from . import masks

    check_flag(causal, "causal", fn=fn)
    if type(window_size) is tuple and window_size == masks.FULL:  # the default: nothing to check (fast path)
        return masks.CAUSAL if causal else masks.FULL
    return masks.window_for(bool(causal), check_window(window_size, fn=fn))


def check_dropout(dropout_p, dropout_seed, *, fn: str) -> tuple:
    """(p, seed): ``dropout_p`` a real in [0, 1) (0 = no dropout), ``dropout_seed`` an int in [0, 2**64),
    required when p > 0 (the keep mask is a function of the seed; see ``philox``). seed is None when p == 0."""
    from . import philox

    if dropout_seed is None and type(dropout_p) in (float, int) and dropout_p == 0:  # the default (fast path)
        return 0.0, None
    p = float(philox.check_dropout_p(dropout_p, fn=fn))
    if p == 0.0:
        if dropout_seed is not None:
            philox.check_seed(dropout_seed, fn=fn, name="dropout_seed")
        return 0.0, None
    if dropout_seed is None:
        raise ValueError(f"{fn}: dropout_p = {dropout_p!r} needs a dropout_seed (an int in [0, 2**64)): the keep "
                         f"mask is drawn from it, and the backward draws the same mask again from it")
    philox.check_seed(dropout_seed, fn=fn, name="dropout_seed")
    return p, int(dropout_seed)


def resolve_dropout(dropout_p, dropout_seed, *, fn: str):
    """The dropout of a call: None without dropout (p == 0), else (p, seed) with p the float32 value of
    ``dropout_p`` (as a Python float) and seed an int; bad values raise ``check_dropout``'s errors.

    The default (a plain 0.0 or 0 and no seed) needs no check and returns None at once, without the NumPy
    rounding of p to float32 that ``torch.compile`` could not trace without a graph break."""
    if dropout_seed is None and type(dropout_p) in (float, int) and dropout_p == 0:
        return None
    p, seed = check_dropout(dropout_p, dropout_seed, fn=fn)
    return (p, seed) if p > 0 else None


# ------------------------------------------------------------------------------------ checks, once per distinct call
# A training loop calls with the same shapes, dtypes, devices and arguments every step: cached_check pays a
# backend's checks on the first call only (at N = 1024 a kernel runs about as long as the Python around it).
CHECK_CACHE_MAX = 512


def check_cache_key(q, k, v, fn: str, kw: dict):
    """The cache key of a call, or None where the checks' answer may depend on more than its key: not three plain
    torch tensors, a torch.compile trace, lazy conj/neg views (resolved by a copy), |softmax_scale| > 1
    (check_scale_range reads the data), or an argument that cannot be hashed. Arguments enter with their types, so
    causal=1 is not the cached causal=True (the first is refused)."""
    if not (array_kind(q) == "torch" and type(q) is type(k) is type(v) and type(q).__name__ == "Tensor"):
        return None
    import torch

    if torch.compiler.is_compiling() or any(x.is_conj() or x.is_neg() for x in (q, k, v)):
        return None
    scale = kw.get("softmax_scale")
    if scale is not None and not (type(scale) in (int, float) and abs(scale) <= 1.0):
        return None
    args = tuple((name, type(val), tuple((type(e), e) for e in val) if type(val) is tuple else val)
                 for name, val in sorted(kw.items()))
    key = (fn, args) + tuple((x.shape, x.stride(), x.dtype, x.device) for x in (q, k, v))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def cached_check(check, cache: dict, q, k, v, *, fn: str, **kw):
    """``check(q, k, v, fn=fn, **kw)`` -> (q, k, v, *rest), answered from ``cache`` for a call with the key of an
    earlier one (check_cache_key): the same result, and the same errors (a call that fails is never cached). q, k,
    v come back as given on a cached call (the key excludes the lazy views that checks replace)."""
    key = check_cache_key(q, k, v, fn, kw)
    rest = cache.get(key) if key is not None else None
    if rest is None:
        q, k, v, *rest = check(q, k, v, fn=fn, **kw)
        rest = tuple(rest)
        if key is not None:
            if len(cache) >= CHECK_CACHE_MAX:
                cache.clear()
            cache[key] = rest
    return (q, k, v) + rest
