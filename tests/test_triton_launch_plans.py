"""flash_attn_triton's C++ launch plans (flash_attention_triton/launch_plans.py, on flash_attention_cuda's extension).

* CPU: the PTX entry parser; the description of a compiled kernel's launch (each pointer from the right buffer,
  each scalar in its C type, the compiler's trailing scratch pointers null) against the PTX entry of the forward,
  dQ and dK/dV kernels compiled for sm_90 without a GPU; the launches a plan refuses (scratch memory, a cluster,
  a parameter list that does not match the entry, a kernel not loaded); public keys of flash_attn_triton and
  flash_attn_cuda never meet; under the interpreter no plan is made.
* GPU: a repeated call runs its plan (no Python launch) with the call plan's bits, forward and backward through
  autograd (from the fourth step no Python launch and no Python backward); inputs that do not fit fall back;
  a launch hook (a profiler) sends every call through Triton's launcher; a second derivative still raises.
  Without a GPU these skip with the reason.
"""
import json
import os
import struct
import subprocess
import sys
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from flash_attention_py import make_inputs

from flash_attention_cuda import launch_plans as cpp
from flash_attention_triton.capabilities import unavailable_reason

pytest.importorskip("triton")
from flash_attention_triton import launch, launch_plans  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASON = unavailable_reason("cuda")


@pytest.fixture
def plans_on(monkeypatch):
    """The plans under test, whatever FA_CUDA_LAUNCH_PLANS says (=0 turns them off for a whole run)."""
    monkeypatch.setattr(cpp, "ENABLED", True)


def gpu(test):
    """A GPU test of the plans: skipped with the reason where there is no GPU; run with the plans on."""
    return pytest.mark.skipif(REASON is not None, reason=str(REASON))(pytest.mark.usefixtures("plans_on")(test))


# ------------------------------------------------------------------ CPU: PTX entries and launch descriptions
PTX = """
.visible .entry other_kernel(.param .u32 other_kernel_param_0)
.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u32 k_param_1,
	.param .f32 k_param_2,
	.param .align 8 .b8 k_param_3[16],
	.param .u64 k_param_4
)
"""


def test_ptx_param_sizes():
    assert launch_plans.ptx_param_sizes(PTX, "k") == [8, 4, 4, 16, 8]
    assert launch_plans.ptx_param_sizes(PTX, "other_kernel") == [4]
    assert launch_plans.ptx_param_sizes(PTX, "missing") == []


def _fake_compiled(signature: dict, ptx_sizes, **metadata):
    """A compiled kernel as describe_launch reads it: metadata, src.signature, asm['ptx'], a loaded function."""
    fields = dict(name="k", num_warps=4, shared=1024, num_ctas=1, global_scratch_size=0, profile_scratch_size=0,
                  launch_cooperative_grid=False, launch_pdl=False)
    fields.update(metadata)
    md = namedtuple("Metadata", sorted(fields))(**fields)
    kinds = {1: ".u8", 4: ".u32", 8: ".u64"}
    ptx = ".entry k(" + ",".join(f".param {kinds[s]} k_param_{i}" for i, s in enumerate(ptx_sizes)) + ")"
    return SimpleNamespace(metadata=md, src=SimpleNamespace(signature=signature), asm={"ptx": ptx}, function=77)


SIG = {"Q": "*fp16", "O": "*fp16", "stride": "i32", "unit": "constexpr", "scale": "fp32", "seed": "u64",
       "BLOCK": "constexpr"}


def test_describe_launch_packs_the_launchers_parameters():
    compiled = _fake_compiled(SIG, [8, 8, 4, 4, 8, 8, 8])
    desc = launch_plans.describe_launch((compiled, (64,)), (3, 2, 1), (0, 4), (96, 1, 0.125, 2**63 + 5))
    function, dims, smem, maps, pointers, scalars = desc
    assert (function, dims, smem, maps) == (77, [3, 2, 1, 128, 1, 1], 1024, [])
    assert pointers == [(0, 0), (4, 0)]  # Q from buffer 0, O from buffer 4
    assert scalars == [struct.pack("<i", 96), struct.pack("<f", 0.125), struct.pack("<Q", 2**63 + 5),
                       bytes(8), bytes(8)]  # the unit stride is a constexpr; global and profile scratch null


@pytest.mark.parametrize("change", ["scratch", "profile", "cluster", "pdl", "cooperative", "unloaded", "entry",
                                    "count", "empty grid", "type"])
