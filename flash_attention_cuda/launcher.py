"""The public functions of the CUDA rung and their input checks.

    flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False,
                    window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    flash_attn_cuda_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, kernel="auto",
                             window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    forward_with_config(q, k, v, *, kernel, config, causal=False, softmax_scale=None, return_lse=False,
                        window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    seed_nomax_forward(q, k, v, *, softmax_scale=None)

The variants (a window, grouped-query K/V heads, dropout) run on the tensor-core kernels (mma, wgmma, wgmma-ws
and the tensor-core backwards); the fp32 kernels take the causal mask only and refuse the others, as capabilities.py says.

What each kernel takes is ``capabilities.py`` (``RUNGS`` below is that table keyed by kernel name, and
the checks here read it); how each kernel is launched is ``launch_specs.py`` (the tile configs, and
``run_backward(..., config=...)`` for the backward's sweep); compiling, streams and pointers are
``runtime.py``. For torch tensors that need gradients, and under ``torch.compile``, the forward runs as the
custom op ``torch.ops.fa_ladder.cuda_fwd`` (``library_ops.py``), differentiated by ``cuda_bwd``.
"""
from __future__ import annotations

from flash_attention_py.masks import with_mask_diagram
from flash_attention_py.validation import array_kind, check_qkv, resolve_lazy, resolve_softmax_scale

from . import launch_plans, launch_specs
from .checks import (BACKWARD_KERNELS, KERNELS, MAX_GRID_Y, RUNGS, check_backward, check_config,  # noqa: F401
                     check_forward, check_forward_cached, check_grid_and_device, supported_text)
from .launch_specs import (MMA_CONFIGS, WGMMA_BACKWARD_CONFIGS, WGMMA_CONFIGS,  # noqa: F401  (re-exported)
                           WGMMA_WS_CONFIGS)
from .runtime import HEADERS, HOPPER_SOURCES, KERNEL_DIR, SOURCES, read_source  # noqa: F401  (re-exported)

__all__ = ["flash_attn_cuda", "flash_attn_cuda_backward", "forward_with_config", "seed_nomax_forward", "KERNELS",
           "RUNGS", "SOURCES", "supported_text", "MMA_CONFIGS", "WGMMA_CONFIGS", "WGMMA_WS_CONFIGS",
           "WGMMA_BACKWARD_CONFIGS"]

FN = "flash_attn_cuda"


def __getattr__(name):
    if name == "MMA_BACKWARD_CONFIGS":  # the value the launches read (launch_specs.py)
        return launch_specs.MMA_BACKWARD_CONFIGS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------ public
