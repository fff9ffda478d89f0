"""The attention variants (sliding window, grouped-query attention, dropout) in the reference and the Python rungs.

Every rung (NumPy v1 and v2 loops with the NumPy backward, the split PyTorch loop with its autograd backward)
against the float64 reference, under the harness's tolerance policy: max-abs error at most 2x that of naive
attention in the same dtype (with the same variants) plus the dtype's floor (``flash_attention_py.testing``).
Then what the comparison cannot show: the exact dropout mask (the zeros of P * Z are where
``philox.keep_mask`` says), its keep rate, rows that see no key, the refusals of bad arguments, and that
grouped-query attention never copies K or V.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from flash_attention_py import (attention_naive, attention_reference, attention_reference_grads, flash_attn_numpy,
                                flash_attn_numpy_backward, flash_attn_torch, philox)
from flash_attention_py.testing import FLOOR, LSE_FLOOR, check_close, grad_floor

# (B, Hq, Hk, Nq, Nk, D, causal, window_size, dropout_p, dtype, Br, Bc): sampled combinations of the axes
# windows (0, 0) / (w, -1) with causal / asymmetric (2, 5) / larger than N / none, Hq/Hk = 1, 2, Hq,
# dropout_p 0, 0.17, 0.5, and odd sizes (N = 1, 17, 100; Nq != Nk both ways)
CASES = [
    (1, 2, 2, 17, 17, 16, False, (0, 0), 0.0, "float32", 8, 8),
    (2, 4, 2, 100, 100, 32, True, (8, -1), 0.17, "float32", 16, 24),
    (1, 3, 1, 17, 100, 16, False, (2, 5), 0.5, "float32", 8, 16),
    (2, 2, 1, 100, 37, 16, False, (200, 300), 0.0, "float32", 32, 16),
    (1, 2, 1, 1, 1, 8, False, (2, 5), 0.17, "float32", 4, 4),
    (1, 4, 4, 37, 17, 8, True, (-1, -1), 0.5, "float32", 16, 8),
    (1, 4, 2, 1, 100, 64, True, (4, -1), 0.17, "float64", 16, 32),
    (1, 2, 1, 40, 40, 16, False, (3, 3), 0.17, "float16", 16, 16),
]


def _case_id(c):
    B, Hq, Hk, Nq, Nk, D, causal, w, p, dt = c[:10]
    return f"B{B}H{Hq}k{Hk}-q{Nq}k{Nk}-d{D}-{'causal' if causal else 'full'}-w{w[0]},{w[1]}-p{p}-{dt}"


def _arrays(rng, B, Hq, Hk, Nq, Nk, D, dtype="float64"):
    """Fresh random q, do (B, Hq, Nq, D) and k, v (B, Hk, Nk, D) as NumPy arrays of ``dtype``."""
    q, do = rng.standard_normal((2, B, Hq, Nq, D))
    k, v = rng.standard_normal((2, B, Hk, Nk, D))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def _naive(q, k, v, do, dtype, **kw):
    """Naive attention in ``dtype`` with the same variants: (o, lse) and (dq, dk, dv), the tolerance yardstick."""
    q, k, v, do = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (q, k, v, do))
    o, lse = attention_naive(q, k, v, return_lse=True, **kw)
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    attention_naive(q, k, v, **kw).backward(do)
    return (o, lse), (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_rungs_match_the_reference(case):
    B, Hq, Hk, Nq, Nk, D, causal, window, p, dtype, Br, Bc = case
    rng = np.random.default_rng()
    q, k, v, do = _arrays(rng, B, Hq, Hk, Nq, Nk, D, dtype)
    kw = dict(causal=causal, window_size=window, dropout_p=p, dropout_seed=int(rng.integers(2**63)) if p else None)
    o_ref, lse_ref = attention_reference(q, k, v, return_lse=True, **kw)
    grads_ref = attention_reference_grads(q, k, v, do, **kw)
    (o_nv, lse_nv), grads_nv = _naive(q, k, v, do, dtype, **kw)
    shape = dict(Nq=Nq, Nk=Nk, D=D)
    floors = dict(o=FLOOR[dtype], lse=LSE_FLOOR[dtype], grad=grad_floor(dtype, shape))

    def check(name, outs, grads):
        where = dict(backend=name, device="cpu", dtype=dtype)
        check_close("o", outs[0], o_ref, o_nv, floor=floors["o"], **where)
        check_close("lse", outs[1], lse_ref, lse_nv, floor=floors["lse"], **where)
        for g_name, g, g_ref, g_nv in zip(("dq", "dk", "dv"), grads, grads_ref, grads_nv):
            assert tuple(g.shape) == tuple(g_ref.shape), (name, g_name)
            check_close(g_name, g, g_ref, g_nv, floor=floors["grad"], **where)

    if dtype != "bfloat16":  # NumPy has no bfloat16
        for order in ("v1", "v2"):
            o, lse = flash_attn_numpy(q, k, v, return_lse=True, loop_order=order, block_m=Br, block_n=Bc, **kw)
            check(f"numpy-{order}", (o, lse),
                  flash_attn_numpy_backward(q, k, v, o, lse, do, block_m=Br, block_n=Bc, **kw))
    qt, kt, vt = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    o, lse = flash_attn_torch(qt, kt, vt, return_lse=True, block_size=Bc, **kw)
    o.backward(torch.from_numpy(do))
    check("torch-split", (o, lse), (qt.grad, kt.grad, vt.grad))


def test_bfloat16_torch_split_with_every_variant():
    rng = np.random.default_rng()
    q, k, v, do = _arrays(rng, 1, 4, 2, 33, 47, 16)
    kw = dict(causal=True, window_size=(9, 2), dropout_p=0.17, dropout_seed=int(rng.integers(2**64, dtype=np.uint64)))
    (o_nv, lse_nv), grads_nv = _naive(q, k, v, do, "bfloat16", **kw)
    qt, kt, vt = (torch.from_numpy(x).to(torch.bfloat16).requires_grad_(True) for x in (q, k, v))
    o, lse = flash_attn_torch(qt, kt, vt, return_lse=True, block_size=16, **kw)
    o.backward(torch.from_numpy(do).to(torch.bfloat16))
    refs = (qt.detach(), kt.detach(), vt.detach())  # the reference of the rounded inputs
    o_ref, lse_ref = attention_reference(*refs, return_lse=True, **kw)
    grads_ref = attention_reference_grads(*refs, torch.from_numpy(do).to(torch.bfloat16), **kw)
    where = dict(backend="torch-split", device="cpu", dtype="bfloat16")
    check_close("o", o, o_ref, o_nv, floor=FLOOR["bfloat16"], **where)
    check_close("lse", lse, lse_ref, lse_nv, floor=LSE_FLOOR["bfloat16"], **where)
    for name, g, g_ref, g_nv in zip(("dq", "dk", "dv"), (qt.grad, kt.grad, vt.grad), grads_ref, grads_nv):
        check_close(name, g, g_ref, g_nv, floor=grad_floor("bfloat16", dict(Nq=33, Nk=47, D=16)), **where)


# ------------------------------------------------------------------ dropout: the exact mask and its rate
def _every_rung(q, k, v, **kw):
    """O (float64 NumPy) of every Python function that takes the variants."""
    t = [torch.from_numpy(x) for x in (q, k, v)]
    return {
        "reference": attention_reference(q, k, v, **kw),
        "naive": attention_naive(q, k, v, **kw),
        "numpy-v1": flash_attn_numpy(q, k, v, loop_order="v1", block_m=5, block_n=7, **kw),
        "numpy-v2": flash_attn_numpy(q, k, v, loop_order="v2", block_m=5, block_n=7, **kw),
        "torch-split": flash_attn_torch(*t, block_size=6, **kw).numpy(),
    }


def test_dropout_zeros_are_where_keep_mask_says():
    """v = identity (Nk = D), so O = P * Z / (1 - p) itself: its zeros are exactly the dropped weights of
    ``philox.keep_mask`` for query head h (not the K/V head), and the kept ones are P / (1 - p)."""
    rng = np.random.default_rng()
    B, Hq, Hk, Nq, Nk = 2, 4, 2, 11, 16
    q, k, _, _ = _arrays(rng, B, Hq, Hk, Nq, Nk, Nk)
    v = np.broadcast_to(np.eye(Nk), (B, Hk, Nk, Nk)).copy()
    p, seed = 0.5, int(rng.integers(2**64, dtype=np.uint64))
    P = attention_reference(q, k, v)  # the weights before dropout (all > 0: full attention, finite scores)
    keep = np.stack([np.stack([philox.keep_mask(seed, p, b, h, np.arange(Nq), np.arange(Nk), Hq, Nq, Nk)
                               for h in range(Hq)]) for b in range(B)])
    assert 0 < keep.mean() < 1
    for name, o in _every_rung(q, k, v, dropout_p=p, dropout_seed=seed).items():
        assert np.array_equal(o != 0, keep), name
        np.testing.assert_allclose(o[keep], P[keep] / (1 - p), rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("p", [0.17, 0.5])
def test_dropout_keep_rate(p):
    """The fraction of kept weights is 1 - p within 5 standard deviations (v = identity: O shows them)."""
    rng = np.random.default_rng()
    B, H, Nq, Nk = 2, 2, 64, 64
    q, k, _, _ = _arrays(rng, B, H, H, Nq, Nk, Nk)
    v = np.broadcast_to(np.eye(Nk), (B, H, Nk, Nk)).copy()
    n = B * H * Nq * Nk
    for name, o in _every_rung(q, k, v, dropout_p=p, dropout_seed=int(rng.integers(2**63))).items():
        rate = np.count_nonzero(o) / n
        assert abs(rate - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), (name, rate)


def test_dropout_seed_matters_and_repeats():
    rng = np.random.default_rng()
    q, k, v, _ = _arrays(rng, 1, 2, 1, 9, 13, 8)
    seed = int(rng.integers(2**32))
    a = flash_attn_numpy(q, k, v, dropout_p=0.3, dropout_seed=seed)
    assert np.array_equal(a, flash_attn_numpy(q, k, v, dropout_p=0.3, dropout_seed=seed))
    assert not np.array_equal(a, flash_attn_numpy(q, k, v, dropout_p=0.3, dropout_seed=seed + 2**32))  # high half


# ------------------------------------------------------------------ rows that see no key
def test_rows_that_see_no_key_give_zero_and_minus_inf():
    """window (0, 0) with Nq = 6 > Nk = 3: query i sees key i - 3 only, so rows 0..2 see none."""
    rng = np.random.default_rng()
    q, k, v, do = _arrays(rng, 1, 4, 2, 6, 3, 8)
    kw = dict(window_size=(0, 0), dropout_p=0.17, dropout_seed=7)
    grads_ref = attention_reference_grads(q, k, v, do, **kw)
    outs = {}
    for order in ("v1", "v2"):
        o, lse = flash_attn_numpy(q, k, v, return_lse=True, loop_order=order, block_m=2, block_n=2, **kw)
        outs[f"numpy-{order}"] = (o, lse, flash_attn_numpy_backward(q, k, v, o, lse, do, block_m=2, block_n=2, **kw))
    qt, kt, vt = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    o, lse = flash_attn_torch(qt, kt, vt, return_lse=True, block_size=2, **kw)
    o.backward(torch.from_numpy(do))
    outs["torch-split"] = (o.detach().numpy(), lse.numpy(), (qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()))
    o, lse = attention_reference(q, k, v, return_lse=True, **kw)
    outs["reference"] = (o, lse, grads_ref)
    for name, (o, lse, grads) in outs.items():
        assert np.all(o[:, :, :3] == 0) and np.all(np.isneginf(lse[:, :, :3])), name
        assert np.all(np.isfinite(lse[:, :, 3:])), name
        assert np.all(grads[0][:, :, :3] == 0) and all(np.isfinite(g).all() for g in grads), name


# ------------------------------------------------------------------ bad arguments
def _public_calls(kind_args):
    """name -> call(**variant kwargs) for every public function of the reference and the Python rungs."""
    q, k, v, do = kind_args["numpy"]
    o, lse = flash_attn_numpy(q, k, v, return_lse=True)
    tq, tk, tv, _ = kind_args["torch"]
    return {
        "attention_reference": lambda **kw: attention_reference(q, k, v, **kw),
        "attention_naive": lambda **kw: attention_naive(tq, tk, tv, **kw),
        "attention_reference_grads": lambda **kw: attention_reference_grads(q, k, v, do, **kw),
        "flash_attn_numpy": lambda **kw: flash_attn_numpy(q, k, v, **kw),
        "flash_attn_numpy_backward": lambda **kw: flash_attn_numpy_backward(q, k, v, o, lse, do, **kw),
        "flash_attn_torch": lambda **kw: flash_attn_torch(tq, tk, tv, **kw),
    }


BAD_VARIANTS = [
    (dict(window_size=(1,)), ValueError, ["window_size", "2 entries"]),
    (dict(window_size=(1, 2, 3)), ValueError, ["window_size", "2 entries"]),
    (dict(window_size=4), TypeError, ["window_size", "int 4"]),
    (dict(window_size="ab"), TypeError, ["window_size", "str"]),
    (dict(window_size=(1.5, 0)), TypeError, ["window_size left", "float"]),
    (dict(window_size=(0, True)), TypeError, ["window_size right", "bool"]),
    (dict(window_size=(-2, 0)), ValueError, ["window_size left", ">= -1", "-2"]),
    (dict(window_size=(3, -5)), ValueError, ["window_size right", ">= -1", "-5"]),
    (dict(dropout_p=1.0, dropout_seed=1), ValueError, ["dropout_p", "[0, 1)"]),
    (dict(dropout_p=-0.1, dropout_seed=1), ValueError, ["dropout_p", "[0, 1)"]),
    (dict(dropout_p=float("nan"), dropout_seed=1), ValueError, ["dropout_p", "[0, 1)"]),
    (dict(dropout_p="0.1", dropout_seed=1), TypeError, ["dropout_p", "str"]),
    (dict(dropout_p=0.1, dropout_seed=1.5), TypeError, ["dropout_seed", "float"]),
    (dict(dropout_p=0.1, dropout_seed=-1), ValueError, ["dropout_seed", "[0, 2**64)"]),
    (dict(dropout_p=0.1), ValueError, ["dropout_seed", "needs"]),
    (dict(causal="yes"), TypeError, ["causal", "True or False"]),
]


def test_bad_variant_arguments_are_refused_by_name():
    rng = np.random.default_rng()
    arrays = _arrays(rng, 1, 2, 1, 5, 6, 8)
    calls = _public_calls({"numpy": arrays, "torch": tuple(torch.from_numpy(x) for x in arrays)})
    for fn_name, call in calls.items():
        call(window_size=(1, 2), dropout_p=0.2, dropout_seed=3)  # the good call runs
        for kw, exc, words in BAD_VARIANTS:
            with pytest.raises(exc) as info:
                call(**kw)
            for w in [fn_name, *words]:
                assert w in str(info.value), f"{fn_name}({kw}): {str(info.value)!r} should mention {w!r}"


def test_heads_that_do_not_divide_are_refused():
    rng = np.random.default_rng()
    arrays = _arrays(rng, 1, 4, 3, 5, 6, 8)
    calls = _public_calls({"numpy": _arrays(rng, 1, 4, 2, 5, 6, 8),
                           "torch": tuple(torch.from_numpy(x) for x in arrays)})
    q, k, v, do = arrays
    calls["attention_reference"] = lambda: attention_reference(q, k, v)
    calls["attention_reference_grads"] = lambda: attention_reference_grads(q, k, v, do)
    calls["flash_attn_numpy"] = lambda: flash_attn_numpy(q, k, v)
    o = np.zeros_like(q)
    calls["flash_attn_numpy_backward"] = lambda: flash_attn_numpy_backward(q, k, v, o, o[..., 0], do)
    for fn_name, call in calls.items():
        with pytest.raises(ValueError) as info:
            call()
        for w in (fn_name, "H = 4", "Hk = 3", "H % Hk == 0"):
            assert w in str(info.value), (fn_name, str(info.value))


# ------------------------------------------------------------------ GQA reads K/V by index: no copy
def test_numpy_gqa_makes_no_copy_of_k_and_v():
    """Hq = 32 query heads on one K/V head: K expanded to the query heads would be 32x K's size; the forward
    and backward together (with dropout) allocate less than a quarter of that at their peak (their tiles,
    the keep mask of one block, and dK, dV of K's own size)."""
    rng = np.random.default_rng()
    B, Hq, Nq, Nk, D = 1, 32, 8, 8192, 32
    q, k, v, do = _arrays(rng, B, Hq, 1, Nq, Nk, D, "float32")
    expanded = B * Hq * Nk * D * 4  # bytes of K as Hq heads
    kw = dict(dropout_p=0.1, dropout_seed=1, block_n=64)
    tracemalloc.start()
    try:
        o, lse = flash_attn_numpy(q, k, v, return_lse=True, **kw)
        flash_attn_numpy_backward(q, k, v, o, lse, do, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < expanded / 4, (peak, expanded)


def test_torch_split_gqa_makes_no_copy_of_k_and_v():
    """The same for the split PyTorch loop, forward and backward: no tensor any op makes is as large as a
    quarter of K expanded to the query heads (every op is seen through a TorchDispatchMode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestOutput(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                    LargestOutput.largest = max(LargestOutput.largest, t.untyped_storage().nbytes())
            return out

    B, Hq, Nq, Nk, D = 1, 16, 8, 2048, 32
    q = torch.randn(B, Hq, Nq, D, requires_grad=True)
    k, v = (torch.randn(B, 1, Nk, D, requires_grad=True) for _ in range(2))
    expanded = B * Hq * Nk * D * 4
    with LargestOutput():
        o = flash_attn_torch(q, k, v, dropout_p=0.1, dropout_seed=1, block_size=128)
        o.backward(torch.randn_like(o))
    assert k.grad.shape == k.shape and v.grad.shape == v.shape
    assert 0 < LargestOutput.largest < expanded / 4, (LargestOutput.largest, expanded)


# ------------------------------------------------------------------ the torch rungs on a GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (torch.cuda.is_available() is False)")
def test_torch_rungs_on_cuda_take_every_variant():
    """On the GPU the keep mask is drawn by torch on the device: the same bits as ``philox.keep_mask`` (v =
    identity shows them), and the split loop with every variant meets the policy against the reference."""
    rng = np.random.default_rng()
    B, Hq, Hk, Nq, Nk = 2, 4, 2, 11, 16
    q, k, _, _ = _arrays(rng, B, Hq, Hk, Nq, Nk, Nk)
    v = np.broadcast_to(np.eye(Nk), (B, Hk, Nk, Nk)).copy()
    p, seed = 0.5, int(rng.integers(2**64, dtype=np.uint64))
    keep = np.stack([np.stack([philox.keep_mask(seed, p, b, h, np.arange(Nq), np.arange(Nk), Hq, Nq, Nk)
                               for h in range(Hq)]) for b in range(B)])
    qc, kc, vc = (torch.from_numpy(x).cuda() for x in (q, k, v))
    for name, fn in (("reference", attention_reference), ("naive", attention_naive), ("torch-split", flash_attn_torch)):
        o = fn(qc, kc, vc, dropout_p=p, dropout_seed=seed)
        assert o.is_cuda and np.array_equal(o.cpu().numpy() != 0, keep), name

    B, Hq, Hk, Nq, Nk, D = 2, 4, 1, 100, 77, 64
    q, k, v, do = _arrays(rng, B, Hq, Hk, Nq, Nk, D, "float32")
    kw = dict(causal=True, window_size=(20, -1), dropout_p=0.17, dropout_seed=int(rng.integers(2**63)))
    o_ref, lse_ref = attention_reference(q, k, v, return_lse=True, **kw)
    grads_ref = attention_reference_grads(q, k, v, do, **kw)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the split loop's float32 matmuls in full float32, like naive's
    try:
        qc, kc, vc, doc = (torch.from_numpy(x).cuda() for x in (q, k, v, do))
        o_nv, lse_nv = attention_naive(qc, kc, vc, return_lse=True, **kw)
        qn, kn, vn = (x.clone().requires_grad_(True) for x in (qc, kc, vc))
        attention_naive(qn, kn, vn, **kw).backward(doc)
        qt, kt, vt = (x.clone().requires_grad_(True) for x in (qc, kc, vc))
        o, lse = flash_attn_torch(qt, kt, vt, return_lse=True, block_size=32, **kw)
        o.backward(doc)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    where = dict(backend="torch-split", device="cuda", dtype="float32")
    check_close("o", o, o_ref, o_nv, floor=FLOOR["float32"], **where)
    check_close("lse", lse, lse_ref, lse_nv, floor=LSE_FLOOR["float32"], **where)
    for name, g, g_ref, g_nv in zip(("dq", "dk", "dv"), (qt.grad, kt.grad, vt.grad), grads_ref,
                                    (qn.grad, kn.grad, vn.grad)):
        check_close(name, g, g_ref, g_nv, floor=grad_floor("float32", dict(Nq=Nq, Nk=Nk, D=D)), **where)
