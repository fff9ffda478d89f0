"""The shared pieces themselves: reference semantics, causal rule, FLOP formula, input generator, registry."""
import math

import numpy as np
import pytest
import torch

from flash_attention_py import attention_flops, attention_reference, flash_attn_numpy, make_inputs, masks
from flash_attention_py.registry import BACKENDS, get_backend
from flash_attention_py import attention_reference_grads
import flash_attention_py.testing as harness


def test_causal_rule_bottom_right():
    def causal_visible(q_idx, k_idx, Nq, Nk):
        return masks.visible(np.asarray(q_idx), np.asarray(k_idx), Nq, Nk, masks.CAUSAL)

    # Nq = 2, Nk = 5: the two queries are the last two positions
    assert causal_visible(range(2), range(5), 2, 5).astype(int).tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # Nq = 5, Nk = 2: the first three queries see nothing
    assert causal_visible(range(5), range(2), 5, 2).astype(int).tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    assert np.array_equal(causal_visible(range(4), range(4), 4, 4), np.tril(np.ones((4, 4), bool)))
    # the K/V loop of a block of queries [.., q_end) stops where its last query's keys end
    assert masks.window_for(True) == masks.CAUSAL and masks.window_for(False) == masks.FULL
    assert masks.kv_range(0, 2, 5, 2, masks.CAUSAL)[1] == 0 and masks.kv_range(0, 5, 5, 2, masks.CAUSAL)[1] == 2
    assert masks.kv_range(0, 1, 2, 5, masks.CAUSAL) == (0, 4)


def test_rows_that_see_no_key_give_zero_and_minus_inf():
    x = make_inputs(1, 2, 7, 3, 8, kind="numpy", dtype="float64")
    o, lse = attention_reference(x["q"], x["k"], x["v"], causal=True, return_lse=True)
    assert np.all(o[:, :, :4] == 0) and np.all(np.isneginf(lse[:, :, :4]))
    assert np.all(np.isfinite(lse[:, :, 4:]))
    for order in ("v1", "v2"):
        o2, lse2 = flash_attn_numpy(x["q"], x["k"], x["v"], causal=True, loop_order=order, return_lse=True,
                                    block_m=2, block_n=2)
        assert np.all(o2[:, :, :4] == 0) and np.all(np.isneginf(lse2[:, :, :4]))


def test_reference_matches_an_explicit_loop():
    x = make_inputs(1, 1, 5, 6, 4, kind="numpy", dtype="float64")
    q, k, v = x["q"][0, 0], x["k"][0, 0], x["v"][0, 0]
    scale = 0.7
    o = attention_reference(x["q"], x["k"], x["v"], softmax_scale=scale)[0, 0]
    for i in range(5):
        s = [scale * float(q[i] @ k[j]) for j in range(6)]
        w = [math.exp(t - max(s)) for t in s]
        expect = sum(wj * v[j] for j, wj in enumerate(w)) / sum(w)
        np.testing.assert_allclose(o[i], expect, rtol=1e-12)


def test_reference_accepts_torch_and_returns_float64():
    x = make_inputs(2, 1, 9, 9, 8, kind="torch", dtype="float16")
    o = attention_reference(x["q"], x["k"], x["v"])
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float64


def test_flops_formula():
    assert attention_flops(1, 1, 10, 20, 8) == 4 * 10 * 20 * 8
    assert attention_flops(2, 3, 10, 10, 8, causal=True) == 0.5 * 4 * 2 * 3 * 100 * 8
    assert attention_flops(1, 1, 10, 10, 8, mode="bwd") == 2.5 * 4 * 100 * 8
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, 1, 1, 1, mode="backward")


def test_make_inputs_is_fresh_random_and_noncontiguous_when_asked():
    a, b = make_inputs(1, 2, 8, 8, 4, kind="numpy"), make_inputs(1, 2, 8, 8, 4, kind="numpy")
    assert not np.array_equal(a["q"], b["q"]) and np.abs(a["q"]).min() > 0
    t = make_inputs(2, 3, 8, 5, 4, kind="torch", layout="bnhd")
    assert tuple(t["q"].shape) == (2, 3, 8, 4) and tuple(t["k"].shape) == (2, 3, 5, 4)
    assert not t["q"].is_contiguous()
    n = make_inputs(2, 3, 8, 5, 4, kind="numpy", layout="bnhd", dtype="float16")
    assert n["q"].dtype == np.float16 and not n["q"].flags.c_contiguous


