"""What a benchmark run writes into its output folder:

    cases.jsonl    each case's row, appended as soon as it is measured (kept if the run is cut short)
    results.csv    one row per case (COLUMNS below)
    results.json   {"meta": environment and command, "config", "backends": what runs here and why not the rest,
                    "matmul_peak_tflops", "columns", "results": the same rows, and "config_sweep" after a
                    preset's --sweep}
    table.txt      the terminal table
    report.md      environment, command, matmul peak, the table and the plots, ready for docs/
    tflops.png, memory.png, speedup.png

``python -m benchmarks.replot FOLDER`` rebuilds everything but the CSV and JSON from results.json.
"""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone

COLUMNS = [
    "backend", "rung", "device", "dtype", "mode", "causal", "B", "H", "Nq", "Nk", "D",
    "status", "reason", "time_ms", "time_lo_ms", "time_hi_ms", "spread_pct", "n_runs", "timer", "round_ms",
    "gflop", "tflops", "mem_peak_mb", "mem_extra_mb", "mem_method", "speedup_vs_naive", "ref", "max_abs_vs_ref",
]
PLOTS = ("tflops.png", "memory.png", "speedup.png")
PARTIAL = "cases.jsonl"  # one JSON row per finished case, written as the run goes


# ------------------------------------------------------------------------------------ environment
def _version(module):
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "unknown")
    except Exception as exc:  # noqa: BLE001
        return f"not importable ({type(exc).__name__})"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_state():
    """{'git_commit', 'git_dirty', 'git_changed_files'} of this checkout ({} without git): a run on a tree with
    local changes names the changed tracked files, since the commit alone does not describe that code."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return {}
    return {"git_commit": commit, "git_dirty": bool(dirty), "git_changed_files": [line[3:] for line in dirty.splitlines()][:50]}


def environment(device, argv):
    """Versions, hardware and the command line, for results.json."""
    env = {
        "command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in argv),
        "argv": list(argv),
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "cupy": _version("cupy"),
        "device": device,
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", ""),
    }
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        env["torch_cuda"] = torch.version.cuda
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
            env["gpu_count"] = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001
        env["torch_error"] = str(exc)
    env.update(git_state())
    return env


# ------------------------------------------------------------------------------------ tables
def _num(x, fmt):
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _size(r):
    return str(r["Nk"]) if r["Nq"] == r["Nk"] else f"{r['Nq']}x{r['Nk']}"


def _shape(r):
    return f"B={r['B']} H={r['H']} D={r['D']}"


def _table_rows(rows):
    """(header, lines, notes, right-aligned columns): the non-ok reasons become numbered notes under the table;
    a run over several (B, H, D) gets a shape column first."""
    notes = {}
    shaped = len({_shape(r) for r in rows}) > 1
    header = ["backend", "dtype", "mode", "causal", "N", "time ms", "spread %", "TFLOP/s", "mem MB", "x naive", "status"]
    lines = []
    for r in rows:
        status = r["status"]
        if status != "ok":
            idx = notes.setdefault(r["reason"], len(notes) + 1)
            status = f"{status} [{idx}]"
        lines.append(([_shape(r)] if shaped else []) + [
            r["backend"], r["dtype"], r["mode"], "yes" if r["causal"] else "no", _size(r),
            _num(r["time_ms"], ".3g"), _num(r["spread_pct"], ".0f"), _num(r["tflops"], ".3g"),
            _num(r["mem_extra_mb"], ".3g"), _num(r["speedup_vs_naive"], ".2f"), status])
    right = {5, 6, 7, 8, 9}
    if shaped:
        header = ["shape"] + header
        right = {i + 1 for i in right}
    return header, lines, notes, right


def shapes_text(cfg):
    """'B=4 H=32 D=64; B=4 H=16 D=128': the run's shapes."""
    shapes = cfg.get("shapes") or [(cfg["B"], cfg["H"], cfg["D"])]
    return "; ".join(f"B={B} H={H} D={D}" for B, H, D in shapes)


