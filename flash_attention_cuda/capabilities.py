"""What the CUDA rungs take, declared once, and whether they can run here.

    CAPABILITIES     'cuda-naive', 'cuda-tiled', 'cuda-mma', 'cuda-wgmma', 'cuda-wgmma-ws' -> Capability (the forward
                     kernels)
    BACKWARD         'wgmma', 'wgmma-fused', 'wgmma-ws', 'mma', 'mma-fused', 'tiled' -> Capability (the backward kernels:
                     wgmma_backward.cu (two kernels, or one with dQ summed atomically, or that one warp-specialised),
                     mma_backward.cu (two kernels, or one with dQ summed atomically), backward.cu)
    TENSOR_CORE_BACKWARDS  the backward kernels on tensor cores (every variant)
    is_hopper(cc)    the one decision "is this GPU a Hopper (compute capability 9.0, sm_90a)?"
    has_mma(cc)      compute capability >= 8.0: mma.sync m16n8k16 for fp16 and bf16
    mma_backward_applies(dtype, D, cc)   the backward's choice of tensor cores (else the fp32 kernels)
    HOPPER_FORWARD                       the forward kernel='auto' runs on a Hopper: 'wgmma-ws'
    HOPPER_BACKWARD                      the backward kernel='auto' runs on a Hopper: 'wgmma-ws'
    HOPPER_WIDE_BACKWARD                 ... and above D = 128: 'wgmma'
    auto_backward(dtype, D, cc)          what kernel='auto' runs: HOPPER_BACKWARD / HOPPER_WIDE_BACKWARD on a
                                         Hopper, else mma, else tiled
    TENSOR_CORE_HEAD_DIMS, BACKWARD_HEAD_DIMS   the head dims the tensor-core kernels are compiled for
    mma_auto_backward(D, cc)             what the mma rung's autograd runs ('mma-auto'): 'mma-fused' or 'mma'
    BACKWARD_OF      a forward rung -> the backward its autograd runs
    cuda_unavailable_reason(), probe functions for the registry and the tests

The launcher's input checks read these tables (``launcher.RUNGS`` is ``CAPABILITIES`` keyed by kernel name),
so what a kernel refuses and what the test harness asks of it come from one place. Nothing heavy is imported
here at import time: torch and cupy only inside the probes.
"""
from __future__ import annotations

import os
from typing import Optional

from flash_attention_py.capabilities import Capability, torch_cuda_reason
from flash_attention_py.validation import FLOAT_DTYPES

__all__ = ["CAPABILITIES", "BACKWARD", "BACKWARD_OF", "KERNEL_OF", "TENSOR_CORE_KERNELS", "TENSOR_CORE_BACKWARDS",
           "HOPPER",
           "TENSOR_CORE_HEAD_DIMS", "BACKWARD_HEAD_DIMS", "is_hopper",
           "has_mma", "mma_backward_applies", "HOPPER_FORWARD", "auto_backward", "mma_auto_backward", "MMA_FUSED_CCS", "MMA_FUSED_AUTO_HEAD_DIMS",
           "HOPPER_BACKWARD", "HOPPER_WIDE_BACKWARD", "cc_text",
           "cuda_unavailable_reason", "cuda_probe", "tiled_probe", "hopper_probe", "student_release_reason"]

HOPPER = (9, 0)  # wgmma.cu uses sm_90a instructions: compute capability 9.0 exactly
MMA_MIN_CC = (8, 0)  # mma.sync m16n8k16 with bf16 inputs, ldmatrix, cp.async
KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")


def _as_pair(cc) -> tuple:
    """(major, minor) from a tuple, or from CuPy's string spelling ('90' for an H100, '80' for an A100)."""
    if isinstance(cc, str):
        return (int(cc[:-1]), int(cc[-1]))
    major, minor = cc
    return (int(major), int(minor))


