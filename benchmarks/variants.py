"""The attention variants (sliding window, GQA/MQA, dropout) timed beside their best PyTorch alternative.

    python -m benchmarks.variants --out results/variants            # on a GPU: the recorded run
    python -m benchmarks.variants --quick --device cpu --out /tmp/v  # the plumbing, tiny, on a CPU

Four sections, each a list of cases timed for every backend that takes them (fwd: the forward alone;
bwd: the backward alone, the forward's graph kept), with the one timer (:func:`benchmarks.measure.time_call`)
and the one SDPA pin (:mod:`benchmarks.targets`):

    window-scaling  N = 16384, windows (w, w) from 256 to the full sequence: time against the fraction of
                    scores that are visible (``masks.visible_pairs``); a kernel that skips every block wholly
                    outside the window runs in time close to proportional to it
    window          causal local (512, 0) and symmetric (256, 256) windows, beside FlexAttention with the same
                    block mask and SDPA with the window as a dense boolean mask
    gqa             Hq = 32 query heads over Hk = 8 and 1 K/V heads, beside SDPA with ``enable_gqa=True``
                    (every SDPA kernel that takes it) and FlexAttention with ``enable_gqa=True``
    dropout         p = 0.1, beside SDPA's FlashAttention-2 kernel (and the others that take dropout)

"ours" are the registry backends named by ``--backends`` that declare the variant (``capabilities.variants``):
by default Triton and the fastest CUDA rung on a Hopper GPU, cuda-wgmma-ws (whose backward is the warp-specialised
wgmma backward, ``capabilities.HOPPER_BACKWARD``); the best PyTorch alternative of a case is the fastest alternative that ran it.
TFLOP/s count the visible scores only (``attention_flops(..., window_size=)``), so the window rows compare
with full attention's. Outputs of the backends are compared with the first alternative that ran the case
(max-abs, not for dropout, whose random numbers differ between libraries).

Writes ``variants.json`` (every row, the environment, the git commit), ``variants.md`` (the tables the docs
read) and ``variants.png`` (time against visible fraction; speed-up over the best alternative).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

from . import measure, report
from .targets import FlexTarget, RegistryTarget, SdpaTarget, SDPA_KERNELS, short_reason

OURS = ("triton", "cuda-wgmma-ws")  # Triton and the fastest CUDA rung on a Hopper GPU (--backends adds others)
ALTERNATIVES = {"window": ("flex", "sdpa-cudnn", "sdpa-efficient"),
                "gqa": ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"),
                "dropout": ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")}
SEED = 2**33 + 7  # dropout_seed of our backends (>= 2**32: both Philox key words in use)


def _case(section, variant, B, Hq, Hk, N, D, causal, mode, window=(-1, -1), p=0.0, dtype="float16"):
    return dict(section=section, variant=variant, B=B, Hq=Hq, Hk=Hk, N=N, D=D, causal=causal, mode=mode,
                window=tuple(window), dropout_p=p, dtype=dtype)


def cases(quick: bool):
    """The run's cases, in order. ``quick``: the same sections at sizes a CPU runs in seconds."""
    if quick:
        N, Hq, D = 128, 4, 32
        out = [_case("window-scaling", "window", 1, Hq, Hq, N, D, False, m, (w, w)) for w in (8, 32, -1)
               for m in ("fwd", "bwd")]
        out += [_case("window", "window", 1, Hq, Hq, N, D, True, m, (16, 0)) for m in ("fwd", "bwd")]
        out += [_case("gqa", "gqa", 1, Hq, 1, N, D, c, "fwd") for c in (False, True)]
        out += [_case("dropout", "dropout", 1, Hq, Hq, N, D, False, m, p=0.1) for m in ("fwd", "bwd")]
        return out
    out = []
    for mode in ("fwd", "bwd"):
        for w in (256, 512, 1024, 2048, 4096, 8192, -1):
            out.append(_case("window-scaling", "window", 1, 16, 16, 16384, 128, False, mode, (w, w)))
    for N, B in ((4096, 4), (16384, 1)):
        for window, causal in (((512, 0), True), ((256, 256), False)):
            for mode in ("fwd", "bwd"):
                out.append(_case("window", "window", B, 16, 16, N, 128, causal, mode, window))
    for N, B in ((4096, 2), (16384, 1)):
        for Hk in (8, 1):
            for causal in (False, True):
                for mode in ("fwd", "bwd"):
                    out.append(_case("gqa", "gqa", B, 32, Hk, N, 128, causal, mode))
    for D, (B, H) in ((64, (4, 32)), (128, (4, 16))):
        for causal in (False, True):
            for mode in ("fwd", "bwd"):
                out.append(_case("dropout", "dropout", B, H, H, 4096, D, causal, mode, p=0.1))
    return out


