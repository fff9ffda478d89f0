"""FlashAttention, rung 3: Triton kernels (forward, and a three-kernel backward).

    from flash_attention_triton import flash_attn_triton
    o, lse = flash_attn_triton(q, k, v, causal=True, return_lse=True)   # q (B, H, Nq, D), k, v (B, H, Nk, D)

* ``forward_kernel.py``: the FlashAttention-2 forward (one program per Q block, online softmax in base 2).
* ``backward_kernels.py``: Delta = rowsum(dO * O), then a dK/dV kernel and a dQ kernel (no atomics).
* ``configs.py``: the fixed interpreter config, the GPU autotune candidates and their pruning.
* ``attention.py``: input checks, launchers and the ``torch.autograd.Function``.

On a CPU the kernels run through Triton's interpreter: set ``TRITON_INTERPRET=1`` before triton is
imported (tests/conftest.py does so when there is no GPU).
"""
from .attention import DTYPES, INTERPRETED, MAX_HEAD_DIM, FlashAttnTritonFunction, flash_attn_triton

__all__ = ["flash_attn_triton", "FlashAttnTritonFunction", "INTERPRETED", "MAX_HEAD_DIM", "DTYPES"]
