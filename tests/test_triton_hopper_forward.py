"""flash_attention_triton/hopper_forward.py: the Gluon forward that runs the Triton rung's forward on a Hopper.

On any machine: the dispatch takes only what the kernel handles (that the kernel compiles for sm_90, which is what a
CPU can check of it, Gluon having no interpreter: tests/test_triton_aot_compile.py). On an sm_90 GPU: the kernel against the float64 reference on odd
sizes, Nq != Nk, every window kind, grouped-query heads, both dtypes, NaN and rows that see no key; and the
dispatch of ``flash_attn_triton`` runs it.
"""
import math

import pytest
import torch

from flash_attention_py import attention_naive, attention_reference, make_inputs, masks
from flash_attention_py.testing import FLOOR, LSE_FLOOR

pytest.importorskip("triton")
hf = pytest.importorskip("flash_attention_triton.hopper_forward")
from flash_attention_triton import launch as L  # noqa: E402

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and not L.INTERPRETED
sm90 = pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (Hopper) with Triton compiling, not interpreting")
TOL = {"float16": 4e-3, "bfloat16": 3e-2}  # max-abs on O ~ N(0, 1/...) (naive attention's error is about half)


def test_dispatch_takes_only_what_the_kernel_handles():
    """CPU tensors, fp32, dropout, head dims other than 128, unaligned strides and calls under MIN_FLOPS go to
    forward_kernel.py."""
    x = make_inputs(1, 2, 64, 64, 128, dtype="float16", kind="torch")
    assert not hf.takes(x["q"], x["k"], x["v"], False, masks.FULL)  # a CPU tensor
    assert L._hopper_forward(x["q"], x["k"], x["v"], False, masks.FULL) is None
    if SM90:
        y = make_inputs(1, 16, 2048, 4096, 128, dtype="float16", device="cuda")  # 6.9e10 FLOPs, causal 5.1e10
        q, k, v = y["q"], y["k"], y["v"]
        assert hf.takes(q, k, v, False, masks.CAUSAL) and not hf.takes(q, k, v, True, masks.CAUSAL)
        assert not hf.takes(q, k, v, False, (100, 0)), "a call under MIN_FLOPS"
        assert not hf.takes(q.float(), k.float(), v.float(), False, masks.FULL)
        for D in (64, 96):  # (the kernel computes D = 64 too, below, but no faster than forward_kernel.py)
            z = make_inputs(1, 16, 2048, 4096, D, dtype="float16", device="cuda")
            assert not hf.takes(z["q"], z["k"], z["v"], False, masks.FULL)
        buf = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
        assert not hf.takes(buf[1:].view(q.shape), k, v, False, masks.FULL)  # 2 bytes off: no TMA


CASES = [  # (B, Hq, Hk, Nq, Nk, D, window)
    (1, 2, 2, 1, 1, 64, masks.FULL),
    (2, 3, 3, 17, 17, 128, masks.CAUSAL),
    (1, 4, 2, 100, 300, 64, masks.CAUSAL),
    (1, 4, 1, 300, 100, 128, masks.CAUSAL),  # rows above the first key see none: O = 0, lse = -inf
    (2, 4, 4, 1000, 1000, 128, (64, 0)),  # causal local attention
    (1, 8, 2, 333, 517, 64, (3, 7)),  # asymmetric window
    (1, 2, 1, 260, 250, 128, (5000, 5000)),  # a window wider than N
    (1, 2, 2, 129, 1000, 64, (0, 0)),
    (1, 6, 3, 1000, 777, 128, masks.FULL),
]


@sm90
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}Hq{}Hk{}Nq{}Nk{}D{}w{}_{}".format(*c[:6], *c[6]))
def test_matches_float64(case, dtype):
    B, Hq, Hk, Nq, Nk, D, window = case
    x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, device="cuda", Hk=Hk)
    scale = D ** -0.5
    o, lse = hf.forward(x["q"], x["k"], x["v"], window, scale)
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], window_size=window, return_lse=True)
    o_ref, lse_ref = torch.as_tensor(o_ref, device="cuda"), torch.as_tensor(lse_ref, device="cuda")
    err = (o.double() - o_ref).abs().max().item()
    rel = ((o.double() - o_ref).norm() / o_ref.norm().clamp_min(1e-300)).item()
    assert err <= TOL[dtype], f"max-abs {err:.2e} (relative norm {rel:.2e})"
    none = lse_ref == float("-inf")
    assert torch.equal(lse == float("-inf"), none), "rows that see no key differ"
    assert (o[none.unsqueeze(-1).expand_as(o)] == 0).all(), "a row that sees no key is not 0"
    assert (lse[~none].double() - lse_ref[~none]).abs().max().item() <= 1e-4 * math.log(Nk + 1) + 1e-5


