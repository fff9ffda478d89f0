"""The launchers of the Triton kernels: grids, configs (fixed or autotuned) and arguments.

    _forward(q, k, v, window, scale, config=None, *, dropout_p=0.0, dropout_seed=None) -> (o, lse)
    _backward(q, k, v, o, lse, do, window, scale, configs=None, *, dropout_p=0.0, dropout_seed=None)
        -> (dq, dk, dv)

Inputs are already checked (``attention.check_inputs``). q is (B, H, Nq, D); k and v (B, Hk, Nk, D) with
H % Hk == 0 (grouped-query attention when Hk < H: the kernels take group = H // Hk and read K/V head
h // group, no copy). window is the mask as (left, right) of ``flash_attention_py.masks`` (a ``causal``
flag is accepted too: ``masks.window_for``); the kernels take it as the constexprs WINDOW_LEFT /
WINDOW_RIGHT: each window is one compiled variant (a model uses one or two), and the compiler folds its
bounds into the block arithmetic. Dropout: dropout_p (in [0, 1)) and dropout_seed (an int in [0, 2**64))
are run-time arguments; the constexpr DROPOUT = dropout_p > 0 selects the kernels that draw the keep mask,
so dropout_p = 0 runs the plain kernels. The softmax scale reaches every kernel as one signed
``scale_log2`` (``scale_args``). On a CUDA GPU the kernels are compiled by Triton and tuned with
``triton.autotune``; on a CPU they run under Triton's interpreter, one fixed config per kernel
(``configs.py``). ``library_ops.py`` wraps these two functions as torch custom ops.

The backward is two launches, the dQ kernel (which also stores Delta) and then the dK/dV kernel. A call like an
earlier one (same shapes, strides, dtype, alignment, window, dropout kinds) replays that call's launches from a
call plan (``_CALLS``), skipping the launcher's lookups; on a GPU the next one runs the same launches as a C++
launch plan (``launch_plans.py``), one C++ call from the allocations to the last launch.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton

from flash_attention_py import masks
from flash_attention_py.validation import resolve_lazy

from . import configs as C
from . import launch_plans  # the C++ launch plans of a call plan's launches (flash_attention_cuda's extension)
from .backward_kernels import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from .capabilities import interpreter_on
from .forward_kernel import attn_fwd_kernel
from .tiles import LOG2E

__all__ = ["scale_args", "length_bucket", "best_configs", "FP32_PRECISION", "INTERPRETED"]

# Was Triton imported with its interpreter on? (decided once, when the kernels were decorated)
INTERPRETED = interpreter_on()
# tl.dot precision for float32 inputs on the GPU. Triton's default, plain "tf32" (10-bit mantissa
# operands), is about 2x less accurate than cuBLAS's tf32 and fails the project's tolerance policy
# (2x naive attention in the same precision); "tf32x3" splits each operand into two tf32 parts and
# sums three tensor-core products: float32-level accuracy at ~3x the tf32 cost. Set to "tf32" for speed
# or "ieee" for plain FMA. (The interpreter always computes float32 dots exactly.)
FP32_PRECISION = "tf32x3"


# Host-side arithmetic in plain Python: triton.cdiv and triton.next_power_of_2 are constexpr functions that cost
# a few microseconds each when called from the host, several times per launch.
def _cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints (triton.cdiv on the host)."""
    return -(-a // b)


def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1; triton.next_power_of_2 on the host)."""
    return 1 << (n - 1).bit_length()


def _block_d(D: int) -> int:
    """Head dim padded to a power of two >= 16 (tl.dot needs K >= 16); the pad is masked off."""
    return max(16, _next_pow2(D))


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


def scale_args(scale: float) -> tuple:
    """The kernels' scale argument: (scale_log2,) = (softmax_scale * log2(e),), signed.

    Every kernel scores in base 2 (exp(x * scale) = exp2(x * scale_log2)); the backward recovers
    softmax_scale as scale_log2 * ln(2). A negative or zero scale needs nothing else.
    """
    return (float(scale) * LOG2E,)


def _window(window) -> tuple:
    """The (left, right) window of a launch: a window tuple, or a ``causal`` flag (masks.window_for)."""
    if isinstance(window, bool):
        return masks.window_for(window)
    left, right = window
    return (int(left), int(right))


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
        key=["Nq", "Nk", "HEAD_DIM", "WINDOW_LEFT", "WINDOW_RIGHT", "DROPOUT", "group"],  # + the tensors' dtypes
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


# ----------------------------------------------------------------------------- the launch itself
# ``jit_fn[grid](*args, **consts)`` costs about 35 us of host time on an H100 host (Triton 3.6), as long as a
# whole kernel at N = 1024: it binds the arguments, works out their specialisation (dtype, 16-byte alignment,
# ints divisible by 16 or equal to 1) and looks the compiled kernel up by it. _run does that once per distinct
# launch and keeps the compiled kernel under a key that is finer than the specialisation: the tensors' dtypes
# and whether each address is 16-byte aligned, every int's exact value, the floats' and the seed's types. The
# next launch with the same key calls the compiled kernel directly (about 10 us). A launch hook (a profiler
# such as proton) sends every launch through Triton's own path.
_COMPILED: dict = {}  # launch key -> (compiled kernel, the values of the jit function's constexpr parameters)
_COMPILED_MAX = 4096


def _int_kind(x) -> str:
    """The Triton argument type of an int that is not specialised (the dropout seed): i32, i64 or u64."""
    return "i32" if -2**31 <= x < 2**31 else ("i64" if -2**63 <= x < 2**63 else "u64")


def _hooked(hook) -> bool:
    """Is a launch hook set? (None, or an empty chain of hooks in Triton >= 3.7: no.)"""
    return hook is not None and bool(getattr(hook, "calls", True))


def _driver():
    return triton.runtime.driver.active


def _hooks_on() -> bool:
    """Is a launch hook (a profiler such as proton) set? Then every launch goes through Triton's own path."""
    knobs = getattr(triton, "knobs", None)
    return knobs is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)


