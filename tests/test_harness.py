"""Every backend of the registry against the float64 reference: forward, lse and gradients.

Parametrised over the registry (``flash_attention_py.registry.BACKENDS``) and the cases, dtypes and
softmax_scale values of ``flash_attention_py.testing``: a new backend is tested here as soon as it has an
entry. Cases a backend cannot run here skip with the reason.
"""
import pytest

import flash_attention_py.testing as H


@pytest.mark.parametrize("backend,device,dtype,case,causal,scale", H.harness_params())
def test_forward(backend, device, dtype, case, causal, scale):
    H.skip_unless_available(backend, device)
    x = H.inputs_for(backend, device, dtype, case)
    kw = dict(causal=causal, softmax_scale=scale)
    o_ref, lse_ref = H.attention_reference(x["q"], x["k"], x["v"], return_lse=True, **kw)
    o, lse = backend.forward(x["q"], x["k"], x["v"], return_lse=True, **kw)
    assert tuple(o.shape) == tuple(x["q"].shape), f"output shape {tuple(o.shape)}"
    assert str(o.dtype).replace("torch.", "") == dtype, f"output dtype {o.dtype}, expected {dtype}"
    assert tuple(lse.shape) == tuple(x["q"].shape[:3]), f"lse shape {tuple(lse.shape)}"
    if backend.array == "torch":
        assert str(o.device).split(":")[0] == device
    o_naive, lse_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], **kw)
    where = dict(backend=backend.name, device=device, dtype=dtype)
    H.check_close("o", o, o_ref, o_naive, floor=H.FLOOR[dtype], **where)
    H.check_close("lse", lse, lse_ref, lse_naive, floor=H.LSE_FLOOR[dtype], **where)


@pytest.mark.parametrize("backend,device,dtype,case,causal,scale", H.harness_params(need_backward=True))
def test_backward(backend, device, dtype, case, causal, scale):
    H.skip_unless_available(backend, device)
    x = H.inputs_for(backend, device, dtype, case)
    kw = dict(causal=causal, softmax_scale=scale)
    grads_ref = H.attention_reference_grads(x["q"], x["k"], x["v"], x["do"], **kw)
    o, lse, *grads = backend.forward_backward(x["q"], x["k"], x["v"], x["do"], **kw)
    grads_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], do=x["do"], **kw)
    where = dict(backend=backend.name, device=device, dtype=dtype)
    floor = H.grad_floor(dtype, case, scale)  # grows with sqrt(N) and with |scale| * sqrt(D) above 1
    for name, g, g_ref, g_naive, ref_x in zip(("dq", "dk", "dv"), grads, grads_ref, grads_naive,
                                              (x["q"], x["k"], x["v"])):
        assert tuple(g.shape) == tuple(ref_x.shape), f"{name} shape {tuple(g.shape)}"
        assert str(g.dtype).replace("torch.", "") == dtype, f"{name} dtype {g.dtype}"
        H.check_close(name, g, g_ref, g_naive, floor=floor, **where)


# ------------------------------------------------------------------ the variants: window, GQA/MQA heads, dropout
@pytest.mark.parametrize("backend,device,dtype,vc", H.variant_params())
def test_variant_forward(backend, device, dtype, vc):
    H.skip_unless_available(backend, device)
    x = H.variant_inputs(backend, device, dtype, vc)
    kw = H.variant_kwargs(vc)
    o_ref, lse_ref = H.attention_reference(x["q"], x["k"], x["v"], return_lse=True, **kw)
    o, lse = backend.forward(x["q"], x["k"], x["v"], return_lse=True, **kw)
    assert tuple(o.shape) == tuple(x["q"].shape), f"output shape {tuple(o.shape)}"
    assert str(o.dtype).replace("torch.", "") == dtype, f"output dtype {o.dtype}, expected {dtype}"
    assert tuple(lse.shape) == tuple(x["q"].shape[:3]), f"lse shape {tuple(lse.shape)}"
    o_naive, lse_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], **kw)
    where = dict(backend=backend.name, device=device, dtype=dtype)
    H.check_close("o", o, o_ref, o_naive, floor=H.FLOOR[dtype] / (1.0 - vc["p"]), **where)
    H.check_close("lse", lse, lse_ref, lse_naive, floor=H.LSE_FLOOR[dtype], **where)


@pytest.mark.parametrize("backend,device,dtype,vc", H.variant_params(need_backward=True))
def test_variant_backward(backend, device, dtype, vc):
    H.skip_unless_available(backend, device)
    x = H.variant_inputs(backend, device, dtype, vc)
    kw = H.variant_kwargs(vc)
    grads_ref = H.attention_reference_grads(x["q"], x["k"], x["v"], x["do"], **kw)
    o, lse, *grads = backend.forward_backward(x["q"], x["k"], x["v"], x["do"], **kw)
    grads_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], do=x["do"], **kw)
    where = dict(backend=backend.name, device=device, dtype=dtype)
    floor = H.variant_grad_floor(dtype, vc, device)
    for name, g, g_ref, g_naive, ref_x in zip(("dq", "dk", "dv"), grads, grads_ref, grads_naive,
                                              (x["q"], x["k"], x["v"])):
        assert tuple(g.shape) == tuple(ref_x.shape), f"{name} shape {tuple(g.shape)}"  # dk, dv: Hk heads
        assert str(g.dtype).replace("torch.", "") == dtype, f"{name} dtype {g.dtype}"
        H.check_close(name, g, g_ref, g_naive, floor=floor, **where)


@pytest.mark.parametrize("backend,variant", H.refusal_params())
def test_variant_refused(backend, variant):
    """A backend whose capability does not list a variant refuses it, naming the argument (never a silent
    answer without it)."""
    q, k, v, kw, word = H.refusal_call(backend, variant)
    with pytest.raises(ValueError, match=word):
        backend.forward(q, k, v, **kw)
