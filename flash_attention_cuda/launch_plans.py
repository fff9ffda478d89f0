"""Launch plans in C++ (``launch_plans.cpp``): a repeated call's allocations and launches without Python between them.

A call of ``flash_attn_cuda`` on the Python path costs 50-80 us of host time (docs/performance.md, *Host time*):
the checks, two ``torch.empty``, the stream lookup, the parameters packed for ``cuLaunchKernel``. At N = 1024 a
kernel runs about that long, so the host decides. Here the second call of a key (shapes, dtypes, device and every
argument) runs the Python path and then registers what it did as a plan in a small C++ extension: the outputs'
shapes and dtypes and, per launch, the kernel, grid, block, shared memory and where each parameter comes from
(an input, an output at an offset, a tensor map of one, or a constant). Every later call with that key is one
C++ call that allocates, encodes the tensor maps, launches on torch's current stream and returns:

    flash_attn_cuda(q, k, v, ...)        first call of a key: checks, run_forward (the key is noted)
    flash_attn_cuda(q, k, v, ...)        second call: the same, and the plan registered under its key
    flash_attn_cuda(q, k, v, ...)        later calls: PUBLIC[key] -> run(plan, [q, k, v]) -> (O, lse)

(A key is planned on its second call: a shape met once, such as a new length at each decoding step, costs
neither a plan nor, if no key repeats, the extension's build. Each plan, a few hundred bytes, stays for the
process.)

Three lookups use it, each keyed on everything the code it skips would read:
* ``PUBLIC``: flash_attn_cuda's own arguments, each of its plain type (a call with another, ``causal=1``, gets no
  key), q, k, v's shapes, dtypes and device, and whether the call needs a gradient (``public_forward_key``): such a
  call skips the checks too. A call the checks would refuse has a key of its own, so it never finds a plan. A call that needs a gradient runs in a C++ autograd function (``run_public``): the
  forward's plan, and in the backward the backward's plan, registered in the call's slot by the first backward
  that runs on the Python path (``add_slot``), so from the fourth step of a shape on a training step's attention
  runs no Python of ours but the public call's key.
* ``FORWARD``: run_forward's checked arguments (``checked_key``): the autograd and ``torch.compile`` paths.
* ``BACKWARD``: run_backward's (``checked_key``): the backward's four allocations and three or four launches.
What a key leaves out, ``run`` checks in C++: every input of the plan's shape, contiguous, on the plan's device
(the current one), 16-byte aligned; otherwise it returns None and the caller takes the Python path. Dropout (whose
seed is a kernel argument) and inputs that the Python path copies (padded D, strided or misaligned inputs) are
never planned.

``flash_attention_triton/launch_plans.py`` describes Triton's compiled kernels to the same extension
(``register``), so ``flash_attn_triton``'s repeated calls run the same way, in the same tables (its keys are tagged
with the function's name).

The extension is built with ``torch.utils.cpp_extension`` at the first plan registered on a GPU (about 25 s, once per
machine; torch caches the build). ``FA_CUDA_LAUNCH_PLANS=0`` turns plans off; a build that fails warns once and
leaves every call on the Python path, which gives the same results bit for bit.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings

from . import runtime

__all__ = ["enabled", "module", "public_forward_key", "checked_key", "describe", "remember", "register", "run",
           "run_public", "remember_public", "add_slot", "PUBLIC", "FORWARD", "BACKWARD", "LAST", "clear"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_plans.cpp")
ENABLED = os.environ.get("FA_CUDA_LAUNCH_PLANS", "1") != "0"
PLANS_MAX = 4096  # keys kept per table; a fuller table is cleared (the C++ plans stay: a few hundred bytes each)
SEEN: dict = {}  # keys of run_forward and run_backward seen once: a key is planned on its second Python-path call
PUBLIC: dict = {}  # public_forward_key -> plan id, or (forward plan id, backward slot id) for a differentiable call
FORWARD: dict = {}  # checked_key of run_forward -> plan id
BACKWARD: dict = {}  # checked_key of run_backward -> plan id
_EXT = None  # the built extension; False where it is off or cannot be built here
_LOCK = threading.Lock()
_Tensor = None  # torch.Tensor, once torch is imported
LAST = threading.local()  # .backward: the plan run_backward ran or registered on this thread's last call, or None


def module():
    """The built extension, building it on first use; False where plans are off or it cannot be built."""
    global _EXT
    if _EXT is None:
        with _LOCK:
            if _EXT is None:
                _EXT = _build()
    return _EXT


def enabled() -> bool:
    """Plans are on (``ENABLED``, and the driver launch, ``runtime.DRIVER_LAUNCH``) and not known to be unbuildable."""
    return ENABLED and runtime.DRIVER_LAUNCH and _EXT is not False


def _build():
    if not ENABLED:
        return False
    try:
        import torch
        from torch.utils import cpp_extension

        if torch.version.cuda is None or not torch.cuda.is_available():
            return False
        print("flash_attention_cuda: building the C++ launch plans (launch_plans.cpp; once per machine, about 25 s; "
              "FA_CUDA_LAUNCH_PLANS=0 skips them)", file=sys.stderr, flush=True)
        ext = cpp_extension.load(name="fa_ladder_launch_plans", sources=[SOURCE], extra_cflags=["-O2"],
                                 with_cuda=True, verbose=False)
        lib = runtime._libcuda()
        ext.set_driver(ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value,
                       ctypes.cast(lib.cuTensorMapEncodeTiled, ctypes.c_void_p).value)
        return ext
    except Exception as err:  # no compiler, no CUDA headers, ...: the Python path does the same work
        warnings.warn(f"flash_attention_cuda: the C++ launch plans could not be built ({type(err).__name__}: {err}); "
                      f"every call takes the Python path (set FA_CUDA_LAUNCH_PLANS=0 to skip the attempt)",
                      RuntimeWarning, stacklevel=3)
        return False


def _turn_off(why: str) -> None:
    """Plans off for the rest of the process, with one warning: every call takes the Python path."""
    global _EXT
    _EXT = False
    warnings.warn(f"flash_attention_cuda: C++ launch plans turned off: {why}; every call takes the Python path",
                  RuntimeWarning, stacklevel=3)


def _tensor_class():
    """torch.Tensor once torch is imported (this package imports without it), else None."""
    global _Tensor
    if _Tensor is None and "torch" in sys.modules:
        _Tensor = sys.modules["torch"].Tensor
    return _Tensor


def _plain_tensors(*xs) -> bool:
    T = _tensor_class()
    return T is not None and all(type(x) is T for x in xs)


_SCALE_TYPES = (int, float, type(None))
_KERNEL_TYPES = (str, type(None))


def public_forward_key(q, k, v, causal, softmax_scale, kernel, return_lse, window_size, dropout_p, dropout_seed,
                       fn: str = "flash_attn_cuda"):
    """The key of a public call (``fn``: flash_attn_cuda, or flash_attn_triton with kernel None), or None where
    no plan may answer the call: plans off, not three plain torch tensors, dropout, a ``torch.compile`` trace, or
    an argument whose check reads more than the key (|softmax_scale| > 1 reads the data) or whose type is not the
    plain one (``causal=1``, a window that is not a tuple of two ints, ...: those calls take the Python path, whose
    checks refuse or read them). So a key's values have one type each, and ``causal=1`` never finds the plan of
    ``causal=True``, nor one function's call the other's plan. Its last entry: whether the call needs a gradient.

    What the C++ ``run`` checks before it launches (``fits``: each input's shape, contiguous, on the plan's device,
    16-byte aligned) the key leaves out, but for the shapes, which pick the plan: a strided or misaligned view of a
    planned call's shapes finds its plan, is refused by it and takes the Python path. The dtypes, which ``fits``
    does not read, are in the key, all three."""
    T = _Tensor or _tensor_class()  # three plain torch tensors (written out: this runs on every call)
    if not enabled() or T is None or type(q) is not T or type(k) is not T or type(v) is not T:
        return None
    if dropout_seed is not None or type(window_size) is not tuple:
        return None
    if not (type(causal) is bool and type(return_lse) is bool and type(softmax_scale) in _SCALE_TYPES
            and type(kernel) in _KERNEL_TYPES and type(dropout_p) in (int, float) and len(window_size) == 2
            and type(window_size[0]) is int and type(window_size[1]) is int):
        return None
    if softmax_scale is not None and abs(softmax_scale) > 1.0:
        return None
    torch = sys.modules["torch"]
    if torch.compiler.is_compiling():
        return None
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (fn, causal, softmax_scale, kernel, return_lse, window_size, dropout_p, q.shape, q.dtype, q.device,
            k.shape, k.dtype, v.shape, v.dtype, grad)


def checked_key(q, k, window, scale: float, kernel: str, config, dropout):
    """The key of run_forward's and run_backward's checked arguments (FORWARD and BACKWARD), or None where plans
    cannot answer (off, not torch tensors, dropout)."""
    if not (enabled() and _plain_tensors(q, k)) or dropout[0] > 0.0:
        return None
    return (kernel, config, scale, window, q.shape, k.shape, q.dtype, q.device)


def run(plan: int, inputs: list):
    """Run plan ``plan`` on ``inputs`` -> a tuple of its outputs, or None where they do not fit it."""
    return _EXT.run(plan, inputs)


def run_public(hit, q, k, v):
    """(O, lse) of a call whose public key found ``hit`` (a PUBLIC entry), or None where q, k, v do not fit it."""
    if type(hit) is int:
        return _EXT.run(hit, [q, k, v])
    return _EXT.run_autograd(hit[0], hit[1], q, k, v)


def remember_public(key, hit) -> None:
    """PUBLIC[key] = hit (a plan id, or (plan id, slot id)); a full table is cleared first, as remember's are."""
    if len(PUBLIC) >= PLANS_MAX:
        PUBLIC.clear()
    PUBLIC[key] = hit


