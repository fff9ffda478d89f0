"""torch.compile through the backends: the split PyTorch loop as it is, Triton and CUDA as torch.library ops.

* CPU (here): the Triton ops under the interpreter at tiny sizes: ``torch.library.opcheck``, and
  ``torch.compile(fullgraph=True)`` of a small module with backend "eager" and "aot_eager" (and "inductor",
  marked slow: it compiles C++ around the op), each with no graph break and the same output and gradients
  as the eager module. The fake (meta) implementations of the Triton and CUDA ops give the right shapes,
  dtypes and strides on fake CPU and fake CUDA tensors (no GPU needed). A second backward raises.
* GPU: the same module compiled with inductor, fullgraph, no graph break, for Triton and the CUDA rungs,
  and opcheck on CUDA tensors; skipped with the reason where there is no GPU.
"""
import math

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attention_py.testing as harness
from flash_attention_py import attention_reference, make_inputs
from flash_attention_py.torch_split import flash_attn_torch
from flash_attention_cuda.capabilities import cuda_unavailable_reason

try:  # the CUDA ops' fake tests need neither triton nor a GPU
    from flash_attention_triton import attention as TA
    from flash_attention_triton import flash_attn_triton
    TRITON_REASON = None
except ImportError as exc:
    TA = flash_attn_triton = None
    TRITON_REASON = f"flash_attention_triton does not import: {exc}"

try:  # imports without CuPy and without a GPU (it launches only with both)
    from flash_attention_cuda import flash_attn_cuda
except ImportError:
    flash_attn_cuda = None

HAS_CUDA = torch.cuda.is_available()
NO_GPU = "no CUDA GPU (torch.cuda.is_available() is False)"
needs_triton = pytest.mark.skipif(TRITON_REASON is not None, reason=str(TRITON_REASON))


def _cuda_ops():
    """flash_attention_cuda.library_ops (imports without CuPy and without a GPU), or skip with the reason."""
    try:
        from flash_attention_cuda import library_ops
    except ImportError as exc:
        pytest.skip(f"flash_attention_cuda does not import: {exc}")
    return library_ops


class TinyAttention(torch.nn.Module):
    """x (B, N, E) -> QKV projection -> attention (B, H, N, D) -> output projection (B, N, E)."""

    def __init__(self, attn, E=32, H=2, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.attn, self.H, self.D = attn, H, E // H
        self.qkv = torch.nn.Linear(E, 3 * E, dtype=dtype, device=device)
        self.out = torch.nn.Linear(E, E, dtype=dtype, device=device)

    def forward(self, x):
        B, N, E = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.H, self.D).permute(2, 0, 3, 1, 4)  # non-contiguous views
        o = self.attn(q, k, v)
        return self.out(o.transpose(1, 2).reshape(B, N, E))


