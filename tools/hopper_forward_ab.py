#!/usr/bin/env python
"""The Triton rung's two forwards on a Hopper GPU, beside cuDNN's, in one run: ``forward_kernel.py`` (Triton's
compiler schedules it) and ``hopper_forward.py`` (one Gluon kernel, warp-specialised), once for each setting of its
``CONFIG`` asked for.

    PYTHONPATH=. FA_CUDA_LAUNCH_PLANS=0 python tools/hopper_forward_ab.py --out results/hopper_forward
    PYTHONPATH=. python tools/hopper_forward_ab.py --configs "STAGES=2;STAGES=3"
    PYTHONPATH=. python tools/hopper_forward_ab.py --shapes 2x32x8x4096 --causal yes

Each shape is BxHqxHkxN (D = 128, fp16). For each, the median times (``triton.testing.do_bench``, CUDA events) of the
forward alone: cuDNN's (SDPA with ``enable_gqa``), ``forward_kernel.py``'s and the Gluon kernel's in each setting, and
each as x cuDNN (above 1: faster than cuDNN); then the largest difference of each Gluon setting's O from the first
setting's (0: bitwise the same; a setting that only reorders work should give 0) and from ``forward_kernel.py``'s.
``--configs``: ``;``-separated settings of ``hopper_forward.CONFIG``, each ``KEY=VALUE,...`` over the defaults, a
column each. ``--out DIR`` also writes the table to DIR/hopper_forward_ab.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess

SHAPES = "2x32x8x4096,2x32x1x4096,4x16x16x4096,1x32x8x16384"  # (both A/B tools)


def parse_configs(text: str, default: dict, tool: str) -> list[dict]:
    """``KEY=VALUE,...;...`` -> one dict of int settings per column ([{}]: the defaults alone); a key not in
    ``default`` exits with a message naming it."""
    if not text:
        return [{}]
    configs = [dict(kv.split("=", 1) for kv in c.split(",") if kv) for c in text.split(";")]
    for c in configs:
        if set(c) - set(default):
            raise SystemExit(f"{tool}: --configs sets {sorted(set(c) - set(default))}, expected keys of "
                             f"{sorted(default)}")
    return [{k: int(v) for k, v in c.items()} for c in configs]


def ab_setup(doc: str, module: str, columns: list, extra: dict | None = None):
    """The command line and set-up the two A/B tools share (this one and hopper_backward_ab.py): parses --shapes,
    --causal, --configs (over flash_attention_triton.<module>.CONFIG, and the tool's own ``extra`` keys) and --out,
    then checks for an sm_90 GPU.
    Returns (args, the module's CONFIG, the settings, the table's lines so far: its header with ``columns`` first and
    two per setting, and a generator of the cases: (B, Hq, Hk, N, causal, make_inputs' dict), D = 128 fp16, with a
    progress bar)."""
    import importlib

    tool = f"{module}_ab.py"
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help=f"BxHqxHkxN, comma-separated (default {SHAPES})")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--configs", default="", help=f"settings of {module}.CONFIG to time, ';'-separated, each "
                    "KEY=VALUE,... over the defaults (default: the defaults alone)")
    ap.add_argument("--out", default=None, help=f"folder for {module}_ab.md")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    for s in shapes:
        if len(s) != 4:
            raise SystemExit(f"{tool}: --shapes takes BxHqxHkxN, got {'x'.join(map(str, s))}")
    flags = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    default = dict(importlib.import_module(f"flash_attention_triton.{module}").CONFIG)
    configs = parse_configs(args.configs, {**default, **(extra or {})}, tool)

    import torch
    from tqdm import tqdm

    from flash_attention_py import make_inputs

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        raise SystemExit(f"{tool}: needs an sm_90 GPU (Hopper)")
    names = [("Gluon " + ",".join(f"{k}={v}" for k, v in c.items())).strip() for c in configs]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; commit {commit or '?'}.", "",
             f"Gluon: {module}.CONFIG = {default}, each column's settings over it.", "",
             "| " + " | ".join(columns) + " " + "".join(f"| {n} ms | x cuDNN " for n in names) + "|",
             "|---" * (len(columns) + 2 * len(names)) + "|"]

    def cases():
        for (B, H, Hk, N), causal in tqdm([(s, c) for s in shapes for c in flags], desc="shapes"):
            yield B, H, Hk, N, causal, make_inputs(B, H, N, N, 128, dtype="float16", device="cuda", Hk=Hk,
                                                   draw="device")

    return args, default, configs, lines, cases()


def write_table(lines: list, out, name: str) -> None:
    """Print the table, and with --out also write it to OUT/name."""
    print("\n".join(lines))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def main() -> None:
    args, default, configs, lines, cases = ab_setup(__doc__, "hopper_forward", [
        "B", "Hq", "Hk", "N", "causal", "max-abs O vs first setting; vs forward_kernel", "cuDNN ms", "forward_kernel ms",
        "x cuDNN"])

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from flash_attention_py import masks
    from flash_attention_triton import hopper_forward as hf
    from flash_attention_triton import launch as L

    for B, H, Hk, N, causal, x in cases:
        D = 128
        q, k, v = x["q"], x["k"], x["v"]
        scale, window = D ** -0.5, masks.window_for(causal)
        plain, L.HOPPER_FORWARD = L.HOPPER_FORWARD, False  # forward_kernel.py, whatever the dispatch default
        try:
            o_plain = L._forward(q, k, v, window, scale)[0]
            t_plain = do_bench(lambda: L._forward(q, k, v, window, scale), warmup=25, rep=200)
        finally:
            L.HOPPER_FORWARD = plain
        outs, times = [], []
        for c in configs:
            hf.CONFIG.update(default, **c)
            try:
                outs.append(hf.forward(q, k, v, window, scale)[0])
                times.append(do_bench(lambda: hf.forward(q, k, v, window, scale), warmup=25, rep=200))
            finally:
                hf.CONFIG.update(default)
        diff = ", ".join(f"{(o.float() - outs[0].float()).abs().max().item():.1e}" for o in outs[1:]) or "-"
        diff += f"; {(outs[0].float() - o_plain.float()).abs().max().item():.1e}"
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            t_cudnn = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hk < H),
                               warmup=25, rep=200)
        lines.append(f"| {B} | {H} | {Hk} | {N} | {causal} | {diff} | {t_cudnn:.3f} | {t_plain:.3f} | "
                     f"{t_cudnn / t_plain:.2f} | " + "".join(f"{t:.3f} | {t_cudnn / t:.2f} | " for t in times).strip())
    write_table(lines, args.out, "hopper_forward_ab.md")


if __name__ == "__main__":
    main()
