#!/usr/bin/env python
"""Where one call's GPU time goes, kernel by kernel: ours beside the PyTorch alternative of the same work.

    python tools/kernel_breakdown.py --out results/kernel_breakdown        # on a GPU

A benchmark gives one number per call; a call is often several kernels. For each case (a shape, a mask and
forward or backward) and each backend this runs the call a few times to warm up, then ``--calls`` times under
``torch.profiler`` (CUDA activity only), and sums each kernel's GPU time per call. So one sees, for instance,
that the one-kernel CUDA backward (cuda-wgmma-ws) is a preprocess (Delta, and zeroing its float32 dQ
accumulator), the kernel itself and a pass that turns the accumulator into dQ, and how long each takes beside
FlexAttention's or cuDNN's own kernels.

The cases, B H N D fp16 (the backward alone: the forward's graph is kept, as in ``benchmarks.variants``):

    window (256, 256)   B1 H16 N16384 D128, backward     cuda-wgmma-ws, triton beside flex
    window (512, 0)     B4 H16 N4096 D128 causal, backward
    full                B4 H16 N4096 D128, backward     cuda-wgmma-ws, triton beside sdpa-cudnn and sdpa-flash
    full                B4 H16 N4096 D128, forward
    GQA Hq 32 / Hk 8    B2 N4096 D128 causal, backward  cuda-wgmma-ws beside sdpa-cudnn (enable_gqa)

Writes ``kernel_breakdown.md`` (one table per case) and ``kernel_breakdown.json`` (every kernel, the
environment and the git commit) into --out, and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FLEX_AND_OURS = ("cuda-wgmma-ws", "triton", "flex")
CUDNN_AND_OURS = ("cuda-wgmma-ws", "triton", "sdpa-cudnn", "sdpa-flash")


def cases():
    """(title, case of benchmarks.variants, backends), in order."""
    from benchmarks.variants import _case

    return [
        ("window (256, 256), backward",
         _case("window", "window", 1, 16, 16, 16384, 128, False, "bwd", (256, 256)), FLEX_AND_OURS),
        ("window (512, 0) causal, backward",
         _case("window", "window", 4, 16, 16, 4096, 128, True, "bwd", (512, 0)), FLEX_AND_OURS),
        ("full, backward", _case("full", "window", 4, 16, 16, 4096, 128, False, "bwd"), CUDNN_AND_OURS),
        ("full, forward", _case("full", "window", 4, 16, 16, 4096, 128, False, "fwd"), CUDNN_AND_OURS),
        ("GQA Hq 32 / Hk 8 causal, backward",
         _case("gqa", "gqa", 2, 32, 8, 4096, 128, True, "bwd"), ("cuda-wgmma-ws", "sdpa-cudnn")),
    ]


def kernel_rows(events, calls: int) -> list:
    """[(kernel name, µs per call, launches per call)] from profiler averages (objects with ``key``,
    ``self_device_time_total`` in µs and ``count``), longest first; rows with no GPU time are dropped."""
    rows = [(e.key, e.self_device_time_total / calls, e.count / calls) for e in events
            if getattr(e, "self_device_time_total", 0) > 0]
    return sorted(rows, key=lambda r: -r[1])


def short_name(kernel: str, width: int = 70) -> str:
    """A kernel's name without its argument list, cut to ``width`` characters."""
    name = kernel.split("(")[0].replace("void ", "")
    return name if len(name) <= width else name[:width - 1] + "…"


def markdown(results: list, meta: dict) -> str:
    lines = ["# One call's GPU time, kernel by kernel", "",
             f"GPU: {meta.get('gpu')}; torch {meta.get('torch')}, triton {meta.get('triton')}; git commit "
             f"{meta.get('git_commit')}{' (with local changes)' if meta.get('git_dirty') else ''}.", "",
             f"Reproduce: `{meta.get('command')}`", "",
             "µs per call: each kernel's GPU time summed over the profiled calls (torch.profiler), divided by "
             "their number; the sum of a backend's kernels is its GPU time per call (gaps between kernels "
             "not counted).", ""]
    for res in results:
        lines += [f"## {res['title']}", "", f"B={res['B']} Hq={res['Hq']} Hk={res['Hk']} N={res['N']} "
                  f"D={res['D']}, {res['dtype']}", "", "| backend | kernel | launches | µs per call |",
                  "|---|---|---:|---:|"]
        for b in res["backends"]:
            if b.get("error"):
                lines.append(f"| {b['name']} | not run: {b['error']} | | |")
                continue
            for i, (k, us, n) in enumerate(b["kernels"]):
                lines.append(f"| {b['name'] if i == 0 else ''} | `{short_name(k)}` | {n:g} | {us:.1f} |")
            lines.append(f"| | **all kernels** | | **{b['total_us']:.1f}** |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=20, help="profiled calls per backend (default 20)")
    args = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise SystemExit("kernel_breakdown: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    from benchmarks.report import git_state
    from benchmarks.variants import _variant_kwargs, targets
    from flash_attention_py.inputs import make_inputs

    by_name = targets(("cuda-wgmma-ws", "triton"))
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                command="python tools/kernel_breakdown.py " + " ".join(argv), **git_state())
    results = []
    for title, case, names in cases():
        x = make_inputs(case["B"], case["Hq"], case["N"], case["N"], case["D"], Hk=case["Hk"], dtype=case["dtype"],
                        device="cuda")
        res = dict(title=title, **{k: case[k] for k in ("B", "Hq", "Hk", "N", "D", "dtype")}, backends=[])
        for name in names:
            target = by_name[name]
            try:
                with target.context():
                    fn = target.prepare(x, case["causal"], case["mode"], **_variant_kwargs(case))
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(args.calls):
                            fn()
                        torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a backend that refuses the case is a row, not the end
                res["backends"].append(dict(name=name, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
                continue
            rows = kernel_rows(prof.key_averages(), args.calls)
            res["backends"].append(dict(name=name, kernels=rows, total_us=sum(r[1] for r in rows)))
            print(f"{title}: {name} {res['backends'][-1]['total_us']:.1f} µs of kernels per call", flush=True)
        results.append(res)
        del x
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kernel_breakdown.json"), "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    text = markdown(results, meta)
    with open(os.path.join(args.out, "kernel_breakdown.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
