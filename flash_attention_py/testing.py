"""Testing support for every backend (like ``numpy.testing``): cases, inputs, tolerance policy, checks and
error bookkeeping. The test suite (tests/test_harness.py and others) and the lab grader import it.

    from flash_attention_py import testing
    for p in testing.harness_params():          # pytest params (backend, device, dtype, case, causal, scale)
        ...

Tolerance policy (as in flash-attn's own tests): a backend's max-abs error against the float64 reference
must be at most 2x the max-abs error of naive attention (``attention_naive``: S, softmax, PV all in the
same dtype, on the same device, in the same matmul precision mode, at the same ``softmax_scale``) plus a
small floor per dtype (``FLOOR``, ``LSE_FLOOR``; for gradients :func:`grad_floor`). Inputs are fresh random
normals every time, never zeros.

Axes of the harness: registry backend x device x claimed dtype x case (``CASES``; a backend slow on the
CPU, the Triton interpreter, gets the 'core' cases only) x causal x softmax_scale (``SCALES``: the default
1/sqrt(D) on every case, each other value on ``SCALE_CASES``, see :func:`case_scales`).

Variant axes (``VARIANT_CASES``, :func:`variant_params`): a short, sampled list of window / grouped-query heads
/ dropout cases, each run on every backend whose capability lists the variants it uses (forward: O and lse;
backward: dq, dk, dv). The CPU gets small N and one dtype per case (rotating through the backend's dtypes);
the GPU gets N from 257 to 1000 and every dtype of the GPU rungs. A backend that does not list a variant is
not asked; :func:`refusal_params` lists, instead, the calls it must refuse with a ValueError.

pytest is imported only inside the functions that need it, so the grader can use the rest without it.
"""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .inputs import make_inputs
from .reference import attention_naive, attention_reference, attention_reference_grads
from .registry import BACKENDS

__all__ = [
    "CASES", "SCALES", "SCALE_CASES", "FLOOR", "LSE_FLOOR", "grad_floor", "case_id", "case_scales", "devices_here",
    "harness_params", "skip_unless_available", "inputs_for", "to_f64_numpy", "errors", "record", "error_table", "check_close",
    "naive_same_precision", "attention_reference", "attention_reference_grads",
    "VARIANT_CASES", "variants_used", "variant_kwargs", "variant_shape", "variant_params", "variant_inputs",
    "variant_grad_floor", "refusal_params", "refusal_call",
]

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
    dict(B=1, H=2, Nq=130, Nk=100, D=192, core=False, quick=False),  # D > 128 over several tiles (CUDA: padded to 256)
    dict(B=1, H=1, Nq=1000, Nk=1000, D=32, core=False),
    dict(B=2, H=2, Nq=64, Nk=48, D=64, layout="bnhd", core=True),  # non-contiguous inputs
]

# softmax_scale values: None (the default 1/sqrt(D)), a negative one (the softmax of -S: the row minimum
# leads), 0 (uniform weights over the visible keys: O = their mean of V) and 2.5 (sharper than the default).
SCALES = (None, -0.3, 0.0, 2.5)
# the cases the other scales run on (see case_scales): D = 64, which every backend takes, and several K/V
# blocks for every backend (a sign or scale error in the online softmax's rescaling shows between blocks)
SCALE_CASES = [
    dict(B=1, H=2, Nq=77, Nk=130, D=64),  # Nq < Nk
    dict(B=2, H=1, Nq=130, Nk=77, D=64),  # Nq > Nk: causal rows that see no key
]

# floors on max-abs errors, per dtype (the rounding of one output value, roughly)
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
LSE_FLOOR = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-4, "bfloat16": 2e-4}


def grad_floor(dtype: str, case: dict, softmax_scale=None) -> float:
    """The floor for dq, dk, dv: ``FLOOR[dtype]`` times sqrt(max(Nq, Nk)) (a gradient sums over a row or a
    column of the attention matrix), times |softmax_scale| * sqrt(D) when that is above 1 (how much larger
    the scores are than at the default scale 1/sqrt(D), where it is 1: the backward recomputes
    P_ij = exp(S_ij * scale - lse_i) from the forward's lse, and that rounding grows with |S_ij * scale|)."""
    sharpness = 1.0 if softmax_scale is None else max(1.0, abs(softmax_scale) * math.sqrt(case["D"]))
    return FLOOR[dtype] * math.sqrt(max(case["Nq"], case["Nk"])) * sharpness