def _title(cfg):
    threads = f" threads={cfg['threads']}" if cfg.get("device") == "cpu" and cfg.get("threads") else ""
    preset = f" preset={cfg['preset']}" if cfg.get("preset") else ""
    return (f"device={cfg['device']}{preset}{threads} {shapes_text(cfg)} "
            f"(time: median; spread: (max-min)/median on CPU, (p80-p20)/median on GPU; mem: peak above the "
            f"inputs; x naive: naive-torch time / this time)")


def text_table(rows, cfg):
    header, lines, notes, right = _table_rows(rows)
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [_title(cfg), fmt(header), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines]
    for reason, idx in notes.items():
        out.append(f"[{idx}] {reason}")
    return "\n".join(out)


def markdown_table(rows, cfg):
    header, lines, notes, right = _table_rows(rows)
    out = [_title(cfg), "", "| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(l) + " |" for l in lines]
    if notes:
        out.append("")
        out += [f"{idx}. {reason.replace('|', '/')}" for reason, idx in notes.items()]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------ files
def clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in COLUMNS})


def _cell(x):
    """A CSV cell: empty for a missing or non-finite value, a list (round_ms) as its values between spaces."""
    if isinstance(x, (list, tuple)):
        return " ".join(str(v) for v in x)
    return "" if clean(x) is None else x


def report_markdown(rows, *, meta, config, matmul_peak, plots=True):
    """report.md: what ran where, how to rerun it, the table and the plots."""
    if meta.get("partial"):
        lines = [f"# Benchmark on {config.get('device')} (cut short)", "",
                 "The run did not finish; these are the cases it measured, rebuilt from cases.jsonl "
                 "(no environment record, no matmul peak).", "", markdown_table(rows, config)]
        return "\n".join(lines)
    lines = [f"# Benchmark on {meta.get('gpu') or 'CPU: ' + str(meta.get('cpu_model') or meta.get('processor'))}", ""]
    hw = meta.get("gpu")
    if hw:
        hw += f" ({meta.get('gpu_memory_gib', '?')} GiB, compute capability {meta.get('gpu_capability', '?')})"
    else:
        hw = f"CPU ({meta.get('cpu_count')} cores visible; torch threads {meta.get('torch_threads')}, " \
             f"NumPy BLAS threads {meta.get('numpy_blas_threads', '?')})"
    lines += [
        f"- hardware: {hw}",
        f"- software: Python {meta.get('python')}, torch {meta.get('torch')} (CUDA {meta.get('torch_cuda')}), "
        f"triton {meta.get('triton')}, cupy {meta.get('cupy')}, numpy {meta.get('numpy')}; {meta.get('platform')}",
        f"- command: `{meta.get('command')}`",
        f"- date: {meta.get('utc')}; git commit {meta.get('git_commit', '?')}{' (with local changes)' if meta.get('git_dirty') else ''}; "
        f"wall time {meta.get('wall_s', float('nan')):.1f} s",
    ]
    if meta.get("git_changed_files"):
        lines.append("- changed files, not in that commit: " + ", ".join(f"`{f}`" for f in meta["git_changed_files"]))
    if meta.get("code_note"):
        lines.append(f"- note: {meta['code_note']}")
    if config.get("autograd_thread") == "calling":
        lines.append("- backward timed with autograd's multithreading off (`--autograd-thread calling`): every "
                     "backend's backward runs on the calling thread")
    if meta.get("TRITON_INTERPRET") == "1" and config.get("device") == "cpu":
        lines.append("- Triton runs under its interpreter here (TRITON_INTERPRET=1)")
    if matmul_peak:
        lines.append("- measured dense matmul peak (8192^3, torch.matmul): " +
                     ", ".join(f"{d} {v:.0f} TFLOP/s" for d, v in matmul_peak.items() if v))
    lines += ["", markdown_table(rows, config)]
    if plots:
        lines += ["", "![TFLOP/s](tflops.png)", "", "![peak memory](memory.png)", ""]
        if speedup_baseline(rows) is not None:
            lines += ["![speed-up](speedup.png)", ""]
    return "\n".join(lines)


