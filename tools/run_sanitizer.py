"""Run compute-sanitizer (memcheck, racecheck and synccheck) over every kernel of the CUDA ladder.

    PYTHONPATH=. python3 tools/run_sanitizer.py [--tools memcheck,racecheck] [--log-dir DIR] [--head-dims 256] [--kernels mma]

For each tool it re-runs this file with ``--inner`` under ``compute-sanitizer --tool TOOL`` and reads
its ``ERROR SUMMARY``. The inner run launches every forward kernel (naive, tiled, mma and wgmma
(on Hopper) in fp16 and bf16, and the seed demo kernel) and the backward kernels (fp32, mma, mma-fused and, on
Hopper, wgmma, wgmma-fused and wgmma-ws, where they take D) at small odd shapes: N = 100 (and Nq != Nk),
D = 32, 64, 96, 128 and 256 (and odd D for the fp32 rungs), causal and not; and the variants (a window, grouped-query
heads, dropout) on the tensor-core rungs, forward and backward; the persistent wgmma-ws forward with two blocks
walking every work item; and the warp-specialised backward with its blocks in tile-major order (GQA, causal or a
left bound alone). --head-dims keeps only the cases of those head
dims; --kernels only those forward rungs (e.g. 'mma': its forward, both mma backwards and their variants, without
the seed demo kernel and the wgmma-ws walks; 'wgmma-ws' keeps the walks). Exit status 0 only if every tool reports 0 errors. Needs a GPU.

    PYTHONPATH=. python3 tools/run_sanitizer.py --backend triton [--log-dir DIR]

runs the same tools over the Triton kernels instead (forward, dQ with Delta, dK/dV; ``triton_inner``; every
kernel is compiled once before the tools run): fp16, bf16 and float32 at small odd shapes (N = 17 to 400, D = 40
to 256, Nq != Nk both ways), causal, windows bounded on one side and on both (with full blocks between two
partial stages: the merged partial loop of ``masks.two_spans``), grouped-query heads and dropout, each on the
fixed small-problem config and, for 16-bit inputs up to D = 128, on the autotuner's largest tiles as well; then, on
an sm_90 GPU, the Gluon forward and backward (``hopper_forward.py``, ``hopper_backward.py``) at D = 128, called
directly (``GLUON_CASES``; the persistent forward once more on two programs, each walking several work items).
``--kernels gluon`` runs only those.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

CASES = [  # (B, H, Nq, Nk, D)
    (1, 2, 100, 100, 64),
    (2, 1, 100, 37, 64),   # Nq > Nk: causal rows that see no key
    (1, 1, 37, 100, 128),
    (1, 1, 17, 33, 40),    # odd D for the fp32 rungs (the tensor-core rungs pad it to 64)
    (1, 1, 70, 100, 256),  # the tensor-core rungs' D = 256 (the wgmma backwards stop at 128: the mma one runs)
    (1, 2, 100, 77, 96),   # D = 32 and 96: 64-byte swizzled panels
    (1, 1, 37, 100, 32),
]

VARIANT_CASES = [  # (B, Hq, Hk, Nq, Nk, D)
    (2, 4, 2, 100, 137, 64),
    (1, 3, 1, 77, 50, 128),  # Nq > Nk
    (1, 2, 2, 130, 130, 64),
    (1, 4, 2, 90, 130, 256),
    (2, 4, 2, 100, 137, 96),
    (1, 4, 1, 77, 130, 32),
]
VARIANT_KINDS = [  # (causal, window_size, dropout_p), one per case
    (False, (5, 2), 0.17),
    (True, (20, -1), 0.0),
    (False, (-1, -1), 0.5),
    (True, (40, -1), 0.17),
    (False, (5, 2), 0.17),
    (True, (20, -1), 0.17),
]


def inner(head_dims=None, kernels=frozenset()) -> int:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from flash_attention_cuda import RUNGS, flash_attn_cuda, flash_attn_cuda_backward, seed_nomax_forward
    from flash_attention_cuda.capabilities import BACKWARD, is_hopper
    from flash_attention_py import make_inputs

    hopper = is_hopper(torch.cuda.get_device_capability())
    takes = lambda b, dtype, D: b == "auto" or BACKWARD[b].supports(dtype, D)  # noqa: E731

    n = 0
    for B, H, Nq, Nk, D in CASES:
        if head_dims and D not in head_dims:
            continue
        for kernel, rung in RUNGS.items():
            if kernels and kernel not in kernels:
                continue
            if rung.hopper_only and not hopper:
                continue  # wgmma: sm_90a only
            for dtype in rung.dtypes["cuda"]:
                if not rung.supports(dtype, D):
                    continue
                x = make_inputs(B, H, Nq, Nk, D, dtype=dtype, kind="torch", device="cuda")
                for causal in (False, True):
                    o, lse = flash_attn_cuda(x["q"], x["k"], x["v"], causal=causal, kernel=kernel, return_lse=True)
                    n += 1
                    if kernel != "naive":  # the backward kernels once per (case, dtype): mma's, wgmma's, fp32's
                        bwd = kernel if kernel in ("mma", "wgmma") else "auto"
                        # both mma backwards; on a Hopper every wgmma backward
                        more = {"mma": ("mma-fused",), "wgmma": ("wgmma-fused", "wgmma-ws")}.get(kernel, ())
                        for b in (bwd,) + more:
                            if not takes(b, dtype, D):
                                continue
                            flash_attn_cuda_backward(x["q"], x["k"], x["v"], o, lse, x["do"], causal=causal, kernel=b)
                            n += 3
        if D <= 128 and not kernels:
            x = make_inputs(B, H, Nq, Nk, D, dtype="float32", kind="torch", device="cuda")
            seed_nomax_forward(x["q"], x["k"], x["v"])
            n += 1
    # the variants (window, grouped-query heads, dropout) on the tensor-core rungs, forward and backward
    for kernel in ("mma", "wgmma", "wgmma-ws") if hopper else ("mma",):
        if kernels and kernel not in kernels:
            continue
        for (B, Hq, Hk, Nq, Nk, D), (causal, window, p) in zip(VARIANT_CASES, VARIANT_KINDS):
            if head_dims and D not in head_dims:
                continue
            q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, Hk, Nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            kw = dict(causal=causal, window_size=window, dropout_p=p, dropout_seed=2**33 + 1 if p else None)
            o, lse = flash_attn_cuda(q, k, v, kernel=kernel, return_lse=True, **kw)
            do = torch.randn_like(o)
            # both mma backwards, every wgmma one
            for bwd in {"wgmma-ws": ("wgmma-fused", "wgmma-ws"), "mma": ("mma", "mma-fused")}.get(kernel, (kernel,)):
                bwd = bwd if takes(bwd, "bfloat16", D) else "auto"  # D > 128: the mma backward
                flash_attn_cuda_backward(q, k, v, o, lse, do, kernel=bwd, **kw)
                n += 3
            n += 1
    # wgmma_ws_fwd's persistent walk: two or three blocks walk every work item (the K/V ring, the mbarriers' phases
    # and O's staging running on across items; with a right bound, pairs of rows blocks on two blocks, and on three
    # the items longest first in a snake, in sections of 3 heads)
    if hopper and (not kernels or "wgmma-ws" in kernels):
        from flash_attention_cuda import launch_specs, runtime

        sms, per_sm = runtime.device_sms, launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM
        sections = launch_specs.WGMMA_WS_SECTION_BYTES
        launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM = 1 << 30
        try:
            for ctas, D in ((c, D) for c in (2, 3) for D in (32, 64, 96, 128, 256)):
                if head_dims and D not in head_dims:
                    continue
                runtime.device_sms = lambda x, ctas=ctas: ctas
                launch_specs.WGMMA_WS_SECTION_BYTES = 3 * 4 * 170 * D // 2  # the K/V of 3 heads (GQA group 2)
                launch_specs.clear_caches()
                q = torch.randn(2, 4, 300, D, device="cuda", dtype=torch.float16)
                k, v = (torch.randn(2, 2, 170, D, device="cuda", dtype=torch.float16) for _ in range(2))
                for kw in (dict(causal=True), dict(window_size=(40, 10), dropout_p=0.17, dropout_seed=5), dict()):
                    flash_attn_cuda(q, k, v, kernel="wgmma-ws", **kw)
                    n += 1
        finally:
            runtime.device_sms, launch_specs.WGMMA_WS_PERSISTENT_UNITS_PER_SM = sms, per_sm
            launch_specs.WGMMA_WS_SECTION_BYTES = sections
            launch_specs.clear_caches()
    # mma_fwd's persistent grid ((128, 8, 1) at D 96 and 128, no dropout): two or three blocks walk every work item, each
    # loading its next item's Q and first K/V tile under its last tile, O staged in that tile's buffer. The library
    # takes it for full attention only; the kernel walks any mask, so every kind is launched here
    if not kernels or "mma" in kernels:
        import dataclasses

        from flash_attention_cuda import launch_specs

        real = launch_specs.forward_spec
        try:
            for ctas, D in ((c, D) for c in (2, 3) for D in (96, 128)):
                if head_dims and D not in head_dims:
                    continue
                launch_specs.forward_spec = lambda kernel, p, real=real, ctas=ctas, **kw: dataclasses.replace(
                    real(kernel, p, **kw), grid=(ctas,))
                launch_specs.clear_caches()
                q = torch.randn(2, 4, 300, D, device="cuda", dtype=torch.float16)
                k, v = (torch.randn(2, 2, 170, D, device="cuda", dtype=torch.float16) for _ in range(2))
                for kw in (dict(causal=True), dict(window_size=(40, 10)), dict()):  # (no dropout: it does not walk)
                    flash_attn_cuda(q, k, v, kernel="mma", **kw)
                    n += 1
        finally:
            launch_specs.forward_spec = real
            launch_specs.clear_caches()
    # wgmma_bwd_ws's blocks in tile-major order: grouped query heads kept whole in each block (the split threshold
    # lowered: cases this small would otherwise split the group) under a mask bounded on one side (causal; a left
    # bound alone, whose last tiles of keys start first)
    if hopper and not kernels and (not head_dims or 64 in head_dims):
        from flash_attention_cuda import launch_specs

        saved = launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS
        launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS = 1
        launch_specs.clear_caches()
        try:
            for causal, window in ((True, (-1, -1)), (False, (30, -1))):
                q = torch.randn(2, 6, 200, 64, device="cuda", dtype=torch.float16)
                k, v = (torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.float16) for _ in range(2))
                o, lse = flash_attn_cuda(q, k, v, kernel="wgmma-ws", return_lse=True, causal=causal, window_size=window)
                flash_attn_cuda_backward(q, k, v, o, lse, torch.randn_like(o), kernel="wgmma-ws", causal=causal,
                                         window_size=window)
                n += 4
        finally:
            launch_specs.WGMMA_WS_BACKWARD_MIN_BLOCKS = saved
            launch_specs.clear_caches()
    torch.cuda.synchronize()
    print(f"inner: {n} kernel launches done")
    return 0


TRITON_CASES = [  # (B, Hq, Hk, Nq, Nk, D, dtypes, (causal, window_size, dropout_p) kinds)
    # a window bounded on both sides with full blocks between two partial stages; causal with a left bound
    (1, 2, 2, 400, 400, 64, ("float16",), ((False, (150, 70), 0.0), (True, (200, -1), 0.17))),
    (2, 4, 2, 100, 137, 96, ("bfloat16",), ((False, (5, 2), 0.17),)),  # grouped-query heads, dropout
    (1, 3, 1, 77, 50, 128, ("float16",), ((True, (-1, -1), 0.0),)),  # Nq > Nk: rows that see no key
    (1, 2, 1, 70, 100, 256, ("float16",), ((True, (30, -1), 0.17),)),
    (1, 1, 1, 17, 33, 40, ("float32",), ((False, (3, 4), 0.0),)),  # odd D, 3xTF32 dots
]
# forced tiles (16-bit inputs, D <= 128): the autotuner's largest candidates
TRITON_FORCED = ({"fwd": (128, 64, 8, 3), "dkdv": (64, 128, 8, 2), "dq": (128, 64, 8, 3)},)


# the Gluon kernels on a Hopper (hopper_forward.py, hopper_backward.py; D = 128, 16-bit inputs), called directly (the
# library sends calls this small to the other kernels): (B, Hq, Hk, Nq, Nk, window, splits of the backward)
GLUON_CASES = [
    (1, 2, 2, 100, 100, (-1, -1), 1),
    (2, 2, 1, 100, 37, (-1, 0), 1),  # causal, Nq > Nk: rows that see no key
    (1, 4, 2, 37, 200, (16, 8), 2),  # a window bounded on both sides; the group split in two (float32 partial sums)
    (1, 2, 2, 300, 300, (-1, 0), 1),  # several tiles a program
]


def gluon_inner() -> int:
    """Launch the Gluon kernels over GLUON_CASES; returns the number of launches (0 off an sm_90 GPU)."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        return 0
    from flash_attention_py import make_inputs
    from flash_attention_triton import hopper_backward, hopper_forward

    n = 0
    for B, Hq, Hk, Nq, Nk, window, splits in GLUON_CASES:
        for dtype in ("float16", "bfloat16"):
            x = make_inputs(B, Hq, Nq, Nk, 128, dtype=dtype, kind="torch", device="cuda", seed=n, Hk=Hk)
            o, lse = hopper_forward.forward(x["q"], x["k"], x["v"], window, 128 ** -0.5)
            hopper_backward.backward(x["q"], x["k"], x["v"], o, lse, x["do"], window, 128 ** -0.5, splits)
            n += 4  # the forward; the backward's preparation, Gluon kernel and dQ cast
    # the persistent forward on two programs, each walking several work items (some with no K/V tile)
    sm_count, hopper_forward._sm_count = hopper_forward._sm_count, lambda device_index: 2
    try:
        for B, Hq, Hk, Nq, Nk, window, _ in GLUON_CASES:
            x = make_inputs(B, Hq, Nq, Nk, 128, dtype="float16", kind="torch", device="cuda", seed=n, Hk=Hk)
            hopper_forward.forward(x["q"], x["k"], x["v"], window, 128 ** -0.5)
            n += 1
    finally:
        hopper_forward._sm_count = sm_count
    return n


