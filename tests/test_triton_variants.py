"""The attention variants in the Triton rung: sliding windows, grouped-query attention, dropout.

    flash_attn_triton(q, k, v, causal=..., window_size=(left, right), dropout_p=p, dropout_seed=s)
    q (B, Hq, Nq, D); k, v (B, Hk, Nk, D), Hq % Hk == 0

Every result is compared against the float64 reference (``attention_reference`` /
``attention_reference_grads``, which take the same variants) under the project's tolerance policy
(``testing.check_close``: at most 2x naive attention in the same dtype, plus a floor). The dropout mask
is checked bit for bit against ``philox.keep_mask``, independently of the reference.

On the CPU the kernels run under Triton's interpreter (tests/conftest.py), which costs milliseconds per
tile: the CPU cases keep N <= 128 and few heads. The GPU cases (larger N, fp16 and bf16) skip without a GPU:

    python -m pytest -q -p no:cacheprovider tests/test_triton_variants.py -k gpu
"""
import math

import pytest
import torch

from flash_attention_py import attention_naive, attention_reference, attention_reference_grads, make_inputs, philox
from flash_attention_py import testing

pytest.importorskip("triton")

from flash_attention_triton import attention as A  # noqa: E402
from flash_attention_triton import capabilities as TC  # noqa: E402
from flash_attention_triton import flash_attn_triton  # noqa: E402

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
if DEVICE == "cpu" and not A.INTERPRETED:
    pytest.skip("no GPU and Triton imported without TRITON_INTERPRET=1", allow_module_level=True)
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="GPU case: needs a CUDA GPU (the CPU cases run the interpreter)")


def gqa_inputs(B, Hq, Hk, Nq, Nk, D, dtype, device=DEVICE, strided_kv=False):
    """Fresh random q, do (B, Hq, Nq, D) and k, v (B, Hk, Nk, D). strided_kv: k and v are views of the first
    Hk heads of (B, Hq, Nk, D) tensors (not contiguous in B)."""
    x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, device=device)
    if strided_kv:
        k, v = x["k"][:, :Hk], x["v"][:, :Hk]
    else:
        y = make_inputs(B, Hk, Nk, Nk, D, dtype=dtype, device=device)
        k, v = y["k"], y["v"]
    return x["q"], k, v, x["do"]


def run(q, k, v, do, **kw):
    """(o, lse, dq, dk, dv) of flash_attn_triton with gradients (through the custom ops)."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o, lse = flash_attn_triton(q, k, v, return_lse=True, **kw)
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


def naive_grads(q, k, v, do, **kw):
    """Naive attention's (o, lse, dq, dk, dv) in the inputs' own dtype: the tolerance yardstick."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o, lse = attention_naive(q, k, v, return_lse=True, **kw)
        o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


def check_against_reference(q, k, v, do, dtype, **kw):
    """Forward (O, lse) and backward (dq, dk, dv) of flash_attn_triton against the float64 reference."""
    out = run(q, k, v, do, **kw)
    o_ref, lse_ref = attention_reference(q, k, v, return_lse=True, **kw)
    grads_ref = attention_reference_grads(q, k, v, do, **kw)
    naive = naive_grads(q, k, v, do, **kw)
    case = dict(Nq=q.shape[2], Nk=k.shape[2], D=q.shape[3])
    floors = (testing.FLOOR[dtype], testing.LSE_FLOOR[dtype]) + (testing.grad_floor(dtype, case),) * 3
    for name, got, ref, nv, floor in zip(("o", "lse", "dq", "dk", "dv"), out, (o_ref, lse_ref, *grads_ref),
                                         naive, floors):
        assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
        testing.check_close(name, got, ref, nv, backend="triton", device=q.device.type, dtype=dtype, floor=floor)
    return out


# ------------------------------------------------------------------ CPU (interpreter) and GPU, small N
@pytest.mark.parametrize("causal,window,Nq,Nk", [
    (False, (0, 0), 70, 60),        # each query sees only its own diagonal key
    (True, (9, -1), 50, 90),        # causal local attention, 9 keys of look-back, Nq < Nk
    (False, (2, 5), 90, 50),        # bounded on both sides, Nq > Nk: some rows see no key (O = 0, lse = -inf)
    (False, (500, 300), 60, 80),    # wider than the sequence: full attention
], ids=["w0_0", "causal-w9", "w2_5-Nq>Nk", "wide"])
def test_window_matches_reference(causal, window, Nq, Nk):
    q, k, v, do = gqa_inputs(1, 2, 2, Nq, Nk, 32, "float32")
    check_against_reference(q, k, v, do, "float32", causal=causal, window_size=window)


