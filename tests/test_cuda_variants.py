"""The attention variants in the CUDA tensor-core rungs: a window, grouped-query K/V heads, dropout.

* CPU (no GPU needed): bad values of the new arguments raise, naming the function and the argument, before
  any launch; the fp32 rungs (naive, tiled and their backward) refuse every variant beyond causal, naming
  the kernels that take them; on a recording runtime the launches get the variants' arguments, K and V by
  their own addresses (no copy for GQA) and dK/dV one block row per K/V head.
* GPU: cuda-mma and cuda-wgmma forward (O, lse) and the mma backward (dq, dk, dv), fp16 and bf16, D 64 and
  128, against the float64 reference with the variants, under the harness's policy (max-abs error <= 2x
  that of naive attention in the same dtype + the dtype's floor, ``flash_attention_py.testing``); the
  exact dropout mask (v = identity, so O is P * Z / (1 - p)) against ``philox.keep_mask``; rows that see no
  key. Without a GPU these skip with the reason.
"""
import dataclasses

import numpy as np
import pytest
import torch

from flash_attention_py import attention_naive, attention_reference, attention_reference_grads, make_inputs
from flash_attention_py.masks import CAUSAL
from flash_attention_py.philox import keep_mask
from flash_attention_py.testing import FLOOR, LSE_FLOOR, errors

from flash_attention_cuda import flash_attn_cuda, flash_attn_cuda_backward, launch_specs, runtime
from flash_attention_cuda.capabilities import BACKWARD, CAPABILITIES, cuda_unavailable_reason, hopper_probe

REASON = cuda_unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))
HOPPER_REASON = hopper_probe("cuda")
WGMMA = pytest.param("wgmma", marks=pytest.mark.skipif(HOPPER_REASON is not None, reason=f"wgmma: {HOPPER_REASON}"))
WGMMA_FUSED = pytest.param("wgmma-fused", marks=pytest.mark.skipif(HOPPER_REASON is not None,
                                                                   reason=f"wgmma-fused: {HOPPER_REASON}"))
WGMMA_WS = pytest.param("wgmma-ws", marks=pytest.mark.skipif(HOPPER_REASON is not None,
                                                              reason=f"wgmma-ws: {HOPPER_REASON}"))


def _qkv(B, Hq, Hk, Nq, Nk, D, dtype, device="cuda"):
    """Fresh random q, do (B, Hq, Nq, D) and k, v (B, Hk, Nk, D)."""
    x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, kind="torch", device=device)
    kv = make_inputs(B, Hk, Nq, Nk, D, dtype=dtype, kind="torch", device=device)
    return x["q"], kv["k"], kv["v"], x["do"]


# ------------------------------------------------------------------ bad input (CPU: raised before any launch)
def _cpu(dtype="float16", Hq=4, Hk=2, N=8, D=64):
    q, k, v, do = _qkv(1, Hq, Hk, N, N, D, dtype, device="cpu")
    return q, k, v, do


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(window_size=3), TypeError, "window_size must be a tuple"),
    (dict(window_size=(1, 2, 3)), ValueError, "window_size must have 2 entries"),
    (dict(window_size=(1.0, 2)), TypeError, "window_size left must be an int"),
    (dict(window_size=(-2, 0)), ValueError, "window_size left must be >= -1"),
    (dict(dropout_p=1.0, dropout_seed=1), ValueError, "dropout_p"),
    (dict(dropout_p=-0.1, dropout_seed=1), ValueError, "dropout_p"),
    (dict(dropout_p=0.2), ValueError, "dropout_p = 0.2 needs a dropout_seed"),
    (dict(dropout_p=0.2, dropout_seed=1.5), TypeError, "dropout_seed must be an int"),
    (dict(dropout_p=0.2, dropout_seed=-1), ValueError, "dropout_seed must be in"),
])
def test_bad_variant_arguments(kwargs, exc, match):
    q, k, v, do = _cpu()
    with pytest.raises(exc, match="flash_attn_cuda: " + match):
        flash_attn_cuda(q, k, v, kernel="mma", **kwargs)
    o, lse = torch.zeros_like(q), torch.randn(q.shape[:3])
    with pytest.raises(exc, match="flash_attn_cuda_backward: " + match):
        flash_attn_cuda_backward(q, k, v, o, lse, do, kernel="mma", **kwargs)


