"""FlashAttention, rung 1 and 2: the algorithm in NumPy and as a split-based PyTorch loop.

Public interface (the same first five arguments in every backend of the project):

    attention_reference(q, k, v, *, causal=False, softmax_scale=None, return_lse=False)
    flash_attn_numpy(q, k, v, *, causal=False, softmax_scale=None, block_m=64, block_n=64,
                     loop_order="v2", return_lse=False)
    flash_attn_numpy_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None,
                              block_m=64, block_n=64) -> (dq, dk, dv)
    flash_attn_torch(q, k, v, *, causal=False, softmax_scale=None, block_size=64, return_lse=False)

Shapes: q (B, H, Nq, D), k and v (B, H, Nk, D), output (B, H, Nq, D), lse (B, H, Nq).
"""
from .common import attention_flops, causal_visible
from .inputs import make_inputs
from .numpy_flash import flash_attn_numpy, flash_attn_numpy_backward
from .reference import attention_naive, attention_reference, attention_reference_grads

__all__ = [
    "attention_reference",
    "attention_naive",
    "attention_reference_grads",
    "flash_attn_numpy",
    "flash_attn_numpy_backward",
    "flash_attn_torch",
    "make_inputs",
    "attention_flops",
    "causal_visible",
]


def __getattr__(name):
    # torch is imported only when the PyTorch backend is asked for, so the NumPy rung loads fast
    if name in ("flash_attn_torch", "FlashAttnSplitFunction"):
        from . import torch_split

        return getattr(torch_split, name)
    raise AttributeError(f"module 'flash_attention_py' has no attribute {name!r}")
