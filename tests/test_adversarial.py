"""Adversarial inputs for every backend that runs here: a clear error or the reference's answer, nothing else.

Five families of generated inputs (a fixed seed, so every run tries the same cases):

* ``shapes``    ranks 2 to 6, zero-sized and mismatched dims, odd N and D (1, 3, 17, 65, 300, ...);
* ``dtypes``    every float dtype, big-endian NumPy floats, ints, bools, complex, long double, float8, mixed;
* ``layouts``   negative strides, Fortran order, broadcast views (stride 0), conj/neg views, large strides;
* ``nonfinite`` NaN, +inf or -inf in one entry of q, k or v (forward and gradients);
* ``scale``     extreme and odd ``softmax_scale`` values: 0, -0.0, denormals, 1e30 .. 1e300, 10**400, NaN,
  strings, bools, 0-d arrays and tensors, 1-element arrays, complex numbers.

For every case exactly one of two outcomes is accepted:

1. a ``ValueError``/``TypeError`` whose message names the function and the offending argument; or
2. agreement with the float64 reference (``attention_reference``, ``attention_reference_grads``), the
   non-finite pattern included: NaN exactly where the reference has NaN, +-inf exactly where it has
   +-inf (after rounding the reference to the output's dtype), and the finite entries within the
   harness's tolerance policy (2x the error of naive attention in the same dtype, plus the dtype's floor,
   plus a relative term of 8 ulps of the compute dtype for the huge values an extreme scale gives).

Anything else is counted ``wrong`` (a silently wrong answer, or an exception of another type, or an error
message that does not say which function and argument) or ``crash`` (the process died). The cases run
in a worker subprocess that streams one result per line, so a segmentation fault in a kernel is counted
as a crash of that case and the worker is restarted for the rest; it never takes pytest down.

At the end the test prints a table of counts per family: tried, clear error, correct, wrong, crash.
``test_adversarial_sample`` runs a small sample (fast); ``test_adversarial_large`` (slow) a larger one.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

SEED = 20261123
FAMILIES = ("shapes", "dtypes", "layouts", "nonfinite", "scale")
OUTCOMES = ("error", "correct", "wrong", "crash")
EXPECTED_ERRORS = (ValueError, TypeError)


# ---------------------------------------------------------------------------------------------- backends
def backends_here():
    """(backend, device) pairs that can run on this machine (the CPU always; CUDA when there is a GPU)."""
    from flash_attention_py.registry import BACKENDS
    from flash_attention_py.testing import devices_here

    out = []
    for device in devices_here():
        for b in BACKENDS:
            if b.unavailable_reason(device) is None and (device == "cpu" or b.array == "torch"):
                out.append((b, device))
    return out


def fn_name(backend) -> str:
    """The public function's name: the prefix every error message of the backend starts with."""
    return backend.load().__name__


# ---------------------------------------------------------------------------------------------- case builders
class Case:
    """One generated call: q, k, v (NumPy, converted to the backend's array type at run time), kwargs."""

    def __init__(self, family, label, q, k, v, *, causal=False, scale=None, words=("q", "k", "v", "D", "dtype"),
                 torch_dtype=None, view=None, grads=False):
        self.family, self.label = family, label
        self.q, self.k, self.v = q, k, v
        self.causal, self.scale = causal, scale
        self.words = words  # one of these must appear in an error message (the argument at fault)
        self.torch_dtype = torch_dtype  # a torch-only dtype name ('bfloat16', 'float8_e4m3fn', ...)
        self.view = view  # a torch-side transform: 'conj', 'neg', 'neg_v', 'expand', 'fortran', 'stride'
        self.grads = grads  # also compare the gradients