def test_gqa_heads_must_divide():
    q, k, v, do = _cpu(Hq=6, Hk=4)
    with pytest.raises(ValueError, match=r"flash_attn_cuda: grouped-query attention needs .* H % Hk == 0"):
        flash_attn_cuda(q, k, v, kernel="mma")
    with pytest.raises(ValueError, match=r"flash_attn_cuda_backward: grouped-query attention needs"):
        flash_attn_cuda_backward(q, k, v, torch.zeros_like(q), torch.randn(q.shape[:3]), do)


@pytest.mark.parametrize("kernel", ["naive", "tiled", "auto"])
@pytest.mark.parametrize("kwargs,what", [(dict(window_size=(4, 0)), r"window_size \(4, 0\)"),
                                         (dict(gqa=True), r"grouped-query K/V heads \(q has 4 heads, k and v 2\)"),
                                         (dict(dropout_p=0.1, dropout_seed=3), "dropout_p = 0.1")])
def test_fp32_rungs_refuse_the_variants(kernel, kwargs, what):
    """float32 runs on naive/tiled ('auto' picks tiled): they take causal only, and say which kernels take more."""
    kwargs = dict(kwargs)
    q, k, v, do = _cpu("float32", Hq=4, Hk=2 if kwargs.pop("gqa", False) else 4)
    rung = "tiled" if kernel == "auto" else kernel
    with pytest.raises(ValueError, match=rf"flash_attn_cuda: kernel '{rung}' does not take {what} \(it takes causal\);"
                                         r" the variants need kernel 'mma' or 'wgmma'"):
        flash_attn_cuda(q, k, v, kernel=kernel, **kwargs)
    with pytest.raises(ValueError, match=rf"flash_attn_cuda_backward: kernel 'tiled' does not take {what}.*"
                                         r"need kernel 'wgmma' or 'wgmma-fused' or 'wgmma-ws' or 'mma'"):
        flash_attn_cuda_backward(q, k, v, torch.zeros_like(q), torch.randn(q.shape[:3]), do, kernel="tiled",
                                 **kwargs)
    with pytest.raises(ValueError, match=f"run_forward: kernel '{rung}' does not take"):  # the launch layer too
        launch_specs.run_forward(q, k, v, kwargs.get("window_size", CAUSAL), 0.1, rung,
                                 dropout=(kwargs.get("dropout_p", 0.0), kwargs.get("dropout_seed")))


def test_capability_tables():
    """What the tables claim is what the checks above enforce."""
    full = ("causal", "window", "gqa", "dropout")
    assert CAPABILITIES["cuda-mma"].variants == full and CAPABILITIES["cuda-wgmma"].variants == full
    assert BACKWARD["mma"].variants == full
    assert CAPABILITIES["cuda-naive"].variants == CAPABILITIES["cuda-tiled"].variants == ("causal",)
    assert BACKWARD["tiled"].variants == ("causal",)


# ------------------------------------------------------------------ launches on a recording runtime (CPU)
@pytest.fixture
def recorded(recorded_launches):
    """conftest's recording runtime, as (kernel name, grid, args) per launch; clear() empties it."""

    class View(list):
        def __iter__(self):
            return iter([(kern.name, grid, args) for kern, grid, _, args, _ in recorded_launches])

        def __len__(self):
            return len(recorded_launches)

        def clear(self):
            recorded_launches.clear()

    return View()


