"""Time the CUDA backward (tensor-core kernels/mma_backward.cu, and the fp32 tiled kernels) beside FlashAttention-2.

    PYTHONPATH=. python3 benchmarks/cuda_backward_vs_fa2.py [--out docs/results/cuda] [--quick]

Shapes: those of cuda_ladder_vs_fa2.py (B=4 H=32 D=64, B=4 H=16 D=128), N = 2048 ... 16384, causal and
not, fp16. What is timed is ``o.backward(do)`` alone (the forward graph is kept, gradients reset to None
between calls), for SDPA under FLASH_ATTENTION and for ``flash_attn_cuda`` (whose backward runs the mma
kernels); the fp32 tiled backward (``flash_attn_cuda_backward(kernel='tiled')``, fp16 inputs upcast) is
timed at N <= --slow-max-n. TFLOP/s = 2.5 x attention_flops / median time. The gradients of both are
compared (max-abs difference). Writes cuda_backward.json and cuda_backward.md to --out. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.cuda_ladder_vs_fa2 import NS, SHAPES, bench, sdpa_fa2, versions  # noqa: E402
from flash_attention_py.common import attention_flops  # noqa: E402

import flash_attention_cuda.launcher as launcher  # noqa: E402
from flash_attention_cuda import flash_attn_cuda, flash_attn_cuda_backward  # noqa: E402

SWEEP = [(4, 64), (8, 64), (4, 32), (8, 32)]  # (warps per block, rows of the looped tile)


def time_backward(forward, q, k, v, do):
    """Median ms of o.backward(do) and the gradients it produced."""
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = forward(qq, kk, vv)

    def step():
        qq.grad = kk.grad = vv.grad = None
        o.backward(do, retain_graph=True)

    ms, _ = bench(step)
    return ms, (qq.grad, kk.grad, vv.grad)


def sweep(log):
    """Time each MMA_BACKWARD_CONFIG candidate at N=4096 (full + causal backward, both D); keep the fastest."""
    results, best = [], None
    data = {}
    for shape in SHAPES:
        data[shape["D"]] = [torch.randn(shape["B"], shape["H"], 4096, shape["D"], device="cuda", dtype=torch.float16)
                            for _ in range(4)]
    for cfg in SWEEP:
        launcher.MMA_BACKWARD_CONFIG = cfg
        tot = 0.0
        for D, (q, k, v, do) in data.items():
            for causal in (False, True):
                ms, _ = time_backward(lambda a, b, c: flash_attn_cuda(a, b, c, causal=causal), q, k, v, do)
                tot += ms
        results.append(dict(warps=cfg[0], tile=cfg[1], ms_total=tot))
        log(f"sweep backward warps={cfg[0]} tile={cfg[1]}: {tot:.3f} ms (D 64 + 128, full + causal, N=4096)")
        if best is None or tot < best[0]:
            best = (tot, cfg)
    launcher.MMA_BACKWARD_CONFIG = best[1]
    log(f"sweep backward: best {best[1]}")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/results/cuda")
    ap.add_argument("--quick", action="store_true", help="N = 2048, 4096 only")
    ap.add_argument("--slow-max-n", type=int, default=2048, help="largest N for the fp32 tiled backward")
    ap.add_argument("--sweep", action="store_true", help="pick the fastest MMA_BACKWARD_CONFIG first")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = versions()
    print(json.dumps(info), flush=True)
    swept = sweep(lambda s: print(s, flush=True)) if args.sweep else []
    rows = []
    for shape in SHAPES:
        B, H, D = shape["B"], shape["H"], shape["D"]
        for N in NS[:2] if args.quick else NS:
            q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(4))
            for causal in (False, True):
                flops = 2.5 * attention_flops(B, H, N, N, D, causal=causal)
                row = dict(B=B, H=H, N=N, D=D, causal=causal, flops=flops)
                ms, g_fa2 = time_backward(lambda a, b, c: sdpa_fa2(a, b, c, causal), q, k, v, do)
                row["fa2_ms"], row["fa2_tflops"] = ms, flops / ms / 1e9
                ms, g_mma = time_backward(lambda a, b, c: flash_attn_cuda(a, b, c, causal=causal), q, k, v, do)
                row["mma_ms"], row["mma_tflops"] = ms, flops / ms / 1e9
                row["mma_vs_fa2"] = row["mma_tflops"] / row["fa2_tflops"]
                row["max_abs_vs_fa2"] = {n: (a.float() - b.float()).abs().max().item()
                                         for n, a, b in zip(("dq", "dk", "dv"), g_mma, g_fa2)}
                if N <= args.slow_max_n:
                    o, lse = flash_attn_cuda(q, k, v, causal=causal, return_lse=True)
                    ms, _ = bench(lambda: flash_attn_cuda_backward(q, k, v, o, lse, do, causal=causal, kernel="tiled"),
                                  min_reps=2, max_reps=4, budget_s=0.3, batch_ms=1.0)
                    row["tiled_ms"], row["tiled_tflops"] = ms, flops / ms / 1e9
                rows.append(row)
                print(f"B={B} H={H} D={D} N={N:>5} causal={causal!s:<5}  FA2 bwd {row['fa2_tflops']:6.1f}  "
                      f"mma bwd {row['mma_tflops']:6.1f} ({row['mma_vs_fa2']:.2f}x, max diff "
                      f"{max(row['max_abs_vs_fa2'].values()):.1e})  tiled bwd {row.get('tiled_tflops', float('nan')):6.2f}",
                      flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    command = "PYTHONPATH=. python3 benchmarks/cuda_backward_vs_fa2.py " + " ".join(sys.argv[1:])
    with open(os.path.join(args.out, "cuda_backward.json"), "w") as f:
        json.dump(dict(info=info, command=command, config=launcher.MMA_BACKWARD_CONFIG, sweep=swept, rows=rows,
                       unit="TFLOP/s = 2.5 x attention_flops / median time of o.backward(do)"), f, indent=1)
    md = ["# CUDA backward vs FlashAttention-2 (SDPA FLASH_ATTENTION), TFLOP/s of o.backward(do)\n",
          f"GPU: {info['gpu']}; torch {info['torch']}, CuPy {info['cupy']}, NVRTC {info['nvrtc']}.\n",
          f"Reproduce: `{command}`\n",
          "fp16. mma = kernels/mma_backward.cu (tensor cores, fp32 accumulation; config (warps, looped tile rows) = "
          f"{launcher.MMA_BACKWARD_CONFIG}); tiled = kernels/backward.cu "
          f"(fp32, inputs upcast; N <= {args.slow_max_n} only). FLOPs = 2.5 x 4·B·H·N²·D (x0.5 causal).\n",
          "| B | H | D | N | causal | FA2 | mma | mma / FA2 | tiled | max-abs diff vs FA2 (dq, dk, dv) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = f"{r['tiled_tflops']:.2f}" if "tiled_tflops" in r else "–"
        d = ", ".join(f"{x:.1e}" for x in r["max_abs_vs_fa2"].values())
        md.append(f"| {r['B']} | {r['H']} | {r['D']} | {r['N']} | {r['causal']} | {r['fa2_tflops']:.1f} | "
                  f"{r['mma_tflops']:.1f} | {r['mma_vs_fa2']:.2f}x | {t} | {d} |")
    with open(os.path.join(args.out, "cuda_backward.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
