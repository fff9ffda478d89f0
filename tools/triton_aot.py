"""Ahead-of-time compilation of every kernel variant for real GPU targets, on a machine with no GPU.

The interpreter accepts programs a GPU compiler rejects (``tl.dot`` with a dimension < 16, tiles
that do not fit in shared memory, ...). ``triton.compile`` with an explicit ``GPUTarget`` runs the
real compiler pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin through ptxas) without a driver, so
these mistakes show up on a CPU-only CI machine too.

    python tools/triton_aot.py [--full] [--json out.json] [--jobs N] [--arch 90]

must run with ``TRITON_INTERPRET`` unset or 0 (``triton.jit`` then builds compilable functions).
Each variant reports its shared memory (``metadata.shared``) against the target's limit.
tests/test_triton_aot_compile.py compiles ``representative_variants()`` this way on every CI run.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a plain checkout: the packages live next to tools/
    sys.path.insert(0, str(ROOT))

from flash_attention_py import masks  # noqa: E402
from flash_attention_triton import configs as C  # noqa: E402

_TY = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_ELEM = {"float16": 2, "bfloat16": 2, "float32": 4}
HEAD_DIMS = (16, 32, 40, 64, 96, 128, 256)  # 40 and 96: padded head dims (masked D loads)
WINDOW = (128, 0)  # a local-attention window: both sides bounded, so every loop has all three stages


def _signature(kernel, dtype: str, constexprs: dict, seed_type: str = "i32"):
    """(signature, constexprs, attrs) as the runtime would specialise them: unit stride_*d, 16-aligned rest.

    ``group`` (query heads per K/V head) is the constant 1, as the runtime specialises an int argument equal
    to 1, unless ``constexprs`` holds group=None: the grouped-query variant, where it is a run-time i32.
    dropout_seed is a ``seed_type`` (the runtime types a seed < 2**31 as i32, a larger one as i64 or u64).
    """
    ty = _TY[dtype]
    consts = dict(constexprs)
    gqa = "group" in consts and consts.pop("group") is None
    sig, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in ("LSE", "DELTA"):
            sig[name] = "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.isupper() and name != "H":  # tensors (H is the head count)
            sig[name] = f"*{ty}"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.startswith("stride_") and name.endswith("d"):
            consts[name] = 1
            sig[name] = "constexpr"
        elif name.startswith("stride_"):
            sig[name] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("scale_log2", "dropout_p"):
            sig[name] = "fp32"
        elif name == "dropout_seed":
            sig[name] = seed_type
        elif name in ("group", "splits") and not gqa:  # the dK/dV kernel's splits of the group: 1 without GQA
            consts[name] = 1
            sig[name] = "constexpr"
        else:  # H, Nq, Nk (and group, splits with grouped-query attention)
            sig[name] = "i32"
    return sig, consts, attrs


def _window(mask) -> tuple:
    """A variant's mask: True / False (causal or not) or a (left, right) window of ``flash_attention_py.masks``."""
    return masks.window_for(mask) if isinstance(mask, bool) else (int(mask[0]), int(mask[1]))


