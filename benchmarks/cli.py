"""``python -m benchmarks``: time every backend of the registry beside PyTorch's own attention kernels.

    python -m benchmarks                         # the default sweep for this machine (CPU or GPU)
    python -m benchmarks --quick                 # a few seconds: tiny sizes
    python -m benchmarks --seed-config           # the seed documents' case: B=8 H=12 N=1024 D=64 fp16
    python -m benchmarks --backends numpy-v2,naive-torch --n 256,512 --causal both --mode both
    python -m benchmarks --list                  # what can run here, and why not the rest; the presets
    python -m benchmarks --preset cuda-ladder    # a named set of backends/shapes/modes (benchmarks/presets.py)
    python -m benchmarks --preset cuda-ladder --dry-run   # the cases it would run, without running them

Every case (backend x dtype x mode x causal x N) becomes one row of the CSV/JSON; a case that runs
out of memory, is not supported, would take too long (predicted before it runs, from the previous N or
from one small probe call) or fails is recorded with its status and reason, and the sweep goes on. An
unusable --out stops the command with a one-line error before any case runs. See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Without a GPU, Triton kernels can only run under the interpreter, which must be switched on before
# any @triton.jit kernel is imported (the same rule as tests/conftest.py).
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from flash_attention_py.common import attention_flops  # noqa: E402
from flash_attention_py.inputs import make_inputs  # noqa: E402

from . import measure, presets, report  # noqa: E402
from .targets import ALL_DTYPES, NAIVE, SDPA_KERNELS, build_targets, short_reason  # noqa: E402

# the sweep's defaults per device, and for --quick / --seed-config (named presets: benchmarks/presets.py)
DEFAULTS = {
    "cpu": dict(n="128..2048", B=1, H=4, D=64, repeats=5, max_call_s=2.0),
    "cuda": dict(n="512..16384", B=4, H=16, D=64, repeats=10, max_call_s=1.0),
    "quick": dict(n="64,128", B=1, H=2, D=32, repeats=3),
    "seed": dict(n="1024", B=8, H=12, D=64),
}
DTYPE_PREFS = {
    "cuda": ("float16", "bfloat16", "float32", "float64"),
    "cpu": ("float32", "float64", "float16", "bfloat16"),
}
MODES = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd+bwd",), "both": ("fwd", "bwd"),
         "all": ("fwd", "bwd", "fwd+bwd")}
CAUSAL = {"off": (False,), "on": (True,), "both": (False, True)}
QUADRATIC_MEMORY = {NAIVE, "sdpa-math"}  # materialise the (Nq, Nk) score matrix
# Before the first (smallest) N of a backend is run, a case more than PROBE_MIN_RATIO times the FLOPs of a
# PROBE_N x PROBE_N call is predicted from one timed call at that size (same B, H, D, dtype, mode, causal).
# The presets start small enough (CPU 128, GPU 512, seed 1024) that they need no probe.
PROBE_N = 256
PROBE_CALLS = 3  # timed calls of the probe (after its warm-up): the fastest predicts
PROBE_MIN_RATIO = 16.0


# ------------------------------------------------------------------------------------ options
def _int_at_least(minimum, expected):
    """An argparse type: an int >= ``minimum``; ``expected`` names it in the error."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parse_sizes(text):
    """'128,256,1000' -> [128, 256, 1000]; '512..4096' -> [512, 1024, 2048, 4096] (doubling)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if ".." in part:
            lo, hi = part.split("..", 1)
            lo, hi = _positive_int(lo), _positive_int(hi)
            if hi < lo:
                raise argparse.ArgumentTypeError(f"range {part!r}: the end is below the start")
            n = lo
            while n <= hi:
                out.append(n)
                n *= 2
        else:
            out.append(_positive_int(part))
    if not out:
        raise argparse.ArgumentTypeError(f"expected sizes like '128,256' or '512..16384', got {text!r}")
    return out


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time every FlashAttention backend of the registry beside PyTorch's own kernels "
                    "(naive softmax(QK^T)V and scaled_dot_product_attention per SDPA kernel). Writes a "
                    "terminal table, results.csv, results.json and PNG plots.",
        epilog="Examples: python -m benchmarks --quick | --seed-config | --backends numpy-v2,naive-torch --n 256,512 "
               "--causal both --mode both. See benchmarks/README.md.")
    p.add_argument("--preset", choices=tuple(presets.PRESETS), default=None,
                   help="a named set of backends, shapes, N, modes and dtypes, with its side-by-side summary "
                        "files (" + "; ".join(f"{n}: {pr.description}" for n, pr in presets.PRESETS.items()) +
                        "). Options given beside it replace the preset's values")
    p.add_argument("--sweep", action="store_true",
                   help="with --preset cuda-ladder / cuda-backward: first time the CUDA kernels' tile-config "
                        "candidates per D (recorded in results.json; the library's tables are not changed)")
    p.add_argument("--dry-run", action="store_true",
                   help="resolve the options (or the preset) and print the cases, without running any")
    p.add_argument("--backends", default=None,
                   help="comma-separated backend names, or groups: 'default' (everything that runs here; "
                        "on a CPU without the Triton interpreter), 'all', 'anchors' (naive-torch + sdpa-*), "
                        "'sdpa'. --list shows the names (default: default)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="'auto' (the default): cuda when a GPU is visible, else cpu")
    p.add_argument("--n", type=parse_sizes, default=None,
                   help="sequence lengths (Nq = Nk): '128,256' or '512..16384' (doubling). "
                        "Default: CPU 128..2048, GPU 512..16384")
    p.add_argument("--nq", type=parse_sizes, default=None, help="query lengths (with --nk: zipped; one value broadcasts)")
    p.add_argument("--nk", type=parse_sizes, default=None, help="key/value lengths")
    p.add_argument("-b", "--batch", type=_positive_int, default=None, help="B (default: CPU 1, GPU 4)")
    p.add_argument("--heads", type=_positive_int, default=None, help="H (default: CPU 4, GPU 16)")
    p.add_argument("-d", "--head-dim", type=_positive_int, default=None, help="D (default: 64)")
    p.add_argument("--dtype", default="auto",
                   help="comma-separated float16,bfloat16,float32,float64, or 'auto': each backend in the first "
                        "dtype it takes of (GPU) float16, bfloat16, float32 / (CPU) float32, float64, float16; the "
                        "anchors in every dtype the others use (default: auto)")
    p.add_argument("--causal", choices=tuple(CAUSAL), default=None, help="causal mask off (default), on, or both")
    p.add_argument("--mode", choices=tuple(MODES), default=None,
                   help="fwd, bwd (backward alone), fwd+bwd (one timed forward+backward), both (fwd and bwd rows), "
                        "all (all three) (default: fwd)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="CPU: timed runs per case (median, min, max; default 5). GPU: runs of a slow case (do_bench "
                        "times the fast ones itself)")
    p.add_argument("--rounds", type=_positive_int, default=None,
                   help="time every case in this many rounds: each backend of a (shape, N, dtype, mode, causal) once a "
                        "round, in turn, so that a slow spell of the GPU falls on all of them alike; a row keeps the "
                        "median of its rounds (round_ms: each round's), and the rounds share one timing's budget "
                        "(default: the preset's, else 1)")
    p.add_argument("--round-order", choices=("run", "case"), default="run",
                   help="with --rounds: 'run' (default) takes round 1 of every case, then round 2 of every case, and "
                        "so on, so that the rounds of one row lie minutes apart and a slow spell of the host (seconds "
                        "long) moves one of them, which the median outvotes; 'case' takes a case's rounds back to "
                        "back, seconds apart")
    p.add_argument("--turn-order", choices=("fixed", "rotate"), default="fixed",
                   help="with --rounds: the order of a case's backends within a round. 'fixed' (default): the same in "
                        "every round; 'rotate': round r starts r - 1 places later (the reference still first in round "
                        "1), so that no backend always follows the same one. A GPU at its power limit sets its clock "
                        "from the work just before; a short timing that always follows a power-hungry kernel starts "
                        "at that kernel's clock")
    p.add_argument("--budget-s", type=_positive_float, default=1.0,
                   help="CPU: stop repeating a case once this many seconds are spent (after 3 runs; default 1)")
    p.add_argument("--max-call-s", type=_positive_float, default=None,
                   help="skip a case, before it runs, when its predicted time per call is longer than this many "
                        "seconds; the prediction scales the backend's time at the previous N (or, before its first "
                        f"N, one timed call at N={PROBE_N}) by the FLOP ratio (default: CPU 2, GPU 1)")
    p.add_argument("--threads", type=_non_negative_int, default=None,
                   help="CPU threads of torch and of NumPy's BLAS; 0 leaves the libraries' own defaults "
                        "(default on a CPU: 1, which keeps timings steady on a shared machine; on a GPU: 0)")
    p.add_argument("--autograd-thread", choices=("device", "calling"), default="device",
                   help="where autograd runs a timed backward (bwd, fwd+bwd): 'device' (PyTorch's default: on a "
                        "worker thread per CUDA device) or 'calling' (torch.autograd.set_multithreading_enabled(False): "
                        "on the thread that calls it, which spares a Python backward the hand-over to that thread; "
                        "every backend alike)")
    p.add_argument("--out", default=None, help="output folder (default bench_out/<device>-<UTC time>)")
    p.add_argument("--seed-config", action="store_true",
                   help="the seed documents' case: B=8 H=12 N=1024 D=64, float16 wherever a backend takes it")
    p.add_argument("--quick", action="store_true", help="tiny sweep (N=64,128, B=1, H=2, D=32) for a smoke test")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true",
                   help="list the backends and whether they run here, and the presets, then exit")
    return p


def resolve(args, parser, targets):
    """Fill the defaults for this device and check the options; returns a config dict."""
    named = presets.PRESETS.get(args.preset)
    device = args.device
    if device == "auto":
        device = named.device if named is not None else ("cuda" if _has_cuda() else "cpu")
    if device == "cuda" and not _has_cuda() and not args.dry_run:
        what = f"--preset {named.name}" if named is not None and args.device == "auto" else "--device cuda"
        parser.error(f"{what}: there is no CUDA GPU here (torch.cuda.is_available() is False); "
                     f"--device cpu runs it on the CPU, --dry-run lists its cases")
    if args.sweep and (named is None or not named.config_sweep):
        parser.error("--sweep: only with a preset that has a tile-config sweep ("
                     + ", ".join(n for n, pr in presets.PRESETS.items() if pr.config_sweep) + ")")
    defaults = dict(DEFAULTS[device])
    if args.quick and args.seed_config:
        parser.error("--quick and --seed-config cannot be combined")
    if named is not None and args.seed_config:
        parser.error("--preset and --seed-config cannot be combined")
    if named is not None:
        defaults.update(n=named.n, repeats=named.repeats, max_call_s=named.max_call_s, rounds=named.rounds)
        if args.quick:  # the preset's two smallest N
            defaults["n"] = ",".join(str(n) for n in parse_sizes(named.n)[:2])
    elif args.quick:
        defaults.update(DEFAULTS["quick"])
    if args.seed_config:
        defaults.update(DEFAULTS["seed"])
    cfg = {"device": device, "preset": args.preset}
    if named is not None and not (args.batch or args.heads or args.head_dim):
        shapes = [tuple(s) for s in named.shapes]
    else:
        first = named.shapes[0] if named is not None else (defaults["B"], defaults["H"], defaults["D"])
        shapes = [(args.batch or first[0], args.heads or first[1], args.head_dim or first[2])]
    cfg["shapes"] = shapes
    cfg["B"], cfg["H"], cfg["D"] = shapes[0]
    cfg["repeats"] = args.repeats or defaults["repeats"]
    cfg["budget_s"] = args.budget_s
    cfg["rounds"] = args.rounds or defaults.get("rounds", 1)
    cfg["round_order"] = args.round_order
    cfg["turn_order"] = args.turn_order
    cfg["max_call_s"] = args.max_call_s or defaults["max_call_s"]
    cfg["timer"] = named.timer if named is not None else "device"
    cfg["max_n"] = dict(named.max_n) if named is not None else {}
    cfg["autograd_thread"] = args.autograd_thread

    # sequence lengths
    if args.n is not None and (args.nq is not None or args.nk is not None):
        parser.error("--n sets Nq = Nk; use either --n or --nq/--nk")
    if args.nq is None and args.nk is None:
        ns = args.n or parse_sizes(defaults["n"])
        pairs = [(n, n) for n in ns]
    else:
        default = parse_sizes(defaults["n"])
        nq = args.nq or (args.nk if args.nk is not None else default)
        nk = args.nk or nq
        if len(nq) == 1:
            nq = nq * len(nk)
        if len(nk) == 1:
            nk = nk * len(nq)
        if len(nq) != len(nk):
            parser.error(f"--nq has {len(nq)} values and --nk has {len(nk)}: give the same number, or one of them a single value")
        pairs = list(zip(nq, nk))
    cfg["sizes"] = sorted(dict.fromkeys(pairs), key=lambda p: (p[0] * p[1], p))

    # backends
    by_name = {t.name: t for t in targets}
    groups = {"all": list(by_name), "anchors": [n for n, t in by_name.items() if t.is_anchor],
              "sdpa": [n for n in by_name if n in SDPA_KERNELS]}
    chosen = []
    backends = args.backends or (",".join(named.backends) if named is not None else "default")
    for token in [s.strip() for s in backends.split(",") if s.strip()]:
        if token == "default":
            chosen += [t.name for t in targets if t.unavailable_reason(device) is None
                       and not (device == "cpu" and t.slow_on_cpu)]
        elif token in groups:
            chosen += groups[token]
        elif token in by_name:
            chosen.append(token)
        else:
            parser.error(f"--backends: unknown backend {token!r}; expected names from "
                         f"{', '.join(by_name)} or a group (default, all, anchors, sdpa)")
    if not chosen:
        parser.error("--backends: no backend selected")
    cfg["backends"] = list(dict.fromkeys(chosen))
    reference = named.reference if named is not None else None
    cfg["reference"] = reference if reference in cfg["backends"] else None
    if cfg["reference"]:  # run first at each N and dtype, so that the others are compared with its output
        cfg["backends"].remove(reference)
        cfg["backends"].insert(0, reference)

    # dtypes, per backend
    prefs = DTYPE_PREFS[device]
    if args.seed_config:
        prefs = ("float16",) + tuple(d for d in prefs if d != "float16")
    text = args.dtype.strip()
    per_backend = {}
    if text == "auto" and named is not None:
        for name in cfg["backends"]:
            per_backend[name] = list(named.dtypes.get(name) or [prefs[0]])
    elif text == "auto":
        for name in cfg["backends"]:
            t = by_name[name]
            if not t.is_anchor:
                claimed = t.dtypes(device)
                pick = next((d for d in prefs if d in claimed), prefs[0])
                per_backend[name] = [pick]
        used = [d for d in prefs if any(d in v for v in per_backend.values())] or [prefs[0]]
        for name in cfg["backends"]:
            if by_name[name].is_anchor:
                claimed = by_name[name].dtypes(device)
                per_backend[name] = [d for d in used if d in claimed] or used
    else:
        dtypes = [d.strip() for d in text.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in ALL_DTYPES]
        if bad or not dtypes:
            parser.error(f"--dtype: unknown dtype {', '.join(bad) or repr(text)}; expected 'auto' or a comma-separated "
                         f"list of {', '.join(ALL_DTYPES)}")
        per_backend = {name: list(dict.fromkeys(dtypes)) for name in cfg["backends"]}
    cfg["dtypes"] = per_backend
    cfg["dtype_option"] = text
    if named is not None and args.mode is None and args.causal is None:
        combos = [tuple(c) for c in named.combos]
    else:
        default_mode = named.combos[0][0] if named is not None else "fwd"
        combos = [(m, c) for m in MODES[args.mode or default_mode] for c in CAUSAL[args.causal or "off"]]
    cfg["combos"] = combos
    cfg["modes"] = list(dict.fromkeys(m for m, _ in combos))
    cfg["causal"] = list(dict.fromkeys(c for _, c in combos))
    cfg["threads"] = args.threads if args.threads is not None else (1 if device == "cpu" else 0)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    cfg["out"] = args.out or os.path.join("bench_out", f"{args.preset or device}-{stamp}")
    return cfg


# ------------------------------------------------------------------------------------ output folder
def output_files(plots=True):
    """The names of the files a run writes into its output folder."""
    return (report.PARTIAL, "results.csv", "results.json", "table.txt", "report.md") + (report.PLOTS if plots else ())


def out_folder_problem(out, names):
    """None if ``out`` is (or can be made) a writable folder where each of ``names`` can be written as a file;
    else one line saying what is wrong. Creates the folder (as the run would)."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{out!r} is an existing file, not a folder"
    parent = path
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{out!r} lies inside {parent!r}, which is a file, not a folder"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"cannot create the folder {out!r}: {exc.strerror or exc}"
    for name in names:
        p = os.path.join(path, name)
        if os.path.isdir(p):
            return f"{os.path.join(out, name)!r} is a folder, but the run writes a file of that name there"
        if os.path.exists(p) and not os.access(p, os.W_OK):
            return f"{os.path.join(out, name)!r} exists and is not writable"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"the folder {out!r} is not writable: {exc.strerror or exc}"
    return None


