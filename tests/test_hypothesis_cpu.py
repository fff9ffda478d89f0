"""Randomised shapes for the CPU backends (Hypothesis): any B, H, Nq, Nk, D, block sizes, causal.

80 examples per backend and direction, over four backend configurations: well over 200 examples per run.
"""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flash_attention_py import (
    attention_reference,
    attention_reference_grads,
    flash_attn_numpy,
    flash_attn_numpy_backward,
    flash_attn_torch,
    make_inputs,
    testing,
)

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.fixed_dictionaries(dict(
    B=st.integers(1, 2), H=st.integers(1, 3), Nq=st.integers(1, 90), Nk=st.integers(1, 90), D=st.integers(1, 48),
    block_m=st.integers(1, 70), block_n=st.integers(1, 70), causal=st.booleans(),
    dtype=st.sampled_from(["float64", "float32"]), scale=st.one_of(st.none(), st.floats(-2.0, 2.0)),
))
TOL = {"float64": 1e-10, "float32": 2e-5}


def _check(out, ref, dtype, what, s=None):
    """max-abs error within TOL x max(1, |ref|); for gradients (``s`` given) also x the backward's conditioning.

    The backward takes Delta_i = rowsum(dO_i * O_i) from the rounded O; its rounding reaches dK_j through
    scale * sum_i dS_ij Q_i, a sum over the queries: so the bound grows with |scale| and sqrt(N). (With Nk = 1
    the exact dK is 0 and the computed one is that rounding alone.)
    """
    max_abs, rel = testing.errors(out, ref)
    bound = TOL[dtype] * max(1.0, float(np.abs(testing.to_f64_numpy(ref)).max(initial=0)))
    if s is not None:
        bound *= max(1.0, abs(s["scale"] or 1.0)) * max(1.0, np.sqrt(max(s["Nq"], s["Nk"]) / 8))
    assert max_abs <= bound, f"{what}: max-abs {max_abs:.3e}, rel-norm {rel:.3e}, bound {bound:.3e}"


@pytest.mark.parametrize("loop_order", ["v1", "v2"])
@SETTINGS
@given(s=shapes)
def test_numpy_forward_and_backward(loop_order, s):
    x = make_inputs(s["B"], s["H"], s["Nq"], s["Nk"], s["D"], dtype=s["dtype"], kind="numpy")
    kw = dict(causal=s["causal"], softmax_scale=s["scale"])
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], return_lse=True, **kw)
    o, lse = flash_attn_numpy(x["q"], x["k"], x["v"], block_m=s["block_m"], block_n=s["block_n"],
                              loop_order=loop_order, return_lse=True, **kw)
    _check(o, o_ref, s["dtype"], "o")
    _check(lse, lse_ref, s["dtype"], "lse")
    dq, dk, dv = flash_attn_numpy_backward(x["q"], x["k"], x["v"], o, lse, x["do"], block_m=s["block_n"],
                                           block_n=s["block_m"], **kw)
    for g, g_ref, name in zip((dq, dk, dv), attention_reference_grads(x["q"], x["k"], x["v"], x["do"], **kw),
                              ("dq", "dk", "dv")):
        _check(g, g_ref, s["dtype"], name, s)


@SETTINGS
@given(s=shapes)
def test_torch_split_forward_and_backward(s):
    x = make_inputs(s["B"], s["H"], s["Nq"], s["Nk"], s["D"], dtype=s["dtype"], kind="torch", with_grad=True)
    kw = dict(causal=s["causal"], softmax_scale=s["scale"])
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], return_lse=True, **kw)
    o, lse = flash_attn_torch(x["q"], x["k"], x["v"], block_size=s["block_m"], return_lse=True, **kw)
    _check(o, o_ref, s["dtype"], "o")
    _check(lse, lse_ref, s["dtype"], "lse")
    o.backward(x["do"])
    refs = attention_reference_grads(x["q"], x["k"], x["v"], x["do"], **kw)
    for t, g_ref, name in zip((x["q"], x["k"], x["v"]), refs, ("dq", "dk", "dv")):
        _check(t.grad, g_ref, s["dtype"], name, s)
