"""FlashAttention as raw CUDA C kernels, compiled by NVRTC and launched through CuPy.

    flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False)

The ladder (``KERNELS``), each a readable ``.cu`` file in ``flash_attention_cuda/kernels/``:

    naive   one thread per query row, K/V tiles in shared memory, online softmax (fp32)
    tiled   block-cooperative tiles, warp shuffles, float4 loads: the four device functions (fp32)
    mma     tensor cores: mma.sync m16n8k16, ldmatrix, cp.async double buffering (fp16/bf16, D 64/128)
    wgmma   Hopper tensor cores: warpgroup wgmma.mma_async from swizzled shared memory, softmax
            overlapped with the next product (fp16/bf16, D 64/128, compute capability 9.0 only)
    backward: recompute from the saved lse, used by autograd: mma_backward.cu (tensor cores, fp16/bf16,
              D 64/128) or backward.cu (fp32 tiled kernels, everything else)

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D), O (B, H, Nq, D), lse (B, H, Nq) float32.
Importing needs CuPy but no GPU; launching needs one (``cupy.cuda.is_available()``).
"""
from .launcher import (KERNELS, MMA_CONFIGS, RUNGS, SOURCES, WGMMA_CONFIGS, flash_attn_cuda,
                       flash_attn_cuda_backward, seed_nomax_forward, supported_text)

__all__ = ["flash_attn_cuda", "flash_attn_cuda_backward", "seed_nomax_forward", "KERNELS", "RUNGS",
           "SOURCES", "MMA_CONFIGS", "WGMMA_CONFIGS", "supported_text"]