# ------------------------------------------------------------------------------------ cases
def make_cases(cfg, by_name):
    """Every case, in the order of the tables: (mode, causal), shape, backend, dtype, then N ascending."""
    cases = []
    for mode, causal in cfg["combos"]:
        for B, H, D in cfg["shapes"]:
            for name in cfg["backends"]:
                for dtype in cfg["dtypes"][name]:
                    for Nq, Nk in cfg["sizes"]:
                        t = by_name[name]
                        cases.append(dict(backend=name, rung=t.rung, device=cfg["device"], dtype=dtype, mode=mode,
                                          causal=causal, B=B, H=H, Nq=Nq, Nk=Nk, D=D))
    return cases


def run_order(cases):
    """Indices of ``cases`` in the order they are run: by shape, N, dtype, mode, causal, then backend, so one
    set of inputs serves every backend, mode and causal at that N and dtype (drawing 4 x B*H*N*D normals at
    N=16384 takes seconds), the reference backend runs before the others at each (mode, causal), and each
    backend still meets its N values in ascending order (for the predicted-time skip)."""
    size_rank = {}
    for c in cases:
        size_rank.setdefault((c["Nq"], c["Nk"]), c["Nq"] * c["Nk"])
    rank = {"mode": {}, "backend": {}, "shape": {}}
    for c in cases:
        rank["mode"].setdefault(c["mode"], len(rank["mode"]))
        rank["backend"].setdefault(c["backend"], len(rank["backend"]))
        rank["shape"].setdefault((c["B"], c["H"], c["D"]), len(rank["shape"]))
    return sorted(range(len(cases)), key=lambda i: (
        rank["shape"][(cases[i]["B"], cases[i]["H"], cases[i]["D"])], size_rank[(cases[i]["Nq"], cases[i]["Nk"])],
        cases[i]["Nq"], cases[i]["dtype"], rank["mode"][cases[i]["mode"]], cases[i]["causal"],
        rank["backend"][cases[i]["backend"]]))


