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
from flash_attention_py import testing
from flash_attention_py.registry import BACKENDS, get_backend


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
    ("heads-mismatch", dict(shape_k=(2, 3, 8, 16)), {}, ValueError, ["heads", "(2, 3, 8, 16)"]),
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
    testing.skip_unless_available(backend, "cpu")
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
    testing.skip_unless_available(backend, "cpu")
    q, k, v = _arrays(backend.array, dtype="float32")
    k = k.astype(np.float64) if backend.array == "numpy" else k.double()
    _expect(TypeError, ["one dtype", "q float32", "k float64"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", [pytest.param(b, id=b.name) for b in BACKENDS if b.array == "torch"])
def test_mixed_devices(backend):
    # a 'meta' tensor stands in for "another device" on a machine without a GPU
    device = "cpu" if "cpu" in backend.dtypes else "cuda"
    testing.skip_unless_available(backend, device)
    dtype = backend.dtypes[device][0]
    q, k, v = _arrays("torch", dtype=dtype, device=device)
    k = k.to("meta")
    _expect(ValueError, ["one device", "k on meta"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", _cpu_backends())
def test_unsupported_dtype(backend):
    testing.skip_unless_available(backend, "cpu")
    if backend.array == "numpy":
        q, k, v = (np.ones((1, 1, 4, 8), dtype=np.int32) for _ in range(3))
    else:
        q, k, v = (torch.ones((1, 1, 4, 8), dtype=torch.int32) for _ in range(3))
    _expect(TypeError, ["int32"], lambda: backend.forward(q, k, v))


@pytest.mark.parametrize("backend", _cpu_backends())
def test_wrong_array_type(backend):
    testing.skip_unless_available(backend, "cpu")
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


# ------------------------------------------------------------------ the smaller crashes of the adversarial issue
def _qkv(kind="numpy", dtype="float32", shape=(1, 2, 8, 16)):
    return _arrays(kind, shape_q=shape, shape_k=shape, dtype=dtype)


def test_huge_block_size_is_one_block():
    q, k, v = _qkv("torch")
    o = flash_attn_torch(q, k, v, block_size=2**64)  # was an overflow inside torch.split
    assert (o.double() - attention_reference(q, k, v)).abs().max() < 1e-5


@pytest.mark.parametrize("fn", [flash_attn_numpy, attention_reference, attention_naive])
def test_softmax_scale_too_big_for_a_float(fn):
    q, k, v = _qkv()
    _expect(ValueError, ["softmax_scale", "finite", fn.__name__], lambda: fn(q, k, v, softmax_scale=10**400))


def test_masked_arrays_refused():
    q, k, v = _qkv()
    _expect(TypeError, ["flash_attn_numpy", "q", "MaskedArray"],
            lambda: flash_attn_numpy(np.ma.masked_array(q, mask=q > 2), k, v))


def test_naive_refuses_long_double_and_float8():
    q, k, v = _qkv()
    _expect(TypeError, ["attention_naive", "float128" if np.dtype(np.longdouble).itemsize == 16 else "float"],
            lambda: attention_naive(*(x.astype(np.longdouble) for x in (q, k, v))))
    tq, tk, tv = _qkv("torch")
    _expect(TypeError, ["attention_naive", "float8_e4m3fn"],
            lambda: attention_naive(*(x.to(torch.float8_e4m3fn) for x in (tq, tk, tv))))


def test_hbm_stats_with_bad_values():
    q, k, v = _qkv()
    _expect(TypeError, ["flash_attn_numpy", "hbm_stats", "read_q"],
            lambda: flash_attn_numpy(q, k, v, hbm_stats={"read_q": "x"}))
    stats = {"read_q": 5}
    flash_attn_numpy(q, k, v, hbm_stats=stats, block_m=4)  # existing counts are added to
    assert stats["read_q"] == 5 + q.size


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(Nq=-1), ValueError, ["Nq", "-1"]), (dict(dtype="bogus"), ValueError, ["dtype", "bogus"]),
    (dict(B=2.5), TypeError, ["B", "2.5"]), (dict(dtype="int8"), ValueError, ["dtype", "int8"]),
    (dict(D=0), ValueError, ["D", "0"]), (dict(H=True), TypeError, ["H"]),
])
def test_make_inputs_bad_arguments(kwargs, exc, words):
    from flash_attention_py import make_inputs

    _expect(exc, ["make_inputs"] + words, lambda: make_inputs(**kwargs))


@pytest.mark.parametrize("order", ["v1", "v2"])
def test_big_endian_arrays_are_accepted(order):
    q, k, v = _qkv(dtype="float64")
    do = np.random.default_rng().standard_normal(q.shape)
    be = [x.astype(">f8") for x in (q, k, v, do)]
    o, lse = flash_attn_numpy(*be[:3], loop_order=order, return_lse=True, causal=True)
    o_ref, lse_ref = attention_reference(q, k, v, causal=True, return_lse=True)
    assert np.abs(o - o_ref).max() < 1e-12 and np.abs(lse - lse_ref).max() < 1e-12  # computed in float64
    grads = flash_attn_numpy_backward(*be[:3], o, lse, be[3], causal=True)
    for g, r in zip(grads, attention_reference_grads(q, k, v, do, causal=True)):
        assert np.abs(g - r).max() < 1e-11
    np.testing.assert_allclose(attention_naive(*be[:3]), attention_reference(q, k, v), atol=1e-12)


@pytest.mark.parametrize("make", [lambda s: np.array(s), lambda s: torch.tensor(s), lambda s: np.float32(s)],
                         ids=["numpy-0d", "torch-0d", "numpy-scalar"])
def test_zero_dim_softmax_scale_accepted(make):
    q, k, v = _qkv("torch")
    expect = flash_attn_torch(q, k, v, softmax_scale=float(np.float32(0.3)))
    assert torch.equal(flash_attn_torch(q, k, v, softmax_scale=make(0.3)), expect)
    _expect(TypeError, ["flash_attn_torch", "softmax_scale", "(2,)"],
            lambda: flash_attn_torch(q, k, v, softmax_scale=torch.tensor([0.3, 0.3])))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scale_that_overflows_the_compute_dtype_is_refused(dtype):
    """softmax_scale=1e38 on float32 gave all zeros and lse -inf; now a clear error (the scores overflow float32)."""
    q, k, v = _qkv(dtype=dtype)
    for call in (lambda: flash_attn_numpy(q, k, v, softmax_scale=1e38),
                 lambda: flash_attn_torch(*(torch.from_numpy(x) for x in (q, k, v)), softmax_scale=1e38)):
        _expect(ValueError, ["softmax_scale", "overflow", "float32"], call)
    # a scale whose scores fit but are too large to hold precisely (one ulp > 1/8 in log2 units) is refused too:
    # the backward's recomputation of P from lse would be meaningless (it gave NaN gradients on a GPU)
    for call in (lambda: flash_attn_numpy(q, k, v, softmax_scale=1e30),
                 lambda: flash_attn_torch(*(torch.from_numpy(x) for x in (q, k, v)), softmax_scale=1e30)):
        _expect(ValueError, ["softmax_scale", "precisely", "float32"], call)
    # float64 computes in float64: a scale that float32 cannot hold precisely is fine there, and matches
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    o = flash_attn_numpy(q64, k64, v64, softmax_scale=1e10)
    np.testing.assert_allclose(o, attention_reference(q64, k64, v64, softmax_scale=1e10), atol=1e-12)
    # a large scale that fits precisely is computed, and matches the reference
    o = flash_attn_numpy(q, k, v, softmax_scale=1e4)
    assert np.abs(o - attention_reference(q, k, v, softmax_scale=1e4)).max() < 1e-2


def test_reference_grads_apply_the_shared_checks():
    q, k, v = _qkv("torch")
    _expect(TypeError, ["attention_reference_grads", "causal"],
            lambda: attention_reference_grads(q, k, v, q, causal="False"))
    _expect(ValueError, ["attention_reference_grads", "do", "(1, 2, 8, 16)", "(1, 2, 3, 16)"],
            lambda: attention_reference_grads(q, k, v, q[:, :, :3]))
    _expect(TypeError, ["attention_reference_grads", "do"],
            lambda: attention_reference_grads(q, k, v, q.numpy()))


def _neg_view(x):
    """A view with torch's lazy negation bit whose values are x (its memory holds -x)."""
    y = torch.complex(torch.zeros_like(x), -x).conj().imag
    assert y.is_neg() and torch.equal(y, x)
    return y


def _torch_cpu_backends():
    return [pytest.param(b, id=b.name) for b in BACKENDS if b.array == "torch" and "cpu" in b.dtypes]


@pytest.mark.parametrize("backend", _torch_cpu_backends())
def test_conj_and_neg_views_are_resolved(backend):
    """torch.complex(a, b).conj().imag has is_neg() True: its values, not its memory, are attended over."""
    testing.skip_unless_available(backend, "cpu")
    a, b = torch.randn(1, 1, 16, 16), torch.randn(1, 1, 16, 16)
    q = torch.complex(a, b).conj().imag  # = -b, the reproducer
    k, v = torch.randn(1, 1, 16, 16), torch.randn(1, 1, 16, 16)
    assert q.is_neg()
    assert (backend.forward(q, k, v).double() - attention_reference(-b, k, v)).abs().max() < 1e-4
    assert (backend.forward(k, k, _neg_view(v)).double() - attention_reference(k, k, v)).abs().max() < 1e-4
    if backend.backward:  # gradients flow back through the resolved view
        base = q.clone().requires_grad_(True)
        view = torch.complex(torch.zeros_like(base), -base).conj().imag  # values: base, with the neg bit
        backend.forward(view, k, v).sum().backward()
        ref = attention_reference_grads(q, k, v, torch.ones(1, 1, 16, 16))[0]
        assert (base.grad.double() - ref).abs().max() < 1e-3


def test_double_backward_split_is_a_clear_error():
    """create_graph=True and a gradient penalty: a RuntimeError saying so, never a silently dropped term."""
    q, k, v = (x.requires_grad_(True) for x in _qkv("torch", dtype="float64"))
    o = flash_attn_torch(q, k, v)
    (gq,) = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="(?i)differentiable|double backward|twice"):
        gq.pow(2).sum().backward()