def test_make_inputs_draws_on_the_device_when_asked():
    """draw='device' (torch.randn where the tensors live; on the CPU here): fresh unless seeded, the same shapes,
    dtypes, layout and grad flags as draw='host'; refused for NumPy and for an unknown draw."""
    import torch

    a, b = (make_inputs(2, 4, 9, 7, 8, kind="torch", dtype="bfloat16", Hk=2, draw="device") for _ in range(2))
    assert tuple(a["q"].shape) == (2, 4, 9, 8) and tuple(a["k"].shape) == (2, 2, 7, 8) == tuple(a["v"].shape)
    assert all(x.dtype == torch.bfloat16 for x in a.values()) and not torch.equal(a["q"], b["q"])
    assert 0.5 < float(a["q"].float().std()) < 1.5
    s1, s2 = (make_inputs(1, 2, 8, 8, 4, kind="torch", seed=3, draw="device") for _ in range(2))
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    t = make_inputs(2, 3, 8, 5, 4, kind="torch", layout="bnhd", with_grad=True, draw="device")
    assert not t["q"].is_contiguous() and t["q"].requires_grad and not t["do"].requires_grad
    with pytest.raises(ValueError, match="make_inputs: draw='device' needs kind='torch'"):
        make_inputs(1, 1, 4, 4, 4, kind="numpy", draw="device")
    with pytest.raises(ValueError, match="make_inputs: draw must be 'host' or 'device', got 'gpu'"):
        make_inputs(1, 1, 4, 4, 4, draw="gpu")


def test_hbm_stats_v1_vs_v2():
    N, D, Br, Bc = 256, 16, 32, 64
    x = make_inputs(1, 1, N, N, D, kind="numpy")
    s1, s2 = {}, {}
    flash_attn_numpy(x["q"], x["k"], x["v"], loop_order="v1", block_m=Br, block_n=Bc, hbm_stats=s1)
    flash_attn_numpy(x["q"], x["k"], x["v"], loop_order="v2", block_m=Br, block_n=Bc, hbm_stats=s2)
    Tr, Tc = N // Br, N // Bc
    assert s1["read_k"] == N * D and s1["read_q"] == Tc * N * D and s1["write_o"] == Tc * N * D
    assert s2["read_q"] == N * D and s2["read_k"] == Tr * N * D and s2["write_o"] == N * D


def test_registry_entries_are_complete():
    from flash_attention_py.registry import CAPABILITIES

    names = [b.name for b in BACKENDS]
    assert len(names) == len(set(names))
    assert set(names) == set(CAPABILITIES), "every capability table entry is a registry backend and vice versa"
    for b in BACKENDS:
        assert b.array in ("numpy", "torch") and b.dtypes and b.rung
        assert b.capability.name == b.name  # its package's capability table has an entry of that name
        assert callable(b.load_forward)
        if b.array == "numpy" and b.backward:
            assert callable(b.load_backward)
    assert get_backend("numpy-v2").unavailable_reason("cpu") is None
    assert "does not run on cuda" in get_backend("numpy-v2").unavailable_reason("cuda")


# ------------------------------------------------------------------ non-finite semantics (issue: NaN became 0)
def _pattern_equal(out, ref):
    out, ref = harness.to_f64_numpy(out), harness.to_f64_numpy(ref)
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN pattern differs from the reference"
    assert np.array_equal(np.isinf(out), np.isinf(ref)) and np.array_equal(out[np.isinf(ref)], ref[np.isinf(ref)])
    fin = np.isfinite(ref)
    assert np.allclose(out[fin], ref[fin], rtol=1e-3, atol=1e-4)


