"""Triton backend beyond the shared harness: out-of-bounds guards, block arithmetic, scales, layouts.

Runs on the GPU when there is one, else under TRITON_INTERPRET=1 (tests/conftest.py). The
interpreter does not raise on an out-of-bounds access (it reads or corrupts neighbouring memory),
so the inputs here are views into NaN-filled buffers: any read past row N or column D turns the
output into NaN and fails the test, on the CPU and on the GPU alike.
"""
import math

import numpy as np
import pytest
import torch

from flash_attention_py import attention_reference, attention_reference_grads, make_inputs, masks

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from flash_attention_triton import attention as A  # noqa: E402
from flash_attention_triton import configs as C  # noqa: E402
from flash_attention_triton import flash_attn_triton  # noqa: E402
from flash_attention_triton import launch as L  # noqa: E402
from flash_attention_triton import masks as TM  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not A.INTERPRETED:
    pytest.skip("no GPU and Triton imported without TRITON_INTERPRET=1", allow_module_level=True)

TOL = {"float32": 2e-4 if DEVICE == "cuda" else 2e-5, "float16": 1e-2, "bfloat16": 6e-2}  # max-abs, O ~ N(0, 1/...)


def nan_padded(x, pad_rows=5, pad_d=7):
    """A copy of x (B, H, N, D) living inside a NaN-filled buffer (B, H, N + 2*pad_rows, D + pad_d)."""
    B, H, N, D = x.shape
    buf = torch.full((B, H, N + 2 * pad_rows, D + pad_d), float("nan"), dtype=x.dtype, device=x.device)
    view = buf[:, :, pad_rows:pad_rows + N, :D]
    view.copy_(x)
    return view


def fwd_bwd(q, k, v, do, causal, scale=None):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o, lse = flash_attn_triton(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


def assert_matches(out, ref, tol, what):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert not torch.isnan(out).any(), f"{what}: NaN (an out-of-bounds read of the NaN padding?)"
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), fin), f"{what}: infinite entries differ from the reference"
    err = (out[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= tol, f"{what}: max-abs error {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("Nq,Nk,D", [(37, 75, 40), (70, 33, 24)])
def test_nan_padding_never_read(Nq, Nk, D):
    """Odd sizes, padded D, Nq != Nk: forward and backward never read past row N or column D."""
    dtype = "float32"
    x = make_inputs(1, 2, Nq, Nk, D, dtype=dtype, device=DEVICE)
    q, k, v, do = (nan_padded(x[n]) for n in ("q", "k", "v", "do"))
    for causal in (False, True):
        o, lse, dq, dk, dv = fwd_bwd(q, k, v, do, causal)
        o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
        grads_ref = attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=causal)
        assert_matches(o, o_ref, TOL[dtype], f"o causal={causal}")
        assert_matches(lse, lse_ref, TOL[dtype], f"lse causal={causal}")
        for name, g, g_ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref):
            assert_matches(g, g_ref, 4 * TOL[dtype], f"{name} causal={causal}")


# (fwd, dkdv, dq) block configs with Br != Bc both ways, including Bc > N and Br > N
CONFIGS = [
    dict(fwd=(16, 64), dkdv=(64, 16), dq=(16, 64)),
    dict(fwd=(32, 16), dkdv=(16, 32), dq=(32, 16)),
]


def reference_for_window(x, window, scale):
    """(o, lse, (dq, dk, dv)) in float64 for a (left, right) window: the reference's own masked attention."""
    from flash_attention_py.reference import _naive_torch

    if window in (masks.FULL, masks.CAUSAL):
        causal = window == masks.CAUSAL
        o, lse = attention_reference(x["q"], x["k"], x["v"], causal=causal, softmax_scale=scale, return_lse=True)
        return o, lse, attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=causal, softmax_scale=scale)
    q, k, v = (x[n].detach().double().requires_grad_(True) for n in ("q", "k", "v"))
    with torch.enable_grad():
        o, lse = _naive_torch(q, k, v, scale, window=window)
        o.backward(x["do"].double())
    return o.detach(), lse.detach(), (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["Br16Bc64", "Br32Bc16"])
@pytest.mark.parametrize("window", [masks.FULL, masks.CAUSAL, pytest.param((5, 0), marks=pytest.mark.slow),
                                    pytest.param((3, 7), marks=pytest.mark.slow)], ids=["full", "causal", "w5_0", "w3_7"])
