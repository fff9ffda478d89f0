"""FlashAttention, rung 1 and 2: the algorithm in NumPy and as a split-based PyTorch loop.

Public interface (the same first arguments and keywords in every backend of the project):

    attention_reference(q, k, v, *, causal=False, softmax_scale=None, return_lse=False,
                        window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    flash_attn_numpy(q, k, v, *, causal=False, softmax_scale=None, block_m=64, block_n=64,
                     loop_order="v2", return_lse=False, window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    flash_attn_numpy_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None,
                              block_m=64, block_n=64, window_size=(-1, -1), dropout_p=0.0,
                              dropout_seed=None) -> (dq, dk, dv)
    flash_attn_torch(q, k, v, *, causal=False, softmax_scale=None, block_size=64, return_lse=False,
                     window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)

Shapes: q (B, Hq, Nq, D), k and v (B, Hk, Nk, D) with Hq % Hk == 0 (Hk = Hq: multi-head; Hk < Hq: grouped-query,
query head h reads K/V head h // (Hq // Hk); Hk = 1: multi-query), output (B, Hq, Nq, D), lse (B, Hq, Nq);
dk and dv (B, Hk, Nk, D) are summed over each K/V head's group of query heads.
window_size=(left, right): query i sees key j iff j <= i + Nk - Nq + right (right >= 0) and
j >= i + Nk - Nq - left (left >= 0); causal=True sets right = 0. Rule and pictures: :mod:`flash_attention_py.masks`.
dropout_p in [0, 1), dropout_seed an int (required when dropout_p > 0): weight (b, h, i, j) is kept iff
philox_uniform(dropout_seed, ((b*Hq + h)*Nq + i)*Nk + j) >= dropout_p (Triton's tl.rand, bit for bit:
:mod:`flash_attention_py.philox`), kept weights are scaled by 1/(1 - dropout_p), lse is the softmax's before dropout.
"""
from . import masks
from .common import attention_flops
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
    "masks",
]


def __getattr__(name):
    # torch is imported only when the PyTorch backend is asked for, so the NumPy rung loads fast
    if name in ("flash_attn_torch", "FlashAttnSplitFunction"):
        from . import torch_split

        value = getattr(torch_split, name)
        globals()[name] = value  # later lookups find the attribute itself
        return value
    raise AttributeError(f"module 'flash_attention_py' has no attribute {name!r}")
