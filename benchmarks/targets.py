"""What the benchmark can time: every registry backend, plus PyTorch's own SDPA kernels as anchors.

A :class:`Target` wraps one thing to time behind one interface:

* ``unavailable_reason(device)`` - None if it can run on ``device`` here, else why not;
* ``case_reason(device, dtype, D, mode)`` - None if it claims this case, else why not;
* ``prepare(inputs, causal, mode)`` - a zero-argument callable that runs the timed step once;
* ``context()`` - a context manager around all of a case's calls (SDPA: the kernel pinning).

Registry backends (``flash_attention_py.registry.BACKENDS``) are picked up automatically, so a new
backend appears in the benchmark as soon as it has a registry entry. The anchors that are not in
the registry are ``torch.nn.functional.scaled_dot_product_attention`` pinned to one kernel with
``torch.nn.attention.sdpa_kernel``: ``sdpa-math``, ``sdpa-efficient``, ``sdpa-flash``, ``sdpa-cudnn``.
The naive anchor is the registry's ``naive-torch`` (``attention_naive``).

Modes: 'fwd' times the forward alone (no autograd graph); 'bwd' times the backward alone (the forward
runs once, untimed, and its graph is kept); 'fwd+bwd' times forward then backward.

Variants: ``prepare(x, causal, mode, **variant)`` also takes ``window_size``, ``dropout_p`` and
``dropout_seed`` (GQA is the shape of ``x['k']``). The registry backends take them as they are; SDPA gets
the window as a boolean ``attn_mask`` (built by :func:`flash_attention_py.masks.visible`), ``enable_gqa=True``
and its own ``dropout_p`` (with its own random numbers: the seed is not its to take); :class:`FlexTarget`
(PyTorch's FlexAttention, compiled, with a block mask from :func:`flash_attention_py.masks.flex_mask_mod`)
takes the window and GQA, not dropout. ``python -m benchmarks.variants`` times them side by side.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

from flash_attention_py.registry import BACKENDS, Backend

ALL_DTYPES = ("float16", "bfloat16", "float32", "float64")
NAIVE = "naive-torch"

# SDPA anchor name -> SDPBackend member name
SDPA_KERNELS = {
    "sdpa-math": "MATH",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}


def short_reason(exc: BaseException, limit: int = 200) -> str:
    """'ExcType: first line of the message', at most ``limit`` characters."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _torch():
    import torch

    return torch


class Target:
    name: str
    rung: str
    description: str
    array: str  # 'numpy' or 'torch'
    is_anchor: bool = False
    slow_on_cpu: bool = False
    devices: tuple = ()

    def dtypes(self, device: str) -> tuple:
        raise NotImplementedError

    def unavailable_reason(self, device: str) -> Optional[str]:
        raise NotImplementedError

    def case_reason(self, device: str, dtype: str, D: int, mode: str) -> Optional[str]:
        raise NotImplementedError

    def prepare(self, x: dict, causal: bool, mode: str, **variant) -> Callable[[], object]:
        raise NotImplementedError

    def context(self):
        """A context manager entered around all of a case's calls (prepare, warm-up, memory, timing)."""
        return contextlib.nullcontext()