def _normal(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _sizes(rng, *, small=False):
    B, H = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    Nq = int(rng.choice([1, 2, 5, 17, 33] if small else [1, 2, 5, 17, 33, 40]))
    Nk = int(rng.choice([1, 3, 16, 17, 31] if small else [1, 3, 16, 17, 31, 40]))
    D = int(rng.choice([1, 3, 8, 16, 17, 32, 64]))
    return B, H, Nq, Nk, D


def case_shapes(rng, i):
    B, H, Nq, Nk, D = _sizes(rng)
    sq, sk, sv = [B, H, Nq, D], [B, H, Nk, D], [B, H, Nk, D]
    kind = ["valid", "valid", "big-d", "rank", "zero", "mismatch-d", "mismatch-b", "mismatch-v", "odd-n"][i % 9]
    if kind == "big-d":
        sq[3] = sk[3] = sv[3] = int(rng.choice([65, 130, 300]))
        sq[2], sk[2], sv[2] = 3, 5, 5
    elif kind == "rank":
        r = int(rng.choice([2, 3, 5, 6]))
        sq = (sq + [2, 2])[:r] if r > 4 else sq[4 - r:]
        if rng.random() < 0.5:
            sk, sv = sq[:-2] + [Nk, sq[-1]], sq[:-2] + [Nk, sq[-1]]
    elif kind == "zero":
        which = int(rng.integers(0, 5))
        sq[which if which < 4 else 2] = 0
        if which in (0, 1, 3):
            sk[which] = sv[which] = 0
        elif which == 4:
            sk[2] = sv[2] = 0
    elif kind == "mismatch-d":
        sk[3] = sv[3] = D + 1
    elif kind == "mismatch-b":
        sk[0] = sv[0] = B + 1
    elif kind == "mismatch-v":
        sv[2] = Nk + 1
    elif kind == "odd-n":
        sq[2], sk[2], sv[2] = 63, 65, 65
    q, k, v = (_normal(rng, tuple(s)) for s in (sq, sk, sv))
    return Case("shapes", f"{kind} q{tuple(sq)} k{tuple(sk)} v{tuple(sv)}", q, k, v, causal=bool(rng.random() < 0.5),
                grads=kind in ("valid", "odd-n") and i % 2 == 0)


_NP_DTYPES = ["float16", "float32", "float64", ">f2", ">f4", ">f8", "int32", "bool", "complex64", "longdouble"]
_TORCH_DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "bool", "complex64", "float8_e4m3fn",
                 "float8_e5m2"]


def case_dtypes(rng, i, array):
    B, H, Nq, Nk, D = _sizes(rng, small=True)
    shapes = [(B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D)]
    names = _NP_DTYPES if array == "numpy" else _TORCH_DTYPES
    dt = names[i % len(names)]
    mixed = i % 4 == 3
    dts = [dt, dt, dt]
    if mixed:
        dts[int(rng.integers(0, 3))] = "float64" if dt != "float64" else "float32"
    if array == "numpy":
        q, k, v = (_normal(rng, s).astype(np.dtype(d)) for s, d in zip(shapes, dts))
        return Case("dtypes", f"{'/'.join(dts)}", q, k, v, causal=bool(rng.random() < 0.5),
                    words=("q", "k", "v", "dtype"), grads=not mixed and i % 2 == 0)
    q, k, v = (_normal(rng, s) for s in shapes)
    return Case("dtypes", f"torch {'/'.join(dts)}", q, k, v, causal=bool(rng.random() < 0.5),
                words=("q", "k", "v", "dtype"), torch_dtype=dts, grads=not mixed and i % 2 == 0)