def compile_kernel(kernel_name: str, dtype: str, head_dim: int, causal, config, arch: int, extra: str = ""):
    """Compile one variant for GPUTarget('cuda', arch, 32) -> Triton's CompiledKernel (not loaded: no GPU).

    causal: True / False, or a (left, right) window (the kernels take the mask as a window of constexprs);
    config is (BLOCK_M, BLOCK_N, num_warps, num_stages). extra: "" (plain), or "gqa" (grouped-query
    attention: group a run-time value), "dropout" (DROPOUT on, a 64-bit seed) or both joined by "+".
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from flash_attention_triton.backward_kernels import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
    from flash_attention_triton.forward_kernel import attn_fwd_kernel

    kernel = {"fwd": attn_fwd_kernel, "dkdv": attn_bwd_dkdv_kernel, "dq": attn_bwd_dq_kernel}[kernel_name]
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        raise RuntimeError("tools/triton_aot.py needs TRITON_INTERPRET unset (it compiles for real GPUs)")
    BM, BN, warps, stages = config
    block_d = max(16, triton.next_power_of_2(head_dim))
    left, right = _window(causal)
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": BM, "BLOCK_D": block_d, "WINDOW_LEFT": left, "WINDOW_RIGHT": right,
              "BLOCK_N": BN, "DROPOUT": "dropout" in extra, "group": None if "gqa" in extra else 1}
    from flash_attention_triton.launch import FP32_PRECISION

    consts["DOT_PREC"] = FP32_PRECISION if dtype == "float32" else "tf32"
    sig, consts, attrs = _signature(kernel, dtype, consts, seed_type="i64" if "dropout" in extra else "i32")
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "num_stages": stages})
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs), target=target,
                          options=options.__dict__)


def compile_hopper_forward(dtype: str, head_dim: int, window, arch: int = 90):
    """Compile ``flash_attention_triton/hopper_forward.py``'s Gluon kernel for GPUTarget('cuda', arch, 32) (its
    descriptors' types spelled out as the launcher makes them) -> CompiledKernel. dtype 'fp16'/'bf16' or
    'float16'/'bfloat16'; window a (left, right) window or a causal flag."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from flash_attention_triton import hopper_forward as hf

    ty = _TY.get(dtype, dtype)
    gdt = {"fp16": gl.float16, "bf16": gl.bfloat16}[ty]
    descs = {name: f"tensordesc<{ty}[1,1,{rows},{head_dim}],{hf.shared_layout([1, 1, rows, head_dim], gdt)!r}>"
             for name, rows in (("q_desc", hf.HALF_M), ("k_desc", hf.BLOCK_N), ("v_desc", hf.BLOCK_N))}
    left, right = _window(window)
    consts = dict(HEAD_D=head_dim, WINDOW_LEFT=left, WINDOW_RIGHT=right, **hf.CONFIG)
    sig = {**descs, "O": f"*{ty}", "LSE": "*fp32", "COUNTER": "*i32", "H": "i32", "group": "i32", "Nq": "i32", "Nk": "i32",
           "n_items": "i32", "scale_log2": "fp32", **{name: "constexpr" for name in consts}}
    return triton.compile(GluonASTSource(hf.attn_fwd_hopper_kernel, sig, constexprs=consts),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})


def compile_hopper_backward(dtype: str, head_dim: int, window, arch: int = 90):
    """Compile ``flash_attention_triton/hopper_backward.py``'s Gluon kernel for GPUTarget('cuda', arch, 32), as
    ``compile_hopper_forward`` does the forward's -> CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from flash_attention_triton import hopper_backward as hb

    ty = _TY.get(dtype, dtype)
    gdt = {"fp16": gl.float16, "bf16": gl.bfloat16}[ty]
    descs = {name: f"tensordesc<{ty}[1,1,{rows},{head_dim}],{hb.shared_layout([1, 1, rows, head_dim], gdt)!r}>"
             for name, rows in (("q_desc", hb.BLOCK_M), ("k_desc", 2 * hb.HALF_N), ("v_desc", 2 * hb.HALF_N),
                                ("do_desc", hb.BLOCK_M))}
    rows = {name: f"tensordesc<fp32[1,{hb.BLOCK_M}],{hb.row_layout()!r}>" for name in ("lse_desc", "delta_desc")}
    left, right = _window(window)
    config = {**hb.CONFIG, "HEAD_GROUP": hb.head_group((left, right))}
    consts = dict(HEAD_D=head_dim, WINDOW_LEFT=left, WINDOW_RIGHT=right, **config)
    dq = f"tensordesc<fp32[1,1,{hb.BLOCK_M},{hb.dq_box()}],{hb.dq_layout()!r}>"
    sig = {**descs, **rows, "dq_desc": dq, "DK": f"*{ty}", "DV": f"*{ty}", "H": "i32", "group": "i32",
           "splits": "i32", "Nq": "i32", "Nk": "i32", "scale_log2": "fp32", **{name: "constexpr" for name in consts}}
    return triton.compile(GluonASTSource(hb.attn_bwd_hopper_kernel, sig, constexprs=consts),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})


def compile_variant(kernel_name: str, dtype: str, head_dim: int, causal, config, arch: int, extra: str = ""):
    """Compile one variant (``compile_kernel``); returns a dict with its shared memory against the target's limit."""
    t0 = time.time()
    compiled = compile_kernel(kernel_name, dtype, head_dim, causal, config, arch, extra)
    shared = int(compiled.metadata.shared)
    limit = C.SMEM_LIMIT[arch]
    return dict(kernel=kernel_name, dtype=dtype, head_dim=head_dim,
                causal=causal if isinstance(causal, bool) else list(causal), window=list(_window(causal)),
                config=list(config), arch=arch, extra=extra, shared=shared, limit=limit, fits=shared <= limit,
                seconds=round(time.time() - t0, 2))


