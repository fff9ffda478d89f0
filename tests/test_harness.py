"""Every backend of the registry against the float64 reference: forward, lse and gradients.

Parametrised over the registry (``flash_attention_py.registry.BACKENDS``): a new backend is
tested here as soon as it has an entry. Cases a backend cannot run here skip with the reason.
"""
import pytest

import harness as H


@pytest.mark.parametrize("backend,device,dtype,case,causal", H.harness_params())
def test_forward(backend, device, dtype, case, causal):
    H.skip_unless_available(backend, device)
    x = H.inputs_for(backend, device, dtype, case)
    o_ref, lse_ref = H.attention_reference(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
    o, lse = backend.forward(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
    assert tuple(o.shape) == tuple(x["q"].shape), f"output shape {tuple(o.shape)}"
    assert str(o.dtype).replace("torch.", "") == dtype, f"output dtype {o.dtype}, expected {dtype}"
    assert tuple(lse.shape) == tuple(x["q"].shape[:3]), f"lse shape {tuple(lse.shape)}"
    if backend.array == "torch":
        assert str(o.device).split(":")[0] == device
    o_naive, lse_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], causal=causal)
    kw = dict(backend=backend.name, device=device, dtype=dtype)
    H.check_close("o", o, o_ref, o_naive, floor=H.FLOOR[dtype], **kw)
    H.check_close("lse", lse, lse_ref, lse_naive, floor=H.LSE_FLOOR[dtype], **kw)


@pytest.mark.parametrize("backend,device,dtype,case,causal", H.harness_params(need_backward=True))
def test_backward(backend, device, dtype, case, causal):
    H.skip_unless_available(backend, device)
    x = H.inputs_for(backend, device, dtype, case)
    grads_ref = H.attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=causal)
    o, lse, *grads = backend.forward_backward(x["q"], x["k"], x["v"], x["do"], causal=causal)
    grads_naive = H.naive_same_precision(backend, device, x["q"], x["k"], x["v"], causal=causal, do=x["do"])
    kw = dict(backend=backend.name, device=device, dtype=dtype)
    # gradients sum over a row or column of the attention matrix: allow the floor to grow with sqrt(N)
    floor = H.FLOOR[dtype] * H.math.sqrt(max(case["Nq"], case["Nk"]))
    for name, g, g_ref, g_naive, ref_x in zip(("dq", "dk", "dv"), grads, grads_ref, grads_naive,
                                              (x["q"], x["k"], x["v"])):
        assert tuple(g.shape) == tuple(ref_x.shape), f"{name} shape {tuple(g.shape)}"
        assert str(g.dtype).replace("torch.", "") == dtype, f"{name} dtype {g.dtype}"
        H.check_close(name, g, g_ref, g_naive, floor=floor, **kw)