@sm90
def test_nan_in_gives_nan_out_and_the_library_runs_it(monkeypatch):
    """A NaN in one query row gives NaN in that row only; flash_attn_triton's forward is this kernel's."""
    from flash_attention_triton import flash_attn_triton

    x = make_inputs(1, 2, 256, 256, 128, dtype="float16", device="cuda")
    q = x["q"].clone()
    q[0, 1, 7, 3] = float("nan")
    o, lse = hf.forward(q, x["k"], x["v"], masks.FULL, 0.1)
    assert torch.isnan(o[0, 1, 7]).all() and torch.isnan(lse[0, 1, 7])
    assert not torch.isnan(o[0, 1, :7]).any() and not torch.isnan(o[0, 0]).any()
    monkeypatch.setattr(hf, "MIN_FLOPS", 0.0)  # (this call is far smaller)
    ran = []
    real = hf.forward
    monkeypatch.setattr(hf, "forward", lambda *a: ran.append(1) or real(*a))
    o2 = flash_attn_triton(q, x["k"], x["v"], softmax_scale=0.1)
    assert ran and torch.equal(torch.isnan(o2), torch.isnan(o))
    monkeypatch.setattr(L, "HOPPER_FORWARD", False)
    ran.clear()
    flash_attn_triton(x["q"], x["k"], x["v"])
    assert not ran, "HOPPER_FORWARD = False still ran the Gluon kernel"


@sm90
def test_direct_launch_serves_every_length_of_a_variant():
    """After a variant's first call the compiled kernel is launched directly (no JIT dispatch): lengths that Triton
    would have specialised differently (1, multiples of 16, odd) still get their own right answers."""
    for Nq, Nk in ((1, 1), (16, 32), (17, 250), (128, 128), (300, 77)):
        x = make_inputs(1, 2, Nq, Nk, 128, dtype="float16", device="cuda")
        o, lse = hf.forward(x["q"], x["k"], x["v"], masks.CAUSAL, 0.1)
        o_ref = torch.as_tensor(attention_reference(x["q"], x["k"], x["v"], causal=True, softmax_scale=0.1),
                                device="cuda")
        assert (o.double() - o_ref).abs().max().item() <= TOL["float16"], (Nq, Nk)
    assert any(key[1] == 128 for key in hf._COMPILED)


@sm90
@pytest.mark.parametrize("persistent", [0, 1])
@pytest.mark.parametrize("case", [(2, 4, 1, 300, 100, masks.CAUSAL), (1, 6, 3, 1000, 777, (64, 0)),
                                  (2, 3, 3, 517, 333, (3, 7)), (1, 4, 2, 700, 700, masks.FULL)],
                         ids=["causal-no-key-rows", "local", "window", "full"])
def test_programs_walk_several_work_items(monkeypatch, case, persistent):
    """PERSISTENT: 3 programs walk every work item (query blocks of every length, some with no K/V tile at all), so
    the slots' and Q_i's mbarrier phases run on across items; with PERSISTENT = 0 one program takes each."""
    B, Hq, Hk, Nq, Nk, window = case
    monkeypatch.setitem(hf.CONFIG, "PERSISTENT", persistent)
    monkeypatch.setattr(hf, "_sm_count", lambda device_index: 3)
    x = make_inputs(B, Hq, Nq, Nk, 128, dtype="float16", device="cuda", Hk=Hk)
    o, lse = hf.forward(x["q"], x["k"], x["v"], window, 0.1)
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], window_size=window, softmax_scale=0.1,
                                         return_lse=True)
    o_ref, lse_ref = torch.as_tensor(o_ref, device="cuda"), torch.as_tensor(lse_ref, device="cuda")
    assert (o.double() - o_ref).abs().max().item() <= TOL["float16"]
    assert torch.equal(lse == float("-inf"), lse_ref == float("-inf"))
    seen = lse_ref != float("-inf")
    assert (lse[seen].double() - lse_ref[seen]).abs().max().item() <= 1e-4 * math.log(Nk + 1) + 1e-5