# ------------------------------------------------------------------------------------ registry
@dataclass
class RegistryTarget(Target):
    backend: Backend

    def __post_init__(self):
        b = self.backend
        self.name, self.rung, self.description, self.array = b.name, b.rung, b.description, b.array
        self.is_anchor = b.name == NAIVE or b.rung == "anchor"
        self.slow_on_cpu = bool(getattr(b, "slow_on_cpu", False))
        self.devices = tuple(b.dtypes)
        self._reasons = {}

    def dtypes(self, device):
        return tuple(self.backend.dtypes.get(device, ()))

    def unavailable_reason(self, device):
        """The registry's probe, then an import of the backend's module (it may not exist yet); cached per device."""
        if device not in self._reasons:
            self._reasons[device] = self._probe(device)
        return self._reasons[device]

    def _probe(self, device):
        try:
            reason = self.backend.unavailable_reason(device)
        except Exception as exc:  # a probe that itself fails
            return f"its availability probe failed: {short_reason(exc)}"
        if reason is not None:
            return reason
        try:  # the module may not exist yet, or fail to import here
            self.backend.load()
        except Exception as exc:
            return f"cannot import {self.backend.name}'s forward: {short_reason(exc)}"
        return None

    def case_reason(self, device, dtype, D, mode):
        b = self.backend
        if dtype not in b.dtypes.get(device, ()):
            return f"{b.name} does not take {dtype} on {device} (it takes {', '.join(b.dtypes.get(device, ())) or 'nothing'})"
        if not b.supports_head_dim(D):
            allowed = f"D in {b.head_dims}" if b.head_dims else f"D <= {b.max_head_dim}"
            return f"{b.name} does not take head dim D={D} ({allowed})"
        if mode != "fwd" and not b.backward:
            return f"{b.name} has no backward"
        return None

    def prepare(self, x, causal, mode, **variant):
        b = self.backend
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        if mode == "fwd":
            # the public function itself, looked up once, with the entry's own arguments: the timed call is the
            # one a user writes (flash_attn_triton(q, k, v, causal=...)), as SDPA's is the bare
            # scaled_dot_product_attention, with nothing of the registry's around it (Backend.forward imports the
            # module on every call: a few microseconds of host time, more than some gaps to FA2 at N = 64)
            fn, kw = b.load(), {**b.kwargs, **variant}
            if b.array == "torch":
                torch = _torch()

                def fwd():
                    with torch.no_grad():
                        return fn(q, k, v, causal=causal, **kw)

                return fwd
            return lambda: fn(q, k, v, causal=causal, **kw)
        if mode == "fwd+bwd":
            return lambda: b.forward_backward(q, k, v, do, causal=causal, **variant)
        # mode == 'bwd': run the forward once (untimed), time the backward alone
        if b.array == "numpy":
            o, lse = b.forward(q, k, v, causal=causal, return_lse=True, **variant)
            return lambda: b.numpy_backward(q, k, v, o, lse, do, causal=causal, **variant)
        torch = _torch()
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            # the kept graph is a steady-state call's, as in a training loop: a backend may run the first calls of
            # a shape otherwise (flash_attn_cuda plans a key on its second call and runs its C++ autograd
            # function from the third), so two calls with their backwards come first, untimed
            for _ in range(STEADY_CALLS):
                warm = b.forward(qg, kg, vg, causal=causal, **variant)
                warm = warm[0] if isinstance(warm, tuple) else warm
                torch.autograd.grad(warm, (qg, kg, vg), do)
            o = b.forward(qg, kg, vg, causal=causal, **variant)
        if isinstance(o, tuple):
            o = o[0]
        return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


STEADY_CALLS = 2  # forward + backward calls before a backward's kept graph is made (Target.prepare, mode 'bwd')