def _run(jit_fn, grid: tuple, tensors: tuple, ints: tuple, tail: tuple, consts: dict):
    """Launch ``jit_fn[grid](*tensors, *ints, *tail, **consts)``: the kernel's arguments in its order, tensors
    first, then the ints it may specialise on (strides, sizes), then ``tail`` (floats, and the dropout seed, an
    int it does not specialise on). consts: its constexprs and the options (num_warps, num_stages).

    Returns the launch's cache entry (compiled kernel, constexpr values), or None where the launch went through
    Triton's own path and left none (the interpreter, a launch hook, a kernel Triton did not hand back)."""
    if INTERPRETED or _hooks_on():
        jit_fn[grid](*tensors, *ints, *tail, **consts)
        return None
    driver = _driver()
    device = driver.get_current_device()
    key = (jit_fn, device, tuple([t.dtype for t in tensors]), tuple([t.data_ptr() % 16 == 0 for t in tensors]),
           ints, tuple(["f" if type(x) is float else _int_kind(x) for x in tail]), tuple(consts.items()))
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = jit_fn[grid](*tensors, *ints, *tail, **consts)  # compiles (once per specialisation), launches
        if compiled is not None and hasattr(compiled, "packed_metadata"):
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
            n = len(tensors) + len(ints) + len(tail)
            hit = _COMPILED[key] = (compiled, tuple(consts[name] for name in jit_fn.arg_names[n:]))
        return hit
    _go(hit, _grid3(grid), ints, driver.get_current_stream(device), tensors, tail)
    return hit


def _grid3(grid: tuple) -> tuple:
    return tuple(grid) + (1,) * (3 - len(grid))


def _go(entry, grid3: tuple, ints: tuple, stream, tensors: tuple, tail: tuple) -> None:
    """Launch a cached compiled kernel (an entry of _COMPILED) directly, on ``stream``, over ``grid3``."""
    compiled, constexprs = entry
    compiled.run(grid3[0], grid3[1], grid3[2], stream, compiled.function, compiled.packed_metadata,
                 None, None, None, *tensors, *ints, *tail, *constexprs)


# The autotuner's choice per problem, so later calls skip triton.Autotuner.run (host time matters at
# small N). Keyed on power-of-two buckets of Nq and Nk: the first length in a bucket is tuned, and every
# other length in it reuses that choice, so a workload of varying lengths does not keep tuning.
# (kernel, bucket(Nq), bucket(Nk), HEAD_DIM, window, DROPOUT, GQA or not, dtype, device)
#   -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
_PLAN = {}