@pytest.mark.parametrize("kernel", ["mma", "wgmma"])
def test_variant_launches_without_a_gpu(recorded, kernel):
    """B = 2, Hq = 6 query heads on Hk = 2 K/V heads, window (5, 2), dropout: the forward reads K and V where they
    are (their own addresses: no copy), the dK/dV kernel runs one block row per (batch, K/V head), dQ one per
    query head, and every launch gets (window, group, p, seed halves) as the kernels declare them."""
    B, Hq, Hk, Nq, Nk, D, seed = 2, 6, 2, 33, 70, 64, 2**33 + 5
    q, k, v, do = _qkv(B, Hq, Hk, Nq, Nk, D, "bfloat16", device="cpu")
    o, lse = launch_specs.run_forward(q, k, v, (5, 2), 0.3, kernel, dropout=(0.25, seed))
    ((name, grid, args),) = recorded
    assert name.endswith(", true>") and grid[1] == B * Hq
    assert args[1:3] == (k.data_ptr(), v.data_ptr())
    tail = (np.int32(5), np.int32(2), np.int32(3), np.float32(0.25), np.uint32(5), np.uint32(2))
    bh = {"mma": (np.int32(B * Hq),), "wgmma": ()}[kernel]  # mma_fwd's last argument: B Hq (its work items)
    fwd = args[len(args) - 6 - len(bh):]
    assert fwd == tail + bh and [type(a) for a in fwd] == [type(t) for t in tail + bh]
    recorded.clear()
    dq, dk, dv = launch_specs.run_backward(q, k, v, o, lse, do, (5, 2), 0.3, kernel, dropout=(0.25, seed))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    (_, _, pre), (kv_name, kv_grid, kv_args), (dq_name, dq_grid, dq_args) = recorded
    assert kv_name.startswith(f"{kernel}_bwd_dkdv<") and kv_name.endswith(", true, true>")
    assert kv_grid[1] == B * Hk and dq_grid[1] == B * Hq
    assert kv_args[1:3] == dq_args[1:3] == (k.data_ptr(), v.data_ptr())
    assert kv_args[-6:] == dq_args[-6:] == tail
    recorded.clear()
    launch_specs.run_forward(q, k[:, :1], v[:, :1], CAUSAL, 0.3, kernel)  # MQA, no dropout: the default kernel
    ((name, grid, args),) = recorded
    assert not name.endswith(", true, true>") and name.count(",") == {"mma": 4, "wgmma": 3}[kernel]
    assert args[len(args) - 4 - len(bh):] == (np.int32(Hq), np.float32(0.0), np.uint32(0), np.uint32(0)) + bh


# ------------------------------------------------------------------ GPU: against the float64 reference
# (Nq, Nk, Hq, Hk, causal, window_size, dropout_p): windows (0, 0), (w, -1) with causal, asymmetric (2, 5),
# larger than N; GQA 1, 2, Hq (MQA); dropout 0, 0.17, 0.5; odd sizes, Nq != Nk both ways, one query.
CASES = [
    (100, 100, 4, 4, False, (0, 0), 0.0),
    (37, 300, 4, 2, True, (16, -1), 0.0),
    (300, 37, 4, 1, False, (2, 5), 0.17),
    (257, 513, 6, 3, True, (70, -1), 0.0),
    (130, 130, 4, 2, False, (500, 500), 0.5),
    (1, 517, 2, 1, False, (33, 0), 0.17),
    (200, 200, 2, 2, True, (-1, -1), 0.17),
    (129, 65, 4, 4, False, (-1, -1), 0.0),
]


def _case_id(c):
    Nq, Nk, Hq, Hk, causal, w, p = c
    return f"{Nq}x{Nk}-H{Hq}/{Hk}-{'causal-' if causal else ''}w{w[0]},{w[1]}-p{p}"


def _kw(causal, window, p, seed):
    return dict(causal=causal, window_size=window, dropout_p=p, dropout_seed=seed if p > 0 else None)


def _check(name, out, ref, naive, floor):
    max_abs, _ = errors(out, ref)
    naive_abs, _ = errors(naive, ref)
    assert max_abs <= 2 * naive_abs + floor, f"{name}: {max_abs:.3e} > 2 x naive {naive_abs:.3e} + {floor:.1e}"


@gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("D", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", ["mma", WGMMA, WGMMA_WS])
def test_forward_variants(kernel, dtype, D, case):
    Nq, Nk, Hq, Hk, causal, window, p = case
    q, k, v, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
    kw = _kw(causal, window, p, seed=int(torch.randint(0, 2**62, ()).item()))
    o, lse = flash_attn_cuda(q, k, v, kernel=kernel, return_lse=True, **kw)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == q.shape[:3]
    ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, **kw)
    naive_o, naive_lse = attention_naive(q, k, v, return_lse=True, **kw)
    _check("o", o, ref_o, naive_o, FLOOR[dtype])
    _check("lse", lse, ref_lse, naive_lse, LSE_FLOOR[dtype])