@sm90
@pytest.mark.parametrize("scale", [-0.3, 0.0, 2.0])
@pytest.mark.parametrize("window", [masks.FULL, masks.CAUSAL, (40, 3)], ids=["full", "causal", "local"])
def test_signed_and_zero_scales(scale, window):
    """The unmasked tiles take rowmax(S_ij * scale) from the unscaled scores (the max, or for a negative scale the
    min, times the scale) and exp2 of one fma a score; the masked tiles scale first. Every sign of the scale, and a
    large one (the largest score far above the rest), against float64 at sizes with both kinds of tile."""
    x = make_inputs(1, 3, 300, 517, 128, dtype="float16", device="cuda")
    o, lse = hf.forward(x["q"], x["k"], x["v"], window, scale)
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], window_size=window, softmax_scale=scale,
                                         return_lse=True)
    o_ref, lse_ref = torch.as_tensor(o_ref, device="cuda"), torch.as_tensor(lse_ref, device="cuda")
    err = (o.double() - o_ref).abs().max().item()
    assert err <= TOL["float16"], f"scale {scale}: max-abs {err:.2e}"
    seen = lse_ref > float("-inf")
    assert (lse[seen].double() - lse_ref[seen]).abs().max().item() <= 1e-3


@sm90
@pytest.mark.parametrize("early", [1, 0], ids=["rescale-early", "rescale-late"])
@pytest.mark.parametrize("window", [masks.FULL, masks.CAUSAL, (300, 0)], ids=["full", "causal", "local"])
def test_rescale_with_growing_scores(monkeypatch, early, window):
    """acc's rescale by alpha, in both places (RESCALE_EARLY: after S_ij is issued, into the last tile's m_i; else
    at the end of the step), where the row maxima keep growing: each row's scores climb along the keys at a slope of
    its own, from -1 to 3 over the rows, so that the steepest rows grow their max by up to 2^17 a tile of 128 keys,
    the gentlest by less than 2^8, and falling rows keep their first tile's max. O and lse within twice naive
    attention's error in fp16, plus its floor."""
    monkeypatch.setitem(hf.CONFIG, "RESCALE_EARLY", early)
    B, H, Nq, Nk, D = 1, 2, 200, 1100, 128
    x = make_inputs(B, H, Nq, Nk, D, dtype="float32", device="cuda", seed=3)
    q, k, v = x["q"], x["k"], x["v"]
    q[..., 0] = 4.0 * torch.linspace(-1.0, 3.0, Nq, device="cuda")  # score_ij climbs by 100 slope / 3 over the keys
    k[..., 0] = torch.linspace(0.0, 25.0 * math.sqrt(D) / 3.0, Nk, device="cuda")
    q, k, v = (t.half().contiguous() for t in (q, k, v))
    o, lse = hf.forward(q, k, v, window, D ** -0.5)
    o_ref, lse_ref = attention_reference(q, k, v, window_size=window, return_lse=True)
    o_naive, lse_naive = attention_naive(q, k, v, window_size=window, return_lse=True)
    o_ref, lse_ref = torch.as_tensor(o_ref, device="cuda"), torch.as_tensor(lse_ref, device="cuda")
    for name, out, ref, naive, floor in (("o", o, o_ref, o_naive, FLOOR["float16"]),
                                         ("lse", lse, lse_ref, lse_naive, LSE_FLOOR["float16"])):
        seen = ref.abs() < float("inf")
        err = (out.double() - ref)[seen].abs().max().item()
        bound = 2.0 * (torch.as_tensor(naive, device="cuda").double() - ref)[seen].abs().max().item() + floor
        assert err <= bound, (name, err, bound)
    assert torch.equal(lse == float("-inf"), lse_ref == float("-inf"))
