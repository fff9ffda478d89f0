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


def markdown(rows: list, meta: dict) -> str:
    out = ["# wgmma_bwd_ws: grid order against tile-major", "",
           f"GPU: {meta['gpu']}; torch {meta['torch']}; git commit {meta.get('git_commit', '?')}.", "",
           f"Reproduce: `{meta['command']}`", "",
           "ms per backward call (launch_specs.run_backward, fp16, do_bench median); x = grid / tile-major "
           "(above 1: tile-major is faster); the kernel's own choice in the last column.", "",
           "| B | Hq | Hk | N | D | causal | grid ms | tile-major ms | x | kernel picks |",
           "|---|---|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['B']} | {r['Hq']} | {r['Hk']} | {r['N']} | {r['D']} | {'yes' if r['causal'] else 'no'} | "
                   f"{r['grid']:.3f} | {r['tile-major']:.3f} | {r['grid'] / r['tile-major']:.2f} | {r['picks']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("ws_block_order: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    from benchmarks.report import git_state
    from flash_attention_cuda import launch_specs, runtime
    from flash_attention_py.inputs import make_inputs

    original = runtime.read_source
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                command="python tools/ws_block_order.py " + " ".join(argv), **git_state())
    rows, grads = [], {}
    try:
        for order in ORDERS:
            runtime.read_source = lambda src, o=order: forced_source(original(src), o) if src == SOURCE else original(src)
            runtime._KERNEL_CACHE.clear()
            runtime._SMEM_SET.clear()
            runtime._FUNCTIONS.clear()
            for n, (B, Hq, Hk, N, D, causal) in enumerate(CASES):
                x = make_inputs(B, Hq, N, N, D, Hk=Hk, dtype="float16", device="cuda", seed=n)
                q, k, v, do = x["q"], x["k"], x["v"], x["do"]
                window, scale = ((-1, 0) if causal else (-1, -1)), D ** -0.5
                o, lse = launch_specs.run_forward(q, k, v, window, scale, "wgmma-ws")
                fn = lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "wgmma-ws")  # noqa: E731
                got = [g.float() for g in fn()]
                if n in grads:  # the same sums, in another order of blocks: dQ's float32 adds may differ slightly
                    for a, b in zip(got, grads[n]):
                        torch.testing.assert_close(a, b, atol=2e-2, rtol=1e-2)
                else:
                    grads[n] = got
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                if order == "grid":
                    p = launch_specs._problem(q, k, scale, window)
                    per = -(-p.group // launch_specs.ws_backward_splits(p))
                    rows.append(dict(B=B, Hq=Hq, Hk=Hk, N=N, D=D, causal=causal,
                                     picks="tile-major" if per > 1 and causal else "grid"))
                rows[n][order] = ms
                print(f"{order:>10}: B{B} Hq{Hq} Hk{Hk} N{N} D{D} causal={causal}: {ms:.3f} ms", flush=True)
                del x, q, k, v, do, o, lse
                torch.cuda.empty_cache()
    finally:
        runtime.read_source = original
        runtime._KERNEL_CACHE.clear()
        runtime._SMEM_SET.clear()
        runtime._FUNCTIONS.clear()
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