# The variant cases. window: window_size (left, right), bottom-right aligned like causal (-1: no limit on that
# side); H, Hk: query and K/V heads (Hq / Hk = 1, 2 or Hq: MHA, GQA, MQA); p, seed: dropout_p, dropout_seed (a
# fixed seed per case, one of them >= 2**32: the Philox key's high word); cpu / gpu: (B, Nq, Nk, D) on each
# device (the CPU small: the Triton interpreter costs ~5 ms per tile; the GPU large, D 64 or 128, which the
# tensor-core kernels take).
VARIANT_CASES = [
    dict(id="win0,0", window=(0, 0), causal=False, H=2, Hk=2, p=0.0, seed=None,
         cpu=(1, 40, 40, 16), gpu=(1, 300, 300, 64)),  # the diagonal only
    dict(id="win5,-1-causal-gqa2", window=(5, -1), causal=True, H=4, Hk=2, p=0.0, seed=None,
         cpu=(2, 50, 70, 32), gpu=(2, 513, 700, 128)),  # sliding window: causal sets right = 0
    dict(id="win2,5-drop0.17", window=(2, 5), causal=False, H=2, Hk=2, p=0.17, seed=1234,
         cpu=(1, 70, 45, 16), gpu=(1, 1000, 777, 64)),  # asymmetric; Nq > Nk: rows that see no key
    dict(id="win4096,4096-mqa", window=(4096, 4096), causal=False, H=3, Hk=1, p=0.0, seed=None,
         cpu=(1, 33, 60, 40), gpu=(1, 257, 999, 64)),  # a window larger than N: full attention
    dict(id="causal-gqa2-drop0.5-seed2^32", window=(-1, -1), causal=True, H=4, Hk=2, p=0.5, seed=2**32 + 12345,
         cpu=(1, 64, 64, 32), gpu=(1, 640, 640, 128)),
    dict(id="mqa-drop0.17-q>k", window=(-1, -1), causal=False, H=2, Hk=1, p=0.17, seed=7,
         cpu=(2, 60, 23, 16), gpu=(2, 900, 333, 64)),
]


def variants_used(vc) -> set:
    """The capability variants ('causal', 'window', 'gqa', 'dropout') a variant case uses."""
    used = {"causal"} if vc["causal"] else set()
    if tuple(vc["window"]) != (-1, -1):
        used.add("window")
    if vc["Hk"] != vc["H"]:
        used.add("gqa")
    if vc["p"] > 0:
        used.add("dropout")
    return used


def variant_kwargs(vc) -> dict:
    """The keyword arguments of a variant case for every forward, backward and the references."""
    return dict(causal=vc["causal"], window_size=tuple(vc["window"]), dropout_p=vc["p"], dropout_seed=vc["seed"])


def variant_shape(vc, device) -> dict:
    """The case's shape on ``device``: dict(B, H, Hk, Nq, Nk, D) (also what :func:`grad_floor` reads)."""
    B, Nq, Nk, D = vc["gpu" if device == "cuda" else "cpu"]
    return dict(B=B, H=vc["H"], Hk=vc["Hk"], Nq=Nq, Nk=Nk, D=D)


def variant_grad_floor(dtype, vc, device) -> float:
    """:func:`grad_floor` of the case's shape, times 1 / (1 - p) (dropout scales the kept weights by it)."""
    return grad_floor(dtype, variant_shape(vc, device)) / (1.0 - vc["p"])


def variant_inputs(backend, device, dtype, vc, *, seed=None):
    """Fresh random q (B, H, Nq, D), k and v (B, Hk, Nk, D), do for variant case ``vc`` on ``device``."""
    s = variant_shape(vc, device)
    return make_inputs(s["B"], s["H"], s["Nq"], s["Nk"], s["D"], Hk=s["Hk"], dtype=dtype, kind=backend.array,
                       device=device, seed=seed)