def case_layouts(rng, i, array):
    B, H, Nq, Nk, D = _sizes(rng, small=True)
    D = max(D, 2)
    q, k, v = (_normal(rng, s) for s in ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D)))
    numpy_views = ["negative", "fortran", "broadcast", "stride", "transposed"]
    torch_views = ["conj", "neg", "neg_v", "expand", "fortran", "stride", "transposed"]
    kind = (numpy_views if array == "numpy" else torch_views)[i % (5 if array == "numpy" else 7)]
    if array == "numpy":
        if kind == "negative":  # negative strides along N and D
            q = np.ascontiguousarray(q[:, :, ::-1, ::-1])[:, :, ::-1, ::-1]
            k = np.ascontiguousarray(k[:, :, ::-1])[:, :, ::-1]
        elif kind == "fortran":
            q, k, v = np.asfortranarray(q), np.asfortranarray(k), np.asfortranarray(v)
        elif kind == "broadcast":  # stride 0 over B and H
            k = np.broadcast_to(k[:1, :1], k.shape)
            v = np.broadcast_to(v[:1, :1], v.shape)
        elif kind == "stride":  # every 3rd row and every 2nd column of bigger buffers
            big = _normal(rng, (B, H, 3 * Nq, 2 * D))
            big[:, :, ::3, ::2] = q
            q = big[:, :, ::3, ::2]
        elif kind == "transposed":
            q = np.swapaxes(np.ascontiguousarray(np.swapaxes(q, 1, 2)), 1, 2)
    return Case("layouts", kind, q, k, v, causal=bool(rng.random() < 0.5), view=kind if array == "torch" else None,
                grads=i % 2 == 0)


def case_nonfinite(rng, i):
    B, H, Nq, Nk, D = _sizes(rng, small=True)
    causal = bool(rng.random() < 0.5)
    where = "qkv"[i % 3]
    value = [math.nan, math.inf, -math.inf][(i // 3) % 3]
    if causal and where != "q" and Nq > Nk:  # a key some query cannot see: keep it seen by every query
        Nq, Nk = Nk, Nq
    q, k, v = (_normal(rng, s) for s in ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D)))
    x = {"q": q, "k": k, "v": v}[where]
    b, h, d = int(rng.integers(0, B)), int(rng.integers(0, H)), int(rng.integers(0, D))
    if causal:
        # the pattern is defined for pairs that see each other: the last query sees every key, and with
        # Nq <= Nk every query sees key 0 (a hidden pair is skipped by a tiled kernel, while 0 * inf is NaN
        # in a dense matmul)
        n = Nq - 1 if where == "q" else 0
    else:
        n = int(rng.integers(0, x.shape[2]))
    x[b, h, n, d] = value
    return Case("nonfinite", f"{where}[{b},{h},{n},{d}]={value} q{q.shape} k{k.shape}", q, k, v, causal=causal,
                grads=True)


_SCALES = [0.0, -0.0, -0.7, 1e-300, 5e-324, 1e-40, 3.0, 1e5, 1e30, -1e30, 1e38, 3e38, 1e300, 10**400,
           math.nan, math.inf, "0.1", True, "np.float32(0.5)", "np.array(0.25)", "torch.tensor(0.3)",
           "np.array([0.5])", complex(0.5, 0), Fraction(1, 3), Decimal("0.5"), None]


def _scale_value(token):
    if token == "np.float32(0.5)":
        return np.float32(0.5)
    if token == "np.array(0.25)":
        return np.array(0.25)
    if token == "torch.tensor(0.3)":
        import torch

        return torch.tensor(0.3)
    if token == "np.array([0.5])":
        return np.array([0.5])
    return token


def case_scale(rng, i, backend):
    B, H, Nq, Nk, D = _sizes(rng, small=True)
    if not backend.supports_head_dim(D):  # the scale is under test here, not the head dim (e.g. cuda-mma: 64/128)
        D = next(d for d in (16, 32, 64, 128) if backend.supports_head_dim(d))
    q, k, v = (_normal(rng, s) for s in ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D)))
    token = _SCALES[i % len(_SCALES)]
    label = token if isinstance(token, str) else repr(token)[:24]
    return Case("scale", f"softmax_scale={label}", q, k, v, causal=bool(rng.random() < 0.5), scale=token,
                words=("softmax_scale",), grads=i % 3 == 0)


