#!/usr/bin/env python
"""Run each forward back to back for seconds, and read the GPU's SM clock and power over the same stretch.

    PYTHONPATH=. python tools/sustained_power.py --out results/sustained_power      # on a CUDA GPU

A benchmark's timing of one case lasts a fraction of a second (``triton.testing.do_bench``: 100 ms of calls). A
long run of large attention calls holds the GPU at its power limit instead, and the GPU lowers its SM clock to
stay under it: then TFLOP/s = clock x work per clock, and a kernel that spends less energy per FLOP keeps a higher
clock. Here each backend of a case runs for --seconds without a pause, once a round, in turn (--rounds), while
``nvidia-smi`` samples the SM clock, the board's power draw and the temperature every 100 ms; each phase reports its
TFLOP/s (CUDA events over the phase), the mean clock and power of its samples (the first 0.5 s left out), and its
TFLOP/s per GHz of SM clock (the work a kernel does per clock, whatever the clock). Writes
``sustained_power.json`` and ``sustained_power.md`` into --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

BACKENDS = ("sdpa-cudnn", "sdpa-flash", "cuda-wgmma-ws")  # the default --backends
CHOICES = BACKENDS + ("cuda-wgmma", "cuda-mma", "triton")  # every one --backends takes
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"
SETTLE_S = 0.5  # samples this soon after a phase starts are left out (the clock is still moving)


def parse_samples(text: str) -> list:
    """``nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits`` lines -> [(epoch s, MHz, W, C)];
    lines that do not parse (a header, a cut last line, '[N/A]') are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def phase_stats(samples: list, t0: float, t1: float, settle: float = SETTLE_S) -> dict:
    """Mean SM clock (MHz) and power (W), and the highest temperature (C), of the samples in [t0 + settle, t1]."""
    s = [x for x in samples if t0 + settle <= x[0] <= t1]
    if not s:
        return {"samples": 0, "sm_mhz": None, "power_w": None, "temp_c": None}
    return {"samples": len(s), "sm_mhz": statistics.fmean(x[1] for x in s),
            "power_w": statistics.fmean(x[2] for x in s), "temp_c": max(x[3] for x in s)}


def table(rows: list, header: str) -> str:
    """sustained_power.md: one line per (case, backend), the median of its rounds."""
    md = [header, "", "| dtype | B | H | N | D | causal | backend | TFLOP/s | SM MHz | power W | TFLOP/s per GHz |",
          "|---|---|---|---|---|---|---|---:|---:|---:|---:|"]
    keys = []
    for r in rows:
        key = (r["dtype"], r["B"], r["H"], r["N"], r["D"], r["causal"], r["backend"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        rs = [r for r in rows if (r["dtype"], r["B"], r["H"], r["N"], r["D"], r["causal"], r["backend"]) == key]
        tf = statistics.median(r["tflops"] for r in rs)
        mhz = [r["sm_mhz"] for r in rs if r["sm_mhz"]]
        pw = [r["power_w"] for r in rs if r["power_w"]]
        mhz_s = f"{statistics.median(mhz):.0f}" if mhz else "-"
        pw_s = f"{statistics.median(pw):.0f}" if pw else "-"
        per = f"{tf / (statistics.median(mhz) / 1e3):.0f}" if mhz else "-"
        d, B, H, N, D, c, b = key
        md.append(f"| {d} | {B} | {H} | {N} | {D} | {'yes' if c else 'no'} | {b} | {tf:.0f} | {mhz_s} | {pw_s} | {per} |")
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="4,16,16384,128", help="B,H,N,D")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="no")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"some of {', '.join(CHOICES)}")
    ap.add_argument("--seconds", type=float, default=3.0, help="each phase: this long without a pause")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        B, H, N, D = (int(x) for x in args.shape.split(","))
    except ValueError:
        ap.error(f"--shape must be B,H,N,D (four integers), got {args.shape!r}")
    backends = args.backends.split(",")
    unknown = [b for b in backends if b not in CHOICES]
    if unknown:
        ap.error(f"--backends: unknown {unknown}; expected some of {list(CHOICES)}")
    bad = [d for d in args.dtypes.split(",") if d not in ("float16", "bfloat16")]
    if bad:
        ap.error(f"--dtypes: unknown {bad}; expected float16 and/or bfloat16")
    if args.seconds < 1.0 or args.rounds < 1:
        ap.error(f"--seconds must be at least 1 and --rounds at least 1, got {args.seconds} and {args.rounds}")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from tqdm import tqdm

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from flash_attention_cuda import flash_attn_cuda
    from flash_attention_py.common import attention_flops

    pins = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    cases = [(dtype, causal) for dtype in args.dtypes.split(",") for causal in causals]
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        bar = tqdm(total=len(cases) * args.rounds * len(backends), desc="phases")
        for dtype, causal in cases:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=getattr(torch, dtype), generator=g)
                       for _ in range(3))
            flops = attention_flops(B, H, N, N, D, causal=causal)

            def call(name):
                if name.startswith("cuda-"):
                    return lambda: flash_attn_cuda(q, k, v, causal=causal, kernel=name[len("cuda-"):])
                if name == "triton":
                    from flash_attention_triton import flash_attn_triton

                    return lambda: flash_attn_triton(q, k, v, causal=causal)

                def sdpa():
                    with sdpa_kernel(pins[name]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return sdpa
            for rnd in range(args.rounds):
                for name in backends:
                    fn = call(name)
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.time()
                    start.record()
                    calls = 0
                    while time.time() - t0 < args.seconds:
                        for _ in range(4):
                            fn()
                        calls += 4
                        torch.cuda.synchronize()  # the host checks the clock between short bursts
                    end.record()
                    torch.cuda.synchronize()
                    t1 = time.time()
                    ms = start.elapsed_time(end) / calls
                    rows.append(dict(dtype=dtype, B=B, H=H, N=N, D=D, causal=causal, backend=name, round=rnd,
                                     calls=calls, ms=ms, tflops=flops / ms / 1e9, t0=t0, t1=t1))
                    bar.set_postfix_str(f"{dtype} {name}: {rows[-1]['tflops']:.0f} TFLOP/s")
                    bar.update()
                    time.sleep(1.0)  # a pause between phases, as between cases
        bar.close()
    finally:
        smi.terminate()
    samples = parse_samples(smi.communicate()[0])
    for r in rows:
        r.update(phase_stats(samples, r["t0"], r["t1"]))
    gpu = torch.cuda.get_device_name()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    os.makedirs(args.out, exist_ok=True)
    doc = {"gpu": gpu, "commit": commit, "torch": torch.__version__, "seconds": args.seconds, "rounds": args.rounds,
           "command": " ".join(["python", "tools/sustained_power.py"] + (argv if argv is not None else sys.argv[1:])),
           "rows": rows}
    with open(os.path.join(args.out, "sustained_power.json"), "w") as f:
        json.dump(doc, f, indent=1)
    header = (f"# Sustained forwards ({gpu}, commit {commit})\n\n`{doc['command']}`: each backend {args.seconds:g} s "
              f"without a pause, {args.rounds} rounds in turn; the median of the rounds. SM clock and power: the mean "
              f"of nvidia-smi's 100 ms samples over each phase (the first {SETTLE_S} s left out).")
    text = table(rows, header)
    with open(os.path.join(args.out, "sustained_power.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