def variant_params(*, need_backward=False):
    """pytest params (backend, device, dtype, variant case) for every backend whose capability lists every
    variant the case uses and takes its head dim. CPU: one dtype per case, rotating through the backend's
    dtypes; GPU: every dtype for the Triton and CUDA rungs, rotating for the others."""
    import pytest

    params = []
    for bi, b in enumerate(BACKENDS):
        if need_backward and not b.backward:
            continue
        for device, dtypes in b.dtypes.items():
            every = device == "cuda" and b.rung in ("triton", "cuda")
            for i, vc in enumerate(VARIANT_CASES):
                if not variants_used(vc) <= set(b.variants):
                    continue
                if not b.supports_head_dim(variant_shape(vc, device)["D"]):
                    continue
                for dtype in (dtypes if every else (dtypes[(i + bi) % len(dtypes)],)):
                    params.append(pytest.param(b, device, dtype, vc, id=f"{b.name}-{device}-{dtype}-{vc['id']}"))
    return params


# a call that uses one variant, for the refusal test: keyword arguments, and whether K/V get fewer heads
_REFUSAL_CALLS = {
    "causal": (dict(causal=True), False, "causal"),
    "window": (dict(window_size=(2, 3)), False, "window_size"),
    "gqa": ({}, True, "heads"),
    "dropout": (dict(dropout_p=0.1, dropout_seed=3), False, "dropout_p"),
}


def refusal_params():
    """pytest params (backend, variant) for every variant of ``VARIANTS`` that a backend's capability does not
    list: the backend must refuse it (see :func:`refusal_call`)."""
    import pytest

    from .capabilities import VARIANTS

    return [pytest.param(b, var, id=f"{b.name}-{var}") for b in BACKENDS for var in VARIANTS
            if var not in b.variants]


def refusal_call(backend, variant):
    """(q, k, v, kwargs, word): a small call of ``backend`` that uses ``variant`` only, and the word its
    ValueError must name. The inputs are on the backend's first device when it can run there, else on the
    CPU (the input checks come before any kernel launch)."""
    device = backend.devices[0]
    if backend.unavailable_reason(device) is not None:
        device = "cpu"
    kwargs, fewer_heads, word = _REFUSAL_CALLS[variant]
    dtype = backend.dtypes[backend.devices[0]][0]
    D = 64 if backend.supports_head_dim(64) else backend.head_dims[0]
    x = make_inputs(1, 2, 8, 8, D, Hk=1 if fewer_heads else 2, dtype=dtype, kind=backend.array, device=device)
    return x["q"], x["k"], x["v"], kwargs, word


def case_id(c) -> str:
    lay = "-bnhd" if c.get("layout") == "bnhd" else ""
    return f"B{c['B']}H{c['H']}-q{c['Nq']}k{c['Nk']}-d{c['D']}{lay}"


def case_scales(cases, causal: bool, supports_head_dim=lambda D: True) -> list:
    """(case, softmax_scale) pairs for one causal mode: every case of ``cases`` at the default scale (None),
    then each other value of ``SCALES`` once, on one of ``SCALE_CASES`` (alternating, shifted by causal, so
    each scale meets both shapes across the two modes), where the backend takes that head dim."""
    pairs = [(c, None) for c in cases]
    pool = [c for c in SCALE_CASES if supports_head_dim(c["D"])]
    for j, scale in enumerate(SCALES[1:]):
        if pool:
            pairs.append((pool[(j + causal) % len(pool)], scale))
    return pairs


def devices_here():
    """'cpu' always; 'cuda' when a GPU is visible."""
    try:
        import torch

        return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    except ImportError:
        return ["cpu"]


def _param_id(backend, device, dtype, case, causal, scale) -> str:
    pid = f"{backend.name}-{device}-{dtype}-{case_id(case)}-{'causal' if causal else 'full'}"
    return pid if scale is None else f"{pid}-scale{scale:g}"


# the quick subset (pytest -m "not slow") runs the large cases and the non-default scales in a backend's first
# dtype only, and no case marked quick=False; the full suite runs them in every dtype
LARGE_SCORES = 257 * 257


