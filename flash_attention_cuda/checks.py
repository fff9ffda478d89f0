"""The input checks of the CUDA rungs' public functions, read from the capability tables (capabilities.py).

``check_forward`` / ``check_backward`` run every check of a call (shapes and dtypes, the kernel and what it takes,
the variants, the grid and the device) before anything is allocated or launched, and return what the launch
needs; ``check_config`` checks a tile config passed in by a sweep. ``RUNGS`` is the forward capability table
keyed by kernel name ('naive', 'tiled', 'mma', 'wgmma', 'wgmma-ws').
"""
from __future__ import annotations

from flash_attention_py.masks import CAUSAL, FULL
from flash_attention_py.validation import (cached_check, check_dropout, check_flag, check_qkv, check_same_as,
                                           check_scale_range, device_of, dtype_name, resolve_lazy,
                                           resolve_softmax_scale, resolve_window)

from . import runtime
from .capabilities import (BACKWARD, CAPABILITIES, HOPPER_FORWARD, KERNEL_OF, TENSOR_CORE_BACKWARDS, auto_backward,
                           cc_text, has_mma, is_hopper)

RUNGS = {KERNEL_OF[name]: cap for name, cap in CAPABILITIES.items()}  # 'naive', 'tiled', 'mma', 'wgmma', 'wgmma-ws'
KERNELS = tuple(RUNGS)
BACKWARD_KERNELS = ("auto",) + tuple(BACKWARD)  # ('auto', 'wgmma', 'wgmma-fused', 'wgmma-ws', 'mma', 'mma-fused', 'tiled')
MAX_GRID_Y = 65535  # gridDim.y limit: the grids are (query or key blocks, B * H)
# the fields of a forward tile config, per kernel that takes one (launch_specs.MMA_CONFIGS, WGMMA_CONFIGS)
CONFIG_FIELDS = {"mma": ("Bc", "warps", "m16 tiles per warp"), "wgmma": ("Bc", "warpgroups"),
                 "wgmma-ws": ("Bc", "consumer warpgroups", "stages")}


def supported_text() -> str:
    """'cuda-naive: float32, D <= 128; ...; cuda-wgmma: float16/bfloat16, D <= 128' for error messages."""
    return "; ".join(cap.text() for cap in RUNGS.values())


def check_grid_and_device(q, dims, fn: str) -> None:
    """B * H fits the grid's y dimension, and q lives on a CUDA device."""
    if dims.B * dims.H > MAX_GRID_Y:
        raise ValueError(f"{fn}: q has B * H = {dims.B} * {dims.H} = {dims.B * dims.H} (shape {tuple(q.shape)}); "
                         f"the kernels launch one grid row per (batch, head) and a CUDA grid has at most {MAX_GRID_Y} "
                         f"rows: expected B * H <= {MAX_GRID_Y} (split the batch)")
    dev = device_of(q)
    if not dev.startswith("cuda"):
        raise ValueError(f"{fn}: q, k and v must be on a CUDA device, got {dev}; move them with .cuda()")


def _resolve_kernel(q, dims, kernel, fn: str) -> str:
    """The kernel name, then the (kernel, dtype, D) combination; 'auto' -> wgmma-ws (Hopper) / mma / tiled."""
    if not isinstance(kernel, str):
        raise TypeError(f"{fn}: kernel must be a str, got {type(kernel).__name__} {kernel!r}")
    if kernel != "auto" and kernel not in RUNGS:
        raise ValueError(f"{fn}: unknown kernel {kernel!r}; expected 'auto' or one of {', '.join(KERNELS)}")
    dt = dtype_name(q)
    if kernel == "auto":  # tensor cores where they apply (wgmma-ws on a Hopper GPU, else mma), else tiled
        kernel = "mma" if RUNGS["mma"].supports(dt, dims.D) else "tiled"
        if kernel == "mma" and device_of(q).startswith("cuda") and is_hopper(runtime.device_cc(q)):
            kernel = HOPPER_FORWARD
        if not RUNGS[kernel].supports(dt, dims.D):
            raise ValueError(f"{fn}: no kernel takes dtype {dt} with head dim D = {dims.D}; "
                             f"supported: {supported_text()}")
    if not RUNGS[kernel].supports(dt, dims.D):
        raise ValueError(f"{fn}: kernel {kernel!r} does not support dtype {dt} with head dim D = {dims.D}; "
                         f"it supports {RUNGS[kernel].text()} (all kernels: {supported_text()})")
    return kernel


def _variants_used(window, dims, k, dropout) -> dict:
    """The variants a call uses beyond the causal mask -> {variant: what the call passed, for messages}."""
    used = {}
    if tuple(window) not in (FULL, CAUSAL):
        used["window"] = f"window_size {tuple(window)}"
    if int(k.shape[1]) != dims.H:
        used["gqa"] = f"grouped-query K/V heads (q has {dims.H} heads, k and v {int(k.shape[1])})"
    if dropout[0] > 0.0:
        used["dropout"] = f"dropout_p = {dropout[0]:.6g}"
    return used


def _check_variants(cap, kernel: str, used: dict, tables: dict, fn: str) -> None:
    """Refuse the variants that kernel ``kernel`` (Capability ``cap``) does not take, naming those that do."""
    missing = [text for name, text in used.items() if name not in cap.variants]
    if missing:
        able = [name for name, c in tables.items() if all(u in c.variants for u in used)]
        raise ValueError(f"{fn}: kernel {kernel!r} does not take {'; '.join(missing)} (it takes "
                         f"{', '.join(cap.variants)}); the variants need kernel "
                         f"{' or '.join(repr(a) for a in able)} ({'; '.join(tables[a].text() for a in able)})")