def write_all(out, rows, *, meta, config, backends, matmul_peak, table, plots=True, extra=None):
    """Write every file of a run into ``out``; returns their paths. ``extra``: more top-level entries of
    results.json (a preset's ``config_sweep``)."""
    paths = []
    p = os.path.join(out, "results.csv")
    write_csv(p, rows)
    paths.append(p)
    p = os.path.join(out, "results.json")
    doc = {"meta": meta, "config": config, "backends": backends, "matmul_peak_tflops": matmul_peak,
           "columns": COLUMNS, "results": [{k: r.get(k) for k in COLUMNS} for r in rows], **(extra or {})}
    with open(p, "w") as f:
        json.dump(clean(doc), f, indent=1, allow_nan=False)
    paths.append(p)
    return paths + write_views(out, rows, meta=meta, config=config, matmul_peak=matmul_peak, table=table, plots=plots)


def write_views(out, rows, *, meta, config, matmul_peak, table, plots=True):
    """table.txt, report.md and the PNGs (plots are skipped, with a note, where matplotlib is missing)."""
    paths = []
    if plots:
        try:
            paths += write_plots(out, rows, matmul_peak, config)
        except ImportError as exc:
            print(f"plots skipped: {exc} (rebuild them elsewhere with python -m benchmarks.replot {out})", file=sys.stderr)
            plots = False
    md = report_markdown(rows, meta=meta, config=config, matmul_peak=matmul_peak, plots=plots)
    for name, text in (("table.txt", table + "\n"), ("report.md", md)):
        p = os.path.join(out, name)
        with open(p, "w") as f:
            f.write(text)
        paths.append(p)
    return paths


# ------------------------------------------------------------------------------------ plots
def _series(rows, metric):
    """{(mode, causal, (B, H, D)): {(backend, dtype): [(x, y, rung), ...]}} over rows with status ok and a
    finite metric."""
    groups = {}
    for r in rows:
        y = r.get(metric)
        if r["status"] != "ok" or y is None or not math.isfinite(y) or y <= 0:
            continue
        g = groups.setdefault(_panel(r), {})
        g.setdefault((r["backend"], r["dtype"]), []).append((r["Nk"], y, r["rung"]))
    return groups


# Okabe and Ito's colour-blind-safe colours (yellow and black left out: too pale / used for the ceilings),
# then Paul Tol's wine, indigo, olive, teal and a dark grey; each backend also gets its own marker, so that
# no two series differ by hue alone. The dtype sets the line style and the bar hatch.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#882255", "#332288", "#999933",
           "#44AA99", "#555555")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")
DTYPE_STYLES = ("-", "--", ":", "-.")
DTYPE_HATCHES = ("", "//", "..", "xx")
CEILING_DASHES = ((0, (6, 2)), (0, (2, 2)), (0, (6, 2, 1, 2)), (0, (1, 1)))


def _styles(names, dtypes):
    """{backend: (colour, marker)} (unique pairs) and {dtype: (line style, hatch)}."""
    by_backend = {name: (PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]) for i, name in enumerate(names)}
    by_dtype = {d: (DTYPE_STYLES[i % len(DTYPE_STYLES)], DTYPE_HATCHES[i % len(DTYPE_HATCHES)]) for i, d in enumerate(dtypes)}
    return by_backend, by_dtype


def _panel(r):
    return (r["mode"], r["causal"], (r["B"], r["H"], r["D"]))


# speedup.png divides by the first of these the run has: naive attention where it ran, else FlashAttention-2
SPEEDUP_BASELINES = (("naive-torch", "naive softmax(QK^T)V"), ("sdpa-flash", "FlashAttention-2 (sdpa-flash)"))


def speedup_baseline(rows):
    """(backend, description) that speedup.png divides by: the first of SPEEDUP_BASELINES with a measured row in
    ``rows``; None where the run has neither (then there is no speed-up plot)."""
    ran = {r["backend"] for r in rows if r["status"] == "ok" and r.get("time_ms")}
    return next((b for b in SPEEDUP_BASELINES if b[0] in ran), None)


def case_key(r):
    """The case a row measures, whatever the backend: device, dtype, mode, causal, B, H, Nq, Nk and D."""
    return (r["device"], r["dtype"], r["mode"], r["causal"], r["B"], r["H"], r["Nq"], r["Nk"], r["D"])