def targets(ours=OURS):
    """{name: Target}: our backends from the registry, the SDPA kernels and FlexAttention."""
    from flash_attention_py.registry import BACKENDS

    found = {b.name: RegistryTarget(backend=b) for b in BACKENDS if b.name in ours}
    found.update({n: SdpaTarget(name=n, kernel=k) for n, k in SDPA_KERNELS.items()})
    found["flex"] = FlexTarget()
    return found


def _variant_kwargs(case):
    kw = {}
    if case["window"] != (-1, -1):
        kw["window_size"] = case["window"]
    if case["dropout_p"]:
        kw.update(dropout_p=case["dropout_p"], dropout_seed=SEED)
    return kw


def _why_not(target, case, device):
    """None if ``target`` runs ``case`` here, else why not."""
    reason = target.unavailable_reason(device)
    if reason is None:
        reason = target.case_reason(device, case["dtype"], case["D"], case["mode"])
    if reason is None and isinstance(target, RegistryTarget) and case["variant"] not in target.backend.variants:
        reason = f"{target.name} does not take {case['variant']} (capabilities: {', '.join(target.backend.variants)})"
    return reason


def _first_output(out):
    o = out[0] if isinstance(out, (tuple, list)) else out
    return o.detach().float() if hasattr(o, "detach") else o


def run_case(case, names, by_name, device, inputs, *, repeats, rounds=1):
    """One row per backend in ``names`` for ``case`` (ours: the registry's; the rest: PyTorch alternatives).

    rounds > 1: every backend is timed once a round, in turn, and the row keeps the median of its rounds (and
    each round's time, ``round_ms``), so that a slow spell of the GPU falls on every backend alike instead of on
    whichever came at that moment."""
    from flash_attention_py.common import attention_flops

    flops = attention_flops(case["B"], case["Hq"], case["N"], case["N"], case["D"], causal=case["causal"],
                            mode=case["mode"], window_size=case["window"])
    rows, first, live = [], None, {}  # live: backend -> (its row, the timed call, its target)
    for name in names:
        target = by_name[name]
        row = dict(case, window=list(case["window"]), backend=name, ours=isinstance(target, RegistryTarget), gflop=flops / 1e9,
                   status="skipped", reason="", time_ms=None, tflops=None, max_abs_vs_alternative=None)
        rows.append(row)
        reason = _why_not(target, case, device)
        if reason is not None:
            row["reason"] = reason
            continue
        try:
            with target.context():
                fn = target.prepare(inputs, case["causal"], case["mode"], **_variant_kwargs(case))
                out = fn()
            if not case["dropout_p"]:
                o = _first_output(out)
                if first is None and not row["ours"]:
                    first = o
                row["_out"] = o
            live[name] = (row, fn, target)
        except NotImplementedError as exc:
            row.update(status="unsupported", reason=short_reason(exc))
        except Exception as exc:  # noqa: BLE001 - a failure is a row, not the end of the run
            row.update(status="failed", reason=short_reason(exc))
    for _ in range(rounds):
        for name, (row, fn, target) in list(live.items()):
            try:
                with target.context():
                    row.setdefault("round_ms", []).append(measure.time_call(fn, device=device, repeats=repeats)[0])
            except Exception as exc:  # noqa: BLE001
                row.update(status="failed", reason=short_reason(exc))
                del live[name]
    for row, _, _ in live.values():
        row["status"] = "ok"
        _settle(row)
    for row in rows:
        o = row.pop("_out", None)
        if o is not None and first is not None and row["ours"]:
            row["max_abs_vs_alternative"] = float((o - first).abs().max())
    return rows


