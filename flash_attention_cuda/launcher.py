"""The public functions of the CUDA rung and their input checks.

    flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False,
                    window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    flash_attn_cuda_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, kernel="auto",
                             window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    forward_with_config(q, k, v, *, kernel, config, causal=False, softmax_scale=None, return_lse=False,
                        window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    seed_nomax_forward(q, k, v, *, softmax_scale=None)

The variants (a window, grouped-query K/V heads, dropout) run on the tensor-core kernels (mma, wgmma and the
mma backward); the fp32 kernels take the causal mask only and refuse the others, as capabilities.py says.

What each kernel takes is ``capabilities.py`` (``RUNGS`` below is that table keyed by kernel name, and
the checks here read it); how each kernel is launched is ``launch_specs.py`` (the tile configs, and
``run_backward(..., config=...)`` for the backward's sweep); compiling, streams and pointers are
``runtime.py``. For torch tensors that need gradients, and under ``torch.compile``, the forward runs as the
custom op ``torch.ops.fa_ladder.cuda_fwd`` (``library_ops.py``), differentiated by ``cuda_bwd``.
"""
from __future__ import annotations

from flash_attention_py.masks import CAUSAL, FULL, with_mask_diagram
from flash_attention_py.validation import (array_kind, check_dropout, check_flag, check_qkv, check_same_as,
                                           check_scale_range, device_of, dtype_name, resolve_lazy,
                                           resolve_softmax_scale, resolve_window)

from . import launch_specs, runtime
from .capabilities import BACKWARD, CAPABILITIES, KERNEL_OF, cc_text, is_hopper, mma_backward_applies
from .launch_specs import MMA_CONFIGS, WGMMA_CONFIGS  # noqa: F401  (re-exported)
from .runtime import HEADERS, HOPPER_SOURCES, KERNEL_DIR, SOURCES, read_source  # noqa: F401  (re-exported)

__all__ = ["flash_attn_cuda", "flash_attn_cuda_backward", "forward_with_config", "seed_nomax_forward", "KERNELS",
           "RUNGS", "SOURCES", "supported_text", "MMA_CONFIGS", "WGMMA_CONFIGS"]

FN = "flash_attn_cuda"


def __getattr__(name):
    if name == "MMA_BACKWARD_CONFIG":  # read it where the launches read it (a sweep may rebind it there)
        return launch_specs.MMA_BACKWARD_CONFIG
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------ checks
RUNGS = {KERNEL_OF[name]: cap for name, cap in CAPABILITIES.items()}  # 'naive', 'tiled', 'mma', 'wgmma'
KERNELS = tuple(RUNGS)
BACKWARD_KERNELS = ("auto",) + tuple(BACKWARD)  # ('auto', 'mma', 'tiled')
MAX_GRID_Y = 65535  # gridDim.y limit: the grids are (query or key blocks, B * H)
# the fields of a forward tile config, per kernel that takes one (launch_specs.MMA_CONFIGS, WGMMA_CONFIGS)
CONFIG_FIELDS = {"mma": ("Bc", "warps", "m16 tiles per warp"), "wgmma": ("Bc", "warpgroups")}


def supported_text() -> str:
    """'cuda-naive: float32, D <= 128; ...; cuda-wgmma: float16/bfloat16, D in {64, 128}' for error messages."""
    return "; ".join(cap.text() for cap in RUNGS.values())


def _check_grid_and_device(q, dims, fn: str) -> None:
    """B * H fits the grid's y dimension, and q lives on a CUDA device."""
    if dims.B * dims.H > MAX_GRID_Y:
        raise ValueError(f"{fn}: q has B * H = {dims.B} * {dims.H} = {dims.B * dims.H} (shape {tuple(q.shape)}); "
                         f"the kernels launch one grid row per (batch, head) and a CUDA grid has at most {MAX_GRID_Y} "
                         f"rows: expected B * H <= {MAX_GRID_Y} (split the batch)")
    dev = device_of(q)
    if not dev.startswith("cuda"):
        raise ValueError(f"{fn}: q, k and v must be on a CUDA device, got {dev}; move them with .cuda()")


def _resolve_kernel(q, dims, kernel, fn: str) -> str:
    """The kernel name, then the (kernel, dtype, D) combination; 'auto' -> wgmma (Hopper) / mma / tiled."""
    if not isinstance(kernel, str):
        raise TypeError(f"{fn}: kernel must be a str, got {type(kernel).__name__} {kernel!r}")
    if kernel != "auto" and kernel not in RUNGS:
        raise ValueError(f"{fn}: unknown kernel {kernel!r}; expected 'auto' or one of {', '.join(KERNELS)}")
    dt = dtype_name(q)
    if kernel == "auto":  # tensor cores where they apply (wgmma on a Hopper GPU, else mma), else tiled
        kernel = "mma" if RUNGS["mma"].supports(dt, dims.D) else "tiled"
        if kernel == "mma" and device_of(q).startswith("cuda") and is_hopper(runtime.device_cc(q)):
            kernel = "wgmma"
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
                         f"{' or '.join(repr(a) for a in able)} with float16/bfloat16 and D in {{64, 128}}")