def test_describe_launch_refuses(change):
    """Each of these leaves the call on launch.py's call plan: scratch memory, a cluster, PDL or a cooperative
    launch (launch attributes the plan does not set), a kernel not loaded, a PTX entry whose parameters are not
    the list built (other sizes, a third trailing pointer), an empty grid, a scalar type the plan does not know."""
    sig, sizes, md, grid = dict(SIG), [8, 8, 4, 4, 8, 8, 8], {}, (3, 2, 1)
    if change in ("scratch", "profile"):
        md[f"{'global' if change == 'scratch' else 'profile'}_scratch_size"] = 128
    elif change == "cluster":
        md["num_ctas"] = 2
    elif change == "pdl":
        md["launch_pdl"] = True
    elif change == "cooperative":
        md["launch_cooperative_grid"] = True
    elif change == "entry":
        sizes[2] = 8
    elif change == "count":
        sizes.append(8)
    elif change == "empty grid":
        grid = (0, 2, 1)
    elif change == "type":
        sig["stride"] = "i16"
    compiled = _fake_compiled(sig, sizes, **md)
    if change == "unloaded":
        compiled.function = None
    assert launch_plans.describe_launch((compiled, (64,)), grid, (0, 4), (96, 1, 0.125, 5)) is None


def test_a_refused_launch_is_not_described_again(monkeypatch):
    """A call plan whose launch describe_launch refuses is noted (REFUSED), so its later calls do not read the
    kernel's PTX again: they keep the Python call plan at its own cost."""
    described = []
    monkeypatch.setattr(launch_plans, "_fit", lambda *xs: True)
    monkeypatch.setattr(launch_plans, "describe_launch", lambda *a: described.append(1))
    monkeypatch.setattr(launch_plans, "REFUSED", set())
    x = torch.empty(1)
    for _ in range(3):
        assert launch_plans.remember_forward(("triton-fwd", "k", 0.1), (None, (1, 1, 1), ()), x, x, x, x, x, ()) is None
    assert len(described) == 1 and ("triton-fwd", "k", 0.1) in launch_plans.REFUSED


AOT = r"""
import json, struct, sys, types
sys.path.insert(0, sys.argv[1])
import triton_aot as A
from flash_attention_triton import launch_plans as LP
from flash_attention_triton.configs import small_config
out = {}
for name, tensors in (("fwd", 5), ("dq", 8), ("dkdv", 8)):
    c = A.compile_kernel(name, "float16", 64, True, small_config(name, 64, 2), 90)
    names = c.src.fn.arg_names
    first_const = names.index("HEAD_DIM")
    values = []
    for arg in names[tensors:first_const]:
        ty = c.src.signature[arg]
        values.append(1 if ty == "constexpr" else 0.18 if ty == "fp32" else 1000 + len(values))
    consts = tuple(c.src.constants[(i,)] for i in range(first_const, len(names)))
    loaded = types.SimpleNamespace(metadata=c.metadata, src=c.src, asm=c.asm, function=1234)
    desc = LP.describe_launch((loaded, consts), (2, 3, 1), tuple(range(tensors)), tuple(values))
    out[name] = dict(desc=None if desc is None else [desc[0], desc[1], desc[2], desc[4], [s.hex() for s in desc[5]]],
                     ptx=LP.ptx_param_sizes(c.asm["ptx"], c.metadata.name), warps=c.metadata.num_warps,
                     shared=c.metadata.shared, values=values,
                     types=[c.src.signature[n] for n in names[tensors:first_const]])
print("RESULT " + json.dumps(out))
"""


