"""flash_attention_triton/hopper_backward.py: the one-kernel Gluon backward (on a Hopper the default; off with
``FA_TRITON_HOPPER_BACKWARD=0``).

On any machine: the dispatch is on by default and takes only what the kernel handles, and the programs go in groups
of heads only under a causal mask that fits in L2 (that the kernel compiles for sm_90 is
tests/test_triton_aot_compile.py's). On an sm_90 GPU: dQ, dK, dV against the float64 reference on odd sizes,
Nq != Nk, every window kind, grouped-query heads (and the float32 splits of MQA), both dtypes, NaN and rows that see
no key, within twice the two-kernel backward's error; and the library's backward runs it.
"""
import pytest
import torch

from flash_attention_py import attention_reference_grads, make_inputs, masks

pytest.importorskip("triton")
hb = pytest.importorskip("flash_attention_triton.hopper_backward")
from flash_attention_triton import launch as L  # noqa: E402

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and not L.INTERPRETED
sm90 = pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (Hopper) with Triton compiling, not interpreting")


def test_on_by_default_and_takes_only_what_the_kernel_handles():
    """Unless FA_TRITON_HOPPER_BACKWARD=0, the dispatch is on; the kernel refuses CPU tensors, dropout, fp32, other
    head dims and unaligned inputs (those calls run the two-kernel backward)."""
    assert L.HOPPER_BACKWARD is True or __import__("os").environ.get("FA_TRITON_HOPPER_BACKWARD") == "0"
    x = make_inputs(1, 2, 64, 64, 128, dtype="float16", kind="torch")
    assert not hb.takes(x["q"], x["k"], x["v"], x["do"], False, masks.FULL)  # a CPU tensor
    if SM90:
        y = make_inputs(1, 16, 2048, 4096, 128, dtype="float16", device="cuda")
        q, k, v, do = y["q"], y["k"], y["v"], y["do"]
        assert hb.takes(q, k, v, do, False, masks.CAUSAL) and not hb.takes(q, k, v, do, True, masks.CAUSAL)
        assert not hb.takes(q.float(), k.float(), v.float(), do.float(), False, masks.FULL)
        z = make_inputs(1, 16, 2048, 4096, 64, dtype="float16", device="cuda")
        assert not hb.takes(z["q"], z["k"], z["v"], z["do"], False, masks.FULL)
        buf = torch.empty(do.numel() + 1, dtype=do.dtype, device="cuda")
        assert not hb.takes(q, k, v, buf[1:].view(do.shape), False, masks.FULL)  # 2 bytes off: no TMA


def _fragment_coords():
    """(rows, cols) of offsets 0..4095 of dq_fragment_layout, composed from its offset bases (bit i of the offset
    adds basis i)."""
    bases = torch.tensor(hb.dq_fragment_layout().offset_bases)
    bits = (torch.arange(64 * 64)[:, None] >> torch.arange(len(bases))) & 1
    coords = bits @ bases
    return coords[:, 0], coords[:, 1]


def test_dq_fragment_layout_stores_a_warps_fragments_contiguously():
    """The layout is a permutation of the 64 x 64 block, and each store of a warp (fixed warp w, register pair cb,
    half rh; its 32 lanes 4 r8 + c4, two elements p each) covers 64 contiguous offsets: rows 16 w + 8 rh + r8,
    columns 8 cb + 2 c4 + p."""
    rows, cols = _fragment_coords()
    assert len(set(zip(rows.tolist(), cols.tolist()))) == 64 * 64
    for w, cb, rh in ((0, 0, 0), (1, 5, 1), (3, 7, 0)):
        start = 64 * (16 * w + 2 * cb + rh)
        got = set(zip(rows[start:start + 64].tolist(), cols[start:start + 64].tolist()))
        assert got == {(16 * w + 8 * rh + r8, 8 * cb + k) for r8 in range(8) for k in range(8)}


