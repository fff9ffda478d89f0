"""The public entry point, the launchers and the autograd.Function of the Triton backend.

    flash_attn_triton(q, k, v, *, causal=False, softmax_scale=None, return_lse=False)

On a CUDA GPU the kernels are compiled by Triton and tuned with ``triton.autotune``; on a
CPU they run under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is
imported), one fixed config per kernel (see ``configs.py``).
"""
from __future__ import annotations

import torch
import triton

from flash_attention_py.validation import check_flag, check_qkv, check_scale_range, resolve_lazy, resolve_softmax_scale

from . import configs as C
from . import library_ops  # registers torch.ops.fa_ladder.triton_fwd / triton_bwd (it imports this module lazily)
from .backward_kernels import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess
from .forward_kernel import LOG2E, attn_fwd_kernel

__all__ = ["flash_attn_triton", "FlashAttnTritonFunction", "INTERPRETED", "MAX_HEAD_DIM", "DTYPES"]

# Was Triton imported with its interpreter on? (decided once, when the kernels were decorated)
INTERPRETED = not isinstance(attn_fwd_kernel, triton.runtime.jit.JITFunction)
MAX_HEAD_DIM = 256
# dtypes per device. bf16 is left out on the CPU: the interpreter's tl.dot on bf16 is silently
# wrong on triton 3.7 (it returns garbage without an error), so it is refused, not computed.
DTYPES = {"cpu": ("float16", "float32"), "cuda": ("float16", "bfloat16", "float32")}
# tl.dot precision for float32 inputs on the GPU. Triton's default, plain "tf32" (10-bit mantissa
# operands), is about 2x less accurate than cuBLAS's tf32 and fails the project's tolerance policy
# (2x naive attention in the same precision); "tf32x3" splits each operand into two tf32 parts and
# sums three tensor-core products: float32-level accuracy at ~3x the tf32 cost. Set to "tf32" for speed
# or "ieee" for plain FMA. (The interpreter always computes float32 dots exactly.)
FP32_PRECISION = "tf32x3"
_BF16_CPU_REASON = ("bfloat16 is not supported on CPU tensors: Triton's interpreter computes tl.dot "
                    "on bfloat16 wrongly without raising (triton 3.7); use float16 or float32 on the CPU, "
                    "or a CUDA GPU for bfloat16")


def _block_d(D: int) -> int:
    """Head dim padded to a power of two >= 16 (tl.dot needs K >= 16); the pad is masked off."""
    return max(16, triton.next_power_of_2(D))


def _fit_int32(x, name: str = "q", fn: str = "flash_attn_triton"):
    """x (B, H, N, D) such that the kernels' int32 row/column offsets cannot wrap around.

    The kernels offset each (batch, head) slice in int64 and rows/columns within it in int32. A legal strided
    view into a big buffer (a row stride of 34M elements, say) can span more than 2**31 elements in one slice:
    it is then copied to a contiguous tensor (only the view's own elements). A slice of 2**31 elements or more
    even when contiguous (N * D >= 2**31) is refused.
    """
    N, D = x.shape[-2:]
    if (N - 1) * abs(x.stride(-2)) + (D - 1) * abs(x.stride(-1)) < 2**31 - 1:
        return x
    if N * D >= 2**31 - 1:
        raise ValueError(f"{fn}: {name} has N * D = {N} * {D} = {N * D} elements per (batch, head); the kernels "
                         f"index within one (batch, head) in int32: expected N * D < 2**31")
    return x.contiguous()


def _elem(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ----------------------------------------------------------------------------- autotuned kernels
def _autotuned(kernel_name: str, jit_fn):
    """triton.autotune over the candidate configs of ``kernel_name``, pruned to what fits."""
    def early_prune(configs, named_args, **kwargs):
        block_d = kwargs["BLOCK_D"]
        elem = named_args["Q"].element_size()
        limit = _device_smem_limit(named_args["Q"].device)
        return C.prune(kernel_name, configs, block_d, elem, limit)

    return triton.autotune(
        configs=C.triton_configs(kernel_name),
        key=["Nq", "Nk", "HEAD_DIM", "CAUSAL"],  # the tensors' dtypes are added to the key by Triton
        prune_configs_by={"early_config_prune": early_prune},
        do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles),
    )(jit_fn)


_SMEM_CACHE = {}


