"""What each backend takes, declared once: the :class:`Capability` record, and the table of this package's
backends (the float64-anchored naive attention, the NumPy loops and the split PyTorch loop).

Every backend package has one table like ``CAPABILITIES`` below, in a ``capabilities.py`` that imports
nothing heavy (no torch, triton or cupy at import time):

    flash_attention_py/capabilities.py       naive-torch, numpy-v1, numpy-v2, torch-split
    flash_attention_triton/capabilities.py   triton
    flash_attention_cuda/capabilities.py     cuda-naive, cuda-tiled, cuda-mma, cuda-wgmma, cuda-wgmma-ws

The registry (``registry.py``), the test harness and the benchmark read these tables; the backends' own
input checks read them too, so what a backend refuses and what the harness asks of it cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["Capability", "CAPABILITIES", "VARIANTS", "torch_cuda_reason", "torch_probe"]

# The attention variants a backend may take ('causal' today; window, GQA and dropout build on the masks)
VARIANTS = ("causal", "window", "gqa", "dropout")


@dataclass(frozen=True)
class Capability:
    """What one backend takes.

    dtypes: device ('cpu' / 'cuda') -> the dtype names it claims there (its devices are the keys).
    head_dims: the only head dims D it takes, or None for any D in 1..max_head_dim (None: no limit).
    backward: it has a backward (autograd for torch backends, a separate function for NumPy).
    hopper_only: it runs only on compute capability 9.0 (sm_90a instructions).
    variants: which of VARIANTS it takes.
    tf32_on: devices where its float32 matmuls may run in tf32 (the harness sets the same mode for the
        naive attention it compares with).
    slow_on_cpu: the harness and benchmark give it a short case list on the CPU (the Triton interpreter).
    probe: device -> why it cannot run here, or None (imports what it needs lazily).
    """

    name: str
    dtypes: dict
    backward: bool = True
    head_dims: Optional[tuple] = None
    max_head_dim: Optional[int] = None
    hopper_only: bool = False
    variants: tuple = ("causal",)
    tf32_on: tuple = ()
    slow_on_cpu: bool = False
    probe: Optional[Callable[[str], Optional[str]]] = None

    @property
    def devices(self) -> tuple:
        return tuple(self.dtypes)

    def supports_head_dim(self, D: int) -> bool:
        if self.head_dims is not None:
            return D in self.head_dims
        return self.max_head_dim is None or 1 <= D <= self.max_head_dim

    def supports(self, dtype: str, D: int, device: Optional[str] = None) -> bool:
        devices = [device.split(":")[0]] if device else list(self.dtypes)
        return any(dtype in self.dtypes.get(d, ()) for d in devices) and self.supports_head_dim(D)

    def head_dim_text(self) -> str:
        if self.head_dims is not None:
            return "D in {" + ", ".join(map(str, self.head_dims)) + "}"
        return f"D <= {self.max_head_dim}" if self.max_head_dim else "any D"

    def text(self) -> str:
        """One line for error messages: 'cuda-mma: float16/bfloat16, D in {64, 128}'."""
        dts = sorted({d for ds in self.dtypes.values() for d in ds}, key=_DTYPE_ORDER.index)
        return f"{self.name}: {'/'.join(dts)}, {self.head_dim_text()}"

    def unavailable_reason(self, device: str = "cpu") -> Optional[str]:
        """None if the backend can run on ``device`` here, else a sentence saying why not."""
        dev = device.split(":")[0]
        if dev not in self.dtypes:
            return f"{self.name} does not run on {dev} (it runs on {', '.join(self.devices)})"
        return self.probe(dev) if self.probe is not None else None


_DTYPE_ORDER = ["float16", "bfloat16", "float32", "float64"]


# -------------------------------------------------------------------- probes of this package
def torch_cuda_reason() -> Optional[str]:
    """Why torch cannot reach a CUDA GPU here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def torch_probe(device: str) -> Optional[str]:
    """A torch backend: any device torch has; 'cuda' needs a GPU."""
    return torch_cuda_reason() if device == "cuda" else None


_NP = ("float16", "float32", "float64")
_TORCH = ("float16", "bfloat16", "float32", "float64")

CAPABILITIES = {
    c.name: c
    for c in (
        Capability("naive-torch", dtypes={"cpu": _TORCH, "cuda": _TORCH}, variants=VARIANTS, probe=torch_probe),
        Capability("numpy-v1", dtypes={"cpu": _NP}, variants=VARIANTS),
        Capability("numpy-v2", dtypes={"cpu": _NP}, variants=VARIANTS),
        Capability("torch-split", dtypes={"cpu": _TORCH, "cuda": _TORCH}, variants=VARIANTS, probe=torch_probe),
    )
}