def length_bucket(n: int) -> int:
    """The autotuning bucket of a sequence length: the next power of two (1100 and 2048 share 2048)."""
    return _next_pow2(n)


def _launch(kernel: str, grid_rows: int, BH: int, args, consts, *, Nq, Nk, block_d, elem, group=1, config=None,
            n_tensors: int, n_tail: int):
    """Launch ``kernel`` over grid (cdiv(grid_rows, BLOCK), B*H) with a fixed or an autotuned config.

    ``config`` (BLOCK_M, BLOCK_N[, num_warps, num_stages]) forces a config (tests use it). args: the first
    ``n_tensors`` are tensors, the last ``n_tail`` floats and the seed, ints between (``_run``).
    Returns what a call plan replays, (cache entry, grid, ints), or None (a tuning launch; see ``_run``).
    """
    block_of = (lambda meta: meta["BLOCK_N"]) if kernel == "dkdv" else (lambda meta: meta["BLOCK_M"])
    if config is None:
        if INTERPRETED:
            config = C.INTERPRETER[kernel]
        elif max(Nq, Nk) < C.AUTOTUNE_MIN_N:
            config = C.small_config(kernel, block_d, elem)
        else:
            plan_key = (kernel, length_bucket(Nq), length_bucket(Nk), consts["HEAD_DIM"], consts["WINDOW_LEFT"],
                        consts["WINDOW_RIGHT"], consts["DROPOUT"], group > 1, args[0].dtype, args[0].device)
            config = _PLAN.get(plan_key)
            if config is None:
                grid = lambda meta: (_cdiv(grid_rows, block_of(meta)), BH)  # noqa: E731
                tuner = _TUNED[kernel]
                tuner[grid](*args, **consts)
                best = tuner.best_config
                _PLAN[plan_key] = (best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], best.num_warps, best.num_stages)
                return None
    BM, BN = config[0], config[1]
    extra = {} if INTERPRETED else {"num_warps": config[2] if len(config) > 2 else 4,
                                    "num_stages": config[3] if len(config) > 3 else 2}
    meta = {"BLOCK_M": BM, "BLOCK_N": BN}
    args = tuple(args)
    grid, ints = (_cdiv(grid_rows, block_of(meta)), BH), args[n_tensors:len(args) - n_tail]
    entry = _run(_JIT[kernel], grid, args[:n_tensors], ints, args[len(args) - n_tail:], dict(consts, **meta, **extra))
    return None if entry is None else (entry, _grid3(grid), ints)


_DEVICE_SIZES = {}  # device index -> (SMs, L2 bytes)
SPLIT_BLOCK_N = 128  # the largest Bc of the dK/dV candidates: the fewest programs a config can give
INTERPRETER_SMS = 2  # under the interpreter, as if the GPU had 2 SMs (so small tests take the split path)
INTERPRETER_L2 = 50 << 20  # ... and an H100's 50 MiB of L2 cache


def device_sizes(device) -> tuple:
    """(SMs, bytes of L2 cache) of a CUDA device; (INTERPRETER_SMS, INTERPRETER_L2) under the interpreter or on a
    CPU."""
    if INTERPRETED or device.type != "cuda":
        return INTERPRETER_SMS, INTERPRETER_L2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE_SIZES:
        props = torch.cuda.get_device_properties(idx)
        _DEVICE_SIZES[idx] = props.multi_processor_count, getattr(props, "L2_cache_size", INTERPRETER_L2)
    return _DEVICE_SIZES[idx]


def dkdv_splits(B: int, Hk: int, group: int, Nk: int, device, head_bytes: int = 0) -> int:
    """How many programs share one K/V block's group of query heads in the dK/dV kernel.

    One program per (K/V block, batch, K/V head) gives B * Hk * cdiv(Nk, Bc) programs: with few K/V heads
    (MQA: Hk = 1) too few to fill the GPU, each looping over all ``group`` query heads. The split is the
    smallest divisor of ``group`` that gives at least two programs per SM (at the largest Bc), else the
    whole group: 1 without GQA or when the grid is already large. With ``head_bytes`` (what one query head's
    rows a program reads: hopper_backward.py's Q and dO), also the smallest that keeps a program's share of the
    group within the L2 cache.
    """
    if group == 1:
        return 1
    sms, l2 = device_sizes(device)
    programs = _cdiv(Nk, SPLIT_BLOCK_N) * B * Hk
    for s in range(1, group + 1):
        if group % s == 0 and programs * s >= 2 * sms and group // s * head_bytes <= l2:
            return s
    return group