def _settle(row):
    """time_ms and TFLOP/s from the median of the row's rounds so far."""
    ms = statistics.median(row["round_ms"])
    row.update(time_ms=ms, tflops=row["gflop"] * 1e9 / (ms * 1e-3) / 1e12)


def time_again(case, rows, by_name, device, inputs, *, repeats):
    """One more round of a case that ran (--round-order run): each backend whose row is ok prepared again on these
    inputs, run once and timed once; its row gains the round (``round_ms``). A failure makes the row failed."""
    for row in rows:
        if row["status"] != "ok":
            continue
        target = by_name[row["backend"]]
        try:
            with target.context():
                fn = target.prepare(inputs, case["causal"], case["mode"], **_variant_kwargs(case))
                fn()
                row["round_ms"].append(measure.time_call(fn, device=device, repeats=repeats)[0])
            _settle(row)
        except Exception as exc:  # noqa: BLE001 - a failure is a row, not the end of the run
            row.update(status="failed", reason=f"round {len(row['round_ms']) + 1}: {short_reason(exc)}", time_ms=None,
                       tflops=None)


# ------------------------------------------------------------------------------------ the summary
def _best_alternative(rows):
    alt = [r for r in rows if not r["ours"] and r["status"] == "ok"]
    return min(alt, key=lambda r: r["time_ms"]) if alt else None


def _key(r):
    return (r["section"], r["B"], r["Hq"], r["Hk"], r["N"], r["D"], r["causal"], tuple(r["window"]),
            r["dropout_p"], r["mode"])


def summarise(rows):
    """Per case: each of our backends' time, the best alternative and the speed-up; the window-scaling table."""
    from flash_attention_py.masks import visible_pairs, window_for

    groups = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    table = []
    for key, group in groups.items():
        best = _best_alternative(group)
        first = group[0]
        entry = {k: first[k] for k in ("section", "variant", "B", "Hq", "Hk", "N", "D", "causal", "window",
                                       "dropout_p", "mode", "dtype")}
        entry["visible_fraction"] = visible_pairs(first["N"], first["N"], window_for(first["causal"], tuple(first["window"]))) \
            / first["N"] ** 2
        entry["best_alternative"] = best["backend"] if best else None
        entry["best_alternative_ms"] = best["time_ms"] if best else None
        entry["ms"] = {r["backend"]: r["time_ms"] for r in group if r["status"] == "ok"}
        entry["tflops"] = {r["backend"]: r["tflops"] for r in group if r["status"] == "ok"}
        entry["vs_best_alternative"] = {r["backend"]: best["time_ms"] / r["time_ms"] for r in group
                                        if r["ours"] and r["status"] == "ok" and best}
        entry["not_run"] = {r["backend"]: r["reason"] for r in group if r["status"] != "ok"}
        table.append(entry)
    full = {(e["mode"], b): ms for e in table if e["section"] == "window-scaling" and tuple(e["window"]) == (-1, -1)
            for b, ms in e["ms"].items()}
    for e in table:
        if e["section"] == "window-scaling":
            e["time_vs_full"] = {b: ms / full[(e["mode"], b)] for b, ms in e["ms"].items() if (e["mode"], b) in full}
    return table


def _f(x, fmt):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _wtext(w):
    return "full" if tuple(w) == (-1, -1) else f"({w[0]}, {w[1]})"


def _ours(table):
    seen = []
    for e in table:
        seen += [b for b in e["vs_best_alternative"] if b not in seen]
        seen += [b for b in e.get("time_vs_full", {}) if b not in seen and b != "flex"]
    return seen


