"""Bad input to the Triton backend: clear ValueError/TypeError naming the argument, never a kernel crash."""
import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")

from flash_attention_triton import attention as A  # noqa: E402
from flash_attention_triton import flash_attn_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def qkv(B=1, H=1, Nq=8, Nk=8, D=16, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn((B, H, N, D), generator=g).to(device=device, dtype=dtype) for N in (Nq, Nk, Nk))


@pytest.mark.parametrize("bad,exc,match", [
    (lambda q, k, v: (q.cpu().numpy(), k, v), TypeError, "q must be a torch.Tensor"),
    (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dimensions"),
    (lambda q, k, v: (q, k, v[..., :8]), ValueError, "v must have the shape of k"),
    (lambda q, k, v: (q, k[..., :8], v[..., :8]), ValueError, "D \\(head dim\\)"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "Nq = 0"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "dtype float64 is not supported"),
    (lambda q, k, v: (q.half(), k, v), TypeError, "share one dtype"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "floating point"),
])
def test_bad_tensors(bad, exc, match):
    with pytest.raises(exc, match=match):
        flash_attn_triton(*bad(*qkv()))


def test_head_dim_over_256():
    with pytest.raises(ValueError, match="D = 288.*D <= 256"):
        flash_attn_triton(*qkv(D=288))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(causal="yes"), TypeError, "causal must be True or False"),
    (dict(causal=1), TypeError, "causal must be True or False"),
    (dict(return_lse=None), TypeError, "return_lse must be True or False"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be finite"),
    (dict(softmax_scale="0.1"), TypeError, "softmax_scale must be a real number"),
])
def test_bad_flags(kw, exc, match):
    with pytest.raises(exc, match=match):
        flash_attn_triton(*qkv(), **kw)


def test_cpu_tensors_without_interpreter(monkeypatch):
    """CPU tensors when Triton was imported without TRITON_INTERPRET=1: say what to do."""
    monkeypatch.setattr(A, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_attn_triton(*qkv(device="cpu"))


def test_bf16_on_cpu_names_the_interpreter_bug(monkeypatch):
    monkeypatch.setattr(A, "INTERPRETED", True)  # the check, whether or not this process interprets
    with pytest.raises(TypeError, match="bfloat16.*interpreter"):
        A.check_inputs(*qkv(device="cpu", dtype=torch.bfloat16))


def test_registry_entry_matches_the_module():
    from flash_attention_py.registry import get_backend

    b = get_backend("triton")
    assert b.max_head_dim == A.MAX_HEAD_DIM
    assert set(b.dtypes["cuda"]) == set(A.DTYPES["cuda"]) and set(b.dtypes["cpu"]) == set(A.DTYPES["cpu"])
    assert b.load() is flash_attn_triton


def test_error_before_any_launch_on_mixed_devices():
    if DEVICE != "cuda":
        pytest.skip("needs a GPU to mix devices")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        flash_attn_triton(q, k.cpu(), v)


def test_numpy_inputs_rejected():
    a = np.zeros((1, 1, 4, 16), np.float32)
    with pytest.raises(TypeError, match="torch.Tensor"):
        flash_attn_triton(a, a, a)