def is_hopper(cc) -> bool:
    """True iff compute capability ``cc`` ((9, 0) or '90') can load the sm_90a kernel (wgmma.cu)."""
    return _as_pair(cc) == HOPPER


def has_mma(cc) -> bool:
    """True iff compute capability ``cc`` has the tensor-core instructions mma.cu and mma_backward.cu use."""
    return _as_pair(cc) >= MMA_MIN_CC


def mma_backward_applies(dtype: str, D: int, cc) -> bool:
    """The tensor-core backward (mma_backward.cu) takes this dtype and head dim on compute capability ``cc``."""
    return BACKWARD["mma"].supports(dtype, D) and has_mma(cc)


def auto_backward(dtype: str, D: int, cc) -> str:
    """The backward kernel='auto' runs: on a Hopper ``HOPPER_BACKWARD`` ('wgmma-ws', the one-kernel wgmma
    backward, warp-specialised) where it takes D (<= 128), above it ``HOPPER_WIDE_BACKWARD`` ('wgmma', the
    two-kernel one); elsewhere 'mma' where the tensor-core kernels take dtype and D (D <= 256); else 'tiled' (the
    fp32 kernels, D <= 128; the caller checks that the answer takes D)."""
    if is_hopper(cc):
        for kernel in (HOPPER_BACKWARD, HOPPER_WIDE_BACKWARD):
            if BACKWARD[kernel].supports(dtype, D):
                return kernel
    return "mma" if mma_backward_applies(dtype, D, cc) else "tiled"


def cc_text(cc) -> str:
    """'9.0' for (9, 0) or '90'."""
    major, minor = _as_pair(cc)
    return f"{major}.{minor}"


# -------------------------------------------------------------------- probes
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
    return torch_cuda_reason()


def student_release_reason() -> Optional[str]:
    """A student release (notebooks/labs/release.py) ships lab 3's template as tiled.cu: its bodies are the lab."""
    tiled = os.path.join(KERNEL_DIR, "tiled.cu")
    if os.path.isfile(tiled):
        with open(tiled) as f:
            if "is not written yet" in f.read():
                return "student release: tiled.cu is lab 3's template"
    return None


def cuda_probe(device: str) -> Optional[str]:
    return cuda_unavailable_reason()


def tiled_probe(device: str) -> Optional[str]:
    return student_release_reason() or cuda_unavailable_reason()


def hopper_probe(device: str) -> Optional[str]:
    reason = cuda_unavailable_reason()
    if reason is None:
        import torch

        cc = torch.cuda.get_device_capability()
        if not is_hopper(cc):
            reason = f"needs a Hopper GPU (compute capability 9.0, sm_90a); this one has {cc_text(cc)}"
    return reason


# -------------------------------------------------------------------- the tables
_FP32 = {"cuda": ("float32",)}
_HALF = {"cuda": ("float16", "bfloat16")}
# The tensor-core kernels (mma.cu, wgmma.cu, wgmma_ws.cu and the backwards) take every variant: a window, grouped-query K/V
# heads and dropout; the fp32 kernels (naive.cu, tiled.cu, backward.cu) the causal mask only.
_ALL_VARIANTS = ("causal", "window", "gqa", "dropout")
# The head dims the tensor-core kernels are compiled for; any other D <= 256 is zero-padded to the next of them
# (launch_specs.padded_head_dim: zero columns leave Q K^T, and so P, unchanged, and give O zero columns that are
# cut off), at the cost of the padded work and one copy of q, k, v. D = 32 and 96 are not multiples of the 64
# columns a 128-byte swizzled row holds: their tiles take the 64-byte swizzle in 32-column panels (wgmma_ops.cuh,
# smem_tiles.cuh). A backward holds a tile of dK and dV in registers, 2 x 64 x D fp32 per 64 keys: at D = 256
# that is 256 registers a thread, more than a thread has. The two-kernel backwards (mma, wgmma) then split the
# columns of dK and dV over two blocks, each computing S and dP once more; the one-kernel wgmma backwards
# (wgmma-fused, wgmma-ws), whose dQ product shares the tile, stop at 128, and kernel='auto' runs the two-kernel
# wgmma backward above it on a Hopper. So the one-kernel wgmma backwards take D = 32, 64, 96 and 128 (their dQ
# product cuts K_j's 32-column panels at D = 32 and 96 as wgmma_backward.cu's DqReduce says).
TENSOR_CORE_HEAD_DIMS = (32, 64, 96, 128, 256)
WGMMA_ONE_KERNEL_HEAD_DIMS = (32, 64, 96, 128)
# ... and the one-kernel mma backward (mma_bwd_fused, FlashAttention-2's warp layout), whose 8 warps hold 128 keys of
# dK and dV, the same
MMA_ONE_KERNEL_HEAD_DIMS = (32, 64, 96, 128)
BACKWARD_HEAD_DIMS = {"wgmma": TENSOR_CORE_HEAD_DIMS, "wgmma-fused": WGMMA_ONE_KERNEL_HEAD_DIMS,
                      "wgmma-ws": WGMMA_ONE_KERNEL_HEAD_DIMS, "mma": TENSOR_CORE_HEAD_DIMS,
                      "mma-fused": MMA_ONE_KERNEL_HEAD_DIMS}