def add_slot(python_backward) -> int:
    """A backward slot for a differentiable public key. Until the slot holds a plan (and whenever the backward
    records a graph, or its inputs do not fit), the C++ backward calls ``python_backward(q, k, v, o, lse, dO)``
    -> (dQ, dK, dV) with the GIL; the first such call that runs a planned backward (``LAST.backward``) puts that
    plan in the slot."""
    import torch

    slot = None

    def fallback(q, k, v, o, lse, do):
        LAST.backward = None
        grads = python_backward(q, k, v, o, lse, do)
        plan = getattr(LAST, "backward", None)
        if plan is not None and not torch.is_grad_enabled():
            _EXT.set_slot(slot, plan)
        return tuple(g.contiguous() for g in grads)

    slot = _EXT.add_slot(fallback)
    return slot


def describe(specs, inputs: dict, outputs: tuple, at: dict, function_of) -> tuple:
    """The C++ description of a plan that launches ``specs`` (launch_specs.LaunchSpec) in order.

    inputs: name -> shape of the buffers ``run`` takes, in its order (``Q``, ``K``, ``V``); outputs: ((name, shape,
    torch dtype), ...) allocated by each call, in order; at: name -> (buffer, byte offset) for the buffers that sit
    inside another (a scratch allocation's Delta, dQaccum, ...); function_of(spec): the kernel's CUfunction
    handle. Returns (outputs as (shape, dtype), launches as (function, grid + block, smem, maps, buffers,
    scalar bytes)), maps as (buffer index, dims, byte strides, box, swizzle) (runtime.tensor_map_layout)."""
    names = list(inputs) + [name for name, _, _ in outputs]
    shapes = {**inputs, **{name: shape for name, shape, _ in outputs}}

    def where(name):
        base, offset = at.get(name, (name, 0))
        return names.index(base), offset

    launches = []
    for spec in specs:
        packed = runtime.Packed(spec)  # the Python driver launch's parameters: the same dims and C scalar values
        maps = []
        for _, name, rows in spec.maps:
            dims, strides, box = runtime.tensor_map_layout(shapes[name], rows)
            maps.append((where(name)[0], list(dims), list(strides), list(box), runtime._TMA_SWIZZLE[box[0]]))
        buffers = [where(name) for name in spec.buffers]
        launches.append((int(function_of(spec)), list(packed.dims), int(spec.smem), maps, buffers,
                         [bytes(value) for value in packed.scalars]))
    return [(list(shape), dtype) for _, shape, dtype in outputs], launches


