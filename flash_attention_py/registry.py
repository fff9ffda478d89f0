"""The one backend registry. The test harness and the benchmark read it; adding a backend is one entry.

Each :class:`Backend` says what to call, which array type it takes, on which devices it runs,
which dtypes it claims there, whether it has a backward, which head dims it takes, and how to
tell whether it can run here (``unavailable_reason`` returns why not, or None).

    >>> from flash_attention_py.registry import BACKENDS, get_backend
    >>> [b.name for b in BACKENDS]                       # doctest: +SKIP
    >>> b = get_backend("numpy-v2"); b.unavailable_reason("cpu") is None
    True
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["Backend", "BACKENDS", "get_backend", "backend_names", "cuda_unavailable_reason"]


@dataclass(frozen=True)
class Backend:
    name: str
    rung: str  # 'numpy', 'torch', 'triton', 'cuda', 'anchor'
    description: str
    target: str  # "module:function" of the forward
    array: str  # 'numpy' or 'torch'
    dtypes: dict  # device ('cpu'/'cuda') -> tuple of dtype names it claims there
    backward: bool
    kwargs: dict = field(default_factory=dict)  # fixed keyword arguments (loop_order=..., kernel=...)
    backward_target: Optional[str] = None  # NumPy: separate backward function; torch: autograd
    head_dims: Optional[tuple] = None  # the only D it takes, or None for any D up to max_head_dim
    max_head_dim: Optional[int] = None
    tf32_on: tuple = ()  # devices where its float32 matmuls run in tf32
    slow_on_cpu: bool = False  # e.g. the Triton interpreter: the harness gives it the short case list
    probe: Optional[Callable[[str], Optional[str]]] = None  # device -> reason it cannot run, or None

    # ---------------------------------------------------------------- what it supports
    @property
    def devices(self) -> tuple:
        return tuple(self.dtypes)

    def supports_head_dim(self, D: int) -> bool:
        if self.head_dims is not None and D not in self.head_dims:
            return False
        return self.max_head_dim is None or D <= self.max_head_dim

    def unavailable_reason(self, device: str = "cpu") -> Optional[str]:
        """None if the backend can run on ``device`` here, else a sentence saying why not."""
        dev = device.split(":")[0]
        if dev not in self.dtypes:
            return f"{self.name} does not run on {dev} (it runs on {', '.join(self.devices)})"
        if self.probe is not None:
            return self.probe(dev)
        return None

    # ---------------------------------------------------------------- calling it
    def load(self) -> Callable:
        module, fn = self.target.split(":")
        return getattr(importlib.import_module(module), fn)

    def forward(self, q, k, v, *, causal=False, softmax_scale=None, return_lse=False, **extra):
        return self.load()(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                           **{**self.kwargs, **extra})

    def numpy_backward(self, q, k, v, o, lse, do, *, causal=False, softmax_scale=None):
        """NumPy backends: their separate backward function, with the entry's block sizes -> (dq, dk, dv)."""
        module, fn = self.backward_target.split(":")
        bwd = getattr(importlib.import_module(module), fn)
        block = {key: val for key, val in self.kwargs.items() if key in ("block_m", "block_n")}
        return bwd(q, k, v, o, lse, do, causal=causal, softmax_scale=softmax_scale, **block)

    def forward_backward(self, q, k, v, do, *, causal=False, softmax_scale=None):
        """Run forward then backward with upstream gradient ``do``: returns (o, lse, dq, dk, dv)."""
        if not self.backward:
            raise NotImplementedError(f"{self.name} has no backward")
        if self.array == "numpy":
            o, lse = self.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)
            dq, dk, dv = self.numpy_backward(q, k, v, o, lse, do, causal=causal, softmax_scale=softmax_scale)
            return o, lse, dq, dk, dv
        q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
        o, lse = self.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)
        o.backward(do)
        return o.detach(), lse, q.grad, k.grad, v.grad


# -------------------------------------------------------------------- probes
def _torch_cuda_reason() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def _torch_probe(device: str) -> Optional[str]:
    return _torch_cuda_reason() if device == "cuda" else None


def _triton_probe(device: str) -> Optional[str]:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device == "cuda":
        return _torch_cuda_reason()
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton runs on the CPU only under its interpreter: set TRITON_INTERPRET=1 before importing it"
    return None