def test_block_arithmetic_any_config(cfg, window):
    """Skipped/partial/full block ranges are right for unequal blocks, Nq != Nk (both ways) and windows
    bounded on either side, through the launchers (the public window_size: tests/test_triton_variants.py)."""
    scale = 0.125
    for Nq, Nk in ((50, 23), (23, 50)):
        x = make_inputs(1, 1, Nq, Nk, 32, dtype="float32", device=DEVICE)
        o_ref, lse_ref, grads_ref = reference_for_window(x, window, scale)
        o, lse = L._forward(x["q"], x["k"], x["v"], window, scale, config=cfg["fwd"])
        assert_matches(o, o_ref, TOL["float32"], f"o {Nq}x{Nk} window={window}")
        assert_matches(lse, lse_ref, TOL["float32"], f"lse {Nq}x{Nk} window={window}")
        grads = L._backward(x["q"], x["k"], x["v"], o, lse, x["do"], window, scale,
                            configs={"dkdv": cfg["dkdv"], "dq": cfg["dq"]})
        for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref):
            assert_matches(g, g_ref, 4 * TOL["float32"], f"{name} {Nq}x{Nk} window={window}")


@triton.jit
def _mask_probe(VIS, RANGES, SPANS, Nq, Nk, LEFT: tl.constexpr, RIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, MAXS: tl.constexpr):
    """Program p: the ranges of query block p and of key block p (12 ints); program 0 also the visible tile.
    SPANS (programs, 2, MAXS): the first rows the backward's merged partial loops (two_spans, span_start) visit,
    K/V blocks of query block p then Q blocks of key block p, -1 past the last."""
    pid = tl.program_id(0)
    q_start = pid * BLOCK_M
    k_start = pid * BLOCK_N
    kv_lo, kv_hi = TM.kv_range(q_start, q_start + BLOCK_M, Nq, Nk, LEFT, RIGHT)
    kv0, kv1, kv2, kv3 = TM.kv_blocks(q_start, Nq, Nk, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    q_lo, q_hi = TM.q_range(k_start, k_start + BLOCK_N, Nq, Nk, LEFT, RIGHT)
    q0, q1, q2, q3 = TM.q_blocks(k_start, Nq, Nk, LEFT, RIGHT, BLOCK_M, BLOCK_N)
    found = (kv_lo, kv_hi, kv0, kv1, kv2, kv3, q_lo, q_hi, q0, q1, q2, q3)
    for i in tl.static_range(12):
        tl.store(RANGES + pid * 12 + i, found[i])
    kv_n1, kv_n = TM.two_spans(kv0, kv1, kv2, kv3, BLOCK_N)
    for i in range(0, kv_n):
        tl.store(SPANS + (pid * 2) * MAXS + i, TM.span_start(i, kv_n1, kv0, kv2, BLOCK_N))
    q_n1, q_n = TM.two_spans(q0, q1, q2, q3, BLOCK_M)
    for i in range(0, q_n):
        tl.store(SPANS + (pid * 2 + 1) * MAXS + i, TM.span_start(i, q_n1, q0, q2, BLOCK_M))
    if pid == 0:
        offs_m = tl.arange(0, ROWS)
        offs_n = tl.arange(0, COLS)
        seen = TM.visible(offs_m[:, None], offs_n[None, :], Nq, Nk, LEFT, RIGHT)
        tl.store(VIS + offs_m[:, None] * COLS + offs_n[None, :], seen.to(tl.int32))


def _check_stages(stages, block, n_blocks_end, kinds, what, spans=None):
    """stages = (start, full_start, full_end, end) of one loop over blocks of ``block`` rows of [0, n_blocks_end);
    kinds = {block start: masks.block_kind}. The unmasked stage must hold exactly the full blocks that lie
    whole inside the bounds, the two masked stages the other non-empty blocks; ``spans`` (the first rows the
    merged partial loop visited, -1 past the last) exactly those masked blocks, each once, in order."""
    start, full_start, full_end, end = stages
    partial = set(range(start, full_start, block)) | set(range(full_end, end, block))
    if spans is not None:
        visited = [s for s in spans if s >= 0]
        assert visited == list(range(start, full_start, block)) + list(range(full_end, end, block)), \
            f"{what}: the merged partial loop visited {visited} ({stages})"
    full = set(range(full_start, full_end, block))
    nonempty = {b for b, kind in kinds.items() if kind != "empty"}
    full_whole = {b for b, kind in kinds.items() if kind == "full" and b + block <= n_blocks_end}
    assert full == full_whole, f"{what}: unmasked blocks {sorted(full)}, expected {sorted(full_whole)} ({stages})"
    assert not partial & full and partial | full == nonempty, \
        f"{what}: visited {sorted(partial | full)}, expected the non-empty blocks {sorted(nonempty)} ({stages})"


@pytest.mark.parametrize("n_random", [4, pytest.param(40, marks=pytest.mark.slow)])
def test_triton_mask_helpers_match_python_masks(n_random):
    """flash_attention_triton.masks (run as a kernel) gives what flash_attention_py.masks gives: the visible
    tile, kv_range and q_range of every block, and loop stages that visit exactly the non-empty blocks with
    no mask on exactly the full ones (whole blocks inside the bounds), and the backward's merged partial loop
    (masks.two_spans) visits exactly the masked ones. Random sizes, windows and blocks."""
    rng = np.random.default_rng()
    ROWS = COLS = 128
    cases = [(70, 20, masks.CAUSAL, 16, 32), (20, 70, masks.CAUSAL, 32, 16), (33, 33, (0, 0), 16, 16)]
    for _ in range(n_random):
        Nq, Nk = (int(n) for n in rng.integers(1, 100, size=2))
        window = tuple(int(w) for w in rng.choice([-1, 0, 1, 6, 19, 45], size=2))
        cases.append((Nq, Nk, window, int(rng.choice([16, 32])), int(rng.choice([16, 32]))))
    for Nq, Nk, window, BM, BN in cases:
        what = f"Nq={Nq} Nk={Nk} window={window} Br={BM} Bc={BN}"
        programs = max(triton.cdiv(Nq, BM), triton.cdiv(Nk, BN))
        ranges = torch.zeros(programs * 12, dtype=torch.int32, device=DEVICE)
        vis = torch.zeros(ROWS * COLS, dtype=torch.int32, device=DEVICE)
        MAXS = 16
        spans = torch.full((programs * 2 * MAXS,), -1, dtype=torch.int32, device=DEVICE)
        _mask_probe[(programs,)](vis, ranges, spans, Nq, Nk, window[0], window[1], BM, BN, ROWS, COLS, MAXS)
        spans = spans.view(programs, 2, MAXS).tolist()
        want = masks.visible(np.arange(ROWS), np.arange(COLS), Nq, Nk, window)
        assert np.array_equal(vis.view(ROWS, COLS).cpu().numpy().astype(bool), want), f"visible: {what}"
        for p, r in enumerate(ranges.view(programs, 12).tolist()):
            q_start, k_start = p * BM, p * BN
            if q_start < Nq:
                assert tuple(r[0:2]) == masks.kv_range(q_start, q_start + BM, Nq, Nk, window), f"kv_range {p}: {what}"
                kinds = {b: masks.block_kind(q_start, q_start + BM, b, b + BN, Nq, Nk, window) for b in range(0, Nk, BN)}
                _check_stages(r[2:6], BN, Nk, kinds, f"kv_blocks of query block {p}: {what}", spans[p][0])
            if k_start < Nk:
                assert tuple(r[6:8]) == masks.q_range(k_start, k_start + BN, Nq, Nk, window), f"q_range {p}: {what}"
                kinds = {b: masks.block_kind(b, b + BM, k_start, k_start + BN, Nq, Nk, window) for b in range(0, Nq, BM)}
                _check_stages(r[8:12], BM, Nq, kinds, f"q_blocks of key block {p}: {what}", spans[p][1])


def test_rows_that_see_no_key():
    """Causal with Nq > Nk: the rows that see no key give O = 0, lse = -inf and zero dq, never NaN."""
    Nq, Nk = 70, 20
    x = make_inputs(1, 1, Nq, Nk, 16, dtype="float32", device=DEVICE)
    o, lse, dq, dk, dv = fwd_bwd(x["q"], x["k"], x["v"], x["do"], True)
    blind = masks.q_range(0, Nk, Nq, Nk, masks.CAUSAL)[0]  # the first query that sees a key
    assert blind == 50
    assert torch.all(o[:, :, :blind] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :blind]))
    assert torch.isfinite(lse[:, :, blind:]).all()
    assert torch.all(dq[:, :, :blind] == 0)
    for g in (o, dq, dk, dv):
        assert not torch.isnan(g).any()


