#!/usr/bin/env python
"""Where the host time of a CUDA-rung call goes: cProfile of many back-to-back calls at a tiny shape.

    PYTHONPATH=. python tools/host_profile.py --out results/host_profile      # on a GPU
    PYTHONPATH=. python tools/host_profile.py --triton --out results/host_profile      # flash_attn_triton

At B=H=1, N=64, D=64 (fp16; the GPU time is a few microseconds, so the wall time per call is host time) it
times, per call and with ``time.perf_counter`` over ``--calls`` calls after a warm-up:

* ``flash_attn_cuda`` forward (kernel=auto), the forward + backward through autograd (causal), and the
  backward alone, through autograd on a kept graph (as the benchmark times it) and ``run_backward`` itself;
* the pieces of a forward: the checks alone (``checks.check_forward_cached``), the two output allocations,
  and ``runtime.launch`` of the already-built launch spec (the CuPy launch); and of ``run_backward``: its cached
  plan (``launch_specs.backward_plan``), its four allocations and the launches of its kernels;
* SDPA's FlashAttention-2 forward, forward + backward and backward alone, for scale, and the backward of a
  Python ``torch.autograd.Function`` that does nothing (what autograd costs any Python backward);
* the CUDA-rung lines again with every launch through CuPy (``runtime.DRIVER_LAUNCH = False``) instead of the
  driver's ``cuLaunchKernel``, to show what the direct launch saves;
* the first lines run the C++ launch plans wherever a call repeats (``flash_attention_cuda/launch_plans.py``:
  the forward, and the forward + backward); they come again with the plans off (``launch_plans.ENABLED =
  False``, as ``FA_CUDA_LAUNCH_PLANS=0``), every call on the Python path whose pieces the lines above time.

It then times the forward (with grad) and the kept graph's backward alone and alternating, with the time spent
inside ``launch_specs.run_forward`` and ``run_backward``: autograd runs our backward (Python) on its CUDA device
thread and the forward runs on the caller's, and the same Python is slower when the two alternate. Then it runs
cProfile over the forward, the forward + backward and the backward alone, and writes the top functions by own
time.
Writes ``host_profile.txt`` into --out and prints it. With ``--triton``, the same for ``flash_attn_triton`` instead
(``triton_section``): ``host_profile_triton.txt``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time


def per_call_us(fn, calls: int, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def threads_section(qg, kg, vg, do, bwd_kept, n: int, sync, kernel: str) -> list:
    """The same Python, slower when forward and backward alternate: autograd runs a CUDA graph's backward nodes
    (ours is Python: custom_ops' autograd.Function) on its own device thread, the forward runs on the caller's.
    Times each loop per call, and the time spent inside launch_specs.run_forward / run_backward per call."""
    import time

    from flash_attention_cuda import flash_attn_cuda, library_ops

    inside = {"run_forward": 0.0, "run_backward": 0.0}
    originals = {name: getattr(library_ops, name) for name in inside}

    def timed(name):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return originals[name](*a, **kw)
            finally:
                inside[name] += time.perf_counter() - t0
        return call

    def fwd_grad():
        return flash_attn_cuda(qg, kg, vg, causal=True, kernel=kernel)

    def fwd_then_kept_bwd():  # the forward's graph is dropped; the backward is the kept graph's, as bwd_kept
        fwd_grad()
        return bwd_kept()

    out = ["", "forward and backward on two threads (us per call; inside: launch_specs.run_forward / run_backward):"]
    try:
        for name in inside:
            setattr(library_ops, name, timed(name))
        for label, fn in (("forward with grad (the graph unused)", fwd_grad), ("backward of a kept graph", bwd_kept),
                          ("the two alternating", fwd_then_kept_bwd)):
            for key in inside:  # per_call_us's 20 warm-up calls count too: divided by n + 20 below
                inside[key] = 0.0
            total = per_call_us(fn, n, sync)
            out.append(f"{label:<64} {total:8.1f}   inside: run_forward {inside['run_forward'] / (n + 20) * 1e6:6.1f}, "
                       f"run_backward {inside['run_backward'] / (n + 20) * 1e6:6.1f}")
    finally:
        for name, fn in originals.items():
            setattr(library_ops, name, fn)
    return out


def triton_section(n: int, sync) -> list:
    """flash_attn_triton's host time per call at the same shape: the forward, the backward through autograd (a kept
    graph, as the benchmark times it), and the launchers alone, with their call plans (``launch._CALLS``: the
    launches of an earlier call like this one, replayed) and through the full path (``launch._backward_full``,
    ``_forward`` with the plans emptied before each call), beside SDPA's FA2 and an autograd.Function that does
    nothing; then a cProfile of the kept graph's backward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flash_attention_py.inputs import make_inputs
    from flash_attention_triton import flash_attn_triton
    from flash_attention_triton import launch as L

    x = make_inputs(1, 1, 64, 64, 64, dtype="float16", device="cuda")
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    kept = flash_attn_triton(qg, kg, vg, causal=True)
    kept_sdpa = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o, lse = L._forward(q, k, v, (-1, 0), 0.125)
    drop = L.dropout_args()

    def fwd_full():
        L._CALLS.clear()
        return L._forward(q, k, v, (-1, 0), 0.125)

    def bwd_full():
        return L._backward_full(q, k, v, o, lse, do, (-1, 0), 0.125, {}, drop, None)

    def no_cpp(fn):  # the Python call plan alone: no C++ launch plan found or made
        def call():
            planned_key, L.launch_plans.planned_key = L.launch_plans.planned_key, lambda *a: None
            try:
                return fn()
            finally:
                L.launch_plans.planned_key = planned_key
        return call

    timed = (("flash_attn_triton forward", lambda: flash_attn_triton(q, k, v)),
             ("  launch._forward (its C++ launch plan, where plans are on)",
              lambda: L._forward(q, k, v, (-1, 0), 0.125)),
             ("  launch._forward (its call plan)", no_cpp(lambda: L._forward(q, k, v, (-1, 0), 0.125))),
             ("  launch._forward (the full path: no call plans)", fwd_full),
             ("flash_attn_triton forward + backward (causal, autograd)",
              lambda: torch.autograd.grad(flash_attn_triton(qg, kg, vg, causal=True), (qg, kg, vg), do)),
             ("flash_attn_triton backward (causal, autograd.grad of a kept graph)",
              lambda: torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True)),
             ("  launch._backward (its C++ launch plan, where plans are on)",
              lambda: L._backward(q, k, v, o, lse, do, (-1, 0), 0.125)),
             ("  launch._backward (its call plan)", no_cpp(lambda: L._backward(q, k, v, o, lse, do, (-1, 0), 0.125))),
             ("  launch._backward_full (the full path)", bwd_full),
             ("sdpa FA2 backward (causal, autograd.grad of a kept graph)",
              lambda: torch.autograd.grad(kept_sdpa, (qg, kg, vg), do, retain_graph=True)))
    lines = ["", "flash_attn_triton, the same shape (us per call):"]
    for name, fn in timed:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            lines.append(f"{name:<64} {per_call_us(fn, n, sync):8.1f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n // 2):
        torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True)
    sync()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
    return lines + ["", f"cProfile of {n // 2} calls of flash_attn_triton's backward (kept graph), by own time:",
                    buf.getvalue()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--kernel", default="auto")
    ap.add_argument("--triton", action="store_true", help="only flash_attn_triton's lines (host_profile_triton.txt)")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    if args.triton:
        text = "\n".join([f"host time per call, microseconds ({torch.cuda.get_device_name()}, torch {torch.__version__}"
                          f"; B=H=1 N=64 D=64 fp16, {args.calls} calls)"] + triton_section(args.calls, torch.cuda.synchronize))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_profile_triton.txt"), "w") as f:
            f.write(text + "\n")
        print(text)
        return 0
    from flash_attention_cuda import flash_attn_cuda, launch_plans, launch_specs, runtime
    from flash_attention_cuda.checks import check_forward_cached
    from flash_attention_py.inputs import make_inputs

    x = make_inputs(1, 1, 64, 64, 64, dtype="float16", device="cuda")
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    sync, n = torch.cuda.synchronize, args.calls

    def fwd():
        return flash_attn_cuda(q, k, v, kernel=args.kernel)

    def fwd_bwd():
        out = flash_attn_cuda(qg, kg, vg, causal=True, kernel=args.kernel)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    def sdpa_fwd():  # timed inside one sdpa_kernel(FLASH_ATTENTION) context (entering it costs more than a call)
        return F.scaled_dot_product_attention(q, k, v)

    def sdpa_fwd_bwd():
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    # the pieces of one forward
    checked = check_forward_cached(q, k, v, causal=False, softmax_scale=None, kernel=args.kernel, return_lse=False,
                                   fn="flash_attn_cuda", window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)
    _, _, _, scale, kernel, window, dropout = checked
    p = launch_specs._problem(q, k, scale, window, dropout=dropout)
    o, lse = runtime.empty(q, q.shape, p.dtype), runtime.empty(q, q.shape[:3], "float32")
    spec = launch_specs.forward_spec(kernel, p, vec4=True)
    stream = runtime.Stream(q)
    arrays = dict(Q=q, K=k, V=v, O=o, LSE=lse)

    def checks_only():
        return check_forward_cached(q, k, v, causal=False, softmax_scale=None, kernel=args.kernel, return_lse=False,
                                    fn="flash_attn_cuda", window_size=(-1, -1), dropout_p=0.0, dropout_seed=None)

    def alloc_only():
        return runtime.empty(q, q.shape, p.dtype), runtime.empty(q, q.shape[:3], "float32")

    def launch_only():
        runtime.launch(stream, spec, arrays)

    def stream_only():
        return runtime.Stream(q)

    # the backward alone: through autograd on a kept graph (as the benchmark times it), and run_backward itself
    kept = flash_attn_cuda(qg, kg, vg, causal=True, kernel=args.kernel)
    kept_sdpa = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    o_c, lse_c = flash_attn_cuda(q, k, v, causal=True, kernel=args.kernel, return_lse=True)

    def bwd_kept():
        return torch.autograd.grad(kept, (qg, kg, vg), do, retain_graph=True)

    def run_backward_only():
        return launch_specs.run_backward(q, k, v, o_c, lse_c, do, (-1, 0), scale)

    # the pieces of one run_backward: its plan (cached), its four allocations (dQ, dK, dV, one float32 scratch
    # buffer) and its launches
    plan_args = ("auto", p.dtype, tuple(q.shape), tuple(k.shape), runtime.device_cc(q), (-1, 0), scale, (0.0, None))
    bplan = launch_specs.backward_plan(*plan_args)

    def bwd_plan_only():
        return launch_specs.backward_plan(*plan_args)

    def bwd_alloc_only():
        return [runtime.empty(q, x.shape, p.dtype) for x in (q, k, v)] + [
            runtime.empty(q, (bplan.scratch_size,), "float32")]

    bufs = bwd_alloc_only()
    barrays = dict(Q=q, K=k, V=v, O=o_c, dO=do, LSE=lse_c, dQ=bufs[0], dK=bufs[1], dV=bufs[2],
                   **{name: runtime.ptr(bufs[3]) + 4 * offset for name, offset in bplan.scratch})

    def bwd_launch_only():
        for spec in bplan.specs:
            runtime.launch(stream, spec, barrays)

    class Nothing(torch.autograd.Function):  # a Python backward that does no work: the floor of ours
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q.clone()

        @staticmethod
        def backward(ctx, grad):
            ctx.saved_tensors
            return grad, grad, grad

    kept_nothing = Nothing.apply(qg, kg, vg)

    def nothing_bwd_kept():
        return torch.autograd.grad(kept_nothing, (qg, kg, vg), do, retain_graph=True)

    def sdpa_bwd_kept():
        return torch.autograd.grad(kept_sdpa, (qg, kg, vg), do, retain_graph=True)

    lines = [f"host time per call, microseconds ({torch.cuda.get_device_name()}, torch {torch.__version__}; "
             f"B=H=1 N=64 D=64 fp16, kernel={args.kernel} -> {kernel}, {n} calls)", ""]
    timed = (("flash_attn_cuda forward", fwd), ("  checks (cached)", checks_only),
             ("  two output allocations", alloc_only), ("  runtime.Stream(q)", stream_only),
             ("  runtime.launch of the built spec", launch_only),
             ("flash_attn_cuda forward + backward (causal, autograd)", fwd_bwd),
             ("flash_attn_cuda backward (causal, autograd.grad of a kept graph)", bwd_kept),
             ("  launch_specs.run_backward alone (no autograd)", run_backward_only),
             ("    its plan (launch_specs.backward_plan, cached)", bwd_plan_only),
             ("    its four allocations (dQ, dK, dV, the float32 scratch)", bwd_alloc_only),
             (f"    runtime.launch of its {len(bplan.specs)} kernels", bwd_launch_only),
             ("sdpa FA2 forward", sdpa_fwd), ("sdpa FA2 forward + backward (causal)", sdpa_fwd_bwd),
             ("sdpa FA2 backward (causal, autograd.grad of a kept graph)", sdpa_bwd_kept),
             ("a Python autograd.Function whose backward does nothing (kept graph)", nothing_bwd_kept))
    for name, fn in timed:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            lines.append(f"{name:<64} {per_call_us(fn, n, sync):8.1f}")
    lines += threads_section(qg, kg, vg, do, bwd_kept, n, sync, args.kernel)
    launch_plans.ENABLED = False
    lines.append("the Python path (C++ launch plans off, launch_plans.ENABLED = False):")
    for name, fn in (timed[0], timed[5], timed[6], timed[7]):
        lines.append(f"{name:<64} {per_call_us(fn, n, sync):8.1f}")
    launch_plans.ENABLED = True
    runtime.DRIVER_LAUNCH = False
    lines.append("launches through CuPy (runtime.DRIVER_LAUNCH = False):")
    for name, fn in (timed[0], timed[4], timed[5], timed[6], timed[7], timed[10]):
        lines.append(f"{name:<64} {per_call_us(fn, n, sync):8.1f}")
    runtime.DRIVER_LAUNCH = True
    for name, fn in (("forward", fwd), ("forward + backward", fwd_bwd), ("backward of a kept graph", bwd_kept)):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n // 2):
            fn()
        sync()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        lines += ["", f"cProfile of {n // 2} calls of the {name}, by own time:", buf.getvalue()]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_profile.txt"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
