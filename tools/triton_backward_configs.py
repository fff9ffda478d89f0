#!/usr/bin/env python
"""Time the Triton backward's kernels alone with every dK/dV candidate config, beside the autotuner's choice.

    PYTHONPATH=. python tools/triton_backward_configs.py --n 1024 --head-dim 128        # on a CUDA GPU

For one shape (B, H, N, D, not causal) and each dtype: the backward (``launch._backward``: preprocess, dK/dV,
dQ; no autograd, no Python around it) with the autotuned configs, then with each candidate of
``configs.DKDV_CONFIGS`` and the autotuned dQ config. Times are ``triton.testing.do_bench`` medians (ms).
It separates the kernels' own time from the host time an autograd call adds at small N.
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
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the timings are of the compiled kernels)")
    from flash_attention_py.inputs import make_inputs
    from flash_attention_triton import configs as C
    from flash_attention_triton import launch as L

    B, H, N, D = args.batch, args.heads, args.n, args.head_dim
    scale = D ** -0.5
    print(f"Triton backward, B={B} H={H} N={N} D={D}, not causal; do_bench medians (ms)")
    for dtype in args.dtype.split(","):
        x = make_inputs(B, H, N, N, D, dtype=dtype, device="cuda")
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        o, lse = L._forward(q, k, v, False, scale)

        def run(cfg=None):
            return L._backward(q, k, v, o, lse, do, False, scale, configs=cfg)

        run()  # autotunes this length bucket
        torch.cuda.synchronize()
        auto = triton.testing.do_bench(run, warmup=25, rep=200)
        plan = {key[0]: cfg for key, cfg in L._PLAN.items() if key[3] == D and key[-2] == getattr(torch, dtype)}
        print(f"{dtype}: autotuned {auto:.4f} ms; configs (BLOCK_M, BLOCK_N, warps, stages): {plan}", flush=True)
        for cand in C.CANDIDATES["dkdv"]:
            try:
                ms = triton.testing.do_bench(lambda: run({"dkdv": cand, "dq": plan["dq"]}), warmup=25, rep=200)
                print(f"  dkdv {cand}: {ms:.4f} ms", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is a line, not the end
                print(f"  dkdv {cand}: failed: {type(exc).__name__}: {str(exc)[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
