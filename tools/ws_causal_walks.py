#!/usr/bin/env python
"""Time wgmma-ws's causal forward under each of its work walks, beside cuDNN.

    PYTHONPATH=. python tools/ws_causal_walks.py --out results/ws_causal_walks      # on a Hopper GPU

With a right bound (causal) wgmma-ws walks its work items (``launch_specs.wgmma_ws_fwd``, wgmma_ws.cu) as pairs of
rows blocks on a persistent grid where they balance, else longest first in sections of heads whose K and V fit in
``launch_specs.WGMMA_WS_SECTION_BYTES``, on a persistent grid or, with more items than it takes, a block per item
handed out by the hardware in that order. For each shape (B, Hq, Hk, N, D; fp16) the forward kernel alone
(``launch_specs.run_forward``, do_bench medians, --rounds rounds taken in turn) with the library's choice and with
each walk forced (``SETTINGS``), beside cuDNN's forward (SDPA, enable_gqa) in the same run. Writes
``ws_causal_walks.txt`` and ``ws_causal_walks.json`` into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# name -> the launch_specs constants it sets: pairs forbidden (PAIRS_BALANCE above 1), a persistent grid forbidden
# (no units per SM), the sections' size
SETTINGS = {
    "library": {},
    "pairs": {"WGMMA_WS_PAIRS_BALANCE": 0.0},
    "longest first 16 MiB": {"WGMMA_WS_PAIRS_BALANCE": 2.0},
    "longest first 64 MiB": {"WGMMA_WS_PAIRS_BALANCE": 2.0, "WGMMA_WS_SECTION_BYTES": 64 << 20},
    "longest first all heads": {"WGMMA_WS_PAIRS_BALANCE": 2.0, "WGMMA_WS_SECTION_BYTES": 1 << 62},
    "block per item 16 MiB": {"WGMMA_WS_PERSISTENT_UNITS_PER_SM": 0},
    "block per item all heads": {"WGMMA_WS_PERSISTENT_UNITS_PER_SM": 0, "WGMMA_WS_SECTION_BYTES": 1 << 62},
}
SHAPES = "1x32x8x16384x128,1x32x1x16384x128,1x32x32x16384x128,4x16x16x16384x128,4x32x32x16384x64,2x32x8x4096x128," \
         "4x16x16x4096x128"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=SHAPES, help="B x Hq x Hk x N x D, comma-separated")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="which of SETTINGS, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from flash_attention_cuda import launch_specs, runtime
    from flash_attention_py.common import attention_flops

    names = args.settings.split(",")
    saved = {attr: getattr(launch_specs, attr) for setting in SETTINGS.values() for attr in setting}
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    times = {}  # (shape, setting) -> [ms per round]
    try:
        for rnd in tqdm(range(args.rounds), desc="rounds"):
            for B, Hq, Hk, N, D in shapes:
                g = torch.Generator(device="cuda").manual_seed(rnd)
                q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.float16, generator=g)
                k, v = (torch.randn(B, Hk, N, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
                scale = D ** -0.5
                for name in names:
                    _set(launch_specs, {**saved, **SETTINGS[name]})
                    run = lambda: launch_specs.run_forward(q, k, v, (-1, 0), scale, "wgmma-ws")  # noqa: E731
                    run()
                    times.setdefault(((B, Hq, Hk, N, D), name), []).append(do_bench(run, return_mode="median"))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cudnn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                                   enable_gqa=Hk != Hq)
                    cudnn()
                    times.setdefault(((B, Hq, Hk, N, D), "cudnn"), []).append(do_bench(cudnn, return_mode="median"))
    finally:
        _set(launch_specs, saved)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    lines = [f"# PYTHONPATH=. python tools/ws_causal_walks.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             f"# {torch.cuda.get_device_name()}, commit {commit}{' (dirty)' if dirty else ''}; wgmma-ws causal forward "
             f"alone, fp16, do_bench median ms (median of {args.rounds} rounds; TFLOP/s in brackets)",
             "B x Hq x Hk x N x D | library's grid | " + " | ".join(names) + " | cuDNN"]
    rows = []
    sms = runtime.device_sms(torch.empty(1, device="cuda"))
    for shape in shapes:
        B, Hq, Hk, N, D = shape
        p = launch_specs.Problem(B, Hq, N, N, D, "float16", D ** -0.5, (-1, 0), Hk)
        spec = launch_specs.wgmma_ws_fwd(p, ctas=sms)
        flops = attention_flops(B, Hq, N, N, D, causal=True)
        ms = {name: statistics.median(times[(shape, name)]) for name in names + ["cudnn"]}
        cell = lambda t: f"{t:.3f} ({flops / t / 1e9:.0f})"  # noqa: E731
        sections = dict(spec.scalars)["heads_per_section"]
        grid = (f"{spec.grid[0]} blocks, " + ("a block per item" if spec.grid[0] == _units(p, spec) else "persistent")
                + (", pairs" if sections == 0 else f", longest first in sections of {sections} heads"))
        lines.append(f"{B}x{Hq}x{Hk}x{N}x{D} | {grid} | " + " | ".join(cell(ms[name]) for name in names)
                     + f" | {cell(ms['cudnn'])}")
        rows.append(dict(B=B, Hq=Hq, Hk=Hk, N=N, D=D, library=grid, ms=ms,
                         rounds={k[1]: v for k, v in times.items() if k[0] == shape}))
        print(lines[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ws_causal_walks.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "ws_causal_walks.json"), "w") as f:
        json.dump(dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), command=lines[0][2:],
                       settings=SETTINGS, rows=rows), f, indent=1)
    return 0


def _set(launch_specs, values: dict) -> None:
    for attr, value in values.items():
        setattr(launch_specs, attr, value)
    launch_specs.clear_caches()


def _units(p, spec) -> int:
    """Work items of the launch (rows blocks of Br queries times heads)."""
    Br = 64 * (spec.block[0] // 128 - 1)
    return -(-p.Nq // Br) * p.B * p.H


if __name__ == "__main__":
    sys.exit(main())