def harness_params(*, need_backward=False):
    """pytest params over (backend, device, dtype, case, causal, softmax_scale), only combinations the backend
    claims (its capability: devices, dtypes, head dims, backward). Marked ``slow`` (the full suite only): the
    cases of at least ``LARGE_SCORES`` scores and the non-default scales in every dtype but the backend's first,
    and the cases marked ``quick=False``."""
    import pytest

    params = []
    for b in BACKENDS:
        if need_backward and not b.backward:
            continue
        for device, dtypes in b.dtypes.items():
            cases = [c for c in CASES if c["core"]] if (device == "cpu" and b.slow_on_cpu) else CASES
            cases = [c for c in cases if b.supports_head_dim(c["D"])]
            for k, dtype in enumerate(dtypes):
                for causal in (False, True):
                    for c, scale in case_scales(cases, causal, b.supports_head_dim):
                        heavy = scale is not None or c["Nq"] * c["Nk"] >= LARGE_SCORES
                        slow = (k > 0 and heavy) or not c.get("quick", True)
                        params.append(pytest.param(b, device, dtype, c, causal, scale,
                                                   marks=[pytest.mark.slow] if slow else [],
                                                   id=_param_id(b, device, dtype, c, causal, scale)))
    return params


def skip_unless_available(backend, device):
    """pytest.skip with the backend's reason when it cannot run on ``device`` here."""
    import pytest

    reason = backend.unavailable_reason(device)
    if reason is not None:
        pytest.skip(reason)


def inputs_for(backend, device, dtype, case, *, seed=None):
    """Fresh random q, k, v, do for ``case`` in the backend's array type, dtype and device."""
    return make_inputs(case["B"], case["H"], case["Nq"], case["Nk"], case["D"], dtype=dtype, kind=backend.array,
                       device=device, layout=case.get("layout", "bhnd"), seed=seed)


# ------------------------------------------------------------------ error bookkeeping
_ERRORS = defaultdict(lambda: dict(max_abs=0.0, rel_norm=0.0, naive_max_abs=0.0, cases=0))


def to_f64_numpy(x):
    """Any array (NumPy, torch on any device) as a float64 NumPy array."""
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
    """Keep the worst errors per (backend, device, dtype, quantity) for :func:`error_table`."""
    e = _ERRORS[(backend, device, dtype, quantity)]
    e["max_abs"] = max(e["max_abs"], max_abs)
    e["rel_norm"] = max(e["rel_norm"], rel)
    e["naive_max_abs"] = max(e["naive_max_abs"], naive_max_abs)
    e["cases"] += 1


def merge_errors(rows):
    """Fold rows of :func:`error_table` recorded elsewhere (another pytest-xdist worker) into this process's."""
    for r in rows:
        e = _ERRORS[(r["backend"], r["device"], r["dtype"], r["quantity"])]
        for k in ("max_abs", "rel_norm", "naive_max_abs"):
            e[k] = max(e[k], r[k])
        e["cases"] += r["cases"]


def error_table():
    """The recorded worst errors, one dict per (backend, device, dtype, quantity), sorted."""
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


def naive_same_precision(backend, device, q, k, v, *, causal, softmax_scale=None, do=None, **variant):
    """Naive attention in the backend's dtype and precision mode, at the same ``softmax_scale`` (and the same
    ``variant`` keywords: window_size, dropout_p, dropout_seed): the tolerance yardstick. Returns (o, lse), or
    (dq, dk, dv) when ``do`` is given. ``backend`` needs only ``tf32_on``
    (the devices where its float32 matmuls run in tf32). q, k, v, do: NumPy arrays (any byte order) or
    tensors; they are put on ``device`` in their own dtype. Raises what ``attention_naive`` raises for an
    input it refuses (e.g. a scale whose scores overflow the dtype)."""
    import torch

    def as_torch(x):
        if isinstance(x, torch.Tensor):
            return x.detach().resolve_conj().resolve_neg().to(device)
        x = np.asarray(x)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))).to(device)

    q, k, v = (as_torch(x) for x in (q, k, v))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = device in backend.tf32_on
    try:
        if do is None:
            return attention_naive(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, **variant)
        q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
        o = attention_naive(q, k, v, causal=causal, softmax_scale=softmax_scale, **variant)
        o.backward(as_torch(do))
        return q.grad, k.grad, v.grad
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
