"""What the Triton backend takes, and whether it can run here: declared once, importing nothing heavy.

* ``CAPABILITIES``: {"triton": Capability(...)}, the table the registry, the test harness and the
  backend's own input checks (``attention.check_inputs``) read.
* ``interpreter_on()``: the one answer to "do the Triton kernels run under Triton's interpreter?".
* ``use_interpreter_without_gpu()``: sets ``TRITON_INTERPRET=1`` when there is no CUDA GPU. Triton reads
  the variable when a kernel is decorated, so this must run before ``flash_attention_triton`` (or any
  other module with ``@triton.jit`` kernels) is imported: tests/conftest.py, notebooks/_setup.py and
  the lab grader call it first.
* ``unavailable_reason(device)``: the probe, None when the backend can run on ``device`` here.

This module imports neither torch nor triton at import time (only inside the functions).
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from flash_attention_py.capabilities import Capability, torch_cuda_reason

__all__ = ["CAPABILITIES", "BF16_CPU_REASON", "interpreter_on", "use_interpreter_without_gpu",
           "unavailable_reason"]

# bf16 is left out on the CPU: the interpreter's tl.dot on bf16 is silently wrong on triton 3.7 (it returns
# garbage without an error), so it is refused, not computed.
BF16_CPU_REASON = ("bfloat16 is not supported on CPU tensors: Triton's interpreter computes tl.dot "
                   "on bfloat16 wrongly without raising (triton 3.7); use float16 or float32 on the CPU, "
                   "or a CUDA GPU for bfloat16")

_KERNELS = __name__.rsplit(".", 1)[0] + ".forward_kernel"


def interpreter_on() -> bool:
    """True when the Triton kernels run under Triton's interpreter (on CPU tensors).

    Once the kernels are imported this is what they were decorated as (Triton reads ``TRITON_INTERPRET``
    when a kernel is defined); before that, what they would be decorated as now. False without triton.
    """
    try:
        import triton
    except ImportError:
        return False
    kernels = sys.modules.get(_KERNELS)
    if kernels is not None:
        return not isinstance(kernels.attn_fwd_kernel, triton.runtime.jit.JITFunction)
    return bool(triton.knobs.runtime.interpret)


def _has_cuda_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # torch missing or a broken driver: no GPU to use
        return False


def use_interpreter_without_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no CUDA GPU (a value already set is kept).

    Call it before any module with ``@triton.jit`` kernels is imported. Returns whether a CUDA GPU is there.
    """
    has_gpu = _has_cuda_gpu()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return has_gpu


def unavailable_reason(device: str = "cpu") -> Optional[str]:
    """None if the Triton backend can run on ``device`` ('cpu' or 'cuda') here, else a sentence saying why not."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if device.split(":")[0] == "cuda":
        return torch_cuda_reason()
    if not interpreter_on():
        return "Triton runs on the CPU only under its interpreter: set TRITON_INTERPRET=1 before importing it"
    return None


CAPABILITIES = {
    "triton": Capability(
        "triton",
        dtypes={"cpu": ("float16", "float32"), "cuda": ("float16", "bfloat16", "float32")},
        backward=True,
        max_head_dim=256,
        tf32_on=(),  # float32 dots run as 3xTF32 on the GPU (float32-level accuracy): compared as float32
        slow_on_cpu=True,
        variants=("causal", "window", "gqa", "dropout"),  # tests/test_triton_variants.py
        probe=unavailable_reason,
    ),
}