# the backwards and the head dims they take: the one-kernel ones D <= 128, the two-kernel mma and wgmma ones D <= 256
# (at D = 256 their dK/dV kernel splits the columns over two blocks); every one of them D = 32, 64, 96 and 128
BACKWARD_DIMS = [pytest.param(*kernel.values, D, id=f"{kernel.values[0]}-d{D}", marks=kernel.marks)
                 for kernel in (pytest.param("mma"), pytest.param("mma-fused"), WGMMA, WGMMA_FUSED, WGMMA_WS)
                 for D in (32, 64, 96, 128)] + \
                [pytest.param("mma", 256, id="mma-d256"), pytest.param("wgmma", 256, id="wgmma-d256", marks=WGMMA.marks)]


@gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel,D", BACKWARD_DIMS)
def test_backward_variants(kernel, D, dtype, case):
    """The mma, mma-fused, wgmma, wgmma-fused and wgmma-ws backwards from each forward's (o, lse): dk, dv of a K/V
    head sum over its group."""
    Nq, Nk, Hq, Hk, causal, window, p = case
    q, k, v, do = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
    kw = _kw(causal, window, p, seed=int(torch.randint(0, 2**62, ()).item()))
    o, lse = flash_attn_cuda(q, k, v, kernel="mma", return_lse=True, **kw)
    grads = flash_attn_cuda_backward(q, k, v, o, lse, do, kernel=kernel, **kw)
    ref = attention_reference_grads(q, k, v, do, **kw)
    qn, kn, vn = (x.clone().requires_grad_(True) for x in (q, k, v))
    attention_naive(qn, kn, vn, **kw).backward(do)
    floor = FLOOR[dtype] * max(Nq, Nk) ** 0.5
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, (qn.grad, kn.grad, vn.grad)):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        _check(name, g, r, n, floor)