class InputCache:
    """make_inputs for the current (sizes, dtype): one draw per array kind, dropped when they change; also
    holds the reference backend's outputs at these inputs (``reference``/``set_reference``). torch inputs for a
    GPU are drawn on the GPU (make_inputs(draw='device')): with --round-order run every round draws them again."""

    def __init__(self):
        self.key, self.store = None, {}

    def get(self, case, kind):
        key = tuple(case[k] for k in ("device", "dtype", "B", "H", "Nq", "Nk", "D"))
        if key != self.key:
            self.clear()
            self.key = key
        if kind not in self.store:
            B, H, Nq, Nk, D = (case[k] for k in ("B", "H", "Nq", "Nk", "D"))
            draw = "device" if kind == "torch" and case["device"] == "cuda" else "host"  # seconds less at large N
            self.store[kind] = make_inputs(B, H, Nq, Nk, D, dtype=case["dtype"], kind=kind, device=case["device"],
                                           draw=draw)
        return self.store[kind]

    def clear(self):
        self.key, self.store = None, {}

    def reference(self, case):
        return self.store.get(("reference", case["mode"], case["causal"]))

    def set_reference(self, case, outputs):
        self.store[("reference", case["mode"], case["causal"])] = outputs


def _outputs(out, mode):
    """The arrays a case's call returns, to compare with the reference's: O (fwd), dQ, dK, dV (bwd), or O, dQ,
    dK, dV (fwd+bwd; a returned lse is left out, as SDPA returns none)."""
    if not isinstance(out, (tuple, list)):
        return [out]
    out = list(out)
    if mode == "fwd":
        return out[:1]
    if mode == "bwd":
        return out[-3:]
    return out[:1] + out[-3:]


