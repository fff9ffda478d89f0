"""Test set-up shared by every test file.

* Without a CUDA GPU, Triton kernels run under its interpreter: TRITON_INTERPRET=1 must be set
  before any module with an ``@triton.jit`` kernel is imported, so it is set here, first.
* Every accuracy check records its errors; the summary at the end prints, per backend, device,
  dtype and quantity, the worst max-abs and relative-norm error against the float64 reference.
"""
import os

os.environ.setdefault("MPLBACKEND", "Agg")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import harness  # noqa: E402  (tests/harness.py)


def pytest_terminal_summary(terminalreporter):
    rows = harness.error_table()
    if not rows:
        return
    terminalreporter.write_sep("=", "accuracy against the float64 reference (worst case per row)")
    head = f"{'backend':<12} {'device':<6} {'dtype':<9} {'quantity':<5} {'max-abs':>10} {'rel-norm':>10} {'naive max-abs':>13} {'cases':>6}"
    terminalreporter.write_line(head)
    for r in rows:
        terminalreporter.write_line(
            f"{r['backend']:<12} {r['device']:<6} {r['dtype']:<9} {r['quantity']:<5} {r['max_abs']:>10.2e} "
            f"{r['rel_norm']:>10.2e} {r['naive_max_abs']:>13.2e} {r['cases']:>6}"
        )
    path = os.environ.get("FA_ERROR_REPORT")
    if path:
        import json

        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
