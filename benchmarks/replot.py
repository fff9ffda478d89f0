"""Rebuild table.txt, report.md and the PNG plots of a benchmark run from its results.json.

    python -m benchmarks.replot bench_out/cuda-20261121-010203

Useful where the run happened on a machine without matplotlib, or after changing the plot code. A run
that was cut short (a time limit) has no results.json, only cases.jsonl (one row per finished case):
then results.csv and results.json are written from it too, with what can be known afterwards
(meta.partial = true; no environment, no matmul peak).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

os.environ.setdefault("MPLBACKEND", "Agg")

from . import report  # noqa: E402

_NUMERIC = ("time_ms", "time_lo_ms", "time_hi_ms", "spread_pct", "gflop", "tflops", "mem_peak_mb", "mem_extra_mb",
            "speedup_vs_naive", "max_abs_vs_ref")


def _from_partial(folder):
    with open(os.path.join(folder, report.PARTIAL)) as f:
        results = [json.loads(line) for line in f if line.strip()]
    if not results:
        raise SystemExit(f"{folder}: {report.PARTIAL} holds no finished case")
    first = results[0]
    order = {}
    for r in results:
        order.setdefault(r["backend"], len(order))
    results.sort(key=lambda r: (r["mode"], r["causal"], order[r["backend"]], r["dtype"], r["Nq"] * r["Nk"], r["Nq"]))
    config = {"device": first["device"], "B": first["B"], "H": first["H"], "D": first["D"],
              "shapes": list(dict.fromkeys((r["B"], r["H"], r["D"]) for r in results)),
              "sizes": sorted({(r["Nq"], r["Nk"]) for r in results})}
    meta = {"partial": True, "device": first["device"],
            "command": "(cut short; rebuilt by python -m benchmarks.replot from cases.jsonl)"}
    return {"meta": meta, "config": config, "backends": [], "matmul_peak_tflops": {}, "results": results}


def load(folder):
    path = os.path.join(folder, "results.json")
    if os.path.isfile(path):
        with open(path) as f:
            doc = json.load(f)
    else:
        doc = _from_partial(folder)
    rows = []
    for r in doc["results"]:
        r = dict(r)
        for k in _NUMERIC:  # JSON holds null where the CSV is empty: back to NaN
            if r.get(k) is None:
                r[k] = math.nan
        rows.append(r)
    return doc, rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.replot", description=__doc__.splitlines()[0])
    p.add_argument("folder", help="a benchmark output folder (holding results.json)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    has_json = os.path.isfile(os.path.join(args.folder, "results.json"))
    if not has_json and not os.path.isfile(os.path.join(args.folder, report.PARTIAL)):
        p.error(f"folder: neither results.json nor {report.PARTIAL} in {args.folder!r}")
    doc, rows = load(args.folder)
    cfg = doc["config"]
    if not has_json:
        from .cli import add_speedups

        add_speedups(rows)
        report.write_all(args.folder, rows, meta=doc["meta"], config=cfg, backends=[], matmul_peak={},
                         table=report.text_table(rows, cfg), plots=False)
    table = report.text_table(rows, cfg)
    paths = report.write_views(args.folder, rows, meta=doc["meta"], config=cfg, matmul_peak=doc.get("matmul_peak_tflops", {}),
                               table=table, plots=not args.no_plots)
    print(table)
    print(f"wrote {', '.join(os.path.basename(x) for x in paths)} to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