_TC_MAX_D = TENSOR_CORE_HEAD_DIMS[-1]
_BWD_MAX_D = {kernel: dims[-1] for kernel, dims in BACKWARD_HEAD_DIMS.items()}

CAPABILITIES = {
    c.name: c
    for c in (
        Capability("cuda-naive", dtypes=_FP32, max_head_dim=128, probe=cuda_probe),
        Capability("cuda-tiled", dtypes=_FP32, max_head_dim=128, probe=tiled_probe),
        Capability("cuda-mma", dtypes=_HALF, max_head_dim=_TC_MAX_D, variants=_ALL_VARIANTS,
                   probe=cuda_probe),
        Capability("cuda-wgmma", dtypes=_HALF, max_head_dim=_TC_MAX_D, hopper_only=True,
                   variants=_ALL_VARIANTS, probe=hopper_probe),
        Capability("cuda-wgmma-ws", dtypes=_HALF, max_head_dim=_TC_MAX_D, hopper_only=True,
                   variants=_ALL_VARIANTS, probe=hopper_probe),
    )
}
KERNEL_OF = {name: name[len("cuda-"):] for name in CAPABILITIES}  # 'cuda-wgmma-ws' -> 'wgmma-ws', the launcher's kernel=
TENSOR_CORE_KERNELS = ("mma", "wgmma", "wgmma-ws")  # the forward kernels on tensor cores (fp16/bf16, every variant)
TENSOR_CORE_BACKWARDS = ("wgmma", "wgmma-fused", "wgmma-ws", "mma", "mma-fused")  # the backward kernels on tensor cores (the same)

