"""The CUDA rung's C++ launch plans (flash_attention_cuda/launch_plans.py, launch_plans.cpp).

* CPU: the description a plan is built from (every kernel parameter from the right buffer, tensor map or
  constant), the keys (a call the checks would refuse never shares a key with one they pass), a build that fails
  (a warning, then the Python path), and that ``launch_specs.clear_caches`` forgets the plans.
* GPU: a repeated call runs its plan (no Python launch) and gives the Python path's bits, forward and backward,
  every tensor-core rung, with causal, a window and grouped-query heads; inputs that do not fit a plan
  (misaligned, strided, another stream) fall back; bad input still raises after a plan exists; a plan runs inside
  a CUDA graph capture. Without a GPU these skip with the reason.
"""
import numpy as np
import pytest
import torch

from flash_attention_py import make_inputs

from flash_attention_cuda import flash_attn_cuda, flash_attn_cuda_backward, launch_plans, launch_specs, runtime
from flash_attention_cuda.capabilities import cuda_unavailable_reason, hopper_probe

REASON = cuda_unavailable_reason()
gpu = pytest.mark.skipif(REASON is not None, reason=str(REASON))
HOPPER_REASON = hopper_probe("cuda")
hopper = pytest.mark.skipif(HOPPER_REASON is not None, reason=f"wgmma: {HOPPER_REASON}")


# ------------------------------------------------------------------ CPU: the description and the keys
@pytest.mark.parametrize("make", ["wgmma_ws_fwd", "mma_fwd", "wgmma_bwd_ws", "mma_bwd_dkdv"])
def test_description_names_every_parameter(make):
    """describe(): per launch, the kernel, grid + block (padded to 3 + 3), shared memory; each tensor map from its
    buffer with runtime.tensor_map_layout's dims, strides and box and the swizzle of its box; each pointer from
    its buffer (an input, an output, or a buffer inside the scratch output at its byte offset); each scalar's
    C value as bytes, in the kernel's order."""
    p = launch_specs.Problem(B=2, H=4, Nq=100, Nk=70, D=64, dtype="bfloat16", scale=-0.3, window=(5, 0), Hk=2)
    forward = make.endswith("fwd")
    if make == "wgmma_ws_fwd":
        spec = launch_specs.wgmma_ws_fwd(p, ctas=132)
    elif make == "mma_fwd":
        spec = launch_specs.forward_spec("mma", p, vec4=True)
    else:
        spec = getattr(launch_specs, make)(p)
    q, kv = (2, 4, 100, 64), (2, 2, 70, 64)
    if forward:
        inputs = dict(Q=q, K=kv, V=kv)
        outputs = (("O", q, torch.float16), ("LSE", (2, 4, 100), torch.float32))
        at = {}
    else:
        inputs = dict(Q=q, K=kv, V=kv, O=q, LSE=(2, 4, 100), dO=q)
        outputs = (("dQ", q, torch.float16), ("dK", kv, torch.float16), ("dV", kv, torch.float16),
                   ("scratch", (4096,), torch.float32))
        at = {"Delta": ("scratch", 4 * 64), "dQaccum": ("scratch", 0), "dKVpart": ("scratch", 0)}
    shapes = {**inputs, **{n: s for n, s, _ in outputs}}
    outs, launches = launch_plans.describe((spec,), inputs, outputs, at, lambda s: 0xC0FFEE)
    assert outs == [(list(s), d) for _, s, d in outputs]
    (function, dims, smem, maps, buffers, scalars), = launches
    names = list(inputs) + [n for n, _, _ in outputs]
    assert function == 0xC0FFEE and smem == spec.smem
    pad3 = lambda t: tuple(t) + (1,) * (3 - len(t))  # noqa: E731
    assert dims == list(pad3(spec.grid) + pad3(spec.block))
    assert len(maps) == len(spec.maps)
    for (src, mdims, mstrides, box, swizzle), (_, name, rows) in zip(maps, spec.maps):
        want = runtime.tensor_map_layout(shapes[name], rows)
        assert names[src] == name and (tuple(mdims), tuple(mstrides), tuple(box)) == want
        assert swizzle == runtime._TMA_SWIZZLE[want[2][0]]
    for (src, offset), name in zip(buffers, spec.buffers):
        base, want_offset = at.get(name, (name, 0))
        assert names[src] == base and offset == want_offset, name
    assert len(buffers) == len(spec.buffers)
    assert scalars == [np.asarray(v).tobytes() for v in spec.scalar_values]
    assert all(len(b) in (4, 8) for b in scalars)