def test_unit_head_dim_stride_and_broadcast_do():
    """q with a non-unit stride along D, and dO from a sum (stride 0 everywhere)."""
    B, H, N, D = 1, 2, 33, 32
    x = make_inputs(B, H, N, N, D, dtype="float32", device=DEVICE)
    q = x["q"].transpose(-1, -2).contiguous().transpose(-1, -2)  # stride along D is N
    assert q.stride(-1) != 1
    q_, k_, v_ = (t.detach().requires_grad_(True) for t in (q, x["k"], x["v"]))
    o = flash_attn_triton(q_, k_, v_, causal=True)
    o.sum().backward()  # dO is an expanded tensor of ones: all strides 0
    grads_ref = attention_reference_grads(q, x["k"], x["v"], torch.ones_like(o), causal=True)
    assert_matches(o, attention_reference(q, x["k"], x["v"], causal=True), TOL["float32"], "o")
    for name, g, g_ref in zip(("dq", "dk", "dv"), (q_.grad, k_.grad, v_.grad), grads_ref):
        assert_matches(g, g_ref, 4 * TOL["float32"], name)


def test_lse_not_differentiable_and_output_contract():
    x = make_inputs(2, 1, 17, 17, 16, dtype="float16", device=DEVICE, with_grad=True)
    o, lse = flash_attn_triton(x["q"], x["k"], x["v"], return_lse=True)
    assert o.dtype == torch.float16 and o.shape == x["q"].shape and o.requires_grad
    assert lse.dtype == torch.float32 and lse.shape == (2, 1, 17) and not lse.requires_grad
    o2 = flash_attn_triton(x["q"], x["k"], x["v"])
    assert torch.equal(o, o2), "the kernel must be deterministic"


