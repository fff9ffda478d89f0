"""Ahead-of-time compilation of every kernel variant for real GPU targets, on a machine with no GPU.

The interpreter accepts programs a GPU compiler rejects (``tl.dot`` with a dimension < 16, tiles
that do not fit in shared memory, ...). ``triton.compile`` with an explicit ``GPUTarget`` runs the
real compiler pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin through ptxas) without a driver, so
these mistakes show up on a CPU-only CI machine too.

    python -m flash_attention_triton.aot [--full] [--json out.json]

must run with ``TRITON_INTERPRET`` unset or 0 (``triton.jit`` then builds compilable functions).
Each variant reports its shared memory (``metadata.shared``) against the target's limit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import configs as C

_TY = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_ELEM = {"float16": 2, "bfloat16": 2, "float32": 4}
HEAD_DIMS = (16, 32, 40, 64, 96, 128, 256)  # 40 and 96: padded head dims (masked D loads)


def _signature(kernel, dtype: str, constexprs: dict):
    """(signature, constexprs, attrs) as the runtime would specialise them: unit stride_*d, 16-aligned rest."""
    ty = _TY[dtype]
    sig, consts, attrs = {}, dict(constexprs), {}
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
        elif name in ("qk_scale", "softmax_scale"):
            sig[name] = "fp32"
        else:  # H, Nq, Nk
            sig[name] = "i32"
    return sig, consts, attrs


def compile_variant(kernel_name: str, dtype: str, head_dim: int, causal: bool, config, arch: int):
    """Compile one variant for GPUTarget('cuda', arch, 32); returns a dict with its shared memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from .backward_kernels import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel, attn_bwd_preprocess
    from .forward_kernel import attn_fwd_kernel

    kernel = {"fwd": attn_fwd_kernel, "dkdv": attn_bwd_dkdv_kernel, "dq": attn_bwd_dq_kernel,
              "pre": attn_bwd_preprocess}[kernel_name]
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        raise RuntimeError("flash_attention_triton.aot needs TRITON_INTERPRET unset (it compiles for real GPUs)")
    BM, BN, warps, stages = config
    block_d = max(16, triton.next_power_of_2(head_dim))
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": BM, "BLOCK_D": block_d}
    if kernel_name != "pre":
        consts.update(CAUSAL=causal, BLOCK_N=BN)
    if kernel_name == "fwd":
        consts["NEG_SCALE"] = False
    if kernel_name != "pre":
        from .attention import FP32_PRECISION

        consts["DOT_PREC"] = FP32_PRECISION if dtype == "float32" else "tf32"
    sig, consts, attrs = _signature(kernel, dtype, consts)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "num_stages": stages})
    t0 = time.time()
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                              target=target, options=options.__dict__)
    shared = int(compiled.metadata.shared)
    limit = C.SMEM_LIMIT[arch]
    return dict(kernel=kernel_name, dtype=dtype, head_dim=head_dim, causal=causal, config=list(config), arch=arch,
                shared=shared, limit=limit, fits=shared <= limit, seconds=round(time.time() - t0, 2))


def variants(full: bool = False, archs=(80, 90)):
    """The variants to compile: (kernel, dtype, head_dim, causal, config, arch).

    Default (CI): for each arch, the fixed small-problem configs of every head dim and dtype, the
    preprocess kernel, and every autotune candidate that survives pruning at D = 64 and 128 (fp16,
    causal: the causal variant holds both the masked and the unmasked loop), plus the candidates at
    D = 256. ``full``: every surviving candidate for every head dim, dtype and causal flag.
    """
    out = []
    for arch in archs:
        limit = C.SMEM_LIMIT[arch]
        for dtype in ("float16", "float32") if not full else ("float16", "bfloat16", "float32"):
            for D in HEAD_DIMS:
                block_d = max(16, 1 << (D - 1).bit_length())
                for k in ("fwd", "dkdv", "dq"):
                    out.append((k, dtype, D, True, C.small_config(k, block_d, _ELEM[dtype]), arch))
        out.append(("pre", "float16", 128, False, (128, 0, 4, 1), arch))
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
        key = (v[0], v[1], v[2], v[3], tuple(v[4]), v[5])
        if key not in seen:
            seen.add(key)
            uniq.append(v)
    return uniq


def representative_variants(archs=(80, 90)):
    """The CI set: per arch, the largest surviving autotune tiles at D = 128 (fp16), the fixed small
    configs at D = 256 in fp32 (the most shared memory of those), D = 16 (dot K = 16) and padded D = 40."""
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
        out.append(("pre", "float16", 128, False, (128, 0, 4, 1), arch))
    return out


def _compile_star(v):
    k, dtype, D, causal, cfg, arch = v
    try:
        return compile_variant(k, dtype, D, causal, cfg, arch)
    except Exception as exc:  # report every failure, not only the first
        return dict(kernel=k, dtype=dtype, head_dim=D, causal=causal, config=list(cfg), arch=arch,
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