def test_cpp_tensor_map_constants_are_the_runtime_ones():
    """launch_plans.cpp encodes tensor maps with cuda.h's enums as constants; they are runtime.py's, the one
    place the Python launch reads them from (data type, interleave, L2 promotion, out-of-bounds fill)."""
    import re

    text = open(launch_plans.SOURCE).read()
    found = dict(re.findall(r"k(TmaUint16|TmaInterleaveNone|TmaL2_256B|TmaOobZero) = (\d+)", text))
    assert {k: int(v) for k, v in found.items()} == {
        "TmaUint16": runtime._TMA_UINT16, "TmaInterleaveNone": runtime._TMA_INTERLEAVE_NONE,
        "TmaL2_256B": runtime._TMA_L2_256B, "TmaOobZero": runtime._TMA_OOB_ZERO}


def test_public_keys_keep_refused_calls_apart(monkeypatch):
    """public_forward_key: every argument's value, the tensors' shapes and dtypes, and whether the call needs a
    gradient; no key where a plan may not answer: dropout, a window that is not a tuple of two ints, |scale| > 1,
    an argument of another type than its plain one (causal=1: the Python path's checks read it), not plain torch
    tensors. Strides are left to the C++ run, which refuses a strided view of a planned shape
    (test_inputs_that_do_not_fit_a_plan_fall_back)."""
    monkeypatch.setattr(launch_plans, "ENABLED", True)
    monkeypatch.setattr(launch_plans, "_EXT", None)  # not yet built: keys are made (no plan is ever found here)
    q = torch.randn(1, 2, 8, 64)
    base = dict(causal=True, softmax_scale=None, kernel="auto", return_lse=False, window_size=(-1, -1),
                dropout_p=0.0, dropout_seed=None)

    def key(x=q, **kw):
        args = {**base, **kw}
        return launch_plans.public_forward_key(x, q, q, *args.values())

    assert key() is not None and key() == key()
    assert key(x=q.transpose(2, 3).contiguous().transpose(2, 3)) == key()  # same shape, other strides: C++ decides
    assert key(x=q.half()) != key() and key(x=q[:, :, :7]) != key()  # dtype, shape
    assert key(kernel="wgmma") != key() and key(return_lse=True) != key() and key(causal=False) != key()
    assert key(window_size=(3, 0)) != key() and key(softmax_scale=0.5) != key()
    for refused in (dict(dropout_seed=3), dict(window_size=[-1, -1]), dict(softmax_scale=2.0),
                    dict(softmax_scale=np.float32(0.1)), dict(causal=1), dict(window_size=(-1.0, -1)),
                    dict(window_size=(-1, -1, 0)), dict(return_lse=0), dict(kernel=["mma"]),
                    dict(dropout_p=False)):
        assert key(**refused) is None, refused
    assert key()[-1] is False and key(x=q.clone().requires_grad_())[-1] is True  # a gradient: a key of its own
    with torch.no_grad():
        assert key(x=q.clone().requires_grad_()) == key()  # no gradient under no_grad
    assert launch_plans.public_forward_key(q.numpy(), q, q, *base.values()) is None


def test_clear_caches_forgets_plans():
    """launch_specs.clear_caches(), called by code that changes a setting the specs read, forgets the plans' keys
    too, so the next call is planned again from the new setting."""
    launch_plans.FORWARD["k"] = launch_plans.BACKWARD["k"] = launch_plans.PUBLIC["k"] = 0
    launch_specs.clear_caches()
    assert not (launch_plans.FORWARD or launch_plans.BACKWARD or launch_plans.PUBLIC)


def test_public_table_is_bounded(monkeypatch):
    """remember_public clears a full PUBLIC table first (PLANS_MAX keys), as remember does its tables: a workload
    of ever-new shapes keeps a bounded table."""
    monkeypatch.setattr(launch_plans, "PLANS_MAX", 3)
    for i in range(7):
        launch_plans.remember_public(("key", i), i)
        assert len(launch_plans.PUBLIC) <= 3 and launch_plans.PUBLIC[("key", i)] == i


def test_a_failed_build_warns_and_leaves_the_python_path(monkeypatch):
    """Where the extension cannot be built (no compiler, no CUDA headers), module() warns once, naming the cause
    and the switch that skips the attempt, and returns False; plans are then off for the process."""
    from torch.utils import cpp_extension

    def fail(*a, **kw):
        raise OSError("nvcc not found")

    monkeypatch.setattr(launch_plans, "_EXT", None)
    monkeypatch.setattr(launch_plans, "ENABLED", True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "load", fail)
    with pytest.warns(RuntimeWarning, match=r"could not be built \(OSError: nvcc not found\).*FA_CUDA_LAUNCH_PLANS=0"):
        assert launch_plans.module() is False
    assert not launch_plans.enabled()
    assert launch_plans.remember(launch_plans.FORWARD, ("k",), (), {}, (), {}, ()) is None