def test_package_attribute_is_resolved_once():
    """``flash_attention_triton.flash_attn_triton`` is loaded lazily (the package imports neither torch nor triton) and
    then kept on the package: a call through the package pays no __getattr__ (about 2 us of host time a call)."""
    import flash_attention_triton as fat

    fn = fat.flash_attn_triton
    assert vars(fat)["flash_attn_triton"] is fn is A.flash_attn_triton


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's bf16 refusal only applies to CPU tensors")
def test_bf16_refused_under_interpreter():
    x = make_inputs(1, 1, 16, 16, 16, dtype="bfloat16")
    with pytest.raises(TypeError, match="bfloat16.*interpreter"):
        flash_attn_triton(x["q"], x["k"], x["v"])


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU only")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_autotuned_path(dtype, D):
    """N >= AUTOTUNE_MIN_N goes through triton.autotune: check it against FA2-sized odd problems."""
    N = C.AUTOTUNE_MIN_N + 37
    x = make_inputs(1, 2, N, N, D, dtype=dtype, device="cuda")
    for causal in (False, True):
        o, lse, dq, dk, dv = fwd_bwd(x["q"], x["k"], x["v"], x["do"], causal)
        o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
        grads_ref = attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=causal)
        tol = TOL[dtype]
        assert_matches(o, o_ref, tol, f"o {dtype} causal={causal}")
        assert_matches(lse, lse_ref, tol, f"lse {dtype} causal={causal}")
        for name, g, g_ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref):
            assert_matches(g, g_ref, 10 * tol * math.sqrt(N / 64), f"{name} {dtype} causal={causal}")



def test_length_bucket():
    assert [L.length_bucket(n) for n in (1, 1000, 1024, 1025, 1100, 2048, 3000)] == [1, 1024, 1024, 2048, 2048, 2048, 4096]
    # the launcher's host arithmetic is triton's, in plain Python
    for n in list(range(1, 300)) + [2**20 - 1, 2**20, 2**20 + 1, 2**31 - 1]:
        assert L._next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 16, 64, 128, 7):
            assert L._cdiv(n, b) == triton.cdiv(n, b), (n, b)
    assert [L._block_d(D) for D in (1, 16, 17, 40, 64, 96, 128, 200, 256)] == [16, 16, 32, 64, 64, 128, 128, 256, 256]


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU only: the autotuner runs on a GPU")
def test_gpu_new_length_in_a_tuned_bucket_does_not_tune_again():
    """Autotuning is keyed on power-of-two buckets of Nq and Nk: 1100 tunes, 1500 (same bucket) reuses it."""
    D, causal = 64, False
    tuner = L._TUNED["fwd"]
    x = make_inputs(1, 2, 1100, 1100, D, dtype="float16", device="cuda")
    flash_attn_triton(x["q"], x["k"], x["v"], causal=causal)
    tuned = len(tuner.cache)
    plans = len(L._PLAN)
    x = make_inputs(1, 2, 1500, 1500, D, dtype="float16", device="cuda")
    o = flash_attn_triton(x["q"], x["k"], x["v"], causal=causal)
    torch.cuda.synchronize()
    assert len(tuner.cache) == tuned, "a new length in a tuned bucket ran the autotuner again"
    assert len(L._PLAN) == plans
    ref = attention_reference(x["q"], x["k"], x["v"], causal=causal)
    assert_matches(o, ref, TOL["float16"], "o at N=1500 with the bucket's config")

