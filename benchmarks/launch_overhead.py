"""Host (Python) time per call of each GPU backend, at a shape so small that the GPU time is negligible.

    PYTHONPATH=. python3 benchmarks/launch_overhead.py [--calls 2000] [--profile]

A call's host time is what the CPU spends before the kernel is queued (checks, allocation, launch). When it
exceeds the kernel's own time, back-to-back calls leave the GPU idle and the benchmark measures Python,
not the kernel: this is what limits every backend below about 0.3 ms per call. --profile prints the top
cProfile entries of one flash_attn_cuda call path. Needs a GPU.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from flash_attention_cuda import flash_attn_cuda  # noqa: E402


def host_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 1, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fa2():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    rows = [("sdpa FLASH_ATTENTION (FA2)", fa2)]
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for kernel in ("mma", "wgmma") if hopper else ("mma",):
        rows.append((f"flash_attn_cuda kernel={kernel}", lambda kernel=kernel: flash_attn_cuda(q, k, v, kernel=kernel)))
    try:
        from flash_attention_triton import flash_attn_triton

        rows.append(("flash_attn_triton", lambda: flash_attn_triton(q, k, v)))
    except Exception as exc:  # pragma: no cover
        print("triton unavailable:", exc)
    print(f"{'call':<34} host us/call")
    for name, fn in rows:
        print(f"{name:<34} {host_us(fn, args.calls):8.1f}")
    if args.profile:
        kernel = "wgmma" if hopper else "mma"
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.calls):
            flash_attn_cuda(q, k, v, kernel=kernel)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