def test_a_refused_plan_turns_plans_off(monkeypatch):
    """If the extension refuses a plan (add_plan raises), remember warns once and turns plans off for the
    process instead of failing the call that already ran."""
    class Refusing:
        def add_plan(self, *args):
            raise TypeError("incompatible function arguments")

    spec = launch_specs.forward_spec("mma", launch_specs.Problem(B=1, H=2, Nq=40, Nk=40, D=64, dtype="float16",
                                                                 scale=0.1, window=(-1, -1)), vec4=True)
    q, lse = torch.empty(1, 2, 40, 64, dtype=torch.float16), torch.empty(1, 2, 40)
    monkeypatch.setattr(launch_plans, "_EXT", Refusing())
    monkeypatch.setattr(runtime, "get_kernel", lambda *a: type("K", (), {"kernel": type("F", (), {"ptr": 1})})())
    args = (launch_plans.FORWARD, ("key",), (spec,), dict(Q=q, K=q, V=q), (("O", q), ("LSE", lse)), {}, ("O", "LSE"))
    assert launch_plans.remember(*args) is None  # first sighting: noted only
    with pytest.warns(RuntimeWarning, match=r"turned off: registering a plan failed \(TypeError: incompatible"):
        assert launch_plans.remember(*args) is None
    assert launch_plans._EXT is False and not launch_plans.enabled() and not launch_plans.FORWARD


def test_plans_off_by_environment(monkeypatch):
    """FA_CUDA_LAUNCH_PLANS=0 (launch_plans.ENABLED False): no key, no build."""
    monkeypatch.setattr(launch_plans, "ENABLED", False)
    monkeypatch.setattr(launch_plans, "_EXT", None)
    q = torch.randn(1, 1, 4, 16)
    assert launch_plans.public_forward_key(q, q, q, False, None, "auto", False, (-1, -1), 0.0, None) is None
    assert launch_plans.module() is False


# ------------------------------------------------------------------ GPU: plans give the Python path's bits
def _qkv(B, Hq, Hk, Nq, Nk, D, dtype, seed=0):
    x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, kind="torch", device="cuda", seed=seed)
    q, k, v, do = x["q"], x["k"], x["v"], x["do"]
    return q, k[:, :Hk].contiguous(), v[:, :Hk].contiguous(), do


def _no_python_launch(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("a launch took the Python path")

    monkeypatch.setattr(runtime, "launch", refuse)


CASES = [  # (Hq, Hk, Nq, Nk, D, dtype, keywords)
    (4, 4, 100, 130, 64, "float16", dict(causal=True)),
    (6, 2, 257, 190, 128, "bfloat16", dict(window_size=(40, 7))),
    (4, 1, 64, 300, 32, "float16", dict()),
]


@gpu
@pytest.mark.parametrize("kernel", ["mma", pytest.param("wgmma", marks=hopper), pytest.param("wgmma-ws", marks=hopper)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_repeated_forward_runs_its_plan(kernel, case, monkeypatch):
    """The first two calls run the Python path, and the second registers its plan (a key met once is not
    planned); the third, with new values in new tensors of the same shapes, runs the plan alone (no Python
    launch) and gives the bits the Python path gives."""
    Hq, Hk, Nq, Nk, D, dtype, kw = CASES[case]
    q, k, v, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
    flash_attn_cuda(q, k, v, kernel=kernel, **kw)
    assert not (launch_plans.PUBLIC or launch_plans.FORWARD), "a key met once is not planned"
    flash_attn_cuda(q, k, v, kernel=kernel, **kw)
    assert launch_plans.PUBLIC and launch_plans.FORWARD, "the second call registered no plan"
    q2, k2, v2, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype, seed=1)
    with monkeypatch.context() as m:
        _no_python_launch(m)
        o, lse = flash_attn_cuda(q2, k2, v2, kernel=kernel, return_lse=True, **kw)
    launch_plans.clear()
    o_py, lse_py = flash_attn_cuda(q2, k2, v2, kernel=kernel, return_lse=True, **kw)  # the Python path again
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)


@gpu
@pytest.mark.parametrize("kernel", ["mma", pytest.param("wgmma", marks=hopper), pytest.param("wgmma-ws", marks=hopper)])
def test_repeated_backward_runs_its_plan(kernel, monkeypatch):
    """Through autograd, four steps of one shape: the first two run the Python path (the eager autograd.Function)
    and the second registers the forward's and the backward's plans; from the third the call is the C++
    autograd function on the forward's plan, whose backward runs on the Python path once more (it finds the
    backward's plan and puts it in the call's slot); the fourth has no Python launch and no Python backward. The
    results are the Python path's: O, dK and dV bit for bit, dQ to float32 rounding where the backward sums it
    with atomic adds (wgmma-ws, 'auto' on a Hopper). loss = O.sum() (an expanded gradient) and lse's output work
    too."""
    from flash_attention_cuda import library_ops

    Hq, Hk, Nq, Nk, D, dtype, kw = CASES[1]
    q, k, v, do = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)

    def step(loss=lambda o: (o * do).sum()):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = flash_attn_cuda(*x, kernel=kernel, return_lse=True, **kw)
        loss(o).backward()
        return [o.detach(), lse] + [t.grad for t in x]

    step()
    step()
    assert launch_plans.FORWARD and launch_plans.BACKWARD, "the second step registered no plan"
    assert any(type(hit) is tuple for hit in launch_plans.PUBLIC.values())
    with monkeypatch.context() as m:
        _no_python_launch(m)
        step()
        m.setattr(library_ops, "_bwd", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("Python backward")))
        planned = step()
        summed = step(lambda o: o.float().sum())
    launch_plans.clear()
    again = step()
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), planned, again):
        if name == "dq":
            assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item() + 1e-3
        else:
            assert torch.equal(a, b), name
    assert all(torch.isfinite(g).all() for g in summed[2:])