def _kept(x):
    """A copy of an output kept for comparison: torch tensors stay on their device in float32 (at N = 16384
    a float64 copy on the host would take seconds), NumPy arrays become float64."""
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().float().clone()
    return np.asarray(x, dtype=np.float64)


def _max_abs_each(outputs, reference):
    """Max-abs difference of each output from the reference's (floats), or None where the shapes differ."""
    import numpy as np

    each = []
    for a, b in zip(outputs, reference):
        if tuple(a.shape) != tuple(b.shape):
            return None
        if hasattr(a, "detach") and hasattr(b, "detach"):
            each.append(float((a.detach().float() - b).abs().max().item()))
        else:
            a, b = (x.detach().double().cpu().numpy() if hasattr(x, "detach") else np.asarray(x, np.float64)
                    for x in (a, b))
            each.append(float(np.abs(a - b).max()))
    return each


def _is_oom(exc) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except Exception:
        pass
    # CuPy's OutOfMemoryError subclasses MemoryError; some allocators only say it in words
    return "out of memory" in str(exc).lower()


def _itemsize(dtype):
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]


def _cleanup(device, failed):
    if failed:  # an exception's traceback may have kept big arrays alive in reference cycles
        gc.collect()
    if device == "cuda":
        try:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


def _failure(exc, prefix=""):
    """The status and reason of a case that raised ``exc``."""
    if _is_oom(exc):
        status = "oom"
    elif isinstance(exc, (ImportError, NotImplementedError, TypeError, ValueError)):
        status = "unsupported"
    else:
        status = "error"
    return dict(status=status, reason=prefix + short_reason(exc))


