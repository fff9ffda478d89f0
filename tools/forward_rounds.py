#!/usr/bin/env python
"""Time the hopper preset's forward rows at N >= 4096 in rounds, every backend once a round in turn.

    PYTHONPATH=. python tools/forward_rounds.py --out results/forward_rounds      # on a Hopper GPU

The hopper preset (``python -m benchmarks --preset hopper``) times each backend of a case once, one after the
other, and the same kernel at the same shape can read 3-11 % apart between fp16 and bf16 or between runs. Here
every case (the preset's shapes, B4 H32 D64 and B4 H16 D128; N 4096 and 16384; fp16 and bf16; causal and not) is
timed for cuda-wgmma-ws (``flash_attn_cuda``, the public function), SDPA's FlashAttention-2 and SDPA's cuDNN, once
each per round, in turn, for --rounds rounds; each keeps the median of its rounds (do_bench medians). Writes
``forward_rounds.txt`` and ``forward_rounds.json`` into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SHAPES = ((4, 32, 64), (4, 16, 128))  # (B, H, D): benchmarks.presets.SHAPES
BACKENDS = ("sdpa-flash", "sdpa-cudnn", "cuda-wgmma-ws")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    from flash_attention_cuda import flash_attn_cuda
    from flash_attention_py.common import attention_flops

    pins = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    cases = [(B, H, N, D, dtype, causal) for B, H, D in SHAPES for N in map(int, args.n.split(","))
             for dtype in ("float16", "bfloat16") for causal in (False, True)]
    rows = []
    for B, H, N, D, dtype, causal in tqdm(cases, desc="cases"):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype), generator=g) for _ in range(3))

        def call(name):
            if name == "cuda-wgmma-ws":
                return lambda: flash_attn_cuda(q, k, v, causal=causal, kernel="wgmma-ws")

            def sdpa():
                with sdpa_kernel(pins[name]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return sdpa

        fns = {name: call(name) for name in BACKENDS}
        times = {name: [] for name in BACKENDS}
        with torch.no_grad():
            for fn in fns.values():
                fn()
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    times[name].append(do_bench(fn, return_mode="median"))
        flops = attention_flops(B, H, N, N, D, causal=causal)
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append(dict(B=B, H=H, N=N, D=D, dtype=dtype, causal=causal, round_ms=times, ms=ms,
                         tflops={name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}))
        del q, k, v, fns
        torch.cuda.empty_cache()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    command = f"PYTHONPATH=. python tools/forward_rounds.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    lines = [f"# {command}",
             f"# {torch.cuda.get_device_name()}, commit {commit}{' (dirty)' if dirty else ''}; the forward, "
             f"TFLOP/s of the median of {args.rounds} rounds (each backend once a round, in turn; do_bench medians)",
             "dtype | B | H | N | D | causal | " + " | ".join(BACKENDS) + " | wgmma-ws / cuDNN | rounds (ms): "
             "wgmma-ws; cuDNN"]
    for r in rows:
        t = r["tflops"]
        lines.append(f"{r['dtype']} | {r['B']} | {r['H']} | {r['N']} | {r['D']} | {r['causal']} | "
                     + " | ".join(f"{t[n]:.0f}" for n in BACKENDS)
                     + f" | {t['cuda-wgmma-ws'] / t['sdpa-cudnn']:.2f} | "
                     + "; ".join(" ".join(f"{x:.3f}" for x in r["round_ms"][n]) for n in ("cuda-wgmma-ws", "sdpa-cudnn")))
        print(lines[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "forward_rounds.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "forward_rounds.json"), "w") as f:
        json.dump(dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       command=command, rounds=args.rounds, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