def markdown(table, meta):
    ours = _ours(table)
    lines = ["# Attention variants beside their best PyTorch alternative", "",
             f"{'GPU: ' + meta['gpu'] if meta.get('gpu') else 'CPU: ' + str(meta.get('cpu_model'))}; torch "
             f"{meta.get('torch')}, triton {meta.get('triton')}, CuPy {meta.get('cupy')}; git commit "
             f"{meta.get('git_commit', '?')}{' (with local changes)' if meta.get('git_dirty') else ''}.", "",
             f"Reproduce: `{meta.get('command')}`" + (f" (tables: its sections {', '.join(meta['sections'])})"
                                                       if meta.get("sections") else ""), "",
             ("Times are medians of CUDA-event timings (triton.testing.do_bench)" if meta.get("device") == "cuda"
              else "Times are medians of time.perf_counter timings")
             + (f" (each backend timed once a round, in turn; the median of {meta['rounds']} rounds"
                + ("" if meta.get("round_order", "case") == "case" else ", each round a pass over the whole run")
                + ")"
                if meta.get("rounds", 1) > 1 else "") + " in ms; x = best alternative's time / "
             "ours (above 1: ours is faster). fwd: the forward alone; bwd: the backward alone. TFLOP/s count visible "
             "scores only. The alternative's name is the fastest PyTorch kernel that ran the case.", ""]
    scaling = [e for e in table if e["section"] == "window-scaling"]
    if scaling:
        lines += ["## Window: time against the visible fraction of scores", "",
                  f"B={scaling[0]['B']} H={scaling[0]['Hq']} N={scaling[0]['N']} D={scaling[0]['D']}, "
                  f"{scaling[0]['dtype']}, windows (w, w). 'time / full' is the time over full attention's; "
                  "with perfect block skipping it equals the visible fraction.", "",
                  "| mode | window | visible | " + " | ".join(f"{b} ms | {b} time / full" for b in ours + ["flex"]) + " |",
                  "|---|---|---|" + "---|---|" * (len(ours) + 1)]
        for e in scaling:
            cells = []
            for b in ours + ["flex"]:
                cells += [_f(e["ms"].get(b), ".3f"), _f(e.get("time_vs_full", {}).get(b), ".3f")]
            lines.append(f"| {e['mode']} | {_wtext(e['window'])} | {e['visible_fraction']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
    titles = {"window": "Sliding window (FlexAttention block mask; SDPA with a dense boolean mask)",
              "gqa": "Grouped-query attention (SDPA enable_gqa=True; FlexAttention enable_gqa=True)",
              "dropout": "Dropout p = 0.1 (SDPA's kernels with dropout_p)"}
    for section, title in titles.items():
        rows = [e for e in table if e["section"] == section]
        if not rows:
            continue
        lines += [f"## {title}", "",
                  "| mode | B | Hq | Hk | N | D | causal | window | best alternative | ms | "
                  + " | ".join(f"{b} ms | {b} x" for b in ours) + " |",
                  "|---|---|---|---|---|---|---|---|---|---|" + "---|---|" * len(ours)]
        for e in rows:
            cells = []
            for b in ours:
                cells += [_f(e["ms"].get(b), ".3f"), _f(e["vs_best_alternative"].get(b), ".2f")]
            lines.append(f"| {e['mode']} | {e['B']} | {e['Hq']} | {e['Hk']} | {e['N']} | {e['D']} | {e['causal']} | "
                         f"{_wtext(e['window'])} | {e['best_alternative'] or '–'} | {_f(e['best_alternative_ms'], '.3f')} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    misses = sorted({f"{b}: {why}" for e in table for b, why in e["not_run"].items()})
    if misses:
        lines += ["Not run (why):", ""] + [f"- {m}" for m in misses] + [""]
    return "\n".join(lines)


def plot(table, path):
    """variants.png: left, time / full against the visible fraction (log-log, the proportional line dashed);
    right, our speed-up over the best PyTorch alternative per case (bars; 1.0 marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scaling = [e for e in table if e["section"] == "window-scaling" and tuple(e["window"]) != (-1, -1)]
    bars = [(e, b, x) for e in table if e["section"] != "window-scaling" for b, x in e["vs_best_alternative"].items()]
    if scaling and bars:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw=dict(width_ratios=(1, 1.6)))
    else:  # one of the two panels
        fig, ax = plt.subplots(1, 1, figsize=(9 if bars else 7, 5.5))
        ax1, ax2 = (ax, None) if scaling else (None, ax)
    styles = {b: (report.PALETTE[i % len(report.PALETTE)], report.MARKERS[i % len(report.MARKERS)])
              for i, b in enumerate(_ours(table) + ["flex"])}
    if ax1 is not None:
        _plot_scaling(ax1, scaling, styles)
    if ax2 is not None:
        _plot_bars(ax2, bars, styles)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _plot_scaling(ax1, scaling, styles):
    names = sorted({b for e in scaling for b in e.get("time_vs_full", {})})
    for b in names:
        for mode, line in (("fwd", "-"), ("bwd", ":")):
            pts = sorted((e["visible_fraction"], e["time_vs_full"][b]) for e in scaling
                         if e["mode"] == mode and b in e["time_vs_full"])
            if pts:
                colour, marker = styles[b]
                ax1.plot(*zip(*pts), line, color=colour, marker=marker, label=f"{b} {mode}")
    if scaling:
        xs = [e["visible_fraction"] for e in scaling]
        ax1.plot([min(xs), 1], [min(xs), 1], "--", color="grey", label="proportional")
    ax1.set(xscale="log", yscale="log", xlabel="visible fraction of scores", ylabel="time / full attention's time",
            title="sliding window (w, w), N = 16384")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.14), ncol=3, frameon=False)


def _plot_bars(ax2, bars, styles):
    labels = []
    for i, (e, b, x) in enumerate(bars):
        colour, _ = styles[b]
        ax2.bar(i, x, color=colour, hatch="//" if e["mode"] == "bwd" else None, edgecolor="black", linewidth=0.4)
        labels.append(f"{e['section']} {e['mode']} N{e['N']}"
                      + (f" {_wtext(e['window'])}" if e["section"] == "window" else "")
                      + (f" Hk{e['Hk']}" if e["section"] == "gqa" else "")
                      + (f" D{e['D']}" if e["section"] == "dropout" else "")
                      + (" causal" if e["causal"] else "") + f" [{b}]")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
    ax2.set(ylabel="best PyTorch alternative's time / ours", title="speed-up over the best PyTorch alternative "
                                                                   "(hatched: backward)")
    ax2.grid(True, axis="y", alpha=0.3)


# ------------------------------------------------------------------------------------ the run
def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.variants", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (variants.json, variants.md, variants.png)")
    p.add_argument("--rebuild", action="store_true",
                   help="run nothing: rebuild variants.json/.md/.png in --out from the rows there (variants.json, or "
                        "the variants.partial.json of a run cut short), keeping only --sections")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the plumbing (a CPU runs it in seconds)")
    p.add_argument("--sections", default="window-scaling,window,gqa,dropout",
                   help="comma-separated subset of the sections")
    p.add_argument("--backends", default=",".join(OURS),
                   help="our backends to time (registry names), comma-separated; default: %(default)s")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every backend of a case once a round, in turn, this many rounds, and keep each one's "
                        "median (default: %(default)s)")
    p.add_argument("--round-order", choices=("run", "case"), default="run",
                   help="with --rounds: 'run' (default) takes round 1 of every case, then round 2 of every case, and "
                        "so on (the inputs drawn again each round), so a slow spell of the host seconds long moves one "
                        "round of a row; 'case' takes a case's rounds back to back")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    import torch

    from flash_attention_py.inputs import make_inputs

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"window-scaling", "window", "gqa", "dropout"}
    if unknown:
        raise SystemExit(f"benchmarks.variants: --sections: unknown {sorted(unknown)}; "
                         "expected window-scaling, window, gqa, dropout")
    if args.rounds < 1:
        raise SystemExit(f"benchmarks.variants: --rounds must be at least 1, got {args.rounds}")
    if args.rebuild:
        return rebuild(args.out, sections)
    todo = [c for c in cases(args.quick) if c["section"] in sections]
    ours = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    by_name = targets(ours)
    missing = [b for b in ours if b not in by_name]
    if missing:
        raise SystemExit(f"benchmarks.variants: --backends: {missing} are not registry backends")
    os.makedirs(args.out, exist_ok=True)
    meta = report.environment(device, argv)
    meta["command"] = "python -m benchmarks.variants " + " ".join(argv)
    meta["rounds"] = args.rounds
    meta["round_order"] = args.round_order
    from tqdm.auto import tqdm

    state = {"inputs": None, "last": None}

    def inputs_for(case):  # one draw per shape, in run order (drawn again when a later round comes back to it)
        shape = (case["B"], case["Hq"], case["Hk"], case["N"], case["D"], case["dtype"])
        if shape != state["last"]:
            state["inputs"] = None
            if device == "cuda":
                torch.cuda.empty_cache()
            state["inputs"] = make_inputs(case["B"], case["Hq"], case["N"], case["N"], case["D"], Hk=case["Hk"],
                                          dtype=case["dtype"], device=device,
                                          draw="device" if device == "cuda" else "host")  # ms, not seconds, a draw
            state["last"] = shape
        return state["inputs"]

    def save_partial():  # what a cut-off run leaves
        with open(os.path.join(args.out, "variants.partial.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, default=str)

    repeats = 5 if args.quick else 10
    spread = args.round_order == "run" and args.rounds > 1
    rows, done = [], []
    for case in tqdm(todo, desc="variants" + (f" round 1 of {args.rounds}" if spread else ""), disable=args.no_progress):
        names = ours + (("flex",) if case["section"] == "window-scaling" else ALTERNATIVES[case["section"]])
        got = run_case(case, names, by_name, device, inputs_for(case), repeats=repeats,
                       rounds=1 if spread else args.rounds)
        rows += got
        done.append((case, got))
        save_partial()
        for r in got:
            if r["status"] == "ok":
                print(f"{r['section']:>14} {r['mode']} N={r['N']} Hq/Hk={r['Hq']}/{r['Hk']} D={r['D']} "
                      f"causal={r['causal']} window={_wtext(r['window'])} p={r['dropout_p']}: {r['backend']:>14} "
                      f"{r['time_ms']:.3f} ms {r['tflops']:.1f} TFLOP/s", flush=True)
    for k in range(2, args.rounds + 1) if spread else ():  # each later round a pass over the whole run
        state["last"] = None  # fresh inputs for every round
        for case, got in tqdm(done, desc=f"variants round {k} of {args.rounds}", disable=args.no_progress):
            time_again(case, got, by_name, device, inputs_for(case), repeats=repeats)
            save_partial()
    write(args.out, meta, rows)
    os.remove(os.path.join(args.out, "variants.partial.json"))
    return 0


def write(out, meta, rows):
    """variants.json (meta, rows, summary), variants.md and variants.png in ``out``; prints the tables."""
    table = summarise(rows)
    with open(os.path.join(out, "variants.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, summary=table), f, indent=1, default=str)
    with open(os.path.join(out, "variants.md"), "w") as f:
        f.write(markdown(table, meta))
    plot(table, os.path.join(out, "variants.png"))
    print(markdown(table, meta))


def rebuild(out, sections):
    """--rebuild: the files of ``out`` again from its rows, only those of ``sections`` (a run cut short: from
    variants.partial.json, marked meta.partial)."""
    done, partial = os.path.join(out, "variants.json"), os.path.join(out, "variants.partial.json")
    path = done if os.path.isfile(done) else partial
    if not os.path.isfile(path):
        raise SystemExit(f"benchmarks.variants: --rebuild: neither variants.json nor variants.partial.json in {out!r}")
    with open(path) as f:
        doc = json.load(f)
    meta = dict(doc["meta"], partial=path == partial or doc["meta"].get("partial", False))
    rows = [dict(r, window=tuple(r["window"])) for r in doc["rows"] if r["section"] in sections]
    meta["sections"] = sections
    write(out, meta, rows)
    if path == partial:
        os.remove(partial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