def best_configs() -> dict:
    """The autotuner's choices so far: kernel -> {key: config string} (empty under the interpreter)."""
    return {name: {str(k): str(v) for k, v in t.cache.items()} for name, t in _TUNED.items()}


# ----------------------------------------------------------------------------- forward / backward
def _dot_prec(q) -> str:
    return FP32_PRECISION if q.dtype == torch.float32 else "tf32"  # (ignored for fp16/bf16 operands)


@functools.lru_cache(maxsize=256)
def _consts_of(D: int, window: tuple, dropout: bool, dot_prec: str) -> dict:
    """The constexprs of the forward, dK/dV and dQ kernels: head dim, mask window, dropout on/off, padded head
    dim, dot precision. One dict per distinct answer, shared: callers must not change it."""
    return dict(HEAD_DIM=D, WINDOW_LEFT=window[0], WINDOW_RIGHT=window[1], DROPOUT=dropout, BLOCK_D=_block_d(D),
                DOT_PREC=dot_prec)


def dropout_args(dropout_p: float = 0.0, dropout_seed=None) -> tuple:
    """The kernels' dropout arguments (dropout_p, dropout_seed): (0.0, 0) without dropout (DROPOUT = False).

    dropout_seed is an int in [0, 2**64) (a negative int64, as a custom op carries a seed >= 2**63, is taken
    modulo 2**64); the kernels hand it to ``tl.rand``, which splits it into two 32-bit key words.
    """
    p = float(dropout_p)
    if not p > 0.0:
        return (0.0, 0)
    if dropout_seed is None:
        raise ValueError("flash_attn_triton: dropout_p > 0 needs a dropout_seed (an int in [0, 2**64))")
    return (p, int(dropout_seed) % 2**64)


# ----------------------------------------------------------------------------- call plans
# A call repeats the same host work for the same problem: the int32 fit of each input, the dK/dV split, the
# config lookups, the launch keys of _run. The first call that finds every launch in _COMPILED leaves a call plan,
# its launches (cache entry, grid, ints), under a key of what decides them: the inputs' shapes, strides, dtype and
# 16-byte alignment, the current device, the mask window and the dropout arguments' kinds. A later call with that
# key allocates its outputs and launches the plan's kernels directly (tools/host_profile.py --triton times both
# paths; docs/backend_triton.md quotes them). Not under the interpreter, with a forced config, or with a launch hook.
_CALLS: dict = {}
_CALLS_MAX = 1024


def _call_key(kind: str, tensors: tuple, window: tuple, drop: tuple):
    """The key of a call plan, or None where calls take the full path (interpreter, launch hook)."""
    if INTERPRETED or _hooks_on():
        return None
    return (kind, _driver().get_current_device(), tensors[0].dtype, tensors[0].device, window,
            drop[0] > 0.0, _int_kind(drop[1]),
            tuple([t.shape for t in tensors]), tuple([t.stride() for t in tensors]),
            tuple([t.data_ptr() % 16 == 0 for t in tensors]))


def _keep_plan(key, plan) -> None:
    if len(_CALLS) >= _CALLS_MAX:
        _CALLS.clear()
    _CALLS[key] = plan


# The Hopper forward (hopper_forward.py, in Gluon) runs every call it takes (hopper_forward.takes: sm_90, fp16/bf16,
# D = 128, no dropout, MIN_FLOPS of work) unless this is False, or FA_TRITON_HOPPER_FORWARD=0 was set before the import: then
# forward_kernel.py runs those calls too. An explicit ``config`` always runs forward_kernel.py.
HOPPER_FORWARD = os.environ.get("FA_TRITON_HOPPER_FORWARD", "1") != "0"


def _hopper_forward(q, k, v, dropout: bool, window):
    """The hopper_forward module where it runs this call, else None."""
    if not (HOPPER_FORWARD and q.is_cuda) or INTERPRETED:
        return None
    from . import hopper_forward  # (Gluon; imported on a GPU only)

    return hopper_forward if hopper_forward.takes(q, k, v, dropout, window) else None