def _size_label(Nq, Nk):
    return str(Nk) if Nq == Nk else f"{Nq}x{Nk}"


def probe_call(case, target):
    """Time one call of ``case`` shrunk to at most PROBE_N x PROBE_N (after an untimed warm-up call, which
    also compiles JIT kernels), the fastest of PROBE_CALLS: a later call can still do one-off work (a second call
    registers its C++ launch plan, and the process's first such call loads the extension: 0.31-0.39 s on an H200,
    against well under a millisecond after it; one probe that timed it skipped a case at N = 16384 as 1270 s
    long). Returns (flops, seconds, size label), or a status/reason dict if it failed."""
    device, dtype, mode, causal = case["device"], case["dtype"], case["mode"], case["causal"]
    B, H, D = case["B"], case["H"], case["D"]
    Nq, Nk = min(case["Nq"], PROBE_N), min(case["Nk"], PROBE_N)
    x = fn = out = None
    try:
        x = make_inputs(B, H, Nq, Nk, D, dtype=dtype, kind=target.array, device=device)
        with target.context():
            fn = target.prepare(x, causal, mode)
            out = fn()
            out = None
            sec = min(measure.time_once(fn, device=device) for _ in range(PROBE_CALLS))
        return attention_flops(B, H, Nq, Nk, D, causal=causal, mode=mode), sec, _size_label(Nq, Nk) + " (probe)"
    except Exception as exc:  # noqa: BLE001
        return _failure(exc, prefix=f"probe at N={_size_label(Nq, Nk)}: ")
    finally:
        del x, fn, out
        _cleanup(device, False)


def autograd_thread(cfg, target):
    """The context a case's calls run in for --autograd-thread: 'calling' turns autograd's multithreading off (the
    backward runs on the calling thread; thread-local, restored on exit) for torch backends; else nothing."""
    if cfg.get("autograd_thread", "device") == "calling" and target.array == "torch":
        import torch

        return torch.autograd.set_multithreading_enabled(False)
    return contextlib.nullcontext()


