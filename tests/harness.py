"""The shared test harness: cases, inputs, tolerance policy and error bookkeeping.

Tolerance policy (as in flash-attn's own tests): a backend's max-abs error against the float64
reference must be at most 2x the max-abs error of naive attention (``attention_naive``: S, softmax,
PV all in the same dtype, on the same device, in the same matmul precision mode) plus a small floor.
Inputs are fresh random normals every time, never zeros.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from flash_attention_py import attention_naive, attention_reference, attention_reference_grads, make_inputs
from flash_attention_py.registry import BACKENDS

# (B, H, Nq, Nk, D, layout). 'core' cases are the short list used for slow backends (interpreter).
CASES = [
    dict(B=1, H=1, Nq=1, Nk=1, D=16, core=True),
    dict(B=2, H=3, Nq=17, Nk=17, D=40, core=True),
    dict(B=1, H=2, Nq=64, Nk=64, D=64, core=True),
    dict(B=2, H=2, Nq=100, Nk=100, D=80, core=False),
    dict(B=1, H=1, Nq=257, Nk=257, D=128, core=True),
    dict(B=2, H=1, Nq=100, Nk=37, D=64, core=True),  # Nq > Nk: causal rows that see no key
    dict(B=1, H=2, Nq=37, Nk=100, D=16, core=True),  # Nq < Nk
    dict(B=1, H=1, Nq=1, Nk=257, D=64, core=False),  # one query (decoding)
    dict(B=1, H=1, Nq=17, Nk=130, D=96, core=False),
    dict(B=1, H=1, Nq=64, Nk=64, D=256, core=False),
    dict(B=1, H=1, Nq=1000, Nk=1000, D=32, core=False),
    dict(B=2, H=2, Nq=64, Nk=48, D=64, layout="bnhd", core=True),  # non-contiguous inputs
]

# floors on max-abs errors, per dtype (the rounding of one output value, roughly)
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
LSE_FLOOR = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-4, "bfloat16": 2e-4}


def case_id(c) -> str:
    lay = "-bnhd" if c.get("layout") == "bnhd" else ""
    return f"B{c['B']}H{c['H']}-q{c['Nq']}k{c['Nk']}-d{c['D']}{lay}"


def devices_here():
    """'cpu' always; 'cuda' when a GPU is visible."""
    try:
        import torch

        return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    except ImportError:
        return ["cpu"]


def harness_params(*, need_backward=False):
    """pytest params over (backend, device, dtype, case, causal), only combinations the backend claims."""
    params = []
    for b in BACKENDS:
        if need_backward and not b.backward:
            continue
        for device, dtypes in b.dtypes.items():
            cases = [c for c in CASES if c["core"]] if (device == "cpu" and b.slow_on_cpu) else CASES
            for dtype in dtypes:
                for c in cases:
                    if not b.supports_head_dim(c["D"]):
                        continue
                    for causal in (False, True):
                        pid = f"{b.name}-{device}-{dtype}-{case_id(c)}-{'causal' if causal else 'full'}"
                        params.append(pytest.param(b, device, dtype, c, causal, id=pid))
    return params


def skip_unless_available(backend, device):
    reason = backend.unavailable_reason(device)
    if reason is not None:
        pytest.skip(reason)


def inputs_for(backend, device, dtype, case, *, seed=None):
    return make_inputs(case["B"], case["H"], case["Nq"], case["Nk"], case["D"], dtype=dtype, kind=backend.array,
                       device=device, layout=case.get("layout", "bhnd"), seed=seed)


# ------------------------------------------------------------------ error bookkeeping
_ERRORS = defaultdict(lambda: dict(max_abs=0.0, rel_norm=0.0, naive_max_abs=0.0, cases=0))


def to_f64_numpy(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        import torch

        x = x.to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def errors(out, ref):
    """(max-abs, relative-norm) of out against ref, both as float64 NumPy; -inf entries must match."""
    out, ref = to_f64_numpy(out), to_f64_numpy(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    assert not np.isnan(out).any(), "NaN in the output"
    inf_ref = np.isinf(ref)
    assert np.array_equal(np.isinf(out), inf_ref), "infinite entries differ from the reference"
    if inf_ref.any():
        assert np.array_equal(out[inf_ref], ref[inf_ref]), "signs of infinite entries differ"
        out, ref = np.where(inf_ref, 0.0, out), np.where(inf_ref, 0.0, ref)
    diff = np.abs(out - ref)
    max_abs = float(diff.max()) if diff.size else 0.0
    norm = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(out - ref) / norm) if norm > 0 else max_abs
    return max_abs, rel


def record(backend, device, dtype, quantity, max_abs, rel, naive_max_abs):
    e = _ERRORS[(backend, device, dtype, quantity)]
    e["max_abs"] = max(e["max_abs"], max_abs)
    e["rel_norm"] = max(e["rel_norm"], rel)
    e["naive_max_abs"] = max(e["naive_max_abs"], naive_max_abs)
    e["cases"] += 1


def error_table():
    order = {"o": 0, "lse": 1, "dq": 2, "dk": 3, "dv": 4}
    rows = [dict(backend=b, device=d, dtype=t, quantity=q, **v) for (b, d, t, q), v in _ERRORS.items()]
    return sorted(rows, key=lambda r: (r["backend"], r["device"], r["dtype"], order.get(r["quantity"], 9)))


def check_close(name, out, ref, naive, *, backend, device, dtype, floor):
    """Assert the tolerance policy for one quantity and record its errors."""
    max_abs, rel = errors(out, ref)
    naive_abs, _ = errors(naive, ref) if naive is not None else (0.0, 0.0)
    record(backend, device, dtype, name, max_abs, rel, naive_abs)
    bound = 2.0 * naive_abs + floor
    assert max_abs <= bound, (
        f"{backend} {name}: max-abs error {max_abs:.3e} (rel-norm {rel:.3e}) exceeds "
        f"2 x naive {dtype} error {naive_abs:.3e} + floor {floor:.1e} = {bound:.3e}"
    )


def naive_same_precision(backend, device, q, k, v, *, causal, do=None):
    """Naive attention in the backend's dtype and precision mode: the tolerance yardstick."""
    import torch

    def as_torch(x):
        return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))

    q, k, v = (as_torch(x).detach().to(device) for x in (q, k, v))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = device in backend.tf32_on
    try:
        if do is None:
            return attention_naive(q, k, v, causal=causal, return_lse=True)
        q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
        o = attention_naive(q, k, v, causal=causal)
        o.backward(as_torch(do).to(device))
        return q.grad, k.grad, v.grad
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


__all__ = [
    "CASES", "FLOOR", "LSE_FLOOR", "harness_params", "skip_unless_available", "inputs_for", "check_close",
    "naive_same_precision", "attention_reference", "attention_reference_grads", "errors", "math",
]