@gpu
@pytest.mark.parametrize("min_blocks", [1, 10**6])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (40, -1)), (False, (-1, 30)), (True, (50, -1))])
@pytest.mark.parametrize("kernel", [WGMMA_WS])
@pytest.mark.parametrize("D", [32, 64, 96])
def test_ws_backward_block_order_with_gqa(kernel, D, causal, window, min_blocks, monkeypatch):
    """wgmma_bwd_ws starts its blocks tile-major where each loops over several query heads and the mask is
    bounded on one side (causal; a left bound alone, whose last tiles of keys go first; a right bound alone), and
    in grid order otherwise (both bounds): every block still runs once. Against the float64 gradients with the
    group whole in each block (min_blocks 1: no split) and split over blocks (min_blocks 10**6: one query head
    each, grid order)."""
    monkeypatch.setattr(launch_specs, "WGMMA_WS_BACKWARD_MIN_BLOCKS", min_blocks)
    launch_specs.clear_caches()
    try:
        Nq, Nk, Hq, Hk = 300, 420, 6, 2
        q, k, v, do = _qkv(2, Hq, Hk, Nq, Nk, D, "float16")
        kw = _kw(causal, window, 0.0, 0)
        p = launch_specs._problem(q, k, 0.125, (-1, -1))
        assert launch_specs.ws_backward_splits(p) == (1 if min_blocks == 1 else Hq // Hk)
        o, lse = flash_attn_cuda(q, k, v, kernel="mma", return_lse=True, **kw)
        grads = flash_attn_cuda_backward(q, k, v, o, lse, do, kernel=kernel, **kw)
        ref = attention_reference_grads(q, k, v, do, **kw)
        qn, kn, vn = (x.clone().requires_grad_(True) for x in (q, k, v))
        attention_naive(qn, kn, vn, **kw).backward(do)
        for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, (qn.grad, kn.grad, vn.grad)):
            _check(name, g, r, n, FLOOR["float16"] * Nk ** 0.5)
    finally:
        launch_specs.clear_caches()


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA])
def test_dropout_mask_is_philox_keep_mask(kernel):
    """v = identity (Nk = D = 64): O = P * Z / (1 - p), so O's zeros are exactly the dropped weights, and they
    are philox.keep_mask's for every (b, h, i, j), with a seed past 2**32 (both key words in use)."""
    B, H, Nq, D, p, seed = 2, 3, 96, 64, 0.5, 2**40 + 12345
    q, k, _, _ = _qkv(B, H, H, Nq, D, D, "float16")
    q, k = q * 0.1, k * 0.1  # flat softmax: every P_ij ~ 1/64, far from underflow
    v = torch.eye(D, dtype=q.dtype, device="cuda").expand(B, H, D, D).contiguous()
    o = flash_attn_cuda(q, k, v, kernel=kernel, dropout_p=p, dropout_seed=seed)
    i, j = np.arange(Nq), np.arange(D)
    keep = np.stack([np.stack([keep_mask(seed, p, b, h, i, j, H, Nq, D) for h in range(H)]) for b in range(B)])
    assert np.array_equal(o.cpu().numpy() != 0, keep)
    assert 0.45 < keep.mean() < 0.55  # the keep rate
    ref = attention_reference(q, k, v, dropout_p=p, dropout_seed=seed)
    assert errors(o, ref)[0] < 2e-3


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA, WGMMA_WS])
@pytest.mark.parametrize("p", [0.99, 0.999])
def test_dropout_near_one_with_climbing_scores(kernel, p):
    """p close to 1 scales the kept P_ij by 1 / (1 - p) = 100 or 1000 before they go into the fp16 P fragments.
    With the row's max as the reference P_ij <= 1 and that stays in fp16's range; a lazily kept reference
    (P_ij up to 256, wgmma_ws.cu at D = 128 without dropout) would not, so the kernels with dropout keep the eager
    rescale. Scores climb along the keys (a row's max keeps growing), D = 128, fp16: O is finite and within the
    harness's tolerance against the float64 reference with the same mask."""
    B, H, Nq, Nk, D, seed = 1, 2, 130, 700, 128, 2024
    q, k, v, _ = _qkv(B, H, H, Nq, Nk, D, "float32")
    q[..., 0] = 4.0
    k[..., 0] = torch.linspace(0.0, 3.0 * D ** 0.5, Nk, device="cuda")  # scores climb by ~12 along the keys
    q, k, v = (x.half().contiguous() for x in (q, k, v))
    o = flash_attn_cuda(q, k, v, kernel=kernel, dropout_p=p, dropout_seed=seed)
    ref = attention_reference(q, k, v, dropout_p=p, dropout_seed=seed)
    naive = attention_naive(q, k, v, dropout_p=p, dropout_seed=seed)
    assert torch.isfinite(o).all()
    assert errors(o, ref)[0] <= 2.0 * errors(naive, ref)[0] + FLOOR["float16"] / (1.0 - p)


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA])
def test_rows_that_see_no_key(kernel):
    """window (0, 0) with Nq > Nk: query i sees only key i + Nk - Nq; the first Nq - Nk rows see none: O = 0,
    lse = -inf, dq = 0."""
    Nq, Nk = 150, 40
    q, k, v, do = _qkv(1, 4, 2, Nq, Nk, 64, "float16")
    o, lse = flash_attn_cuda(q, k, v, kernel=kernel, return_lse=True, window_size=(0, 0))
    blind = Nq - Nk
    assert (o[:, :, :blind] == 0).all() and torch.isneginf(lse[:, :, :blind]).all()
    assert torch.isfinite(lse[:, :, blind:]).all()
    dq, dk, dv = flash_attn_cuda_backward(q, k, v, o, lse, do, window_size=(0, 0))
    assert (dq[:, :, :blind] == 0).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    ref = attention_reference(q, k, v, window_size=(0, 0))
    assert errors(o, ref)[0] < 4e-3