class FakeDriver:
    """Triton's active driver as the launch tests see it: device 0, stream 77."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 77


def test_launch_reuses_the_compiled_kernel_under_a_key_finer_than_its_specialisation(monkeypatch):
    """L._run calls Triton's launcher once per distinct key (tensors' dtypes and 16-byte alignment, every int's
    value, the floats' and the seed's types, the constexprs) and the compiled kernel directly after that; a launch
    hook (a profiler) sends every launch through Triton's own path. On a fake kernel and driver (no GPU)."""
    calls = []

    class Compiled:
        packed_metadata, function = "meta", "fn"

        def run(self, *args):
            calls.append(("direct",) + args)

    class Kernel:
        arg_names = ["X", "Y", "stride", "n", "p", "seed", "BLOCK", "FLAG"]

        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append(("triton", grid, args, kw)) or Compiled()

    monkeypatch.setattr(L, "INTERPRETED", False)
    monkeypatch.setattr(L, "_COMPILED", {})
    monkeypatch.setattr(L, "_driver", FakeDriver)
    kernel, buf = Kernel(), torch.zeros(64, dtype=torch.float16)
    x, y = buf[:16], buf[16:32]  # 32-byte offsets: both 16-byte aligned
    consts = dict(BLOCK=64, FLAG=True, num_warps=4)

    def launch(x=x, stride=8, seed=5, p=0.1, **kw):
        calls.clear()
        L._run(kernel, (3, 2), (x, y), (stride, 100), (p, seed), dict(consts, **kw))
        return calls[0][0]

    assert launch() == "triton" and calls[0][1:] == ((3, 2), (x, y, 8, 100, 0.1, 5), consts)
    assert launch() == "direct"
    assert calls[0][1:] == (3, 2, 1, 77, "fn", "meta", None, None, None, x, y, 8, 100, 0.1, 5, 64, True)
    assert launch(seed=12345, p=0.3) == "direct"  # the seed and the floats are not specialised on
    assert launch(stride=16) == "triton"  # another int value (divisible by 16 now)
    assert launch(x=buf[1:17]) == "triton"  # an address 2 bytes off alignment
    assert launch(x=buf[16:32].float()) == "triton"  # another dtype
    assert launch(seed=2**40) == "triton" and launch(seed=2**40 + 1) == "direct"  # an i64 seed
    assert launch(BLOCK=32) == "triton"
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert launch() == "triton"