def test_description_matches_the_compiled_ptx_entry():
    """The forward, dQ and dK/dV kernels compiled for sm_90 (no GPU needed): the description has one pointer per
    tensor argument, from its buffer, then each run-time int and float in its signature's C type (the unit strides
    and group = 1 are constexprs and absent), then the compiler's trailing pointers as null; their sizes are the
    PTX entry's, parameter for parameter; block = 32 * num_warps; shared memory the kernel's."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", AOT, os.path.join(ROOT, "tools")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    for name, tensors in (("fwd", 5), ("dq", 8), ("dkdv", 8)):
        r = out[name]
        assert r["desc"] is not None, name
        function, dims, smem, pointers, scalars = r["desc"]
        assert function == 1234 and dims == [2, 3, 1, 32 * r["warps"], 1, 1] and smem == r["shared"]
        assert pointers == [[i, 0] for i in range(tensors)]
        sizes = [8] * tensors + [len(bytes.fromhex(s)) for s in scalars]
        assert sizes == r["ptx"], (name, sizes, r["ptx"])
        run_time = [(ty, v) for ty, v in zip(r["types"], r["values"]) if ty != "constexpr"]
        assert [ty for ty, _ in run_time].count("fp32") == 2 and len(run_time) < len(r["types"])  # specialised
        fmt = {"i32": "<i", "fp32": "<f"}
        assert [bytes.fromhex(s) for s in scalars[:len(run_time)]] == [struct.pack(fmt[ty], v) for ty, v in run_time]
        assert all(bytes.fromhex(s) == bytes(8) for s in scalars[len(run_time):])


def test_public_keys_of_the_two_functions_never_meet(monkeypatch):
    """flash_attn_triton's public key names the function: a flash_attn_cuda call with the same tensors and
    arguments (kernel None, which its checks refuse) can never find a Triton plan."""
    monkeypatch.setattr(cpp, "ENABLED", True)
    monkeypatch.setattr(cpp, "_EXT", None)
    q = torch.randn(1, 2, 8, 64)
    args = (True, None, False, (-1, -1), 0.0, None)
    triton_key = launch_plans.public_key(q, q, q, *args)
    cuda_key = cpp.public_forward_key(q, q, q, True, None, None, False, (-1, -1), 0.0, None)
    assert triton_key is not None and cuda_key is not None and triton_key != cuda_key
    assert launch_plans.public_key(q, q, q, True, None, False, (-1, -1), 0.1, 3) is None  # dropout: never planned


def test_planned_key_refuses_dropout_and_no_call_key(monkeypatch):
    monkeypatch.setattr(cpp, "ENABLED", True)
    monkeypatch.setattr(cpp, "_EXT", None)
    assert launch_plans.planned_key("triton-fwd", ("k",), 0.125, (0.0, 0)) == ("triton-fwd", ("k",), 0.125)
    assert launch_plans.planned_key("triton-fwd", ("k",), 0.125, (0.1, 7)) is None
    assert launch_plans.planned_key("triton-fwd", None, 0.125, (0.0, 0)) is None
    monkeypatch.setattr(cpp, "ENABLED", False)
    assert launch_plans.planned_key("triton-fwd", ("k",), 0.125, (0.0, 0)) is None


@pytest.mark.skipif(not launch.INTERPRETED, reason="the interpreter is off (a GPU is present)")
def test_no_plan_under_the_interpreter():
    """Under TRITON_INTERPRET=1 calls take the interpreter's path: no key, no plan, no build."""
    from flash_attention_triton import flash_attn_triton

    x = make_inputs(1, 2, 17, 17, 16, dtype="float32", kind="torch", seed=0)
    for _ in range(3):
        flash_attn_triton(x["q"], x["k"], x["v"], causal=True)
    assert not (cpp.PUBLIC or cpp.FORWARD or cpp.BACKWARD)


# ------------------------------------------------------------------ GPU: plans run, and give the call plan's bits
@pytest.fixture
def fresh_calls(monkeypatch):
    """No call plan of an earlier test: a key's first call here runs the full path. The forward is
    forward_kernel.py's on a Hopper too (hopper_forward.py launches from Python and leaves no plan)."""
    monkeypatch.setattr(launch, "_CALLS", {})
    monkeypatch.setattr(launch, "HOPPER_FORWARD", False)


def _qkv(B, Hq, Hk, Nq, Nk, D, dtype, seed=0):
    x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, kind="torch", device="cuda", seed=seed)
    return x["q"], x["k"][:, :Hk].contiguous(), x["v"][:, :Hk].contiguous(), x["do"]


def _no_python_launch(m):
    def refuse(*a, **kw):
        raise AssertionError("a launch took the Python path")

    m.setattr(launch, "_go", refuse)
    m.setattr(launch, "_run", refuse)


CASES = [  # (Hq, Hk, Nq, Nk, D, dtype, keywords)
    (4, 4, 100, 130, 64, "float16", dict(causal=True)),
    (6, 2, 257, 190, 128, "bfloat16", dict(window_size=(40, 7))),
    (4, 1, 64, 300, 32, "float16", dict()),
]


@gpu
@pytest.mark.parametrize("case", range(len(CASES)))
def test_repeated_forward_runs_its_plan(case, fresh_calls, monkeypatch):
    """The first call runs the full path and leaves a call plan; the second runs the call plan and registers the
    C++ plan; the third, with new values in new tensors of the same shapes, runs the C++ plan alone (no Python
    launch) and gives the bits of the Python path."""
    from flash_attention_triton import flash_attn_triton

    Hq, Hk, Nq, Nk, D, dtype, kw = CASES[case]
    q, k, v, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
    flash_attn_triton(q, k, v, **kw)
    assert not cpp.PUBLIC
    flash_attn_triton(q, k, v, **kw)
    assert cpp.PUBLIC and cpp.FORWARD, "the second call registered no plan"
    q2, k2, v2, _ = _qkv(2, Hq, Hk, Nq, Nk, D, dtype, seed=1)
    with monkeypatch.context() as m:
        _no_python_launch(m)
        o, lse = flash_attn_triton(q2, k2, v2, return_lse=True, **kw)
    cpp.clear()
    o_py, lse_py = flash_attn_triton(q2, k2, v2, return_lse=True, **kw)  # the call plan again
    assert torch.equal(o, o_py) and torch.equal(lse, lse_py)