# The one-kernel Hopper backward (hopper_backward.py, in Gluon) runs every call it takes (hopper_backward.takes: sm_90,
# fp16/bf16, D = 128, no dropout, TMA-aligned, MIN_FLOPS of work) unless this is False, or
# FA_TRITON_HOPPER_BACKWARD=0 was set before the import: then backward_kernels.py runs them.
HOPPER_BACKWARD = os.environ.get("FA_TRITON_HOPPER_BACKWARD", "1") != "0"


def _hopper_backward(q, k, v, do, dropout: bool, window):
    """The hopper_backward module where it runs this call, else None."""
    if not (HOPPER_BACKWARD and q.is_cuda) or INTERPRETED:
        return None
    from . import hopper_backward  # (Gluon; imported on a GPU only)

    return hopper_backward if hopper_backward.takes(q, k, v, do, dropout, window) else None


def _forward(q, k, v, window, scale: float, config=None, *, dropout_p: float = 0.0, dropout_seed=None):
    """o (B, H, Nq, D) in q's dtype and lse (B, H, Nq) float32 of checked inputs; window = (left, right) or causal.

    k, v may have Hk heads, H % Hk == 0 (grouped-query attention). With dropout_p > 0, O is that of the
    dropped, rescaled weights and lse that of the softmax before dropout. On a Hopper GPU the calls
    ``hopper_forward.takes`` run that kernel (``HOPPER_FORWARD``), the others ``forward_kernel.py``.
    """
    window, drop = _window(window), dropout_args(dropout_p, dropout_seed)
    hopper = _hopper_forward(q, k, v, drop[0] > 0.0, window) if config is None else None
    if hopper is not None:
        return hopper.forward(q, k, v, window, scale)
    key = None if config is not None else _call_key("fwd", (q, k, v), window, drop)
    plan = _CALLS.get(key)
    if plan is not None:  # the launch of an earlier call like this one, directly
        cpp_key = launch_plans.planned_key("triton-fwd", key, scale, drop)
        out = launch_plans.forward_plan(cpp_key, q, k, v)  # its C++ launch plan, from the third call of a key
        if out is not None:
            return out
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        entry, grid, ints = plan
        tail = (*scale_args(scale), *drop)
        _go(entry, grid, ints, _driver().get_current_stream(key[1]), (q, k, v, o, lse), tail)
        launch_plans.remember_forward(cpp_key, plan, q, k, v, o, lse, tail)
        return o, lse
    q0, k0, v0 = q, k, v
    q, k, v = (_fit_int32(x, n) for x, n in zip((q, k, v), ("q", "k", "v")))  # int32 row offsets must not wrap
    B, H, Nq, D = q.shape
    Nk, group = k.shape[2], H // k.shape[1]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, H, Nq, D), contiguous
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    consts = _consts_of(D, window, drop[0] > 0.0, _dot_prec(q))
    args = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), H, group, Nq, Nk, *scale_args(scale), *drop)
    launch = _launch("fwd", Nq, B * H, args, consts, Nq=Nq, Nk=Nk, block_d=consts["BLOCK_D"], elem=q.element_size(),
                     group=group, config=config, n_tensors=5, n_tail=3)
    if key is not None and launch is not None and all(a is b for a, b in zip((q, k, v), (q0, k0, v0))):
        _keep_plan(key, launch)
    return o, lse


class _BackwardPlan(NamedTuple):
    """The launches of a backward call, in their order: dQ (and Delta), dK/dV; each (cache entry, grid, ints)."""

    splits: int
    dq: tuple
    dkdv: tuple


