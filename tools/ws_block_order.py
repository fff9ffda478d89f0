#!/usr/bin/env python
"""The order in which wgmma_bwd_ws starts its blocks: grid order against tile-major, timed on one GPU.

    python tools/ws_block_order.py --out results/ws_block_order        # on a Hopper GPU

Each block of the warp-specialised backward owns one tile of 128 keys of one K/V head and loops over the query
heads of its group (all of them, or its share when ``launch_specs.ws_backward_splits`` splits the group). Two
orders of starting them:

* grid order (the tile of keys fastest): one head's tiles run together and share the Q_i and dO_i they stream
  in L2;
* tile-major (the tile slowest): every head's first tile starts in the first wave. With a causal mask the first
  tiles of keys are seen by every query and the last by few, so this starts the longest blocks first.

The kernel picks tile-major where a block loops over several query heads and the mask is bounded on one side
(``tile_major`` in ``wgmma_bwd_ws``). This tool rewrites that one line of the source before NVRTC compiles it, to
force either order, and times ``launch_specs.run_backward`` (``triton.testing.do_bench``, median) for GQA and
plain heads, causal and not. It checks that both orders give the same gradients. Writes ``ws_block_order.md``
and ``ws_block_order.json`` (with the git commit) into --out and prints the table.

    python tools/ws_block_order.py --cases "1,32,8,16384,128,1;1,32,1,16384,128,1" --min-blocks 512,1024,2048 \
        --cudnn --out results/ws_block_order_16k

--cases: "B,Hq,Hk,N,D,causal" entries separated by ';' (default: CASES). --min-blocks: also time each order with
``launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS`` set to each value (how far ``ws_backward_splits`` splits a group of
query heads over blocks; the library's value is always timed). --cudnn: SDPA's cuDNN backward
(``enable_gqa=True``) of the same case beside them, in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SOURCE = "wgmma_backward.cu"
RULE = "const bool tile_major = per > 1 && (mask.right >= 0) != (mask.left >= 0);"
ORDERS = {"grid": "const bool tile_major = false;", "tile-major": "const bool tile_major = true;"}
# (B, Hq, Hk, N, D, causal)
CASES = [(2, 32, 8, 4096, 128, True), (2, 32, 8, 4096, 128, False), (1, 32, 8, 8192, 128, True),
         (4, 32, 4, 4096, 128, True), (4, 16, 16, 4096, 128, True), (4, 16, 16, 4096, 128, False),
         (4, 16, 16, 4096, 64, True)]


def forced_source(text: str, order: str) -> str:
    """wgmma_backward.cu's text with the kernel's choice of order replaced by ``order`` ('grid', 'tile-major')."""
    if RULE not in text:
        raise ValueError(f"ws_block_order: {SOURCE} no longer holds the line {RULE!r}; update RULE")
    return text.replace(RULE, ORDERS[order])


def parse_cases(text: str) -> list:
    """--cases "B,Hq,Hk,N,D,causal;..." -> [(B, Hq, Hk, N, D, causal), ...]."""
    cases = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        parts = entry.split(",")
        if len(parts) != 6:
            raise ValueError(f"ws_block_order: --cases entry {entry!r} must be B,Hq,Hk,N,D,causal")
        B, Hq, Hk, N, D, causal = (int(x) for x in parts)
        if Hq % Hk:
            raise ValueError(f"ws_block_order: --cases entry {entry!r}: Hq = {Hq} is not a multiple of Hk = {Hk}")
        cases.append((B, Hq, Hk, N, D, bool(causal)))
    return cases


def column(order: str, min_blocks) -> str:
    """A timing's column: the order, with the split setting where it is not the library's."""
    return order if min_blocks is None else f"{order} m{min_blocks}"


def markdown(rows: list, meta: dict) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r["ms"]))
    out = ["# wgmma_bwd_ws: grid order against tile-major", "",
           f"GPU: {meta['gpu']}; torch {meta['torch']}; git commit {meta.get('git_commit', '?')}.", "",
           f"Reproduce: `{meta['command']}`", "",
           "ms per backward call (launch_specs.run_backward, fp16, do_bench median); x = grid / tile-major "
           "(above 1: tile-major is faster); the kernel's own choice in the last column. \"mN\": with "
           "WGMMA_WS_BACKWARD_MIN_BLOCKS = N (the library's: " f"{meta['min_blocks']}; splits per case in "
           "ws_block_order.json); sdpa-cudnn: SDPA's cuDNN backward (enable_gqa) of the same case.", "",
           "| B | Hq | Hk | N | D | causal | splits | " + " | ".join(f"{c} ms" for c in cols) + " | x | kernel picks |",
           "|---|---|---|---|---|---|---:|" + "---:|" * len(cols) + "---:|---|"]
    for r in rows:
        ms = r["ms"]
        out.append(f"| {r['B']} | {r['Hq']} | {r['Hk']} | {r['N']} | {r['D']} | {'yes' if r['causal'] else 'no'} | "
                   f"{r['splits']} | " + " | ".join(f"{ms[c]:.3f}" if c in ms else "–" for c in cols)
                   + f" | {ms['grid'] / ms['tile-major']:.2f} | {r['picks']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=None, help='"B,Hq,Hk,N,D,causal;..." (default: the tool\'s CASES)')
    ap.add_argument("--min-blocks", default="", help="also time with WGMMA_WS_BACKWARD_MIN_BLOCKS = each of these")
    ap.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN backward of each case beside them")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases) if args.cases else CASES
    sweep = [None] + [int(x) for x in args.min_blocks.split(",") if x.strip()]
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("ws_block_order: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    from benchmarks.report import git_state
    from flash_attention_cuda import launch_specs, runtime
    from flash_attention_py.inputs import make_inputs

    original, library_min = runtime.read_source, launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, min_blocks=library_min,
                command="python tools/ws_block_order.py " + " ".join(argv), **git_state())
    rows, grads = [], {}

    def problem_of(n):
        B, Hq, Hk, N, D, causal = cases[n]
        x = make_inputs(B, Hq, N, N, D, Hk=Hk, dtype="float16", device="cuda", seed=n)
        return x, ((-1, 0) if causal else (-1, -1)), D ** -0.5

    try:
        for order in ORDERS:
            runtime.read_source = lambda src, o=order: forced_source(original(src), o) if src == SOURCE else original(src)
            runtime._KERNEL_CACHE.clear()
            runtime._SMEM_SET.clear()
            runtime._FUNCTIONS.clear()
            for n, (B, Hq, Hk, N, D, causal) in enumerate(cases):
                x, window, scale = problem_of(n)
                q, k, v, do = x["q"], x["k"], x["v"], x["do"]
                o, lse = launch_specs.run_forward(q, k, v, window, scale, "wgmma-ws")
                if order == "grid":
                    p = launch_specs._problem(q, k, scale, window)
                    splits = launch_specs.ws_backward_splits(p)
                    rows.append(dict(B=B, Hq=Hq, Hk=Hk, N=N, D=D, causal=causal, splits=splits, ms={},
                                     picks="tile-major" if -(-p.group // splits) > 1 and causal else "grid",
                                     splits_of={}))
                for min_blocks in sweep:
                    launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS = library_min if min_blocks is None else min_blocks
                    launch_specs.clear_caches()
                    fn = lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "wgmma-ws")  # noqa: E731
                    got = [g.float() for g in fn()]
                    if n in grads:  # the same sums, in another order: dQ's (and split dK, dV's) float32 adds may differ
                        for a, b in zip(got, grads[n]):
                            torch.testing.assert_close(a, b, atol=2e-2, rtol=1e-2)
                    else:
                        grads[n] = got
                    ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                    rows[n]["ms"][column(order, min_blocks)] = ms
                    rows[n]["splits_of"][column(order, min_blocks)] = launch_specs.ws_backward_splits(
                        launch_specs._problem(q, k, scale, window))
                    print(f"{column(order, min_blocks):>16}: B{B} Hq{Hq} Hk{Hk} N{N} D{D} causal={causal}: "
                          f"{ms:.3f} ms", flush=True)
                launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS = library_min
                launch_specs.clear_caches()
                del x, q, k, v, do, o, lse, got
                torch.cuda.empty_cache()
    finally:
        runtime.read_source = original
        runtime._KERNEL_CACHE.clear()
        runtime._SMEM_SET.clear()
        runtime._FUNCTIONS.clear()
        launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS = library_min
        launch_specs.clear_caches()
    if args.cudnn:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for n, (B, Hq, Hk, N, D, causal) in enumerate(cases):
            x, window, scale = problem_of(n)
            qq, kk, vv = (x[t].detach().clone().requires_grad_(True) for t in ("q", "k", "v"))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=Hk != Hq)
            rows[n]["ms"]["sdpa-cudnn"] = triton.testing.do_bench(
                lambda: torch.autograd.grad(out, (qq, kk, vv), x["do"], retain_graph=True), warmup=50, rep=300)
            print(f"      sdpa-cudnn: B{B} Hq{Hq} Hk{Hk} N{N} D{D} causal={causal}: {rows[n]['ms']['sdpa-cudnn']:.3f} ms",
                  flush=True)
            del x, qq, kk, vv, out
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ws_block_order.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    text = markdown(rows, meta)
    with open(os.path.join(args.out, "ws_block_order.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