def make_case(backend, family: str, i: int) -> Case:
    """Case number ``i`` of ``family`` for ``backend``: the same every run (seeded by family and number)."""
    rng = np.random.default_rng([SEED, FAMILIES.index(family), i])
    if family == "shapes":
        return case_shapes(rng, i)
    if family == "dtypes":
        return case_dtypes(rng, i, backend.array)
    if family == "layouts":
        return case_layouts(rng, i, backend.array)
    if family == "nonfinite":
        return case_nonfinite(rng, i)
    return case_scale(rng, i, backend)


# ---------------------------------------------------------------------------------------------- running one case
def _to_backend(case, backend, device):
    """q, k, v as the backend takes them: NumPy as built, or torch tensors with the case's dtype and view."""
    if backend.array == "numpy":
        return case.q, case.k, case.v
    import torch

    def conv(x, dt):
        if x.dtype.kind not in "fc" or x.dtype.itemsize > 8:
            x = x.astype(np.float64)
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("=")))
        dt = dt or default
        if dt.startswith("float8"):
            return t.to(device=device, dtype=torch.float32).to(getattr(torch, dt))
        return t.to(device=device, dtype=getattr(torch, dt))

    default = "float32" if "float32" in backend.dtypes[device.split(":")[0]] else backend.dtypes[device][0]
    dts = case.torch_dtype or [None, None, None]
    q, k, v = (conv(x, dt) for x, dt in zip((case.q, case.k, case.v), dts))
    view = case.view
    if view in ("conj", "neg", "neg_v"):
        # a view with torch's lazy negative bit whose values are the case's q (or v): memory holds -q
        def neg_view(x):
            return torch.complex(torch.zeros_like(x), -x).conj().imag  # values: x; is_neg() is True

        if view == "neg_v":
            v = neg_view(v)
        else:
            q = neg_view(q)
            if view == "conj":
                k = neg_view(k)
    elif view == "expand":
        k = k[:1, :1].expand(k.shape)
        v = v[:1, :1].expand(v.shape)
    elif view == "fortran":
        q = q.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
        k = k.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)
    elif view == "stride":
        B, H, N, D = q.shape
        big = torch.randn(B, H, 3 * N, 2 * D, dtype=q.dtype, device=q.device)
        big[:, :, ::3, ::2] = q
        q = big[:, :, ::3, ::2]
    elif view == "transposed":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k, v


def _f64(x):
    if hasattr(x, "detach"):
        import torch

        return x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _compare(out, ref, naive, out_dtype: str, floor: float, extra: float = 0.0) -> str | None:
    """None if ``out`` agrees with ``ref`` (pattern and tolerance), else why not. ``extra``: added to the bound."""
    out = _f64(out)
    ref_r = _f64(ref)
    ref_rounded = ref_r.astype(out_dtype if out_dtype in ("float16", "float32", "float64") else "float32")
    ref_rounded = ref_rounded.astype(np.float64)
    if out.shape != ref_r.shape:
        return f"shape {out.shape} != reference {ref_r.shape}"
    if not np.array_equal(np.isnan(out), np.isnan(ref_r)):
        return f"NaN pattern differs ({int(np.isnan(out).sum())} NaN, reference {int(np.isnan(ref_r).sum())})"
    inf_ref = np.isinf(ref_rounded)
    if not np.array_equal(np.isinf(out), inf_ref) or not np.array_equal(out[inf_ref], ref_rounded[inf_ref]):
        return f"inf pattern differs ({int(np.isinf(out).sum())} inf, reference {int(inf_ref.sum())})"
    fin = np.isfinite(ref_rounded)
    if not fin.any():
        return None
    err = np.abs(out[fin] - ref_r[fin])
    naive_err = 0.0
    if naive is not None:
        nv = _f64(naive)
        both = fin & np.isfinite(nv)
        if both.any():
            naive_err = float(np.abs(nv[both] - ref_r[both]).max())
    eps = np.finfo(np.float32 if out_dtype != "float64" else np.float64).eps
    bound = 2 * naive_err + floor + extra + 8 * eps * np.abs(ref_r[fin])
    if not np.all(err <= bound):
        j = int(np.argmax(err - bound))
        return f"max-abs error {float(err.max()):.3e} over the bound (worst {float(err[j]):.3e} > {float(bound[j]):.3e})"
    return None


