"""Bad input gets a clear ValueError/TypeError naming the argument, what it got and what it expected.

The shared cases run through every public function of flash_attention_py and through every
registry backend that can run here (so a new backend is checked as soon as it is registered).
"""
import math

import numpy as np
import pytest
import torch

from flash_attention_py import (
    attention_naive,
    attention_reference,
    attention_reference_grads,
    flash_attn_numpy,
    flash_attn_numpy_backward,
    flash_attn_torch,
)
from flash_attention_py.registry import BACKENDS, get_backend
import harness


def _arrays(kind, shape_q=(2, 2, 8, 16), shape_k=(2, 2, 8, 16), shape_v=None, dtype="float32", device="cpu"):
    shape_v = shape_k if shape_v is None else shape_v
    rng = np.random.default_rng()
    xs = [rng.standard_normal(s) for s in (shape_q, shape_k, shape_v)]
    if kind == "numpy":
        return [x.astype(dtype) for x in xs]
    return [torch.from_numpy(x).to(device=device, dtype=getattr(torch, dtype)) for x in xs]


# (id, how to build q/k/v from `_arrays`, extra kwargs, exception, words the message must contain)
SHARED_CASES = [
    ("rank", dict(shape_q=(2, 8, 16)), {}, ValueError, ["q", "4 dimensions", "(2, 8, 16)"]),
    ("batch-mismatch", dict(shape_k=(3, 2, 8, 16)), {}, ValueError, ["B (batch)", "(3, 2, 8, 16)"]),
    ("heads-mismatch", dict(shape_k=(2, 1, 8, 16)), {}, ValueError, ["H (heads)"]),
    ("headdim-mismatch", dict(shape_k=(2, 2, 8, 32)), {}, ValueError, ["D (head dim)"]),
    ("v-shape", dict(shape_v=(2, 2, 9, 16)), {}, ValueError, ["v", "(2, 2, 9, 16)", "(2, 2, 8, 16)"]),
    ("D=0", dict(shape_q=(2, 2, 8, 0), shape_k=(2, 2, 8, 0)), {}, ValueError, ["D = 0"]),
    ("Nq=0", dict(shape_q=(2, 2, 0, 16)), {}, ValueError, ["Nq = 0"]),
    ("Nk=0", dict(shape_k=(2, 2, 0, 16)), {}, ValueError, ["Nk = 0"]),
    ("scale-nan", {}, dict(softmax_scale=math.nan), ValueError, ["softmax_scale", "finite"]),
    ("scale-inf", {}, dict(softmax_scale=math.inf), ValueError, ["softmax_scale", "finite"]),
    ("scale-str", {}, dict(softmax_scale="0.1"), TypeError, ["softmax_scale", "str"]),
    ("causal-not-bool", {}, dict(causal="yes"), TypeError, ["causal", "True or False"]),
]


def _cpu_backends():
    out = []
    for b in BACKENDS:
        if "cpu" in b.dtypes:
            out.append(pytest.param(b, id=b.name))
    return out


def _expect(exc, words, call):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"message {msg!r} should mention {w!r}"


@pytest.mark.parametrize("case", SHARED_CASES, ids=[c[0] for c in SHARED_CASES])
@pytest.mark.parametrize("backend", _cpu_backends())
def test_backend_rejects(backend, case):
    harness.skip_unless_available(backend, "cpu")
    _, build, kwargs, exc, words = case
    dtype = "float32" if "float32" in backend.dtypes["cpu"] else backend.dtypes["cpu"][0]
    q, k, v = _arrays(backend.array, dtype=dtype, **build)
    _expect(exc, words, lambda: backend.forward(q, k, v, **kwargs))