@gpu
@pytest.mark.parametrize("ctas", [1, 3, 7])
@pytest.mark.parametrize("D", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("kernel", [WGMMA_WS])
def test_ws_forward_persistent_walk(kernel, D, ctas, monkeypatch):
    """wgmma_ws_fwd is persistent: ctas blocks walk every work item (Br query rows of one head) in turn, the ring
    of K/V slots and the mbarriers' phases running on across items, O staged in its own tile (D <= 128) or in
    Q's rows (D 256, where the next Q waits for the store). With 1, 3 or 7 blocks for many items: causal with
    Nq > Nk (the first items' rows see no key: O = 0, lse = -inf, without the ring), a window with GQA and
    dropout, and a negative scale (Q's sign flipped per item), against the float64 reference. With a right
    bound (causal, the window) the blocks walk pairs of rows blocks where they balance (the middle one of an odd
    count alone; 1 block, and 3 at D 128 and 256) and else the items longest first in a snake (7 blocks, and 3 at D 64),
    in sections of all heads and of 3 heads (the last one shorter)."""
    monkeypatch.setattr(runtime, "device_sms", lambda x: ctas)
    monkeypatch.setattr(launch_specs, "WGMMA_WS_PERSISTENT_UNITS_PER_SM", 1 << 30)  # persistent however many units
    try:
        for sections in (1 << 30, 3):  # bytes, or heads (the K/V bytes of 3 heads at each case's Nk)
            _persistent_walk_cases(kernel, D, sections, monkeypatch)
    finally:
        launch_specs.clear_caches()  # the specs cached with the patched grid


@gpu
@pytest.mark.parametrize("ctas", [None, 3])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("kernel", [WGMMA_WS])
def test_ws_forward_rows_blocks_above_row_0(kernel, D, ctas, monkeypatch):
    """With a right bound wgmma-ws's rows blocks end at the last query row (launch_specs.rows_pad_top): the first
    starts above row 0, on rows the copy engine zero-fills, and its rows below 0 are never stored. Several heads
    (a stray store above row 0 would land in the head before), Nq = 1, 100, 1000 and Nq != Nk both ways (rows that
    see no key: O = 0, lse = -inf), causal, a local window, a window with a right bound past the diagonal, GQA and
    dropout; a block per item (ctas None) and a persistent grid of 3 blocks."""
    if ctas:
        monkeypatch.setattr(runtime, "device_sms", lambda x: ctas)
        monkeypatch.setattr(launch_specs, "WGMMA_WS_PERSISTENT_UNITS_PER_SM", 1 << 30)
    launch_specs.clear_caches()
    cases = [(1, 1, dict(causal=True)), (100, 100, dict(causal=True)), (1000, 1000, dict(causal=True)),
             (1000, 300, dict(causal=True)), (300, 1000, dict(window_size=(200, 0))),
             (450, 450, dict(window_size=(-1, 37), dropout_p=0.17, dropout_seed=2**33 + 5))]
    try:
        for i, (Nq, Nk, kw) in enumerate(cases):
            dtype = ("float16", "bfloat16")[i % 2]
            q, k, v, _ = _qkv(2, 6, 2, Nq, Nk, D, dtype)
            o, lse = flash_attn_cuda(q, k, v, kernel=kernel, return_lse=True, **kw)
            ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, **kw)
            naive_o, naive_lse = attention_naive(q, k, v, return_lse=True, **kw)
            _check(f"o {Nq}x{Nk} {kw}", o, ref_o, naive_o, FLOOR[dtype])
            _check(f"lse {Nq}x{Nk} {kw}", lse, ref_lse, naive_lse, LSE_FLOOR[dtype])
            blind = max(0, Nq - Nk) if kw.get("causal") else 0
            assert (o[:, :, :blind] == 0).all() and torch.isneginf(lse[:, :, :blind]).all()
    finally:
        launch_specs.clear_caches()


@gpu
@pytest.mark.parametrize("ctas", [1, 3, 7])
@pytest.mark.parametrize("D", [96, 128])
def test_mma_forward_persistent_walk(D, ctas, monkeypatch):
    """mma_fwd's persistent grid (its configs that keep Q in registers, (128, 8, 1) at D 96 and 128): ctas blocks
    walk the work items in turn, each loading its next item's Q and first K/V tile under its last tile (into the
    buffer after it, the two buffers' turn running on across items) and staging O in the last tile's buffer. The
    library takes this grid for full attention only (every item sees every key); the kernel walks any mask, so it
    is launched here for causal with Nq > Nk (items whose rows see no key), a window with GQA, a negative scale and
    full attention with MQA, against the float64 reference. (With dropout mma_fwd does not walk: a block per item.)"""
    real = launch_specs.forward_spec

    def persistent(kernel, p, **kw):
        spec = real(kernel, p, **kw)
        assert spec.name.startswith("mma_fwd<") and spec.grid[0] * spec.grid[-1] > ctas
        return dataclasses.replace(spec, grid=(ctas,))

    monkeypatch.setattr(launch_specs, "forward_spec", persistent)
    launch_specs.clear_caches()
    try:
        cases = [(520, 300, 4, 2, dict(causal=True), 0.125), (333, 517, 6, 3, dict(window_size=(70, 20)), 0.1),
                 (260, 260, 2, 2, dict(), -0.07), (700, 1000, 3, 1, dict(), 0.09)]
        for i, (Nq, Nk, Hq, Hk, kw, scale) in enumerate(cases):
            dtype = ("float16", "bfloat16")[i % 2]
            q, k, v, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
            o, lse = flash_attn_cuda(q, k, v, kernel="mma", return_lse=True, softmax_scale=scale, **kw)
            ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, softmax_scale=scale, **kw)
            naive_o, naive_lse = attention_naive(q, k, v, return_lse=True, softmax_scale=scale, **kw)
            _check(f"o {Nq}x{Nk}", o, ref_o, naive_o, FLOOR[dtype])
            _check(f"lse {Nq}x{Nk}", lse, ref_lse, naive_lse, LSE_FLOOR[dtype])
            if kw.get("causal"):
                assert (o[:, :, :Nq - Nk] == 0).all() and torch.isneginf(lse[:, :, :Nq - Nk]).all()
    finally:
        launch_specs.clear_caches()


