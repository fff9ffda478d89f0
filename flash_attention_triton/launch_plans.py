"""flash_attn_triton's repeated calls as C++ launch plans: the CUDA rung's extension, given Triton's kernels.

launch.py already keeps a call plan per call key (launch.py, *call plans*): a repeated call allocates its outputs
and hands each compiled kernel to Triton's launcher, with no config lookup or specialisation. What is left is
Python: the checks' cache, the allocations, Triton's launcher (which reads each tensor's ``data_ptr`` through
Python), 43-46 us a forward on an H200 against SDPA's 16-18 in the same runs (the plans-off runs of
docs/results/cuda/launch_overhead_triton_plans/; with the plans, 16-28 against 16-27).
This module describes those launches to the C++ launch plans of ``flash_attention_cuda/launch_plans.py``, so a
repeated call is one C++ call, as flash_attn_cuda's is:

    flash_attn_triton(q, k, v, ...)     1st call of a key: checks, tuning or config lookup, launch
    flash_attn_triton(q, k, v, ...)     2nd call: the call plan (launch.py), and the C++ plan registered
    flash_attn_triton(q, k, v, ...)     later calls: PUBLIC[key] -> the C++ plan -> (O, lse)

A differentiable call runs in the same C++ autograd function (``PlannedAttention``), whose backward runs the
backward's plan once the first backward on the Python path has registered it. Keys are launch.py's call keys
(shapes, strides, dtypes, alignment, device, mask window, dropout's kinds) with the softmax scale (a plan holds its
scalar arguments), tagged "triton-fwd" / "triton-bwd"; the public key is ``launch_plans.public_forward_key`` with
``fn="flash_attn_triton"``. ``FA_CUDA_LAUNCH_PLANS=0`` turns them off with the CUDA rung's.

A Triton launch, as its launcher makes it (triton/backends/nvidia/driver.py), is ``cuLaunchKernel`` of the
compiled kernel's CUfunction over the grid, with 32 * num_warps threads and ``metadata.shared`` bytes of shared
memory; its parameters, in order:

    every argument of the jit function but the constexprs (the constexpr parameters, and the ints the
    specialisation made constant: a unit stride, a group of 1), a pointer as 8 bytes, an int or float in its
    signature's C type (i32: int32_t, fp32: float, ...); then the pointers the compiler appends (global and
    profile scratch), null for a kernel that needs no scratch memory.

``describe_launch`` builds that list and checks it against the compiled kernel's PTX entry (the count and each
parameter's size). A kernel whose list does not match, or that needs scratch memory, a cluster, a cooperative or a
PDL launch, is not planned: its calls keep launch.py's call plan. Dropout calls are never planned (the seed is a
kernel argument), nor a GQA backward that sums dK/dV over splits (a torch sum between launches), nor inputs that
are not contiguous and 16-byte aligned. The plans give the call plan's bits (tests/test_triton_launch_plans.py).
"""
from __future__ import annotations

import re
import struct

from flash_attention_cuda import launch_plans as cpp

__all__ = ["ptx_param_sizes", "describe_launch", "planned_key", "public_key", "forward_plan", "backward_plan",
           "remember_forward", "remember_backward", "remember_public"]

REFUSED: set = set()  # keys whose launches cannot be planned (describe_launch said no): not described again
_C_TYPES = {"i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q", "fp32": "<f", "f32": "<f", "fp64": "<d"}
_PTX_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.[a-z]+(\d+)\b[^,]*?(?:\[(\d+)\])?\s*$")


def ptx_param_sizes(ptx: str, name: str) -> list:
    """The byte size of each parameter of ``.entry name`` in ``ptx``, in order (an array parameter
    ``.b8 x[K]``: K), or [] where the entry is not found."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return []
    sizes = []
    for decl in m.group(1).split(","):
        p = _PTX_PARAM.search(decl.strip())
        if p is None:
            return []
        sizes.append(int(p.group(2)) if p.group(2) else _PTX_BYTES[p.group(1)])
    return sizes


class Buffer(int):
    """A pointer argument: which buffer of the plan (its inputs, then its outputs, in order)."""


def describe_launch(entry, grid3: tuple, buffers: tuple, values: tuple):
    """The C++ description of one launch of a compiled Triton kernel, or None where it cannot be planned.

    entry: launch.py's (compiled kernel, its constexpr values); grid3: (x, y, z); buffers: the plan's buffer
    index of each tensor argument, in order; values: the other run-time arguments (ints, then floats and the
    seed). Returns (CUfunction, grid + block, shared memory, [], [(buffer, 0), ...], [scalar bytes, ...]),
    ``launch_plans.describe``'s form, with the compiler's trailing scratch pointers as null 8-byte scalars."""
    compiled, constexprs = entry
    md = getattr(compiled, "metadata", None)
    if (md is None or getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0)
            or getattr(md, "profile_scratch_size", 0) or not getattr(compiled, "function", None)
            or min(grid3) < 1):
        return None
    types = list(compiled.src.signature.values())
    args = [Buffer(b) for b in buffers] + list(values) + list(constexprs)
    if len(types) != len(args):
        return None
    pointers, scalars, sizes = [], [], []
    for ty, arg in zip(types, args):
        if ty == "constexpr":
            continue
        if isinstance(ty, str) and ty.startswith("*"):
            if type(arg) is not Buffer or scalars:  # pointers come first in the extension's parameter order
                return None
            pointers.append((int(arg), 0))
            sizes.append(8)
            continue
        fmt = _C_TYPES.get(ty)
        if fmt is None or type(arg) is Buffer:
            return None
        scalars.append(struct.pack(fmt, arg))
        sizes.append(len(scalars[-1]))
    ptx = compiled.asm.get("ptx") if hasattr(compiled.asm, "get") else None
    entry_sizes = ptx_param_sizes(ptx or "", md.name)
    tail = entry_sizes[len(sizes):]
    if entry_sizes[:len(sizes)] != sizes or len(tail) > 2 or any(s != 8 for s in tail):
        return None
    scalars += [bytes(8)] * len(tail)  # global and profile scratch: null
    return (int(compiled.function), [*grid3, 32 * md.num_warps, 1, 1], int(md.shared), [], pointers, scalars)


def planned_key(kind: str, call_key, scale: float, drop: tuple):
    """A plan's key: launch.py's call key and the scale, or None (no call key, dropout, plans off)."""
    if call_key is None or drop[0] > 0.0 or not cpp.enabled():
        return None
    return (kind, call_key, scale)


def public_key(q, k, v, causal, softmax_scale, return_lse, window_size, dropout_p, dropout_seed):
    """flash_attn_triton's key in launch_plans.PUBLIC, or None where no plan may answer the call."""
    return cpp.public_forward_key(q, k, v, causal, softmax_scale, None, return_lse, window_size, dropout_p,
                                  dropout_seed, fn="flash_attn_triton")