def test_call_plans_replay_the_launches_of_an_earlier_call(monkeypatch):
    """_forward and _backward leave a call plan once every launch is in the compiled-kernel cache; a later call
    with the same shapes, strides, dtype, alignment, window and dropout kinds launches the plan's kernels directly
    with the same grids and arguments (its own tensors). Anything else that changes a launch takes the full path.
    On fake kernels and a fake driver (no GPU)."""
    calls = []

    class Compiled:
        packed_metadata = "meta"

        def __init__(self, name):
            self.function = name

        def run(self, *args):
            calls.append(("direct", self.function, args[:3], args[9:]))

    class Kernel:
        def __init__(self, name, real):
            self.name, self.arg_names = name, real.arg_names

        def __getitem__(self, grid):
            def launch(*args, **kw):
                calls.append(("triton", self.name, (grid[0], grid[1], 1), args))
                return Compiled(self.name)
            return launch

    monkeypatch.setattr(L, "INTERPRETED", False)
    for name in ("_COMPILED", "_CALLS"):
        monkeypatch.setattr(L, name, {})
    monkeypatch.setattr(L, "_driver", FakeDriver)
    monkeypatch.setattr(L, "_JIT", {n: Kernel(n, f) for n, f in L._JIT.items()})
    x = make_inputs(2, 4, 100, 90, 64, dtype="float16", device="cpu")
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    o, lse = torch.randn_like(q), torch.randn(q.shape[:3])

    def run(fn, *args, **kw):
        calls.clear()
        fn(*args, **kw)
        return [c[0] for c in calls], [c[1:] for c in calls]

    def same_launches(full, direct, n_tensors):
        """The direct launches: the full path's kernels, grids, ints and tail (the output tensors are new)."""
        assert [c[0] for c in full] == [c[0] for c in direct]
        for (_, grid, args), (_, grid_d, args_d), n in zip(full, direct, n_tensors):
            assert grid == grid_d and args[n:] == args_d[n:len(args)]
            inputs = [i for i, a in enumerate(args[:n]) if any(a is t for t in (q, k, v, do, o, lse))]
            assert inputs and all(args[i] is args_d[i] for i in inputs)

    for window, drop in (((-1, 0), {}), ((3, 2), {"dropout_p": 0.25, "dropout_seed": 9})):
        ways, full = run(L._forward, q, k, v, window, 0.125, **drop)
        assert ways == ["triton"]
        ways, direct = run(L._forward, q, k, v, window, 0.125, **drop)
        assert ways == ["direct"]
        same_launches(full, direct, [5])
        ways, full = run(L._backward, q, k, v, o, lse, do, window, 0.125, **drop)
        assert ways == ["triton"] * 2 and [c[0] for c in full] == ["dq", "dkdv"]  # dQ (and Delta) first
        ways, direct = run(L._backward, q, k, v, o, lse, do, window, 0.125, **drop)
        assert ways == ["direct"] * 2
        same_launches(full, direct, [8, 8])
    # the softmax scale and the seed are run-time arguments: the plan's launches with the new values
    ways, direct = run(L._backward, q, k, v, o, lse, do, (3, 2), -0.5, dropout_p=0.5, dropout_seed=10)
    tail = (-0.5 * L.LOG2E, 0.5, 10)
    plain = [[a for a in args if not isinstance(a, torch.Tensor)] for _, _, args in direct]
    assert ways == ["direct"] * 2 and all(any(tuple(p[i:i + 3]) == tail for i in range(len(p))) for p in plain)
    # what changes a launch: another window, a seed of another int type, strides, alignment, a launch hook
    assert run(L._forward, q, k, v, (5, 2), 0.125)[0] == ["triton"]
    assert run(L._forward, q, k, v, (3, 2), 0.125, dropout_p=0.25, dropout_seed=2**40)[0] == ["triton"]
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert run(L._forward, qt, k, v, (-1, 0), 0.125)[0] == ["triton"]
    assert run(L._forward, qt, k, v, (-1, 0), 0.125)[0] == ["direct"]
    buf = torch.empty(q.numel() + 1, dtype=q.dtype)
    q_odd = buf[1:].view(q.shape)
    assert run(L._backward, q_odd, k, v, o, lse, do, (-1, 0), 0.125)[0] == ["triton"] * 2
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert run(L._forward, q, k, v, (-1, 0), 0.125)[0] == ["triton"]
    assert run(L._forward, q, k, v, (-1, 0), 0.125)[0] == ["triton"]


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU only: call plans launch compiled kernels")
@pytest.mark.parametrize("variant", [dict(window=(-1, 0)), dict(window=(40, 3)),
                                     dict(window=(-1, -1), dropout_p=0.2), dict(window=(-1, 0), Hk=1)],
                         ids=["causal", "window", "dropout", "mqa-split"])
def test_gpu_call_plans_give_the_full_paths_answers(variant, monkeypatch):
    """The first calls take the full path and leave a call plan; the plan's replay gives the same bits (the
    kernels are deterministic), a new seed through the plan gives the full path's answer for that seed, and the
    answers match float64. MQA with one K/V head splits the dK/dV kernel's group (partial sums added up).
    The forward is forward_kernel.py's on a Hopper too (hopper_forward.py leaves no call plan)."""
    monkeypatch.setattr(L, "HOPPER_FORWARD", False)
    window, p, Hk = variant["window"], variant.get("dropout_p", 0.0), variant.get("Hk", 4)
    x = make_inputs(2, 4, 300, 260, 64, dtype="float16", device="cuda", Hk=Hk)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    seeds = (11, 12) if p else (None, None)

    def call(seed):
        o, lse = L._forward(q, k, v, window, 0.125, dropout_p=p, dropout_seed=seed)
        return (o, lse) + L._backward(q, k, v, o, lse, do, window, 0.125, dropout_p=p, dropout_seed=seed)

    L._CALLS.clear()
    first = [call(seeds[0]) for _ in range(3)]  # full path (compiles), full path (leaves the plan), plan
    assert sum(key[0] in ("fwd", "bwd") for key in L._CALLS) == 2, "no call plan was left"
    for later in first[1:]:
        for a, b in zip(first[0], later):
            assert torch.equal(a, b), "a call plan's replay differs from the full path"
    replayed = call(seeds[1])
    L._CALLS.clear()
    full = call(seeds[1])
    assert all(torch.equal(a, b) for a, b in zip(replayed, full)), "another seed through the plan differs"
    ref = attention_reference(q, k, v, window_size=window, dropout_p=p, dropout_seed=seeds[1], return_lse=True)
    grads = attention_reference_grads(q, k, v, do, window_size=window, dropout_p=p, dropout_seed=seeds[1])
    assert_matches(full[0], ref[0], TOL["float16"], "o")
    for name, g, g_ref in zip(("dq", "dk", "dv"), full[2:], grads):
        assert_matches(g, g_ref, 10 * TOL["float16"] * math.sqrt(300 / 64), name)


