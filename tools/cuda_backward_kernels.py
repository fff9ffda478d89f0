#!/usr/bin/env python
"""Time the CUDA tensor-core backwards (mma.sync, wgmma, wgmma-fused, wgmma-ws) alone, every wgmma tile config, beside FA2 and cuDNN.

    PYTHONPATH=. python tools/cuda_backward_kernels.py --out results/backward_kernels      # on a Hopper GPU
    PYTHONPATH=. python tools/cuda_backward_kernels.py --mma-only --out results/mma_backward   # any GPU (sm_80+)

For each head dim, N and causal (B4 H16 fp16 by default): the backward kernels alone (``launch_specs.run_backward``:
Delta, dK/dV, dQ; no autograd around them) with kernel 'mma' (two kernels), kernel 'mma-fused' (one kernel, dQ
summed atomically, as FlashAttention-2 does) and with kernel 'wgmma' for each candidate
(warpgroups, streamed tile rows), kernel 'wgmma-fused' (one kernel, dQ summed atomically), kernel 'wgmma-ws' (that kernel
warp-specialised; its default config and the others of ``WS_CANDIDATES``, "wgmma-ws Br<queries per tile>"), and SDPA's FlashAttention-2 and cuDNN backward (``torch.autograd.grad`` of
one recorded forward). Times are ``triton.testing.do_bench`` medians; TFLOP/s count 2.5 x 4·B·H·N²·D (x0.5
causal). Writes ``backward_kernels.json`` and ``backward_kernels.md`` into --out. It is the measurement behind
``capabilities.HOPPER_BACKWARD``, ``HOPPER_WIDE_BACKWARD`` (D = 256: ``--head-dims 256``) and
``launch_specs.WGMMA_BACKWARD_CONFIGS``, ``WGMMA_WS_BACKWARD_CONFIGS``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CANDIDATES = {64: [(2, 64), (2, 128), (3, 64)], 128: [(2, 64), (1, 64), (3, 64)], 256: [(1, 32), (2, 32), (1, 64)],
              32: [(2, 64)], 96: [(2, 64)]}
# wgmma-ws configs (queries per tile, stages) timed beside its default (launch_specs.WGMMA_WS_BACKWARD_CONFIGS)
WS_CANDIDATES = {32: [(64, 2)], 64: [(64, 2)], 96: [], 128: []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--n", default="1024,4096,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--mma-only", action="store_true", help="only the mma.sync backwards beside FA2 and cuDNN")
    ap.add_argument("--mma-configs", action="store_true",
                    help="also the two-kernel mma backward in every candidate config of "
                         "benchmarks.presets.CONFIG_CANDIDATES['mma-backward'] (\"mma WxT\": W warps, tiles of T rows)")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from benchmarks.presets import CONFIG_CANDIDATES
    from flash_attention_cuda import flash_attn_cuda, launch_specs
    from flash_attention_cuda.capabilities import BACKWARD
    from flash_attention_py.common import attention_flops
    from flash_attention_py.inputs import make_inputs
    from flash_attention_py.masks import window_for

    B, H = args.batch, args.heads
    cases = [(D, N, causal) for D in map(int, args.head_dims.split(",")) for N in map(int, args.n.split(","))
             for causal in (False, True)]
    rows = []
    for D, N, causal in tqdm(cases, desc="backward kernels"):
        x = make_inputs(B, H, N, N, D, dtype="float16", device="cuda")
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        o, lse = flash_attn_cuda(q, k, v, causal=causal, kernel="mma", return_lse=True)
        flops = attention_flops(B, H, N, N, D, causal=causal, mode="bwd")
        window, scale = window_for(causal), D ** -0.5
        ms = {mma: do_bench(lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, mma))
              for mma in ("mma", "mma-fused")}
        # the one-kernel mma backward's other Q tile at D = 64 (8 warps, 128 keys a block; at D = 128 a Q tile of 128
        # rows spills 424 bytes a thread)
        for tile in (64, 128) if D == 64 else ():
            if (8, tile) != launch_specs.MMA_FUSED_BACKWARD_CONFIGS[D]:
                ms[f"mma-fused Br{tile}"] = do_bench(
                    lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "mma-fused", (8, tile)))
        for cfg in CONFIG_CANDIDATES["mma-backward"][None] if args.mma_configs else []:
            if tuple(cfg) == tuple(launch_specs.MMA_BACKWARD_CONFIGS[D]):
                continue
            try:
                ms[f"mma {cfg[0]}x{cfg[1]}"] = do_bench(
                    lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "mma", tuple(cfg)))
            except Exception as exc:  # a config the GPU cannot hold: printed, not fatal
                tqdm.write(f"D{D} N{N} causal={causal} mma {cfg}: {type(exc).__name__}: {exc}"[:300])
        for cfg in [] if args.mma_only else CANDIDATES.get(D, []):
            ms[f"wgmma {cfg[0]}x{cfg[1]}"] = do_bench(
                lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "wgmma", cfg))
        for one in () if args.mma_only else ("wgmma-fused", "wgmma-ws"):
            if not BACKWARD[one].supports("float16", D):  # the one-kernel backwards stop at D = 128
                continue
            ms[one] = do_bench(lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, one))
        for cfg in [] if args.mma_only else WS_CANDIDATES.get(D, []):
            ms[f"wgmma-ws Br{cfg[0]}"] = do_bench(
                lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "wgmma-ws", cfg))
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            ms[name] = do_bench(lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True))
        rows.append(dict(B=B, H=H, N=N, D=D, causal=causal, ms=ms,
                         tflops={name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    doc = dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               command="python tools/cuda_backward_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               unit="TFLOP/s = 2.5 x 4·B·H·N²·D (x0.5 causal) / do_bench median of the backward alone", rows=rows)
    names = list(dict.fromkeys(n for r in rows for n in r["tflops"]))
    md = [f"# CUDA backward kernels alone ({doc['gpu']}, B{B} H{H}, commit {commit}{' with local changes' if dirty else ''})",
          "", f"`{doc['command']}`; {doc['unit']}. wgmma RxT: R warpgroups per block, streamed tiles of T rows; "
          f"mma: its library config {launch_specs.MMA_BACKWARD_CONFIGS}, mma WxT: W warps, tiles of T rows; mma-fused: "
          f"{launch_specs.MMA_FUSED_BACKWARD_CONFIGS}, mma-fused BrT: Q tiles of T rows.", "",
          "| D | N | causal | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for r in rows:
        md.append(f"| {r['D']} | {r['N']} | {r['causal']} | "
                  + " | ".join(f"{r['tflops'][n]:.0f}" if n in r["tflops"] else "–" for n in names) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "backward_kernels.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "backward_kernels.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