def cuda_unavailable_reason() -> Optional[str]:
    """Why the CuPy/CUDA backend cannot launch here, or None."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed"
    try:
        if not cupy.cuda.is_available():
            return "no CUDA GPU: cupy.cuda.is_available() is False (CuPy imports but cannot launch)"
    except Exception as exc:  # a broken driver install raises here
        return f"CuPy cannot reach a GPU: {exc}"
    return _torch_cuda_reason()


def _cuda_probe(device: str) -> Optional[str]:
    return cuda_unavailable_reason()


def _cuda_tiled_probe(device: str) -> Optional[str]:
    # a student release (notebooks/labs/release.py) ships lab 3's template as tiled.cu: its bodies are the lab
    tiled = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flash_attention_cuda", "kernels", "tiled.cu")
    if os.path.isfile(tiled):
        with open(tiled) as f:
            if "is not written yet" in f.read():
                return "student release: tiled.cu is lab 3's template"
    return cuda_unavailable_reason()


def _cuda_hopper_probe(device: str) -> Optional[str]:
    reason = cuda_unavailable_reason()
    if reason is None:
        import torch

        cc = torch.cuda.get_device_capability()
        if cc != (9, 0):
            reason = f"needs a Hopper GPU (compute capability 9.0, sm_90a); this one has {cc[0]}.{cc[1]}"
    return reason


_NP = ("float16", "float32", "float64")
_TORCH = ("float16", "bfloat16", "float32", "float64")

BACKENDS = (
    Backend(
        name="naive-torch", rung="anchor",
        description="standard attention: materialise S = QK^T and softmax(S) in the input dtype",
        target="flash_attention_py.reference:attention_naive", array="torch",
        dtypes={"cpu": _TORCH, "cuda": _TORCH}, backward=True, probe=_torch_probe,
    ),
    Backend(
        name="numpy-v1", rung="numpy",
        description="NumPy, FlashAttention-1 loop order (outer K/V, inner Q; O, l, m in HBM)",
        target="flash_attention_py.numpy_flash:flash_attn_numpy", array="numpy",
        kwargs={"loop_order": "v1", "block_m": 32, "block_n": 32},
        backward_target="flash_attention_py.numpy_flash:flash_attn_numpy_backward",
        dtypes={"cpu": _NP}, backward=True,
    ),
    Backend(
        name="numpy-v2", rung="numpy",
        description="NumPy, FlashAttention-2 loop order (outer Q, inner K/V; causal block skipping)",
        target="flash_attention_py.numpy_flash:flash_attn_numpy", array="numpy",
        kwargs={"loop_order": "v2", "block_m": 64, "block_n": 32},
        backward_target="flash_attention_py.numpy_flash:flash_attn_numpy_backward",
        dtypes={"cpu": _NP}, backward=True,
    ),
    Backend(
        name="torch-split", rung="torch",
        description="PyTorch, torch.split blocks with in-place rescaling (tiny-flash-attention's v1 loop)",
        target="flash_attention_py.torch_split:flash_attn_torch", array="torch",
        kwargs={"block_size": 32},
        dtypes={"cpu": _TORCH, "cuda": _TORCH}, backward=True, probe=_torch_probe,
    ),
    Backend(
        name="triton", rung="triton",
        description="Triton kernel, FlashAttention-2 order (GPU, or CPU through TRITON_INTERPRET=1)",
        target="flash_attention_triton:flash_attn_triton", array="torch",
        dtypes={"cpu": ("float32", "float16"), "cuda": ("float16", "bfloat16", "float32")},
        backward=True, max_head_dim=256, tf32_on=(), slow_on_cpu=True, probe=_triton_probe,
    ),
    Backend(
        name="cuda-naive", rung="cuda",
        description="CUDA through CuPy: one thread per query row, K/V tiles in shared memory (fp32)",
        target="flash_attention_cuda:flash_attn_cuda", array="torch", kwargs={"kernel": "naive"},
        dtypes={"cuda": ("float32",)}, backward=True, max_head_dim=128, probe=_cuda_probe,
    ),
    Backend(
        name="cuda-tiled", rung="cuda",
        description="CUDA through CuPy: block-cooperative tiles, warp-shuffle softmax (fp32)",
        target="flash_attention_cuda:flash_attn_cuda", array="torch", kwargs={"kernel": "tiled"},
        dtypes={"cuda": ("float32",)}, backward=True, max_head_dim=128, probe=_cuda_tiled_probe,
    ),
    Backend(
        name="cuda-mma", rung="cuda",
        description="CUDA through CuPy: tensor cores (mma.sync m16n8k16, ldmatrix, cp.async)",
        target="flash_attention_cuda:flash_attn_cuda", array="torch", kwargs={"kernel": "mma"},
        dtypes={"cuda": ("float16", "bfloat16")}, backward=True, head_dims=(64, 128), probe=_cuda_probe,
    ),
    Backend(
        name="cuda-wgmma", rung="cuda",
        description="CUDA through CuPy: Hopper tensor cores (wgmma.mma_async, sm_90a)",
        target="flash_attention_cuda:flash_attn_cuda", array="torch", kwargs={"kernel": "wgmma"},
        dtypes={"cuda": ("float16", "bfloat16")}, backward=True, head_dims=(64, 128), probe=_cuda_hopper_probe,
    ),
)


def backend_names() -> list:
    return [b.name for b in BACKENDS]


def get_backend(name: str) -> Backend:
    for b in BACKENDS:
        if b.name == name:
            return b
    raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(backend_names())}")