def _naive(backend, device, q, k, v, *, causal, scale, do=None):
    """The harness's yardstick (naive attention in the backend's dtype and precision mode, at the case's
    softmax_scale): (o, lse), or (dq, dk, dv) when ``do`` is given; None where naive attention refuses the input.
    """
    from flash_attention_py.testing import naive_same_precision

    try:
        return naive_same_precision(backend, device, q, k, v, causal=causal, softmax_scale=scale, do=do)
    except EXPECTED_ERRORS:
        return None


def _max_norm(x) -> float:
    """The largest row norm of x (B, H, N, D) over its finite entries."""
    x = np.nan_to_num(_f64(x), nan=0.0, posinf=0.0, neginf=0.0)
    return float(np.sqrt((x ** 2).sum(-1)).max())


def _scale_for_bound(scale, D):
    from flash_attention_py.validation import resolve_softmax_scale

    return resolve_softmax_scale(scale, D, fn="bound")


def _message_ok(exc, fn: str, words) -> str | None:
    msg = str(exc)
    if fn not in msg:
        return f"message does not name {fn}: {msg[:160]!r}"
    if not any(re.search(rf"(?<![A-Za-z_]){re.escape(w)}(?![A-Za-z_])", msg) for w in words):
        return f"message names none of {words}: {msg[:160]!r}"
    return None


def run_case(backend, device, family: str, i: int) -> dict:
    """Run one case; returns {'outcome': 'error' | 'correct' | 'wrong', 'detail': ...}."""
    from flash_attention_py import attention_reference, attention_reference_grads
    from flash_attention_py.testing import FLOOR, LSE_FLOOR

    case = make_case(backend, family, i)
    fn = fn_name(backend)
    base = dict(backend=backend.name, device=device, family=family, i=i, label=case.label)
    try:
        q, k, v = _to_backend(case, backend, device)
    except Exception as exc:  # the case cannot be built for this backend (e.g. a dtype torch cannot cast to)
        return dict(base, outcome="error", detail=f"not buildable: {type(exc).__name__}: {exc}"[:200])
    scale = _scale_value(case.scale)
    kw = dict(causal=case.causal, softmax_scale=scale)
    # 1. the backend
    try:
        o, lse = backend.forward(q, k, v, return_lse=True, **kw)
    except EXPECTED_ERRORS as exc:
        bad = _message_ok(exc, fn, case.words)
        if bad:
            return dict(base, outcome="wrong", detail=f"{type(exc).__name__}: {bad}")
        return dict(base, outcome="error", detail=f"{type(exc).__name__}: {str(exc)[:160]}")
    except Exception as exc:
        return dict(base, outcome="wrong", detail=f"unclear {type(exc).__name__}: {str(exc)[:200]}")
    # 2. the reference (it must accept what the backend accepted)
    try:
        ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, **kw)
    except EXPECTED_ERRORS as exc:
        return dict(base, outcome="wrong", detail=f"accepted what the reference refuses: {str(exc)[:160]}")
    out_dtype = str(getattr(o, "dtype", "")).replace("torch.", "")
    out_dtype = np.dtype(o.dtype).name if backend.array == "numpy" else out_dtype
    floor = FLOOR.get(out_dtype, 2e-3)
    lse_floor = LSE_FLOOR.get(out_dtype, 2e-4)
    lse_dtype = str(lse.dtype).replace("torch.", "") if hasattr(lse, "dtype") else "float32"
    lse_dtype = np.dtype(lse.dtype).name if backend.array == "numpy" else lse_dtype
    naive_o = naive_lse = None
    naive = _naive(backend, device, q, k, v, causal=case.causal, scale=scale)
    if naive is not None:  # (None: naive attention refuses the input, e.g. a scale that overflows its dtype)
        naive_o, naive_lse = naive
    for name, out, ref, naive, fl, dt in (("o", o, ref_o, naive_o, floor, out_dtype),
                                          ("lse", lse, ref_lse, naive_lse, lse_floor, lse_dtype)):
        bad = _compare(out, ref, naive, dt, fl)
        if bad:
            return dict(base, outcome="wrong", detail=f"{name}: {bad}")
    # 3. the gradients
    if case.grads and backend.backward:
        rng = np.random.default_rng([SEED, 99, i])
        do_np = rng.standard_normal(tuple(q.shape))
        try:
            if backend.array == "numpy":
                do = do_np.astype(np.dtype(q.dtype).newbyteorder("="))
                qn, kn, vn = (np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("=")) for x in (q, k, v))
                _, _, dq, dk, dv = backend.forward_backward(qn, kn, vn, do, **kw)
            else:
                import torch

                do = torch.from_numpy(do_np).to(device=q.device, dtype=q.dtype)
                _, _, dq, dk, dv = backend.forward_backward(q, k, v, do, **kw)
        except Exception as exc:
            return dict(base, outcome="wrong", detail=f"backward raised {type(exc).__name__}: {str(exc)[:160]}")
        refs = attention_reference_grads(q, k, v, do, causal=case.causal, softmax_scale=scale)
        naive_g = _naive(backend, device, q, k, v, causal=case.causal, scale=scale, do=do) or (None, None, None)
        # The FlashAttention backward takes Delta_i = rowsum(dO_i * O_i) from the rounded O, where autograd
        # takes rowsum(P_ij dP_ij); the difference (~eps |dO| |V|) is multiplied by scale * |K| (or |Q|) in
        # dQ (dK). With a huge softmax_scale that rounding dominates, so the bound carries that term.
        eps = float(np.finfo(np.float64 if out_dtype == "float64" else np.float32).eps)
        size = max(_max_norm(x) for x in (q, k, v, do))
        amplified = 8 * eps * abs(float(_scale_for_bound(scale, q.shape[-1]))) * size ** 3
        for name, g, r, nv in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, naive_g):
            bad = _compare(g, r, nv, out_dtype, 2 * floor, amplified if name != "dv" else 0.0)
            if bad:
                return dict(base, outcome="wrong", detail=f"{name}: {bad}")
    return dict(base, outcome="correct", detail="")