@pytest.mark.parametrize("B,Hq,Hk", [(2, 3, 1), (1, 4, 2), pytest.param(2, 4, 4, marks=pytest.mark.slow)],
                         ids=["mqa", "gqa2", "mha"])
def test_gqa_matches_reference(B, Hq, Hk):
    """dK and dV of a K/V head sum over its group of query heads (Hq = Hk: the plain kernels); the GQA K/V
    views are strided (no copy)."""
    q, k, v, do = gqa_inputs(B, Hq, Hk, 40, 70, 32, "float32", strided_kv=Hk == 2)
    _, _, _, dk, dv = check_against_reference(q, k, v, do, "float32", causal=True)
    assert dk.shape == k.shape and dv.shape == v.shape


def test_dkdv_splits_rule():
    """The dK/dV kernel splits a group only when the grid would be too small: the smallest divisor of the group
    that gives two programs per SM (the interpreter counts INTERPRETER_SMS = 2); with head_bytes (the Hopper
    kernel's Q and dO of a query head), also one that keeps a program's share of heads within the L2 cache (the
    interpreter counts INTERPRETER_L2 = 50 MiB)."""
    from flash_attention_triton.launch import INTERPRETER_L2, INTERPRETER_SMS, dkdv_splits

    cpu = torch.device("cpu")
    assert INTERPRETER_SMS == 2
    assert dkdv_splits(1, 1, 1, 100, cpu) == 1  # no GQA: never split
    assert dkdv_splits(1, 1, 8, 100, cpu) == 4  # one program: 4 splits give 4 = 2 per SM
    assert dkdv_splits(1, 1, 3, 100, cpu) == 3  # no divisor is enough: one head per program
    assert dkdv_splits(2, 2, 8, 300, cpu) == 1  # 2 * 2 * 3 programs already
    assert INTERPRETER_L2 == 50 << 20
    head = 2 * 16384 * 128 * 2  # Q_i and dO_i of a query head at N = 16384, D = 128, fp16: 8 MiB
    assert dkdv_splits(1, 1, 32, 16384, cpu) == 1  # 128 programs: enough
    assert dkdv_splits(1, 1, 32, 16384, cpu, head) == 8  # 4 heads (32 MiB) a program; 8 would be 64 MiB
    assert dkdv_splits(1, 1, 3, 16384, cpu, 64 << 20) == 3  # no divisor is enough: one head per program


def test_gqa_split_group_matches_reference():
    """MQA with 8 query heads on one K/V head: 4 programs per K/V block, each summing 2 heads into a float32
    partial, added up by the launcher."""
    q, k, v, do = gqa_inputs(1, 8, 1, 30, 50, 16, "float32")
    _, _, _, dk, dv = check_against_reference(q, k, v, do, "float32", causal=False)
    assert dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("p,Hk,window", [(0.17, 2, (-1, -1)), (0.5, 1, (6, 3))], ids=["p0.17-gqa", "p0.5-mqa-w6_3"])
def test_dropout_matches_reference(p, Hk, window):
    """O = (P * Z / (1 - p)) V with lse before dropout; the backward draws Z again from the seed."""
    q, k, v, do = gqa_inputs(1, 2, Hk, 60, 75, 32, "float32")
    check_against_reference(q, k, v, do, "float32", window_size=window, dropout_p=p, dropout_seed=20260423)


def test_float16_all_variants_at_once():
    q, k, v, do = gqa_inputs(1, 2, 1, 64, 96, 64, "float16")
    check_against_reference(q, k, v, do, "float16", causal=True, window_size=(40, -1), dropout_p=0.25,
                            dropout_seed=99)