def _graph_breaks(fn, *args) -> list:
    """The reasons Dynamo breaks the graph of fn(*args) (empty: one graph)."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return [str(r.reason).splitlines()[0] for r in explained.break_reasons]


def _compiled_matches_eager(attn, backend, *, device="cpu", dtype=torch.float32, N=24, tol=1e-5):
    """Compile TinyAttention(attn) with fullgraph=True: no graph break, same output and gradients as eager."""
    model = TinyAttention(attn, dtype=dtype, device=device)
    x = torch.randn(2, N, 32, dtype=dtype, device=device)
    assert _graph_breaks(model, x) == []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    outs = []
    for m in (model, compiled):
        m.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.square().sum().backward()
        outs.append((y.detach(), xi.grad, model.qkv.weight.grad.clone()))
    for name, a, b in zip(("out", "dx", "dW_qkv"), outs[0], outs[1]):
        err = (a.double() - b.double()).abs().max().item()
        assert err <= tol * max(1.0, a.double().abs().max().item()), f"{backend} {name}: compiled vs eager {err:.2e}"


# ------------------------------------------------------------------ the split PyTorch loop


@pytest.mark.slow
def test_torch_split_compiles_fullgraph():
    """flash_attn_torch (an autograd.Function around a Python loop) compiles with fullgraph=True."""
    attn = lambda q, k, v: flash_attn_torch(q, k, v, causal=True, softmax_scale=0.3, block_size=16)  # noqa: E731
    _compiled_matches_eager(attn, "aot_eager")


# ------------------------------------------------------------------ Triton, on the CPU
@needs_triton
def test_triton_ops_registered():
    assert hasattr(torch.ops.fa_ladder, "triton_fwd") and hasattr(torch.ops.fa_ladder, "triton_bwd")


def test_cuda_ops_registered():
    _cuda_ops()
    assert hasattr(torch.ops.fa_ladder, "cuda_fwd") and hasattr(torch.ops.fa_ladder, "cuda_bwd")


needs_interpreter = pytest.mark.skipif(
    TRITON_REASON is not None or (not HAS_CUDA and not TA.INTERPRETED),
    reason=str(TRITON_REASON or "no GPU and Triton imported without TRITON_INTERPRET=1"))


@needs_interpreter
@pytest.mark.parametrize("backend", [pytest.param("eager", marks=pytest.mark.slow), "aot_eager"])
def test_triton_compiles_fullgraph_cpu(backend):
    if HAS_CUDA:
        pytest.skip("CPU interpreter case; the GPU case is test_gpu_inductor_fullgraph")
    _compiled_matches_eager(lambda q, k, v: flash_attn_triton(q, k, v, causal=True, softmax_scale=0.3), backend)


@needs_interpreter
@pytest.mark.slow
def test_triton_compiles_inductor_cpu():
    """Inductor around the opaque op on the CPU (~1 min here: it builds C++ for the projections)."""
    if HAS_CUDA:
        pytest.skip("CPU interpreter case; the GPU case is test_gpu_inductor_fullgraph")
    _compiled_matches_eager(lambda q, k, v: flash_attn_triton(q, k, v, causal=True), "inductor", tol=1e-4)


@needs_interpreter
@pytest.mark.slow
def test_triton_opcheck_cpu():
    """opcheck: schema, fake tensors, autograd registration, AOT dispatch, on interpreter-sized inputs."""
    if HAS_CUDA:
        pytest.skip("CPU interpreter case; the GPU case is test_gpu_opcheck")
    x = make_inputs(1, 2, 9, 13, 16, layout="bnhd")  # Nq != Nk, non-contiguous
    q, k, v = (x[n].requires_grad_(True) for n in ("q", "k", "v"))
    torch.library.opcheck(torch.ops.fa_ladder.triton_fwd.default, (q, k, v, True, 0.3))
    o, lse = torch.ops.fa_ladder.triton_fwd(q.detach(), k.detach(), v.detach(), True, 0.3)
    torch.library.opcheck(torch.ops.fa_ladder.triton_bwd.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, x["do"], True, 0.3))


@needs_interpreter
def test_triton_op_matches_reference_and_lse_is_not_differentiable():
    x = make_inputs(1, 2, 11, 7, 16, device="cuda" if HAS_CUDA else "cpu", with_grad=True)
    o, lse = flash_attn_triton(x["q"], x["k"], x["v"], causal=True, return_lse=True)
    assert o.requires_grad and not lse.requires_grad
    ref, ref_lse = attention_reference(x["q"].detach(), x["k"].detach(), x["v"].detach(), causal=True,
                                       return_lse=True)
    assert (o.detach().double().cpu() - ref.cpu()).abs().max().item() < 1e-5
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), fin.cpu())


@needs_interpreter
def test_triton_double_backward_raises():
    x = make_inputs(1, 1, 5, 5, 16, device="cuda" if HAS_CUDA else "cpu", with_grad=True)
    o = flash_attn_triton(x["q"], x["k"], x["v"])
    (dq,) = torch.autograd.grad(o.square().sum(), x["q"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        dq.sum().backward()


# ------------------------------------------------------------------ fake implementations (no GPU needed)
FAKE_CASES = [  # (dtype, Nq, Nk, D)
    (torch.float16, 5, 7, 64),
    (torch.bfloat16, 3, 1, 128),
    (torch.float32, 9, 4, 40),
]


def _fake_qkv(mode, device, dtype, Nq, Nk, D, B=2, H=3):
    with mode:
        q = torch.empty_strided((B, H, Nq, D), (Nq * H * D, D, H * D, 1), dtype=dtype, device=device)  # (B, N, H, D)
        k = torch.empty((B, H, Nk, D), dtype=dtype, device=device)
        v = torch.empty((B, H, Nk, D), dtype=dtype, device=device)
    return q, k, v


def _check_fake(fwd, bwd, extra, device, dtype, Nq, Nk, D):
    mode = FakeTensorMode()
    q, k, v = _fake_qkv(mode, device, dtype, Nq, Nk, D)
    with mode:
        o, lse = fwd(q, k, v, True, 1 / math.sqrt(D), *extra)
        dq, dk, dv = bwd(q, k, v, o, lse, torch.empty_like(o), True, 1 / math.sqrt(D))
    B, H = q.shape[:2]
    assert (o.shape, o.dtype, o.device.type, o.is_contiguous()) == ((B, H, Nq, D), dtype, device, True)
    assert (lse.shape, lse.dtype, lse.device.type) == ((B, H, Nq), torch.float32, device)
    for g, x in ((dq, q), (dk, k), (dv, v)):
        assert (g.shape, g.dtype, g.device.type, g.is_contiguous()) == (x.shape, dtype, device, True)


@needs_triton
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype,Nq,Nk,D", FAKE_CASES)
def test_triton_fake_shapes(device, dtype, Nq, Nk, D):
    _check_fake(torch.ops.fa_ladder.triton_fwd, torch.ops.fa_ladder.triton_bwd, (), device, dtype, Nq, Nk, D)


@pytest.mark.parametrize("dtype,Nq,Nk,D", FAKE_CASES)
def test_cuda_fake_shapes(dtype, Nq, Nk, D):
    _cuda_ops()
    kernel = "tiled" if dtype == torch.float32 else "mma"
    _check_fake(torch.ops.fa_ladder.cuda_fwd, torch.ops.fa_ladder.cuda_bwd, (kernel,), "cuda", dtype, Nq, Nk, D)


def test_cuda_ops_run_and_differentiate_without_a_gpu(recorded_launches):
    """cuda_fwd runs the forward launch and its autograd runs cuda_bwd's three launches (a recording runtime
    stands in for the GPU: kernels are recorded, not run; the mma rung's backward at D = 64 on its Hopper is the one
    kernel, capabilities.mma_auto_backward); lse is not differentiable."""
    _cuda_ops()
    x = make_inputs(1, 2, 33, 70, 64, dtype="float16", kind="torch", with_grad=True)
    o, lse = torch.ops.fa_ladder.cuda_fwd(x["q"], x["k"], x["v"], True, 0.3, "mma")
    o.backward(x["do"])
    assert [c[0].name.split("<")[0] for c in recorded_launches] == ["mma_fwd", "mma_bwd_fused_preprocess",
                                                                    "mma_bwd_fused", "mma_bwd_dq_store"]
    assert all(x[n].grad.shape == x[n].shape and x[n].grad.dtype == torch.float16 for n in ("q", "k", "v"))
    assert o.requires_grad and not lse.requires_grad



def test_eager_twin_backward_fills_no_zero_gradient_for_lse(recorded_launches):
    """The eager twin of the forward op (what a call outside torch.compile runs) does not materialise lse's
    gradient: no zero tensor is filled on each backward for an output that is not differentiable."""
    from flash_attention_cuda import library_ops

    _cuda_ops()
    x = make_inputs(1, 2, 33, 70, 64, dtype="float16", kind="torch", with_grad=True)
    o, lse = library_ops.cuda_fwd.eager(x["q"], x["k"], x["v"], True, 0.3, "mma", -1, 0, 0.0, 0, 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o.backward(x["do"])
    ops = {e.name for e in prof.events()}
    assert not ops & {"aten::zeros", "aten::zeros_like", "aten::fill_", "aten::zero_"}, sorted(ops)
    assert all(x[n].grad is not None for n in ("q", "k", "v"))

# ------------------------------------------------------------------ GPU: inductor, fullgraph, opcheck
GPU_BACKENDS = [  # (name, attention callable, dtype)
    ("triton-fp16", lambda q, k, v: flash_attn_triton(q, k, v, causal=True), torch.float16),
    ("triton-fp32", lambda q, k, v: flash_attn_triton(q, k, v, causal=True, softmax_scale=0.2), torch.float32),
    ("cuda-mma", lambda q, k, v: flash_attn_cuda(q, k, v, causal=True, softmax_scale=0.1, kernel="mma"),
     torch.float16),
    ("cuda-auto", lambda q, k, v: flash_attn_cuda(q, k, v, causal=True), torch.bfloat16),  # wgmma on Hopper
    ("cuda-tiled", lambda q, k, v: flash_attn_cuda(q, k, v, causal=True, kernel="tiled"), torch.float32),
]


def _skip_unless_gpu(name):
    if not HAS_CUDA:
        pytest.skip(NO_GPU)
    if name.startswith("triton") and TRITON_REASON:
        pytest.skip(TRITON_REASON)
    if name.startswith("cuda"):
        reason = cuda_unavailable_reason()
        if reason:
            pytest.skip(reason)


@pytest.mark.gpu
@pytest.mark.parametrize("name,attn,dtype", GPU_BACKENDS, ids=[b[0] for b in GPU_BACKENDS])
def test_gpu_inductor_fullgraph(name, attn, dtype):
    """A module with the backend inside compiles with inductor, fullgraph=True, no graph break."""
    _skip_unless_gpu(name)
    E = 128 if "mma" in name or "auto" in name else 64  # H = 2 heads: D = 64 (mma/wgmma take D 64/128)
    model = TinyAttention(attn, E=E, H=2, dtype=dtype, device="cuda")
    x = torch.randn(2, 256, E, dtype=dtype, device="cuda")
    if name.startswith("cuda"):  # compile before any eager call has cached the device's compute capability
        from flash_attention_cuda import runtime

        runtime._CC.clear()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    outs = []
    for m in (compiled, model):
        model.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.float().square().mean().backward()
        outs.append((y.detach().float(), xi.grad.float(), model.qkv.weight.grad.float().clone()))
    for what, a, b in zip(("out", "dx", "dW_qkv"), outs[1], outs[0]):
        err = (a - b).abs().max().item()
        assert err <= tol * max(1.0, a.abs().max().item()), f"{name} {what}: compiled vs eager {err:.2e}"
    assert _graph_breaks(model, x) == []


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda-mma", "cuda-tiled"])
def test_gpu_opcheck(name):
    _skip_unless_gpu(name)
    dtype = "float32" if name in ("triton", "cuda-tiled") else "float16"
    x = make_inputs(2, 2, 100, 77, 64, dtype=dtype, device="cuda", layout="bnhd")
    q, k, v = (x[n].requires_grad_(True) for n in ("q", "k", "v"))
    if name == "triton":
        fwd, bwd, extra = torch.ops.fa_ladder.triton_fwd, torch.ops.fa_ladder.triton_bwd, ()
    else:
        _cuda_ops()
        fwd, bwd, extra = torch.ops.fa_ladder.cuda_fwd, torch.ops.fa_ladder.cuda_bwd, (name.split("-")[1],)
    torch.library.opcheck(fwd.default, (q, k, v, True, 0.125, *extra))
    o, lse = fwd(q.detach(), k.detach(), v.detach(), True, 0.125, *extra)
    torch.library.opcheck(bwd.default, (q.detach(), k.detach(), v.detach(), o, lse, x["do"], True, 0.125))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cuda-mma", "cuda-tiled"])
def test_gpu_cuda_double_backward_raises(name):
    _skip_unless_gpu(name)
    dtype = "float32" if name == "cuda-tiled" else "float16"
    x = make_inputs(1, 2, 64, 64, 64, dtype=dtype, device="cuda", with_grad=True)
    o = flash_attn_cuda(x["q"], x["k"], x["v"], kernel=name.split("-")[1])
    (dq,) = torch.autograd.grad(o.float().square().sum(), x["q"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        dq.float().sum().backward()


@pytest.mark.gpu
def test_gpu_cuda_op_gradients_match_reference():
    """Through the op, cuda-mma's gradients meet the harness's tolerance policy (2x naive fp16 + floor)."""
    _skip_unless_gpu("cuda-mma")
    x = make_inputs(2, 2, 130, 130, 64, dtype="float16", device="cuda", with_grad=True)
    o = flash_attn_cuda(x["q"], x["k"], x["v"], causal=True, kernel="mma")
    o.backward(x["do"])
    qd, kd, vd = (x[n].detach() for n in ("q", "k", "v"))
    ref = harness.attention_reference_grads(qd, kd, vd, x["do"], causal=True)
    b = type("B", (), {"tf32_on": ()})()
    naive = harness.naive_same_precision(b, "cuda", qd, kd, vd, causal=True, do=x["do"])
    for name, got, r, n in zip(("dq", "dk", "dv"), (x["q"].grad, x["k"].grad, x["v"].grad), ref[-3:], naive):
        harness.check_close(name, got, r, n, backend="cuda-mma-op", device="cuda", dtype="float16",
                            floor=harness.FLOOR["float16"])
