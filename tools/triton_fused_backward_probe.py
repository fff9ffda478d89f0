#!/usr/bin/env python
"""Does one launch of both backward kernels' programs beat two launches? A probe of Triton's backward.

    PYTHONPATH=. python tools/triton_fused_backward_probe.py --out results/triton_fused_bwd   # on a GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python tools/triton_fused_backward_probe.py --check       # on a CPU

``flash_attn_triton``'s backward is two kernels in a row (``backward_kernels.py``): the dQ kernel, which also
writes Delta, then the dK/dV kernel. FlexAttention's backward is one kernel whose grid holds both kinds of
program (a program past the K/V blocks computes dQ), after a small kernel for Delta; at the windowed shapes
of ``docs/results/cuda/kernel_breakdown/`` it is 663-704 µs against our two kernels' 781-835. This probe
builds that arrangement from our own pieces, unchanged: ``_dkdv_inner`` and ``_dq_inner`` with the mask's
stages (``masks.q_blocks``, ``masks.kv_blocks``), the full blocks and then both partial stages in one loop, as the
two kernels run them. A measurement, not a backend: fp16/bf16, contiguous
(B, H, N, D), a window (or causal or full), grouped K/V heads summed by one program per K/V head; no dropout,
D a power of two.

On a GPU it times, per shape, our backward (``launch._backward``: its two autotuned kernels) against Delta +
the fused kernel in a few configs (BLOCK_M1 x BLOCK_N1 for dK/dV, BLOCK_M2 x BLOCK_N2 for dQ, warps,
stages), ``triton.testing.do_bench`` medians, checks dQ, dK, dV of each against ours (max |difference| over
max |ours| < 1e-2), and writes ``fused_backward_probe.json`` and ``.md`` into --out. ``--check`` runs the
same comparison at small sizes under the interpreter.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

from flash_attention_triton import launch
from flash_attention_triton.backward_kernels import _dkdv_inner, _dq_inner, lse_base2
from flash_attention_triton.masks import kv_blocks, q_blocks
from flash_attention_triton.tiles import _LN2, LOG2E, head_ptrs, load_rows, store_rows

# (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, warps, stages): FlexAttention's sm90 D <= 128 config first
CONFIGS = [(64, 128, 128, 64, 8, 3), (64, 128, 128, 64, 8, 2), (32, 64, 64, 32, 4, 3), (32, 128, 128, 32, 8, 3)]
SHAPES = [  # B, H, Hk, N, D, window
    (4, 16, 16, 4096, 128, (512, 0)), (1, 16, 16, 16384, 128, (256, 256)), (4, 16, 16, 4096, 128, (-1, -1)),
    (2, 32, 8, 4096, 128, (-1, 0)),
]


@triton.jit
def delta_kernel(O, DO, DELTA, N, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Delta_i = rowsum(dO_i * O_i) for BLOCK rows of the contiguous (B * H * N, HEAD_DIM) O and dO."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs = rows[:, None].to(tl.int64) * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    ok = rows[:, None] < N
    o = tl.load(O + offs, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=rows < N)


@triton.jit
def fused_kernel(Q, K, V, DO, LSE, DELTA, DQ, DK, DV, H, group, Nq, Nk, scale_log2,
                 HEAD_DIM: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
                 BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr):
    """Grid (cdiv(Nk, BLOCK_N1) + cdiv(Nq, BLOCK_M2) * group, B * Hk): the first programs are the dK/dV
    kernel's (a K/V block of one K/V head, looping over its group's query heads), the rest the dQ kernel's
    (a Q block of one query head). Q, DO, DQ (B, H, Nq, D) and K, V, DK, DV (B, H // group, Nk, D) contiguous."""
    pid = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    Hk = H // group
    off_b = (pid_bkv // Hk).to(tl.int64)
    off_hk = (pid_bkv % Hk).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    sq_b, sq_h, sq_n = H * Nq * HEAD_DIM, Nq * HEAD_DIM, HEAD_DIM  # contiguous strides
    sk_b, sk_h, sk_n = Hk * Nk * HEAD_DIM, Nk * HEAD_DIM, HEAD_DIM
    n_kv = tl.cdiv(Nk, BLOCK_N1)
    if pid < n_kv:  # dK_j, dV_j (the dK/dV kernel's program, no splits)
        start_n = pid * BLOCK_N1
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        k = load_rows(K, off_b, off_hk, sk_b, sk_h, sk_n, 1, offs_n, Nk, offs_d, HEAD_DIM, HEAD_DIM)
        v = load_rows(V, off_b, off_hk, sk_b, sk_h, sk_n, 1, offs_n, Nk, offs_d, HEAD_DIM, HEAD_DIM)
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
        start, full_start, full_end, end = q_blocks(start_n, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M1, BLOCK_N1)
        offs_m0 = tl.arange(0, BLOCK_M1)
        for g in range(0, group):
            off_h = off_hk * group + g
            pid_bh = off_b * H + off_h
            Q_ptr = head_ptrs(Q, off_b, off_h, sq_b, sq_h, 1, offs_d)
            DO_ptr = head_ptrs(DO, off_b, off_h, sq_b, sq_h, 1, offs_d)
            # as attn_bwd_dkdv_kernel: the full blocks, then both partial stages in one loop
            dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE + pid_bh * Nq, DELTA + pid_bh * Nq, sq_n, sq_n,
                                 offs_n, offs_m0, offs_d, Nq, Nk, scale_log2, full_start, full_end, full_end, full_end,
                                 0, 0.0, 0, False, WINDOW_LEFT, WINDOW_RIGHT, False, HEAD_DIM, BLOCK_M1, HEAD_DIM, "tf32")
            dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE + pid_bh * Nq, DELTA + pid_bh * Nq, sq_n, sq_n,
                                 offs_n, offs_m0, offs_d, Nq, Nk, scale_log2, start, full_start, full_end, end,
                                 0, 0.0, 0, True, WINDOW_LEFT, WINDOW_RIGHT, False, HEAD_DIM, BLOCK_M1, HEAD_DIM, "tf32")
        store_rows(DK, pid_bkv, offs_n, Nk, offs_d, dk * (scale_log2 * _LN2), HEAD_DIM, HEAD_DIM)
        store_rows(DV, pid_bkv, offs_n, Nk, offs_d, dv, HEAD_DIM, HEAD_DIM)
    else:  # dQ_i (the dQ kernel's program, reading Delta)
        p = pid - n_kv
        n_q = tl.cdiv(Nq, BLOCK_M2)
        off_h = off_hk * group + p // n_q
        start_m = (p % n_q) * BLOCK_M2
        pid_bh = off_b * H + off_h
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        q = load_rows(Q, off_b, off_h, sq_b, sq_h, sq_n, 1, offs_m, Nq, offs_d, HEAD_DIM, HEAD_DIM)
        do = load_rows(DO, off_b, off_h, sq_b, sq_h, sq_n, 1, offs_m, Nq, offs_d, HEAD_DIM, HEAD_DIM)
        lse2 = lse_base2(tl.load(LSE + pid_bh * Nq + offs_m, mask=offs_m < Nq, other=0.0))
        delta = tl.load(DELTA + pid_bh * Nq + offs_m, mask=offs_m < Nq, other=0.0)
        K_ptr = head_ptrs(K, off_b, off_hk, sk_b, sk_h, 1, offs_d)
        V_ptr = head_ptrs(V, off_b, off_hk, sk_b, sk_h, 1, offs_d)
        offs_n0 = tl.arange(0, BLOCK_N2)
        dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
        start, full_start, full_end, end = kv_blocks(start_m, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M2, BLOCK_N2)
        # as attn_bwd_dq_kernel: the full blocks, then both partial stages in one loop
        dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, sk_n, sk_n, offs_m, offs_n0, offs_d, Nq, Nk,
                       scale_log2, full_start, full_end, full_end, full_end, offs_m, 0.0, 0,
                       False, WINDOW_LEFT, WINDOW_RIGHT, False, HEAD_DIM, BLOCK_N2, HEAD_DIM, "tf32")
        dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, sk_n, sk_n, offs_m, offs_n0, offs_d, Nq, Nk,
                       scale_log2, start, full_start, full_end, end, offs_m, 0.0, 0,
                       True, WINDOW_LEFT, WINDOW_RIGHT, False, HEAD_DIM, BLOCK_N2, HEAD_DIM, "tf32")
        store_rows(DQ, pid_bh, offs_m, Nq, offs_d, dq * (scale_log2 * _LN2), HEAD_DIM, HEAD_DIM)