@gpu
@pytest.mark.parametrize("case", [0, 1])
def test_repeated_backward_runs_its_plan(case, fresh_calls, monkeypatch):
    """Through autograd, five steps of one shape: from the third the call is the C++ autograd function, whose
    backward runs the Python path once more and puts the backward's plan in its slot; the fourth has no Python
    launch and no Python backward (with grouped-query heads whose dK/dV sum over splits, the backward keeps
    its call plan). O, lse, dQ, dK and dV are the Python path's, bit for bit; loss = O.sum() works too."""
    Hq, Hk, Nq, Nk, D, dtype, kw = CASES[case]
    q, k, v, do = _qkv(2, Hq, Hk, Nq, Nk, D, dtype)
    from flash_attention_triton import flash_attn_triton

    def step(loss=lambda o: (o * do).sum()):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = flash_attn_triton(*x, return_lse=True, **kw)
        loss(o).backward()
        return [o.detach(), lse] + [t.grad for t in x]

    step()
    step()
    assert any(type(hit) is tuple for hit in cpp.PUBLIC.values())
    step()
    with monkeypatch.context() as m:
        if cpp.BACKWARD:
            _no_python_launch(m)
            m.setattr(launch, "_backward", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("Python backward")))
        else:  # split dK/dV sums: only the forward is planned
            assert launch.dkdv_splits(2, Hk, Hq // Hk, Nk, q.device) > 1
        planned = step()
        summed = step(lambda o: o.float().sum())
    cpp.clear()
    monkeypatch.setattr(launch, "_CALLS", {})
    again = step()
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), planned, again):
        assert torch.equal(a, b), name
    assert all(torch.isfinite(g).all() for g in summed[2:])


@gpu
def test_planned_call_refuses_a_second_derivative(fresh_calls):
    from flash_attention_triton import flash_attn_triton

    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, "float16")
    for _ in range(3):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        o = flash_attn_triton(*x, causal=True)
        grads = torch.autograd.grad(o.float().square().sum(), x, create_graph=True)
    assert any(type(hit) is tuple for hit in cpp.PUBLIC.values())
    with pytest.raises(RuntimeError, match="double backward"):
        grads[0].float().sum().backward()


@gpu
def test_inputs_that_do_not_fit_fall_back(fresh_calls):
    """A misaligned copy and a strided view of planned shapes take the Python path and give the same bits."""
    from flash_attention_triton import flash_attn_triton

    q, k, v, _ = _qkv(1, 2, 2, 77, 77, 64, "float16")
    for _ in range(3):
        o = flash_attn_triton(q, k, v, causal=True)
    assert cpp.PUBLIC
    flat = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)
    q_mis = flat[1:].view(q.shape)
    q_mis.copy_(q)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    for x in (q_mis, q_strided):
        assert torch.equal(flash_attn_triton(x, k, v, causal=True), o)


@gpu
def test_a_launch_hook_sees_every_launch(fresh_calls):
    """With a launch hook set (a profiler such as proton), planned calls go through Triton's launcher again."""
    import triton
    from flash_attention_triton import flash_attn_triton

    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, "float16")
    for _ in range(3):
        flash_attn_triton(q, k, v, causal=True)
    assert cpp.PUBLIC
    seen = []
    knobs = triton.knobs.runtime
    old = knobs.launch_enter_hook
    try:
        knobs.launch_enter_hook = lambda *a: seen.append(1)
        flash_attn_triton(q, k, v, causal=True)
    finally:
        knobs.launch_enter_hook = old
    assert seen, "the hook saw no launch"


@gpu
def test_bad_input_still_raises_after_a_plan(fresh_calls):
    from flash_attention_triton import flash_attn_triton

    q, k, v, _ = _qkv(1, 2, 2, 64, 64, 64, "float16")
    for _ in range(3):
        flash_attn_triton(q, k, v, causal=True)
    assert cpp.PUBLIC
    with pytest.raises(TypeError, match="causal"):
        flash_attn_triton(q, k, v, causal=1)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_triton(q, k, v, causal=True, window_size=(-2, 0))