# ------------------------------------------------------------------------------------ SDPA anchors
def _sdpa_api():
    """(sdpa_kernel, SDPBackend), or raise ImportError saying why."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as exc:  # torch too old, or no torch
        raise ImportError(f"torch.nn.attention.sdpa_kernel/SDPBackend unavailable: {short_reason(exc)}") from exc
    return sdpa_kernel, SDPBackend


def _causal_lower_right():
    """torch.nn.attention.bias.causal_lower_right, or None (imported only when needed: it pulls in dynamo)."""
    try:
        from torch.nn.attention.bias import causal_lower_right
    except Exception:
        return None
    return causal_lower_right


@dataclass
class SdpaTarget(Target):
    name: str
    kernel: str  # SDPBackend member name

    def __post_init__(self):
        self.rung = "anchor"
        self.array = "torch"
        self.is_anchor = True
        self.devices = ("cpu", "cuda")
        self.description = (f"torch.nn.functional.scaled_dot_product_attention pinned to SDPBackend.{self.kernel} "
                            f"(torch.nn.attention.sdpa_kernel)")
        self._probe_cache = {}

    def dtypes(self, device):
        return ALL_DTYPES  # what a kernel takes is found out by calling it; a refusal is 'unsupported'

    @contextlib.contextmanager
    def context(self):
        """SDPA pinned to this kernel (entered once around a case's calls, so that the timed call is the bare
        F.scaled_dot_product_attention); a refusal ('No available kernel') becomes NotImplementedError."""
        sdpa_kernel, SDPBackend = _sdpa_api()
        backend = getattr(SDPBackend, self.kernel, None)
        if backend is None:
            raise NotImplementedError(f"this torch has no SDPBackend.{self.kernel}")
        with warnings.catch_warnings(record=True) as caught:  # kept for the reason of a refusal; no spam per call
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    yield
            except RuntimeError as exc:
                text = str(exc).lower()
                if "no available kernel" in text or "no viable backend" in text:
                    why = "; ".join(str(w.message).splitlines()[0] for w in caught)[:300]
                    raise NotImplementedError(
                        f"SDPBackend.{self.kernel} refuses this case here" + (f" ({why})" if why else "")) from exc
                raise

    @staticmethod
    def _mask_kwargs(Nq, Nk, causal):
        if not causal:
            return {}
        if Nq == Nk:
            return {"is_causal": True}
        # the project's causal mask is bottom-right aligned; is_causal=True is top-left aligned
        causal_lower_right = _causal_lower_right()
        if causal_lower_right is None:
            raise NotImplementedError("causal with Nq != Nk needs torch.nn.attention.bias.causal_lower_right")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 'will produce NaNs when seq_len_q > seq_len_kv': the NaN check sees it
            return {"attn_mask": causal_lower_right(Nq, Nk)}

    def unavailable_reason(self, device):
        if device in self._probe_cache:
            return self._probe_cache[device]
        reason = None
        try:
            torch = _torch()
            if device == "cuda" and not torch.cuda.is_available():
                reason = "no CUDA GPU (torch.cuda.is_available() is False)"
            else:
                dtype = torch.float16 if device == "cuda" else torch.float32
                q = torch.randn(1, 2, 16, 64, device=device, dtype=dtype)
                with self.context():
                    torch.nn.functional.scaled_dot_product_attention(q, q, q)
        except Exception as exc:
            reason = f"SDPBackend.{self.kernel} does not run on {device} here: {short_reason(exc)}"
        self._probe_cache[device] = reason
        return reason

    def case_reason(self, device, dtype, D, mode):
        return None

    @staticmethod
    def _variant_kwargs(q, k, causal, window_size=None, dropout_p=0.0, dropout_seed=None):
        """SDPA's keyword arguments for a call with these variants (see the module docstring)."""
        from flash_attention_py.masks import visible, window_for

        torch = _torch()
        Nq, Nk = q.shape[-2], k.shape[-2]
        window = window_for(causal, tuple(window_size) if window_size is not None else (-1, -1))
        if window in ((-1, -1), (-1, 0)):
            kw = SdpaTarget._mask_kwargs(Nq, Nk, causal)
        else:  # a window: SDPA takes it only as a dense boolean mask (True = visible)
            kw = {"attn_mask": visible(torch.arange(Nq, device=q.device), torch.arange(Nk, device=q.device),
                                       Nq, Nk, window)}
        if k.shape[1] != q.shape[1]:
            kw["enable_gqa"] = True
        if dropout_p:
            kw["dropout_p"] = float(dropout_p)
        return kw

    def prepare(self, x, causal, mode, **variant):
        torch = _torch()
        sdpa = torch.nn.functional.scaled_dot_product_attention
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        kw = self._variant_kwargs(q, k, causal, **variant)
        if mode == "fwd":
            def fwd():
                with torch.no_grad():
                    return sdpa(q, k, v, **kw)

            return fwd
        if mode == "fwd+bwd":
            def fwd_bwd():
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                with torch.enable_grad():
                    o = sdpa(qg, kg, vg, **kw)
                return (o.detach(),) + torch.autograd.grad(o, (qg, kg, vg), do)

            return fwd_bwd
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():  # run_case calls prepare inside self.context()
            o = sdpa(qg, kg, vg, **kw)
        return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


