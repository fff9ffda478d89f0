"""First cell of every notebook: ``from _setup import *``.

* puts the repository root on ``sys.path``, so the notebooks import ``flash_attention_py`` (and the
  Triton / CUDA packages) from a plain checkout, without ``pip install -e .``;
* says whether there is a CUDA GPU (``HAS_GPU``) and, when there is none, sets
  ``TRITON_INTERPRET=1`` so that Triton kernels run on the CPU under Triton's interpreter
  (it must be set before ``flash_attention_triton`` is first imported);
* ``skip(what)`` prints one line saying which GPU-only step a CPU run leaves out.
"""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or a broken driver: treat as CPU-only
        return False


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if HAS_GPU else "cpu"


def skip(what: str) -> None:
    """Say what a CPU-only run leaves out (GPU cells call this instead of failing)."""
    print(f"[skipped: no CUDA GPU] {what}")


def describe_machine() -> str:
    if HAS_GPU:
        import torch

        return f"GPU: {torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    return "CPU only: GPU cells will print what they skip; Triton runs under TRITON_INTERPRET=1"


__all__ = ["ROOT", "HAS_GPU", "DEVICE", "skip", "describe_machine"]