@pytest.mark.skipif(DEVICE != "cuda", reason="GPU only: the direct launch runs on a GPU")
def test_gpu_direct_launch_keeps_each_specialisation():
    """The same shapes and strides at 16-byte aligned addresses and 2 bytes off, alternating: Triton compiles each
    specialisation once, L._run launches the cached one directly after that, and every answer matches float64."""
    x = make_inputs(2, 3, 100, 130, 64, dtype="float16", device="cuda")

    def at_offset(t, offset):
        buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
        view = buf[offset:offset + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    for causal in (False, True):
        o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
        grads_ref = attention_reference_grads(x["q"], x["k"], x["v"], x["do"], causal=causal)
        for offset in (0, 1, 0, 1):
            q, k, v, do = (at_offset(x[n], offset) for n in ("q", "k", "v", "do"))
            assert (q.data_ptr() % 16 == 0) == (offset == 0)
            o, lse, dq, dk, dv = fwd_bwd(q, k, v, do, causal)
            assert_matches(o, o_ref, TOL["float16"], f"o offset {offset} causal={causal}")
            assert_matches(lse, lse_ref, TOL["float16"], f"lse offset {offset} causal={causal}")
            for name, g, g_ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref):
                assert_matches(g, g_ref, 10 * TOL["float16"] * math.sqrt(130 / 64), f"{name} offset {offset}")
    assert L._COMPILED, "no launch went through the direct path's cache"


def test_checks_are_cached_by_what_they_read(monkeypatch):
    """flash_attn_triton checks a call once per distinct key (validation.cached_check, as flash_attn_cuda does);
    another shape or argument is checked again, bad input is refused every time."""
    seen = []
    real = A._check_call
    monkeypatch.setattr(A, "_CHECKED", {})
    monkeypatch.setattr(A, "_check_call", lambda *a, **kw: seen.append(a[0].shape) or real(*a, **kw))
    x = make_inputs(1, 2, 17, 17, 16, dtype="float32", device=DEVICE)
    q, k, v = x["q"], x["k"], x["v"]
    first = flash_attn_triton(q, k, v, causal=True)
    for _ in range(2):
        assert torch.equal(flash_attn_triton(q, k, v, causal=True), first)
    assert len(seen) == 1
    flash_attn_triton(q, k, v, causal=False)
    flash_attn_triton(q[:, :, :5], k, v, causal=True)
    assert len(seen) == 3
    for _ in range(2):
        with pytest.raises(TypeError, match="causal must be True or False"):
            flash_attn_triton(q, k, v, causal=1)
    assert len(seen) == 5


def test_prune_keeps_something_and_fits():
    for kernel, cands in C.CANDIDATES.items():
        for block_d in (16, 64, 128, 256):
            for elem in (2, 4):
                kept = C.prune(kernel, cands, block_d, elem)
                assert kept, (kernel, block_d, elem)
                for c in kept:
                    BM, BN, w, s = c
                    if len(kept) > 1 or C.smem_estimate(kernel, BM, BN, s, block_d, elem) <= C.SMEM_LIMIT[90]:
                        assert C.smem_estimate(kernel, BM, BN, s, block_d, elem) <= C.SMEM_LIMIT[90]


def test_double_backward_is_a_clear_error_or_correct():
    """create_graph=True then a gradient penalty: either a RuntimeError that says so, or the right 2nd-order term.

    (It used to give q.grad = 2q exactly: the penalty's contribution through the backward was dropped.)
    """
    x = make_inputs(1, 1, 16, 16, 16, dtype="float32", device=DEVICE)
    q, k, v = (t.detach().requires_grad_(True) for t in (x["q"], x["k"], x["v"]))
    o = flash_attn_triton(q, k, v)
    (gq,) = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)
    try:
        (gq.pow(2).sum() + q.pow(2).sum()).backward()
    except RuntimeError as exc:
        assert any(w in str(exc).lower() for w in ("double backward", "differentiate twice", "not differentiable")), exc
        return
    # no error: then the second-order term must be there, as autograd through float64 naive attention gives it
    from flash_attention_py import attention_naive

    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (x["q"], x["k"], x["v"]))
    (g64,) = torch.autograd.grad(attention_naive(q64, k64, v64).pow(2).sum(), q64, create_graph=True)
    (g64.pow(2).sum() + q64.pow(2).sum()).backward()
    assert_matches(q.grad, q64.grad, 1e-3, "q.grad of the gradient penalty")


