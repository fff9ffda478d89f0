#!/usr/bin/env python
"""Run one family of tests/test_adversarial.py's cases, more of them than the test takes, on chosen backends.

    PYTHONPATH=. python tools/adversarial_family.py --family nonfinite --cases 36 --backends cuda-
    PYTHONPATH=. python tools/adversarial_family.py --family scale --cases 52 --backends triton,cuda-mma

Each case runs in a worker subprocess as in the test (a crash counts as one); prints the per-backend table and
every case that gave a wrong answer or crashed; exit status 1 if any did. --backends: names or name prefixes,
comma-separated (default: every backend that runs here).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import test_adversarial as T

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=T.FAMILIES, required=True)
    ap.add_argument("--cases", type=int, default=36, help="case numbers 0 .. CASES - 1 (default 36)")
    ap.add_argument("--backends", default="", help="names or prefixes, comma-separated")
    args = ap.parse_args(argv)
    wanted = [w for w in args.backends.split(",") if w]
    pairs = [(b.name, d) for b, d in T.backends_here() if not wanted or any(b.name.startswith(w) for w in wanted)]
    if not pairs:
        ap.error(f"no backend here matches {args.backends!r}")
    results = T.run_jobs([(name, device, args.family, i) for name, device in pairs for i in range(args.cases)])
    print(T.table(results, key="backend"))
    bad = [r for r in results if r["outcome"] in ("wrong", "crash")]
    for r in bad:
        print(f"  {r['outcome'].upper()}: {r['backend']} {r['device']} {r['family']} #{r['i']} {r['label']}: {r['detail']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