# The backward kernels: on a Hopper the wgmma kernels (wgmma_backward.cu), elsewhere the mma.sync kernels
# (mma_backward.cu, compute capability >= 8.0) where they apply, else the fp32 kernels (backward.cu; fp16/bf16/fp64
# are converted to fp32 and back).
BACKWARD = {
    "wgmma": Capability("cuda-wgmma-backward", dtypes=_HALF, max_head_dim=_BWD_MAX_D["wgmma"], hopper_only=True,
                        variants=_ALL_VARIANTS, probe=hopper_probe),
    # one kernel: dK, dV and dQ (summed over the K/V tiles with atomic adds; wgmma_backward.cu, wgmma_bwd_fused)
    "wgmma-fused": Capability("cuda-wgmma-fused-backward", dtypes=_HALF, max_head_dim=_BWD_MAX_D["wgmma-fused"],
                              hopper_only=True, variants=_ALL_VARIANTS, probe=hopper_probe),
    # the same kernel warp-specialised: a producer warpgroup's copy engine loads, two consumer warpgroups
    # (wgmma_backward.cu, wgmma_bwd_ws)
    "wgmma-ws": Capability("cuda-wgmma-ws-backward", dtypes=_HALF, max_head_dim=_BWD_MAX_D["wgmma-ws"],
                           hopper_only=True, variants=_ALL_VARIANTS, probe=hopper_probe),
    "mma": Capability("cuda-mma-backward", dtypes=_HALF, max_head_dim=_BWD_MAX_D["mma"],
                      variants=_ALL_VARIANTS, probe=cuda_probe),
    # one kernel: mma_bwd_dkdv's blocks also add dQ_i += dS_ij K_j atomically (mma_backward.cu, mma_bwd_fused)
    "mma-fused": Capability("cuda-mma-fused-backward", dtypes=_HALF, max_head_dim=_BWD_MAX_D["mma-fused"],
                            variants=_ALL_VARIANTS, probe=cuda_probe),
    "tiled": Capability("cuda-tiled-backward", dtypes={"cuda": FLOAT_DTYPES}, max_head_dim=128, probe=cuda_probe),
}
# The forward kernel='auto' runs on a Hopper: the warp-specialised wgmma kernel, faster than wgmma.cu at every
# measured shape (H100, B4 H16, fp16/bf16, D 64 and 128, N 1024..16384, the kernels alone:
# docs/results/cuda/forward_kernels.md, written by tools/cuda_forward_kernels.py)
HOPPER_FORWARD = "wgmma-ws"
# The backward kernel='auto' runs on a Hopper: the one-kernel wgmma backward, warp-specialised, faster than the
# same kernel without a producer warpgroup, than the two-kernel one and than the mma backward at every measured
# shape (H100, B4 H16 fp16, D 64 and 128, N 1024..16384, the kernels alone: docs/results/cuda/backward_kernels.md,
# written by tools/cuda_backward_kernels.py)
HOPPER_BACKWARD = "wgmma-ws"
# ... and above D = 128, where the one-kernel backwards stop: the two-kernel wgmma backward (at D = 256 its dK/dV
# kernel splits the columns over two blocks)
HOPPER_WIDE_BACKWARD = "wgmma"
# The backward a forward rung's autograd runs: the mma rung keeps its own (mma_backward.cu), so the ladder's
# rungs stay apart in a benchmark: 'mma-auto', mma_auto_backward's choice between its two; the others take
# kernel='auto' (wgmma on a Hopper; the fp32 rungs: tiled).
BACKWARD_OF = {"naive": "auto", "tiled": "auto", "mma": "mma-auto", "wgmma": "auto", "wgmma-ws": "auto"}
# the GPUs whose blocks hold mma_bwd_fused's 162 KiB of shared memory (A100; H100, H200)
MMA_FUSED_CCS = ((8, 0), (9, 0))
# the head dims where the one-kernel mma backward beat the two kernels (H200, fp16, B4 H16/H32, N 1024 and 4096,
# the kernels alone: docs/results/cuda/mma_backward/fused_layout/): 0.98-1.17x at D 64, 96 and 128 (below 1.0x only
# causal at N = 1024); at D = 32 0.78-0.88x, where a tile of 32 columns is little work between the block's barriers
MMA_FUSED_AUTO_HEAD_DIMS = (64, 96, 128)


def mma_auto_backward(D: int, cc) -> str:
    """The mma rung's backward ('mma-auto'): the one-kernel mma backward ('mma-fused', FlashAttention-2's warp
    layout) at MMA_FUSED_AUTO_HEAD_DIMS on the GPUs that hold its shared memory (MMA_FUSED_CCS), else the two
    kernels ('mma': D = 32, where they are faster, and D = 256, where the one kernel cannot hold dK and dV)."""
    return "mma-fused" if D in MMA_FUSED_AUTO_HEAD_DIMS and _as_pair(cc) in MMA_FUSED_CCS else "mma"
