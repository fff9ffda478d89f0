#!/usr/bin/env python
"""Time the Hopper forward kernels alone (wgmma, and wgmma-ws in every candidate config) beside FA2 and cuDNN.

    PYTHONPATH=. python tools/cuda_forward_kernels.py --out results/forward_kernels      # on a Hopper GPU

For each dtype, head dim, N and causal (B4 H16 by default): the forward kernels alone
(``launch_specs.run_forward``; no autograd, no input checks) with kernel 'wgmma' (its library config) and
kernel 'wgmma-ws' for each candidate (Bc, consumer warpgroups, stages;
``benchmarks.presets.CONFIG_CANDIDATES['wgmma-ws']``), and SDPA's FlashAttention-2 and cuDNN
forward. Before timing, each wgmma-ws config's output is compared with wgmma's (max abs difference, printed and
recorded). Times are medians of CUDA-graph replays (``triton.testing.do_bench_cudagraph``; ``--timer events``:
``do_bench``), so they are the kernels' own: at N = 1024 a call's host time (tens of microseconds of Python)
would otherwise exceed the kernel's and be what is measured. TFLOP/s count 4·B·H·N²·D (x0.5 causal). Writes
``forward_kernels.json`` and ``forward_kernels.md`` into --out: the measurement behind
``launch_specs.WGMMA_WS_CONFIGS`` and the forward kernel='auto' picks on a Hopper. With ``--walks``, causal rows
also time the two walks of the persistent grid forced (``launch_specs.WGMMA_WS_PAIRS_BALANCE``): the measurement
behind that threshold.

    PYTHONPATH=. python tools/cuda_forward_kernels.py --kernel mma --out results/mma_forward   # any GPU (sm_80+)

``--kernel mma`` times the mma.sync forward (mma.cu) instead, in its library config and in every candidate of
``benchmarks.presets.CONFIG_CANDIDATES['mma']`` (Bc, warps, m16 tiles per warp), each compared with the library
config's output first: the measurement behind ``launch_specs.MMA_CONFIGS``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--kernel", choices=("wgmma-ws", "mma"), default="wgmma-ws",
                    help="wgmma-ws: the Hopper forwards (default); mma: the mma.sync forward's tile configs")
    ap.add_argument("--configs", choices=("all", "library"), default="all",
                    help="all: every candidate config (default); library: launch_specs.WGMMA_WS_CONFIGS[D] alone")
    ap.add_argument("--walks", action="store_true",
                    help="causal rows: also the library config with each walk forced, pairs of rows blocks or the items "
                         "longest first (launch_specs.WGMMA_WS_PAIRS_BALANCE 0 or 2), on the library's grid")
    ap.add_argument("--timer", choices=("graph", "events"), default="graph",
                    help="graph: CUDA-graph replays, the kernels alone (default); events: do_bench, host time included "
                         "where it is longer than the kernel")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm
    from triton.testing import do_bench, do_bench_cudagraph

    def timed(fn):
        if args.timer == "graph":
            return do_bench_cudagraph(fn, return_mode="median")
        return do_bench(fn, return_mode="median")

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from flash_attention_cuda import launch_specs
    from flash_attention_py.common import attention_flops
    from flash_attention_py.inputs import make_inputs
    from flash_attention_py.masks import window_for

    B, H = args.batch, args.heads
    cases = [(dt, D, N, causal) for dt in args.dtypes.split(",") for D in map(int, args.head_dims.split(","))
             for N in map(int, args.n.split(",")) for causal in (False, True)]
    rows = []
    for dt, D, N, causal in tqdm(cases, desc="forward kernels"):
        x = make_inputs(B, H, N, N, D, dtype=dt, device="cuda")
        q, k, v = x["q"], x["k"], x["v"]
        flops = attention_flops(B, H, N, N, D, causal=causal, mode="fwd")
        window, scale = window_for(causal), D ** -0.5
        if args.kernel == "mma":
            ms, diff = mma_configs(q, k, v, window, scale, D, args.configs, timed)
        else:
            ms, diff = wgmma_ws_configs(q, k, v, window, scale, D, causal, args, timed)
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(backend):
                ms[name] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        ref = "mma" if args.kernel == "mma" else "wgmma"  # what each config's output is compared with
        rows.append(dict(dtype=dt, B=B, H=H, N=N, D=D, causal=causal, ms=ms, **{f"max_abs_vs_{ref}": diff},
                         tflops={name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}))
        tqdm.write(f"{dt} D{D} N{N} causal={causal}: " + ", ".join(f"{n} {v:.0f}" for n, v in rows[-1]["tflops"].items())
                   + f"; max |config - library| {diff}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    doc = dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               command="python tools/cuda_forward_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               timer=args.timer, unit="TFLOP/s = 4·B·H·N²·D (x0.5 causal) / median time of the forward alone ("
               + ("CUDA-graph replays" if args.timer == "graph" else "do_bench") + ")", rows=rows)
    names = list(dict.fromkeys(n for r in rows for n in r["tflops"]))
    if args.kernel == "mma":
        legend = (f"mma: the library config (launch_specs.MMA_CONFIGS: {launch_specs.MMA_CONFIGS}); mma BcxWxT: Bc keys "
                  "per K/V tile, W warps, T m16 tiles (16 query rows each) per warp.")
    else:
        legend = ("wgmma-ws BcxCxS: Bc keys per tile, C consumer warpgroups, S K/V stages; unmarked: the grid the library "
                  f"picks (persistent up to {launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM} work units per SM, else a block "
                  "per unit); \"persistent\": one block per SM walks the work units (items of Br query rows, or with causal "
                  "pairs of them where they balance); \"a block per unit\": a block per unit; \"pairs\", \"longest first\" "
                  "(--walks, causal): the library's grid walking pairs of rows blocks wherever it is persistent, or the items "
                  "longest first.")
    title = "mma.sync forward" if args.kernel == "mma" else "Hopper forward"
    md = [f"# {title} kernels alone ({doc['gpu']}, B{B} H{H}, commit {commit}{' with local changes' if dirty else ''})",
          "", f"`{doc['command']}`; {doc['unit']}. {legend}", "",
          "| dtype | D | N | causal | " + " | ".join(names) + " |", "|---|---|---|---|" + "---|" * len(names)]
    for r in rows:
        md.append(f"| {r['dtype']} | {r['D']} | {r['N']} | {r['causal']} | "
                  + " | ".join(f"{r['tflops'][n]:.0f}" if n in r["tflops"] else "–" for n in names) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "forward_kernels.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "forward_kernels.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def wgmma_ws_configs(q, k, v, window, scale, D, causal, args, timed):
    """ms and max |difference| from wgmma's output of wgmma (its library config) and every wgmma-ws config and grid."""
    from flash_attention_cuda import launch_specs, runtime

    o_ref, _ = launch_specs.run_forward(q, k, v, window, scale, "wgmma")
    ms = {"wgmma": timed(lambda: launch_specs.run_forward(q, k, v, window, scale, "wgmma"))}
    diff = {}
    library = launch_specs.WGMMA_WS_CONFIGS[D]
    from benchmarks.presets import CONFIG_CANDIDATES

    configs = [(tuple(cfg), "library")
               for cfg in (CONFIG_CANDIDATES["wgmma-ws"].get(D, []) if args.configs == "all" else [library])]
    walks = [(library, "pairs"), (library, "longest first")] if args.walks and causal else []
    for cfg, grid in configs + [(library, "persistent"), (library, "a block per unit")] + walks:
        # library: the grid launch_specs picks (persistent up to WGMMA_WS_PERSISTENT_UNITS_PER_SM units per SM);
        # persistent: one block per SM walks the work units, however many; a block per unit (an item of Br
        # query rows, or with causal a pair of them); pairs, longest first: the library's grid, with causal
        # walking pairs wherever it is persistent, or the items longest first
        name = "wgmma-ws " + "x".join(map(str, cfg)) + ("" if grid == "library" else " " + grid)
        sms, per_sm = runtime.device_sms, launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM
        balance = launch_specs.WGMMA_WS_PAIRS_BALANCE
        try:
            if grid in ("pairs", "longest first"):  # pairs wherever the grid is persistent, or never
                launch_specs.WGMMA_WS_PAIRS_BALANCE = 0.0 if grid == "pairs" else 2.0
            elif grid == "persistent":
                launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM = 1 << 30
            elif grid == "a block per unit":
                runtime.device_sms = lambda x: 1 << 30  # min(units, 2^30) blocks: one per unit
            launch_specs.clear_caches()
            o, _ = launch_specs.run_forward(q, k, v, window, scale, "wgmma-ws", cfg)
            diff[name] = (o.float() - o_ref.float()).abs().max().item()
            ms[name] = timed(lambda: launch_specs.run_forward(q, k, v, window, scale, "wgmma-ws", cfg))
        except Exception as exc:  # a config the GPU cannot hold: recorded, not fatal
            diff[name] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            runtime.device_sms, launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM = sms, per_sm
            launch_specs.WGMMA_WS_PAIRS_BALANCE = balance
            launch_specs.clear_caches()
    return ms, diff