def _persistent_walk_cases(kernel, D, sections, monkeypatch):
    cases = [(520, 300, 4, 2, dict(causal=True), 0.125),  # 5 (Br 128) or 3 (Br 192) rows blocks: a block alone
             (333, 517, 6, 3, dict(window_size=(70, 20), dropout_p=0.17, dropout_seed=2**40 + 3), 0.1),
             (260, 260, 2, 2, dict(), -0.07)]
    for i, (Nq, Nk, Hq, Hk, kw, scale) in enumerate(cases):
        group = Hq // Hk
        monkeypatch.setattr(launch_specs, "WGMMA_WS_SECTION_BYTES", sections if sections != 3 else 3 * 4 * Nk * D // group)
        launch_specs.clear_caches()
        dtype = ("float16", "bfloat16")[i % 2]
        q, k, v, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
        o, lse = flash_attn_cuda(q, k, v, kernel=kernel, return_lse=True, softmax_scale=scale, **kw)
        ref_o, ref_lse = attention_reference(q, k, v, return_lse=True, softmax_scale=scale, **kw)
        naive_o, naive_lse = attention_naive(q, k, v, return_lse=True, softmax_scale=scale, **kw)
        _check(f"o {Nq}x{Nk}", o, ref_o, naive_o, FLOOR[dtype])
        _check(f"lse {Nq}x{Nk}", lse, ref_lse, naive_lse, LSE_FLOOR[dtype])
        if kw.get("causal"):
            assert (o[:, :, :Nq - Nk] == 0).all() and torch.isneginf(lse[:, :, :Nq - Nk]).all()


# ------------------------------------------------------------------ fa::Mask on the host (CPU): the window logic
_MASK_MAIN = r"""
#define __device__
#define __forceinline__ inline
#include <cstdio>
#include "masks.cuh"
int main() {  // per case "Nq Nk left right Br Bc": every answer the kernels' loops and masking take from fa::Mask
    int Nq, Nk, l, r, Br, Bc;
    while (std::scanf("%d %d %d %d %d %d", &Nq, &Nk, &l, &r, &Br, &Bc) == 6) {
        const fa::Mask m = fa::make_mask(Nq, Nk, l, r);
        for (int i = 0; i < Nq; ++i)
            for (int j = 0; j < Nk; ++j) std::printf("%d", (int)m.visible(i, j));
        std::printf("\n");
        for (int i = 0; i < Nq; ++i) std::printf("%d %d ", m.kv_begin(i), m.kv_end(i + 1));
        std::printf("\n");
        for (int q0 = 0; q0 < Nq; q0 += Br)
            std::printf("%d %d ", m.kv_tile_begin(q0, Bc), m.kv_tile_end(q0, q0 + Br, Bc));
        std::printf("\n");
        for (int k0 = 0; k0 < Nk; k0 += Bc) std::printf("%d %d ", m.q_begin(k0), m.q_end(k0 + Bc));
        std::printf("\n");
        for (int q0 = 0; q0 < Nq; q0 += Br)
            for (int k0 = 0; k0 < Nk; k0 += Bc) std::printf("%d", (int)m.needs_mask(q0, q0 + Br, k0, k0 + Bc));
        std::printf("\n");
    }
}
"""


def test_mask_header_window_logic_on_the_host(tmp_path):
    """masks.cuh (fa::Mask) built with g++ against the rule of variants' windows, element by element: each row's
    key range, the forward's K/V tile range (both ends), the backward's query range per key block, and that a
    tile the mask calls full needs no masking (and that one past the last key or query does); random windows, both
    bounds, Nq != Nk both ways."""
    import shutil
    import subprocess

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the host build of masks.cuh is not checked")
    (tmp_path / "main.cpp").write_text(_MASK_MAIN)
    exe = tmp_path / "mask"
    res = subprocess.run([gxx, "-std=c++17", "-O1", f"-I{runtime.KERNEL_DIR}", str(tmp_path / "main.cpp"), "-o",
                          str(exe)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rng = np.random.default_rng()
    cases = [(int(rng.integers(1, 70)), int(rng.integers(1, 70)), int(rng.integers(-1, 40)),
              int(rng.integers(-1, 40)), int(rng.choice([16, 32, 64])), int(rng.choice([16, 64]))) for _ in range(60)]
    cases += [(5, 2, -1, 0, 16, 16), (2, 5, 0, 0, 16, 16), (40, 9, 0, 0, 16, 16), (1, 50, 3, -1, 16, 16)]
    out = subprocess.run([str(exe)], input="\n".join(" ".join(map(str, c)) for c in cases), capture_output=True,
                         text=True, timeout=60).stdout.splitlines()
    assert len(out) == 5 * len(cases)
    from flash_attention_py import masks

    for n, (Nq, Nk, left, right, Br, Bc) in enumerate(cases):
        vis_txt, rows, qtiles, kblocks, needs = out[5 * n: 5 * n + 5]
        vis = masks.visible(np.arange(Nq), np.arange(Nk), Nq, Nk, (left, right))
        assert vis_txt == "".join("1" if x else "0" for x in vis.ravel()), (Nq, Nk, left, right)
        rows = np.array(rows.split(), int).reshape(Nq, 2)
        for i in range(Nq):  # row i sees exactly [kv_begin(i), kv_end(i + 1)) (empty when it sees none)
            lo, hi = rows[i]
            assert np.array_equal(vis[i], (np.arange(Nk) >= lo) & (np.arange(Nk) < hi)), (i, Nq, Nk, left, right)
        qtiles = np.array(qtiles.split(), int).reshape(-1, 2)
        for b, (t0, t1) in enumerate(qtiles):  # the K/V tiles a query block visits hold every key it sees
            seen = np.flatnonzero(vis[b * Br:(b + 1) * Br].any(0))
            assert t0 <= t1 and (seen.size == 0 or (t0 * Bc <= seen[0] and seen[-1] < t1 * Bc)), (b, t0, t1)
            assert seen.size > 0 or t1 == t0
        kblocks = np.array(kblocks.split(), int).reshape(-1, 2)
        for b, (q_lo, q_hi) in enumerate(kblocks):  # the queries that see a key of the block lie in [q_lo, q_hi)
            seers = np.flatnonzero(vis[:, b * Bc:(b + 1) * Bc].any(1))
            assert seers.size == 0 or (q_lo <= seers[0] and seers[-1] < q_hi), (b, q_lo, q_hi)
        flags = iter(needs)
        for q0 in range(0, Nq, Br):
            for k0 in range(0, Nk, Bc):
                full_block = vis[q0:q0 + Br, k0:k0 + Bc].all() and k0 + Bc <= Nk and q0 + Br <= Nq
                assert (next(flags) == "0") == full_block, (q0, k0, Nq, Nk, left, right)


@gpu
@pytest.mark.parametrize("kernel", ["mma", WGMMA])
def test_autograd_carries_the_variants(kernel):
    """Through autograd (the custom ops cuda_fwd / cuda_bwd): the backward gets the forward's window and dropout
    seed, and dk, dv of the 2 K/V heads sum over their query heads."""
    q, k, v, do = _qkv(2, 4, 2, 150, 170, 64, "bfloat16")
    kw = _kw(True, (40, -1), 0.17, seed=2**35 + 1)
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    flash_attn_cuda(q, k, v, kernel=kernel, **kw).backward(do)
    ref = attention_reference_grads(q, k, v, do, **kw)
    qn, kn, vn = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    attention_naive(qn, kn, vn, **kw).backward(do)
    for name, g, r, n in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref, (qn.grad, kn.grad, vn.grad)):
        _check(name, g, r, n, FLOOR["bfloat16"] * 170 ** 0.5)
