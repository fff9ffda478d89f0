#!/usr/bin/env python
"""Time the Triton backward alone at fixed tile configs on the window shapes, beside FlexAttention's backward.

    PYTHONPATH=. python tools/triton_window_backward.py old            # in a checkout before a kernel change
    PYTHONPATH=. python tools/triton_window_backward.py new --flex     # in the checkout after it, FlexAttention too
    PYTHONPATH=. python tools/triton_window_backward.py new --forward  # the forward instead (an A/B of its kernel)

An A/B of a change to the backward kernels: run it in both checkouts in turn, on one GPU (twice each, so that a
slow spell of the GPU shows). B4 H16 N4096 D128 fp16 (the variants record's window shape), one set of inputs
(seed 1), three cases: the windows (512, 0) and (256, 256) on the configs the autotuner picks for them, dQ
(128, 64, 8, 3) and dK/dV (32, 64, 4, 3), and causal on (128, 64, 8, 3) and (64, 128, 8, 3). Each line is three
``triton.testing.do_bench`` medians (ms) of ``launch._backward`` (dQ with Delta, then dK/dV; no autograd), and
the sum of |dQ| as a check that both checkouts compute the same thing. ``--flex`` then times FlexAttention's
backward of the two windows the way ``benchmarks.variants`` does (``benchmarks.targets.FlexTarget``: the backward
of a kept graph through autograd, its Delta kernel included).
"""
from __future__ import annotations

import argparse
import sys

CASES = [("window (512, 0)", (512, 0), {"dq": (128, 64, 8, 3), "dkdv": (32, 64, 4, 3)}),
         ("window (256, 256)", (256, 256), {"dq": (128, 64, 8, 3), "dkdv": (32, 64, 4, 3)}),
         ("causal", True, {"dq": (128, 64, 8, 3), "dkdv": (64, 128, 8, 3)})]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label", help="the tag each line starts with (which checkout this is)")
    ap.add_argument("--flex", action="store_true", help="also FlexAttention's backward of the two windows")
    ap.add_argument("--forward", action="store_true", help="time the forward instead of the backward")
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the timings are of the compiled kernels)")
    from flash_attention_py.inputs import make_inputs
    from flash_attention_triton import launch as L

    B, H, N, D = 4, 16, 4096, 128
    x = make_inputs(B, H, N, N, D, dtype="float16", device="cuda", seed=1)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    scale = D ** -0.5
    mode = "fwd" if args.forward else "bwd"

    def report(label, fn, check):  # three do_bench medians (ms) of fn, and a checksum: sum |check(fn())|
        name, out = check(fn())
        torch.cuda.synchronize()
        ms = [triton.testing.do_bench(fn, warmup=25, rep=150) for _ in range(3)]
        print(f"{args.label} {label}: " + " ".join(f"{m:.4f}" for m in ms)
              + f" | sum |{name}| {float(out.float().abs().sum()):.4f}", flush=True)

    for name, window, cfg in CASES:
        if args.forward:  # the autotuned config, then a fixed one
            for fwd_cfg in (None, (128, 64, 8, 3)):
                report(f"fwd {name} config {fwd_cfg or 'tuned'}",
                       lambda: L._forward(q, k, v, window, scale, config=fwd_cfg), lambda r: ("O", r[0]))
        else:
            o, lse = L._forward(q, k, v, window, scale)
            report(name, lambda: L._backward(q, k, v, o, lse, do, window, scale, configs=cfg), lambda r: ("dQ", r[0]))
    if args.flex:
        from benchmarks.targets import FlexTarget

        target = FlexTarget()
        for name, window, _ in CASES[:2]:
            with target.context():
                f = target.prepare(x, False, mode, window_size=window)
                f()
                torch.cuda.synchronize()
                ms = [triton.testing.do_bench(f, warmup=25, rep=150) for _ in range(3)]
            print(f"flex {mode} {name}: " + " ".join(f"{m:.4f}" for m in ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