def fused_backward(q, k, v, o, lse, do, window, scale, cfg):
    """(dq, dk, dv) by Delta + the fused kernel; cfg = (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, warps, stages)."""
    M1, N1, M2, N2, warps, stages = cfg
    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    group = H // Hk
    delta = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    delta_kernel[(triton.cdiv(B * H * Nq, 64),)](o, do, delta, B * H * Nq, BLOCK=64, HEAD_DIM=D)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grid = (triton.cdiv(Nk, N1) + triton.cdiv(Nq, M2) * group, B * Hk)
    fused_kernel[grid](q, k, v, do, lse, delta, dq, dk, dv, H, group, Nq, Nk, scale * LOG2E, HEAD_DIM=D,
                       WINDOW_LEFT=window[0], WINDOW_RIGHT=window[1], BLOCK_M1=M1, BLOCK_N1=N1, BLOCK_M2=M2,
                       BLOCK_N2=N2, num_warps=warps, num_stages=stages)
    return dq, dk, dv


def _inputs(B, H, Hk, N, D, dtype, device):
    torch.manual_seed(0)
    q = torch.randn(B, H, N, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hk, N, D, device=device, dtype=dtype) for _ in range(2))
    do = torch.randn(B, H, N, D, device=device, dtype=dtype)
    return q, k, v, do