def check_forward(q, k, v, *, causal, softmax_scale, kernel, return_lse, fn: str, window_size=FULL, dropout_p=0.0,
                   dropout_seed=None):
    """Every check of a forward call -> (q, k, v without lazy conj/neg views, softmax_scale, resolved kernel,
    window (left, right), dropout (p, seed))."""
    window = resolve_window(causal, window_size, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    dropout = check_dropout(dropout_p, dropout_seed, fn=fn)
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), gqa=True)
    kernel = _resolve_kernel(q, dims, kernel, fn)
    _check_variants(RUNGS[kernel], kernel, _variants_used(window, dims, k, dropout), RUNGS, fn)
    check_grid_and_device(q, dims, fn)
    if RUNGS[kernel].hopper_only and not is_hopper(runtime.device_cc(q)):
        raise ValueError(f"{fn}: kernel {kernel!r} runs only on compute capability 9.0 (Hopper: H100/H200, "
                         f"sm_90a); this GPU has {cc_text(runtime.device_cc(q))}. Use kernel='mma'")
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: the kernels read raw memory
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    check_scale_range(q, k, scale, fn=fn)  # the kernels compute the scores in float32
    return q, k, v, scale, kernel, window, dropout


# The checked plan of a forward call, keyed by everything check_forward reads (validation.check_cache_key): a
# training loop calls with the same shapes, dtypes, devices and arguments every step, and pays the checks once (the
# launch's host time is what decides short calls: docs/performance.md §7).
_PLANS: dict = {}


def check_forward_cached(q, k, v, *, fn: str, **kw):
    """check_forward, answered from a cache of earlier checked calls with the same key
    (``validation.cached_check``): the same result, and the same errors (a call that fails is never cached)."""
    return cached_check(check_forward, _PLANS, q, k, v, fn=fn, **kw)


def check_backward(q, k, v, o, lse, do, *, causal, softmax_scale, kernel, fn: str, window_size=FULL, dropout_p=0.0,
                    dropout_seed=None):
    """Every check of a backward call -> (q, k, v, o, do without lazy views, softmax_scale, the backward kernel
    ('wgmma', 'wgmma-fused', 'wgmma-ws', 'mma', 'mma-fused' or 'tiled'; 'auto' resolved by
    capabilities.auto_backward), window, dropout)."""
    window = resolve_window(causal, window_size, fn=fn)
    dropout = check_dropout(dropout_p, dropout_seed, fn=fn)
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), gqa=True)
    q, k, v, o, do = (resolve_lazy(x) for x in (q, k, v, o, do))  # conj/neg views: the kernels read raw memory
    for name, x in (("o", o), ("do", do)):
        check_same_as(x, name, q, "q", fn=fn)
    check_same_as(lse, "lse", q, "q", fn=fn, shape=(dims.B, dims.H, dims.Nq), dtype="float32")
    if not isinstance(kernel, str) or kernel not in BACKWARD_KERNELS:
        raise ValueError(f"{fn}: kernel must be one of {', '.join(BACKWARD_KERNELS)}, got {kernel!r}")
    used = _variants_used(window, dims, k, dropout)
    if kernel == "tiled":  # refused before the device is asked (kernel 'auto' is resolved below)
        _check_variants(BACKWARD["tiled"], kernel, used, BACKWARD, fn)
    widest = max(BACKWARD.values(), key=lambda cap: cap.max_head_dim)
    if not widest.supports_head_dim(dims.D):
        raise ValueError(f"{fn}: the backward kernels take {widest.head_dim_text()}, got D = {dims.D}")
    check_grid_and_device(q, dims, fn)
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    cc, dtype = runtime.device_cc(q), dtype_name(q)
    if kernel in TENSOR_CORE_BACKWARDS:
        cap = BACKWARD[kernel]
        able = is_hopper(cc) if cap.hopper_only else has_mma(cc)
        if not (cap.supports(dtype, dims.D) and able):
            need = "9.0 (Hopper: H100/H200, sm_90a)" if cap.hopper_only else ">= 8.0"
            raise ValueError(f"{fn}: kernel {kernel!r} takes {'/'.join(cap.dtypes['cuda'])} with "
                             f"{cap.head_dim_text()} on compute capability {need}; got {dtype}, D = {dims.D}, "
                             f"compute capability {cc_text(cc)}. Use kernel='auto'")
    elif kernel == "auto":
        kernel = auto_backward(dtype, dims.D, cc)
        if not BACKWARD[kernel].supports(dtype, dims.D):  # e.g. float32 with D > 128: only 'tiled' takes float32
            raise ValueError(f"{fn}: no backward kernel takes dtype {dtype} with head dim D = {dims.D} on compute "
                             f"capability {cc_text(cc)}; the backward kernels take: "
                             + "; ".join(f"{name}: {cap.text()}" for name, cap in BACKWARD.items()))
    _check_variants(BACKWARD[kernel], kernel, used, BACKWARD, fn)
    return q, k, v, o, do, scale, kernel, window, dropout


def check_config(kernel: str, config, fn: str) -> None:
    """A tile config for ``kernel`` ('mma', 'wgmma' or 'wgmma-ws'): a tuple of positive ints, one per field."""
    if kernel not in CONFIG_FIELDS:
        raise ValueError(f"{fn}: kernel must be one of {', '.join(CONFIG_FIELDS)} (the rungs with tile configs), "
                         f"got {kernel!r}")
    fields = CONFIG_FIELDS[kernel]
    if not (isinstance(config, tuple) and len(config) == len(fields)
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in config)):
        raise ValueError(f"{fn}: config for kernel {kernel!r} must be a tuple of {len(fields)} positive ints "
                         f"({', '.join(fields)}), got {config!r}")