def _device_smem_limit(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMEM_CACHE:
        try:
            props = triton.runtime.driver.active.utils.get_device_properties(idx)
            _SMEM_CACHE[idx] = int(props["max_shared_mem"])
        except Exception:  # pragma: no cover - older drivers: fall back to the table
            major, minor = torch.cuda.get_device_capability(idx)
            _SMEM_CACHE[idx] = C.SMEM_LIMIT.get(10 * major + minor, 101376)
    return _SMEM_CACHE[idx]


if INTERPRETED:
    _TUNED = {}
else:
    _TUNED = {
        "fwd": _autotuned("fwd", attn_fwd_kernel),
        "dkdv": _autotuned("dkdv", attn_bwd_dkdv_kernel),
        "dq": _autotuned("dq", attn_bwd_dq_kernel),
    }
_JIT = {"fwd": attn_fwd_kernel, "dkdv": attn_bwd_dkdv_kernel, "dq": attn_bwd_dq_kernel}


# The autotuner's choice per problem, so later calls skip triton.Autotuner.run (host time matters at
# small N). Keyed on power-of-two buckets of Nq and Nk: the first length in a bucket is tuned, and every
# other length in it reuses that choice, so a workload of varying lengths does not keep tuning.
# (kernel, bucket(Nq), bucket(Nk), HEAD_DIM, CAUSAL, dtype, device) -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
_PLAN = {}


def length_bucket(n: int) -> int:
    """The autotuning bucket of a sequence length: the next power of two (1100 and 2048 share 2048)."""
    return triton.next_power_of_2(n)


def _launch(kernel: str, grid_rows: int, BH: int, args, consts, *, Nq, Nk, block_d, elem, config=None):
    """Launch ``kernel`` over grid (cdiv(grid_rows, BLOCK), B*H) with a fixed or an autotuned config.

    ``config`` (BLOCK_M, BLOCK_N[, num_warps, num_stages]) forces a config (tests use it).
    """
    block_of = (lambda meta: meta["BLOCK_N"]) if kernel == "dkdv" else (lambda meta: meta["BLOCK_M"])
    if config is None:
        if INTERPRETED:
            config = C.INTERPRETER[kernel]
        elif max(Nq, Nk) < C.AUTOTUNE_MIN_N:
            config = C.small_config(kernel, block_d, elem)
        else:
            plan_key = (kernel, length_bucket(Nq), length_bucket(Nk), consts["HEAD_DIM"], consts["CAUSAL"],
                        args[0].dtype, args[0].device)
            config = _PLAN.get(plan_key)
            if config is None:
                grid = lambda meta: (triton.cdiv(grid_rows, block_of(meta)), BH)  # noqa: E731
                tuner = _TUNED[kernel]
                tuner[grid](*args, **consts)
                best = tuner.best_config
                _PLAN[plan_key] = (best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.num_warps, best.num_stages)
                return
    BM, BN = config[0], config[1]
    extra = {} if INTERPRETED else {"num_warps": config[2] if len(config) > 2 else 4,
                                    "num_stages": config[3] if len(config) > 3 else 2}
    meta = {"BLOCK_M": BM, "BLOCK_N": BN}
    _JIT[kernel][(triton.cdiv(grid_rows, block_of(meta)), BH)](*args, **consts, BLOCK_M=BM, BLOCK_N=BN, **extra)


def best_configs() -> dict:
    """The autotuner's choices so far: kernel -> {key: config string} (empty under the interpreter)."""
    return {name: {str(k): str(v) for k, v in t.cache.items()} for name, t in _TUNED.items()}


# ----------------------------------------------------------------------------- forward / backward
def _dot_prec(q) -> str:
    return FP32_PRECISION if q.dtype == torch.float32 else "tf32"  # (ignored for fp16/bf16 operands)


def _forward(q, k, v, causal: bool, scale: float, config=None):
    q, k, v = (_fit_int32(x, n) for x, n in zip((q, k, v), ("q", "k", "v")))  # int32 row offsets must not wrap
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    block_d = _block_d(D)
    args = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), H, Nq, Nk, scale * LOG2E)
    consts = dict(HEAD_DIM=D, CAUSAL=causal, NEG_SCALE=scale < 0, BLOCK_D=block_d, DOT_PREC=_dot_prec(q))
    _launch("fwd", Nq, B * H, args, consts, Nq=Nq, Nk=Nk, block_d=block_d, elem=q.element_size(), config=config)
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, configs=None):
    do = resolve_lazy(do)  # an upstream gradient can be a conj/neg view too: the kernels read raw memory
    q, k, v, do = (_fit_int32(x, n) for x, n in zip((q, k, v, do), ("q", "k", "v", "do")))  # int32 row offsets
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    block_d = _block_d(D)
    elem = q.element_size()
    configs = configs or {}
    # 1. Delta_i = rowsum(dO_i * O_i)
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    BM_pre = C.INTERPRETER["pre"][0] if INTERPRETED else 128
    attn_bwd_preprocess[(triton.cdiv(Nq, BM_pre), B * H)](
        o, do, delta, *do.stride(), H, Nq, HEAD_DIM=D, BLOCK_M=BM_pre, BLOCK_D=block_d)
    # gradients come out contiguous (B, H, N, D), whatever the inputs' strides
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    consts = dict(HEAD_DIM=D, CAUSAL=causal, BLOCK_D=block_d, DOT_PREC=_dot_prec(q))
    # 2. dK_j, dV_j: one program per K/V block
    _launch("dkdv", Nk, B * H, (q, k, v, do, lse, delta, dk, dv, *common, H, Nq, Nk, scale, scale * LOG2E), consts,
            Nq=Nq, Nk=Nk, block_d=block_d, elem=elem, config=configs.get("dkdv"))
    # 3. dQ_i: one program per Q block
    _launch("dq", Nq, B * H, (q, k, v, do, lse, delta, dq, *common, H, Nq, Nk, scale, scale * LOG2E),
            consts, Nq=Nq, Nk=Nk, block_d=block_d, elem=elem, config=configs.get("dq"))
    return dq, dk, dv


