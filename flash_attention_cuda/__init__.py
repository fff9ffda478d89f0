"""FlashAttention as raw CUDA C kernels, compiled by NVRTC and launched through CuPy.

    flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False)

The ladder (``KERNELS``), each a readable ``.cu`` file in ``flash_attention_cuda/kernels/``:

    naive   one thread per query row, K/V tiles in shared memory, online softmax (fp32)
    tiled   block-cooperative tiles, warp shuffles, float4 loads: the four device functions (fp32)
    mma     tensor cores: mma.sync m16n8k16, ldmatrix, cp.async double buffering (fp16/bf16, D 64/128/256)
    wgmma   Hopper tensor cores: warpgroup wgmma.mma_async from swizzled shared memory, softmax
            overlapped with the next product (fp16/bf16, D 64/128/256, compute capability 9.0 only)
    backward: recompute from the saved lse, used by autograd: wgmma_backward.cu (Hopper) or mma_backward.cu
              (tensor cores, fp16/bf16, D <= 256) or backward.cu (fp32 tiled kernels, everything else)

The modules: ``launcher.py`` (the public functions and their input checks), ``capabilities.py`` (what
each kernel takes, the Hopper decision, the probes), ``launch_specs.py`` (grid, block, shared memory and
arguments of every kernel, the tile configs), ``runtime.py`` (NVRTC, the kernel cache, streams, pointers)
and ``library_ops.py`` (the torch.library custom ops, imported by ``flash_attn_cuda`` when it first needs
them).

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D), O (B, H, Nq, D), lse (B, H, Nq) float32.
Importing needs neither torch, CuPy nor a GPU; launching needs CuPy and a GPU
(``capabilities.cuda_unavailable_reason()``).
"""
from . import launch_specs as _launch_specs
from .launch_specs import MMA_CONFIGS, WGMMA_CONFIGS
from .launcher import (KERNELS, RUNGS, SOURCES, flash_attn_cuda, flash_attn_cuda_backward, forward_with_config,
                       seed_nomax_forward, supported_text)

__all__ = ["flash_attn_cuda", "flash_attn_cuda_backward", "forward_with_config", "seed_nomax_forward", "KERNELS",
           "RUNGS", "SOURCES", "MMA_CONFIGS", "WGMMA_CONFIGS", "MMA_BACKWARD_CONFIGS", "supported_text"]


def __getattr__(name):
    if name == "MMA_BACKWARD_CONFIGS":  # read where the launches read it (a sweep may rebind it there)
        return _launch_specs.MMA_BACKWARD_CONFIGS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
