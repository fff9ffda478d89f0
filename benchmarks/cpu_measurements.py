"""The CPU measurements the docs quote (memory, HBM traffic, accuracy, a tail bug), recorded in one JSON file.

    python benchmarks/cpu_measurements.py --out docs/results/cpu      # a few seconds on a laptop

Writes ``measurements.json``; ``python tools/docs_tables.py`` builds the docs' tables and checks their
quoted figures from it. The measurements are those of the lab guide (docs/lab_guide.md, M1, M2, M7, M8):

* memory: peak of Python-tracked allocations (tracemalloc) of a NumPy standard attention, which
  materialises S and P, against ``flash_attn_numpy`` (B = H = 1, D = 64, float32, N = 1024, 2048, 4096);
* hbm: the elements ``flash_attn_numpy(..., hbm_stats={})`` counts for the worked example of
  docs/algorithm.md section 6 (N = 4096, d = 64, the v1 order with Br = 64, Bc = 200 and the v2 order with
  Br = 200, Bc = 64);
* accuracy: max-abs and relative-norm error against the float64 reference of standard attention in the
  same dtype and of the tiled backends (B = 2, H = 4, N = 512, D = 64, causal, seed 1);
* tail_bug: the float64 reference with its last query row zeroed (B = 1, H = 4, N = 1000, D = 64, seed 3),
  and the harness's fp16 bound for comparison (2 x standard attention's fp16 error + 2e-3).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tracemalloc
from datetime import datetime, timezone

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.report import git_state  # noqa: E402
from flash_attention_py import (attention_naive, attention_reference, flash_attn_numpy, flash_attn_torch,  # noqa: E402
                                make_inputs)

FP16_FLOOR = 2e-3  # the harness's floor on top of 2x the naive error (tests/harness.py)


def standard_numpy(q, k, v):
    """Standard attention in NumPy: S and P are materialised, (B, H, N, N) each."""
    S = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    return P @ v


def _peak_mib(fn, *args):
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def memory():
    rows = []
    for N in (1024, 2048, 4096):
        x = make_inputs(1, 1, N, N, 64, kind="numpy", dtype="float32")
        rows.append({"N": N, "standard_mib": _peak_mib(standard_numpy, x["q"], x["k"], x["v"]),
                     "flash_numpy_mib": _peak_mib(lambda q, k, v: flash_attn_numpy(q, k, v, block_m=64, block_n=64),
                                                  x["q"], x["k"], x["v"])})
    return rows


def hbm():
    N, D = 4096, 64
    x = make_inputs(1, 1, N, N, D, kind="numpy", dtype="float32")
    rows = []
    for order, Br, Bc in (("v1", 64, 200), ("v2", 200, 64)):
        stats = {}
        flash_attn_numpy(x["q"], x["k"], x["v"], block_m=Br, block_n=Bc, loop_order=order, hbm_stats=stats)
        rows.append({"N": N, "D": D, "loop_order": order, "Br": Br, "Bc": Bc, "elements": int(sum(stats.values())),
                     "by_array": {k: int(v) for k, v in stats.items()}})
    return {"rows": rows, "standard_elements": 4 * N * N + 4 * N * D}


def _err(o, ref):
    o = o.detach().double().numpy() if hasattr(o, "detach") else np.asarray(o, np.float64)
    return float(np.abs(o - ref).max()), float(np.linalg.norm(o - ref) / np.linalg.norm(ref))


def accuracy():
    rows = []
    for dtype in ("float16", "bfloat16", "float32"):
        x = make_inputs(2, 4, 512, 512, 64, dtype=dtype, kind="torch", seed=1)
        ref = attention_reference(x["q"], x["k"], x["v"], causal=True).numpy()
        outs = {"attention_naive": attention_naive(x["q"], x["k"], x["v"], causal=True),
                "flash_attn_torch": flash_attn_torch(x["q"], x["k"], x["v"], causal=True)}
        if dtype != "bfloat16":  # NumPy has no bfloat16
            xn = {n: t.numpy() for n, t in x.items()}
            outs["flash_attn_numpy"] = flash_attn_numpy(xn["q"], xn["k"], xn["v"], causal=True)
        for name, o in outs.items():
            max_abs, rel = _err(o, ref)
            rows.append({"dtype": dtype, "function": name, "max_abs": max_abs, "rel_norm": rel})
    return {"B": 2, "H": 4, "N": 512, "D": 64, "causal": True, "seed": 1, "rows": rows}


def tail_bug(naive_fp16_max_abs):
    x = make_inputs(1, 4, 1000, 1000, 64, kind="numpy", dtype="float64", seed=3)
    ref = attention_reference(x["q"], x["k"], x["v"])
    o = ref.copy()
    o[:, :, -1] = 0  # the last query row is never written
    bound = 2 * naive_fp16_max_abs + FP16_FLOOR
    max_abs = float(np.abs(o - ref).max())
    return {"B": 1, "H": 4, "N": 1000, "D": 64, "seed": 3, "max_abs": max_abs,
            "rel_norm": float(np.linalg.norm(o - ref) / np.linalg.norm(ref)), "fp16_bound": bound,
            "times_bound": max_abs / bound}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/cpu_measurements.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cpu", help="output folder (default: results/cpu)")
    args = p.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out: {args.out!r} is an existing file, not a folder")
    import torch

    acc = accuracy()
    naive16 = next(r["max_abs"] for r in acc["rows"] if r["dtype"] == "float16" and r["function"] == "attention_naive")
    doc = {
        "meta": {"command": "python benchmarks/cpu_measurements.py --out " + args.out,
                 "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": sys.version.split()[0],
                 "numpy": np.__version__, "torch": torch.__version__, "platform": platform.platform(), **git_state()},
        "memory": memory(), "hbm": hbm(), "accuracy": acc, "tail_bug": tail_bug(naive16),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "measurements.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v for k, v in doc.items() if k != "meta"}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