def _backward(q, k, v, o, lse, do, window, scale: float, configs=None, *, dropout_p: float = 0.0, dropout_seed=None):
    """(dq, dk, dv), contiguous, in the inputs' dtypes; window = (left, right) or causal.

    dk, dv are (B, Hk, Nk, D): with grouped-query attention, each sums the gradients of its group's query
    heads. dropout_p and dropout_seed must be the forward's (the keep mask is drawn again from them).
    o (the forward's output) and lse are contiguous.
    """
    do = resolve_lazy(do)  # an upstream gradient can be a conj/neg view too: the kernels read raw memory
    window, drop = _window(window), dropout_args(dropout_p, dropout_seed)
    hopper = _hopper_backward(q, k, v, do, drop[0] > 0.0, window) if not configs else None
    if hopper is not None:
        return hopper.backward(q, k, v, o, lse, do, window, scale, hopper.splits(q, k))
    key = None if configs else _call_key("bwd", (q, k, v, o, lse, do), window, drop)
    plan = _CALLS.get(key)
    if plan is None:
        launch_plans.cpp.LAST.backward = None
        return _backward_full(q, k, v, o, lse, do, window, scale, configs or {}, drop, key)
    cpp_key = launch_plans.planned_key("triton-bwd", key, scale, drop)
    out = launch_plans.backward_plan(cpp_key, q, k, v, o, lse, do)  # its C++ launch plan, from the third call
    if out is not None:
        return out
    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    stream = _driver().get_current_stream(key[1])
    tail = (*scale_args(scale), *drop)
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _go(*plan.dq, stream, (q, k, v, o, do, lse, delta, dq), tail)  # the GPU starts while the host goes on
    dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (k, v))
    dk_out, dv_out = (dk, dv) if plan.splits == 1 else (
        torch.empty((B, Hk * plan.splits, Nk, D), dtype=torch.float32, device=k.device) for _ in range(2))
    _go(*plan.dkdv, stream, (q, k, v, do, lse, delta, dk_out, dv_out), tail)
    if plan.splits > 1:
        _sum_splits(dk, dv, dk_out, dv_out, plan.splits)
    launch_plans.remember_backward(cpp_key, plan, q, k, v, o, lse, do, delta, dq, dk, dv, tail)
    return dq, dk, dv


def _sum_splits(dk, dv, dk_out, dv_out, splits: int) -> None:
    """dK_j, dV_j = sums of the float32 partial sums of the dK/dV kernel's splits (B, Hk * splits, Nk, D)."""
    B, Hk, Nk, D = dk.shape
    for grad, part in ((dk, dk_out), (dv, dv_out)):
        grad.copy_(part.view(B, Hk, splits, Nk, D).sum(dim=2))


def _backward_full(q, k, v, o, lse, do, window, scale, configs, drop, key):
    """The backward's two launches through _launch (configs, tuning, launch keys); leaves a call plan under
    ``key`` (not None) when both went through the compiled-kernel cache."""
    inputs = (q, k, v, do)
    q, k, v, do = (_fit_int32(x, n) for x, n in zip(inputs, ("q", "k", "v", "do")))  # int32 row offsets
    B, H, Nq, D = q.shape
    Nk, Hk = k.shape[2], k.shape[1]
    group = H // Hk
    consts = _consts_of(D, window, drop[0] > 0.0, _dot_prec(q))
    block_d, elem = consts["BLOCK_D"], q.element_size()
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    # gradients come out contiguous (B, H, N, D), whatever the inputs' strides
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    # 1. Delta_i = rowsum(dO_i * O_i) and dQ_i: one program per Q block
    dqs = _launch("dq", Nq, B * H, (q, k, v, o, do, lse, delta, dq, *common, H, group, Nq, Nk, *scale_args(scale),
                                    *drop),
                  consts, Nq=Nq, Nk=Nk, block_d=block_d, elem=elem, group=group, config=configs.get("dq"), n_tensors=8,
                  n_tail=3)
    # 2. dK_j, dV_j: one program per (K/V block, batch, K/V head, split), summing over its share of the group's
    #    query heads; with splits > 1 into float32 partial sums (B, Hk * splits, Nk, D), added up here
    dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format) for x in (k, v))
    splits = dkdv_splits(B, Hk, group, Nk, q.device)
    dk_out, dv_out = (dk, dv) if splits == 1 else (
        torch.empty((B, Hk * splits, Nk, D), dtype=torch.float32, device=k.device) for _ in range(2))
    dkdv = _launch("dkdv", Nk, B * Hk * splits, (q, k, v, do, lse, delta, dk_out, dv_out, *common, H, group, splits,
                                                 Nq, Nk, *scale_args(scale), *drop), consts,
                   Nq=Nq, Nk=Nk, block_d=block_d, elem=elem, group=group, config=configs.get("dkdv"), n_tensors=8,
                   n_tail=3)
    if splits > 1:
        _sum_splits(dk, dv, dk_out, dv_out, splits)
    if key is not None and None not in (dqs, dkdv) and all(a is b for a, b in zip((q, k, v, do), inputs)):
        _keep_plan(key, _BackwardPlan(splits, dqs, dkdv))
    return dq, dk, dv