def test_reference_nonfinite_semantics():
    """NaN in, NaN out; a +inf score gives O = NaN and lse = +inf; only -inf scores give 0 / -inf."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(3))
    q[0, 0, 1, 3] = np.nan
    k2 = k.copy()
    k2[0, 0, 0, :] = np.inf * np.sign(q[0, 0, 2])  # row 2's score with key 0: sum of +inf = +inf
    o, lse = attention_reference(q, k2, v, return_lse=True)
    assert np.isnan(o[0, 0, 1]).all() and np.isnan(lse[0, 0, 1])
    assert np.isnan(o[0, 0, 2]).all() and lse[0, 0, 2] == np.inf
    # every score -inf (data, not the mask): the row attends to nothing, like a row that sees no key
    k3 = np.full_like(k, 0.0)
    k3[..., 0] = np.inf
    q3 = np.ones_like(q)
    q3[..., 0] = -1.0
    o3, lse3 = attention_reference(q3, k3, v, return_lse=True)
    assert (o3 == 0).all() and np.isneginf(lse3).all()


def test_reference_keeps_nan_in_causal_rows_with_more_queries_than_keys():
    """causal and Nq > Nk: rows that see no key give 0, but a NaN elsewhere stays NaN (was turned into 0)."""
    x = make_inputs(1, 1, 6, 3, 4, kind="numpy", dtype="float64")
    q = x["q"].copy()
    q[0, 0, 5, 0] = np.nan
    o, lse = attention_reference(q, x["k"], x["v"], causal=True, return_lse=True)
    assert (o[0, 0, :3] == 0).all() and np.isneginf(lse[0, 0, :3]).all()
    assert np.isnan(o[0, 0, 5]).all() and np.isnan(lse[0, 0, 5])
    assert np.isfinite(o[0, 0, 3:5]).all()


def _nonfinite_params():
    cases = [("q", np.nan), ("k", np.nan), ("k", np.inf), ("v", -np.inf), ("q", -np.inf)]
    out = []
    for b in BACKENDS:
        if b.unavailable_reason("cpu") is not None:
            continue
        for where, value in cases:
            if b.slow_on_cpu and where != "q":  # the interpreter is slow; the adversarial module has more cases
                continue
            out.append(pytest.param(b, where, value, id=f"{b.name}-{where}-{value}"))
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend,where,value", _nonfinite_params())
def test_nonfinite_inputs_match_the_reference(backend, where, value):
    """The issue's reproducer, in every backend here: o, lse and the gradients keep the reference's NaN/inf."""
    rng = np.random.default_rng(1)
    arrays = {n: rng.standard_normal((1, 2, 6, 16)) for n in ("q", "k", "v", "do")}
    arrays[where][0, 1, 3 if where == "q" else 0, 5] = value
    dt = "float32" if "float32" in backend.dtypes["cpu"] else backend.dtypes["cpu"][0]
    if backend.array == "numpy":
        q, k, v, do = (arrays[n].astype(dt) for n in ("q", "k", "v", "do"))
    else:
        q, k, v, do = (torch.from_numpy(arrays[n]).to(getattr(torch, dt)) for n in ("q", "k", "v", "do"))
    for causal in (False, True):
        o, lse, dq, dk, dv = backend.forward_backward(q, k, v, do, causal=causal)
        o_ref, lse_ref = attention_reference(q, k, v, causal=causal, return_lse=True)
        _pattern_equal(o, o_ref)
        _pattern_equal(lse, lse_ref)
        for g, g_ref in zip((dq, dk, dv), attention_reference_grads(q, k, v, do, causal=causal)):
            _pattern_equal(g, g_ref)
        if where == "q" and np.isnan(value):  # the issue's case: that row was 0 / -inf, dq = 0
            assert np.isnan(harness.to_f64_numpy(o)[0, 1, 3]).all()
            assert np.isnan(harness.to_f64_numpy(lse)[0, 1, 3])
            assert np.isnan(harness.to_f64_numpy(dq)[0, 1, 3]).all()


def test_issue_reproducer_numpy_nan_query():
    q, k, v = (np.random.default_rng(0).standard_normal((1, 1, 4, 8)).astype(np.float32) for _ in range(3))
    q[0, 0, 1, 3] = np.nan
    o, lse = flash_attn_numpy(q, k, v, return_lse=True)
    assert np.isnan(o[0, 0, 1]).all() and np.isnan(lse[0, 0, 1])
    assert np.isfinite(o[0, 0, [0, 2, 3]]).all()
    k[0, 0, 2, 0] = np.nan  # one NaN in one key row: every output row is NaN, not 0
    assert np.isnan(flash_attn_numpy(q, k, v)).all()