def triton_inner(kernels=frozenset()) -> int:
    """Launch the Triton kernels over TRITON_CASES (under compute-sanitizer, from main); ``kernels`` {'gluon'}: only
    the Gluon kernels (GLUON_CASES), which run after the others by default."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from flash_attention_py import make_inputs, masks
    from flash_attention_triton import launch as L

    n = 0
    for B, Hq, Hk, Nq, Nk, D, dtypes, kinds in (TRITON_CASES if kernels != {"gluon"} else []):
        for dtype in dtypes:
            x = make_inputs(B, Hq, Nq, Nk, D, dtype=dtype, kind="torch", device="cuda", seed=n)
            q = x["q"]
            k, v = x["k"][:, :Hk].contiguous(), x["v"][:, :Hk].contiguous()  # Hk K/V heads
            forced = TRITON_FORCED if dtype != "float32" and D <= 128 else ()
            for causal, window_size, p in kinds:
                window = masks.window_for(causal, window_size)
                drop = dict(dropout_p=p, dropout_seed=2**33 + 7 if p else None)
                for cfg in (None,) + forced:
                    o, lse = L._forward(q, k, v, window, D ** -0.5, config=cfg and cfg["fwd"], **drop)
                    L._backward(q, k, v, o, lse, x["do"], window, D ** -0.5,
                                configs=cfg and {"dkdv": cfg["dkdv"], "dq": cfg["dq"]}, **drop)
                    n += 3
    n += gluon_inner()
    torch.cuda.synchronize()
    print(f"inner: {n} kernel launches done")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tools", default="memcheck,racecheck,synccheck")
    ap.add_argument("--log-dir", default=None, help="write each tool's full log here")
    ap.add_argument("--sanitizer", default=os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    ap.add_argument("--head-dims", default="", help="only the CUDA cases of these head dims, e.g. '256' (default: all)")
    ap.add_argument("--kernels", default="", help="only these forward rungs and their backwards, e.g. 'mma' "
                    "(default: all)")
    ap.add_argument("--tool-timeout", type=float, default=None, help="seconds each tool may run (default: no limit)")
    ap.add_argument("--backend", choices=("cuda", "triton"), default="cuda",
                    help="the CUDA ladder's kernels (default) or the Triton kernels")
    args = ap.parse_args()
    head_dims = {int(d) for d in args.head_dims.split(",") if d}
    kernels = frozenset(k for k in args.kernels.split(",") if k)
    if args.inner:
        return triton_inner(kernels) if args.backend == "triton" else inner(head_dims, kernels)
    ok = True
    summary = []
    if args.backend == "triton":  # compile every kernel once outside the sanitizer: the tools then load them
        subprocess.run([sys.executable, os.path.abspath(__file__), "--inner", "--backend", "triton", "--kernels",
                        args.kernels], check=True)
    for tool in args.tools.split(","):
        cmd = [args.sanitizer, "--tool", tool, "--target-processes", "all"]
        if tool == "memcheck":
            cmd += ["--leak-check", "no"]
        if tool == "racecheck":
            cmd += ["--racecheck-report", "all"]
        cmd += [sys.executable, os.path.abspath(__file__), "--inner", "--head-dims", args.head_dims,
                "--kernels", args.kernels, "--backend", args.backend]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.tool_timeout)
            log, rc = res.stdout + res.stderr, res.returncode
        except subprocess.TimeoutExpired as e:  # keep what it printed, and say so
            out = (e.stdout or b"") + (e.stderr or b"")
            log = (out.decode() if isinstance(out, bytes) else out) + f"\n(timed out after {args.tool_timeout} s)\n"
            rc = "timeout"
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            name = f"sanitizer_triton_{tool}.log" if args.backend == "triton" else f"sanitizer_{tool}.log"
            with open(os.path.join(args.log_dir, name), "w") as f:
                f.write(" ".join(cmd) + "\n" + log)
        # memcheck ends with "ERROR SUMMARY: N errors", racecheck with
        # "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)"
        m = re.findall(r"ERROR SUMMARY: (\d+) error", log)
        r = re.findall(r"RACECHECK SUMMARY: (\d+) hazards displayed \((\d+) errors, (\d+) warnings\)", log)
        errors = int(m[-1]) if m else (sum(map(int, r[-1])) if r else None)
        launched = re.search(r"inner: (\d+) kernel launches done", log)
        good = rc == 0 and errors == 0 and launched is not None
        ok &= good
        line = (f"{tool}: {'OK' if good else 'FAIL'}, {errors} errors/hazards reported, "
                f"{launched.group(1) if launched else '?'} launches, exit {rc}")
        summary.append(line)
        print(line, flush=True)
        if not good:
            print(log[-4000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
