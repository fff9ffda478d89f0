"""The one backend registry. The test harness and the benchmark read it; adding a backend is one entry.

Each :class:`Backend` names a backend, says which array type it takes and binds its forward (and, for
NumPy, its separate backward) by a real import, done lazily so that importing the registry imports no
torch, triton or cupy. What a backend takes (devices, dtypes, head dims, backward, variants) and whether
it can run here are NOT written here: they are its package's capability table, read through
``Backend.capability``:

    flash_attention_py/capabilities.py       naive-torch, numpy-v1, numpy-v2, torch-split
    flash_attention_triton/capabilities.py   triton
    flash_attention_cuda/capabilities.py     cuda-naive, cuda-tiled, cuda-mma, cuda-wgmma, cuda-wgmma-ws

    >>> from flash_attention_py.registry import BACKENDS, get_backend
    >>> [b.name for b in BACKENDS]                       # doctest: +SKIP
    >>> b = get_backend("numpy-v2"); b.unavailable_reason("cpu") is None
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from flash_attention_cuda.capabilities import CAPABILITIES as _CUDA_CAPABILITIES
from flash_attention_py.capabilities import CAPABILITIES as _PY_CAPABILITIES
from flash_attention_py.capabilities import Capability
from flash_attention_triton.capabilities import CAPABILITIES as _TRITON_CAPABILITIES

__all__ = ["Backend", "BACKENDS", "CAPABILITIES", "get_backend", "backend_names"]

# every backend's capability, by registry name (one table per package, merged here)
CAPABILITIES = {**_PY_CAPABILITIES, **_TRITON_CAPABILITIES, **_CUDA_CAPABILITIES}


class _FromCapability:
    """A read-only Backend attribute that is its capability's attribute of the same name."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, backend, owner=None):
        return self if backend is None else getattr(backend.capability, self.name)


@dataclass(frozen=True)
class Backend:
    """One registry entry.

    name: the registry name (also the key of its capability table).
    rung: 'anchor', 'numpy', 'torch', 'triton' or 'cuda'.
    array: 'numpy' or 'torch', the array type its functions take and return.
    load_forward: () -> the public forward function ``f(q, k, v, *, causal, softmax_scale, return_lse, ...)``
        (imports its module when called).
    kwargs: fixed keyword arguments of this entry (loop_order=..., kernel=..., block sizes).
    load_backward: NumPy only, () -> the separate backward function; torch backends use autograd.

    What it takes (dtypes, devices, backward, head_dims, max_head_dim, tf32_on, slow_on_cpu, variants,
    supports_head_dim(D), unavailable_reason(device)) is read from ``capability``, its package's table entry.
    """

    name: str
    rung: str
    description: str
    array: str
    load_forward: Callable[[], Callable]
    kwargs: dict = field(default_factory=dict)
    load_backward: Optional[Callable[[], Callable]] = None

    # ---------------------------------------------------------------- what it supports: its capability
    @property
    def capability(self) -> Capability:
        return CAPABILITIES[self.name]

    dtypes = _FromCapability()  # device ('cpu' / 'cuda') -> the dtype names it claims there
    devices = _FromCapability()
    backward = _FromCapability()  # it has a backward (autograd, or NumPy's separate function)
    head_dims = _FromCapability()
    max_head_dim = _FromCapability()
    tf32_on = _FromCapability()
    slow_on_cpu = _FromCapability()
    variants = _FromCapability()
    supports_head_dim = _FromCapability()  # (D) -> bool
    unavailable_reason = _FromCapability()  # (device='cpu') -> None if it can run there here, else why not

    # ---------------------------------------------------------------- calling it
    def load(self) -> Callable:
        """The public forward function (importing its module)."""
        return self.load_forward()

    def forward(self, q, k, v, *, causal=False, softmax_scale=None, return_lse=False, **extra):
        return self.load_forward()(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                                   **{**self.kwargs, **extra})

    def numpy_backward(self, q, k, v, o, lse, do, *, causal=False, softmax_scale=None, **variant):
        """NumPy backends: their separate backward function, with the entry's block sizes -> (dq, dk, dv).
        ``variant``: the forward call's window_size, dropout_p, dropout_seed (the mask is drawn again)."""
        block = {key: val for key, val in self.kwargs.items() if key in ("block_m", "block_n")}
        return self.load_backward()(q, k, v, o, lse, do, causal=causal, softmax_scale=softmax_scale,
                                    **block, **variant)

    def forward_backward(self, q, k, v, do, *, causal=False, softmax_scale=None, **variant):
        """Run forward then backward with upstream gradient ``do``: returns (o, lse, dq, dk, dv).
        ``variant``: window_size, dropout_p, dropout_seed, passed to the forward and to the backward."""
        if not self.backward:
            raise NotImplementedError(f"{self.name} has no backward")
        kw = dict(causal=causal, softmax_scale=softmax_scale, **variant)
        if self.array == "numpy":
            o, lse = self.forward(q, k, v, return_lse=True, **kw)
            dq, dk, dv = self.numpy_backward(q, k, v, o, lse, do, **kw)
            return o, lse, dq, dk, dv
        q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
        o, lse = self.forward(q, k, v, return_lse=True, **kw)
        o.backward(do)
        return o.detach(), lse, q.grad, k.grad, v.grad