def _check_forward(q, k, v, *, causal, softmax_scale, kernel, return_lse, fn: str, window_size=FULL, dropout_p=0.0,
                   dropout_seed=None):
    """Every check of a forward call -> (q, k, v without lazy conj/neg views, softmax_scale, resolved kernel,
    window (left, right), dropout (p, seed))."""
    window = resolve_window(causal, window_size, fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    dropout = check_dropout(dropout_p, dropout_seed, fn=fn)
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), gqa=True)
    kernel = _resolve_kernel(q, dims, kernel, fn)
    _check_variants(RUNGS[kernel], kernel, _variants_used(window, dims, k, dropout), RUNGS, fn)
    _check_grid_and_device(q, dims, fn)
    if RUNGS[kernel].hopper_only and not is_hopper(runtime.device_cc(q)):
        raise ValueError(f"{fn}: kernel {kernel!r} runs only on compute capability 9.0 (Hopper: H100/H200, "
                         f"sm_90a); this GPU has {cc_text(runtime.device_cc(q))}. Use kernel='mma'")
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: the kernels read raw memory
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    check_scale_range(q, k, scale, fn=fn)  # the kernels compute the scores in float32
    return q, k, v, scale, kernel, window, dropout


def _check_backward(q, k, v, o, lse, do, *, causal, softmax_scale, kernel, fn: str, window_size=FULL, dropout_p=0.0,
                    dropout_seed=None):
    """Every check of a backward call -> (q, k, v, o, do without lazy views, softmax_scale, 'mma' or 'tiled',
    window, dropout)."""
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
    if not BACKWARD["tiled"].supports_head_dim(dims.D):
        raise ValueError(f"{fn}: the backward kernels take {BACKWARD['tiled'].head_dim_text()}, got D = {dims.D}")
    _check_grid_and_device(q, dims, fn)
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    mma_ok = mma_backward_applies(dtype_name(q), dims.D, runtime.device_cc(q))
    if kernel == "mma" and not mma_ok:
        mma = BACKWARD["mma"]
        raise ValueError(f"{fn}: kernel 'mma' takes {'/'.join(mma.dtypes['cuda'])} with {mma.head_dim_text()} on "
                         f"compute capability >= 8.0; got {dtype_name(q)}, D = {dims.D}, compute capability "
                         f"{cc_text(runtime.device_cc(q))}. Use kernel='tiled'")
    kernel = "mma" if kernel != "tiled" and mma_ok else "tiled"
    _check_variants(BACKWARD[kernel], kernel, used, BACKWARD, fn)
    return q, k, v, o, do, scale, kernel, window, dropout


def _check_config(kernel: str, config, fn: str) -> None:
    """A tile config for ``kernel`` ('mma' or 'wgmma'): a tuple of positive ints, one per field."""
    if kernel not in CONFIG_FIELDS:
        raise ValueError(f"{fn}: kernel must be one of {', '.join(CONFIG_FIELDS)} (the rungs with tile configs), "
                         f"got {kernel!r}")
    fields = CONFIG_FIELDS[kernel]
    if not (isinstance(config, tuple) and len(config) == len(fields)
            and all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in config)):
        raise ValueError(f"{fn}: config for kernel {kernel!r} must be a tuple of {len(fields)} positive ints "
                         f"({', '.join(fields)}), got {config!r}")


# ------------------------------------------------------------------------------------ public
@with_mask_diagram
def flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False,
                    window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """FlashAttention forward by a raw CUDA kernel launched through CuPy.

    Arguments
        q: (B, Hq, Nq, D), k and v: (B, Hk, Nk, D) (Hk = Hq without grouped-query attention): torch CUDA
           tensors (any strides; made contiguous) or CuPy arrays, one dtype.
        {MASK_DIAGRAM}

        {VARIANTS}
        The variants beyond causal (a window, Hk < Hq, dropout_p > 0) run on kernels 'mma' and 'wgmma' only
        (and the 'mma' backward); the fp32 kernels 'naive' and 'tiled' refuse them (capabilities.py).
        softmax_scale: defaults to 1/sqrt(D).
        kernel: 'naive' | 'tiled' (fp32, D <= 128) | 'mma' (fp16/bf16, D in {64, 128}) |
                'wgmma' (fp16/bf16, D in {64, 128}, Hopper only) | 'auto' (for fp16/bf16 with D 64 or 128:
                wgmma on a Hopper GPU, else mma; otherwise tiled).
        return_lse: also return lse (B, Hq, Nq) float32 = log(sum_j exp(scaled score)) of the softmax before
            dropout.

    Returns O (B, Hq, Nq, D) in q's dtype (and lse (B, Hq, Nq)). A row that sees no key gives O = 0, lse = -inf.
    Differentiable for torch tensors: the backward recomputes from the saved lse, on tensor cores for
    fp16/bf16 with D 64 or 128 (``kernels/mma_backward.cu``), else with the fp32 kernels (fp16/bf16
    upcast). D <= 128 for the backward. For torch tensors that need gradients, and under ``torch.compile``,
    the kernels run as the custom ops ``torch.ops.fa_ladder.cuda_fwd`` / ``cuda_bwd`` (``library_ops.py``), so
    ``torch.compile(fullgraph=True)`` compiles a model that calls this with no graph break.
    """
    q, k, v, scale, kernel, window, dropout = _check_forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale, kernel=kernel, return_lse=return_lse, fn=FN,
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    if array_kind(q) == "torch":
        import torch

        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
            # one graph node for torch.compile, differentiable through cuda_bwd. Eager calls that need no
            # gradient skip the op's dispatch (~30 us). Imported here, not at the top: library_ops imports
            # torch and registers the ops, and this package must import without torch (CuPy arrays, and the
            # registry reading capabilities.py).
            from .library_ops import forward_op

            o, lse = forward_op(q, k, v, causal, scale, kernel, window, dropout, fn=FN)
            return (o, lse) if return_lse else o
    o, lse = launch_specs.run_forward(q, k, v, window, scale, kernel, dropout=dropout)
    return (o, lse) if return_lse else o