def _fit(*xs) -> bool:
    """Tensors a plan can take: on a GPU, contiguous, 16-byte aligned (launch_plans.cpp, ``fits``)."""
    return all(x.is_cuda and x.is_contiguous() and x.data_ptr() % 16 == 0 for x in xs)


def forward_plan(key, q, k, v):
    """(O, lse) by the forward's plan under ``key``, or None (no plan, or inputs that do not fit it)."""
    hit = cpp.FORWARD.get(key)
    return None if hit is None else cpp.run(hit, [q, k, v])


def _refuse(key) -> None:
    if len(REFUSED) >= cpp.PLANS_MAX:
        REFUSED.clear()
    REFUSED.add(key)


def remember_forward(key, launch, q, k, v, o, lse, tail: tuple):
    """Register the forward's plan of a call that just ran launch.py's call plan ``launch`` (entry, grid, ints)
    with ``tail`` (scale, dropout_p, seed) on q, k, v -> o, lse. Returns the plan id, or None."""
    if key is None or key in cpp.FORWARD or key in REFUSED or not _fit(q, k, v):
        return None
    entry, grid3, ints = launch
    desc = describe_launch(entry, grid3, (0, 1, 2, 3, 4), (*ints, *tail))
    if desc is None:
        _refuse(key)
        return None
    outputs = [(list(o.shape), o.dtype), (list(lse.shape), lse.dtype)]
    return cpp.register(cpp.FORWARD, key, [q, k, v], outputs, [desc], [0, 1])


def backward_plan(key, q, k, v, o, lse, do):
    """(dQ, dK, dV) by the backward's plan under ``key`` (noted in launch_plans.LAST.backward), or None."""
    hit = cpp.BACKWARD.get(key)
    out = None if hit is None else cpp.run(hit, [q, k, v, o, lse, do])
    cpp.LAST.backward = None if out is None else hit
    return out


def remember_backward(key, plan, q, k, v, o, lse, do, delta, dq, dk, dv, tail: tuple):
    """Register the backward's plan of a call that just ran launch.py's backward call plan ``plan`` (splits 1):
    inputs q, k, v, o, lse, dO; outputs Delta, dQ, dK, dV (dQ, dK, dV returned). Notes it in
    launch_plans.LAST.backward, for the C++ autograd function's slot. Returns the plan id, or None."""
    cpp.LAST.backward = cpp.BACKWARD.get(key)
    if (key is None or cpp.LAST.backward is not None or key in REFUSED or plan.splits != 1
            or not _fit(q, k, v, o, lse, do)):
        return cpp.LAST.backward
    # buffers: q 0, k 1, v 2, o 3, lse 4, dO 5 (the inputs), Delta 6, dQ 7, dK 8, dV 9 (the outputs)
    dq_launch = describe_launch(plan.dq[0], plan.dq[1], (0, 1, 2, 3, 5, 4, 6, 7), (*plan.dq[2], *tail))
    dkdv_launch = describe_launch(plan.dkdv[0], plan.dkdv[1], (0, 1, 2, 5, 4, 6, 8, 9), (*plan.dkdv[2], *tail))
    if dq_launch is None or dkdv_launch is None:
        _refuse(key)
        return None
    outputs = [(list(x.shape), x.dtype) for x in (delta, dq, dk, dv)]
    cpp.LAST.backward = cpp.register(cpp.BACKWARD, key, [q, k, v, o, lse, do], outputs, [dq_launch, dkdv_launch],
                                     [1, 2, 3])
    return cpp.LAST.backward


def remember_public(public, forward_key, needs_grad: bool, make_backward):
    """After a call on the Python path: PUBLIC[public] = its forward's plan, or with a gradient (plan, a backward
    slot whose Python fallback is ``make_backward()``), where the forward has a plan."""
    plan = cpp.FORWARD.get(forward_key) if forward_key is not None else None
    if public is None or plan is None or public in cpp.PUBLIC:
        return
    cpp.remember_public(public, (plan, cpp.add_slot(make_backward())) if needs_grad else plan)
