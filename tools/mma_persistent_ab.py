#!/usr/bin/env python
"""The mma forward with its persistent grid off and on, beside FlashAttention-2, in one process.

    PYTHONPATH=. python tools/mma_persistent_ab.py --out results/mma_persistent      # on a CUDA GPU

``launch_specs.mma_fwd`` gives the configs that keep Q in registers ((128, 8, 1) at D 96 and 128, full attention)
a persistent grid, one block per SM, where there are at most ``MMA_PERSISTENT_ITEMS_PER_SM`` work items a block:
each block loads its next item's Q and first K/V tile under its last tile (mma.cu, AHEAD). Here each case is
timed with that setting 0 (a block per item: "off") and unbounded ("on"), and SDPA's FlashAttention-2, once each
per round, each round starting one later (--rounds rounds; do_bench medians, TFLOP/s of the median), and the two
outputs are compared bit for bit. At D = 64 ((128, 4, 2): Q read from shared memory) the grid never walks: its
"off" and "on" time the same launch, a check of the timer's spread. Writes ``mma_persistent_ab.json`` and
``mma_persistent_ab.md`` into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# (D, B, H, N values, dtypes, causal values): the hopper preset's shapes, and D = 96
CASES = ((128, 4, 16, (1024, 2048, 4096, 8192), ("float16", "bfloat16"), (False, True)),
         (64, 4, 32, (1024, 4096), ("float16", "bfloat16"), (False, True)),
         (96, 4, 16, (1024, 4096), ("float16",), (False,)))
NAMES = ("off", "on", "sdpa-flash")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm
    from triton.testing import do_bench

    from flash_attention_cuda import flash_attn_cuda, launch_specs
    from flash_attention_py.common import attention_flops

    saved = launch_specs.MMA_PERSISTENT_ITEMS_PER_SM
    cases = [(D, B, H, N, dt, c) for D, B, H, ns, dts, cs in CASES for N in ns for dt in dts for c in cs]
    rows = []
    try:
        for D, B, H, N, dtype, causal in tqdm(cases, desc="cases"):
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype)) for _ in range(3))

            def ours():
                return flash_attn_cuda(q, k, v, causal=causal, kernel="mma")

            def fa2():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            outs, times, grids = {}, {n: [] for n in NAMES}, {}
            for r in range(args.rounds):
                for name in NAMES[r % 3:] + NAMES[:r % 3]:
                    fn = fa2
                    if name != "sdpa-flash":
                        launch_specs.MMA_PERSISTENT_ITEMS_PER_SM = 0 if name == "off" else 1 << 30
                        launch_specs.clear_caches()  # the specs (and launch plans) made with the other setting
                        outs[name], fn = ours(), ours
                        p = launch_specs._problem(q, k, D ** -0.5, (-1, 0) if causal else (-1, -1))
                        grids[name] = launch_specs.mma_fwd(p, None, torch.cuda.get_device_properties(0).multi_processor_count).grid
                    times[name].append(do_bench(fn, return_mode="median"))
            flops = attention_flops(B, H, N, N, D, causal=causal)
            tflops = {n: flops / (statistics.median(t) * 1e-3) / 1e12 for n, t in times.items()}
            rows.append(dict(D=D, B=B, H=H, N=N, dtype=dtype, causal=causal, grid=grids, round_ms=times, tflops=tflops,
                             bitwise_same=bool(torch.equal(outs["off"], outs["on"]))))
            del q, k, v, outs
    finally:
        launch_specs.MMA_PERSISTENT_ITEMS_PER_SM = saved
        launch_specs.clear_caches()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    command = f"PYTHONPATH=. python tools/mma_persistent_ab.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    md = [f"# mma forward, persistent grid off and on ({torch.cuda.get_device_name()}, commit {commit}"
          f"{' (dirty)' if dirty else ''})", "", f"`{command}`; TFLOP/s of the median of {args.rounds} rounds.", "",
          "| D | B | H | N | dtype | causal | grid off | grid on | off | on | FA2 | on / off | on / FA2 | same bits |",
          "|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        t = r["tflops"]
        md.append(f"| {r['D']} | {r['B']} | {r['H']} | {r['N']} | {r['dtype']} | {'yes' if r['causal'] else 'no'} | "
                  f"{r['grid']['off']} | {r['grid']['on']} | {t['off']:.1f} | {t['on']:.1f} | {t['sdpa-flash']:.1f} | "
                  f"{t['on'] / t['off']:.3f} | {t['on'] / t['sdpa-flash']:.3f} | {r['bitwise_same']} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mma_persistent_ab.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, "mma_persistent_ab.json"), "w") as f:
        json.dump(dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       command=command, rounds=args.rounds, rows=rows), f, indent=1)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