@with_mask_diagram
def flash_attn_cuda(q, k, v, *, causal=False, softmax_scale=None, kernel="auto", return_lse=False,
                    window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """FlashAttention forward by a raw CUDA kernel launched through CuPy.

    Arguments
        q: (B, Hq, Nq, D), k and v: (B, Hk, Nk, D) (Hk = Hq without grouped-query attention): torch CUDA
           tensors (any strides; made contiguous) or CuPy arrays, one dtype.
        {MASK_DIAGRAM}

        {VARIANTS}
        The variants beyond causal (a window, Hk < Hq, dropout_p > 0) run on the tensor-core kernels only
        (and the tensor-core backwards); the fp32 kernels 'naive' and 'tiled' refuse them (capabilities.py).
        softmax_scale: defaults to 1/sqrt(D).
        kernel: 'naive' | 'tiled' (fp32, D <= 128) | 'mma' (fp16/bf16, D <= 256) |
                'wgmma' (fp16/bf16, D <= 256, Hopper only) | 'wgmma-ws' (the same, warp-specialised: a TMA
                producer warpgroup and ping-pong consumers, Hopper only) | 'auto' (for fp16/bf16: wgmma-ws on a
                Hopper GPU, else mma; otherwise tiled). The tensor-core kernels are compiled for D = 32, 64,
                96, 128 and 256: another D runs on copies of q, k, v zero-padded to the next of them (exact; the
                padded work and one copy).
        The checks of a call are done once per distinct (shapes, strides, dtypes, devices, arguments) and
        remembered (checks.check_forward_cached): a loop of identical calls pays them on its first call only.
        On a GPU, a call whose key ran before runs that call's C++ launch plan (launch_plans.py): the same
        kernels and bits, without the Python between the checks and the launch (FA_CUDA_LAUNCH_PLANS=0: off).
        return_lse: also return lse (B, Hq, Nq) float32 = log(sum_j exp(scaled score)) of the softmax before
            dropout.

    Returns O (B, Hq, Nq, D) in q's dtype (and lse (B, Hq, Nq)). A row that sees no key gives O = 0, lse = -inf.
    Differentiable for torch tensors: the backward recomputes from the saved lse, on tensor cores for
    fp16/bf16 (on a Hopper ``wgmma_bwd_ws`` for D <= 128 and the two-kernel wgmma backward above, else
    ``kernels/mma_backward.cu``; D padded as in the forward), else with the fp32 kernels (fp16/bf16 upcast,
    D <= 128). For torch tensors that need gradients, and under ``torch.compile``,
    the kernels run as the custom ops ``torch.ops.fa_ladder.cuda_fwd`` / ``cuda_bwd`` (``library_ops.py``), so
    ``torch.compile(fullgraph=True)`` compiles a model that calls this with no graph break.
    """
    # a call whose key (every argument, its type, q, k, v's shapes, strides, dtypes and devices, and whether it needs
    # a gradient) ran before: that call's C++ launch plan, or with a gradient the C++ autograd function on its plans;
    # the checks are in the key (launch_plans.py)
    public_key = launch_plans.public_forward_key(q, k, v, causal, softmax_scale, kernel, return_lse, window_size,
                                                 dropout_p, dropout_seed)
    if public_key is not None:
        hit = launch_plans.PUBLIC.get(public_key)
        if hit is not None:
            out = launch_plans.run_public(hit, q, k, v)
            if out is not None:
                return out if return_lse else out[0]
    q, k, v, scale, kernel, window, dropout = check_forward_cached(  # the checks, once per distinct call
        q, k, v, causal=causal, softmax_scale=softmax_scale, kernel=kernel, return_lse=return_lse, fn=FN,
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    if array_kind(q) == "torch":
        import torch

        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
            # one graph node for torch.compile, differentiable through cuda_bwd. Eager calls that need no
            # gradient skip the op's dispatch (~30 us). Imported here, not at the top: library_ops imports
            # torch and registers the ops, and this package must import without torch (CuPy arrays, and the
            # registry reading capabilities.py).
            from .library_ops import forward_op, python_backward

            o, lse = forward_op(q, k, v, causal, scale, kernel, window, dropout, fn=FN)
            if public_key is not None and public_key not in launch_plans.PUBLIC:  # the next such call: the C++
                # autograd function on this call's plans (a key already there is one whose inputs did not fit it:
                # no second slot)
                plan = launch_plans.FORWARD.get(launch_plans.checked_key(q, k, window, scale, kernel, None, dropout))
                if plan is not None:
                    launch_plans.remember_public(public_key, (plan, launch_plans.add_slot(
                        python_backward(causal, scale, kernel, window))))
            return (o, lse) if return_lse else o
    o, lse = launch_specs.run_forward(q, k, v, window, scale, kernel, dropout=dropout)
    if public_key is not None and public_key not in launch_plans.PUBLIC:  # run_forward planned this call: the
        # next with the same arguments skips the checks
        plan = launch_plans.FORWARD.get(launch_plans.checked_key(q, k, window, scale, kernel, None, dropout))
        if plan is not None:
            launch_plans.remember_public(public_key, plan)
    return (o, lse) if return_lse else o



def forward_with_config(q, k, v, *, kernel, config, causal=False, softmax_scale=None, return_lse=False,
                        window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """:func:`flash_attn_cuda` with an explicit tile config instead of the default one, for config sweeps.

    kernel 'mma': config = (Bc keys per K/V tile, warps per block, m16 tiles per warp), Br = 16 * tiles * warps;
    kernel 'wgmma': config = (Bc, warpgroups per block), Br = 64 * warpgroups. The defaults per head dim,
    ``launch_specs.MMA_CONFIGS`` / ``WGMMA_CONFIGS``, stay as they are. The same checks and result as
    flash_attn_cuda (window_size, GQA and dropout included): O (B, H, Nq, D) in q's dtype (and lse (B, H, Nq)
    float32); no autograd. A config the
    kernel's ``static_assert``s refuse fails to compile (RuntimeError), as does one that needs more shared
    memory than the GPU has.
    """
    fn = "forward_with_config"
    check_config(kernel, config, fn)
    q, k, v, scale, kernel, window, dropout = check_forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale, kernel=kernel, return_lse=return_lse, fn=fn,
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    o, lse = launch_specs.run_forward(q, k, v, window, scale, kernel, config, dropout=dropout)
    return (o, lse) if return_lse else o


def seed_nomax_forward(q, k, v, *, softmax_scale=None):
    """The seed lab kernel's arithmetic (sum of exp(S_ij), no running max), full attention, fp32.

    q (B, H, Nq, D), k and v (B, H, Nk, D) float32, D <= 128 -> O (B, H, Nq, D). For the test that shows why
    the running max matters: with scores past ~88.7 it gives inf/NaN.
    """
    fn = "seed_nomax_forward"
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch", "cupy"), dtypes=("float32",))
    if not RUNGS["naive"].supports_head_dim(dims.D):
        raise ValueError(f"{fn}: D must be <= {RUNGS['naive'].max_head_dim}, got {dims.D}")
    check_grid_and_device(q, dims, fn)
    scale = resolve_softmax_scale(softmax_scale, dims.D, fn=fn)
    return launch_specs.run_seed_nomax(*(resolve_lazy(x) for x in (q, k, v)), scale)


@with_mask_diagram
def flash_attn_cuda_backward(q, k, v, o, lse, do, *, causal=False, softmax_scale=None, kernel="auto",
                             window_size=(-1, -1), dropout_p=0.0, dropout_seed=None):
    """dQ, dK, dV of ``O = softmax(q k^T * scale) v`` by recompute kernels, from the forward's lse.

    q (B, Hq, Nq, D), k and v (B, Hk, Nk, D), o and do (B, Hq, Nq, D), lse (B, Hq, Nq) float32 natural log
    (the forward's). The gradients come back in q's dtype, shaped like q, k, v: with grouped-query K/V heads
    (Hq % Hk == 0) dK and dV of a K/V head sum over its group of query heads. causal, window_size, dropout_p
    and dropout_seed: those of the forward call; the dropout mask is drawn again from the seed. The variants
    beyond causal need a tensor-core kernel ('wgmma-ws', 'wgmma-fused', 'wgmma', 'mma', 'mma-fused', or 'auto' where one
    applies):
        {MASK_DIAGRAM}

        {VARIANTS}

    kernel: 'wgmma-ws' (fp16/bf16, D <= 128 (padded to 32, 64, 96 or 128), Hopper only: one kernel on warpgroup tensor
    cores, warp-specialised (a producer warpgroup loads through TMA), dQ summed in float32 by the copy engine, so
    dQ is not bitwise reproducible; wgmma_bwd_ws in kernels/wgmma_backward.cu) | 'wgmma-fused' (the same kernel
    without the producer warpgroup; wgmma_bwd_fused) | 'wgmma' (two kernels: dK/dV and dQ, deterministic;
    D <= 256, padded to 32, 64, 96, 128 or 256) | 'mma' (fp16/bf16, D <= 256 (padded as 'wgmma'), compute
    capability >= 8.0: mma.sync tensor cores, fp32 accumulation, two kernels, deterministic;
    kernels/mma_backward.cu) | 'mma-fused' (the same, D <= 128, as one kernel of 8 warps per 128 keys in
    FlashAttention-2's warp layout, dQ summed with atomic adds; mma_bwd_fused: what the mma rung's autograd runs
    at D = 64, 96 and 128 on compute capability 8.0 and 9.0) | 'tiled' (any float dtype, D <= 128: fp16/bf16 are upcast and the
    fp32 kernels of kernels/backward.cu run) | 'auto' (wgmma-ws on a Hopper for D <= 128, wgmma above it, else
    mma where it applies, else tiled).
    """
    q, k, v, o, do, scale, kernel, window, dropout = check_backward(
        q, k, v, o, lse, do, causal=causal, softmax_scale=softmax_scale, kernel=kernel, fn="flash_attn_cuda_backward",
        window_size=window_size, dropout_p=dropout_p, dropout_seed=dropout_seed)
    return launch_specs.run_backward(q, k, v, o, lse, do, window, scale, kernel, dropout=dropout)
