"""Time the CUDA ladder (naive, tiled, mma, wgmma) beside PyTorch SDPA's FlashAttention-2 backend.

    PYTHONPATH=. python3 benchmarks/cuda_ladder_vs_fa2.py [--out docs/results/cuda] [--quick] [--sweep]

Shapes (the issue's targets): B=4 H=32 D=64 and B=4 H=16 D=128, N = 2048, 4096, 8192, 16384
(Nq = Nk), causal and not, fp16 for mma, wgmma (Hopper only) and SDPA (FLASH_ATTENTION backend), fp32 for
naive and tiled.
The slow fp32 rungs are timed at N <= --slow-max-n (default 4096) only: at 16384 one naive call
takes seconds. TFLOP/s = attention_flops (4·B·H·N²·D, x0.5 causal) / median time per call (CUDA events
around back-to-back calls, after warm-up). Each mma result is also checked against SDPA's output (max-abs difference).
--sweep first times several mma (BC, warps, m16 tiles per warp) and wgmma (BC, warpgroups) configurations per D
at N=4096 and keeps the fastest of each.
Writes cuda_ladder.json and cuda_ladder.md to --out. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from flash_attention_py.common import attention_flops  # noqa: E402

import flash_attention_cuda as fac  # noqa: E402
from flash_attention_cuda import flash_attn_cuda  # noqa: E402

SHAPES = [dict(B=4, H=32, D=64), dict(B=4, H=16, D=128)]
NS = [2048, 4096, 8192, 16384]


def bench(fn, *, min_reps=5, max_reps=30, budget_s=0.4, batch_ms=10.0):
    """Median milliseconds per fn() call: CUDA events around a batch of back-to-back calls.

    Two warm-up calls first (compilation, caches). A batch holds enough calls to last ~batch_ms, so the
    host-side launch cost of one call overlaps the previous call's kernel, as in a real model.
    """
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one_ms = (time.perf_counter() - t0) * 1e3
    inner = max(1, min(50, int(batch_ms / max(one_ms, 1e-3))))
    times = []
    t_start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - t_start < budget_s):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times), len(times) * inner


def sdpa_fa2(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def versions():
    import cupy

    info = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda_torch=torch.version.cuda,
                cupy=cupy.__version__, cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
                cuda_driver=cupy.cuda.runtime.driverGetVersion(), nvrtc=".".join(map(str, cupy.cuda.nvrtc.getVersion())),
                python=platform.python_version())
    from benchmarks.report import git_state

    info.update(git_state())  # the commit, and the changed files if the tree has local changes
    try:
        info["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except Exception:
        pass
    return info


def sweep_configs(kernel, configs, candidates, fields, log):
    """Time candidate configs of one tensor-core rung per D at N=4096 (full + causal call); keep the fastest.

    configs: the launcher's table (MMA_CONFIGS or WGMMA_CONFIGS), updated in place; fields: names of the
    tuple's entries, for the JSON and the log.
    """
    results = []
    for shape in SHAPES:
        D = shape["D"]
        q, k, v = (torch.randn(shape["B"], shape["H"], 4096, D, device="cuda", dtype=torch.float16) for _ in range(3))
        best = None
        for cfg in candidates[D]:
            configs[D] = cfg
            try:
                tot = 0.0
                for causal in (False, True):
                    ms, _ = bench(lambda: flash_attn_cuda(q, k, v, causal=causal, kernel=kernel), max_reps=20,
                                  budget_s=0.3)
                    tot += ms
            except Exception as exc:  # e.g. too much shared memory for this config
                log(f"sweep {kernel} D={D} cfg={cfg}: failed: {str(exc).splitlines()[0][:200]}")
                continue
            results.append(dict(kernel=kernel, D=D, **dict(zip(fields, cfg)), ms_full_plus_causal=tot))
            log(f"sweep {kernel} D={D} " + " ".join(f"{f}={c}" for f, c in zip(fields, cfg))
                + f": {tot:.3f} ms (full + causal, N=4096)")
            if best is None or tot < best[0]:
                best = (tot, cfg)
        configs[D] = best[1]
        log(f"sweep {kernel} D={D}: best {best[1]}")
    return results


def sweep_mma(log):
    """mma: (BC, NWARPS, MT) candidates."""
    candidates = {64: [(64, 4, 2), (64, 8, 2), (128, 8, 1), (64, 8, 1), (32, 8, 2)],
                  128: [(64, 8, 1), (32, 8, 2), (32, 4, 2), (64, 4, 2), (128, 8, 1)]}
    return sweep_configs("mma", fac.MMA_CONFIGS, candidates, ("BC", "NWARPS", "MT"), log)


def sweep_wgmma(log):
    """wgmma: (BC, NWG warpgroups) candidates."""
    candidates = {64: [(128, 2), (64, 2), (128, 3)], 128: [(128, 2), (64, 2), (64, 3)]}
    return sweep_configs("wgmma", fac.WGMMA_CONFIGS, candidates, ("BC", "NWG"), log)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/cuda")
    ap.add_argument("--quick", action="store_true", help="N = 2048, 4096 only")
    ap.add_argument("--sweep", action="store_true", help="pick the fastest mma config per D first")
    ap.add_argument("--slow-max-n", type=int, default=4096, help="largest N for the fp32 rungs naive/tiled")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    info = versions()
    log(json.dumps(info))
    hopper = torch.cuda.get_device_capability() == (9, 0)
    sweep = (sweep_mma(log) + (sweep_wgmma(log) if hopper else [])) if args.sweep else []
    ns = NS[:2] if args.quick else NS
    rows = []
    for shape in SHAPES:
        B, H, D = shape["B"], shape["H"], shape["D"]
        for N in ns:
            q16, k16, v16 = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
            for causal in (False, True):
                flops = attention_flops(B, H, N, N, D, causal=causal)
                row = dict(B=B, H=H, N=N, D=D, causal=causal, flops=flops)
                ms, _ = bench(lambda: sdpa_fa2(q16, k16, v16, causal))
                row["fa2_ms"], row["fa2_tflops"] = ms, flops / ms / 1e9
                ms, _ = bench(lambda: flash_attn_cuda(q16, k16, v16, causal=causal, kernel="mma"))
                row["mma_ms"], row["mma_tflops"] = ms, flops / ms / 1e9
                row["mma_vs_fa2"] = row["mma_tflops"] / row["fa2_tflops"]
                row["mma_max_abs_vs_fa2"] = (flash_attn_cuda(q16, k16, v16, causal=causal, kernel="mma").float()
                                             - sdpa_fa2(q16, k16, v16, causal).float()).abs().max().item()
                if hopper:
                    ms, _ = bench(lambda: flash_attn_cuda(q16, k16, v16, causal=causal, kernel="wgmma"))
                    row["wgmma_ms"], row["wgmma_tflops"] = ms, flops / ms / 1e9
                    row["wgmma_vs_fa2"] = row["wgmma_tflops"] / row["fa2_tflops"]
                    row["wgmma_max_abs_vs_fa2"] = (
                        flash_attn_cuda(q16, k16, v16, causal=causal, kernel="wgmma").float()
                        - sdpa_fa2(q16, k16, v16, causal).float()).abs().max().item()
                if N <= args.slow_max_n:
                    q32, k32, v32 = q16.float(), k16.float(), v16.float()
                    for rung in ("tiled", "naive"):
                        ms, reps = bench(lambda: flash_attn_cuda(q32, k32, v32, causal=causal, kernel=rung),
                                         min_reps=2, max_reps=4, budget_s=0.3, batch_ms=1.0)
                        row[f"{rung}_ms"], row[f"{rung}_tflops"] = ms, flops / ms / 1e9
                    del q32, k32, v32
                rows.append(row)
                log(f"B={B} H={H} D={D} N={N:>5} causal={causal!s:<5}  FA2 {row['fa2_tflops']:6.1f}  "
                    f"mma {row['mma_tflops']:6.1f} ({row['mma_vs_fa2']:.2f}x, diff {row['mma_max_abs_vs_fa2']:.1e})  "
                    f"wgmma {row.get('wgmma_tflops', float('nan')):6.1f} ({row.get('wgmma_vs_fa2', float('nan')):.2f}x, "
                    f"diff {row.get('wgmma_max_abs_vs_fa2', float('nan')):.1e})  "
                    f"tiled {row.get('tiled_tflops', float('nan')):6.2f}  naive {row.get('naive_tflops', float('nan')):6.2f}")
            del q16, k16, v16
            torch.cuda.empty_cache()
    command = "PYTHONPATH=. python3 benchmarks/cuda_ladder_vs_fa2.py " + " ".join(sys.argv[1:])
    result = dict(info=info, command=command, mma_configs={str(k): v for k, v in fac.MMA_CONFIGS.items()},
                  wgmma_configs={str(k): v for k, v in fac.WGMMA_CONFIGS.items()},
                  sweep=sweep, rows=rows, unit="TFLOP/s = attention_flops / median time",
                  slow_rungs_max_n=args.slow_max_n)
    with open(os.path.join(args.out, "cuda_ladder.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = [f"# CUDA ladder vs FlashAttention-2 (SDPA FLASH_ATTENTION), forward TFLOP/s\n",
          f"GPU: {info['gpu']}; torch {info['torch']} (CUDA {info['cuda_torch']}), CuPy {info['cupy']}, "
          f"NVRTC {info['nvrtc']}, driver {info['cuda_driver']}.\n",
          f"Reproduce: `{command}`\n",
          f"wgmma, mma and FA2 in fp16; tiled and naive in fp32 (timed at N <= {args.slow_max_n} only). "
          f"mma configs (BC keys per tile, warps, m16 tiles per warp; Br = 16 x tiles x warps): {result['mma_configs']}; "
          f"wgmma configs (BC, warpgroups; Br = 64 x warpgroups): {result['wgmma_configs']}.\n",
          "| B | H | D | N | causal | FA2 | wgmma | wgmma / FA2 | mma | mma / FA2 | tiled | naive |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = lambda key: f"{r[key]:.2f}" if key in r else "–"  # noqa: E731
        w = (f"{r['wgmma_tflops']:.1f} | {r['wgmma_vs_fa2']:.2f}x") if "wgmma_tflops" in r else "– | –"
        md.append(f"| {r['B']} | {r['H']} | {r['D']} | {r['N']} | {r['causal']} | {r['fa2_tflops']:.1f} | {w} | "
                  f"{r['mma_tflops']:.1f} | {r['mma_vs_fa2']:.2f}x | {f('tiled_tflops')} | {f('naive_tflops')} |")
    with open(os.path.join(args.out, "cuda_ladder.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    log("\n".join(md))


if __name__ == "__main__":
    main()