def _differs(ours, other):
    """max |difference| / max |ours| over dQ, dK, dV."""
    return max(((a.float() - b.float()).abs().max() / a.float().abs().max().clamp_min(1e-30)).item()
               for a, b in zip(ours, other))


def compare(B, H, Hk, N, D, window, cfgs, dtype, device, bench=None):
    q, k, v, do = _inputs(B, H, Hk, N, D, dtype, device)
    scale = 1.0 / math.sqrt(D)
    o, lse = launch._forward(q, k, v, window, scale)
    ours = launch._backward(q, k, v, o, lse, do, window, scale)
    row = {"B": B, "H": H, "Hk": Hk, "N": N, "D": D, "window": list(window), "dtype": str(dtype).split(".")[-1]}
    if bench:
        row["ours (two kernels) ms"] = bench(lambda: launch._backward(q, k, v, o, lse, do, window, scale))
    for cfg in cfgs:
        name = "fused {}x{} / {}x{} w{} s{}".format(*cfg)
        try:
            err = _differs(ours, fused_backward(q, k, v, o, lse, do, window, scale, cfg))
            row[name] = (bench(lambda: fused_backward(q, k, v, o, lse, do, window, scale, cfg)) if bench
                         else f"ok ({err:.1g})") if err < 1e-2 else f"differs ({err:.2g})"
        except Exception as e:  # a config the compiler refuses
            row[name] = f"fails: {type(e).__name__}"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (GPU run)")
    ap.add_argument("--check", action="store_true", help="small sizes under TRITON_INTERPRET=1, no timing")
    args = ap.parse_args(argv)
    if args.check:
        cfgs = [(16, 32, 32, 16, 4, 1)]
        for B, H, Hk, N, D, window in [(1, 2, 2, 80, 16, (24, 0)), (1, 4, 2, 64, 32, (-1, -1)), (2, 2, 1, 70, 16, (8, 8))]:
            row = compare(B, H, Hk, N, D, window, cfgs, torch.float32, "cpu")
            print(json.dumps(row))
            assert all(row[k].startswith("ok") for k in row if k.startswith("fused")), row
        return 0
    if not (torch.cuda.is_available() and args.out):
        ap.error("give --out on a CUDA GPU, or --check under TRITON_INTERPRET=1")
    from triton.testing import do_bench
    bench = lambda fn: round(do_bench(fn, warmup=50, rep=300), 4)  # noqa: E731
    rows = []
    for B, H, Hk, N, D, window in SHAPES:
        row = compare(B, H, Hk, N, D, window, CONFIGS, torch.float16, "cuda", bench)
        print(json.dumps(row), flush=True)
        rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    doc = dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), triton=triton.__version__,
               command="python tools/triton_fused_backward_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               unit="ms, do_bench median of the backward alone (fp16)", rows=rows)
    names = [n for n in rows[0] if n.startswith(("ours", "fused"))]
    md = [f"# Triton's backward: two kernels against one fused grid ({doc['gpu']}, triton {triton.__version__}, "
          f"commit {commit}{' with local changes' if dirty else ''})", "", f"`{doc['command']}`; {doc['unit']}.", "",
          "| shape | window | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for r in rows:
        md.append(f"| B{r['B']} H{r['H']} Hk{r['Hk']} N{r['N']} D{r['D']} | {tuple(r['window'])} | "
                  + " | ".join(f"{r[n]:.3f}" if isinstance(r[n], float) else str(r[n]) for n in names) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fused_backward_probe.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "fused_backward_probe.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
