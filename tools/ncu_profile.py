#!/usr/bin/env python
"""Nsight Compute profiles of every rung, with the numbers that say what limits each one.

    python tools/ncu_profile.py --out docs/results/cuda/ncu            # every profile (about 5 minutes on an H100)
    python tools/ncu_profile.py --out results/ncu --only cuda-mma-fwd-d128

For each profile (a backend, forward or backward, one shape) it runs this file again with ``--inner LABEL``
under ``ncu --profile-from-start off --clock-control none`` (the GPU's clocks left as they run, as in
the benchmark's timings): the inner run warms up (compiles, autotunes), then opens the
profiler around exactly one call, so only that call's kernels are measured. From each kernel it keeps:

* time (``gpu__time_duration``), and the FLOP rate of the whole call (4·B·H·Nq·Nk·D, ×2.5 backward);
* tensor-pipe utilisation: the busiest tensor pipe's share of its peak (``sm__pipe_tensor_op_*`` or
  ``sm__inst_executed_pipe_tensor_op_*``; HMMA is ``mma.sync``, GMMA is Hopper's ``wgmma``), and the FMA pipe's,
  for the fp32 rungs that use no tensor cores;
* DRAM throughput and SM throughput as a share of peak (Speed of Light);
* achieved occupancy (active warps over the SM's maximum), registers per thread, local-memory (spill)
  traffic, and shared-memory bank conflicts (loads and stores);
* the scalar pipes (ALU, FMA-heavy, XU) and the issue slots (``sm__inst_issued``: one warp instruction per cycle
  per SM sub-partition at most), which say whether scalar work between the products (dropout's Philox) is what
  limits a kernel.

It writes ``profiles.json`` (every kernel, every metric kept) and ``profiles.md`` (one table, and for each
profile the limiter read from those numbers) into ``--out``. Needs a CUDA GPU and ``ncu`` on the PATH.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# label -> (backend, mode, dtype, B, H, N, D, causal[, dropout_p[, window[, kv_heads]]]) (read through ``spec``);
# backend "flex": FlexAttention with the window's block mask (benchmarks.targets.FlexTarget), the window variant's
# PyTorch alternative; kv_heads < H: grouped-query attention (SDPA with enable_gqa=True)
PROFILES = {
    "cuda-naive-fwd-d64": ("cuda-naive", "fwd", "float32", 1, 8, 1024, 64, False),
    "cuda-tiled-fwd-d64": ("cuda-tiled", "fwd", "float32", 1, 8, 1024, 64, False),
    "cuda-mma-fwd-d64": ("cuda-mma", "fwd", "float16", 4, 16, 4096, 64, False),
    "cuda-mma-fwd-d128": ("cuda-mma", "fwd", "float16", 4, 16, 4096, 128, False),
    "cuda-wgmma-fwd-d64": ("cuda-wgmma", "fwd", "float16", 4, 16, 4096, 64, False),
    "cuda-wgmma-fwd-d128": ("cuda-wgmma", "fwd", "float16", 4, 16, 4096, 128, False),
    "cuda-wgmma-ws-fwd-d64": ("cuda-wgmma-ws", "fwd", "float16", 4, 16, 4096, 64, False),
    "cuda-wgmma-ws-fwd-d128": ("cuda-wgmma-ws", "fwd", "float16", 4, 16, 4096, 128, False),
    "cuda-mma-bwd-d128": ("cuda-mma", "bwd", "float16", 4, 16, 4096, 128, False),
    # cuda-wgmma-ws's backward: the one-kernel wgmma backward (capabilities.HOPPER_BACKWARD)
    "cuda-wgmma-ws-bwd-d64": ("cuda-wgmma-ws", "bwd", "float16", 4, 16, 4096, 64, False),
    "cuda-wgmma-ws-bwd-d128": ("cuda-wgmma-ws", "bwd", "float16", 4, 16, 4096, 128, False),
    "sdpa-cudnn-bwd-d128": ("sdpa-cudnn", "bwd", "float16", 4, 16, 4096, 128, False),
    "triton-fwd-d128": ("triton", "fwd", "float16", 4, 16, 4096, 128, False),
    "triton-bwd-d128": ("triton", "bwd", "float16", 4, 16, 4096, 128, False),
    "sdpa-flash-fwd-d128": ("sdpa-flash", "fwd", "float16", 4, 16, 4096, 128, False),
    "sdpa-cudnn-fwd-d128": ("sdpa-cudnn", "fwd", "float16", 4, 16, 4096, 128, False),
    # dropout (p = 0.1): the keep mask drawn per score (tl.rand's Philox, bit for bit), beside the same call without
    # it and SDPA's FA2 with and without its own dropout
    "cuda-wgmma-ws-fwd-d64-dropout": ("cuda-wgmma-ws", "fwd", "float16", 4, 16, 4096, 64, False, 0.1),
    "triton-fwd-d64-dropout": ("triton", "fwd", "float16", 4, 16, 4096, 64, False, 0.1),
    "sdpa-flash-fwd-d64": ("sdpa-flash", "fwd", "float16", 4, 16, 4096, 64, False),
    "sdpa-flash-fwd-d64-dropout": ("sdpa-flash", "fwd", "float16", 4, 16, 4096, 64, False, 0.1),
    "cuda-wgmma-ws-bwd-d64-dropout": ("cuda-wgmma-ws", "bwd", "float16", 4, 16, 4096, 64, False, 0.1),
    "triton-bwd-d64-dropout": ("triton", "bwd", "float16", 4, 16, 4096, 64, False, 0.1),
    # a causal sliding window of 512 keys (window_size (512, 0)), the variants record's shape: Triton's two backward
    # kernels beside FlexAttention's one
    "triton-bwd-d128-window": ("triton", "bwd", "float16", 4, 16, 4096, 128, True, 0.0, (512, 0)),
    "flex-bwd-d128-window": ("flex", "bwd", "float16", 4, 16, 4096, 128, True, 0.0, (512, 0)),
    # the mma rung against FlashAttention-2, whose warp layout its one-kernel backward copies: the backward at
    # D = 64 and 128, and both at N = 1024, where a block loops over few tiles
    "cuda-mma-bwd-d64": ("cuda-mma", "bwd", "float16", 4, 16, 4096, 64, False),
    "sdpa-flash-bwd-d64": ("sdpa-flash", "bwd", "float16", 4, 16, 4096, 64, False),
    "sdpa-flash-bwd-d128": ("sdpa-flash", "bwd", "float16", 4, 16, 4096, 128, False),
    "cuda-mma-fwd-d128-n1024": ("cuda-mma", "fwd", "float16", 4, 16, 1024, 128, False),
    "sdpa-flash-fwd-d128-n1024": ("sdpa-flash", "fwd", "float16", 4, 16, 1024, 128, False),
    "cuda-mma-bwd-d64-n1024": ("cuda-mma", "bwd", "float16", 4, 32, 1024, 64, False),
    "sdpa-flash-bwd-d64-n1024": ("sdpa-flash", "bwd", "float16", 4, 32, 1024, 64, False),
    # the causal backward beside cuDNN's: B4 H16 N4096 as the hopper preset, and grouped-query attention (Hq = 32,
    # Hk = 8) at N = 16384 as the variants benchmark, where cuda-wgmma-ws's causal backward trails cuDNN's most
    "cuda-wgmma-ws-bwd-d128-causal": ("cuda-wgmma-ws", "bwd", "float16", 4, 16, 4096, 128, True),
    "sdpa-cudnn-bwd-d128-causal": ("sdpa-cudnn", "bwd", "float16", 4, 16, 4096, 128, True),
    "cuda-wgmma-ws-bwd-d128-gqa-causal": ("cuda-wgmma-ws", "bwd", "float16", 1, 32, 16384, 128, True, 0.0, None, 8),
    "sdpa-cudnn-bwd-d128-gqa-causal": ("sdpa-cudnn", "bwd", "float16", 1, 32, 16384, 128, True, 0.0, None, 8),
}


def spec(label) -> dict:
    """PROFILES[label] as a dict, the optional fields filled in: dropout_p 0.0, window None, kv_heads H."""
    backend, mode, dtype, B, H, N, D, causal, *rest = PROFILES[label]
    rest = list(rest) + [0.0, None, None][len(rest):]
    return dict(backend=backend, mode=mode, dtype=dtype, B=B, H=H, N=N, D=D, causal=causal, dropout_p=rest[0],
                window=rest[1], kv_heads=rest[2] if rest[2] is not None else H)

SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables"]
# raw metrics asked for besides the sections (kept only where this ncu knows them)
EXTRA = [
    "sm__pipe_tensor_op_hmma_cycles_active", "sm__pipe_tensor_op_gmma_cycles_active",
    "sm__inst_executed_pipe_tensor_op_hmma", "sm__inst_executed_pipe_tensor_op_gmma",
    "sm__pipe_fma_cycles_active",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld", "l1tex__t_bytes_pipe_lsu_mem_local_op_st",
    # the scalar pipes: ALU (integer and logic ops but multiplies: LOP3, shifts, compares), FMA-heavy (fp32 FMAs
    # and the integer multiplies, IMAD), XU (transcendentals and conversions: exp2, int -> float)
    "sm__pipe_alu_cycles_active", "sm__pipe_fmaheavy_cycles_active", "sm__pipe_xu_cycles_active",
    # the issue slots: one warp instruction per cycle per SM sub-partition at most, whatever pipe it goes to
    "sm__inst_issued",
]


# ------------------------------------------------------------------------------------------ inner run
def _call(label):
    """(fn, flops): fn() runs the call to profile once; everything it needs is built here."""
    import torch

    sys.path.insert(0, ROOT)
    from flash_attention_py import make_inputs
    from flash_attention_py.common import attention_flops

    sp = spec(label)
    backend, mode, dtype, B, H, N, D, causal = (sp[k] for k in ("backend", "mode", "dtype", "B", "H", "N", "D", "causal"))
    p, window, Hk = sp["dropout_p"], sp["window"], sp["kv_heads"]
    drop = dict(dropout_p=p, dropout_seed=1234) if p else {}
    if window is not None:
        drop["window_size"] = window
    x = make_inputs(B, H, N, N, D, dtype=dtype, kind="torch", device="cuda", with_grad=(mode == "bwd"), Hk=Hk)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    flops = attention_flops(B, H, N, N, D, causal=causal, mode=mode, window_size=window)
    if backend == "flex":  # the benchmark's own call: torch.compile'd flex_attention, the backward of a kept graph
        from benchmarks.targets import FlexTarget

        target = FlexTarget()
        with target.context():
            fn = target.prepare(x, causal, mode, window_size=window)

        def run():
            with target.context():
                fn()
        return run, flops
    if backend.startswith("cuda-"):
        from flash_attention_cuda import flash_attn_cuda

        def forward():
            return flash_attn_cuda(q, k, v, causal=causal, kernel=backend[len("cuda-"):], **drop)
    elif backend == "triton":
        from flash_attention_triton import flash_attn_triton

        def forward():
            return flash_attn_triton(q, k, v, causal=causal, **drop)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        pin = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

        def forward():
            with sdpa_kernel(pin):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p,
                                                                        enable_gqa=Hk != H)

    if mode == "fwd":
        def fn():
            with torch.no_grad():
                forward()
        return fn, flops
    o = forward()

    def fn():
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return fn, flops


def inner(label) -> int:
    import torch

    fn, flops = _call(label)
    for _ in range(3):  # compile, autotune, warm the caches
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"inner {label}: one call profiled ({time.perf_counter() - t0:.3f} s under the profiler), flops={flops:.6g}")
    return 0


# ------------------------------------------------------------------------------------------ outer run
def _known_metrics(ncu) -> set:
    res = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True)
    return {line.split()[0] for line in res.stdout.splitlines() if line.strip() and "__" in line.split()[0]}


def _num(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def _parse_raw(csv_text) -> list:
    """ncu --page raw --csv: a header row, a units row, then one row a kernel."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header, units, data = rows[start], rows[start + 1], rows[start + 2:]
    kernels = []
    for r in data:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        kernels.append({"kernel": d.get("Kernel Name", "?"), "metrics": d,
                        "units": dict(zip(header, units))})
    return kernels