def variants(full: bool = False, archs=(80, 90)):
    """The variants to compile: (kernel, dtype, head_dim, causal, config, arch[, extra]).

    Default (CI): for each arch, the fixed small-problem configs of every head dim and dtype, the
    and every autotune candidate that survives pruning at D = 64 and 128 (fp16,
    causal: the causal variant holds both the masked and the unmasked loop), plus the candidates at
    D = 256. ``full``: every surviving candidate for every head dim, dtype and causal flag, and the small
    configs with a window bounded on both sides (three loop stages), with grouped-query attention and with
    dropout.
    """
    out = []
    for arch in archs:
        limit = C.SMEM_LIMIT[arch]
        for dtype in ("float16", "float32") if not full else ("float16", "bfloat16", "float32"):
            for D in HEAD_DIMS:
                block_d = max(16, 1 << (D - 1).bit_length())
                for k in ("fwd", "dkdv", "dq"):
                    out.append((k, dtype, D, True, C.small_config(k, block_d, _ELEM[dtype]), arch))
        if full:
            for D in HEAD_DIMS:
                block_d = max(16, 1 << (D - 1).bit_length())
                for k in ("fwd", "dkdv", "dq"):
                    for extra in ("", "gqa", "dropout", "gqa+dropout"):
                        out.append((k, "float16", D, WINDOW, C.small_config(k, block_d, 2), arch, extra))
        tuned = [(d, D, c) for d in ("float16", "bfloat16", "float32") for D in HEAD_DIMS for c in (False, True)] \
            if full else [("float16", 64, True), ("float16", 128, True), ("float16", 256, True)]
        for dtype, D, causal in tuned:
            block_d = max(16, 1 << (D - 1).bit_length())
            for k in ("fwd", "dkdv", "dq"):
                for cfg in C.prune(k, C.CANDIDATES[k], block_d, _ELEM[dtype], limit):
                    out.append((k, dtype, D, causal, cfg, arch))
    # drop duplicates, keep order
    seen, uniq = set(), []
    for v in out:
        key = (v[0], v[1], v[2], v[3], tuple(v[4]), v[5], v[6] if len(v) > 6 else "")
        if key not in seen:
            seen.add(key)
            uniq.append(v)
    return uniq


def representative_variants(archs=(80, 90)):
    """The CI set: per arch, the largest surviving autotune tiles at D = 128 (fp16), the fixed small
    configs at D = 256 in fp32 (the most shared memory of those), D = 16 (dot K = 16) and padded D = 40,
    and on sm_90 the three kernels with the variants together: a window bounded on both sides (a masked, an
    unmasked and a masked stage), grouped-query attention (group a run-time value) and dropout (tl.rand)."""
    out = []
    for arch in archs:
        limit = C.SMEM_LIMIT[arch]
        for k in ("fwd", "dkdv", "dq"):
            kept = C.prune(k, C.CANDIDATES[k], 128, 2, limit)
            biggest = max(kept, key=lambda c: C.smem_estimate(k, c[0], c[1], c[3], 128, 2))
            out.append((k, "float16", 128, True, biggest, arch))
            out.append((k, "float32", 256, True, C.small_config(k, 256, 4), arch))
        out.append(("fwd", "float16", 16, True, C.small_config("fwd", 16, 2), arch))
        out.append(("dq", "float16", 40, True, C.small_config("dq", 64, 2), arch))
        if arch == 90:
            for k in ("fwd", "dkdv", "dq"):  # the variants at once: a window, GQA and dropout
                out.append((k, "float16", 64, WINDOW, C.small_config(k, 64, 2), arch, "gqa+dropout"))
    return out


def _compile_star(v):
    k, dtype, D, causal, cfg, arch = v[:6]
    extra = v[6] if len(v) > 6 else ""
    try:
        return compile_variant(k, dtype, D, causal, cfg, arch, extra)
    except Exception as exc:  # report every failure, not only the first
        return dict(kernel=k, dtype=dtype, head_dim=D, causal=causal, config=list(cfg), arch=arch, extra=extra,
                    error=f"{type(exc).__name__}: {str(exc)[:500]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every surviving config of every variant (slow)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--arch", type=int, action="append", help="compute capability x10 (default 80 and 90)")
    ap.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET to compile for GPU targets", file=sys.stderr)
        return 2
    todo = variants(args.full, tuple(args.arch or (80, 90)))
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(_compile_star, todo, chunksize=1)
    else:
        results = [_compile_star(v) for v in todo]
    failures = [r for r in results if "error" in r]
    for r in results:
        print(json.dumps(r), flush=True)
    print(f"{len(results)} variants, {len(failures)} failed, "
          f"{sum(1 for r in results if 'fits' in r and not r['fits'])} over the shared-memory limit", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = failures + [r for r in results if "fits" in r and not r["fits"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
