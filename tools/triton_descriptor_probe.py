#!/usr/bin/env python
"""What Hopper's copy engine gives the Triton forward: tensor-descriptor (TMA) loads, and tl.range(warp_specialize).

    PYTHONPATH=. python tools/triton_descriptor_probe.py --out results/triton_descriptors     # on a Hopper GPU

A measurement, not a backend: a reduced forward (fp16, contiguous, full or causal mask, no other variant) whose
Q, K, V and O tiles move through ``tl.make_tensor_descriptor`` (TMA on sm_90; the descriptor's shape zero-fills
the rows past N), timed for a few (BLOCK_M, BLOCK_N, warps, stages) with and without ``warp_specialize`` on the
full blocks' loop, beside ``flash_attn_triton`` (pointer loads, autotuned) and SDPA's FA2 and cuDNN, at B4 H32
D64 and B4 H16 D128, N = 4096 (``--shapes`` as JSON). Checks each output against SDPA (max |error| < 1e-2).
TFLOP/s = 4·B·H·N²·D (x0.5 causal) / ``triton.testing.do_bench`` median. Writes ``descriptor_probe.json``
and ``descriptor_probe.md`` into --out.
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

from flash_attention_triton.tiles import _LN2, LOG2E  # noqa: E402


@triton.jit
def _step(acc, l_i, m_i, q, k, v, offs_m, cols, Nq, Nk, scale_log2, MASKED: tl.constexpr, CAUSAL_PAD):
    # S_ij = Q_i K_j^T, in base 2 with the scale folded in; MASKED: -inf past the causal diagonal (CAUSAL_PAD = 0)
    # or past Nk
    S = tl.dot(q, tl.trans(k)) * scale_log2
    if MASKED:
        S = tl.where((cols[None, :] <= offs_m[:, None] + (Nk - Nq) + CAUSAL_PAD) & (cols[None, :] < Nk), S, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(S, 1))  # m_new = max(m_old, rowmax(S_ij))
    P = tl.math.exp2(S - m_new[:, None])  # P_ij = exp2(S_ij - m_new); acc and l_i rescaled by exp2(m_old - m_new)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(P, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(P.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def fwd_desc(Q, K, V, O, LSE, H, group, Nq, Nk, scale_log2, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    pid = tl.program_id(0)
    if CAUSAL:
        pid = tl.num_programs(0) - 1 - pid
    start_m = pid * BLOCK_M
    pid_bh = tl.program_id(1)
    Hk = H // group
    off_b = pid_bh // H
    off_h = pid_bh % H
    kvh = (off_b * Hk + off_h // group).to(tl.int64)
    qd = tl.make_tensor_descriptor(Q + pid_bh.to(tl.int64) * Nq * HEAD_DIM, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                   block_shape=[BLOCK_M, HEAD_DIM])
    kd = tl.make_tensor_descriptor(K + kvh * Nk * HEAD_DIM, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                   block_shape=[BLOCK_N, HEAD_DIM])
    vd = tl.make_tensor_descriptor(V + kvh * Nk * HEAD_DIM, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                   block_shape=[BLOCK_N, HEAD_DIM])
    od = tl.make_tensor_descriptor(O + pid_bh.to(tl.int64) * Nq * HEAD_DIM, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                   block_shape=[BLOCK_M, HEAD_DIM])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = qd.load([start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if CAUSAL:
        full_end = ((start_m + Nk - Nq + 1) // BLOCK_N) * BLOCK_N
        full_end = tl.maximum(tl.minimum(full_end, Nk), 0)
        end = tl.minimum(start_m + BLOCK_M + Nk - Nq, Nk)
    else:
        full_end = (Nk // BLOCK_N) * BLOCK_N
        end = Nk
    for start_n in tl.range(0, full_end, BLOCK_N, warp_specialize=WS):
        k = kd.load([start_n, 0])
        v = vd.load([start_n, 0])
        acc, l_i, m_i = _step(acc, l_i, m_i, q, k, v, offs_m, start_n + offs_n, Nq, Nk, scale_log2, False, 0)
    for start_n in range(full_end, end, BLOCK_N):
        k = kd.load([start_n, 0])
        v = vd.load([start_n, 0])
        acc, l_i, m_i = _step(acc, l_i, m_i, q, k, v, offs_m, start_n + offs_n, Nq, Nk, scale_log2, True, 0 if CAUSAL else Nk)
    o = acc / l_i[:, None]
    tl.store(LSE + pid_bh.to(tl.int64) * Nq + offs_m, (m_i + tl.math.log2(l_i)) * _LN2, mask=offs_m < Nq)
    od.store([start_m, 0], o.to(O.dtype.element_ty))


def run_desc(q, k, v, causal, BM, BN, warps, stages, ws):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(Nq, BM), B * H)
    fwd_desc[grid](q, k, v, o, lse, H, H // k.shape[1], Nq, Nk, LOG2E / math.sqrt(D), HEAD_DIM=D, CAUSAL=causal,
                   BLOCK_M=BM, BLOCK_N=BN, WS=ws, num_warps=warps, num_stages=stages)
    return o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="[[4, 32, 4096, 64], [4, 16, 4096, 128]]", help="JSON list of [B, H, N, D]")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    # device-side descriptors live in a global scratch buffer the launcher provides
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from flash_attention_triton import flash_attn_triton

    cfgs = [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3)]
    rows = []
    for B, H, N, D in json.loads(args.shapes):
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
            flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
            tf = lambda ms: round(flops / ms / 1e9, 1)  # noqa: E731
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            row = {"B": B, "H": H, "N": N, "D": D, "causal": causal,
                   "triton (ours)": tf(do_bench(lambda: flash_attn_triton(q, k, v, causal=causal), rep=200))}
            for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(backend):
                    row[name] = tf(do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=200))
            for ws in (False, True):
                for c in cfgs:
                    key = f"desc {c[0]}x{c[1]} w{c[2]} s{c[3]}{' ws' if ws else ''}"
                    try:
                        err = (run_desc(q, k, v, causal, *c, ws).float() - ref.float()).abs().max().item()
                        row[key] = tf(do_bench(lambda: run_desc(q, k, v, causal, *c, ws), rep=200)) if err < 1e-2 \
                            else f"wrong (max error {err:.3g})"
                    except Exception as e:  # a config the compiler refuses
                        row[key] = f"fails: {type(e).__name__}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True).stdout.strip())
    doc = dict(commit=commit, dirty=dirty, gpu=torch.cuda.get_device_name(), triton=triton.__version__,
               command="python tools/triton_descriptor_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               unit="TFLOP/s, fp16 forward", rows=rows)
    names = [n for n in rows[0] if n not in ("B", "H", "N", "D", "causal")]
    md = [f"# Triton forward with tensor descriptors ({doc['gpu']}, triton {triton.__version__}, commit {commit}"
          f"{' with local changes' if dirty else ''})", "", f"`{doc['command']}`; {doc['unit']}.", "",
          "| shape | causal | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r in rows:
        md.append(f"| B{r['B']} H{r['H']} N{r['N']} D{r['D']} | {r['causal']} | "
                  + " | ".join(f"{r[n]:.0f}" if isinstance(r[n], float) else str(r[n]) for n in names) + " |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "descriptor_probe.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "descriptor_probe.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