def forward_with_config(q, k, v, *, kernel, config, causal=False, softmax_scale=None, return_lse=False,
                        window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """:func:`flash_attn_cuda` with an explicit tile config instead of the default one, for config sweeps.

    kernel 'mma': config = (Bc keys per K/V tile, warps per block, m16 tiles per warp), Br = 16 * tiles * warps;
    kernel 'wgmma': config = (Bc, warpgroups per block), Br = 64 * warpgroups. The defaults per head dim,
    ``launch_specs.MMA_CONFIGS`` / ``WGMMA_CONFIGS``, stay as they are. The same checks and result as
    flash_attn_cuda (window_size, GQA and dropout included): O (B, H, Nq, D) in q's dtype (and lse (B, H, Nq)
    float32); no autograd. A config the
    kernel's ``static_assert``s refuse fails to compile (RuntimeError), as does one that needs more shared
    memory than the GPU has.
    """
    fn = "forward_with_config"
    _check_config(kernel, config, fn)
    q, k, v, scale, kernel, window, dropout = _check_forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale, kernel=kernel, return_lse=return_lse, fn=fn,
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    o, lse = launch_specs.run_forward(q, k, v, window, scale, kernel, config, dropout=dropout)
    return (o, lse) if return_lse else o


def seed_nomax_forward(q, k, v, *, softmax_scale=None):
    """The seed lab kernel's arithmetic (sum of exp(S_ij), no running max), full attention, fp32.

    q (B, H, Nq, D), k and v (B, H, Nk, D) float32, D <= 128 -> O (B, H, Nq, D). For the test that shows why
    the running max matters: with scores past ~88.7 it gives inf/NaN.
    """
    fn = "seed_nomax_forward"
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), dtypes=("float32",))
    if not RUNGS["naive"].supports_head_dim(dims.D):
        raise ValueError(f"{fn}: D must be <= {RUNGS['naive'].max_head_dim}, got {dims.D}")
    _check_grid_and_device(q, dims, fn)
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    return launch_specs.run_seed_nomax(*(resolve_lazy(x) for x in (q, k, v)), scale)


@with_mask_diagram
def flash_attn_cuda_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, kernel="auto",
                             window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """dQ, dK, dV of ``O = softmax(q k^T * scale) v`` by recompute kernels, from the forward's lse.

    q (B, Hq, Nq, D), k and v (B, Hk, Nk, D), o and do (B, Hq, Nq, D), lse (B, Hq, Nq) float32 natural log
    (the forward's). The gradients come back in q's dtype, shaped like q, k, v: with grouped-query K/V heads
    (Hq % Hk == 0) dK and dV of a K/V head sum over its group of query heads. causal, window_size, dropout_p
    and dropout_seed: those of the forward call; the dropout mask is drawn again from the seed. The variants
    beyond causal need kernel 'mma' (or 'auto' where mma applies):
        {MASK_DIAGRAM}

        {VARIANTS}

    kernel: 'mma' (fp16/bf16, D in {64, 128}, compute capability >= 8.0: tensor cores, fp32 accumulation,
    kernels/mma_backward.cu) | 'tiled' (any float dtype, D <= 128: fp16/bf16 are upcast and the fp32
    kernels of kernels/backward.cu run) | 'auto' (mma where it applies, else tiled).
    """
    q, k, v, o, do, scale, kernel, window, dropout = _check_backward(
        q, k, v, o, lse, do, causal=causal, softmax_scale=softmax_scale, kernel=kernel, fn="flash_attn_cuda_backward",
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    return launch_specs.run_backward(q, k, v, o, lse, do, window, scale, kernel, dropout=dropout)