@pytest.mark.parametrize("seed", [7, 2**40 + 3, 2**64 - 3], ids=["small", "2^40", "2^64-3"])
def test_dropout_mask_is_philox_keep_mask(seed):
    """With v = identity (Nk = D), O = P * Z / (1 - p) exactly where kept and 0 where dropped: the kernel's
    mask must be philox.keep_mask's, for every (b, h) (offsets use the query head, also under MQA), whatever
    the seed's size, through the custom op (with gradients: the seed travels as an int64) and without."""
    B, H, Nq, Nk, p = 2, 2, 40, 32, 0.3
    q = make_inputs(B, H, Nq, Nk, Nk, device=DEVICE)["q"]
    k = make_inputs(B, 1, Nk, Nk, Nk, device=DEVICE)["k"]
    v = torch.eye(Nk, device=DEVICE).expand(B, 1, Nk, Nk)
    rows, cols = torch.arange(Nq, device=DEVICE), torch.arange(Nk, device=DEVICE)
    want = torch.stack([torch.stack([philox.keep_mask(seed, p, b, h, rows, cols, H, Nq, Nk) for h in range(H)])
                        for b in range(B)])
    assert 0.5 < want.float().mean().item() < 0.9  # a real mask, neither all kept nor all dropped
    for grad in (False, True):
        qq = q.clone().requires_grad_(grad)
        o = flash_attn_triton(qq, k, v, softmax_scale=0.01, dropout_p=p, dropout_seed=seed)  # P_ij > 0 everywhere
        assert torch.equal(o.detach() != 0, want), f"grad={grad}: the dropout mask differs from philox.keep_mask"


def test_dropout_zero_is_the_plain_kernel():
    """dropout_p = 0 (with or without a seed) gives exactly the output without dropout (DROPOUT off)."""
    q, k, v, _ = gqa_inputs(1, 2, 1, 50, 40, 32, "float32")
    plain = flash_attn_triton(q, k, v, causal=True)
    assert torch.equal(flash_attn_triton(q, k, v, causal=True, dropout_p=0.0, dropout_seed=5), plain)
    assert torch.equal(flash_attn_triton(q, k, v, causal=True, dropout_p=0), plain)


def test_autograd_function_takes_the_variants():
    """FlashAttnTritonFunction.apply(q, k, v, causal, scale, window_size, dropout_p, dropout_seed) agrees with
    flash_attn_triton (the custom-op path) in the forward and the backward."""
    q, k, v, do = gqa_inputs(1, 2, 1, 40, 60, 32, "float32")
    kw = dict(window_size=(7, 2), dropout_p=0.2, dropout_seed=11)
    ref = run(q, k, v, do, causal=True, **kw)
    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
    o, lse = A.FlashAttnTritonFunction.apply(qq, kk, vv, True, 1 / math.sqrt(32), (7, 2), 0.2, 11)
    o.backward(do)
    for name, got, want in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, qq.grad, kk.grad, vv.grad), ref):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


def test_capability_table_lists_the_variants():
    assert set(TC.CAPABILITIES["triton"].variants) == {"causal", "window", "gqa", "dropout"}


# ------------------------------------------------------------------ bad input (checked before any kernel runs)
BAD = [
    (dict(window_size="ab"), TypeError, "window_size must be a tuple"),
    (dict(window_size=(3,)), ValueError, "window_size must have 2 entries"),
    (dict(window_size=(-2, 0)), ValueError, "window_size left must be >= -1"),
    (dict(window_size=(1.5, 0)), TypeError, "window_size left must be an int"),
    (dict(window_size=(0, True)), TypeError, "window_size right must be an int"),
    (dict(dropout_p=1.0, dropout_seed=1), ValueError, "dropout_p must be in [0, 1)"),
    (dict(dropout_p=-0.1, dropout_seed=1), ValueError, "dropout_p must be in [0, 1)"),
    (dict(dropout_p="0.1", dropout_seed=1), TypeError, "dropout_p must be a float"),
    (dict(dropout_p=0.1), ValueError, "needs a dropout_seed"),
    (dict(dropout_p=0.1, dropout_seed=-1), ValueError, "dropout_seed must be in [0, 2**64)"),
    (dict(dropout_p=0.1, dropout_seed=2**64), ValueError, "dropout_seed must be in [0, 2**64)"),
    (dict(dropout_p=0.1, dropout_seed=1.0), TypeError, "dropout_seed must be an int"),
]