@gpu
def test_planned_call_refuses_a_second_derivative():
    """create_graph=True through the C++ autograd function: the first derivative is the backward op's, whose own
    backward raises the same error as the eager path's."""
    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, "float16")
    for _ in range(3):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        o = flash_attn_cuda(*x, causal=True)
        grads = torch.autograd.grad(o.float().square().sum(), x, create_graph=True)
    assert any(type(hit) is tuple for hit in launch_plans.PUBLIC.values())
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        grads[0].float().sum().backward()


@gpu
@pytest.mark.parametrize("kernel", ["mma", pytest.param("wgmma-ws", marks=hopper)])
def test_inputs_that_do_not_fit_a_plan_fall_back(kernel):
    """A plan needs contiguous, 16-byte aligned inputs on the current device. A misaligned copy (2 bytes into
    its storage) and a strided view of the same shapes find the plan, are refused by it, and take the Python
    path, which copies them and gives the aligned contiguous input's bits; so does the backward (mma: no
    atomics) given a misaligned q or dO."""
    q, k, v, _ = _qkv(1, 2, 2, 77, 77, 64, "float16")
    o = flash_attn_cuda(q, k, v, kernel=kernel, causal=True)
    flash_attn_cuda(q, k, v, kernel=kernel, causal=True)
    assert launch_plans.PUBLIC
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)
    q_mis = flat[1:].view(q.shape)
    q_mis.copy_(q)
    assert q_mis.data_ptr() % 16 != 0 and q_mis.is_contiguous()
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) memory, (B, H, N, D) view
    for x in (q_mis, q_strided):  # the Python path copies both (the kernels load 16 bytes at a time): same bits
        assert torch.equal(flash_attn_cuda(x, k, v, kernel=kernel, causal=True), o)
    o, lse = flash_attn_cuda(q, k, v, kernel=kernel, causal=True, return_lse=True)
    do = torch.randn_like(q)
    grads = flash_attn_cuda_backward(q, k, v, o, lse, do, causal=True, kernel="mma")
    do_mis = torch.empty_like(flat)[1:].view(q.shape)  # a buffer of its own: q_mis stays as it is
    do_mis.copy_(do)
    for args in ((q_mis, k, v, o, lse, do), (q, k, v, o, lse, do_mis)):  # misaligned inputs of the backward
        again = flash_attn_cuda_backward(*args, causal=True, kernel="mma")
        assert all(torch.equal(a, b) for a, b in zip(again, grads))


@gpu
def test_bad_input_still_raises_after_a_plan():
    """A plan never answers a call the checks would refuse: its key holds every argument's type and value."""
    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, "float16")
    for _ in range(2):
        flash_attn_cuda(q, k, v, causal=True)
    assert launch_plans.PUBLIC
    with pytest.raises(TypeError, match="causal"):
        flash_attn_cuda(q, k, v, causal=1)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_cuda(q, k, v, causal=True, window_size=(-2, 0))
    with pytest.raises(ValueError, match="unknown kernel"):
        flash_attn_cuda(q, k, v, causal=True, kernel="wmma")


@gpu
def test_plan_runs_inside_a_cuda_graph():
    """A planned call captured in a CUDA graph: its allocation comes from the graph's pool and its launch is
    recorded on the capture stream; a replay after new values are copied into the inputs gives the eager
    answer for them."""
    q, k, v, _ = _qkv(1, 2, 2, 128, 128, 64, "float16")
    for _ in range(2):
        flash_attn_cuda(q, k, v, causal=True)
    assert launch_plans.PUBLIC
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_cuda(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = flash_attn_cuda(q, k, v, causal=True)
    q2, k2, v2, _ = _qkv(1, 2, 2, 128, 128, 64, "float16", seed=5)
    for dst, src in ((q, q2), (k, k2), (v, v2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, flash_attn_cuda(q2, k2, v2, causal=True))