@pytest.mark.parametrize("case", SHARED_CASES, ids=[c[0] for c in SHARED_CASES])
@pytest.mark.parametrize("fn", [attention_reference, attention_naive], ids=["reference", "naive"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_reference_rejects(fn, kind, case):
    _, build, kwargs, exc, words = case
    q, k, v = _arrays(kind, **build)
    _expect(exc, words, lambda: fn(q, k, v, **kwargs))


@pytest.mark.parametrize("backend", _cpu_backends())
def test_mixed_dtypes(backend):
    harness.skip_unless_available(backend, "cpu")
    q, k, v = _arrays(backend.array, dtype="float32")
    k = k.astype(np.float64) if backend.array == "numpy" else k.double()
    _expect(TypeError, ["one dtype", "q float32", "k float64"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", [pytest.param(b, id=b.name) for b in BACKENDS if b.array == "torch"])
def test_mixed_devices(backend):
    # a 'meta' tensor stands in for "another device" on a machine without a GPU
    device = "cpu" if "cpu" in backend.dtypes else "cuda"
    harness.skip_unless_available(backend, device)
    dtype = backend.dtypes[device][0]
    q, k, v = _arrays("torch", dtype=dtype, device=device)
    k = k.to("meta")
    _expect(ValueError, ["one device", "k on meta"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", _cpu_backends())
def test_unsupported_dtype(backend):
    harness.skip_unless_available(backend, "cpu")
    if backend.array == "numpy":
        q, k, v = (np.ones((1, 1, 4, 8), dtype=np.int32) for _ in range(3))
    else:
        q, k, v = (torch.ones((1, 1, 4, 8), dtype=torch.int32) for _ in range(3))
    _expect(TypeError, ["int32"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", _cpu_backends())
def test_wrong_array_type(backend):
    harness.skip_unless_available(backend, "cpu")
    q = [[[[1.0]]]]
    _, k, v = _arrays(backend.array)
    _expect(TypeError, ["q must be a", "list"], lambda: backend.forward(q, k, v))


def test_numpy_rejects_torch_and_torch_rejects_numpy():
    qn, kn, vn = _arrays("numpy")
    qt, kt, vt = _arrays("torch")
    _expect(TypeError, ["numpy.ndarray", "Tensor"], lambda: flash_attn_numpy(qt, kt, vt))
    _expect(TypeError, ["torch.Tensor", "ndarray"], lambda: flash_attn_torch(qn, kn, vn))
    _expect(TypeError, ["same array type"], lambda: attention_reference(qn, kt, vn))


def test_numpy_specific_arguments():
    q, k, v = _arrays("numpy")
    _expect(ValueError, ["loop_order", "'v3'"], lambda: flash_attn_numpy(q, k, v, loop_order="v3"))
    _expect(ValueError, ["block_m", "positive", "0"], lambda: flash_attn_numpy(q, k, v, block_m=0))
    _expect(ValueError, ["block_n", "-4"], lambda: flash_attn_numpy(q, k, v, block_n=-4))
    _expect(TypeError, ["block_m", "float"], lambda: flash_attn_numpy(q, k, v, block_m=16.0))
    _expect(TypeError, ["block_n", "bool"], lambda: flash_attn_numpy(q, k, v, block_n=True))
    _expect(TypeError, ["hbm_stats", "list"], lambda: flash_attn_numpy(q, k, v, hbm_stats=[]))
    _expect(TypeError, ["return_lse"], lambda: flash_attn_numpy(q, k, v, return_lse=1))


def test_torch_specific_arguments():
    q, k, v = _arrays("torch")
    _expect(ValueError, ["block_size", "positive"], lambda: flash_attn_torch(q, k, v, block_size=0))
    _expect(TypeError, ["block_size", "float"], lambda: flash_attn_torch(q, k, v, block_size=2.5))
    q16, k16, v16 = (x.to(torch.int64) for x in (q, k, v))
    _expect(TypeError, ["int64", "bfloat16, float16, float32, float64"], lambda: flash_attn_torch(q16, k16, v16))


def test_numpy_backward_rejects():
    q, k, v = _arrays("numpy")
    o, lse = flash_attn_numpy(q, k, v, return_lse=True)
    do = np.random.default_rng().standard_normal(o.shape).astype(np.float32)
    bwd = flash_attn_numpy_backward
    _expect(ValueError, ["do", "shape", "(2, 2, 8, 15)"], lambda: bwd(q, k, v, o, lse, do[..., :15]))
    _expect(TypeError, ["do", "float64"], lambda: bwd(q, k, v, o, lse, do.astype(np.float64)))
    _expect(ValueError, ["o", "shape"], lambda: bwd(q, k, v, o[:, :, :4], lse, do))
    _expect(ValueError, ["lse", "(2, 2, 8)", "(2, 2, 7)"], lambda: bwd(q, k, v, o, lse[..., :7], do))
    _expect(TypeError, ["lse", "float16"], lambda: bwd(q, k, v, o, lse.astype(np.float16), do))
    _expect(TypeError, ["lse", "list"], lambda: bwd(q, k, v, o, lse.tolist(), do))
    _expect(ValueError, ["block_n"], lambda: bwd(q, k, v, o, lse, do, block_n=0))
    _expect(ValueError, ["Nq = 0"], lambda: bwd(q[:, :, :0], k, v, o[:, :, :0], lse[..., :0], do[:, :, :0]))
    _expect(ValueError, ["softmax_scale"], lambda: bwd(q, k, v, o, lse, do, softmax_scale=math.inf))


def test_reference_grads_rejects():
    q, k, v = _arrays("numpy", shape_k=(2, 2, 8, 8))
    _expect(ValueError, ["D (head dim)"], lambda: attention_reference_grads(q, k, v, q))


def test_unknown_backend_name():
    _expect(ValueError, ["unknown backend", "numpy-v2"], lambda: get_backend("numpy-v9"))