def _with_speedup(rows, baseline):
    """Copies of ``rows`` with 'speedup': the baseline's median time over the row's, in the same case (case_key;
    NaN where the baseline has no such row)."""
    t0 = {case_key(r): r["time_ms"] for r in rows if r["backend"] == baseline and r["status"] == "ok" and r.get("time_ms")}
    out = []
    for r in rows:
        t = r.get("time_ms")
        ok = r["status"] == "ok" and case_key(r) in t0 and t is not None and t > 0
        out.append(dict(r, speedup=t0[case_key(r)] / t if ok else math.nan))
    return out


def write_plots(out, rows, matmul_peak, config):
    """tflops.png, memory.png, speedup.png: one panel per (mode, causal); lines against N, or bars where
    the run has a single N. The legend sits outside the panels, so it hides neither points nor ceilings.
    speedup.png is over ``speedup_baseline(rows)``; a run with no baseline gets none (and loses a stale one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import NullFormatter

    mode_rank = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}
    panels = sorted({_panel(r) for r in rows}, key=lambda p: (mode_rank.get(p[0], 3), p[0], p[1], p[2])) \
        or [("fwd", False, (config["B"], config["H"], config["D"]))]
    shaped = len({p[2] for p in panels}) > 1
    dtypes = sorted({r["dtype"] for r in rows})
    nq_varies = any(r["Nq"] != r["Nk"] for r in rows)
    xlabel = "Nk (key length)" if nq_varies else "N (sequence length, Nq = Nk)"
    sub = f"{config['device']}" if shaped else f"{config['device']}, B={config['B']} H={config['H']} D={config['D']}"
    single_n = len({(r["Nq"], r["Nk"]) for r in rows}) == 1
    if single_n and rows:
        sub += f", N={_size(rows[0])}"
    specs = [
        ("tflops.png", "tflops", "TFLOP/s", "throughput (FLOPs = 4·B·H·Nq·Nk·D, x0.5 causal, x2.5 bwd)", False),
        ("memory.png", "mem_extra_mb", "peak memory above the inputs (MiB)", "peak memory", True),
    ]
    baseline = speedup_baseline(rows)
    if baseline is not None:
        rows = _with_speedup(rows, baseline[0])
        specs.append(("speedup.png", "speedup", f"speed-up over {baseline[0]} (x)", f"speed-up over {baseline[1]}", False))
    elif os.path.exists(os.path.join(out, "speedup.png")):
        os.remove(os.path.join(out, "speedup.png"))  # an earlier plot of this folder, which these rows do not back
    order = {}
    for r in rows:
        order.setdefault(r["backend"], len(order))
    names = sorted(order, key=order.get)
    by_backend, by_dtype = _styles(names, dtypes)
    anchors = {r["backend"] for r in rows if r.get("rung") == "anchor"}

    def label(backend, dtype):
        text = backend if len(dtypes) == 1 else f"{backend} ({dtype})"
        return text + (" [anchor]" if backend in anchors else "")

    paths = []
    for fname, metric, ylabel, title, logy in specs:
        series = _series(rows, metric)
        n = len(panels)
        if single_n:
            width = max(6.5, 0.45 * max((len(series.get(p, {})) for p in panels), default=1) + 2)
        else:
            width = 6.5
        ncols = min(n, 2)
        nrows = (n + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 4.6 * nrows), squeeze=False)
        legend = {}
        for ax, panel in zip(axes.flat, panels):
            data = series.get(panel, {})
            keys = sorted(data, key=lambda k: (order[k[0]], dtypes.index(k[1])))
            if single_n:
                for i, key in enumerate(keys):
                    backend, dtype = key
                    colour, _ = by_backend[backend]
                    _, hatch = by_dtype[dtype]
                    y = data[key][0][1]
                    ax.bar(i, y, color=colour, hatch=hatch, edgecolor="black", linewidth=0.6)
                    ax.annotate(f"{y:.0f}" if y >= 1000 else f"{y:.3g}", (i, y), xytext=(0, 2), textcoords="offset points", ha="center",
                                va="bottom", fontsize=6.5, zorder=5,
                                bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none", alpha=0.85))
                    legend.setdefault(label(backend, dtype), Patch(facecolor=colour, hatch=hatch, edgecolor="black"))
                ax.set_xticks(range(len(keys)))
                ax.set_xticklabels([label(*k) for k in keys], rotation=60, ha="right", fontsize=7)
                ax.set_xlim(-0.6, max(len(keys), 1) - 0.4)
            else:
                all_x = set()
                for key in keys:
                    backend, dtype = key
                    pts = sorted(data[key])
                    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                    colour, marker = by_backend[backend]
                    style, _ = by_dtype[dtype]
                    ax.plot(xs, ys, marker=marker, ms=5, lw=1.6, ls=style, color=colour,
                            markerfacecolor="white" if backend in anchors else colour, markeredgewidth=1.2)
                    legend.setdefault(label(backend, dtype), Line2D([], [], marker=marker, ms=5, lw=1.6, ls=style, color=colour,
                                                                  markerfacecolor="white" if backend in anchors else colour))
                    all_x.update(xs)
                if logy and data:
                    # guide lines through the smallest point of all series: slope 1 (O(N)) and slope 2 (O(N^2))
                    allpts = [p for pts in data.values() for p in pts]
                    x0 = min(p[0] for p in allpts)
                    x1 = max(p[0] for p in allpts)
                    y0 = min(p[1] for p in allpts if p[0] == x0)
                    if x1 > x0:
                        ax.plot([x0, x1], [y0, y0 * x1 / x0], color="black", ls=(0, (1, 3)), lw=1)
                        ax.plot([x0, x1], [y0, y0 * (x1 / x0) ** 2], color="black", ls=(0, (6, 3)), lw=1)
                        legend.setdefault("∝ N (guide)", Line2D([], [], color="black", ls=(0, (1, 3)), lw=1))
                        legend.setdefault("∝ N² (guide)", Line2D([], [], color="black", ls=(0, (6, 3)), lw=1))
                ax.set_xscale("log", base=2)
                if all_x:
                    ticks = sorted(all_x)
                    ax.set_xticks(ticks)
                    ax.set_xticklabels([str(t) for t in ticks], fontsize=7)
                    ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_xlabel(xlabel)
            if metric == "tflops":  # the ceilings: told apart by dash pattern, named in the legend, not on the axes
                peaks = [(d, v) for d, v in matmul_peak.items() if v and math.isfinite(v)]
                for i, (d, peak) in enumerate(peaks):
                    dash = CEILING_DASHES[i % len(CEILING_DASHES)]
                    ax.axhline(peak, color="black", ls=dash, lw=1, zorder=0.5)
                    legend.setdefault(f"measured matmul peak, {d}: {peak:.0f} TFLOP/s",
                                      Line2D([], [], color="black", ls=dash, lw=1))
                if peaks:
                    ax.set_ylim(0, max(v for _, v in peaks) * 1.08)
            if metric == "speedup":
                ax.axhline(1.0, color="black", ls=(0, (2, 2)), lw=0.9, zorder=0.5)
            if logy:
                ax.set_yscale("log")
            if single_n and data and not (metric == "tflops" and matmul_peak):
                top = max(pts[0][1] for pts in data.values())
                lo, _ = ax.get_ylim()
                ax.set_ylim(lo, top * (2.0 if logy else 1.12))  # room for the value labels
            mode, causal, (B, Hh, D) = panel
            where = f"{sub}, B={B} H={Hh} D={D}" if shaped else sub
            ax.set_title(f"{title}\n{mode}, {'causal' if causal else 'non-causal'}; {where}", fontsize=9)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", axis="y" if single_n else "both", alpha=0.3)
            if not data:
                ax.text(0.5, 0.5, "no successful case", transform=ax.transAxes, ha="center", va="center")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.tight_layout()
        if legend:
            fig.legend(list(legend.values()), list(legend), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7.5,
                       frameon=False, title=(("colour = backend, hatch = dtype" if single_n else "colour and marker = backend, line = dtype")
                              if len(dtypes) > 1 else None),
                       title_fontsize=7.5)
        p = os.path.join(out, fname)
        fig.savefig(p, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths
