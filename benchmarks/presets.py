"""Named sets of backends, shapes and modes that ``python -m benchmarks --preset NAME`` runs.

A preset is an ordinary sweep (the same cases, the same timer in :mod:`benchmarks.measure`, the same
results.csv / results.json / report.md / plots) with its own backends, shapes, sequence lengths,
(mode, causal) pairs and dtypes, plus a summary: the side-by-side tables the docs quote
(``cuda_ladder.json``, ``cuda_backward.json``, ``triton_vs_fa2.json``, ``launch_overhead.txt``), built from
the sweep's rows after the run. ``python -m benchmarks --list`` names them.

    cuda-ladder      forward TFLOP/s of the CUDA rungs beside SDPA's FlashAttention-2 kernel
    cuda-backward    the backward alone (o.backward(dO)) of the CUDA rungs beside FlashAttention-2's
    triton-vs-fa2    Triton forward and causal backward beside FlashAttention-2 and cuDNN
    launch-overhead  host time per call at a shape too small for the GPU time to matter
    hopper           every GPU backend, fp16 and bf16, forward and backward, causal and not, beside FA2
                     and cuDNN; writes hopper_summary.json (the performance targets' table)

``--sweep`` (cuda-ladder, cuda-backward) first times the CUDA kernels' tile-config candidates per D at
N = 4096, passing each config in (``flash_attention_cuda.launcher.forward_with_config``; the backward
through ``launch_specs.run_backward``), and records every candidate and the best per D in results.json
(``config_sweep``) and in the summary. Nothing is written into the library's tables
(``launch_specs.MMA_CONFIGS``, ...): the timed rows use the library's own configs; to adopt a better one,
change the library's table.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import measure
from .targets import short_reason

SHAPES = ((4, 32, 64), (4, 16, 128))  # (B, H, D): the issue's targets
SWEEP_N = 4096


@dataclass(frozen=True)
class Preset:
    """One named benchmark: which backends, shapes, N and (mode, causal) pairs it times, and its summary.

    backends: names, the ``reference`` first (its output is the one the others are compared with);
    shapes: (B, H, D) triples; n: sizes as ``--n`` takes them; combos: (mode, causal) pairs;
    dtypes: backend -> dtypes it is timed in; max_n: backend -> the largest N it is timed at (the slow
    fp32 rungs), larger cases are recorded as skipped; timer: 'device' or 'host' (see measure.time_call);
    rounds: the default of --rounds (each backend of a case timed once a round, in turn);
    config_sweep: kernels whose tile configs ``--sweep`` times first; summary: (rows, context) ->
    {file name: text}, the side-by-side files written beside results.json.
    """

    name: str
    description: str
    backends: tuple
    shapes: tuple
    n: str
    combos: tuple
    dtypes: dict
    reference: Optional[str] = None
    max_n: dict = field(default_factory=dict)
    timer: str = "device"
    device: str = "cuda"
    repeats: int = 10
    rounds: int = 1
    max_call_s: float = 10.0
    config_sweep: tuple = ()
    summary: Optional[Callable] = None


# ------------------------------------------------------------------------------------ side-by-side rows
def pivot(rows, short):
    """Wide rows, one per (B, H, D, N, causal, mode), from the sweep's long rows (status ok, Nq = Nk).

    ``short`` maps a backend name to the prefix of its fields: ``{prefix}_ms``, ``{prefix}_tflops`` and,
    where the row was compared with the reference, ``{prefix}_max_abs_vs_ref`` (the largest over the
    outputs) and ``{prefix}_max_abs_each`` (one per output: O, or dQ, dK, dV).
    """
    wide = {}
    for r in rows:
        if r.get("status") != "ok" or r["backend"] not in short or r["Nq"] != r["Nk"]:
            continue
        key = (r["B"], r["H"], r["D"], r["Nk"], r["causal"], r["mode"])
        w = wide.setdefault(key, dict(B=r["B"], H=r["H"], N=r["Nk"], D=r["D"], causal=r["causal"], mode=r["mode"],
                                      flops=r["gflop"] * 1e9))
        p = short[r["backend"]]
        w[f"{p}_ms"], w[f"{p}_tflops"] = r["time_ms"], r["tflops"]
        diff = r.get("max_abs_vs_ref")
        if diff is not None and not (isinstance(diff, float) and math.isnan(diff)):
            w[f"{p}_max_abs_vs_ref"] = diff
            w[f"{p}_max_abs_each"] = list(r.get("max_abs_each") or [diff])
    return [wide[k] for k in sorted(wide, key=lambda k: (k[2], k[0], -k[1], k[3], k[4], k[5] != "fwd", k[5]))]


def _ratio(w, a, b, name):
    if w.get(f"{a}_tflops") and w.get(f"{b}_tflops"):
        w[name] = w[f"{a}_tflops"] / w[f"{b}_tflops"]


def _f(x, fmt):
    return "–" if x is None else format(x, fmt)


def _header(title, ctx, note):
    meta = ctx["meta"]
    return [f"# {title}", "",
            f"{'GPU: ' + meta['gpu'] if meta.get('gpu') else 'CPU: ' + str(meta.get('cpu_model'))}; torch {meta.get('torch')}, triton {meta.get('triton')}, "
            f"CuPy {meta.get('cupy')}.", "", f"Reproduce: `{meta.get('command')}`", "", note, ""]


def _sweep_text(ctx):
    sweep = ctx.get("config_sweep") or {}
    if not sweep.get("best"):
        return ""
    return (f"Tile-config sweep (N = {SWEEP_N}, best per D): {json.dumps(sweep['best'])}; the library's own configs, "
            f"used for the rows: {json.dumps(sweep.get('library'))}.")


# ------------------------------------------------------------------------------------ summaries
def ladder_summary(rows, ctx):
    """cuda_ladder.json / .md: forward TFLOP/s of every CUDA rung and of FA2 per shape, N and causal."""
    wide = pivot(rows, {"sdpa-flash": "fa2", "cuda-wgmma": "wgmma", "cuda-mma": "mma", "cuda-tiled": "tiled",
                        "cuda-naive": "naive"})
    for w in wide:
        for k in ("mma", "wgmma"):
            _ratio(w, k, "fa2", f"{k}_vs_fa2")
            if f"{k}_max_abs_vs_ref" in w:
                w[f"{k}_max_abs_vs_fa2"] = w.pop(f"{k}_max_abs_vs_ref")
                w.pop(f"{k}_max_abs_each", None)
    slow = ctx["preset"].max_n.get("cuda-naive")
    sweep = ctx.get("config_sweep") or {}
    doc = dict(info=ctx["meta"], command=ctx["meta"].get("command"), configs=sweep.get("library"),
               sweep=sweep.get("results", []), best_configs=sweep.get("best", {}), rows=wide,
               unit="TFLOP/s = attention_flops / median time (triton.testing.do_bench)", slow_rungs_max_n=slow)
    md = _header("CUDA ladder vs FlashAttention-2 (SDPA FLASH_ATTENTION), forward TFLOP/s", ctx,
                 f"wgmma, mma and FA2 in fp16; tiled and naive in fp32 (N <= {slow} only). {_sweep_text(ctx)}")
    md += ["| B | H | D | N | causal | FA2 | wgmma | wgmma / FA2 | mma | mma / FA2 | tiled | naive |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in wide:
        md.append(f"| {w['B']} | {w['H']} | {w['D']} | {w['N']} | {w['causal']} | {_f(w.get('fa2_tflops'), '.1f')} | "
                  f"{_f(w.get('wgmma_tflops'), '.1f')} | {_f(w.get('wgmma_vs_fa2'), '.2f')}x | "
                  f"{_f(w.get('mma_tflops'), '.1f')} | {_f(w.get('mma_vs_fa2'), '.2f')}x | "
                  f"{_f(w.get('tiled_tflops'), '.2f')} | {_f(w.get('naive_tflops'), '.2f')} |")
    return {"cuda_ladder.json": json.dumps(doc, indent=1, default=str), "cuda_ladder.md": "\n".join(md) + "\n"}


def backward_summary(rows, ctx):
    """cuda_backward.json / .md: TFLOP/s of the backward alone, mma and tiled against FA2's."""
    wide = pivot(rows, {"sdpa-flash": "fa2", "cuda-mma": "mma", "cuda-tiled": "tiled"})
    for w in wide:
        _ratio(w, "mma", "fa2", "mma_vs_fa2")
        each = w.pop("mma_max_abs_each", None)
        w.pop("mma_max_abs_vs_ref", None)
        if each is not None:
            w["max_abs_vs_fa2"] = dict(zip(("dq", "dk", "dv"), each))
        for k in ("tiled", "fa2"):
            w.pop(f"{k}_max_abs_vs_ref", None)
            w.pop(f"{k}_max_abs_each", None)
    sweep = ctx.get("config_sweep") or {}
    backward_sweep = [dict(warps=r["config"][0], tile=r["config"][1], ms_total=r["ms"])
                      for r in sweep.get("results", []) if r["kernel"] == "mma-backward" and r.get("ms") is not None]
    doc = dict(info=ctx["meta"], command=ctx["meta"].get("command"),
               config=(sweep.get("library") or {}).get("mma-backward"), best_config=sweep.get("best", {}).get("mma-backward"),
               sweep=backward_sweep, rows=wide,
               unit="TFLOP/s = 2.5 x attention_flops / median time of the backward alone (triton.testing.do_bench)")
    tiled_n = ctx["preset"].max_n.get("cuda-tiled")
    md = _header("CUDA backward vs FlashAttention-2 (SDPA FLASH_ATTENTION), TFLOP/s of the backward alone", ctx,
                 f"fp16; mma = kernels/mma_backward.cu (tensor cores), tiled = kernels/backward.cu (fp32; N <= {tiled_n} "
                 f"only). FLOPs = 2.5 x 4·B·H·N²·D (x0.5 causal). {_sweep_text(ctx)}")
    md += ["| B | H | D | N | causal | FA2 | mma | mma / FA2 | tiled | max-abs diff vs FA2 (dq, dk, dv) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for w in wide:
        d = ", ".join(f"{x:.1e}" for x in (w.get("max_abs_vs_fa2") or {}).values()) or "–"
        md.append(f"| {w['B']} | {w['H']} | {w['D']} | {w['N']} | {w['causal']} | {_f(w.get('fa2_tflops'), '.1f')} | "
                  f"{_f(w.get('mma_tflops'), '.1f')} | {_f(w.get('mma_vs_fa2'), '.2f')}x | "
                  f"{_f(w.get('tiled_tflops'), '.2f')} | {d} |")
    return {"cuda_backward.json": json.dumps(doc, indent=1, default=str), "cuda_backward.md": "\n".join(md) + "\n"}


TARGET_FWD, TARGET_BWD = 1.1, 1.0  # Triton against FA2: forward at N >= 2048, causal backward


def triton_summary(rows, ctx):
    """triton_vs_fa2.json / .md: Triton against FA2 and cuDNN, with the targets (forward >= 1.1x FA2 at
    N >= 2048, causal backward >= 1.0x)."""
    wide = pivot(rows, {"triton": "triton", "sdpa-flash": "fa2", "sdpa-cudnn": "cudnn"})
    for w in wide:
        w["max_abs_vs_fa2"] = w.pop("triton_max_abs_vs_ref", None)
        for k in ("triton", "fa2", "cudnn"):
            w.pop(f"{k}_max_abs_each", None)
            w.pop(f"{k}_max_abs_vs_ref", None)
        _ratio(w, "triton", "fa2", "vs_fa2")
        _ratio(w, "triton", "cudnn", "vs_cudnn")
        target = TARGET_FWD if w["mode"] == "fwd" else TARGET_BWD
        w["target"] = target if (w["mode"] == "bwd" or w["N"] >= 2048) else None
        w["meets_target"] = None if w["target"] is None or "vs_fa2" not in w else w["vs_fa2"] >= target
    meta = dict(ctx["meta"])
    timed = [r for r in rows if r["backend"] == "triton" and r.get("status") == "ok"]
    meta.update(dtype=timed[0]["dtype"] if timed else None,
                timer=(timed[0]["timer"] if timed else "") + " median (benchmarks/measure.py)",
                flops="4*B*H*N*N*D, x0.5 causal, x2.5 backward (flash_attention_py.common.attention_flops)",
                seconds=meta.get("wall_s"), diagnostics=None)
    try:
        from flash_attention_triton.attention import best_configs

        meta["autotune_choices"] = best_configs()
    except Exception as exc:  # noqa: BLE001 - a note, not a failure of the run
        meta["autotune_choices"] = f"not recorded: {short_reason(exc)}"
    md = _header(f"Triton FlashAttention vs FlashAttention-2 and cuDNN (SDPA backends), {meta['dtype']}", ctx,
                 "FLOPs: 4·B·H·N²·D, x0.5 causal, x2.5 backward.")
    md += ["| mode | causal | B | H | D | N | Triton TFLOP/s | FA2 TFLOP/s | cuDNN TFLOP/s | Triton/FA2 | Triton/cuDNN | target |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in wide:
        tgt = "" if w["target"] is None or w["meets_target"] is None else \
            f">= {w['target']:.1f}x: " + ("met" if w["meets_target"] else "**missed**")
        md.append(f"| {w['mode']} | {'yes' if w['causal'] else 'no'} | {w['B']} | {w['H']} | {w['D']} | {w['N']} | "
                  f"{_f(w.get('triton_tflops'), '.1f')} | {_f(w.get('fa2_tflops'), '.1f')} | {_f(w.get('cudnn_tflops'), '.1f')} | "
                  f"{_f(w.get('vs_fa2'), '.2f')} | {_f(w.get('vs_cudnn'), '.2f')} | {tgt} |")
    return {"triton_vs_fa2.json": json.dumps(dict(meta=meta, rows=wide), indent=1, default=str),
            "triton_vs_fa2.md": "\n".join(md) + "\n"}


HOPPER_NAMES = ("sdpa-flash", "sdpa-cudnn", "triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma")


def hopper_summary(rows, ctx):
    """hopper_summary.json / .md: per (mode, dtype, B, H, N, D, causal), the TFLOP/s of every backend that ran
    it (FA2 as 'sdpa-flash', cuDNN as 'sdpa-cudnn', the CUDA rungs 'cuda-...'), with the ratios to both.
    The CUDA rungs' backward is the tensor-core backward (mma_backward.cu) for both."""
    meta = ctx["meta"]
    wide = {}
    for r in rows:
        if r.get("status") != "ok" or r["Nq"] != r["Nk"]:
            continue
        key = (r["mode"], r["dtype"], r["B"], r["H"], r["Nk"], r["D"], r["causal"])
        w = wide.setdefault(key, dict(zip(("mode", "dtype", "B", "H", "N", "D", "causal"), key), tflops={}))
        w["tflops"][r["backend"]] = round(r["tflops"], 2)
    order = sorted(wide, key=lambda k: (k[0] != "fwd", k[1], k[5], k[6], k[4], k[2], k[3]))
    out = [wide[k] for k in order]
    rounds, order = meta.get("rounds", 1), meta.get("round_order", "case")
    how = ("each round a pass over the whole run" if order == "run" else "a row's rounds back to back")
    if meta.get("turn_order") == "rotate":
        how += ", each round starting one backend later than the one before"
    doc = {"commit": meta.get("git_commit"), "dirty": meta.get("git_dirty"), "gpu": meta.get("gpu"),
           "torch": meta.get("torch"), "triton": meta.get("triton"), "command": meta.get("command"),
           "unit": "TFLOP/s = 4*B*H*N*N*D (x0.5 causal, x2.5 backward) / median time (triton.testing.do_bench)"
                   + (f"; the median of {rounds} rounds, every backend of a row timed once a round, in turn, {how}"
                      if rounds > 1 else ""),
           "rounds": rounds,
           "round_order": order,
           "turn_order": meta.get("turn_order", "fixed"),
           "rows": out}
    names = [n for n in HOPPER_NAMES if any(n in w["tflops"] for w in out)]
    ours = [n for n in names if not n.startswith("sdpa-")]
    md = _header("Every GPU backend beside FlashAttention-2 and cuDNN, TFLOP/s", ctx,
                 f"git commit {meta.get('git_commit')}{' (with local changes)' if meta.get('git_dirty') else ''}. "
                 + (f"Each time is the median of {rounds} rounds, every backend of a row timed once a round, in "
                    f"turn, {how}. " if rounds > 1 else "") + "x FA2 / x cuDNN: the backend's TFLOP/s over theirs.")
    md += ["| mode | dtype | causal | B | H | D | N | " + " | ".join(names) + " | "
           + " | ".join(f"{n} x FA2 | {n} x cuDNN" for n in ours) + " |",
           "|---|---|---|---|---|---|---|" + "---|" * (len(names) + 2 * len(ours))]
    for w in out:
        t = w["tflops"]
        ratios = []
        for n in ours:
            for base in ("sdpa-flash", "sdpa-cudnn"):
                ratios.append(_f(t[n] / t[base] if t.get(n) and t.get(base) else None, ".2f"))
        md.append(f"| {w['mode']} | {w['dtype']} | {'yes' if w['causal'] else 'no'} | {w['B']} | {w['H']} | {w['D']} | "
                  f"{w['N']} | " + " | ".join(_f(t.get(n), ".1f") for n in names) + " | " + " | ".join(ratios) + " |")
    return {"hopper_summary.json": json.dumps(doc, indent=1, default=str), "hopper_summary.md": "\n".join(md) + "\n"}


HOST_LABELS = {"sdpa-flash": "sdpa FLASH_ATTENTION (FA2)", "cuda-mma": "flash_attn_cuda kernel=mma",
               "cuda-wgmma": "flash_attn_cuda kernel=wgmma", "cuda-wgmma-ws": "flash_attn_cuda kernel=wgmma-ws",
               "triton": "flash_attn_triton"}


def host_summary(rows, ctx):
    """launch_overhead.txt: host microseconds per call, one line per backend and mode (the forward lines
    first, named as the docs read them; then the causal backward's)."""
    lines = [f"{'call':<46} host us/call"]
    for r in sorted(rows, key=lambda r: r["mode"] != "fwd"):
        label = HOST_LABELS.get(r["backend"], r["backend"]) + ("" if r["mode"] == "fwd" else " backward (causal)")
        value = f"{r['time_ms'] * 1e3:8.1f}" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
        lines.append(f"{label:<46} {value}")
    return {"launch_overhead.txt": "\n".join(lines) + "\n"}


# ------------------------------------------------------------------------------------ the presets
_FWD = (("fwd", False), ("fwd", True))
PRESETS = {p.name: p for p in (
    Preset(name="cuda-ladder",
           description="forward of the CUDA rungs (naive, tiled fp32; mma, wgmma fp16) beside SDPA's FlashAttention-2",
           backends=("sdpa-flash", "cuda-wgmma", "cuda-mma", "cuda-tiled", "cuda-naive"), shapes=SHAPES,
           n="2048..16384", combos=_FWD, reference="sdpa-flash",
           dtypes={"sdpa-flash": ("float16",), "cuda-wgmma": ("float16",), "cuda-mma": ("float16",),
                   "cuda-tiled": ("float32",), "cuda-naive": ("float32",)},
           max_n={"cuda-tiled": 4096, "cuda-naive": 4096}, config_sweep=("mma", "wgmma"), summary=ladder_summary),
    Preset(name="cuda-backward",
           description="the backward alone of the CUDA rungs (mma fp16, tiled fp32) beside FlashAttention-2's",
           backends=("sdpa-flash", "cuda-mma", "cuda-tiled"), shapes=SHAPES, n="2048..16384",
           combos=(("bwd", False), ("bwd", True)), reference="sdpa-flash",
           dtypes={"sdpa-flash": ("float16",), "cuda-mma": ("float16",), "cuda-tiled": ("float32",)},
           max_n={"cuda-tiled": 2048}, config_sweep=("mma-backward",), summary=backward_summary),
    Preset(name="triton-vs-fa2",
           description="Triton forward (causal and not) and causal backward beside FlashAttention-2 and cuDNN, fp16",
           backends=("sdpa-flash", "triton", "sdpa-cudnn"), shapes=SHAPES, n="1024..16384",
           combos=(("fwd", False), ("fwd", True), ("bwd", True)), reference="sdpa-flash",
           dtypes={"sdpa-flash": ("float16",), "triton": ("float16",), "sdpa-cudnn": ("float16",)},
           summary=triton_summary),
    Preset(name="launch-overhead",
           description="host time per call (checks, allocation, launch) of the forward and the causal backward "
                       "at B=H=1 N=64 D=64, where the GPU time does not matter",
           backends=("sdpa-flash", "cuda-mma", "cuda-wgmma", "cuda-wgmma-ws", "triton"), shapes=((1, 1, 64),),
           n="64",
           combos=(("fwd", False), ("bwd", True)), timer="host",
           dtypes={"sdpa-flash": ("float16",), "cuda-mma": ("float16",), "cuda-wgmma": ("float16",),
                   "cuda-wgmma-ws": ("float16",), "triton": ("float16",)},
           # 3 rounds, each a pass over the whole run: a host's speed drifts by up to 2x between runs (an H200's,
           # docs/results/cuda/launch_overhead_triton_plans/), so each line and FA2's are medians over the same stretches
           rounds=3, summary=host_summary),
    Preset(name="hopper",
           description="every GPU backend (Triton, cuda-wgmma-ws, cuda-wgmma, cuda-mma) beside FA2 and cuDNN, fp16 and "
                       "bf16, forward and backward, causal and not; hopper_summary.json",
           backends=HOPPER_NAMES, shapes=SHAPES, n="1024,4096,16384",
           combos=(("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True)), reference="sdpa-flash",
           dtypes={n: ("float16", "bfloat16") for n in HOPPER_NAMES}, rounds=3, summary=hopper_summary),
)}


# ------------------------------------------------------------------------------------ tile-config sweep
# candidates per kernel and D: mma (Bc, warps, m16 tiles per warp; Br = 16 x tiles x warps), wgmma (Bc,
# warpgroups; Br = 64 x warpgroups), mma-backward (warps per block, rows of the looped tile; any D), wgmma-ws
# (Bc, consumer warpgroups, K/V stages; Br = 64 x consumer warpgroups; tools/cuda_forward_kernels.py times them
# beside the other grids; 176 keys is FlashAttention-3's tile at D = 128 without a mask)
CONFIG_CANDIDATES = {
    "mma": {64: [(64, 4, 2), (64, 8, 2), (128, 8, 1), (64, 8, 1), (32, 8, 2), (128, 4, 2)],
            128: [(64, 8, 1), (32, 8, 2), (32, 4, 2), (64, 4, 2), (128, 8, 1), (64, 4, 1), (32, 4, 1)]},
    "wgmma": {64: [(128, 2), (64, 2), (128, 3)], 128: [(128, 2), (64, 2), (64, 3)]},
    "mma-backward": {None: [(4, 64), (8, 64), (4, 32), (8, 32)]},
    "wgmma-ws": {64: [(128, 2, 2), (128, 2, 3), (128, 3, 2), (64, 2, 4), (192, 2, 2)],
                 128: [(128, 2, 2), (64, 2, 3), (64, 2, 4), (128, 2, 3), (160, 2, 2), (176, 2, 2), (192, 2, 2)]},
}
CONFIG_FIELDS = {"mma": ("Bc", "warps", "tiles_per_warp"), "wgmma": ("Bc", "warpgroups"),
                 "mma-backward": ("warps", "tile_rows"), "wgmma-ws": ("Bc", "consumer_warpgroups", "stages")}
# where the library keeps its own configs (read, never written): module attribute names, first found wins
LIBRARY_TABLES = {"mma": ("MMA_CONFIGS",), "wgmma": ("WGMMA_CONFIGS",), "mma-backward": ("MMA_BACKWARD_CONFIGS",),
                  "wgmma-ws": ("WGMMA_WS_CONFIGS",)}


def library_configs(kernels):
    """The CUDA library's own tile configs for ``kernels`` (copies; read from launch_specs, else the
    package), for the record. Nothing is written back."""
    import importlib

    found = {}
    for kernel in kernels:
        for module in ("flash_attention_cuda.launch_specs", "flash_attention_cuda.launcher", "flash_attention_cuda"):
            try:
                mod = importlib.import_module(module)
            except Exception:  # noqa: BLE001
                continue
            attr = next((a for a in LIBRARY_TABLES[kernel] if hasattr(mod, a)), None)
            if attr is not None:
                table = getattr(mod, attr)
                found[kernel] = ({str(k): list(v) for k, v in table.items()} if isinstance(table, dict) else list(table))
                break
    return found


def _sweep_call(kernel, x, causal, config):
    """A zero-argument callable: one call of ``kernel`` with tile config ``config`` passed in
    (``flash_attention_cuda.launcher.forward_with_config``; the backward: ``launch_specs.run_backward`` on
    fresh contiguous inputs, with the forward's lse)."""
    import importlib

    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    launcher = importlib.import_module("flash_attention_cuda.launcher")
    if kernel in ("mma", "wgmma", "wgmma-ws"):  # the forwards
        return lambda: launcher.forward_with_config(q, k, v, kernel=kernel, config=config, causal=causal)
    from flash_attention_py.masks import window_for
    from flash_attention_py.validation import resolve_softmax_scale

    specs = importlib.import_module("flash_attention_cuda.launch_specs")
    o, lse = launcher.flash_attn_cuda(q, k, v, causal=causal, kernel="mma", return_lse=True)
    scale = resolve_softmax_scale(None, q.shape[-1], fn="config_sweep")
    return lambda: specs.run_backward(q, k, v, o, lse, do, window_for(causal), scale, "mma", config)


def config_sweep(kernels, shapes, device, log=print):
    """Time every candidate config of ``kernels`` per D at N = SWEEP_N (the full and the causal call, summed),
    through measure.time_call. Returns {'results': [...], 'best': {kernel: {D: config}}, 'library': ...}.
    A candidate that fails (e.g. too much shared memory) is recorded with its reason."""
    from flash_attention_py.inputs import make_inputs

    results, best = [], {}
    for kernel in kernels:
        for D, candidates in CONFIG_CANDIDATES[kernel].items():
            if D is not None and D not in {s[2] for s in shapes}:
                continue
            ds = sorted({s[2] for s in shapes}) if D is None else [D]
            data = {d: None for d in ds}
            scores = {}
            for config in candidates:
                entry = dict(kernel=kernel, D=D, config=list(config), **dict(zip(CONFIG_FIELDS[kernel], config)),
                             ms=None, reason="")
                try:
                    total = 0.0
                    for d in ds:
                        if data[d] is None:
                            B, H = next((s[0], s[1]) for s in shapes if s[2] == d)
                            data[d] = make_inputs(B, H, SWEEP_N, SWEEP_N, d, dtype="float16", device=device)
                        for causal in (False, True):
                            total += measure.time_call(_sweep_call(kernel, data[d], causal, config), device=device)[0]
                    entry["ms"] = total
                    scores[tuple(config)] = total
                    log(f"sweep {kernel} D={D if D is not None else '/'.join(map(str, ds))} config={config}: "
                        f"{total:.3f} ms (full + causal, N={SWEEP_N})")
                except Exception as exc:  # noqa: BLE001 - a config that does not fit is a row, not the end
                    entry["reason"] = short_reason(exc)
                    log(f"sweep {kernel} D={D} config={config}: failed: {entry['reason']}")
                results.append(entry)
            if scores:
                best.setdefault(kernel, {})[str(D) if D is not None else "all"] = list(min(scores, key=scores.get))
                log(f"sweep {kernel} D={D if D is not None else 'all'}: best {list(min(scores, key=scores.get))}")
            data.clear()
    return {"n": SWEEP_N, "results": results, "best": best, "library": library_configs(kernels)}


def write_summary(out, preset, rows, ctx):
    """Write the preset's side-by-side files into ``out``; returns their paths."""
    if preset.summary is None:
        return []
    paths = []
    for name, text in preset.summary(rows, dict(ctx, preset=preset)).items():
        path = os.path.join(out, name)
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    return paths
