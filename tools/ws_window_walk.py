#!/usr/bin/env python
"""Time wgmma-ws's forward with sliding windows on the grid the library picks and on the persistent walk forced.

    PYTHONPATH=. python tools/ws_window_walk.py --out results/ws_window_walk      # on a Hopper GPU

B1 H16 N16384 D128 fp16, windows (w, w): the forward kernel alone (``launch_specs.run_forward``, do_bench medians)
with ``launch_specs.WGMMA_WS_WALK_SPREAD`` as it is (the library's grid: a block per item where the rows blocks'
keys are too uneven for the persistent walks, ``launch_specs._walk_fits``) and with the persistent walk forced.
Writes ``ws_window_walk.txt`` into --out: the measurement behind WGMMA_WS_WALK_SPREAD.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--windows", default="512,1024,2048,4096,8192")
    args = ap.parse_args(argv)
    import torch
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from flash_attention_cuda import launch_specs
    from flash_attention_py.inputs import make_inputs

    x = make_inputs(1, 16, 16384, 16384, 128, dtype="float16", device="cuda")
    q, k, v = x["q"], x["k"], x["v"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# PYTHONPATH=. python tools/ws_window_walk.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             f"# {torch.cuda.get_device_name()}, commit {commit}; B1 H16 N16384 D128 fp16, wgmma-ws forward alone, "
             "do_bench median ms", "window | library grid | persistent walk forced | library / forced"]
    spread = launch_specs.WGMMA_WS_WALK_SPREAD
    for w in map(int, args.windows.split(",")):
        ms = {}
        for name, value in (("library", spread), ("forced", float("inf"))):
            launch_specs.WGMMA_WS_WALK_SPREAD = value
            launch_specs.clear_caches()
            run = lambda: launch_specs.run_forward(q, k, v, (w, w), 128 ** -0.5, "wgmma-ws")  # noqa: E731
            run()
            ms[name] = do_bench(run, return_mode="median")
        launch_specs.WGMMA_WS_WALK_SPREAD = spread
        launch_specs.clear_caches()
        lines.append(f"({w}, {w}) | {ms['library']:.3f} | {ms['forced']:.3f} | {ms['library'] / ms['forced']:.2f}")
        print(lines[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ws_window_walk.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