def run_case(case, target, cfg, history, inputs=None):
    """Measure one case; returns the row (a dict). Never raises for a backend's failure."""
    row = dict(case)
    row.update(status="ok", reason="", time_ms=math.nan, time_lo_ms=math.nan, time_hi_ms=math.nan, round_ms=None,
               spread_pct=math.nan, n_runs=None, timer="", gflop=math.nan, tflops=math.nan,
               mem_peak_mb=math.nan, mem_extra_mb=math.nan, mem_method="", speedup_vs_naive=math.nan,
               ref="", max_abs_vs_ref=math.nan)
    device, dtype, mode = case["device"], case["dtype"], case["mode"]
    B, H, Nq, Nk, D = (case[k] for k in ("B", "H", "Nq", "Nk", "D"))
    flops = attention_flops(B, H, Nq, Nk, D, causal=case["causal"], mode=mode)
    row["gflop"] = flops / 1e9

    reason = target.unavailable_reason(device) or target.case_reason(device, dtype, D, mode)
    if reason:
        row.update(status="unsupported", reason=reason)
        return row
    max_n = cfg.get("max_n", {}).get(case["backend"])
    if max_n is not None and max(Nq, Nk) > max_n:
        row.update(status="skipped", reason=f"not run: {cfg.get('preset') or 'this run'} times {case['backend']} "
                                            f"at N <= {max_n} only")
        return row
    # A host allocation that does not fit may bring in the OOM killer rather than a MemoryError. make_inputs
    # draws q, k, v, dO on the host in float64 (then casts; torch inputs for a GPU are drawn there, InputCache, so
    # the bound is loose); on the CPU, naive-style backends add the (Nq, Nk) score matrices.
    need = 4 * B * H * max(Nq, Nk) * D * (8 + _itemsize(dtype))
    quadratic = device == "cpu" and case["backend"] in QUADRATIC_MEMORY
    if quadratic:
        need += B * H * Nq * Nk * max(4, _itemsize(dtype)) * (6 if mode != "fwd" else 3)
    avail = measure.available_memory_bytes()
    if avail is not None and need > avail / 2:
        row.update(status="oom", reason=(
            f"not run: estimated {need / 2**30:.1f} GiB of host memory (inputs"
            f"{' and (Nq, Nk) score matrices' if quadratic else ''}), more than half of the "
            f"{avail / 2**30:.1f} GiB available (the OOM killer could end the sweep)"))
        return row

    # the predicted time per call: from this backend's previous N, or from one small timed call
    group = (case["backend"], dtype, mode, case["causal"], B, H, D)
    prev = history.get(group)
    if prev is None and flops > PROBE_MIN_RATIO * attention_flops(B, H, min(Nq, PROBE_N), min(Nk, PROBE_N), D,
                                                                  causal=case["causal"], mode=mode):
        probed = probe_call(case, target)
        if isinstance(probed, dict):  # the probe itself failed: so would the case
            row.update(probed)
            return row
        prev = history[group] = probed
    if prev is not None:
        flops0, sec0, n0 = prev
        predicted = sec0 * flops / flops0
        if predicted > cfg["max_call_s"]:
            row.update(status="skipped", reason=(
                f"not run: predicted {predicted:.3g} s per call from {sec0:.3g} s at N={n0} x the FLOP ratio "
                f"{flops / flops0:.3g} (> --max-call-s {cfg['max_call_s']:g})"))
            return row

    x = fn = out = None
    try:
        if inputs is None:
            x = make_inputs(B, H, Nq, Nk, D, dtype=dtype, kind=target.array, device=device)
        else:
            x = inputs.get(case, target.array)
        with target.context(), autograd_thread(cfg, target):
            fn = target.prepare(x, case["causal"], mode)
            out = fn()  # warm-up (and compilation for JIT backends)
            if measure.has_nan(out):
                row.update(status="error", reason="the output holds NaN")
                return row
            if cfg.get("reference") and inputs is not None:
                compare(row, case, out, cfg["reference"], inputs)
            del out
            out = None
            peak, extra, method = measure.peak_memory(fn, device=device, array=target.array)
            row.update(mem_peak_mb=peak / 2**20, mem_extra_mb=extra / 2**20, mem_method=method)
            med, lo, hi, n, timer = _time(fn, cfg, device)
        row.update(time_ms=med, time_lo_ms=lo, time_hi_ms=hi, n_runs=n, timer=timer, round_ms=[med])
        settle_rounds(row)
        history[group] = (flops, med * 1e-3, _size_label(Nq, Nk))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, and the sweep goes on
        row.update(_failure(exc))
    finally:
        del x, fn, out
        _cleanup(device, row["status"] != "ok")
    return row


def _time(fn, cfg, device):
    """One timing of a prepared call, a share of the case's budget when the case is timed in rounds."""
    return measure.time_call(fn, device=device, timer=cfg.get("timer", "device"), repeats=cfg["repeats"],
                             budget_s=cfg["budget_s"], turns=cfg.get("rounds", 1))


def time_again(row, case, target, cfg, inputs):
    """One more round of a case that ran (--rounds): the call prepared again on the same inputs and timed as
    in run_case; the row gains this round's median (``round_ms``) and widens its low and high to this round's.
    A failure in a later round makes the row an error, as a failure in the first would."""
    x = fn = None
    try:
        x = inputs.get(case, target.array)
        with target.context(), autograd_thread(cfg, target):
            fn = target.prepare(x, case["causal"], case["mode"])
            med, lo, hi, _, _ = _time(fn, cfg, case["device"])
        row["round_ms"].append(med)
        row.update(time_lo_ms=min(row["time_lo_ms"], lo), time_hi_ms=max(row["time_hi_ms"], hi))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, and the sweep goes on
        row.update(_failure(exc, prefix=f"round {len(row['round_ms']) + 1}: "), time_ms=math.nan, tflops=math.nan,
                   spread_pct=math.nan)
    finally:
        del x, fn
        _cleanup(case["device"], row["status"] != "ok")


# how the rounds of a row were taken (--round-order), as the timer and the summaries name it
ROUND_ORDER_TEXT = {"run": "one per pass over the whole run", "case": "taken in turn, back to back"}
_ROUNDS_SUFFIX = re.compile(r"; the median of \d+ rounds.*$")


def settle_rounds(row, order="run"):
    """time_ms = the median of the row's rounds so far (round_ms), and the columns that follow from it; the timer
    names the rounds where there are several, and how they were taken (``order``: ROUND_ORDER_TEXT)."""
    rounds = row["round_ms"]
    med = statistics.median(rounds)
    lo, hi = row["time_lo_ms"], row["time_hi_ms"]
    row.update(time_ms=med, spread_pct=100.0 * (hi - lo) / med if med > 0 else math.nan,
               tflops=row["gflop"] * 1e9 / (med * 1e-3) / 1e12 if med > 0 else math.nan)
    row["timer"] = _ROUNDS_SUFFIX.sub("", row["timer"])
    if len(rounds) > 1:
        row["timer"] += f"; the median of {len(rounds)} rounds, {ROUND_ORDER_TEXT[order]}"


def _jsonl(row):
    """One line of cases.jsonl: the row's columns."""
    return json.dumps(report.clean({k: row.get(k) for k in report.COLUMNS}), allow_nan=False) + "\n"