# ------------------------------------------------------------------------------------ FlexAttention
_FLEX = {}


def _flex_attention(device):
    """torch.nn.attention.flex_attention.flex_attention, compiled on a GPU (its fused Triton kernel; eager
    FlexAttention materialises the scores), eager on the CPU; one compiled function per process."""
    if device not in _FLEX:
        torch = _torch()
        from torch.nn.attention.flex_attention import flex_attention

        if device == "cuda":
            _FLEX[device] = torch.compile(flex_attention, dynamic=False)
        else:
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            _FLEX[device] = flex_attention
    return _FLEX[device]


@dataclass
class FlexTarget(Target):
    """PyTorch's FlexAttention with a block mask of the project's mask rule: the window variant's PyTorch
    alternative (blocks wholly outside the window are skipped, as in the kernels here). Not in the default
    sweep (each mask compiles); :mod:`benchmarks.variants` times it."""

    name: str = "flex"

    def __post_init__(self):
        self.rung = "anchor"
        self.array = "torch"
        self.is_anchor = True
        self.devices = ("cpu", "cuda")
        self.description = ("torch.nn.attention.flex_attention.flex_attention (torch.compile on a GPU) with a "
                            "create_block_mask block mask of masks.flex_mask_mod")

    def dtypes(self, device):
        return ("float16", "bfloat16", "float32")

    def context(self):
        """Room for one compiled kernel per mask and shape (a run compiles more than dynamo's default limit
        of recompilations, past which it would fall back to eager FlexAttention)."""
        import torch._dynamo

        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        return torch._dynamo.config.patch(**{limit: 256})

    def unavailable_reason(self, device):
        try:
            torch = _torch()
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        except Exception as exc:
            return f"FlexAttention unavailable: {short_reason(exc)}"
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
        return None

    def case_reason(self, device, dtype, D, mode):
        return None if dtype in self.dtypes(device) else f"flex is timed in {', '.join(self.dtypes(device))}"

    def prepare(self, x, causal, mode, window_size=None, dropout_p=0.0, dropout_seed=None):
        if dropout_p:
            raise NotImplementedError("FlexAttention has no dropout")
        from torch.nn.attention.flex_attention import create_block_mask

        from flash_attention_py.masks import flex_mask_mod, window_for

        torch = _torch()
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        Nq, Nk = q.shape[-2], k.shape[-2]
        window = window_for(causal, tuple(window_size) if window_size is not None else (-1, -1))
        block_mask = None if window == (-1, -1) else create_block_mask(
            flex_mask_mod(Nq, Nk, window), None, None, Nq, Nk, device=q.device.type)
        flex = _flex_attention(q.device.type)
        kw = dict(block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])
        if mode == "fwd":
            def fwd():
                with torch.no_grad():
                    return flex(q, k, v, **kw)

            return fwd
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        if mode == "fwd+bwd":
            def fwd_bwd():
                with torch.enable_grad():
                    o = flex(qg, kg, vg, **kw)
                return (o.detach(),) + torch.autograd.grad(o, (qg, kg, vg), do)

            return fwd_bwd
        with torch.enable_grad():
            o = flex(qg, kg, vg, **kw)
        return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


# ------------------------------------------------------------------------------------ the list
def build_targets() -> list:
    """Every registry backend (in registry order), then the SDPA anchors."""
    targets = [RegistryTarget(backend=b) for b in BACKENDS]
    names = {t.name for t in targets}
    targets += [SdpaTarget(name=n, kernel=k) for n, k in SDPA_KERNELS.items() if n not in names]
    return targets
