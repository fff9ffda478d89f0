"""FlashAttention, rung 3: Triton kernels (forward, and a two-kernel backward).

    from flash_attention_triton import flash_attn_triton
    o, lse = flash_attn_triton(q, k, v, causal=True, return_lse=True)   # q (B, H, Nq, D), k, v (B, Hk, Nk, D)
    o = flash_attn_triton(q, k, v, window_size=(256, 0), dropout_p=0.1, dropout_seed=1234)

The variants: a sliding window ``window_size=(left, right)`` (``masks.py``), grouped-query attention
(k, v with Hk heads, H % Hk == 0; no copy of K/V) and dropout (``tl.rand``, the mask drawn again in the backward).

* ``forward_kernel.py``: the FlashAttention-2 forward (one program per Q block, online softmax in base 2).
* ``backward_kernels.py``: a dQ kernel (which also computes Delta = rowsum(dO * O)), then a dK/dV kernel (no atomics).
* ``masks.py``: the mask rule as ``@triton.jit`` helpers (which keys a query sees, which blocks to visit).
* ``tiles.py``: tile loads and stores shared by the kernels.
* ``configs.py``: the fixed interpreter config, the GPU autotune candidates and their pruning.
* ``capabilities.py``: what the backend takes (dtypes, head dims), and whether it runs here.
* ``launch.py``: the launchers (grids, fixed or autotuned configs, the kernels' arguments, call plans).
* ``attention.py``: the public ``flash_attn_triton``, its input checks and the ``torch.autograd.Function``.
* ``library_ops.py``: the kernels as ``torch.library`` custom ops (for autograd and ``torch.compile``).

On a CPU the kernels run through Triton's interpreter: ``TRITON_INTERPRET=1`` must be set before the
kernels are imported (``capabilities.use_interpreter_without_gpu()`` does so when there is no GPU).
Importing this package imports neither torch nor triton: the names below load ``attention.py`` (and the
kernels) on first use, so ``flash_attention_triton.capabilities`` can be imported before that.
"""
__all__ = ["flash_attn_triton", "FlashAttnTritonFunction", "INTERPRETED", "MAX_HEAD_DIM", "DTYPES"]


def __getattr__(name):
    if name in __all__:
        from . import attention

        value = getattr(attention, name)
        globals()[name] = value  # later lookups find the attribute itself: this runs once per name (~2 us a call)
        return value
    raise AttributeError(f"module 'flash_attention_triton' has no attribute {name!r}")