def _rewrite(partial, rows):
    """cases.jsonl again, one line per case with the rounds it has so far (--round-order run: a row gains its
    later rounds long after it was first written), so that a run cut short keeps every round it took."""
    partial.seek(0)
    partial.truncate()
    partial.writelines(_jsonl(row) for row in rows)
    partial.flush()


def turns(order, cases):
    """``order`` (run_order's) cut into runs of consecutive cases that differ in the backend alone: the cases
    timed in turn, once a round, under --rounds."""
    key = lambda c: tuple(c[k] for k in ("device", "dtype", "mode", "causal", "B", "H", "Nq", "Nk", "D"))  # noqa: E731
    runs = []
    for i in order:
        if runs and key(cases[runs[-1][-1]]) == key(cases[i]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def rotated(turn, r):
    """The cases of one turn in round ``r`` under --turn-order rotate: r - 1 places later (round 1 as given)."""
    k = (r - 1) % len(turn) if turn else 0
    return turn[k:] + turn[:k]


def compare(row, case, out, reference, inputs):
    """Keep the reference backend's outputs at these inputs; for any other backend, record in ``row`` the
    max-abs difference of its outputs from them (``max_abs_vs_ref``, the largest; ``max_abs_each``, per
    output, in memory only for the presets' summaries)."""
    outputs = _outputs(out, case["mode"])
    if case["backend"] == reference:
        inputs.set_reference(case, [_kept(o) for o in outputs])
        return
    ref = inputs.reference(case)
    if ref is None or len(ref) != len(outputs):
        return
    each = _max_abs_each(outputs, ref)
    if each:
        row.update(ref=reference, max_abs_vs_ref=max(each), max_abs_each=each)


def add_speedups(rows):
    """speedup_vs_naive = naive-torch's median time / this row's, same device/dtype/mode/causal/sizes."""
    naive = {report.case_key(r): r["time_ms"] for r in rows if r["backend"] == NAIVE and r["status"] == "ok"}
    for r in rows:
        t0 = naive.get(report.case_key(r))
        if r["status"] == "ok" and t0 is not None and r["time_ms"] > 0:
            r["speedup_vs_naive"] = t0 / r["time_ms"]


# ------------------------------------------------------------------------------------ main
def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    targets = build_targets()
    by_name = {t.name: t for t in targets}
    if args.list:
        device = "cuda" if (args.device == "cuda" or (args.device == "auto" and _has_cuda())) else "cpu"
        for t in targets:
            why = t.unavailable_reason(device)
            note = " (excluded from the CPU default: slow under the interpreter)" if device == "cpu" and t.slow_on_cpu and not why else ""
            print(f"{t.name:<15} {t.rung:<7} {'runs here' + note if why is None else 'unavailable: ' + why}")
        print("\npresets (--preset NAME; --dry-run lists a preset's cases):")
        for name, pr in presets.PRESETS.items():
            print(f"{name:<15} {pr.description}")
        return 0
    cfg = resolve(args, parser, targets)
    if args.dry_run:
        return dry_run(cfg, by_name)
    problem = out_folder_problem(cfg["out"], output_files(plots=not args.no_plots))
    if problem:  # one line, as argparse's own errors end, before anything is run
        parser.exit(2, f"{parser.prog}: error: --out: {problem}\n")
    saved = measure.thread_info()
    if cfg["threads"]:
        measure.set_threads(cfg["threads"])
    try:
        return _run(cfg, args, argv, targets, by_name)
    finally:  # main() may run inside another program (the tests): give it its thread counts back
        if cfg["threads"]:
            measure.restore_threads(saved)


def dry_run(cfg, by_name):
    """Print the resolved configuration and every case, with why a case would not run where that is known
    before running it (the backend is unavailable here, does not take the case, or the preset caps its N)."""
    cases = make_cases(cfg, by_name)
    shapes = report.shapes_text(cfg)
    rounds = f" in {cfg['rounds']} rounds, {ROUND_ORDER_TEXT[cfg.get('round_order', 'run')]}" if cfg["rounds"] > 1 else ""
    print(f"{cfg.get('preset') or 'sweep'} on {cfg['device']}: {len(cases)} cases; {shapes}; N "
          f"{', '.join(_size_label(*p) for p in cfg['sizes'])}; (mode, causal) "
          f"{', '.join(m + (' causal' if c else '') for m, c in cfg['combos'])}; timer {cfg['timer']}"
          f"{rounds}; "
          f"reference {cfg['reference'] or 'none'}; output {cfg['out']}")
    for c in cases:
        t = by_name[c["backend"]]
        why = t.unavailable_reason(c["device"]) or t.case_reason(c["device"], c["dtype"], c["D"], c["mode"])
        cap = cfg["max_n"].get(c["backend"])
        if not why and cap is not None and max(c["Nq"], c["Nk"]) > cap:
            why = f"skipped: N > {cap}"
        print(f"  {c['backend']:<13} {c['dtype']:<8} {c['mode']:<7} {'causal' if c['causal'] else 'full':<6} "
              f"B={c['B']} H={c['H']} D={c['D']} N={_size_label(c['Nq'], c['Nk'])}" + (f"  ({why})" if why else ""))
    return 0


def _run(cfg, args, argv, targets, by_name):
    t_start = time.perf_counter()
    cases = make_cases(cfg, by_name)
    os.makedirs(cfg["out"], exist_ok=True)

    availability = []
    for t in targets:
        why = t.unavailable_reason(cfg["device"])
        note = ("left out of the CPU default: slow under the Triton interpreter (name it in --backends to run it)"
                if cfg["device"] == "cpu" and t.slow_on_cpu and why is None and t.name not in cfg["backends"] else "")
        availability.append(dict(name=t.name, rung=t.rung, description=t.description, available=why is None,
                                 reason=why or "", selected=t.name in cfg["backends"], note=note))
    missing = [a for a in availability if not a["available"]]
    shapes = report.shapes_text(cfg)
    print(f"benchmark{' ' + cfg['preset'] if cfg.get('preset') else ''} on {cfg['device']}: {len(cases)} cases, {shapes}, "
          f"backends {', '.join(cfg['backends'])}; output in {cfg['out']}", file=sys.stderr)
    for a in missing:
        print(f"  unavailable here: {a['name']}: {a['reason']}", file=sys.stderr)

    named = presets.PRESETS.get(cfg.get("preset"))
    sweep = None
    if args.sweep:
        sweep = presets.config_sweep(named.config_sweep, cfg["shapes"], cfg["device"],
                                     log=lambda text: print(text, file=sys.stderr, flush=True))
    matmul_peak = {}
    if cfg["device"] == "cuda":
        used = sorted({d for v in cfg["dtypes"].values() for d in v})
        for d in used:
            try:
                matmul_peak[d] = measure.matmul_peak_tflops(d)
                if d == "float32":
                    matmul_peak["float32 (tf32)"] = measure.matmul_peak_tflops(d, tf32=True)
            except Exception as exc:  # noqa: BLE001
                print(f"  matmul peak in {d} not measured: {short_reason(exc)}", file=sys.stderr)

    try:
        from tqdm.auto import tqdm
    except ImportError:  # no progress bar, but the run goes on
        tqdm = None
    rows, history, inputs = [None] * len(cases), {}, InputCache()
    # each finished case is appended here at once, so a run that is killed (a time limit) keeps what it measured;
    # python -m benchmarks.replot FOLDER builds the files from it
    partial = open(os.path.join(cfg["out"], report.PARTIAL), "w")
    n_rounds = cfg["rounds"]
    bar = tqdm(total=len(cases) * n_rounds, unit="timing", desc="benchmark", file=sys.stderr, dynamic_ncols=True,
               disable=args.no_progress) if tqdm else None

    def step(i, what):
        case = cases[i]
        if bar is not None:
            bar.set_postfix_str(f"{case['backend']} {case['dtype']} {case['mode']}{' causal' if case['causal'] else ''} "
                                f"Nq={case['Nq']} Nk={case['Nk']}{what}", refresh=True)

    order = cfg.get("round_order", "run")

    def again(turn, r):  # round r of the cases of one turn that are still ok
        for i in rotated(turn, r if cfg.get("turn_order") == "rotate" else 1):
            if rows[i]["status"] == "ok":
                step(i, f" (round {r} of {n_rounds})")
                time_again(rows[i], cases[i], by_name[cases[i]["backend"]], cfg, inputs)
                if rows[i]["status"] == "ok":
                    settle_rounds(rows[i], order)
            if bar is not None:
                bar.update(1)

    all_turns = turns(run_order(cases), cases)
    for turn in all_turns:  # round 1: the backends of one case in turn (the memory pass and the reference too)
        for i in turn:
            step(i, f" (round 1 of {n_rounds})" if n_rounds > 1 else "")
            rows[i] = run_case(cases[i], by_name[cases[i]["backend"]], cfg, history, inputs)
            if bar is not None:
                bar.update(1)
        if order == "case":  # the case's later rounds at once, back to back
            for r in range(2, n_rounds + 1):
                again(turn, r)
        for i in turn:
            partial.write(_jsonl(rows[i]))
        partial.flush()
    if order == "run":  # the later rounds, each a pass over the whole run in the same order; the inputs drawn again
        for r in range(2, n_rounds + 1):
            inputs.clear()
            for turn in all_turns:
                again(turn, r)
                _rewrite(partial, [rows[i] for t in all_turns for i in t if rows[i] is not None])
    inputs.clear()
    partial.close()
    if bar is not None:
        bar.close()
    add_speedups(rows)
    wall = time.perf_counter() - t_start

    meta = report.environment(cfg["device"], argv if argv is not None else sys.argv[1:])
    meta["wall_s"] = wall
    meta["rounds"] = n_rounds
    meta["round_order"] = order
    meta["turn_order"] = cfg.get("turn_order", "fixed")
    meta.update(measure.thread_info())
    config = {k: v for k, v in cfg.items() if k != "sizes"}
    config["sizes"] = [list(p) for p in cfg["sizes"]]
    table = report.text_table(rows, cfg)
    print(table)
    extra = {"config_sweep": sweep} if sweep is not None else {}
    paths = report.write_all(cfg["out"], rows, meta=meta, config=config, backends=availability,
                             matmul_peak=matmul_peak, table=table, plots=not args.no_plots, extra=extra)
    if named is not None:
        paths += presets.write_summary(cfg["out"], named, rows, dict(meta=meta, config_sweep=sweep))
    print(f"wall time {wall:.1f} s; wrote {', '.join(os.path.basename(p) for p in paths)} to {cfg['out']}")
    return 0
