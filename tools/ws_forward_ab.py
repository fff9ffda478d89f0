#!/usr/bin/env python
"""Time the wgmma-ws forward (or, with --backward, backward) alone, in the library's config and grid, at a few
shapes: one checkout against another. ``--backend triton`` times the Triton kernels instead (autotuned, as
``flash_attn_triton`` launches them).

    PYTHONPATH=. python tools/ws_forward_ab.py --label new                 # on a Hopper GPU, in this checkout
    (cd ../other && PYTHONPATH=. python ../main/tools/ws_forward_ab.py --label old)   # the same, in another one
    PYTHONPATH=. python tools/ws_forward_ab.py --label new --backward --window 256,256 --shapes 1x16x16384x128
    PYTHONPATH=. python tools/ws_forward_ab.py --label new --dropout 0.1 --shapes 4x32x4096x64,4x16x4096x128
    PYTHONPATH=. python tools/ws_forward_ab.py --label mqa --kv-heads 1 --shapes 1x32x16384x128
    FA_CUDA_LAUNCH_PLANS=0 PYTHONPATH=. python tools/ws_forward_ab.py --label new --backend triton

Run it in two checkouts in turn, on the same machine (and once more in the first, to see the spread): the kernels
compile from whichever checkout is on PYTHONPATH, so the two lines of a shape compare two versions of the kernel and
its launch. Prints one line per shape: label, fwd or bwd, dtype, B, H (Hq/Hk with --kv-heads), N, D, the mask (not-causal, causal, or the
window), the median time in ms and TFLOP/s (4·B·H·N²·D, x0.5 causal, x2.5 backward, counting visible scores only, over
the median of CUDA-graph replays, ``triton.testing.do_bench_cudagraph``). The backward is the whole of it: its
preprocess, the one-kernel wgmma_bwd_ws and the dQ store (Triton: the preprocess and the dK/dV and dQ kernels).
``--backend cuda-wgmma`` or ``cuda-mma`` times that rung's forward and the backward its autograd runs
(``capabilities.BACKWARD_OF``: wgmma_bwd_ws after wgmma, the mma rung's own after mma).
With ``--backend triton`` the first call of a shape tunes the kernels (their choice is then cached); the C++ launch
plans are best left off (``FA_CUDA_LAUNCH_PLANS=0``): the graph then captures the Python launches.
"""
from __future__ import annotations

import argparse
import sys

SHAPES = "4x16x1024x64,4x16x4096x64,8x12x1024x64,4x16x1024x128,4x16x4096x128,4x16x16384x128"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="the name printed at the start of each line")
    ap.add_argument("--shapes", default=SHAPES, help="BxHxNxD, comma-separated (default: %(default)s)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--kv-heads", type=int, default=0,
                    help="K/V heads of every shape (grouped-query attention; H %% this == 0; default: H)")
    ap.add_argument("--backward", action="store_true", help="time the backward instead of the forward")
    ap.add_argument("--window", default="", help="one window L,R instead of not causal and causal (e.g. 256,256)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout_p (seed 2**33 + 7, as benchmarks.variants; default: %(default)s, no dropout)")
    ap.add_argument("--backend", default="cuda-wgmma-ws", choices=("cuda-wgmma-ws", "cuda-wgmma", "cuda-mma", "triton"),
                    help="the kernels to time (default: %(default)s)")
    args = ap.parse_args(argv)
    import torch
    from triton.testing import do_bench_cudagraph

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (Hopper)")
    from flash_attention_py.common import attention_flops
    from flash_attention_py.inputs import make_inputs
    from flash_attention_py.masks import window_for

    drop = (args.dropout, 2**33 + 7) if args.dropout else (0.0, None)
    if args.backend == "triton":
        from flash_attention_triton import launch

        def fwd(q, k, v, window, scale):
            return launch._forward(q, k, v, window, scale, dropout_p=drop[0], dropout_seed=drop[1])

        def bwd(q, k, v, o, lse, do, window, scale):
            return launch._backward(q, k, v, o, lse, do, window, scale, dropout_p=drop[0], dropout_seed=drop[1])
    else:  # the CUDA rung named: its forward, and the backward the library runs after it
        from flash_attention_cuda import capabilities, launch_specs

        kernel = args.backend.removeprefix("cuda-")
        bwd_kernel = "wgmma-ws" if kernel == "wgmma-ws" else capabilities.BACKWARD_OF[kernel]  # its autograd's

        def fwd(q, k, v, window, scale):
            return launch_specs.run_forward(q, k, v, window, scale, kernel, dropout=drop)

        def bwd(q, k, v, o, lse, do, window, scale):
            return launch_specs.run_backward(q, k, v, o, lse, do, window, scale, bwd_kernel, dropout=drop)

    tag = f" p={args.dropout:g}" if args.dropout else ""
    masks = [(f"window{args.window}", tuple(map(int, args.window.split(","))))] if args.window else \
        [("not-causal", window_for(False)), ("causal", window_for(True))]
    mode = "bwd" if args.backward else "fwd"
    for shape in args.shapes.split(","):
        B, H, N, D = map(int, shape.split("x"))
        Hk = args.kv_heads or H
        if Hk < 1 or H % Hk:
            ap.error(f"--kv-heads: got {Hk}, expected a divisor of H = {H} (shape {shape})")
        for name, window in masks:
            x = make_inputs(B, H, N, N, D, dtype=args.dtype, device="cuda", Hk=Hk)
            q, k, v = x["q"], x["k"], x["v"]
            scale = D ** -0.5
            if args.backward:
                o, lse = fwd(q, k, v, window, scale)
                call = lambda: bwd(q, k, v, o, lse, x["do"], window, scale)  # noqa: E731
            else:
                call = lambda: fwd(q, k, v, window, scale)  # noqa: E731
            call()  # compiled (Triton: tuned) and warm
            ms = do_bench_cudagraph(call, return_mode="median")
            flops = attention_flops(B, H, N, N, D, mode=mode, window_size=window)
            print(args.label, mode, args.dtype, B, H if Hk == H else f"{H}/{Hk}", N, D, name + tag, f"{ms:.4f}", f"{flops / (ms * 1e-3) / 1e12:.0f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