@pytest.mark.parametrize("Nq", [1, 100, 128])
def test_dq_fragments_cast_puts_dq_back_in_order(Nq):
    """attn_bwd_dq_fragments_cast_kernel inverts dq_fragment_layout: dQaccum (B, H, Nq_pad, 128) holding each 64 x 64
    block (a Q tile's rows, a consumer's columns) in the layout's order comes back as softmax_scale * dQ."""
    if not L.INTERPRETED and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) or a GPU")
    dev = "cuda" if torch.cuda.is_available() and not L.INTERPRETED else "cpu"
    B, H, D = 2, 3, 128
    Nq_pad = -(-Nq // 64) * 64
    dq = torch.randn(B, H, Nq_pad, D, generator=torch.Generator().manual_seed(Nq))
    rows, cols = _fragment_coords()
    blocks = dq.view(B, H, Nq_pad // 64, 64, 2, 64).permute(0, 1, 2, 4, 3, 5)  # (B, H, tile, consumer, r, k)
    stored = blocks[..., rows, cols].reshape(B, H, Nq_pad // 64, 2, 64, 64)  # offset order, as 64 x 64 boxes
    dqa = stored.permute(0, 1, 2, 4, 3, 5).reshape(B, H, Nq_pad, D).contiguous().to(dev)
    out = torch.empty(B, H, Nq, D, dtype=torch.float16, device=dev)
    n = out.numel()
    hb.attn_bwd_dq_fragments_cast_kernel[(-(-n // 4096), )](dqa, out, n, Nq, Nq_pad, 0.5, HEAD_DIM=D, BLOCK=4096)
    assert torch.equal(out.cpu(), (dq[:, :, :Nq] * 0.5).half())


def test_program_order_groups_heads_only_under_a_causal_mask_that_fits_in_l2(monkeypatch):
    """head_group: groups of CAUSAL_HEAD_GROUP heads under a causal mask whose group's Q_i and dO_i fit in L2 (B2
    Hq32 Hk8 N4096: 4 x 8.4 MB), a head's blocks in turn where they do not (N = 16384: 4 x 33.5 MB > 50 MB), for
    every other window and wherever CONFIG sets HEAD_GROUP."""
    l2, share_bytes = 50 << 20, lambda n: 2 * 4 * n * 128 * 2  # Q_i and dO_i of 4 query heads, fp16, D = 128
    assert hb.head_group(masks.CAUSAL, share_bytes(4096), l2) == hb.CAUSAL_HEAD_GROUP == 4
    assert hb.head_group(masks.CAUSAL, share_bytes(16384), l2) == 0
    for window in (masks.FULL, (512, 0), (256, 256), (0, 0)):
        assert hb.head_group(window, share_bytes(4096), l2) == 0, window
    monkeypatch.setitem(hb.CONFIG, "HEAD_GROUP", 2)
    assert hb.head_group(masks.FULL, share_bytes(16384), l2) == 2


CASES = [  # (B, Hq, Hk, Nq, Nk, window, splits or None: hb.splits)
    (1, 2, 2, 1, 1, masks.FULL, None),
    (2, 3, 3, 17, 17, masks.CAUSAL, None),
    (1, 4, 2, 100, 300, masks.CAUSAL, None),
    (1, 4, 1, 300, 100, masks.CAUSAL, None),  # rows above the first key see none: no gradient from them
    (2, 4, 4, 1000, 1000, (64, 0), None),  # causal local attention
    (1, 8, 2, 333, 517, (3, 7), None),  # asymmetric window
    (1, 2, 1, 260, 250, (5000, 5000), None),  # a window wider than N
    (1, 2, 2, 129, 1000, (0, 0), None),
    (1, 6, 3, 1000, 777, masks.FULL, None),
    (1, 8, 1, 640, 640, masks.FULL, 4),  # MQA, the group split over 4 programs: float32 partial sums
]


def _err(a, b):
    return (a.double() - b).abs().max().item()


@sm90
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}Hq{}Hk{}Nq{}Nk{}w{}_{}s{}".format(*c[:5], *c[5], c[6]))
def test_matches_float64(case, dtype):
    B, Hq, Hk, Nq, Nk, window, splits = case
    x = make_inputs(B, Hq, Nq, Nk, 128, dtype=dtype, device="cuda", Hk=Hk)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    scale = 128 ** -0.5
    o, lse = L._forward(q, k, v, window, scale)
    refs = [torch.as_tensor(r, device="cuda") for r in attention_reference_grads(q, k, v, do, window_size=window)]
    two = L._backward(q, k, v, o, lse, do, window, scale)  # backward_kernels.py (the opt-in is off here)
    splits = splits or hb.splits(q, k)
    got = hb.backward(q, k, v, o, lse, do, window, scale, splits)
    floor = {"float16": 2e-3, "bfloat16": 1e-2}[dtype]
    for name, g, t, r in zip(("dq", "dk", "dv"), got, two, refs):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        rel = ((g.double() - r).norm() / r.norm().clamp_min(1e-300)).item()
        assert _err(g, r) <= 2 * _err(t, r) + floor, f"{name}: max-abs {_err(g, r):.2e} (relative norm {rel:.2e}), " \
                                                    f"two-kernel {_err(t, r):.2e}"


@sm90
def test_nan_in_gives_nan_where_the_reference_has_it_and_the_library_runs_it(monkeypatch):
    """A NaN in one key: NaN in exactly the gradient entries where the float64 reference has it (every dQ row's
    column of that NaN, as 0 * NaN in dS_ij K_j; all of the rows that see the key; all of dK and dV of that head), none
    in the other head; with HOPPER_BACKWARD (the default) the library's backward is this kernel's."""
    from flash_attention_triton import flash_attn_triton

    x = make_inputs(1, 2, 256, 256, 128, dtype="float16", device="cuda")
    k = x["k"].clone()
    k[0, 1, 100, 5] = float("nan")
    o, lse = L._forward(x["q"], k, x["v"], masks.CAUSAL, 0.1)
    got = hb.backward(x["q"], k, x["v"], o, lse, x["do"], masks.CAUSAL, 0.1, 1)
    refs = attention_reference_grads(x["q"], k, x["v"], x["do"], causal=True, softmax_scale=0.1)
    for name, g, r in zip(("dq", "dk", "dv"), got, refs):
        nan_ref = torch.isnan(torch.as_tensor(r)).cpu()
        assert torch.equal(torch.isnan(g).cpu(), nan_ref), f"{name}: NaN at {torch.isnan(g).sum()} entries, " \
                                                          f"the reference at {nan_ref.sum()}"
        assert not torch.isnan(g[0, 0]).any(), name
    monkeypatch.setattr(L, "HOPPER_BACKWARD", True)
    monkeypatch.setattr(hb, "MIN_FLOPS", 0.0)  # (this call is far smaller)
    ran = []
    real = hb.backward
    monkeypatch.setattr(hb, "backward", lambda *a: ran.append(1) or real(*a))
    q = x["q"].clone().requires_grad_()
    flash_attn_triton(q, x["k"], x["v"], causal=True).backward(x["do"])
    assert ran, "HOPPER_BACKWARD = True did not run the Gluon backward"
    ref = torch.as_tensor(attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=True)[0], device="cuda")
    assert _err(q.grad, ref) <= 4e-3