class FlashAttnTritonFunction(torch.autograd.Function):
    """autograd.Function: forward kernel; backward = preprocess + dK/dV kernel + dQ kernel.

    Saves q, k, v, O and lse (B, H, Nq) only: P is recomputed block by block in the backward.
    lse is returned as a non-differentiable output.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # a double backward raises, never drops the 2nd-order term
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def check_inputs(q, k, v, *, fn: str = "flash_attn_triton"):
    """The project's checks plus the Triton backend's own: returns (B, H, Nq, Nk, D)."""
    dims = check_qkv(q, k, v, fn=fn, kinds=("torch",))
    dev = q.device.type
    dt = str(q.dtype).replace("torch.", "")
    if dev not in DTYPES:
        raise ValueError(f"{fn}: q, k, v must be CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
                         f"got device {q.device}")
    if dev == "cpu" and not INTERPRETED:
        raise ValueError(
            f"{fn}: q, k, v are CPU tensors but Triton was imported without its interpreter; expected CUDA "
            "tensors, or set TRITON_INTERPRET=1 before importing triton to run the kernels on the CPU (slow)")
    if dev == "cpu" and dt == "bfloat16":
        raise TypeError(f"{fn}: q, k, v have dtype {_BF16_CPU_REASON}")
    if dt not in DTYPES[dev]:
        raise TypeError(f"{fn}: dtype {dt} is not supported on {dev}; expected one of {', '.join(DTYPES[dev])}")
    if dev == "cuda" and dims.B * dims.H > 65535:
        raise ValueError(f"{fn}: q has B * H = {dims.B * dims.H} (shape {tuple(q.shape)}); the kernels launch one grid "
                         "row per (batch, head) and a CUDA grid has at most 65535: expected B * H <= 65535")
    if dims.D > MAX_HEAD_DIM:
        raise ValueError(f"{fn}: q has head dim D = {dims.D} (shape {tuple(q.shape)}); expected D <= {MAX_HEAD_DIM}")
    return dims


def flash_attn_triton(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    """FlashAttention-2 in Triton: ``O = softmax(q k^T * softmax_scale) v``, differentiable.

    Arguments
        q: (B, H, Nq, D); k, v: (B, H, Nk, D). torch tensors, any strides, on one CUDA device
           (float16, bfloat16 or float32), or on the CPU under ``TRITON_INTERPRET=1`` (float16 or
           float32). D <= 256 (other D than 16/32/64/128/256 are padded to a power of two with
           masked loads). float32 matmuls run on the tensor cores as 3xTF32 on the GPU
           (``FP32_PRECISION``, float32-level accuracy), exactly under the interpreter.
           Accumulation is float32; P is rounded to the input dtype before P V, as in FA2.
        causal: bottom-right aligned mask: query i sees key j iff j <= i + Nk - Nq.

                Nq=Nk=3      Nq=2, Nk=4       Nq=3, Nk=2
                  k0 k1 k2     k0 k1 k2 k3      k0 k1
              q0  1  0  0   q0 1  1  1  0   q0  0  0   <- no key: O = 0, lse = -inf
              q1  1  1  0   q1 1  1  1  1   q1  1  0
              q2  1  1  1                   q2  1  1

        softmax_scale: defaults to 1/sqrt(D); any finite real (0 and negative included) whose scores fit
            float32 (else a ValueError: the kernels compute the scores in float32).
        return_lse: also return lse (B, H, Nq) float32 = ln(sum_j exp(scale * S_ij)), not differentiable.

    Returns O (B, H, Nq, D) in q's dtype (contiguous), and lse if asked. Gradients are contiguous.
    With gradients, and under ``torch.compile``, the kernels run as the custom ops
    ``torch.ops.fa_ladder.triton_fwd`` / ``triton_bwd`` (``library_ops.py``), so ``torch.compile(fullgraph=True)``
    compiles a model that calls this with no graph break.
    """
    fn = "flash_attn_triton"
    B, H, Nq, Nk, D = check_inputs(q, k, v, fn=fn)
    q, k, v = (resolve_lazy(x) for x in (q, k, v))  # conj/neg views: the kernels read raw memory
    check_flag(causal, "causal", fn=fn)
    check_flag(return_lse, "return_lse", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    check_scale_range(q, k, scale, fn=fn)  # the kernels compute the scores in float32
    # through the torch.library custom op (library_ops.py): one graph node for torch.compile, differentiable
    # through its registered backward op. Eager calls that need no gradient skip its dispatch (~30 us).
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        o, lse = library_ops.triton_fwd(q, k, v, causal, scale)
    else:
        with library_ops.on_device(q):
            o, lse = _forward(q, k, v, causal, scale)
    return (o, lse) if return_lse else o


def flops(B, H, Nq, Nk, D, causal=False, mode="fwd") -> float:  # convenience for the benchmark
    from flash_attention_py.common import attention_flops

    return attention_flops(B, H, Nq, Nk, D, causal=causal, mode=mode)

