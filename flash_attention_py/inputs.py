"""The one input generator: fresh random q, k, v (and dO) for tests, benchmarks and notebooks."""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["make_inputs"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def make_inputs(B=1, H=1, Nq=128, Nk=None, D=64, *, dtype="float32", kind="torch", device="cpu",
                seed=None, with_grad=False, layout="bhnd", Hk=None, draw="host"):
    """Random normal q (B, H, Nq, D), k and v (B, Hk, Nk, D), and dO (B, H, Nq, D).

    Arguments
        Nk: defaults to Nq.
        Hk: the K/V heads, defaults to H; grouped-query attention (GQA/MQA) takes H % Hk == 0.
        B, H, Nq, Nk, D: positive ints (anything else raises a ValueError/TypeError naming it).
        dtype: 'float16', 'bfloat16', 'float32' or 'float64' (bfloat16 only for torch).
        kind: 'numpy' or 'torch'.
        device: torch device ('cpu', 'cuda', ...); ignored for NumPy.
        seed: None draws fresh inputs every call (the default: never test on one fixed input).
        with_grad: torch tensors that require grad.
        layout: 'bhnd' (contiguous) or 'bnhd' (a (B, N, H, D) buffer viewed as (B, H, N, D):
            non-contiguous, as the output of a QKV projection usually is).

        draw: 'host' (NumPy, in float64) or 'device' (torch.randn on ``device`` in float32, for kind='torch'
            only: at N = 16384 the host takes seconds per array, the GPU milliseconds; a benchmark that draws
            its inputs again for every round uses it). The same seed gives other values than 'host'.

    Returns a dict with 'q', 'k', 'v', 'do'. Values are drawn in float64 (float32 with draw='device') and then
    rounded to ``dtype``, so a float64 reference of the rounded values is exact.
    """
    fn = "make_inputs"
    Nk = Nq if Nk is None else Nk
    Hk = H if Hk is None else Hk
    for name, val in (("B", B), ("H", H), ("Nq", Nq), ("Nk", Nk), ("D", D), ("Hk", Hk)):
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise TypeError(f"{fn}: {name} must be an int, got {type(val).__name__} {val!r}")
        if val < 1:
            raise ValueError(f"{fn}: {name} must be >= 1, got {val}")
    if H % Hk:
        raise ValueError(f"{fn}: H must be a multiple of Hk (grouped-query heads), got H = {H}, Hk = {Hk}")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ValueError(f"{fn}: dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if not isinstance(with_grad, bool):
        raise TypeError(f"{fn}: with_grad must be True or False, got {type(with_grad).__name__} {with_grad!r}")
    if layout not in ("bhnd", "bnhd"):
        raise ValueError(f"make_inputs: layout must be 'bhnd' or 'bnhd', got {layout!r}")
    if kind not in ("numpy", "torch"):
        raise ValueError(f"make_inputs: kind must be 'numpy' or 'torch', got {kind!r}")
    if draw not in ("host", "device"):
        raise ValueError(f"{fn}: draw must be 'host' or 'device', got {draw!r}")
    if draw == "device" and kind != "torch":
        raise ValueError(f"{fn}: draw='device' needs kind='torch', got kind={kind!r}")
    if draw == "device":
        return _draw_on_device(B, H, Hk, Nq, Nk, D, dtype, device, seed, with_grad, layout)
    rng = np.random.default_rng(seed)

    def draw(N, heads=H):
        shape = (B, N, heads, D) if layout == "bnhd" else (B, heads, N, D)
        x = rng.standard_normal(shape)
        return np.swapaxes(x, 1, 2) if layout == "bnhd" else x

    arrays = {"q": draw(Nq), "k": draw(Nk, Hk), "v": draw(Nk, Hk), "do": draw(Nq)}
    if kind == "numpy":
        if dtype == "bfloat16":
            raise TypeError("make_inputs: NumPy has no bfloat16; use kind='torch'")
        out = {}
        for name, x in arrays.items():
            y = np.empty_like(x, dtype=dtype) if layout == "bhnd" else np.swapaxes(np.empty(np.swapaxes(x, 1, 2).shape, dtype), 1, 2)
            y[...] = x
            out[name] = y
        return out
    import torch

    tdtype = getattr(torch, dtype)
    out = {}
    for name, x in arrays.items():
        base = torch.from_numpy(np.ascontiguousarray(np.swapaxes(x, 1, 2) if layout == "bnhd" else x))
        base = base.to(device=device, dtype=tdtype)
        t = base.transpose(1, 2) if layout == "bnhd" else base
        if with_grad and name != "do":
            t.requires_grad_(True)
        out[name] = t
    return out


def _draw_on_device(B, H, Hk, Nq, Nk, D, dtype, device, seed, with_grad, layout):
    """make_inputs(draw='device'): standard normals drawn by torch on ``device`` in float32, then rounded."""
    import torch

    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    out = {}
    for name, N, heads in (("q", Nq, H), ("k", Nk, Hk), ("v", Nk, Hk), ("do", Nq, H)):
        shape = (B, N, heads, D) if layout == "bnhd" else (B, heads, N, D)
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(getattr(torch, dtype))
        t = x.transpose(1, 2) if layout == "bnhd" else x
        if with_grad and name != "do":
            t.requires_grad_(True)
        out[name] = t
    return out