def remember(table: dict, key, specs, inputs: dict, outputs: tuple, at: dict, returned: tuple):
    """Register the plan of a call that just ran ``specs`` on the Python path under ``key`` in ``table``.

    inputs: name -> the call's tensor, in ``run``'s order; outputs: ((name, tensor), ...) the call allocated;
    at and returned (output names ``run`` returns): as ``describe``. A key is planned on its second call, so a
    shape met once (a new length each decoding step, a test's one case) costs neither a plan nor the build.
    Nothing is registered where the extension is off or cannot be built. Returns the plan id, or None."""
    if key is None:
        return None
    seen_key = (id(table), key)
    if seen_key not in SEEN:
        if len(SEEN) >= PLANS_MAX:
            SEEN.clear()
        SEEN[seen_key] = True
        return None
    if not module():
        return None
    device = next(iter(inputs.values())).device.index
    out = tuple((name, tuple(x.shape), x.dtype) for name, x in outputs)
    desc_outputs, launches = describe(specs, {name: tuple(x.shape) for name, x in inputs.items()}, out, at,
                                      lambda spec: runtime.get_kernel(spec.source, spec.name, device).kernel.ptr)
    out_names = [name for name, _ in outputs]
    return register(table, key, list(inputs.values()), desc_outputs, launches, [out_names.index(r) for r in returned])


def register(table: dict, key, inputs: list, outputs: list, launches: list, returned: list):
    """Register a described plan (``describe``'s outputs and launches; ``returned``: output indices) for the
    tensors ``inputs`` of the call that made it, under ``key`` in ``table``; every input must be 16-byte aligned.
    Returns the plan id, or None where the extension is off or cannot be built. A plan the extension refuses turns
    plans off for the process (one warning); the call that made it has already run."""
    if not module():
        return None
    try:
        plan = _EXT.add_plan(inputs[0].device.index, [True] * len(inputs), [list(x.shape) for x in inputs], outputs,
                             launches, list(returned))
    except Exception as err:  # a plan the extension refuses: plans off for the process, the call already ran
        _turn_off(f"registering a plan failed ({type(err).__name__}: {err})")
        return None
    if len(table) >= PLANS_MAX:
        table.clear()
    table[key] = plan
    return plan


def clear() -> None:
    """Forget every key (the C++ plans stay registered, unused): tests start from the Python path."""
    SEEN.clear()
    PUBLIC.clear()
    FORWARD.clear()
    BACKWARD.clear()