# ---------------------------------------------------------------------------------------------- the worker
def _worker(jobs):
    """Run jobs [(backend name, device, family, i)] and print one JSON line per result (flushed)."""
    import warnings

    from flash_attention_py.registry import get_backend

    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    for name, device, family, i in jobs:
        print("START " + json.dumps([name, device, family, i]), flush=True)
        res = run_case(get_backend(name), device, family, i)
        print("RESULT " + json.dumps(res), flush=True)


def run_jobs(jobs, timeout_s=900):
    """Run the jobs in worker subprocesses; a worker that dies counts its current case as a crash."""
    results, todo = [], list(jobs)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE, env.get("PYTHONPATH", "")])
    while todo:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], input=json.dumps(todo),
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        started = None
        done = 0
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = json.loads(line[6:])
            elif line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
                started = None
                done += 1
        todo = todo[done:]
        if started is not None or (proc.returncode != 0 and todo):
            crashed = todo.pop(0)
            results.append(dict(backend=crashed[0], device=crashed[1], family=crashed[2], i=crashed[3], label="",
                                outcome="crash",
                                detail=f"worker exited with {proc.returncode}: {proc.stderr[-300:]}"))
    return results


def table(results, key="family") -> str:
    """Counts per family (or per ``key``: 'backend'): tried, clear error, correct, wrong, crash."""
    counts = defaultdict(Counter)
    for r in results:
        counts[r[key]][r["outcome"]] += 1
    rows = FAMILIES if key == "family" else sorted(counts)
    width = max([len(key)] + [len(str(x)) for x in rows])
    lines = [f"{key:<{width}} {'tried':>6} {'clear error':>12} {'correct':>8} {'wrong':>6} {'crash':>6}"]
    total = Counter()
    for row in rows:
        c = counts[row]
        total.update(c)
        lines.append(f"{row:<{width}} {sum(c.values()):>6} {c['error']:>12} {c['correct']:>8} {c['wrong']:>6} "
                     f"{c['crash']:>6}")
    lines.append(f"{'all':<{width}} {sum(total.values()):>6} {total['error']:>12} {total['correct']:>8} "
                 f"{total['wrong']:>6} {total['crash']:>6}")
    return "\n".join(lines)