# -------------------------------------------------------------------- the functions, imported when first called
def _attention_naive():
    from flash_attention_py.reference import attention_naive

    return attention_naive


def _flash_attn_numpy():
    from flash_attention_py.numpy_flash import flash_attn_numpy

    return flash_attn_numpy


def _flash_attn_numpy_backward():
    from flash_attention_py.numpy_flash import flash_attn_numpy_backward

    return flash_attn_numpy_backward


def _flash_attn_torch():
    from flash_attention_py.torch_split import flash_attn_torch

    return flash_attn_torch


def _flash_attn_triton():
    from flash_attention_triton import flash_attn_triton

    return flash_attn_triton


def _flash_attn_cuda():
    from flash_attention_cuda import flash_attn_cuda

    return flash_attn_cuda


BACKENDS = (
    Backend(
        name="naive-torch", rung="anchor", array="torch", load_forward=_attention_naive,
        description="standard attention: materialise S = QK^T and softmax(S) in the input dtype",
    ),
    Backend(
        name="numpy-v1", rung="numpy", array="numpy", load_forward=_flash_attn_numpy,
        load_backward=_flash_attn_numpy_backward, kwargs={"loop_order": "v1", "block_m": 32, "block_n": 32},
        description="NumPy, FlashAttention-1 loop order (outer K/V, inner Q; O, l, m in HBM)",
    ),
    Backend(
        name="numpy-v2", rung="numpy", array="numpy", load_forward=_flash_attn_numpy,
        load_backward=_flash_attn_numpy_backward, kwargs={"loop_order": "v2", "block_m": 64, "block_n": 32},
        description="NumPy, FlashAttention-2 loop order (outer Q, inner K/V; causal block skipping)",
    ),
    Backend(
        name="torch-split", rung="torch", array="torch", load_forward=_flash_attn_torch, kwargs={"block_size": 32},
        description="PyTorch, torch.split blocks with in-place rescaling (tiny-flash-attention's v1 loop)",
    ),
    Backend(
        name="triton", rung="triton", array="torch", load_forward=_flash_attn_triton,
        description="Triton kernel, FlashAttention-2 order (GPU, or CPU through TRITON_INTERPRET=1)",
    ),
    Backend(
        name="cuda-naive", rung="cuda", array="torch", load_forward=_flash_attn_cuda, kwargs={"kernel": "naive"},
        description="CUDA through CuPy: one thread per query row, K/V tiles in shared memory (fp32)",
    ),
    Backend(
        name="cuda-tiled", rung="cuda", array="torch", load_forward=_flash_attn_cuda, kwargs={"kernel": "tiled"},
        description="CUDA through CuPy: block-cooperative tiles, warp-shuffle softmax (fp32)",
    ),
    Backend(
        name="cuda-mma", rung="cuda", array="torch", load_forward=_flash_attn_cuda, kwargs={"kernel": "mma"},
        description="CUDA through CuPy: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async)",
    ),
    Backend(
        name="cuda-wgmma", rung="cuda", array="torch", load_forward=_flash_attn_cuda, kwargs={"kernel": "wgmma"},
        description="CUDA through CuPy: Hopper tensor cores (wgmma.mma_async, sm_90a)",
    ),
    Backend(
        name="cuda-wgmma-ws", rung="cuda", array="torch", load_forward=_flash_attn_cuda,
        kwargs={"kernel": "wgmma-ws"},
        description="CUDA through CuPy: wgmma, warp-specialised (TMA producer, ping-pong consumers, setmaxnreg)",
    ),
)


def backend_names() -> list:
    return [b.name for b in BACKENDS]


def get_backend(name: str) -> Backend:
    for b in BACKENDS:
        if b.name == name:
            return b
    raise ValueError(f"get_backend: name {name!r} is an unknown backend; expected one of {', '.join(backend_names())}")