def mma_configs(q, k, v, window, scale, D, which, timed):
    """ms of the mma forward in its library config ("mma") and, with which == "all", in every candidate config
    ("mma BcxWxT": Bc keys per tile, W warps, T m16 tiles per warp), and each candidate's max |difference| from the
    library config's output."""
    from benchmarks.presets import CONFIG_CANDIDATES
    from flash_attention_cuda import launch_specs

    library = tuple(launch_specs.MMA_CONFIGS[D])
    o_ref, _ = launch_specs.run_forward(q, k, v, window, scale, "mma")
    ms = {"mma": timed(lambda: launch_specs.run_forward(q, k, v, window, scale, "mma"))}
    diff = {}
    for cfg in (CONFIG_CANDIDATES["mma"].get(D, []) if which == "all" else []):
        if tuple(cfg) == library:
            continue
        name = "mma " + "x".join(map(str, cfg))
        try:
            o, _ = launch_specs.run_forward(q, k, v, window, scale, "mma", tuple(cfg))
            diff[name] = (o.float() - o_ref.float()).abs().max().item()
            ms[name] = timed(lambda: launch_specs.run_forward(q, k, v, window, scale, "mma", tuple(cfg)))
        except Exception as exc:  # a config the GPU cannot hold: recorded, not fatal
            diff[name] = f"{type(exc).__name__}: {exc}"[:300]
    return ms, diff


if __name__ == "__main__":
    sys.exit(main())