@pytest.mark.parametrize("kw,exc,text", BAD, ids=[f"{i}-{next(iter(b[0]))}" for i, b in enumerate(BAD)])
def test_bad_variant_arguments(kw, exc, text):
    q, k, v, _ = gqa_inputs(1, 2, 2, 8, 8, 16, "float32")
    with pytest.raises(exc, match="flash_attn_triton") as info:
        flash_attn_triton(q, k, v, **kw)
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize("Hq,Hk,Hv,text", [
    (3, 2, 2, "expected H % Hk == 0"),
    (2, 4, 4, "expected H % Hk == 0"),
    (4, 2, 1, "v must have the shape of k"),
])
def test_bad_gqa_heads(Hq, Hk, Hv, text):
    q = make_inputs(1, Hq, 8, 8, 16, device=DEVICE)["q"]
    k = make_inputs(1, Hk, 8, 8, 16, device=DEVICE)["k"]
    v = make_inputs(1, Hv, 8, 8, 16, device=DEVICE)["v"]
    with pytest.raises(ValueError, match="flash_attn_triton") as info:
        flash_attn_triton(q, k, v)
    assert text in str(info.value), str(info.value)


# ------------------------------------------------------------------ GPU: fp16 / bf16 at larger N
@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal,window,Hk,p", [
    (True, (256, -1), 2, 0.0),      # causal sliding window, GQA
    (False, (128, 128), 8, 0.1),    # symmetric window, dropout
    (True, (-1, -1), 1, 0.15),      # causal MQA with dropout
    (False, (300, 40), 4, 0.0),     # Nq != Nk below
], ids=["causal-w256-gqa", "w128_128-p0.1", "causal-mqa-p0.15", "w300_40-gqa2"])
def test_gpu_variants_larger_n(dtype, causal, window, Hk, p):
    Nq, Nk = (1100, 1300) if window == (300, 40) else (1024, 1024)
    q, k, v, do = gqa_inputs(2, 8, Hk, Nq, Nk, 128 if Hk == 8 else 64, dtype)
    kw = dict(causal=causal, window_size=window)
    if p > 0:
        kw.update(dropout_p=p, dropout_seed=123456789)
    check_against_reference(q, k, v, do, dtype, **kw)


@needs_gpu
def test_gpu_dropout_mask_and_rate():
    """On the GPU too, the compiled tl.rand gives philox.keep_mask's bits; the kept fraction is 1 - p."""
    B, H, Nq, Nk, p, seed = 1, 4, 777, 128, 0.2, 2**63 + 11
    q = make_inputs(B, H, Nq, Nk, Nk, dtype="float16", device="cuda")["q"]
    k = make_inputs(B, 2, Nk, Nk, Nk, dtype="float16", device="cuda")["k"]
    v = torch.eye(Nk, dtype=torch.float16, device="cuda").expand(B, 2, Nk, Nk)
    o = flash_attn_triton(q, k, v, softmax_scale=0.01, dropout_p=p, dropout_seed=seed)
    rows, cols = torch.arange(Nq, device="cuda"), torch.arange(Nk, device="cuda")
    want = torch.stack([philox.keep_mask(seed, p, 0, h, rows, cols, H, Nq, Nk) for h in range(H)])[None]
    assert torch.equal(o != 0, want)
    assert abs(want.float().mean().item() - (1 - p)) < 0.01


@pytest.mark.slow
def test_custom_ops_opcheck_with_variants():
    """torch.library.opcheck of fa_ladder::triton_fwd / triton_bwd with a window, GQA shapes and dropout
    (schema, fake tensors, autograd registration); a seed >= 2**63 travels as its int64 two's complement."""
    from flash_attention_triton.library_ops import seed_arg

    q, k, v, do = gqa_inputs(1, 4, 2, 9, 13, 16, "float32")
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    variant = (3, 1, 0.25, seed_arg(2**64 - 5))
    torch.library.opcheck(torch.ops.fa_ladder.triton_fwd.default, (q, k, v, True, 0.3, *variant))
    o, lse = torch.ops.fa_ladder.triton_fwd(q.detach(), k.detach(), v.detach(), True, 0.3, *variant)
    torch.library.opcheck(torch.ops.fa_ladder.triton_bwd.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, do, True, 0.3, *variant))