def _pick(metrics, units, *names, want_unit=None):
    for name in names:
        if name in metrics and _num(metrics[name]) is not None:
            value = _num(metrics[name])
            unit = units.get(name, "")
            if want_unit == "ns":  # durations come in ns, us, ms or s
                value *= {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
                          "s": 1e9, "second": 1e9}.get(unit, 1)
            return value
    return None


def summarise(kernel) -> dict:
    m, u = kernel["metrics"], kernel["units"]
    tensor = [(k, _num(v)) for k, v in m.items()
              if k.startswith(("sm__pipe_tensor_op", "sm__inst_executed_pipe_tensor_op"))
              and k.endswith("pct_of_peak_sustained_active") and _num(v) is not None]
    best = max(tensor, key=lambda kv: kv[1]) if tensor else (None, None)
    return {
        "kernel": kernel["kernel"][:90],
        "time_us": (_pick(m, u, "gpu__time_duration.sum", want_unit="ns") or 0) / 1e3,
        "tensor_pipe_pct": best[1],
        "tensor_pipe_metric": best[0],
        "fma_pipe_pct": _pick(m, u, "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        "alu_pipe_pct": _pick(m, u, "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
        "fmaheavy_pipe_pct": _pick(m, u, "sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active"),
        "xu_pipe_pct": _pick(m, u, "sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active"),
        "issue_slots_pct": _pick(m, u, "sm__inst_issued.avg.pct_of_peak_sustained_active"),
        "sm_throughput_pct": _pick(m, u, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_throughput_pct": _pick(m, u, "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                     "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        # Speed of Light's "Memory Throughput": the busiest of DRAM, L2 and L1/shared memory
        "memory_throughput_pct": _pick(m, u, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        "l1_shared_throughput_pct": _pick(m, u, "l1tex__throughput.avg.pct_of_peak_sustained_active"),
        "l2_throughput_pct": _pick(m, u, "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        "achieved_occupancy_pct": _pick(m, u, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "registers_per_thread": _pick(m, u, "launch__registers_per_thread"),
        "local_bytes": sum(filter(None, [_pick(m, u, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"),
                                         _pick(m, u, "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")])),
        "smem_bank_conflicts": sum(filter(None, [
            _pick(m, u, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
            _pick(m, u, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")])),
    }


def limiter(k) -> str:
    """A one-line reading of the numbers, for a student."""
    tensor, dram, occ = k["tensor_pipe_pct"], k["dram_throughput_pct"] or 0, k["achieved_occupancy_pct"] or 0
    if k["local_bytes"] and k["local_bytes"] > 0:
        spill = "; spills to local memory"
    else:
        spill = ""
    if tensor is not None and tensor >= 60:
        return f"tensor cores busy ({tensor:.0f}% of peak): compute-bound, as a FlashAttention kernel should be{spill}"
    l1 = k.get("l1_shared_throughput_pct") or 0
    scalar = max(((k.get(key) or 0, name) for key, name in (("alu_pipe_pct", "ALU (integer and logic)"),
                                                            ("fmaheavy_pipe_pct", "FMA-heavy (fp32 and integer multiply)"),
                                                            ("xu_pipe_pct", "XU (exp2, conversions)"))))
    issue = k.get("issue_slots_pct") or 0
    if scalar[0] >= 60 and (tensor is None or tensor < 60):
        issued = f" (issue slots {issue:.0f}% busy)" if issue else ""
        return (f"the {scalar[1]} pipe {scalar[0]:.0f}% busy with the tensor pipe {tensor or 0:.0f}%: bound by scalar "
                f"work between the matrix products{issued}{spill}")
    if dram >= 60:
        return f"memory-bound: DRAM at {dram:.0f}% of peak{spill}"
    if l1 >= 60 and (tensor is None or tensor < 60):
        return (f"shared-memory/L1 traffic at {l1:.0f}% of peak with the tensor pipe {tensor or 0:.0f}% busy: bound by "
                f"moving tiles between shared memory and registers (DRAM {dram:.0f}%){spill}")
    if tensor is not None and tensor > 5:
        return (f"tensor pipe only {tensor:.0f}% busy with DRAM at {dram:.0f}%: latency-bound (softmax and "
                f"data movement between the matrix products, occupancy {occ:.0f}%){spill}")
    fma = k["fma_pipe_pct"]
    if fma is not None and fma >= 40:
        return f"fp32 FMA pipe {fma:.0f}% busy: bound by scalar arithmetic (no tensor cores){spill}"
    return f"latency-bound: neither DRAM ({dram:.0f}%) nor a math pipe is near its peak, occupancy {occ:.0f}%{spill}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="results/ncu", help="folder for profiles.json and profiles.md")
    ap.add_argument("--only", action="append", choices=sorted(PROFILES), help="profile only these (repeatable)")
    ap.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    ap.add_argument("--timeout-s", type=float, default=240, help="per profile")
    args = ap.parse_args()
    if args.inner:
        return inner(args.inner)
    ncu = shutil.which(args.ncu)
    if ncu is None:
        ap.error(f"ncu not found (--ncu {args.ncu!r}); Nsight Compute is needed")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        ap.error(f"--out {args.out!r}: {exc.strerror}")
    known = _known_metrics(ncu)
    extra = [f"{name}.{agg}" for name in EXTRA if name in known
             for agg in (("avg.pct_of_peak_sustained_active",) if "cycles_active" in name or name.startswith("sm__inst")
                         else ("sum",))]
    results = []
    env = {"gpu": _gpu_name(), "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1:],
           "commit": _commit()}
    for label in args.only or list(PROFILES):
        with tempfile.TemporaryDirectory() as tmp:
            rep = os.path.join(tmp, "p")
            cmd = [ncu, "--profile-from-start", "off", "--target-processes", "all", "--clock-control", "none",
                   "-f", "-o", rep]
            for s in SECTIONS:
                cmd += ["--section", s]
            if extra:
                cmd += ["--metrics", ",".join(extra)]
            cmd += [sys.executable, os.path.abspath(__file__), "--inner", label]
            t0 = time.perf_counter()
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                                     env={**os.environ, "PYTHONPATH": ROOT})
            except subprocess.TimeoutExpired:
                print(f"{label}: timed out after {args.timeout_s:.0f} s", flush=True)
                results.append({"label": label, "error": "timeout"})
                continue
            flops = next((float(line.split("flops=")[1]) for line in res.stdout.splitlines() if "flops=" in line), None)
            if res.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
                print(f"{label}: ncu failed (exit {res.returncode})\n{(res.stdout + res.stderr)[-1500:]}", flush=True)
                results.append({"label": label, "error": (res.stdout + res.stderr)[-800:]})
                continue
            raw = subprocess.run([ncu, "--import", rep + ".ncu-rep", "--page", "raw", "--csv"],
                                 capture_output=True, text=True).stdout
        parsed = _parse_raw(raw)
        kernels = [dict(summarise(k), raw={name: value for name, value in k["metrics"].items()
                                           if "__" in name and _num(value) is not None}) for k in parsed]
        total_us = sum(k["time_us"] for k in kernels)
        sp = spec(label)
        entry = {"label": label, **sp, "window": list(sp["window"]) if sp["window"] is not None else None,
                 "time_us": total_us,
                 "tflops": (flops / (total_us * 1e-6) / 1e12) if flops and total_us else None,
                 "kernels": kernels}
        main_kernel = max(kernels, key=lambda k: k["time_us"]) if kernels else None
        entry["limiter"] = limiter(main_kernel) if main_kernel else "no kernel captured"
        results.append(entry)
        print(f"{label}: {len(kernels)} kernels, {total_us:.0f} us, "
              f"{entry['tflops'] or 0:.0f} TFLOP/s, {entry['limiter']} ({time.perf_counter() - t0:.0f} s)", flush=True)
        _write(args.out, env, results)  # after every profile: a run cut short keeps what it measured
    _write(args.out, env, results)
    print(f"wrote {args.out}/profiles.json and profiles.md")
    return 0 if all("error" not in r for r in results) else 1


def _write(out, env, results):
    with open(os.path.join(out, "profiles.json"), "w") as f:
        json.dump({"env": env, "profiles": results}, f, indent=1)
    with open(os.path.join(out, "profiles.md"), "w") as f:
        f.write(render_markdown(env, results))


def _fmt(v, spec=".0f"):
    return "–" if v is None else format(v, spec)


def render_markdown(env, results) -> str:
    lines = [f"# Nsight Compute profiles ({env['gpu']}, commit {env['commit']})", "",
             "One call per row, after warm-up; the kernel columns are those of the call's longest kernel.", "",
             "| profile | TFLOP/s | time (µs) | longest kernel | tensor pipe % | FMA pipe % | ALU % | FMA-heavy % | XU % | DRAM % | L1/shared % | L2 % | occupancy % | regs | spill bytes | smem bank conflicts | issue slots % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | failed | | | | | | | | | | | | | | | |")
            continue
        k = max(r["kernels"], key=lambda k: k["time_us"])
        lines.append(f"| {r['label']} | {_fmt(r['tflops'])} | {_fmt(r['time_us'])} | `{k['kernel'][:40]}` | "
                     f"{_fmt(k['tensor_pipe_pct'])} | {_fmt(k['fma_pipe_pct'])} | {_fmt(k.get('alu_pipe_pct'))} | "
                     f"{_fmt(k.get('fmaheavy_pipe_pct'))} | {_fmt(k.get('xu_pipe_pct'))} | {_fmt(k['dram_throughput_pct'])} | "
                     f"{_fmt(k.get('l1_shared_throughput_pct'))} | {_fmt(k.get('l2_throughput_pct'))} | "
                     f"{_fmt(k['achieved_occupancy_pct'])} | {_fmt(k['registers_per_thread'])} | {_fmt(k['local_bytes'])} | "
                     f"{_fmt(k['smem_bank_conflicts'])} | {_fmt(k.get('issue_slots_pct'))} |")
    lines += ["", "## What limits each one", ""]
    lines += [f"* **{r['label']}**: {r.get('limiter', r.get('error', ''))}" for r in results]
    return "\n".join(lines) + "\n"


def _gpu_name():
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:
        return "?"


def _commit():
    try:
        sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
