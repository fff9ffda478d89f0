#!/usr/bin/env python
"""Time the Triton backward at one shape: through autograd (as the benchmark does), alone, and with every config.

    PYTHONPATH=. python tools/triton_backward_configs.py --n 1024 --head-dim 128                # on a CUDA GPU
    PYTHONPATH=. python tools/triton_backward_configs.py --batch 4 --heads 32 --head-dim 64 --causal both
    PYTHONPATH=. python tools/triton_backward_configs.py --batch 1 --n 16384 --window 256,256 --extra dkdv:32,128,4,3

For one shape (B, H, N, D) and each dtype and causal setting, one line each:

* ``autograd``: ``torch.autograd.grad`` of a kept graph, the call the benchmark times, three times over
  (``benchmarks.measure.time_gpu``: do_bench median [20th, 80th percentile]), and its host time per call
  (``benchmarks.measure.time_host``): where the host time is longer than the kernels', the GPU waits;
* ``alone``: ``launch._backward`` (dQ with Delta, then dK/dV; no autograd, no Python around it), with the autotuned
  configs (printed);
* ``sdpa-flash``: FlashAttention-2's backward through autograd, the same two ways (and, with ``--cuda``,
  ``flash_attn_cuda``'s; with ``--calling-thread``, each of these again with autograd's multithreading off:
  the backward on the calling thread instead of the device thread autograd runs CUDA nodes on);
* then each candidate of ``configs.DKDV_CONFIGS`` (with the tuned dQ config) and of ``configs.DQ_CONFIGS``
  (with the tuned dK/dV config), ``launch._backward`` alone, and each ``--extra`` config not among them.

``--window LEFT,RIGHT`` times a sliding window (``window_size``; --causal then sets nothing) with the ``alone`` and
per-config lines only.

TFLOP/s are 2.5 x 4·B·H·N²·D (x0.5 causal) over the median.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16,bfloat16")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="no")
    ap.add_argument("--no-candidates", action="store_true", help="skip the per-config lines")
    ap.add_argument("--window", default=None, help="LEFT,RIGHT: a sliding window instead of --causal (alone and "
                                                   "per-config lines only)")
    ap.add_argument("--extra", action="append", default=[],
                    help="KERNEL:BM,BN,WARPS,STAGES, a config to time beside the candidates (repeatable), e.g. "
                         "dkdv:32,128,4,3")
    ap.add_argument("--cuda", action="store_true", help="also flash_attn_cuda (kernel='auto') through autograd")
    ap.add_argument("--calling-thread", action="store_true",
                    help="also time each autograd line with torch.autograd.set_multithreading_enabled(False): the "
                         "backward on the calling thread instead of autograd's device thread")
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the timings are of the compiled kernels)")
    from benchmarks.measure import time_gpu, time_host
    from flash_attention_py.common import attention_flops
    from flash_attention_py.inputs import make_inputs
    from flash_attention_triton import configs as C
    from flash_attention_triton import launch as L
    from flash_attention_triton.attention import FlashAttnTritonFunction

    B, H, N, D = args.batch, args.heads, args.n, args.head_dim
    scale = D ** -0.5
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    extra = {"dkdv": [], "dq": []}
    for item in args.extra:
        kernel, _, cfg = item.partition(":")
        if kernel not in extra or len(cfg.split(",")) != 4:
            ap.error(f"--extra: expected dkdv:BM,BN,WARPS,STAGES or dq:BM,BN,WARPS,STAGES, got {item!r}")
        extra[kernel].append(tuple(int(c) for c in cfg.split(",")))
    window = None
    if args.window is not None:
        left, right = (int(c) for c in args.window.split(","))
        window, causals = (left, right), (False,)
    print(f"Triton backward, B={B} H={H} N={N} D={D}; times in ms (do_bench median [p20, p80]); "
          f"GPU {torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}", flush=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for dtype in args.dtype.split(","):
        for causal in causals:
            # with a window, the visible scores only (as the variants benchmark counts them)
            flops = attention_flops(B, H, N, N, D, causal=causal, mode="bwd", window_size=window)
            tf = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
            x = make_inputs(B, H, N, N, D, dtype=dtype, device="cuda")
            q, k, v, do = x["q"], x["k"], x["v"], x["do"]
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            head = f"{dtype} causal={'yes' if causal else 'no'}" + (f" window={window}" if window else "")
            if window is not None:
                o, lse = L._forward(q, k, v, window, scale)
                alone = lambda cfg=None: L._backward(q, k, v, o, lse, do, window, scale, configs=cfg)  # noqa: E731
                alone()  # autotunes this key
                _configs(C, L, alone, head, tf, D, window, dtype, extra, args.no_candidates)
                continue
            with torch.enable_grad():
                o_auto, _ = FlashAttnTritonFunction.apply(qg, kg, vg, causal, scale)
                o_cuda = None
                if args.cuda:
                    from flash_attention_cuda import flash_attn_cuda

                    o_cuda = flash_attn_cuda(qg, kg, vg, causal=causal, softmax_scale=scale)
                o_fa2 = None
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    o_fa2 = sdpa(qg, kg, vg, is_causal=causal, scale=scale)
            o, lse = L._forward(q, k, v, causal, scale)

            def alone(cfg=None):
                return L._backward(q, k, v, o, lse, do, causal, scale, configs=cfg)

            def grad_of(out):
                return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

            alone()  # autotunes this length bucket
            torch.cuda.synchronize()
            lines = [("triton autograd", grad_of(o_auto)), ("sdpa-flash autograd", grad_of(o_fa2))]
            if o_cuda is not None:
                lines.append(("cuda autograd", grad_of(o_cuda)))
            for threads in (True, False) if args.calling_thread else (True,):
                for name, fn in lines:
                    with torch.autograd.set_multithreading_enabled(threads):
                        runs = [time_gpu(fn, repeats=5) for _ in range(3)]
                        host = time_host(fn, device="cuda", calls=300)[0]
                    txt = "; ".join(f"{m:.4f} [{lo:.4f}, {hi:.4f}] = {tf(m):.0f} TFLOP/s" for m, lo, hi, *_ in runs)
                    label = name if threads else name + " (calling thread)"
                    print(f"{head} {label}: {txt}; host {host * 1e3:.0f} us/call", flush=True)
            _configs(C, L, alone, head, tf, D, (-1, 0 if causal else -1), dtype, extra, args.no_candidates)
    return 0


def _configs(C, L, alone, head, tf, D, window, dtype, extra, no_candidates):
    """The ``alone`` line with the tuned configs, then every candidate and extra config of each kernel (the other
    kernel on its tuned config)."""
    import torch
    import triton

    from benchmarks.measure import time_gpu

    m, lo, hi, *_ = time_gpu(alone, repeats=5)
    plan = {key[0]: cfg for key, cfg in L._PLAN.items()
            if key[3] == D and tuple(key[4:6]) == tuple(window) and key[-2] == getattr(torch, dtype)}
    print(f"{head} triton alone: {m:.4f} [{lo:.4f}, {hi:.4f}] = {tf(m):.0f} TFLOP/s; tuned configs "
          f"(BLOCK_M, BLOCK_N, warps, stages): {plan}", flush=True)
    if no_candidates:
        return
    for kernel, other in (("dkdv", "dq"), ("dq", "dkdv")):
        for cand in list(C.CANDIDATES[kernel]) + [c for c in extra[kernel] if c not in C.CANDIDATES[kernel]]:
            try:
                ms = triton.testing.do_bench(lambda: alone({kernel: cand, other: plan[other]}), warmup=25, rep=100)
                print(f"  {kernel} {cand}: {ms:.4f} ms = {tf(ms):.0f} TFLOP/s", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is a line, not the end
                print(f"  {kernel} {cand}: failed: {type(exc).__name__}: {str(exc)[:80]}")


if __name__ == "__main__":
    sys.exit(main())