def test_scale_that_overflows_float32_is_refused():
    x = make_inputs(1, 1, 8, 8, 16, dtype="float32", device=DEVICE)
    with pytest.raises(ValueError, match="flash_attn_triton: softmax_scale .*overflow float32"):
        flash_attn_triton(x["q"], x["k"], x["v"], softmax_scale=1e38)
    with pytest.raises(ValueError, match="flash_attn_triton: softmax_scale .*too large to hold precisely"):
        flash_attn_triton(x["q"], x["k"], x["v"], softmax_scale=1e30)  # fits, but one ulp of a score > 1/8
    o = flash_attn_triton(x["q"], x["k"], x["v"], softmax_scale=1e4)  # large but precise: computed
    assert_matches(o, attention_reference(x["q"], x["k"], x["v"], softmax_scale=1e4), 1e-2, "o scale=1e4")


@pytest.mark.parametrize("scale", [-20.0, -0.3, 0.0, 2.0])
@pytest.mark.parametrize("causal", [False, True])
def test_signed_and_zero_scales(scale, causal):
    """The forward with a signed scale: every sign, zero, and large ones (a row max taken on the wrong side would
    overflow exp2; docs/results/triton/fma_fold/ tried two fma forms of it), against float64, with Nq != Nk and
    ragged ends so that both kinds of block run (and, causal, rows that see no key: O = 0 and lse = -inf)."""
    x = make_inputs(1, 2, 150, 70, 32, dtype="float32", device=DEVICE)
    o, lse = flash_attn_triton(x["q"], x["k"], x["v"], causal=causal, softmax_scale=scale, return_lse=True)
    o_ref, lse_ref = attention_reference(x["q"], x["k"], x["v"], causal=causal, softmax_scale=scale,
                                         return_lse=True)
    assert_matches(o, torch.as_tensor(o_ref), 1e-4, f"o scale={scale}")
    # lse grows with the scale (|lse| ~ |scale| max|S|): float32's rounding of it too
    assert_matches(lse, torch.as_tensor(lse_ref), 1e-4 * max(1.0, abs(scale)), f"lse scale={scale}")


@pytest.mark.slow
def test_element_offsets_past_int32():
    """A legal strided view whose row offsets pass 2**31 elements: int64 offsets (it segfaulted with int32).

    The issue's reproducer: a (1, 1, 64, 16) view into a (64, 34_200_000) float16 buffer (4.4 GB), forward and
    backward. On the GPU it needs about 4.4 GB of device memory.
    """
    store = torch.zeros(64, 34_200_000, dtype=torch.float16, device=DEVICE)
    try:
        q = store[:, :16].view(1, 1, 64, 16)
        q.copy_(torch.randn(1, 1, 64, 16, device=DEVICE).half())
        assert q.stride(2) * 63 > 2**31
        k, v, do = (torch.randn(1, 1, 64, 16, device=DEVICE).half() for _ in range(3))
        o, lse, dq, dk, dv = fwd_bwd(q, k, v, do, causal=True)
        assert_matches(o, attention_reference(q, k, v, causal=True), TOL["float16"], "o")
        for name, g, g_ref in zip(("dq", "dk", "dv"), (dq, dk, dv),
                                  attention_reference_grads(q, k, v, do, causal=True)):
            assert_matches(g, g_ref, 4 * TOL["float16"], name)
    finally:
        del store
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ tools/triton_fused_backward_probe.py
@pytest.mark.skipif(DEVICE != "cpu", reason="the probe's check runs under the interpreter; on a GPU the probe "
                                            "times itself (python tools/triton_fused_backward_probe.py --out DIR)")
def test_fused_backward_probe_matches_the_two_kernels():
    """The probe's one-grid backward (the same inner loops) gives the two kernels' dQ, dK, dV: window, full, GQA."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "triton_fused_backward_probe.py"
    spec = importlib.util.spec_from_file_location("triton_fused_backward_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.main(["--check"]) == 0
