#!/usr/bin/env python
"""The order in which wgmma_bwd_ws starts its blocks, grid order against tile-major, and how far it splits a group
of query heads over blocks, timed on one GPU.

    python tools/ws_block_order.py --out results/ws_block_order        # on a Hopper GPU

Each block of the warp-specialised backward owns one tile of 128 keys of one K/V head and loops over the query
heads of its group (all of them, or its share when ``launch_specs.ws_backward_splits`` splits the group). Two
orders of starting them:

* grid order (the tile of keys fastest): one head's tiles run together and share the Q_i and dO_i they stream
  in L2;
* tile-major (the tile slowest): every head's first tile starts in the first wave. With a causal mask the first
  tiles of keys are seen by every query and the last by few, so this starts the longest blocks first.

``launch_specs.ws_backward_tile_major`` picks one (the kernel's ``tile_major`` argument); this tool forces each in
turn (``launch_specs.WGMMA_WS_BACKWARD_ORDER``) and times ``launch_specs.run_backward`` (``triton.testing.do_bench``,
median) for GQA and plain heads, causal and not. It checks that every timing gives the same gradients. Writes
``ws_block_order.md`` and ``ws_block_order.json`` (with the git commit) into --out and prints the table.

    python tools/ws_block_order.py --cases "1,32,8,16384,128,1;1,32,1,16384,128,1" --cudnn \
        --set WGMMA_WS_BACKWARD_MORE_BLOCKS=1024 --set WGMMA_WS_BACKWARD_MIN_BLOCKS=2048,WGMMA_WS_BACKWARD_MIN_ROWS=1 \
        --out results/ws_block_order_16k

--cases: "B,Hq,Hk,N,D,causal" entries separated by ';' (default: CASES). --set: also time each order with these
``launch_specs`` settings (comma-separated NAME=INT, taken together; the option repeats: one column pair per
--set; the library's settings are always timed). --cudnn: SDPA's cuDNN backward (``enable_gqa=True``) of the
same case beside them, in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ORDERS = ("grid", "tile-major")
# settings --set may change: the split rule's (launch_specs.ws_backward_splits) and the order rule's
SETTINGS = ("WGMMA_WS_BACKWARD_MIN_BLOCKS", "WGMMA_WS_BACKWARD_MORE_BLOCKS", "WGMMA_WS_BACKWARD_MIN_ROWS",
            "WGMMA_WS_TILE_MAJOR_MAX_BLOCKS")
# (B, Hq, Hk, N, D, causal)
CASES = [(2, 32, 8, 4096, 128, True), (2, 32, 8, 4096, 128, False), (1, 32, 8, 8192, 128, True),
         (4, 32, 4, 4096, 128, True), (4, 16, 16, 4096, 128, True), (4, 16, 16, 4096, 128, False),
         (4, 16, 16, 4096, 64, True)]


def parse_settings(text: str) -> dict:
    """--set "NAME=INT,NAME=INT" -> {NAME: INT}, names from SETTINGS."""
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        if name not in SETTINGS or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"ws_block_order: --set takes NAME=INT with NAME one of {', '.join(SETTINGS)}; got {item!r}")
        out[name] = int(value)
    if not out:
        raise ValueError(f"ws_block_order: --set {text!r} names no setting")
    return out


def label(settings: dict) -> str:
    """A column's name for a --set: the settings, shortened (WGMMA_WS_BACKWARD_MIN_BLOCKS=1024 -> MIN_BLOCKS=1024)."""
    return ",".join(f"{k.replace('WGMMA_WS_BACKWARD_', '').replace('WGMMA_WS_', '')}={v}" for k, v in settings.items())


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


def column(order: str, settings: dict) -> str:
    """A timing's column: the order, with the --set settings where they are not the library's."""
    return order if not settings else f"{order} {label(settings)}"


def markdown(rows: list, meta: dict) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r["ms"]))
    out = ["# wgmma_bwd_ws: grid order against tile-major", "",
           f"GPU: {meta['gpu']}; torch {meta['torch']}; git commit {meta.get('git_commit', '?')}.", "",
           f"Reproduce: `{meta['command']}`", "",
           "ms per backward call (launch_specs.run_backward, fp16, do_bench median); x = grid / tile-major "
           "(above 1: tile-major is faster), at the library's settings " f"({label(meta['settings'])}); splits: the "
           "library's (per column in ws_block_order.json); the library's own order in the last column; a column "
           "named with settings ran with those (--set); sdpa-cudnn: SDPA's cuDNN backward (enable_gqa) of the "
           "same case.", "",
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
    ap.add_argument("--set", action="append", default=[], dest="settings",
                    help="NAME=INT,...: also time with these launch_specs settings (repeatable)")
    ap.add_argument("--cudnn", action="store_true", help="SDPA's cuDNN backward of each case beside them")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases) if args.cases else CASES
    sweep = [{}] + [parse_settings(text) for text in args.settings]
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("ws_block_order: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    from benchmarks.report import git_state
    from flash_attention_cuda import launch_specs, runtime
    from flash_attention_py.inputs import make_inputs

    library = {name: getattr(launch_specs, name) for name in SETTINGS}
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, settings=library,
                command="python tools/ws_block_order.py " + " ".join(argv), **git_state())
    rows, grads = [], {}

    def problem_of(n):
        B, Hq, Hk, N, D, causal = cases[n]
        x = make_inputs(B, Hq, N, N, D, Hk=Hk, dtype="float16", device="cuda", seed=n)
        return x, ((-1, 0) if causal else (-1, -1)), D ** -0.5

    def use(settings: dict, order) -> None:
        for name in SETTINGS:
            setattr(launch_specs, name, settings.get(name, library[name]))
        launch_specs.WGMMA_WS_BACKWARD_ORDER = order
        launch_specs.clear_caches()

    try:
        for n, (B, Hq, Hk, N, D, causal) in enumerate(cases):
            x, window, scale = problem_of(n)
            q, k, v, do = x["q"], x["k"], x["v"], x["do"]
            o, lse = launch_specs.run_forward(q, k, v, window, scale, "wgmma-ws")
            p = launch_specs._problem(q, k, scale, window)
            use({}, None)
            rows.append(dict(B=B, Hq=Hq, Hk=Hk, N=N, D=D, causal=causal, splits=launch_specs.ws_backward_splits(p),
                             picks="tile-major" if launch_specs.ws_backward_tile_major(p) else "grid", ms={},
                             splits_of={}))
            for settings in sweep:
                for order in ORDERS:
                    use(settings, order)
                    fn = lambda: launch_specs.run_backward(q, k, v, o, lse, do, window, scale, "wgmma-ws")  # noqa: E731
                    got = [g.float() for g in fn()]
                    if n in grads:  # the same sums in another order: the float32 adds of dQ (and of split dK, dV)
                        for a, b in zip(got, grads[n]):
                            torch.testing.assert_close(a, b, atol=2e-2, rtol=1e-2)
                    else:
                        grads[n] = got
                    ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                    rows[n]["ms"][column(order, settings)] = ms
                    rows[n]["splits_of"][column(order, settings)] = launch_specs.ws_backward_splits(p)
                    print(f"{column(order, settings):>24}: B{B} Hq{Hq} Hk{Hk} N{N} D{D} causal={causal}: {ms:.3f} ms "
                          f"({launch_specs.ws_backward_splits(p)} splits)", flush=True)
            del x, q, k, v, do, o, lse, got
            grads.pop(n)
            torch.cuda.empty_cache()
    finally:
        use({}, None)
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