def _jobs(per_family: dict):
    jobs = []
    for backend, device in backends_here():
        for fam in FAMILIES:
            n = per_family[fam]
            if backend.slow_on_cpu and device == "cpu":
                n = max(1, n // 2)
            jobs += [(backend.name, device, fam, i) for i in range(n)]
    return jobs


def _run_and_report(per_family, capsys, tmp_path):
    results = run_jobs(_jobs(per_family))
    text = table(results)
    bad = [r for r in results if r["outcome"] in ("wrong", "crash")]
    (tmp_path / "adversarial.json").write_text(json.dumps(results, indent=1))
    with capsys.disabled():
        print("\nadversarial inputs, per family (every backend that runs here):\n" + text)
        print("per backend:\n" + table(results, key="backend"))
        for r in bad:
            print(f"  {r['outcome'].upper()}: {r['backend']} {r['device']} {r['family']} #{r['i']} {r['label']}: "
                  f"{r['detail']}")
    assert not bad, f"{len(bad)} adversarial cases gave a wrong answer or crashed:\n" + "\n".join(
        f"{r['backend']} {r['family']} #{r['i']} {r['label']}: {r['detail']}" for r in bad[:20])
    return results


def test_adversarial_sample(capsys, tmp_path):
    """A small fixed sample of every family on every backend here: clear error or the reference's answer."""
    results = _run_and_report({"shapes": 9, "dtypes": 10, "layouts": 7, "nonfinite": 9, "scale": 26}, capsys,
                              tmp_path)
    assert {r["family"] for r in results} == set(FAMILIES)


@pytest.mark.slow
def test_adversarial_large(capsys, tmp_path):
    """About three times the sample (more case numbers: the builders draw sizes and values per case number)."""
    _run_and_report({"shapes": 36, "dtypes": 30, "layouts": 28, "nonfinite": 36, "scale": 52}, capsys, tmp_path)


def test_worker_survives_a_crash(tmp_path):
    """A case that kills the worker (here: os._exit in place of a segfault) is a crash, and the rest still run."""
    # two scale cases refused up front (cheap: no torch import in the worker), around a simulated crash
    i_big = _SCALES.index(10**400)
    i_nan = next(i for i, s in enumerate(_SCALES) if isinstance(s, float) and math.isnan(s))
    jobs = [("numpy-v1", "cpu", "scale", i_big), ("__crash__", "cpu", "scale", 1), ("numpy-v1", "cpu", "scale", i_nan)]
    results = run_jobs(jobs)
    assert [r["outcome"] for r in results] == ["error", "crash", "error"], results


if __name__ == "__main__" and "--worker" in sys.argv:
    _jobs_in = [tuple(j) for j in json.loads(sys.stdin.read())]
    # "__crash__" stands in for a case that kills the process (as a segfault in a kernel would): for the test above
    _n = next((i for i, j in enumerate(_jobs_in) if j[0] == "__crash__"), len(_jobs_in))
    _worker(_jobs_in[:_n])
    if _n < len(_jobs_in):
        print("START " + json.dumps(list(_jobs_in[_n])), flush=True)
        os._exit(139)


def test_family_tool_runs_one_family():
    """tools/adversarial_family.py: one family, chosen backends, the per-backend table."""
    res = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "tools", "adversarial_family.py"),
                          "--family", "nonfinite", "--cases", "2", "--backends", "numpy-v2"],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "numpy-v2      2" in res.stdout
