#!/usr/bin/env python
"""Time the Python a planned public call runs before its C++ plan: the key and its lookup, here and at a revision.

    PYTHONPATH=. python tools/public_key_probe.py --against 8f57128      # any machine; no GPU needed

A repeated ``flash_attn_cuda`` / ``flash_attn_triton`` call with a C++ launch plan runs, in Python, only
``launch_plans.public_forward_key`` and a dict lookup before the one C++ call (``launch_plans.py``). That Python is
host time on every call, and it does not need a GPU: here plans are forced on (``ENABLED``, a stand-in extension)
and the key of a B=H=1 N=64 D=64 fp16 forward is made and looked up in a loop, for this checkout's
``launch_plans.py`` and for the one at --against (read with ``git show``), in alternating rounds; each round keeps
the best of 3 timeit repeats, and the medians are printed. The C++ side (allocations, tensor maps, the launch) is
not in it: the launch-overhead preset times the whole call on a GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import timeit


def load_revision(rev: str):
    """flash_attention_cuda/launch_plans.py as it was at ``rev``, imported as a module of the package."""
    text = subprocess.run(["git", "show", f"{rev}:flash_attention_cuda/launch_plans.py"], capture_output=True,
                          text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    name = "flash_attention_cuda._launch_plans_at_" + "".join(c if c.isalnum() else "_" for c in rev)
    spec = importlib.util.spec_from_file_location(name, f.name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def lookup_loop(mod, q, k, v):
    """A function doing what a planned call does before C++: the key, then PUBLIC.get (the key must hit)."""
    args = (False, None, "wgmma", False, (-1, -1), 0.0, None)
    mod.ENABLED, mod._EXT = True, object()  # plans on, with a stand-in for the built extension
    key = mod.public_forward_key(q, k, v, *args)
    if key is None:
        raise SystemExit(f"public_key_probe: {mod.__name__} made no key for a plain call")
    mod.PUBLIC[key] = 1

    def call():
        pk = mod.public_forward_key(q, k, v, *args)
        return mod.PUBLIC.get(pk) if pk is not None else None
    if call() != 1:
        raise SystemExit(f"public_key_probe: {mod.__name__}'s key did not find its entry")
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="a git revision to time beside this checkout")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=100_000, help="calls per timeit repeat")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.number < 1:
        ap.error(f"--rounds and --number must be at least 1, got {args.rounds} and {args.number}")
    import torch

    from flash_attention_cuda import launch_plans, runtime

    runtime.DRIVER_LAUNCH = True  # as on a GPU with the driver's launch (enabled() reads it)
    q = torch.randn(1, 1, 64, 64, dtype=torch.float16)
    k, v = q.clone(), q.clone()
    calls = {"this checkout": lookup_loop(launch_plans, q, k, v)}
    if args.against:
        calls[f"at {args.against}"] = lookup_loop(load_revision(args.against), q, k, v)
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            times[name].append(min(timeit.repeat(fn, number=args.number, repeat=3)) / args.number * 1e6)
    print(f"public call's key + lookup, microseconds per call (median of {args.rounds} rounds, each the best of 3 "
          f"repeats of {args.number} calls; torch {torch.__version__}, Python {sys.version.split()[0]})")
    for name, xs in times.items():
        print(f"  {name:20s} {statistics.median(xs):6.2f}   rounds: {' '.join(f'{x:.2f}' for x in xs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
