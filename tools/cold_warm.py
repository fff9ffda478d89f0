#!/usr/bin/env python
"""Time forwards with L2 flushed before every call (as the benchmark does) and with L2 left warm, in one process.

    PYTHONPATH=. python tools/cold_warm.py --out results/cold_warm                  # on a CUDA GPU
    PYTHONPATH=. python tools/cold_warm.py --backends cuda-wgmma-ws,sdpa-cudnn --cases 4x16x4096x128 --out ...

``triton.testing.do_bench``, the benchmark's timer, zeroes a 256 MB buffer before every call: each call starts
with none of its inputs in L2 (and L2 full of the buffer's dirty lines). ``triton.testing.do_bench_cudagraph``
replays the calls back to back in a CUDA graph: each call finds in L2 what the one before left there. The
difference is what a kernel pays for its first touches of DRAM. For each case (B x H x N x D, causal and not,
--dtype) every backend (--backends: names of the benchmark's targets, the public call the benchmark times;
``benchmarks.targets``) is timed both ways once a round, in turn, for --rounds rounds, and keeps each timing's
median over the rounds. Writes ``cold_warm.md`` and ``cold_warm.json`` into --out: microseconds cold and warm,
their difference, and each backend's speed over the first backend named against FlashAttention-2 where both ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = "4x16x1024x128,4x32x1024x64,8x12x1024x64,4x16x4096x128"
BACKENDS = "cuda-mma,sdpa-flash"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backends", default=BACKENDS, help="benchmark target names, comma-separated (default: "
                    "%(default)s); sdpa-flash, if named, is the reference of the x FA2 columns")
    ap.add_argument("--cases", default=CASES, help="BxHxNxD, comma-separated (default: %(default)s)")
    ap.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        cases = [tuple(int(n) for n in c.split("x")) for c in args.cases.split(",")]
        if any(len(c) != 4 or min(c) < 1 for c in cases):
            raise ValueError
    except ValueError:
        ap.error(f"--cases takes BxHxNxD with positive integers, comma-separated; got {args.cases!r}")
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from tqdm import tqdm
    from triton.testing import do_bench, do_bench_cudagraph

    from benchmarks.targets import build_targets
    from flash_attention_py.common import attention_flops
    from flash_attention_py.inputs import make_inputs

    targets = {t.name: t for t in build_targets()}
    names = args.backends.split(",")
    unknown = [n for n in names if n not in targets]
    if unknown:
        ap.error(f"--backends: unknown {unknown}; known: {sorted(targets)}")
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    rows = []
    for (B, H, N, D), causal in tqdm([(c, m) for c in cases for m in causals], desc="cases"):
        x = make_inputs(B, H, N, N, D, dtype=args.dtype, kind="torch", device="cuda")
        flops = attention_flops(B, H, N, N, D, causal=causal)
        times = {n: {"cold": [], "warm": []} for n in names}
        reasons = {}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name in reasons:
                    continue
                target = targets[name]
                reason = target.unavailable_reason("cuda") or target.case_reason("cuda", args.dtype, D, "fwd")
                if reason:
                    reasons[name] = reason
                    continue
                with target.context():
                    fn = target.prepare(x, causal, "fwd")
                    fn()  # compiled (Triton: tuned), planned
                    fn()
                    times[name]["cold"].append(do_bench(fn, return_mode="median"))
                    times[name]["warm"].append(do_bench_cudagraph(fn, return_mode="median"))
        row = dict(B=B, H=H, N=N, D=D, dtype=args.dtype, causal=causal, gflop=flops / 1e9, round_ms=times,
                   skipped=reasons)
        row["us"] = {n: {k: statistics.median(t[k]) * 1e3 for k in t} for n, t in times.items() if t["cold"]}
        rows.append(row)
        del x
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    command = f"PYTHONPATH=. python tools/cold_warm.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    md = [f"# Cold and warm L2 ({torch.cuda.get_device_name()}, commit {commit}{' (dirty)' if dirty else ''})", "",
          f"`{command}`; {args.dtype}; cold: `do_bench` (L2 flushed before every call), warm: "
          f"`do_bench_cudagraph` (calls back to back); microseconds, the median of {args.rounds} rounds.", "",
          "| B | H | N | D | causal | backend | cold µs | warm µs | cold − warm | × FA2 cold | × FA2 warm |",
          "|---|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        fa2 = r["us"].get("sdpa-flash")
        for n, t in r["us"].items():
            x_fa2 = (f"{fa2['cold'] / t['cold']:.3f} | {fa2['warm'] / t['warm']:.3f}" if fa2 else "– | –")
            md.append(f"| {r['B']} | {r['H']} | {r['N']} | {r['D']} | {'yes' if r['causal'] else 'no'} | {n} | "
                      f"{t['cold']:.1f} | {t['warm']:.1f} | {t['cold'] - t['warm']:.1f} | {x_fa2} |")
        for n, why in r["skipped"].items():
            md.append(f"| {r['B']} | {r['H']} | {r['N']} | {r['D']} | {'yes' if r['causal'] else 'no'} | {n} | "
                      f"not run: {why} | | | | |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold_warm.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, "cold_warm.json"), "w") as f:
        json.dump(dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       command=command, rounds=args.rounds, rows=rows), f, indent=1)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
